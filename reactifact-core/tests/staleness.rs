//! Staleness: when an artifact that a committed run of a watching produce read changes, that
//! run (produce, trigger) runs again with `EventKind::Stale`, so what it derived is recomputed;
//! an unchanged recompute writes nothing, so a cascade stops. The readers index survives a
//! reopen of the SQLite store (from the log and from a checkpoint), verify and replay.

mod common;

use std::sync::{Arc, Mutex};

use common::{order, Order};
use reactifact_core::audit::EventKind;
use reactifact_core::runtime::TurnOutcome;
use reactifact_core::store::Synchronous;
use reactifact_core::{Agent, Artifact, Context, OpenOptions, Produce, ProduceCall, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Customer {
    orders: Vec<String>,
}

impl Artifact for Customer {
    const KIND: &'static str = "customer";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Summary {
    total_cents: u64,
}

impl Artifact for Summary {
    const KIND: &'static str = "summary";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Grade {
    grade: String,
}

impl Artifact for Grade {
    const KIND: &'static str = "grade";
}

/// (produce, event kind, trigger id) of every run.
type Runs = Arc<Mutex<Vec<(&'static str, EventKind, String)>>>;

/// On a customer: sums its orders, read through the snapshot, into `summary:{customer}`.
fn summarize(runs: &Runs, stale: bool) -> Produce {
    let runs = runs.clone();
    let produce = Produce::new("summarize", move |call: ProduceCall<Customer>| {
        let runs = runs.clone();
        async move {
            runs.lock()
                .unwrap()
                .push(("summarize", call.event, call.trigger.id.to_string()));
            let mut total_cents = 0;
            for id in &call.trigger.data.orders {
                if let Some(order) = call.snapshot.get::<Order>(id).unwrap() {
                    total_cents += order.data.total_cents;
                }
            }
            call.effects
                .upsert(format!("summary:{}", call.trigger.id), Summary { total_cents });
        }
    })
    .creates::<Summary>();
    if stale {
        produce.stale()
    } else {
        produce
    }
}

/// On a customer: grades it from its summary, read through the snapshot.
fn grade(runs: &Runs) -> Produce {
    let runs = runs.clone();
    Produce::new("grade", move |call: ProduceCall<Customer>| {
        let runs = runs.clone();
        async move {
            runs.lock()
                .unwrap()
                .push(("grade", call.event, call.trigger.id.to_string()));
            let total = call
                .snapshot
                .get::<Summary>(&format!("summary:{}", call.trigger.id))
                .unwrap()
                .map(|s| s.data.total_cents);
            let grade = match total {
                None => "unknown",
                Some(t) if t >= 1_000 => "gold",
                Some(_) => "silver",
            };
            call.effects
                .upsert(format!("grade:{}", call.trigger.id), Grade { grade: grade.into() });
        }
    })
    .creates::<Grade>()
    .stale()
}

fn seed(ctx: &mut Context) {
    let mut tx = ctx.transaction();
    tx.create("order:1", order("ada", 100));
    tx.create("order:2", order("ada", 200));
    tx.create("order:3", order("bob", 999));
    tx.create(
        "customer:ada",
        Customer {
            orders: vec!["order:1".into(), "order:2".into()],
        },
    );
    tx.commit().unwrap();
}

fn runtime(ctx: Context, produces: Vec<Produce>) -> Runtime {
    let agent = produces.into_iter().fold(Agent::new("books"), Agent::produce);
    Runtime::builder(ctx).agent(agent).build().unwrap()
}

fn taken(runs: &Runs) -> Vec<(&'static str, EventKind, String)> {
    std::mem::take(&mut *runs.lock().unwrap())
}

fn total(ctx: &Context) -> u64 {
    ctx.get::<Summary>("summary:customer:ada")
        .unwrap()
        .unwrap()
        .data
        .total_cents
}

fn grade_of(ctx: &Context) -> String {
    ctx.get::<Grade>("grade:customer:ada").unwrap().unwrap().data.grade
}

const ADA: &str = "customer:ada";

#[tokio::test]
async fn a_change_of_what_a_run_read_reruns_it_and_an_unchanged_recompute_stops_the_cascade() {
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    seed(&mut ctx);
    let mut rt = runtime(ctx, vec![summarize(&runs, true), grade(&runs)]);
    let report = rt.run().await.unwrap();
    // Generation 1 runs both on the creation; `grade` read the summary before it existed, so
    // the summary's creation makes it stale: generation 2 grades again.
    assert_eq!((report.generations, report.runs), (2, 3));
    assert_eq!(
        taken(&runs),
        [
            ("summarize", EventKind::Created, ADA.to_owned()),
            ("grade", EventKind::Created, ADA.to_owned()),
            ("grade", EventKind::Stale, ADA.to_owned()),
        ]
    );
    assert_eq!(
        (total(rt.context()), grade_of(rt.context())),
        (300, "silver".to_owned())
    );

    // An order ada has changes: the summary is recomputed (one level), which changes it, so
    // the grade is recomputed too; the grade comes out the same, writes nothing, and the
    // cascade stops there.
    rt.context_mut().update("order:1", order("ada", 150)).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(
        (report.outcome, report.generations, report.runs),
        (TurnOutcome::Completed, 2, 2)
    );
    assert_eq!(
        taken(&runs),
        [
            ("summarize", EventKind::Stale, ADA.to_owned()),
            ("grade", EventKind::Stale, ADA.to_owned()),
        ]
    );
    assert_eq!(
        (total(rt.context()), grade_of(rt.context())),
        (350, "silver".to_owned())
    );
    let grade_version = rt
        .context()
        .get::<Grade>("grade:customer:ada")
        .unwrap()
        .unwrap()
        .version;
    assert_eq!(grade_version.0, 2, "the unchanged grade kept its version");

    // A change that does not change the summary stops at the first level.
    rt.context_mut().update("order:2", order("ada-renamed", 200)).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!((report.generations, report.runs), (1, 1));
    assert_eq!(taken(&runs), [("summarize", EventKind::Stale, ADA.to_owned())]);

    // Crossing the threshold changes the grade: the cascade goes as far as changes go.
    rt.context_mut().update("order:2", order("ada", 900)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(grade_of(rt.context()), "gold");
    assert_eq!(rt.context().queued_events(), 0);
}

#[tokio::test]
async fn what_a_run_did_not_read_or_no_longer_reads_does_not_rerun_it() {
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    seed(&mut ctx);
    let mut rt = runtime(ctx, vec![summarize(&runs, true)]);
    rt.run().await.unwrap();
    taken(&runs);
    // Bob's order was never read.
    rt.context_mut().update("order:3", order("bob", 1)).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 0);
    // Ada drops order 1: the customer's update runs the produce (as an update), whose new run
    // reads order 2 only; a change of order 1 then reruns nothing.
    rt.context_mut()
        .update(
            ADA,
            Customer {
                orders: vec!["order:2".into()],
            },
        )
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [("summarize", EventKind::Updated, ADA.to_owned())]);
    rt.context_mut().update("order:1", order("ada", 7)).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 0);
    assert_eq!(total(rt.context()), 200);
    rt.context_mut().update("order:2", order("ada", 7)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [("summarize", EventKind::Stale, ADA.to_owned())]);
    assert_eq!(total(rt.context()), 7);
}

