//! The runtime's spans carry correlation fields and never a payload.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use reactifact_core::{Agent, Context, Runtime};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// A span's or event's fields, as (name, value).
type FieldList = Vec<(String, String)>;

/// Records every span with its fields, and every event's fields.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<(String, FieldList)>>>,
    events: Arc<Mutex<Vec<FieldList>>>,
    next: Arc<AtomicU64>,
}

struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut fields = Fields(Vec::new());
        attrs.record(&mut fields);
        self.spans
            .lock()
            .unwrap()
            .push((attrs.metadata().name().to_owned(), fields.0));
        Id::from_u64(self.next.fetch_add(1, Ordering::SeqCst) + 1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(Vec::new());
        event.record(&mut fields);
        self.events.lock().unwrap().push(fields.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn spans_cover_turn_generation_produce_commit_and_delivery_without_payloads() {
    let capture = Capture::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(capture.clone(), || {
        runtime.block_on(async {
            let mut ctx = Context::new("orders");
            ctx.create("order:1", order("secret-customer-name", 4242)).unwrap();
            let mut rt = Runtime::builder(ctx)
                .agent(Agent::new("billing").produce(process_order()))
                .dispatcher(Recorder::default().dispatcher())
                .build()
                .unwrap();
            rt.run().await.unwrap();
        })
    });
    let spans = capture.spans.lock().unwrap().clone();
    let find = |name: &str| {
        spans
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no `{name}` span in {spans:?}"))
            .1
            .clone()
    };
    let field = |fields: &[(String, String)], name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no field `{name}` in {fields:?}"))
            .1
            .clone()
    };
    let turn = find("turn");
    assert_eq!(field(&turn, "turn"), "1");
    assert_eq!(field(&turn, "session"), "orders");
    assert_eq!(field(&find("generation"), "generation"), "2");
    let produce = find("produce");
    assert_eq!(field(&produce, "agent"), "billing");
    assert_eq!(field(&produce, "produce"), "process_order");
    assert_eq!(field(&produce, "artifact_id"), "order:1");
    let commits: Vec<_> = spans
        .iter()
        .filter(|(n, _)| n == "commit")
        .map(|(_, f)| field(f, "generation"))
        .collect();
    assert_eq!(commits, ["1", "2"], "the seed's commit and the generation's");
    assert_eq!(field(&find("delivery"), "action_key"), "notify:order:1");

    let everything = format!("{spans:?}{:?}", capture.events.lock().unwrap());
    assert!(
        !everything.contains("secret-customer-name"),
        "a payload was logged: {everything}"
    );
    assert!(!everything.contains("4242"), "a payload was logged: {everything}");
}
