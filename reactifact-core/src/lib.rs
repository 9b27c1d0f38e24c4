//! reactifact: reactive produces whose side effects are committed as intents and delivered
//! once per key by an outbox.
//!
//! A *produce* reacts to one artifact type and never performs I/O: it states what should
//! change through its [`Effects`] — artifacts to create or update, and intents
//! ([`PendingAction`]s with a stable idempotency key). The [`Runtime`] runs produces in
//! generations over a [`Context`], commits every generation atomically, and only then hands
//! each new intent to a [`Dispatcher`], once per key. Retries, re-derivations and replays
//! rebuild the same decision without sending twice.
//!
//! Delivery is at-least-once, and the effect is exactly-once where the receiver honours the
//! idempotency key.
//!
//! See `docs/concepts.md` and `docs/scheduler-semantics.md` in the repository for the
//! contract in full.
//!
//! The source is laid out by subsystem, imports running downward: `model/` (values with no
//! behaviour of their own, the process clock) ← `state/` (the versioned state, pure: live
//! state, snapshots, the commit log and its rules, the commit graph) ← `store/` (durable homes,
//! the outbox trait and its stores, the ledger handle, store URLs, the contract suite) ←
//! `session/` (the context of one session, which keeps its state in a store; branches and
//! merges; `connect`) ← `outbox/` (the drain, the drainer, dispatchers, the router) ← `run/`
//! (produces, effects, generations, the runtime, `serve`) ← `audit/` (verification, time
//! travel, replay, provenance, export). Each error enum lives beside the operation that raises
//! it and is re-exported here. `tests/layering.rs` fails on any import that runs upward.
//!
//! A tracked snapshot records a produce's reads through `state/snapshot.rs`'s `ReadLog`, which
//! the run's effects buffer implements; the log reads its older commits through a loader its
//! context passes. A runtime, not its context, holds the lease owner its commits claim under
//! (`outbox/owner.rs` reads it from `/proc`). No file of `outbox/` imports `run/`: the stop
//! signal and a panic's message are `model/`'s, a drain reports its own interruption, and
//! `FlushError` is the drainer's.

mod audit;
mod model;
mod outbox;
mod run;
mod session;
mod state;
mod store;

pub use audit::inspect::StoredArtifact;
pub use audit::provenance::{content_key, Provenance};
pub use audit::replay::{testing, Difference, Divergence, ReplayError, ReplayReport};
pub use audit::verify::{verify_log, TimeTravelError, VerifyReport};
pub use model::action::{ActionKey, Intent, Origin, Payload, PendingAction};
pub use model::artifact::{Artifact, ArtifactId, Generation, Kind, ReadError, Record, Version};
pub use model::call::{CallOutcome, RecordedCall, Usage};
pub use model::delivery::{
    reclaimed_error, taken_over_error, Attempt, AttemptOutcome, Decision, Delivery, DeliveryParts, DeliveryStatus,
    FenceToken, Lease, NewIntent, Verdict, ATTEMPTS_KEPT, FAR_FUTURE, MIN_LEASE,
};
pub use model::event::{Event, EventKind};
pub use model::field_diff::FieldDiff;
pub use model::hash::{CommitHash, ContentHash, StateHash};
pub use model::parked::{FailedRun, Parked, PARKED_ID_PREFIX, RETRY_TIMER_PREFIX};
pub use model::patch::{EffectError, Op, PutMode};
pub use model::question::Question;
pub use model::relation::Relation;
pub use model::stop::StopHandle;
pub use model::telemetry::metric;
pub use model::timer::Timer;
pub use model::trace::{set_trace_propagation, TraceParent, TraceParentError, TracePropagation};
pub use outbox::dispatcher::{BoxError, DispatchError, Dispatcher, MAX_RETRY_AFTER};
pub use outbox::drain::{DeliveryFailure, RetryPolicy};
pub use outbox::drainer::{Drainer, DrainerBuilder, FlushError};
pub use outbox::options::{DeliveryErrors, DeliveryOptions};
pub use outbox::owner::reclaim_dead_owners;
pub use outbox::report::DrainReport;
pub use outbox::router::{ActionCall, Router};
pub use reactifact_macros::{produce, Artifact};
pub use run::ask::AnswerError;
pub use run::calls::{CallError, MissKind, ReplayMiss};
pub use run::effects::{DeclaredOutput, Dynamic, Effects};
pub use run::handle::{RuntimeHandle, SubmitError, DEFAULT_INBOX_CAPACITY};
pub use run::produce::{
    Agent, IntoProduce, IntoProduceResult, Produce, ProduceCall, ProduceError, ProduceFailure, RunFailure,
};
pub use run::resources::{DeclaredResource, Resources};
pub use run::runtime::{
    Budget, BuildError, ProduceErrors, ProduceUsage, RunError, Runtime, RuntimeBuilder, TurnOutcome, TurnReport,
    MAX_CONFLICT_RETRIES,
};
pub use run::serve::ServeReport;
pub use run::when;
pub use session::branch::{
    ArtifactState, Conflict, Diff, ForkError, MergeError, MergeReport, Resolution, Side, Updated,
};
pub use session::connect::{connect, ConnectError};
pub use session::context::{Context, Transaction, WriteError};
pub use session::rearm::RearmError;
pub use state::commit::{Commit, CommitError, Read, RunRecord, Runs, TriggerRef};
pub use state::refold::VerifyError;
pub use state::snapshot::Snapshot;
pub use state::writes::Writes;
pub use store::ledger::Ledger;
pub use store::log_store::{Act, Append, CheckpointRow, ClaimOrder, CommitRow, LogStore, OutboxCheck, SessionRow};
pub use store::memory::MemoryOutbox;
pub use store::outbox::{
    check_decision, ApprovalError, BoxFuture, CancelError, ClaimRequest, Claimed, FailedAttempt, LedgerQuery,
    OutboxStore, Outcome, Page, PurgeFilter, Recorded, Recording, RetryError, Scope, StatusCounts, Wakeups,
};
pub use store::store_url::{redact_url, StoreUrl, StoreUrlError};
pub use store::{list_sessions, SessionInfo};
pub use store::{
    BackendError, OpenError, OpenOptions, SqliteOutbox, StoreError, Synchronous, DEFAULT_CHECKPOINT_EVERY,
};

/// The random number generator [`ProduceCall::rng`] returns is `fastrand`'s, re-exported so
/// that you can name its type without depending on the crate yourself.
pub use fastrand;

/// The store contract suite: checks every [`OutboxStore`] must pass, written once and run
/// against each store (memory, SQLite, and stores of other crates). Not public API; enabled by
/// the `store-contract` feature.
#[cfg(feature = "store-contract")]
#[doc(hidden)]
pub use store::contract as store_contract;

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The examples of the agents guide (`docs/agents.md`), compiled and run as doctests.
#[doc = include_str!("../../docs/agents.md")]
#[cfg(doctest)]
pub struct AgentsGuideDoctests;

/// Support for code generated by `reactifact-macros`. Not public API: it may change in any
/// release without notice.
#[doc(hidden)]
pub mod __private {
    pub use ::core::future::Future;
    pub use ::core::marker::PhantomData;
    pub use ::core::option::Option;
    pub use ::core::primitive::str;
    pub use ::core::result::Result;
    pub use ::std::boxed::Box;
    pub use ::std::vec::Vec;

    pub use crate::{
        Artifact, DeclaredOutput, DeclaredResource, EventKind, IntoProduce, IntoProduceResult, Kind, Produce,
        ProduceCall, ProduceError,
    };
}
