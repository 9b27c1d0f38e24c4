//! The embedded durable store: one SQLite file (WAL mode), many named sessions.
//!
//! The file holds the log, the checkpoints and the outbox. The log is one row per commit (its
//! runs with every operation's bytes); opening a session starts from its newest checkpoint
//! that checks out ([`checkpoint`]) and replays the commits after it to rebuild the state,
//! checking each commit's state hash; the older commits are read only when asked for. The outbox is a table of current delivery state, one row per
//! idempotency key ([`SqliteOutbox`]): a commit registers its intents in its own transaction,
//! and drains claim and record through the outbox's own connection, on its own thread.
//!
//! Layout: this module opens the file and writes the log; [`schema`] holds the versions and
//! migrations, [`checkpoint`] the checkpoints, [`row`] an outbox row and its integrity digest, [`outbox`] the
//! [`OutboxStore`] of the file, [`actor`] the outbox's thread.
//!
//! Limit: the log's commit (`Store::commit`) still runs SQLite on the caller's thread.

// `OpenError` is large (a corrupt log carries its `VerifyError` unboxed, so that the source
// downcasts to it); it is built only on the cold path of an open.
#![allow(clippy::result_large_err)]

mod actor;
mod checkpoint;
mod outbox;
mod row;
mod schema;
pub(crate) mod sessions;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};

use super::codec;
use super::{
    Checkpoint, CommitDelta, History, Loaded, OpenError, OpenOptions, Store, StoreError, StoredCheckpoint, Synchronous,
};
use crate::model::action::{ActionKey, Intent, Origin};
use crate::model::artifact::Generation;
use crate::model::delivery::NewIntent;
use crate::model::hash::{CommitHash, StateHash};
use crate::model::patch::Op;
use crate::state::commit::Commit;
use crate::state::refold::{first_act, VerifyError};
use crate::store::log_store::ClaimOrder;
use crate::store::outbox::Claimed;

pub use outbox::{register_in, SqliteOutbox};
pub(crate) use schema::SCHEMA_VERSION;

/// How long a connection waits for another one's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The store's connection, behind a mutex so that the store is `Sync` (a rusqlite
/// `Connection` is `Send` but not `Sync`). Everything but a fork and a verification reaches
/// it through `&mut`, without locking.
struct Conn(Mutex<Connection>);

