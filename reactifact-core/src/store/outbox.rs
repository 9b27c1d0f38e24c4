//! The outbox of a store: the delivery ledger as a table of the store, and the operations
//! that move an intent through it.
//!
//! The ledger is the store's, not a process's: every drain (a runtime's own, or a standalone
//! [`Drainer`](crate::Drainer)) in every process works on it through [`OutboxStore`], and no
//! process keeps a private copy. The transitions:
//!
//! - **register** — in the commit transaction of the generation that acted the intent: a new
//!   key is pending, due at once, and belongs to the committing session; a key the store
//!   already holds is not registered again (it is *attached* to the committing session unless
//!   it is final, so that session's drain delivers it too);
//! - **claim** ([`OutboxStore::claim`]) — atomically takes due intents in a [`Scope`] and puts
//!   them in flight under a lease, each with the next [`FenceToken`]; expired leases are
//!   reclaimed first;
//! - **record** ([`OutboxStore::record`]) — the outcome of an attempt, accepted only while the
//!   intent is in flight under the token of the claim: a stale holder's late outcome is
//!   rejected ([`Recorded::Stale`]) and changes nothing;
//! - **renew** ([`OutboxStore::renew`]) — a live holder extends the lease of a long dispatch;
//! - **take over** ([`OutboxStore::take_over`]) — the claims of a holder proved dead go back to
//!   pending at once, as if their leases had expired; [`OutboxStore::lease_owners`] lists the
//!   holders to judge;
//! - **retry**, **cancel** and **purge** — the operator's;
//! - **approve** and **reject** ([`OutboxStore::approve`], [`OutboxStore::reject`]) — the
//!   operator's decision on an intent registered
//!   [awaiting approval](DeliveryStatus::AwaitingApproval): approved, it is pending and due at
//!   once; rejected, it is final and never handed to a dispatcher. Who decided and when are
//!   kept in the entry ([`Delivery::decision`]).
//!
//! Reads ([`get`](OutboxStore::get), [`list`](OutboxStore::list),
//! [`counts`](OutboxStore::counts), [`next_due`](OutboxStore::next_due)) are store queries.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::model::action::ActionKey;
use crate::model::delivery::{Attempt, AttemptOutcome, Decision, Delivery, DeliveryStatus, FenceToken, Verdict};
use crate::model::policy::ClaimPolicy;
use crate::model::rate::{RateBucket, RateState};
use crate::store::StoreError;

/// The future of a store operation: boxed, so that [`OutboxStore`] is object-safe, and `Send`,
/// so that it can be awaited on any executor thread.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The wake-ups of a store for its serving drains ([`OutboxStore::wakeups`]): an item each time
/// intents may have fallen due.
pub type Wakeups = Pin<Box<dyn futures_util::Stream<Item = ()> + Send + 'static>>;

/// Which intents of a store an operation sees: those of some sessions (registered by them, or
/// attached to them), of some kinds, or all of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    sessions: Option<Vec<Arc<str>>>,
    kinds: Option<Vec<Arc<str>>>,
}

impl Scope {
    /// Every intent of the store.
    pub fn all() -> Self {
        Scope::default()
    }

    /// The intents of one session: those its commits registered, and those attached to it (a
    /// key it committed that another session had registered first, such as a merged one).
    pub fn session(session: impl Into<Arc<str>>) -> Self {
        Scope::all().sessions([session])
    }

    /// Only the intents of these sessions (replacing any earlier session filter).
    pub fn sessions<S: Into<Arc<str>>>(mut self, sessions: impl IntoIterator<Item = S>) -> Self {
        self.sessions = Some(sessions.into_iter().map(Into::into).collect());
        self
    }

    /// Only the intents of these action kinds (replacing any earlier kind filter).
    pub fn kinds<S: Into<Arc<str>>>(mut self, kinds: impl IntoIterator<Item = S>) -> Self {
        self.kinds = Some(kinds.into_iter().map(Into::into).collect());
        self
    }

    /// The session filter: `None` for every session.
    pub fn session_filter(&self) -> Option<&[Arc<str>]> {
        self.sessions.as_deref()
    }

