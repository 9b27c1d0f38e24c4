//! The names nearly every program of reactifact uses, for a glob import:
//!
//! ```
//! use reactifact_core::prelude::*;
//! # use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, Artifact)]
//! struct Order { email: String }
//!
//! #[produce(also_creates = [PendingAction])]
//! async fn confirm(call: ProduceCall<Order>) {
//!     call.effects.act("email", format!("confirm:{}", call.trigger.id), &call.trigger.data.email);
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut ctx = Context::new("shop");
//! ctx.create("order:1", Order { email: "ada@example.com".into() })?;
//! let mut rt = Runtime::builder(ctx)
//!     .agent(Agent::new("mailer").produce(confirm))
//!     .dispatcher(|intent: Intent| async move { Ok::<(), DispatchError>(()) })
//!     .delivery(DeliveryOptions::new().retry_policy(RetryPolicy::manual()))
//!     .build()?;
//! assert_eq!(rt.run().await?.deliveries.delivered, 1);
//! # Ok(()) }
//! ```
//!
//! Artifacts and produces (the [`produce`] attribute, the [`Artifact`] derive and trait, an
//! [`Agent`] of [`Produce`]s, what a run receives and writes through), the [`Context`] and the
//! [`Runtime`] that runs over it, intents and their delivery.

pub use crate::model::action::{Intent, PendingAction};
pub use crate::model::artifact::{Artifact, ArtifactId, Record};
pub use crate::model::timer::Timer;
pub use crate::outbox::dispatcher::{DispatchError, Dispatcher};
pub use crate::outbox::drain::RetryPolicy;
pub use crate::outbox::options::DeliveryOptions;
pub use crate::run::effects::Effects;
pub use crate::run::produce::{Agent, Produce, ProduceCall, ProduceError};
pub use crate::run::runtime::Runtime;
pub use crate::run::when;
pub use crate::session::context::Context;
pub use crate::state::snapshot::Snapshot;
pub use crate::store::outbox::Scope;
pub use reactifact_macros::{produce, Artifact};