impl Conn {
    fn get(&mut self) -> &mut Connection {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) struct SqliteStore {
    conn: Conn,
    path: PathBuf,
    session: String,
    read_only: bool,
    /// The session's generation as this store last wrote or read it: commits are fenced on it.
    generation: u64,
    /// The session has no row yet: [`SqliteStore::settle_open`] writes it.
    new_session: bool,
    /// A file of this schema version opened for writing is switched to WAL mode with this
    /// sync setting (and migrated, if older) by [`SqliteStore::settle_open`], once its log
    /// verified.
    unprepared: Option<(i64, Synchronous)>,
    /// The file's outbox, shared with the stores of this store's forks.
    outbox: Arc<SqliteOutbox>,
    /// The file has the checkpoints table (schema version 3, or 2 once migrated).
    checkpoints: bool,
    /// The last write run on the outbox's thread: if the store is dropped while it is still
    /// under way (its future was dropped: a cut-off commit), the drop waits for it to end, so
    /// that a reopen reads what it left and no write of this store lands after that.
    last_write: Option<Arc<WriteEnd>>,
}

/// The end of a write run on the outbox's thread.
#[derive(Default)]
struct WriteEnd {
    ended: Mutex<bool>,
    signal: Condvar,
}

impl WriteEnd {
    /// Waits until the write ended, at most `limit`.
    fn wait(&self, limit: Duration) {
        let ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        let (ended, timeout) = self
            .signal
            .wait_timeout_while(ended, limit, |ended| !*ended)
            .unwrap_or_else(PoisonError::into_inner);
        if !*ended && timeout.timed_out() {
            tracing::warn!("a cut-off write of the store was still under way when the store was dropped");
        }
    }
}

/// Marks the write ended when dropped: after it ran, if it panicked, or if it never ran.
struct EndOnDrop(Arc<WriteEnd>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        *self.0.ended.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.0.signal.notify_all();
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        if let Some(write) = self.last_write.take() {
            // A write waits at most the busy timeout for the lock, then runs one transaction.
            write.wait(2 * BUSY_TIMEOUT);
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
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => OpenError::NotADatabase { path: path.into() },
        Some(ErrorCode::DatabaseCorrupt) => OpenError::Corrupt {
            path: path.into(),
            detail: e.to_string(),
            source: None,
        },
        _ if short_read => OpenError::Corrupt {
            path: path.into(),
            detail: e.to_string(),
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
    /// Opens (or creates) the file and the session and loads the session.
    ///
    /// Nothing is written before the file is known to be one of ours (or new and empty), and
    /// nothing at all with [`OpenOptions::read_only`] or when the open is refused: a new
    /// session, WAL mode and the migration of an older file are written by
    /// [`SqliteStore::settle_open`], once the log has verified. A read-only open of a file of
    /// schema version 1 is refused ([`OpenError::OlderSchema`]): it would have to be migrated;
    /// one of version 2 is read as it is, without checkpoints.
    ///
    /// The session is loaded from its newest checkpoint that checks out, if any: `Loaded`
    /// then holds only the commits after it.
    pub(crate) fn open(path: &Path, session: &str, options: &OpenOptions) -> Result<(SqliteStore, Loaded), OpenError> {
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
        conn.set_prepared_statement_cache_capacity(STATEMENTS_CACHED);
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
            // one of this version prepared for writing, only once its log verified
            // (`settle_open`).
            schema::prepare_for_writing(&mut conn, options.synchronous, version, path)?;
        }
        let row: Option<(u64, u64)> = conn
            .query_row(
                "SELECT generation, consumed_seq FROM sessions WHERE name = ?1",
                [session],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
            .map_err(|e| open_error(path, e))?;
        if row.is_none() {
            // Commits of a session without its row: the row was lost or changed. Creating the
            // session afresh would hide them behind an empty log.
            let orphaned: bool = conn
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM commits WHERE session = ?1)",
                    [session],
                    |row| row.get(0),
                )
                .map_err(|e| open_error(path, e))?;
            if orphaned {
                return Err(OpenError::Corrupt {
                    path: path.into(),
                    detail: format!("the file holds commits of session `{session}` but no such session"),
                    source: None,
                });
            }
        }
        let (generation, consumed_seq, new_session) = match row {
            Some((generation, consumed_seq)) => (generation, consumed_seq, false),
            None if creating => (0, 0, true),
            None => {
                return Err(OpenError::NoSuchSession {
                    path: path.into(),
                    session: session.into(),
                })
            }
        };
        let outbox = SqliteOutbox::for_store(path, options.synchronous, options.read_only.then_some(session))?;
        let mut store = SqliteStore {
            conn: Conn(Mutex::new(conn)),
            path: path.into(),
            session: session.into(),
            read_only: options.read_only,
            generation,
            new_session,
            unprepared: (!options.read_only && version >= 1).then_some((version, options.synchronous)),
            outbox: Arc::new(outbox),
            last_write: None,
            // A new file got the current schema above.
            checkpoints: version == 0 || schema::has_checkpoints(version),
        };
        let corrupt = |e: LoadError| match e {
            LoadError::Sqlite(e) => open_error(path, e),
            LoadError::Corrupt(detail) => OpenError::Corrupt {
                path: path.into(),
                detail,
                source: None,
            },
        };
        // A session without a row has no log yet. Otherwise the newest checkpoint that checks
        // out, and the commits after it; the older commits are not read.
        let (checkpoint, commits) = if new_session {
            (None, Vec::new())
        } else {
            let conn = store.conn.get();
            let checkpoint = if store.checkpoints {
                checkpoint::newest(conn, session, generation).map_err(corrupt)?
            } else {
                None
            };
            let after = checkpoint.as_ref().map_or(0, |c| c.generation.0);
            // Up to the generation the session's row said, not to the end: a commit another
            // context makes meanwhile (with its row) is read later, by a catch-up.
            let commits = load_range(conn, session, after, generation).map_err(corrupt)?;
            if after + commits.len() as u64 != generation {
                return Err(corrupt(LoadError::Corrupt(format!(
                    "session `{session}` is at generation {generation} but its log holds {} commits",
                    after + commits.len() as u64
                ))));
            }
            (checkpoint, commits)
        };
        // From a checkpoint, the merged histories are read with the older commits, on demand.
        let foreign = if checkpoint.is_some() {
            Vec::new()
        } else {
            load_foreign(store.conn.get(), &[&commits]).map_err(corrupt)?
        };
        Ok((
            store,
            Loaded {
                commits,
                foreign,
                consumed_seq,
                checkpoint,
            },
        ))
    }

    /// The writes of an open, once the loaded log (`log`) has verified: WAL mode and the
    /// migration of an older file, the new session's row, and a row for every intent of the
    /// loaded commits (after the checkpoint the open started from, if any) that has neither a
    /// row nor a purge tombstone (one that was lost or changed: it is registered again from
    /// the verified log, so a committed intent is never lost; `verify` reports a missing row
    /// of any commit). Nothing for a read-only open.
    ///
    /// Expired leases are not reclaimed here: every claim of a drain reclaims them.
    pub(crate) fn settle_open(&mut self, log: &[Commit]) -> Result<(), OpenError> {
        if self.read_only {
            return Ok(());
        }
        if let Some((version, synchronous)) = self.unprepared.take() {
            schema::prepare_for_writing(self.conn.get(), synchronous, version, &self.path)?;
            self.checkpoints = true;
        }
        if self.new_session {
            // Another process may create the same session at the same time: either row is
            // the same empty session.
            self.conn
                .get()
                .execute(
                    "INSERT OR IGNORE INTO sessions (name, generation, head, consumed_seq, created_at)
                     VALUES (?1, 0, NULL, 0, ?2)",
                    params![self.session, millis(SystemTime::now())],
                )
                .map_err(|e| open_error(&self.path, e))?;
            self.new_session = false;
        }
        self.register_missing(log).map_err(|e| open_error(&self.path, e))
    }

    /// Registers again every act of `log` whose key has no outbox row and no tombstone.
    fn register_missing(&mut self, log: &[Commit]) -> Result<(), rusqlite::Error> {
        let mut missing: Vec<NewIntent> = Vec::new();
        {
            let conn = self.conn.get();
            let mut known = conn.prepare(
                "SELECT EXISTS (SELECT 1 FROM outbox WHERE key = ?1)
                     OR EXISTS (SELECT 1 FROM outbox_purged WHERE key = ?1)",
            )?;
            let mut session_of = conn.prepare("SELECT session FROM commits WHERE hash = ?1 LIMIT 1")?;
            for commit in log {
                for (run, record) in commit.runs.iter().enumerate() {
                    for op in &record.ops {
                        let Op::Act {
                            key,
                            action,
                            hash,
                            bytes,
                            payload,
                            ..
                        } = op
                        else {
                            continue;
                        };
                        if known.query_row([key.as_str()], |row| row.get::<_, bool>(0))?
                            || missing.iter().any(|m| m.intent.key == *key)
                        {
                            continue;
                        }
                        let session: String = session_of
                            .query_row([&commit.hash.as_bytes()[..]], |row| row.get(0))
                            .optional()?
                            .unwrap_or_else(|| self.session.clone());
                        tracing::warn!(action_key = %key, generation = commit.generation.0, "an intent of the log had no outbox row (it was lost or changed); it is registered again from the log, held");
                        missing.push(NewIntent {
                            intent: Intent {
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
                            },
                            bytes: bytes.clone(),
                            action_hash: *hash,
                        });
                    }
                }
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let tx = self
            .conn
            .get()
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        outbox::register_held(&tx, &missing, millis(crate::model::time::now()))?;
        tx.commit()
    }

    /// The file's outbox (one per opened store, shared by its forks).
    pub(crate) fn outbox(&self) -> Arc<SqliteOutbox> {
        self.outbox.clone()
    }

    /// The session's commits before and at `upto` (read on demand by a context opened from a
    /// checkpoint at `upto`), and the other sessions' commits that the merges of those and of
    /// `tail` reach.
    fn read_before(&self, upto: u64, tail: &[Commit]) -> Result<(Vec<Commit>, Vec<Commit>), LoadError> {
        read_before(&self.conn.lock(), &self.session, upto, tail)
    }

    fn sqlite_error(&self, source: rusqlite::Error) -> StoreError {
        store_error(&store_name(&self.path), source)
    }

    fn conflict(&self) -> StoreError {
        StoreError::conflict(store_name(&self.path), self.session.clone(), self.generation)
    }

    /// Whether a checkpoint can be written: the store is writable and has the table.
    fn check_checkpoints(&self) -> Result<(), StoreError> {
        self.check_writable()?;
        if !self.checkpoints {
            // Unreachable: a writable store has migrated its file before it is used.
            return Err(StoreError::read_only(store_name(&self.path), self.session.clone()));
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::read_only(store_name(&self.path), self.session.clone()));
        }
        Ok(())
    }

    /// Writes one commit and registers its intents, in one transaction; `Ok(false)` if
    /// another writer advanced the session.
    fn write_commit(&mut self, delta: &CommitDelta<'_>) -> Result<bool, rusqlite::Error> {
        let row = CommitRow::of(delta);
        let fence = self.generation;
        Ok(write_commit_row(self.conn.get(), &row, fence)?.is_some())
    }

    /// The outbox checks of `Context::verify` (see [`Store::verify_outbox`]).
    fn check_outbox(&self, log: &[Commit]) -> Result<Result<(), VerifyError>, rusqlite::Error> {
        let conn = self.conn.lock();
        // Every row intact; every row born of a commit of this log names an act of it.
        let commits: HashMap<[u8; 32], &Commit> = log.iter().map(|c| (c.hash.0, c)).collect();
        let mut stmt = conn.prepare(&format!("SELECT {} FROM outbox ORDER BY seq", row::COLUMNS))?;
        let mut rows = stmt.query([])?;
        while let Some(found) = rows.next()? {
            let row = match row::Row::read(found)? {
                row::Read::Intact(row) => row,
                row::Read::Damaged { key, detail, .. } => {
                    return Ok(Err(VerifyError::OutboxChanged {
                        generation: first_act(log, &key),
                        key: ActionKey::from(key),
                        detail,
                    }))
                }
            };
            let key = ActionKey::from(row.key.as_str());
            if crate::model::hash::content_hash(&row.bytes).as_bytes()[..] != row.action_hash[..] {
                return Ok(Err(VerifyError::OutboxChanged {
                    generation: first_act(log, &row.key),
                    key,
                    detail: "its bytes do not hash to its action hash".into(),
                }));
            }
            let Some(commit) = <[u8; 32]>::try_from(row.origin_commit.as_slice())
                .ok()
                .and_then(|hash| commits.get(&hash))
            else {
                continue; // Born of another session's commit.
            };
            // The row names the commit by its hash and its generation: both must agree.
            let acted = u64::try_from(row.origin_gen).ok() == Some(commit.generation.0)
                && usize::try_from(row.origin_run)
                .ok()
                .and_then(|run| commit.runs.get(run))
                .is_some_and(|run| {
                    run.ops.iter().any(|op| {
                        matches!(op, Op::Act { key: k, hash, action, .. }
                            if k.as_str() == row.key && hash.as_bytes()[..] == row.action_hash[..] && **action == *row.kind)
                    })
                });
            if !acted {
                return Ok(Err(VerifyError::OutboxForged {
                    generation: commit.generation,
                    key,
                }));
            }
        }
        drop(rows);
        drop(stmt);
        // Every act of the log has a row or a tombstone.
        let mut known = conn.prepare(
            "SELECT EXISTS (SELECT 1 FROM outbox WHERE key = ?1)
                 OR EXISTS (SELECT 1 FROM outbox_purged WHERE key = ?1)",
        )?;
        let mut seen: HashSet<&str> = HashSet::new();
        for commit in log {
            for run in &commit.runs {
                for op in &run.ops {
                    if let Op::Act { key, .. } = op {
                        if seen.insert(key.as_str()) && !known.query_row([key.as_str()], |r| r.get::<_, bool>(0))? {
                            return Ok(Err(VerifyError::OutboxMissing {
                                generation: commit.generation,
                                key: key.clone(),
                            }));
                        }
                    }
                }
            }
        }
        Ok(Ok(()))
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

/// A commit as its row, owned, so that it can be written on the outbox's thread.
struct CommitRow {
    session: String,
    generation: u64,
    hash: CommitHash,
    parent: Option<CommitHash>,
    merged: Option<CommitHash>,
    state_hash: StateHash,
    events_consumed: u64,
    consumed_before: u64,
    runs: Vec<u8>,
    intents: Vec<NewIntent>,
    now: i64,
    claim: Option<ClaimOrder>,
}

impl CommitRow {
    fn of(delta: &CommitDelta<'_>) -> CommitRow {
        let commit = delta.commit;
        CommitRow {
            session: delta.session.to_owned(),
            generation: commit.generation.0,
            hash: commit.hash,
            parent: commit.parent,
            merged: commit.merged,
            state_hash: commit.state_hash,
            events_consumed: commit.events_consumed as u64,
            consumed_before: delta.consumed_before,
            runs: codec::encode_runs(&commit.runs),
            intents: delta.intents.to_vec(),
            now: millis(delta.now),
            claim: delta.claim.as_ref().map(ClaimOrder::of),
        }
    }
}

/// Writes a commit's row, registers its intents and makes its claim, in one transaction,
/// fenced on the session being at generation `fence`; `Ok(None)` if another writer advanced
/// it, else what the claim took.
fn write_commit_row(conn: &mut Connection, row: &CommitRow, fence: u64) -> Result<Option<Claimed>, rusqlite::Error> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let fenced = tx
        .prepare_cached(
            // Fenced on the generation this context loaded or last committed, and on the
            // consumed events never moving back (a stale copy would run them again).
            "UPDATE sessions SET generation = ?1, head = ?2, consumed_seq = ?3
             WHERE name = ?4 AND generation = ?5 AND consumed_seq <= ?3",
        )?
        .execute(params![
            row.generation,
            &row.hash.as_bytes()[..],
            row.consumed_before,
            row.session,
            fence,
        ])?;
    if fenced == 0 {
        return Ok(None);
    }
    // `intents` is no longer written: the outbox rows are the ledger.
    tx.prepare_cached(
        "INSERT INTO commits (session, generation, hash, parent, merged, state_hash, events_consumed, intents, runs)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, ?8)",
    )?
    .execute(params![
        row.session,
        row.generation,
        &row.hash.as_bytes()[..],
        row.parent.as_ref().map(|p| &p.as_bytes()[..]),
        row.merged.as_ref().map(|p| &p.as_bytes()[..]),
        &row.state_hash.as_bytes()[..],
        row.events_consumed,
        row.runs,
    ])?;
    if !row.intents.is_empty() {
        outbox::register(&tx, &row.intents, row.now)?;
    }
    let claimed = match &row.claim {
        Some(c) => outbox::claim_in(&tx, &c.request())?,
        None => Claimed::default(),
    };
    tx.commit()?;
    Ok(Some(claimed))
}

/// The columns [`commit_from_row`] reads, in its order.
const COMMIT_COLUMNS: &str = "generation, hash, parent, merged, state_hash, events_consumed, runs";

/// A commit from a row of [`COMMIT_COLUMNS`].
fn commit_from_row(row: &rusqlite::Row<'_>) -> Result<Commit, LoadError> {
    let generation: u64 = row.get(0)?;
    let what = |field: &str| format!("commit {generation}: {field}");
    let hash: Vec<u8> = row.get(1)?;
    let parent: Option<Vec<u8>> = row.get(2)?;
    let merged: Option<Vec<u8>> = row.get(3)?;
    let state_hash: Vec<u8> = row.get(4)?;
    let runs = codec::decode_runs(row.get_ref(6)?.as_blob()?)
        .map_err(|e| LoadError::Corrupt(format!("commit {generation}: its runs do not decode: {e}")))?;
    let optional_hash = |bytes: Option<Vec<u8>>, field: &str| {
        bytes
            .map(|b| digest(&b, &what(field)).map(CommitHash))
            .transpose()
            .map_err(LoadError::Corrupt)
    };
    Ok(Commit {
        generation: Generation(generation),
        hash: CommitHash(digest(&hash, &what("hash")).map_err(LoadError::Corrupt)?),
        parent: optional_hash(parent, "parent")?,
        merged: optional_hash(merged, "merged parent")?,
        state_hash: StateHash(digest(&state_hash, &what("state hash")).map_err(LoadError::Corrupt)?),
        events_consumed: row.get::<_, u64>(5)? as usize,
        runs: runs.into(),
    })
}

enum LoadError {
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

impl LoadError {
    /// As a verification error of a log read on demand.
    fn into_history(self) -> VerifyError {
        VerifyError::History {
            detail: match self {
                LoadError::Sqlite(e) => e.to_string(),
                LoadError::Corrupt(detail) => detail,
            },
        }
    }
}

/// The sessions whose rows hold `session`'s log, root first: each with the generations it
/// contributes, `(from, upto]`. A branch's log is its parent's up to the fork (read from the
/// parent's rows, recursively), then its own commits.
fn chain(conn: &Connection, session: &str) -> Result<Vec<(String, u64, u64)>, LoadError> {
    let mut ancestry = crate::store::Ancestry::new(session);
    loop {
        let session = ancestry.oldest();
        let fork: Option<(Option<String>, Option<u64>)> = conn
            .query_row(
                "SELECT parent, fork_generation FROM sessions WHERE name = ?1",
                [session],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?;
        match fork {
            Some((Some(parent), Some(at))) => ancestry.push_parent(parent, at).map_err(LoadError::Corrupt)?,
            Some(_) => break,
            None => return Err(LoadError::Corrupt(format!("the parent session `{session}` is missing"))),
        }
    }
    Ok(ancestry.segments())
}

/// The commits of `session`'s log with a generation in `(after, upto]`, oldest first.
fn load_range(conn: &Connection, session: &str, after: u64, upto: u64) -> Result<Vec<Commit>, LoadError> {
    let mut commits = Vec::new();
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COMMIT_COLUMNS} FROM commits
         WHERE session = ?1 AND generation > ?2 AND generation <= ?3 ORDER BY generation"
    ))?;
    let upto = upto.min(i64::MAX as u64);
    for (owner, from, to) in chain(conn, session)? {
        let (low, high) = (from.max(after), to.min(upto));
        if low >= high {
            continue;
        }
        let mut rows = stmt.query(params![owner, low, high])?;
        while let Some(row) = rows.next()? {
            commits.push(commit_from_row(row)?);
        }
    }
    Ok(commits)
}

/// `session`'s commits up to `upto`, and the other sessions' commits that the merges of those
/// and of `tail` reach (see [`Store::load_before`]).
fn read_before(
    conn: &Connection,
    session: &str,
    upto: u64,
    tail: &[Commit],
) -> Result<(Vec<Commit>, Vec<Commit>), LoadError> {
    let prefix = load_range(conn, session, 0, upto)?;
    if prefix.len() as u64 != upto {
        return Err(LoadError::Corrupt(format!(
            "session `{session}` has a checkpoint at generation {upto} but {} commits up to it",
            prefix.len()
        )));
    }
    let foreign = load_foreign(conn, &[&prefix, tail])?;
    Ok((prefix, foreign))
}

/// A commit's hash and state hash, as stored.
type StoredHashes = (Vec<u8>, Vec<u8>);

/// The hash and state hash of commit `generation` of `session`'s log, without decoding it.
fn commit_hashes_at(conn: &Connection, session: &str, generation: u64) -> Result<Option<StoredHashes>, LoadError> {
    let Some((owner, ..)) = chain(conn, session)?
        .into_iter()
        .find(|&(_, from, upto)| from < generation && generation <= upto)
    else {
        return Ok(None);
    };
    Ok(conn
        .query_row(
            "SELECT hash, state_hash FROM commits WHERE session = ?1 AND generation = ?2",
            params![owner, generation],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?)
}

/// The commits of other sessions that the logs reach through their merge commits' merged
/// parents and do not hold themselves: the histories they merged, so a later merge can walk
/// them (those merged from elsewhere are not in the file, and are left out). Nothing is read
/// for logs without merge commits; otherwise one pass over the commits' hashes finds where
/// each one is, then each commit needed is read by its key.
fn load_foreign(conn: &Connection, logs: &[&[Commit]]) -> Result<Vec<Commit>, LoadError> {
    let log = || logs.iter().flat_map(|l| l.iter());
    let mut wanted: Vec<CommitHash> = log().filter_map(|c| c.merged).collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let own: HashSet<CommitHash> = log().map(|c| c.hash).collect();
    let mut located: HashMap<Vec<u8>, (String, u64)> = HashMap::new();
    {
        let mut stmt = conn.prepare("SELECT hash, session, generation FROM commits")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            located.insert(row.get(0)?, (row.get(1)?, row.get(2)?));
        }
    }
    let mut stmt = conn.prepare(&format!(
        "SELECT {COMMIT_COLUMNS} FROM commits WHERE session = ?1 AND generation = ?2"
    ))?;
    let mut found: HashMap<CommitHash, Commit> = HashMap::new();
    while let Some(hash) = wanted.pop() {
        if own.contains(&hash) || found.contains_key(&hash) {
            continue;
        }
        // A history merged from another file or from memory is not here; the merge walk
        // stops at its head.
        let Some((session, generation)) = located.get(&hash.as_bytes()[..]) else {
            continue;
        };
        let commit = stmt
            .query_row(params![session, generation], |row| Ok(commit_from_row(row)))?
            .map_err(|e| match e {
                LoadError::Sqlite(e) => LoadError::Sqlite(e),
                LoadError::Corrupt(detail) => LoadError::Corrupt(format!("session `{session}`: {detail}")),
            })?;
        wanted.extend(commit.parent);
        wanted.extend(commit.merged);
        found.insert(hash, commit);
    }
    Ok(found.into_values().collect())
}

impl SqliteStore {
    /// Runs the write `op` on the outbox's thread, keeping track of its end (see
    /// [`SqliteStore::last_write`]).
    fn write_off_thread<T: Send + 'static>(
        &mut self,
        op: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> crate::store::outbox::BoxFuture<'static, Result<T, StoreError>> {
        let end = Arc::new(WriteEnd::default());
        let mark = EndOnDrop(end.clone());
        self.last_write = Some(end);
        self.outbox.run_write(move |conn| {
            let _ended = mark;
            op(conn)
        })
    }

    /// A new session in the same file whose log is this session's up to commit `at`.
    fn fork_session(
        &self,
        branch: &str,
        at: u64,
        head: Option<&CommitHash>,
        consumed_seq: u64,
    ) -> Result<SqliteStore, StoreError> {
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| self.sqlite_error(e))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| self.sqlite_error(e))?;
        let synchronous: i64 = self
            .conn
            .lock()
            .query_row("PRAGMA synchronous", [], |row| row.get(0))
            .map_err(|e| self.sqlite_error(e))?;
        conn.pragma_update(None, "synchronous", synchronous)
            .map_err(|e| self.sqlite_error(e))?;
        let inserted = conn
            .execute(
                "INSERT OR IGNORE INTO sessions (name, generation, head, consumed_seq, parent, fork_generation, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?2, ?6)",
                params![
                    branch,
                    at,
                    head.map(|h| &h.as_bytes()[..]),
                    consumed_seq,
                    self.session,
                    millis(SystemTime::now()),
                ],
            )
            .map_err(|e| self.sqlite_error(e))?;
        if inserted == 0 {
            return Err(StoreError::session_exists(store_name(&self.path), branch));
        }
        Ok(SqliteStore {
            conn: Conn(Mutex::new(conn)),
            path: self.path.clone(),
            session: branch.to_owned(),
            read_only: false,
            generation: at,
            new_session: false,
            unprepared: None,
            outbox: self.outbox.clone(),
            last_write: None,
            checkpoints: self.checkpoints,
        })
    }
}

