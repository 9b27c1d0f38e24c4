//! The model clients of the support-agent example: tickets arrive, a triage produce asks a
//! model to classify each ticket and to draft a reply.
//!
//! A produce holds an `Arc<dyn` [`Model`]`>` and records each [`CompletionRequest`] with the
//! call; the program chooses the client:
//!
//! - [`model`]: the request, the answer, the error and the [`Model`] trait.
//! - [`stand_in`]: [`StandIn`], a deterministic model (the default of the example), the two
//!   tasks' system prompts and the [`Category`] a triage answers.
//! - `openai` (with the `openai` feature): `OpenAiCompatible`, a client for an
//!   OpenAI-compatible chat completions API over HTTP.

pub mod model;
#[cfg(feature = "openai")]
pub mod openai;
pub mod stand_in;

pub use model::{Completion, CompletionFuture, CompletionRequest, Model, ModelError};
#[cfg(feature = "openai")]
pub use openai::OpenAiCompatible;
pub use stand_in::{draft_request, triage_request, Category, StandIn, DRAFT_SYSTEM, TRIAGE_SYSTEM};
