//! The delivery engine: retries with backoff, dead letters, concurrency limits, timeouts,
//! typed routing and a graceful stop. Timed behaviour runs on tokio's paused clock.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use reactifact_core::error::BuildError;
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::{Budget, TurnOutcome, MAX_RETRY_AFTER};
use reactifact_core::{
    ActionCall, Agent, Context, DeliveryOptions, DispatchError, Dispatcher, Drainer, Intent, OpenOptions, Produce,
    ProduceCall, RetryPolicy, Router, Runtime,
};
use tokio::time::Instant;

fn seeded_orders(n: u64) -> Context {
    seeded((0..n).map(|i| (format!("order:{i}"), order(&format!("customer-{i}"), i))))
}

/// Records, per key, the tokio instants of its attempts.
#[derive(Clone, Default)]
struct Attempts(Arc<Mutex<Vec<(String, u32, Instant)>>>);

impl Attempts {
    fn record(&self, intent: &Intent) {
        self.0
            .lock()
            .unwrap()
            .push((intent.key().to_string(), intent.attempt(), Instant::now()));
    }

    fn of(&self, key: &str) -> Vec<(u32, Instant)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _, _)| k == key)
            .map(|&(_, attempt, at)| (attempt, at))
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn a_transient_outage_is_ridden_out_with_exponential_backoff() {
    let attempts = Attempts::default();
    let dispatcher = {
        let attempts = attempts.clone();
        move |intent: Intent| {
            attempts.record(&intent);
            let attempt = intent.attempt();
            async move {
                if attempt <= 3 {
                    return Err(DispatchError::retryable("503 service unavailable"));
                }
                Ok(())
            }
        }
    };
    let policy = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60)).max_attempts(5);
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .delivery(DeliveryOptions::new().retry_policy(policy.clone()))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.deliveries.failed.len(), 1);
    assert_eq!(report.deliveries.waiting, 1, "the retry is scheduled, not lost");
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(entry.status(), DeliveryStatus::Failed);
    assert!(entry.next_attempt_at().is_some());

    let settled = rt.settle().await.unwrap();
    assert_eq!(settled.delivered, 1);
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Delivered, 4));

    // Each wait is the policy's delay for that attempt (jittered into [0.5, 1) of 1 s, 2 s, 4 s).
    let seen = attempts.of("notify:order:0");
    assert_eq!(seen.iter().map(|(a, _)| *a).collect::<Vec<_>>(), [1, 2, 3, 4]);
    for pair in seen.windows(2) {
        let (attempt, at) = pair[0];
        let waited = pair[1].1 - at;
        let expected = policy.delay("notify:order:0", attempt);
        assert!(
            waited >= expected && waited < expected + Duration::from_millis(5),
            "after attempt {attempt}: waited {waited:?}, policy says {expected:?}"
        );
        let nominal = Duration::from_secs(1 << (attempt - 1));
        assert!(
            expected >= nominal / 2 && expected < nominal,
            "{expected:?} is not a jittered {nominal:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn attempts_used_up_make_a_dead_letter_that_retry_re_arms() {
    let calls = Arc::new(AtomicUsize::new(0));
    let dispatcher = {
        let calls = calls.clone();
        move |_: Intent| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(DispatchError::msg("still down")) }
        }
    };
    let mut rt =
        Runtime::builder(seeded_orders(1))
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(dispatcher)
            .delivery(DeliveryOptions::new().retry_policy(
                RetryPolicy::exponential(Duration::from_millis(100), Duration::from_secs(1)).max_attempts(3),
            ))
            .build()
            .unwrap();
    rt.run().await.unwrap();
    let settled = rt.settle().await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(settled.dead.len(), 1);
    assert_eq!(settled.dead[0].status, DeliveryStatus::Dead);
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Dead, 3));
    assert_eq!(entry.last_error(), Some("still down"));
    assert_eq!(
        rt.context().ledger().pending().await.unwrap(),
        0,
        "a dead letter waits for nobody"
    );

    rt.retry("notify:order:0").await.unwrap();
    rt.flush().await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 4, "re-armed: one more attempt");
}

#[tokio::test(start_paused = true)]
async fn a_permanent_error_goes_straight_to_the_dead_letter() {
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(|_: Intent| async { Err::<(), _>(DispatchError::permanent("400 bad request")) })
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.dead.len(), 1);
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Dead, 1));
    assert_eq!(entry.next_attempt_at(), None);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_longer_than_the_backoff_is_waited_out() {
    let attempts = Attempts::default();
    let dispatcher = {
        let attempts = attempts.clone();
        move |intent: Intent| {
            attempts.record(&intent);
            let first = intent.attempt() == 1;
            async move {
                if first {
                    return Err(DispatchError::retryable("429 too many requests").retry_after(Duration::from_secs(42)));
                }
                Ok(())
            }
        }
    };
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    let seen = attempts.of("notify:order:0");
    assert_eq!(seen.len(), 2);
    let waited = seen[1].1 - seen[0].1;
    // Schedules are kept in whole milliseconds, rounded up: never early.
    assert!(
        waited >= Duration::from_secs(42) && waited <= Duration::from_millis(42_001),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn one_failing_intent_does_not_block_the_others_and_manual_policies_wait_for_retry() {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let dispatcher = {
        let sent = sent.clone();
        move |intent: Intent| {
            let sent = sent.clone();
            async move {
                if intent.key().as_str() == "notify:order:1" {
                    return Err(DispatchError::msg("mailbox full"));
                }
                sent.lock().unwrap().push(intent.key().to_string());
                Ok(())
            }
        }
    };
    let mut rt = Runtime::builder(seeded_orders(3))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .delivery(DeliveryOptions::new().retry_policy_for("notify", RetryPolicy::manual()))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.delivered, 2);
    assert_eq!(report.deliveries.failed.len(), 1);
    assert_eq!(report.deliveries.failed[0].next_attempt_at, None);
    assert_eq!(report.deliveries.waiting, 0);
    assert_eq!(*sent.lock().unwrap(), ["notify:order:0", "notify:order:2"]);
    let settled = rt.settle().await.unwrap();
    assert_eq!(settled.delivered, 0, "a manual policy never retries by itself");
}

#[tokio::test(start_paused = true)]
async fn deliveries_run_concurrently_within_global_and_per_kind_limits() {
    // Two kinds: "notify" from the order flow and "audit" from a second produce.
    let audit = Produce::new("audit", |call: ProduceCall<Order>| async move {
        call.effects.act("audit", format!("audit:{}", call.trigger.id), &1u8);
    })
    .creates::<reactifact_core::PendingAction>();
    let gauges: Arc<Mutex<foldhash_like::Gauges>> = Default::default();
    let dispatcher = {
        let gauges = gauges.clone();
        move |intent: Intent| {
            let gauges = gauges.clone();
            async move {
                gauges.lock().unwrap().enter(intent.kind());
                tokio::time::sleep(Duration::from_millis(10)).await;
                gauges.lock().unwrap().leave(intent.kind());
                Ok::<(), DispatchError>(())
            }
        }
    };
    let mut rt = Runtime::builder(seeded_orders(40))
        .agent(Agent::new("billing").produce(process_order()).produce(audit))
        .dispatcher(dispatcher)
        .delivery(DeliveryOptions::new().concurrency(8).concurrency_for("audit", 2))
        .build()
        .unwrap();
    let started = Instant::now();
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.delivered, 80);
    let gauges = gauges.lock().unwrap();
    assert_eq!(gauges.peak("audit"), 2);
    assert_eq!(gauges.peak_total(), 8);
    // 40 audits two at a time take at least 20 rounds of 10 ms; sequential would be 80.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(800),
        "{took:?}"
    );
}

