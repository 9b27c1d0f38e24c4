//! The delivery state of an intent, as the outbox of a store keeps it: its status, its
//! attempts, and the lease and fencing token of the attempt in flight.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::model::action::{ActionKey, Intent, Origin};
use crate::model::artifact::{ArtifactId, Generation};
use crate::model::hash::ContentHash;

/// Where an intent is in its delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum DeliveryStatus {
    /// Committed and waiting for a drain.
    Pending,
    /// Claimed by a drain, which holds a lease on it: handed to a dispatcher (or about to be),
    /// the outcome not recorded yet.
    InFlight,
    /// The dispatcher reported success. Never handed to a dispatcher again.
    Delivered,
    /// The last attempt failed. If [`Delivery::next_attempt_at`] is set, the retry policy
    /// will try again then; otherwise it waits for `retry`.
    Failed,
    /// No more automatic attempts: the retry policy's attempts are used up, or the dispatcher
    /// said the failure is permanent. A dead letter stays visible; `retry` re-arms it.
    Dead,
    /// Not delivered until an operator acts: no dispatcher route handles its kind, or its
    /// stored row failed its integrity check. Held, not dropped: `retry` re-arms it.
    Held,
    /// Cancelled by an operator before it was delivered: never handed to a dispatcher again
    /// ([`Delivery::cancel_reason`] says why). Final, like `Delivered`.
    Cancelled,
    /// Committed by a produce that asked for approval
    /// ([`Effects::act_with_approval`](crate::Effects::act_with_approval)): never claimed, never
    /// handed to a dispatcher, not final, until an operator approves it (pending, due at once)
    /// or rejects it ([`Rejected`](DeliveryStatus::Rejected)).
    AwaitingApproval,
    /// Rejected by an operator while it awaited approval ([`Delivery::decision`] says who,
    /// when and why): never handed to a dispatcher. Final, like `Cancelled`, and purged like
    /// it.
    Rejected,
    /// Waits for an earlier intent of its ordering group ([`Delivery::group`]) to be final
    /// (delivered, cancelled or rejected): never claimed, not final. When the earlier one is
    /// final it becomes pending (or awaits approval, if it asks for it), due at once or at
    /// its `not_before`. An operator may cancel it (which skips it).
    Blocked,
}

impl DeliveryStatus {
    /// Every status, in the order of their codes.
    pub const ALL: [DeliveryStatus; 10] = [
        DeliveryStatus::Pending,
        DeliveryStatus::InFlight,
        DeliveryStatus::Delivered,
        DeliveryStatus::Failed,
        DeliveryStatus::Dead,
        DeliveryStatus::Held,
        DeliveryStatus::Cancelled,
        DeliveryStatus::AwaitingApproval,
        DeliveryStatus::Rejected,
        DeliveryStatus::Blocked,
    ];

    /// Whether no transition leaves this status: delivered, cancelled or rejected.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            DeliveryStatus::Delivered | DeliveryStatus::Cancelled | DeliveryStatus::Rejected
        )
    }

    /// The status's stable code in a store (0 pending … 6 cancelled, 7 awaiting approval, 8
    /// rejected, 9 blocked), the same in every store.
    pub fn code(self) -> u8 {
        match self {
            DeliveryStatus::Pending => 0,
            DeliveryStatus::InFlight => 1,
            DeliveryStatus::Delivered => 2,
            DeliveryStatus::Failed => 3,
            DeliveryStatus::Dead => 4,
            DeliveryStatus::Held => 5,
            DeliveryStatus::Cancelled => 6,
            DeliveryStatus::AwaitingApproval => 7,
            DeliveryStatus::Rejected => 8,
            DeliveryStatus::Blocked => 9,
        }
    }

    /// The status with this code, if one has it.
    pub fn from_code(code: u8) -> Option<DeliveryStatus> {
        DeliveryStatus::ALL.get(usize::from(code)).copied()
    }
}

impl fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::InFlight => "in flight",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Failed => "failed",
            DeliveryStatus::Dead => "dead",
            DeliveryStatus::Held => "held",
            DeliveryStatus::Cancelled => "cancelled",
            DeliveryStatus::AwaitingApproval => "awaiting approval",
            DeliveryStatus::Rejected => "rejected",
            DeliveryStatus::Blocked => "blocked",
        })
    }
}

