//! Running produces: the runtime's builder and options, its reports, the handle that writes
//! into a serving runtime, resources, and the values a run meets (kinds, versions, relations,
//! usage, trace context).

pub use crate::model::action::{ActionKey, Origin, Payload};
pub use crate::model::artifact::{Generation, Kind, Version};
pub use crate::model::call::{CallOutcome, RecordedCall, Usage};
pub use crate::model::question::Question;
pub use crate::model::relation::Relation;
pub use crate::model::stop::StopHandle;
pub use crate::model::telemetry::metric;
pub use crate::model::trace::{set_trace_propagation, TraceParent, TracePropagation};
pub use crate::outbox::dispatcher::MAX_RETRY_AFTER;
pub use crate::outbox::drainer::{Drainer, DrainerBuilder};
pub use crate::outbox::options::{DeliveryErrors, DeliveryOptions};
pub use crate::outbox::router::{ActionCall, Router};
pub use crate::run::call_fn::CallFn;
pub use crate::run::effects::{DeclaredOutput, Dynamic, IntentBuilder};
pub use crate::run::handle::{RuntimeHandle, DEFAULT_INBOX_CAPACITY};
pub use crate::run::produce::{IntoProduce, IntoProduceResult};
pub use crate::run::resources::{DeclaredResource, Resources};
pub use crate::run::runtime::{
    Budget, ProduceErrors, ProduceUsage, RuntimeBuilder, TurnOutcome, TurnReport, MAX_CONFLICT_RETRIES,
};
pub use crate::run::serve::ServeReport;
pub use crate::session::context::Transaction;
pub use crate::state::writes::Writes;

/// The random number generator [`ProduceCall::rng`](crate::ProduceCall::rng) returns is
/// `fastrand`'s, re-exported so that you can name its type without depending on the crate
/// yourself.
pub use fastrand;
