//! The documented OpenTelemetry adapter with the layer filtered at INFO (the usual set-up; the
//! core's `produce` and `delivery` spans are DEBUG): the stored context, the delivery and the
//! dispatcher's context are still in the exported turn's trace, not in one of the core's own
//! that no exported span has. One test per binary: the subscriber and the propagation are
//! process-wide. (Adopted from the issue-19 review.)

mod otel;

use otel::traced_order;
use tracing::level_filters::LevelFilter;

#[test]
fn with_debug_spans_filtered_out_the_intent_stays_in_the_turn_s_trace() {
    let traced = traced_order(LevelFilter::INFO);
    let stored = traced.stored;
    // Only the INFO spans are exported: the turn's is the decision's trace in the backend.
    let turn = traced.span("turn");
    assert_eq!(
        stored.trace_id(),
        turn.span_context.trace_id().to_bytes(),
        "the stored context is in no exported trace: the turn's is {:?}, the intent's {stored:?}",
        turn.span_context.trace_id()
    );
    let handed = &traced.handed;
    assert_eq!(handed[0].trace_id(), stored.trace_id());
}
