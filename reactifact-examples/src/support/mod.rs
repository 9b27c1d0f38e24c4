//! A support agent: a model classifies each support ticket and drafts a reply to it, and the
//! reply is emailed once, whatever happens (the `support-agent` program).
//!
//! Every client implements [`Model`], which is object safe, so a caller can hold an
//! `Arc<dyn Model>` and choose the client at start-up. A [`CompletionRequest`] is plain data
//! with its fields in a fixed order, so it can be recorded with a call and hashed.
//!
//! - [`agent`]: the agent itself: the [`Ticket`] and [`Triage`] artifacts, the model client
//!   and settings it uses as resources, and the produce [`triage`](fn@agent::triage).
//! - [`cases`]: the `support-agent` program's cases: first run, retry, crash-resume, replay
//!   and a token budget, each checking what it claims.
//! - [`model`]: the request, the answer, the error and the [`Model`] trait.
//! - [`stand_in`]: [`StandIn`], a deterministic model that needs no network, the two tasks'
//!   system prompts and requests, and the [`Category`] a triage answers.
//! - with the `openai` feature, reactifact-model's `ChatClient` (an OpenAI-compatible chat
//!   completions client; `https` with the `openai-tls` feature) is a [`Model`] too, and is
//!   re-exported here.

pub mod agent;
pub mod cases;
pub mod model;
pub mod stand_in;

pub use agent::{Email, ModelClient, ModelSettings, Ticket, Triage};
pub use model::{Completion, CompletionFuture, CompletionRequest, Model, ModelError};
#[cfg(feature = "openai")]
pub use reactifact_model::ChatClient;
pub use stand_in::{draft_request, triage_request, Category, StandIn, DRAFT_SYSTEM, TRIAGE_SYSTEM};