#[tokio::test]
async fn a_produce_that_does_not_opt_in_is_not_rerun() {
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    seed(&mut ctx);
    let mut rt = runtime(ctx, vec![summarize(&runs, false)]);
    rt.run().await.unwrap();
    taken(&runs);
    rt.context_mut().update("order:1", order("ada", 150)).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 0);
    assert_eq!(total(rt.context()), 300, "nothing recomputed it");
    assert_eq!(rt.context().queued_events(), 0, "the update was consumed");
}

#[tokio::test]
async fn a_deleted_trigger_is_not_rerun_and_a_deleted_read_reruns() {
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    seed(&mut ctx);
    let mut rt = runtime(ctx, vec![summarize(&runs, true)]);
    rt.run().await.unwrap();
    taken(&runs);
    // A deleted read is a change of what the run saw.
    rt.context_mut().delete("order:1").unwrap();
    rt.run().await.unwrap();
    assert_eq!(taken(&runs), [("summarize", EventKind::Stale, ADA.to_owned())]);
    assert_eq!(total(rt.context()), 200);
    // The customer is deleted: a change of its orders reruns nothing.
    let mut tx = rt.context_mut().transaction();
    tx.delete(ADA);
    tx.commit().unwrap();
    rt.run().await.unwrap();
    rt.context_mut().update("order:2", order("ada", 1)).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 0);
    assert!(taken(&runs).is_empty());
}

