//! Every error of the crate, one enum per operation (each also named where its operation is
//! documented). All are `std::error::Error + Send + Sync`, with lowercase messages that name
//! the failing id, key or path.

pub use crate::audit::replay::ReplayError;
pub use crate::audit::verify::TimeTravelError;
pub use crate::model::artifact::ReadError;
pub use crate::model::build_error::BuildError;
pub use crate::model::patch::EffectError;
pub use crate::model::trace::TraceParentError;
pub use crate::outbox::dispatcher::BoxError;
pub use crate::outbox::drain::DeliveryFailure;
pub use crate::outbox::drainer::FlushError;
pub use crate::run::ask::AnswerError;
pub use crate::run::calls::{CallError, MissKind, ReplayMiss};
pub use crate::run::handle::SubmitError;
pub use crate::run::produce::{ProduceFailure, RunFailure};
pub use crate::run::runtime::RunError;
pub use crate::run::tools::ToolError;
pub use crate::session::branch::{ForkError, MergeError};
pub use crate::session::connect::ConnectError;
pub use crate::session::context::WriteError;
pub use crate::session::rearm::RearmError;
pub use crate::state::commit::CommitError;
pub use crate::state::refold::VerifyError;
pub use crate::store::outbox::{ApprovalError, CancelError, RetryError};
pub use crate::store::store_url::StoreUrlError;
pub use crate::store::{BackendError, OpenError, StoreError};
