//! The generation contract: snapshot isolation, work order, validation, atomicity, budgets.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use reactifact_core::audit::EventKind;
use reactifact_core::error::{RunError, RunFailure};
use reactifact_core::runtime::{Budget, ProduceErrors, TurnOutcome};
use reactifact_core::{Agent, Context, Produce, ProduceCall, ProduceError, Runtime};

#[tokio::test]
async fn produces_of_one_generation_read_the_same_snapshot() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    // The first produce writes a receipt; the second reports whether it could see it.
    let writer = Produce::new("writer", |call: ProduceCall<Order>| async move {
        call.effects.upsert(
            "receipt:order:1",
            Receipt {
                order: call.trigger.id.to_string(),
                total_cents: 1,
            },
        );
    })
    .creates::<Receipt>();
    let observer = Produce::new("observer", |call: ProduceCall<Order>| async move {
        let seen = call.snapshot.get::<Receipt>("receipt:order:1").unwrap().is_some();
        call.effects.upsert(
            "invoice:1",
            Invoice {
                order: format!("saw receipt: {seen}"),
            },
        );
    })
    .creates::<Invoice>();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(writer).produce(observer))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    let invoice = rt.context().get::<Invoice>("invoice:1").unwrap().unwrap();
    assert_eq!(invoice.data.order, "saw receipt: false");
    assert!(rt.context().get::<Receipt>("receipt:order:1").unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn results_are_collected_in_work_order_whatever_the_completion_order() {
    let ctx = seeded((0..5u64).map(|i| (format!("order:{i}"), order("ada", i))));
    // Earlier orders finish later; every run writes the same id, so the last writer in work
    // order (order:4) must win, and the log must list runs in work order.
    let slow_first = Produce::new("slow_first", |call: ProduceCall<Order>| async move {
        let n = call.trigger.data.total_cents;
        tokio::time::sleep(Duration::from_millis(100 * (5 - n))).await;
        call.effects.upsert(
            "receipt:last",
            Receipt {
                order: call.trigger.id.to_string(),
                total_cents: n,
            },
        );
    })
    .creates::<Receipt>();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(slow_first))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let last = rt.context().get::<Receipt>("receipt:last").unwrap().unwrap();
    assert_eq!(last.data.order, "order:4");
    let commit = rt.context().log().unwrap().last().unwrap();
    let triggers: Vec<_> = commit
        .runs
        .iter()
        .map(|r| r.trigger.as_ref().unwrap().id.to_string())
        .collect();
    assert_eq!(triggers, ["order:0", "order:1", "order:2", "order:3", "order:4"]);
}

#[tokio::test]
async fn work_is_ordered_by_agent_priority_then_event_then_registration() {
    let mut ctx = Context::new("t");
    let mut tx = ctx.transaction();
    tx.create("order:1", order("ada", 1)).create("order:2", order("bob", 2));
    tx.commit().unwrap();
    let touch = |name: &'static str| {
        Produce::new(name, move |call: ProduceCall<Order>| async move {
            call.effects.upsert(
                format!("receipt:{name}:{}", call.trigger.id),
                Receipt {
                    order: call.trigger.id.to_string(),
                    total_cents: 0,
                },
            );
        })
        .creates::<Receipt>()
    };
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("low").produce(touch("low_a")).produce(touch("low_b")))
        .agent(Agent::new("high").priority(10).produce(touch("high")))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let commit = rt.context().log().unwrap().last().unwrap();
    let order: Vec<_> = commit
        .runs
        .iter()
        .map(|r| format!("{}@{}", r.produce.as_deref().unwrap(), r.trigger.as_ref().unwrap().id))
        .collect();
    assert_eq!(
        order,
        [
            "high@order:1",
            "high@order:2",
            "low_a@order:1",
            "low_b@order:1",
            "low_a@order:2",
            "low_b@order:2"
        ]
    );
}

