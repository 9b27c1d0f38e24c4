//! The dispatcher: one `tools/call` per delivery attempt.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reactifact_core::runtime::TraceParent;
use reactifact_core::{DispatchError, Dispatcher, Intent};
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Client, Url};
use rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use rmcp::ServiceError;
use serde_json::{Map, Value};

use crate::builder::McpBuilder;
use crate::classify::Classification;
use crate::error::{snippet, McpError};
use crate::payload::to_arguments;
use crate::read::ToolAnswer;
use crate::session::Sessions;

/// The `_meta` entry carrying the intent's idempotency key (a string).
pub const IDEMPOTENCY_KEY: &str = "io.reactifact/idempotency-key";
/// The `_meta` entry carrying the intent's action kind (a string).
pub const KIND_META: &str = "io.reactifact/kind";
/// The `_meta` entry carrying the attempt number (an integer): 1 for the first delivery, 2
/// after one failure, …
pub const ATTEMPT_META: &str = "io.reactifact/attempt";
/// The `_meta` entry carrying the W3C trace context (MCP's reserved `traceparent`): the
/// delivery attempt's span, in the trace of the produce run that committed the intent
/// ([`Intent::trace_parent`]).
pub const TRACEPARENT: &str = "traceparent";

/// A [`Dispatcher`] that delivers each intent as a call of a tool on an MCP server, over
/// streamable HTTP, with the idempotency key in the request's `_meta`.
///
/// Built with [`McpDispatcher::builder`]; cheap to clone (clones share the session). It
/// connects on its first call, and opens a new session after one broke. It also calls
/// read-only tools as recorded calls ([`McpDispatcher::call_read_only`]). See the
/// [crate documentation](crate) for what it sends and how outcomes are classified.
#[derive(Clone)]
pub struct McpDispatcher {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) server: Server,
    pub(crate) routes: BTreeMap<String, String>,
    pub(crate) routes_only: bool,
    pub(crate) headers: HashMap<HeaderName, HeaderValue>,
    pub(crate) bearer: Option<String>,
    pub(crate) timeout: Duration,
    pub(crate) client: Option<Client>,
    pub(crate) tool_error: Classification,
    /// Codes classified otherwise than by default.
    pub(crate) codes: BTreeMap<i32, Classification>,
    pub(crate) sessions: Sessions,
}

/// The server's URL and the form of it that messages show.
pub(crate) struct Server {
    pub(crate) url: Url,
    pub(crate) shown: String,
}

/// One delivery attempt, as the dispatcher needs it: usually taken from an [`Intent`]
/// (`Outgoing::from(&intent)`), or built by hand where there is none (a typed handler that
/// forwards to an MCP tool, a test).
#[derive(Clone, Copy, Debug)]
pub struct Outgoing<'a> {
    /// The action kind; selects the tool and is sent as [`KIND_META`].
    pub kind: &'a str,
    /// The idempotency key, sent as [`IDEMPOTENCY_KEY`].
    pub key: &'a str,
    /// The attempt number, sent as [`ATTEMPT_META`].
    pub attempt: u32,
    /// The payload's rmp-serde bytes (named fields); sent as the tool's arguments (a JSON
    /// object).
    pub payload: &'a [u8],
    /// The W3C trace context, sent as [`TRACEPARENT`] (none sent if `None`).
    pub traceparent: Option<TraceParent>,
}

impl<'a> From<&'a Intent> for Outgoing<'a> {
    fn from(intent: &'a Intent) -> Self {
        Outgoing {
            kind: intent.kind(),
            key: intent.key().as_str(),
            attempt: intent.attempt(),
            payload: intent.payload_bytes(),
            traceparent: intent.trace_parent().copied(),
        }
    }
}