/// Concurrency gauges per kind.
mod foldhash_like {
    use std::collections::HashMap;

    #[derive(Default)]
    pub struct Gauges {
        now: HashMap<String, usize>,
        peak: HashMap<String, usize>,
        total: usize,
        peak_total: usize,
    }

    impl Gauges {
        pub fn enter(&mut self, kind: &str) {
            let now = self.now.entry(kind.to_owned()).or_default();
            *now += 1;
            let peak = self.peak.entry(kind.to_owned()).or_default();
            *peak = (*peak).max(*now);
            self.total += 1;
            self.peak_total = self.peak_total.max(self.total);
        }

        pub fn leave(&mut self, kind: &str) {
            *self.now.get_mut(kind).unwrap() -= 1;
            self.total -= 1;
        }

        pub fn peak(&self, kind: &str) -> usize {
            self.peak.get(kind).copied().unwrap_or(0)
        }

        pub fn peak_total(&self) -> usize {
            self.peak_total
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_attempt_past_its_timeout_is_a_retryable_failure() {
    let calls = Arc::new(AtomicUsize::new(0));
    let dispatcher = {
        let calls = calls.clone();
        move |_: Intent| {
            let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    std::future::pending::<()>().await;
                }
                Ok::<(), DispatchError>(())
            }
        }
    };
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .delivery(DeliveryOptions::new().timeout(Some(Duration::from_secs(2))))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.failed[0].error, "timed out after 2s");
    rt.settle().await.unwrap();
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Delivered, 2));
}

/// A produce that schedules an email to the order's customer an hour after its run (by the
/// run's recorded clock): `remind:{order id}`.
fn remind_in_an_hour() -> Produce {
    Produce::new("remind", |call: ProduceCall<Order>| async move {
        let at = call.now() + Duration::from_secs(3600);
        let key = format!("remind:{}", call.trigger.id);
        call.effects
            .intent("email", key, &call.trigger.data.customer)
            .not_before(at)
            .act();
        Ok::<(), reactifact_core::ProduceError>(())
    })
    .creates::<reactifact_core::PendingAction>()
}

/// An intent scheduled an hour ahead (`effects.intent(..).not_before(..)`, from the run's
/// recorded clock) is committed with its turn but not delivered by it; the ledger shows it
/// pending with its time; a settle waits for the time (the paused clock jumps there) and then
/// delivers it, once. In memory and in a SQLite file alike.
#[tokio::test(start_paused = true)]
async fn a_scheduled_intent_is_delivered_at_its_time_not_before() {
    let dir = tempfile::tempdir().unwrap();
    let contexts = [seeded_orders(1), {
        let mut ctx = Context::open(dir.path().join("s.db"), "orders").unwrap();
        ctx.create("order:0", order("ada", 1)).unwrap();
        ctx
    }];
    for ctx in contexts {
        let recorder = Recorder::default();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("reminders").produce(remind_in_an_hour()))
            .dispatcher(recorder.dispatcher())
            .build()
            .unwrap();
        let started = Instant::now();
        let report = rt.run().await.unwrap();
        assert_eq!(report.deliveries.delivered, 0, "not delivered by its turn");
        let entry = rt.context().ledger().get("remind:order:0").await.unwrap().unwrap();
        assert_eq!(entry.status(), DeliveryStatus::Pending);
        let at = entry.not_before().expect("its time is kept");
        assert!(at > rt.now() + Duration::from_secs(3599), "{at:?}");
        rt.settle().await.unwrap();
        assert_eq!(recorder.sent(), ["remind:order:0"]);
        assert!(
            started.elapsed() >= Duration::from_secs(3599),
            "{:?}",
            started.elapsed()
        );
        assert!(rt.now() >= at, "delivered at its time, not before");
    }
}

