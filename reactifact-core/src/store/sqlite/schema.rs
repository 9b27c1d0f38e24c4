//! The file's schema: its version (`PRAGMA user_version`), the check that a file is ours,
//! and the forward migrations.
//!
//! - Version 1: `sessions`, `commits` (with an `intents` side column holding the ledger's
//!   copy of each commit's intents) and `deliveries` (one row per ledger write, folded on
//!   open).
//! - Version 2: the outbox is a table of the store. `outbox` (one row per idempotency key, with
//!   the committed `PendingAction` bytes, their hash and a row digest), `outbox_members`
//!   (sessions a key is attached to) and `outbox_purged` (tombstones of purged keys).
//!   `commits.intents` is no longer written (NULL) and `deliveries` is dropped.
//! - Version 3: `checkpoints` (the encoded state of a session right after one of its commits,
//!   named by the commit's generation, hash and state hash, with a digest over all of it). A
//!   version-2 file reads as a version-3 file without checkpoints, so a read-only open takes
//!   it as it is; a writable open migrates it (adds the table) once its log verified.
//! - Version 4: the attempt history. `outbox_attempts` (one row per attempt that ended other
//!   than delivered: who claimed it, when, its lease, when and how it ended), four columns of
//!   `outbox` that keep the last claim after it ended (`claim_owner`, `claimed_at`,
//!   `claim_until`, `claim_token`: a delivered attempt is read from them, when `claim_token`
//!   is the row's token — a claim by an older build leaves them behind), and
//!   `outbox_cancelled`, a partial index of cancelled rows for a purge of cancelled ones. None of it is in the row digest:
//!   the history is diagnostic, and no transition reads it. Version 2 and 3 files read as
//!   version-4 files without a history; a standalone outbox, or a writable open, migrates them.
//! - Version 5: human approval. Four columns of `outbox` hold an operator's decision on an
//!   intent that awaited approval (`decision`: 1 approved, 2 rejected; `decided_by`,
//!   `decided_at`, `decision_reason`), digested with the row whenever one is set (a row
//!   without a decision keeps its digest, so no row is rewritten); the status codes 7
//!   (awaiting approval) and 8 (rejected, final); `outbox_final` covers rejected rows too, and
//!   `outbox_rejected` is a partial index of them for a purge of rejected ones. Files of
//!   versions 2 to 4 read as version-5 files without decisions (a read-only connection sees
//!   the four columns as NULL through a temporary view); a writable open migrates them.
//! - Version 6: trace context. One nullable column of `outbox`, `trace_parent`: the W3C trace
//!   context (`TraceParent::to_bytes`, 25 bytes) of the produce run that committed the
//!   intent, written at registration and never changed. It is kept beside the intent, outside
//!   the hashed record and outside the row digest (advisory: a value that does not decode
//!   reads as none). Files of versions 2 to 5 read as version-6 files without trace context
//!   (a read-only connection sees the column as NULL through the temporary view); a writable
//!   open migrates them, adding the column (NULL in every row, whose digest does not change).
//! - Version 7: ordering groups. One nullable column of `outbox`, `grp`: the ordering group
//!   the intent's `PendingAction` names, written at registration and never changed, outside
//!   the row digest (a claim checks it against the hashed bytes); the status code 9
//!   (blocked: behind an earlier open row of its group, not due); and `outbox_group_open`, a
//!   partial index of the open rows of groups, by which a registration finds whether its
//!   group has an open row and a row that became final finds its group's next one. Files of
//!   versions 2 to 6 read as version-7 files without groups (the temporary view shows `grp`
//!   as NULL); a writable open migrates them (no row is rewritten).
//! - Version 8: rate limits. `outbox_rates` (the state of each rate limit's bucket) and
//!   `outbox_kind_due`, the due rows by kind.
//! - Version 9: approvals bound to what they approve. One nullable column of `outbox`,
//!   `decided_digest`: the action hash of the row when an operator approved or rejected it,
//!   digested with the decision whenever it is set (a decision an older build recorded has
//!   none, and keeps its digest: no row is rewritten); a claim hands out an approved row only
//!   while its action hash is that digest. `call_answers`: the answers of recorded calls, kept
//!   as they arrive before the generation of their run commits, dropped once a run of the same
//!   produce on the same trigger commits (a read-only open of an older file reads none). And
//!   `commits_hash`, an index of the commits by their hash (a read of a commit by its hash
//!   walked the whole table). Files of versions 2
//!   to 8 read as version-9 files whose decisions have no digest (the temporary view shows the
//!   column as NULL); a writable open migrates them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use rusqlite::{params, Connection, ErrorCode, Transaction, TransactionBehavior};
use serde::Deserialize;

