//! A serving runtime never fails on a produce: a failed run is retried alone by its produce's
//! policy while the rest of its generation commits, and after its last attempt its event is
//! parked for an operator, who re-arms it.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{order, Order, Receipt, Recorder};
use reactifact_core::error::RearmError;
use reactifact_core::{Agent, Context, PendingAction, Produce, ProduceCall, ProduceError, RetryPolicy, Runtime};

/// The order flow (a receipt and a `notify` intent per order), failing on `order:1` while
/// `fail` says so: with an error, or a panic when `panic` is set. Counts the runs on `order:1`.
fn flaky(fail: Arc<AtomicBool>, panic: bool, runs_on_1: Arc<AtomicU32>) -> Produce {
    Produce::new("process_order", move |call: ProduceCall<Order>| {
        let id = call.trigger.id.to_string();
        let failing = id == "order:1" && fail.load(Ordering::SeqCst);
        if id == "order:1" {
            runs_on_1.fetch_add(1, Ordering::SeqCst);
        }
        async move {
            if failing {
                if panic {
                    panic!("the model said 503");
                }
                return Err(ProduceError::msg("the model said 503"));
            }
            call.effects.upsert(
                format!("receipt:{id}"),
                Receipt {
                    order: id.clone(),
                    total_cents: call.trigger.data.total_cents,
                },
            );
            call.effects.act("notify", format!("notify:{id}"), &id);
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Receipt>()
    .creates::<PendingAction>()
}

fn runtime(produce: Produce, recorder: &Recorder) -> Runtime {
    Runtime::builder(Context::new("orders"))
        .agent(Agent::new("orders").produce(produce))
        .dispatcher(recorder.dispatcher())
        .produce_retry_policy(RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(8)).max_attempts(3))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_is_retried_alone_and_commits_when_it_succeeds() {
    let fail = Arc::new(AtomicBool::new(true));
    let runs = Arc::new(AtomicU32::new(0));
    let recorder = Recorder::default();
    let rt = runtime(flaky(fail.clone(), false, runs.clone()), &recorder);
    let handle = rt.handle();
    let serving = common::serving(rt, Duration::from_secs(3600));
    let mut batch = reactifact_core::Writes::new();
    for i in 0..3 {
        batch.create(format!("order:{i}"), order("ada", i));
    }
    handle.write(batch).await.unwrap();
    // The other orders of the generation commit and go out at once.
    while recorder.sent().len() < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The first retry (after 0.5–1 s) fails too; the model recovers before the second.
    while runs.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fail.store(false, Ordering::SeqCst);
    while recorder.sent().len() < 3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(report.failed_runs, 2);
    assert_eq!(report.runs, 3, "the runs committed, each once");
    assert_eq!(report.parked, 0);
    assert_eq!(report.delivered, 3);
    let ctx = rt.context();
    assert!(ctx.get::<Receipt>("receipt:order:1").unwrap().is_some());
    assert_eq!(
        ctx.pending_timers(),
        0,
        "the retry timer is gone once the run succeeded"
    );
    assert!(ctx
        .get::<reactifact_core::Timer>("timer:retry/orders/process_order/order:1")
        .unwrap()
        .is_none());
    assert_eq!(ctx.parked().count(), 0);
    assert_eq!(ctx.queued_events(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_produce_that_panics_every_time_is_parked_and_an_operator_re_arms_it() {
    let fail = Arc::new(AtomicBool::new(true));
    let runs = Arc::new(AtomicU32::new(0));
    let recorder = Recorder::default();
    let rt = runtime(flaky(fail.clone(), true, runs.clone()), &recorder);
    let handle = rt.handle();
    let serving = common::serving(rt, Duration::from_secs(3600));
    handle.create("order:1", order("ada", 1)).await.unwrap();
    // Three attempts (the policy's), then parked; the service stays up and takes more orders.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    handle.create("order:2", order("bob", 2)).await.unwrap();
    while recorder.sent().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(recorder.sent(), ["notify:order:2"]);
    // An unknown id is refused and writes nothing.
    let unknown = handle.rearm("parked:orders/process_order/order:9").await;
    assert!(matches!(unknown, Err(RearmError::NotParked { .. })), "{unknown:?}");
    // Fixed, the operator re-arms it: it runs again and commits.
    fail.store(false, Ordering::SeqCst);
    handle.rearm("parked:orders/process_order/order:1").await.unwrap();
    while recorder.sent().len() < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    assert_eq!(report.failed_runs, 3);
    assert_eq!(report.parked, 1);
    let ctx = rt.context();
    assert_eq!(ctx.parked().count(), 0, "the re-armed event is no longer parked");
    assert!(ctx.get::<Receipt>("receipt:order:1").unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_parked_event_names_its_produce_trigger_attempts_and_error() {
    let fail = Arc::new(AtomicBool::new(true));
    let runs = Arc::new(AtomicU32::new(0));
    let recorder = Recorder::default();
    let rt = runtime(flaky(fail, false, runs), &recorder);
    let handle = rt.handle();
    let serving = common::serving(rt, Duration::from_secs(3600));
    handle.create("order:1", order("ada", 1)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    handle.stop();
    let (mut rt, _) = serving.await.unwrap();
    let parked: Vec<_> = rt.context().parked().map(Result::unwrap).collect();
    assert_eq!(parked.len(), 1);
    let record = &parked[0];
    assert_eq!(record.id.as_str(), "parked:orders/process_order/order:1");
    let run = &record.data.run;
    assert_eq!((run.agent.as_str(), run.produce.as_str()), ("orders", "process_order"));
    assert_eq!(run.trigger.as_str(), "order:1");
    assert_eq!(run.attempts, 3);
    assert!(run.error.contains("the model said 503"), "{}", run.error);
    assert_eq!(rt.context().pending_timers(), 0);
    assert!(
        rt.context()
            .get::<reactifact_core::Timer>("timer:retry/orders/process_order/order:1")
            .unwrap()
            .is_none(),
        "a parked run keeps no retry timer"
    );
    // Parked events survive in the state; re-armed without serving, the next turn runs it.
    rt.rearm("parked:orders/process_order/order:1").await.unwrap();
    assert_eq!(rt.context().parked().count(), 0);
    assert_eq!(rt.context().pending_timers(), 1);
}