    /// The kind filter: `None` for every kind.
    pub fn kind_filter(&self) -> Option<&[Arc<str>]> {
        self.kinds.as_deref()
    }

    /// Whether an intent of `kind` that belongs to `sessions` is in scope.
    pub fn admits<'a>(&self, kind: &str, mut sessions: impl Iterator<Item = &'a str>) -> bool {
        self.kinds
            .as_ref()
            .is_none_or(|kinds| kinds.iter().any(|k| &**k == kind))
            && self
                .sessions
                .as_ref()
                .is_none_or(|wanted| sessions.any(|s| wanted.iter().any(|w| &**w == s)))
    }
}

/// A request to claim due intents ([`OutboxStore::claim`]).
#[derive(Clone, Debug)]
pub struct ClaimRequest<'a> {
    /// Which intents may be claimed.
    pub scope: &'a Scope,
    /// At most this many are claimed.
    pub limit: usize,
    /// Who claims: recorded in each lease (a process and drain identity).
    pub owner: &'a Arc<str>,
    /// How long each claim is leased from `now`.
    pub lease: Duration,
    /// The time of the claim, from the drain's clock.
    pub now: SystemTime,
    /// How the claim chooses among due intents: the rate limits it spends from, and the
    /// priorities of kinds ([`ClaimPolicy::none`] for neither).
    pub policy: &'a ClaimPolicy,
}

impl ClaimRequest<'_> {
    /// Whether this claim lets sessions take turns: its policy asks for it
    /// ([`ClaimPolicy::turns`]), and its scope is of several sessions (or all) without a kind
    /// filter. Such a claim first takes the earliest due intent of each session that
    /// registered one (when more sessions wait than the claim takes, which of them is drawn
    /// anew for each claim), then the rest.
    pub fn takes_turns(&self) -> bool {
        self.policy.turns
            && self.scope.kind_filter().is_none()
            && self.scope.session_filter().is_none_or(|s| s.len() > 1)
    }

    /// The buckets of the policy's [`rates`](ClaimPolicy::rates) that intents of the scope
    /// can spend from, by name (the order in which a store locks them).
    pub fn buckets_in_scope(&self) -> Vec<&RateBucket> {
        let mut buckets: Vec<&RateBucket> = self
            .policy
            .rates
            .iter()
            .filter(|b| {
                self.scope
                    .kind_filter()
                    .is_none_or(|kinds| kinds.iter().any(|k| b.covers(k)))
            })
            .collect();
        buckets.sort_by(|a, b| a.name.cmp(&b.name));
        buckets.dedup_by(|a, b| a.name == b.name);
        buckets
    }
}

/// What a claim took.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Claimed {
    /// The intents claimed, in flight under this claim's lease, in the order they fell due
    /// (registration order among those due at the same time). Each entry's
    /// [`lease`](Delivery::lease) holds its token; its attempt count includes this attempt.
    pub claims: Vec<Delivery>,
    /// How many in-flight intents (in any scope) whose lease had expired the claim put back
    /// to pending first.
    pub reclaimed: usize,
    /// Keys whose stored row failed its integrity check while the claim read it: each is now
    /// held with an `integrity:` error, and never handed to a dispatcher.
    pub integrity: Vec<ActionKey>,
    /// When a rate limit that may have held intents back allows more: the earliest
    /// [`next_allowed`](crate::RateLimit::next_allowed) of the claim's buckets that it spent
    /// to the last (or found paused). `None` if no bucket ran out (a store may also answer
    /// `None` when it found nothing due at all). A claim that took fewer than asked took
    /// everything due in scope except what its rate limits held back.
    pub throttled: Option<SystemTime>,
}

impl Claimed {
    /// The outcomes that give every claim back, never handed out: pending and due again at
    /// once, no attempt spent.
    pub(crate) fn releases(&self) -> Vec<Recording> {
        self.claims
            .iter()
            .map(|d| Recording {
                key: d.intent.key.clone(),
                token: d.lease.as_ref().map_or(d.token, |l| l.token),
                outcome: Outcome::Released,
            })
            .collect()
    }
}

pub use crate::model::outcome::{FailedAttempt, Outcome};

