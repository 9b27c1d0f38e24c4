//! The delivery engine: drains the outbox with retries, backoff, a dead letter, bounded
//! concurrency, per-attempt timeouts and a graceful stop.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tracing::Instrument;

use crate::model::action::{ActionKey, Intent};
use crate::outbox::dispatcher::{DispatchError, ErasedDispatcher};
use crate::outbox::ledger::{later, DeliveryStatus, FailedAttempt, Lease, Ledger};
use crate::run::runtime::{StopHandle, TurnOutcome};
use crate::state::context::Context;
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

/// What a failed delivery does to the drain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeliveryErrors {
    /// Failures are recorded in the ledger and listed in the drain's report; the drain goes
    /// on with the other intents.
    #[default]
    Continue,
    /// The first failure stops the drain: deliveries already running finish and are
    /// recorded, none starts after it, and the turn returns
    /// [`RunError::Delivery`](crate::RunError::Delivery).
    FailLoud,
}

/// How the outbox delivers: policies, limits, timeouts. Set through the
/// [`RuntimeBuilder`](crate::RuntimeBuilder).
#[derive(Clone, Debug)]
pub(crate) struct DeliveryConfig {
    pub(crate) policy: RetryPolicy,
    pub(crate) policies: foldhash::HashMap<String, RetryPolicy>,
    pub(crate) concurrency: usize,
    pub(crate) kind_limits: foldhash::HashMap<String, usize>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) grace: Duration,
    pub(crate) errors: DeliveryErrors,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            policy: RetryPolicy::default(),
            policies: Default::default(),
            concurrency: 64,
            kind_limits: Default::default(),
            timeout: Some(Duration::from_secs(30)),
            grace: Duration::from_secs(10),
            errors: DeliveryErrors::default(),
        }
    }
}

impl DeliveryConfig {
    fn policy_for(&self, kind: &str) -> &RetryPolicy {
        self.policies.get(kind).unwrap_or(&self.policy)
    }
}

/// Wall-clock time read from tokio's clock: anchored to the system clock when the runtime was
/// built and advanced by tokio's monotonic clock, so backoff and leases follow a paused test
/// clock and never jump with the system clock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    wall: SystemTime,
    mono: Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Clock {
            wall: SystemTime::now(),
            mono: Instant::now(),
        }
    }

    pub(crate) fn now(&self) -> SystemTime {
        self.wall + self.mono.elapsed()
    }

    /// The tokio instant at which the wall-clock time `at` is reached (at most about 30 years
    /// ahead, see [`instant_after`]).
    pub(crate) fn instant_at(&self, at: SystemTime) -> Instant {
        instant_after(self.mono, at.duration_since(self.wall).unwrap_or_default())
    }
}

/// `base + delay` for a delay from outside (a deadline, a grace period, a retry time), which
/// may be as long as `Duration::MAX`: capped at about 30 years, as tokio caps its own timers,
/// so it never overflows.
pub(crate) fn instant_after(base: Instant, delay: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);
    base.checked_add(delay.min(FAR)).unwrap_or(base)
}

/// What a drain did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct DrainReport {
    /// Intents delivered.
    pub delivered: u64,
    /// Failed attempts that will be retried (at `next_attempt_at`) or wait for `retry`.
    pub failed: Vec<DeliveryFailure>,
    /// Intents that became dead letters: attempts used up, or a permanent error.
    pub dead: Vec<DeliveryFailure>,
    /// Intents held because no route handles their kind.
    pub held: Vec<ActionKey>,
    /// Intents whose attempt was cut off by a stop or the deadline after the grace period:
    /// the receiver may have seen them, so they are pending again, due at once, and are
    /// delivered again with the same key. Not failures: they do not count against the retry
    /// policy's `max_attempts`.
    pub interrupted: Vec<ActionKey>,
    /// Outcomes rejected as stale: this drain stalled past its lease while delivering these
    /// intents, another drain reclaimed them meanwhile, and the ledger keeps that drain's
    /// record (each was logged at warn).
    pub stale: u64,
    /// Intents still waiting when the drain ended: retries not yet due, attempts cut off,
    /// intents not started because of a stop or the deadline, and intents in flight under
    /// another holder's lease (a process that died after handing them out): they are due again
    /// when the lease expires.
    pub waiting: usize,
}

