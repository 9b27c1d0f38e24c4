//! A serving runtime's own delivery: a drain of the runtime's session that runs beside its
//! turns, with the claims, leases and fencing of any other drain of the store.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tracing::Instrument;

use crate::model::stop::StopHandle;
use crate::outbox::dispatcher::ErasedDispatcher;
use crate::outbox::drain::{Clock, Drain, DrainError};
use crate::outbox::drainer::record_gauges;
use crate::outbox::options::DeliveryOptions;
use crate::outbox::report::DrainReport;
use crate::run::runtime::Runtime;
use crate::store::outbox::{OutboxStore, Scope};

/// What the drain beside a serving runtime's turns owns: its own copies of the runtime's
/// delivery options, so that it runs while the turns hold the runtime.
pub(crate) struct Beside {
    outbox: Arc<dyn OutboxStore>,
    scope: Scope,
    owner: Arc<str>,
    lease: Duration,
    dispatcher: Arc<dyn ErasedDispatcher>,
    config: DeliveryOptions,
    clock: Clock,
    /// Wakes the drain: the turns committed intents, or a handle approved or re-armed one.
    nudge: Arc<Notify>,
    /// Stops the drain once the turns have stopped.
    stop: StopHandle,
    /// How often it sets the outbox gauges of the session.
    metrics_every: Duration,
    span: tracing::Span,
}

impl Beside {
    /// The delivery of `rt`'s session; `None` without a dispatcher (a drainer elsewhere
    /// delivers it).
    pub(crate) fn of(rt: &Runtime) -> Option<Beside> {
        let dispatcher = rt.dispatcher.clone()?;
        Some(Beside {
            outbox: rt.context.outbox(),
            scope: Scope::session(rt.context.session()),
            owner: rt.owner.clone(),
            lease: rt.lease(),
            dispatcher,
            config: rt.delivery.clone(),
            clock: Clock::new(),
            nudge: rt.inbox.nudge.clone(),
            stop: StopHandle::default(),
            metrics_every: rt.metrics_every,
            span: tracing::info_span!("delivery", session = %rt.context.session()),
        })
    }

    /// Takes over the claims of provably dead owners of this host first (see
    /// `outbox::owner`), then delivers until [`stop`](Beside::stop): what is due, what the nudge points at, what
    /// falls due (retries, expired leases) and, every `poll`, what other processes committed;
    /// and sets the session's outbox gauges every metrics interval.
    /// A store that is briefly away is ridden out; deliveries running at the stop finish within
    /// the grace period.
    pub(crate) async fn serve(&self, poll: Duration, report: &mut DrainReport) -> Result<(), DrainError> {
        // A restart takes over at once what its dead predecessor on this host held, instead of
        // waiting out its leases.
        crate::outbox::owner::reclaim_dead_owners_or_warn(self.outbox.as_ref(), &self.scope)
            .instrument(self.span.clone())
            .await;
        let drain = Drain {
            outbox: self.outbox.as_ref(),
            scope: &self.scope,
            owner: &self.owner,
            lease: self.lease,
            dispatcher: &self.dispatcher,
            config: &self.config,
            clock: &self.clock,
            stop: &self.stop,
            deadline: None,
            nudge: Some(&self.nudge),
        };
        let served = drain.serve(report, Some(poll)).instrument(self.span.clone());
        let gauges = record_gauges(self.outbox.clone(), self.scope.clone(), self.metrics_every);
        tokio::select! {
            served = served => served.map(|_| ()),
            never = gauges => match never {},
        }
    }

    /// Asks [`serve`](Beside::serve) to stop.
    pub(crate) fn stop(&self) {
        self.stop.stop();
    }
}
