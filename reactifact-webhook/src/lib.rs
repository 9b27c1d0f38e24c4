//! A reactifact [`Dispatcher`](reactifact_core::Dispatcher) that delivers each intent to an
//! HTTP webhook.
//!
//! [`WebhookDispatcher`] POSTs the intent's payload, transcoded from rmp-serde to JSON, to a
//! URL chosen by the intent's action kind, with these headers:
//!
//! | header | value |
//! | --- | --- |
//! | `Content-Type` | `application/json` |
//! | `Idempotency-Key` | the intent's idempotency key, identical on every attempt |
//! | `X-Reactifact-Kind` | the action kind |
//! | `X-Reactifact-Attempt` | the attempt number: 1, then 2 after one failure, … |
//! | `traceparent` | the attempt's W3C trace context ([`Intent::trace_parent`](reactifact_core::Intent::trace_parent)): the trace of the produce run that decided it |
//!
//! plus any extra headers set with [`WebhookBuilder::header`]. Delivery is at-least-once;
//! the effect is exactly-once where the receiver deduplicates on `Idempotency-Key`.
//!
//! The answer decides the outcome:
//!
//! - **2xx**: delivered.
//! - **408, 409, 429, 5xx**, a timeout, a refused or broken connection: a *retryable*
//!   [`DispatchError`](reactifact_core::DispatchError); the outbox tries again after its
//!   backoff, and no earlier than the delay in a `Retry-After` header (delta-seconds or an
//!   HTTP-date). 409 is retried because a receiver that honours `Idempotency-Key` answers it
//!   while a request with the same key is still in progress, which a redelivery can cause.
//! - **anything else** (other 4xx, a 3xx, which is not followed), or a payload with no JSON
//!   form: a *permanent* error; the intent goes to the dead letter.
//! - a kind with no URL: the intent is *held*
//!   ([`DispatchError::no_route`](reactifact_core::DispatchError::no_route)), as a `Router`
//!   holds a kind it has no route for; add the URL and `retry` it.
//!
//! [`WebhookBuilder::classify`] classifies a status otherwise, as a [`Classification`]:
//! `.classify(409, Classification::Delivered)` for a receiver whose 409 means "already done".
//!
//! Error messages name the URL (password and query string hidden), the status and the start of
//! the response body; payloads are never logged. The [`WebhookError`] inside a
//! `DispatchError` can be recovered with `as_error().downcast_ref::<WebhookError>()`.
//!
//! To post from code of your own — a typed handler that forwards to a webhook, say — call
//! [`WebhookDispatcher::send`] with an [`Outgoing`] attempt; it returns the [`WebhookError`]
//! itself, and [`WebhookError::into_dispatch_error`] classifies it as above.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use reactifact_core::{Agent, Context, Runtime};
//! use reactifact_webhook::WebhookDispatcher;
//!
//! # async fn run(ctx: Context, agent: Agent) -> Result<(), Box<dyn std::error::Error>> {
//! let webhook = WebhookDispatcher::builder()
//!     .url("http://hooks.internal:8080/reactifact") // every kind without its own URL
//!     .route("email", "http://mailer.internal/send") // kind `email`
//!     .header("Authorization", "Bearer s3cret")
//!     .timeout(Duration::from_secs(10))
//!     .build()?;
//! let mut rt = Runtime::builder(ctx).agent(agent).dispatcher(webhook).build()?;
//! rt.run().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # TLS
//!
//! `https://` URLs need the crate feature `rustls` (off by default, to keep builds lean):
//! `reactifact-webhook = { version = "0.1", features = ["rustls"] }`. Without it, building a
//! dispatcher with an `https://` URL fails with [`BuildError::UnsupportedScheme`], unless you
//! pass a [`reqwest::Client`] of your own with [`WebhookBuilder::client`].

mod builder;
mod classify;
mod dispatcher;
mod error;
mod payload;

pub use builder::{WebhookBuilder, DEFAULT_TIMEOUT};
pub use classify::{retry_after, Classification};
pub use dispatcher::{Outgoing, WebhookDispatcher, ATTEMPT_HEADER, IDEMPOTENCY_KEY, KIND_HEADER, TRACEPARENT};
pub use error::{BuildError, WebhookError};
/// The HTTP client crate, re-exported for [`WebhookBuilder::client`].
pub use reqwest;