impl DrainReport {
    fn absorb(&mut self, other: DrainReport) {
        self.delivered += other.delivered;
        self.failed.extend(other.failed);
        self.dead.extend(other.dead);
        self.held.extend(other.held);
        self.interrupted.extend(other.interrupted);
        self.stale += other.stale;
        self.waiting = other.waiting;
    }
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

/// How many intents one drain step leases and records together (at least the delivery
/// concurrency, so the limit is reachable).
const DRAIN_BATCH: usize = 256;

/// How one attempt ended.
enum Attempt {
    Delivered,
    Failed(DispatchError),
    TimedOut(Duration),
    Panicked(String),
}

pub(crate) struct Drain<'a> {
    pub(crate) context: &'a mut Context,
    pub(crate) dispatcher: &'a Arc<dyn ErasedDispatcher>,
    pub(crate) config: &'a DeliveryConfig,
    pub(crate) clock: &'a Clock,
    pub(crate) stop: &'a StopHandle,
    pub(crate) deadline: Option<Instant>,
}

impl Drain<'_> {
    fn interrupted(&self) -> Option<TurnOutcome> {
        if self.stop.is_requested() {
            Some(TurnOutcome::Stopped)
        } else if self.deadline.is_some_and(|d| Instant::now() >= d) {
            Some(TurnOutcome::DeadlineExceeded)
        } else {
            None
        }
    }

    /// Delivers every intent due now, in batches. Returns the outcome that interrupted it, if a
    /// stop or the deadline did.
    pub(crate) async fn run(&mut self, report: &mut DrainReport) -> Result<Option<TurnOutcome>, DrainError> {
        let mut outcome = None;
        loop {
            // First, so that what is due includes what an expired lease gives back (and no
            // expiry of a batch that has since finished counts as due).
            self.reclaim_expired_leases()?;
            if !self.context.ledger().lock().has_due(self.clock.now()) {
                break;
            }
            if let Some(interrupted) = self.interrupted() {
                outcome = Some(interrupted);
                break;
            }
            let mut batch_report = DrainReport::default();
            let result = self.batch(&mut batch_report).await;
            report.absorb(batch_report);
            if let Some(interrupted) = result? {
                outcome = Some(interrupted);
                break;
            }
        }
        let ledger = self.context.ledger().lock();
        report.waiting = ledger.pending() + ledger.in_flight();
        drop(ledger);
        Ok(outcome)
    }

    /// Puts the in-flight intents whose lease expired back to pending, in memory and in the
    /// store: their holder (another process, or an earlier context of this one) died or
    /// stalled past its lease after handing them to a dispatcher. Between batches this drain
    /// holds no lease of its own, so only another holder's leases can have expired.
    fn reclaim_expired_leases(&mut self) -> Result<(), DrainError> {
        let now = self.clock.now();
        let reclaimed = self.context.ledger().lock().reclaim_expired(now);
        if !reclaimed.is_empty() {
            tracing::warn!(reclaimed = reclaimed.len(), "in-flight deliveries whose lease expired are pending again; they are delivered again with the same key");
            self.context.persist_deliveries(&reclaimed)?;
        }
        Ok(())
    }

    /// Delivers every waiting intent, sleeping until retries are due, until none waits (each
    /// is delivered, dead, held or waiting for `retry`), or a stop or the deadline.
    pub(crate) async fn settle(&mut self, report: &mut DrainReport) -> Result<Option<TurnOutcome>, DrainError> {
        loop {
            if let Some(outcome) = self.run(report).await? {
                return Ok(Some(outcome));
            }
            let Some(next) = self.context.ledger().lock().next_due() else {
                return Ok(None);
            };
            let wake = self.clock.instant_at(next);
            let deadline = async {
                match self.deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                () = self.stop.requested() => return Ok(Some(TurnOutcome::Stopped)),
                () = deadline => return Ok(Some(TurnOutcome::DeadlineExceeded)),
            }
        }
    }

    /// One batch: lease it (one ledger write), deliver it concurrently, record the outcomes
    /// (one more).
    async fn batch(&mut self, report: &mut DrainReport) -> Result<Option<TurnOutcome>, DrainError> {
        let now = self.clock.now();
        let lease = self.context.new_lease(now);
        let size = DRAIN_BATCH.max(self.config.concurrency);
        let batch = self.context.ledger_mut().begin_batch(size, &lease, now);
        if let Err(e) = self.context.persist_deliveries(&batch) {
            for &at in &batch {
                self.context.ledger_mut().release(at, now);
            }
            return Err(DrainError::Store(e));
        }
        let intents: Vec<Intent> = batch
            .iter()
            .map(|&at| self.context.ledger().lock().intent_for(at))
            .collect();
        // Declared before the outcomes, so that if this future is dropped, the outcomes are
        // recorded in memory first and the hold then writes them to the store.
        let mut hold = BatchHold {
            every: self.context.lease_duration() / 3,
            context: &mut *self.context,
            clock: self.clock,
            batch: &batch,
            written: false,
        };
        let mut outcomes = Outcomes {
            ledger: hold.context.ledger().clone(),
            config: self.config,
            clock: *self.clock,
            batch: &batch,
            lease,
            intents: &intents,
            results: std::iter::repeat_with(|| None).take(batch.len()).collect(),
            started: vec![false; batch.len()],
            recorded: false,
        };
        let interrupted = deliver(
            self.dispatcher.as_ref(),
            self.config,
            self.stop,
            self.deadline,
            &intents,
            &mut outcomes,
            &mut hold,
        )
        .await;
        let first_failure = outcomes.record(report);
        drop(outcomes);
        hold.written = true;
        drop(hold);
        self.context.persist_deliveries(&batch)?;
        match first_failure {
            Some(failure) if self.config.errors == DeliveryErrors::FailLoud => Err(DrainError::Delivery(failure)),
            _ => Ok(interrupted),
        }
    }
}

