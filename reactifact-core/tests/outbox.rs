//! The outbox contract: intents commit with their state and are delivered once per key.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use reactifact_core::error::{FlushError, RetryError, RunError};
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::{DeliveryErrors, TurnOutcome};
use reactifact_core::{
    Agent, Context, DeliveryOptions, DispatchError, Intent, PendingAction, Produce, ProduceCall, Runtime,
};

#[tokio::test]
async fn an_intent_is_delivered_once_after_its_commit() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1200)).unwrap();
    let recorder = Recorder::default();
    let seen_committed = Arc::new(AtomicUsize::new(0));
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher({
            let recorder = recorder.clone();
            let seen = seen_committed.clone();
            move |intent: Intent| {
                let recorder = recorder.clone();
                let seen = seen.clone();
                async move {
                    let notify: Notify = intent.payload().unwrap();
                    assert_eq!(notify.customer, "ada");
                    assert_eq!(intent.attempt(), 1);
                    seen.fetch_add(intent.generation().0 as usize, Ordering::SeqCst);
                    recorder.sent.lock().unwrap().push(intent.key().to_string());
                    Ok::<(), DispatchError>(())
                }
            }
        })
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.deliveries.delivered, 1);
    assert_eq!(recorder.sent(), ["notify:order:1"]);
    // The intent came from generation 2 (the seed is generation 1).
    assert_eq!(seen_committed.load(Ordering::SeqCst), 2);
    let delivery = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Delivered);
    assert_eq!(delivery.attempts(), 1);
    assert_eq!(delivery.kind(), "notify");
    assert!(delivery.delivered_at().is_some());
    let action = rt
        .context()
        .get::<PendingAction>("action:notify:order:1")
        .unwrap()
        .unwrap();
    assert_eq!(action.data.kind, "notify");
    assert_eq!(action.data.payload::<Notify>().unwrap().order, "order:1");
}

#[tokio::test]
async fn two_agents_reacting_to_one_event_write_one_intent_and_one_delivery() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1200)).unwrap();
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .agent(Agent::new("audit").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(recorder.sent(), ["notify:order:1"]);
    assert_eq!(rt.context().ledger().len().await.unwrap(), 1);
    assert_eq!(rt.context().list::<PendingAction>().count(), 1);
}

#[tokio::test]
async fn a_re_run_produce_creates_no_second_intent() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1200)).unwrap();
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let action_hash = rt
        .context()
        .get::<PendingAction>("action:notify:order:1")
        .unwrap()
        .unwrap()
        .hash;
    // A later edit of the order re-runs the produce: the receipt is refreshed, the intent
    // already exists and nothing is sent again.
    rt.context_mut().update("order:1", order("ada", 1500)).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 1);
    assert_eq!(report.deliveries.delivered, 0);
    assert_eq!(recorder.sent(), ["notify:order:1"]);
    let receipt = rt.context().get::<Receipt>("receipt:order:1").unwrap().unwrap();
    assert_eq!((receipt.data.total_cents, receipt.version.0), (1500, 2));
    let action = rt
        .context()
        .get::<PendingAction>("action:notify:order:1")
        .unwrap()
        .unwrap();
    assert_eq!(action.version.0, 1);
    assert_eq!(action.hash, action_hash, "delivery state never enters the content");
}

#[tokio::test]
async fn act_reports_an_existing_intent() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let results = Arc::new(std::sync::Mutex::new(Vec::new()));
    let twice = {
        let results = results.clone();
        Produce::new("twice", move |call: ProduceCall<Order>| {
            let results = results.clone();
            async move {
                let first = call.effects.act("notify", "k", &1u8);
                let second = call.effects.act("notify", "k", &1u8);
                results.lock().unwrap().push((first.is_some(), second.is_some()));
            }
        })
        .creates::<PendingAction>()
    };
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(twice))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.context_mut().update("order:1", order("ada", 2)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(*results.lock().unwrap(), [(true, false), (false, false)]);
    assert_eq!(
        rt.context().ledger().pending().await.unwrap(),
        1,
        "no dispatcher: the intent waits"
    );
}

#[tokio::test]
async fn a_failed_delivery_is_recorded_and_retry_then_flush_delivers_it_once() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1200)).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let delivered = Arc::new(AtomicUsize::new(0));
    let dispatcher = {
        let calls = calls.clone();
        let delivered = delivered.clone();
        move |intent: Intent| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            let delivered = delivered.clone();
            async move {
                assert_eq!(intent.key().as_str(), "notify:order:1");
                if n == 0 {
                    return Err(DispatchError::msg("smtp unavailable"));
                }
                delivered.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }
    };
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .delivery(DeliveryOptions::new().errors(DeliveryErrors::FailLoud))
        .build()
        .unwrap();
    let err = rt.run().await.unwrap_err();
    let RunError::Delivery(failure) = &err else {
        panic!("expected a delivery error, got {err}");
    };
    assert_eq!((failure.attempt, failure.error.as_str()), (1, "smtp unavailable"));
    let entry = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(entry.status(), DeliveryStatus::Failed);
    assert_eq!(entry.attempts(), 1);
    assert_eq!(entry.last_error(), Some("smtp unavailable"));
    // The commit stands: the receipt exists, and a failed intent is not redelivered by itself.
    assert!(rt.context().get::<Receipt>("receipt:order:1").unwrap().is_some());
    assert_eq!(rt.flush().await.unwrap().delivered, 0);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    rt.retry("notify:order:1").await.unwrap();
    let report = rt.flush().await.unwrap();
    assert_eq!(report.delivered, 1);
    let entry = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(entry.status(), DeliveryStatus::Delivered);
    assert_eq!(entry.attempts(), 2);
    assert_eq!(entry.last_error(), None);
    assert_eq!(rt.flush().await.unwrap().delivered, 0);
    assert_eq!(delivered.load(Ordering::SeqCst), 1);

    assert!(matches!(
        rt.retry("notify:order:1").await,
        Err(RetryError::NotFailed {
            status: DeliveryStatus::Delivered,
            ..
        })
    ));
    assert!(matches!(rt.retry("nope").await, Err(RetryError::UnknownKey(_))));
}