/// A fencing token: how many times an intent has been claimed. Every claim takes the next
/// one, so a token names one attempt, and the store accepts an outcome or a renewal only
/// while the intent is still in flight under the token it was claimed with. A holder that
/// stalled past its lease, whose intent was reclaimed (and perhaps claimed and delivered by
/// another drain), holds an old token: its late outcome is rejected, not recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FenceToken(pub u64);

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Who holds an in-flight attempt, until when, and under which token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The drainer (process and drain) that claimed the intent. A drain of this crate writes
    /// `pid PID started NANOS`, then, where its process can tell, where it runs
    /// (`on HOST boot BOOT ns PIDNS:TIMENS ticks TICKS`, and `machine MACHINE` where the host
    /// has a machine id) and, for a standalone drainer, `drainer N`: enough for a drain starting
    /// later on the same host to prove the holder dead and take its claims over at once
    /// ([`reclaim_dead_owners`](crate::reclaim_dead_owners)).
    pub owner: Arc<str>,
    /// When the lease expires, unless its holder renews it. Once it has expired, any drain of
    /// the store puts the intent back to pending, and it is delivered again with the same
    /// idempotency key.
    pub expires_at: SystemTime,
    /// The fencing token of the claim.
    pub token: FenceToken,
}

/// What an operator decided about an intent that awaited approval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// Approved: the intent became pending, and is delivered like any other.
    Approved,
    /// Rejected: the intent is final, never handed to a dispatcher.
    Rejected,
}

impl Verdict {
    /// The verdict's stable code in a store (1 approved, 2 rejected). For the stores'
    /// encodings.
    #[doc(hidden)]
    pub fn code(self) -> u8 {
        match self {
            Verdict::Approved => 1,
            Verdict::Rejected => 2,
        }
    }

    /// The verdict of a stored code. For the stores' encodings.
    #[doc(hidden)]
    pub fn from_code(code: i64) -> Option<Verdict> {
        match code {
            1 => Some(Verdict::Approved),
            2 => Some(Verdict::Rejected),
            _ => None,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Approved => "approved",
            Verdict::Rejected => "rejected",
        })
    }
}

/// The decision on an intent that required approval, as the ledger keeps it
/// ([`Delivery::decision`]): the verdict, who made it, when, (for a rejection) why, and the
/// digest of what was decided on. It is part of the entry's integrity digest in every durable
/// store, so a changed byte never turns a rejection into an approval unnoticed.
///
/// An approval is bound to what it approved: a claim hands an intent out only while the
/// action hash its row holds is the [`digest`](Decision::digest) its approval recorded, so no
/// other bytes ever go out under it (a row whose payload was changed in the table is held,
/// never sent, and `verify` names it).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Approved or rejected.
    pub verdict: Verdict,
    /// Who decided, as the operator named themselves.
    pub by: String,
    /// When (whole milliseconds).
    pub at: SystemTime,
    /// Why, for a rejection (`None` for an approval).
    pub reason: Option<String>,
    /// What was approved (or rejected): the action hash of the intent's committed
    /// `PendingAction` (it covers its kind, key, payload and flags), as the store held it
    /// when the operator decided. `None` only for a decision recorded by a build before
    /// approvals were bound to their digest (an older file or schema): such an approval is
    /// accepted as it was, bound to nothing but the row's own integrity check.
    pub digest: Option<ContentHash>,
}

impl Decision {
    /// A decision from its parts, as a store reads it (without a digest: see
    /// [`with_digest`](Decision::with_digest)).
    pub fn new(verdict: Verdict, by: impl Into<String>, at: SystemTime, reason: Option<String>) -> Self {
        Decision {
            verdict,
            by: by.into(),
            at,
            reason,
            digest: None,
        }
    }

    /// The decision, bound to the action hash it decided on (`None` for a decision an older
    /// build recorded).
    pub fn with_digest(mut self, digest: Option<ContentHash>) -> Self {
        self.digest = digest;
        self
    }

    /// Whether an intent whose committed `PendingAction` hashes to `action_hash` may go out
    /// under this decision: it is an approval, and its digest is `action_hash` (or it has
    /// none: an approval an older build recorded).
    pub fn approves(&self, action_hash: &ContentHash) -> bool {
        self.verdict == Verdict::Approved && self.digest.as_ref().is_none_or(|d| d == action_hash)
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} by {}", self.verdict, self.by)?;
        if let Some(digest) = &self.digest {
            write!(f, " (digest {})", digest.short())?;
        }
        if let Some(reason) = &self.reason {
            write!(f, ": {reason}")?;
        }
        Ok(())
    }
}

/// The ledger entry of one intent. Kept out of the `PendingAction`'s content, so delivery
/// never changes a content hash.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub(crate) intent: Intent,
    pub(crate) status: DeliveryStatus,
    pub(crate) attempts: u32,
    pub(crate) recorded_at: SystemTime,
    pub(crate) updated_at: SystemTime,
    pub(crate) delivered_at: Option<SystemTime>,
    pub(crate) lease: Option<Lease>,
    /// The token of the last claim (0 before the first).
    pub(crate) token: FenceToken,
    /// What most entries never have (an error, a cancel, a decision, an attempt of unknown
    /// outcome, a scheduled retry).
    pub(crate) remarks: Remarks,
}