/// The error recorded for an attempt cut off before its outcome was known.
const INTERRUPTED: &str = "the attempt was cut off (a stop, the deadline or a dropped turn) before its outcome was \
                           known; the receiver may have seen the intent, so it is delivered again at once with the \
                           same key";

/// Hands the batch to the dispatcher, concurrently within the global and per-kind limits. On a
/// stop or the deadline (or the first failure, failing loud) it starts nothing more and gives
/// running deliveries the grace period.
/// A batch's hold on the context while it is delivered: it renews the batch's lease every
/// third of the lease, so that a long dispatch is not reclaimed while its drain lives, and if
/// the drain's future is dropped mid-batch it writes what [`Outcomes`] recorded in memory to
/// the store, so that a finished outcome survives the dropped turn and a cut-off attempt is
/// due again at once instead of waiting out its lease.
struct BatchHold<'a> {
    context: &'a mut Context,
    clock: &'a Clock,
    every: Duration,
    batch: &'a [usize],
    /// The normal path writes the outcomes itself.
    written: bool,
}

impl Drop for BatchHold<'_> {
    fn drop(&mut self) {
        if self.written {
            return;
        }
        if let Err(e) = self.context.persist_deliveries(self.batch) {
            // The file keeps the batch in flight: the lease expires and the intents are
            // delivered again with the same key.
            tracing::warn!(error = %e, "the outcomes of a dropped drain could not be stored");
        }
    }
}

impl BatchHold<'_> {
    /// Moves every entry of the batch that still holds the batch's lease to a new one, from
    /// now, in memory and in the store. An entry another drain reclaimed is left to it.
    fn renew(&mut self, out: &mut Outcomes<'_>) {
        let lease = self.context.new_lease(self.clock.now());
        let renewed: Vec<usize> = {
            let mut ledger = out.ledger.lock();
            out.batch
                .iter()
                .copied()
                .filter(|&at| ledger.renew(at, &out.lease, &lease))
                .collect()
        };
        out.lease = lease;
        if let Err(e) = self.context.persist_deliveries(&renewed) {
            // The renewal holds in memory; a process that opens the store meanwhile may take
            // the lease for expired, and deliver again with the same key.
            tracing::warn!(error = %e, renewed = renewed.len(), "the renewed lease could not be stored");
        }
    }
}

