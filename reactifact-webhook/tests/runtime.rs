//! End to end: a runtime whose outbox delivers through the webhook dispatcher.

mod support;

use std::time::Duration;

use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::TraceParent;
use reactifact_core::{
    Agent, Artifact, Context, DeliveryOptions, PendingAction, Produce, ProduceCall, ProduceError, RetryPolicy, Runtime,
};
use reactifact_webhook::WebhookDispatcher;
use serde::{Deserialize, Serialize};
use support::{Reply, Server};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Order {
    customer: String,
    total_cents: u64,
}

impl Artifact for Order {
    const KIND: &'static str = "order";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Notify {
    customer: String,
    order: String,
}

/// A `notify` intent per order, keyed by the order id.
fn notify_customer() -> Produce {
    Produce::new("notify_customer", |call: ProduceCall<Order>| async move {
        let id = call.trigger.id.to_string();
        call.effects.act(
            "notify",
            format!("notify:{id}"),
            &Notify {
                customer: call.trigger.data.customer.clone(),
                order: id,
            },
        );
        Ok::<(), ProduceError>(())
    })
    .creates::<PendingAction>()
}

#[tokio::test]
async fn the_outbox_posts_each_intent_once_with_its_key() {
    let server = Server::start(vec![Reply::status(200)]).await;
    let mut ctx = Context::new("t");
    for (i, customer) in ["ada", "grace", "barbara"].into_iter().enumerate() {
        let order = Order {
            customer: customer.to_owned(),
            total_cents: 100 * (i as u64 + 1),
        };
        ctx.create(format!("order:{i}"), order).unwrap();
    }
    let webhook = WebhookDispatcher::new(server.url("/hook")).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(notify_customer()))
        .dispatcher(webhook)
        .build()
        .unwrap();
    rt.run().await.unwrap();
    // A second turn has nothing left to deliver.
    rt.run().await.unwrap();

    let mut received = server.received();
    received.sort_by(|a, b| a.header("idempotency-key").cmp(&b.header("idempotency-key")));
    let keys: Vec<_> = received.iter().map(|r| r.header("idempotency-key").unwrap()).collect();
    assert_eq!(keys, ["notify:order:0", "notify:order:1", "notify:order:2"]);
    for (request, customer) in received.iter().zip(["ada", "grace", "barbara"]) {
        assert_eq!(request.header("x-reactifact-kind"), Some("notify"));
        assert_eq!(request.header("x-reactifact-attempt"), Some("1"));
        assert_eq!(request.json()["customer"], customer);
    }
    for key in keys {
        let delivery = rt.context().ledger().get(key).await.unwrap().unwrap();
        assert_eq!(delivery.status(), DeliveryStatus::Delivered, "{key}");
    }
}

/// A runtime over one order, whose `notify` intent goes to `server`, retried after 10 ms to
/// 50 ms (the server is real, so the clock is too).
fn runtime(server: &Server) -> Runtime {
    runtime_with(WebhookDispatcher::new(server.url("/hook")).unwrap())
}

fn runtime_with(webhook: WebhookDispatcher) -> Runtime {
    let mut ctx = Context::new("t");
    let order = Order {
        customer: "ada".to_owned(),
        total_cents: 1200,
    };
    ctx.create("order:1", order).unwrap();
    Runtime::builder(ctx)
        .agent(Agent::new("a").produce(notify_customer()))
        .dispatcher(webhook)
        .delivery(DeliveryOptions::new().retry_policy(RetryPolicy::exponential(
            Duration::from_millis(10),
            Duration::from_millis(50),
        )))
        .build()
        .unwrap()
}