/// One outcome to record: for the attempt claimed with `token`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recording {
    /// The intent.
    pub key: ActionKey,
    /// The token of the claim the attempt was made under.
    pub token: FenceToken,
    /// What happened.
    pub outcome: Outcome,
}

/// What the store did with one [`Recording`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recorded {
    /// Recorded: the intent now has this status.
    Accepted(DeliveryStatus),
    /// Rejected: the intent is no longer in flight under the recording's token (its lease
    /// expired and it was reclaimed, and perhaps claimed again and delivered). Nothing
    /// changed. `status` and `token` are the intent's current ones (`None` for a key the
    /// store does not hold).
    Stale {
        /// The intent's current status.
        status: Option<DeliveryStatus>,
        /// The intent's current token.
        token: FenceToken,
    },
}

/// How many intents of a scope are in each status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatusCounts {
    /// Pending: waiting for a drain.
    pub pending: u64,
    /// In flight under a lease.
    pub in_flight: u64,
    /// Delivered (not counting purged ones).
    pub delivered: u64,
    /// Failed (retried at their `next_attempt_at`, or waiting for `retry`).
    pub failed: u64,
    /// Of the failed, those with a retry scheduled.
    pub retrying: u64,
    /// Dead letters.
    pub dead: u64,
    /// Held.
    pub held: u64,
    /// Cancelled (not counting purged ones).
    pub cancelled: u64,
    /// Awaiting an operator's approval: never claimed until approved.
    pub awaiting_approval: u64,
    /// Rejected by an operator (not counting purged ones).
    pub rejected: u64,
    /// Blocked behind an earlier intent of their ordering group: not counted in
    /// [`waiting`](StatusCounts::waiting), they move only once the intent ahead is final.
    pub blocked: u64,
}

impl StatusCounts {
    /// Intents a drain will still act on without an operator: pending ones, failed ones with
    /// a retry scheduled, and those in flight (each finishes, or comes back when its lease
    /// expires). Intents awaiting approval wait for an operator, and are not counted.
    pub fn waiting(&self) -> u64 {
        self.pending + self.retrying + self.in_flight
    }

    /// Every intent counted.
    pub fn total(&self) -> u64 {
        self.pending
            + self.in_flight
            + self.delivered
            + self.failed
            + self.dead
            + self.held
            + self.cancelled
            + self.awaiting_approval
            + self.rejected
            + self.blocked
    }

    /// The count for one status.
    pub fn of(&self, status: DeliveryStatus) -> u64 {
        match status {
            DeliveryStatus::Pending => self.pending,
            DeliveryStatus::InFlight => self.in_flight,
            DeliveryStatus::Delivered => self.delivered,
            DeliveryStatus::Failed => self.failed,
            DeliveryStatus::Dead => self.dead,
            DeliveryStatus::Held => self.held,
            DeliveryStatus::Cancelled => self.cancelled,
            DeliveryStatus::AwaitingApproval => self.awaiting_approval,
            DeliveryStatus::Rejected => self.rejected,
            DeliveryStatus::Blocked => self.blocked,
        }
    }
}

/// A page of ledger entries ([`OutboxStore::list`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerQuery {
    /// Which intents.
    pub scope: Scope,
    /// Only those in this status.
    pub status: Option<DeliveryStatus>,
    /// Only those registered after this cursor (a page's [`Page::next`]); `None` from the
    /// start.
    pub after: Option<u64>,
    /// At most this many (default 100); 0 is taken as 1, so that every page but the last
    /// moves the cursor on.
    pub limit: usize,
}

impl Default for LedgerQuery {
    fn default() -> Self {
        LedgerQuery {
            scope: Scope::all(),
            status: None,
            after: None,
            limit: 100,
        }
    }
}

/// One page of ledger entries, in registration order.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Page {
    /// The entries.
    pub entries: Vec<Delivery>,
    /// The cursor of the next page (pass it as [`LedgerQuery::after`]), `None` after the last.
    pub next: Option<u64>,
}

