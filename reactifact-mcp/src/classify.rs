//! Turning a tool call's outcome into a delivery outcome: delivered, retryable or permanent.

/// What an outcome means for the delivery: used for a result with `isError: true`
/// ([`McpBuilder::on_tool_error`](crate::McpBuilder::on_tool_error)) and for each JSON-RPC
/// error code ([`McpBuilder::classify_code`](crate::McpBuilder::classify_code)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Classification {
    /// The server has the intent: the delivery is recorded as delivered.
    Delivered,
    /// Trying again may help: a retryable
    /// [`DispatchError`](reactifact_core::DispatchError), retried after the retry policy's
    /// backoff, with the same idempotency key.
    Retryable,
    /// Trying again cannot help: a permanent `DispatchError`; the intent is dead at once
    /// (re-armable by hand).
    Permanent,
}

/// JSON-RPC: the request is not valid JSON.
pub const PARSE_ERROR: i32 = -32700;
/// JSON-RPC: the request is not a valid request.
pub const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC: the server has no such method (it does not serve tools).
pub const METHOD_NOT_FOUND: i32 = -32601;
/// JSON-RPC: invalid parameters. MCP servers answer it for an unknown tool and for arguments
/// that do not match the tool's input schema.
pub const INVALID_PARAMS: i32 = -32602;
/// JSON-RPC: an internal error of the server.
pub const INTERNAL_ERROR: i32 = -32603;
/// MCP: a resource was not found.
pub const RESOURCE_NOT_FOUND: i32 = -32002;
/// MCP: the server needs the user to visit a URL first (URL elicitation), which no delivery
/// can do.
pub const URL_ELICITATION_REQUIRED: i32 = -32042;

impl Classification {
    /// The default for a JSON-RPC error `code`: internal errors (-32603) and the
    /// implementation-defined server errors (-32099 to -32000) are retryable, except -32002
    /// (resource not found) and -32042 (URL elicitation required); everything else — parse
    /// error, invalid request, method not found, invalid params (an unknown tool, arguments
    /// the tool refuses), and codes an application defines — is permanent: the same request
    /// would be refused again.
    pub fn default_for_code(code: i32) -> Self {
        match code {
            INTERNAL_ERROR => Classification::Retryable,
            RESOURCE_NOT_FOUND | URL_ELICITATION_REQUIRED => Classification::Permanent,
            -32099..=-32000 => Classification::Retryable,
            _ => Classification::Permanent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified_as_documented() {
        for code in [PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS] {
            assert_eq!(
                Classification::default_for_code(code),
                Classification::Permanent,
                "{code}"
            );
        }
        for code in [RESOURCE_NOT_FOUND, URL_ELICITATION_REQUIRED, 1, 0, -1, -31999, -32100] {
            assert_eq!(
                Classification::default_for_code(code),
                Classification::Permanent,
                "{code}"
            );
        }
        for code in [INTERNAL_ERROR, -32000, -32001, -32099] {
            assert_eq!(
                Classification::default_for_code(code),
                Classification::Retryable,
                "{code}"
            );
        }
    }
}
