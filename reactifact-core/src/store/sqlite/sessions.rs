//! Read-only views of a store file for operators: the sessions it holds with their heads, and
//! its outbox opened for reading only. Nothing here writes to the file, creates it, or
//! switches it to WAL mode (as [`Context::open_with`](crate::Context::open_with) with
//! [`OpenOptions::read_only`](crate::OpenOptions::read_only) does not).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use rusqlite::Connection;

use super::outbox::SqliteOutbox;
use super::{check_header, digest, open_error, open_read_only, schema, SCHEMA_VERSION};
use crate::model::artifact::Generation;
use crate::model::hash::CommitHash;
use crate::store::SessionInfo;
use crate::store::{OpenError, Synchronous};

/// Opens the file at `path` read-only after the checks a read-only open makes: it must exist,
/// be a SQLite database written by reactifact, of a schema version this build reads.
fn open_checked(path: &Path) -> Result<Connection, OpenError> {
    let size = match std::fs::metadata(path) {
        Ok(metadata) => metadata.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(OpenError::NoSuchFile { path: path.into() }),
        Err(_) => 1, // SQLite says why it cannot be read.
    };
    if size == 0 {
        return Err(OpenError::Foreign { path: path.into() });
    }
    check_header(path, size)?;
    let conn = open_read_only(path)?;
    match schema::schema_version(&conn, path)? {
        // Only the sessions table is read, which every version this build reads has.
        schema::READS_FROM..=SCHEMA_VERSION => Ok(conn),
        0 => Err(OpenError::Foreign { path: path.into() }),
        found if found > SCHEMA_VERSION => Err(OpenError::NewerSchema {
            path: path.into(),
            found,
            supported: SCHEMA_VERSION,
        }),
        found => Err(OpenError::OlderSchema {
            path: path.into(),
            found,
            supported: SCHEMA_VERSION,
        }),
    }
}

/// The sessions of the SQLite store file at `path`, by name, each with its generation, head,
/// fork point, consumed event position and number of its own commits. Reads the `sessions`
/// table and counts each session's rows of the `commits` table (no commit is decoded or
/// checked: open a session to verify it). Writes nothing, and creates no file.
///
/// # Errors
/// As a read-only open: [`OpenError::NoSuchFile`], [`OpenError::NotADatabase`],
/// [`OpenError::Foreign`] (also for an empty file), [`OpenError::Corrupt`] (also for a session
/// row whose head is not a 32-byte hash, or whose generation, fork point or consumed position
/// is negative), [`OpenError::OlderSchema`],
/// [`OpenError::NewerSchema`].
#[allow(clippy::result_large_err)] // see `OpenError::Corrupt`
pub fn list_sessions(path: impl AsRef<Path>) -> Result<Vec<SessionInfo>, OpenError> {
    let path = path.as_ref();
    let conn = open_checked(path)?;
    let mut stmt = conn
        .prepare(
            "SELECT s.name, s.generation, s.head, s.parent, s.fork_generation, s.created_at, s.consumed_seq,
                    (SELECT count(*) FROM commits c WHERE c.session = s.name)
               FROM sessions s ORDER BY s.name",
        )
        .map_err(|e| open_error(path, e))?;
    let rows = stmt
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, Option<Vec<u8>>>(2)?,
                row.get::<_, Option<String>>(3)?,
                row.get::<_, Option<i64>>(4)?,
                row.get::<_, i64>(5)?,
                row.get::<_, i64>(6)?,
                row.get::<_, i64>(7)?,
            ))
        })
        .map_err(|e| open_error(path, e))?;
    let mut sessions = Vec::new();
    for row in rows {
        let (name, generation, head, parent, fork, created, consumed_seq, commits) =
            row.map_err(|e| open_error(path, e))?;
        let corrupt = |detail: String| OpenError::Corrupt {
            path: path.into(),
            detail: format!("session `{name}`: {detail}"),
            source: None,
        };
        let unsigned = |value: i64, what: &str| {
            u64::try_from(value).map_err(|_| corrupt(format!("its {what} is negative ({value})")))
        };
        let head = head
            .map(|bytes| digest(&bytes, "the head").map(CommitHash))
            .transpose()
            .map_err(corrupt)?;
        let forked_from = match parent {
            Some(parent) => Some((parent, Generation(unsigned(fork.unwrap_or(0), "fork generation")?))),
            None => None,
        };
        sessions.push(SessionInfo {
            generation: Generation(unsigned(generation, "generation")?),
            head,
            forked_from,
            created_at: UNIX_EPOCH + Duration::from_millis(u64::try_from(created).unwrap_or(0)),
            consumed_seq: unsigned(consumed_seq, "consumed event position")?,
            commits: unsigned(commits, "number of commits")?,
            name,
        });
    }
    Ok(sessions)
}

impl SqliteOutbox {
    /// Opens the outbox of the store file at `path` for reading only: its reads
    /// ([`get`](crate::OutboxStore::get), [`list`](crate::OutboxStore::list),
    /// [`counts`](crate::OutboxStore::counts), [`next_due`](crate::OutboxStore::next_due))
    /// work, and every write (a claim, a record, a retry, …) fails with
    /// [`StoreError::ReadOnly`](crate::StoreError::ReadOnly). Nothing in the file is changed,
    /// and no `-wal` or `-shm` file is left behind when no process has the file open.
    ///
    /// # Errors
    /// As [`list_sessions`].
    #[allow(clippy::result_large_err)] // see `OpenError::Corrupt`
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Arc<SqliteOutbox>, OpenError> {
        let path = path.as_ref();
        // The checks, on a connection of their own; the outbox's connection lives on its thread.
        drop(open_checked(path)?);
        SqliteOutbox::for_store(path, Synchronous::Full, Some("(read-only outbox)")).map(Arc::new)
    }
}
