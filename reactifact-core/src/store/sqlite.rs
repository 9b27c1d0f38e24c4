//! The embedded durable store: one SQLite file (WAL mode), many named sessions.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};

use super::codec;
use super::{CommitDelta, Loaded, OpenError, OpenOptions, Store, StoreError, Synchronous};
use crate::action::{ActionKey, Intent};
use crate::artifact::{ArtifactId, Generation, Kind, Stored, Version};
use crate::commit::Commit;
use crate::event::QueuedEvent;
use crate::hash::{self, CommitHash, StateHash};
use crate::ledger::{Delivery, DeliveryStatus, Lease};
use crate::state::Relation;

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
        next_created INTEGER NOT NULL,
        consumed_seq INTEGER NOT NULL,
        created_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE artifacts (
        session TEXT NOT NULL,
        id TEXT NOT NULL,
        kind TEXT NOT NULL,
        version INTEGER NOT NULL,
        hash BLOB NOT NULL,
        generation INTEGER NOT NULL,
        created INTEGER NOT NULL,
        bytes BLOB NOT NULL,
        PRIMARY KEY (session, id)
    ) WITHOUT ROWID;
    CREATE TABLE relations (
        session TEXT NOT NULL,
        src TEXT NOT NULL,
        name TEXT NOT NULL,
        dst TEXT NOT NULL,
        PRIMARY KEY (session, src, name, dst)
    ) WITHOUT ROWID;
    CREATE TABLE commits (
        session TEXT NOT NULL,
        generation INTEGER NOT NULL,
        hash BLOB NOT NULL,
        parent BLOB,
        state_hash BLOB NOT NULL,
        events_consumed INTEGER NOT NULL,
        runs BLOB NOT NULL,
        first_event_seq INTEGER NOT NULL,
        events BLOB NOT NULL,
        PRIMARY KEY (session, generation)
    ) WITHOUT ROWID;
    CREATE TABLE ledger (
        seq INTEGER PRIMARY KEY,
        key TEXT NOT NULL UNIQUE,
        session TEXT NOT NULL,
        kind TEXT NOT NULL,
        payload BLOB NOT NULL,
        generation INTEGER NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        last_error TEXT,
        lease_owner TEXT,
        lease_expires INTEGER,
        expired_leases INTEGER NOT NULL,
        recorded_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        delivered_at INTEGER
    );
    ",
];

pub(crate) struct SqliteStore {
    conn: Connection,
    path: PathBuf,
    session: String,
    read_only: bool,
    /// The session's generation as this store last wrote or read it: commits are fenced on it.
    generation: u64,
}

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

fn status_name(status: DeliveryStatus) -> &'static str {
    match status {
        DeliveryStatus::Pending => "pending",
        DeliveryStatus::InFlight => "in_flight",
        DeliveryStatus::Delivered => "delivered",
        DeliveryStatus::Failed => "failed",
    }
}

fn digest(bytes: &[u8], what: &str) -> Result<[u8; 32], String> {
    bytes
        .try_into()
        .map_err(|_| format!("{what} is {} bytes, not a 32-byte hash", bytes.len()))
}

/// Maps a SQLite error met while opening to what the user should hear.
fn open_error(path: &Path, e: rusqlite::Error) -> OpenError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => OpenError::NotADatabase { path: path.into() },
        Some(ErrorCode::DatabaseCorrupt) => OpenError::Corrupt {
            path: path.into(),
            detail: e.to_string(),
        },
        _ => OpenError::Sqlite {
            path: path.into(),
            source: e,
        },
    }
}

