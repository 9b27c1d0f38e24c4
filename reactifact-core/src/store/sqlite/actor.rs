//! The thread that owns the outbox's SQLite connection.
//!
//! Requests are boxed closures over `&mut Connection`, sent on a std channel; each replies on
//! a tokio oneshot. So no SQLite call of the outbox (and no fsync) runs on an executor thread.
//! The thread ends once every handle is dropped and the queued requests have run; dropping
//! the last handle waits for that, so that the connection is closed (and the WAL folded into
//! the file, if it was the file's last connection) when the drop returns, as for a plain
//! `Connection`.

use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};

use crate::store::outbox::BoxFuture;
use crate::store::StoreError;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// A handle to the connection's thread.
pub(super) struct Actor {
    /// `None` only while dropping.
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The store, as it names itself in errors.
    store: String,
}

impl Drop for Actor {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            // (Never the case: no request holds a handle. Joining itself would deadlock.)
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

impl Actor {
    /// Starts the thread that owns `conn`.
    pub(super) fn spawn(mut conn: Connection, store: String) -> std::io::Result<Actor> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("reactifact-sqlite-outbox".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    job(&mut conn);
                }
            })?;
        Ok(Actor {
            jobs: Some(jobs),
            thread: Some(thread),
            store,
        })
    }

    /// Runs `op` on the thread; its result, when it has run.
    pub(super) fn call<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn: &mut Connection| {
            let _ = reply.send(op(conn));
        });
        let sent = self.jobs.as_ref().map(|jobs| jobs.send(job));
        let store = self.store.clone();
        Box::pin(async move {
            if !matches!(sent, Some(Ok(()))) {
                return Err(StoreError::closed(store));
            }
            // Under tokio, the wait runs as a blocking task: while one runs, a paused test
            // clock does not auto-advance, so a store call takes no time on it (awaiting the
            // reply directly would let the clock jump to the next timer while SQLite works).
            let answered = match tokio::runtime::Handle::try_current() {
                Ok(handle) => handle
                    .spawn_blocking(move || answer.blocking_recv())
                    .await
                    .unwrap_or_else(|_| Ok(Err(StoreError::closed(store.clone())))),
                Err(_) => answer.await,
            };
            answered.unwrap_or_else(|_| Err(StoreError::closed(store)))
        })
    }

    /// Runs `op` on the thread without waiting for it.
    pub(super) fn send(&self, op: impl FnOnce(&mut Connection) + Send + 'static) {
        let sent = self.jobs.as_ref().map(|jobs| jobs.send(Box::new(op)));
        if !matches!(sent, Some(Ok(()))) {
            tracing::warn!(store = %self.store, "the outbox thread is gone; the submitted outcomes stay in flight until their leases expire");
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