/// The generation `session`'s row records, if it has one.
fn session_generation(conn: &Connection, session: &str) -> rusqlite::Result<Option<u64>> {
    conn.query_row("SELECT generation FROM sessions WHERE name = ?1", [session], |row| {
        row.get(0)
    })
    .optional()
}

impl SqliteStore {
    /// [`StoreError::Conflict`] unless the session's row is at the generation this store last
    /// saw (a session not yet written has no row).
    fn current(&self, generation: Option<u64>) -> Result<(), StoreError> {
        match generation {
            None if self.generation == 0 => Ok(()),
            Some(generation) if generation == self.generation => Ok(()),
            _ => Err(self.conflict()),
        }
    }
}

impl Store for SqliteStore {
    fn fork(
        &self,
        branch: &str,
        at: Generation,
        head: Option<&CommitHash>,
        consumed_seq: u64,
    ) -> Result<Box<dyn Store>, StoreError> {
        self.check_writable()?;
        Ok(Box::new(self.fork_session(branch, at.0, head, consumed_seq)?))
    }

    fn commit(&mut self, delta: &CommitDelta<'_>) -> Result<(), StoreError> {
        self.check_writable()?;
        match self.write_commit(delta) {
            Ok(true) => {
                self.generation = delta.commit.generation.0;
                Ok(())
            }
            Ok(false) => Err(self.conflict()),
            Err(e) => Err(self.sqlite_error(e)),
        }
    }

