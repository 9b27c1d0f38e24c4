//! Every public future of the runtime is `Send`, so a turn can be `tokio::spawn`ed on a
//! multi-thread runtime or driven from a web handler; the context and the runtime can be
//! shared across threads.

mod common;

use common::*;
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::TurnOutcome;
use reactifact_core::{Agent, Context, Runtime};

fn assert_send<T: Send>(_: &T) {}

fn assert_send_sync<T: Send + Sync>() {}

fn runtime(ctx: Context, recorder: &Recorder) -> Runtime {
    Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap()
}

#[test]
fn the_context_and_the_runtime_are_send_and_sync() {
    assert_send_sync::<Context>();
    assert_send_sync::<Runtime>();
}

#[test]
fn every_public_future_of_the_runtime_is_send() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::default();
    let ctx = Context::open(dir.path().join("state.db"), "orders").unwrap();
    let mut rt = runtime(ctx, &recorder);
    let budget = reactifact_core::runtime::Budget::default();
    // Built, checked and dropped: never polled.
    assert_send(&rt.run());
    assert_send(&rt.run_with(budget));
    assert_send(&rt.flush());
    assert_send(&rt.settle());
    assert_send(&rt.replay());
    assert_send(&rt.serve(std::time::Duration::from_secs(1)));
    assert_send(&rt.retry("k"));
    assert_send(&rt.cancel("k", "why"));
    let handle = rt.handle();
    assert_send(&handle.create("order:9", order("ada", 1)));
    let agents = [Agent::new("billing").produce(process_order())];
    assert_send(&rt.context().replay(&agents));
    assert_send(&reactifact_core::testing::assert_replays(rt.context(), &agents));
    assert_send(&rt.context().provenance("k"));
    assert_send(&rt.context().export_audit(Vec::new()));
    let ledger = rt.context().ledger();
    assert_send(&ledger.get("k"));
    assert_send(&ledger.counts());
    assert_send(&ledger.entries());
    let drainer = reactifact_core::Drainer::builder(rt.context().outbox(), recorder.dispatcher())
        .build()
        .expect("valid delivery options");
    assert_send(&drainer.flush());
    assert_send(&drainer.settle());
    assert_send(&drainer.serve(drainer.stop_handle()));
    assert_send_sync::<reactifact_core::Drainer>();
    assert_send_sync::<reactifact_core::store::SqliteOutbox>();
    assert_send_sync::<reactifact_core::store::MemoryOutbox>();
}

#[test]
fn a_turn_over_a_sqlite_context_runs_on_a_spawned_task_of_a_multi_thread_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let recorder = Recorder::default();
    let mut ctx = Context::open(&path, "orders").unwrap();
    ctx.create("order:1", order("ada", 1200)).unwrap();
    let mut rt = runtime(ctx, &recorder);
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (report, rt) = tokio.block_on(async move {
        tokio::spawn(async move {
            let report = rt.run().await.unwrap();
            (report, rt)
        })
        .await
        .unwrap()
    });
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.deliveries.delivered, 1);
    assert_eq!(recorder.sent(), ["notify:order:1"]);
    drop(rt);
    let reopened = Context::open(&path, "orders").unwrap();
    assert_eq!(
        tokio
            .block_on(reopened.ledger().get("notify:order:1"))
            .unwrap()
            .unwrap()
            .status(),
        DeliveryStatus::Delivered
    );
}

/// Every future of a runtime handle is `Send`, so a web handler can await it on any executor.
#[test]
fn handle_futures_are_send() {
    fn assert_send<T: Send>(_: &T) {}
    let rt = reactifact_core::Runtime::builder(reactifact_core::Context::new("s"))
        .build()
        .unwrap();
    let handle = rt.handle();
    assert_send(&handle.write(reactifact_core::Writes::new()));
    assert_send(&handle.try_write(reactifact_core::Writes::new()));
    assert_send(&handle.try_create_once("order:9", order("ada", 1)));
    assert_send(&handle.delete("a:1"));
    assert_send(&handle.link("a:1", "r", "b:1"));
    assert_send(&handle.unlink("a:1", "r", "b:1"));
    assert_send(&handle.approve("k", "ada"));
    assert_send(&handle.reject("k", "ada", "no"));
    assert_send(&handle.retry("k"));
    assert_send(&handle.cancel("k", "no"));
}
