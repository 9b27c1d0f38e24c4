//! The shop of the `shop-service` and `serve-bench` programs: an [`Order`] triggers
//! [`draft_confirmation`](fn@draft_confirmation), which asks a model to draft the confirmation
//! email (a recorded, metered call), writes the [`Confirmation`] and records an `email` intent
//! keyed `confirm:{order id}`; a stand-in mail service, the [`Mailer`], delivers it.
//!
//! - [`Order`], [`Confirmation`], [`Email`]: the artifacts and the intent's payload.
//! - [`StandInModel`]: the model, a resource; it answers after a configurable delay, so a
//!   program can give the produce the latency of a real model without a network.
//! - [`Mailer`]: the dispatcher; it waits a configurable delay per attempt, fails every Nth
//!   attempt with a retryable error if asked to, and counts what it sent, by key.
//! - [`runtime`]: the runtime both programs serve, over any context.
//! - [`router`]: the HTTP service over a [`RuntimeHandle`]: `POST /orders`,
//!   `POST /approvals/{key}`, `GET /metrics`.
//!
//! An order of [`APPROVAL_THRESHOLD_CENTS`] or more asks for a human's approval
//! (`act_with_approval`): its confirmation is committed like any other, and delivered once an
//! operator approves it (`POST /approvals/confirm:order:{id}`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use metrics_exporter_prometheus::PrometheusHandle;
use reactifact_core::{
    produce, Agent, ApprovalError, Artifact, ArtifactId, BuildError, Context, DispatchError, Dispatcher, Intent,
    PendingAction, ProduceCall, ProduceError, ProduceErrors, Runtime, RuntimeHandle, SubmitError, Usage, WriteError,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------------
// The domain
// ---------------------------------------------------------------------------------------------

/// The kind of the intent [`draft_confirmation`](fn@draft_confirmation) records.
pub const EMAIL: &str = "email";

/// Orders of this total or more (1,000.00) need an operator's approval before their
/// confirmation is sent.
pub const APPROVAL_THRESHOLD_CENTS: u64 = 100_000;

/// The session both programs write.
pub const SESSION: &str = "shop";

/// An order, at `order:{id}`: the trigger of [`draft_confirmation`](fn@draft_confirmation).
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq, Eq)]
#[artifact(kind = "order")]
pub struct Order {
    /// The customer's name.
    pub customer: String,
    /// Where the confirmation goes.
    pub email: String,
    /// The total, in cents.
    pub total_cents: u64,
}

/// The confirmation drafted for an order, at `confirmation:{order id}`.
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq, Eq)]
#[artifact(kind = "confirmation")]
pub struct Confirmation {
    /// The email's subject line.
    pub subject: String,
    /// The email's body, as the model drafted it.
    pub body: String,
    /// Whether the email waits for an operator's approval.
    pub needs_approval: bool,
}

/// The payload of an `email` intent.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Email {
    /// The customer's address.
    pub to: String,
    /// The subject line.
    pub subject: String,
    /// The body.
    pub body: String,
}

/// The artifact id of the order `id`: `order:{id}`.
pub fn order_id(id: &str) -> String {
    format!("order:{id}")
}

/// The idempotency key of the confirmation of the order at `order`: `confirm:{order}`
/// (`confirm:order:42`). Derived from the order's artifact id alone, so every run that
/// reaches the decision derives the same key.
pub fn confirmation_key(order: &ArtifactId) -> String {
    format!("confirm:{order}")
}

/// The artifact id of the [`Confirmation`] of the order at `order`: `confirmation:{order}`.
pub fn confirmation_id(order: &ArtifactId) -> String {
    format!("confirmation:{order}")
}

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

/// What [`draft_confirmation`](fn@draft_confirmation) asks the model: plain data in a fixed
/// field order, recorded with the call and hashed.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct DraftRequest {
    /// The model's name.
    pub model: String,
    /// The order's artifact id.
    pub order: String,
    /// The customer's name.
    pub customer: String,
    /// The total, in cents.
    pub total_cents: u64,
}

