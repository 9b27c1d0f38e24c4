//! The embedded durable store: one SQLite file (WAL mode), many named sessions.
//!
//! The file holds logs, not tables of current state: one row per commit (its runs with every
//! operation's bytes, and the intents it registered) and one row per ledger write (the new
//! state of the entries it touched). A generation is therefore two statements in one
//! transaction however many artifacts it writes, and a drain batch is one insert. Opening a
//! session replays its commits to rebuild the state, checking each commit's state hash, and
//! folds the ledger rows.

// `OpenError` is large (a corrupt log carries its `VerifyError` unboxed, so that the source
// downcasts to it); it is built only on the cold path of an open.
#![allow(clippy::result_large_err)]

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};
use serde::{Deserialize, Serialize};

use super::codec;
use super::{CommitDelta, Loaded, OpenError, OpenOptions, Store, StoreError, Synchronous};
use crate::model::action::{ActionKey, Intent, Origin};
use crate::model::artifact::Generation;
use crate::model::hash::{CommitHash, StateHash};
use crate::outbox::ledger::{Delivery, DeliveryStatus, Lease};
use crate::state::commit::Commit;

/// How long a connection waits for another one's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema version this build writes (`PRAGMA user_version`).
pub(crate) const SCHEMA_VERSION: i64 = 1;

/// Forward migrations: `MIGRATIONS[v]` upgrades a file from version `v` to `v + 1`.
const MIGRATIONS: &[&str] = &[
    // 0 → 1: the first schema.
    "
    CREATE TABLE sessions (
        name TEXT PRIMARY KEY,
        generation INTEGER NOT NULL,
        head BLOB,
        consumed_seq INTEGER NOT NULL,
        parent TEXT,
        fork_generation INTEGER,
        created_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE commits (
        seq INTEGER PRIMARY KEY,
        session TEXT NOT NULL,
        generation INTEGER NOT NULL,
        hash BLOB NOT NULL,
        parent BLOB,
        merged BLOB,
        state_hash BLOB NOT NULL,
        events_consumed INTEGER NOT NULL,
        intents BLOB,
        runs BLOB NOT NULL,
        UNIQUE (session, generation)
    );
    CREATE TABLE deliveries (
        seq INTEGER PRIMARY KEY,
        written_at INTEGER NOT NULL,
        entries BLOB NOT NULL
    );
    ",
];

/// An intent as registered by a commit (the `intents` column).
#[derive(Serialize, Deserialize)]
struct IntentRow<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(with = "serde_bytes", borrow)]
    payload: Cow<'a, [u8]>,
    recorded_at: i64,
    /// The position of the recording run in its commit.
    run: u32,
}

/// The state of one ledger entry after a write (the `deliveries.entries` column).
#[derive(Serialize, Deserialize)]
struct DeliveryRow<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    status: u8,
    attempts: u32,
    #[serde(borrow)]
    last_error: Option<Cow<'a, str>>,
    #[serde(borrow)]
    lease: Option<(Cow<'a, str>, i64)>,
    expired_leases: u32,
    updated_at: i64,
    delivered_at: Option<i64>,
    next_attempt_at: Option<i64>,
    /// Attempts cut off before their outcome was known; absent from rows written before it
    /// was kept.
    #[serde(default)]
    interrupted: u32,
}

/// The store's connection, behind a mutex so that the store is `Sync` (a rusqlite
/// `Connection` is `Send` but not `Sync`). Everything but a fork reaches it through `&mut`,
/// without locking.
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
    /// A file of this schema version opened for writing is switched to WAL mode, with this
    /// sync setting, by [`SqliteStore::settle_open`], once its log verified.
    unprepared: Option<Synchronous>,
}

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

fn status_code(status: DeliveryStatus) -> u8 {
    match status {
        DeliveryStatus::Pending => 0,
        DeliveryStatus::InFlight => 1,
        DeliveryStatus::Delivered => 2,
        DeliveryStatus::Failed => 3,
        DeliveryStatus::Dead => 4,
        DeliveryStatus::Held => 5,
        DeliveryStatus::Cancelled => 6,
    }
}

