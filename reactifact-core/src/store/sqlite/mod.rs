//! The embedded durable store: one SQLite file (WAL mode), many named sessions.
//!
//! The file holds the log, the checkpoints and the outbox. [`SqliteStore`] is the file as a
//! [`LogStore`](crate::store::LogStore): it keeps rows (sessions, commits, checkpoints), and
//! the core's session (`store/backed.rs`) encodes, loads and checks them, as it does for every
//! backend. The outbox is a table of current delivery state, one row per idempotency key
//! ([`SqliteOutbox`]): a commit registers its intents in its own transaction. Every statement
//! of an opened file runs on the outbox's connection, on its own thread ([`actor`]).
//!
//! Layout: this module opens the file; [`log`] holds the rows of the log and the checkpoints,
//! [`schema`] the versions and migrations, [`row`] an outbox row and its integrity digest,
//! [`outbox`] the [`OutboxStore`](crate::store::OutboxStore) of the file, [`actor`] the
//! connection's thread, [`sessions`] the listing of a file's sessions.

// `OpenError` is large (a corrupt log carries its `VerifyError` unboxed, so that the source
// downcasts to it); it is built only on the cold path of an open.
#![allow(clippy::result_large_err)]

mod actor;
mod log;
mod outbox;
mod row;
mod schema;
pub(crate) mod sessions;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode, OpenFlags};

use super::backed::block_on;
use super::in_flight::InFlight;
use super::{OpenError, OpenOptions, StoreError, Synchronous};
use crate::model::action::{Intent, Origin};
use crate::model::delivery::NewIntent;
use crate::model::patch::Op;
use crate::state::commit::Commit;

pub use outbox::{register_in, SqliteOutbox};
pub(crate) use schema::SCHEMA_VERSION;

/// How long a connection waits for another one's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The log store of one SQLite file: its sessions, their commits and checkpoints, beside the
/// file's outbox, as a [`LogStore`](crate::store::LogStore).
///
/// [`Context::open`](crate::Context::open) opens one for each session it opens (so that the
/// file is migrated only once the session's log verified); [`SqliteStore::open`] opens one to
/// hand to [`Context::open_store`](crate::Context::open_store) or to a test of the log
/// contract. Every statement runs on the file's outbox connection, on a thread of its own.
pub struct SqliteStore {
    outbox: Arc<SqliteOutbox>,
    path: PathBuf,
    /// `sqlite:{path}`, as the store names itself.
    name: String,
    read_only: bool,
    /// A file of this schema version opened for writing is switched to WAL mode with this
    /// sync setting (and migrated, if older) by [`SqliteStore::prepare`], once the log it
    /// was opened for verified.
    unprepared: Mutex<Option<(i64, Synchronous)>>,
    /// The file has the checkpoints table (schema version 3 and later; a writable store's
    /// file has it once prepared).
    checkpoints: std::sync::atomic::AtomicBool,
    /// The file has the table of answers kept before a commit (schema version 9 and later; a
    /// writable store's file has it once prepared).
    answers: std::sync::atomic::AtomicBool,
    /// The writes under way on the outbox's thread: dropping the store waits for them, so
    /// that a write whose future was dropped (a cut-off commit) cannot land after the store
    /// is gone and a reopen reads what it left.
    writes: Arc<InFlight>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("read_only", &self.read_only)
            .finish()
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // A write waits at most the busy timeout for the lock, then runs one transaction.
        if !self.writes.wait(2 * BUSY_TIMEOUT) {
            tracing::warn!(store = %self.name, "a cut-off write of the store was still under way when the store was dropped");
        }
    }
}

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn digest(bytes: &[u8], what: &str) -> Result<[u8; 32], String> {
    bytes
        .try_into()
        .map_err(|_| format!("{what} is {} bytes, not a 32-byte hash", bytes.len()))
}

/// How many prepared statements a connection keeps (rusqlite's default is 16): the claim,
/// record and commit paths prepare more distinct statements than that (one per scope shape,
/// plus the attempt history's), and an evicted one is prepared again on the hot path.
const STATEMENTS_CACHED: usize = 64;