/// What most ledger entries never have (an error, a cancel, a decision, an attempt of unknown
/// outcome, a scheduled retry), behind one pointer: `None` while all of it is empty, so an
/// entry that was delivered at the first attempt costs one word for it (the in-memory ledger
/// keeps an entry per intent for the life of the store, with its remarks in this form too).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Remarks(Option<Box<RemarkFields>>);

/// The fields of [`Remarks`].
#[derive(Clone, Debug, Default, PartialEq)]
struct RemarkFields {
    last_error: Option<String>,
    cancel_reason: Option<String>,
    decision: Option<Decision>,
    expired_leases: u32,
    interrupted: u32,
    /// Only a failed attempt schedules a retry, and it always sets an error too.
    next_attempt_at: Option<SystemTime>,
    /// The intent's `not_before`, if it has one.
    not_before: Option<SystemTime>,
    /// The intent's ordering group, if it has one.
    group: Option<Arc<str>>,
}

impl Remarks {
    /// The error of the last attempt ([`Delivery::last_error`]).
    pub(crate) fn last_error(&self) -> Option<&str> {
        self.0.as_ref()?.last_error.as_deref()
    }

    /// When the next automatic attempt is due ([`Delivery::next_attempt_at`]).
    pub(crate) fn next_attempt_at(&self) -> Option<SystemTime> {
        self.0.as_ref()?.next_attempt_at
    }

    /// Why an operator cancelled the intent ([`Delivery::cancel_reason`]).
    pub(crate) fn cancel_reason(&self) -> Option<&str> {
        self.0.as_ref()?.cancel_reason.as_deref()
    }

    /// The earliest time the intent may be delivered ([`Delivery::not_before`]).
    pub(crate) fn not_before(&self) -> Option<SystemTime> {
        self.0.as_ref()?.not_before
    }

    /// Sets the earliest time the intent may be delivered.
    pub(crate) fn set_not_before(&mut self, at: SystemTime) {
        self.fields_mut().not_before = Some(at);
    }

    /// The intent's ordering group ([`Delivery::group`]).
    pub(crate) fn group(&self) -> Option<&Arc<str>> {
        self.0.as_ref()?.group.as_ref()
    }

    /// Sets the intent's ordering group.
    pub(crate) fn set_group(&mut self, group: Arc<str>) {
        self.fields_mut().group = Some(group);
    }

    /// The operator's decision ([`Delivery::decision`]).
    pub(crate) fn decision(&self) -> Option<&Decision> {
        self.0.as_ref()?.decision.as_ref()
    }

    /// The attempts that ended with an expired lease ([`Delivery::expired_leases`]).
    pub(crate) fn expired_leases(&self) -> u32 {
        self.0.as_ref().map_or(0, |r| r.expired_leases)
    }

    /// The attempts cut off ([`Delivery::interrupted_attempts`]).
    pub(crate) fn interrupted(&self) -> u32 {
        self.0.as_ref().map_or(0, |r| r.interrupted)
    }

    /// Whether none is set (nothing is allocated).
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The fields, made present.
    fn fields_mut(&mut self) -> &mut RemarkFields {
        self.0.get_or_insert_with(Box::default)
    }

    /// Sets (or clears) the error of the last attempt.
    pub(crate) fn set_last_error(&mut self, error: Option<String>) {
        if error.is_some() || self.0.is_some() {
            self.fields_mut().last_error = error;
        }
    }

    /// Sets (or clears) when the next automatic attempt is due.
    pub(crate) fn set_next_attempt_at(&mut self, at: Option<SystemTime>) {
        if at.is_some() || self.0.is_some() {
            self.fields_mut().next_attempt_at = at;
        }
    }

    /// Records an operator's cancel.
    pub(crate) fn set_cancel_reason(&mut self, reason: String) {
        self.fields_mut().cancel_reason = Some(reason);
    }

    /// Records an operator's decision.
    pub(crate) fn set_decision(&mut self, decision: Decision) {
        self.fields_mut().decision = Some(decision);
    }

    /// Counts an attempt whose lease expired.
    pub(crate) fn count_expired_lease(&mut self) {
        self.fields_mut().expired_leases += 1;
    }

    /// Counts an attempt cut off before its outcome was known.
    pub(crate) fn count_interrupted(&mut self) {
        self.fields_mut().interrupted += 1;
    }
}