impl SqliteStore {
    /// Opens (or creates) the file and the session and loads the session.
    pub(crate) fn open(path: &Path, session: &str, options: &OpenOptions) -> Result<(SqliteStore, Loaded), OpenError> {
        let corrupt = |detail: String| OpenError::Corrupt {
            path: path.into(),
            detail,
        };
        let flags = if options.read_only {
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
        } else {
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX
        };
        let mut conn = Connection::open_with_flags(path, flags).map_err(|e| open_error(path, e))?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(|e| open_error(path, e))?;
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(|e| open_error(path, e))?;
        if version > SCHEMA_VERSION {
            return Err(OpenError::NewerSchema {
                path: path.into(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        if options.read_only {
            if version < SCHEMA_VERSION {
                return Err(OpenError::NoSuchSession {
                    path: path.into(),
                    session: session.into(),
                });
            }
        } else {
            conn.pragma_update(None, "journal_mode", "WAL")
                .map_err(|e| open_error(path, e))?;
            let sync = match options.synchronous {
                Synchronous::Full => "FULL",
                Synchronous::Normal => "NORMAL",
            };
            conn.pragma_update(None, "synchronous", sync)
                .map_err(|e| open_error(path, e))?;
            migrate(&mut conn, version).map_err(|e| open_error(path, e))?;
        }

        let row: Option<(u64, u64, u64)> = conn
            .query_row(
                "SELECT generation, next_created, consumed_seq FROM sessions WHERE name = ?1",
                [session],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .optional()
            .map_err(|e| open_error(path, e))?;
        let (generation, next_created, consumed_seq) = match row {
            Some(row) => row,
            None if options.create && !options.read_only => {
                conn.execute(
                    "INSERT INTO sessions (name, generation, head, next_created, consumed_seq, created_at)
                     VALUES (?1, 0, NULL, 0, 0, ?2)",
                    params![session, millis(SystemTime::now())],
                )
                .map_err(|e| open_error(path, e))?;
                (0, 0, 0)
            }
            None => {
                return Err(OpenError::NoSuchSession {
                    path: path.into(),
                    session: session.into(),
                })
            }
        };

        let mut store = SqliteStore {
            conn,
            path: path.into(),
            session: session.into(),
            read_only: options.read_only,
            generation,
        };
        let mut loaded = store.load(next_created, consumed_seq).map_err(|e| match e {
            LoadError::Sqlite(e) => open_error(path, e),
            LoadError::Corrupt(detail) => corrupt(detail),
        })?;
        if !options.read_only {
            loaded.reclaimed = store
                .reclaim_expired_leases(&mut loaded.deliveries)
                .map_err(|e| open_error(path, e))?;
        }
        Ok((store, loaded))
    }

    fn load(&mut self, next_created: u64, consumed_seq: u64) -> Result<Loaded, LoadError> {
        let session = self.session.as_str();
        let mut artifacts = Vec::new();
        let mut stmt = self.conn.prepare(
            "SELECT id, kind, version, hash, generation, created, bytes FROM artifacts
             WHERE session = ?1 ORDER BY created",
        )?;
        let mut rows = stmt.query([session])?;
        while let Some(row) = rows.next()? {
            let id: String = row.get(0)?;
            let kind: String = row.get(1)?;
            let stored_hash: Vec<u8> = row.get(3)?;
            let bytes: Vec<u8> = row.get(6)?;
            let hash = hash::content_hash(&bytes);
            if hash.as_bytes()[..] != stored_hash[..] {
                return Err(LoadError::Corrupt(format!(
                    "artifact `{id}` (kind `{kind}`): its bytes do not match its content hash"
                )));
            }
            artifacts.push(Stored {
                id: ArtifactId::from(id),
                kind: Kind::intern(&kind),
                version: Version(row.get(2)?),
                hash,
                generation: Generation(row.get(4)?),
                created: row.get(5)?,
                bytes: Arc::from(bytes),
            });
        }
        drop(rows);
        drop(stmt);

        let mut relations = Vec::new();
        let mut stmt = self
            .conn
            .prepare("SELECT src, name, dst FROM relations WHERE session = ?1")?;
        let mut rows = stmt.query([session])?;
        while let Some(row) = rows.next()? {
            let src: String = row.get(0)?;
            let name: String = row.get(1)?;
            let dst: String = row.get(2)?;
            relations.push(Relation::new(src, &name, dst));
        }
        drop(rows);
        drop(stmt);

        // The event queue is the tail of the events the commits emitted: those numbered
        // `consumed_seq` and up. Each commit row holds the events it emitted.
        let mut events = Vec::new();
        let mut next_event_seq = 0;
        let mut commits = Vec::new();
        let mut stmt = self.conn.prepare(
            "SELECT generation, hash, parent, state_hash, events_consumed, runs, first_event_seq, events
             FROM commits WHERE session = ?1 ORDER BY generation",
        )?;
        let mut rows = stmt.query([session])?;
        while let Some(row) = rows.next()? {
            let generation: u64 = row.get(0)?;
            let what = |field: &str| format!("commit {generation}: {field}");
            let hash: Vec<u8> = row.get(1)?;
            let parent: Option<Vec<u8>> = row.get(2)?;
            let state_hash: Vec<u8> = row.get(3)?;
            let runs: Vec<u8> = row.get(5)?;
            let runs = codec::decode_runs(&runs)
                .map_err(|e| LoadError::Corrupt(format!("commit {generation}: its runs do not decode: {e}")))?;
            let first_event_seq: u64 = row.get(6)?;
            let emitted: Vec<u8> = row.get(7)?;
            let emitted = codec::decode_events(&emitted, Generation(generation))
                .map_err(|e| LoadError::Corrupt(format!("commit {generation}: its events do not decode: {e}")))?;
            next_event_seq = first_event_seq + emitted.len() as u64;
            if next_event_seq > consumed_seq {
                let skip = consumed_seq.saturating_sub(first_event_seq) as usize;
                events.extend(
                    emitted
                        .into_iter()
                        .enumerate()
                        .skip(skip)
                        .map(|(i, event)| QueuedEvent {
                            seq: first_event_seq + i as u64,
                            event,
                        }),
                );
            }
            commits.push(Commit {
                generation: Generation(generation),
                hash: CommitHash(digest(&hash, &what("hash")).map_err(LoadError::Corrupt)?),
                parent: parent
                    .map(|p| digest(&p, &what("parent")).map(CommitHash))
                    .transpose()
                    .map_err(LoadError::Corrupt)?,
                state_hash: StateHash(digest(&state_hash, &what("state hash")).map_err(LoadError::Corrupt)?),
                events_consumed: row.get::<_, u64>(4)? as usize,
                runs,
            });
        }
        drop(rows);
        drop(stmt);
        if commits.len() as u64 != self.generation {
            return Err(LoadError::Corrupt(format!(
                "session `{session}` is at generation {} but its log holds {} commits",
                self.generation,
                commits.len()
            )));
        }

        let mut deliveries = Vec::new();
        let mut stmt = self.conn.prepare(
            "SELECT key, kind, payload, generation, status, attempts, last_error, lease_owner, lease_expires,
                    expired_leases, recorded_at, updated_at, delivered_at
             FROM ledger ORDER BY seq",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let key: String = row.get(0)?;
            let kind: String = row.get(1)?;
            let payload: Vec<u8> = row.get(2)?;
            let status: String = row.get(4)?;
            let status = match status.as_str() {
                "pending" => DeliveryStatus::Pending,
                "in_flight" => DeliveryStatus::InFlight,
                "delivered" => DeliveryStatus::Delivered,
                "failed" => DeliveryStatus::Failed,
                other => {
                    return Err(LoadError::Corrupt(format!(
                        "ledger entry `{key}` has unknown status `{other}`"
                    )))
                }
            };
            let lease_owner: Option<String> = row.get(7)?;
            let lease_expires: Option<i64> = row.get(8)?;
            deliveries.push(Delivery {
                intent: Intent {
                    key: ActionKey::from(key),
                    kind: Arc::from(kind),
                    payload: Arc::from(payload),
                    generation: Generation(row.get(3)?),
                    attempt: 0,
                },
                status,
                attempts: row.get(5)?,
                last_error: row.get(6)?,
                lease: lease_owner.map(|owner| Lease {
                    owner,
                    expires_at: from_millis(lease_expires.unwrap_or(0)),
                }),
                expired_leases: row.get(9)?,
                recorded_at: from_millis(row.get(10)?),
                updated_at: from_millis(row.get(11)?),
                delivered_at: row.get::<_, Option<i64>>(12)?.map(from_millis),
            });
        }
        drop(rows);
        drop(stmt);

        Ok(Loaded {
            artifacts,
            relations,
            events,
            commits,
            deliveries,
            next_created,
            next_event_seq,
            reclaimed: 0,
        })
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
            let owner = entry
                .lease
                .take()
                .map_or_else(|| "an unknown drainer".to_owned(), |l| l.owner);
            entry.status = DeliveryStatus::Pending;
            entry.expired_leases += 1;
            entry.updated_at = now;
            entry.last_error = Some(format!(
                "attempt {} was in flight under the lease of {owner}, which expired before its outcome was \
                 recorded; the receiver may have seen it, so it is delivered again with the same key",
                entry.attempts
            ));
            reclaimed.push(&*entry);
        }
        let count = reclaimed.len();
        if count > 0 {
            let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            save_deliveries(&tx, &mut reclaimed.into_iter())?;
            tx.commit()?;
            tracing::warn!(path = %self.path.display(), reclaimed = count, "in-flight deliveries with expired leases put back to pending");
        }
        Ok(count)
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

    fn write_commit(&mut self, delta: &CommitDelta<'_>) -> Result<bool, rusqlite::Error> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let session = delta.session;
        let commit = delta.commit;
        let fenced = tx
            .prepare_cached(
                "UPDATE sessions SET generation = ?1, head = ?2, next_created = ?3, consumed_seq = ?4
                 WHERE name = ?5 AND generation = ?6",
            )?
            .execute(params![
                commit.generation.0,
                &commit.hash.as_bytes()[..],
                delta.next_created,
                delta.consumed_before,
                session,
                self.generation,
            ])?;
        if fenced == 0 {
            return Ok(false);
        }
        {
            let mut put = tx.prepare_cached(
                "INSERT OR REPLACE INTO artifacts (session, id, kind, version, hash, generation, created, bytes)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?;
            let mut delete = tx.prepare_cached("DELETE FROM artifacts WHERE session = ?1 AND id = ?2")?;
            for (id, stored) in &delta.artifacts {
                match stored {
                    Some(s) => {
                        put.execute(params![
                            session,
                            id.as_str(),
                            s.kind.as_str(),
                            s.version.0,
                            &s.hash.as_bytes()[..],
                            s.generation.0,
                            s.created,
                            &s.bytes[..],
                        ])?;
                    }
                    None => {
                        delete.execute(params![session, id.as_str()])?;
                    }
                }
            }
        }
        {
            let mut link =
                tx.prepare_cached("INSERT OR IGNORE INTO relations (session, src, name, dst) VALUES (?1, ?2, ?3, ?4)")?;
            let mut unlink =
                tx.prepare_cached("DELETE FROM relations WHERE session = ?1 AND src = ?2 AND name = ?3 AND dst = ?4")?;
            for (r, present) in &delta.relations {
                let stmt = if *present { &mut link } else { &mut unlink };
                stmt.execute(params![session, r.from.as_str(), &*r.name, r.to.as_str()])?;
            }
        }
        tx.prepare_cached(
            "INSERT INTO commits (session, generation, hash, parent, state_hash, events_consumed, runs,
                 first_event_seq, events)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?
        .execute(params![
            session,
            commit.generation.0,
            &commit.hash.as_bytes()[..],
            commit.parent.as_ref().map(|p| p.as_bytes().to_vec()),
            &commit.state_hash.as_bytes()[..],
            commit.events_consumed as u64,
            codec::encode_runs(&commit.runs),
            delta.next_event_seq - delta.events.len() as u64,
            codec::encode_events(delta.events.iter().map(|q| &q.event)),
        ])?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT OR IGNORE INTO ledger (key, session, kind, payload, generation, status, attempts,
                     expired_leases, recorded_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, 0, ?7, ?7)",
            )?;
            for d in delta.deliveries {
                insert.execute(params![
                    d.intent.key.as_str(),
                    session,
                    &*d.intent.kind,
                    &d.intent.payload[..],
                    d.intent.generation.0,
                    status_name(d.status),
                    millis(d.recorded_at),
                ])?;
            }
        }
        tx.commit()?;
        Ok(true)
    }
}

fn migrate(conn: &mut Connection, from: i64) -> Result<(), rusqlite::Error> {
    if from >= SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Exclusive)?;
    // Re-read under the lock: another process may have migrated meanwhile.
    let current: i64 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    for script in &MIGRATIONS[current as usize..SCHEMA_VERSION as usize] {
        tx.execute_batch(script)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()
}

fn save_deliveries(
    tx: &rusqlite::Transaction<'_>,
    entries: &mut dyn Iterator<Item = &Delivery>,
) -> Result<(), rusqlite::Error> {
    let mut update = tx.prepare_cached(
        "UPDATE ledger SET status = ?1, attempts = ?2, last_error = ?3, lease_owner = ?4, lease_expires = ?5,
             expired_leases = ?6, updated_at = ?7, delivered_at = ?8
         WHERE key = ?9",
    )?;
    for d in entries {
        update.execute(params![
            status_name(d.status),
            d.attempts,
            d.last_error,
            d.lease.as_ref().map(|l| l.owner.as_str()),
            d.lease.as_ref().map(|l| millis(l.expires_at)),
            d.expired_leases,
            millis(d.updated_at),
            d.delivered_at.map(millis),
            d.intent.key.as_str(),
        ])?;
    }
    Ok(())
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

impl Store for SqliteStore {
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
        self.conn
            .prepare_cached("UPDATE sessions SET consumed_seq = ?2 WHERE name = ?1")
            .and_then(|mut stmt| stmt.execute(params![session, before]))
            .map(|_| ())
            .map_err(|e| self.sqlite_error(e))
    }

    fn save_deliveries(&mut self, entries: &mut dyn Iterator<Item = &Delivery>) -> Result<(), StoreError> {
        self.check_writable()?;
        let result = (|| {
            let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            save_deliveries(&tx, entries)?;
            tx.commit()
        })();
        result.map_err(|e| self.sqlite_error(e))
    }

    fn describe(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }
}
