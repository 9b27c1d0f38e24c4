//! One row of `outbox` as read: its columns, whether it passed its integrity check, and the
//! ledger entry it stands for.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reactifact_core::audit::{CommitHash, ContentHash};
use reactifact_core::ledger::{Decision, Delivery, DeliveryStatus, FenceToken, Lease};
use reactifact_core::runtime::{Generation, Origin, TraceParent};
use reactifact_core::store::{DeliveryParts, Verdict};
use reactifact_core::{ActionKey, Intent, PendingAction};

use crate::schema::DIGESTED;

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Status codes ([`DeliveryStatus::code`]).
pub(crate) const PENDING: i64 = 0;
pub(crate) const IN_FLIGHT: i64 = 1;
pub(crate) const FAILED: i64 = 3;
pub(crate) const DEAD: i64 = 4;
pub(crate) const HELD: i64 = 5;
pub(crate) const CANCELLED: i64 = 6;
pub(crate) const AWAITING_APPROVAL: i64 = 7;
pub(crate) const REJECTED: i64 = 8;
pub(crate) const BLOCKED: i64 = 9;

/// Why a row that does not match its digest is held.
pub(crate) const CHANGED: &str = "the row does not match its digest (it was changed outside reactifact)";
/// Why a row whose bytes do not hash to its action hash is held.
pub(crate) const REHASHED: &str = "its bytes do not hash to its action hash";

/// Milliseconds since the Unix epoch, as the store keeps times.
pub(crate) fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The time of a stored millisecond count: the epoch for a negative one, at most
/// [`FAR_FUTURE`](reactifact_core::store::FAR_FUTURE) (a damaged value never yields an unprintable
/// time).
pub(crate) fn time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0)).min(reactifact_core::store::FAR_FUTURE)
}

/// The columns a read selects from `o`, in [`Row::read`]'s order: `seq`, the digested ones,
/// whether the row is intact (its digest matches), and the trace context.
pub(crate) fn columns(s: &str) -> String {
    format!("o.seq, {}, {}, o.trace_parent, o.grp", prefixed("o"), intact(s, "o"))
}

/// The digested columns of alias `alias`, comma-separated.
pub(crate) fn prefixed(alias: &str) -> String {
    DIGESTED.map(|c| format!("{alias}.{c}")).join(", ")
}

/// Whether the row `alias` matches its digest.
pub(crate) fn intact(s: &str, alias: &str) -> String {
    format!("({alias}.digest = {s}.outbox_digest({}))", prefixed(alias))
}

/// The digest of row `alias` with some columns replaced by expressions.
pub(crate) fn digest_with(s: &str, alias: &str, replaced: &[(&str, &str)]) -> String {
    let args: Vec<String> = DIGESTED
        .iter()
        .map(|c| match replaced.iter().find(|(name, _)| name == c) {
            Some((_, expr)) => format!("({expr})"),
            None => format!("{alias}.{c}"),
        })
        .collect();
    format!("{s}.outbox_digest({})", args.join(", "))
}

/// An `UPDATE … SET` list writing `replaced` and the digest over them.
pub(crate) fn set_with_digest(s: &str, alias: &str, replaced: &[(&str, &str)]) -> String {
    let mut set: Vec<String> = replaced.iter().map(|(c, e)| format!("{c} = ({e})")).collect();
    set.push(format!("digest = {}", digest_with(s, alias, replaced)));
    set.join(", ")
}

/// The columns a hold of a damaged row `alias` sets at `$now` (a parameter). The row's
/// decision cannot be trusted: it is dropped (and named in the error), so that a retry of the
/// hold puts an intent that requires approval back to awaiting it — a changed rejection never
/// comes back approved.
pub(crate) fn hold_set(s: &str, alias: &str, now: &str) -> String {
    let error = format!(
        "'integrity: ' || CASE WHEN NOT {} THEN '{CHANGED}' ELSE '{REHASHED}' END
         || CASE WHEN {alias}.decision IS NULL AND {alias}.decided_by IS NULL THEN '' ELSE
             '; the decision it held is not trusted and was dropped: approve or reject it again' END",
        intact(s, alias)
    );
    set_with_digest(
        s,
        alias,
        &[
            ("status", "5"),
            ("due_at", "NULL::bigint"),
            ("owner", "NULL::text"),
            ("lease_until", "NULL::bigint"),
            ("next_attempt_at", "NULL::bigint"),
            ("last_error", &error),
            ("updated_at", now),
            ("decision", "NULL::bigint"),
            ("decided_by", "NULL::text"),
            ("decided_at", "NULL::bigint"),
            ("decision_reason", "NULL::text"),
            ("decided_digest", "NULL::bytea"),
        ],
    )
}

