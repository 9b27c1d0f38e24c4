//! The standalone drainer: delivers the intents of a whole store (or of some sessions and
//! kinds), in any process, alongside any number of runtimes and other drainers.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::model::build_error::BuildError;
use crate::model::stop::StopHandle;
use crate::outbox::dispatcher::{Dispatcher, ErasedDispatcher};
use crate::outbox::drain::{Clock, Drain, RetryPolicy};
use crate::outbox::drain::{DeliveryFailure, DrainError, Interrupted};
use crate::outbox::options::{DeliveryErrors, DeliveryOptions};
use crate::outbox::report::DrainReport;
use crate::store::outbox::{OutboxStore, Scope};
use crate::store::StoreError;

/// Delivers the intents of a store, without a runtime: the outbox's drain for a process of its
/// own (or a task of its own), next to any number of runtimes and other drainers of the same
/// store.
///
/// Every drain of a store claims intents from the store's outbox atomically, under a lease and
/// a fencing token, so drainers and runtimes never hand one key to their dispatchers at once;
/// a key goes out again only after its holder died or stalled past its lease (then with the
/// same key). While it runs, a drainer renews the leases of its running deliveries, and puts
/// the expired leases of dead holders back to pending.
///
/// ```
/// use std::sync::Arc;
/// use reactifact_core::{Context, DeliveryOptions, DispatchError, Drainer, Intent, Scope};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::new("orders");
/// let drainer = Drainer::builder(ctx.outbox(), |intent: Intent| async move {
///     println!("sending {}", intent.key());
///     Ok::<(), DispatchError>(())
/// })
/// .scope(Scope::all().kinds(["notify"]))
/// .delivery(DeliveryOptions::new().concurrency(16))
/// .build()?;
/// let report = drainer.flush().await?;
/// assert_eq!(report.delivered, 0);
/// # Ok(()) }
/// ```
pub struct Drainer {
    outbox: Arc<dyn OutboxStore>,
    dispatcher: Arc<dyn ErasedDispatcher>,
    scope: Scope,
    options: DeliveryOptions,
    lease: Duration,
    poll: Duration,
    metrics_every: Duration,
    owner: Arc<str>,
    clock: Clock,
    stop: StopHandle,
}

/// Builds a [`Drainer`]: [`Drainer::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct DrainerBuilder {
    outbox: Arc<dyn OutboxStore>,
    dispatcher: Arc<dyn ErasedDispatcher>,
    scope: Scope,
    options: DeliveryOptions,
    poll: Duration,
    metrics_every: Duration,
}

impl Drainer {
    /// A drainer of `outbox` (a context's [`outbox`](crate::Context::outbox), or a file's
    /// [`SqliteOutbox`](crate::SqliteOutbox)) that hands intents to `dispatcher`.
    pub fn builder(outbox: Arc<dyn OutboxStore>, dispatcher: impl Dispatcher) -> DrainerBuilder {
        DrainerBuilder {
            outbox,
            dispatcher: Arc::new(dispatcher),
            scope: Scope::all(),
            options: DeliveryOptions::default(),
            poll: Duration::from_millis(250),
            metrics_every: Duration::ZERO,
        }
    }

    /// Delivers every intent in scope that is due now, and those that fall due while it runs.
    ///
    /// # Errors
    /// [`FlushError::Delivery`] with [`DeliveryErrors::FailLoud`] on the first failure (recorded
    /// first), [`FlushError::Store`] if the store fails.
    pub async fn flush(&self) -> Result<DrainReport, FlushError> {
        self.drain(|drain, report| Box::pin(drain.run(report))).await
    }

    /// Delivers until nothing in scope waits: sleeps until retries fall due and until the
    /// leases of other holders expire (then delivers those intents again with the same key).
    /// Returns early on a stop.
    ///
    /// # Errors
    /// As [`flush`](Drainer::flush).
    pub async fn settle(&self) -> Result<DrainReport, FlushError> {
        self.drain(|drain, report| Box::pin(drain.settle(report))).await
    }