impl Delivery {
    /// The idempotency key.
    pub fn key(&self) -> &ActionKey {
        &self.intent.key
    }

    /// The action kind.
    pub fn kind(&self) -> &str {
        &self.intent.kind
    }

    /// The intent as a dispatcher receives it (its [`attempt`](Intent::attempt) is the
    /// number of the last attempt).
    pub fn intent(&self) -> &Intent {
        &self.intent
    }

    /// The id of the `PendingAction` artifact: `action:{key}`.
    pub fn action_id(&self) -> ArtifactId {
        self.intent.key.artifact_id()
    }

    /// The generation, in [`Origin::session`], of the commit that recorded the intent (a
    /// convenience for `origin().generation()`).
    pub fn generation(&self) -> Generation {
        self.intent.origin.generation()
    }

    /// Where the intent was recorded: session, commit hash and run.
    pub fn origin(&self) -> &Origin {
        &self.intent.origin
    }

    /// The delivery state.
    pub fn status(&self) -> DeliveryStatus {
        self.status
    }

    /// How many times the intent was handed to a dispatcher, whatever came of it: this is
    /// also the attempt number the dispatcher last saw ([`Intent::attempt`]). It includes the
    /// attempts of unknown outcome ([`interrupted_attempts`](Self::interrupted_attempts),
    /// [`expired_leases`](Self::expired_leases)), which the retry policy does not count
    /// against its `max_attempts`: the failures it counts are `attempts − interrupted_attempts
    /// − expired_leases`. An attempt that found no route (held), and a claim released before
    /// it was handed to a dispatcher, are not counted at all.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The error of the last failed attempt, if the last attempt failed (or why the intent is
    /// held, or pending again after an attempt of unknown outcome).
    pub fn last_error(&self) -> Option<&str> {
        self.remarks.last_error()
    }

    /// When the intent was committed.
    pub fn recorded_at(&self) -> SystemTime {
        self.recorded_at
    }

    /// When the entry last changed.
    pub fn updated_at(&self) -> SystemTime {
        self.updated_at
    }

    /// When the delivery succeeded.
    pub fn delivered_at(&self) -> Option<SystemTime> {
        self.delivered_at
    }

    /// When the next automatic attempt is due, for a failed intent the retry policy will try
    /// again.
    pub fn next_attempt_at(&self) -> Option<SystemTime> {
        self.remarks.next_attempt_at()
    }

    /// The earliest time the intent may be delivered, if its produce scheduled it
    /// ([`IntentBuilder::not_before`](crate::runtime::IntentBuilder::not_before)): until then
    /// it is pending but not due.
    pub fn not_before(&self) -> Option<SystemTime> {
        self.remarks.not_before()
    }

    /// The intent's ordering group, if its produce put it in one
    /// ([`IntentBuilder::group`](crate::runtime::IntentBuilder::group)).
    pub fn group(&self) -> Option<&str> {
        self.remarks.group().map(|g| &**g)
    }

    /// The lease of the attempt in flight, if one is.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// The fencing token of the last claim: how many times the intent was claimed (0 if it
    /// never was).
    pub fn token(&self) -> FenceToken {
        self.token
    }

    /// Why an operator cancelled the intent, if one did.
    pub fn cancel_reason(&self) -> Option<&str> {
        self.remarks.cancel_reason()
    }

    /// The operator's decision, for an intent that required approval and was approved or
    /// rejected ([`OutboxStore::approve`](crate::OutboxStore::approve),
    /// [`reject`](crate::OutboxStore::reject)); `None` for every other intent, and for one
    /// still awaiting approval.
    pub fn decision(&self) -> Option<&Decision> {
        self.remarks.decision()
    }

    /// How many attempts ended with an expired lease: the holder died (or stalled past its
    /// lease) after claiming the intent and before recording the outcome, so the receiver may
    /// have seen the intent. Each such attempt was followed by a delivery with the same
    /// idempotency key. A lease taken over from a holder proved dead before it expired
    /// ([`OutboxStore::take_over`](crate::OutboxStore::take_over)) counts here too.
    pub fn expired_leases(&self) -> u32 {
        self.remarks.expired_leases()
    }

    /// How many attempts were cut off before their outcome was known: still running when a
    /// stop or the turn's deadline ended the grace period, or when the caller dropped the
    /// turn. The receiver may have seen each of them, so each was followed by a delivery with
    /// the same idempotency key, due at once; none counts as a failure against the retry
    /// policy.
    pub fn interrupted_attempts(&self) -> u32 {
        self.remarks.interrupted()
    }