/// The model's answer: the email's subject and body.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    /// The subject line.
    pub subject: String,
    /// The body.
    pub body: String,
}

/// A stand-in for a model that drafts confirmation emails, registered as a resource: its
/// answer is a pure function of the request, given after [`delay`](StandInModel::delay) (tokio
/// time), and its usage counts words as tokens.
#[derive(Clone, Debug, Default)]
pub struct StandInModel {
    delay: Duration,
}

impl StandInModel {
    /// The name the model gives in its requests.
    pub const NAME: &'static str = "stand-in-drafter";

    /// A model that answers after `delay`.
    pub fn new(delay: Duration) -> Self {
        StandInModel { delay }
    }

    /// How long each answer takes.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Drafts the confirmation of `request`'s order, with the tokens it used.
    ///
    /// # Errors
    /// Never: the stand-in always answers.
    pub async fn draft(&self, request: &DraftRequest) -> Result<(Draft, Usage), Infallible> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let draft = Draft {
            subject: format!("Your order {} is confirmed", request.order),
            body: format!(
                "Dear {},\n\nthank you for your order {} of {}.{:02}. We are preparing it now.\n",
                request.customer,
                request.order,
                request.total_cents / 100,
                request.total_cents % 100
            ),
        };
        let words = |text: &str| text.split_whitespace().count() as u64;
        let tokens_in = words(&request.customer) + words(&request.order) + 8;
        let tokens_out = words(&draft.subject) + words(&draft.body);
        Ok((draft, Usage::tokens(tokens_in, tokens_out)))
    }
}

/// Drafts an order's confirmation: asks the [`StandInModel`] (the recorded, metered call
/// `draft`, so a retry and a replay get the answer back without asking again), upserts the
/// [`Confirmation`] at `confirmation:{order id}` and records the `email` intent keyed
/// `confirm:{order id}` — with an approval required when the total is
/// [`APPROVAL_THRESHOLD_CENTS`] or more. No I/O happens here.
#[produce(Confirmation, also_creates = [PendingAction], uses = [StandInModel])]
pub async fn draft_confirmation(call: ProduceCall<Order>) -> Result<(), ProduceError> {
    let model = call.resource::<StandInModel>();
    let order = &call.trigger.data;
    let id = &call.trigger.id;
    let request = DraftRequest {
        model: StandInModel::NAME.to_owned(),
        order: id.to_string(),
        customer: order.customer.clone(),
        total_cents: order.total_cents,
    };
    let draft: Draft = call.record_metered("draft", &request, || model.draft(&request)).await?;
    let needs_approval = order.total_cents >= APPROVAL_THRESHOLD_CENTS;
    call.effects.upsert(
        confirmation_id(id),
        Confirmation {
            subject: draft.subject.clone(),
            body: draft.body.clone(),
            needs_approval,
        },
    );
    let email = Email {
        to: order.email.clone(),
        subject: draft.subject,
        body: draft.body,
    };
    if needs_approval {
        call.effects.act_with_approval(EMAIL, confirmation_key(id), &email);
    } else {
        call.effects.act(EMAIL, confirmation_key(id), &email);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The mail service
// ---------------------------------------------------------------------------------------------

/// A stand-in mail service, the runtime's dispatcher: each attempt waits
/// [`delay`](Mailer::new) (tokio time), then fails with a retryable error if it is a multiple
/// of `fail_every` (counting every attempt of every key, from 1; 0 never fails), and otherwise
/// "sends" the email and counts it under its key. Cheap to clone; the clones share the counts.
#[derive(Clone)]
pub struct Mailer {
    inner: Arc<MailerInner>,
}

struct MailerInner {
    delay: Duration,
    fail_every: u64,
    attempts: AtomicU64,
    sent: Mutex<HashMap<String, Sent>>,
    /// The number of successful sends, for [`Mailer::wait_for`].
    delivered: watch::Sender<u64>,
}

/// What the [`Mailer`] sent under one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    /// How many times it was sent (once, unless the outbox handed the key out again).
    pub times: u32,
    /// When it was first sent (tokio time).
    pub first_at: Instant,
}

impl std::fmt::Debug for Mailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailer")
            .field("delay", &self.inner.delay)
            .field("fail_every", &self.inner.fail_every)
            .field("attempts", &self.attempts())
            .field("delivered", &self.delivered())
            .finish()
    }
}

