//! [`SqliteOutbox`]: the outbox of a SQLite file, an [`OutboxStore`] whose connection lives on
//! its own thread.
//!
//! Every write runs in one `BEGIN IMMEDIATE` transaction on that connection, so a claim (its
//! reclaim of expired leases, its choice of due rows and their update) is atomic against
//! every other connection of the file, in this process or another: two claims never take
//! the same key. Records and renewals are fenced on `status = in flight AND token`. A claim
//! first reads whether it has anything to do (a due row in its scope, an expired lease
//! anywhere): an idle poll is that read alone, and never takes the file's write lock.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::types::Value;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use super::actor::{self, Actor};
use super::row::{self, ms, Read, Row, COLUMNS};
use super::{check_header, open_error, open_read_only, schema, store_error, store_name, BUSY_TIMEOUT};
use crate::model::action::ActionKey;
use crate::model::delivery::{
    later, Attempt, AttemptOutcome, Delivery, DeliveryStatus, FenceToken, NewIntent, Verdict, ATTEMPTS_KEPT,
};
use crate::model::outcome::LastError;
use crate::model::rate::{RateBucket, RateSpend, RateState};
use crate::model::turn;
use crate::store::log_store::ClaimOrder;
use crate::store::outbox::{
    check_decision, ApprovalError, BoxFuture, CancelError, ClaimRequest, Claimed, LedgerQuery, OutboxStore, Page,
    PurgeFilter, Recorded, Recording, RetryError, Scope, StatusCounts,
};
use crate::store::{OpenError, StoreError, Synchronous};

/// The outbox of a SQLite store file: the delivery ledger as the `outbox` table, shared by
/// every drain of the file in every process.
///
/// A [`Context`](crate::Context) opened on the file has one (shared with its forks); a
/// standalone drainer opens one with [`SqliteOutbox::open`]. Its connection lives on a
/// thread of its own, so no SQLite call (and no fsync) runs on the caller's executor; the
/// thread ends when the last handle is dropped, after the requests already sent.
pub struct SqliteOutbox {
    actor: Actor,
    path: PathBuf,
    /// `sqlite:{path}`, as the outbox names itself.
    name: String,
    /// `Some(session)` for the outbox of a read-only context: reads only.
    read_only: Option<String>,
}

impl std::fmt::Debug for SqliteOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteOutbox")
            .field("path", &self.path)
            .field("read_only", &self.read_only.is_some())
            .finish()
    }
}

impl SqliteOutbox {
    /// Runs `op` on the outbox's thread (its connection to the file), for the rows of the
    /// log ([`SqliteStore`](super::SqliteStore)).
    pub(super) fn run_write<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        self.actor.call(op)
    }

    /// Opens the outbox of the store file at `path`, which a [`Context`](crate::Context) created,
    /// for reading and writing (`synchronous = FULL`, WAL mode). A file of schema version 2 or
    /// 3 is upgraded to the current version first, in one exclusive transaction: the tables and
    /// columns the later versions add, empty (the checkpoints table, the attempt history); no
    /// row is rewritten, and the log is not read. Processes of a build older than the upgrade
    /// then refuse to open the file (`NewerSchema`): upgrade them together. Nothing else in
    /// the file is changed.
    ///
    /// # Errors
    /// [`OpenError::NoSuchFile`] for a missing file (nothing is created),
    /// [`OpenError::NotADatabase`], [`OpenError::Corrupt`] or [`OpenError::Foreign`] for a
    /// file that is not a reactifact store, [`OpenError::OlderSchema`] for a store of schema
    /// version 1 (open it once with [`Context::open`](crate::Context::open) to upgrade it),
    /// [`OpenError::NewerSchema`], [`OpenError::ReadOnlyFile`] for a file that cannot be
    /// written.
    #[allow(clippy::result_large_err)] // see `OpenError::Corrupt`
    pub fn open(path: impl AsRef<Path>) -> Result<Arc<SqliteOutbox>, OpenError> {
        let path = path.as_ref();
        let size = match std::fs::metadata(path) {
            Ok(metadata) => metadata.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(OpenError::NoSuchFile { path: path.into() })
            }
            Err(_) => 1, // SQLite says why it cannot be read.
        };
        if size == 0 {
            return Err(OpenError::Foreign { path: path.into() });
        }
        check_header(path, size)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(path, flags).map_err(|e| open_error(path, e))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| open_error(path, e))?;
        if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
            return Err(OpenError::ReadOnlyFile { path: path.into() });
        }
        let version = schema::schema_version(&conn, path)?;
        match version {
            schema::READS_FROM..=schema::SCHEMA_VERSION => {}
            0 => return Err(OpenError::Foreign { path: path.into() }),
            found => {
                return Err(OpenError::OlderSchema {
                    path: path.into(),
                    found,
                    supported: schema::SCHEMA_VERSION,
                })
            }
        }
        // A version 2 or 3 file gets the tables and columns of the current version (its
        // outbox is the same; the history starts empty).
        schema::prepare_for_writing(&mut conn, Synchronous::Full, version, path)?;
        Self::spawn(conn, path, None).map(Arc::new)
    }

    /// The outbox of a store a context opened: a connection of its own on its own thread.
    /// `read_only` names the session of a read-only context.
    pub(super) fn for_store(
        path: &Path,
        synchronous: Synchronous,
        read_only: Option<&str>,
    ) -> Result<SqliteOutbox, OpenError> {
        let conn = if read_only.is_some() {
            open_read_only(path)?
        } else {
            let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            let conn = Connection::open_with_flags(path, flags).map_err(|e| open_error(path, e))?;
            let sync = match synchronous {
                Synchronous::Full => "FULL",
                Synchronous::Normal => "NORMAL",
            };
            conn.pragma_update(None, "synchronous", sync)
                .map_err(|e| open_error(path, e))?;
            conn
        };
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| open_error(path, e))?;
        Self::spawn(conn, path, read_only.map(str::to_owned))
    }

    pub(super) fn spawn(conn: Connection, path: &Path, read_only: Option<String>) -> Result<SqliteOutbox, OpenError> {
        conn.set_prepared_statement_cache_capacity(super::STATEMENTS_CACHED);
        let actor = Actor::spawn(conn, store_name(path)).map_err(|e| OpenError::Backend {
            path: path.into(),
            source: format!("the outbox thread could not be started: {e}").into(),
        })?;
        Ok(SqliteOutbox {
            actor,
            path: path.into(),
            name: store_name(path),
            read_only,
        })
    }

    /// Waits until every request sent before (including [`submit`](OutboxStore::submit)ted
    /// outcomes) has run.
    pub async fn close(&self) {
        let _ = self.actor.call(|_| Ok(())).await;
    }

    /// Registers `intents`, in order, as one commit made at `now` would, in one transaction
    /// on the outbox's thread, through the same `register` a commit runs: for the store
    /// contract suite (crate `reactifact-store-contract`) and tests of the outbox alone. Not
    /// public API.
    #[doc(hidden)]
    pub fn register_intents(
        &self,
        intents: Vec<NewIntent>,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        if let Err(e) = self.check_writable() {
            return Box::pin(async move { Err(e) });
        }
        let now = ms(now);
        self.run(move |conn| actor::write(conn, |tx| register(tx, &intents, now)))
    }

    fn decide(
        &self,
        key: &str,
        verdict: Verdict,
        by: &str,
        reason: Option<&str>,
        now: SystemTime,
    ) -> BoxFuture<'static, Result<Delivery, ApprovalError>> {
        if let Err(e) = self.check_writable() {
            return Box::pin(async move { Err(ApprovalError::Store(e)) });
        }
        let (key, by, reason) = (key.to_owned(), by.to_owned(), reason.map(str::to_owned));
        let name = self.name.clone();
        let answer = self.run(move |conn| decide(conn, &name, &key, verdict, &by, reason.as_deref(), now));
        Box::pin(async move { answer.await.map_err(ApprovalError::Store)? })
    }

    fn check_writable(&self) -> Result<(), StoreError> {
        match &self.read_only {
            Some(session) => Err(StoreError::read_only(self.name.clone(), session.clone())),
            None => Ok(()),
        }
    }

    /// Runs `op` on the outbox's thread, mapping SQLite's errors.
    fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let name = self.name.clone();
        self.actor.call(move |conn| op(conn).map_err(|e| store_error(&name, e)))
    }

    /// Runs a read on the outbox's thread, which may also find a damaged row.
    fn read<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Connection) -> rusqlite::Result<Result<T, (String, String)>> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let name = self.name.clone();
        let answer = self.run(op);
        Box::pin(async move {
            answer
                .await?
                .map_err(|(key, detail)| StoreError::integrity(name, key, detail))
        })
    }
}

