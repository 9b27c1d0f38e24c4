//! A reactifact [`Dispatcher`](reactifact_core::Dispatcher) that delivers each intent as an
//! MCP tool call, built on the official Rust MCP SDK ([`rmcp`]), and calls read-only MCP tools
//! as recorded calls.
//!
//! [`McpDispatcher`] talks to one MCP server over the streamable HTTP transport. It opens a
//! session on its first call (the `initialize` handshake), shares it between concurrent
//! calls, and opens a new one after it broke or timed out. Each delivery attempt is one
//! `tools/call`: the tool is the intent kind's route ([`McpBuilder::route`]), or the kind
//! itself; the arguments are the intent's payload, transcoded from rmp-serde to a JSON object;
//! and the request's `_meta` carries:
//!
//! | `_meta` entry | value |
//! | --- | --- |
//! | `io.reactifact/idempotency-key` | the intent's idempotency key (a string), identical on every attempt |
//! | `io.reactifact/kind` | the action kind (a string) |
//! | `io.reactifact/attempt` | the attempt number (an integer): 1, then 2 after one failure, … |
//! | `traceparent` | the attempt's W3C trace context ([`Intent::trace_parent`](reactifact_core::Intent::trace_parent)), MCP's reserved trace key |
//!
//! (plus the `progressToken` rmcp adds). Delivery is at-least-once; the effect is exactly-once
//! where the tool deduplicates on `io.reactifact/idempotency-key`.
//!
//! The outcome decides the delivery:
//!
//! - **a result**: delivered.
//! - **a result with `isError: true`**: the tool ran and refused — *permanent* by default
//!   (dead letter), or as [`McpBuilder::on_tool_error`] classifies it.
//! - **a JSON-RPC error**: by its code ([`Classification::default_for_code`]): internal error
//!   (-32603) and the server-defined range -32099..=-32000 are *retryable*, except -32002
//!   (resource not found) and -32042 (URL elicitation required); parse error, invalid request,
//!   method not found, invalid params (an unknown tool, arguments the tool refuses) and any
//!   other code are *permanent*. [`McpBuilder::classify_code`] changes one code's class.
//! - **no session** (connection refused, no answer to `initialize`), **a timeout**, **a
//!   dropped connection or closed session**: *retryable*; the next attempt opens a new
//!   session.
//! - **HTTP 401/403** (authorization required), **an answer that is not a result** (the
//!   server asks for user input or starts a task), **a payload that is not a JSON object**:
//!   *permanent*.
//! - **a kind without a route** when [`McpBuilder::routes_only`] is set: *held*
//!   ([`DispatchError::no_route`](reactifact_core::DispatchError::no_route)); add the route and
//!   `retry` it.
//!
//! Error messages name the server URL (password and query string hidden) and the tool, never
//! the payload. The [`McpError`] inside a `DispatchError` can be recovered with
//! `as_error().downcast_ref::<McpError>()`.
//!
//! # Read-only tools as recorded calls
//!
//! [`McpDispatcher::call_read_only`] calls a tool inside a produce through
//! [`ProduceCall::record`](reactifact_core::ProduceCall::record): a retried generation, a
//! resume and a replay get the recorded [`ToolAnswer`] back without calling the server again.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use reactifact_core::{Agent, Context, Produce, ProduceCall, ProduceError, Runtime};
//! use reactifact_mcp::McpDispatcher;
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Ticket { sku: String }
//! # impl reactifact_core::Artifact for Ticket { const KIND: &'static str = "ticket"; }
//!
//! # async fn run(ctx: Context) -> Result<(), Box<dyn std::error::Error>> {
//! let mcp = McpDispatcher::builder("http://tools.internal:8000/mcp")
//!     .route("email", "send_email") // intents of kind `email` call the tool `send_email`
//!     .bearer_token("s3cret")
//!     .timeout(Duration::from_secs(10))
//!     .build()?;
//!
//! // A produce that reads through a read-only tool, as a recorded call.
//! let tools = mcp.clone();
//! let check = Produce::new("check_stock", move |call: ProduceCall<Ticket>| {
//!     let tools = tools.clone();
//!     async move {
//!         #[derive(serde::Serialize)]
//!         struct Query<'a> { sku: &'a str }
//!         #[derive(serde::Deserialize)]
//!         struct Stock { stock: u32 }
//!         let answer = tools
//!             .call_read_only(&call, "stock", Query { sku: &call.trigger.data.sku })
//!             .await?;
//!         let stock: Stock = answer.decode().map_err(ProduceError::msg)?;
//!         // … write what the produce decided, with `stock.stock` in hand
//!         # let _ = stock.stock;
//!         Ok::<(), ProduceError>(())
//!     }
//! });
//!
//! let mut rt = Runtime::builder(ctx)
//!     .agent(Agent::new("support").produce(check))
//!     .dispatcher(mcp) // the outbox delivers intents as tool calls
//!     .build()?;
//! rt.run().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # TLS
//!
//! `https://` URLs need the crate feature `rustls` (off by default, to keep builds lean):
//! `reactifact-mcp = { version = "0.1", features = ["rustls"] }`. Without it, building a
//! dispatcher with an `https://` URL fails with [`BuildError::UnsupportedScheme`], unless you
//! pass a [`reqwest::Client`] of your own with [`McpBuilder::client`].

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

/// The examples of the MCP guide (`docs/mcp.md`), compiled as doctests.
#[doc = include_str!("../../docs/mcp.md")]
#[cfg(doctest)]
pub struct McpGuideDoctests;
