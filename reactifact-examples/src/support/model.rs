//! What a produce asks a model and what it gets back: [`CompletionRequest`], [`Completion`],
//! [`ModelError`], and the [`Model`] trait every client implements.
//!
//! With the `openai` feature, reactifact-model's `ChatClient` is a [`Model`]: a
//! [`CompletionRequest`] is sent as a chat completion of two messages (the system prompt and
//! the prompt), and the answer's text and token counts come back as a [`Completion`]. The
//! client itself (HTTP, retries, `Retry-After`) lives in reactifact-model.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// How many bytes of an error answer's body [`ModelError::status`] keeps.
pub const ERROR_BODY_BYTES: usize = 512;

/// One completion request: a system prompt that says what the task is, and the user's prompt.
///
/// A produce records this value with the call, so its encoding identifies the call: the fields
/// are plain values in a fixed order (no maps), and equal requests encode to equal bytes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CompletionRequest {
    /// The model's name, as the server knows it (the stand-in ignores it).
    pub model: String,
    /// The system prompt: the instructions for the task.
    pub system: String,
    /// The user's prompt: the input of the task.
    pub prompt: String,
    /// The most tokens the answer may have.
    pub max_tokens: u32,
}

/// A model's answer to a [`CompletionRequest`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The answer's text.
    pub text: String,
    /// The tokens the request used, as the model counted them (0 if it did not say).
    pub tokens_in: u64,
    /// The tokens the answer used, as the model counted them (0 if it did not say).
    pub tokens_out: u64,
}

/// Why a completion failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// The model server answered with a status that is not a success.
    #[error("the model server answered {status}{}", body_suffix(body))]
    Status {
        /// The HTTP status.
        status: u16,
        /// The start of the answer's body (at most [`ERROR_BODY_BYTES`] bytes, cut at a
        /// character boundary; empty if there was none).
        body: String,
    },
    /// No answer arrived: the connection failed, broke, or the request timed out.
    #[error("the model server could not be reached: {0}")]
    Transport(String),
    /// An answer arrived but is not a completion: not the expected JSON, or no choice in it.
    #[error("the model server's answer is malformed: {0}")]
    Malformed(String),
}

fn body_suffix(body: &str) -> String {
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    }
}

impl ModelError {
    /// A [`Status`](ModelError::Status) error for `status` with the start of `body`: at most
    /// [`ERROR_BODY_BYTES`] bytes of it, decoded lossily as UTF-8 and cut at a character
    /// boundary.
    pub fn status(status: u16, body: &[u8]) -> Self {
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
        ModelError::Status { status, body }
    }

    /// Whether trying the same request again can help: a status of 408 (request timeout),
    /// 409 (conflict), 429 (too many requests) or 5xx, and every transport error. A malformed
    /// answer and every other status are not retryable.
    pub fn is_retryable(&self) -> bool {
        match self {
            ModelError::Status { status, .. } => matches!(status, 408 | 409 | 429 | 500..=599),
            ModelError::Transport(_) => true,
            ModelError::Malformed(_) => false,
        }
    }
}

/// The future a [`Model`] returns.
pub type CompletionFuture<'a> = Pin<Box<dyn Future<Output = Result<Completion, ModelError>> + Send + 'a>>;

/// A model that completes prompts. Object safe, so a produce can hold an `Arc<dyn Model>`
/// and the program can choose the client at start-up.
pub trait Model: Send + Sync + 'static {
    /// Completes `request`.
    fn complete<'a>(&'a self, request: &'a CompletionRequest) -> CompletionFuture<'a>;
}

impl<M: Model + ?Sized> Model for Arc<M> {
    fn complete<'a>(&'a self, request: &'a CompletionRequest) -> CompletionFuture<'a> {
        (**self).complete(request)
    }
}

#[cfg(feature = "openai")]
impl Model for reactifact_model::ChatClient {
    fn complete<'a>(&'a self, request: &'a CompletionRequest) -> CompletionFuture<'a> {
        Box::pin(async move {
            let chat = reactifact_model::ChatRequest::new(request.model.as_str())
                .system(request.system.as_str())
                .user(request.prompt.as_str())
                .max_tokens(request.max_tokens);
            let answer = reactifact_model::ChatClient::complete(self, &chat).await?;
            let text = answer
                .content
                .ok_or_else(|| ModelError::Malformed("the first choice's message has no content".to_owned()))?;
            Ok(Completion {
                text,
                tokens_in: answer.usage.prompt_tokens,
                tokens_out: answer.usage.completion_tokens,
            })
        })
    }
}

/// reactifact-model's error as this example's: a status keeps its code and body; a transport
/// error and a malformed answer keep the endpoint (never the key) and the reason.
#[cfg(feature = "openai")]
impl From<reactifact_model::ModelError> for ModelError {
    fn from(error: reactifact_model::ModelError) -> Self {
        use reactifact_model::ModelError as Chat;
        match error {
            Chat::Status { status, body, .. } => ModelError::Status { status, body },
            Chat::Transport { url, reason } => ModelError::Transport(format!("{url}: {reason}")),
            Chat::Malformed { url, reason } => ModelError::Malformed(format!("{url}: {reason}")),
            other => ModelError::Malformed(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_error_body_is_cut_at_a_character_boundary() {
        let body = "é".repeat(ERROR_BODY_BYTES);
        let ModelError::Status { status, body } = ModelError::status(500, body.as_bytes()) else {
            panic!("a status error");
        };
        assert_eq!(status, 500);
        assert_eq!(body, "é".repeat(ERROR_BODY_BYTES / 2));
    }

    #[test]
    fn a_cut_in_the_middle_of_a_character_keeps_the_message_short() {
        let body = format!("a{}", "é".repeat(ERROR_BODY_BYTES));
        let ModelError::Status { body, .. } = ModelError::status(500, body.as_bytes()) else {
            panic!("a status error");
        };
        assert!(body.len() <= ERROR_BODY_BYTES, "{}", body.len());
        assert!(body.starts_with("aé"));
    }

    #[test]
    fn retryable_statuses() {
        for status in [408, 409, 429, 500, 502, 503, 599] {
            assert!(ModelError::status(status, b"").is_retryable(), "{status}");
        }
        for status in [200, 301, 400, 401, 403, 404, 422, 600] {
            assert!(!ModelError::status(status, b"").is_retryable(), "{status}");
        }
        assert!(ModelError::Transport("reset".into()).is_retryable());
        assert!(!ModelError::Malformed("no choice".into()).is_retryable());
    }

    #[test]
    fn messages_name_the_status_and_body() {
        assert_eq!(
            ModelError::status(429, b"slow down").to_string(),
            "the model server answered 429: slow down"
        );
        assert_eq!(
            ModelError::status(500, b"").to_string(),
            "the model server answered 500"
        );
    }
}