/// An order's webhooks in one ordering group reach the receiver one at a time, in the order
/// they were acted, even with many deliveries allowed at once: a turn delivers the whole group
/// (each delivered intent releases the next), and a dead one holds the rest until it is
/// retried. In memory and in a SQLite file alike.
#[tokio::test(start_paused = true)]
async fn an_ordering_group_reaches_the_receiver_in_order_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let contexts = [seeded_orders(1), {
        let mut ctx = Context::open(dir.path().join("g.db"), "orders").unwrap();
        ctx.create("order:0", order("ada", 1)).unwrap();
        ctx
    }];
    for ctx in contexts {
        let events = Produce::new("events", |call: ProduceCall<Order>| async move {
            let order = call.trigger.id.to_string();
            for event in ["created", "paid", "shipped", "delivered"] {
                call.effects
                    .intent("webhook", format!("{event}:{order}"), &event)
                    .group(order.clone())
                    .act();
            }
            Ok::<(), reactifact_core::ProduceError>(())
        })
        .creates::<reactifact_core::PendingAction>();
        // The receiver: each call takes 10 ms; "paid" fails for good on its first attempt.
        let log: Arc<Mutex<Vec<(String, Instant, Instant)>>> = Arc::default();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let dispatcher = {
            let (log, in_flight) = (log.clone(), in_flight.clone());
            move |intent: Intent| {
                let (log, in_flight) = (log.clone(), in_flight.clone());
                async move {
                    assert_eq!(in_flight.fetch_add(1, Ordering::SeqCst), 0, "two of one group at once");
                    let started = Instant::now();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    log.lock()
                        .unwrap()
                        .push((intent.key().to_string(), started, Instant::now()));
                    if intent.key().as_str().starts_with("paid:") && intent.attempt() == 1 {
                        return Err(DispatchError::permanent("card declined"));
                    }
                    Ok(())
                }
            }
        };
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("webhooks").produce(events))
            .dispatcher(dispatcher)
            .delivery(DeliveryOptions::new().concurrency(16))
            .build()
            .unwrap();
        rt.run().await.unwrap();
        let sent = |log: &Mutex<Vec<(String, Instant, Instant)>>| -> Vec<String> {
            log.lock().unwrap().iter().map(|(k, ..)| k.clone()).collect()
        };
        assert_eq!(
            sent(&log),
            ["created:order:0", "paid:order:0"],
            "a dead intent holds its group"
        );
        let ledger = rt.context().ledger();
        assert_eq!(
            ledger.get("shipped:order:0").await.unwrap().unwrap().status(),
            DeliveryStatus::Blocked
        );
        assert_eq!(
            ledger.get("paid:order:0").await.unwrap().unwrap().group(),
            Some("order:0")
        );
        rt.retry("paid:order:0").await.unwrap();
        rt.run().await.unwrap();
        assert_eq!(
            sent(&log),
            [
                "created:order:0",
                "paid:order:0",
                "paid:order:0",
                "shipped:order:0",
                "delivered:order:0"
            ],
            "retried in place, then the rest, in order"
        );
        let log = log.lock().unwrap();
        for w in log.windows(2) {
            assert!(w[1].1 >= w[0].2, "{} started before {} ended", w[1].0, w[0].0);
        }
    }
}

/// A scheduled intent survives a restart: committed an hour ahead in a file, the process gone
/// (runtime and context dropped), the file reopened by another runtime, it is not delivered
/// before its time and is delivered at it, once.
#[tokio::test(start_paused = true)]
async fn a_scheduled_intent_survives_a_reopen_and_goes_out_at_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let at = {
        let mut ctx = Context::open(&path, "orders").unwrap();
        ctx.create("order:0", order("ada", 1)).unwrap();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("reminders").produce(remind_in_an_hour()))
            .build()
            .unwrap();
        rt.run().await.unwrap();
        let entry = rt.context().ledger().get("remind:order:0").await.unwrap().unwrap();
        entry.not_before().expect("scheduled")
    };
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(Context::open(&path, "orders").unwrap())
        .agent(Agent::new("reminders").produce(remind_in_an_hour()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    assert_eq!(rt.run().await.unwrap().deliveries.delivered, 0, "not before its time");
    assert!(rt.now() < at);
    rt.settle().await.unwrap();
    assert_eq!(recorder.sent(), ["remind:order:0"]);
    assert!(rt.now() >= at);
}

/// An attempt timeout of zero would cancel every attempt: both builders refuse it, with the
/// same error, and build with any positive timeout or none.
#[test]
fn both_builders_refuse_an_attempt_timeout_of_zero() {
    let send = |_: Intent| async { Ok::<(), DispatchError>(()) };
    let zero = DeliveryOptions::new().timeout(Some(Duration::ZERO));
    let ctx = seeded_orders(1);
    let drainer = Drainer::builder(ctx.outbox(), send).delivery(zero.clone()).build();
    assert!(
        matches!(&drainer, Err(BuildError::Delivery { problem, .. }) if problem.contains("timeout of zero")),
        "{:?}",
        drainer.err()
    );
    let runtime = Runtime::builder(seeded_orders(1))
        .dispatcher(send)
        .delivery(zero)
        .build();
    assert!(
        matches!(runtime, Err(BuildError::Delivery { .. })),
        "{:?}",
        runtime.err()
    );
    for fine in [Some(Duration::from_millis(1)), None] {
        let options = DeliveryOptions::new().timeout(fine);
        Drainer::builder(ctx.outbox(), send)
            .delivery(options.clone())
            .build()
            .unwrap();
        Runtime::builder(seeded_orders(1))
            .dispatcher(send)
            .delivery(options)
            .build()
            .unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn an_attempt_is_timed_from_its_start_across_all_its_waits() {
    // Each wait is within the 2 s limit; the first attempt's two (1.5 s + 1 s) are not.
    let calls = Arc::new(AtomicUsize::new(0));
    let dispatcher = {
        let calls = calls.clone();
        move |_: Intent| {
            let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                if first {
                    tokio::time::sleep(Duration::from_millis(1_000)).await;
                }
                Ok::<(), DispatchError>(())
            }
        }
    };
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .delivery(DeliveryOptions::new().timeout(Some(Duration::from_secs(2))))
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.failed[0].error, "timed out after 2s");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_millis(2_100),
        "cut off at its deadline, not at the end of its second wait: {took:?}"
    );
    rt.settle().await.unwrap();
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(
        (entry.status(), entry.attempts()),
        (DeliveryStatus::Delivered, 2),
        "the second attempt, 1.5 s, is within it"
    );
}

#[derive(serde::Deserialize, Debug)]
struct NotifyPayload {
    customer: String,
    order: String,
}

