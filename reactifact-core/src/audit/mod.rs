//! Auditing the log: what [`Context::verify`](crate::Context::verify),
//! [`replay`](crate::Context::replay), [`provenance`](crate::Context::provenance) and
//! [`export_audit`](crate::Context::export_audit) answer, and the values of the log they read — commits,
//! runs, events, operations and hashes.

pub(crate) mod export;
pub(crate) mod inspect;
pub(crate) mod provenance;
pub(crate) mod replay;
pub(crate) mod verify;

pub use crate::model::event::{Event, EventKind};
pub use crate::model::hash::{CommitHash, ContentHash, StateHash};
pub use crate::model::patch::{Op, PutMode};
pub use crate::state::commit::{Commit, Read, RunRecord, Runs, TriggerRef};
pub use crate::state::refold::VerifyError;
pub use inspect::StoredArtifact;
pub use provenance::{content_key, Cause, Provenance};
pub use replay::{testing, Difference, Divergence, ReplayError, ReplayReport};
pub use verify::{verify_log, TimeTravelError, VerifyReport};
