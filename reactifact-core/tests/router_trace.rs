//! A `Router` handler gets the delivery attempt's trace context (`ActionCall::trace_parent`),
//! so that a typed handler forwards `traceparent` downstream as a plain dispatcher does.
//! (Adopted from the issue-19 review: the field was missing.)

use std::sync::{Arc, Mutex};

use reactifact_core::runtime::TraceParent;
use reactifact_core::{ActionCall, Agent, Artifact, Context, PendingAction, Produce, ProduceCall, Router, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Order {
    customer: String,
}

impl Artifact for Order {
    const KIND: &'static str = "order";
}

#[tokio::test]
async fn a_router_handler_is_handed_the_attempt_s_trace_context() {
    let mut ctx = Context::new("shop");
    ctx.create("order:1", Order { customer: "ada".into() }).unwrap();
    let notify = Produce::new("notify", |call: ProduceCall<Order>| async move {
        call.effects.act(
            "notify",
            format!("notify:{}", call.trigger.id),
            &call.trigger.data.customer,
        );
    })
    .creates::<PendingAction>();
    let handed: Arc<Mutex<Vec<Option<TraceParent>>>> = Arc::default();
    let seen = handed.clone();
    let router = Router::new().on("notify", move |call: ActionCall<String>| {
        seen.lock().unwrap().push(call.trace_parent); // no such field today
        async { Ok(()) }
    });
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("mailer").produce(notify))
        .dispatcher(router)
        .build()
        .unwrap();
    assert_eq!(rt.run().await.unwrap().deliveries.delivered, 1);
    let stored = *rt
        .context()
        .ledger()
        .get("notify:order:1")
        .await
        .unwrap()
        .unwrap()
        .intent()
        .trace_parent()
        .unwrap();
    let handed = handed.lock().unwrap();
    assert_eq!(handed[0].map(|t| t.trace_id()), Some(stored.trace_id()));
}