#[tokio::test(start_paused = true)]
async fn a_router_decodes_payloads_and_holds_kinds_it_has_no_route_for() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let router = {
        let seen = seen.clone();
        Router::new().on("audit", move |call: ActionCall<NotifyPayload>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(call.payload.order);
                Ok(())
            }
        })
    };
    let mut rt = Runtime::builder(seeded_orders(2))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(router)
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(
        report.deliveries.held.len(),
        2,
        "no route for `notify`: held, not dropped"
    );
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Held, 0));
    assert!(entry
        .last_error()
        .unwrap()
        .contains("no route handles action kind `notify`"));
    assert_eq!(rt.context().ledger().pending().await.unwrap(), 0);

    // Add the route (a new runtime over the same context) and re-arm: delivered once each.
    let ctx = rt.into_context();
    let router = {
        let seen = seen.clone();
        Router::new().on("notify", move |call: ActionCall<NotifyPayload>| {
            let seen = seen.clone();
            async move {
                assert_eq!(call.attempt, 1);
                assert!(call.key.as_str().starts_with("notify:"));
                seen.lock()
                    .unwrap()
                    .push(format!("{} for {}", call.payload.order, call.payload.customer));
                Ok(())
            }
        })
    };
    let mut rt = Runtime::builder(ctx).dispatcher(router).build().unwrap();
    rt.retry("notify:order:0").await.unwrap();
    rt.retry("notify:order:1").await.unwrap();
    assert_eq!(rt.flush().await.unwrap().delivered, 2);
    assert_eq!(
        *seen.lock().unwrap(),
        ["order:0 for customer-0", "order:1 for customer-1"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_payload_that_does_not_decode_for_its_route_is_a_dead_letter() {
    let router = Router::new().on("notify", |_: ActionCall<Vec<u64>>| async { Ok(()) });
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(router)
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.dead.len(), 1);
    assert!(
        report.deliveries.dead[0].error.contains("does not decode as"),
        "{}",
        report.deliveries.dead[0].error
    );
}

#[tokio::test(start_paused = true)]
async fn a_stop_lets_running_deliveries_finish_within_the_grace_period_and_leaves_the_rest_pending() {
    let started = Arc::new(AtomicUsize::new(0));
    let dispatcher = {
        let started = started.clone();
        move |intent: Intent| {
            started.fetch_add(1, Ordering::SeqCst);
            // order:0 and order:1 take 1 s; order:2 never finishes.
            let forever = intent.key().as_str() == "notify:order:2";
            async move {
                if forever {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<(), DispatchError>(())
            }
        }
    };
    let mut rt = Runtime::builder(seeded_orders(6))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .delivery(
            DeliveryOptions::new()
                .concurrency(3)
                .timeout(None)
                .grace(Duration::from_secs(5)),
        )
        .build()
        .unwrap();
    let stop = rt.stop_handle();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.stop();
    });
    let began = Instant::now();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Stopped);
    assert_eq!(
        began.elapsed(),
        Duration::from_millis(5100),
        "stopped after the grace period"
    );
    assert_eq!(started.load(Ordering::SeqCst), 3, "nothing starts after the stop");
    assert_eq!(report.deliveries.delivered, 2, "the two running deliveries finished");
    let ledger = rt.context().ledger();
    let status = async |key: &str| ledger.get(key).await.unwrap().unwrap().status();
    // The one still running when the grace period ended was cut off: its outcome is unknown,
    // so it is due again at once, with the attempt counted as interrupted.
    let cancelled = ledger.get("notify:order:2").await.unwrap().unwrap();
    assert_eq!(
        (
            cancelled.status(),
            cancelled.attempts(),
            cancelled.interrupted_attempts()
        ),
        (DeliveryStatus::Pending, 1, 1)
    );
    assert!(cancelled.last_error().unwrap().contains("the receiver may have seen"));
    assert_eq!(report.deliveries.interrupted.len(), 1);
    assert!(report.deliveries.failed.is_empty());
    for key in ["notify:order:3", "notify:order:4", "notify:order:5"] {
        assert_eq!(status(key).await, DeliveryStatus::Pending, "{key}");
        assert_eq!(
            ledger.get(key).await.unwrap().unwrap().attempts(),
            0,
            "{key}: never handed out"
        );
    }
    assert!(
        ledger
            .entries()
            .await
            .unwrap()
            .iter()
            .all(|d| d.status() != DeliveryStatus::InFlight),
        "nothing left in flight"
    );
}

#[tokio::test(start_paused = true)]
async fn a_scheduled_retry_survives_a_reopen_of_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let next = {
        let mut ctx = Context::open(&path, "orders").unwrap();
        ctx.create("order:1", order("ada", 1)).unwrap();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(|_: Intent| async { Err::<(), _>(DispatchError::msg("down")) })
            .build()
            .unwrap();
        let report = rt.run().await.unwrap();
        let d = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
        eprintln!("DEBUG {report:?} {d:?}");
        d.next_attempt_at()
    };
    assert!(next.is_some());
    let ctx = Context::open(&path, "orders").unwrap();
    let entry = ctx.ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        (entry.status(), entry.next_attempt_at()),
        (DeliveryStatus::Failed, next)
    );
    assert_eq!(ctx.ledger().pending().await.unwrap(), 1);
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(ctx).dispatcher(recorder.dispatcher()).build().unwrap();
    rt.settle().await.unwrap();
    assert_eq!(recorder.sent(), ["notify:order:1"]);
}

// ---------------------------------------------------------------------------------------------
// Adversarial dispatchers and outside values (issue 12).

#[tokio::test(start_paused = true)]
async fn a_dispatcher_that_panics_before_returning_its_future_is_a_failed_attempt() {
    let calls = Arc::new(AtomicUsize::new(0));
    let dispatcher = {
        let calls = calls.clone();
        move |_: Intent| {
            // Panics while building the future, not inside it.
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("no connection pool");
            }
            std::future::ready(Ok::<(), DispatchError>(()))
        }
    };
    let mut rt = Runtime::builder(seeded_orders(2))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .delivery(DeliveryOptions::new().concurrency(1))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.delivered, 1, "the other intent is not held back");
    assert_eq!(report.deliveries.failed.len(), 1);
    let failure = &report.deliveries.failed[0];
    assert!(failure.error.contains("no connection pool"), "{}", failure.error);
    let entry = rt.context().ledger().get(failure.key.as_str()).await.unwrap().unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Failed, 1));
    rt.settle().await.unwrap();
    let entry = rt.context().ledger().get(failure.key.as_str()).await.unwrap().unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Delivered, 2));
}

