//! [`StandIn`]: a local chat completions server for tests and examples (the `stand-in`
//! feature), answering through a function of the request and counting what it received.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::answer::{ChatAnswer, FinishReason, TokenUsage, WireAnswer};
use crate::request::{ChatRequest, Message};
use crate::tool_call::ToolCall;

/// The path the stand-in answers chat completions at; its base URL ends in `/v1`.
pub const CHAT_PATH: &str = "/v1/chat/completions";

/// The path where the stand-in tells how many chat completions it received, as
/// `{"requests": n}` (for a test that counts calls from another process).
pub const COUNT_PATH: &str = "/requests";

/// What the stand-in answers one request with.
#[derive(Clone, Debug)]
pub struct Reply {
    kind: Kind,
    headers: Vec<(String, String)>,
    delay: Duration,
}

#[derive(Clone, Debug)]
enum Kind {
    Answer(ChatAnswer),
    Http { status: u16, body: String },
    Dropped,
    Never,
}

impl Reply {
    /// A 200 chat completion carrying `answer` as the OpenAI API writes it (its content,
    /// tool calls, finish reason and usage; the request's model, an id and the object type).
    pub fn answer(answer: ChatAnswer) -> Self {
        Reply::of(Kind::Answer(answer))
    }

    /// A 200 chat completion with the text `content`, finish reason `stop` and the usage
    /// given.
    pub fn text(content: impl Into<String>, prompt_tokens: u64, completion_tokens: u64) -> Self {
        Reply::answer(ChatAnswer {
            content: Some(content.into()),
            tool_calls: Vec::new(),
            finish_reason: Some(FinishReason::Stop),
            usage: TokenUsage {
                prompt_tokens,
                completion_tokens,
            },
        })
    }

    /// A 200 chat completion asking for `calls`, with no text and finish reason `tool_calls`.
    pub fn tool_calls(calls: Vec<ToolCall>, prompt_tokens: u64, completion_tokens: u64) -> Self {
        Reply::answer(ChatAnswer {
            content: None,
            tool_calls: calls,
            finish_reason: Some(FinishReason::ToolCalls),
            usage: TokenUsage {
                prompt_tokens,
                completion_tokens,
            },
        })
    }

    /// An answer of `status` with `body` as it is (`Content-Type: application/json`): an
    /// error (`Reply::status(429, ..).header("retry-after", "2")`), or a malformed success.
    pub fn status(status: u16, body: impl Into<String>) -> Self {
        Reply::of(Kind::Http {
            status,
            body: body.into(),
        })
    }

    /// The connection closed in the middle of the answer (after its head, before its body).
    pub fn dropped() -> Self {
        Reply::of(Kind::Dropped)
    }

    /// No answer, ever (for a client's timeout).
    pub fn never() -> Self {
        Reply::of(Kind::Never)
    }

    /// The reply with a header added (`Retry-After`, …).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The reply sent `delay` after the request arrived (a slow model), so that a test can act
    /// while the request is unanswered ([`StandIn::unanswered`]).
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    fn of(kind: Kind) -> Self {
        Reply {
            kind,
            headers: Vec::new(),
            delay: Duration::ZERO,
        }
    }
}

/// One chat completions request as the stand-in received it.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    /// Its number, from 0, in the order they arrived.
    pub index: u64,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The body as JSON (`Null` if it was not JSON).
    pub body: serde_json::Value,
}

/// The function a stand-in answers with: the request's number (from 0, in arrival order) and
/// the request.
type Answer = dyn Fn(u64, &ChatRequest) -> Reply + Send + Sync;

struct Shared {
    answer: Box<Answer>,
    requests: AtomicU64,
    answered: AtomicU64,
    abandoned: AtomicU64,
    received: Mutex<Vec<Received>>,
}

/// Counts a request as abandoned if it is dropped before it is answered (its client went
/// away and the server dropped the handler).
struct Pending<'a> {
    shared: &'a Shared,
    answered: bool,
}

impl Pending<'_> {
    fn answer(&mut self) {
        self.answered = true;
        self.shared.answered.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.shared.abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A chat completions server on 127.0.0.1, for tests and examples: each
/// `POST /v1/chat/completions` whose body reads as a [`ChatRequest`] is answered by the
/// function it was started with; a body that does not is answered 400. It counts the requests
/// it received (read as a count at `GET /requests` too) and keeps them.
///
/// The server stops when the `StandIn` is dropped.
///
/// ```
/// use reactifact_model::stand_in::{Reply, StandIn};
/// use reactifact_model::{ChatClient, ChatRequest};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let server = StandIn::start(|_index, request| Reply::text(format!("hello from {}", request.model), 3, 3))
///     .await
///     .unwrap();
/// let client = ChatClient::new(server.base_url(), None).unwrap();
/// let answer = client.complete(&ChatRequest::new("small").user("hi")).await.unwrap();
/// assert_eq!(answer.text(), "hello from small");
/// assert_eq!(server.requests(), 1);
/// # });
/// ```
pub struct StandIn {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for StandIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandIn")
            .field("addr", &self.addr)
            .field("requests", &self.requests())
            .finish()
    }
}

impl StandIn {
    /// Starts a server on `127.0.0.1` on a free port, answering with `answer`.
    ///
    /// # Errors
    /// When the port cannot be bound.
    pub async fn start<F>(answer: F) -> io::Result<StandIn>
    where
        F: Fn(u64, &ChatRequest) -> Reply + Send + Sync + 'static,
    {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        StandIn::on(listener, answer)
    }

