//! End to end: a runtime whose outbox delivers through the MCP dispatcher to a local MCP
//! server the test starts.

mod support;

use std::time::Duration;

use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::TraceParent;
use reactifact_core::{
    Agent, Artifact, Context, DeliveryOptions, PendingAction, Produce, ProduceCall, ProduceError, RetryPolicy, Runtime,
};
use reactifact_mcp::{McpDispatcher, McpError, ATTEMPT_META, IDEMPOTENCY_KEY, KIND_META, TRACEPARENT};
use serde::{Deserialize, Serialize};
use support::{Server, Step};

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

/// A runtime over `orders`, whose `notify` intents go through `mcp`, retried after 10 ms to
/// 50 ms (the server is real, so the clock is too).
fn runtime(mcp: McpDispatcher, orders: &[&str]) -> Runtime {
    let mut ctx = Context::new("t");
    for (i, customer) in orders.iter().enumerate() {
        let order = Order {
            customer: (*customer).to_owned(),
            total_cents: 100 * (i as u64 + 1),
        };
        ctx.create(format!("order:{i}"), order).unwrap();
    }
    Runtime::builder(ctx)
        .agent(Agent::new("a").produce(notify_customer()))
        .dispatcher(mcp)
        .delivery(DeliveryOptions::new().retry_policy(RetryPolicy::exponential(
            Duration::from_millis(10),
            Duration::from_millis(50),
        )))
        .build()
        .unwrap()
}