/// A dispatcher that fails the first attempt of every key with `first`, then delivers.
fn fails_once(first: impl Fn() -> DispatchError + Send + Sync + 'static, attempts: &Attempts) -> impl Dispatcher {
    let attempts = attempts.clone();
    move |intent: Intent| {
        attempts.record(&intent);
        let result = if intent.attempt() == 1 { Err(first()) } else { Ok(()) };
        std::future::ready(result)
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_of_u64_max_seconds_is_capped_and_ridden_out() {
    let attempts = Attempts::default();
    let huge = || DispatchError::retryable("429").retry_after(Duration::from_secs(u64::MAX));
    assert_eq!(huge().retry_after_hint(), Some(MAX_RETRY_AFTER));
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(fails_once(huge, &attempts))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(entry.status(), DeliveryStatus::Failed);
    let wait = entry
        .next_attempt_at()
        .unwrap()
        .duration_since(entry.updated_at())
        .unwrap();
    assert!(
        wait >= MAX_RETRY_AFTER && wait < MAX_RETRY_AFTER + Duration::from_millis(5),
        "{wait:?}"
    );
    rt.settle().await.unwrap();
    let seen = attempts.of("notify:order:0");
    assert_eq!(seen.len(), 2);
    assert!(seen[1].1 - seen[0].1 >= MAX_RETRY_AFTER);
}

#[tokio::test(start_paused = true)]
async fn a_policy_of_duration_max_schedules_far_ahead_without_panicking() {
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(|_: Intent| async { Err::<(), _>(DispatchError::msg("down")) })
        .delivery(
            DeliveryOptions::new().retry_policy(RetryPolicy::exponential(Duration::MAX, Duration::MAX).max_attempts(3)),
        )
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.failed.len(), 1);
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    let next = entry.next_attempt_at().unwrap();
    let years = next.duration_since(entry.updated_at()).unwrap().as_secs() / (365 * 86_400);
    assert!(years > 1_000, "far ahead: {years} years");
    // A settle sleeps towards it, without panicking, until it is stopped.
    let stop = rt.stop_handle();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        stop.stop();
    });
    rt.settle().await.unwrap();
    assert_eq!(
        rt.context()
            .ledger()
            .get("notify:order:0")
            .await
            .unwrap()
            .unwrap()
            .status(),
        DeliveryStatus::Failed
    );
}