impl Mailer {
    /// A mail service whose attempts take `delay` and fail every `fail_every`th time (0: never).
    pub fn new(delay: Duration, fail_every: u64) -> Self {
        Mailer {
            inner: Arc::new(MailerInner {
                delay,
                fail_every,
                attempts: AtomicU64::new(0),
                sent: Mutex::new(HashMap::new()),
                delivered: watch::Sender::new(0),
            }),
        }
    }

    /// Attempts so far, failed ones included.
    pub fn attempts(&self) -> u64 {
        self.inner.attempts.load(Ordering::SeqCst)
    }

    /// Successful sends so far, of every key.
    pub fn delivered(&self) -> u64 {
        *self.inner.delivered.borrow()
    }

    /// How many times `key` was sent.
    pub fn times_sent(&self, key: &str) -> u32 {
        self.sent_lock().get(key).map_or(0, |sent| sent.times)
    }

    /// Everything sent so far, by key.
    pub fn sent(&self) -> HashMap<String, Sent> {
        self.sent_lock().clone()
    }

    /// Resolves once at least `count` sends succeeded.
    pub async fn wait_for(&self, count: u64) {
        let mut delivered = self.inner.delivered.subscribe();
        // The sender lives as long as `self`, so the wait cannot fail.
        let _ = delivered.wait_for(|delivered| *delivered >= count).await;
    }

    fn sent_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sent>> {
        // A panic while the lock was held left the map whole (each update is one statement).
        self.inner
            .sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One attempt.
    async fn send(&self, intent: Intent) -> Result<(), DispatchError> {
        let attempt = self.inner.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        if !self.inner.delay.is_zero() {
            tokio::time::sleep(self.inner.delay).await;
        }
        let every = self.inner.fail_every;
        if every > 0 && attempt % every == 0 {
            // Inside the runtime's `delivery` span: the line carries the key and the attempt.
            tracing::info!("mail service failed the attempt (it fails every {every}th)");
            return Err(DispatchError::retryable(format!(
                "stand-in mail service: attempt {attempt} fails (every {every}th attempt does)"
            )));
        }
        // A real mail service would send this, with `intent.key()` as its idempotency key.
        let _email: Email = intent.payload().map_err(DispatchError::permanent)?;
        let now = Instant::now();
        self.sent_lock()
            .entry(intent.key().to_string())
            .and_modify(|sent| sent.times += 1)
            .or_insert(Sent {
                times: 1,
                first_at: now,
            });
        self.inner.delivered.send_modify(|delivered| *delivered += 1);
        // Never log the payload: it names the customer.
        tracing::info!(kind = intent.kind(), "mail service sent the email");
        Ok(())
    }
}

impl Dispatcher for Mailer {
    fn dispatch(&self, intent: Intent) -> impl std::future::Future<Output = Result<(), DispatchError>> + Send {
        self.send(intent)
    }
}

// ---------------------------------------------------------------------------------------------
// The runtime
// ---------------------------------------------------------------------------------------------

/// How the shop's runtime is built.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long the [`StandInModel`] takes to answer.
    pub model_delay: Duration,
    /// How many deliveries run at once.
    pub delivery_concurrency: usize,
}

impl Default for Settings {
    /// An instant model and the runtime's default delivery concurrency, 64.
    fn default() -> Self {
        Settings {
            model_delay: Duration::ZERO,
            delivery_concurrency: 64,
        }
    }
}