#[tokio::test]
async fn one_failing_delivery_does_not_block_the_others() {
    let mut ctx = Context::new("t");
    let mut tx = ctx.transaction();
    tx.create("order:1", order("ada", 1)).create("order:2", order("bob", 2));
    tx.commit().unwrap();
    let recorder = Recorder::default();
    let dispatcher = {
        let recorder = recorder.clone();
        move |intent: Intent| {
            let recorder = recorder.clone();
            async move {
                if intent.key().as_str() == "notify:order:1" {
                    return Err(DispatchError::msg("mailbox full"));
                }
                recorder.sent.lock().unwrap().push(intent.key().to_string());
                Ok(())
            }
        }
    };
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.deliveries.delivered, 1);
    assert_eq!(report.deliveries.failed.len(), 1);
    assert_eq!(report.deliveries.failed[0].key.as_str(), "notify:order:1");
    assert_eq!(recorder.sent(), ["notify:order:2"]);
}

#[tokio::test]
async fn a_panicking_dispatcher_is_recorded_as_a_failure() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(|_intent: Intent| async move {
            if true {
                panic!("driver bug");
            }
            Ok::<(), DispatchError>(())
        })
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    let failure = &report.deliveries.failed[0];
    assert_eq!(failure.error, "dispatcher panicked: driver bug");
    let entry = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(entry.status(), DeliveryStatus::Failed);
    assert!(
        entry.next_attempt_at().is_some(),
        "a panic is retried like any retryable failure"
    );
}

#[tokio::test]
async fn intents_committed_without_a_dispatcher_wait_for_flush() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(rt.context().ledger().pending().await.unwrap(), 1);
    assert!(matches!(rt.flush().await, Err(FlushError::NoDispatcher)));

    // Hand the context to a runtime with a dispatcher: the committed intent goes out.
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(rt.into_context())
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    assert_eq!(rt.flush().await.unwrap().delivered, 1);
    assert_eq!(recorder.sent(), ["notify:order:1"]);
}

#[tokio::test]
async fn pending_actions_cannot_be_written_directly() {
    let mut ctx = Context::new("t");
    let err = ctx
        .create(
            "action:x",
            PendingAction {
                kind: "notify".into(),
                key: "x".into(),
                payload: vec![],
                requires_approval: false,
                not_before: None,
                group: None,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("recorded with `act"), "{err}");
    assert!(ctx.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_turn_cancelled_mid_delivery_leaves_the_intent_due_again_not_stuck() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let dispatcher = {
        let calls = calls.clone();
        move |_intent: Intent| {
            let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    std::future::pending::<()>().await;
                }
                Ok::<(), DispatchError>(())
            }
        }
    };
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .build()
        .unwrap();
    let cancelled = tokio::time::timeout(std::time::Duration::from_secs(5), rt.run()).await;
    assert!(
        cancelled.is_err(),
        "the dispatcher never returns, so the caller's timeout fires"
    );
    // The attempt's outcome is unknown: pending again, due at once, not a failure.
    let entry = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(entry.status(), DeliveryStatus::Pending);
    assert_eq!(entry.interrupted_attempts(), 1);
    assert!(
        entry.last_error().unwrap().contains("the receiver may have seen"),
        "{:?}",
        entry.last_error()
    );
    // The receipt's generation committed before the drain; the next drain delivers the
    // intent again with the same key.
    assert!(rt.context().get::<Receipt>("receipt:order:1").unwrap().is_some());
    assert_eq!(rt.flush().await.unwrap().delivered, 1);
    assert_eq!(
        rt.context()
            .ledger()
            .get("notify:order:1")
            .await
            .unwrap()
            .unwrap()
            .attempts(),
        2
    );
}

#[tokio::test]
async fn an_intent_knows_the_run_that_recorded_it_even_after_an_isolated_failure() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let broken = Produce::new("broken", |_call: ProduceCall<Order>| async {
        Err::<(), _>(reactifact_core::ProduceError::msg("bad data"))
    });
    let origins = Arc::new(std::sync::Mutex::new(Vec::new()));
    let dispatcher = {
        let origins = origins.clone();
        move |intent: Intent| {
            origins.lock().unwrap().push(intent.origin().clone());
            async { Ok::<(), DispatchError>(()) }
        }
    };
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(broken).produce(process_order()))
        .produce_errors(reactifact_core::runtime::ProduceErrors::Isolate)
        .dispatcher(dispatcher)
        .build()
        .unwrap();
    rt.run().await.unwrap();
    // The failed run was dropped from the commit, so the recording run is the first one kept.
    let origin = origins.lock().unwrap()[0].clone();
    let commit = rt
        .context()
        .commit_of(&origin)
        .unwrap()
        .expect("the commit is in this log");
    assert_eq!(commit.runs[origin.run()].produce.as_deref(), Some("process_order"));
    assert_eq!(
        rt.context().intent_origin("notify:order:1").unwrap(),
        Some((origin.generation(), origin.run()))
    );
}