use super::row::{self, Row};
use super::{open_error, LoadError, BUSY_TIMEOUT};
use crate::model::patch::Op;
use crate::store::codec;
use crate::store::{OpenError, Synchronous};

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: i64 = 9;

/// The oldest schema version this build reads without migrating it, in a read-only open:
/// version 3 only adds the checkpoints table, version 4 the attempt history, version 5 the
/// decision columns and version 6 the trace context.
pub(crate) const READS_FROM: i64 = 2;

/// The first schema.
const V1: &str = "
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
";

/// The outbox tables of version 2.
pub(super) const V2_TABLES: &str = "
    CREATE TABLE outbox (
        seq INTEGER PRIMARY KEY,
        key TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        session TEXT NOT NULL,
        origin_commit BLOB NOT NULL,
        origin_gen INTEGER NOT NULL,
        origin_run INTEGER NOT NULL,
        action_hash BLOB NOT NULL,
        bytes BLOB NOT NULL,
        recorded_at INTEGER NOT NULL,
        status INTEGER NOT NULL,
        due_at INTEGER,
        token INTEGER NOT NULL,
        owner TEXT,
        lease_until INTEGER,
        attempts INTEGER NOT NULL,
        expired INTEGER NOT NULL,
        interrupted INTEGER NOT NULL,
        last_error TEXT,
        cancel_reason TEXT,
        updated_at INTEGER NOT NULL,
        delivered_at INTEGER,
        next_attempt_at INTEGER,
        digest BLOB NOT NULL,
        CHECK ((status = 1) = (owner IS NOT NULL AND lease_until IS NOT NULL)),
        CHECK (due_at IS NULL OR status IN (0, 3)),
        CHECK (status <> 0 OR due_at IS NOT NULL)
    );
    CREATE INDEX outbox_due ON outbox (due_at, seq) WHERE due_at IS NOT NULL;
    CREATE INDEX outbox_session_due ON outbox (session, due_at, seq) WHERE due_at IS NOT NULL;
    CREATE INDEX outbox_leases ON outbox (lease_until) WHERE lease_until IS NOT NULL;
    CREATE INDEX outbox_final ON outbox (updated_at, seq) WHERE status IN (2, 6);
    CREATE TABLE outbox_members (
        session TEXT NOT NULL,
        key TEXT NOT NULL,
        PRIMARY KEY (session, key)
    ) WITHOUT ROWID;
    CREATE INDEX outbox_members_key ON outbox_members (key);
    CREATE TABLE outbox_purged (
        key TEXT PRIMARY KEY,
        purged_at INTEGER NOT NULL
    ) WITHOUT ROWID;
";

/// The table of version 3.
const V3_TABLES: &str = "
    CREATE TABLE checkpoints (
        session TEXT NOT NULL,
        generation INTEGER NOT NULL,
        hash BLOB NOT NULL,
        state_hash BLOB NOT NULL,
        body BLOB NOT NULL,
        digest BLOB NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (session, generation)
    ) WITHOUT ROWID;
";

/// The columns and the table of version 4: the attempt history.
pub(super) const V4_CHANGES: &str = "
    ALTER TABLE outbox ADD COLUMN claim_owner TEXT;
    ALTER TABLE outbox ADD COLUMN claimed_at INTEGER;
    ALTER TABLE outbox ADD COLUMN claim_until INTEGER;
    ALTER TABLE outbox ADD COLUMN claim_token INTEGER;
    CREATE INDEX outbox_cancelled ON outbox (updated_at, seq) WHERE status = 6;
    CREATE TABLE outbox_attempts (
        key TEXT NOT NULL,
        token INTEGER NOT NULL,
        number INTEGER NOT NULL,
        owner TEXT NOT NULL,
        claimed_at INTEGER NOT NULL,
        lease_until INTEGER NOT NULL,
        ended_at INTEGER NOT NULL,
        outcome INTEGER NOT NULL,
        error TEXT,
        retry_at INTEGER,
        PRIMARY KEY (key, token)
    ) WITHOUT ROWID;
