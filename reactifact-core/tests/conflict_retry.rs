//! Two writers on one session of one store: the one that commits second finds the session
//! advanced, reads the other's commits, and runs its generation again on them — no lost
//! update, no second intent, and the retry is counted in the turn report. (The PostgreSQL
//! crate runs the same race across processes.)

mod common;

use common::*;
use reactifact_core::error::{StoreError, WriteError};
use reactifact_core::runtime::TurnOutcome;
use reactifact_core::{Agent, Context, Runtime};

fn runtime(ctx: Context) -> Runtime {
    Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_stale_runtime_catches_up_and_runs_its_generation_on_the_new_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    Context::open(&path, "orders")
        .unwrap()
        .create("order:1", order("ada", 1200))
        .unwrap();
    // Both writers load generation 1, with order 1's event queued.
    let mut first = runtime(Context::open(&path, "orders").unwrap());
    let mut second = runtime(Context::open(&path, "orders").unwrap());

    // The first takes order 1 (generation 2), then a direct write adds order 2 (generation 3).
    let report = first.run().await.unwrap();
    assert_eq!(report.generations, 1);
    first.context_mut().create("order:2", order("bob", 900)).unwrap();

    // The second's generation for order 1 is fenced out; it reads generations 2 and 3, finds
    // order 1 consumed and order 2 queued, and commits order 2's receipt as generation 4.
    let report = second.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.conflicts, 1, "one generation was run again");
    assert_eq!(report.generations, 1, "only order 2's generation was committed");
    let ctx = second.context();
    assert_eq!(ctx.generation().0, 4);
    assert!(ctx.get::<Receipt>("receipt:order:1").unwrap().is_some());
    assert!(ctx.get::<Receipt>("receipt:order:2").unwrap().is_some());
    assert!(ctx.get::<Order>("order:2").unwrap().is_some());
    assert_eq!(ctx.queued_events(), 0);

    // What the file holds is what the second holds: every write of both, one intent per key.
    let state_hash = ctx.state_hash();
    drop(first);
    drop(second);
    let reopened = Context::open(&path, "orders").unwrap();
    assert_eq!(reopened.generation().0, 4);
    assert_eq!(reopened.state_hash(), state_hash);
    reopened.verify().unwrap();
    let pending = reopened.ledger().pending().await.unwrap();
    assert_eq!(pending, 2, "notify:order:1 and notify:order:2, each once");
    let receipts = reopened
        .log()
        .unwrap()
        .iter()
        .flat_map(|c| &c.runs)
        .filter(|run| run.produce.as_deref() == Some("process_order"))
        .count();
    assert_eq!(receipts, 2, "each order was processed by exactly one committed run");
}

#[tokio::test]
async fn a_direct_write_of_a_stale_context_is_refused_with_a_conflict_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut first = Context::open(&path, "orders").unwrap();
    let mut second = Context::open(&path, "orders").unwrap();
    first.create("order:1", order("ada", 1200)).unwrap();
    let refused = second.create("order:2", order("bob", 900)).unwrap_err();
    assert!(
        matches!(refused, WriteError::Store(StoreError::Conflict { expected: 0, .. })),
        "{refused:?}"
    );
    assert_eq!(second.generation().0, 0);
    assert!(second.get::<Order>("order:2").unwrap().is_none());
    drop((first, second));
    let reopened = Context::open(&path, "orders").unwrap();
    assert_eq!(reopened.generation().0, 1);
    assert!(reopened.get::<Order>("order:2").unwrap().is_none());
}

#[tokio::test]
async fn a_stale_write_that_changes_nothing_here_is_refused_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut first = Context::open(&path, "orders").unwrap();
    first.create("order:1", order("ada", 100)).unwrap();
    let mut second = Context::open(&path, "orders").unwrap();
    first.update("order:1", order("ada", 999)).unwrap();
    first.create("order:2", order("bob", 5)).unwrap();
    // On the stale copy both writes change nothing; at the store's head both would.
    let set = second.create("order:1", order("ada", 100));
    assert!(
        matches!(set, Err(WriteError::Store(StoreError::Conflict { .. }))),
        "{set:?}"
    );
    let deleted = second.delete("order:2");
    assert!(
        matches!(deleted, Err(WriteError::Store(StoreError::Conflict { .. }))),
        "{deleted:?}"
    );
    // Caught up, the same writes apply to the head.
    assert_eq!(second.catch_up().await.unwrap(), 2);
    second.create("order:1", order("ada", 100)).unwrap();
    second.delete("order:2").unwrap();
    drop((first, second));
    let reopened = Context::open(&path, "orders").unwrap();
    assert_eq!(reopened.get::<Order>("order:1").unwrap().unwrap().data.total_cents, 100);
    assert!(reopened.get::<Order>("order:2").unwrap().is_none());
}

#[tokio::test]
async fn a_serving_runtime_writes_a_stale_handle_write_on_the_new_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    Context::open(&path, "orders")
        .unwrap()
        .create("order:1", order("ada", 100))
        .unwrap();
    let serving = Runtime::builder(Context::open(&path, "orders").unwrap())
        .build()
        .unwrap();
    let handle = serving.handle();
    let mut serving = serving;
    let task = tokio::spawn(async move { serving.serve(std::time::Duration::from_secs(3600)).await });
    // Let the serving runtime reach its wait, then another writer changes the order.
    handle.create("order:0", order("eve", 1)).await.unwrap();
    let mut other = Context::open(&path, "orders").unwrap();
    other.update("order:1", order("ada", 999)).unwrap();
    // On the server's stale copy this write changes nothing; at the head it does.
    handle.create("order:1", order("ada", 100)).await.unwrap();
    handle.stop();
    let report = task.await.unwrap().unwrap();
    assert_eq!(report.writes, 2);
    let reopened = Context::open(&path, "orders").unwrap();
    assert_eq!(reopened.get::<Order>("order:1").unwrap().unwrap().data.total_cents, 100);
    assert_eq!(reopened.generation().0, 4);
}
