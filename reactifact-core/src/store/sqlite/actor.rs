//! The thread that owns the outbox's SQLite connection.
//!
//! Requests are boxed closures over `&mut Connection`, sent on a std channel; each replies on
//! a tokio oneshot. So no SQLite call of the outbox (and no fsync) runs on an executor thread.
//! The thread ends once every handle is dropped and the queued requests have run.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};

use crate::store::outbox::BoxFuture;
use crate::store::StoreError;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// A handle to the connection's thread.
pub(super) struct Actor {
    jobs: mpsc::Sender<Job>,
    path: PathBuf,
}

impl Actor {
    /// Starts the thread that owns `conn`.
    pub(super) fn spawn(mut conn: Connection, path: PathBuf) -> std::io::Result<Actor> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("reactifact-sqlite-outbox".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    job(&mut conn);
                }
            })?;
        Ok(Actor { jobs, path })
    }

    /// Runs `op` on the thread; its result, when it has run.
    pub(super) fn call<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let sent = self.jobs.send(Box::new(move |conn: &mut Connection| {
            let _ = reply.send(op(conn));
        }));
        let path = self.path.clone();
        Box::pin(async move {
            if sent.is_err() {
                return Err(StoreError::Closed { path });
            }
            answer.await.unwrap_or(Err(StoreError::Closed { path }))
        })
    }

    /// Runs `op` on the thread without waiting for it.
    pub(super) fn send(&self, op: impl FnOnce(&mut Connection) + Send + 'static) {
        if self.jobs.send(Box::new(op)).is_err() {
            tracing::warn!(path = %self.path.display(), "the outbox thread is gone; the submitted outcomes stay in flight until their leases expire");
        }
    }
}

/// Runs `body` in one `BEGIN IMMEDIATE` transaction and commits it. A database still busy
/// after the busy timeout is retried a few times before the error is returned.
pub(super) fn write<T>(
    conn: &mut Connection,
    mut body: impl FnMut(&Transaction<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let mut pause = Duration::from_millis(5);
    let mut tries = 0;
    loop {
        let attempt = (|| -> rusqlite::Result<T> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = body(&tx)?;
            tx.commit()?;
            Ok(out)
        })();
        match attempt {
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) && tries < 4 => {
                tries += 1;
                std::thread::sleep(pause);
                pause *= 4;
            }
            other => return other,
        }
    }
}
