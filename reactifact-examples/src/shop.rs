//! The shop of the `shop-service` and `serve-bench` programs: an [`Order`] triggers
//! [`draft_confirmation`](fn@draft_confirmation), which asks a model to draft the confirmation
//! email (a recorded, metered call), writes the [`Confirmation`] and records an `email` intent
//! keyed `confirm:{order id}`; a stand-in mail service, the [`Mailer`], delivers it.
//!
//! - [`Order`], [`Confirmation`], [`Email`]: the artifacts and the intent's payload.
//! - [`StandInModel`]: the model, a resource; it answers after a configurable delay, so a
//!   program can give the produce the latency of a real model without a network, and fails
//!   every Nth call (or every call, during an outage) if asked to.
//! - [`Mailer`]: the dispatcher; it waits a configurable delay per attempt, fails every Nth
//!   attempt with a retryable error if asked to, and counts what it sent, by key.
//! - [`runtime`]: the runtime both programs serve, over any context: a produce that fails is
//!   retried by [`Settings::produce_retry`] and parked after its last attempt.
//! - [`router`]: the HTTP service over a [`RuntimeHandle`]: `POST /orders`,
//!   `POST /approvals/{key}`, `POST /parked/{id}/rearm`, `GET /metrics`; [`serve`] runs it
//!   with the runtime until a [`terminated`] signal, and stops both gracefully.
//!
//! An order of [`APPROVAL_THRESHOLD_CENTS`] or more asks for a human's approval
//! (`act_with_approval`): its confirmation is committed like any other, and delivered once an
//! operator approves it (`POST /approvals/confirm:order:{id}`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use metrics_exporter_prometheus::PrometheusHandle;
use reactifact_core::error::{ApprovalError, BuildError, RearmError, RunError, SubmitError, WriteError};
use reactifact_core::ledger::PARKED_ID_PREFIX;
use reactifact_core::runtime::{ServeReport, Usage, DEFAULT_INBOX_CAPACITY};
use reactifact_core::{
    produce, Agent, Artifact, ArtifactId, Context, DeliveryOptions, DispatchError, Dispatcher, Intent, PendingAction,
    ProduceCall, ProduceError, RetryPolicy, Runtime, RuntimeHandle,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify, Semaphore};
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

/// The agent of [`draft_confirmation`](fn@draft_confirmation).
pub const AGENT: &str = "shop";

/// The produce's name, as parked records and retry timers name it.
pub const PRODUCE: &str = "draft_confirmation";

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

