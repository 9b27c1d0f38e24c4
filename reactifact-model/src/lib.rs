//! An OpenAI-compatible chat completions client for reactifact produces.
//!
//! - [`ChatRequest`]: the model, the [`Message`]s, the [`Tool`]s the model may call, and the
//!   sampling options; every type serializes exactly as the OpenAI API expects and encodes
//!   equal requests to equal bytes, so a request identifies a recorded call.
//! - [`ChatAnswer`]: the text, the [`ToolCall`]s (the model's id, the tool's name and the raw
//!   JSON arguments), the [`FinishReason`] and the [`TokenUsage`].
//! - [`ChatClient`]: `POST {base_url}/chat/completions`, configured by
//!   [`ChatClient::new`] or by the environment ([`ChatClient::from_env`]: `OPENAI_BASE_URL`,
//!   `OPENAI_API_KEY`). It retries what reactifact-webhook's
//!   [`Classification`](reactifact_webhook::Classification) calls retryable (408, 409, 429,
//!   5xx) and transport failures, with exponential backoff and never sooner than the answer's
//!   `Retry-After` ([`RetryPolicy`]).
//! - [`ChatClient::complete_recorded`]: the way to ask a model from a produce — a recorded,
//!   metered call ([`ProduceCall::record_metered`](reactifact_core::ProduceCall::record_metered)),
//!   so that a retried generation, a resume and a replay get the answer back without calling.
//! - `stand_in` (the `stand-in` feature): a local chat completions server for tests and
//!   examples, answering through a function of the request and counting what it received.
//!
//! # TLS
//!
//! `https://` base URLs (OpenAI's) need the crate feature `rustls` (off by default, to keep
//! builds lean): `reactifact-model = { version = "0.1", features = ["rustls"] }`. Without it
//! [`ChatClient::new`] refuses an `https://` URL with [`BuildError::UnsupportedScheme`].
//!
//! See `docs/models.md` for the configuration of a real provider.

mod answer;
mod client;
mod endpoint;
mod error;
mod recorded;
mod request;
mod retry;
#[cfg(feature = "stand-in")]
pub mod stand_in;
mod tool_call;

pub use answer::{ChatAnswer, FinishReason, TokenUsage};
pub use client::{ChatClient, API_KEY_VAR, BASE_URL_VAR, DEFAULT_BASE_URL, DEFAULT_TIMEOUT, MAX_ANSWER_BYTES};
pub use error::{BuildError, ModelError, ERROR_BODY_BYTES};
pub use request::{ChatRequest, Message, Tool, ToolChoice};
pub use retry::RetryPolicy;
pub use tool_call::ToolCall;

/// The examples of the models guide (`docs/models.md`), compiled and run as doctests.
#[doc = include_str!("../../docs/models.md")]
#[cfg(doctest)]
pub struct ModelsGuideDoctests;
