//! [`OpenAiCompatible`], a [`Model`] that asks an HTTP server speaking the OpenAI chat
//! completions API (OpenAI itself, or a local server such as vLLM, llama.cpp or Ollama).
//!
//! It POSTs `{base_url}/chat/completions` with the request's system prompt and prompt as two
//! messages, and reads the first choice's content and the token usage.
//!
//! Built with the `openai` feature only, the client speaks plain `http://`; an `https://` base
//! URL needs the `openai-tls` feature too (TLS through rustls), and [`OpenAiCompatible::new`]
//! refuses one without it.

use std::env::VarError;
use std::fmt;
use std::time::Duration;

use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Client, Response, Url};
use serde::{Deserialize, Serialize};

use super::model::{Completion, CompletionFuture, CompletionRequest, Model, ModelError, ERROR_BODY_BYTES};

/// The base URL [`OpenAiCompatible::from_env`] uses when `OPENAI_BASE_URL` is not set.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The request timeout unless [`OpenAiCompatible::with_timeout`] sets another.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest successful answer read, in bytes; a longer one is [`ModelError::Malformed`].
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// The environment variable with the base URL.
const BASE_URL_VAR: &str = "OPENAI_BASE_URL";
/// The environment variable with the API key.
const API_KEY_VAR: &str = "OPENAI_API_KEY";

/// Why an [`OpenAiCompatible`] could not be built.
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
    /// The API key cannot be sent in an HTTP header (it holds a control character). The
    /// message does not show the key.
    #[error("the model server api key cannot be sent in an http header: it contains a control character")]
    InvalidApiKey,
    /// An environment variable [`OpenAiCompatible::from_env`] reads is not valid unicode.
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

/// A [`Model`] behind an OpenAI-compatible chat completions endpoint.
///
/// Each [`complete`](Model::complete) is one POST of
/// `{"model", "messages": [system, user], "max_tokens"}` with `Authorization: Bearer <key>`
/// when a key is given. A 2xx answer's `choices[0].message.content` is the text and
/// `usage.prompt_tokens` / `usage.completion_tokens` the token counts (0 where missing);
/// another status is [`ModelError::Status`]; no answer within the timeout, or a connection
/// that fails, is [`ModelError::Transport`]; a 2xx answer that is not such JSON (or has no
/// choice, or no content in it, or is larger than [`MAX_ANSWER_BYTES`]) is
/// [`ModelError::Malformed`]. Redirects are not followed. The client does not retry:
/// [`ModelError::is_retryable`] tells the caller whether to.
#[derive(Clone)]
pub struct OpenAiCompatible {
    client: Client,
    endpoint: Url,
    shown: String,
    authorization: Option<HeaderValue>,
    timeout: Duration,
}

