//! [`ChatClient`]: a client of an OpenAI-compatible chat completions endpoint.

use std::env::VarError;
use std::fmt;
use std::time::Duration;

use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Client, Response, Url};

use crate::answer::{parse, ChatAnswer};
use crate::endpoint::{describe, endpoint, shown};
use crate::error::{BuildError, ModelError, ERROR_BODY_BYTES};
use crate::request::ChatRequest;
use crate::retry::RetryPolicy;

/// The base URL [`ChatClient::from_env`] uses when `OPENAI_BASE_URL` is not set: OpenAI's.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The timeout of one attempt unless [`ChatClient::with_timeout`] sets another.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest successful answer read, in bytes; a longer one is [`ModelError::Malformed`].
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// The environment variable with the base URL.
pub const BASE_URL_VAR: &str = "OPENAI_BASE_URL";
/// The environment variable with the API key.
pub const API_KEY_VAR: &str = "OPENAI_API_KEY";

/// A client of an OpenAI-compatible chat completions endpoint (OpenAI itself, or a local
/// server such as vLLM, llama.cpp or Ollama). Cheap to clone: clones share one connection
/// pool.
///
/// Each attempt is one `POST {base_url}/chat/completions` of the [`ChatRequest`] as JSON,
/// with `Authorization: Bearer <key>` when a key is given. A 2xx answer is read into a
/// [`ChatAnswer`] (its first choice); another status is [`ModelError::Status`] (with the start
/// of its body and its `Retry-After`); a connection that fails or breaks, or no whole answer
/// within the timeout, is [`ModelError::Transport`]; a 2xx answer that is not a chat completion
/// or is larger than [`MAX_ANSWER_BYTES`] is [`ModelError::Malformed`]. Redirects are not
/// followed. Retryable failures are retried by the client's [`RetryPolicy`].
///
/// Inside a produce, call it through [`ChatClient::complete_recorded`], so that a retry, a
/// resume or a replay gets the answer back without calling again.
///
/// Its `Debug` shows the endpoint (password and query string hidden) and never the key.
#[derive(Clone)]
pub struct ChatClient {
    client: Client,
    endpoint: Url,
    shown: String,
    authorization: Option<HeaderValue>,
    timeout: Duration,
    retry: RetryPolicy,
}

impl fmt::Debug for ChatClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatClient")
            .field("endpoint", &self.shown)
            .field("api_key", &self.authorization.as_ref().map(|_| "***"))
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .finish()
    }
}

