//! The documented OpenTelemetry adapter with the layer filtered at INFO (the usual set-up; the
//! core's `produce` and `delivery` spans are DEBUG): the stored context, the delivery and the
//! dispatcher's context are still in the exported turn's trace, not in one of the core's own
//! that no exported span has. One test per binary: the subscriber and the propagation are
//! process-wide. (Adopted from the issue-19 review.)

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
use tracing_subscriber::Layer as _;

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
fn with_debug_spans_filtered_out_the_intent_stays_in_the_turn_s_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry().with(
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("test"))
            .with_filter(tracing::level_filters::LevelFilter::INFO),
    );
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
    // Only the INFO spans are exported: the turn's is the decision's trace in the backend.
    let turn = span("turn");
    assert_eq!(
        stored.trace_id(),
        turn.span_context.trace_id().to_bytes(),
        "the stored context is in no exported trace: the turn's is {:?}, the intent's {stored:?}",
        turn.span_context.trace_id()
    );
    let handed = handed.lock().unwrap();
    assert_eq!(handed[0].trace_id(), stored.trace_id());
}