#[tokio::test]
async fn an_undeclared_output_fails_the_generation_before_anything_is_applied() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    let hash_before = ctx.state_hash();
    let sneaky = Produce::new("sneaky", |call: ProduceCall<Order>| async move {
        call.effects.upsert(
            "receipt:1",
            Receipt {
                order: call.trigger.id.to_string(),
                total_cents: 1,
            },
        );
        call.effects.upsert("invoice:1", Invoice { order: "x".into() });
    })
    .creates::<Receipt>();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(sneaky).produce(process_order()))
        .build()
        .unwrap();
    let err = rt.run().await.unwrap_err();
    let RunError::Produce { first, others } = &err else {
        panic!("expected a produce error, got {err}");
    };
    assert_eq!(*others, 0);
    assert_eq!(first.produce, "sneaky");
    assert!(matches!(&first.failure, RunFailure::UndeclaredOutput { kind, .. } if kind.as_str() == "invoice"));
    let message = err.to_string();
    assert!(message.contains("invoice") && message.contains("sneaky"), "{message}");
    let ctx = rt.context();
    assert_eq!(ctx.state_hash(), hash_before);
    assert_eq!(ctx.log().unwrap().len(), 1, "only the seed is committed");
    assert_eq!(ctx.queued_events(), 1, "the event stays queued");
    assert!(
        ctx.ledger().is_empty().await.unwrap(),
        "the sibling's intent was not committed either"
    );
}

#[tokio::test]
async fn an_update_with_equal_content_creates_no_version_and_no_event() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    let commits = ctx.log().unwrap().len();
    ctx.update("order:1", order("ada", 100)).unwrap();
    ctx.create("order:1", order("ada", 100)).unwrap();
    assert_eq!(ctx.queued_events(), 1);
    assert_eq!(ctx.log().unwrap().len(), commits);
    assert_eq!(ctx.get::<Order>("order:1").unwrap().unwrap().version.0, 1);
    ctx.update("order:1", order("ada", 200)).unwrap();
    assert_eq!(ctx.queued_events(), 2);
    let events: Vec<_> = ctx.events().map(|e| e.kind).collect();
    assert_eq!(events, [EventKind::Created, EventKind::Updated]);
    assert_eq!(ctx.get::<Order>("order:1").unwrap().unwrap().version.0, 2);
}

#[tokio::test]
async fn a_produce_rewriting_equal_content_does_not_cascade() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    // Reacts to an order by writing the same order back: a no-op, so no further generation.
    let echo = Produce::new("echo", |call: ProduceCall<Order>| async move {
        call.effects.update(call.trigger.id.clone(), call.trigger.data.clone());
    });
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(echo))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.generations, 1);
    assert_eq!(rt.context().queued_events(), 0);
}

fn ping_pong() -> Produce {
    // Bumps the order total on every run: an endless cycle.
    Produce::new("bump", |call: ProduceCall<Order>| async move {
        let mut next = call.trigger.data.clone();
        next.total_cents += 1;
        call.effects.update(call.trigger.id.clone(), next);
    })
}

#[tokio::test]
async fn a_cycle_is_stopped_by_the_run_budget() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 0)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(ping_pong()))
        .build()
        .unwrap();
    let report = rt.run_with(Budget::UNLIMITED.max_runs(5)).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::RunsExhausted);
    assert_eq!(report.runs, 5);
    assert_eq!(
        rt.context().get::<Order>("order:1").unwrap().unwrap().data.total_cents,
        5
    );
    assert_eq!(
        rt.context().queued_events(),
        1,
        "the next event waits for the next turn"
    );

    let report = rt.run_with(Budget::UNLIMITED.max_generations(3)).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::GenerationsExhausted);
    assert_eq!(report.generations, 3);
    assert_eq!(
        rt.context().get::<Order>("order:1").unwrap().unwrap().data.total_cents,
        8
    );
}

#[tokio::test(start_paused = true)]
async fn a_generation_past_the_deadline_is_cancelled_and_its_events_stay_queued() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    let slow = Produce::new("slow", |call: ProduceCall<Order>| async move {
        tokio::time::sleep(Duration::from_secs(10)).await;
        call.effects.upsert(
            "receipt:1",
            Receipt {
                order: "order:1".into(),
                total_cents: 1,
            },
        );
    })
    .creates::<Receipt>();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(slow))
        .build()
        .unwrap();
    let hash = rt.context().state_hash();
    let report = rt
        .run_with(Budget::UNLIMITED.deadline(Duration::from_secs(1)))
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::DeadlineExceeded);
    assert_eq!(report.generations, 0);
    assert_eq!(rt.context().state_hash(), hash);
    assert_eq!(rt.context().queued_events(), 1);
    // Given time, the next turn completes the same work.
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert!(rt.context().get::<Receipt>("receipt:1").unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_deadline_of_duration_max_is_no_deadline_not_a_panic() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .budget(Budget::UNLIMITED.deadline(Duration::MAX))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.generations, 1);
    let report = rt.run_with(Budget::default().deadline(Duration::MAX)).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
}