async fn deliver(
    dispatcher: &dyn ErasedDispatcher,
    config: &DeliveryConfig,
    stop: &StopHandle,
    deadline: Option<Instant>,
    intents: &[Intent],
    out: &mut Outcomes<'_>,
    hold: &mut BatchHold<'_>,
) -> Option<TurnOutcome> {
    let mut running = FuturesUnordered::new();
    let mut active: foldhash::HashMap<&str, usize> = Default::default();
    let mut waiting: foldhash::HashMap<&str, VecDeque<usize>> = Default::default();
    let mut next = 0;
    let mut stopping: Option<(TurnOutcome, Instant)> = None;
    let mut failed_loud = false;
    let start = |i: usize| attempt(dispatcher, intents[i].clone(), config.timeout, i);
    // Built once: registering with the stop handle on every completion would cost a lock each.
    let interrupt = async {
        let deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.requested() => TurnOutcome::Stopped,
            () = deadline => TurnOutcome::DeadlineExceeded,
        }
    };
    tokio::pin!(interrupt);
    let grace = tokio::time::sleep(config.grace);
    tokio::pin!(grace);
    let renew_every = (!hold.every.is_zero()).then_some(hold.every);
    let renew = tokio::time::sleep_until(instant_after(Instant::now(), hold.every));
    tokio::pin!(renew);
    loop {
        let accepting = stopping.is_none() && !failed_loud;
        while accepting && running.len() < config.concurrency && next < intents.len() {
            let kind = intents[next].kind();
            let limit = config.kind_limits.get(kind).copied().unwrap_or(usize::MAX);
            let count = active.entry(kind).or_default();
            if *count >= limit {
                waiting.entry(kind).or_default().push_back(next);
            } else {
                *count += 1;
                out.started[next] = true;
                running.push(start(next));
            }
            next += 1;
        }
        tokio::select! {
            biased;
            done = running.next() => {
                let Some((i, attempt)) = done else { break };
                let kind = intents[i].kind();
                if let Some(count) = active.get_mut(kind) {
                    *count -= 1;
                }
                if config.errors == DeliveryErrors::FailLoud && !matches!(attempt, Attempt::Delivered) {
                    failed_loud = true;
                }
                out.results[i] = Some(attempt);
                if stopping.is_none() && !failed_loud {
                    if let Some(queued) = waiting.get_mut(kind).and_then(VecDeque::pop_front) {
                        *active.entry(kind).or_default() += 1;
                        out.started[queued] = true;
                        running.push(start(queued));
                    }
                }
            }
            outcome = &mut interrupt, if stopping.is_none() => {
                tracing::info!(outcome = ?outcome, running = running.len(), grace = ?config.grace, "stopping the drain; running deliveries get the grace period");
                let until = instant_after(Instant::now(), config.grace);
                grace.as_mut().reset(until);
                stopping = Some((outcome, until));
            }
            () = &mut renew, if renew_every.is_some() => {
                hold.renew(out);
                renew.as_mut().reset(instant_after(Instant::now(), hold.every));
            }
            () = &mut grace, if stopping.is_some() => {
                tracing::warn!(running = running.len(), "grace period over; cancelling the deliveries still running");
                break;
            }
        }
    }
    stopping.map(|(outcome, _)| outcome)
}

/// The outcomes of a batch being delivered, and their recording in the ledger: by
/// [`record`](Outcomes::record) when the deliveries end, or by `Drop` if the drain's future is
/// dropped first (the caller gave up on the turn). Either way every intent is recorded as what
/// happened to it: an attempt that finished as it finished (delivered, failed or dead per the
/// retry policy, held); an attempt cut off while running as of unknown outcome, due again at
/// once; an intent never started back to pending. After a drop, the [`BatchHold`] writes
/// them to a durable store.
struct Outcomes<'a> {
    ledger: Ledger,
    config: &'a DeliveryConfig,
    clock: Clock,
    batch: &'a [usize],
    /// The lease the batch holds (taken under, or renewed to): an entry that no longer holds
    /// it was reclaimed by another drain, and this drain's outcome for it is stale.
    lease: Lease,
    intents: &'a [Intent],
    results: Vec<Option<Attempt>>,
    started: Vec<bool>,
    recorded: bool,
}

