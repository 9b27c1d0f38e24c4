//! One row of the `outbox` table: its columns, its integrity digest, and the checks a row
//! passes before its intent is handed to a dispatcher.
//!
//! Every row carries `digest = SHA-256(domain ‖ every column but seq and digest)`, each column
//! encoded with its SQLite type and length, so that a changed value or a changed type shows.
//! Every transition rewrites it; every read for a claim, a record, a renewal or a `get`
//! checks it. (`seq` is left out so that a row's digest can be computed before SQLite
//! numbers it; a changed `seq` only reorders claims.)
//!
//! The four decision columns of schema 5 (`decision`, `decided_by`, `decided_at`,
//! `decision_reason`: an operator's approval or rejection) are digested after the others,
//! whenever any of them is set. A row without a decision — every row an older build wrote —
//! keeps the digest it had, so the migration to schema 5 rewrites no row; a row with one can
//! neither lose it nor have it changed without failing its check (the encoding of each value
//! is self-delimiting, so a row with a decision never digests like one without).
//!
//! The approved digest of schema 9 (`decided_digest`: the action hash of the row when an
//! operator decided on it, [`Decision::digest`]) is digested after the four decision columns,
//! only when it is set. A decision an older build recorded has none and keeps the digest it
//! had (the migration to schema 9 rewrites no row); a decision with one can neither lose it
//! nor have it changed without failing the check. A claim hands out an approved row only
//! while its action hash is the approved digest ([`check_intent`](Row::check_intent)).
//!
//! The trace context of schema 6 (`trace_parent`: the W3C context of the produce run that
//! committed the intent, [`TraceParent::to_bytes`]) is written at registration, never
//! changed, and is **not** digested: it is advisory. Changed, it can only misattribute a
//! delivery to another trace — never change what is delivered, to whom, or whether — and a
//! value that does not decode (a wrong length, an all-zero id, a value of another type) reads
//! as no trace context: never an error, never a held row. Keeping it out of the digest
//! also leaves every older row's digest as it was (the migration rewrites nothing).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::types::{ToSqlOutput, ValueRef};
use sha2::{Digest, Sha256};

use crate::model::action::{ActionKey, Intent, Origin, Payload, PendingAction};
use crate::model::artifact::Generation;
use crate::model::delivery::{
    Decision, Delivery, DeliveryParts, DeliveryStatus, FenceToken, Lease, NewIntent, Verdict,
};
use crate::model::hash::{self, CommitHash, ContentHash};
use crate::model::trace::TraceParent;
use crate::state::refold::VerifyError;
use crate::store::log_store::OutboxCheck;

/// The columns of a row, in the order [`Row::read`] reads them.
pub(super) const COLUMNS: &str = "seq, key, kind, session, origin_commit, origin_gen, origin_run, action_hash, bytes, \
     recorded_at, status, due_at, token, owner, lease_until, attempts, expired, interrupted, last_error, \
     cancel_reason, updated_at, delivered_at, next_attempt_at, digest, decision, decided_by, decided_at, \
     decision_reason, trace_parent, grp, decided_digest";

/// Where [`COLUMNS`] has `trace_parent` (after `seq`, the digested columns, `digest` and the
/// four decision columns).
const TRACE_AT: usize = FIELDS + 6;

/// Where [`COLUMNS`] has `grp`, the ordering group (after `trace_parent`).
const GROUP_AT: usize = TRACE_AT + 1;

/// Where [`COLUMNS`] has `decided_digest`, the digest a decision was made on (after `grp`).
const DECIDED_DIGEST_AT: usize = GROUP_AT + 1;

/// The digested columns: all but `seq` (first) and `digest` (last).
const FIELDS: usize = 22;

/// Domain separation of the row digest.
const DOMAIN: &[u8] = b"reactifact/outbox/row/v1\0";

/// Status codes, as [`DeliveryStatus::code`] gives them.
pub(super) const PENDING: i64 = 0;
pub(super) const IN_FLIGHT: i64 = 1;
pub(super) const DELIVERED: i64 = 2;
pub(super) const FAILED: i64 = 3;
pub(super) const DEAD: i64 = 4;
pub(super) const HELD: i64 = 5;
pub(super) const CANCELLED: i64 = 6;
pub(super) const AWAITING_APPROVAL: i64 = 7;
pub(super) const REJECTED: i64 = 8;
pub(super) const BLOCKED: i64 = 9;