";

/// The columns and indexes of version 5: the operator's decision on an intent that awaited
/// approval.
pub(super) const V5_CHANGES: &str = "
    ALTER TABLE outbox ADD COLUMN decision INTEGER;
    ALTER TABLE outbox ADD COLUMN decided_by TEXT;
    ALTER TABLE outbox ADD COLUMN decided_at INTEGER;
    ALTER TABLE outbox ADD COLUMN decision_reason TEXT;
    DROP INDEX outbox_final;
    CREATE INDEX outbox_final ON outbox (updated_at, seq) WHERE status IN (2, 6, 8);
    CREATE INDEX outbox_rejected ON outbox (updated_at, seq) WHERE status = 8;
";

/// The column of version 6: the trace context kept beside each intent (outside the digest).
pub(super) const V6_CHANGES: &str = "
    ALTER TABLE outbox ADD COLUMN trace_parent BLOB;
";

/// The column and index of version 7: the ordering group kept beside each intent (outside
/// the digest), and the open rows of each group.
pub(super) const V7_CHANGES: &str = "
    ALTER TABLE outbox ADD COLUMN grp TEXT;
    CREATE INDEX outbox_group_open ON outbox (grp, seq) WHERE grp IS NOT NULL AND status NOT IN (2, 6, 8);
";

/// The table and index of version 8: the state of each rate limit's bucket (microseconds
/// since the Unix epoch), written by claims and pauses, and the due rows by kind, from which
/// a rate-limited claim takes each kind's share.
pub(super) const V8_CHANGES: &str = "
    CREATE TABLE outbox_rates (
        name TEXT PRIMARY KEY,
        tat INTEGER NOT NULL,
        paused_until INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX outbox_kind_due ON outbox (kind, due_at, seq) WHERE due_at IS NOT NULL;
";

/// Version 9: the digest an operator's decision was made on (digested with the decision when
/// set), the answers of recorded calls kept before their runs' generations commit (one row per
/// answer, in the order kept), and the commits by their hash.
pub(super) const V9_CHANGES: &str = "
    ALTER TABLE outbox ADD COLUMN decided_digest BLOB;
    CREATE TABLE call_answers (
        seq INTEGER PRIMARY KEY,
        session TEXT NOT NULL,
        produce TEXT NOT NULL,
        trigger TEXT NOT NULL,
        run BLOB NOT NULL,
        call BLOB NOT NULL
    );
    CREATE INDEX call_answers_run ON call_answers (session, produce, trigger);
    CREATE INDEX commits_hash ON commits (hash);
";

/// Whether a file of this version keeps the answers of recorded calls.
pub(super) fn has_answers(version: i64) -> bool {
    version >= 9
}

/// Whether a file of this version keeps decisions (an older one is read through a view that
/// shows none).
pub(super) fn has_decisions(version: i64) -> bool {
    version >= 5
}

/// Whether a file of this version keeps trace context (an older one is read through a view
/// that shows none).
pub(super) fn has_trace_context(version: i64) -> bool {
    version >= 6
}

/// On a read-only connection to a file of versions 2 to 8: a temporary view named `outbox`
/// (temporary objects come first in name resolution) that adds the columns the file lacks,
/// all NULL — the decision columns of version 5 (for versions 2 to 4), the trace context of
/// version 6, the group of version 7 and the approved digest of version 9 — so that every
/// read of this build works on the file as it is. Nothing is written to the file; a file of the current version gets no view.
pub(super) fn view_older_outbox(conn: &Connection, version: i64) -> rusqlite::Result<()> {
    let decisions = if has_decisions(version) {
        ""
    } else {
        ", NULL AS decision, NULL AS decided_by, NULL AS decided_at, NULL AS decision_reason"
    };
    let trace = if has_trace_context(version) {
        ""
    } else {
        ", NULL AS trace_parent"
    };
    let group = if version >= 7 { "" } else { ", NULL AS grp" };
    let decided = if version >= 9 { "" } else { ", NULL AS decided_digest" };
    if decisions.is_empty() && trace.is_empty() && group.is_empty() && decided.is_empty() {
        return Ok(());
    }
    conn.execute_batch(&format!(
        "CREATE TEMP VIEW IF NOT EXISTS outbox AS SELECT *{decisions}{trace}{group}{decided} FROM main.outbox"
    ))
}

/// The tables of each version, by which a file of that version is recognised as ours: those
/// of version 1 (its ledger, `deliveries`, only there), and those each later version
/// [added](ADDED) up to it.
fn tables_of(version: i64) -> Vec<&'static str> {
    let mut tables = vec!["sessions", "commits"];
    if version == 1 {
        tables.push("deliveries");
    }
    tables.extend(
        ADDED
            .iter()
            .filter(|(added, ..)| *added <= version)
            .flat_map(|(_, added, _)| added.iter().copied()),
    );
    tables
}