#[tokio::test]
async fn a_sibling_write_in_the_same_generation_makes_a_run_stale() {
    // `bump` (on the customer too) updates order 1 in the generation where `summarize` reads
    // it: the summary's run did not see the bump, so it is rerun in the next generation.
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    seed(&mut ctx);
    let bump = Produce::new("bump", |call: ProduceCall<Customer>| async move {
        if call.event == EventKind::Created {
            call.effects.update("order:1", order("ada", 1_000));
        }
    });
    let mut rt = runtime(ctx, vec![summarize(&runs, true), bump]);
    rt.run().await.unwrap();
    assert_eq!(
        taken(&runs),
        [
            ("summarize", EventKind::Created, ADA.to_owned()),
            ("summarize", EventKind::Stale, ADA.to_owned()),
        ]
    );
    assert_eq!(total(rt.context()), 1_200);
}

#[tokio::test]
async fn a_run_that_reads_its_own_trigger_runs_once_per_change() {
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    seed(&mut ctx);
    let recorder = runs.clone();
    let reads_itself = Produce::new("reads_itself", move |call: ProduceCall<Customer>| {
        let runs = recorder.clone();
        async move {
            runs.lock()
                .unwrap()
                .push(("reads_itself", call.event, call.trigger.id.to_string()));
            let _ = call.snapshot.get::<Customer>(call.trigger.id.as_str());
        }
    })
    .stale();
    let mut rt = runtime(ctx, vec![reads_itself]);
    rt.run().await.unwrap();
    rt.context_mut().update(ADA, Customer { orders: Vec::new() }).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!((report.generations, report.runs), (1, 1));
    assert_eq!(
        taken(&runs),
        [
            ("reads_itself", EventKind::Created, ADA.to_owned()),
            ("reads_itself", EventKind::Updated, ADA.to_owned()),
        ],
        "the update and the staleness it causes are one run, as the update"
    );
}

fn options() -> OpenOptions {
    OpenOptions::new().synchronous(Synchronous::Normal)
}

#[tokio::test]
async fn the_readers_survive_a_reopen_of_the_sqlite_store_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let runs = Runs::default();
    let mut ctx = Context::open_with(&path, "main", options()).unwrap();
    seed(&mut ctx);
    let mut rt = runtime(ctx, vec![summarize(&runs, true), grade(&runs)]);
    rt.run().await.unwrap();
    drop(rt);

    let mut ctx = Context::open_with(&path, "main", options()).unwrap();
    ctx.update("order:2", order("ada", 5_000)).unwrap();
    taken(&runs);
    let mut rt = runtime(ctx, vec![summarize(&runs, true), grade(&runs)]);
    rt.run().await.unwrap();
    assert_eq!(
        taken(&runs),
        [
            ("summarize", EventKind::Stale, ADA.to_owned()),
            ("grade", EventKind::Stale, ADA.to_owned()),
        ]
    );
    assert_eq!(
        (total(rt.context()), grade_of(rt.context())),
        (5_100, "gold".to_owned())
    );
    drop(rt);

    let ctx = Context::open_with(&path, "main", options()).unwrap();
    let stale_runs = ctx
        .log()
        .unwrap()
        .iter()
        .flat_map(|c| &c.runs)
        .filter(|r| r.trigger.as_ref().is_some_and(|t| t.event == EventKind::Stale))
        .count();
    assert_eq!(stale_runs, 3);
    assert!(ctx
        .log()
        .unwrap()
        .iter()
        .flat_map(|c| &c.runs)
        .filter(|r| r.produce.is_some())
        .all(|r| r.watches_reads));
    ctx.verify().unwrap();
    reactifact_core::testing::assert_replays(
        &ctx,
        &[Agent::new("books")
            .produce(summarize(&Runs::default(), true))
            .produce(grade(&Runs::default()))],
    )
    .await;
}