/// Milliseconds since the Unix epoch, as the file keeps times.
pub(super) fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The time of a stored millisecond count: the epoch for a negative one, at most
/// [`FAR_FUTURE`](crate::FAR_FUTURE) (a damaged value never yields an unprintable time).
pub(super) fn time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0)).min(crate::FAR_FUTURE)
}

fn decision_int(v: ValueRef<'_>) -> Option<Option<i64>> {
    match v {
        ValueRef::Null => Some(None),
        ValueRef::Integer(i) => Some(Some(i)),
        _ => None,
    }
}

fn decision_text(v: ValueRef<'_>) -> Option<Option<String>> {
    match v {
        ValueRef::Null => Some(None),
        ValueRef::Text(t) => std::str::from_utf8(t).ok().map(|t| Some(t.to_owned())),
        _ => None,
    }
}

/// One outbox row, as stored.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Row {
    pub(super) seq: i64,
    pub(super) key: String,
    pub(super) kind: String,
    /// The registering session (the owner).
    pub(super) session: String,
    pub(super) origin_commit: Vec<u8>,
    pub(super) origin_gen: i64,
    pub(super) origin_run: i64,
    pub(super) action_hash: Vec<u8>,
    /// The `PendingAction` encoding, as committed.
    pub(super) bytes: Vec<u8>,
    pub(super) recorded_at: i64,
    pub(super) status: i64,
    /// Set exactly when the row is claimable: pending, or failed with a retry scheduled.
    pub(super) due_at: Option<i64>,
    pub(super) token: i64,
    pub(super) owner: Option<String>,
    pub(super) lease_until: Option<i64>,
    pub(super) attempts: i64,
    pub(super) expired: i64,
    pub(super) interrupted: i64,
    pub(super) last_error: Option<String>,
    pub(super) cancel_reason: Option<String>,
    pub(super) updated_at: i64,
    pub(super) delivered_at: Option<i64>,
    pub(super) next_attempt_at: Option<i64>,
    /// An operator's verdict ([`Verdict::code`]) on an intent that awaited approval.
    pub(super) decision: Option<i64>,
    pub(super) decided_by: Option<String>,
    pub(super) decided_at: Option<i64>,
    pub(super) decision_reason: Option<String>,
    /// The action hash the decision was made on (schema 9); `None` without a decision, or for
    /// one an older build recorded.
    pub(super) decided_digest: Option<Vec<u8>>,
    /// The trace context of the run that committed the intent (outside the digest; a stored
    /// value that does not decode reads as `None`).
    pub(super) trace: Option<TraceParent>,
    /// The intent's ordering group (schema 7's `grp`), as its `PendingAction` names it:
    /// written at registration, never changed, outside the digest (a claim checks it against
    /// the hashed bytes, [`check_intent`](Row::check_intent)).
    pub(super) group: Option<String>,
}

/// A row as read: whole and intact, or failing its integrity check.
#[allow(clippy::large_enum_variant)] // short-lived, read one at a time
pub(super) enum Read {
    Intact(Row),
    /// The row's digest does not match, or a column has the wrong type.
    Damaged {
        seq: i64,
        /// The key column as far as it reads.
        key: String,
        detail: String,
    },
}

fn opt_int(v: Option<i64>) -> ValueRef<'static> {
    v.map_or(ValueRef::Null, ValueRef::Integer)
}

fn opt_text(v: &Option<String>) -> ValueRef<'_> {
    v.as_deref().map_or(ValueRef::Null, |s| ValueRef::Text(s.as_bytes()))
}