impl fmt::Debug for OpenAiCompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiCompatible")
            .field("endpoint", &self.shown)
            .field("api_key", &self.authorization.as_ref().map(|_| "***"))
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl OpenAiCompatible {
    /// A client for the server at `base_url` (such as `http://127.0.0.1:8000/v1`; a trailing
    /// slash makes no difference), sending `api_key` as a bearer token if there is one, with
    /// the [`DEFAULT_TIMEOUT`].
    ///
    /// Fails if the URL does not parse or is not `http`/`https`, if it is `https` and the
    /// crate was built without the `openai-tls` feature, or if the key cannot be a header.
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
            .user_agent(concat!("reactifact-examples/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| BuildError::Client {
                reason: describe(&error),
            })?;
        Ok(OpenAiCompatible {
            client,
            shown: shown(&endpoint),
            endpoint,
            authorization,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// A client configured by the environment: the base URL from `OPENAI_BASE_URL` (or
    /// [`DEFAULT_BASE_URL`] if it is unset or empty) and the key from `OPENAI_API_KEY` (none
    /// if it is unset or empty). The default base URL is `https`, so without the `openai-tls`
    /// feature `OPENAI_BASE_URL` must name an `http` server.
    pub fn from_env() -> Result<Self, BuildError> {
        from_vars(std::env::var(BASE_URL_VAR), std::env::var(API_KEY_VAR))
    }

    /// The same client with another request timeout: connecting, sending, and receiving the
    /// whole answer must fit in it.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The URL posted to, with any password and query string hidden.
    pub fn endpoint(&self) -> &str {
        &self.shown
    }

    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn send(&self, request: &CompletionRequest) -> Result<Completion, ModelError> {
        let body = ChatRequest {
            model: &request.model,
            messages: [
                ChatMessage {
                    role: "system",
                    content: &request.system,
                },
                ChatMessage {
                    role: "user",
                    content: &request.prompt,
                },
            ],
            max_tokens: request.max_tokens,
        };
        let body = serde_json::to_vec(&body).map_err(|error| ModelError::Malformed(error.to_string()))?;
        let mut post = self
            .client
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .timeout(self.timeout)
            .body(body);
        if let Some(authorization) = &self.authorization {
            post = post.header(AUTHORIZATION, authorization.clone());
        }
        let mut response = post.send().await.map_err(|error| self.transport(error))?;
        let status = response.status();
        if !status.is_success() {
            let body = read_at_most(&mut response, ERROR_BODY_BYTES).await.unwrap_or_default();
            return Err(ModelError::status(status.as_u16(), &body));
        }
        if response
            .content_length()
            .is_some_and(|length| length > MAX_ANSWER_BYTES as u64)
        {
            return Err(too_large());
        }
        let body = read_at_most(&mut response, MAX_ANSWER_BYTES + 1)
            .await
            .map_err(|error| self.transport(error))?;
        if body.len() > MAX_ANSWER_BYTES {
            return Err(too_large());
        }
        parse(&body)
    }

    fn transport(&self, error: reqwest::Error) -> ModelError {
        let url = &self.shown;
        if error.is_timeout() {
            return ModelError::Transport(format!("{url} did not answer within {:?}", self.timeout));
        }
        let connect = error.is_connect();
        let reason = describe(&error.without_url());
        if connect {
            ModelError::Transport(format!("connecting to {url} failed: {reason}"))
        } else {
            ModelError::Transport(format!("the request to {url} failed: {reason}"))
        }
    }
}

impl Model for OpenAiCompatible {
    fn complete<'a>(&'a self, request: &'a CompletionRequest) -> CompletionFuture<'a> {
        Box::pin(self.send(request))
    }
}

/// The body of a chat completions request.
#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: [ChatMessage<'a>; 2],
    max_tokens: u32,
}

/// One message of a [`ChatRequest`].
#[derive(Serialize)]
struct ChatMessage<'a> {
    role: &'static str,
    content: &'a str,
}

/// The parts of a chat completions answer the client reads; the rest is ignored.
#[derive(Deserialize)]
struct ChatAnswer {
    choices: Vec<Choice>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: AnswerMessage,
}

#[derive(Deserialize)]
struct AnswerMessage {
    content: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

/// A 2xx answer's body as a completion.
fn parse(body: &[u8]) -> Result<Completion, ModelError> {
    let answer: ChatAnswer = serde_json::from_slice(body)
        .map_err(|error| ModelError::Malformed(format!("not a chat completion: {error}")))?;
    let choice = answer
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| ModelError::Malformed("the answer has no choice".to_owned()))?;
    let text = choice
        .message
        .content
        .ok_or_else(|| ModelError::Malformed("the first choice's message has no content".to_owned()))?;
    let (tokens_in, tokens_out) = match answer.usage {
        Some(usage) => (usage.prompt_tokens.unwrap_or(0), usage.completion_tokens.unwrap_or(0)),
        None => (0, 0),
    };
    Ok(Completion {
        text,
        tokens_in,
        tokens_out,
    })
}

fn too_large() -> ModelError {
    ModelError::Malformed(format!("the answer is larger than {MAX_ANSWER_BYTES} bytes"))
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

/// `{base_url}/chat/completions`, checked.
fn endpoint(base_url: &str) -> Result<Url, BuildError> {
    let invalid = |reason: String| BuildError::InvalidUrl {
        url: base_url.to_owned(),
        reason,
    };
    let mut url = Url::parse(base_url).map_err(|error| invalid(error.to_string()))?;
    let refuse = |url: &Url, reason: &str| BuildError::UnsupportedScheme {
        url: shown(url),
        reason: reason.to_owned(),
    };
    match url.scheme() {
        "http" => {}
        "https" if cfg!(feature = "openai-tls") => {}
        "https" => {
            return Err(refuse(
                &url,
                "https needs TLS: build reactifact-examples with the `openai-tls` feature",
            ))
        }
        _ => return Err(refuse(&url, "only http and https servers can be asked")),
    }
    url.set_fragment(None);
    url.path_segments_mut()
        .map_err(|()| invalid("it cannot have a path".to_owned()))?
        .pop_if_empty()
        .extend(["chat", "completions"]);
    Ok(url)
}

/// The URL as messages show it: any password and the query string are hidden, since either
/// may hold a secret.
fn shown(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    shown.set_fragment(None);
    let had_query = shown.query().is_some();
    shown.set_query(None);
    let mut text = String::from(shown);
    if had_query {
        text.push_str("?…");
    }
    text
}

/// An error's causes on one line. reqwest's own outer message ("error sending request") is
/// left out when there is a cause, since the caller's message already says what failed.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let Some(first) = error.source() else {
        return error.to_string();
    };
    let mut out = first.to_string();
    let mut source = first.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