    /// The failed attempts the retry policy counts: those that ended with an error, a panic
    /// or a timeout. An attempt in flight has not ended, and a delivered intent's last
    /// attempt succeeded: neither is counted.
    pub fn failed_attempts(&self) -> u32 {
        let settled = match self.status {
            DeliveryStatus::InFlight | DeliveryStatus::Delivered => 1,
            _ => 0,
        };
        self.counted_attempts().saturating_sub(settled)
    }

    /// The attempts the retry policy counts against its maximum: every attempt but those cut
    /// off and those whose lease expired. For a claim being decided, this includes the
    /// attempt that just failed.
    pub(crate) fn counted_attempts(&self) -> u32 {
        self.attempts
            .saturating_sub(self.interrupted_attempts())
            .saturating_sub(self.expired_leases())
    }

    /// An entry from its parts, as a store of another crate reads it from its rows.
    pub fn from_parts(parts: DeliveryParts) -> Self {
        let DeliveryParts {
            intent,
            status,
            attempts,
            last_error,
            recorded_at,
            updated_at,
            delivered_at,
            lease,
            expired_leases,
            interrupted,
            next_attempt_at,
            token,
            cancel_reason,
            decision,
            not_before,
            group,
        } = parts;
        let remarks = RemarkFields {
            last_error,
            cancel_reason,
            decision,
            expired_leases,
            interrupted,
            next_attempt_at,
            not_before,
            group,
        };
        Delivery {
            intent,
            status,
            attempts,
            recorded_at,
            updated_at,
            delivered_at,
            lease,
            token,
            remarks: Remarks((remarks != RemarkFields::default()).then(|| Box::new(remarks))),
        }
    }
}

/// The parts of a [`Delivery`] ([`Delivery::from_parts`]), for a store of another crate that
/// builds ledger entries from its rows. Each field is what the accessor of the same name
/// returns.
#[derive(Clone, Debug)]
pub struct DeliveryParts {
    /// The intent ([`Delivery::intent`]).
    pub intent: Intent,
    /// The status ([`Delivery::status`]).
    pub status: DeliveryStatus,
    /// The attempts ([`Delivery::attempts`]).
    pub attempts: u32,
    /// The last error ([`Delivery::last_error`]).
    pub last_error: Option<String>,
    /// When the intent was committed ([`Delivery::recorded_at`]).
    pub recorded_at: SystemTime,
    /// When the entry last changed ([`Delivery::updated_at`]).
    pub updated_at: SystemTime,
    /// When it was delivered ([`Delivery::delivered_at`]).
    pub delivered_at: Option<SystemTime>,
    /// The lease of the attempt in flight ([`Delivery::lease`]).
    pub lease: Option<Lease>,
    /// Attempts that ended with an expired lease ([`Delivery::expired_leases`]).
    pub expired_leases: u32,
    /// Attempts cut off ([`Delivery::interrupted_attempts`]).
    pub interrupted: u32,
    /// The next automatic attempt ([`Delivery::next_attempt_at`]).
    pub next_attempt_at: Option<SystemTime>,
    /// The token of the last claim ([`Delivery::token`]).
    pub token: FenceToken,
    /// Why an operator cancelled it ([`Delivery::cancel_reason`]).
    pub cancel_reason: Option<String>,
    /// The operator's approval or rejection ([`Delivery::decision`]).
    pub decision: Option<Decision>,
    /// The earliest time it may be delivered ([`Delivery::not_before`]): read it from the
    /// row's `PendingAction` bytes with [`action_not_before`](crate::action_not_before).
    pub not_before: Option<SystemTime>,
    /// Its ordering group ([`Delivery::group`]): read it from the row's `PendingAction` bytes
    /// with [`action_group`](crate::action_group).
    pub group: Option<Arc<str>>,
}

/// The default lease of a claim: long enough for a slow dispatch between two renewals (every
/// third of it), short enough that a crashed holder's intents go out again within half a
/// minute.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Why an intent is pending again after its lease expired: `last_error` of a reclaimed
/// intent, in every store (stores of other crates use it too).
pub fn reclaimed_error(attempt: impl fmt::Display, owner: &str) -> String {
    format!(
        "attempt {attempt} was in flight under the lease of {owner}, which expired before its outcome was recorded; \
         the receiver may have seen it, so it is delivered again with the same key"
    )
}

/// Why an intent is pending again after a drain took over the lease of its holder, proved
/// dead before the lease expired ([`OutboxStore::take_over`](crate::OutboxStore::take_over)):
/// `last_error` of an intent taken over, in every store (stores of other crates use it too).
pub fn taken_over_error(attempt: impl fmt::Display, owner: &str) -> String {
    format!(
        "attempt {attempt} was in flight under the lease of {owner}, which died before its outcome was recorded \
         (a drain proved it dead and took the lease over); the receiver may have seen it, so it is delivered again \
         with the same key"
    )
}