/// Which final entries a [`purge`](OutboxStore::purge) deletes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PurgeFilter {
    /// Delivered, cancelled and rejected ones.
    #[default]
    Final,
    /// Delivered ones only.
    Delivered,
    /// Cancelled ones only.
    Cancelled,
    /// Rejected ones only.
    Rejected,
}

impl PurgeFilter {
    /// Whether an entry in `status` is purged by this filter (if old enough).
    pub fn admits(self, status: DeliveryStatus) -> bool {
        match self {
            PurgeFilter::Final => status.is_final(),
            PurgeFilter::Delivered => status == DeliveryStatus::Delivered,
            PurgeFilter::Cancelled => status == DeliveryStatus::Cancelled,
            PurgeFilter::Rejected => status == DeliveryStatus::Rejected,
        }
    }

    /// The status codes it purges ([`DeliveryStatus::code`]), for the stores' statements.
    #[doc(hidden)]
    pub fn codes(self) -> &'static [u8] {
        match self {
            PurgeFilter::Final => &[2, 6, 8],
            PurgeFilter::Delivered => &[2],
            PurgeFilter::Cancelled => &[6],
            PurgeFilter::Rejected => &[8],
        }
    }
}

/// An operator's [`retry`](OutboxStore::retry) refused to re-arm an intent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RetryError {
    /// The ledger has no intent with this key.
    #[error("no intent with key `{0}` in the delivery ledger")]
    UnknownKey(ActionKey),
    /// Only failed, dead and held intents can be re-armed.
    #[error("intent `{key}` is {status}; only failed, dead and held intents can be retried")]
    NotFailed {
        /// The key.
        key: ActionKey,
        /// Its current status.
        status: DeliveryStatus,
    },
    /// The store could not record the re-arming; the intent is as it was.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An operator's [`approve`](OutboxStore::approve) or [`reject`](OutboxStore::reject) refused
/// to decide on an intent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    /// The ledger has no intent with this key.
    #[error("no intent with key `{0}` in the delivery ledger")]
    UnknownKey(ActionKey),
    /// The intent does not await approval: it was acted without asking for one (or is held,
    /// cancelled, …). Only an intent awaiting approval can be approved or rejected.
    #[error("intent `{key}` is {status}, not awaiting approval; only an intent awaiting approval can be approved or rejected")]
    NotAwaiting {
        /// The key.
        key: ActionKey,
        /// Its current status.
        status: DeliveryStatus,
    },
    /// The intent was already decided the other way: an approved intent cannot be rejected,
    /// nor a rejected one approved.
    #[error("intent `{key}` was already {verdict} by {by}")]
    AlreadyDecided {
        /// The key.
        key: ActionKey,
        /// The decision that stands.
        verdict: Verdict,
        /// Who made it.
        by: String,
    },
    /// The store does not implement approvals (an [`OutboxStore`] of another crate written
    /// before they existed, which keeps the default [`OutboxStore::approve`]): nothing
    /// changed.
    #[error("the outbox of {store} does not support approving or rejecting intents (`{key}`)")]
    Unsupported {
        /// The store ([`OutboxStore::describe`]).
        store: String,
        /// The key.
        key: ActionKey,
    },
    /// The name of the operator is empty.
    #[error("intent `{key}`: an approval or rejection must name who decided")]
    NoDecider {
        /// The key.
        key: ActionKey,
    },
    /// The store could not record the decision; the intent is as it was.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether an approval or rejection (`verdict`, by `by`) may be recorded on the entry of `key`,
/// which is in `status` with `decision`: `Ok(true)` to record it; `Ok(false)` when that decision
/// is already recorded (deciding the same way again changes nothing: the first stands); or why
/// not. An empty `by` is refused first, whatever the entry's state, so that a repeated decision
/// needs a name as the first one did. The one rule every store's
/// [`approve`](OutboxStore::approve) and [`reject`](OutboxStore::reject) follow; for the
/// stores, not needed to use one.
#[doc(hidden)]
pub fn check_decision(
    key: &str,
    status: DeliveryStatus,
    decision: Option<&Decision>,
    verdict: Verdict,
    by: &str,
) -> Result<bool, ApprovalError> {
    if by.is_empty() {
        return Err(ApprovalError::NoDecider {
            key: ActionKey::from(key),
        });
    }
    if let Some(decision) = decision {
        if decision.verdict == verdict {
            return Ok(false);
        }
        return Err(ApprovalError::AlreadyDecided {
            key: ActionKey::from(key),
            verdict: decision.verdict,
            by: decision.by.clone(),
        });
    }
    if status != DeliveryStatus::AwaitingApproval {
        return Err(ApprovalError::NotAwaiting {
            key: ActionKey::from(key),
            status,
        });
    }
    Ok(true)
}

