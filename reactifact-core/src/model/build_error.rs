//! Why a runtime or a drainer could not be built from its builder.

use crate::model::artifact::Kind;

/// Building a [`Runtime`](crate::Runtime) or a [`Drainer`](crate::Drainer) was refused: the
/// runtime's registrations are ambiguous, or the delivery options cannot deliver as given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Two distinct Rust types claim one kind, so each would trigger the other's produces
    /// and be decoded as the other. Kinds default to the snake_case type name, so
    /// `billing::Invoice` and `tax::Invoice` collide unless one is given a kind of its own.
    #[error("kind `{kind}` is claimed by two types, `{first}` and `{second}`; give one of them a kind of its own with `#[artifact(kind = \"...\")]`")]
    KindCollision {
        /// The kind both claim.
        kind: Kind,
        /// The type registered first.
        first: &'static str,
        /// The other type.
        second: &'static str,
    },
    /// Two agents share a name; replay and provenance find an agent by its name.
    #[error("two agents are named `{agent}`; replay and provenance find agents by name, so give each its own")]
    DuplicateAgent {
        /// The name.
        agent: String,
    },
    /// An agent registers two produces under one name; replay and provenance find a produce
    /// by its agent's name and its own.
    #[error("agent `{agent}` registers two produces named `{produce}`; replay and provenance find produces by name, so give each its own (`#[produce(.., name = \"...\")]`)")]
    DuplicateProduce {
        /// The agent.
        agent: String,
        /// The produce's name.
        produce: String,
    },
    /// A produce's join is incomplete: parts without a key for the trigger, or a key
    /// without parts (see [`Produce::join`](crate::Produce::join)).
    #[error("produce `{produce}` (agent `{agent}`) {problem}")]
    Join {
        /// The agent.
        agent: String,
        /// The produce's name.
        produce: String,
        /// What is missing.
        problem: &'static str,
    },
    /// A produce uses a resource no one registered with [`RuntimeBuilder::resource`](crate::RuntimeBuilder::resource).
    #[error("produce `{produce}` (agent `{agent}`) uses resource `{resource}`, which is not registered; register one with RuntimeBuilder::resource")]
    MissingResource {
        /// The agent.
        agent: String,
        /// The produce's name.
        produce: String,
        /// The resource's type name.
        resource: &'static str,
    },
    /// The delivery options ([`DeliveryOptions`](crate::DeliveryOptions)) cannot deliver
    /// as given: an attempt timeout of zero, which would cancel every attempt.
    #[error("the delivery options are refused: {problem}")]
    #[non_exhaustive]
    Delivery {
        /// What is wrong, and the fix.
        problem: String,
    },
}