/// SHA-256 over the digested columns, each with its type and length.
fn digest<'a>(values: impl Iterator<Item = ValueRef<'a>>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    for value in values {
        match value {
            ValueRef::Null => h.update([0]),
            ValueRef::Integer(i) => {
                h.update([1]);
                h.update(i.to_be_bytes());
            }
            ValueRef::Real(f) => {
                h.update([2]);
                h.update(f.to_bits().to_be_bytes());
            }
            ValueRef::Text(t) => {
                h.update([3]);
                h.update((t.len() as u64).to_be_bytes());
                h.update(t);
            }
            ValueRef::Blob(b) => {
                h.update([4]);
                h.update((b.len() as u64).to_be_bytes());
                h.update(b);
            }
        }
    }
    h.finalize().into()
}

/// The digest of the row `row` of a `SELECT` of [`COLUMNS`] holds now, read as it is (any
/// column of any type or content: a damaged row is digested, never refused).
pub(super) fn digest_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<[u8; 32]> {
    let mut values = Vec::with_capacity(FIELDS);
    for at in 1..=FIELDS {
        values.push(row.get_ref(at)?);
    }
    let mut decision = Vec::with_capacity(4);
    for at in FIELDS + 2..=FIELDS + 5 {
        decision.push(row.get_ref(at)?);
    }
    let decided = row.get_ref(DECIDED_DIGEST_AT)?;
    Ok(row_digest(values.into_iter(), decision.into_iter(), decided))
}

/// The digest of a row: its digested columns, then its decision columns if any is set, then
/// the approved digest if it is set (schema 9).
fn row_digest<'a>(
    values: impl Iterator<Item = ValueRef<'a>>,
    decision: impl Iterator<Item = ValueRef<'a>> + Clone,
    decided: ValueRef<'a>,
) -> [u8; 32] {
    match (decision.clone().all(|v| v == ValueRef::Null), decided) {
        (true, ValueRef::Null) => digest(values),
        (false, ValueRef::Null) => digest(values.chain(decision)),
        (_, decided) => digest(values.chain(decision).chain([decided])),
    }
}

impl Row {
    /// A new row for an intent a commit registers: pending, due at `now` (or at its
    /// `not_before`, if later), or awaiting approval.
    pub(super) fn register(new: &NewIntent, now: i64) -> Row {
        let intent = &new.intent;
        let meta = crate::model::action::action_meta(&new.bytes);
        let awaiting = meta.requires_approval;
        Row {
            seq: 0,
            key: intent.key.as_str().to_owned(),
            kind: intent.kind.to_string(),
            session: intent.origin.session().to_owned(),
            origin_commit: intent.origin.commit().as_bytes().to_vec(),
            origin_gen: i64::try_from(intent.origin.generation().0).unwrap_or(i64::MAX),
            origin_run: i64::from(intent.origin.run),
            action_hash: new.action_hash.as_bytes().to_vec(),
            bytes: new.bytes.to_vec(),
            recorded_at: now,
            status: if awaiting { AWAITING_APPROVAL } else { PENDING },
            due_at: (!awaiting).then(|| not_before(meta.not_before).max(now)),
            token: 0,
            owner: None,
            lease_until: None,
            attempts: 0,
            expired: 0,
            interrupted: 0,
            last_error: None,
            cancel_reason: None,
            updated_at: now,
            delivered_at: None,
            next_attempt_at: None,
            decision: None,
            decided_by: None,
            decided_at: None,
            decision_reason: None,
            decided_digest: None,
            trace: intent.trace,
            group: meta.group,
        }
    }

    /// The decision columns, in [`COLUMNS`] order.
    pub(super) fn decision_fields(&self) -> [ValueRef<'_>; 4] {
        [
            opt_int(self.decision),
            opt_text(&self.decided_by),
            opt_int(self.decided_at),
            opt_text(&self.decision_reason),
        ]
    }

