//! Debounce: a debounced produce runs at most once per generation for one trigger, however
//! many of its events arrived, on the newest of them — 1,000 events included, through a run
//! budget, across a reopen of the SQLite store, in replay.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use reactifact_core::audit::EventKind;
use reactifact_core::runtime::{Budget, TurnOutcome};
use reactifact_core::store::Synchronous;
use reactifact_core::{Agent, Context, OpenOptions, Produce, ProduceCall, Runtime};

/// (event kind, trigger id, version, total) of every run.
type Runs = Arc<Mutex<Vec<(EventKind, String, u64, u64)>>>;

fn watcher(name: &'static str, kinds: &[EventKind], debounce: bool, runs: &Runs) -> Produce {
    let runs = runs.clone();
    let produce = Produce::new(name, move |call: ProduceCall<Order>| {
        let runs = runs.clone();
        async move {
            runs.lock().unwrap().push((
                call.event,
                call.trigger.id.to_string(),
                call.trigger.version.0,
                call.trigger.data.total_cents,
            ));
            call.effects.upsert(
                format!("invoice:{name}:{}", call.trigger.id),
                Invoice {
                    order: format!("{} {}", call.event, call.trigger.data.total_cents),
                },
            );
        }
    })
    .creates::<Invoice>()
    .on(kinds.iter().copied());
    if debounce {
        produce.debounce()
    } else {
        produce
    }
}

const ALL: [EventKind; 3] = [EventKind::Created, EventKind::Updated, EventKind::Deleted];

/// One commit that emits 1,000 events for `order:1`: created, then deleted and created again
/// with a new total each time, ending with a deletion of the version with total 499.
fn churned(ctx: &mut Context) {
    let mut tx = ctx.transaction();
    for i in 0..500u64 {
        tx.create("order:1", order("ada", i));
        tx.delete("order:1");
    }
    tx.commit().unwrap();
    assert_eq!(ctx.queued_events(), 1_000);
}

#[tokio::test]
async fn a_debounced_produce_given_1000_events_for_one_trigger_runs_once_on_the_newest() {
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    churned(&mut ctx);
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(watcher("once", &ALL, true, &runs)))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(
        (report.outcome, report.generations, report.runs),
        (TurnOutcome::Completed, 1, 1)
    );
    assert_eq!(
        *runs.lock().unwrap(),
        [(EventKind::Deleted, "order:1".to_owned(), 1, 499)],
        "one run, on the last deletion's last version"
    );
    assert_eq!(rt.context().queued_events(), 0);
    rt.replay().await.unwrap();
}

#[tokio::test]
async fn without_debounce_every_deletion_of_the_batch_runs() {
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    churned(&mut ctx);
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(watcher("each", &ALL, false, &runs)))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!((report.generations, report.runs), (1, 500));
    let totals: Vec<u64> = runs.lock().unwrap().iter().map(|r| r.3).collect();
    assert_eq!(totals, (0..500).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_debounced_produce_given_1000_updates_runs_once_on_the_newest_version() {
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    let mut tx = ctx.transaction();
    for i in 0..1_000u64 {
        tx.create("order:1", order("ada", i));
    }
    tx.commit().unwrap();
    assert_eq!(ctx.queued_events(), 1_000);
    let mut rt = Runtime::builder(ctx)
        .agent(
            Agent::new("a")
                .produce(watcher("once", &ALL, true, &runs))
                .produce(watcher("plain", &ALL, false, &runs)),
        )
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!((report.generations, report.runs), (1, 2));
    // A creation or an update matches only at the current version: both run once.
    assert_eq!(
        *runs.lock().unwrap(),
        [
            (EventKind::Updated, "order:1".to_owned(), 1_000, 999),
            (EventKind::Updated, "order:1".to_owned(), 1_000, 999)
        ]
    );
}

#[tokio::test]
async fn debounce_is_per_trigger_and_per_produce() {
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    let mut tx = ctx.transaction();
    for id in ["order:1", "order:2"] {
        for i in 0..3u64 {
            tx.create(id, order("ada", i));
            tx.delete(id);
        }
    }
    tx.commit().unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(
            Agent::new("a")
                .produce(watcher("first", &[EventKind::Deleted], true, &runs))
                .produce(watcher("second", &[EventKind::Deleted], true, &runs)),
        )
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 4, "two produces, two triggers");
    let mut seen: Vec<(String, u64)> = runs.lock().unwrap().iter().map(|r| (r.1.clone(), r.3)).collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("order:1".to_owned(), 2),
            ("order:1".to_owned(), 2),
            ("order:2".to_owned(), 2),
            ("order:2".to_owned(), 2)
        ]
    );
    // Work order: the run takes the place of the trigger's first event.
    let commit = rt.context().log().unwrap().last().unwrap();
    let order: Vec<String> = commit
        .runs
        .iter()
        .map(|r| format!("{}/{}", r.produce.as_deref().unwrap(), r.trigger.as_ref().unwrap().id))
        .collect();
    assert_eq!(
        order,
        ["first/order:1", "second/order:1", "first/order:2", "second/order:2"]
    );
}

#[tokio::test]
async fn a_merged_event_counts_no_run_against_the_budget() {
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    churned(&mut ctx);
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(watcher("once", &ALL, true, &runs)))
        .build()
        .unwrap();
    let report = rt.run_with(Budget::UNLIMITED.max_runs(1)).await.unwrap();
    assert_eq!((report.outcome, report.runs), (TurnOutcome::Completed, 1));
    assert_eq!(rt.context().queued_events(), 0);

    // Undebounced, the budget cuts the batch after the first deletion.
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    churned(&mut ctx);
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(watcher("each", &ALL, false, &runs)))
        .build()
        .unwrap();
    let report = rt.run_with(Budget::UNLIMITED.max_runs(1)).await.unwrap();
    assert_eq!((report.outcome, report.runs), (TurnOutcome::RunsExhausted, 1));
    assert_eq!(runs.lock().unwrap()[0].3, 0, "the oldest deletion first");
}

#[tokio::test]
async fn a_debounced_batch_queued_in_a_sqlite_file_runs_once_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let options = OpenOptions::new().synchronous(Synchronous::Normal);
    let mut ctx = Context::open_with(&path, "main", options.clone()).unwrap();
    churned(&mut ctx);
    drop(ctx);

    let runs = Runs::default();
    let ctx = Context::open_with(&path, "main", options.clone()).unwrap();
    assert_eq!(ctx.queued_events(), 1_000);
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(watcher("once", &ALL, true, &runs)))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 1);
    assert_eq!(
        *runs.lock().unwrap(),
        [(EventKind::Deleted, "order:1".to_owned(), 1, 499)]
    );
    drop(rt);
    let ctx = Context::open_with(&path, "main", options).unwrap();
    assert_eq!(ctx.queued_events(), 0);
    ctx.verify().unwrap();
    reactifact_core::testing::assert_replays(
        &ctx,
        &[Agent::new("a").produce(watcher("once", &ALL, true, &Runs::default()))],
    )
    .await;
}
