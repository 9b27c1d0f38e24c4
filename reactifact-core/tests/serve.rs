//! The long-running modes: `Runtime::serve` with writes sent through a handle, and the
//! standalone `Drainer` next to a runtime on one store.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{order, process_order, Order, Recorder};
use reactifact_core::error::SubmitError;
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::{Agent, Context, DeliveryOptions, DispatchError, Drainer, Intent, RetryPolicy, Runtime, Scope};

fn runtime(ctx: Context, recorder: &Recorder) -> Runtime {
    Runtime::builder(ctx)
        .agent(Agent::new("orders").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_serving_runtime_commits_handle_writes_reacts_and_delivers_until_stopped() {
    let recorder = Recorder::default();
    let rt = runtime(Context::new("orders"), &recorder);
    let handle = rt.handle();
    let writer = tokio::spawn(async move {
        for i in 0..5 {
            handle
                .create(format!("order:{i}"), order("ada", 100 + i))
                .await
                .unwrap();
        }
        // A refused write answers with its error and writes nothing.
        let refused = handle.update("order:missing", order("bob", 1)).await;
        assert!(matches!(refused, Err(SubmitError::Write(_))), "{refused:?}");
        handle
    });
    let serving = common::serving(rt, Duration::from_millis(50));
    let handle = writer.await.unwrap();
    // Every write resolves only once committed; the deliveries follow in the turns after.
    while recorder.sent().len() < 5 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    assert_eq!(report.writes, 5);
    assert_eq!(report.refused_writes, 1);
    assert_eq!(report.delivered, 5);
    let mut sent = recorder.sent();
    sent.sort();
    assert_eq!(sent, (0..5).map(|i| format!("notify:order:{i}")).collect::<Vec<_>>());
    assert_eq!(rt.context().list::<Order>().count(), 5);
    assert_eq!(rt.context().queued_events(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_serving_runtime_retries_when_the_retry_falls_due_without_any_write() {
    let attempts = Arc::new(AtomicU32::new(0));
    let seen = attempts.clone();
    let mut ctx = Context::new("orders");
    ctx.create("order:1", order("ada", 100)).unwrap();
    let rt = Runtime::builder(ctx)
        .agent(Agent::new("orders").produce(process_order()))
        .dispatcher(move |_intent: Intent| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    Err(DispatchError::retryable("down"))
                } else {
                    Ok(())
                }
            }
        })
        .delivery(DeliveryOptions::new().retry_policy(RetryPolicy::exponential(
            Duration::from_secs(60),
            Duration::from_secs(60),
        )))
        .build()
        .unwrap();
    let stop = rt.stop_handle();
    let serving = common::serving(rt, Duration::from_secs(3600));
    // The retry is due 30–60 s after the failure (jitter); the poll interval is an hour.
    while attempts.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop.stop();
    let (rt, report) = serving.await.unwrap();
    assert_eq!(report.failed, 1);
    assert_eq!(report.delivered, 1);
    let delivery = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Delivered);
    assert_eq!(delivery.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_drainer_and_a_runtime_on_one_outbox_send_each_key_once() {
    let mut ctx = Context::new("orders");
    let mut tx = ctx.transaction();
    for i in 0..300 {
        tx.create(format!("order:{i}"), order("ada", i));
    }
    tx.commit().unwrap();
    let outbox = ctx.outbox();
    let runtime_sends = Recorder::default();
    let drainer_sends = Recorder::default();
    // The runtime commits the intents; the drainer delivers concurrently with the runtime's
    // own drain, each in its own task.
    let mut rt = runtime(ctx, &runtime_sends);
    let drainer = Drainer::builder(outbox, drainer_sends.dispatcher())
        .delivery(DeliveryOptions::new().concurrency(8))
        .build()
        .expect("valid delivery options");
    let (turn, drained) = tokio::join!(rt.run(), async {
        let mut delivered = 0;
        for _ in 0..50 {
            delivered += drainer.flush().await.unwrap().delivered;
            tokio::task::yield_now().await;
        }
        delivered
    });
    let turn = turn.unwrap();
    let rest = drainer.settle().await.unwrap().delivered;
    let mut all = runtime_sends.sent();
    all.extend(drainer_sends.sent());
    let total = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 300, "every key sent");
    assert_eq!(total, 300, "no key sent twice");
    assert_eq!(turn.deliveries.delivered + drained + rest, 300);
    assert_eq!(rt.context().ledger().pending().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_drainer_scoped_to_a_kind_leaves_the_other_kinds_alone() {
    let mut ctx = Context::new("orders");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("orders").produce(process_order()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let other = Drainer::builder(rt.context().outbox(), recorder.dispatcher())
        .scope(Scope::all().kinds(["email"]))
        .build()
        .expect("valid delivery options");
    assert_eq!(other.settle().await.unwrap().delivered, 0);
    let notify = Drainer::builder(rt.context().outbox(), recorder.dispatcher())
        .scope(Scope::all().kinds(["notify"]))
        .build()
        .expect("valid delivery options");
    assert_eq!(notify.settle().await.unwrap().delivered, 1);
    assert_eq!(recorder.sent(), vec!["notify:order:1".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn a_runtime_drains_only_its_own_sessions_intents() {
    let mut main = Context::new("main");
    main.create("order:1", order("ada", 1)).unwrap();
    // Main commits its intent without a dispatcher: it stays pending.
    let mut main_rt = Runtime::builder(main)
        .agent(Agent::new("orders").produce(process_order()))
        .build()
        .unwrap();
    main_rt.run().await.unwrap();
    let main = main_rt.into_context();
    // A branch forked after it shares the ledger but not main's intents.
    let mut branch = main.fork("what-if").unwrap();
    branch.create("order:2", order("bob", 2)).unwrap();
    let branch_sends = Recorder::default();
    let mut branch_rt = runtime(branch, &branch_sends);
    branch_rt.run().await.unwrap();
    assert_eq!(branch_sends.sent(), vec!["notify:order:2".to_owned()]);
    let ledger = branch_rt.context().ledger();
    assert_eq!(
        ledger.get("notify:order:1").await.unwrap().unwrap().status(),
        DeliveryStatus::Pending,
        "the branch does not deliver main's intent"
    );
    assert_eq!(ledger.session("what-if").pending().await.unwrap(), 0);
    assert_eq!(ledger.session("main").pending().await.unwrap(), 1);
    let main_sends = Recorder::default();
    let mut main_rt = runtime(main, &main_sends);
    main_rt.flush().await.unwrap();
    assert_eq!(main_sends.sent(), vec!["notify:order:1".to_owned()]);
}

/// A serving runtime's delivery runs beside its turns: writes are acknowledged while a
/// dispatcher hangs for an hour (on the paused clock, a write that waited for it would take the
/// hour), and at the stop the delivery in flight finishes within the grace and is recorded.
#[tokio::test(start_paused = true)]
async fn intake_never_waits_for_a_delivery_and_the_stop_lets_the_one_in_flight_finish() {
    let sent = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = sent.clone();
    let rt = Runtime::builder(Context::new("orders"))
        .agent(Agent::new("orders").produce(process_order()))
        .dispatcher(move |intent: Intent| {
            let seen = seen.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                seen.lock().unwrap().push(intent.key().to_string());
                Ok::<(), DispatchError>(())
            }
        })
        .delivery(
            DeliveryOptions::new()
                .timeout(None)
                .grace(Duration::from_secs(2 * 3600)),
        )
        .build()
        .unwrap();
    let handle = rt.handle();
    let serving = common::serving(rt, Duration::from_secs(24 * 3600));
    let started = tokio::time::Instant::now();
    for i in 0..20 {
        handle
            .create(format!("order:{i}"), order("ada", 100 + i))
            .await
            .unwrap();
        // Each order's generation runs and hands its intent to the hanging dispatcher.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the writes waited for the deliveries: {:?}",
        started.elapsed()
    );
    assert!(sent.lock().unwrap().is_empty(), "no delivery has finished yet");
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    assert_eq!(report.writes, 20);
    assert_eq!(
        report.delivered, 20,
        "the deliveries in flight finished within the grace"
    );
    assert_eq!(sent.lock().unwrap().len(), 20);
    assert_eq!(rt.context().ledger().pending().await.unwrap(), 0);
}

/// A serving runtime without a dispatcher stops at once and leaves its intents pending.
#[tokio::test(start_paused = true)]
async fn a_serving_runtime_without_a_dispatcher_stops_and_leaves_its_intents_pending() {
    let rt = Runtime::builder(Context::new("orders"))
        .agent(Agent::new("orders").produce(process_order()))
        .build()
        .unwrap();
    let handle = rt.handle();
    let serving = common::serving(rt, Duration::from_secs(3600));
    handle.create("order:1", order("ada", 1)).await.unwrap();
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    assert_eq!(report.delivered, 0);
    assert_eq!(report.waiting_intents, 1, "the report says what it left waiting");
    assert_eq!(report.queued_events, 0);
    assert_eq!(rt.context().ledger().pending().await.unwrap(), 1);
}