/// Registers the intents of a commit, in its transaction (decision: registration happens in
/// the commit). A key neither held nor purged is inserted, pending and due at `now`, owned by
/// the committing session, with the intent's trace context beside it (`trace_parent`); a key
/// held (not final) by another session is attached to the committing one, its trace context
/// unchanged; a final or purged key is left alone.
pub(super) fn register(tx: &Connection, intents: &[NewIntent], now: i64) -> rusqlite::Result<()> {
    for new in intents {
        let key = new.intent.key.as_str();
        let purged: bool = tx
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM outbox_purged WHERE key = ?1)")?
            .query_row([key], |row| row.get(0))?;
        if purged {
            continue;
        }
        let mut row = Row::register(new, now);
        if let Some(group) = &row.group {
            // Behind an open row of its group (registered by an earlier commit, or earlier in
            // this one): blocked until that one is final.
            if group_has_open(tx, group)? {
                row.status = row::BLOCKED;
                row.due_at = None;
            }
        }
        if row.insert(tx)? {
            continue;
        }
        tx.prepare_cached(
            "INSERT OR IGNORE INTO outbox_members (session, key)
             SELECT ?1, ?2 WHERE EXISTS
                 (SELECT 1 FROM outbox WHERE key = ?2 AND session <> ?1 AND status NOT IN (2, 6, 8))",
        )?
        .execute(params![new.intent.origin.session(), key])?;
    }
    Ok(())
}

/// Registers `intents` — built with [`Enqueue`](crate::store::Enqueue), or handed over by a
/// commit — inside `tx`, a transaction of the application's own on a connection to the
/// store's file (beside its own tables in that file), as a commit registers its intents: a key
/// neither held nor purged is inserted, pending and due at `now` (or at its `not_before`, or
/// blocked behind its ordering group, or awaiting approval); a held key is attached to the
/// intent's session; a final or purged key is left alone. Nothing is visible to drainers until
/// `tx` commits; a rolled-back transaction leaves nothing. Drainers of the file find them at
/// their next poll ([`DrainerBuilder::poll_interval`](crate::DrainerBuilder::poll_interval)).
///
/// Open the connection with a busy timeout (`Connection::busy_timeout`: the store's own
/// connections write the file too) and begin the transaction `IMMEDIATE` (as
/// `Connection::transaction_with_behavior` does), so that it waits for the file's writer
/// instead of failing on its first write. Use this crate's [`rusqlite`](crate::store::rusqlite),
/// whose version it was built with.
///
/// # Errors
/// [`StoreError::Backend`] if the file is not a reactifact store of this build's schema (open
/// it once with [`Context::open`](crate::Context::open) or [`SqliteOutbox::open`] first, which
/// create or migrate it), or if SQLite fails; roll `tx` back then.
pub fn register_in(tx: &rusqlite::Transaction<'_>, intents: &[NewIntent], now: SystemTime) -> Result<(), StoreError> {
    let name = store_name(tx.path().map_or(Path::new(":memory:"), Path::new));
    let version: i64 = tx
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|e| store_error(&name, e))?;
    if version != schema::SCHEMA_VERSION {
        return Err(StoreError::backend(
            name,
            false,
            format!(
                "the file has schema version {version}, not the {} of a reactifact store of this build: \
                 open it once with `Context::open` or `SqliteOutbox::open`, which create or migrate it",
                schema::SCHEMA_VERSION
            ),
        ));
    }
    register(tx, intents, ms(now)).map_err(|e| store_error(&name, e))
}

/// Whether `group` has an open row registered before the row `seq`.
fn group_open_before(conn: &Connection, group: &str, seq: i64) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM outbox WHERE grp = ?1 AND seq < ?2 AND status NOT IN (2, 6, 8))")?
        .query_row(params![group, seq], |row| row.get(0))
}

/// Whether `group` has an open (not final) row.
fn group_has_open(conn: &Connection, group: &str) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM outbox WHERE grp = ?1 AND status NOT IN (2, 6, 8))")?
        .query_row([group], |row| row.get(0))
}

/// Writes `row` after an operator's or a drain's change (`now` its time), and, if that made it
/// final, releases its ordering group: the group's first open row, if blocked, becomes
/// pending (or awaits approval, if it asks for it and has no decision), due at `now` or at its
/// `not_before`. One transaction, so the group never has two rows handed out, nor none.
fn write_row(tx: &Connection, row: &Row, now: i64) -> rusqlite::Result<()> {
    row.update(tx)?;
    let Some(group) = row.group.as_deref() else {
        return Ok(());
    };
    if !row.status().is_some_and(DeliveryStatus::is_final) {
        return Ok(());
    }
    let head = tx
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM outbox WHERE grp = ?1 AND status NOT IN (2, 6, 8) ORDER BY seq LIMIT 1"
        ))?
        .query_row([group], Row::read)
        .optional()?;
    match head {
        Some(Read::Intact(mut head)) if head.status == row::BLOCKED => {
            let awaiting = head.requires_approval() && head.decision.is_none();
            head.settle(if awaiting { row::AWAITING_APPROVAL } else { row::PENDING }, now);
            head.due_at = head.due_at.map(|due| due.max(head.not_before()));
            head.update(tx)
        }
        // A damaged head would never be claimed: held, for an operator.
        Some(Read::Damaged { seq, key, detail }) => hold_damaged(tx, seq, &key, &detail, now),
        _ => Ok(()),
    }
}

fn by_key(conn: &Connection, key: &str) -> rusqlite::Result<Option<Read>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM outbox WHERE key = ?1"))?
        .query_row([key], Row::read)
        .optional()
}

fn by_seq(conn: &Connection, seq: i64) -> rusqlite::Result<Option<Read>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM outbox WHERE seq = ?1"))?
        .query_row([seq], Row::read)
        .optional()
}

/// Holds a row that failed its integrity check: held, not due, no lease, `last_error`
/// saying why; its digest rewritten over what it now holds, so that it reads as the held row
/// it is (an operator's `retry` re-arms it, and its claim checks it again).
fn hold_damaged(tx: &Connection, seq: i64, key: &str, detail: &str, now: i64) -> rusqlite::Result<()> {
    tracing::warn!(action_key = %key, detail, "an outbox row failed its integrity check; it is held, not delivered");
    // The row's decision cannot be trusted: it is dropped (and named in the error), so that a
    // retry of the hold puts an intent that requires approval back to awaiting it — a changed
    // rejection never comes back approved.
    tx.prepare_cached(
        "UPDATE outbox SET status = 5, due_at = NULL, owner = NULL, lease_until = NULL, next_attempt_at = NULL,
             last_error = ?2 || CASE WHEN decision IS NULL AND decided_by IS NULL THEN '' ELSE
                 '; the decision it held is not trusted and was dropped: approve or reject it again' END,
             decision = NULL, decided_by = NULL, decided_at = NULL, decision_reason = NULL,
             decided_digest = NULL, updated_at = ?3 WHERE seq = ?1",
    )?
    .execute(params![seq, format!("integrity: {detail}"), now])?;
    // The new digest, over the columns as they are now (whatever they hold: a column of
    // text that is not UTF-8 is digested as it is, never a panic).
    let digest = tx
        .prepare_cached(&format!("SELECT {COLUMNS} FROM outbox WHERE seq = ?1"))?
        .query_row([seq], row::digest_of)?;
    tx.prepare_cached("UPDATE outbox SET digest = ?2 WHERE seq = ?1")?
        .execute(params![seq, &digest[..]])?;
    Ok(())
}

/// Holds an intact row whose intent does not check out.
fn hold_row(tx: &Connection, mut row: Row, detail: &str, now: i64) -> rusqlite::Result<()> {
    tracing::warn!(action_key = %row.key, detail, "an outbox row failed its integrity check; it is held, not delivered");
    row.next_attempt_at = None;
    row.last_error = Some(format!("integrity: {detail}"));
    row.settle(row::HELD, now);
    row.update(tx)
}

/// Registers intents of the verified log that had no row and no tombstone, each held with an
/// `integrity:` error: a committed intent is never lost, and never sent again on its own
/// either (its row may have been a delivered one), so an operator decides (`retry`).
pub(super) fn register_held(tx: &rusqlite::Transaction<'_>, intents: &[NewIntent], now: i64) -> rusqlite::Result<()> {
    register(tx, intents, now)?;
    for intent in intents {
        if let Some(Read::Intact(row)) = by_key(tx, intent.intent.key.as_str())? {
            if matches!(row.status, row::PENDING | row::BLOCKED) {
                hold_row(
                    tx,
                    row,
                    "the committed intent had no outbox row (it was lost or changed); it is held, \
                     since it may have been delivered already: retry it to send it",
                    now,
                )?;
            }
        }
    }
    Ok(())
}

