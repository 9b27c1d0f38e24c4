//! A reactifact [`Dispatcher`](reactifact_core::Dispatcher) that delivers each intent as an
//! MCP tool call, built on the official Rust MCP SDK ([`rmcp`]).
//!
//! Placeholder: the full documentation follows.

mod builder;
mod classify;
mod dispatcher;
mod error;
mod payload;
mod read;
mod session;

pub use builder::{McpBuilder, DEFAULT_TIMEOUT};
pub use classify::{
    Classification, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, RESOURCE_NOT_FOUND,
    URL_ELICITATION_REQUIRED,
};
pub use dispatcher::{McpDispatcher, Outgoing, ATTEMPT_META, IDEMPOTENCY_KEY, KIND_META, TRACEPARENT};
pub use error::{BuildError, McpError};
pub use read::ToolAnswer;
/// The HTTP client crate, re-exported for [`McpBuilder::client`].
pub use reqwest;
/// The MCP SDK, re-exported at the version this crate uses.
pub use rmcp;
