//! The trace context with tracing-opentelemetry: the adapter `docs/observability.md` shows,
//! installed with `set_trace_propagation`, makes the core's spans OpenTelemetry spans of one
//! trace — the produce run's span, the delivery span as its child, the dispatcher handed the
//! delivery span's context — with the core depending on no OpenTelemetry crate.
//!
//! One test per binary: the propagation and the subscriber are process-wide.

mod otel;

use std::sync::{Arc, Mutex};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use otel::{deliver_one_order, Otel};
use reactifact_core::{set_trace_propagation, TraceParent};
use tracing_subscriber::layer::SubscriberExt;

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