/// The (key, attempt) headers of every request the server received.
fn keys_and_attempts(server: &Server) -> Vec<(String, String)> {
    server
        .received()
        .iter()
        .map(|r| {
            (
                r.header("idempotency-key").unwrap().to_owned(),
                r.header("x-reactifact-attempt").unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn an_outage_is_ridden_out_with_the_same_key_and_the_receivers_retry_after() {
    // `Retry-After: 0` does not hurry a retry: the policy's short backoff still applies.
    let busy = Reply::status(503).header("retry-after", "0").body("busy");
    let server = Server::start(vec![busy.clone(), busy, Reply::status(200)]).await;
    let mut rt = runtime(&server);
    rt.run().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Failed);
    let error = delivery.last_error().unwrap();
    assert!(error.contains("503") && error.contains("busy"), "{error}");

    rt.settle().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Delivered);
    assert_eq!(delivery.attempts(), 3);
    let received = server.received();
    let sent: Vec<_> = received
        .iter()
        .map(|r| {
            (
                r.header("idempotency-key").unwrap(),
                r.header("x-reactifact-attempt").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        sent,
        [
            ("notify:order:1", "1"),
            ("notify:order:1", "2"),
            ("notify:order:1", "3")
        ]
    );
}

#[tokio::test]
async fn a_400_sends_the_intent_to_the_dead_letter_after_one_post() {
    let server = Server::start(vec![Reply::status(400).body("unknown customer")]).await;
    let mut rt = runtime(&server);
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Dead);
    assert_eq!(delivery.attempts(), 1);
    assert!(delivery.last_error().unwrap().contains("unknown customer"));
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_409_for_a_key_still_in_progress_is_retried_with_the_same_key() {
    let in_progress = Reply::status(409).body("a request with this key is in progress");
    let server = Server::start(vec![in_progress, Reply::status(200)]).await;
    let mut rt = runtime(&server);
    rt.run().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Failed, "retried, not dead");
    assert!(delivery.next_attempt_at().is_some());
    rt.settle().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!((delivery.status(), delivery.attempts()), (DeliveryStatus::Delivered, 2));
    let sent = keys_and_attempts(&server);
    assert_eq!(
        sent,
        [
            ("notify:order:1".into(), "1".into()),
            ("notify:order:1".into(), "2".into())
        ]
    );
}

#[tokio::test]
async fn a_kind_without_a_url_is_held_in_the_ledger_not_dead() {
    let server = Server::start(vec![Reply::status(200)]).await;
    let webhook = WebhookDispatcher::builder()
        .route("email", server.url("/email"))
        .build()
        .unwrap();
    let mut rt = runtime_with(webhook);
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.held.len(), 1);
    assert!(report.deliveries.dead.is_empty(), "{:?}", report.deliveries.dead);
    let delivery = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!((delivery.status(), delivery.attempts()), (DeliveryStatus::Held, 0));
    assert!(delivery.last_error().unwrap().contains("`notify`"));
    assert!(server.received().is_empty());
}

/// Every request carries a valid W3C `traceparent`: in the trace of the produce run that
/// committed the intent (as the ledger kept it), with the delivery attempt's span as parent.
#[tokio::test]
async fn each_request_carries_the_trace_of_the_decision() {
    let server = Server::start(vec![Reply::status(500), Reply::status(200)]).await;
    let mut ctx = Context::new("t");
    ctx.create(
        "order:0",
        Order {
            customer: "ada".into(),
            total_cents: 100,
        },
    )
    .unwrap();
    let webhook = WebhookDispatcher::new(server.url("/hook")).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(notify_customer()))
        .dispatcher(webhook)
        .delivery(DeliveryOptions::new().retry_policy(RetryPolicy::exponential(Duration::ZERO, Duration::ZERO)))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    // The retry, due at once (zero backoff), within one settle.
    rt.settle().await.unwrap();
    let received = server.received();
    assert_eq!(received.len(), 2, "one failed attempt, one delivered");
    let stored = *rt
        .context()
        .ledger()
        .get("notify:order:0")
        .await
        .unwrap()
        .unwrap()
        .intent()
        .trace_parent()
        .expect("the ledger keeps the producing run's trace context");
    let mut parents = Vec::new();
    for request in &received {
        let header = request.header("traceparent").expect("a traceparent header");
        let trace: TraceParent = header.parse().expect("a valid W3C traceparent");
        assert_eq!(trace.to_string(), header, "lowercase, version 00");
        assert_eq!(trace.trace_id(), stored.trace_id(), "the decision's trace");
        assert_ne!(
            trace.parent_id(),
            stored.parent_id(),
            "the parent is the delivery's span, not the run's"
        );
        parents.push(trace.parent_id());
    }
    assert_ne!(parents[0], parents[1], "each attempt is a span of its own");
}