impl ChatClient {
    /// A client for the server at `base_url` (such as `http://127.0.0.1:8000/v1`; a trailing
    /// slash makes no difference), sending `api_key` as a bearer token if there is one, with
    /// the [`DEFAULT_TIMEOUT`] and the default [`RetryPolicy`].
    ///
    /// # Errors
    /// If the URL does not parse or is not `http`/`https`, if it is `https` and the crate was
    /// built without the `rustls` feature, or if the key cannot be a header.
    pub fn new(base_url: impl AsRef<str>, api_key: Option<String>) -> Result<Self, BuildError> {
        let endpoint = endpoint(base_url.as_ref())?;
        let authorization = match api_key {
            Some(key) => {
                let mut value =
                    HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| BuildError::InvalidApiKey)?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let client = Client::builder()
            .user_agent(concat!("reactifact-model/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| BuildError::Client {
                reason: describe(&error),
            })?;
        Ok(ChatClient {
            client,
            shown: shown(&endpoint),
            endpoint,
            authorization,
            timeout: DEFAULT_TIMEOUT,
            retry: RetryPolicy::default(),
        })
    }

    /// A client configured by the environment: the base URL from `OPENAI_BASE_URL` (or
    /// [`DEFAULT_BASE_URL`] if it is unset or empty) and the key from `OPENAI_API_KEY` (none
    /// if it is unset or empty). The default base URL is `https`, so without the `rustls`
    /// feature `OPENAI_BASE_URL` must name an `http` server.
    ///
    /// # Errors
    /// As [`new`](ChatClient::new), and [`BuildError::NotUnicode`] for a variable that is not
    /// unicode.
    pub fn from_env() -> Result<Self, BuildError> {
        from_vars(std::env::var(BASE_URL_VAR), std::env::var(API_KEY_VAR))
    }

    /// The same client with another timeout per attempt: connecting, sending and receiving the
    /// whole answer must fit in it. [`Duration::MAX`] means no timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same client with another [`RetryPolicy`] (`RetryPolicy::none()` for no retry).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The URL posted to, with any password and query string hidden.
    pub fn endpoint(&self) -> &str {
        &self.shown
    }

    /// The timeout per attempt.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The retry policy.
    pub fn retry(&self) -> RetryPolicy {
        self.retry
    }

    /// Asks the model: posts `request`, retrying retryable failures by the client's
    /// [`RetryPolicy`] (waiting no less than an answer's `Retry-After`, and failing at once
    /// when that is beyond the policy's cap).
    ///
    /// This call is not recorded: inside a produce use
    /// [`complete_recorded`](ChatClient::complete_recorded).
    ///
    /// # Errors
    /// The last attempt's [`ModelError`], or the first one that is not retryable.
    pub async fn complete(&self, request: &ChatRequest) -> Result<ChatAnswer, ModelError> {
        let body = serde_json::to_vec(request).map_err(|error| ModelError::Malformed {
            url: self.shown.clone(),
            reason: format!("the request does not encode as json: {error}"),
        })?;
        let mut attempt = 1;
        loop {
            let error = match self.attempt(body.clone()).await {
                Ok(answer) => return Ok(answer),
                Err(error) => error,
            };
            if !error.is_retryable() {
                return Err(error);
            }
            let Some(delay) = self.retry.delay(attempt, error.retry_after()) else {
                return Err(error);
            };
            tracing::warn!(
                endpoint = %self.shown,
                attempt,
                delay = ?delay,
                error = %error,
                "model call failed; retrying"
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// One POST.
    async fn attempt(&self, body: Vec<u8>) -> Result<ChatAnswer, ModelError> {
        let mut post = self
            .client
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .body(body);
        if self.timeout != Duration::MAX {
            post = post.timeout(self.timeout);
        }
        if let Some(authorization) = &self.authorization {
            post = post.header(AUTHORIZATION, authorization.clone());
        }
        let mut response = post.send().await.map_err(|error| self.transport(error))?;
        let status = response.status();
        if !status.is_success() {
            let retry_after = reactifact_webhook::retry_after(response.headers());
            let body = read_at_most(&mut response, ERROR_BODY_BYTES).await.unwrap_or_default();
            return Err(ModelError::status(&self.shown, status.as_u16(), &body, retry_after));
        }
        if response
            .content_length()
            .is_some_and(|length| length > MAX_ANSWER_BYTES as u64)
        {
            return Err(self.too_large());
        }
        let body = read_at_most(&mut response, MAX_ANSWER_BYTES + 1)
            .await
            .map_err(|error| self.transport(error))?;
        if body.len() > MAX_ANSWER_BYTES {
            return Err(self.too_large());
        }
        parse(&body).map_err(|reason| ModelError::Malformed {
            url: self.shown.clone(),
            reason,
        })
    }

    fn too_large(&self) -> ModelError {
        ModelError::Malformed {
            url: self.shown.clone(),
            reason: format!("the answer is larger than {MAX_ANSWER_BYTES} bytes"),
        }
    }

    fn transport(&self, error: reqwest::Error) -> ModelError {
        let url = self.shown.clone();
        if error.is_timeout() {
            return ModelError::Transport {
                url,
                reason: format!("no answer within {:?}", self.timeout),
            };
        }
        let connect = error.is_connect();
        let reason = describe(&error.without_url());
        let reason = if connect {
            format!("connecting failed: {reason}")
        } else {
            format!("the request failed: {reason}")
        };
        ModelError::Transport { url, reason }
    }
}

/// Reads the body until its end or until `limit` bytes are read (it may return up to a chunk
/// more).
async fn read_at_most(response: &mut Response, limit: usize) -> Result<Vec<u8>, reqwest::Error> {
    let mut bytes = Vec::new();
    while bytes.len() < limit {
        match response.chunk().await? {
            Some(chunk) => bytes.extend_from_slice(&chunk),
            None => break,
        }
    }
    Ok(bytes)
}

/// [`ChatClient::from_env`] on the values it read.
fn from_vars(base_url: Result<String, VarError>, api_key: Result<String, VarError>) -> Result<ChatClient, BuildError> {
    let read = |value: Result<String, VarError>, name| match value {
        Ok(value) if !value.is_empty() => Ok(Some(value)),
        Ok(_) | Err(VarError::NotPresent) => Ok(None),
        Err(VarError::NotUnicode(_)) => Err(BuildError::NotUnicode { name }),
    };
    let base_url = read(base_url, BASE_URL_VAR)?;
    let api_key = read(api_key, API_KEY_VAR)?;
    ChatClient::new(base_url.as_deref().unwrap_or(DEFAULT_BASE_URL), api_key)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    #[test]
    fn the_key_is_never_shown() {
        let client = ChatClient::new("http://127.0.0.1:9/v1", Some("sk-s3cret".into())).unwrap();
        let debug = format!("{client:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(debug.contains("***"), "{debug}");
        let error = ChatClient::new("http://127.0.0.1:9/v1", Some("sk-s3cret\n".into())).unwrap_err();
        assert_eq!(error, BuildError::InvalidApiKey);
        assert!(!error.to_string().contains("s3cret"));
        assert!(!format!("{error:?}").contains("s3cret"));
    }

    #[test]
    fn the_environment_names_the_server_and_the_key() {
        let client = from_vars(Ok("http://127.0.0.1:8000/v1/".into()), Ok("sk-1".into())).unwrap();
        assert_eq!(client.endpoint(), "http://127.0.0.1:8000/v1/chat/completions");
        assert!(client.authorization.is_some());
        let client = from_vars(Ok("http://127.0.0.1:8000".into()), Ok(String::new())).unwrap();
        assert!(client.authorization.is_none(), "an empty key is no key");
        let client = from_vars(Ok("http://127.0.0.1:8000".into()), Err(VarError::NotPresent)).unwrap();
        assert!(client.authorization.is_none());

        let default = from_vars(Err(VarError::NotPresent), Err(VarError::NotPresent));
        let empty = from_vars(Ok(String::new()), Err(VarError::NotPresent));
        for client in [default, empty] {
            if cfg!(feature = "rustls") {
                assert_eq!(client.unwrap().endpoint(), "https://api.openai.com/v1/chat/completions");
            } else {
                assert!(matches!(client, Err(BuildError::UnsupportedScheme { .. })));
            }
        }

        let garbage = Err(VarError::NotUnicode(OsString::from("x")));
        assert_eq!(
            from_vars(garbage, Err(VarError::NotPresent)).unwrap_err(),
            BuildError::NotUnicode {
                name: "OPENAI_BASE_URL"
            }
        );
    }
}
