//! The errors: [`BuildError`] (setting a client up) and [`ModelError`] (a completion).

use std::time::Duration;

use reactifact_webhook::Classification;
use reqwest::StatusCode;

/// How many bytes of an error answer's body [`ModelError::Status`] keeps.
pub const ERROR_BODY_BYTES: usize = 512;

/// Why a [`ChatClient`](crate::ChatClient) could not be built. No message shows the API key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The base URL does not parse, or cannot have a path.
    #[error("model server base url `{url}` is invalid: {reason}")]
    InvalidUrl {
        /// The base URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The base URL's scheme is not one the client can speak.
    #[error("model server base url `{url}` cannot be used: {reason}")]
    UnsupportedScheme {
        /// The base URL, with any password and query string hidden.
        url: String,
        /// Why, and what to do.
        reason: String,
    },
    /// The API key cannot be sent in an HTTP header (it holds a control character).
    #[error("the model server api key cannot be sent in an http header: it contains a control character")]
    InvalidApiKey,
    /// An environment variable [`ChatClient::from_env`](crate::ChatClient::from_env) reads is
    /// not valid unicode.
    #[error("environment variable {name} is not valid unicode")]
    NotUnicode {
        /// The variable's name.
        name: &'static str,
    },
    /// The HTTP client could not be set up.
    #[error("the http client for the model server could not be built: {reason}")]
    Client {
        /// What the HTTP client reported.
        reason: String,
    },
}

/// Why a completion failed (after the client's retries, if it was retryable).
///
/// Messages name the endpoint (password and query string hidden) and never the API key, the
/// request or the answer beyond the start of an error body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The server answered with a status that is not a success.
    #[error(
        "model server {url} answered {status}{}{}",
        body_suffix(body),
        retry_suffix(retry_after)
    )]
    Status {
        /// The endpoint.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the answer's body (at most [`ERROR_BODY_BYTES`] bytes, decoded lossily
        /// and cut at a character boundary; empty if there was none).
        body: String,
        /// The delay the answer's `Retry-After` asked for, if it had one that reads.
        retry_after: Option<Duration>,
    },
    /// No (whole) answer arrived: the connection failed or broke, or the timeout elapsed.
    #[error("model server {url} could not be reached: {reason}")]
    Transport {
        /// The endpoint.
        url: String,
        /// What happened.
        reason: String,
    },
    /// A successful answer arrived but is not a chat completion: not the expected JSON, no
    /// choice in it, or larger than [`MAX_ANSWER_BYTES`](crate::MAX_ANSWER_BYTES).
    #[error("model server {url} gave a malformed answer: {reason}")]
    Malformed {
        /// The endpoint.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
}

fn body_suffix(body: &str) -> String {
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    }
}

fn retry_suffix(retry_after: &Option<Duration>) -> String {
    match retry_after {
        Some(delay) => format!(" (retry after {delay:?})"),
        None => String::new(),
    }
}

impl ModelError {
    /// A [`Status`](ModelError::Status) error for `status` with the start of `body` (at most
    /// [`ERROR_BODY_BYTES`] bytes of it, decoded lossily as UTF-8 and cut at a character
    /// boundary) and the answer's `Retry-After`.
    pub fn status(url: impl Into<String>, status: u16, body: &[u8], retry_after: Option<Duration>) -> Self {
        let body = String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_BYTES)]);
        let mut body = body.into_owned();
        if body.len() > ERROR_BODY_BYTES {
            // A cut multi-byte character became a replacement character, which is longer.
            let mut end = ERROR_BODY_BYTES;
            while !body.is_char_boundary(end) {
                end -= 1;
            }
            body.truncate(end);
        }
        ModelError::Status {
            url: url.into(),
            status,
            body,
            retry_after,
        }
    }

    /// Whether trying the same request again can help: a status that reactifact-webhook's
    /// [`Classification::default_for`] calls retryable (408, 409, 429 and 5xx), and every
    /// transport error. A malformed answer and every other status are not retryable.
    pub fn is_retryable(&self) -> bool {
        match self {
            ModelError::Status { status, .. } => StatusCode::from_u16(*status)
                .is_ok_and(|status| Classification::default_for(status) == Classification::Retryable),
            ModelError::Transport { .. } => true,
            ModelError::Malformed { .. } => false,
        }
    }

    /// The delay the server's `Retry-After` asked for, if this is a status error that had one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ModelError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> ModelError {
        ModelError::status("http://h/v1/chat/completions", code, b"", None)
    }

    #[test]
    fn a_long_error_body_is_cut_at_a_character_boundary() {
        let body = "é".repeat(ERROR_BODY_BYTES);
        let ModelError::Status { body, .. } = ModelError::status("u", 500, body.as_bytes(), None) else {
            panic!("a status error");
        };
        assert_eq!(body, "é".repeat(ERROR_BODY_BYTES / 2));
        let body = format!("a{}", "é".repeat(ERROR_BODY_BYTES));
        let ModelError::Status { body, .. } = ModelError::status("u", 500, body.as_bytes(), None) else {
            panic!("a status error");
        };
        assert!(body.len() <= ERROR_BODY_BYTES, "{}", body.len());
        assert!(body.starts_with("aé"));
    }

    #[test]
    fn retryable_statuses_are_the_webhooks() {
        for code in [408, 409, 429, 500, 502, 503, 599] {
            assert!(status(code).is_retryable(), "{code}");
        }
        for code in [200, 301, 400, 401, 403, 404, 422, 999] {
            assert!(!status(code).is_retryable(), "{code}");
        }
        let transport = ModelError::Transport {
            url: "u".into(),
            reason: "reset".into(),
        };
        assert!(transport.is_retryable());
        let malformed = ModelError::Malformed {
            url: "u".into(),
            reason: "no choice".into(),
        };
        assert!(!malformed.is_retryable());
    }

    #[test]
    fn messages_name_the_endpoint_status_body_and_delay() {
        assert_eq!(
            ModelError::status(
                "http://h/v1/chat/completions",
                429,
                b"slow down",
                Some(Duration::from_secs(2))
            )
            .to_string(),
            "model server http://h/v1/chat/completions answered 429: slow down (retry after 2s)"
        );
        assert_eq!(
            status(500).to_string(),
            "model server http://h/v1/chat/completions answered 500"
        );
    }
}