fn status_from(code: u8) -> Option<DeliveryStatus> {
    Some(match code {
        0 => DeliveryStatus::Pending,
        1 => DeliveryStatus::InFlight,
        2 => DeliveryStatus::Delivered,
        3 => DeliveryStatus::Failed,
        4 => DeliveryStatus::Dead,
        5 => DeliveryStatus::Held,
        _ => return None,
    })
}

fn digest(bytes: &[u8], what: &str) -> Result<[u8; 32], String> {
    bytes
        .try_into()
        .map_err(|_| format!("{what} is {} bytes, not a 32-byte hash", bytes.len()))
}

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
        _ => OpenError::Sqlite {
            path: path.into(),
            source: e,
        },
    }
}

fn encode_deliveries(entries: &mut dyn Iterator<Item = &Delivery>) -> Vec<u8> {
    let rows: Vec<DeliveryRow<'_>> = entries
        .map(|d| DeliveryRow {
            key: Cow::Borrowed(d.intent.key.as_str()),
            status: status_code(d.status),
            attempts: d.attempts,
            last_error: d.last_error.as_deref().map(Cow::Borrowed),
            lease: d
                .lease
                .as_ref()
                .map(|l| (Cow::Borrowed(&*l.owner), millis(l.expires_at))),
            expired_leases: d.expired_leases,
            updated_at: millis(d.updated_at),
            delivered_at: d.delivered_at.map(millis),
            next_attempt_at: d.next_attempt_at.map(millis),
            interrupted: d.interrupted,
        })
        .collect();
    rmp_serde::to_vec(&rows).expect("ledger entries always encode")
}