/// Shows the URL as messages do and header names only: both may hold secrets.
impl fmt::Debug for McpDispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        let headers: Vec<&str> = inner.headers.keys().map(|name| name.as_str()).collect();
        f.debug_struct("McpDispatcher")
            .field("url", &inner.server.shown)
            .field("routes", &inner.routes)
            .field("routes_only", &inner.routes_only)
            .field("headers", &headers)
            .field("bearer_token", &inner.bearer.is_some())
            .field("timeout", &inner.timeout)
            .field("on_tool_error", &inner.tool_error)
            .field("classify_code", &inner.codes)
            .finish_non_exhaustive()
    }
}

impl McpDispatcher {
    /// A builder for a dispatcher that calls the MCP server at `url` (its streamable HTTP
    /// endpoint, e.g. `http://tools.internal:8000/mcp`).
    pub fn builder(url: impl Into<String>) -> McpBuilder {
        McpBuilder::new(url.into())
    }

    /// A dispatcher that calls the server at `url`, each kind's tool named like the kind, with
    /// the default settings.
    pub fn new(url: impl Into<String>) -> Result<Self, crate::BuildError> {
        Self::builder(url).build()
    }

    pub(crate) fn from_inner(inner: Inner) -> Self {
        McpDispatcher { inner: Arc::new(inner) }
    }

    /// The server's URL.
    pub fn url(&self) -> &Url {
        &self.inner.server.url
    }

    /// The tool intents of `kind` call: the kind's route, else the kind itself — or `None`
    /// for a kind without a route when [`routes_only`](McpBuilder::routes_only) is set.
    pub fn tool_for<'k>(&'k self, kind: &'k str) -> Option<&'k str> {
        match self.inner.routes.get(kind) {
            Some(tool) => Some(tool),
            None if self.inner.routes_only => None,
            None => Some(kind),
        }
    }

    /// The timeout of one tool call (and of opening a session).
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// How a JSON-RPC error `code` is classified: as set with
    /// [`McpBuilder::classify_code`], else [`Classification::default_for_code`].
    pub fn classification(&self, code: i32) -> Classification {
        self.inner.classification(code)
    }

    /// Calls one delivery attempt's tool and classifies the outcome: `Ok` for a result (and
    /// for an error classified as delivered), otherwise the [`McpError`] saying why.
    /// [`Dispatcher::dispatch`] is this plus [`McpError::into_dispatch_error`].
    pub async fn send(&self, outgoing: Outgoing<'_>) -> Result<(), McpError> {
        let Outgoing {
            kind,
            key,
            attempt,
            payload,
            traceparent,
        } = outgoing;
        let inner = &self.inner;
        let tool = self
            .tool_for(kind)
            .ok_or_else(|| McpError::NoRoute { kind: kind.to_owned() })?;
        let arguments = to_arguments(payload).map_err(|reason| McpError::Payload {
            key: key.to_owned(),
            kind: kind.to_owned(),
            reason,
        })?;
        let mut meta = RequestMetaObject::new();
        meta.insert(IDEMPOTENCY_KEY.to_owned(), Value::from(key));
        meta.insert(KIND_META.to_owned(), Value::from(kind));
        meta.insert(ATTEMPT_META.to_owned(), Value::from(attempt));
        if let Some(trace) = traceparent {
            meta.set_traceparent(trace.to_string());
        }
        let url = inner.server.shown.as_str();
        let outcome = match inner.call(tool, arguments, Some(meta)).await {
            Ok(result) if result.is_error == Some(true) => match inner.tool_error {
                Classification::Delivered => Ok(()),
                class => Err(McpError::Tool {
                    url: url.to_owned(),
                    tool: tool.to_owned(),
                    text: snippet(&text_of(&result).join(" ")),
                    retryable: class == Classification::Retryable,
                }),
            },
            Ok(_) => Ok(()),
            Err(McpError::Rpc { code, .. }) if inner.classification(code) == Classification::Delivered => Ok(()),
            Err(error) => Err(error),
        };
        match &outcome {
            Ok(()) => tracing::debug!(kind, key, attempt, url, tool, "mcp tool call delivered"),
            Err(error) => tracing::debug!(kind, key, attempt, url, tool, error = %error, "mcp tool call failed"),
        }
        outcome
    }

