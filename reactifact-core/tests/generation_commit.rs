//! What a runtime's generation commit does in its own store write, besides the commit: it
//! consumes the events it emits that no produce reacts to (no write of their own later), and
//! on a durable store it claims the session's due intents for the turn's drain (no claim of
//! its own later). Both must leave exactly what the separate writes left: nothing a produce
//! reacts to is consumed, and a claim the drain never took is released, not left in flight.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use common::*;
use futures_util::FutureExt;
use reactifact_core::error::{RunError, StoreError, WriteError};
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::{Budget, StopHandle, TurnOutcome};
use reactifact_core::{Agent, Context, Produce, ProduceCall, ProduceError, Runtime};

fn seed_order(path: &Path) {
    let mut ctx = Context::open(path, "orders").unwrap();
    ctx.create("order:1", order("ada", 1200)).unwrap();
}

/// A produce on receipts: the receipt events of `process_order` are reacted to.
fn invoice_receipt() -> Produce {
    Produce::new("invoice_receipt", |call: ProduceCall<Receipt>| async move {
        call.effects.upsert(
            format!("invoice:{}", call.trigger.data.order),
            Invoice {
                order: call.trigger.data.order.clone(),
            },
        );
        Ok::<(), ProduceError>(())
    })
    .creates::<Invoice>()
}

#[tokio::test]
async fn the_events_no_produce_reacts_to_are_consumed_by_the_commit_that_emits_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    seed_order(&path);
    let mut rt = Runtime::builder(Context::open(&path, "orders").unwrap())
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    // One generation: the receipt and the pending action it emits react nothing, so nothing
    // is left for a second generation to consume.
    let report = rt.run_with(Budget::UNLIMITED.max_generations(1)).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.generations, 1);
    assert_eq!(rt.context().queued_events(), 0);
    let commit = rt.context().log().unwrap().last().unwrap();
    assert_eq!(
        commit.events_consumed, 3,
        "the order's event and the two the commit emitted"
    );
    drop(rt);

    // Durably so: a reopened session has nothing queued either.
    let ctx = Context::open(&path, "orders").unwrap();
    assert_eq!(ctx.queued_events(), 0);
    assert_eq!(ctx.log().unwrap().len(), 2);
}

#[tokio::test]
async fn an_event_a_produce_reacts_to_stays_queued_with_the_ones_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    seed_order(&path);
    let mut rt = Runtime::builder(Context::open(&path, "orders").unwrap())
        .agent(
            Agent::new("billing")
                .produce(process_order())
                .produce(invoice_receipt()),
        )
        .build()
        .unwrap();
    let report = rt.run_with(Budget::UNLIMITED.max_generations(1)).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::GenerationsExhausted);
    // The receipt (reacted to) comes first, so the pending action's event after it waits too:
    // events are consumed in order.
    assert_eq!(rt.context().queued_events(), 2);
    assert_eq!(rt.context().log().unwrap().last().unwrap().events_consumed, 1);
    drop(rt);

    let ctx = Context::open(&path, "orders").unwrap();
    assert_eq!(ctx.queued_events(), 2, "still queued after a reopen");
    let mut rt = Runtime::builder(ctx)
        .agent(
            Agent::new("billing")
                .produce(process_order())
                .produce(invoice_receipt()),
        )
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert!(rt.context().get::<Invoice>("invoice:order:1").unwrap().is_some());
    assert_eq!(rt.context().queued_events(), 0);
}

