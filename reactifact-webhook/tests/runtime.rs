//! End to end: a runtime whose outbox delivers through the webhook dispatcher.

mod support;

use reactifact_core::{
    Agent, Artifact, Context, DeliveryStatus, PendingAction, Produce, ProduceCall, ProduceError, Runtime,
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
        let delivery = rt.context().ledger().get(key).unwrap();
        assert_eq!(delivery.status(), DeliveryStatus::Delivered, "{key}");
    }
}

/// A runtime over one order, whose `notify` intent goes to `server`.
fn runtime(server: &Server) -> Runtime {
    let mut ctx = Context::new("t");
    let order = Order {
        customer: "ada".to_owned(),
        total_cents: 1200,
    };
    ctx.create("order:1", order).unwrap();
    Runtime::builder(ctx)
        .agent(Agent::new("a").produce(notify_customer()))
        .dispatcher(WebhookDispatcher::new(server.url("/hook")).unwrap())
        .build()
        .unwrap()
}

#[tokio::test]
async fn an_outage_is_ridden_out_with_the_same_key_and_the_receivers_retry_after() {
    // `Retry-After: 0` makes each retry due at once, so `settle` takes no backoff time.
    let busy = Reply::status(503).header("retry-after", "0").body("busy");
    let server = Server::start(vec![busy.clone(), busy, Reply::status(200)]).await;
    let mut rt = runtime(&server);
    rt.run().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:1").unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Failed);
    let error = delivery.last_error().unwrap();
    assert!(error.contains("503") && error.contains("busy"), "{error}");

    rt.settle().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:1").unwrap();
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
    let delivery = rt.context().ledger().get("notify:order:1").unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Dead);
    assert_eq!(delivery.attempts(), 1);
    assert!(delivery.last_error().unwrap().contains("unknown customer"));
    assert_eq!(server.received().len(), 1);
}
