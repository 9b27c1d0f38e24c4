//! The trace context with tracing-opentelemetry: the adapter `docs/observability.md` shows,
//! installed with `set_trace_propagation`, makes the core's spans OpenTelemetry spans of one
//! trace — the produce run's span, the delivery span as its child, the dispatcher handed the
//! delivery span's context — with the core depending on no OpenTelemetry crate.
//!
//! One test per binary: the propagation and the subscriber are process-wide.

use std::sync::{Arc, Mutex};

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use reactifact_core::{
    set_trace_propagation, Agent, Artifact, Context, DispatchError, Intent, PendingAction, Produce, ProduceCall,
    Runtime, TraceParent, TracePropagation,
};
use serde::{Deserialize, Serialize};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

/// The adapter of `docs/observability.md`.
struct Otel;

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

#[test]
fn the_core_spans_join_one_opentelemetry_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    tracing::subscriber::set_global_default(subscriber).unwrap();
    assert!(set_trace_propagation(Otel).is_ok());
    assert!(set_trace_propagation(Otel).is_err(), "installed once");

    let handed: Arc<Mutex<Vec<TraceParent>>> = Arc::default();
    let seen = handed.clone();
    let stored = tokio::runtime::Builder::new_current_thread()
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
                    seen.lock().unwrap().extend(intent.trace_parent().copied());
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
        });
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let span = |name: &str| {
        spans.iter().find(|s| s.name == name).unwrap_or_else(|| {
            panic!(
                "no {name} span among {:?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        })
    };
    let (produce, delivery) = (span("produce"), span("delivery"));
    // The ledger kept the produce span's OpenTelemetry context.
    assert_eq!(stored.trace_id(), produce.span_context.trace_id().to_bytes());
    assert_eq!(stored.parent_id(), produce.span_context.span_id().to_bytes());
    // The delivery span is its child, in its trace.
    assert_eq!(delivery.span_context.trace_id(), produce.span_context.trace_id());
    assert_eq!(delivery.parent_span_id, produce.span_context.span_id());
    // The dispatcher was handed the delivery span's context.
    let handed = handed.lock().unwrap();
    assert_eq!(handed.len(), 1);
    assert_eq!(handed[0].trace_id(), delivery.span_context.trace_id().to_bytes());
    assert_eq!(handed[0].parent_id(), delivery.span_context.span_id().to_bytes());
}
