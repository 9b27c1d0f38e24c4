//! Runtimes that cannot do part of the work say so, and never destroy what another runtime
//! needs: without a dispatcher intents stay pending with a warning; without produces the
//! event queue is left for a runtime that has them.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use reactifact_core::runtime::TurnOutcome;
use reactifact_core::{Agent, Context, PendingAction, Produce, ProduceCall, ProduceError, Runtime};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// An event's fields, as (name, value).
type FieldList = Vec<(String, String)>;

/// Records every event at `warn` or above with its fields.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<FieldList>>>);

struct Fields(FieldList);

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.push((field.name().to_owned(), value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl Subscriber for Warnings {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() <= Level::WARN {
            let mut fields = Fields(Vec::new());
            event.record(&mut fields);
            self.0.lock().unwrap().push(fields.0);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Warnings {
    /// The warnings that mention a dispatcher, each as its `waiting` field.
    fn about_the_dispatcher(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|fields| fields.iter().any(|(n, v)| n == "message" && v.contains("dispatcher")))
            .map(|fields| {
                fields
                    .iter()
                    .find(|(n, _)| n == "waiting")
                    .map_or_else(|| format!("no `waiting` field in {fields:?}"), |(_, v)| v.clone())
            })
            .collect()
    }
}

fn block_on<F: std::future::Future>(warnings: &Warnings, future: F) -> F::Output {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(warnings.clone(), || tokio.block_on(future))
}

fn receipt() -> Receipt {
    Receipt {
        order: "order:1".into(),
        total_cents: 1,
    }
}

/// On each receipt, a second intent: a turn of two generations, each followed by a drain.
fn thank_for_receipt() -> Produce {
    Produce::new("thank", |call: ProduceCall<Receipt>| async move {
        call.effects.act("thank", format!("thank:{}", call.trigger.id), &());
        Ok::<(), ProduceError>(())
    })
    .creates::<PendingAction>()
}

#[test]
fn a_runtime_without_a_dispatcher_warns_once_per_turn_and_counts_the_waiting_intents() {
    let warnings = Warnings::default();
    let ctx = seeded([
        ("order:1".to_owned(), order("ada", 1)),
        ("order:2".to_owned(), order("bob", 2)),
    ]);
    let mut rt = Runtime::builder(ctx)
        .agent(
            Agent::new("billing")
                .produce(process_order())
                .produce(thank_for_receipt()),
        )
        .build()
        .unwrap();
    let report = block_on(&warnings, rt.run()).unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.generations, 2);
    assert_eq!(report.deliveries.waiting, 4, "two notify and two thank intents wait");
    assert_eq!(block_on(&warnings, rt.context().ledger().pending()).unwrap(), 4);
    assert_eq!(
        warnings.about_the_dispatcher(),
        ["4"],
        "one warning for the turn, with the count"
    );

    // The next turn has nothing to run, and says so again: the intents still wait.
    let report = block_on(&warnings, rt.run()).unwrap();
    assert_eq!(report.deliveries.waiting, 4);
    assert_eq!(warnings.about_the_dispatcher(), ["4", "4"]);
}

#[test]
fn a_runtime_without_a_dispatcher_and_without_intents_is_quiet() {
    let warnings = Warnings::default();
    let mut ctx = Context::new("t");
    ctx.create("receipt:1", receipt()).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    let report = block_on(&warnings, rt.run()).unwrap();
    assert_eq!(report.deliveries.waiting, 0);
    assert!(warnings.about_the_dispatcher().is_empty());
}

#[tokio::test]
async fn a_delivery_only_runtime_leaves_the_event_queue_to_a_runtime_with_agents() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let recorder = Recorder::default();
    let mut ctx = Context::open(&path, "orders").unwrap();
    ctx.create("order:1", order("ada", 1200)).unwrap();
    ctx.create("order:2", order("bob", 300)).unwrap();
    assert_eq!(ctx.queued_events(), 2);

    // A drainer: a dispatcher and no agent. It delivers what is pending and runs nothing.
    let mut drainer = Runtime::builder(ctx).dispatcher(recorder.dispatcher()).build().unwrap();
    let report = drainer.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!((report.generations, report.runs), (0, 0));
    assert_eq!(drainer.context().queued_events(), 2, "the events stay queued in memory");
    drop(drainer);

    // Nor did it consume them in the file: a runtime with agents opening it later runs them.
    let ctx = Context::open(&path, "orders").unwrap();
    assert_eq!(ctx.queued_events(), 2, "the events stay queued in the file");
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 2);
    assert_eq!(recorder.sent(), ["notify:order:1", "notify:order:2"]);
}

#[tokio::test]
async fn a_runtime_with_nothing_registered_leaves_the_event_queue_alone() {
    let ctx = seeded([("order:1".to_owned(), order("ada", 1))]);
    let mut rt = Runtime::builder(ctx).build().unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(rt.context().queued_events(), 1);
}

#[tokio::test]
async fn events_no_produce_matches_are_consumed_by_a_runtime_with_agents() {
    // The contract: a runtime that has produces consumes the events none of them reacts to,
    // without a commit, so they do not pile up.
    let mut ctx = Context::new("t");
    let mut tx = ctx.transaction();
    tx.create("order:1", order("ada", 1)).create("receipt:1", receipt());
    tx.commit().unwrap();
    let commits = ctx.log().unwrap().len();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.runs, 1, "the order ran; the receipt matched nothing");
    assert_eq!(rt.context().queued_events(), 0);
    assert_eq!(rt.context().log().unwrap().len(), commits + 1);
}