    /// Starts a server on `listener`, answering with `answer`.
    ///
    /// # Errors
    /// When the listener has no local address.
    pub fn on<F>(listener: TcpListener, answer: F) -> io::Result<StandIn>
    where
        F: Fn(u64, &ChatRequest) -> Reply + Send + Sync + 'static,
    {
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            answer: Box::new(answer),
            requests: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            received: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route(CHAT_PATH, post(chat))
            .route(COUNT_PATH, get(count))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(%error, "the stand-in model server stopped");
            }
        });
        Ok(StandIn { addr, shared, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL to give a [`ChatClient`](crate::ChatClient): `http://127.0.0.1:<port>/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// How many chat completions requests it received (answered or not).
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// How many chat completions requests it answered: it began to send their answers (a
    /// status and headers, a body or a dropped connection). A request answered
    /// [`never`](Reply::never), or whose client went away during its [`after`](Reply::after)
    /// delay, is not answered.
    pub fn answered(&self) -> u64 {
        self.shared.answered.load(Ordering::SeqCst)
    }

    /// How many requests it dropped unanswered because their client went away (a client
    /// killed while its request was in flight).
    pub fn abandoned(&self) -> u64 {
        self.shared.abandoned.load(Ordering::SeqCst)
    }

    /// How many requests it received and has neither answered nor abandoned yet: those in
    /// flight.
    pub fn unanswered(&self) -> u64 {
        // Read these first: a request answered in between is counted as unanswered, never the
        // other way round.
        let done = self.answered() + self.abandoned();
        self.requests().saturating_sub(done)
    }

    /// The chat completions requests it received, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs a stand-in on `addr` until the process ends: prints
/// `stand-in model listening on http://<addr>/v1` on a line of its own to stdout (so a test
/// that started the process reads the port, with `127.0.0.1:0` for a free one), then answers
/// with `answer`. Another process counts its requests at `GET /requests`.
///
/// # Errors
/// When `addr` cannot be bound or stdout cannot be written.
pub async fn serve<F>(addr: SocketAddr, answer: F) -> io::Result<()>
where
    F: Fn(u64, &ChatRequest) -> Reply + Send + Sync + 'static,
{
    let listener = TcpListener::bind(addr).await?;
    let server = StandIn::on(listener, answer)?;
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "stand-in model listening on {}", server.base_url())?;
    stdout.flush()?;
    drop(stdout);
    std::future::pending::<()>().await;
    Ok(())
}

/// An answer for any request: the text of its last user message, with the words of every
/// message as prompt tokens and the words of the text as completion tokens. What the
/// `reactifact-model-stand-in` program answers.
pub fn echo(_index: u64, request: &ChatRequest) -> Reply {
    let words = |text: &str| text.split_whitespace().count() as u64;
    let mut prompt = 0;
    let mut last = "";
    for message in &request.messages {
        match message {
            Message::System { content } | Message::Tool { content, .. } => prompt += words(content),
            Message::User { content } => {
                prompt += words(content);
                last = content;
            }
            Message::Assistant { content, .. } => prompt += content.as_deref().map_or(0, words),
        }
    }
    Reply::text(last, prompt, words(last))
}

async fn count(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(json!({ "requests": shared.requests.load(Ordering::SeqCst) })).into_response()
}

async fn chat(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let index = shared.requests.fetch_add(1, Ordering::SeqCst);
    let mut pending = Pending {
        shared: &shared,
        answered: false,
    };
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    shared
        .received
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Received {
            index,
            authorization: headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned),
            body: json,
        });
    let request: ChatRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => {
            let body = json!({"error": {"message": format!("not a chat completions request: {error}"), "type": "invalid_request_error"}});
            pending.answer();
            return respond(StatusCode::BAD_REQUEST, &[], body.to_string());
        }
    };
    let reply = (shared.answer)(index, &request);
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    if !matches!(reply.kind, Kind::Never) {
        pending.answer();
    }
    match reply.kind {
        Kind::Answer(answer) => {
            let wire = WireAnswer::of(&answer);
            let choice = &wire.choices[0];
            let body = json!({
                "id": format!("chatcmpl-stand-in-{index}"),
                "object": "chat.completion",
                "created": 0,
                "model": request.model,
                "choices": [{"index": 0, "message": choice.message, "finish_reason": choice.finish_reason}],
                "usage": {
                    "prompt_tokens": answer.usage.prompt_tokens,
                    "completion_tokens": answer.usage.completion_tokens,
                    "total_tokens": answer.usage.prompt_tokens.saturating_add(answer.usage.completion_tokens),
                },
            });
            respond(StatusCode::OK, &reply.headers, body.to_string())
        }
        Kind::Http { status, body } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            respond(status, &reply.headers, body)
        }
        Kind::Dropped => {
            let broken = futures_util::stream::once(async {
                Err::<Bytes, io::Error>(io::Error::other("the stand-in drops the connection"))
            });
            let mut response = Body::from_stream(broken).into_response();
            add_headers(&mut response, &reply.headers);
            response
        }
        Kind::Never => std::future::pending().await,
    }
}

fn respond(status: StatusCode, headers: &[(String, String)], body: String) -> Response {
    let mut response = (status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response();
    add_headers(&mut response, headers);
    response
}

fn add_headers(response: &mut Response, headers: &[(String, String)]) {
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::from_str(value)) {
            response.headers_mut().append(name, value);
        }
    }
}