/// Maps a SQLite error met while opening to what the user should hear.
fn open_error(path: &Path, e: rusqlite::Error) -> OpenError {
    // A read past the end of the file: it was cut short.
    const SQLITE_IOERR_SHORT_READ: i32 = 522;
    let short_read = matches!(&e, rusqlite::Error::SqliteFailure(f, _) if f.extended_code == SQLITE_IOERR_SHORT_READ);
    // A column of another type than reactifact writes: the row was changed outside it.
    let mistyped = matches!(
        &e,
        rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
    );
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => OpenError::NotADatabase { path: path.into() },
        Some(ErrorCode::DatabaseCorrupt) => OpenError::Corrupt {
            path: path.into(),
            detail: e.to_string(),
            source: None,
        },
        _ if short_read || mistyped => OpenError::Corrupt {
            path: path.into(),
            detail: if mistyped {
                format!("a column has the wrong type: {e}")
            } else {
                e.to_string()
            },
            source: None,
        },
        _ => OpenError::Backend {
            path: path.into(),
            source: Box::new(e),
        },
    }
}

/// How a store of the file at `path` names itself in errors and `describe`: `sqlite:{path}`.
fn store_name(path: &Path) -> String {
    format!("sqlite:{}", path.display())
}

/// A SQLite error met by the store `store` while in use. A database still busy or locked
/// after the busy timeout (and, in the outbox, its own retries) is retryable.
fn store_error(store: &str, e: rusqlite::Error) -> StoreError {
    let retryable = matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    );
    StoreError::backend(store, retryable, e)
}

impl SqliteStore {
    /// Opens (creating if needed) the store file at `path` for reading and writing, with
    /// `synchronous = FULL` in WAL mode. A file of an older schema version is upgraded at
    /// once, as [`SqliteOutbox::open`] does: the log is not read
    /// ([`Context::open`](crate::Context::open) upgrades a file only once the session it
    /// opens has verified).
    ///
    /// # Errors
    /// As [`Context::open`](crate::Context::open): [`OpenError`] names the path and what is
    /// wrong.
    pub fn open(path: impl AsRef<Path>) -> Result<Arc<SqliteStore>, OpenError> {
        let store = Self::open_file(path.as_ref(), "", &OpenOptions::new())?;
        store.prepare()?;
        Ok(store)
    }

    /// Opens the file at `path` for a session of it (named in the errors of a missing one),
    /// checking that it is a reactifact store this build reads, without writing anything but
    /// the schema of a new, empty file. A file of an older version opened for writing is
    /// migrated by [`SqliteStore::prepare`], once its log verified. A read-only open of a file
    /// of schema version 1 is refused ([`OpenError::OlderSchema`]): it would have to be
    /// migrated; one of version 2 is read as it is, without checkpoints.
    pub(crate) fn open_file(path: &Path, session: &str, options: &OpenOptions) -> Result<Arc<SqliteStore>, OpenError> {
        // (whether the path exists, its size if it could be read: if not, SQLite says why).
        let (exists, size) = match std::fs::metadata(path) {
            Ok(metadata) => (true, Some(metadata.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (false, None),
            Err(_) => (true, None),
        };
        let creating = options.create && !options.read_only;
        if !exists && !creating {
            return Err(OpenError::NoSuchFile { path: path.into() });
        }
        match size {
            Some(0) if !creating => {
                return Err(OpenError::NoSuchSession {
                    path: path.into(),
                    session: session.into(),
                })
            }
            Some(size @ 1..) => check_header(path, size)?,
            _ => {}
        }
        let mut conn = if options.read_only {
            open_read_only(path)?
        } else {
            let flags =
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            Connection::open_with_flags(path, flags).map_err(|e| open_error(path, e))?
        };
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| open_error(path, e))?;
        if !options.read_only && conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
            return Err(OpenError::ReadOnlyFile { path: path.into() });
        }
        let version = schema::schema_version(&conn, path)?;
        if options.read_only {
            if version == 0 {
                return Err(OpenError::NoSuchSession {
                    path: path.into(),
                    session: session.into(),
                });
            }
            // A version-2 file reads as it is (version 3 only adds checkpoints).
            if version < schema::READS_FROM {
                return Err(OpenError::OlderSchema {
                    path: path.into(),
                    found: version,
                    supported: SCHEMA_VERSION,
                });
            }
        } else if version == 0 {
            // A new file: it gets its schema now. A file of an older version is migrated, and
            // one of this version prepared for writing, only once its log verified.
            schema::prepare_for_writing(&mut conn, options.synchronous, version, path)?;
        } else {
            let sync = match options.synchronous {
                Synchronous::Full => "FULL",
                Synchronous::Normal => "NORMAL",
            };
            conn.pragma_update(None, "synchronous", sync)
                .map_err(|e| open_error(path, e))?;
        }
        let read_only = options.read_only.then_some(session);
        let outbox = SqliteOutbox::spawn(conn, path, read_only.map(str::to_owned))?;
        Ok(Arc::new(SqliteStore {
            outbox: Arc::new(outbox),
            path: path.into(),
            name: store_name(path),
            read_only: options.read_only,
            unprepared: Mutex::new((!options.read_only && version >= 1).then_some((version, options.synchronous))),
            // A new file got the current schema above.
            checkpoints: (version == 0 || schema::has_checkpoints(version)).into(),
            answers: (version == 0 || schema::has_answers(version)).into(),
            writes: Arc::default(),
        }))
    }