impl Outcomes<'_> {
    /// Records every outcome in the ledger (once), listing them in `report`. Returns the first
    /// failed or dead delivery, for a fail-loud drain.
    fn record(&mut self, report: &mut DrainReport) -> Option<DeliveryFailure> {
        if std::mem::replace(&mut self.recorded, true) {
            return None;
        }
        let now = self.clock.now();
        let mut ledger = self.ledger.lock();
        let mut first_failure = None;
        for (i, (&at, intent)) in self.batch.iter().zip(self.intents).enumerate() {
            let result = self.results[i].take();
            if ledger.entry(at).lease() != Some(&self.lease) {
                // Our lease expired and another drain reclaimed the intent (it may have
                // delivered it since): its record stands, ours is rejected.
                if self.started[i] {
                    tracing::warn!(action_key = %intent.key(), attempt = intent.attempt(), status = %ledger.entry(at).status(), "a late outcome of a delivery whose lease had expired is rejected: another drain reclaimed the intent");
                    report.stale += 1;
                }
                continue;
            }
            let error = match (result, self.started[i]) {
                (None, false) => {
                    ledger.release(at, now);
                    continue;
                }
                (None, true) => {
                    ledger.record_interrupted(at, INTERRUPTED.to_owned(), now);
                    tracing::warn!(action_key = %intent.key(), kind = intent.kind(), attempt = intent.attempt(), "delivery cut off before its outcome was known; due again with the same key");
                    report.interrupted.push(intent.key().clone());
                    continue;
                }
                (Some(Attempt::Delivered), _) => {
                    ledger.record_delivered(at, now);
                    report.delivered += 1;
                    continue;
                }
                (Some(Attempt::Failed(e)), _) if e.is_no_route() => {
                    ledger.record_held(at, e.to_string(), now);
                    tracing::warn!(action_key = %intent.key(), kind = intent.kind(), "no route for the intent's kind; held");
                    report.held.push(intent.key().clone());
                    continue;
                }
                (Some(Attempt::Failed(e)), _) => e,
                (Some(Attempt::TimedOut(limit)), _) => DispatchError::retryable(format!("timed out after {limit:?}")),
                (Some(Attempt::Panicked(message)), _) => {
                    DispatchError::retryable(format!("dispatcher panicked: {message}"))
                }
            };
            let policy = self.config.policy_for(intent.kind());
            let failures = ledger.entry(at).failed_attempts();
            let next = policy.after_failure(intent.key().as_str(), failures, &error, now);
            let message = error.to_string();
            ledger.record_failed(at, message.clone(), next, now);
            let entry = ledger.entry(at);
            let failure = DeliveryFailure {
                key: intent.key().clone(),
                kind: intent.kind().to_owned(),
                attempt: intent.attempt(),
                error: message,
                status: entry.status(),
                next_attempt_at: entry.next_attempt_at(),
            };
            tracing::warn!(action_key = %failure.key, kind = %failure.kind, attempt = failure.attempt, status = %failure.status, error = %failure.error, "delivery failed");
            if first_failure.is_none() {
                first_failure = Some(failure.clone());
            }
            if failure.status == DeliveryStatus::Dead {
                report.dead.push(failure);
            } else {
                report.failed.push(failure);
            }
        }
        first_failure
    }
}

impl Drop for Outcomes<'_> {
    fn drop(&mut self) {
        self.record(&mut DrainReport::default());
    }
}

type AttemptFuture<'a> = Pin<Box<dyn Future<Output = (usize, Attempt)> + Send + 'a>>;

/// One attempt: the dispatch, bounded by the timeout, with panics caught.
fn attempt(
    dispatcher: &dyn ErasedDispatcher,
    intent: Intent,
    timeout: Option<Duration>,
    index: usize,
) -> AttemptFuture<'_> {
    let span =
        tracing::debug_span!("delivery", action_key = %intent.key(), kind = intent.kind(), attempt = intent.attempt());
    // A dispatcher may panic while building its future as well as inside it.
    let built = span.in_scope(|| std::panic::catch_unwind(AssertUnwindSafe(|| dispatcher.dispatch_boxed(intent))));
    let dispatch = match built {
        Ok(future) => AssertUnwindSafe(future).catch_unwind(),
        Err(panic) => {
            let attempt = Attempt::Panicked(crate::run::generation::panic_message(&panic));
            return Box::pin(std::future::ready((index, attempt)));
        }
    };
    Box::pin(
        async move {
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
                Err(panic) => Attempt::Panicked(crate::run::generation::panic_message(&panic)),
            };
            (index, attempt)
        }
        .instrument(span),
    )
}
