//! The documented OpenTelemetry adapter with the layer filtered at INFO (the usual set-up; the
//! core's `produce` and `delivery` spans are DEBUG): the stored context, the delivery and the
//! dispatcher's context are still in the exported turn's trace, not in one of the core's own
//! that no exported span has. One test per binary: the subscriber and the propagation are
//! process-wide. (Adopted from the issue-19 review.)

mod otel;

use std::sync::{Arc, Mutex};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use otel::{deliver_one_order, Otel};
use reactifact_core::{set_trace_propagation, TraceParent};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer as _;

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
    let stored = deliver_one_order(handed.clone());
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