#[tokio::test]
async fn a_failing_produce_keeps_the_batch_queued_and_a_retry_re_runs_it() {
    let mut ctx = Context::new("t");
    let mut tx = ctx.transaction();
    tx.create("order:1", order("ada", 1)).create("order:2", order("bob", 2));
    tx.commit().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let flaky = {
        let calls = calls.clone();
        Produce::new("flaky", move |call: ProduceCall<Order>| {
            let attempt = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if call.trigger.id == "order:1" && attempt == 0 {
                    return Err(ProduceError::msg("upstream hiccup"));
                }
                call.effects.upsert(
                    format!("invoice:{}", call.trigger.id),
                    Invoice {
                        order: call.trigger.id.to_string(),
                    },
                );
                Ok(())
            }
        })
        .creates::<Invoice>()
    };
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(flaky).produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    let err = rt.run().await.unwrap_err();
    assert!(err.to_string().contains("upstream hiccup"), "{err}");
    // The sibling runs finished (4 runs in all) but nothing was committed or sent.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(rt.context().queued_events(), 2);
    assert_eq!(rt.context().list::<Receipt>().count(), 0);
    assert!(recorder.sent().is_empty());

    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(rt.context().list::<Receipt>().count(), 2);
    assert_eq!(rt.context().list::<Invoice>().count(), 2);
    assert_eq!(recorder.sent(), ["notify:order:1", "notify:order:2"]);
}

#[tokio::test]
async fn isolation_mode_drops_only_the_failing_patch() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let broken = Produce::new("broken", |call: ProduceCall<Order>| async move {
        call.effects.upsert("invoice:1", Invoice { order: "x".into() });
        Err::<(), _>(ProduceError::msg("bad data"))
    })
    .creates::<Invoice>();
    let panicking = Produce::new("panicking", |_call: ProduceCall<Order>| async move {
        if true {
            panic!("produce bug");
        }
    });
    let mut rt = Runtime::builder(ctx)
        .agent(
            Agent::new("a")
                .produce(broken)
                .produce(panicking)
                .produce(process_order()),
        )
        .produce_errors(ProduceErrors::Isolate)
        .dispatcher(Recorder::default().dispatcher())
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    let failed: Vec<_> = report.failed_runs.iter().map(|f| f.produce.as_str()).collect();
    assert_eq!(failed, ["broken", "panicking"]);
    assert!(matches!(&report.failed_runs[1].failure, RunFailure::Panicked(m) if m == "produce bug"));
    assert!(rt.context().get::<Invoice>("invoice:1").unwrap().is_none());
    assert!(rt.context().get::<Receipt>("receipt:order:1").unwrap().is_some());
    assert_eq!(rt.context().queued_events(), 0);
    assert_eq!(report.deliveries.delivered, 1);
}

#[tokio::test]
async fn isolation_mode_drops_a_patch_that_does_not_apply() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let dangling = Produce::new("dangling", |_call: ProduceCall<Order>| async move {
        _call.effects.update(
            "receipt:missing",
            Receipt {
                order: "x".into(),
                total_cents: 0,
            },
        );
    });
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(dangling).produce(process_order()))
        .produce_errors(ProduceErrors::Isolate)
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.failed_runs.len(), 1);
    assert!(report.failed_runs[0]
        .to_string()
        .contains("update of unknown artifact `receipt:missing`"));
    assert_eq!(report.runs, 1);
    assert!(rt.context().get::<Receipt>("receipt:order:1").unwrap().is_some());
    let commit = rt.context().log().unwrap().last().unwrap();
    assert_eq!(commit.runs.len(), 1, "the dropped patch is not in the log");
}

#[tokio::test]
async fn fail_loud_commit_errors_apply_nothing() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let hash = ctx.state_hash();
    let dangling = Produce::new("dangling", |call: ProduceCall<Order>| async move {
        call.effects.update(
            "receipt:missing",
            Receipt {
                order: "x".into(),
                total_cents: 0,
            },
        );
    });
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(process_order()).produce(dangling))
        .build()
        .unwrap();
    let err = rt.run().await.unwrap_err();
    assert!(err.to_string().contains("produce `dangling`"), "{err}");
    assert_eq!(
        rt.context().state_hash(),
        hash,
        "the first run's receipt was rolled back"
    );
    assert!(rt.context().ledger().is_empty().await.unwrap());
    assert_eq!(rt.context().queued_events(), 1);
}