/// The shop's runtime over `context`: the agent `shop` with
/// [`draft_confirmation`](fn@draft_confirmation), the [`StandInModel`] of `settings`, and
/// `mailer` as its dispatcher. A produce that fails is isolated (its patch dropped and the
/// failure reported), so that it cannot end a serving runtime.
///
/// # Errors
/// As [`RuntimeBuilder::build`](reactifact_core::RuntimeBuilder::build).
pub fn runtime(context: Context, settings: &Settings, mailer: &Mailer) -> Result<Runtime, BuildError> {
    Runtime::builder(context)
        .agent(Agent::new("shop").produce(draft_confirmation))
        .resource(StandInModel::new(settings.model_delay))
        .dispatcher(mailer.clone())
        .delivery_concurrency(settings.delivery_concurrency)
        .produce_errors(ProduceErrors::Isolate)
        .build()
}

// ---------------------------------------------------------------------------------------------
// The HTTP service
// ---------------------------------------------------------------------------------------------

/// The content type of the Prometheus text exposition format.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// The longest order id `POST /orders` takes.
pub const MAX_ID_LEN: usize = 128;

/// The body of `POST /orders`.
#[derive(Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NewOrder {
    /// The order's id, unique per order: 1 to [`MAX_ID_LEN`] ASCII letters, digits, `-`, `_`
    /// or `.`. The order is stored at `order:{id}`.
    pub id: String,
    /// The customer's name.
    pub customer: String,
    /// Where the confirmation goes.
    pub email: String,
    /// The total, in cents.
    pub total_cents: u64,
}

/// The answer to an accepted `POST /orders`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// Where the order is stored: `order:{id}`.
    pub order: String,
    /// The idempotency key of its confirmation email (approve it with
    /// `POST /approvals/{confirmation}` when `needs_approval`).
    pub confirmation: String,
    /// Whether the confirmation waits for an operator's approval.
    pub needs_approval: bool,
}

/// The body of `POST /approvals/{key}`.
#[derive(Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NewApproval {
    /// Who approves (recorded in the ledger).
    pub by: String,
}

/// The answer to an accepted `POST /approvals/{key}`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Approved {
    /// The intent's key.
    pub key: String,
    /// Its status in the ledger after the approval (`pending`, or further along).
    pub status: String,
}

/// What the service shares between requests.
#[derive(Clone)]
struct Service {
    handle: RuntimeHandle,
    metrics: PrometheusHandle,
}

/// The shop's HTTP service over a serving runtime's `handle`:
///
/// - `POST /orders` with a [`NewOrder`] as JSON writes the order through the handle and
///   answers `202 Accepted` with an [`Accepted`] once it is committed (the confirmation is
///   drafted and sent after); `422` for an order it refuses, `503` when the runtime is gone or
///   the store failed the write.
/// - `POST /approvals/{key}` with a [`NewApproval`] as JSON approves the intent `key`, which
///   awaits approval, and answers `200` with an [`Approved`]; approving again is idempotent.
///   `404` for an unknown key, `409` for one that does not await approval (or was rejected),
///   `422` without a name, `503` when the store failed.
/// - `GET /metrics`: `metrics`' rendering, in the Prometheus text format.
///
/// Errors answer with `{"error": "…"}`. The service records
/// `shop_orders_total{outcome="accepted"|"refused"}` and the histogram
/// `shop_order_intake_seconds` (from the request to the commit) through the `metrics` facade.
pub fn router(handle: RuntimeHandle, metrics: PrometheusHandle) -> axum::Router {
    metrics::describe_counter!(
        "shop_orders_total",
        "Orders received by POST /orders, by outcome (accepted: committed; refused)."
    );
    metrics::describe_histogram!(
        "shop_order_intake_seconds",
        metrics::Unit::Seconds,
        "Seconds from an order's request to its commit (accepted orders)."
    );
    axum::Router::new()
        .route("/orders", post(post_order))
        .route("/approvals/{key}", post(post_approval))
        .route("/metrics", get(get_metrics))
        .with_state(Service { handle, metrics })
}

