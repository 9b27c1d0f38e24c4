//! The delivery engine: drains the outbox with retries, backoff, a dead letter, bounded
//! concurrency, per-attempt timeouts and a graceful stop.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use crate::model::action::{ActionKey, Intent};
use crate::model::delivery::{ceil_millis, later, Delivery, DeliveryStatus, FenceToken};
use crate::model::stop::StopHandle;
use crate::model::telemetry::{Counted, DeliveryMetrics};
use crate::outbox::dispatcher::{DispatchError, Dispatcher, ErasedDispatcher};
use crate::outbox::options::{DeliveryErrors, DeliveryOptions};
use crate::outbox::report::DrainReport;
use crate::store::outbox::{
    ClaimRequest, Claimed, FailedAttempt, OutboxStore, Outcome, Recorded, Recording, Scope, Wakeups,
};
use crate::store::StoreError;

/// A delivery that failed, as recorded in the ledger.
#[derive(Debug, Clone, thiserror::Error)]
#[error("delivery of action `{key}` ({kind}) failed on attempt {attempt}: {error}")]
pub struct DeliveryFailure {
    /// The action's idempotency key.
    pub key: ActionKey,
    /// The action kind.
    pub kind: String,
    /// The attempt number that failed (1 for the first).
    pub attempt: u32,
    /// The dispatcher's error message, as recorded.
    pub error: String,
    /// `Failed` (retried at `next_attempt_at`, or waiting for `retry`) or `Dead`.
    pub status: DeliveryStatus,
    /// When the retry policy tries again, if it does.
    pub next_attempt_at: Option<std::time::SystemTime>,
}

impl DeliveryFailure {
    /// The failure of `intent`'s attempt with `error`, followed by `next`.
    fn of(intent: &Intent, error: String, next: FailedAttempt) -> Self {
        DeliveryFailure {
            key: intent.key.clone(),
            kind: intent.kind.to_string(),
            attempt: intent.attempt,
            error,
            status: match next {
                FailedAttempt::Dead => DeliveryStatus::Dead,
                _ => DeliveryStatus::Failed,
            },
            next_attempt_at: match next {
                FailedAttempt::RetryAt(at) => Some(ceil_millis(at)),
                _ => None,
            },
        }
    }
}

/// When to try a failed delivery again, and when to give up.
///
/// The delay after the `n`-th failed attempt is `initial × multiplier^(n − 1)`, capped at
/// `max_delay`, then scaled by a jitter factor in [0.5, 1) derived from the key and `n` (so
/// two intents that failed together do not retry together, and a replay computes the same
/// schedule). A `Retry-After` the dispatcher reports ([`DispatchError::retry_after`]) is a
/// floor under that delay, never a shortcut: the next attempt waits for the longer of the two,
/// so a receiver answering `Retry-After: 0` cannot use up the attempts in a few round trips.
/// After `max_attempts` failed attempts the intent is dead.
///
/// Only attempts that ended with an answer count as failures: an attempt cut off by a stop,
/// the turn's deadline or a dropped turn, and one whose lease expired, has an unknown outcome
/// and is delivered again at once with the same key, without counting against
/// `max_attempts` (see [`Delivery::interrupted_attempts`](crate::Delivery::interrupted_attempts)).
/// An attempt past the delivery timeout is a failure.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial: Duration,
    max_delay: Duration,
    multiplier: f64,
    automatic: bool,
}

impl Default for RetryPolicy {
    /// Up to 8 attempts, 1 s after the first failure, doubling, at most 5 minutes apart.
    fn default() -> Self {
        RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(300)).max_attempts(8)
    }
}

impl RetryPolicy {
    /// Exponential backoff from `initial`, doubling, capped at `max_delay`, 8 attempts. Any
    /// durations are accepted: a delay too long to represent is `max_delay`, and a retry time
    /// past the year 9999 is kept as the end of that year.
    pub fn exponential(initial: Duration, max_delay: Duration) -> Self {
        RetryPolicy {
            max_attempts: 8,
            initial,
            max_delay: max_delay.max(initial),
            multiplier: 2.0,
            automatic: true,
        }
    }

    /// No automatic retry: a failed intent stays `Failed` until
    /// [`retry`](crate::Runtime::retry) re-arms it, whatever `Retry-After` the dispatcher reported.
    pub fn manual() -> Self {
        RetryPolicy {
            max_attempts: u32::MAX,
            initial: Duration::ZERO,
            max_delay: Duration::ZERO,
            multiplier: 1.0,
            automatic: false,
        }
    }

    /// Gives up (dead letter) after `attempts` attempts in all (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// How many attempts it allows in all.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Whether it retries by itself (not [`manual`](RetryPolicy::manual)).
    pub fn is_automatic(&self) -> bool {
        self.automatic
    }

    /// Sets the growth factor between delays (at least 1; `NaN` is 1).
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier.max(1.0);
        self
    }

    /// The backoff after the failed attempt `attempt` (1 for the first failure) of `key`,
    /// before any `Retry-After` hint. Never more than `max_delay`.
    pub fn delay(&self, key: &str, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(64) as i32;
        let base = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        // An infinite growth of a zero start is NaN: it stays zero.
        let capped = if base.is_nan() {
            0.0
        } else {
            base.min(self.max_delay.as_secs_f64())
        };
        // Rounding near `Duration::MAX` can leave the range: that is `max_delay`.
        Duration::try_from_secs_f64(capped * jitter(key, attempt)).unwrap_or(self.max_delay)
    }

    /// What follows the `failures`-th failed attempt of `key` (attempts of unknown outcome not
    /// counted).
    fn after_failure(&self, key: &str, failures: u32, error: &DispatchError, now: SystemTime) -> FailedAttempt {
        if error.is_permanent() || failures >= self.max_attempts {
            FailedAttempt::Dead
        } else if !self.automatic {
            FailedAttempt::AwaitRetry
        } else {
            let backoff = self.delay(key, failures);
            let delay = error.retry_after_hint().map_or(backoff, |hint| hint.max(backoff));
            FailedAttempt::RetryAt(later(now, delay))
        }
    }
}