    /// Delivers until `stop` (or [`stop_handle`](Drainer::stop_handle)) is asked to stop, then
    /// lets running deliveries finish within the grace period and returns. Intents committed by
    /// other processes are noticed within the poll interval; retries and expired leases when
    /// they fall due. With a [`metrics_interval`](DrainerBuilder::metrics_interval), it also
    /// sets the outbox gauges of the metrics recorder that often, from a count of its scope
    /// ([`Ledger::record_metrics`](crate::Ledger::record_metrics)).
    ///
    /// As it starts, it takes over at once the claims of the lease owners of its scope that are
    /// provably dead ([`reclaim_dead_owners`](crate::reclaim_dead_owners): a process of this
    /// host that is gone, such as the one this drainer's process replaces), instead of waiting
    /// out their leases; a failure to do so is logged, and those claims wait out their leases.
    ///
    /// # Errors
    /// As [`flush`](Drainer::flush).
    pub async fn serve(&self, stop: StopHandle) -> Result<DrainReport, FlushError> {
        let poll = self.poll;
        let mut report = DrainReport::default();
        let span = tracing::info_span!("drainer", store = %self.outbox.describe(), serve = true);
        crate::outbox::owner::reclaim_dead_owners_or_warn(self.outbox.as_ref(), &self.scope)
            .instrument(span.clone())
            .await;
        let drain = self.drain_of(&stop);
        let served = drain.serve(&mut report, Some(poll)).instrument(span.clone());
        let gauges = self.record_gauges().instrument(span);
        let outcome = tokio::select! {
            outcome = served => outcome,
            never = gauges => match never {},
        };
        outcome.map_err(FlushError::from)?;
        Ok(report)
    }

    /// Sets the outbox gauges every `metrics_every` (never, if zero), until dropped.
    async fn record_gauges(&self) -> std::convert::Infallible {
        record_gauges(self.outbox.clone(), self.scope.clone(), self.metrics_every).await
    }

    /// A handle that stops a running [`flush`](Drainer::flush), [`settle`](Drainer::settle)
    /// or [`serve`](Drainer::serve) of this drainer. A stop asked while none runs stops the
    /// next one.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// The outbox it drains.
    pub fn outbox(&self) -> &Arc<dyn OutboxStore> {
        &self.outbox
    }

    /// The scope it drains.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    async fn drain<F>(&self, run: F) -> Result<DrainReport, FlushError>
    where
        F: for<'d> FnOnce(
            &'d Drain<'d>,
            &'d mut DrainReport,
        ) -> crate::store::outbox::BoxFuture<'d, Result<Option<Interrupted>, DrainError>>,
    {
        let mut report = DrainReport::default();
        let span = tracing::info_span!("drainer", store = %self.outbox.describe());
        let drain = self.drain_of(&self.stop);
        let outcome = run(&drain, &mut report).instrument(span).await;
        if outcome.map_err(FlushError::from)? == Some(Interrupted::Stopped) {
            self.stop.clear();
        }
        Ok(report)
    }

    fn drain_of<'a>(&'a self, stop: &'a StopHandle) -> Drain<'a> {
        Drain {
            outbox: self.outbox.as_ref(),
            scope: &self.scope,
            owner: &self.owner,
            lease: self.lease,
            dispatcher: &self.dispatcher,
            config: &self.options,
            clock: &self.clock,
            stop,
            deadline: None,
            nudge: None,
        }
    }
}

impl DrainerBuilder {
    /// Which intents it delivers (default: every intent of the store).
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// How it delivers: retry policies, limits, the attempt timeout, the grace period after a
    /// stop, what a failure does, the lease of each claim (default:
    /// [`DeliveryOptions::default`], with a 30 s lease).
    pub fn delivery(mut self, options: DeliveryOptions) -> Self {
        self.options = options;
        self
    }

    /// At most this many deliveries at once.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().concurrency(limit))`")]
    pub fn concurrency(mut self, limit: usize) -> Self {
        self.options = self.options.concurrency(limit);
        self
    }

    /// At most this many deliveries of one action kind at once.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().concurrency_for(kind, limit))`")]
    pub fn concurrency_for(mut self, kind: &str, limit: usize) -> Self {
        self.options = self.options.concurrency_for(kind, limit);
        self
    }