/// The shortest lease a drain takes (a shorter one is taken as this): long enough for a few
/// renewals (every third of the lease) on a timer of millisecond resolution, so that a drain
/// never takes its own running deliveries for expired.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// The latest time the ledger records, as a duration after the Unix epoch: the end of the
/// year 9999 (UTC). A retry or a lease further ahead means "never" in practice, and this one
/// every store can keep (milliseconds in an `i64`) and every HTTP date and RFC 3339 time can
/// show. Stores clamp what they read back to it, so that a damaged value never yields a time
/// no formatter can print.
pub const FAR_FUTURE: Duration = Duration::from_secs(253_402_300_799);

/// `t + delay` for a delay from outside (a policy, a `Retry-After`, a lease), which may be as
/// long as `Duration::MAX`: saturates at [`FAR_FUTURE`] instead of overflowing.
pub(crate) fn later(t: SystemTime, delay: Duration) -> SystemTime {
    let far = SystemTime::UNIX_EPOCH + FAR_FUTURE;
    t.checked_add(delay).map_or(far, |at| at.min(far))
}

/// Milliseconds since the Unix epoch (0 before it): the resolution stores keep times in.
pub(crate) fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The time `millis` milliseconds after the Unix epoch.
pub(crate) fn from_unix_millis(millis: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(millis)
}

/// `t` rounded up to a whole millisecond: what a store keeps of a retry time, never early.
pub(crate) fn ceil_millis(t: SystemTime) -> SystemTime {
    let sub = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .is_ok_and(|d| d.subsec_nanos() % 1_000_000 != 0);
    from_unix_millis(unix_millis(t) + u64::from(sub))
}

/// An intent a commit registers, as the commit hands it to its store: the intent (its
/// origin names the committing session), the `PendingAction` bytes the commit hashed, and
/// their content hash. A store keeps the bytes and the hash with the row and hands a
/// dispatcher only bytes that still hash to it.
#[derive(Clone, Debug)]
pub struct NewIntent {
    /// The intent, attempt 0.
    pub intent: Intent,
    /// The `PendingAction` encoding, as committed.
    pub bytes: Arc<[u8]>,
    /// Its content hash, as the commit hashed it.
    pub action_hash: ContentHash,
}

impl NewIntent {
    /// Whether the committed `PendingAction` asks for approval before delivery
    /// ([`PendingAction::requires_approval`](crate::PendingAction::requires_approval)): read
    /// from the committed bytes, so that nothing but the hashed decision says so.
    pub fn requires_approval(&self) -> bool {
        crate::model::action::requires_approval(&self.bytes)
    }

    /// When the committed `PendingAction` may be delivered at the earliest
    /// ([`PendingAction::not_before`](crate::PendingAction::not_before)), read from the
    /// committed bytes; `None` for at once.
    pub fn not_before(&self) -> Option<SystemTime> {
        crate::model::action::not_before(&self.bytes).map(from_unix_millis)
    }

    /// The committed `PendingAction`'s ordering group
    /// ([`PendingAction::group`](crate::PendingAction::group)), read from the committed bytes.
    pub fn group(&self) -> Option<String> {
        crate::model::action::action_group(&self.bytes)
    }
}

/// One attempt to deliver an intent, as the outbox of a store keeps it
/// ([`OutboxStore::attempts`](crate::OutboxStore::attempts)): who claimed it, when, under which
/// lease and token, and how it ended.
///
/// Every claim handed to a dispatcher is an attempt. A claim released before it was handed out
/// ([`Outcome::Released`](crate::Outcome::Released)) is not one, and leaves no entry (its token
/// is skipped).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Attempt {
    /// The fencing token of the claim: it names the attempt.
    pub token: FenceToken,
    /// The attempt number the dispatcher saw ([`Intent::attempt`]). An attempt that found no
    /// route ([`AttemptOutcome::Held`]) is not counted, so the next one has the same number.
    pub number: u32,
    /// The drainer (process and drain) that claimed the intent.
    pub owner: Arc<str>,
    /// When the claim was made.
    pub claimed_at: SystemTime,
    /// When its lease expired or would have, as last renewed.
    pub lease_expires_at: SystemTime,
    /// When the outcome was recorded (or the expired lease reclaimed); `None` while in flight.
    pub ended_at: Option<SystemTime>,
    /// How it ended.
    pub outcome: AttemptOutcome,
}