/// A factor in [0.5, 1) from the key and the attempt.
fn jitter(key: &str, attempt: u32) -> f64 {
    let digest = Sha256::new()
        .chain_update(key.as_bytes())
        .chain_update(attempt.to_le_bytes())
        .finalize();
    let mut bits = [0u8; 8];
    bits.copy_from_slice(&digest[..8]);
    0.5 + 0.5 * (u64::from_le_bytes(bits) >> 11) as f64 / (1u64 << 53) as f64
}

/// The drain's view of [the process's clock](crate::model::time): a handle, so that a drain
/// names the clock it reads.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Clock;

impl Clock {
    pub(crate) fn new() -> Self {
        Clock
    }

    pub(crate) fn now(&self) -> SystemTime {
        crate::model::time::now()
    }

    /// The tokio instant at which the wall-clock time `at` is reached.
    pub(crate) fn instant_at(&self, at: SystemTime) -> Instant {
        crate::model::time::instant_at(at)
    }
}

pub(crate) use crate::model::time::instant_after;

/// What ended a drain before it ran out of work: a stop or its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Interrupted {
    /// Its stop handle asked it to stop.
    Stopped,
    /// Its deadline passed.
    DeadlineExceeded,
}

/// Why a drain stopped with an error.
pub(crate) enum DrainError {
    Delivery(DeliveryFailure),
    Store(StoreError),
}

impl From<StoreError> for DrainError {
    fn from(e: StoreError) -> Self {
        DrainError::Store(e)
    }
}

/// How one attempt ended.
pub(crate) enum Attempt {
    Delivered,
    Failed(DispatchError),
    TimedOut(Duration),
    Panicked(String),
}

/// The error recorded for an attempt cut off before its outcome was known.
const INTERRUPTED: &str = "the attempt was cut off (a stop, the deadline or a dropped turn) before its outcome was \
                           known; the receiver may have seen the intent, so it is delivered again at once with the \
                           same key";

/// How often a settling drain looks again while what it waits for is due later.
const SETTLE_RECHECK: Duration = Duration::from_secs(1);

/// How many consecutive failed writes of outcomes a drain rides out before it gives up with
/// the store's error (the outcomes not written stay in flight until their lease expires).
const RECORD_TRIES: u32 = 3;

/// A drain of one scope of an outbox: claims due intents, hands them to the dispatcher within
/// the concurrency limits, and records each outcome, group-committed.
pub(crate) struct Drain<'a> {
    pub(crate) outbox: &'a dyn OutboxStore,
    pub(crate) scope: &'a Scope,
    pub(crate) owner: &'a Arc<str>,
    pub(crate) lease: Duration,
    pub(crate) dispatcher: &'a Arc<dyn ErasedDispatcher>,
    pub(crate) config: &'a DeliveryOptions,
    pub(crate) clock: &'a Clock,
    pub(crate) stop: &'a StopHandle,
    pub(crate) deadline: Option<Instant>,
    /// Wakes a serving drain to claim again: the runtime it delivers for committed intents,
    /// or a handle approved or re-armed one. A wake-up sent while the drain is busy is kept
    /// for its next wait.
    pub(crate) nudge: Option<&'a Notify>,
}

/// What a claimed intent is waiting for.
enum Stage {
    /// Claimed, not yet handed to the dispatcher (its kind is at its limit).
    Queued,
    /// Handed to the dispatcher.
    Running,
    /// Finished; the outcome waits to be written.
    Finished(Outcome),
    /// The outcome is being written.
    Recording(Outcome),
}

/// One claim this drain holds: its slot is taken until the store acknowledged its outcome, so
/// the intents a crash can re-send are at most those held, at most the concurrency.
struct Slot {
    claim: Delivery,
    stage: Stage,
}

impl Slot {
    fn token(&self) -> FenceToken {
        self.claim.lease.as_ref().map_or(self.claim.token, |l| l.token)
    }

    /// The outcome to write if the drain ends now: what finished as it finished, an attempt
    /// still running as cut off, an intent never handed out released.
    fn outcome_now(&self) -> Outcome {
        match &self.stage {
            Stage::Queued => Outcome::Released,
            Stage::Running => Outcome::Interrupted {
                reason: INTERRUPTED.to_owned(),
            },
            Stage::Finished(outcome) | Stage::Recording(outcome) => outcome.clone(),
        }
    }
}

/// The claims a drain holds. If the drain's future is dropped (the caller gave up on the
/// turn), `Drop` submits every outcome not yet acknowledged, so a finished outcome survives
/// the dropped turn and a cut-off attempt is due again at once instead of waiting out its
/// lease. An outcome written twice is harmless: the second finds the token spent and is
/// rejected as stale.
struct Holds<'a> {
    outbox: &'a dyn OutboxStore,
    clock: Clock,
    slots: Vec<Option<Slot>>,
    /// The free slots, the lowest taken first: claims fill the slots in the order they come,
    /// so the outcomes written together (in slot order) are in claim order.
    free: BinaryHeap<Reverse<usize>>,
    held: usize,
}