#[test]
fn policy_delays_stay_finite_for_extreme_settings() {
    let policies = [
        RetryPolicy::exponential(Duration::MAX, Duration::MAX),
        RetryPolicy::exponential(Duration::from_secs(1), Duration::MAX).multiplier(f64::INFINITY),
        RetryPolicy::exponential(Duration::from_secs(1), Duration::MAX).multiplier(f64::MAX),
        RetryPolicy::exponential(Duration::ZERO, Duration::MAX).multiplier(f64::INFINITY),
        RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60)).multiplier(f64::NAN),
        RetryPolicy::default(),
    ];
    for policy in &policies {
        for attempt in [0, 1, 2, 64, 65, u32::MAX] {
            let delay = policy.delay("k", attempt);
            assert!(delay <= Duration::MAX, "{policy:?} {attempt}");
        }
    }
    // NaN growth is no growth; zero start stays zero.
    let nan = &policies[4];
    assert!(nan.delay("k", 5) < Duration::from_secs(1));
    assert_eq!(policies[3].delay("k", 9), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_delivery_timeout_and_grace_of_duration_max_wait_without_panicking() {
    let dispatcher = |_: Intent| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<(), DispatchError>(())
    };
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .delivery(DeliveryOptions::new().timeout(Some(Duration::MAX)).grace(Duration::MAX))
        .build()
        .unwrap();
    let stop = rt.stop_handle();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.stop();
    });
    let began = Instant::now();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Stopped);
    assert_eq!(report.deliveries.delivered, 1, "the grace period outlasts the delivery");
    assert_eq!(began.elapsed(), Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn a_lease_of_duration_max_is_kept_as_far_future() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let options = || OpenOptions::new().lease(Duration::MAX);
    {
        let mut ctx = Context::open_with(&path, "orders", options()).unwrap();
        ctx.create("order:1", order("ada", 1)).unwrap();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(|_: Intent| std::future::pending::<Result<(), DispatchError>>())
            .delivery(DeliveryOptions::new().timeout(None))
            .build()
            .unwrap();
        // The process dies while the delivery is in flight.
        crash_mid_turn(&mut rt).await;
    }
    // The durable store still holds it in flight under a lease that has not expired.
    let ctx = Context::open_with(&path, "orders", options()).unwrap();
    let entry = ctx.ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(entry.status(), DeliveryStatus::InFlight);
    let expires = entry.lease().unwrap().expires_at;
    assert!(expires > std::time::SystemTime::now() + Duration::from_secs(100 * 365 * 86_400));
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_shorter_than_the_backoff_does_not_shorten_it() {
    let attempts = Attempts::default();
    let policy = RetryPolicy::exponential(Duration::from_secs(10), Duration::from_secs(60)).max_attempts(3);
    let zero = || DispatchError::retryable("503").retry_after(Duration::ZERO);
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(fails_once(zero, &attempts))
        .delivery(DeliveryOptions::new().retry_policy(policy.clone()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    let seen = attempts.of("notify:order:0");
    assert_eq!(seen.len(), 2);
    let waited = seen[1].1 - seen[0].1;
    let backoff = policy.delay("notify:order:0", 1);
    assert!(
        waited >= backoff && waited < backoff + Duration::from_millis(5),
        "waited {waited:?}, the backoff is {backoff:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_flapping_503_with_retry_after_zero_does_not_use_up_the_attempts_at_once() {
    let calls = Arc::new(AtomicUsize::new(0));
    let dispatcher = {
        let calls = calls.clone();
        move |_: Intent| {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Err::<(), _>(
                DispatchError::retryable("503").retry_after(Duration::ZERO),
            ))
        }
    };
    let mut rt =
        Runtime::builder(seeded_orders(1))
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(dispatcher)
            .delivery(DeliveryOptions::new().retry_policy(
                RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60)).max_attempts(8),
            ))
            .build()
            .unwrap();
    rt.run().await.unwrap();
    // Ride it out for 3 s: the backoff (0.5 s–1 s, then 1 s–2 s, …) allows at most three
    // attempts in all, and the intent is still waiting, not dead.
    let stop = rt.stop_handle();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.stop();
    });
    let settled = rt.settle().await.unwrap();
    assert!(settled.dead.is_empty(), "{settled:?}");
    assert!(
        calls.load(Ordering::SeqCst) <= 3,
        "{} attempts",
        calls.load(Ordering::SeqCst)
    );
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(entry.status(), DeliveryStatus::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_manual_policy_waits_for_retry_whatever_the_hint() {
    let attempts = Attempts::default();
    let soon = || DispatchError::retryable("429").retry_after(Duration::from_secs(5));
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(fails_once(soon, &attempts))
        .delivery(DeliveryOptions::new().retry_policy(RetryPolicy::manual()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(
        (entry.status(), entry.next_attempt_at()),
        (DeliveryStatus::Failed, None)
    );
    assert_eq!(rt.settle().await.unwrap().delivered, 0);
}

// ---------------------------------------------------------------------------------------------
// Attempts cut off by a stop, a deadline or a dropped turn (issue 12).

#[tokio::test(start_paused = true)]
async fn a_stop_that_cuts_off_the_only_attempt_leaves_the_intent_due_not_dead() {
    let attempts = Attempts::default();
    let dispatcher = {
        let attempts = attempts.clone();
        move |intent: Intent| {
            attempts.record(&intent);
            let slow = intent.attempt() == 1;
            async move {
                if slow {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Ok::<(), DispatchError>(())
            }
        }
    };
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .delivery(
            DeliveryOptions::new()
                .retry_policy(
                    RetryPolicy::exponential(Duration::from_secs(60), Duration::from_secs(60)).max_attempts(1),
                )
                .timeout(None)
                .grace(Duration::from_secs(2)),
        )
        .build()
        .unwrap();
    let stop = rt.stop_handle();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.stop();
    });
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Stopped);
    assert!(report.deliveries.dead.is_empty(), "{:?}", report.deliveries.dead);
    assert!(report.deliveries.failed.is_empty(), "{:?}", report.deliveries.failed);
    assert_eq!(report.deliveries.interrupted.len(), 1);
    assert_eq!(report.deliveries.interrupted[0].as_str(), "notify:order:0");
    assert_eq!(report.deliveries.waiting, 1);

    let ledger = rt.context().ledger();
    let entry = ledger.get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(entry.status(), DeliveryStatus::Pending, "due again at once");
    assert_eq!((entry.attempts(), entry.interrupted_attempts()), (1, 1));
    assert!(entry.last_error().unwrap().contains("the receiver may have seen"));

    // The next flush delivers it with the same key, without waiting out any backoff.
    let flushed = rt.flush().await.unwrap();
    assert_eq!(flushed.delivered, 1);
    let seen = attempts.of("notify:order:0");
    assert_eq!(seen.iter().map(|(a, _)| *a).collect::<Vec<_>>(), [1, 2]);
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Delivered, 2));
}

