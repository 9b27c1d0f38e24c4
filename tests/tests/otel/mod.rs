//! Shared by the trace-propagation suites (`opentelemetry.rs`, `otel_info_filter.rs`,
//! `propagation_panic.rs`; one per binary, since the subscriber and the propagation are
//! process-wide): the OpenTelemetry adapter `docs/observability.md` shows, and one order
//! decided and delivered in memory.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use reactifact_core::{
    Agent, Artifact, Context, DispatchError, Intent, PendingAction, Produce, ProduceCall, Runtime, TraceParent,
    TracePropagation,
};
use serde::{Deserialize, Serialize};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The adapter of `docs/observability.md`.
pub struct Otel;

impl TracePropagation for Otel {
    fn context_of(&self, span: &tracing::Span) -> Option<TraceParent> {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        if !sc.is_valid() {
            return None;
        }
        TraceParent::new(
            sc.trace_id().to_bytes(),
            sc.span_id().to_bytes(),
            sc.trace_flags().to_u8(),
        )
    }

    fn continue_from(&self, span: &tracing::Span, parent: &TraceParent) {
        let remote = SpanContext::new(
            TraceId::from_bytes(parent.trace_id()),
            SpanId::from_bytes(parent.parent_id()),
            TraceFlags::new(parent.flags()),
            true,
            TraceState::default(),
        );
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Order {
    customer: String,
}

impl Artifact for Order {
    const KIND: &'static str = "order";
}

/// One order, decided (a `notify` intent) and delivered in one turn on a memory context; the
/// dispatcher's trace contexts go to `handed`. Returns the producing run's context as the
/// ledger kept it.
pub fn deliver_one_order(handed: Arc<Mutex<Vec<TraceParent>>>) -> TraceParent {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
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
                .dispatcher(move |intent: Intent| {
                    handed.lock().unwrap().extend(intent.trace_parent().copied());
                    async { Ok::<(), DispatchError>(()) }
                })
                .build()
                .unwrap();
            assert_eq!(rt.run().await.unwrap().deliveries.delivered, 1);
            let entry = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
            *entry
                .intent()
                .trace_parent()
                .expect("the ledger keeps the run's context")
        })
}