/// `?, ?, …` for `n` values.
fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// ` AND …` restricting rows `o` to a scope; its parameters appended to `params`.
fn scope_sql(scope: &Scope, params: &mut Vec<Value>) -> String {
    let mut sql = String::new();
    if let Some(sessions) = scope.session_filter() {
        let list = placeholders(sessions.len());
        sql.push_str(&format!(
            " AND (o.session IN ({list}) OR o.key IN (SELECT key FROM outbox_members WHERE session IN ({list})))"
        ));
        for _ in 0..2 {
            params.extend(sessions.iter().map(|s| Value::Text(s.to_string())));
        }
    }
    sql.push_str(&kinds_sql(scope, "o", params));
    sql
}

fn kinds_sql(scope: &Scope, alias: &str, params: &mut Vec<Value>) -> String {
    match scope.kind_filter() {
        Some(kinds) => {
            params.extend(kinds.iter().map(|k| Value::Text(k.to_string())));
            format!(" AND {alias}.kind IN ({})", placeholders(kinds.len()))
        }
        None => String::new(),
    }
}

/// The query of the rows a claim takes, in claim order: due at `now`, in the scope. Each
/// branch reads a partial index of due rows (all, or by session), or the members' key.
pub(super) fn candidates_sql(scope: &Scope, now: i64, limit: i64) -> (String, Vec<Value>) {
    let mut params = Vec::new();
    let sql = match scope.session_filter() {
        None => {
            params.push(Value::Integer(now));
            let kinds = kinds_sql(scope, "o", &mut params);
            params.push(Value::Integer(limit));
            format!("SELECT o.seq, o.due_at FROM outbox o WHERE o.due_at <= ?{kinds} ORDER BY o.due_at, o.seq LIMIT ?")
        }
        Some(sessions) => {
            // Per session, its own rows and its attached rows, each side limited on its own
            // in the order of its index: a claim reads at most `limit` rows of each side
            // instead of every due row of the session. (One side per session: with one
            // `session IN (..)` side, the contract's differential test caught claims taken
            // out of claim order.)
            let mut sides = Vec::new();
            for session in sessions {
                params.push(Value::Text(session.to_string()));
                params.push(Value::Integer(now));
                let own_kinds = kinds_sql(scope, "o", &mut params);
                params.push(Value::Integer(limit));
                sides.push(format!(
                    "SELECT seq, due_at FROM (
                         SELECT o.seq AS seq, o.due_at AS due_at FROM outbox o
                          WHERE o.session = ? AND o.due_at <= ?{own_kinds}
                          ORDER BY o.due_at, o.seq LIMIT ?)"
                ));
                params.push(Value::Text(session.to_string()));
                params.push(Value::Integer(now));
                let member_kinds = kinds_sql(scope, "o", &mut params);
                params.push(Value::Integer(limit));
                sides.push(format!(
                    "SELECT seq, due_at FROM (
                         SELECT o.seq AS seq, o.due_at AS due_at
                           FROM outbox_members m JOIN outbox o ON o.key = m.key
                          WHERE m.session = ? AND o.due_at <= ?{member_kinds}
                          ORDER BY o.due_at, o.seq LIMIT ?)"
                ));
            }
            params.push(Value::Integer(limit));
            if sides.is_empty() {
                // No session at all: nothing is in scope.
                return ("SELECT seq, due_at FROM outbox WHERE 0 LIMIT ?".to_owned(), params);
            }
            format!(
                "SELECT seq, due_at FROM ({}) ORDER BY due_at, seq LIMIT ?",
                sides.join(" UNION ")
            )
        }
    };
    (sql, params)
}

/// The read a claim runs first, outside any write transaction: whether any lease of the
/// store has expired at `now`, or (with `due`) any row of the scope is due at `now`. One
/// statement, so one snapshot; each part reads a partial index (`outbox_leases`, and those of
/// [`candidates_sql`]). When it finds nothing, the claim has nothing to do, and an idle poll
/// ends without taking the file's write lock.
pub(super) fn work_sql(scope: &Scope, now: i64, due: bool) -> (String, Vec<Value>) {
    let mut params = vec![Value::Integer(now)];
    let mut sql = "SELECT EXISTS (SELECT 1 FROM outbox WHERE lease_until <= ?)".to_owned();
    if due {
        let (candidates, more) = candidates_sql(scope, now, 1);
        sql.push_str(&format!(" OR EXISTS ({candidates})"));
        params.extend(more);
    }
    (sql, params)
}

fn claim(conn: &mut Connection, request: &ClaimRequest<'_>) -> rusqlite::Result<Claimed> {
    // First a read: a poll that finds nothing due and no lease expired takes no write lock
    // (in WAL mode a read waits for no writer, and no writer waits for it).
    let (sql, params) = work_sql(request.scope, ms(request.now), request.limit > 0);
    let work: bool = conn
        .prepare_cached(&sql)?
        .query_row(rusqlite::params_from_iter(params), |row| row.get(0))?;
    if !work {
        return Ok(Claimed::default());
    }
    actor::write(conn, |tx| claim_in(tx, request))
}

/// A claim's writes, in the caller's transaction: every expired lease of the store put back to
/// pending, then up to `limit` due intents of `scope` claimed, spending from the request's
/// rate limits. A commit claims for its generation's drain with this, in its own transaction.
pub(super) fn claim_in(tx: &Connection, request: &ClaimRequest<'_>) -> rusqlite::Result<Claimed> {
    let at = ms(request.now);
    let until = ms(later(request.now, request.lease));
    let mut claimed = Claimed::default();
    // Every expired lease of the store, first.
    let expired: Vec<i64> = tx
        .prepare_cached("SELECT seq FROM outbox WHERE lease_until <= ?1 ORDER BY lease_until, seq")?
        .query_map([at], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    for seq in expired {
        match end_lease(tx, seq, at, crate::model::delivery::reclaimed_error)? {
            Ended::Pending(_) => claimed.reclaimed += 1,
            Ended::Not => {}
            Ended::Held(key) => claimed.integrity.push(key),
        }
    }
    if request.limit == 0 {
        return Ok(claimed);
    }
    let limit = i64::try_from(request.limit).unwrap_or(i64::MAX);
    let buckets = request.buckets_in_scope();
    let mut spend = RateSpend::new(
        buckets
            .iter()
            .map(|b| Ok((*b, rate_state(tx, &b.name)?)))
            .collect::<rusqlite::Result<Vec<_>>>()?,
        request.now,
    );
    // Sessions take turns: the earliest due intent of each session first.
    let heads = match request.takes_turns() {
        true => session_heads(tx, request.scope, at, request.limit)?,
        false => Vec::new(),
    };
    let mut due = if !request.policy.by_kind() {
        candidates(tx, request.scope, at, limit)?
    } else {
        // Each kind's share on its own, from the index of due rows by kind: a limited kind
        // up to its bucket's allowance, any other up to the limit; then by priority, and the
        // earliest of all among equals.
        let kinds: Vec<Arc<str>> = match request.scope.kind_filter() {
            Some(kinds) => kinds.to_vec(),
            None => tx
                .prepare_cached(DUE_KINDS)?
                .query_map([], |row| Ok(Arc::from(row.get::<_, String>(0)?)))?
                .collect::<Result<_, _>>()?,
        };
        let allowances: Vec<(&RateBucket, u32)> = spend.allowances().collect();
        let mut due = Vec::new();
        for kind in kinds {
            let share = allowances
                .iter()
                .find(|(b, _)| b.covers(&kind))
                .map_or(limit, |&(_, allowed)| i64::from(allowed).min(limit));
            if share > 0 {
                let priority = request.policy.priority_of(&kind);
                let rows = candidates(tx, &request.scope.clone().kinds([kind]), at, share)?;
                due.extend(rows.into_iter().map(|(seq, due_at)| (priority, seq, due_at)));
            }
        }
        due.sort_unstable_by_key(|&(priority, seq, due_at)| (std::cmp::Reverse(priority), due_at, seq));
        due.into_iter().map(|(_, seq, due_at)| (seq, due_at)).collect()
    };
    if !heads.is_empty() {
        due.retain(|d| !heads.contains(d));
        due.splice(0..0, heads);
    }
    due.truncate(request.limit);
    // Each claim's due time and seq: a claim that took turns hands them out in due order.
    let mut taken: Vec<(i64, i64, Delivery)> = Vec::with_capacity(due.len());
    for (seq, due_at) in due {
        let mut row = match by_seq(tx, seq)? {
            Some(Read::Intact(row)) => row,
            Some(Read::Damaged { seq, key, detail }) => {
                hold_damaged(tx, seq, &key, &detail, at)?;
                claimed.integrity.push(ActionKey::from(key));
                continue;
            }
            None => continue,
        };
        let payload = match row.check_intent() {
            Ok(payload) => payload,
            Err(detail) => {
                claimed.integrity.push(ActionKey::from(row.key.as_str()));
                hold_row(tx, row, &detail, at)?;
                continue;
            }
        };
        if !spend.take(&row.kind) {
            continue;
        }
        row.status = row::IN_FLIGHT;
        row.attempts += 1;
        row.token += 1;
        row.owner = Some(request.owner.to_string());
        row.lease_until = Some(until);
        row.next_attempt_at = None;
        row.due_at = None;
        row.updated_at = at;
        row.update_claimed(tx)?;
        taken.push((due_at, seq, row.delivery(&payload)));
    }
    taken.sort_unstable_by_key(|&(due_at, seq, _)| (due_at, seq));
    claimed.claims = taken.into_iter().map(|(_, _, d)| d).collect();
    for (name, state) in spend.spent() {
        write_rate(tx, name, state)?;
    }
    claimed.throttled = spend.throttled();
    Ok(claimed)
}

/// The kinds with a due (or scheduled) row, each found by one seek of `outbox_kind_due`.
const DUE_KINDS: &str = "WITH RECURSIVE k(kind) AS (
        SELECT (SELECT min(kind) FROM outbox WHERE due_at IS NOT NULL)
        UNION ALL
        SELECT (SELECT min(o.kind) FROM outbox o WHERE o.due_at IS NOT NULL AND o.kind > k.kind)
          FROM k WHERE k.kind IS NOT NULL
    ) SELECT kind FROM k WHERE kind IS NOT NULL";