    /// The digested columns, in [`COLUMNS`] order. `trace_parent` is not one of them (see the
    /// module's documentation): a damaged trace context can only misattribute a trace, and
    /// reads as none.
    pub(super) fn fields(&self) -> [ValueRef<'_>; FIELDS] {
        [
            ValueRef::Text(self.key.as_bytes()),
            ValueRef::Text(self.kind.as_bytes()),
            ValueRef::Text(self.session.as_bytes()),
            ValueRef::Blob(&self.origin_commit),
            ValueRef::Integer(self.origin_gen),
            ValueRef::Integer(self.origin_run),
            ValueRef::Blob(&self.action_hash),
            ValueRef::Blob(&self.bytes),
            ValueRef::Integer(self.recorded_at),
            ValueRef::Integer(self.status),
            opt_int(self.due_at),
            ValueRef::Integer(self.token),
            opt_text(&self.owner),
            opt_int(self.lease_until),
            ValueRef::Integer(self.attempts),
            ValueRef::Integer(self.expired),
            ValueRef::Integer(self.interrupted),
            opt_text(&self.last_error),
            opt_text(&self.cancel_reason),
            ValueRef::Integer(self.updated_at),
            opt_int(self.delivered_at),
            opt_int(self.next_attempt_at),
        ]
    }