impl Attempt {
    /// An attempt from its parts, as a store reads it (the fields' order).
    pub fn new(
        token: FenceToken,
        number: u32,
        owner: Arc<str>,
        claimed_at: SystemTime,
        lease_expires_at: SystemTime,
        ended_at: Option<SystemTime>,
        outcome: AttemptOutcome,
    ) -> Self {
        Attempt {
            token,
            number,
            owner,
            claimed_at,
            lease_expires_at,
            ended_at,
            outcome,
        }
    }
}

/// How many ended attempts the history keeps per key: the latest ones. A key that is never
/// final — its attempts keep being interrupted, or keep outliving their leases, neither of
/// which the retry policy counts — would otherwise grow its history without bound. The
/// entry's counters ([`Delivery::attempts`], [`Delivery::expired_leases`],
/// [`Delivery::interrupted_attempts`]) count every attempt.
pub const ATTEMPTS_KEPT: usize = 64;

/// How an [`Attempt`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// Still in flight under its lease.
    InFlight,
    /// The dispatcher reported success.
    Delivered,
    /// The dispatcher failed with `error`; `retry_at` is when the retry policy tried again
    /// (`None`: it waited for an operator's retry).
    Failed {
        /// The error.
        error: String,
        /// The retry it scheduled.
        retry_at: Option<SystemTime>,
    },
    /// The dispatcher failed with `error`, and the intent became a dead letter.
    Dead {
        /// The error.
        error: String,
    },
    /// No route handled the intent's kind; it was held, never handed to a dispatcher.
    Held {
        /// Why.
        reason: String,
    },
    /// Cut off before its outcome was known (a stop, a deadline, a dropped turn); delivered
    /// again with the same key.
    Interrupted {
        /// Why.
        reason: String,
    },
    /// Its holder died or stalled: the lease expired before an outcome was recorded, and a
    /// drain reclaimed it; or its holder was proved dead and a drain took the lease over before
    /// it expired ([`OutboxStore::take_over`](crate::OutboxStore::take_over)). Delivered again
    /// with the same key.
    Expired,
}

impl AttemptOutcome {
    /// The outcome's stable code in a store (the same in every store), and its error text.
    /// For the stores' encodings; not needed to read a history.
    #[doc(hidden)]
    pub fn code(&self) -> (u8, Option<&str>) {
        match self {
            AttemptOutcome::InFlight => (0, None),
            AttemptOutcome::Delivered => (1, None),
            AttemptOutcome::Failed { error, .. } => (2, Some(error)),
            AttemptOutcome::Dead { error } => (3, Some(error)),
            AttemptOutcome::Held { reason } => (4, Some(reason)),
            AttemptOutcome::Interrupted { reason } => (5, Some(reason)),
            AttemptOutcome::Expired => (6, None),
        }
    }

    /// The outcome of a stored code, error text and retry time (`None` for an unknown code;
    /// the retry time is read for a failed attempt only). For the stores' encodings.
    #[doc(hidden)]
    pub fn from_code(code: u8, error: Option<String>, retry_at: Option<SystemTime>) -> Option<AttemptOutcome> {
        let error = || error.clone().unwrap_or_default();
        Some(match code {
            0 => AttemptOutcome::InFlight,
            1 => AttemptOutcome::Delivered,
            2 => AttemptOutcome::Failed {
                error: error(),
                retry_at,
            },
            3 => AttemptOutcome::Dead { error: error() },
            4 => AttemptOutcome::Held { reason: error() },
            5 => AttemptOutcome::Interrupted { reason: error() },
            6 => AttemptOutcome::Expired,
            _ => return None,
        })
    }

    /// A short name: `in flight`, `delivered`, `failed`, `dead`, `held`, `interrupted` or
    /// `expired`.
    pub fn name(&self) -> &'static str {
        match self {
            AttemptOutcome::InFlight => "in flight",
            AttemptOutcome::Delivered => "delivered",
            AttemptOutcome::Failed { .. } => "failed",
            AttemptOutcome::Dead { .. } => "dead",
            AttemptOutcome::Held { .. } => "held",
            AttemptOutcome::Interrupted { .. } => "interrupted",
            AttemptOutcome::Expired => "expired",
        }
    }

    /// The error it carries (failed, dead), or the reason (held, interrupted); `None` for the
    /// others.
    pub fn error(&self) -> Option<&str> {
        self.code().1
    }
}

