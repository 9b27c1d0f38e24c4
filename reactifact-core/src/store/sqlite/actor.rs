//! Where the outbox's SQLite connection is used: never on an executor thread.
//!
//! Under tokio, each request runs as a blocking task (`spawn_blocking`) that locks the
//! connection: one hand-over to a pooled thread and one back. While a blocking task runs, a
//! paused test clock does not auto-advance, so a store call takes no time on it (awaiting a
//! reply from another thread would let the clock jump to the next timer while SQLite works).
//! Outside tokio, and for fire-and-forget requests, a thread of the store's own runs them.
//! That thread ends once every handle is dropped and the queued requests have run; dropping
//! the last handle waits for it, so that the connection is closed (and the WAL folded into the
//! file, if it was the file's last connection) when the drop returns, as for a plain
//! `Connection`.

use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};

use crate::store::outbox::BoxFuture;
use crate::store::StoreError;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The connection, shared by the blocking tasks and the store's thread.
type Shared = Arc<Mutex<Connection>>;

fn with_conn<T>(conn: &Shared, op: impl FnOnce(&mut Connection) -> T) -> T {
    op(&mut conn.lock().unwrap_or_else(PoisonError::into_inner))
}

/// A handle to the connection.
pub(super) struct Actor {
    conn: Shared,
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
    /// Takes `conn`, and starts the store's thread.
    pub(super) fn spawn(conn: Connection, store: String) -> std::io::Result<Actor> {
        let conn: Shared = Arc::new(Mutex::new(conn));
        let (jobs, queue) = mpsc::channel::<Job>();
        let shared = conn.clone();
        let thread = std::thread::Builder::new()
            .name("reactifact-sqlite-outbox".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    with_conn(&shared, job);
                }
            })?;
        Ok(Actor {
            conn,
            jobs: Some(jobs),
            thread: Some(thread),
            store,
        })
    }

    /// Runs `op` off the caller's thread; its result, when it has run.
    pub(super) fn call<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let store = self.store.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let conn = self.conn.clone();
            let task = handle.spawn_blocking(move || with_conn(&conn, op));
            return Box::pin(async move { task.await.unwrap_or_else(|_| Err(StoreError::closed(store))) });
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn: &mut Connection| {
            let _ = reply.send(op(conn));
        });
        let sent = self.jobs.as_ref().map(|jobs| jobs.send(job));
        Box::pin(async move {
            if !matches!(sent, Some(Ok(()))) {
                return Err(StoreError::closed(store));
            }
            answer.await.unwrap_or_else(|_| Err(StoreError::closed(store)))
        })
    }

    /// Runs `op` on the store's thread without waiting for it.
    pub(super) fn send(&self, op: impl FnOnce(&mut Connection) + Send + 'static) {
        let sent = self.jobs.as_ref().map(|jobs| jobs.send(Box::new(op)));
        if !matches!(sent, Some(Ok(()))) {
            tracing::warn!(store = %self.store, "the outbox thread is gone; the submitted outcomes stay in flight until their leases expire");
        }
    }
}

/// [`write`], without an fsync of its own when the connection syncs every commit: the
/// transaction is committed to the WAL with `synchronous = NORMAL`, so it survives a crash of
/// the process at once, and a power loss once the next commit of the file that syncs (any
/// `FULL` commit syncs the whole WAL, earlier frames included) or the next checkpoint has run.
pub(super) fn write_lazily_synced<T>(
    conn: &mut Connection,
    body: impl FnMut(&Transaction<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    // 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA.
    let level: i64 = conn.query_row("PRAGMA synchronous", [], |row| row.get(0))?;
    if level <= 1 {
        return write(conn, body);
    }
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    let written = write(conn, body);
    let restored = conn.pragma_update(None, "synchronous", level);
    let written = written?;
    restored?;
    Ok(written)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn synchronous(conn: &Connection) -> i64 {
        conn.query_row("PRAGMA synchronous", [], |row| row.get(0)).unwrap()
    }

    /// A lazily synced write commits with `NORMAL` and leaves the connection as it found it, so
    /// the claims and commits after it still sync; a connection set to `NORMAL` stays so.
    #[test]
    fn a_lazily_synced_write_runs_with_normal_and_restores_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("a.db")).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        for (level, name) in [(2, "FULL"), (3, "EXTRA"), (1, "NORMAL")] {
            conn.pragma_update(None, "synchronous", name).unwrap();
            let during = write_lazily_synced(&mut conn, |tx| {
                tx.execute("INSERT INTO t VALUES (1)", [])?;
                tx.query_row("PRAGMA synchronous", [], |row| row.get::<_, i64>(0))
            })
            .unwrap();
            assert_eq!((during, synchronous(&conn)), (1, level), "{name}");
        }
        // A write that fails restores the level too.
        conn.pragma_update(None, "synchronous", "FULL").unwrap();
        let failed = write_lazily_synced(&mut conn, |tx| tx.execute("INSERT INTO missing VALUES (1)", []));
        assert!(failed.is_err());
        assert_eq!(synchronous(&conn), 2);
        let rows: i64 = conn.query_row("SELECT count(*) FROM t", [], |row| row.get(0)).unwrap();
        assert_eq!(rows, 3);
    }
}