    /// The lease of each claim.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().lease(lease))`")]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.options = self.options.lease(lease);
        self
    }

    /// The retry policy for every kind without one of its own.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().retry_policy(policy))`")]
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.options = self.options.retry_policy(policy);
        self
    }

    /// The retry policy of one action kind.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().retry_policy_for(kind, policy))`")]
    pub fn retry_policy_for(mut self, kind: &str, policy: RetryPolicy) -> Self {
        self.options = self.options.retry_policy_for(kind, policy);
        self
    }

    /// Bounds each attempt.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().timeout(timeout))`")]
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.options = self.options.timeout(timeout);
        self
    }

    /// How long running deliveries may finish after a stop.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().grace(grace))`")]
    pub fn grace(mut self, grace: Duration) -> Self {
        self.options = self.options.grace(grace);
        self
    }

    /// What a failed delivery does.
    #[deprecated(note = "use `.delivery(DeliveryOptions::new().errors(mode))`")]
    pub fn delivery_errors(mut self, mode: DeliveryErrors) -> Self {
        self.options = self.options.errors(mode);
        self
    }

    /// How often [`serve`](Drainer::serve) looks for intents committed meanwhile when nothing
    /// falls due sooner (default 250 ms; at least 1 ms).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll = every.max(Duration::from_millis(1));
        self
    }

    /// How often [`serve`](Drainer::serve) sets the outbox gauges from a count of its scope
    /// (default `Duration::ZERO`: never). Each count is two queries of the store, and the
    /// count of statuses reads the whole outbox table (delivered rows included, until purged):
    /// on SQLite it runs on the store's one outbox thread, between claims and outcome writes,
    /// so keep it to one drainer per store (the gauges have no scope label) and to an interval
    /// of tens of seconds on a large outbox.
    pub fn metrics_interval(mut self, every: Duration) -> Self {
        self.metrics_every = every;
        self
    }

    /// The drainer, after checking its delivery options, as
    /// [`RuntimeBuilder::build`](crate::RuntimeBuilder::build) checks a runtime's.
    ///
    /// # Errors
    /// [`BuildError::Delivery`] when the [delivery options](DrainerBuilder::delivery) cannot
    /// deliver as given (an attempt timeout of zero).
    pub fn build(self) -> Result<Drainer, BuildError> {
        crate::model::telemetry::describe();
        self.options.check()?;
        Ok(Drainer {
            outbox: self.outbox,
            dispatcher: self.dispatcher,
            scope: self.scope,
            lease: self.options.lease.unwrap_or(crate::model::delivery::DEFAULT_LEASE),
            options: self.options,
            poll: self.poll,
            metrics_every: self.metrics_every,
            owner: crate::outbox::owner::drainer_owner(),
            clock: Clock::new(),
            stop: StopHandle::default(),
        })
    }
}

impl std::fmt::Debug for Drainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drainer")
            .field("store", &self.outbox.describe())
            .field("scope", &self.scope)
            .field("owner", &self.owner)
            .field("lease", &self.lease)
            .finish()
    }
}

/// A drain of its own failed: [`Drainer::flush`], [`settle`](Drainer::settle) or
/// [`serve`](Drainer::serve), or [`Runtime::flush`](crate::Runtime::flush) and
/// [`settle`](crate::Runtime::settle).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlushError {
    /// No dispatcher is configured, so nothing can be delivered.
    #[error("no dispatcher is configured; add one with RuntimeBuilder::dispatcher")]
    NoDispatcher,
    /// A delivery failed (fail-loud delivery); it is recorded in the ledger.
    #[error(transparent)]
    Delivery(#[from] DeliveryFailure),
    /// The durable store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<DrainError> for FlushError {
    fn from(e: DrainError) -> Self {
        match e {
            DrainError::Delivery(f) => FlushError::Delivery(f),
            DrainError::Store(e) => FlushError::Store(e),
        }
    }
}

/// The longest gauge period kept as given: about 30 years.
const FAR_PERIOD: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// Sets the outbox gauges of the metrics recorder from a count of `scope` every `every` (never,
/// if zero), until dropped; a count that fails is logged and the gauges keep their values.
pub(crate) async fn record_gauges(
    outbox: Arc<dyn OutboxStore>,
    scope: Scope,
    every: Duration,
) -> std::convert::Infallible {
    if every.is_zero() {
        return std::future::pending().await;
    }
    let ledger = crate::Ledger::new(outbox).scoped(scope);
    // A period too long to represent (`Duration::MAX`) is a very long one, not an overflow.
    let mut ticks = tokio::time::interval(every.min(FAR_PERIOD));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Err(e) = ledger.record_metrics().await {
            tracing::debug!(error = %e, "the outbox could not be counted for its gauges");
        }
    }
}
