//! Model clients for a support agent: a model classifies each support ticket and drafts a
//! reply to it.
//!
//! Every client implements [`Model`], which is object safe, so a caller can hold an
//! `Arc<dyn Model>` and choose the client at start-up. A [`CompletionRequest`] is plain data
//! with its fields in a fixed order, so it can be recorded with a call and hashed.
//!
//! - [`model`]: the request, the answer, the error and the [`Model`] trait.
//! - [`stand_in`]: [`StandIn`], a deterministic model that needs no network, the two tasks'
//!   system prompts and requests, and the [`Category`] a triage answers.
//! - `openai` (with the `openai` feature): `OpenAiCompatible`, a client for an
//!   OpenAI-compatible chat completions API over HTTP (`https` with the `openai-tls`
//!   feature).

pub mod model;
#[cfg(feature = "openai")]
pub mod openai;
pub mod stand_in;

pub use model::{Completion, CompletionFuture, CompletionRequest, Model, ModelError};
#[cfg(feature = "openai")]
pub use openai::OpenAiCompatible;
pub use stand_in::{draft_request, triage_request, Category, StandIn, DRAFT_SYSTEM, TRIAGE_SYSTEM};