/// The earliest due row (`seq`, due time) of each session of `scope` that registered one, at
/// most `limit`: all of them when there are no more, else `limit` sessions drawn anew for each
/// claim. The sessions are found by one seek of `outbox_session_due` each.
fn session_heads(tx: &Connection, scope: &Scope, at: i64, limit: usize) -> rusqlite::Result<Vec<(i64, i64)>> {
    let (sql, params) = session_heads_sql(scope, at);
    let mut heads: Vec<(u64, i64, i64)> = tx
        .prepare_cached(&sql)?
        .query_map(rusqlite::params_from_iter(params), |row| {
            let session: String = row.get(0)?;
            Ok((session_hash(&session), row.get(1)?, row.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    if heads.len() > limit {
        let draw = turn::draw();
        heads.sort_unstable_by_key(|&(session, ..)| turn::place(session, draw));
        heads.truncate(limit);
    }
    Ok(heads.into_iter().map(|(_, seq, due_at)| (seq, due_at)).collect())
}

/// The query of [`session_heads`]: each session of `scope` with a due row at `at`, and that row.
fn session_heads_sql(scope: &Scope, at: i64) -> (String, Vec<Value>) {
    let mut params = vec![Value::Integer(at)];
    let only = match scope.session_filter() {
        Some(sessions) => {
            params.extend(sessions.iter().map(|s| Value::Text(s.to_string())));
            format!(" AND s.session IN ({})", placeholders(sessions.len()))
        }
        None => String::new(),
    };
    let sql = format!(
        "WITH RECURSIVE s(session) AS (
             SELECT (SELECT min(session) FROM outbox WHERE due_at IS NOT NULL)
             UNION ALL
             SELECT (SELECT min(o.session) FROM outbox o WHERE o.due_at IS NOT NULL AND o.session > s.session)
               FROM s WHERE s.session IS NOT NULL
         )
         SELECT s.session, h.seq, h.due_at FROM s JOIN outbox h ON h.seq = (
             SELECT o.seq FROM outbox o WHERE o.session = s.session AND o.due_at <= ?1 ORDER BY o.due_at, o.seq LIMIT 1
         ) WHERE s.session IS NOT NULL{only}"
    );
    (sql, params)
}

/// A hash of a session's name, for [`turn::place`].
fn session_hash(session: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    session.hash(&mut hasher);
    hasher.finish()
}

/// The rows of `scope` due at `at`, at most `limit`, in claim order: their `seq` and due time.
fn candidates(tx: &Connection, scope: &Scope, at: i64, limit: i64) -> rusqlite::Result<Vec<(i64, i64)>> {
    let (sql, params) = candidates_sql(scope, at, limit);
    tx.prepare_cached(&sql)?
        .query_map(rusqlite::params_from_iter(params), |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect()
}

/// The stored state of the rate limit `name`: full and not paused if none is stored.
fn rate_state(tx: &Connection, name: &str) -> rusqlite::Result<RateState> {
    let stored = tx
        .prepare_cached("SELECT tat, paused_until FROM outbox_rates WHERE name = ?1")?
        .query_row([name], |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)))
        .optional()?;
    let time = |us: i64| u64::try_from(us).unwrap_or(0);
    Ok(stored.map_or_else(RateState::default, |(tat, paused)| RateState {
        tat: time(tat),
        paused_until: time(paused),
    }))
}

fn write_rate(tx: &Connection, name: &str, state: RateState) -> rusqlite::Result<()> {
    let stored = |us: u64| i64::try_from(us).unwrap_or(i64::MAX);
    tx.prepare_cached("INSERT OR REPLACE INTO outbox_rates (name, tat, paused_until) VALUES (?1, ?2, ?3)")?
        .execute(params![name, stored(state.tat), stored(state.paused_until)])?;
    Ok(())
}

/// What [`end_lease`] did with a row.
enum Ended {
    /// Put back to pending: its key.
    Pending(ActionKey),
    /// Nothing: the row is gone, or not in flight.
    Not,
    /// Held: the row failed its integrity check (its key).
    Held(ActionKey),
}

/// Ends the lease of the in-flight row `seq` at `at`, its holder dead or stalled past it: the
/// attempt ended expired in the history, the row pending and due at `at`, one more expired
/// lease, `last_error` from `error` (of the attempt and the holder). A damaged row is held.
fn end_lease(tx: &Connection, seq: i64, at: i64, error: fn(i64, &str) -> String) -> rusqlite::Result<Ended> {
    Ok(match by_seq(tx, seq)? {
        Some(Read::Intact(mut row)) if row.status == row::IN_FLIGHT => {
            let holder = row.owner.clone().unwrap_or_else(|| "an unknown drainer".into());
            end_attempt(tx, &row, at, &AttemptOutcome::Expired)?;
            row.expired += 1;
            row.last_error = Some(error(row.attempts, &holder));
            row.next_attempt_at = None;
            row.settle(row::PENDING, at);
            row.update(tx)?;
            Ended::Pending(ActionKey::from(row.key.as_str()))
        }
        Some(Read::Intact(_)) | None => Ended::Not,
        Some(Read::Damaged { seq, key, detail }) => {
            hold_damaged(tx, seq, &key, &detail, at)?;
            Ended::Held(ActionKey::from(key))
        }
    })
}

/// The distinct owners of the leases in flight in `scope` (the partial index of leases).
fn lease_owners(conn: &Connection, scope: &Scope) -> rusqlite::Result<Vec<Arc<str>>> {
    let mut params = Vec::new();
    let filter = scope_sql(scope, &mut params);
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT DISTINCT o.owner FROM outbox o WHERE o.lease_until IS NOT NULL AND o.owner IS NOT NULL{filter}"
    ))?;
    let owners = stmt.query_map(rusqlite::params_from_iter(params), |row| {
        row.get::<_, String>(0).map(|o| Arc::from(o.as_str()))
    })?;
    owners.collect()
}

/// Takes over the claims of `owner` ([`OutboxStore::take_over`]), in one transaction.
fn take_over(conn: &mut Connection, owner: &str, now: SystemTime) -> rusqlite::Result<Vec<ActionKey>> {
    let at = ms(now);
    actor::write(conn, |tx| {
        let held: Vec<i64> = tx
            .prepare_cached("SELECT seq FROM outbox WHERE lease_until IS NOT NULL AND owner = ?1 ORDER BY seq")?
            .query_map([owner], |row| row.get(0))?
            .collect::<Result<_, _>>()?;
        let mut taken = Vec::with_capacity(held.len());
        for seq in held {
            if let Ended::Pending(key) = end_lease(tx, seq, at, crate::model::delivery::taken_over_error)? {
                taken.push(key);
            }
        }
        Ok(taken)
    })
}