/// An error answer: `status` with `{"error": message}`.
fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    #[derive(Serialize)]
    struct Body {
        error: String,
    }
    (
        status,
        Json(Body {
            error: message.to_string(),
        }),
    )
        .into_response()
}

/// Why an order id is refused, if it is.
fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!("the order id must have 1 to {MAX_ID_LEN} characters"));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "the order id may hold ASCII letters, digits, `-`, `_` and `.`, not {c:?}"
        ));
    }
    Ok(())
}

async fn post_order(State(service): State<Service>, Json(new): Json<NewOrder>) -> Response {
    let started = std::time::Instant::now();
    if let Err(e) = check_id(&new.id) {
        metrics::counter!("shop_orders_total", "outcome" => "refused").increment(1);
        return error(StatusCode::UNPROCESSABLE_ENTITY, e);
    }
    let id = ArtifactId::from(order_id(&new.id));
    let order = Order {
        customer: new.customer,
        email: new.email,
        total_cents: new.total_cents,
    };
    let needs_approval = order.total_cents >= APPROVAL_THRESHOLD_CENTS;
    // TODO(create_once): `create` refreshes an order that exists (an equal one changes
    // nothing; another re-runs the produce, whose confirmation key already exists and is not
    // sent again), so a duplicate id answers 202 like a new order. With `create_once` the
    // answer tells them apart (409 for an id that exists).
    let written = service.handle.create(id.clone(), order).await;
    let outcome = if written.is_ok() { "accepted" } else { "refused" };
    metrics::counter!("shop_orders_total", "outcome" => outcome).increment(1);
    match written {
        Ok(()) => {
            metrics::histogram!("shop_order_intake_seconds").record(started.elapsed().as_secs_f64());
            tracing::info!(order = %id, needs_approval, "order committed");
            let accepted = Accepted {
                confirmation: confirmation_key(&id),
                order: id.to_string(),
                needs_approval,
            };
            (StatusCode::ACCEPTED, Json(accepted)).into_response()
        }
        Err(SubmitError::Write(WriteError::Store(e))) => {
            tracing::warn!(order = %id, error = %e, "the store failed an order's write");
            error(StatusCode::SERVICE_UNAVAILABLE, e)
        }
        Err(SubmitError::Write(e)) => error(StatusCode::UNPROCESSABLE_ENTITY, e),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

async fn post_approval(
    State(service): State<Service>,
    Path(key): Path<String>,
    Json(approval): Json<NewApproval>,
) -> Response {
    match service.handle.approve(&key, &approval.by).await {
        Ok(delivery) => {
            tracing::info!(key = %key, by = %approval.by, "intent approved");
            let approved = Approved {
                key,
                status: delivery.status().to_string(),
            };
            (StatusCode::OK, Json(approved)).into_response()
        }
        Err(e @ ApprovalError::UnknownKey(_)) => error(StatusCode::NOT_FOUND, e),
        Err(e @ (ApprovalError::NotAwaiting { .. } | ApprovalError::AlreadyDecided { .. })) => {
            error(StatusCode::CONFLICT, e)
        }
        Err(e @ ApprovalError::NoDecider { .. }) => error(StatusCode::UNPROCESSABLE_ENTITY, e),
        Err(e @ ApprovalError::Unsupported { .. }) => error(StatusCode::NOT_IMPLEMENTED, e),
        Err(e) => {
            tracing::warn!(key = %key, error = %e, "an approval failed");
            error(StatusCode::SERVICE_UNAVAILABLE, e)
        }
    }
}

async fn get_metrics(State(service): State<Service>) -> Response {
    (
        [(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)],
        service.metrics.render(),
    )
        .into_response()
}
