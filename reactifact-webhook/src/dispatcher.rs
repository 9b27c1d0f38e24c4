//! The dispatcher: one POST per delivery attempt.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reactifact_core::runtime::TraceParent;
use reactifact_core::{DispatchError, Dispatcher, Intent};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::{Client, StatusCode, Url};

use crate::builder::WebhookBuilder;
use crate::classify::{status_error, transport_error, Classification};
use crate::error::WebhookError;
use crate::payload::to_json;

/// The header carrying the intent's idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The header carrying the intent's action kind.
pub const KIND_HEADER: &str = "x-reactifact-kind";
/// The header carrying the attempt number: 1 for the first delivery, 2 after one failure, …
pub const ATTEMPT_HEADER: &str = "x-reactifact-attempt";
/// The W3C trace-context header: the delivery attempt's span, in the trace of the produce run
/// that committed the intent ([`Intent::trace_parent`]).
pub const TRACEPARENT: &str = "traceparent";

/// A [`Dispatcher`] that POSTs each intent's payload as JSON to an HTTP webhook.
///
/// Built with [`WebhookDispatcher::builder`]; cheap to clone (clones share the connection
/// pool). See the [crate documentation](crate) for what it sends and how answers are
/// classified.
#[derive(Clone)]
pub struct WebhookDispatcher {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) default: Option<Target>,
    pub(crate) routes: BTreeMap<String, Target>,
    pub(crate) headers: HeaderMap,
    pub(crate) timeout: Duration,
    /// Statuses classified otherwise than by default.
    pub(crate) classes: BTreeMap<StatusCode, Classification>,
}

/// A URL and the form of it that messages show.
pub(crate) struct Target {
    pub(crate) url: Url,
    pub(crate) shown: String,
}

/// One delivery attempt, as the dispatcher needs it: usually taken from an [`Intent`]
/// (`Outgoing::from(&intent)`), or built by hand where there is none (a typed handler that
/// forwards to a webhook, a test).
#[derive(Clone, Copy, Debug)]
pub struct Outgoing<'a> {
    /// The action kind; selects the URL and is sent as `X-Reactifact-Kind`.
    pub kind: &'a str,
    /// The idempotency key, sent as `Idempotency-Key`.
    pub key: &'a str,
    /// The attempt number, sent as `X-Reactifact-Attempt`.
    pub attempt: u32,
    /// The payload's rmp-serde bytes (named fields); sent as JSON.
    pub payload: &'a [u8],
    /// The W3C trace context, sent as `traceparent` (none sent if `None`). From an intent, the
    /// delivery attempt's own ([`Intent::trace_parent`]): the receiver's span becomes a child
    /// of the delivery, in the trace of the produce run that decided it.
    pub traceparent: Option<TraceParent>,
}

/// Shows URLs as messages do and header names only: both may hold secrets.
impl fmt::Debug for WebhookDispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        let routes: BTreeMap<&str, &str> = inner
            .routes
            .iter()
            .map(|(k, t)| (k.as_str(), t.shown.as_str()))
            .collect();
        let headers: Vec<&str> = inner.headers.keys().map(|name| name.as_str()).collect();
        f.debug_struct("WebhookDispatcher")
            .field("default", &inner.default.as_ref().map(|t| t.shown.as_str()))
            .field("routes", &routes)
            .field("headers", &headers)
            .field("timeout", &inner.timeout)
            .field("classify", &inner.classes)
            .finish_non_exhaustive()
    }
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

impl WebhookDispatcher {
    /// A builder: set a default URL and/or a URL per kind, then [`build`](WebhookBuilder::build).
    pub fn builder() -> WebhookBuilder {
        WebhookBuilder::default()
    }

    /// A dispatcher that posts every intent to `url`, with the default settings.
    pub fn new(url: impl Into<String>) -> Result<Self, crate::BuildError> {
        Self::builder().url(url).build()
    }

    pub(crate) fn from_inner(inner: Inner) -> Self {
        WebhookDispatcher { inner: Arc::new(inner) }
    }

    /// The URL intents of `kind` are posted to: the kind's own, else the default.
    pub fn url_for(&self, kind: &str) -> Option<&Url> {
        self.target(kind).map(|target| &target.url)
    }

    /// The request timeout (connecting, sending and receiving the answer's head).
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// How an answer with `status` is classified: as set with
    /// [`WebhookBuilder::classify`], else [`Classification::default_for`].
    pub fn classification(&self, status: StatusCode) -> Classification {
        self.inner
            .classes
            .get(&status)
            .copied()
            .unwrap_or_else(|| Classification::default_for(status))
    }

    fn target(&self, kind: &str) -> Option<&Target> {
        self.inner.routes.get(kind).or(self.inner.default.as_ref())
    }

    /// Posts one delivery attempt and classifies the answer: `Ok` for a status classified as
    /// delivered (2xx by default), otherwise the [`WebhookError`] saying why.
    /// [`Dispatcher::dispatch`] is this plus [`WebhookError::into_dispatch_error`].
    pub async fn send(&self, outgoing: Outgoing<'_>) -> Result<(), WebhookError> {
        let Outgoing {
            kind,
            key,
            attempt,
            payload,
            traceparent,
        } = outgoing;
        let target = self
            .target(kind)
            .ok_or_else(|| WebhookError::NoRoute { kind: kind.to_owned() })?;
        let body = to_json(kind, key, payload)?;
        let mut headers = self.headers(kind, key, attempt)?;
        if let Some(trace) = traceparent {
            // Formatted by `TraceParent`: always a valid header value.
            let value = HeaderValue::from_str(&trace.to_string()).expect("a traceparent is a valid header value");
            headers.insert(HeaderName::from_static(TRACEPARENT), value);
        }
        let url = target.shown.as_str();
        let sent = self
            .inner
            .client
            .post(target.url.clone())
            .headers(headers)
            .timeout(self.inner.timeout)
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => {
                let error = transport_error(url, self.inner.timeout, error);
                tracing::debug!(kind, key, attempt, url, error = %error, "webhook delivery failed");
                return Err(error);
            }
        };
        let status = response.status();
        let class = self.classification(status);
        if class == Classification::Delivered {
            tracing::debug!(kind, key, attempt, url, status = status.as_u16(), "webhook delivered");
            return Ok(());
        }
        let error = status_error(url, response, class == Classification::Retryable).await;
        tracing::debug!(
            kind,
            key,
            attempt,
            url,
            status = status.as_u16(),
            "webhook refused the delivery"
        );
        Err(error)
    }

    fn headers(&self, kind: &str, key: &str, attempt: u32) -> Result<HeaderMap, WebhookError> {
        let value = |name: &str, text: &str| {
            HeaderValue::from_bytes(text.as_bytes()).map_err(|_| WebhookError::Header {
                key: key.to_owned(),
                kind: kind.to_owned(),
                reason: format!("the {name} contains a control character, which no HTTP header can carry"),
            })
        };
        let mut headers = self.inner.headers.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(HeaderName::from_static(IDEMPOTENCY_KEY), value("key", key)?);
        headers.insert(HeaderName::from_static(KIND_HEADER), value("kind", kind)?);
        headers.insert(HeaderName::from_static(ATTEMPT_HEADER), HeaderValue::from(attempt));
        Ok(headers)
    }
}

impl Dispatcher for WebhookDispatcher {
    async fn dispatch(&self, intent: Intent) -> Result<(), DispatchError> {
        self.send(Outgoing::from(&intent))
            .await
            .map_err(WebhookError::into_dispatch_error)
    }
}