/// One outbox row, as read.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub(crate) seq: i64,
    pub(crate) key: String,
    pub(crate) kind: String,
    pub(crate) session: String,
    pub(crate) origin_commit: Vec<u8>,
    pub(crate) origin_gen: i64,
    pub(crate) origin_run: i64,
    /// The content hash of `bytes` as committed (the claim's statement checks that the bytes
    /// still hash to it).
    pub(crate) action_hash: Vec<u8>,
    pub(crate) bytes: Vec<u8>,
    pub(crate) recorded_at: i64,
    pub(crate) status: i64,
    pub(crate) token: i64,
    pub(crate) owner: Option<String>,
    pub(crate) lease_until: Option<i64>,
    pub(crate) attempts: i64,
    pub(crate) expired: i64,
    pub(crate) interrupted: i64,
    pub(crate) last_error: Option<String>,
    pub(crate) cancel_reason: Option<String>,
    pub(crate) updated_at: i64,
    pub(crate) delivered_at: Option<i64>,
    pub(crate) next_attempt_at: Option<i64>,
    /// An operator's verdict ([`Verdict::code`]) on an intent that awaited approval, who, when
    /// and why.
    pub(crate) decision: Option<i64>,
    pub(crate) decided_by: Option<String>,
    pub(crate) decided_at: Option<i64>,
    pub(crate) decision_reason: Option<String>,
    /// The action hash the decision was made on (version 8); `None` without a decision, or
    /// for one an older build recorded.
    pub(crate) decided_digest: Option<Vec<u8>>,
    /// Whether the row matched its digest when read.
    pub(crate) intact: bool,
    /// The trace context of the run that committed the intent: not digested, and `None` for
    /// a stored value that does not decode (advisory: it can only misattribute a trace).
    pub(crate) trace: Option<TraceParent>,
    /// The intent's ordering group (`grp`): written at registration, never changed, not
    /// digested; a claim checks it against the hashed bytes ([`Row::check_intent`]).
    pub(crate) group: Option<String>,
}

impl Row {
    /// Reads the [`columns`] starting at column `at` (the due time, used by the statements, is
    /// not kept; the trace context is read leniently).
    pub(crate) fn read(row: &tokio_postgres::Row, at: usize) -> Result<Row, tokio_postgres::Error> {
        Ok(Row {
            seq: row.try_get(at)?,
            key: row.try_get(at + 1)?,
            kind: row.try_get(at + 2)?,
            session: row.try_get(at + 3)?,
            origin_commit: row.try_get(at + 4)?,
            origin_gen: row.try_get(at + 5)?,
            origin_run: row.try_get(at + 6)?,
            action_hash: row.try_get(at + 7)?,
            bytes: row.try_get(at + 8)?,
            recorded_at: row.try_get(at + 9)?,
            status: row.try_get(at + 10)?,
            token: row.try_get(at + 12)?,
            owner: row.try_get(at + 13)?,
            lease_until: row.try_get(at + 14)?,
            attempts: row.try_get(at + 15)?,
            expired: row.try_get(at + 16)?,
            interrupted: row.try_get(at + 17)?,
            last_error: row.try_get(at + 18)?,
            cancel_reason: row.try_get(at + 19)?,
            updated_at: row.try_get(at + 20)?,
            delivered_at: row.try_get(at + 21)?,
            next_attempt_at: row.try_get(at + 22)?,
            decision: row.try_get(at + 23)?,
            decided_by: row.try_get(at + 24)?,
            decided_at: row.try_get(at + 25)?,
            decision_reason: row.try_get(at + 26)?,
            decided_digest: row.try_get(at + 27)?,
            intact: row.try_get::<_, Option<bool>>(at + 28)?.unwrap_or(false),
            // Never an error: a value of another type, or one that does not decode, is none.
            trace: row
                .try_get::<_, Option<&[u8]>>(at + 29)
                .ok()
                .flatten()
                .and_then(TraceParent::from_bytes),
            group: row.try_get(at + 30)?,
        })
    }

