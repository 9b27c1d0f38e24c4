//! The trace context with tracing-opentelemetry: the adapter `docs/observability.md` shows,
//! installed with `set_trace_propagation`, makes the core's spans OpenTelemetry spans of one
//! trace — the produce run's span, the delivery span as its child, the dispatcher handed the
//! delivery span's context — with the core depending on no OpenTelemetry crate.
//!
//! One test per binary: the propagation and the subscriber are process-wide.

mod otel;

use otel::traced_order;
use tracing::level_filters::LevelFilter;

#[test]
fn the_core_spans_join_one_opentelemetry_trace() {
    let traced = traced_order(LevelFilter::TRACE);
    let stored = traced.stored;
    let (produce, delivery) = (traced.span("produce"), traced.span("delivery"));
    // The ledger kept the produce span's OpenTelemetry context.
    assert_eq!(stored.trace_id(), produce.span_context.trace_id().to_bytes());
    assert_eq!(stored.parent_id(), produce.span_context.span_id().to_bytes());
    // The delivery span is its child, in its trace.
    assert_eq!(delivery.span_context.trace_id(), produce.span_context.trace_id());
    assert_eq!(delivery.parent_span_id, produce.span_context.span_id());
    // The dispatcher was handed the delivery span's context.
    let handed = &traced.handed;
    assert_eq!(handed.len(), 1);
    assert_eq!(handed[0].trace_id(), delivery.span_context.trace_id().to_bytes());
    assert_eq!(handed[0].parent_id(), delivery.span_context.span_id().to_bytes());
}