/// Whether a file of this version keeps the attempt history.
pub(super) fn has_attempts(version: i64) -> bool {
    version >= 4
}

/// Whether a file of this version has the checkpoints table.
pub(super) fn has_checkpoints(version: i64) -> bool {
    version >= 3
}

/// What each version added that a file of an older version cannot hold: the tables it
/// created, and the columns it added to `outbox`. (Version 1 → 2 creates the outbox with the
/// columns of versions 5 to 7, but leaves the file at the current version.)
const ADDED: [(i64, &[&str], &[&str]); 8] = [
    (2, &["outbox", "outbox_members", "outbox_purged"], &[]),
    (3, &["checkpoints"], &[]),
    (
        4,
        &["outbox_attempts"],
        &["claim_owner", "claimed_at", "claim_until", "claim_token"],
    ),
    (5, &[], &["decision", "decided_by", "decided_at", "decision_reason"]),
    (6, &[], &["trace_parent"]),
    (7, &[], &["grp"]),
    (8, &["outbox_rates"], &[]),
    (9, &["call_answers"], &["decided_digest"]),
];

/// The first table or `outbox` column of `tables` and `columns` that a version after `version`
/// added, named with that version: a file whose stated version is older than what it holds
/// (its `user_version` was lowered outside reactifact). Migrating it would fail half way on
/// SQLite's own "already exists".
fn ahead_of(version: i64, tables: &[&str], columns: &[&str]) -> Option<String> {
    ADDED
        .iter()
        .filter(|(added, ..)| *added > version)
        .find_map(|(added, new_tables, new_columns)| {
            let table = new_tables
                .iter()
                .find(|t| tables.contains(t))
                .map(|t| format!("table `{t}`"));
            let column = || {
                new_columns
                    .iter()
                    .find(|c| columns.contains(c))
                    .map(|c| format!("column `outbox.{c}`"))
            };
            table
                .or_else(column)
                .map(|what| format!("{what}, which schema version {added} added"))
        })
}