#[tokio::test(start_paused = true)]
async fn per_agent_and_global_concurrency_limits_hold() {
    let ctx = seeded((0..20u64).map(|i| (format!("order:{i}"), order("ada", i))));
    let gauge = |active: Arc<AtomicUsize>, peak: Arc<AtomicUsize>| {
        Produce::new("gauge", move |_call: ProduceCall<Order>| {
            let (active, peak) = (active.clone(), peak.clone());
            async move {
                let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                active.fetch_sub(1, Ordering::SeqCst);
            }
        })
    };
    let (a_active, a_peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (b_active, b_peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").concurrency(2).produce(gauge(a_active, a_peak.clone())))
        .agent(Agent::new("b").produce(gauge(b_active, b_peak.clone())))
        .max_concurrency(5)
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 40);
    assert_eq!(a_peak.load(Ordering::SeqCst), 2);
    assert_eq!(
        b_peak.load(Ordering::SeqCst),
        3,
        "agent b gets the global slots a cannot use"
    );
}

/// A produce that counts how many of its runs are live at once, waits in the runs of every
/// third order, panics in order 7's after its wait, and writes `receipt:last` with its order's
/// number (so the last writer in work order wins).
fn mixed(active: Arc<AtomicUsize>, peak: Arc<AtomicUsize>) -> Produce {
    Produce::new("mixed", move |call: ProduceCall<Order>| {
        let (active, peak) = (active.clone(), peak.clone());
        async move {
            let n = call.trigger.data.total_cents;
            let now = active.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            if n % 3 == 0 {
                tokio::time::sleep(Duration::from_millis(10 * (4 - n / 3))).await;
            }
            active.fetch_sub(1, Ordering::SeqCst);
            if n == 6 {
                panic!("order 6 fails after its wait");
            }
            call.effects.upsert(
                "receipt:last",
                Receipt {
                    order: call.trigger.id.to_string(),
                    total_cents: n,
                },
            );
        }
    })
    .creates::<Receipt>()
}

#[tokio::test(start_paused = true)]
async fn runs_that_finish_at_once_and_runs_that_wait_keep_the_limits_and_the_work_order() {
    let ctx = seeded((0..12u64).map(|i| (format!("order:{i:02}"), order("ada", i))));
    let (active, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").concurrency(2).produce(mixed(active, peak.clone())))
        .produce_errors(ProduceErrors::Isolate)
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 11, "every run but the panicking one commits");
    assert_eq!(report.failed_runs.len(), 1);
    assert!(
        matches!(&report.failed_runs[0].failure, RunFailure::Panicked(m) if m == "order 6 fails after its wait"),
        "{:?}",
        report.failed_runs[0].failure
    );
    assert_eq!(
        peak.load(Ordering::SeqCst),
        2,
        "two waiting runs hold the agent's places"
    );
    let commit = rt.context().log().unwrap().last().unwrap();
    let triggers: Vec<String> = commit
        .runs
        .iter()
        .map(|r| r.trigger.as_ref().unwrap().id.to_string())
        .collect();
    let expected: Vec<String> = (0..12).filter(|&i| i != 6).map(|i| format!("order:{i:02}")).collect();
    assert_eq!(triggers, expected, "the log lists the runs in work order");
    let last = rt.context().get::<Receipt>("receipt:last").unwrap().unwrap();
    assert_eq!(last.data.total_cents, 11, "the last run in work order wrote last");
}

/// Two produces on the same trigger kind, in one agent and in another, interleaved in work
/// order: a run that ends leaves its slot to its own produce's next run only, so each run
/// writes what its produce writes (a run in another produce's slot would write an undeclared
/// kind, and fail). Runs that panic as they start or as they run, and runs that wait, are
/// among them; every other run still runs its own produce.
#[tokio::test(start_paused = true)]
async fn every_run_runs_its_own_produce_whatever_ran_before_it() {
    let ctx = seeded((0..30u64).map(|i| (format!("order:{i:02}"), order("ada", i))));
    let receipts = Produce::new("receipts", |call: ProduceCall<Order>| {
        let n = call.trigger.data.total_cents;
        if n % 10 == 4 {
            panic!("receipts panics as run {n} starts");
        }
        async move {
            if n % 5 == 0 {
                tokio::time::sleep(Duration::from_millis(1 + n)).await;
            }
            if n % 10 == 7 {
                panic!("receipts panics in run {n}");
            }
            call.effects.upsert(
                format!("receipt:{}", call.trigger.id),
                Receipt {
                    order: call.trigger.id.to_string(),
                    total_cents: n,
                },
            );
        }
    })
    .creates::<Receipt>();
    let invoices = |name: &'static str| {
        Produce::new(name, move |call: ProduceCall<Order>| async move {
            if call.trigger.data.total_cents % 3 == 0 {
                tokio::task::yield_now().await;
            }
            call.effects.upsert(
                format!("invoice:{name}:{}", call.trigger.id),
                Invoice {
                    order: call.trigger.id.to_string(),
                },
            );
        })
        .creates::<Invoice>()
    };
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(receipts).produce(invoices("first")))
        .agent(Agent::new("b").produce(invoices("second")))
        .produce_errors(ProduceErrors::Isolate)
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.failed_runs.len(), 6, "{:?}", report.failed_runs);
    assert!(report.failed_runs.iter().all(|f| f.produce == "receipts"
        && matches!(&f.failure, RunFailure::Panicked(m) if m.starts_with("receipts panics"))));
    assert_eq!(report.runs, 90 - 6);
    for i in 0..30u64 {
        let id = format!("order:{i:02}");
        let receipt = rt.context().get::<Receipt>(&format!("receipt:{id}")).unwrap();
        assert_eq!(receipt.is_some(), i % 10 != 4 && i % 10 != 7, "{id}");
        for name in ["first", "second"] {
            let invoice = rt.context().get::<Invoice>(&format!("invoice:{name}:{id}")).unwrap();
            assert_eq!(invoice.map(|r| r.data.order), Some(id.clone()), "{name} {id}");
        }
    }
}