    /// The file's outbox (one per opened store, shared by its sessions' contexts).
    pub fn outbox(&self) -> Arc<SqliteOutbox> {
        self.outbox.clone()
    }

    /// Switches a file opened for writing to WAL mode and migrates an older one, once: what
    /// [`SqliteStore::open_file`] left for after the log verified. Nothing for a read-only
    /// store, or a file already prepared.
    pub(crate) fn prepare(&self) -> Result<(), OpenError> {
        let Some((version, synchronous)) = *self.unprepared.lock().unwrap_or_else(PoisonError::into_inner) else {
            return Ok(());
        };
        let path = self.path.clone();
        let prepared = block_on(
            self.outbox
                .run_write(move |conn| Ok(schema::prepare_for_writing(conn, synchronous, version, &path))),
        );
        match prepared {
            Ok(Ok(())) => {
                *self.unprepared.lock().unwrap_or_else(PoisonError::into_inner) = None;
                self.checkpoints.store(true, std::sync::atomic::Ordering::Release);
                self.answers.store(true, std::sync::atomic::Ordering::Release);
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(e) => Err(self.file_error(OpenError::Store {
                session: String::new(),
                source: e,
            })),
        }
    }

    /// The writes of a context's open, once the loaded log (`log`) has verified: WAL mode and
    /// the migration of an older file ([`SqliteStore::prepare`]), and a row for every intent
    /// of the loaded commits (after the checkpoint the open started from, if any) that has
    /// neither a row nor a purge tombstone (one that was lost or changed: it is registered
    /// again from the verified log, held, so a committed intent is never lost; `verify`
    /// reports a missing row of any commit). Nothing for a read-only store.
    ///
    /// Expired leases are not reclaimed here: every claim of a drain reclaims them.
    pub(crate) fn settle(&self, session: &str, log: &[Commit]) -> Result<(), OpenError> {
        if self.read_only {
            return Ok(());
        }
        self.prepare()?;
        let acts: Vec<NewIntent> = log
            .iter()
            .flat_map(|commit| {
                commit.runs.iter().enumerate().flat_map(move |(run, record)| {
                    record.ops.iter().filter_map(move |op| {
                        let Op::Act {
                            key,
                            action,
                            hash,
                            bytes,
                            payload,
                            ..
                        } = op
                        else {
                            return None;
                        };
                        let intent = Intent {
                            key: key.clone(),
                            kind: action.clone(),
                            payload: payload.clone(),
                            origin: Origin::new(
                                session,
                                commit.hash,
                                commit.generation,
                                u32::try_from(run).unwrap_or(u32::MAX),
                            ),
                            attempt: 0,
                            trace: None,
                        };
                        Some(NewIntent {
                            intent,
                            bytes: bytes.clone(),
                            action_hash: *hash,
                        })
                    })
                })
            })
            .collect();
        if acts.is_empty() {
            return Ok(());
        }
        let path = self.path.clone();
        let registered = self.outbox.run_write(move |conn| {
            Ok(log::register_missing(conn, acts, millis(crate::model::time::now())).map_err(|e| open_error(&path, e)))
        });
        match block_on(registered) {
            Ok(registered) => registered,
            Err(e) => Err(self.file_error(OpenError::Store {
                session: session.to_owned(),
                source: e,
            })),
        }
    }

    /// An error of an open of this file, as the file's: a SQLite error met while reading the
    /// log names the path, as one met while opening the file does ([`OpenError::Corrupt`] for
    /// a damaged file).
    pub(crate) fn file_error(&self, e: OpenError) -> OpenError {
        let OpenError::Store {
            source: StoreError::Backend { source, .. },
            ..
        } = e
        else {
            return e;
        };
        match source.downcast::<rusqlite::Error>() {
            Ok(e) => open_error(&self.path, *e),
            Err(source) => OpenError::Backend {
                path: self.path.clone(),
                source,
            },
        }
    }

    fn check_writable(&self, session: &str) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::read_only(self.name.clone(), session));
        }
        Ok(())
    }
}