    /// Calls `tool` with `arguments`, outside any produce and without recording: the answer,
    /// or the [`McpError`] saying why there is none (a result with `isError: true` is
    /// [`McpError::Tool`]). Inside a produce, use [`call_read_only`](Self::call_read_only).
    pub async fn call_tool(&self, tool: &str, arguments: Map<String, Value>) -> Result<ToolAnswer, McpError> {
        let inner = &self.inner;
        let result = inner.call(tool, arguments, None).await?;
        if result.is_error == Some(true) {
            return Err(McpError::Tool {
                url: inner.server.shown.clone(),
                tool: tool.to_owned(),
                text: snippet(&text_of(&result).join(" ")),
                retryable: inner.tool_error == Classification::Retryable,
            });
        }
        Ok(ToolAnswer {
            text: text_of(&result).into_iter().map(str::to_owned).collect(),
            structured: result.structured_content,
        })
    }
}

impl Inner {
    fn classification(&self, code: i32) -> Classification {
        self.codes
            .get(&code)
            .copied()
            .unwrap_or_else(|| Classification::default_for_code(code))
    }

    /// `text` with the server URL's secrets hidden (the HTTP client's messages quote the URL).
    pub(crate) fn scrub(&self, text: &str) -> String {
        let url = &self.server.url;
        let mut text = text.replace(url.as_str(), &self.server.shown);
        if let Some(password) = url.password().filter(|password| !password.is_empty()) {
            text = text.replace(password, "***");
        }
        if let Some(query) = url.query().filter(|query| !query.is_empty()) {
            text = text.replace(query, "…");
        }
        text
    }

    /// One `tools/call`, within the timeout, on the open session (or a new one). A session
    /// that timed out or broke is dropped, so the next call opens a new one.
    async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        meta: Option<RequestMetaObject>,
    ) -> Result<CallToolResult, McpError> {
        let session = self.session().await?;
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        params.meta = meta;
        let url = || self.server.shown.clone();
        let answered = tokio::time::timeout(self.timeout, session.peer().call_tool(params)).await;
        let error = match answered {
            Ok(Ok(result)) => return Ok(result),
            Ok(Err(error)) => error,
            Err(_) => {
                // The session may be dead without a word (a server gone silent): start over.
                self.forget(&session).await;
                return Err(McpError::Timeout {
                    url: url(),
                    tool: tool.to_owned(),
                    after: self.timeout,
                });
            }
        };
        Err(match error {
            ServiceError::McpError(data) => McpError::Rpc {
                url: url(),
                tool: tool.to_owned(),
                code: data.code.0,
                message: snippet(&data.message),
                retryable: self.classification(data.code.0) == Classification::Retryable,
            },
            ServiceError::Timeout { timeout } => McpError::Timeout {
                url: url(),
                tool: tool.to_owned(),
                after: timeout,
            },
            error @ ServiceError::UnexpectedResponse | error @ ServiceError::InputRequiredRoundsExceeded { .. } => {
                McpError::Unexpected {
                    url: url(),
                    tool: tool.to_owned(),
                    reason: self.scrub(&error.to_string()),
                }
            }
            error if error.auth_challenge().is_some() => {
                self.forget(&session).await;
                McpError::Unauthorized {
                    url: url(),
                    reason: self.scrub(&error.to_string()),
                }
            }
            error => {
                // A closed transport, a failed send, a cancelled request: the session is
                // suspect.
                self.forget(&session).await;
                McpError::Transport {
                    url: url(),
                    tool: tool.to_owned(),
                    reason: self.scrub(&error_chain(&error)),
                }
            }
        })
    }
}

/// The text blocks of a result.
fn text_of(result: &CallToolResult) -> Vec<&str> {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|text| text.text.as_str()))
        .collect()
}

/// An error's message with its sources', `: `-separated.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = cause.source();
    }
    text
}

impl Dispatcher for McpDispatcher {
    async fn dispatch(&self, intent: Intent) -> Result<(), DispatchError> {
        self.send(Outgoing::from(&intent))
            .await
            .map_err(McpError::into_dispatch_error)
    }
}