    /// The approved digest's column.
    fn decided_field(&self) -> ValueRef<'_> {
        self.decided_digest.as_deref().map_or(ValueRef::Null, ValueRef::Blob)
    }

    /// The row's digest, as stored beside it.
    pub(super) fn digest(&self) -> [u8; 32] {
        row_digest(
            self.fields().into_iter(),
            self.decision_fields().into_iter(),
            self.decided_field(),
        )
    }

    /// Inserts the row unless its key is there already; returns whether it was inserted.
    pub(super) fn insert(&self, conn: &rusqlite::Connection) -> rusqlite::Result<bool> {
        let digest = self.digest();
        let fields = self.fields();
        let trace = self.trace.map(|t| t.to_bytes());
        let params = fields
            .iter()
            .copied()
            .chain([ValueRef::Blob(&digest)])
            .chain(self.decision_fields())
            .chain([trace.as_ref().map_or(ValueRef::Null, |t| ValueRef::Blob(t))])
            .chain([self.group.as_deref().map_or(ValueRef::Null, ValueRef::from)])
            .map(ToSqlOutput::Borrowed);
        let changed = conn
            .prepare_cached(
                "INSERT INTO outbox (key, kind, session, origin_commit, origin_gen, origin_run, action_hash, bytes,
                     recorded_at, status, due_at, token, owner, lease_until, attempts, expired, interrupted,
                     last_error, cancel_reason, updated_at, delivered_at, next_attempt_at, digest,
                     decision, decided_by, decided_at, decision_reason, trace_parent, grp)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19,
                     ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29)
                 ON CONFLICT (key) DO NOTHING",
            )?
            .execute(rusqlite::params_from_iter(params))?;
        Ok(changed == 1)
    }

    /// Writes every column of the row (found by its `seq`) and its new digest.
    pub(super) fn update(&self, conn: &rusqlite::Connection) -> rusqlite::Result<()> {
        self.write(
            conn,
            "UPDATE outbox SET status = ?1, due_at = ?2, token = ?3, owner = ?4, lease_until = ?5, attempts = ?6,
                 expired = ?7, interrupted = ?8, last_error = ?9, cancel_reason = ?10, updated_at = ?11,
                 delivered_at = ?12, next_attempt_at = ?13, digest = ?14,
                 decision = ?16, decided_by = ?17, decided_at = ?18, decision_reason = ?19, decided_digest = ?20
             WHERE seq = ?15",
        )
    }

    /// [`update`](Row::update) for a row in flight (just claimed, or renewed): also keeps its
    /// lease as the last claim (`claim_owner`, `claimed_at`, `claim_until`, `claim_token`;
    /// outside the digest), which the attempt history reads once the attempt was delivered. An
    /// in-flight row's `updated_at` is the time of its claim (a renewal does not change it).
    pub(super) fn update_claimed(&self, conn: &rusqlite::Connection) -> rusqlite::Result<()> {
        self.write(
            conn,
            "UPDATE outbox SET status = ?1, due_at = ?2, token = ?3, owner = ?4, lease_until = ?5, attempts = ?6,
                 expired = ?7, interrupted = ?8, last_error = ?9, cancel_reason = ?10, updated_at = ?11,
                 delivered_at = ?12, next_attempt_at = ?13, digest = ?14,
                 decision = ?16, decided_by = ?17, decided_at = ?18, decision_reason = ?19, decided_digest = ?20,
                 claim_owner = ?4, claimed_at = ?11, claim_until = ?5, claim_token = ?3
             WHERE seq = ?15",
        )
    }

    /// Runs `sql`, an update of the row by its `seq` (`?15`) with the columns a transition
    /// changes (`?1`–`?13`: the first nine never change after the insert, so SQLite leaves the
    /// indexes of the others alone), the new digest (`?14`) and the decision (`?16`–`?20`).
    fn write(&self, conn: &rusqlite::Connection, sql: &str) -> rusqlite::Result<()> {
        let digest = self.digest();
        let fields = self.fields();
        let params = fields[9..]
            .iter()
            .copied()
            .chain([ValueRef::Blob(&digest), ValueRef::Integer(self.seq)])
            .chain(self.decision_fields())
            .chain([self.decided_field()])
            .map(ToSqlOutput::Borrowed);
        conn.prepare_cached(sql)?.execute(rusqlite::params_from_iter(params))?;
        Ok(())
    }

    /// Reads a row of [`COLUMNS`], checking its digest and its column types (not the trace
    /// context's: one that does not decode reads as none).
    pub(super) fn read(row: &rusqlite::Row<'_>) -> rusqlite::Result<Read> {
        let seq = match row.get_ref(0)? {
            ValueRef::Integer(seq) => seq,
            _ => 0,
        };
        let key = match row.get_ref(1)? {
            ValueRef::Text(t) | ValueRef::Blob(t) => String::from_utf8_lossy(t).into_owned(),
            ValueRef::Integer(i) => i.to_string(),
            _ => format!("(row {seq})"),
        };
        let mut values = Vec::with_capacity(FIELDS);
        for at in 1..=FIELDS {
            values.push(row.get_ref(at)?);
        }
        let stored = row.get_ref(FIELDS + 1)?;
        let mut decision = Vec::with_capacity(4);
        for at in FIELDS + 2..FIELDS + 6 {
            decision.push(row.get_ref(at)?);
        }
        let decided = row.get_ref(DECIDED_DIGEST_AT)?;
        let damaged = |detail: String| Read::Damaged {
            seq,
            key: key.clone(),
            detail,
        };
        if !matches!(stored, ValueRef::Blob(d) if d == row_digest(values.iter().copied(), decision.iter().copied(), decided))
        {
            return Ok(damaged(
                "the row does not match its digest (it was changed outside reactifact)".into(),
            ));
        }
        let decided = match decided {
            ValueRef::Null => Some(None),
            ValueRef::Blob(b) => Some(Some(b.to_vec())),
            _ => None,
        };
        match Row::typed(seq, &values, &decision).zip(decided) {
            Some((mut intact, decided)) => {
                intact.decided_digest = decided;
                intact.trace = match row.get_ref(TRACE_AT)? {
                    ValueRef::Blob(b) => TraceParent::from_bytes(b),
                    _ => None,
                };
                intact.group = match row.get_ref(GROUP_AT)? {
                    ValueRef::Text(t) => Some(String::from_utf8_lossy(t).into_owned()),
                    _ => None,
                };
                Ok(Read::Intact(intact))
            }
            None => Ok(damaged("a column of the row has the wrong type".into())),
        }
    }

    /// The row from its digested columns, if each has the type it should.
    fn typed(seq: i64, v: &[ValueRef<'_>], d: &[ValueRef<'_>]) -> Option<Row> {
        let text = |at: usize| match v[at] {
            ValueRef::Text(t) => std::str::from_utf8(t).ok().map(str::to_owned),
            _ => None,
        };
        let opt_text = |at: usize| match v[at] {
            ValueRef::Null => Some(None),
            _ => text(at).map(Some),
        };
        let blob = |at: usize| match v[at] {
            ValueRef::Blob(b) => Some(b.to_vec()),
            _ => None,
        };
        let int = |at: usize| match v[at] {
            ValueRef::Integer(i) => Some(i),
            _ => None,
        };
        let opt_int = |at: usize| match v[at] {
            ValueRef::Null => Some(None),
            ValueRef::Integer(i) => Some(Some(i)),
            _ => None,
        };
        Some(Row {
            seq,
            key: text(0)?,
            kind: text(1)?,
            session: text(2)?,
            origin_commit: blob(3)?,
            origin_gen: int(4)?,
            origin_run: int(5)?,
            action_hash: blob(6)?,
            bytes: blob(7)?,
            recorded_at: int(8)?,
            status: int(9)?,
            due_at: opt_int(10)?,
            token: int(11)?,
            owner: opt_text(12)?,
            lease_until: opt_int(13)?,
            attempts: int(14)?,
            expired: int(15)?,
            interrupted: int(16)?,
            last_error: opt_text(17)?,
            cancel_reason: opt_text(18)?,
            updated_at: int(19)?,
            delivered_at: opt_int(20)?,
            next_attempt_at: opt_int(21)?,
            decision: decision_int(d[0])?,
            decided_by: decision_text(d[1])?,
            decided_at: decision_int(d[2])?,
            decision_reason: decision_text(d[3])?,
            decided_digest: None,
            trace: None,
            group: None,
        })
    }

    /// The decision the row records, if it records one that reads.
    pub(super) fn decision(&self) -> Option<Decision> {
        let verdict = Verdict::from_code(self.decision?)?;
        Some(
            Decision::new(
                verdict,
                self.decided_by.clone().unwrap_or_default(),
                time(self.decided_at.unwrap_or(0)),
                self.decision_reason.clone(),
            )
            .with_digest(self.decided_hash()),
        )
    }

    /// The approved digest, if the row records one of 32 bytes.
    fn decided_hash(&self) -> Option<ContentHash> {
        let bytes: [u8; 32] = self.decided_digest.as_deref()?.try_into().ok()?;
        Some(ContentHash(bytes))
    }

    /// For `verify`: a [`VerifyError::OutboxDecision`] if the row records a decision bound to
    /// a digest that is not the action hash the log acted for its key (in its origin commit
    /// `origin`, of generation `generation`, and its run), or not the one the row holds.
    pub(super) fn decision_mismatch(
        &self,
        check: &OutboxCheck,
        origin: [u8; 32],
        generation: Generation,
    ) -> Option<VerifyError> {
        let verdict = Verdict::from_code(self.decision?)?;
        let decided = self.decided_hash()?;
        let run = u64::try_from(self.origin_run).ok()?;
        let act = check
            .acts
            .iter()
            .find(|a| a.key.as_str() == self.key && a.commit == origin && a.run == run)?;
        let held: [u8; 32] = self.action_hash.as_slice().try_into().ok()?;
        (decided.0 != act.action_hash || decided.0 != held).then(|| VerifyError::OutboxDecision {
            generation,
            key: ActionKey::from(self.key.as_str()),
            verdict,
            decided,
            acted: ContentHash(act.action_hash),
            held: ContentHash(held),
        })
    }

    /// Whether the row's `PendingAction` asks for approval.
    /// The earliest time the row may be due ([`PendingAction::not_before`](crate::PendingAction::not_before)),
    /// in the milliseconds the table keeps (`i64::MIN` for none).
    pub(super) fn not_before(&self) -> i64 {
        not_before(crate::model::action::not_before(&self.bytes))
    }

    pub(super) fn requires_approval(&self) -> bool {
        crate::model::action::requires_approval(&self.bytes)
    }

    /// The status, if the code is one.
    pub(super) fn status(&self) -> Option<DeliveryStatus> {
        u8::try_from(self.status).ok().and_then(DeliveryStatus::from_code)
    }

    /// Checks that the row may be handed to a dispatcher: a known status, bytes that hash to
    /// the row's action hash and decode as a `PendingAction` of the row's key and kind.
    /// Returns the payload, or why not.
    pub(super) fn check_intent(&self) -> Result<Vec<u8>, String> {
        if self.status().is_none() {
            return Err(format!("the row has unknown status {}", self.status));
        }
        if self.origin_commit.len() != 32 {
            return Err("its origin commit is not a 32-byte hash".into());
        }
        if hash::content_hash(&self.bytes).as_bytes()[..] != self.action_hash[..] {
            return Err("its bytes do not hash to its action hash".into());
        }
        let action: PendingAction = rmp_serde::from_slice(&self.bytes)
            .map_err(|e| format!("its bytes do not decode as a pending action: {e}"))?;
        if action.key != self.key {
            return Err(format!("its pending action is for key `{}`", action.key));
        }
        if action.kind != self.kind {
            return Err(format!(
                "its pending action is of kind `{}`, not `{}`",
                action.kind, self.kind
            ));
        }
        // An approval covers the bytes it was given, and no others.
        if let Some(decided) = &self.decided_digest {
            if self.decision == Some(i64::from(Verdict::Approved.code())) && decided[..] != self.action_hash[..] {
                return Err(format!(
                    "intent `{}` was approved for digest {}, but its row holds {}: the approval does not cover \
                     these bytes, which are not sent",
                    self.key,
                    hash::hex(decided),
                    hash::hex(&self.action_hash)
                ));
            }
        }
        if action.requires_approval && self.decision != Some(i64::from(Verdict::Approved.code())) {
            return Err("its pending action requires approval, and the row records none".into());
        }
        if action.group != self.group {
            return Err(format!(
                "its pending action is of ordering group {:?}, the row says {:?}",
                action.group, self.group
            ));
        }
        Ok(action.payload)
    }

    /// The ledger entry of the row, with this payload (what a dispatcher receives).
    pub(super) fn delivery(&self, payload: &[u8]) -> Delivery {
        let commit: [u8; 32] = self.origin_commit.as_slice().try_into().unwrap_or([0; 32]);
        let count = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
        let token = FenceToken(u64::try_from(self.token).unwrap_or(0));
        Delivery::from_parts(DeliveryParts {
            intent: Intent {
                key: ActionKey::from(self.key.as_str()),
                kind: Arc::from(self.kind.as_str()),
                payload: Payload::from(payload),
                origin: Origin::new(
                    self.session.as_str(),
                    CommitHash(commit),
                    Generation(u64::try_from(self.origin_gen).unwrap_or(0)),
                    count(self.origin_run),
                ),
                attempt: count(self.attempts),
                trace: self.trace,
            },
            // An unknown code (only in a row that failed its check) shows as held.
            status: self.status().unwrap_or(DeliveryStatus::Held),
            attempts: count(self.attempts),
            last_error: self.last_error.clone(),
            recorded_at: time(self.recorded_at),
            updated_at: time(self.updated_at),
            delivered_at: self.delivered_at.map(time),
            lease: match (&self.owner, self.lease_until) {
                (Some(owner), Some(until)) if self.status == IN_FLIGHT => Some(Lease {
                    owner: Arc::from(owner.as_str()),
                    expires_at: time(until),
                    token,
                }),
                _ => None,
            },
            expired_leases: count(self.expired),
            interrupted: count(self.interrupted),
            next_attempt_at: self.next_attempt_at.map(time),
            token,
            cancel_reason: self.cancel_reason.clone(),
            decision: self.decision(),
            not_before: crate::model::action::action_not_before(&self.bytes),
            group: self.group.as_deref().map(Arc::from),
        })
    }

    /// The entry for a read that does not hand the intent out: the payload if the bytes
    /// decode, empty otherwise.
    pub(super) fn view(&self) -> Delivery {
        let payload = rmp_serde::from_slice::<PendingAction>(&self.bytes)
            .map(|a| a.payload)
            .unwrap_or_default();
        self.delivery(&payload)
    }

    /// Clears the lease and sets the status and `updated_at`.
    pub(super) fn settle(&mut self, status: i64, now: i64) {
        self.status = status;
        self.owner = None;
        self.lease_until = None;
        self.updated_at = now;
        let status = u8::try_from(status).ok().and_then(DeliveryStatus::from_code);
        self.due_at = match status {
            Some(status) => crate::model::outcome::due_at(status, self.next_attempt_at.map(time), time(now)).map(ms),
            None => None,
        };
    }
}

/// A `not_before` in the milliseconds the table keeps (`i64::MIN` for none).
fn not_before(at: Option<u64>) -> i64 {
    at.map_or(i64::MIN, |at| i64::try_from(at).unwrap_or(i64::MAX))
}