    fn commit_async<'a>(
        &'a mut self,
        delta: &CommitDelta<'_>,
    ) -> crate::store::outbox::BoxFuture<'a, Result<Claimed, StoreError>> {
        if let Err(e) = self.check_writable() {
            return Box::pin(std::future::ready(Err(e)));
        }
        // Encoded here; written (and synced) on the outbox's thread, over its connection.
        let row = CommitRow::of(delta);
        let fence = self.generation;
        let store = store_name(&self.path);
        // A commit cut off (its future dropped) runs on regardless: what its claim took is
        // then released at once, as a dropped claim's is, not left in flight for a lease.
        let (unwanted, wanted) = outbox::Unwanted::pair();
        let now = delta.now;
        let written = self.write_off_thread(move |conn| {
            let written = write_commit_row(conn, &row, fence).and_then(|written| {
                if let Some(claimed) = &written {
                    outbox::release_if_unwanted(conn, &wanted, claimed, now)?;
                }
                Ok(written)
            });
            written.map_err(|source| store_error(&store, source))
        });
        let generation = delta.commit.generation.0;
        Box::pin(async move {
            let written = written.await;
            unwanted.answered();
            match written? {
                Some(claimed) => {
                    self.generation = generation;
                    Ok(claimed)
                }
                None => Err(self.conflict()),
            }
        })
    }

    fn consume_events<'a>(
        &'a mut self,
        session: &str,
        before: u64,
    ) -> crate::store::outbox::BoxFuture<'a, Result<(), StoreError>> {
        if let Err(e) = self.check_writable() {
            return Box::pin(std::future::ready(Err(e)));
        }
        // Fenced like a commit: a copy that is behind the session (another writer committed,
        // or consumed further) is refused instead of losing events or running them again.
        let (session, fence, store) = (session.to_owned(), self.generation, store_name(&self.path));
        let written = self.write_off_thread(move |conn| {
            conn.prepare_cached(
                "UPDATE sessions SET consumed_seq = ?2 WHERE name = ?1 AND generation = ?3 AND consumed_seq <= ?2",
            )
            .and_then(|mut stmt| stmt.execute(params![session, before, fence]))
            .map_err(|source| store_error(&store, source))
        });
        Box::pin(async move {
            if written.await? == 0 {
                return Err(self.conflict());
            }
            Ok(())
        })
    }

    fn check_current(&self) -> Result<(), StoreError> {
        let generation = session_generation(&self.conn.lock(), &self.session).map_err(|e| self.sqlite_error(e))?;
        self.current(generation)
    }

    fn check_current_async(&self) -> crate::store::outbox::BoxFuture<'_, Result<(), StoreError>> {
        let (session, store) = (self.session.clone(), store_name(&self.path));
        let read = self
            .outbox
            .run_write(move |conn| session_generation(conn, &session).map_err(|e| store_error(&store, e)));
        Box::pin(async move { self.current(read.await?) })
    }

    fn catch_up(&mut self) -> crate::store::outbox::BoxFuture<'_, Result<crate::store::CaughtUp, StoreError>> {
        let (session, fence, store) = (self.session.clone(), self.generation, store_name(&self.path));
        let read = self.outbox.run_write(move |conn| {
            let history = |detail: String| StoreError::History {
                store: store.clone(),
                session: session.clone(),
                detail,
            };
            let row: Option<(u64, u64)> = conn
                .query_row(
                    "SELECT generation, consumed_seq FROM sessions WHERE name = ?1",
                    [session.as_str()],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()
                .map_err(|e| store_error(&store, e))?;
            let Some((generation, consumed_seq)) = row else {
                return Err(history(format!("session `{session}` is missing")));
            };
            let commits = load_range(conn, &session, fence, generation).map_err(|e| match e {
                LoadError::Sqlite(e) => store_error(&store, e),
                LoadError::Corrupt(detail) => history(detail),
            })?;
            if fence + commits.len() as u64 != generation {
                return Err(history(format!(
                    "session `{session}` is at generation {generation} but its log after {fence} holds {} commits",
                    commits.len()
                )));
            }
            Ok((generation, crate::store::CaughtUp { commits, consumed_seq }))
        });
        Box::pin(async move {
            let (generation, caught) = read.await?;
            self.generation = generation;
            Ok(caught)
        })
    }

    fn verify_outbox(&self, log: &[Commit]) -> Result<(), VerifyError> {
        self.check_outbox(log)
            .unwrap_or_else(|e| Err(VerifyError::OutboxUnreadable { detail: e.to_string() }))
    }

    fn describe(&self) -> String {
        store_name(&self.path)
    }

    fn checkpoint(&self, checkpoint: Checkpoint) -> crate::store::outbox::BoxFuture<'static, Result<(), StoreError>> {
        if let Err(e) = self.check_checkpoints() {
            return Box::pin(std::future::ready(Err(e)));
        }
        let (session, store) = (self.session.clone(), store_name(&self.path));
        // Encoded and written on the outbox's thread: O(state), never on the caller's.
        self.outbox.run_write(move |conn| {
            checkpoint::write(conn, &session, &checkpoint).map_err(|source| store_error(&store, source))
        })
    }

    fn checkpoint_later(&self, checkpoint: Checkpoint) {
        if let Err(e) = self.check_checkpoints() {
            tracing::warn!(error = %e, generation = checkpoint.generation.0, "no checkpoint written");
            return;
        }
        let (session, store) = (self.session.clone(), store_name(&self.path));
        self.outbox.send_write(move |conn| {
            if let Err(e) = checkpoint::write(conn, &session, &checkpoint) {
                tracing::warn!(store = %store, session = %session, generation = checkpoint.generation.0, error = %e, "a checkpoint could not be written; the next open replays more commits");
            }
        });
    }

    fn load_before(&self, upto: Generation, tail: &[Commit]) -> Result<(Vec<Commit>, Vec<Commit>), VerifyError> {
        self.read_before(upto.0, tail).map_err(LoadError::into_history)
    }

    fn load_before_async(
        &self,
        upto: Generation,
        tail: Vec<Commit>,
    ) -> crate::store::outbox::BoxFuture<'static, History> {
        let session = self.session.clone();
        // Read on the outbox's thread, over its connection.
        let read = self
            .outbox
            .run_write(move |conn| Ok(read_before(conn, &session, upto.0, &tail)));
        Box::pin(async move {
            match read.await {
                Ok(read) => read.map_err(LoadError::into_history),
                Err(e) => Err(VerifyError::History { detail: e.to_string() }),
            }
        })
    }

    fn checkpoints(&self) -> Result<Vec<StoredCheckpoint>, VerifyError> {
        if !self.checkpoints {
            return Ok(Vec::new());
        }
        checkpoint::all(&self.conn.lock(), &self.session).map_err(|e| LoadError::Sqlite(e).into_history())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::outbox::{ClaimRequest, OutboxStore, Scope};

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
        let (mut store, _) = SqliteStore::open(&path, "orders", &OpenOptions::new()).unwrap();
        store.settle_open(&[]).unwrap();
        drop(store);
        let (store, _) = SqliteStore::open(&path, "orders", &OpenOptions::new().read_only(true)).unwrap();
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
        let (mut store, _) = SqliteStore::open(&path, "orders", &OpenOptions::new()).unwrap();
        store.settle_open(&[]).unwrap();
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
        assert!(forged.insert(store.conn.get()).unwrap());
        match store.verify_outbox(std::slice::from_ref(&commit)) {
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
        assert!(store.verify_outbox(&[]).is_ok());
    }

    #[test]
    fn a_row_naming_its_commit_by_hash_but_another_generation_is_forged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let (mut store, _) = SqliteStore::open(&path, "orders", &OpenOptions::new()).unwrap();
        store.settle_open(&[]).unwrap();
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
        assert!(row_of(5).insert(store.conn.get()).unwrap());
        match store.verify_outbox(std::slice::from_ref(&commit)) {
            Err(VerifyError::OutboxForged {
                generation: Generation(1),
                ..
            }) => {}
            other => panic!("expected a forged row, got {other:?}"),
        }
        // The same row with the commit's own generation checks out.
        store.conn.get().execute("DELETE FROM outbox", []).unwrap();
        assert!(row_of(1).insert(store.conn.get()).unwrap());
        assert!(store.verify_outbox(std::slice::from_ref(&commit)).is_ok());
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
            let mut conn = Connection::open(&path).unwrap();
            conn.execute_batch("DELETE FROM checkpoints").unwrap();
            checkpoint::write(&mut conn, "orders", forged).unwrap();
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