#[tokio::test(start_paused = true)]
async fn an_attempt_cut_off_by_the_deadline_does_not_count_against_max_attempts() {
    let dispatcher = |intent: Intent| async move {
        if intent.attempt() == 1 {
            std::future::pending::<()>().await;
        }
        Err::<(), _>(DispatchError::msg("503 service unavailable"))
    };
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .delivery(
            DeliveryOptions::new()
                .retry_policy(RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(1)).max_attempts(2))
                .timeout(None)
                .grace(Duration::ZERO),
        )
        .build()
        .unwrap();
    let report = rt
        .run_with(Budget::default().deadline(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::DeadlineExceeded);
    assert_eq!(report.deliveries.interrupted.len(), 1);
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(entry.status(), DeliveryStatus::Pending);

    // Two real failures make the dead letter; the cut-off attempt was not one of them.
    let settled = rt.settle().await.unwrap();
    assert_eq!(settled.failed.len(), 1, "{settled:?}");
    assert_eq!(settled.failed[0].attempt, 2);
    assert_eq!(settled.dead.len(), 1, "{settled:?}");
    assert_eq!(settled.dead[0].attempt, 3);
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!(
        (entry.status(), entry.attempts(), entry.interrupted_attempts()),
        (DeliveryStatus::Dead, 3, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_turn_records_finished_outcomes_as_they_finished() {
    // order:0 is refused with a 400, order:1 fails once with its only attempt, order:2 is
    // delivered, order:3 hangs until the caller gives up on the turn.
    let calls = Attempts::default();
    let dispatcher = {
        let calls = calls.clone();
        move |intent: Intent| {
            calls.record(&intent);
            let key = intent.key().to_string();
            let first = intent.attempt() == 1;
            async move {
                match key.as_str() {
                    "notify:order:0" => Err(DispatchError::permanent("400 bad request")),
                    "notify:order:1" => Err(DispatchError::msg("503 service unavailable")),
                    "notify:order:3" if first => std::future::pending().await,
                    _ => Ok(()),
                }
            }
        }
    };
    let mut rt = Runtime::builder(seeded_orders(4))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .delivery(
            DeliveryOptions::new()
                .retry_policy(RetryPolicy::default().max_attempts(1))
                .timeout(None),
        )
        .build()
        .unwrap();
    assert!(tokio::time::timeout(Duration::from_secs(1), rt.run()).await.is_err());

    let ledger = rt.context().ledger().clone();
    let state = async |key: &str| {
        let entry = ledger.get(key).await.unwrap().unwrap();
        (entry.status(), entry.attempts())
    };
    assert_eq!(
        state("notify:order:0").await,
        (DeliveryStatus::Dead, 1),
        "a 400 is not retried"
    );
    assert_eq!(
        state("notify:order:1").await,
        (DeliveryStatus::Dead, 1),
        "max_attempts holds"
    );
    assert_eq!(state("notify:order:2").await, (DeliveryStatus::Delivered, 1));
    assert_eq!(
        state("notify:order:3").await,
        (DeliveryStatus::Pending, 1),
        "cut off: due again"
    );
    assert_eq!(
        ledger
            .get("notify:order:3")
            .await
            .unwrap()
            .unwrap()
            .interrupted_attempts(),
        1
    );

    let flushed = rt.flush().await.unwrap();
    assert_eq!(flushed.delivered, 1);
    assert_eq!(calls.of("notify:order:0").len(), 1);
    assert_eq!(calls.of("notify:order:1").len(), 1);
    assert_eq!(calls.of("notify:order:3").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_turn_records_a_kind_without_a_route_as_held() {
    let router = Router::new().on("audit", |_: ActionCall<u8>| std::future::pending());
    let audit = Produce::new("audit", |call: ProduceCall<Order>| async move {
        call.effects.act("audit", format!("audit:{}", call.trigger.id), &1u8);
    })
    .creates::<reactifact_core::PendingAction>();
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()).produce(audit))
        .dispatcher(router)
        .delivery(DeliveryOptions::new().timeout(None))
        .build()
        .unwrap();
    assert!(tokio::time::timeout(Duration::from_secs(1), rt.run()).await.is_err());
    let ledger = rt.context().ledger();
    let notify = ledger.get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((notify.status(), notify.attempts()), (DeliveryStatus::Held, 0));
    let audit = ledger.get("audit:order:0").await.unwrap().unwrap();
    assert_eq!(
        (audit.status(), audit.interrupted_attempts()),
        (DeliveryStatus::Pending, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_dispatcher_of_its_own_can_hold_an_intent_it_has_no_route_for() {
    let dispatcher = |intent: Intent| async move {
        match intent.kind() {
            "notify" => Err(DispatchError::no_route(format!("no handler for `{}`", intent.kind()))),
            _ => Ok(()),
        }
    };
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.held.len(), 1);
    assert!(report.deliveries.dead.is_empty() && report.deliveries.failed.is_empty());
    let entry = rt.context().ledger().get("notify:order:0").await.unwrap().unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Held, 0));
    assert_eq!(entry.last_error(), Some("no handler for `notify`"));
    assert!(DispatchError::no_route("x").is_no_route());
    assert!(!DispatchError::msg("x").is_no_route());
}

#[tokio::test(start_paused = true)]
async fn an_interrupted_attempt_survives_a_reopen_and_still_does_not_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut ctx = Context::open(&path, "orders").unwrap();
        ctx.create("order:1", order("ada", 1)).unwrap();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(|_: Intent| std::future::pending::<Result<(), DispatchError>>())
            .delivery(DeliveryOptions::new().timeout(None).grace(Duration::ZERO))
            .build()
            .unwrap();
        let report = rt
            .run_with(Budget::default().deadline(Duration::from_secs(1)))
            .await
            .unwrap();
        assert_eq!(report.deliveries.interrupted.len(), 1);
    }
    let ctx = Context::open(&path, "orders").unwrap();
    let entry = ctx.ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        (entry.status(), entry.attempts(), entry.interrupted_attempts()),
        (DeliveryStatus::Pending, 1, 1)
    );
    // Two failures allowed: the first real one, attempt 2, is not the last.
    let mut rt = Runtime::builder(ctx)
        .dispatcher(|_: Intent| async { Err::<(), _>(DispatchError::msg("down")) })
        .delivery(DeliveryOptions::new().retry_policy(RetryPolicy::default().max_attempts(2)))
        .build()
        .unwrap();
    let flushed = rt.flush().await.unwrap();
    assert_eq!(flushed.failed.len(), 1, "{flushed:?}");
    assert!(flushed.dead.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_holder_stalled_past_its_lease_cannot_overwrite_the_drain_that_reclaimed_it() {
    // A runtime and a drainer over one outbox. The runtime hands the intent to a dispatcher
    // that answers after ten minutes, with a failure; while it waits, its turn is not polled
    // at all (a stalled holder: not even its lease renewal runs), so the five-minute lease
    // expires and the drainer reclaims and delivers the intent.
    let mut ctx = Context::new("shop");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let outbox = ctx.outbox();
    let mut stalled = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(|_: Intent| async {
            tokio::time::sleep(Duration::from_secs(600)).await;
            Err::<(), _>(DispatchError::permanent("a late answer"))
        })
        .delivery(DeliveryOptions::new().timeout(None))
        .build()
        .unwrap();
    let recorder = Recorder::default();
    let live = Drainer::builder(outbox, recorder.dispatcher())
        .build()
        .expect("valid delivery options");

    let mut turn = Box::pin(stalled.run());
    // Poll the turn until its dispatch is under way, then leave it alone.
    assert!(tokio::time::timeout(Duration::from_secs(1), &mut turn).await.is_err());
    tokio::time::sleep(Duration::from_secs(360)).await;
    let live_report = live.flush().await.unwrap();
    assert_eq!(live_report.delivered, 1);
    assert_eq!(recorder.sent(), ["notify:order:1"]);

    // The stalled holder resumes; its late failure is rejected, not recorded over the
    // delivery.
    let stalled_report = turn.await.unwrap();
    assert_eq!(stalled_report.deliveries.stale, 1);
    assert!(
        stalled_report.deliveries.dead.is_empty(),
        "{:?}",
        stalled_report.deliveries.dead
    );
    let entry = stalled.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        (entry.status(), entry.attempts(), entry.expired_leases()),
        (DeliveryStatus::Delivered, 2, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_long_dispatch_renews_its_lease_and_is_not_reclaimed_while_its_drain_lives() {
    // The dispatch takes twenty minutes, four times the five-minute lease; a drainer of the
    // same outbox drains every six minutes meanwhile.
    let mut ctx = Context::new("shop");
    ctx.create("order:1", order("ada", 1)).unwrap();
    let outbox = ctx.outbox();
    let slow = Recorder::default();
    let mut long = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher({
            let sent = slow.sent.clone();
            move |intent: Intent| {
                let sent = sent.clone();
                async move {
                    tokio::time::sleep(Duration::from_secs(1200)).await;
                    sent.lock().unwrap().push(intent.key().to_string());
                    Ok::<(), DispatchError>(())
                }
            }
        })
        .delivery(DeliveryOptions::new().timeout(None))
        .build()
        .unwrap();
    let other_sends = Recorder::default();
    let watcher = Drainer::builder(outbox, other_sends.dispatcher())
        .build()
        .expect("valid delivery options");
    let (report, reclaimed) = tokio::join!(long.run(), async {
        let mut delivered = 0;
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(360)).await;
            delivered += watcher.flush().await.unwrap().delivered;
        }
        delivered
    });
    assert_eq!(reclaimed, 0, "the renewed lease was never taken for expired");
    assert!(other_sends.sent().is_empty());
    assert_eq!(report.unwrap().deliveries.delivered, 1);
    assert_eq!(slow.sent(), ["notify:order:1"]);
    let entry = long.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        (entry.status(), entry.attempts(), entry.expired_leases()),
        (DeliveryStatus::Delivered, 1, 0)
    );
}

#[tokio::test]
async fn failed_attempts_counts_the_failures_not_the_attempt_that_succeeded() {
    let calls = Arc::new(AtomicUsize::new(0));
    let dispatcher = {
        let calls = calls.clone();
        move |_: Intent| {
            let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
            std::future::ready(if first {
                Err(DispatchError::retryable("503"))
            } else {
                Ok(())
            })
        }
    };
    let mut rt = Runtime::builder(seeded([("order:1".to_owned(), order("ada", 100))]))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .delivery(DeliveryOptions::new().retry_policy(RetryPolicy::manual()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let failed = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        (failed.status(), failed.attempts(), failed.failed_attempts()),
        (DeliveryStatus::Failed, 1, 1)
    );
    rt.retry("notify:order:1").await.unwrap();
    rt.flush().await.unwrap();
    let delivered = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        (delivered.status(), delivered.attempts(), delivered.failed_attempts()),
        (DeliveryStatus::Delivered, 2, 1),
        "the attempt that succeeded is not a failure"
    );
}

/// How long the lease of each dispatched intent had left when its dispatcher was handed it,
/// read from the store's ledger.
#[derive(Clone, Default)]
struct LeasesSeen(Arc<Mutex<Vec<Duration>>>);

impl LeasesSeen {
    fn dispatcher(&self, ledger: reactifact_core::Ledger) -> impl Dispatcher {
        let seen = self.clone();
        move |intent: Intent| {
            let (seen, ledger) = (seen.clone(), ledger.clone());
            async move {
                let entry = ledger.get(intent.key().as_str()).await.unwrap().unwrap();
                let lease = entry.lease().expect("handed over under a lease");
                let left = lease
                    .expires_at
                    .duration_since(std::time::SystemTime::now())
                    .unwrap_or_default();
                seen.0.lock().unwrap().push(left);
                Ok::<(), DispatchError>(())
            }
        }
    }

    /// Every lease seen, at least this long.
    fn all_at_least(&self, lease: Duration) -> usize {
        let seen = self.0.lock().unwrap();
        assert!(
            seen.iter().all(|left| *left > lease - Duration::from_secs(60)),
            "leases left when dispatched: {seen:?}, want about {lease:?}"
        );
        seen.len()
    }
}

/// One `DeliveryOptions` value configures a runtime and a drainer alike, and its lease is the
/// lease of every claim: those a runtime's commits take for its turn's drain, those its
/// serving delivery takes, and a drainer's — not the 30 s the context was opened with.
#[tokio::test]
async fn the_delivery_options_lease_is_the_lease_of_every_claim() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_secs(3600);
    let options = DeliveryOptions::new().lease(lease).concurrency(4);
    let mut ctx = Context::open(dir.path().join("shop.db"), "t").unwrap();
    ctx.create("order:0", order("a", 1)).unwrap();

    // A turn: the commit claims the intent it registers, and the drain hands it over.
    let by_turn = LeasesSeen::default();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(by_turn.dispatcher(Context::open(dir.path().join("shop.db"), "t").unwrap().ledger()))
        .delivery(options.clone())
        .build()
        .unwrap();
    assert_eq!(rt.run().await.unwrap().deliveries.delivered, 1);
    assert_eq!(by_turn.all_at_least(lease), 1);

    // Serving: the delivery beside the turns claims for itself.
    let serving = LeasesSeen::default();
    let mut rt = Runtime::builder(rt.into_context())
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(serving.dispatcher(Context::open(dir.path().join("shop.db"), "t").unwrap().ledger()))
        .delivery(options.clone())
        .build()
        .unwrap();
    let handle = rt.handle();
    let served = tokio::spawn(async move { rt.serve(Duration::from_millis(10)).await });
    handle.create("order:1", order("b", 2)).await.unwrap();
    while serving.0.lock().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    handle.stop();
    served.await.unwrap().unwrap();
    assert_eq!(serving.all_at_least(lease), 1);

    // A drainer of another session of the store.
    let mut other = Context::open(dir.path().join("shop.db"), "other").unwrap();
    other.create("order:2", order("c", 3)).unwrap();
    let mut rt = Runtime::builder(other)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let drained = LeasesSeen::default();
    let outbox = rt.context().outbox();
    let drainer = Drainer::builder(outbox, drained.dispatcher(rt.context().ledger()))
        .delivery(options)
        .build()
        .expect("valid delivery options");
    assert_eq!(drainer.flush().await.unwrap().delivered, 1);
    assert_eq!(drained.all_at_least(lease), 1);
}