/// The file's schema version, refusing what reactifact did not write: a negative or newer
/// version, tables of another program in a file without a version, or a version without
/// reactifact's tables; and a file whose version is older than the tables and columns it
/// holds ([`OpenError::Corrupt`]: its version was changed outside reactifact). `0` is a new,
/// empty database. Reads only.
pub(super) fn schema_version(conn: &Connection, path: &Path) -> Result<i64, OpenError> {
    // One statement, one snapshot: another process may be creating or migrating the schema
    // right now. The outbox's columns are the file's own (`main`), not those of the view a
    // read-only connection puts in front of an older outbox.
    let (version, objects, tables, columns): (i64, i64, String, String) = conn
        .query_row(
            "SELECT (SELECT user_version FROM pragma_user_version), count(*),
                    coalesce(group_concat(CASE WHEN type = 'table' THEN name END, ' '), ''),
                    (SELECT coalesce(group_concat(name, ' '), '') FROM pragma_table_info('outbox', 'main'))
             FROM sqlite_master",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )
        .map_err(|e| open_error(path, e))?;
    if version > SCHEMA_VERSION {
        return Err(OpenError::NewerSchema {
            path: path.into(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    let present: Vec<&str> = tables.split(' ').collect();
    if version > 0 {
        let columns: Vec<&str> = columns.split(' ').collect();
        if let Some(ahead) = ahead_of(version, &present, &columns) {
            return Err(OpenError::Corrupt {
                path: path.into(),
                detail: format!(
                    "its schema version is {version}, but it has {ahead}: its version was changed outside \
                     reactifact, and the file was left as it was"
                ),
                source: None,
            });
        }
    }
    let foreign = match version {
        ..0 => true,
        0 => objects > 0,
        _ => !tables_of(version).iter().all(|t| present.contains(t)),
    };
    if foreign {
        return Err(OpenError::Foreign { path: path.into() });
    }
    Ok(version)
}

/// WAL mode, the sync setting and the migrations, for a file known to be ours or new (and,
/// for an older version, whose log verified).
///
/// While several connections open one new file at once, SQLite can answer "database is
/// locked" at once, without waiting for the busy timeout (switching to WAL mode, or upgrading a
/// lock in a way that could deadlock). The steps are idempotent, so they are retried for up to
/// the busy timeout: concurrent first opens all succeed.
pub(super) fn prepare_for_writing(
    conn: &mut Connection,
    synchronous: Synchronous,
    version: i64,
    path: &Path,
) -> Result<(), OpenError> {
    let sync = match synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    let mut prepare = || -> Result<i64, LoadError> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", sync)?;
        migrate(conn, version)
    };
    let give_up = std::time::Instant::now() + BUSY_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    let migrated = loop {
        match prepare() {
            Ok(migrated) => break migrated,
            Err(LoadError::Sqlite(e))
                if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) && std::time::Instant::now() < give_up =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(LoadError::Sqlite(e)) => return Err(open_error(path, e)),
            Err(LoadError::Corrupt(detail)) => {
                return Err(OpenError::Corrupt {
                    path: path.into(),
                    detail,
                    source: None,
                })
            }
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

/// Upgrades the file to [`SCHEMA_VERSION`] in one exclusive transaction; returns the version
/// found under the lock (another process may have migrated meanwhile, possibly past this
/// build, which the caller refuses).
pub(super) fn migrate(conn: &mut Connection, from: i64) -> Result<i64, LoadError> {
    if from >= SCHEMA_VERSION {
        return Ok(from);
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Exclusive)?;
    let current: i64 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    match current {
        0 => {
            tx.execute_batch(V1)?;
            migrate_1_to_2(&tx)?;
            tx.execute_batch(V3_TABLES)?;
            tx.execute_batch(V4_CHANGES)?;
        }
        // (Version 1 → 2 creates the outbox with the decision columns of version 5, the trace
        // context of version 6 and the group of version 7, which its rows are written with.)
        1 => {
            migrate_1_to_2(&tx)?;
            tx.execute_batch(V3_TABLES)?;
            tx.execute_batch(V4_CHANGES)?;
        }
        // Version 2 → 3: the checkpoints table, empty (the first checkpoint is written after
        // the next `checkpoint_every` commits, or on request).
        2 => {
            tx.execute_batch(V3_TABLES)?;
            tx.execute_batch(V4_CHANGES)?;
            tx.execute_batch(V5_CHANGES)?;
            tx.execute_batch(V6_CHANGES)?;
            tx.execute_batch(V7_CHANGES)?;
        }
        // Version 3 → 4: the attempt history, empty (attempts that ended before it are not in
        // it), and the last-claim columns, NULL until the next claim.
        3 => {
            tx.execute_batch(V4_CHANGES)?;
            tx.execute_batch(V5_CHANGES)?;
            tx.execute_batch(V6_CHANGES)?;
            tx.execute_batch(V7_CHANGES)?;
        }
        // Version 4 → 5: the decision columns, NULL in every row (whose digest does not
        // change), and the indexes of rejected rows.
        4 => {
            tx.execute_batch(V5_CHANGES)?;
            tx.execute_batch(V6_CHANGES)?;
            tx.execute_batch(V7_CHANGES)?;
        }
        // Version 5 → 6: the trace context, NULL in every row (it is outside the digest: no
        // row is rewritten). Intents registered before it read without one.
        5 => {
            tx.execute_batch(V6_CHANGES)?;
            tx.execute_batch(V7_CHANGES)?;
        }
        // Version 6 → 7: the ordering group, NULL in every row (outside the digest: no row is
        // rewritten), and the index of groups' open rows (empty).
        6 => tx.execute_batch(V7_CHANGES)?,
        // Version 7 → 8: the rate limits' buckets (empty: every bucket starts full).
        7 => {}
        // Version 8 → 9: below.
        8 => {}
        _ => return Ok(current),
    }
    if current < 8 {
        tx.execute_batch(V8_CHANGES)?;
    }
    // Version 8 → 9: the approved digest, NULL in every row (decisions recorded before it
    // have none, and keep their digest: no row is rewritten), the answers kept before a commit
    // (none yet) and the commits by hash.
    tx.execute_batch(V9_CHANGES)?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(SCHEMA_VERSION)
}

/// An intent as version 1 registered it (the `commits.intents` column; rmp encodes it as an
/// array, so every field is decoded, in order, though only the key and time are used).
#[derive(Deserialize)]
#[allow(dead_code)]
struct IntentRow<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(with = "serde_bytes", borrow)]
    payload: Cow<'a, [u8]>,
    recorded_at: i64,
    run: u32,
}

/// The state of one ledger entry after a version-1 write (the `deliveries.entries` column).
#[derive(Deserialize)]
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
    /// Absent from rows written before it was kept.
    #[serde(default)]
    interrupted: u32,
}

/// Version 1 → 2: builds the outbox from the log and the version-1 ledger.
///
/// Every commit, in file order, registers the keys it acted that no earlier commit did (the
/// first registration wins), with the `PendingAction` bytes and hash of the commit's own
/// `Op::Act` — the side column `commits.intents` gives only the time of registration, so a
/// changed copy there can neither change a payload nor lose an intent. A key acted by a
/// commit of another session is attached to that session. The `deliveries` rows are folded
/// in order, delivered being final (a stale copy's later row does not re-arm it); an
/// in-flight entry keeps its owner and expiry, with token 1, and a drain's reclaim puts it
/// back once it expired. Then `commits.intents` is cleared and `deliveries` dropped.
fn migrate_1_to_2(tx: &Transaction<'_>) -> Result<(), LoadError> {
    tx.execute_batch(V2_TABLES)?;
    tx.execute_batch(V5_CHANGES)?;
    tx.execute_batch(V6_CHANGES)?;
    tx.execute_batch(V7_CHANGES)?;
    let now = row::ms(std::time::SystemTime::now());
    let mut rows: Vec<Row> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut members: Vec<(String, String)> = Vec::new();
    {
        let mut stmt = tx.prepare("SELECT session, generation, hash, intents, runs FROM commits ORDER BY seq")?;
        let mut found = stmt.query([])?;
        while let Some(commit) = found.next()? {
            let session: String = commit.get(0)?;
            let generation: i64 = commit.get(1)?;
            let hash: Vec<u8> = commit.get(2)?;
            let recorded: HashMap<String, i64> = match commit.get_ref(3)?.as_blob_or_null()? {
                Some(blob) => rmp_serde::from_slice::<Vec<IntentRow<'_>>>(blob)
                    .map_err(|e| {
                        LoadError::Corrupt(format!(
                            "the intents of commit {generation} of session `{session}` do not decode: {e}"
                        ))
                    })?
                    .into_iter()
                    .map(|i| (i.key.into_owned(), i.recorded_at))
                    .collect(),
                None => HashMap::new(),
            };
            let runs = codec::decode_runs(commit.get_ref(4)?.as_blob()?).map_err(|e| {
                LoadError::Corrupt(format!(
                    "commit {generation} of session `{session}`: its runs do not decode: {e}"
                ))
            })?;
            for (run, record) in runs.iter().enumerate() {
                for op in &record.ops {
                    let Op::Act {
                        key,
                        action,
                        hash: action_hash,
                        bytes,
                        ..
                    } = op
                    else {
                        continue;
                    };
                    if let Some(&at) = index.get(key.as_str()) {
                        if rows[at].session != session {
                            members.push((session.clone(), key.as_str().to_owned()));
                        }
                        continue;
                    }
                    let at = recorded.get(key.as_str()).copied().unwrap_or(now);
                    index.insert(key.as_str().to_owned(), rows.len());
                    rows.push(Row {
                        seq: 0,
                        key: key.as_str().to_owned(),
                        kind: action.to_string(),
                        session: session.clone(),
                        origin_commit: hash.clone(),
                        origin_gen: generation,
                        origin_run: i64::try_from(run).unwrap_or(i64::MAX),
                        action_hash: action_hash.as_bytes().to_vec(),
                        bytes: bytes.to_vec(),
                        recorded_at: at,
                        status: row::PENDING,
                        due_at: Some(at),
                        token: 0,
                        owner: None,
                        lease_until: None,
                        attempts: 0,
                        expired: 0,
                        interrupted: 0,
                        last_error: None,
                        cancel_reason: None,
                        updated_at: at,
                        delivered_at: None,
                        next_attempt_at: None,
                        decision: None,
                        decided_by: None,
                        decided_at: None,
                        decision_reason: None,
                        decided_digest: None,
                        // Version 1 kept no trace context.
                        trace: None,
                        group: None,
                    });
                }
            }
        }
    }
    {
        let mut stmt = tx.prepare("SELECT entries FROM deliveries ORDER BY seq")?;
        let mut found = stmt.query([])?;
        while let Some(write) = found.next()? {
            let written: Vec<DeliveryRow<'_>> = rmp_serde::from_slice(write.get_ref(0)?.as_blob()?)
                .map_err(|e| LoadError::Corrupt(format!("a ledger write does not decode: {e}")))?;
            for state in written {
                let Some(&at) = index.get(&*state.key) else {
                    return Err(LoadError::Corrupt(format!(
                        "the ledger records a delivery of `{}`, an intent no commit acted",
                        state.key
                    )));
                };
                let entry = &mut rows[at];
                if entry.status == row::DELIVERED {
                    // Final: a later row is a stale copy's and must not re-arm the key.
                    continue;
                }
                if state.status > 5 {
                    return Err(LoadError::Corrupt(format!(
                        "ledger entry `{}` has unknown status {}",
                        state.key, state.status
                    )));
                }
                entry.status = i64::from(state.status);
                entry.attempts = i64::from(state.attempts);
                entry.last_error = state.last_error.map(Cow::into_owned);
                entry.expired = i64::from(state.expired_leases);
                entry.interrupted = i64::from(state.interrupted);
                entry.updated_at = state.updated_at;
                entry.delivered_at = state.delivered_at;
                entry.next_attempt_at = state.next_attempt_at;
                (entry.owner, entry.lease_until) = match (entry.status, state.lease) {
                    (row::IN_FLIGHT, Some((owner, until))) => (Some(owner.into_owned()), Some(until)),
                    // In flight without a lease: expired at once.
                    (row::IN_FLIGHT, None) => (Some("an unknown drainer".to_owned()), Some(state.updated_at)),
                    _ => (None, None),
                };
                entry.token = if entry.status == row::IN_FLIGHT { 1 } else { 0 };
                entry.due_at = match entry.status {
                    row::PENDING => Some(state.updated_at),
                    row::FAILED => state.next_attempt_at,
                    _ => None,
                };
            }
        }
    }
    for entry in &rows {
        entry.insert(tx)?;
    }
    for (session, key) in members {
        let open = rows[index[&key]].status;
        if open != row::DELIVERED && open != row::CANCELLED {
            tx.execute(
                "INSERT OR IGNORE INTO outbox_members (session, key) VALUES (?1, ?2)",
                params![session, key],
            )?;
        }
    }
    tx.execute_batch("UPDATE commits SET intents = NULL WHERE intents IS NOT NULL; DROP TABLE deliveries;")?;
    Ok(())
}
