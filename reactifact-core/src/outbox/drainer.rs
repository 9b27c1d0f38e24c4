//! The standalone drainer: delivers the intents of a whole store (or of some sessions and
//! kinds), in any process, alongside any number of runtimes and other drainers.

use std::sync::Arc;
use std::time::Duration;

use crate::outbox::dispatcher::Dispatcher;
use crate::outbox::drain::{DrainReport, RetryPolicy};
use crate::run::runtime::{FlushError, StopHandle};
use crate::store::outbox::{OutboxStore, Scope};

/// Delivers the intents of a store: the outbox's drain without a runtime.
pub struct Drainer {
    _outbox: Arc<dyn OutboxStore>,
}

/// Builds a [`Drainer`].
pub struct DrainerBuilder {
    outbox: Arc<dyn OutboxStore>,
}

impl Drainer {
    /// A drainer of `outbox` that hands intents to `dispatcher`.
    pub fn builder(outbox: Arc<dyn OutboxStore>, dispatcher: impl Dispatcher) -> DrainerBuilder {
        let _ = dispatcher;
        DrainerBuilder { outbox }
    }

    /// Delivers every intent in scope that is due now.
    pub async fn flush(&self) -> Result<DrainReport, FlushError> {
        todo!()
    }

    /// Delivers until nothing in scope waits (sleeping until retries fall due and leases
    /// expire), or a stop.
    pub async fn settle(&self) -> Result<DrainReport, FlushError> {
        todo!()
    }

    /// Delivers until `stop` is requested, noticing new intents within the poll interval.
    pub async fn serve(&self, stop: StopHandle) -> Result<DrainReport, FlushError> {
        let _ = stop;
        todo!()
    }

    /// A handle that stops a running `flush`, `settle` or `serve`.
    pub fn stop_handle(&self) -> StopHandle {
        todo!()
    }
}

impl DrainerBuilder {
    /// Which intents it delivers (default: all of the store's).
    pub fn scope(self, scope: Scope) -> Self {
        let _ = scope;
        self
    }
    /// At most this many deliveries at once (default 64).
    pub fn concurrency(self, n: usize) -> Self {
        let _ = n;
        self
    }
    /// The lease of each claim (default 30 s), renewed every third of it.
    pub fn lease(self, lease: Duration) -> Self {
        let _ = lease;
        self
    }
    /// The retry policy.
    pub fn retry_policy(self, policy: RetryPolicy) -> Self {
        let _ = policy;
        self
    }
    /// The per-attempt timeout (default 30 s).
    pub fn timeout(self, timeout: Option<Duration>) -> Self {
        let _ = timeout;
        self
    }
    /// How often `serve` looks for new intents when nothing is due (default 250 ms).
    pub fn poll_interval(self, every: Duration) -> Self {
        let _ = every;
        self
    }
    /// The drainer.
    pub fn build(self) -> Drainer {
        Drainer { _outbox: self.outbox }
    }
}