/// Where the runtime parks the order at `order` once its draft failed on every attempt the
/// produce's retry policy allows: `parked:shop/draft_confirmation/{order}`
/// (`parked:shop/draft_confirmation/order:42`).
pub fn parked_id(order: &ArtifactId) -> String {
    format!("{PARKED_ID_PREFIX}{AGENT}/{PRODUCE}/{order}")
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
/// time), and its usage counts words as tokens. It fails every
/// [`failing_every`](StandInModel::failing_every)th call (counting every call, from 1), and
/// every call while an [outage](StandInModel::set_outage) lasts. Cheap to clone; the clones
/// share the count and the outage.
#[derive(Clone, Debug, Default)]
pub struct StandInModel {
    delay: Duration,
    fail_every: u64,
    calls: Arc<AtomicU64>,
    outage: Arc<AtomicBool>,
}

/// The [`StandInModel`] failed a call; a retry of the run asks again.
#[derive(Debug, thiserror::Error)]
#[error("stand-in model: {0}")]
pub struct ModelError(String);

impl StandInModel {
    /// The name the model gives in its requests.
    pub const NAME: &'static str = "stand-in-drafter";

    /// A model that answers after `delay`.
    pub fn new(delay: Duration) -> Self {
        StandInModel {
            delay,
            ..StandInModel::default()
        }
    }

    /// Fails every `n`th call (0: never).
    pub fn failing_every(mut self, n: u64) -> Self {
        self.fail_every = n;
        self
    }

    /// Starts (`true`) or ends an outage: every call fails while it lasts.
    pub fn set_outage(&self, down: bool) {
        self.outage.store(down, Ordering::SeqCst);
    }

    /// How long each answer takes.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Calls so far, failed ones included.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Drafts the confirmation of `request`'s order, with the tokens it used.
    ///
    /// # Errors
    /// [`ModelError`] on every [`failing_every`](StandInModel::failing_every)th call and during
    /// an [outage](StandInModel::set_outage).
    pub async fn draft(&self, request: &DraftRequest) -> Result<(Draft, Usage), ModelError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if self.outage.load(Ordering::SeqCst) {
            return Err(ModelError(format!("call {call} failed: the model is down")));
        }
        let every = self.fail_every;
        if every > 0 && call.is_multiple_of(every) {
            return Err(ModelError(format!("call {call} failed (every {every}th call does)")));
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
/// [`APPROVAL_THRESHOLD_CENTS`] or more. No I/O happens here. A failed model call fails the
/// run: a serving runtime retries it by its produce's retry policy, and parks the order after
/// the last attempt.
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
/// [`delay`](Mailer::new) (tokio time), then fails with a retryable error (a 503) if it is a multiple
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
        if every > 0 && attempt.is_multiple_of(every) {
            // Inside the runtime's `delivery` span: the line carries the key and the attempt.
            tracing::info!("mail service failed the attempt (it fails every {every}th)");
            return Err(DispatchError::retryable(format!(
                "stand-in mail service: 503 Service Unavailable on attempt {attempt} (every {every}th attempt is)"
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

/// How often a serving shop runtime looks at its store without being woken (for work another
/// process committed to its session).
pub const POLL: Duration = Duration::from_secs(1);

/// How the shop's runtime is built.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The model [`draft_confirmation`](fn@draft_confirmation) asks (its clones share its
    /// counts: keep one to set an outage).
    pub model: StandInModel,
    /// How many deliveries run at once.
    pub delivery_concurrency: usize,
    /// How a failed draft is retried, and when it is parked.
    pub produce_retry: RetryPolicy,
    /// How a failed email is retried, and when it is a dead letter.
    pub delivery_retry: RetryPolicy,
    /// How many writes the runtime's inbox holds
    /// ([`RuntimeBuilder::inbox_capacity`](reactifact_core::runtime::RuntimeBuilder::inbox_capacity)).
    pub inbox_capacity: usize,
}

/// The shop's produce retry policy unless [`Settings::produce_retry`] says otherwise: 5
/// attempts, the first retry about 1 s after the first failure, doubling, at most 1 minute
/// apart (so an order whose every attempt fails is parked 7.5 to 15 s after its first failure,
/// the delays being jittered by a factor in [0.5, 1)).
pub fn default_produce_retry() -> RetryPolicy {
    RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60)).max_attempts(5)
}

impl Default for Settings {
    /// An instant model that never fails, the runtime's default delivery concurrency (64), the
    /// [`default_produce_retry`], the default delivery retry policy ([`RetryPolicy::default`])
    /// and the default inbox ([`DEFAULT_INBOX_CAPACITY`] writes).
    fn default() -> Self {
        Settings {
            model: StandInModel::new(Duration::ZERO),
            delivery_concurrency: 64,
            produce_retry: default_produce_retry(),
            delivery_retry: RetryPolicy::default(),
            inbox_capacity: DEFAULT_INBOX_CAPACITY,
        }
    }
}

/// The shop's runtime over `context`: the agent `shop` with
/// [`draft_confirmation`](fn@draft_confirmation), the model of `settings`, and `mailer` as its
/// dispatcher.
///
/// # Errors
/// As [`RuntimeBuilder::build`](reactifact_core::runtime::RuntimeBuilder::build).
pub fn runtime(context: Context, settings: &Settings, mailer: &Mailer) -> Result<Runtime, BuildError> {
    runtime_with(context, settings, mailer.clone())
}

/// As [`runtime`], with any dispatcher (a test's, say, that logs each attempt and hands it on
/// to a [`Mailer`]). While it serves, a draft that fails (the model failed, the produce
/// panicked) is retried alone after its policy's backoff while the other orders go on, and
/// parked at [`parked_id`] after the last attempt, for an operator to re-arm
/// (`POST /parked/{id}/rearm`).
///
/// # Errors
/// As [`RuntimeBuilder::build`](reactifact_core::runtime::RuntimeBuilder::build).
pub fn runtime_with(context: Context, settings: &Settings, dispatcher: impl Dispatcher) -> Result<Runtime, BuildError> {
    Runtime::builder(context)
        .agent(Agent::new(AGENT).produce(draft_confirmation))
        .resource(settings.model.clone())
        .dispatcher(dispatcher)
        .delivery(
            DeliveryOptions::new()
                .concurrency(settings.delivery_concurrency)
                .retry_policy(settings.delivery_retry.clone()),
        )
        .produce_retry_policy(settings.produce_retry.clone())
        .inbox_capacity(settings.inbox_capacity)
        .build()
}

// ---------------------------------------------------------------------------------------------
// The HTTP service
// ---------------------------------------------------------------------------------------------

/// The content type of the Prometheus text exposition format.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// The longest order id `POST /orders` takes.
pub const MAX_ID_LEN: usize = 128;

/// The `Retry-After` of a `503` the service answers when it is overloaded, in seconds.
pub const RETRY_AFTER_SECS: u64 = 1;

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

/// The answer to a committed `POST /orders` (`201` for a new order, `200` for an id that
/// existed).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// Where the order is stored: `order:{id}`.
    pub order: String,
    /// Whether this request created the order; `false`: an order with this id existed (a
    /// retried request), and nothing was written.
    pub created: bool,
    /// The idempotency key of its confirmation email (approve it with
    /// `POST /approvals/{confirmation}` when `needs_approval`).
    pub confirmation: String,
    /// Whether the confirmation waits for an operator's approval (as the request's total
    /// says; for a duplicate, the stored order's total decides).
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

/// The answer to an accepted `POST /parked/{id}/rearm`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Rearmed {
    /// The parked record that was re-armed (and is gone): `parked:shop/draft_confirmation/order:{id}`.
    pub parked: String,
}

/// How many `POST /orders` may wait for their commit at once: the service's admission
/// control. A request that finds every place taken is answered `503` with `Retry-After` at
/// once, so an overload costs a refusal, not a queue that grows without limit. Cheap to clone;
/// the clones share the places.
///
/// The runtime's own inbox is bounded too ([`Settings::inbox_capacity`]), but a handle write
/// that finds it full *waits* for room, and an HTTP server would keep every such request (a
/// task and a socket each) while it waits; [`RuntimeHandle::try_write`] answers
/// [`SubmitError::Full`] at once, but without telling whether a `create_once` created its
/// artifact, which `POST /orders` answers with. So the service counts its own waiting
/// requests, and [`serve`]'s callers give it as many places as the inbox holds.
#[derive(Clone, Debug)]
pub struct Admission {
    places: Arc<Semaphore>,
    limit: usize,
}

impl Admission {
    /// At most `limit` orders waiting for their commit (at least 1).
    pub fn new(limit: usize) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Admission {
            places: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// How many orders wait for their commit now.
    pub fn waiting(&self) -> usize {
        self.limit - self.places.available_permits()
    }

    /// How many may wait at once.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// What the service shares between requests.
#[derive(Clone)]
struct Service {
    handle: RuntimeHandle,
    metrics: PrometheusHandle,
    admission: Admission,
}

/// The shop's HTTP service over a serving runtime's `handle`:
///
/// - `POST /orders` with a [`NewOrder`] as JSON creates the order through the handle
///   (`create_once`) and answers once it is committed (the confirmation is drafted and sent
///   after): `201 Created` with an [`Accepted`] for a new order; `200 OK` with
///   `"created": false` for an id that exists (a retried request: nothing is written, and the
///   stored order stands even if this body differs); `422` for an order it refuses; `503` with
///   `Retry-After: 1` when `admission`'s places are all taken (nothing is written), and `503`
///   when the runtime is gone or the store failed the write.
/// - `POST /approvals/{key}` with a [`NewApproval`] as JSON approves the intent `key`, which
///   awaits approval, and answers `200` with an [`Approved`]; approving again is idempotent.
///   `404` for an unknown key, `409` for one that does not await approval (or was rejected),
///   `422` without a name, `503` when the store failed.
/// - `POST /parked/{id}/rearm` re-arms a parked order (its draft failed on every attempt):
///   `{id}` is the order's id (`42`) or the parked record's whole id, percent-encoded
///   (`parked:shop%2Fdraft_confirmation%2Forder:42`). The produce runs again on the order, with
///   its retry policy's attempts anew. `200` with a [`Rearmed`] once the re-arm is committed,
///   `404` when nothing is parked there, `503` when the runtime is gone or the store failed.
/// - `GET /metrics`: `metrics`' rendering, in the Prometheus text format.
///
/// There is no `GET /parked`: the parked records are in the runtime's context, which a
/// [`RuntimeHandle`] cannot read (`Context::parked` lists them where a context is at hand).
///
/// Errors answer with `{"error": "…"}`. The service records
/// `shop_orders_total{outcome="created"|"duplicate"|"refused"|"overloaded"}` and the histogram
/// `shop_order_intake_seconds` (from the request to the commit) through the `metrics` facade.
pub fn router(handle: RuntimeHandle, metrics: PrometheusHandle, admission: Admission) -> axum::Router {
    metrics::describe_counter!(
        "shop_orders_total",
        "Orders received by POST /orders, by outcome (created; duplicate: the id existed; refused; \
         overloaded: answered 503 at once)."
    );
    metrics::describe_histogram!(
        "shop_order_intake_seconds",
        metrics::Unit::Seconds,
        "Seconds from an order's request to its commit (created and duplicate orders)."
    );
    axum::Router::new()
        .route("/orders", post(post_order))
        .route("/approvals/{key}", post(post_approval))
        .route("/parked/{id}/rearm", post(post_rearm))
        .route("/metrics", get(get_metrics))
        .with_state(Service {
            handle,
            metrics,
            admission,
        })
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

/// A `503` with `Retry-After`: the service is overloaded, and nothing was written.
fn overloaded(message: impl std::fmt::Display) -> Response {
    let mut response = error(StatusCode::SERVICE_UNAVAILABLE, message);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    response
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
    // A place among the orders waiting for their commit, or a 503 at once.
    let Ok(_place) = service.admission.places.clone().try_acquire_owned() else {
        metrics::counter!("shop_orders_total", "outcome" => "overloaded").increment(1);
        return overloaded(format!(
            "overloaded: {} orders wait for their commit; retry later",
            service.admission.limit()
        ));
    };
    let id = ArtifactId::from(order_id(&new.id));
    let order = Order {
        customer: new.customer,
        email: new.email,
        total_cents: new.total_cents,
    };
    let needs_approval = order.total_cents >= APPROVAL_THRESHOLD_CENTS;
    // `create_once`: a retried request (the same id again) writes nothing and is told apart.
    let written = service.handle.create_once(id.clone(), order).await;
    let outcome = match &written {
        Ok(true) => "created",
        Ok(false) => "duplicate",
        Err(_) => "refused",
    };
    metrics::counter!("shop_orders_total", "outcome" => outcome).increment(1);
    match written {
        Ok(created) => {
            metrics::histogram!("shop_order_intake_seconds").record(started.elapsed().as_secs_f64());
            tracing::info!(order = %id, created, needs_approval, "order committed");
            let accepted = Accepted {
                confirmation: confirmation_key(&id),
                order: id.to_string(),
                created,
                needs_approval,
            };
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            (status, Json(accepted)).into_response()
        }
        Err(SubmitError::Write(WriteError::Store(e))) => {
            tracing::warn!(order = %id, error = %e, "the store failed an order's write");
            error(StatusCode::SERVICE_UNAVAILABLE, e)
        }
        Err(SubmitError::Write(e)) => error(StatusCode::UNPROCESSABLE_ENTITY, e),
        // `create_once` waits for room in the inbox: it does not answer `Full`.
        Err(e @ SubmitError::Full(_)) => overloaded(e),
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

async fn post_rearm(State(service): State<Service>, Path(id): Path<String>) -> Response {
    let parked = if id.starts_with(PARKED_ID_PREFIX) {
        id
    } else {
        if let Err(e) = check_id(&id) {
            return error(StatusCode::NOT_FOUND, e);
        }
        parked_id(&ArtifactId::from(order_id(&id)))
    };
    match service.handle.rearm(parked.as_str()).await {
        Ok(()) => {
            tracing::info!(parked = %parked, "parked order re-armed");
            (StatusCode::OK, Json(Rearmed { parked })).into_response()
        }
        Err(e @ RearmError::NotParked { .. }) => error(StatusCode::NOT_FOUND, e),
        Err(RearmError::Write(WriteError::Store(e))) => {
            tracing::warn!(parked = %parked, error = %e, "the store failed a re-arm");
            error(StatusCode::SERVICE_UNAVAILABLE, e)
        }
        Err(e @ RearmError::Write(_)) => error(StatusCode::UNPROCESSABLE_ENTITY, e),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

async fn get_metrics(State(service): State<Service>) -> Response {
    (
        [(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)],
        service.metrics.render(),
    )
        .into_response()
}

// ---------------------------------------------------------------------------------------------
// Serving
// ---------------------------------------------------------------------------------------------

/// Serving the shop failed ([`serve`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The HTTP server failed.
    #[error("the HTTP server failed: {0}")]
    Http(#[source] std::io::Error),
    /// The runtime stopped on an error (a fatal store error).
    #[error("the runtime stopped on an error: {0}")]
    Runtime(#[source] RunError),
    /// The runtime's task panicked.
    #[error("the runtime panicked: {0}")]
    Panicked(String),
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT), with the signal's name; never if neither can be
/// listened for (which is logged).
pub async fn terminated() -> &'static str {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C still stops the service");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = ctrl_c => "Ctrl-C",
        () = terminate => "SIGTERM",
    }
}

/// Serves `runtime` (its turns and its delivery, [`Runtime::serve`] with [`POLL`]) and `app`
/// (built over the runtime's handle) on `listener`, until `shutdown` resolves or the runtime
/// stops on its own (a fatal store error). Then it stops gracefully, in order: the HTTP server
/// stops taking connections and finishes the requests under way (each of which is committed or
/// refused); then the runtime stops: a generation still running is cancelled and its events
/// stay queued for the next start, and deliveries under way get the runtime's shutdown grace
/// to finish. Returns what the runtime served.
///
/// # Errors
/// [`ServiceError`]: the HTTP server failed, or the runtime stopped on an error or panicked.
pub async fn serve(
    mut runtime: Runtime,
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<ServeReport, ServiceError> {
    let handle = runtime.handle();
    let ended = Arc::new(Notify::new());
    let serving = {
        let ended = ended.clone();
        tokio::spawn(async move {
            let report = runtime.serve(POLL).await;
            // Kept for the HTTP server's shutdown, should it wait later.
            ended.notify_one();
            report
        })
    };
    let stop_serving = async move {
        tokio::select! {
            () = shutdown => {}
            () = ended.notified() => tracing::warn!("the runtime stopped serving: shutting down"),
        }
    };
    let http = axum::serve(listener, app)
        .with_graceful_shutdown(stop_serving)
        .await
        .map_err(ServiceError::Http);
    // No request is under way any more: stop the runtime and wait for it.
    handle.stop();
    let report = serving
        .await
        .map_err(|e| ServiceError::Panicked(e.to_string()))?
        .map_err(ServiceError::Runtime)?;
    http.map(|()| report)
}