/// `notify` intents call `send_email` on `server`.
fn dispatcher(server: &Server) -> McpDispatcher {
    McpDispatcher::builder(server.url())
        .route("notify", "send_email")
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// The (key, attempt) in the `_meta` of every call the server received.
fn keys_and_attempts(server: &Server) -> Vec<(String, u64)> {
    server
        .received()
        .iter()
        .map(|r| {
            (
                r.meta_str(IDEMPOTENCY_KEY).unwrap().to_owned(),
                r.meta[ATTEMPT_META].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_outbox_calls_the_tool_once_per_intent_with_its_key_in_meta() {
    let server = Server::start(vec![]).await;
    let mut rt = runtime(dispatcher(&server), &["ada", "grace", "barbara"]);
    rt.run().await.unwrap();
    // A second turn has nothing left to deliver.
    rt.run().await.unwrap();

    let mut received = server.received();
    received.sort_by(|a, b| a.meta_str(IDEMPOTENCY_KEY).cmp(&b.meta_str(IDEMPOTENCY_KEY)));
    let keys: Vec<_> = received.iter().map(|r| r.meta_str(IDEMPOTENCY_KEY).unwrap()).collect();
    assert_eq!(keys, ["notify:order:0", "notify:order:1", "notify:order:2"]);
    for (i, (request, customer)) in received.iter().zip(["ada", "grace", "barbara"]).enumerate() {
        assert_eq!(request.meta_str(KIND_META), Some("notify"));
        assert_eq!(request.meta[ATTEMPT_META], 1);
        let order = format!("order:{i}");
        assert_eq!(
            request.arguments,
            serde_json::json!({ "customer": customer, "order": order }),
            "the payload is the tool's arguments"
        );
        let trace: TraceParent = request
            .meta_str(TRACEPARENT)
            .expect("a traceparent in _meta")
            .parse()
            .expect("a valid W3C traceparent");
        let key = format!("notify:{order}");
        let stored = *rt
            .context()
            .ledger()
            .get(&key)
            .await
            .unwrap()
            .unwrap()
            .intent()
            .trace_parent()
            .unwrap();
        assert_eq!(trace.trace_id(), stored.trace_id(), "the decision's trace");
    }
    for key in keys {
        let delivery = rt.context().ledger().get(key).await.unwrap().unwrap();
        assert_eq!(delivery.status(), DeliveryStatus::Delivered, "{key}");
    }
}

#[tokio::test]
async fn a_retry_after_a_failure_carries_the_same_key() {
    let server = Server::start(vec![Step::Rpc(reactifact_mcp::INTERNAL_ERROR)]).await;
    let mut rt = runtime(dispatcher(&server), &["ada"]);
    rt.run().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(
        delivery.status(),
        DeliveryStatus::Failed,
        "an internal error is retried"
    );
    let error = delivery.last_error().unwrap();
    assert!(error.contains("-32603") && error.contains("send_email"), "{error}");

    rt.settle().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((delivery.status(), delivery.attempts()), (DeliveryStatus::Delivered, 2));
    assert_eq!(
        keys_and_attempts(&server),
        [("notify:order:0".to_owned(), 1), ("notify:order:0".to_owned(), 2)]
    );
}

#[tokio::test]
async fn a_tool_error_sends_the_intent_to_the_dead_letter_after_one_call() {
    let server = Server::start(vec![Step::ToolError("mailbox unavailable")]).await;
    let mut rt = runtime(dispatcher(&server), &["ada"]);
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((delivery.status(), delivery.attempts()), (DeliveryStatus::Dead, 1));
    let error = delivery.last_error().unwrap();
    assert!(
        error.contains("mailbox unavailable") && error.contains("`send_email`") && error.contains(&server.url()),
        "{error}"
    );
    assert!(!error.contains("ada"), "the payload is never quoted: {error}");
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_tool_error_classified_as_retryable_is_retried() {
    let server = Server::start(vec![Step::ToolError("try later")]).await;
    let mcp = McpDispatcher::builder(server.url())
        .route("notify", "send_email")
        .on_tool_error(reactifact_mcp::Classification::Retryable)
        .build()
        .unwrap();
    let mut rt = runtime(mcp, &["ada"]);
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((delivery.status(), delivery.attempts()), (DeliveryStatus::Delivered, 2));
}

#[tokio::test]
async fn the_server_going_away_mid_call_is_retried_and_delivered_later() {
    let mut server = Server::start(vec![Step::Hang]).await;
    // rmcp tries to resume a broken stream for a while: the call's timeout ends the attempt.
    let mcp = McpDispatcher::builder(server.url())
        .route("notify", "send_email")
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut rt = runtime(mcp, &["ada"]);
    // The call reaches the tool, which never answers; then the server goes away.
    let (report, ()) = tokio::join!(rt.run(), async {
        server.hanging().await;
        server.stop();
    });
    report.unwrap();
    let delivery = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Failed, "retryable, not dead");
    let error = delivery.last_error().unwrap();
    assert!(error.contains(&server.url()) && error.contains("send_email"), "{error}");

    // A new server on the same address, without the old session: the dispatcher opens a new one.
    server.start_again().await;
    rt.settle().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Delivered);
    let sent = keys_and_attempts(&server);
    assert_eq!(sent.first(), Some(&("notify:order:0".to_owned(), 1)));
    assert_eq!(
        sent.last(),
        Some(&("notify:order:0".to_owned(), u64::from(delivery.attempts())))
    );
    assert!(sent.iter().all(|(key, _)| key == "notify:order:0"), "{sent:?}");
}

#[tokio::test]
async fn a_server_that_is_not_there_is_retried() {
    let mut server = Server::start(vec![]).await;
    server.stop();
    let mut rt = runtime(dispatcher(&server), &["ada"]);
    rt.run().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Failed, "retryable, not dead");
    let error = delivery.last_error().unwrap();
    assert!(
        error.contains("connecting to mcp server") && error.contains(&server.url()),
        "{error}"
    );
    server.start_again().await;
    rt.settle().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Delivered);
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn an_unknown_tool_is_dead_at_once() {
    let server = Server::start(vec![]).await;
    let mcp = McpDispatcher::new(server.url()).unwrap(); // `notify` calls a tool named `notify`
    let mut rt = runtime(mcp.clone(), &["ada"]);
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    let delivery = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((delivery.status(), delivery.attempts()), (DeliveryStatus::Dead, 1));
    let error = delivery.last_error().unwrap();
    assert!(error.contains("-32602") && error.contains("`notify`"), "{error}");
    assert!(server.received().is_empty());

    let error = mcp.call_tool("notify", Default::default()).await.unwrap_err();
    assert!(
        matches!(error, McpError::Rpc { code: -32602, .. }) && !error.is_retryable(),
        "{error}"
    );
}

#[tokio::test]
async fn a_kind_without_a_route_is_held_when_routes_are_restricted() {
    let server = Server::start(vec![]).await;
    let mcp = McpDispatcher::builder(server.url())
        .route("email", "send_email")
        .routes_only()
        .build()
        .unwrap();
    let mut rt = runtime(mcp, &["ada"]);
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.held.len(), 1);
    let delivery = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((delivery.status(), delivery.attempts()), (DeliveryStatus::Held, 0));
    assert!(delivery.last_error().unwrap().contains("`notify`"));
    assert!(server.received().is_empty());
}