#[tokio::test]
async fn a_turn_stopped_after_its_commit_releases_what_the_commit_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    seed_order(&path);
    let stop: Arc<OnceLock<StopHandle>> = Arc::default();
    // The produce asks the runtime to stop while it runs: its generation still commits (the
    // work finished), and the turn stops before its drain hands anything out.
    let stopping = {
        let stop = stop.clone();
        order_flow(move || stop.get().expect("set before the turn").stop())
    };
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(Context::open(&path, "orders").unwrap())
        .agent(Agent::new("billing").produce(stopping))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    stop.set(rt.stop_handle()).unwrap_or_else(|_| unreachable!());
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Stopped);
    assert_eq!(report.generations, 1);
    assert!(recorder.sent().is_empty(), "a stopped turn hands nothing out");

    // The commit's claim was given back: pending, not in flight under a lease for 30 s, and
    // no attempt was spent on it.
    let delivery = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Pending);
    assert_eq!(delivery.attempts(), 0);
    assert!(delivery.lease().is_none());

    // And the next turn delivers it.
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.delivered, 1);
    assert_eq!(recorder.sent(), ["notify:order:1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_dropped_while_its_commit_is_written_cuts_the_context_off_and_a_reopen_continues() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    seed_order(&path);
    let ran = Arc::new(AtomicBool::new(false));
    let mut rt = Runtime::builder(Context::open(&path, "orders").unwrap())
        .agent(Agent::new("billing").produce(order_flow({
            let ran = ran.clone();
            move || ran.store(true, Ordering::SeqCst)
        })))
        .build()
        .unwrap();

    // Another program holds the file's write lock: the generation's commit waits for it (up
    // to the store's busy timeout, much longer than this test takes to get there).
    let locker = rusqlite::Connection::open(&path).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    {
        let mut turn = std::pin::pin!(rt.run());
        // Drive the turn until its produce ran, then a little further, into the commit's
        // write, which cannot finish while the lock is held.
        let mut after = 0;
        while after < 3 {
            if turn.as_mut().now_or_never().is_some() {
                panic!("the turn finished while its commit could not be written");
            }
            if ran.load(Ordering::SeqCst) {
                after += 1;
            }
            tokio::task::yield_now().await;
        }
        // The turn is dropped here, while its commit waits for the lock.
    }
    // The context took its changes back and writes nothing more.
    assert!(rt.context().get::<Receipt>("receipt:order:1").unwrap().is_none());
    let refused = rt.context_mut().create("order:2", order("bob", 100));
    assert!(
        matches!(refused, Err(WriteError::Store(StoreError::CutOff { .. }))),
        "a write after a cut-off commit: {refused:?}"
    );
    assert!(matches!(
        rt.run().await,
        Err(RunError::Store(StoreError::CutOff { .. }))
    ));
    locker.execute_batch("COMMIT").unwrap();
    // Dropping the context waits for its cut-off write to end, so that the reopen reads what
    // it left (a write landing after the reopen read the log would make its next commit a
    // conflict).
    drop(rt);

    // Whether the cut-off commit landed or not, a reopen continues from what the file holds:
    // the order is processed once, its intent registered once.
    let ctx = Context::open(&path, "orders").unwrap();
    ctx.verify().unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    assert!(rt.context().get::<Receipt>("receipt:order:1").unwrap().is_some());
    assert_eq!(rt.context().ledger().len().await.unwrap(), 1);
    assert_eq!(rt.context().log().unwrap().len(), 2, "the seed and one generation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_commit_releases_what_its_claim_took() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    seed_order(&path);
    let ran = Arc::new(AtomicBool::new(false));
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(Context::open(&path, "orders").unwrap())
        .agent(Agent::new("billing").produce(order_flow({
            let ran = ran.clone();
            move || ran.store(true, Ordering::SeqCst)
        })))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    let locker = rusqlite::Connection::open(&path).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    {
        let mut turn = std::pin::pin!(rt.run());
        let mut after = 0;
        while after < 3 {
            assert!(
                turn.as_mut().now_or_never().is_none(),
                "the turn finished while its commit could not be written"
            );
            if ran.load(Ordering::SeqCst) {
                after += 1;
            }
            tokio::task::yield_now().await;
        }
    }
    // The cut-off commit lands once the lock is free, its claim with it; the dropped context
    // waits for it.
    locker.execute_batch("COMMIT").unwrap();
    drop(rt);
    assert!(recorder.sent().is_empty());

    let ctx = Context::open(&path, "orders").unwrap();
    assert_eq!(
        ctx.generation().0,
        2,
        "the cut-off commit landed once the lock was free"
    );
    // Its claim was given back, not left in flight under this process's lease.
    let delivery = ctx.ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Pending);
    assert_eq!(delivery.attempts(), 0);
    assert!(delivery.lease().is_none());
    // The next turn delivers it now, not after a lease.
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(recorder.sent(), ["notify:order:1"]);
}