#[tokio::test]
async fn the_readers_come_from_a_checkpoint_and_verify_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let runs = Runs::default();
    let mut ctx = Context::open_with(&path, "main", options()).unwrap();
    seed(&mut ctx);
    let mut rt = runtime(ctx, vec![summarize(&runs, true), grade(&runs)]);
    rt.run().await.unwrap();
    let at = rt.context().checkpoint().await.unwrap().unwrap();
    rt.context().verify().unwrap();
    drop(rt);
    // The commits up to the checkpoint no longer decode: the index can only come from it.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(&format!(
        "UPDATE commits SET runs = x'c1c1' WHERE session = 'main' AND generation <= {};",
        at.0
    ))
    .unwrap();
    drop(conn);

    let mut ctx = Context::open_with(&path, "main", options()).unwrap();
    ctx.update("order:1", order("ada", 1_000)).unwrap();
    taken(&runs);
    let mut rt = runtime(ctx, vec![summarize(&runs, true), grade(&runs)]);
    rt.run().await.unwrap();
    assert_eq!(
        taken(&runs),
        [
            ("summarize", EventKind::Stale, ADA.to_owned()),
            ("grade", EventKind::Stale, ADA.to_owned()),
        ]
    );
    assert_eq!(grade_of(rt.context()), "gold");
}

#[tokio::test]
async fn a_fork_keeps_the_readers() {
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    seed(&mut ctx);
    let mut rt = runtime(ctx, vec![summarize(&runs, true)]);
    rt.run().await.unwrap();
    let past = rt.context().generation();
    rt.context_mut()
        .create("unrelated", Grade { grade: "x".into() })
        .unwrap();
    rt.run().await.unwrap();
    for branch in [
        rt.context().fork("head").unwrap(),
        rt.context().fork_at("past", past).unwrap(),
    ] {
        taken(&runs);
        let mut branch = branch;
        branch.update("order:1", order("ada", 1)).unwrap();
        let mut brt = runtime(branch, vec![summarize(&runs, true)]);
        brt.run().await.unwrap();
        assert_eq!(taken(&runs), [("summarize", EventKind::Stale, ADA.to_owned())]);
        assert_eq!(total(brt.context()), 201);
    }
}

#[tokio::test]
async fn a_runtime_that_catches_up_with_another_writer_takes_its_readers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut seeded = Context::open_with(&path, "main", options()).unwrap();
    seed(&mut seeded);
    drop(seeded);
    let runs = Runs::default();
    let mut first = runtime(
        Context::open_with(&path, "main", options()).unwrap(),
        vec![summarize(&Runs::default(), true)],
    );
    let mut second = runtime(
        Context::open_with(&path, "main", options()).unwrap(),
        vec![summarize(&runs, true)],
    );
    // The first summarizes; the second's summary of the same creation is fenced out, and it
    // takes the first's commit — and the run it records — instead.
    first.run().await.unwrap();
    let report = second.run().await.unwrap();
    assert_eq!((report.conflicts, report.generations), (1, 0));
    taken(&runs);
    second.context_mut().update("order:1", order("ada", 1)).unwrap();
    second.run().await.unwrap();
    assert_eq!(taken(&runs), [("summarize", EventKind::Stale, ADA.to_owned())]);
    assert_eq!(total(second.context()), 201);
}

#[tokio::test]
async fn a_runs_own_write_of_what_it_read_does_not_make_it_stale() {
    // `count` reads the tally it writes and adds the order's total: were its own write a
    // change it had not seen, it would rerun itself until the generation budget ran out.
    let runs = Runs::default();
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 5)).unwrap();
    let recorder = runs.clone();
    let count = Produce::new("count", move |call: ProduceCall<Order>| {
        let runs = recorder.clone();
        async move {
            runs.lock()
                .unwrap()
                .push(("count", call.event, call.trigger.id.to_string()));
            let seen = call
                .snapshot
                .get::<Summary>("tally")
                .unwrap()
                .map_or(0, |s| s.data.total_cents);
            call.effects.upsert(
                "tally",
                Summary {
                    total_cents: seen + call.trigger.data.total_cents,
                },
            );
        }
    })
    .creates::<Summary>()
    .stale();
    let mut rt = runtime(ctx, vec![count]);
    let report = rt.run().await.unwrap();
    assert_eq!(
        (report.outcome, report.generations, report.runs),
        (TurnOutcome::Completed, 1, 1)
    );
    assert_eq!(
        rt.context().get::<Summary>("tally").unwrap().unwrap().data.total_cents,
        5
    );
    // A change of the tally by someone else is one it did not make: it recomputes.
    taken(&runs);
    rt.context_mut().update("tally", Summary { total_cents: 100 }).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!((report.generations, report.runs), (1, 1));
    assert_eq!(taken(&runs), [("count", EventKind::Stale, "order:1".to_owned())]);
    assert_eq!(
        rt.context().get::<Summary>("tally").unwrap().unwrap().data.total_cents,
        105
    );
}