/// Intents of the kinds `keys` names, as a commit of `session` at `generation` registers them
/// (real `PendingAction` bytes and their content hash), for the core's own tests of the
/// outboxes. (The contract suite, a crate of its own, has its own.)
#[cfg(test)]
pub(crate) fn test_intents(session: &str, generation: u64, keys: &[(&str, &str)]) -> Vec<NewIntent> {
    use crate::model::action::{ActionKey, Intent, Origin, PendingAction};
    use crate::model::artifact::Generation;
    use crate::model::hash::{content_hash, CommitHash};
    keys.iter()
        .enumerate()
        .map(|(run, &(key, kind))| {
            let payload = rmp_serde::to_vec_named(&key).expect("a string encodes");
            let action = PendingAction {
                kind: kind.to_owned(),
                key: key.to_owned(),
                payload: payload.clone(),
                requires_approval: false,
                not_before: None,
                group: None,
            };
            let bytes = rmp_serde::to_vec_named(&action).expect("a PendingAction encodes");
            let origin = Origin::new(
                session,
                CommitHash([generation as u8; 32]),
                Generation(generation),
                run as u32,
            );
            NewIntent {
                intent: Intent::new(ActionKey::from(key), kind, payload, origin, 0),
                action_hash: content_hash(&bytes),
                bytes: Arc::from(bytes),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hash::CommitHash;

    fn fresh() -> Delivery {
        let origin = Origin::new("main", CommitHash([7; 32]), Generation(1), 0);
        let intent = Intent::new(ActionKey::from("k"), "notify", Vec::new(), origin, 0);
        Delivery::from_parts(DeliveryParts {
            intent,
            status: DeliveryStatus::Pending,
            attempts: 0,
            last_error: None,
            recorded_at: SystemTime::UNIX_EPOCH,
            updated_at: SystemTime::UNIX_EPOCH,
            delivered_at: None,
            lease: None,
            expired_leases: 0,
            interrupted: 0,
            next_attempt_at: None,
            token: FenceToken(0),
            cancel_reason: None,
            decision: None,
            not_before: None,
            group: None,
        })
    }

    /// The rarely set fields, as a reader sees them.
    fn remarks(d: &Delivery) -> (Option<&str>, Option<&str>, Option<&Decision>, u32, u32) {
        (
            d.last_error(),
            d.cancel_reason(),
            d.decision(),
            d.expired_leases(),
            d.interrupted_attempts(),
        )
    }

    #[test]
    fn an_entry_without_remarks_allocates_none_and_reads_empty() {
        let mut d = fresh();
        d.remarks.set_last_error(None);
        d.remarks.set_next_attempt_at(None);
        assert!(
            d.remarks.is_empty(),
            "clearing an absent error or retry allocates nothing"
        );
        assert_eq!(d.next_attempt_at(), None);
        assert_eq!(remarks(&d), (None, None, None, 0, 0));
    }

    #[test]
    fn remarks_read_back_and_an_error_clears() {
        let mut d = fresh();
        d.attempts = 4;
        d.remarks.count_expired_lease();
        d.remarks.count_interrupted();
        d.remarks.set_last_error(Some("boom".into()));
        d.remarks.set_cancel_reason("stop".into());
        let decision = Decision::new(Verdict::Rejected, "ops", SystemTime::UNIX_EPOCH, Some("no".into()));
        d.remarks.set_decision(decision.clone());
        assert_eq!(remarks(&d), (Some("boom"), Some("stop"), Some(&decision), 1, 1));
        assert_eq!(
            d.counted_attempts(),
            2,
            "the expired and the interrupted attempt are not counted"
        );
        d.remarks.set_last_error(None);
        assert_eq!((d.last_error(), d.cancel_reason()), (None, Some("stop")));
        let retry = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(60);
        d.remarks.set_next_attempt_at(Some(retry));
        assert_eq!(d.next_attempt_at(), Some(retry));
        d.remarks.set_next_attempt_at(None);
        assert_eq!((d.next_attempt_at(), d.cancel_reason()), (None, Some("stop")));
    }

    #[test]
    fn from_parts_keeps_every_remark_and_boxes_only_when_one_is_set() {
        let d = fresh();
        let parts = |d: &Delivery, expired| DeliveryParts {
            intent: d.intent.clone(),
            status: DeliveryStatus::Pending,
            attempts: 3,
            last_error: None,
            recorded_at: d.recorded_at,
            updated_at: d.updated_at,
            delivered_at: None,
            lease: None,
            expired_leases: expired,
            interrupted: 0,
            next_attempt_at: None,
            token: FenceToken(3),
            cancel_reason: None,
            decision: None,
            not_before: None,
            group: None,
        };
        assert!(Delivery::from_parts(parts(&d, 0)).remarks.is_empty());
        let retry = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(60);
        let failed = Delivery::from_parts(DeliveryParts {
            next_attempt_at: Some(retry),
            ..parts(&d, 0)
        });
        assert_eq!(failed.next_attempt_at(), Some(retry));
        let read = Delivery::from_parts(parts(&d, 2));
        assert_eq!((read.expired_leases(), read.counted_attempts()), (2, 1));
    }
}
