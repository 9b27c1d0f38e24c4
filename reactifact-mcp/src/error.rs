//! Errors: building a dispatcher ([`BuildError`]) and calling a tool ([`McpError`]).

use std::time::Duration;

use reactifact_core::DispatchError;

/// Why one tool call failed. Every [`DispatchError`] the dispatcher returns wraps one of these;
/// get it back with `dispatch_error.as_error().downcast_ref::<McpError>()`.
///
/// Messages name the server URL (with any password and query string hidden) and the tool,
/// never the payload or the arguments.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// No session could be opened: the connection was refused, the server did not answer the
    /// `initialize` handshake within the timeout, or refused it.
    #[error("connecting to mcp server {url} failed: {reason}")]
    Connect {
        /// The server URL, as shown in messages.
        url: String,
        /// What failed.
        reason: String,
    },
    /// The server refused the client for want of authorization (HTTP 401 or 403): set or
    /// renew the token ([`McpBuilder::bearer_token`](crate::McpBuilder::bearer_token)).
    #[error("mcp server {url} requires authorization: {reason}")]
    Unauthorized {
        /// The server URL, as shown in messages.
        url: String,
        /// What the MCP client reported.
        reason: String,
    },
    /// The server did not answer the tool call within the timeout.
    #[error("mcp server {url} did not answer tool `{tool}` within {after:?}")]
    Timeout {
        /// The server URL, as shown in messages.
        url: String,
        /// The tool called.
        tool: String,
        /// The call timeout.
        after: Duration,
    },
    /// The call was sent, or was being sent, and its answer never came: the connection broke,
    /// the session closed, the server went away. The tool may or may not have run.
    #[error("calling tool `{tool}` on mcp server {url} failed: {reason}")]
    Transport {
        /// The server URL, as shown in messages.
        url: String,
        /// The tool called.
        tool: String,
        /// What the MCP client reported.
        reason: String,
    },
    /// The server answered with a JSON-RPC error (an unknown tool, invalid arguments, an
    /// internal error).
    #[error("mcp server {url} refused tool `{tool}`: json-rpc error {code}: {message}")]
    Rpc {
        /// The server URL, as shown in messages.
        url: String,
        /// The tool called.
        tool: String,
        /// The JSON-RPC error code.
        code: i32,
        /// The error's message, cut to its first 200 characters.
        message: String,
        /// Whether the code is classified as retryable (see [`Classification`](crate::Classification)).
        retryable: bool,
    },
    /// The tool ran and reported a failure: a result with `isError: true`.
    #[error("tool `{tool}` on mcp server {url} reported an error{}", text_suffix(text))]
    Tool {
        /// The server URL, as shown in messages.
        url: String,
        /// The tool called.
        tool: String,
        /// The result's text content, cut to its first 200 characters (empty if it had none).
        text: String,
        /// Whether tool errors are classified as retryable
        /// ([`McpBuilder::on_tool_error`](crate::McpBuilder::on_tool_error)).
        retryable: bool,
    },
    /// The server answered with something that is not a tool's result (it asked for user
    /// input, or started a task), which a dispatcher cannot act on.
    #[error("mcp server {url} answered tool `{tool}` with something other than a result: {reason}")]
    Unexpected {
        /// The server URL, as shown in messages.
        url: String,
        /// The tool called.
        tool: String,
        /// What the MCP client reported.
        reason: String,
    },
    /// The intent's kind has no route and the dispatcher calls only routed kinds
    /// ([`McpBuilder::routes_only`](crate::McpBuilder::routes_only)). The intent is held, not
    /// failed: add the route and `retry` it.
    #[error("no mcp tool for action kind `{kind}`: the dispatcher calls routed kinds only")]
    NoRoute {
        /// The action kind.
        kind: String,
    },
    /// The payload is not valid rmp-serde, or not a JSON object (a tool's arguments are an
    /// object: a struct, or a map with string keys).
    #[error("the payload of action `{key}` ({kind}) cannot be sent as tool arguments: {reason}")]
    Payload {
        /// The action's idempotency key.
        key: String,
        /// The action kind.
        kind: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The arguments of a read-only call are not a JSON object.
    #[error("the arguments of tool `{tool}` cannot be sent: {reason}")]
    Arguments {
        /// The tool called.
        tool: String,
        /// What is wrong with them.
        reason: String,
    },
}

impl McpError {
    /// Whether trying again can help: connection failures, timeouts, broken sessions, the
    /// JSON-RPC codes classified as retryable (by default internal errors, -32603, and the
    /// server-defined range -32099..=-32000 except -32002 and -32042), and tool errors if
    /// [`on_tool_error`](crate::McpBuilder::on_tool_error) says so. A kind without a route is
    /// held; everything else is permanent.
    pub fn is_retryable(&self) -> bool {
        match self {
            McpError::Connect { .. } | McpError::Timeout { .. } | McpError::Transport { .. } => true,
            McpError::Rpc { retryable, .. } | McpError::Tool { retryable, .. } => *retryable,
            McpError::Unauthorized { .. }
            | McpError::Unexpected { .. }
            | McpError::NoRoute { .. }
            | McpError::Payload { .. }
            | McpError::Arguments { .. } => false,
        }
    }

    /// The JSON-RPC error code the server answered, if it answered with one.
    pub fn code(&self) -> Option<i32> {
        match self {
            McpError::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The delivery outcome: a retryable [`DispatchError`] if [`is_retryable`](Self::is_retryable),
    /// [`no_route`](DispatchError::no_route) for [`McpError::NoRoute`] (the intent is held),
    /// else permanent.
    pub fn into_dispatch_error(self) -> DispatchError {
        if matches!(self, McpError::NoRoute { .. }) {
            DispatchError::no_route(self)
        } else if self.is_retryable() {
            DispatchError::retryable(self)
        } else {
            DispatchError::permanent(self)
        }
    }
}

fn text_suffix(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text:?}")
    }
}

/// At most 200 characters of `text`, whitespace collapsed, for a message.
pub(crate) fn snippet(text: &str) -> String {
    const CHARS: usize = 200;
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match collapsed.char_indices().nth(CHARS) {
        Some((cut, _)) => format!("{}…", &collapsed[..cut]),
        None => collapsed,
    }
}

/// Building an [`McpDispatcher`](crate::McpDispatcher) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The server URL does not parse.
    #[error("invalid mcp server URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What the parser reported.
        reason: String,
    },
    /// The URL's scheme is not `http`, or is `https` without TLS support.
    #[error("mcp server URL {url}: {reason}")]
    UnsupportedScheme {
        /// The URL, as shown in messages.
        url: String,
        /// Why the scheme is refused and what to do.
        reason: &'static str,
    },
    /// An extra header's name or value is not valid HTTP.
    #[error("invalid header `{name}`: {reason}")]
    InvalidHeader {
        /// The header name as given.
        name: String,
        /// What was wrong with it.
        reason: String,
    },
    /// An extra header would replace one the MCP transport sets itself (`Accept`,
    /// `Content-Type`, `Mcp-Session-Id`, `Mcp-Protocol-Version`, `Last-Event-Id`,
    /// `Authorization`: use [`bearer_token`](crate::McpBuilder::bearer_token) for the last).
    #[error("header `{name}` is set by the mcp transport and cannot be overridden")]
    ReservedHeader {
        /// The header name as given.
        name: String,
    },
    /// The HTTP client could not be built.
    #[error("building the HTTP client failed: {reason}")]
    Client {
        /// What the client reported.
        reason: String,
    },
}