/// Refuses a non-empty file that is not a whole SQLite database before SQLite sees it: one
/// that does not start with the SQLite magic, or is shorter than its header, or — when no
/// process has it open (no `-wal` beside it) — shorter than the size its header records.
/// SQLite itself would take a file shorter than its header for a new database and write one,
/// and read a file cut after its last page in use as if nothing were missing.
fn check_header(path: &Path, size: u64) -> Result<(), OpenError> {
    const MAGIC: &[u8; 16] = b"SQLite format 3\0";
    let mut header = [0u8; 100];
    let read = std::fs::File::open(path).and_then(|mut file| {
        use std::io::Read;
        let mut filled = 0;
        while filled < header.len() {
            match file.read(&mut header[filled..])? {
                0 => break,
                n => filled += n,
            }
        }
        Ok(filled)
    });
    let Ok(read) = read else {
        return Ok(()); // SQLite reports why it cannot be read.
    };
    if header[..read.min(MAGIC.len())] != MAGIC[..read.min(MAGIC.len())] {
        return Err(OpenError::NotADatabase { path: path.into() });
    }
    let truncated = |detail: String| OpenError::Corrupt {
        path: path.into(),
        detail,
        source: None,
    };
    if read < header.len() {
        return Err(truncated(format!(
            "the file is truncated: {size} bytes, shorter than a SQLite header"
        )));
    }
    let field = |at: usize| u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536,
        n => u64::from(n),
    };
    // The page count is valid when the "version valid for" matches the change counter.
    let recorded = (field(92) == field(24)).then(|| page_size * u64::from(field(28)));
    if let Some(recorded) = recorded.filter(|&recorded| size < recorded) {
        if !has_wal(path) {
            return Err(truncated(format!(
                "the file is truncated: {size} bytes, its header records {recorded}"
            )));
        }
    }
    Ok(())
}

/// Whether a `-wal` file sits beside the database: a process has it open, or one crashed.
fn has_wal(path: &Path) -> bool {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    Path::new(&wal).exists()
}

/// Opens the file read-only without leaving anything behind. A WAL-mode file that no process
/// has open (no `-wal` file beside it) is read as immutable: SQLite then creates no `-wal` or
/// `-shm` file, which also makes read-only media work. A file with a `-wal` (a writer has it
/// open, or one crashed) is read through its WAL.
fn open_read_only(path: &Path) -> Result<Connection, OpenError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let opened = if has_wal(path) {
        Connection::open_with_flags(path, flags)
    } else {
        Connection::open_with_flags(immutable_uri(path), flags | OpenFlags::SQLITE_OPEN_URI)
    };
    let conn = opened.map_err(|e| open_error(path, e))?;
    // A file of an older version, read as it is: its outbox seen with the columns of the
    // current version it lacks (no decisions, no trace context), through a temporary view.
    let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0)).unwrap_or(0);
    if (schema::READS_FROM..SCHEMA_VERSION).contains(&version) {
        schema::view_older_outbox(&conn, version).map_err(|e| open_error(path, e))?;
    }
    Ok(conn)
}

