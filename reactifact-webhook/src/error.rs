//! Errors: building a dispatcher ([`BuildError`]) and delivering one intent ([`WebhookError`]).

use std::time::Duration;

use reqwest::StatusCode;

/// Why one delivery failed. Every [`DispatchError`](reactifact_core::DispatchError) the
/// dispatcher returns wraps one of these; get it back with
/// `dispatch_error.as_error().downcast_ref::<WebhookError>()`.
///
/// Messages name the URL (with any password and query string hidden), never the payload.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// The receiver answered with a status that is not a success.
    #[error("webhook {url} answered {status}{}{}", redirect_hint(*status), snippet_suffix(body))]
    Status {
        /// The URL posted to, as shown in messages.
        url: String,
        /// The status it answered.
        status: StatusCode,
        /// The start of the response body, whitespace collapsed (empty if there was none).
        body: String,
        /// The delay the receiver asked for in `Retry-After`, if any (read only when the status
        /// is retryable).
        retry_after: Option<Duration>,
        /// Whether the status is classified as retryable (see
        /// [`Classification`](crate::Classification)); otherwise it is permanent.
        retryable: bool,
    },
    /// The receiver did not answer within the request timeout.
    #[error("webhook {url} did not answer within {after:?}")]
    Timeout {
        /// The URL posted to, as shown in messages.
        url: String,
        /// The request timeout.
        after: Duration,
    },
    /// No connection could be made (refused, unreachable, name not resolved).
    #[error("connecting to webhook {url} failed: {reason}")]
    Connect {
        /// The URL posted to, as shown in messages.
        url: String,
        /// What the HTTP client reported.
        reason: String,
    },
    /// The request failed after the connection was made (reset, closed early, bad response).
    #[error("request to webhook {url} failed: {reason}")]
    Request {
        /// The URL posted to, as shown in messages.
        url: String,
        /// What the HTTP client reported.
        reason: String,
    },
    /// The intent's kind has no URL and the dispatcher has no default URL. The intent is held,
    /// not failed: configure a URL and `retry` it.
    #[error("no webhook URL for action kind `{kind}` and no default URL")]
    NoRoute {
        /// The action kind.
        kind: String,
    },
    /// The payload cannot be represented as JSON (for example a map with non-string keys or raw
    /// bytes), or is not valid rmp-serde.
    #[error("the payload of action `{key}` ({kind}) cannot be sent as JSON: {reason}")]
    Payload {
        /// The action's idempotency key.
        key: String,
        /// The action kind.
        kind: String,
        /// What the transcoder reported.
        reason: String,
    },
    /// The key or kind cannot be sent in an HTTP header (it holds a control character).
    #[error("action `{key}` ({kind}) cannot be sent: {reason}")]
    Header {
        /// The action's idempotency key.
        key: String,
        /// The action kind.
        kind: String,
        /// What is wrong.
        reason: String,
    },
}

impl WebhookError {
    /// Whether trying again can help: timeouts, connection and network errors, and the
    /// statuses classified as retryable (by default 408, 409, 429 and 5xx; see
    /// [`Classification`](crate::Classification)). A kind without a URL is held (see
    /// [`into_dispatch_error`](Self::into_dispatch_error)); everything else is permanent.
    pub fn is_retryable(&self) -> bool {
        match self {
            WebhookError::Status { retryable, .. } => *retryable,
            WebhookError::Timeout { .. } | WebhookError::Connect { .. } | WebhookError::Request { .. } => true,
            WebhookError::NoRoute { .. } | WebhookError::Payload { .. } | WebhookError::Header { .. } => false,
        }
    }

    /// The status the receiver answered, if it answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            WebhookError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

fn redirect_hint(status: StatusCode) -> &'static str {
    if status.is_redirection() {
        " (redirects are not followed; configure the final URL)"
    } else {
        ""
    }
}

fn snippet_suffix(body: &str) -> String {
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body:?}")
    }
}

/// Building a [`WebhookDispatcher`](crate::WebhookDispatcher) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A URL does not parse.
    #[error("invalid webhook URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What the parser reported.
        reason: String,
    },
    /// A URL's scheme is not `http`, or is `https` without TLS support.
    #[error("webhook URL {url}: {reason}")]
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
    /// An extra header would replace one the dispatcher sets itself.
    #[error("header `{name}` is set by the webhook dispatcher and cannot be overridden")]
    ReservedHeader {
        /// The header name as given.
        name: String,
    },
    /// A status given to [`WebhookBuilder::classify`](crate::WebhookBuilder::classify) is not
    /// an HTTP status (100 to 999).
    #[error("cannot classify status {status}: HTTP statuses run from 100 to 999")]
    InvalidStatus {
        /// The status as given.
        status: u16,
    },
    /// The HTTP client could not be built.
    #[error("building the HTTP client failed: {reason}")]
    Client {
        /// What the client reported.
        reason: String,
    },
}