/// Writes the outcomes of finished attempts in one transaction without an fsync of its own
/// (see `actor::write_lazily_synced`): the next commit or claim of the file, whose fsync
/// covers the WAL written before it, makes them durable against a power loss. An outcome lost
/// that way leaves its intent in flight under its lease, so it is delivered again with the
/// same key, as after any crash between a send and its record; the intent itself, registered
/// by a commit that syncs, is never lost.
fn record(conn: &mut Connection, outcomes: &[Recording], now: SystemTime) -> rusqlite::Result<Vec<Recorded>> {
    let at = ms(now);
    actor::write_lazily_synced(conn, |tx| {
        let mut results = Vec::with_capacity(outcomes.len());
        for recording in outcomes {
            let mut row = match by_key(tx, recording.key.as_str())? {
                None => {
                    results.push(Recorded::Stale {
                        status: None,
                        token: FenceToken(0),
                    });
                    continue;
                }
                Some(Read::Damaged { seq, key, detail }) => {
                    hold_damaged(tx, seq, &key, &detail, at)?;
                    results.push(Recorded::Stale {
                        status: Some(DeliveryStatus::Held),
                        token: recording.token,
                    });
                    continue;
                }
                Some(Read::Intact(row)) => row,
            };
            let token = FenceToken(u64::try_from(row.token).unwrap_or(0));
            if row.status != row::IN_FLIGHT || token != recording.token {
                results.push(Recorded::Stale {
                    status: row.status(),
                    token,
                });
                continue;
            }
            let t = recording.outcome.transition();
            if let Some(ended) = &t.history {
                end_attempt(tx, &row, at, ended)?;
            }
            if t.uncount_attempt {
                row.attempts = (row.attempts - 1).max(0);
            }
            if t.count_interrupted {
                row.interrupted += 1;
            }
            match t.last_error {
                LastError::Clear => row.last_error = None,
                LastError::Keep => {}
                LastError::Set(error) => row.last_error = Some(error.to_owned()),
            }
            if t.delivered {
                row.delivered_at = Some(at);
            }
            row.next_attempt_at = t.next_attempt_at.map(ms);
            let status = i64::from(t.status.code());
            row.settle(status, at);
            write_row(tx, &row, at)?;
            results.push(Recorded::Accepted(row.status().unwrap_or(DeliveryStatus::Held)));
        }
        Ok(results)
    })
}

/// The rows a purge batch of `filter` deletes, oldest first (`?1` the cut-off, `?2` the batch
/// size). The literal statuses let SQLite prove the predicate of a partial index: the final
/// rows' `outbox_final`, or `outbox_cancelled` / `outbox_rejected`, so that a purge of
/// cancelled or rejected rows never walks the (many) old delivered ones.
pub(super) fn purge_sql(filter: PurgeFilter) -> &'static str {
    match filter {
        PurgeFilter::Delivered => {
            "SELECT seq, key FROM outbox WHERE status IN (2, 6, 8) AND status = 2 AND updated_at < ?1
             ORDER BY updated_at, seq LIMIT ?2"
        }
        PurgeFilter::Cancelled => {
            "SELECT seq, key FROM outbox WHERE status = 6 AND updated_at < ?1 ORDER BY updated_at, seq LIMIT ?2"
        }
        PurgeFilter::Rejected => {
            "SELECT seq, key FROM outbox WHERE status = 8 AND updated_at < ?1 ORDER BY updated_at, seq LIMIT ?2"
        }
        _ => {
            "SELECT seq, key FROM outbox WHERE status IN (2, 6, 8) AND updated_at < ?1
             ORDER BY updated_at, seq LIMIT ?2"
        }
    }
}

/// An operator's approval or rejection of the intent `key`, in one write transaction.
fn decide(
    conn: &mut Connection,
    name: &str,
    key: &str,
    verdict: Verdict,
    by: &str,
    reason: Option<&str>,
    now: SystemTime,
) -> rusqlite::Result<Result<Delivery, ApprovalError>> {
    actor::write(conn, |tx| {
        let mut row = match by_key(tx, key)? {
            None => return Ok(Err(ApprovalError::UnknownKey(ActionKey::from(key)))),
            Some(Read::Damaged { key, detail, .. }) => {
                return Ok(Err(ApprovalError::Store(StoreError::integrity(name, key, detail))))
            }
            Some(Read::Intact(row)) => row,
        };
        // An unknown status code (only in a row that failed its check) reads as held.
        let status = row.status().unwrap_or(DeliveryStatus::Held);
        match check_decision(key, status, row.decision().as_ref(), verdict, by) {
            Err(e) => return Ok(Err(e)),
            Ok(false) => return Ok(Ok(row.view())),
            Ok(true) => {}
        }
        let at = ms(now);
        row.decision = Some(i64::from(verdict.code()));
        row.decided_by = Some(by.to_owned());
        row.decided_at = Some(at);
        row.decision_reason = reason.map(str::to_owned);
        // What the operator decided on: the action hash the row holds, which its bytes must
        // hash to (a claim hands the row out only while it still holds it).
        if crate::model::hash::content_hash(&row.bytes).as_bytes()[..] != row.action_hash[..] {
            let detail = "its bytes do not hash to its action hash";
            return Ok(Err(ApprovalError::Store(StoreError::integrity(name, key, detail))));
        }
        row.decided_digest = Some(row.action_hash.clone());
        row.settle(
            match verdict {
                Verdict::Approved => row::PENDING,
                _ => row::REJECTED,
            },
            at,
        );
        // Approved before its `not_before`: due then, not now.
        row.due_at = row.due_at.map(|due| due.max(row.not_before()));
        write_row(tx, &row, at)?;
        Ok(Ok(row.view()))
    })
}

/// Adds the attempt in flight in `row` (before its outcome is applied) to the history, ended
/// at `at` with `outcome`.
fn end_attempt(tx: &Connection, row: &Row, at: i64, outcome: &AttemptOutcome) -> rusqlite::Result<()> {
    let (code, error) = outcome.code();
    let retry_at = match outcome {
        AttemptOutcome::Failed { retry_at, .. } => retry_at.map(ms),
        _ => None,
    };
    tx.prepare_cached(
        "INSERT OR REPLACE INTO outbox_attempts
             (key, token, number, owner, claimed_at, lease_until, ended_at, outcome, error, retry_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        row.key,
        row.token,
        row.attempts,
        row.owner.as_deref().unwrap_or("an unknown drainer"),
        row.updated_at,
        row.lease_until.unwrap_or(at),
        at,
        code,
        error,
        retry_at,
    ])?;
    // Only the latest attempts are kept.
    tx.prepare_cached(
        "DELETE FROM outbox_attempts WHERE key = ?1 AND token <
             (SELECT token FROM outbox_attempts WHERE key = ?1 ORDER BY token DESC LIMIT 1 OFFSET ?2)",
    )?
    .execute(params![row.key, ATTEMPTS_KEPT as i64 - 1])?;
    Ok(())
}