/// [`OpenAiCompatible::from_env`] on the values it read.
fn from_vars(
    base_url: Result<String, VarError>,
    api_key: Result<String, VarError>,
) -> Result<OpenAiCompatible, BuildError> {
    let read = |value: Result<String, VarError>, name| match value {
        Ok(value) if !value.is_empty() => Ok(Some(value)),
        Ok(_) | Err(VarError::NotPresent) => Ok(None),
        Err(VarError::NotUnicode(_)) => Err(BuildError::NotUnicode { name }),
    };
    let base_url = read(base_url, BASE_URL_VAR)?;
    let api_key = read(api_key, API_KEY_VAR)?;
    OpenAiCompatible::new(base_url.as_deref().unwrap_or(DEFAULT_BASE_URL), api_key)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    #[test]
    fn the_endpoint_is_under_the_base_url_with_or_without_a_slash() {
        for base in ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/"] {
            assert_eq!(
                endpoint(base).unwrap().as_str(),
                "http://127.0.0.1:8000/v1/chat/completions"
            );
        }
        for base in ["http://127.0.0.1:8000", "http://127.0.0.1:8000/"] {
            assert_eq!(
                endpoint(base).unwrap().as_str(),
                "http://127.0.0.1:8000/chat/completions"
            );
        }
        let with_query = endpoint("http://h/openai/?api-version=1#top").unwrap();
        assert_eq!(with_query.as_str(), "http://h/openai/chat/completions?api-version=1");
        assert_eq!(shown(&with_query), "http://h/openai/chat/completions?…");
    }

    #[test]
    fn bad_base_urls_are_refused() {
        assert!(matches!(endpoint("not a url"), Err(BuildError::InvalidUrl { .. })));
        assert!(matches!(
            endpoint("ftp://h/v1"),
            Err(BuildError::UnsupportedScheme { .. })
        ));
        assert!(matches!(
            endpoint("mailto:a@b"),
            Err(BuildError::UnsupportedScheme { .. })
        ));
        let https = endpoint("https://user:pw@api.example.invalid/v1");
        if cfg!(feature = "openai-tls") {
            assert!(https.is_ok());
        } else {
            let error = https.unwrap_err();
            assert!(error.to_string().contains("openai-tls"), "{error}");
            assert!(!error.to_string().contains("pw"), "{error}");
        }
    }

    #[test]
    fn the_key_is_never_shown() {
        let client = OpenAiCompatible::new("http://127.0.0.1:9/v1", Some("sk-s3cret".into())).unwrap();
        let debug = format!("{client:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(debug.contains("***"), "{debug}");
        let error = OpenAiCompatible::new("http://127.0.0.1:9/v1", Some("sk-s3cret\n".into())).unwrap_err();
        assert_eq!(error, BuildError::InvalidApiKey);
        assert!(!error.to_string().contains("s3cret"));
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
            if cfg!(feature = "openai-tls") {
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

    #[test]
    fn answers_parse_or_are_malformed() {
        let full = br#"{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"bug"}},
            {"message":{"content":"other"}}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}"#;
        assert_eq!(
            parse(full).unwrap(),
            Completion {
                text: "bug".into(),
                tokens_in: 12,
                tokens_out: 1
            }
        );
        let no_usage = br#"{"choices":[{"message":{"content":"hi"}}]}"#;
        assert_eq!(
            (parse(no_usage).unwrap().tokens_in, parse(no_usage).unwrap().tokens_out),
            (0, 0)
        );
        let null_usage = br#"{"choices":[{"message":{"content":"hi"}}],"usage":null}"#;
        assert_eq!(parse(null_usage).unwrap().tokens_out, 0);
        for garbage in [
            &b"<html>oops</html>"[..],
            b"",
            b"[]",
            br#"{"choices":[]}"#,
            br#"{"choices":null}"#,
            br#"{"choices":[{"message":{"content":null}}]}"#,
            br#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":-1}}"#,
            br#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1e400}}"#,
            br#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":18446744073709551616}}"#,
        ] {
            assert!(
                matches!(parse(garbage), Err(ModelError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(garbage)
            );
        }
    }
}
