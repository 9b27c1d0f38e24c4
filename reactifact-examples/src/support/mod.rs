//! The model clients of the support-agent example: tickets arrive, a triage produce asks a
//! model to classify each ticket and to draft a reply.
//!
//! A produce holds an `Arc<dyn` [`Model`]`>` and records each [`CompletionRequest`] with the
//! call.
//!
//! - [`model`]: the request, the answer, the error and the [`Model`] trait.

pub mod model;

pub use model::{Completion, CompletionFuture, CompletionRequest, Model, ModelError};
