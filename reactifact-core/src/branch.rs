//! Branches of a context and their merges: what [`Context::fork`](crate::Context::fork),
//! [`diff`](crate::Context::diff) and [`merge`](crate::Context::merge) take and answer.

pub use crate::model::field_diff::FieldDiff;
pub use crate::session::branch::{
    ArtifactState, Conflict, Diff, ForkError, MergeError, MergeReport, Resolution, Side, Updated,
};