impl Holds<'_> {
    fn insert(&mut self, slot: Slot) -> usize {
        self.held += 1;
        match self.free.pop() {
            Some(Reverse(at)) => {
                self.slots[at] = Some(slot);
                at
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        }
    }

    fn slot(&mut self, at: usize) -> &mut Slot {
        self.slots[at].as_mut().expect("a held slot")
    }

    /// Puts the outcomes of a write that failed back to be written again.
    fn unwritten(&mut self, ats: &[usize]) {
        for &at in ats {
            let slot = self.slot(at);
            if let Stage::Recording(outcome) = std::mem::replace(&mut slot.stage, Stage::Queued) {
                slot.stage = Stage::Finished(outcome);
            }
        }
    }

    fn release(&mut self, at: usize) -> Slot {
        self.held -= 1;
        self.free.push(Reverse(at));
        self.slots[at].take().expect("a held slot")
    }

    fn held(&self) -> impl Iterator<Item = (usize, &Slot)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(at, s)| s.as_ref().map(|s| (at, s)))
    }
}

impl Drop for Holds<'_> {
    fn drop(&mut self) {
        if self.held == 0 {
            return;
        }
        let outcomes: Vec<Recording> = self
            .held()
            .map(|(_, slot)| Recording {
                key: slot.claim.intent.key.clone(),
                token: slot.token(),
                outcome: slot.outcome_now(),
            })
            .collect();
        tracing::debug!(outcomes = outcomes.len(), "a dropped drain submits its outcomes");
        self.outbox.submit(outcomes, self.clock.now());
    }
}

/// Claims made for a drain before it runs: by the generation's commit, in its transaction,
/// for the turn's drain that follows. The drain takes them as the answer to its first claim.
/// Dropped unused (the turn ended before its drain ran), they are released: pending and due
/// again at once, not left in flight for a lease.
pub(crate) struct Preclaimed {
    outbox: Arc<dyn OutboxStore>,
    claimed: Claimed,
    /// How many the claim asked for: fewer taken means nothing more was due.
    asked: usize,
}

impl Preclaimed {
    pub(crate) fn new(outbox: Arc<dyn OutboxStore>, claimed: Claimed, asked: usize) -> Self {
        Preclaimed { outbox, claimed, asked }
    }

    fn take(mut self) -> Claimed {
        std::mem::take(&mut self.claimed)
    }

    /// Gives the claims back, and waits until the store has them (a turn that stops before
    /// its drain). If the store fails, the drop submits them once more.
    async fn release(mut self) {
        let released = self.claimed.releases();
        if released.is_empty() {
            return;
        }
        match self.outbox.record(&released, crate::model::time::now()).await {
            Ok(_) => self.claimed.claims.clear(),
            Err(e) => tracing::warn!(error = %e, "the claims of a stopped turn could not be released"),
        }
    }
}

impl Drop for Preclaimed {
    fn drop(&mut self) {
        let released = self.claimed.releases();
        if !released.is_empty() {
            self.outbox.submit(released, crate::model::time::now());
        }
    }
}