    /// The status, if the code is one.
    pub(crate) fn status(&self) -> Option<DeliveryStatus> {
        u8::try_from(self.status).ok().and_then(DeliveryStatus::from_code)
    }

    /// Checks that the row's intent may be handed to a dispatcher (its digest and action hash
    /// were checked by the statement that read it): a known status, a 32-byte origin commit,
    /// bytes that decode as a `PendingAction` of the row's key and kind. Returns the payload,
    /// or why not.
    pub(crate) fn check_intent(&self) -> Result<Vec<u8>, String> {
        if self.status().is_none() {
            return Err(format!("the row has unknown status {}", self.status));
        }
        if self.origin_commit.len() != 32 {
            return Err("its origin commit is not a 32-byte hash".into());
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
            if self.decision == Some(i64::from(Verdict::Approved.code())) && *decided != self.action_hash {
                return Err(format!(
                    "intent `{}` was approved for digest {}, but its row holds {}: the approval does not cover \
                     these bytes, which are not sent",
                    self.key,
                    hex(decided),
                    hex(&self.action_hash)
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

    /// The decision the row records, if it records one that reads.
    pub(crate) fn decision(&self) -> Option<Decision> {
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

    /// Whether the row's bytes hash to its action hash.
    pub(crate) fn bytes_match(&self) -> bool {
        ContentHash::of(&self.bytes).as_bytes()[..] == self.action_hash[..]
    }

    /// Whether the row's `PendingAction` asks for approval (`false` if its bytes do not
    /// decode).
    pub(crate) fn requires_approval(&self) -> bool {
        rmp_serde::from_slice::<PendingAction>(&self.bytes).is_ok_and(|a| a.requires_approval)
    }

    /// When the row becomes due if it is made pending at `now` (Unix milliseconds): then, or
    /// at its `PendingAction`'s `not_before` if that is later.
    pub(crate) fn due_from(&self, now: i64) -> i64 {
        let not_before = rmp_serde::from_slice::<PendingAction>(&self.bytes)
            .ok()
            .and_then(|a| a.not_before)
            .map_or(i64::MIN, |at| i64::try_from(at).unwrap_or(i64::MAX));
        not_before.max(now)
    }

    /// The ledger entry of the row, with this payload.
    pub(crate) fn delivery(&self, payload: &[u8]) -> Delivery {
        let commit: [u8; 32] = self.origin_commit.as_slice().try_into().unwrap_or([0; 32]);
        let count = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
        let token = FenceToken(u64::try_from(self.token).unwrap_or(0));
        let origin = Origin::new(
            self.session.as_str(),
            CommitHash(commit),
            Generation(u64::try_from(self.origin_gen).unwrap_or(0)),
            count(self.origin_run),
        );
        Delivery::from_parts(DeliveryParts {
            intent: Intent::new(
                ActionKey::from(self.key.as_str()),
                self.kind.as_str(),
                payload,
                origin,
                count(self.attempts),
            )
            .with_trace_parent(self.trace),
            // An unknown code (only in a damaged row) shows as held.
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
            not_before: reactifact_core::store::action_not_before(&self.bytes),
            group: self.group.as_deref().map(Arc::from),
        })
    }

    /// The entry for a read that does not hand the intent out: the payload if the bytes
    /// decode, empty otherwise.
    pub(crate) fn view(&self) -> Delivery {
        let payload = rmp_serde::from_slice::<PendingAction>(&self.bytes)
            .map(|a| a.payload)
            .unwrap_or_default();
        self.delivery(&payload)
    }
}