#[test]
fn a_long_queue_behind_an_agent_limit_runs_on_a_small_stack() {
    // Each run that finishes at once starts its agent's next waiting one: that must be a loop,
    // not a recursion as deep as the queue.
    let turn = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(|| {
            let tokio = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            tokio.block_on(Box::pin(async {
                let ctx = seeded((0..20_000u64).map(|i| (format!("order:{i:05}"), order("ada", i))));
                let first_waits = Produce::new("first_waits", |call: ProduceCall<Order>| async move {
                    if call.trigger.data.total_cents == 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                });
                let mut rt = Runtime::builder(ctx)
                    .agent(Agent::new("a").concurrency(1).produce(first_waits))
                    .build()
                    .unwrap();
                rt.run().await.unwrap().runs
            }))
        })
        .unwrap();
    assert_eq!(turn.join().expect("the turn ran to its end"), 20_000);
}

#[tokio::test]
async fn a_condition_filters_work_against_the_current_state() {
    let mut ctx = Context::new("t");
    let mut tx = ctx.transaction();
    tx.create("order:small", order("ada", 5))
        .create("order:big", order("bob", 500));
    tx.commit().unwrap();
    let big_only =
        process_order().when(|_snapshot, order: &reactifact_core::Record<Order>| order.data.total_cents > 100);
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(big_only))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 1);
    assert!(rt.context().get::<Receipt>("receipt:order:big").unwrap().is_some());
    assert!(rt.context().get::<Receipt>("receipt:order:small").unwrap().is_none());
}

#[tokio::test]
async fn stop_handle_ends_the_turn_with_stopped() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 0)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(ping_pong()))
        .build()
        .unwrap();
    rt.stop_handle().stop();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Stopped);
    assert_eq!(report.generations, 0);
    // The request was honoured; the next turn runs.
    let report = rt.run_with(Budget::UNLIMITED.max_generations(2)).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::GenerationsExhausted);
}

#[tokio::test(start_paused = true)]
async fn stop_handle_cancels_a_running_generation() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 0)).unwrap();
    let forever = Produce::new("forever", |_call: ProduceCall<Order>| std::future::pending::<()>());
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(forever))
        .build()
        .unwrap();
    let stop = rt.stop_handle();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.stop();
    });
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Stopped);
    assert_eq!(rt.context().queued_events(), 1);
}

#[tokio::test]
async fn produces_with_intents_must_declare_pending_action() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 0)).unwrap();
    let undeclared = Produce::new("undeclared", |call: ProduceCall<Order>| async move {
        call.effects.act("notify", "k", &1u8);
    });
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(undeclared))
        .build()
        .unwrap();
    let err = rt.run().await.unwrap_err();
    assert!(err.to_string().contains("pending_action"), "{err}");
    assert!(rt.context().ledger().is_empty().await.unwrap());
}

#[tokio::test]
async fn an_event_superseded_by_a_later_change_of_its_artifact_runs_nothing() {
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 1)).unwrap();
    ctx.update("order:1", order("ada", 2)).unwrap();
    assert_eq!(ctx.queued_events(), 2);
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(process_order()))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 1, "the produce runs once, on the latest version");
    let trigger = rt.context().log().unwrap().last().unwrap().runs[0]
        .trigger
        .clone()
        .unwrap();
    assert_eq!(trigger.version.0, 2);
}