/// The next wake-up of a store's stream; never, without one or once it ended.
async fn store_woken(wakeups: Option<&mut Wakeups>) {
    match wakeups {
        Some(stream) => {
            if stream.next().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// The next wake-up of a store's stream or of the drain's nudge, whichever comes first.
async fn woken(wakeups: Option<&mut Wakeups>, nudge: Option<&Notify>) {
    let nudged = async {
        match nudge {
            Some(nudge) => nudge.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = store_woken(wakeups) => {}
        () = nudged => {}
    }
}

type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A write of outcomes: the slots written, the outcomes' buffer (emptied, for the next write),
/// and what the store made of each.
type Written = (Vec<usize>, Vec<Recording>, Result<Vec<Recorded>, StoreError>);

impl<'a> Drain<'a> {
    fn interrupted(&self) -> Option<Interrupted> {
        if self.stop.is_requested() {
            Some(Interrupted::Stopped)
        } else if self.deadline.is_some_and(|d| Instant::now() >= d) {
            Some(Interrupted::DeadlineExceeded)
        } else {
            None
        }
    }

    /// Delivers every intent of the scope due now (and what falls due meanwhile, such as an
    /// expired lease of a dead holder). Returns the outcome that interrupted it, if a stop or
    /// the deadline did.
    pub(crate) async fn run(&self, report: &mut DrainReport) -> Result<Option<Interrupted>, DrainError> {
        let outcome = self.run_without_count(report, None).await?;
        self.count_waiting(report).await?;
        Ok(outcome)
    }

    /// [`run`](Drain::run), leaving [`DrainReport::waiting`] as it is (a turn counts once, at
    /// its end).
    /// `preclaimed` holds what the commit before it claimed for it.
    pub(crate) async fn run_without_count(
        &self,
        report: &mut DrainReport,
        preclaimed: Option<Preclaimed>,
    ) -> Result<Option<Interrupted>, DrainError> {
        match self.interrupted() {
            Some(interrupted) => {
                if let Some(preclaimed) = preclaimed {
                    preclaimed.release().await;
                }
                Ok(Some(interrupted))
            }
            None => self.deliver(report, None, preclaimed, None, &mut None).await,
        }
    }

    /// Sets [`DrainReport::waiting`]: what of the scope still waits in the store.
    pub(crate) async fn count_waiting(&self, report: &mut DrainReport) -> Result<(), DrainError> {
        report.waiting = usize::try_from(self.outbox.counts(self.scope).await?.waiting()).unwrap_or(usize::MAX);
        Ok(())
    }

    /// Delivers every waiting intent, sleeping until retries fall due and leases expire, until
    /// none waits (each is delivered, dead, held or waiting for `retry`), or a stop or the
    /// deadline.
    pub(crate) async fn settle(&self, report: &mut DrainReport) -> Result<Option<Interrupted>, DrainError> {
        self.serve(report, None).await
    }

    /// Like [`settle`](Drain::settle), but with a `poll` interval also wakes that often to look
    /// for intents committed meanwhile (by another process), and runs until a stop.
    pub(crate) async fn serve(
        &self,
        report: &mut DrainReport,
        poll: Option<Duration>,
    ) -> Result<Option<Interrupted>, DrainError> {
        // A serving drain also wakes when the store says intents may have fallen due.
        let mut wakeups = poll.and_then(|_| self.outbox.wakeups());
        // When the rate limits that held intents back in the last claim allow more.
        let mut throttled = None;
        loop {
            let before = report.progress();
            let ran = match self.interrupted() {
                Some(interrupted) => {
                    self.count_waiting(report).await?;
                    return Ok(Some(interrupted));
                }
                None => self.deliver(report, poll, None, wakeups.as_mut(), &mut throttled).await,
            };
            let ran = match ran {
                // A serving drain rides out a store that is busy for a while.
                Err(DrainError::Store(e)) if poll.is_some() && e.is_retryable() => {
                    tracing::warn!(error = %e, "the store is busy; the drain looks again after its poll interval");
                    Ok(None)
                }
                other => other,
            };
            if let Some(outcome) = ran? {
                self.count_waiting(report).await?;
                return Ok(Some(outcome));
            }
            let next = match self.outbox.next_due(self.scope).await {
                Ok(next) => next,
                // A serving drain rides out a store that is briefly away here too (a dropped
                // connection): it looks again after its poll interval, as after a failed
                // claim. Ending here would end the serving runtime it runs beside.
                Err(e) if poll.is_some() && e.is_retryable() => {
                    tracing::warn!(error = %e, "the store is busy; the drain looks again after its poll interval");
                    None
                }
                Err(e) => return Err(e.into()),
            };
            let now = self.clock.now();
            let idle = before == report.progress();
            let wake = match (next, poll) {
                // Nothing pending, retrying or in flight: nothing waits.
                (None, None) => {
                    report.waiting = 0;
                    return Ok(None);
                }
                // Due already, but held back by a rate limit: look again when it allows more.
                (Some(at), _) if at <= now && throttled.is_some() => {
                    let allowed = self.clock.instant_at(throttled.take().expect("guarded"));
                    allowed.min(instant_after(Instant::now(), poll.unwrap_or(SETTLE_RECHECK)))
                }
                // Due already, yet this drain took nothing: another drain holds it or took it
                // meanwhile. Look again shortly rather than spin.
                (Some(at), _) if at <= now && idle => Instant::now() + Duration::from_millis(10),
                // Settling: wake when it falls due, and at least every second, so that an
                // intent another live drain holds is seen delivered soon after, not only when
                // that drain's lease would have expired.
                (Some(at), None) => self
                    .clock
                    .instant_at(at)
                    .min(instant_after(Instant::now(), SETTLE_RECHECK)),
                (Some(at), Some(poll)) => self.clock.instant_at(at).min(instant_after(Instant::now(), poll)),
                (None, Some(poll)) => instant_after(Instant::now(), poll),
            };
            let deadline = async {
                match self.deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            let interrupted = tokio::select! {
                () = tokio::time::sleep_until(wake) => None,
                () = woken(wakeups.as_mut(), self.nudge) => None,
                () = self.stop.requested() => Some(Interrupted::Stopped),
                () = deadline => Some(Interrupted::DeadlineExceeded),
            };
            if let Some(outcome) = interrupted {
                self.count_waiting(report).await?;
                return Ok(Some(outcome));
            }
        }
    }

    /// Claims and delivers until nothing in scope is due, recording outcomes as they finish.
    /// With a `poll` interval, it also looks for newly due intents that often while
    /// deliveries run (a serving drain); without, only when a slot frees.
    ///
    /// What `preclaimed` holds is taken as the answer to the first claim; a serving drain
    /// also looks again whenever `wakeups` yields.
    async fn deliver(
        &self,
        report: &mut DrainReport,
        poll: Option<Duration>,
        preclaimed: Option<Preclaimed>,
        mut wakeups: Option<&mut Wakeups>,
        throttled: &mut Option<SystemTime>,
    ) -> Result<Option<Interrupted>, DrainError> {
        let config = self.config;
        let dispatcher = self.dispatcher.as_ref();
        let mut holds = Holds {
            outbox: self.outbox,
            clock: *self.clock,
            slots: Vec::new(),
            free: BinaryHeap::new(),
            held: 0,
        };
        let mut running = FuturesUnordered::new();
        // The slot of the last attempt that ended where it started, for the next one.
        let mut spare: Option<AttemptSlot<'_>> = None;
        let mut active: foldhash::HashMap<Arc<str>, usize> = Default::default();
        let mut queued: foldhash::HashMap<Arc<str>, VecDeque<usize>> = Default::default();
        // The claim being made, and how many it asked for. (The guard releases the claims made
        // beforehand if this drain is dropped before it took them.)
        let mut claiming: Option<(usize, StoreFuture<'_, Result<Claimed, StoreError>>)> = preclaimed.map(|pre| {
            let asked = pre.asked;
            let taken: StoreFuture<'_, Result<Claimed, StoreError>> = Box::pin(async move { Ok(pre.take()) });
            (asked, taken)
        });
        // The outcomes being written: their slots, and the store's answer.
        let mut recording: Option<StoreFuture<'_, Written>> = None;
        // The slots and the outcomes of a write, kept from one write to the next.
        let mut buffers: (Vec<usize>, Vec<Recording>) = Default::default();
        let mut renewing: Option<StoreFuture<'_, Result<Vec<bool>, StoreError>>> = None;
        let mut exhausted = false;
        let mut stopping: Option<Interrupted> = None;
        let mut first_failure: Option<DeliveryFailure> = None;
        // Rate limits to pause (a receiver's `Retry-After`): new ones, and those whose kinds'
        // queued claims were given back, to write.
        let mut pauses: Vec<(Arc<str>, SystemTime)> = Vec::new();
        let mut pausing: Vec<(Arc<str>, SystemTime)> = Vec::new();
        // When the last claim's rate limits allow more (`Claimed::throttled`).
        let throttle = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(throttle);
        let mut store_error: Option<StoreError> = None;
        let mut record_failures = 0;
        let mut metrics = DeliveryMetrics::default();
        // Built once: registering with the stop handle on every completion would cost a lock each.
        let interrupt = async {
            let deadline = async {
                match self.deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.stop.requested() => Interrupted::Stopped,
                () = deadline => Interrupted::DeadlineExceeded,
            }
        };
        tokio::pin!(interrupt);
        let grace = tokio::time::sleep(config.grace);
        tokio::pin!(grace);
        let renew_every = self.lease / 3;
        let renew = tokio::time::sleep_until(instant_after(Instant::now(), renew_every));
        tokio::pin!(renew);
        let look_again = tokio::time::sleep_until(instant_after(Instant::now(), poll.unwrap_or_default()));
        tokio::pin!(look_again);
        loop {
            let failed_loud = first_failure.is_some() && config.errors == DeliveryErrors::FailLoud;
            let accepting = stopping.is_none() && !failed_loud && store_error.is_none();
            // Hand queued claims to the dispatcher as their kinds free up.
            if accepting {
                // Started and not yet acknowledged: at most `concurrency` at any instant.
                let mut started = holds.held - queued.values().map(VecDeque::len).sum::<usize>();
                for (kind, waiting) in queued.iter_mut() {
                    if waiting.is_empty() {
                        continue;
                    }
                    let limit = config.kind_limits.get(&**kind).copied().unwrap_or(usize::MAX);
                    let count = active.entry(kind.clone()).or_default();
                    while *count < limit && started < config.concurrency {
                        let Some(at) = waiting.pop_front() else { break };
                        *count += 1;
                        started += 1;
                        let slot = holds.slot(at);
                        slot.stage = Stage::Running;
                        let mut attempt = spare.take().unwrap_or_else(|| dispatcher.slot());
                        attempt.as_mut().start(slot.claim.intent.clone(), config.timeout, at);
                        // Polled once here: an attempt that ends at once (an in-process
                        // dispatcher) is finished without joining `running`, which allocates
                        // a task for every future it holds, and leaves its slot for the next.
                        match std::future::poll_fn(|cx| Poll::Ready(attempt.as_mut().poll(cx))).await {
                            Poll::Ready((at, ended)) => {
                                spare = Some(attempt);
                                *count -= 1;
                                let outcome = self.outcome_of(holds.slot(at), ended, &mut first_failure, &mut pauses);
                                holds.slot(at).stage = Stage::Finished(outcome);
                            }
                            Poll::Pending => running.push(attempt),
                        }
                    }
                }
            }
            // Claim as many as there are free slots: a slot is taken from the hand-over to the
            // dispatcher until the outcome is acknowledged. Claims waiting for their kind's
            // limit take no slot (nothing of them reached a receiver), but at most
            // `concurrency` of them wait.
            let waiting_for_kind: usize = queued.values().map(VecDeque::len).sum();
            let free = config
                .concurrency
                .saturating_sub(holds.held - waiting_for_kind)
                .min(config.concurrency.saturating_sub(waiting_for_kind));
            if accepting && !exhausted && claiming.is_none() && free > 0 {
                let request = ClaimRequest {
                    scope: self.scope,
                    limit: free,
                    owner: self.owner,
                    lease: self.lease,
                    now: self.clock.now(),
                    policy: &config.claims,
                };
                claiming = Some((free, self.outbox.claim(request)));
            }
            self.release_paused(&mut pauses, &mut pausing, &mut holds, &mut queued);
            // Write what finished, as one group, while nothing else is being written.
            let record_broken = record_failures >= RECORD_TRIES;
            if recording.is_none() && !record_broken {
                // (The buffers of the last write, emptied.)
                let (mut ready, mut outcomes) = std::mem::take(&mut buffers);
                ready.extend(
                    holds
                        .held()
                        .filter(|(_, s)| matches!(s.stage, Stage::Finished(_)))
                        .map(|(at, _)| at),
                );
                if ready.is_empty() {
                    buffers = (ready, outcomes);
                } else {
                    outcomes.extend(ready.iter().map(|&at| {
                        let slot = holds.slot(at);
                        let Stage::Finished(outcome) = std::mem::replace(&mut slot.stage, Stage::Queued) else {
                            unreachable!("filtered on finished")
                        };
                        slot.stage = Stage::Recording(outcome.clone());
                        Recording {
                            key: slot.claim.intent.key.clone(),
                            token: slot.token(),
                            outcome,
                        }
                    }));
                    let outbox = self.outbox;
                    let now = self.clock.now();
                    let pausing = std::mem::take(&mut pausing);
                    recording = Some(Box::pin(async move {
                        // Before the outcomes: the bucket is paused by the time the failure
                        // that asked for it is recorded.
                        for (bucket, until) in pausing {
                            if let Err(e) = outbox.pause(&bucket, until).await {
                                tracing::warn!(error = %e, bucket = %bucket, "the pause a receiver asked for could not be written; its rate limit goes on");
                            }
                        }
                        let result = outbox.record(&outcomes, now).await;
                        outcomes.clear();
                        (ready, outcomes, result)
                    }));
                }
            }
            if holds.held == 0 && claiming.is_none() && (exhausted || !accepting) {
                break;
            }
            if record_broken && recording.is_none() {
                // Nothing more can be written: what is held stays in flight until its lease
                // expires (the holds' drop submits it once more).
                break;
            }
            tokio::select! {
                biased;
                Some(first) = running.next(), if !running.is_empty() => {
                    // Every attempt finished by now joins the same write.
                    let mut done = Some(first);
                    while let Some((at, attempt)) = done {
                        if let Some(count) = active.get_mut(holds.slot(at).claim.kind()) {
                            *count -= 1;
                        }
                        let outcome = self.outcome_of(holds.slot(at), attempt, &mut first_failure, &mut pauses);
                        holds.slot(at).stage = Stage::Finished(outcome);
                        done = running.next().now_or_never().flatten();
                    }
                }
                (mut ats, outcomes, result) = async { recording.as_mut().expect("guarded").await }, if recording.is_some() => {
                    recording = None;
                    match result {
                        Ok(recorded) if recorded.len() == ats.len() => {
                            record_failures = 0;
                            // A serving drain looks for more whenever slots free up; any
                            // drain does after a failure, which may be due again at once.
                            if poll.is_some() {
                                exhausted = false;
                            }
                            // The group's outcomes were acknowledged together, now.
                            let acknowledged = self.clock.now();
                            for (&at, recorded) in ats.iter().zip(recorded) {
                                let slot = holds.release(at);
                                if matches!(slot.stage, Stage::Recording(Outcome::Failed { .. })) {
                                    exhausted = false;
                                }
                                // Delivered, an intent of an ordering group releases the next
                                // of its group, due now: look again.
                                if slot.claim.group().is_some() && recorded == Recorded::Accepted(DeliveryStatus::Delivered) {
                                    exhausted = false;
                                }
                                self.report_recorded(slot, recorded, acknowledged, report, &mut metrics);
                            }
                        }
                        Ok(recorded) => {
                            // A store that answers for fewer outcomes than it was given: none
                            // of them is known to be written.
                            let e = StoreError::backend(
                                self.outbox.describe(),
                                false,
                                format!("the store answered {} results for {} outcomes", recorded.len(), ats.len()),
                            );
                            tracing::error!(error = %e, "the outcomes of deliveries could not be written");
                            holds.unwritten(&ats);
                            record_failures = RECORD_TRIES;
                            store_error = Some(e);
                        }
                        Err(e) => {
                            record_failures += 1;
                            tracing::warn!(error = %e, tries = record_failures, "the outcomes of deliveries could not be written");
                            holds.unwritten(&ats);
                            if record_failures >= RECORD_TRIES {
                                store_error = Some(e);
                            }
                        }
                    }
                    ats.clear();
                    buffers = (ats, outcomes);
                }
                claimed = async { claiming.as_mut().expect("guarded").1.as_mut().await }, if claiming.is_some() => {
                    let asked = claiming.take().map_or(0, |(asked, _)| asked);
                    match claimed {
                        Ok(claimed) => {
                            DeliveryMetrics::reclaimed(claimed.reclaimed);
                            if claimed.reclaimed > 0 {
                                tracing::warn!(reclaimed = claimed.reclaimed, "in-flight deliveries whose lease expired are pending again; they are delivered again with the same key");
                            }
                            for key in &claimed.integrity {
                                tracing::error!(action_key = %key, "a stored intent failed its integrity check; it is held and never delivered");
                            }
                            // Rows held for integrity were taken too: fewer than asked means
                            // nothing more is due.
                            exhausted = claimed.claims.len() + claimed.integrity.len() < asked;
                            *throttled = claimed.throttled;
                            if let Some(at) = claimed.throttled {
                                throttle.as_mut().reset(self.clock.instant_at(at));
                            }
                            report.list_integrity(claimed.integrity);
                            for claim in claimed.claims {
                                let at = holds.insert(Slot { claim, stage: Stage::Queued });
                                let claim = &holds.slot(at).claim;
                                match queued.get_mut(claim.kind()) {
                                    Some(waiting) => waiting.push_back(at),
                                    None => {
                                        queued.insert(Arc::clone(&claim.intent.kind), VecDeque::from([at]));
                                    }
                                }
                            }
                        }
                        Err(e) => {
                            store_error = Some(e);
                        }
                    }
                }
                outcome = &mut interrupt, if stopping.is_none() => {
                    tracing::info!(outcome = ?outcome, running = running.len(), grace = ?config.grace, "stopping the drain; running deliveries get the grace period");
                    grace.as_mut().reset(instant_after(Instant::now(), config.grace));
                    stopping = Some(outcome);
                    self.release_queued(&mut holds, &mut queued);
                }
                renewed = async { renewing.as_mut().expect("guarded").await }, if renewing.is_some() => {
                    renewing = None;
                    if let Err(e) = renewed {
                        tracing::warn!(error = %e, "the leases of running deliveries could not be renewed");
                    }
                }
                () = &mut renew, if !renew_every.is_zero() && renewing.is_none() => {
                    let held: Vec<(ActionKey, FenceToken)> = holds
                        .held()
                        .map(|(_, s)| (s.claim.intent.key.clone(), s.token()))
                        .collect();
                    if !held.is_empty() {
                        let until = later(self.clock.now(), self.lease);
                        let outbox = self.outbox;
                        renewing = Some(Box::pin(async move { outbox.renew(&held, until).await }));
                    }
                    renew.as_mut().reset(instant_after(Instant::now(), renew_every));
                }
                () = woken(wakeups.as_deref_mut(), self.nudge), if poll.is_some() && exhausted && accepting => {
                    exhausted = false;
                }
                // A rate limit that held intents back allows more.
                () = &mut throttle, if throttled.is_some() && exhausted && accepting => {
                    *throttled = None;
                    exhausted = false;
                }
                () = &mut look_again, if poll.is_some() && exhausted && accepting => {
                    exhausted = false;
                    look_again.as_mut().reset(instant_after(Instant::now(), poll.unwrap_or_default()));
                }
                () = &mut grace, if stopping.is_some() && !running.is_empty() => {
                    tracing::warn!(running = running.len(), "grace period over; cancelling the deliveries still running");
                    drop(std::mem::take(&mut running));
                    for at in holds.held().filter(|(_, s)| matches!(s.stage, Stage::Running)).map(|(at, _)| at).collect::<Vec<_>>() {
                        let slot = holds.slot(at);
                        slot.stage = Stage::Finished(slot.outcome_now());
                        tracing::warn!(action_key = %slot.claim.intent.key, attempt = slot.claim.intent.attempt, "delivery cut off before its outcome was known; due again with the same key");
                        report.list_interrupted(slot.claim.intent.key.clone());
                    }
                }
            }
            let failed_loud = first_failure.is_some() && config.errors == DeliveryErrors::FailLoud;
            if stopping.is_some() || failed_loud || store_error.is_some() {
                self.release_queued(&mut holds, &mut queued);
            }
            self.release_paused(&mut pauses, &mut pausing, &mut holds, &mut queued);
        }
        if let Some(e) = store_error {
            return Err(DrainError::Store(e));
        }
        if let Some(failure) = first_failure.filter(|_| config.errors == DeliveryErrors::FailLoud) {
            return Err(DrainError::Delivery(failure));
        }
        Ok(stopping)
    }

    /// Gives back the claims not yet handed to the dispatcher of the kinds of each rate limit
    /// newly paused (`pauses`): pending, no attempt spent. The pauses move to `pausing`, to
    /// be written.
    fn release_paused(
        &self,
        pauses: &mut Vec<(Arc<str>, SystemTime)>,
        pausing: &mut Vec<(Arc<str>, SystemTime)>,
        holds: &mut Holds<'_>,
        queued: &mut foldhash::HashMap<Arc<str>, VecDeque<usize>>,
    ) {
        for (bucket, until) in pauses.drain(..) {
            for kind in self
                .config
                .claims
                .rates
                .iter()
                .filter(|b| b.name == bucket)
                .flat_map(|b| &b.kinds)
            {
                for at in queued.get_mut(kind).into_iter().flat_map(|waiting| waiting.drain(..)) {
                    holds.slot(at).stage = Stage::Finished(Outcome::Released);
                }
            }
            pausing.push((bucket, until));
        }
    }

    /// Releases every claim not yet handed to the dispatcher.
    fn release_queued(&self, holds: &mut Holds<'_>, queued: &mut foldhash::HashMap<Arc<str>, VecDeque<usize>>) {
        for (_, waiting) in queued.iter_mut() {
            for at in waiting.drain(..) {
                holds.slot(at).stage = Stage::Finished(Outcome::Released);
            }
        }
    }

    /// The outcome to record for a finished attempt, listing failures in `report`.
    /// A failure whose error carries a `Retry-After`, of a kind with a rate limit, adds the
    /// pause of its bucket to `pauses`.
    fn outcome_of(
        &self,
        slot: &Slot,
        attempt: Attempt,
        first_failure: &mut Option<DeliveryFailure>,
        pauses: &mut Vec<(Arc<str>, SystemTime)>,
    ) -> Outcome {
        let intent = &slot.claim.intent;
        let error = match attempt {
            Attempt::Delivered => return Outcome::Delivered,
            Attempt::Failed(e) if e.is_no_route() => {
                return Outcome::Held { reason: e.to_string() };
            }
            Attempt::Failed(e) => e,
            Attempt::TimedOut(limit) => DispatchError::retryable(format!("timed out after {limit:?}")),
            Attempt::Panicked(message) => DispatchError::retryable(format!("dispatcher panicked: {message}")),
        };
        let now = self.clock.now();
        if let (Some(wait), Some(bucket)) = (error.retry_after_hint(), self.config.bucket_of(intent.kind())) {
            if !error.is_permanent() {
                pauses.push((bucket.name.clone(), later(now, wait)));
            }
        }
        let policy = self.config.policy_for(intent.kind());
        let next = policy.after_failure(intent.key().as_str(), slot.claim.counted_attempts(), &error, now);
        let failure = DeliveryFailure::of(intent, error.to_string(), next);
        if first_failure.is_none() {
            *first_failure = Some(failure.clone());
        }
        Outcome::Failed {
            error: failure.error,
            next,
        }
    }

    /// Lists an outcome acknowledged at `acknowledged` in `report`, and counts it in `metrics`.
    fn report_recorded(
        &self,
        slot: Slot,
        recorded: Recorded,
        acknowledged: SystemTime,
        report: &mut DrainReport,
        metrics: &mut DeliveryMetrics,
    ) {
        let ours = slot.token();
        let intent = &slot.claim.intent;
        let outcome = match slot.stage {
            Stage::Recording(outcome) => outcome,
            _ => return,
        };
        let recorded = match recorded {
            // The row is as this outcome leaves it, under this claim's token, which no other
            // drain writes with: an earlier write of it landed and its answer was lost (the
            // store failed after its commit), so it counts as recorded.
            Recorded::Stale { status, token } if token == ours && status == Some(outcome.transition().status) => {
                Recorded::Accepted(outcome.transition().status)
            }
            recorded => recorded,
        };
        if !matches!(outcome, Outcome::Released | Outcome::Held { .. }) {
            metrics.attempt(&intent.kind);
        }
        if let Recorded::Stale { status, token } = recorded {
            if outcome != Outcome::Released {
                tracing::warn!(action_key = %intent.key, attempt = intent.attempt, our_token = %ours, their_token = %token, status = ?status, "a late outcome of a delivery whose lease had expired is rejected: another drain reclaimed the intent");
                report.stale += 1;
                DeliveryMetrics::stale(1);
            }
            return;
        }
        let kind = &intent.kind;
        match outcome {
            Outcome::Delivered => {
                report.delivered += 1;
                let latency = acknowledged
                    .duration_since(slot.claim.recorded_at())
                    .unwrap_or_default();
                metrics.outcome(kind, Counted::Delivered, Some(latency));
            }
            Outcome::Held { .. } => {
                metrics.outcome(kind, Counted::Held, None);
                tracing::warn!(action_key = %intent.key, kind = %intent.kind, "no route for the intent's kind; held");
                report.list_held(intent.key.clone());
            }
            Outcome::Failed { error, next } => {
                let failure = DeliveryFailure::of(intent, error, next);
                tracing::warn!(action_key = %failure.key, kind = %failure.kind, attempt = failure.attempt, status = %failure.status, error = %failure.error, "delivery failed");
                if failure.status == DeliveryStatus::Dead {
                    metrics.outcome(kind, Counted::Dead, None);
                    report.list_dead(failure);
                } else {
                    metrics.outcome(kind, Counted::Failed, None);
                    report.list_failed(failure);
                }
            }
            Outcome::Interrupted { .. } => metrics.outcome(kind, Counted::Interrupted, None),
            Outcome::Released => {}
        }
    }
}

/// A place for one attempt at a time ([`ErasedDispatcher::slot`]): [`Attempting::start`]
/// puts an attempt in it, polling it runs the attempt, and the slot is empty again once the
/// attempt ended (the dispatch's future is dropped then, not when the slot is).
pub(crate) type AttemptSlot<'a> = Pin<Box<dyn Attempting + Send + 'a>>;

/// An [`AttemptSlot`]'s contents: polled, it yields the slot of the claim its attempt was
/// made for, and how the attempt ended.
pub(crate) trait Attempting: Future<Output = (usize, Attempt)> {
    /// Starts an attempt to deliver `intent` for the claim held in slot `index`, in place of
    /// the ended one (if any). The attempt is written into the slot: no box is made for it.
    fn start(self: Pin<&mut Self>, intent: Intent, timeout: Option<Duration>, index: usize);
}

pin_project_lite::pin_project! {
    /// An [`Attempting`] for attempts that `build` makes (the closure over a dispatcher of a
    /// known type that [`slot`] passes, so that `F` is the attempt's own future type).
    struct AttemptCell<B, F> {
        build: B,
        #[pin]
        attempt: Option<F>,
    }
}

impl<B, F: Future<Output = (usize, Attempt)>> Future for AttemptCell<B, F> {
    type Output = (usize, Attempt);

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<(usize, Attempt)> {
        let mut attempt = self.project().attempt;
        let running = attempt
            .as_mut()
            .as_pin_mut()
            .expect("an attempt slot is polled only between its start and the attempt's end");
        let ended = std::task::ready!(running.poll(cx));
        attempt.set(None);
        Poll::Ready(ended)
    }
}

impl<B, F> Attempting for AttemptCell<B, F>
where
    B: Fn(Intent, Option<Duration>, usize) -> F,
    F: Future<Output = (usize, Attempt)>,
{
    fn start(self: Pin<&mut Self>, intent: Intent, timeout: Option<Duration>, index: usize) {
        let mut this = self.project();
        let attempt = (this.build)(intent, timeout, index);
        this.attempt.set(Some(attempt));
    }
}

/// An empty [`AttemptSlot`] for `dispatcher`'s attempts.
pub(crate) fn slot<D: Dispatcher>(dispatcher: &D) -> AttemptSlot<'_> {
    Box::pin(AttemptCell {
        build: move |intent, timeout, index| attempt(dispatcher, intent, timeout, index),
        attempt: None,
    })
}

/// One attempt: the dispatch, bounded by the timeout, with panics caught.
/// (A dispatcher may panic while building its future as well as inside it.)
/// The dispatcher is handed the attempt's own trace context ([`Intent::trace_parent`]),
/// continuing the one the ledger kept.
fn attempt<D: Dispatcher>(
    dispatcher: &D,
    mut intent: Intent,
    timeout: Option<Duration>,
    index: usize,
) -> impl Future<Output = (usize, Attempt)> + Send + '_ {
    let span = tracing::debug_span!(
        "delivery",
        action_key = %intent.key(),
        kind = intent.kind(),
        attempt = intent.attempt(),
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
        parent_span_id = tracing::field::Empty,
    );
    intent.trace = Some(crate::model::trace::delivery_context(&span, intent.trace.as_ref()));
    let built = span.in_scope(|| std::panic::catch_unwind(AssertUnwindSafe(|| dispatcher.dispatch(intent))));
    async move {
        let dispatch = match built {
            Ok(future) => AssertUnwindSafe(future).catch_unwind(),
            Err(panic) => return (index, Attempt::Panicked(crate::model::panic::panic_message(&panic))),
        };
        let result = match timeout {
            Some(limit) => match tokio::time::timeout(limit, dispatch).await {
                Ok(result) => result,
                Err(_) => return (index, Attempt::TimedOut(limit)),
            },
            None => dispatch.await,
        };
        let attempt = match result {
            Ok(Ok(())) => Attempt::Delivered,
            Ok(Err(e)) => Attempt::Failed(e),
            Err(panic) => Attempt::Panicked(crate::model::panic::panic_message(&panic)),
        };
        (index, attempt)
    }
    .instrument(span)
}