impl SqliteStore {
    /// Opens (or creates) the file and the session and loads the session.
    ///
    /// Nothing is written before the file is known to be one of ours (or new and empty), and
    /// nothing at all with [`OpenOptions::read_only`] or when the open is refused: a new
    /// session and the reclaim of expired leases are written by [`SqliteStore::settle_open`],
    /// once the log has verified.
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
        if !options.read_only && conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
            return Err(OpenError::ReadOnlyFile { path: path.into() });
        }
        let version = schema_version(&conn, path)?;
        if options.read_only {
            if version < SCHEMA_VERSION {
                return Err(OpenError::NoSuchSession {
                    path: path.into(),
                    session: session.into(),
                });
            }
        } else if version < SCHEMA_VERSION {
            // A new (or older) file: it gets its schema now. A file of this version is
            // prepared for writing only once its log verified (`settle_open`).
            prepare_for_writing(&mut conn, options.synchronous, version, path)?;
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

        let mut store = SqliteStore {
            conn: Conn(Mutex::new(conn)),
            path: path.into(),
            session: session.into(),
            read_only: options.read_only,
            generation,
            new_session,
            unprepared: (!options.read_only && version >= SCHEMA_VERSION).then_some(options.synchronous),
        };
        let corrupt = |e: LoadError| match e {
            LoadError::Sqlite(e) => open_error(path, e),
            LoadError::Corrupt(detail) => OpenError::Corrupt {
                path: path.into(),
                detail,
                source: None,
            },
        };
        // A session without a row has no log yet.
        let commits = if new_session {
            Vec::new()
        } else {
            store.load_commits().map_err(corrupt)?
        };
        let foreign = store.load_foreign(&commits).map_err(corrupt)?;
        let deliveries = store.load_ledger().map_err(corrupt)?;
        Ok((
            store,
            Loaded {
                commits,
                foreign,
                consumed_seq,
                deliveries,
            },
        ))
    }

    /// The writes of an open, once the loaded log has verified: the new session's row, and
    /// the expired leases put back to pending (returns how many). Nothing for a read-only open.
    pub(crate) fn settle_open(&mut self, deliveries: &mut [Delivery]) -> Result<usize, OpenError> {
        if self.read_only {
            return Ok(0);
        }
        if let Some(synchronous) = self.unprepared.take() {
            prepare_for_writing(self.conn.get(), synchronous, SCHEMA_VERSION, &self.path)?;
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
        self.reclaim_expired_leases(deliveries)
            .map_err(|e| open_error(&self.path, e))
    }

    /// The session's log, oldest first. A branch's log is its parent's up to the fork (read
    /// from the parent's rows, recursively), then its own commits.
    fn load_commits(&mut self) -> Result<Vec<Commit>, LoadError> {
        // The chain of (session, last generation taken from it), from this session up to the
        // root; each takes the commits after the next one's limit.
        let mut chain = vec![(self.session.clone(), u64::MAX)];
        loop {
            let (session, _) = chain.last().expect("the chain starts with this session");
            let fork: Option<(Option<String>, Option<u64>)> = self
                .conn
                .get()
                .query_row(
                    "SELECT parent, fork_generation FROM sessions WHERE name = ?1",
                    [session.as_str()],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            match fork {
                Some((Some(parent), Some(at))) => {
                    if chain.iter().any(|(s, _)| *s == parent) || chain.len() > 1000 {
                        return Err(LoadError::Corrupt(format!("session `{parent}` is its own ancestor")));
                    }
                    chain.push((parent, at));
                }
                Some(_) => break,
                None => return Err(LoadError::Corrupt(format!("the parent session `{session}` is missing"))),
            }
        }
        // Each session contributes the commits after its parent's fork point, up to where its
        // child forked.
        let mut commits = Vec::new();
        let mut stmt = self.conn.get().prepare(&format!(
            "SELECT {COMMIT_COLUMNS} FROM commits
             WHERE session = ?1 AND generation > ?2 AND generation <= ?3 ORDER BY generation"
        ))?;
        let mut from = 0u64;
        for (session, upto) in chain.into_iter().rev() {
            let upto = upto.min(i64::MAX as u64);
            let mut rows = stmt.query(params![session, from, upto])?;
            while let Some(row) = rows.next()? {
                commits.push(commit_from_row(row)?);
            }
            from = upto;
        }
        if commits.len() as u64 != self.generation {
            return Err(LoadError::Corrupt(format!(
                "session `{}` is at generation {} but its log holds {} commits",
                self.session,
                self.generation,
                commits.len()
            )));
        }
        Ok(commits)
    }

    /// The commits of other sessions that the log reaches through its merge commits' merged
    /// parents and does not hold itself: the histories it merged, so a later merge can walk
    /// them (those merged from elsewhere are not in the file, and are left out). Nothing is read
    /// for a log without merge commits; otherwise one pass over the commits' hashes finds where
    /// each one is, then each commit needed is read by its key.
    fn load_foreign(&mut self, log: &[Commit]) -> Result<Vec<Commit>, LoadError> {
        let mut wanted: Vec<CommitHash> = log.iter().filter_map(|c| c.merged).collect();
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let own: HashSet<CommitHash> = log.iter().map(|c| c.hash).collect();
        let mut located: HashMap<Vec<u8>, (String, u64)> = HashMap::new();
        {
            let mut stmt = self
                .conn
                .get()
                .prepare("SELECT hash, session, generation FROM commits")?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                located.insert(row.get(0)?, (row.get(1)?, row.get(2)?));
            }
        }
        let mut stmt = self.conn.get().prepare(&format!(
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

    /// The file's ledger: the intents every session's commits registered, in commit order
    /// (a key is registered once, by its first commit), with every later ledger write folded in.
    fn load_ledger(&mut self) -> Result<Vec<Delivery>, LoadError> {
        let mut entries: Vec<Delivery> = Vec::new();
        let mut index: foldhash::HashMap<ActionKey, usize> = foldhash::HashMap::default();
        let mut stmt = self
            .conn
            .get()
            .prepare("SELECT session, generation, hash, intents FROM commits WHERE intents IS NOT NULL ORDER BY seq")?;
        let mut rows = stmt.query([])?;
        let mut session: Arc<str> = Arc::from("");
        while let Some(row) = rows.next()? {
            let name = row.get_ref(0)?.as_str()?;
            if *session != *name {
                session = Arc::from(name);
            }
            let generation = Generation(row.get(1)?);
            let commit = CommitHash(digest(row.get_ref(2)?.as_blob()?, "a commit's hash").map_err(LoadError::Corrupt)?);
            let intents: Vec<IntentRow<'_>> = rmp_serde::from_slice(row.get_ref(3)?.as_blob()?)
                .map_err(|e| LoadError::Corrupt(format!("the intents of a commit do not decode: {e}")))?;
            for intent in intents {
                let key = ActionKey::from(&*intent.key);
                if index.contains_key(key.as_str()) {
                    continue;
                }
                index.insert(key.clone(), entries.len());
                entries.push(Delivery::new(
                    Intent {
                        key,
                        kind: Arc::from(&*intent.kind),
                        payload: Arc::from(&*intent.payload),
                        origin: Origin {
                            session: session.clone(),
                            commit,
                            generation,
                            run: intent.run,
                        },
                        attempt: 0,
                    },
                    from_millis(intent.recorded_at),
                ));
            }
        }
        drop(rows);
        drop(stmt);

        let mut stmt = self.conn.get().prepare("SELECT entries FROM deliveries ORDER BY seq")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let written: Vec<DeliveryRow<'_>> = rmp_serde::from_slice(row.get_ref(0)?.as_blob()?)
                .map_err(|e| LoadError::Corrupt(format!("a ledger write does not decode: {e}")))?;
            for state in written {
                let Some(&at) = index.get(&*state.key) else {
                    return Err(LoadError::Corrupt(format!(
                        "the ledger records a delivery of `{}`, an intent no commit registered",
                        state.key
                    )));
                };
                let entry = &mut entries[at];
                let status = status_from(state.status).ok_or_else(|| {
                    LoadError::Corrupt(format!(
                        "ledger entry `{}` has unknown status {}",
                        state.key, state.status
                    ))
                })?;
                if entry.status == DeliveryStatus::Delivered {
                    // Delivered is final: no transition leaves it, so a later row is a stale
                    // copy's (one that loaded the ledger before the delivery) and must not
                    // re-arm the key.
                    if status != DeliveryStatus::Delivered {
                        tracing::warn!(action_key = %state.key, status = %status, "a ledger write after the delivery of this key is ignored: it came from a stale copy of the ledger");
                    }
                    continue;
                }
                entry.status = status;
                entry.attempts = state.attempts;
                entry.last_error = state.last_error.map(Cow::into_owned);
                entry.lease = state.lease.map(|(owner, expires)| Lease {
                    owner: Arc::from(&*owner),
                    expires_at: from_millis(expires),
                    token: crate::model::delivery::FenceToken(u64::from(state.attempts)),
                });
                entry.expired_leases = state.expired_leases;
                entry.interrupted = state.interrupted;
                entry.updated_at = from_millis(state.updated_at);
                entry.delivered_at = state.delivered_at.map(from_millis);
                entry.next_attempt_at = state.next_attempt_at.map(from_millis);
            }
        }
        Ok(entries)
    }

    /// Puts intents whose lease expired back to pending, counting the ambiguous attempt.
    fn reclaim_expired_leases(&mut self, deliveries: &mut [Delivery]) -> Result<usize, rusqlite::Error> {
        let now = SystemTime::now();
        let mut reclaimed = Vec::new();
        for entry in deliveries.iter_mut() {
            let expired = entry.status == DeliveryStatus::InFlight
                && entry.lease.as_ref().is_none_or(|lease| lease.expires_at <= now);
            if !expired {
                continue;
            }
            let _ = now; // TEMPORARY: helper S removes the open-time reclaim
            reclaimed.push(&*entry);
        }
        let count = reclaimed.len();
        if count > 0 {
            self.insert_deliveries(&mut reclaimed.into_iter())?;
            tracing::warn!(path = %self.path.display(), reclaimed = count, "in-flight deliveries with expired leases put back to pending");
        }
        Ok(count)
    }

    fn insert_deliveries(&mut self, entries: &mut dyn Iterator<Item = &Delivery>) -> Result<(), rusqlite::Error> {
        self.conn
            .get()
            .prepare_cached("INSERT INTO deliveries (written_at, entries) VALUES (?1, ?2)")?
            .execute(params![millis(SystemTime::now()), encode_deliveries(entries)])?;
        Ok(())
    }

    fn sqlite_error(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    fn check_writable(&self) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::ReadOnly {
                path: self.path.clone(),
                session: self.session.clone(),
            });
        }
        Ok(())
    }

    /// Writes one commit; `Ok(false)` if another writer advanced the session.
    fn write_commit(&mut self, delta: &CommitDelta<'_>) -> Result<bool, rusqlite::Error> {
        let tx = self
            .conn
            .get()
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let commit = delta.commit;
        let fenced = tx
            .prepare_cached(
                // Fenced on the generation this context loaded or last committed, and on the
                // consumed events never moving back (a stale copy would run them again).
                "UPDATE sessions SET generation = ?1, head = ?2, consumed_seq = ?3
                 WHERE name = ?4 AND generation = ?5 AND consumed_seq <= ?3",
            )?
            .execute(params![
                commit.generation.0,
                &commit.hash.as_bytes()[..],
                delta.consumed_before,
                delta.session,
                self.generation,
            ])?;
        if fenced == 0 {
            return Ok(false);
        }
        let now = millis(SystemTime::now());
        let intents = (!delta.intents.is_empty()).then(|| {
            let rows: Vec<IntentRow<'_>> = delta
                .intents
                .iter()
                .map(|d| IntentRow {
                    key: Cow::Borrowed(d.intent.key.as_str()),
                    kind: Cow::Borrowed(&d.intent.kind),
                    payload: Cow::Borrowed(&d.intent.payload),
                    recorded_at: now,
                    run: d.intent.origin.run,
                })
                .collect();
            rmp_serde::to_vec(&rows).expect("intents always encode")
        });
        tx.prepare_cached(
            "INSERT INTO commits (session, generation, hash, parent, merged, state_hash, events_consumed, intents, runs)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?
        .execute(params![
            delta.session,
            commit.generation.0,
            &commit.hash.as_bytes()[..],
            commit.parent.as_ref().map(|p| &p.as_bytes()[..]),
            commit.merged.as_ref().map(|p| &p.as_bytes()[..]),
            &commit.state_hash.as_bytes()[..],
            commit.events_consumed as u64,
            intents,
            codec::encode_runs(&commit.runs),
        ])?;
        tx.commit()?;
        Ok(true)
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
    opened.map_err(|e| open_error(path, e))
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

/// The file's schema version, refusing what reactifact did not write: a negative or newer
/// version, tables of another program in a file without a version, or a version without
/// reactifact's tables. `0` is a new, empty database.
fn schema_version(conn: &Connection, path: &Path) -> Result<i64, OpenError> {
    // One statement, one snapshot: another process may be creating the schema right now.
    let (version, objects, ours): (i64, i64, i64) = conn
        .query_row(
            "SELECT (SELECT user_version FROM pragma_user_version), count(*),
                    count(CASE WHEN type = 'table' AND name IN ('sessions', 'commits', 'deliveries') THEN 1 END)
             FROM sqlite_master",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .map_err(|e| open_error(path, e))?;
    if version > SCHEMA_VERSION {
        return Err(OpenError::NewerSchema {
            path: path.into(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    let foreign = match version {
        ..0 => true,
        0 => objects > 0,
        _ => ours < 3,
    };
    if foreign {
        return Err(OpenError::Foreign { path: path.into() });
    }
    Ok(version)
}

/// WAL mode, the sync setting and the migrations, for a file known to be ours or new.
///
/// While several connections open one new file at once, SQLite can answer "database is
/// locked" at once, without waiting for the busy timeout (switching to WAL mode, or upgrading a
/// lock in a way that could deadlock). The steps are idempotent, so they are retried for up to
/// the busy timeout: concurrent first opens all succeed.
fn prepare_for_writing(
    conn: &mut Connection,
    synchronous: Synchronous,
    version: i64,
    path: &Path,
) -> Result<(), OpenError> {
    let sync = match synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    let mut prepare = || -> Result<i64, rusqlite::Error> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", sync)?;
        migrate(conn, version)
    };
    let give_up = std::time::Instant::now() + BUSY_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    let migrated = loop {
        match prepare() {
            Ok(migrated) => break migrated,
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) && std::time::Instant::now() < give_up => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(open_error(path, e)),
        }
    };
    if migrated != SCHEMA_VERSION {
        return Err(if migrated < 0 {
            OpenError::Foreign { path: path.into() }
        } else {
            OpenError::NewerSchema {
                path: path.into(),
                found: migrated,
                supported: SCHEMA_VERSION,
            }
        });
    }
    Ok(())
}

/// Upgrades the file to [`SCHEMA_VERSION`]; returns the version found under the lock (another
/// process may have migrated meanwhile, possibly past this build, which the caller refuses).
fn migrate(conn: &mut Connection, from: i64) -> Result<i64, rusqlite::Error> {
    if from >= SCHEMA_VERSION {
        return Ok(from);
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Exclusive)?;
    let current: i64 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    let Some(scripts) = usize::try_from(current).ok().and_then(|from| MIGRATIONS.get(from..)) else {
        return Ok(current);
    };
    for script in scripts {
        tx.execute_batch(script)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(SCHEMA_VERSION)
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
        runs,
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

impl SqliteStore {
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
            return Err(StoreError::SessionExists {
                path: self.path.clone(),
                session: branch.to_owned(),
            });
        }
        Ok(SqliteStore {
            conn: Conn(Mutex::new(conn)),
            path: self.path.clone(),
            session: branch.to_owned(),
            read_only: false,
            generation: at,
            new_session: false,
            unprepared: None,
        })
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
            Ok(false) => Err(StoreError::Conflict {
                path: self.path.clone(),
                session: self.session.clone(),
                expected: self.generation,
            }),
            Err(e) => Err(self.sqlite_error(e)),
        }
    }

    fn consume_events(&mut self, session: &str, before: u64) -> Result<(), StoreError> {
        self.check_writable()?;
        // Fenced like a commit: a copy that is behind the session (another writer committed,
        // or consumed further) is refused instead of losing events or running them again.
        let fenced = self
            .conn
            .get()
            .prepare_cached(
                "UPDATE sessions SET consumed_seq = ?2 WHERE name = ?1 AND generation = ?3 AND consumed_seq <= ?2",
            )
            .and_then(|mut stmt| stmt.execute(params![session, before, self.generation]))
            .map_err(|e| self.sqlite_error(e))?;
        if fenced == 0 {
            return Err(StoreError::Conflict {
                path: self.path.clone(),
                session: self.session.clone(),
                expected: self.generation,
            });
        }
        Ok(())
    }

    fn save_deliveries(&mut self, entries: &mut dyn Iterator<Item = &Delivery>) -> Result<(), StoreError> {
        self.check_writable()?;
        self.insert_deliveries(entries).map_err(|e| self.sqlite_error(e))
    }

    fn describe(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_row_written_before_interrupted_attempts_were_kept_still_decodes() {
        // The row as it was written before the `interrupted` field.
        #[derive(Serialize)]
        struct OldRow<'a> {
            key: &'a str,
            status: u8,
            attempts: u32,
            last_error: Option<&'a str>,
            lease: Option<(&'a str, i64)>,
            expired_leases: u32,
            updated_at: i64,
            delivered_at: Option<i64>,
            next_attempt_at: Option<i64>,
        }
        let old = rmp_serde::to_vec(&vec![OldRow {
            key: "k",
            status: 3,
            attempts: 2,
            last_error: Some("down"),
            lease: None,
            expired_leases: 1,
            updated_at: 5,
            delivered_at: None,
            next_attempt_at: Some(9),
        }])
        .unwrap();
        let rows: Vec<DeliveryRow<'_>> = rmp_serde::from_slice(&old).unwrap();
        assert_eq!(
            (rows[0].attempts, rows[0].expired_leases, rows[0].interrupted),
            (2, 1, 0)
        );
        assert_eq!(rows[0].next_attempt_at, Some(9));
    }
}
