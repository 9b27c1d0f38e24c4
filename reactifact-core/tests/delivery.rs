//! The delivery engine: retries with backoff, dead letters, concurrency limits, timeouts,
//! typed routing and a graceful stop. Timed behaviour runs on tokio's paused clock.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use reactifact_core::{
    ActionCall, Agent, Context, DeliveryStatus, DispatchError, Intent, Produce, ProduceCall, RetryPolicy, Router,
    Runtime, TurnOutcome,
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
        .retry_policy(policy.clone())
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.deliveries.failed.len(), 1);
    assert_eq!(report.deliveries.waiting, 1, "the retry is scheduled, not lost");
    let entry = rt.context().ledger().get("notify:order:0").unwrap();
    assert_eq!(entry.status(), DeliveryStatus::Failed);
    assert!(entry.next_attempt_at().is_some());

    let settled = rt.settle().await.unwrap();
    assert_eq!(settled.delivered, 1);
    let entry = rt.context().ledger().get("notify:order:0").unwrap();
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
    let mut rt = Runtime::builder(seeded_orders(1))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(dispatcher)
        .retry_policy(RetryPolicy::exponential(Duration::from_millis(100), Duration::from_secs(1)).max_attempts(3))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let settled = rt.settle().await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(settled.dead.len(), 1);
    assert_eq!(settled.dead[0].status, DeliveryStatus::Dead);
    let entry = rt.context().ledger().get("notify:order:0").unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Dead, 3));
    assert_eq!(entry.last_error(), Some("still down"));
    assert_eq!(rt.context().ledger().pending(), 0, "a dead letter waits for nobody");

    rt.retry("notify:order:0").unwrap();
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
    let entry = rt.context().ledger().get("notify:order:0").unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Dead, 1));
    assert_eq!(entry.next_attempt_at(), None);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_hint_wins_over_the_backoff() {
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
        .retry_policy_for("notify", RetryPolicy::manual())
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
        .delivery_concurrency(8)
        .delivery_concurrency_for("audit", 2)
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
        .delivery_timeout(Some(Duration::from_secs(2)))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.deliveries.failed[0].error, "timed out after 2s");
    rt.settle().await.unwrap();
    let entry = rt.context().ledger().get("notify:order:0").unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Delivered, 2));
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
    let entry = rt.context().ledger().get("notify:order:0").unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::Held, 0));
    assert!(entry
        .last_error()
        .unwrap()
        .contains("no route handles action kind `notify`"));
    assert_eq!(rt.context().ledger().pending(), 0);

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
    rt.retry("notify:order:0").unwrap();
    rt.retry("notify:order:1").unwrap();
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
        .delivery_concurrency(3)
        .delivery_timeout(None)
        .shutdown_grace(Duration::from_secs(5))
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
    let status = |key: &str| ledger.get(key).unwrap().status();
    // The one still running when the grace period ended is a recorded, retryable failure.
    let cancelled = ledger.get("notify:order:2").unwrap();
    assert_eq!((cancelled.status(), cancelled.attempts()), (DeliveryStatus::Failed, 1));
    assert!(cancelled.last_error().unwrap().contains("the receiver may have seen"));
    for key in ["notify:order:3", "notify:order:4", "notify:order:5"] {
        assert_eq!(status(key), DeliveryStatus::Pending, "{key}");
        assert_eq!(ledger.get(key).unwrap().attempts(), 0, "{key}: never handed out");
    }
    assert!(
        ledger.iter().all(|d| d.status() != DeliveryStatus::InFlight),
        "nothing left in flight"
    );
}

#[tokio::test(start_paused = true)]
async fn a_scheduled_retry_survives_a_reopen_of_the_sqlite_store() {
    let dir = std::env::temp_dir().join(format!("reactifact-delivery-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.db");
    let next = {
        let mut ctx = Context::open(&path, "orders").unwrap();
        ctx.create("order:1", order("ada", 1)).unwrap();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(|_: Intent| async { Err::<(), _>(DispatchError::msg("down")) })
            .build()
            .unwrap();
        rt.run().await.unwrap();
        rt.context().ledger().get("notify:order:1").unwrap().next_attempt_at()
    };
    assert!(next.is_some());
    let ctx = Context::open(&path, "orders").unwrap();
    let entry = ctx.ledger().get("notify:order:1").unwrap();
    assert_eq!(
        (entry.status(), entry.next_attempt_at()),
        (DeliveryStatus::Failed, next)
    );
    assert_eq!(ctx.ledger().pending(), 1);
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(ctx).dispatcher(recorder.dispatcher()).build().unwrap();
    rt.settle().await.unwrap();
    assert_eq!(recorder.sent(), ["notify:order:1"]);
    let _ = std::fs::remove_dir_all(&dir);
}