/// The attempt history of `key` ([`OutboxStore::attempts`]): the ended attempts of
/// `outbox_attempts`, then the last claim if it is in flight or was delivered. A file of a
/// version without the history (read as it is) shows only an attempt in flight.
fn attempts(conn: &mut Connection, key: &str) -> rusqlite::Result<Option<Vec<Attempt>>> {
    // One read transaction, one snapshot of the history and the row.
    let conn = conn.transaction()?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let history = schema::has_attempts(version);
    let last = if history {
        "SELECT status, token, attempts, owner, lease_until, updated_at, delivered_at,
                CASE WHEN claim_token = token THEN claim_owner END, claimed_at, claim_until
         FROM outbox WHERE key = ?1"
    } else {
        "SELECT status, token, attempts, owner, lease_until, updated_at, delivered_at, NULL, NULL, NULL
         FROM outbox WHERE key = ?1"
    };
    type Last = (
        i64,
        i64,
        i64,
        Option<String>,
        Option<i64>,
        i64,
        Option<i64>,
        Option<String>,
        Option<i64>,
        Option<i64>,
    );
    let found: Option<Last> = conn
        .prepare_cached(last)?
        .query_row([key], |r| {
            // The last claim's columns are outside the digest: a value of the wrong type reads
            // as none (no delivered attempt shown), not as an error.
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7).ok().flatten(),
                r.get(8).ok().flatten(),
                r.get(9).ok().flatten(),
            ))
        })
        .optional()?;
    let Some((
        status,
        token,
        number,
        owner,
        lease_until,
        updated_at,
        delivered_at,
        claim_owner,
        claimed_at,
        claim_until,
    )) = found
    else {
        return Ok(None);
    };
    let count = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
    let token = FenceToken(u64::try_from(token).unwrap_or(0));
    let mut attempts = Vec::new();
    if history {
        let mut stmt = conn.prepare_cached(
            "SELECT token, number, owner, claimed_at, lease_until, ended_at, outcome, error, retry_at
             FROM outbox_attempts WHERE key = ?1 ORDER BY token",
        )?;
        let mut rows = stmt.query([key])?;
        while let Some(r) = rows.next()? {
            // A history row is outside every digest: one that does not read (a changed type,
            // an unknown outcome) is skipped with a warning, never fails the read.
            let read = || -> rusqlite::Result<Option<Attempt>> {
                let code: i64 = r.get(6)?;
                let (error, retry_at): (Option<String>, Option<i64>) = (r.get(7)?, r.get(8)?);
                let Some(outcome) = u8::try_from(code)
                    .ok()
                    .and_then(|c| AttemptOutcome::from_code(c, error, retry_at.map(row::time)))
                else {
                    return Ok(None);
                };
                Ok(Some(Attempt {
                    token: FenceToken(u64::try_from(r.get::<_, i64>(0)?).unwrap_or(0)),
                    number: count(r.get(1)?),
                    owner: Arc::from(r.get::<_, String>(2)?),
                    claimed_at: row::time(r.get(3)?),
                    lease_expires_at: row::time(r.get(4)?),
                    ended_at: Some(row::time(r.get(5)?)),
                    outcome,
                }))
            };
            match read() {
                Ok(Some(attempt)) => attempts.push(attempt),
                Ok(None) => tracing::warn!(
                    action_key = key,
                    "an attempt of unknown outcome in the history; skipped"
                ),
                Err(e) => tracing::warn!(action_key = key, error = %e, "a damaged row in the attempt history; skipped"),
            }
        }
    }
    let last = match (status, owner, lease_until, claim_owner, claimed_at, claim_until) {
        (row::IN_FLIGHT, Some(owner), Some(until), ..) => {
            Some((owner, updated_at, until, None, AttemptOutcome::InFlight))
        }
        (row::DELIVERED, _, _, Some(owner), Some(at), Some(until)) => {
            Some((owner, at, until, delivered_at.map(row::time), AttemptOutcome::Delivered))
        }
        _ => None,
    };
    if let Some((owner, claimed_at, lease_until, ended_at, outcome)) = last {
        attempts.push(Attempt {
            token,
            number: count(number),
            owner: Arc::from(owner),
            claimed_at: row::time(claimed_at),
            lease_expires_at: row::time(lease_until),
            ended_at,
            outcome,
        });
    }
    conn.finish()?;
    Ok(Some(attempts))
}

/// A purged row's attachments go with it. (A final row keeps them: it stays in the scope of
/// every session it was attached to, for that session's reads, as in the other stores.)
fn forget_members(tx: &Connection, key: &str) -> rusqlite::Result<()> {
    tx.prepare_cached("DELETE FROM outbox_members WHERE key = ?1")?
        .execute([key])?;
    Ok(())
}

/// Marks a write unwanted if the future waiting for its answer is dropped first: a write
/// that runs on regardless then releases the claims it made (see [`release_if_unwanted`]).
pub(super) struct Unwanted(Option<Arc<AtomicBool>>);

impl Unwanted {
    /// The guard for the future, and the flag for the write.
    pub(super) fn pair() -> (Unwanted, Arc<AtomicBool>) {
        let wanted = Arc::new(AtomicBool::new(true));
        (Unwanted(Some(wanted.clone())), wanted)
    }

    /// The answer arrived: nothing to mark.
    pub(super) fn answered(mut self) {
        self.0 = None;
    }
}

impl Drop for Unwanted {
    fn drop(&mut self) {
        if let Some(wanted) = self.0.take() {
            wanted.store(false, Ordering::SeqCst);
        }
    }
}

/// Releases what `claimed` took, on the same connection, if its caller is gone (`wanted` was
/// cleared): pending and due again at once, instead of in flight for a whole lease.
pub(super) fn release_if_unwanted(
    conn: &mut Connection,
    wanted: &AtomicBool,
    claimed: &Claimed,
    now: SystemTime,
) -> rusqlite::Result<()> {
    if !wanted.load(Ordering::SeqCst) && !claimed.claims.is_empty() {
        record(conn, &claimed.releases(), now)?;
    }
    Ok(())
}