/// `file:{path}?immutable=1`, the path percent-encoded.
fn immutable_uri(path: &Path) -> String {
    let mut uri = String::from("file:");
    for &byte in path.as_os_str().as_encoded_bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            uri.push(char::from(byte));
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    uri
}

/// Why a migration failed: SQLite's error, or a row it could not carry over.
pub(super) enum LoadError {
    Sqlite(rusqlite::Error),
    Corrupt(String),
}

impl From<rusqlite::Error> for LoadError {
    fn from(e: rusqlite::Error) -> Self {
        LoadError::Sqlite(e)
    }
}

impl From<rusqlite::types::FromSqlError> for LoadError {
    fn from(e: rusqlite::types::FromSqlError) -> Self {
        LoadError::Corrupt(format!("a column has the wrong type: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use rusqlite::TransactionBehavior;

    use super::*;
    use crate::model::action::ActionKey;
    use crate::model::artifact::Generation;
    use crate::model::hash::{CommitHash, StateHash};
    use crate::state::refold::VerifyError;
    use crate::store::log_store::LogStore;
    use crate::store::outbox::{ClaimRequest, OutboxStore, Scope};
    use crate::store::Checkpoint;

    fn verify(store: &SqliteStore, log: &[Commit]) -> Result<(), VerifyError> {
        match block_on(store.verify_outbox(crate::store::backed::outbox_check(log))).unwrap() {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn sqlite_errors_are_boxed_backend_errors_and_busy_is_retryable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let holder = Connection::open(&path).unwrap();
        holder.execute_batch("CREATE TABLE t (x); BEGIN IMMEDIATE;").unwrap();
        let mut other = Connection::open(&path).unwrap();
        other.busy_timeout(Duration::ZERO).unwrap();
        let busy = other
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map(drop)
            .unwrap_err();
        let name = store_name(&path);
        let err = store_error(&name, busy);
        assert!(err.is_retryable(), "{err}");
        assert_eq!(err.store(), name);
        let message = err.to_string();
        assert!(message.starts_with(&format!("store {name}: ")), "{message}");
        assert!(message.contains("locked") || message.contains("busy"), "{message}");
        let source = std::error::Error::source(&err).expect("the driver's error is the source");
        let driver = source.downcast_ref::<rusqlite::Error>().expect("a rusqlite error");
        assert_eq!(driver.sqlite_error_code(), Some(ErrorCode::DatabaseBusy));

        let syntax = other.execute_batch("SELEKT 1").unwrap_err();
        let err = store_error(&name, syntax);
        assert!(!err.is_retryable(), "{err}");
        assert!(!StoreError::conflict(name.clone(), "orders", 3).is_retryable());
        assert!(!StoreError::closed(name).is_retryable());
    }

    #[test]
    fn a_read_only_store_has_an_outbox_that_reads_and_refuses_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        drop(crate::Context::open(&path, "orders").unwrap());
        let store = SqliteStore::open_file(&path, "orders", &OpenOptions::new().read_only(true)).unwrap();
        let outbox = store.outbox();
        assert!(Arc::ptr_eq(&outbox, &store.outbox()), "one outbox per opened store");
        block_on(async {
            assert_eq!(outbox.counts(&Scope::all()).await.unwrap().total(), 0);
            let owner: Arc<str> = Arc::from("x");
            let err = outbox
                .claim(ClaimRequest {
                    scope: &Scope::all(),
                    limit: 1,
                    owner: &owner,
                    lease: Duration::from_secs(1),
                    now: SystemTime::now(),
                    policy: crate::store::ClaimPolicy::none(),
                })
                .await
                .unwrap_err();
            assert!(matches!(err, StoreError::ReadOnly { .. }), "{err}");
            assert!(matches!(
                outbox.purge(crate::PurgeFilter::Final, SystemTime::now(), 1).await,
                Err(StoreError::ReadOnly { .. })
            ));
        });
    }

    #[test]
    fn a_row_pointing_at_a_commit_that_did_not_act_it_is_forged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = SqliteStore::open(&path).unwrap();
        let conn = Connection::open(&path).unwrap();
        let commit = Commit {
            generation: Generation(1),
            parent: None,
            merged: None,
            hash: CommitHash([7; 32]),
            state_hash: StateHash([0; 32]),
            runs: crate::Runs::default(),
            events_consumed: 0,
        };
        // A row, with a digest that checks out, claiming to come from a commit of the log
        // that acted nothing.
        let bytes = rmp_serde::to_vec_named(&crate::model::action::PendingAction {
            kind: "notify".into(),
            key: "k".into(),
            payload: Vec::new(),
            requires_approval: false,
            not_before: None,
            group: None,
        })
        .unwrap();
        let forged = row::Row::register(
            &NewIntent {
                intent: Intent {
                    key: ActionKey::from("k"),
                    kind: Arc::from("notify"),
                    payload: Vec::new().into(),
                    origin: Origin::new("orders", commit.hash, Generation(1), 0),
                    attempt: 0,
                    trace: None,
                },
                action_hash: crate::model::hash::content_hash(&bytes),
                bytes: Arc::from(bytes),
            },
            0,
        );
        assert!(forged.insert(&conn).unwrap());
        match verify(&store, std::slice::from_ref(&commit)) {
            Err(
                err @ VerifyError::OutboxForged {
                    generation: Generation(1),
                    ..
                },
            ) => assert_eq!(
                err.to_string(),
                "commit 1: the outbox row of `k` names it as its origin, but it did not act it"
            ),
            other => panic!("expected a forged row, got {other:?}"),
        }
        // Not a commit of this log: another session's row, not checked against it.
        assert!(verify(&store, &[]).is_ok());
    }

    #[test]
    fn a_row_naming_its_commit_by_hash_but_another_generation_is_forged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = SqliteStore::open(&path).unwrap();
        let conn = Connection::open(&path).unwrap();
        let act = Op::act("notify", ActionKey::from("k"), &"payload").unwrap();
        let Op::Act {
            hash, bytes, payload, ..
        } = act.clone()
        else {
            unreachable!("an act")
        };
        let commit = Commit {
            generation: Generation(1),
            parent: None,
            merged: None,
            hash: CommitHash([7; 32]),
            state_hash: StateHash([0; 32]),
            runs: vec![crate::state::commit::RunRecord {
                agent: None,
                produce: None,
                trigger: None,
                ops: vec![act],
                reads: Vec::new(),
                watches_reads: false,
                calls: Vec::new(),
            }]
            .into(),
            events_consumed: 0,
        };
        // The commit acted `k`; the row (its digest checks out) names the commit's hash and
        // run, but generation 5: a changed origin generation with a recomputed digest.
        let row_of = |generation| {
            row::Row::register(
                &NewIntent {
                    intent: Intent::new(
                        ActionKey::from("k"),
                        "notify",
                        payload.clone(),
                        Origin::new("orders", commit.hash, Generation(generation), 0),
                        0,
                    ),
                    action_hash: hash,
                    bytes: bytes.clone(),
                },
                0,
            )
        };
        assert!(row_of(5).insert(&conn).unwrap());
        match verify(&store, std::slice::from_ref(&commit)) {
            Err(VerifyError::OutboxForged {
                generation: Generation(1),
                ..
            }) => {}
            other => panic!("expected a forged row, got {other:?}"),
        }
        // The same row with the commit's own generation checks out.
        conn.execute("DELETE FROM outbox", []).unwrap();
        assert!(row_of(1).insert(&conn).unwrap());
        assert!(verify(&store, std::slice::from_ref(&commit)).is_ok());
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Note {
        n: u32,
    }

    impl crate::model::artifact::Artifact for Note {
        const KIND: &'static str = "note";
    }

    /// A checkpoint whose digest, commit hash and state hash all check out but whose content
    /// is not the log's (written by something other than the context): the open takes it,
    /// `verify` refuses it, naming its generation.
    #[test]
    fn verify_refuses_a_checkpoint_that_checks_out_but_is_not_the_logs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let options = || OpenOptions::new().checkpoint_every(0);
        let mut ctx = crate::Context::open_with(&path, "orders", options()).unwrap();
        ctx.create("note:1", Note { n: 1 }).unwrap();
        let first = ctx.state().clone();
        ctx.update("note:1", Note { n: 2 }).unwrap();
        // Back to the first content: the same state hash as after commit 1, version 3.
        ctx.update("note:1", Note { n: 1 }).unwrap();
        ctx.create("note:2", Note { n: 2 }).unwrap();
        let honest = ctx.checkpoint_of_head().unwrap();
        drop(ctx);

        let forge = |forged: &Checkpoint| {
            Connection::open(&path)
                .unwrap()
                .execute_batch("DELETE FROM checkpoints")
                .unwrap();
            let body = crate::store::codec::encode_checkpoint(
                &forged.state,
                forged.next_event_seq,
                &forged.events,
                &forged.readers,
            );
            let (generation, hash, state_hash) = (forged.generation.0, forged.hash.0, forged.state_hash.0);
            let digest = crate::store::codec::checkpoint_digest("orders", generation, &hash, &state_hash, &body);
            let row = crate::store::CheckpointRow::new(
                "orders".into(),
                generation,
                hash.to_vec(),
                state_hash.to_vec(),
                body,
                digest.to_vec(),
            );
            block_on(SqliteStore::open(&path).unwrap().put_checkpoint(row, 2)).unwrap();
        };
        let verified = || crate::Context::open_with(&path, "orders", options()).unwrap().verify();
        forge(&honest);
        verified().unwrap();

        // The state after commit 1 (note:1 at version 1) under commit 3's names.
        let mut ctx = crate::Context::open_with(&path, "orders", options()).unwrap();
        ctx.delete("note:2").unwrap();
        let at_3 = ctx.checkpoint_of_head().unwrap();
        let forged = Checkpoint { state: first, ..at_3 };
        drop(ctx);
        forge(&forged);
        match verified() {
            Err(VerifyError::Checkpoint { generation, detail }) => {
                assert_eq!(generation, Generation(5));
                assert!(detail.starts_with("its state is not the log's"), "{detail}");
            }
            other => panic!("expected a bad checkpoint, got {other:?}"),
        }

        // A queued event left out.
        let ctx = crate::Context::open_with(&path, "orders", options()).unwrap();
        let mut short = ctx.checkpoint_of_head().unwrap();
        assert!(short.events.len() >= 2);
        short.events.remove(0);
        drop(ctx);
        forge(&short);
        assert!(matches!(verified(), Err(VerifyError::Checkpoint { .. })));

        // The queued deletion of note:2 holding another version than the one deleted.
        forge(&honest);
        let ctx = crate::Context::open_with(&path, "orders", options()).unwrap();
        let mut swapped = ctx.checkpoint_of_head().unwrap();
        let deletion = swapped
            .events
            .iter_mut()
            .find(|q| q.deleted.is_some())
            .expect("the deletion of note:2 is queued");
        deletion.deleted = ctx.state().get("note:1").cloned();
        drop(ctx);
        forge(&swapped);
        match verified() {
            Err(VerifyError::Checkpoint { detail, .. }) => {
                assert!(detail.contains("the version deleted"), "{detail}");
            }
            other => panic!("expected a bad checkpoint, got {other:?}"),
        }

        // A readers index the log never built.
        forge(&honest);
        let ctx = crate::Context::open_with(&path, "orders", options()).unwrap();
        let mut invented = ctx.checkpoint_of_head().unwrap();
        invented.readers = crate::state::readers::Readers::from_entries([(
            crate::state::readers::ReaderKey {
                agent: "a".into(),
                produce: "p".into(),
                trigger: "note:1".into(),
            },
            crate::state::readers::Reader {
                generation: Generation(1),
                reads: vec![crate::model::artifact::ArtifactId::from("note:2")].into(),
                wrote: Vec::new().into(),
            },
        )]);
        drop(ctx);
        forge(&invented);
        match verified() {
            Err(VerifyError::Checkpoint { detail, .. }) => {
                assert!(detail.starts_with("its readers index is not the log's"), "{detail}");
            }
            other => panic!("expected a bad checkpoint, got {other:?}"),
        }
        // The honest one still verifies, its deletion and all.
        forge(&honest);
        verified().unwrap();
    }
}