/// An operator's [`cancel`](OutboxStore::cancel) refused to cancel an intent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CancelError {
    /// The ledger has no intent with this key.
    #[error("no intent with key `{0}` in the delivery ledger")]
    UnknownKey(ActionKey),
    /// The intent is delivered, or in flight (its dispatcher may be sending it right now):
    /// it cannot be cancelled. An in-flight intent can be cancelled once its attempt ends
    /// other than delivered.
    #[error("intent `{key}` is {status} and cannot be cancelled")]
    NotCancellable {
        /// The key.
        key: ActionKey,
        /// Its current status.
        status: DeliveryStatus,
    },
    /// The store could not record the cancellation; the intent is as it was.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The outbox of a store: the delivery ledger and its transitions, shared by every drain in
/// every process that opens the store.
///
/// Every method is one atomic store operation. A store implements it so that any number of
/// drains, in any number of processes, together hand each key to a dispatcher once per
/// recorded outcome: a claim is a compare-and-set, an outcome is accepted only under the
/// claim's token, and only an expired lease makes a claimed intent claimable again.
///
/// Times come from the caller (its drain's clock), so that tests can run on tokio's paused
/// clock; a store keeps them in whole milliseconds.
pub trait OutboxStore: Send + Sync + 'static {
    /// A short description, e.g. `sqlite:/var/lib/app/state.db` or `memory`.
    fn describe(&self) -> String;

    /// Claims up to `request.limit` intents of `request.scope` that are due at `request.now`:
    /// pending ones, and failed ones whose `next_attempt_at` has come. Each becomes in flight
    /// under a lease of `request.owner` until `now + lease`, with the next fencing token
    /// (`token + 1`) and one more attempt; its `next_attempt_at` is cleared.
    ///
    /// First, every in-flight intent of the store whose lease expired at `now` is put back to
    /// pending, due at once, with one more [`expired_leases`](Delivery::expired_leases) and
    /// `last_error` saying so (any drain reclaims for all).
    ///
    /// Intents are claimed in the order they fell due; among those due at the same time, in
    /// registration order. Two concurrent claims never take the same intent.
    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> BoxFuture<'a, Result<Claimed, StoreError>>;

    /// Records outcomes, each accepted only while its intent is in flight under its token
    /// ([`Recorded::Stale`] otherwise, changing nothing). Accepted outcomes are durable when
    /// the future completes. One result per recording, in order.
    ///
    /// - [`Outcome::Delivered`]: delivered at `now`, `last_error` cleared, final;
    /// - [`Outcome::Failed`]: `last_error` set; failed with `next_attempt_at` for
    ///   [`FailedAttempt::RetryAt`], failed without one for `AwaitRetry`, dead for `Dead`;
    /// - [`Outcome::Held`]: held, the attempt uncounted;
    /// - [`Outcome::Interrupted`]: pending, due at once, one more interrupted attempt;
    /// - [`Outcome::Released`]: pending, due at once, the attempt uncounted.
    ///
    /// Every accepted outcome ends the lease.
    fn record<'a>(
        &'a self,
        outcomes: &'a [Recording],
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<Recorded>, StoreError>>;

    /// Records outcomes without waiting, for code that cannot await (a drain whose future is
    /// dropped). Best effort: what the store cannot record stays in flight until its lease
    /// expires.
    fn submit(&self, outcomes: Vec<Recording>, now: SystemTime);

    /// Extends the lease of each held attempt still in flight under its token to `until`;
    /// returns, per entry, whether it still held it.
    fn renew<'a>(
        &'a self,
        held: &'a [(ActionKey, FenceToken)],
        until: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>>;

    /// The owners of the leases in flight in `scope`: each distinct
    /// [`Lease::owner`](crate::Lease::owner) of an intent of `scope` in flight, once, in no
    /// particular order. A drain that starts asks it for the holders it might prove dead
    /// ([`reclaim_dead_owners`](crate::reclaim_dead_owners)).
    ///
    /// The default, for a store of another crate written before this operation, reports none:
    /// nothing is taken over early, and the claims of a dead holder wait out their leases, as
    /// any claim of any store does. A wrapper around a store must forward it, and
    /// [`take_over`](OutboxStore::take_over).
    fn lease_owners<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Vec<Arc<str>>, StoreError>> {
        let _ = scope;
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Takes over the claims of `owner`, a holder the caller has proved dead: every intent of
    /// the store in flight under a lease of `owner`, whatever its expiry and its scope, is put
    /// back to pending, due at `now`, exactly as an expired lease is reclaimed — one more
    /// [`expired_leases`](Delivery::expired_leases), its attempt ended
    /// [`Expired`](AttemptOutcome::Expired) in the history, its `last_error` saying so
    /// ([`taken_over_error`](crate::taken_over_error)) — and its token is spent, so an outcome
    /// or a renewal under it is stale. Returns the keys taken, in registration order; none if
    /// `owner` holds nothing in flight (a second take-over takes nothing). One atomic
    /// operation.
    ///
    /// Never for an owner that may be alive: its running deliveries would be handed to another
    /// dispatcher while it still sends them (its outcomes then rejected as stale).
    ///
    /// The default, with [`lease_owners`](OutboxStore::lease_owners)' default, takes nothing.
    fn take_over<'a>(&'a self, owner: &'a str, now: SystemTime) -> BoxFuture<'a, Result<Vec<ActionKey>, StoreError>> {
        let _ = (owner, now);
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Pauses the rate limit `bucket` until `until`: no claim takes an intent of its kinds
    /// before then ([`RateState::paused`](crate::store::RateState::paused); a pause only
    /// lengthens). A drain calls it when a receiver answered an attempt with a `Retry-After`.
    ///
    /// The default, for a store of another crate written before rate limits, does nothing;
    /// such a store also ignores the rate limits of [`ClaimRequest::policy`], which the contract
    /// suite checks.
    fn pause<'a>(&'a self, bucket: &'a str, until: SystemTime) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (bucket, until);
        Box::pin(async { Ok(()) })
    }

    /// Re-arms a failed, dead or held intent: pending, due at `now`, `next_attempt_at`
    /// cleared — or, for an intent that requires approval and was never approved (held
    /// because its row was lost or damaged), awaiting approval again. Returns the entry as it
    /// is now.
    fn retry<'a>(&'a self, key: &'a str, now: SystemTime) -> BoxFuture<'a, Result<Delivery, RetryError>>;

    /// Cancels a pending, failed, dead, held or awaiting intent: cancelled, final, with
    /// `reason`. Cancelling a cancelled intent again changes nothing. Returns the entry as it
    /// is now.
    fn cancel<'a>(
        &'a self,
        key: &'a str,
        reason: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, CancelError>>;

    /// Approves an intent awaiting approval: pending, due at `now` (or at its `not_before`,
    /// if later: [`action_not_before`](crate::store::action_not_before)), its
    /// [`decision`](Delivery::decision) approved `by` at `now`. Approving an approved intent
    /// again changes nothing (the first approval stands, whoever asks). Returns the entry as
    /// it is now.
    ///
    /// # Errors
    /// [`ApprovalError::NotAwaiting`] for an intent that does not await approval (and was
    /// never approved), [`ApprovalError::AlreadyDecided`] for a rejected one,
    /// [`ApprovalError::NoDecider`] for an empty `by`.
    ///
    /// The default, for a store of another crate written before approvals, refuses with
    /// [`ApprovalError::Unsupported`]; a store that registers intents awaiting approval
    /// (every store of this workspace) implements it. A wrapper around a store must forward
    /// it.
    fn approve<'a>(
        &'a self,
        key: &'a str,
        by: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, ApprovalError>> {
        let _ = (by, now);
        let store = self.describe();
        Box::pin(async move {
            Err(ApprovalError::Unsupported {
                store,
                key: ActionKey::from(key),
            })
        })
    }

    /// Rejects an intent awaiting approval: [rejected](DeliveryStatus::Rejected), final,
    /// never handed to a dispatcher, its [`decision`](Delivery::decision) rejected `by` at
    /// `now` for `reason`. Rejecting a rejected intent again changes nothing. Returns the
    /// entry as it is now.
    ///
    /// # Errors
    /// As [`approve`](OutboxStore::approve); an approved intent cannot be rejected
    /// ([`ApprovalError::AlreadyDecided`]): cancel it instead, if it is not delivered yet.
    /// The default refuses, like [`approve`](OutboxStore::approve)'s.
    fn reject<'a>(
        &'a self,
        key: &'a str,
        by: &'a str,
        reason: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, ApprovalError>> {
        let _ = (by, reason, now);
        let store = self.describe();
        Box::pin(async move {
            Err(ApprovalError::Unsupported {
                store,
                key: ActionKey::from(key),
            })
        })
    }

    /// Deletes up to `limit` final entries that `filter` admits (delivered, cancelled,
    /// rejected, or all) last changed before `before`, oldest first, with their attempt histories;
    /// returns how many. A purged key is remembered: committing it again never registers it
    /// again.
    fn purge(&self, filter: PurgeFilter, before: SystemTime, limit: usize) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// The entry for `key`.
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Delivery>, StoreError>>;

    /// Every attempt to deliver `key`, oldest first (by token): those that ended, then the
    /// one in flight, if one is. `None` for a key the ledger does not hold.
    ///
    /// The history is diagnostic: it is kept beside the ledger entry, outside the entry's
    /// integrity digest, and no transition reads it. It keeps the latest
    /// [`ATTEMPTS_KEPT`](crate::ATTEMPTS_KEPT) ended attempts of a key.
    ///
    /// The default, for a store that keeps no history, answers from the entry alone: the
    /// attempt in flight, if one is (claimed at the entry's `updated_at`).
    fn attempts<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<Attempt>>, StoreError>> {
        Box::pin(async move {
            Ok(self.get(key).await?.map(|d| {
                d.lease()
                    .map(|lease| {
                        Attempt::new(
                            lease.token,
                            d.attempts(),
                            lease.owner.clone(),
                            d.updated_at(),
                            lease.expires_at,
                            None,
                            AttemptOutcome::InFlight,
                        )
                    })
                    .into_iter()
                    .collect()
            }))
        })
    }

    /// A page of entries, in registration order.
    fn list<'a>(&'a self, query: &'a LedgerQuery) -> BoxFuture<'a, Result<Page, StoreError>>;

    /// How many entries of `scope` are in each status.
    fn counts<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<StatusCounts, StoreError>>;

    /// Wake-ups for a serving drain: a stream that yields when intents may have fallen due in
    /// this store (any process registered or re-armed some), so that a serving drain
    /// ([`Drainer::serve`](crate::Drainer::serve)) claims at once instead of at its next poll.
    /// A spurious wake-up costs one claim that finds nothing; a stream that ends leaves the
    /// drain polling. `None` (the default): the store cannot tell, and drains find work
    /// committed elsewhere by polling every
    /// [`poll_interval`](crate::DrainerBuilder::poll_interval).
    fn wakeups(&self) -> Option<Wakeups> {
        None
    }

    /// When the next intent of `scope` falls due: the earliest pending one (due now), retry,
    /// or lease expiry of one in flight. `None` if none waits and none is in flight.
    fn next_due<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Option<SystemTime>, StoreError>>;

    /// The state of every rate limit's bucket the store keeps (those a claim has spent from or
    /// a pause has written), by name: for operators, who see a pause a receiver asked for and
    /// until when. The store keeps no limit, only this state.
    ///
    /// The default, for a store of another crate written before rate limits, reports none.
    fn rate_states(&self) -> BoxFuture<'_, Result<Vec<(String, RateState)>, StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}
