//! A `TracePropagation` adapter that panics takes no turn down: its span's ids are minted
//! instead, and the intent is delivered. One test per binary: the propagation is process-wide.
//! (Adopted from the issue-19 review: the panic unwound through the drain and the turn.)

use reactifact_core::{
    set_trace_propagation, Agent, Artifact, Context, DispatchError, Intent, PendingAction, Produce, ProduceCall,
    Runtime, TraceParent, TracePropagation,
};
use serde::{Deserialize, Serialize};

struct Panicky;

impl TracePropagation for Panicky {
    fn continue_from(&self, _span: &tracing::Span, _parent: &TraceParent) {
        panic!("the tracing backend's adapter panicked");
    }
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Order {
    customer: String,
}

impl Artifact for Order {
    const KIND: &'static str = "order";
}

#[test]
fn a_panicking_propagation_fails_the_attempt_not_the_turn() {
    assert!(set_trace_propagation(Panicky).is_ok());
    let turn = std::panic::catch_unwind(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
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
                let mut rt = Runtime::builder(ctx)
                    .agent(Agent::new("mailer").produce(notify))
                    .dispatcher(|_: Intent| async { Ok::<(), DispatchError>(()) })
                    .build()
                    .unwrap();
                rt.run()
                    .await
                    .map(|r| r.deliveries.delivered)
                    .map_err(|e| e.to_string())
            })
    });
    assert!(
        turn.is_ok(),
        "the turn panicked: a propagation adapter's panic is not caught as a dispatcher's is"
    );
}