impl OutboxStore for SqliteOutbox {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        if let Err(e) = self.check_writable() {
            return Box::pin(async move { Err(e) });
        }
        let order = ClaimOrder::of(&request);
        // The claim runs even if its caller is gone by then (a dropped drain): it then
        // releases what it took, instead of leaving it in flight for a whole lease.
        let (unwanted, wanted) = Unwanted::pair();
        let claimed = self.run(move |conn| {
            let claimed = claim(conn, &order.request())?;
            release_if_unwanted(conn, &wanted, &claimed, order.now)?;
            Ok(claimed)
        });
        Box::pin(async move {
            let claimed = claimed.await;
            unwanted.answered();
            claimed
        })
    }

    fn record<'a>(
        &'a self,
        outcomes: &'a [Recording],
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<Recorded>, StoreError>> {
        if let Err(e) = self.check_writable() {
            return Box::pin(async move { Err(e) });
        }
        let outcomes = outcomes.to_vec();
        self.run(move |conn| record(conn, &outcomes, now))
    }

    fn lease_owners<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Vec<Arc<str>>, StoreError>> {
        let scope = scope.clone();
        self.run(move |conn| lease_owners(conn, &scope))
    }

    fn take_over<'a>(&'a self, owner: &'a str, now: SystemTime) -> BoxFuture<'a, Result<Vec<ActionKey>, StoreError>> {
        if let Err(e) = self.check_writable() {
            return Box::pin(async move { Err(e) });
        }
        let owner = owner.to_owned();
        self.run(move |conn| take_over(conn, &owner, now))
    }

    fn pause<'a>(&'a self, bucket: &'a str, until: SystemTime) -> BoxFuture<'a, Result<(), StoreError>> {
        if let Err(e) = self.check_writable() {
            return Box::pin(async move { Err(e) });
        }
        let bucket = bucket.to_owned();
        self.run(move |conn| {
            actor::write(conn, |tx| {
                let state = rate_state(tx, &bucket)?;
                write_rate(tx, &bucket, state.paused(until))
            })
        })
    }

    fn submit(&self, outcomes: Vec<Recording>, now: SystemTime) {
        if self.read_only.is_some() || outcomes.is_empty() {
            return;
        }
        let name = self.name.clone();
        self.actor.send(move |conn| {
            if let Err(e) = record(conn, &outcomes, now) {
                tracing::warn!(store = %name, error = %e, "submitted outcomes could not be recorded; they stay in flight until their leases expire");
            }
        });
    }

    fn renew<'a>(
        &'a self,
        held: &'a [(ActionKey, FenceToken)],
        until: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        if let Err(e) = self.check_writable() {
            return Box::pin(async move { Err(e) });
        }
        let held = held.to_vec();
        let until = ms(until);
        self.run(move |conn| {
            actor::write(conn, |tx| {
                let mut renewed = Vec::with_capacity(held.len());
                for (key, token) in &held {
                    let holds = match by_key(tx, key.as_str())? {
                        Some(Read::Intact(mut row))
                            if row.status == row::IN_FLIGHT && u64::try_from(row.token).ok() == Some(token.0) =>
                        {
                            row.lease_until = Some(until);
                            row.update_claimed(tx)?;
                            true
                        }
                        _ => false,
                    };
                    renewed.push(holds);
                }
                Ok(renewed)
            })
        })
    }

    fn retry<'a>(&'a self, key: &'a str, now: SystemTime) -> BoxFuture<'a, Result<Delivery, RetryError>> {
        if let Err(e) = self.check_writable() {
            return Box::pin(async move { Err(RetryError::Store(e)) });
        }
        let key = key.to_owned();
        let name = self.name.clone();
        let answer = self.run(move |conn| {
            actor::write(conn, |tx| {
                Ok(match by_key(tx, &key)? {
                    None => Err(RetryError::UnknownKey(ActionKey::from(key.as_str()))),
                    Some(Read::Damaged { key, detail, .. }) => {
                        Err(RetryError::Store(StoreError::integrity(name.clone(), key, detail)))
                    }
                    Some(Read::Intact(mut row)) => match row.status {
                        row::FAILED | row::DEAD | row::HELD => {
                            row.next_attempt_at = None;
                            // An intent that needs approval and never had one goes back to
                            // waiting for it.
                            let unapproved = row.requires_approval() && row.decision.is_none();
                            row.settle(
                                if unapproved {
                                    row::AWAITING_APPROVAL
                                } else {
                                    row::PENDING
                                },
                                ms(now),
                            );
                            // A held row re-armed before its `not_before`: due then.
                            row.due_at = row.due_at.map(|due| due.max(row.not_before()));
                            // Never ahead of an earlier open row of its group.
                            if let Some(group) = &row.group {
                                if group_open_before(tx, group, row.seq)? {
                                    row.settle(row::BLOCKED, ms(now));
                                }
                            }
                            row.update(tx)?;
                            Ok(row.view())
                        }
                        _ => Err(RetryError::NotFailed {
                            key: ActionKey::from(key.as_str()),
                            status: row.status().unwrap_or(DeliveryStatus::Held),
                        }),
                    },
                })
            })
        });
        Box::pin(async move { answer.await.map_err(RetryError::Store)? })
    }

    fn cancel<'a>(
        &'a self,
        key: &'a str,
        reason: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, CancelError>> {
        if let Err(e) = self.check_writable() {
            return Box::pin(async move { Err(CancelError::Store(e)) });
        }
        let (key, reason) = (key.to_owned(), reason.to_owned());
        let name = self.name.clone();
        let answer = self.run(move |conn| {
            actor::write(conn, |tx| {
                Ok(match by_key(tx, &key)? {
                    None => Err(CancelError::UnknownKey(ActionKey::from(key.as_str()))),
                    Some(Read::Damaged { key, detail, .. }) => {
                        Err(CancelError::Store(StoreError::integrity(name.clone(), key, detail)))
                    }
                    Some(Read::Intact(mut row)) => match row.status {
                        row::CANCELLED => Ok(row.view()),
                        row::PENDING | row::FAILED | row::DEAD | row::HELD | row::AWAITING_APPROVAL | row::BLOCKED => {
                            row.next_attempt_at = None;
                            row.cancel_reason = Some(reason.clone());
                            row.settle(row::CANCELLED, ms(now));
                            write_row(tx, &row, ms(now))?;
                            Ok(row.view())
                        }
                        _ => Err(CancelError::NotCancellable {
                            key: ActionKey::from(key.as_str()),
                            status: row.status().unwrap_or(DeliveryStatus::Held),
                        }),
                    },
                })
            })
        });
        Box::pin(async move { answer.await.map_err(CancelError::Store)? })
    }

    fn approve<'a>(
        &'a self,
        key: &'a str,
        by: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, ApprovalError>> {
        self.decide(key, Verdict::Approved, by, None, now)
    }

    fn reject<'a>(
        &'a self,
        key: &'a str,
        by: &'a str,
        reason: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, ApprovalError>> {
        self.decide(key, Verdict::Rejected, by, Some(reason), now)
    }

    fn purge(&self, filter: PurgeFilter, before: SystemTime, limit: usize) -> BoxFuture<'_, Result<u64, StoreError>> {
        if let Err(e) = self.check_writable() {
            return Box::pin(async move { Err(e) });
        }
        let (before, limit) = (ms(before), i64::try_from(limit).unwrap_or(i64::MAX));
        let sql = purge_sql(filter);
        self.run(move |conn| {
            let now = ms(SystemTime::now());
            actor::write(conn, |tx| {
                let old: Vec<(i64, String)> = tx
                    .prepare_cached(sql)?
                    .query_map(params![before, limit], |row| Ok((row.get(0)?, row.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                for (seq, key) in &old {
                    tx.prepare_cached("INSERT OR IGNORE INTO outbox_purged (key, purged_at) VALUES (?1, ?2)")?
                        .execute(params![key, now])?;
                    tx.prepare_cached("DELETE FROM outbox WHERE seq = ?1")?.execute([seq])?;
                    tx.prepare_cached("DELETE FROM outbox_attempts WHERE key = ?1")?
                        .execute([key])?;
                    forget_members(tx, key)?;
                }
                Ok(old.len() as u64)
            })
        })
    }

    fn attempts<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<Attempt>>, StoreError>> {
        let key = key.to_owned();
        self.run(move |conn| attempts(conn, &key))
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Delivery>, StoreError>> {
        let key = key.to_owned();
        self.read(move |conn| {
            Ok(match by_key(conn, &key)? {
                None => Ok(None),
                Some(Read::Intact(row)) => Ok(Some(row.view())),
                Some(Read::Damaged { key, detail, .. }) => Err((key, detail)),
            })
        })
    }

    fn list<'a>(&'a self, query: &'a LedgerQuery) -> BoxFuture<'a, Result<Page, StoreError>> {
        let query = query.clone();
        self.read(move |conn| {
            let mut params = vec![Value::Integer(
                query.after.map_or(0, |a| i64::try_from(a).unwrap_or(i64::MAX)),
            )];
            let mut sql = format!("SELECT {COLUMNS} FROM outbox o WHERE o.seq > ?");
            sql.push_str(&scope_sql(&query.scope, &mut params));
            if let Some(status) = query.status {
                sql.push_str(" AND o.status = ?");
                params.push(Value::Integer(i64::from(status.code())));
            }
            sql.push_str(" ORDER BY o.seq LIMIT ?");
            let limit = query.limit.max(1);
            params.push(Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1));
            let mut stmt = conn.prepare_cached(&sql)?;
            let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
            let mut page = Page::default();
            let mut last = 0;
            while let Some(found) = rows.next()? {
                if page.entries.len() == limit {
                    page.next = Some(u64::try_from(last).unwrap_or(0));
                    break;
                }
                match Row::read(found)? {
                    Read::Intact(row) => {
                        last = row.seq;
                        page.entries.push(row.view());
                    }
                    Read::Damaged { key, detail, .. } => return Ok(Err((key, detail))),
                }
            }
            Ok(Ok(page))
        })
    }

    fn counts<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<StatusCounts, StoreError>> {
        let scope = scope.clone();
        self.run(move |conn| {
            let mut params = Vec::new();
            let filter = scope_sql(&scope, &mut params);
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT o.status, count(*), count(o.next_attempt_at) FROM outbox o WHERE 1{filter} GROUP BY o.status"
            ))?;
            let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
            let mut counts = StatusCounts::default();
            while let Some(row) = rows.next()? {
                let (status, n, retrying): (i64, i64, i64) = (row.get(0)?, row.get(1)?, row.get(2)?);
                let n = u64::try_from(n).unwrap_or(0);
                match status {
                    row::PENDING => counts.pending += n,
                    row::IN_FLIGHT => counts.in_flight += n,
                    row::DELIVERED => counts.delivered += n,
                    row::FAILED => {
                        counts.failed += n;
                        counts.retrying += u64::try_from(retrying).unwrap_or(0);
                    }
                    row::DEAD => counts.dead += n,
                    row::CANCELLED => counts.cancelled += n,
                    row::AWAITING_APPROVAL => counts.awaiting_approval += n,
                    row::REJECTED => counts.rejected += n,
                    row::BLOCKED => counts.blocked += n,
                    // Held, and (in a damaged row) an unknown code: not delivered until an
                    // operator acts.
                    _ => counts.held += n,
                }
            }
            Ok(counts)
        })
    }

    fn rate_states(&self) -> BoxFuture<'_, Result<Vec<(String, RateState)>, StoreError>> {
        self.run(|conn| {
            // A file older than schema 8, opened read-only, has no buckets.
            let kept: bool = conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'outbox_rates')",
                )?
                .query_row([], |row| row.get(0))?;
            if !kept {
                return Ok(Vec::new());
            }
            let time = |us: i64| u64::try_from(us).unwrap_or(0);
            conn.prepare_cached("SELECT name, tat, paused_until FROM outbox_rates ORDER BY name")?
                .query_map([], |row| {
                    let state = RateState {
                        tat: time(row.get(1)?),
                        paused_until: time(row.get(2)?),
                    };
                    Ok((row.get(0)?, state))
                })?
                .collect()
        })
    }

    fn next_due<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Option<SystemTime>, StoreError>> {
        let scope = scope.clone();
        self.run(move |conn| {
            let mut earliest: Option<i64> = None;
            for column in ["due_at", "lease_until"] {
                let mut params = Vec::new();
                let filter = scope_sql(&scope, &mut params);
                let at: Option<i64> = conn
                    .prepare_cached(&format!(
                        "SELECT min(o.{column}) FROM outbox o WHERE o.{column} IS NOT NULL{filter}"
                    ))?
                    .query_row(rusqlite::params_from_iter(params), |row| row.get(0))?;
                earliest = match (earliest, at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            Ok(earliest.map(row::time))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(conn: &Connection, sql: &str, params: &[Value]) -> Vec<String> {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        stmt.query_map(rusqlite::params_from_iter(params), |row| row.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// No step of the plan reads a whole table (`SCAN outbox`, `SCAN o`, `SCAN m`). (`SCAN
    /// CONSTANT ROW` is the one row of a `SELECT` without `FROM`.)
    fn assert_no_table_scan(plan: &[String]) {
        for step in plan {
            let scans_a_table = step.starts_with("SCAN ")
                && step != "SCAN CONSTANT ROW"
                && !step.contains("subquery")
                && !step.contains('(');
            assert!(
                !scans_a_table && !step.starts_with("SCAN o") && !step.starts_with("SCAN m"),
                "{plan:#?}"
            );
        }
    }

    #[test]
    fn the_claim_query_reads_the_partial_indexes_of_due_rows() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(schema::V2_TABLES).unwrap();
        let (sql, params) = candidates_sql(&Scope::all(), 0, 10);
        let all = plan(&conn, &sql, &params);
        assert!(all.iter().any(|s| s.contains("INDEX outbox_due (")), "{all:#?}");
        assert_no_table_scan(&all);

        let (sql, params) = candidates_sql(&Scope::session("orders"), 0, 10);
        let session = plan(&conn, &sql, &params);
        assert!(session.iter().any(|s| s.contains("outbox_session_due")), "{session:#?}");
        assert_no_table_scan(&session);

        let (sql, params) = candidates_sql(&Scope::all().sessions(["a", "b"]).kinds(["notify"]), 0, 10);
        let both = plan(&conn, &sql, &params);
        println!("{all:#?}\n{session:#?}\n{both:#?}");
        assert_no_table_scan(&both);

        let leases = plan(
            &conn,
            "SELECT seq FROM outbox WHERE lease_until <= ?1 ORDER BY lease_until, seq",
            &[Value::Integer(0)],
        );
        assert!(leases.iter().any(|s| s.contains("outbox_leases")), "{leases:#?}");
    }

    #[test]
    fn turns_and_rate_limited_claims_seek_their_indexes() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(schema::V2_TABLES).unwrap();
        conn.execute_batch(schema::V8_CHANGES).unwrap();
        // (`SCAN s` and `SCAN k` read the recursive query's own rows, one per session or kind.)
        let no_scan_of_outbox = |steps: &[String]| {
            assert!(
                !steps.iter().any(|s| s.starts_with("SCAN o") || s.starts_with("SCAN h")),
                "{steps:#?}"
            );
        };
        for scope in [Scope::all(), Scope::all().sessions(["a", "b"])] {
            let (sql, params) = session_heads_sql(&scope, 0);
            let steps = plan(&conn, &sql, &params);
            assert!(steps.iter().any(|s| s.contains("outbox_session_due")), "{steps:#?}");
            no_scan_of_outbox(&steps);
        }
        let kinds = plan(&conn, DUE_KINDS, &[]);
        assert!(kinds.iter().any(|s| s.contains("outbox_kind_due")), "{kinds:#?}");
        no_scan_of_outbox(&kinds);
        let (sql, params) = candidates_sql(&Scope::all().kinds(["x"]), 0, 10);
        let one_kind = plan(&conn, &sql, &params);
        assert!(one_kind.iter().any(|s| s.contains("outbox_kind_due")), "{one_kind:#?}");
    }

    #[test]
    fn each_purge_reads_a_partial_index_of_the_rows_it_deletes() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(schema::V2_TABLES).unwrap();
        conn.execute_batch(schema::V4_CHANGES).unwrap();
        conn.execute_batch(schema::V5_CHANGES).unwrap();
        conn.execute_batch(schema::V6_CHANGES).unwrap();
        let params = [Value::Integer(10), Value::Integer(1000)];
        for (filter, index) in [
            (PurgeFilter::Final, "outbox_final"),
            (PurgeFilter::Delivered, "outbox_final"),
            (PurgeFilter::Cancelled, "outbox_cancelled"),
            (PurgeFilter::Rejected, "outbox_rejected"),
        ] {
            let steps = plan(&conn, purge_sql(filter), &params);
            assert!(steps.iter().any(|s| s.contains(index)), "{filter:?}: {steps:#?}");
            assert!(
                !steps.iter().any(|s| s.contains("TEMP B-TREE")),
                "{filter:?} sorts: {steps:#?}"
            );
            assert_no_table_scan(&steps);
        }
    }

    #[test]
    fn the_read_before_a_claim_reads_the_partial_indexes() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(schema::V2_TABLES).unwrap();
        conn.execute_batch(schema::V5_CHANGES).unwrap();
        conn.execute_batch(schema::V6_CHANGES).unwrap();
        conn.execute_batch(schema::V7_CHANGES).unwrap();
        // The reads of a group's open rows (registration, release, retry) use its index.
        let group = Value::Text("order:1".into());
        for sql in [
            "SELECT EXISTS (SELECT 1 FROM outbox WHERE grp = ?1 AND status NOT IN (2, 6, 8))",
            "SELECT seq FROM outbox WHERE grp = ?1 AND status NOT IN (2, 6, 8) ORDER BY seq LIMIT 1",
        ] {
            let steps = plan(&conn, sql, std::slice::from_ref(&group));
            assert!(
                steps.iter().any(|s| s.contains("INDEX outbox_group_open")),
                "{steps:#?}"
            );
            assert_no_table_scan(&steps);
        }
        let steps = plan(
            &conn,
            "SELECT EXISTS (SELECT 1 FROM outbox WHERE grp = ?1 AND seq < ?2 AND status NOT IN (2, 6, 8))",
            &[group, Value::Integer(7)],
        );
        assert!(
            steps.iter().any(|s| s.contains("INDEX outbox_group_open")),
            "{steps:#?}"
        );
        let (sql, params) = work_sql(&Scope::all(), 0, false);
        let leases = plan(&conn, &sql, &params);
        assert!(leases.iter().any(|s| s.contains("INDEX outbox_leases")), "{leases:#?}");
        assert_no_table_scan(&leases);

        let (sql, params) = work_sql(&Scope::all(), 0, true);
        let all = plan(&conn, &sql, &params);
        assert!(all.iter().any(|s| s.contains("INDEX outbox_leases")), "{all:#?}");
        assert!(all.iter().any(|s| s.contains("INDEX outbox_due (")), "{all:#?}");
        assert_no_table_scan(&all);

        let (sql, params) = work_sql(&Scope::session("orders"), 0, true);
        let session = plan(&conn, &sql, &params);
        assert!(
            session.iter().any(|s| s.contains("INDEX outbox_leases")),
            "{session:#?}"
        );
        assert!(session.iter().any(|s| s.contains("outbox_session_due")), "{session:#?}");
        assert_no_table_scan(&session);

        let (sql, params) = work_sql(&Scope::all().sessions(["a", "b"]).kinds(["notify"]), 0, true);
        let both = plan(&conn, &sql, &params);
        println!("{leases:#?}\n{all:#?}\n{session:#?}\n{both:#?}");
        assert_no_table_scan(&both);

        // And it answers: nothing, then a due row, then an expired lease only.
        let answer = |scope: &Scope, now: i64, due: bool| -> bool {
            let (sql, params) = work_sql(scope, now, due);
            conn.query_row(&sql, rusqlite::params_from_iter(params), |row| row.get(0))
                .unwrap()
        };
        assert!(!answer(&Scope::all(), 10, true));
        let intents = crate::model::delivery::test_intents("orders", 1, &[("k1", "notify")]);
        register(&conn, &intents, 5).unwrap();
        assert!(!answer(&Scope::all(), 4, true), "due at 5, not at 4");
        assert!(answer(&Scope::all(), 5, true));
        assert!(answer(&Scope::session("orders"), 5, true));
        assert!(!answer(&Scope::session("billing"), 5, true));
        assert!(!answer(&Scope::all().kinds(["other"]), 5, true));
        assert!(!answer(&Scope::all(), 5, false), "no lease");
        conn.execute(
            "UPDATE outbox SET status = 1, due_at = NULL, owner = 'd', lease_until = 9 WHERE key = 'k1'",
            [],
        )
        .unwrap();
        assert!(!answer(&Scope::all(), 8, true), "in flight, lease not expired");
        assert!(
            answer(&Scope::session("billing"), 9, false),
            "an expired lease, in any scope"
        );
    }
}
