//! A `TracePropagation` adapter that panics takes no turn down: its span's ids are minted
//! instead, and the intent is delivered. One test per binary: the propagation is process-wide.
//! (Adopted from the issue-19 review: the panic unwound through the drain and the turn.)

mod otel;

use std::sync::{Arc, Mutex};

use otel::deliver_one_order;
use reactifact_core::runtime::{set_trace_propagation, TraceParent, TracePropagation};

struct Panicky;

impl TracePropagation for Panicky {
    fn context_of(&self, _span: &tracing::Span) -> Option<TraceParent> {
        panic!("the tracing backend's adapter panicked");
    }

    fn continue_from(&self, _span: &tracing::Span, _parent: &TraceParent) {
        panic!("the tracing backend's adapter panicked");
    }
}

#[test]
fn a_panicking_propagation_fails_neither_the_turn_nor_the_delivery() {
    assert!(set_trace_propagation(Panicky).is_ok());
    let handed: Arc<Mutex<Vec<TraceParent>>> = Arc::default();
    let seen = handed.clone();
    let stored = std::panic::catch_unwind(move || deliver_one_order(seen))
        .expect("the turn panicked: a propagation adapter's panic is not caught");
    // The ids were minted: the delivery continues the stored trace.
    let handed = handed.lock().unwrap();
    assert_eq!(handed.len(), 1);
    assert_eq!(handed[0].trace_id(), stored.trace_id());
    assert_ne!(handed[0].parent_id(), stored.parent_id());
}
