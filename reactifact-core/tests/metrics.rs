//! The metrics one order yields, counted by a debugging recorder: exactly the counters and
//! histogram samples `docs/observability.md` lists, on tokio's paused clock (so durations are
//! exact), and no payload, key or id in any label.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Notify, Order, Receipt};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use reactifact_core::runtime::Usage;
use reactifact_core::{
    Agent, Context, DeliveryOptions, DispatchError, Intent, PendingAction, Produce, ProduceCall, ProduceError,
    RetryPolicy, Runtime, Scope,
};

/// A metric as the test names it: `name{label=value,...}` (labels sorted).
fn name_of(key: &metrics::Key) -> String {
    let mut labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
    labels.sort();
    if labels.is_empty() {
        key.name().to_owned()
    } else {
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

/// What the recorder holds: counters and gauges by name; histograms as their samples.
#[derive(Debug, Default)]
struct Seen {
    counters: BTreeMap<String, u64>,
    gauges: BTreeMap<String, f64>,
    histograms: BTreeMap<String, Vec<f64>>,
}

fn seen(snapshotter: &Snapshotter) -> Seen {
    let mut seen = Seen::default();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = name_of(key.key());
        match value {
            DebugValue::Counter(n) => {
                seen.counters.insert(name, n);
            }
            DebugValue::Gauge(v) => {
                seen.gauges.insert(name, v.0);
            }
            DebugValue::Histogram(samples) => {
                seen.histograms.insert(name, samples.into_iter().map(|s| s.0).collect());
            }
        }
    }
    seen
}

/// Runs `test` on a paused current-thread runtime with `recorder` as the thread's recorder.
fn with_recorder<F: std::future::Future>(recorder: &DebuggingRecorder, test: impl FnOnce() -> F) -> F::Output {
    metrics::with_local_recorder(recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime")
            .block_on(test())
    })
}

/// Takes 2 s (on the paused clock), writes a receipt, acts one `notify` intent.
fn process_order() -> Produce {
    Produce::new("process_order", |call: ProduceCall<Order>| async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let id = call.trigger.id.to_string();
        call.effects.upsert(
            format!("receipt:{id}"),
            Receipt {
                order: id.clone(),
                total_cents: call.trigger.data.total_cents,
            },
        );
        call.effects.act(
            "notify",
            format!("notify:{id}"),
            &Notify {
                customer: call.trigger.data.customer.clone(),
                order: id,
            },
        );
    })
    .creates::<Receipt>()
    .creates::<PendingAction>()
}

/// A runtime over session `shop` holding `order:1` … `order:{orders}`, its agent `orders`
/// running [`process_order`].
fn shop(orders: u32) -> reactifact_core::runtime::RuntimeBuilder {
    let mut ctx = Context::new("shop");
    for i in 1..=orders {
        ctx.create(format!("order:{i}"), order()).unwrap();
    }
    Runtime::builder(ctx).agent(Agent::new("orders").produce(process_order()))
}

fn order() -> Order {
    Order {
        customer: "ada@example.com".into(),
        total_cents: 4200,
    }
}

#[test]
fn one_order_yields_exactly_the_expected_counters_and_samples() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_recorder(&recorder, || async {
        let mut rt = shop(1)
            // The receiver takes 3 s: the delivery is recorded 3 s after the commit.
            .dispatcher(|_intent: Intent| async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok::<(), DispatchError>(())
            })
            .build()
            .unwrap();
        let report = rt.run().await.unwrap();
        assert_eq!(
            (report.generations, report.runs, report.deliveries.delivered),
            (1, 1, 1)
        );
    });
    let seen = seen(&snapshotter);
    assert_eq!(
        nonzero(&seen),
        BTreeMap::from([
            ("reactifact_deliveries_total{kind=notify,outcome=delivered}", 1),
            ("reactifact_delivery_attempts_total{kind=notify}", 1),
            ("reactifact_generations_committed_total", 1),
            ("reactifact_intents_committed_total{kind=notify}", 1),
            ("reactifact_runs_committed_total{agent=orders,produce=process_order}", 1),
        ]),
        "every counter that counted, and nothing else"
    );
    let histograms = &seen.histograms;
    assert_samples(
        &histograms["reactifact_run_duration_seconds{agent=orders,produce=process_order}"],
        &[2.0],
    );
    assert_samples(&histograms["reactifact_delivery_latency_seconds{kind=notify}"], &[3.0]);
    // Two commits: the order's direct write, and the generation (nothing of the paused clock
    // passes inside a commit of the memory store).
    assert_samples(&histograms["reactifact_commit_duration_seconds"], &[0.0, 0.0]);
    assert_eq!(histograms.len(), 3, "{histograms:?}");
    assert!(seen.gauges.is_empty(), "gauges are set only when the outbox is counted");
    assert_no_secret(&seen);
}

#[test]
fn each_run_is_timed_on_its_own_whether_it_waits_or_ends_at_once() {
    // The runs of one generation: the first waits 3 s, the second ends at its first poll, the
    // third waits 1 s (so the runs end in another order than they start).
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_recorder(&recorder, || async {
        let mut ctx = Context::new("shop");
        for (i, seconds) in [3u64, 0, 1].into_iter().enumerate() {
            let order = Order {
                total_cents: seconds,
                ..order()
            };
            ctx.create(format!("order:{i}"), order).unwrap();
        }
        let waits = Produce::new("waits", |call: ProduceCall<Order>| async move {
            let seconds = call.trigger.data.total_cents;
            if seconds > 0 {
                tokio::time::sleep(Duration::from_secs(seconds)).await;
            }
        });
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("orders").produce(waits))
            .build()
            .unwrap();
        assert_eq!(rt.run().await.unwrap().runs, 3);
    });
    let seen = seen(&snapshotter);
    assert_samples(
        &seen.histograms["reactifact_run_duration_seconds{agent=orders,produce=waits}"],
        &[3.0, 0.0, 1.0],
    );
}

/// `samples` are `expected`, to the paused clock's resolution: tokio's timers fire on
/// whole-millisecond ticks, so a 2 s sleep may end up to a millisecond late, and the ledger
/// keeps a retry time rounded up to a whole millisecond (a retry's wait: up to two late).
fn assert_samples(samples: &[f64], expected: &[f64]) {
    assert_eq!(samples.len(), expected.len(), "{samples:?} for {expected:?}");
    for (got, want) in samples.iter().zip(expected) {
        assert!((want..=&(want + 0.005)).contains(&got), "{samples:?} for {expected:?}");
    }
}

/// Counters that are 0 are not "seen": the handles a drain registers for every outcome of a
/// kind only count once something happens.
fn nonzero(seen: &Seen) -> BTreeMap<&str, u64> {
    seen.counters
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| (k.as_str(), *v))
        .collect()
}

/// No label value carries the payload (the customer's address), a key or an id.
fn assert_no_secret(seen: &Seen) {
    let names = seen
        .counters
        .keys()
        .chain(seen.gauges.keys())
        .chain(seen.histograms.keys());
    for name in names {
        for secret in ["ada@example.com", "order:1", "notify:", "receipt:", "shop"] {
            assert!(!name.contains(secret), "{name} carries {secret:?}");
        }
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(1))
}

#[test]
fn failures_retries_and_dead_letters_are_counted_by_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_recorder(&recorder, || async {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let mut rt = shop(2)
            // order:1 fails once, then goes through; order:2 always fails permanently.
            .dispatcher(move |intent: Intent| {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    match intent.key().as_str() {
                        "notify:order:2" => Err(DispatchError::permanent("refused")),
                        _ if n == 0 => Err(DispatchError::retryable("down")),
                        _ => Ok(()),
                    }
                }
            })
            .delivery(DeliveryOptions::new().retry_policy(policy()))
            .build()
            .unwrap();
        rt.run().await.unwrap();
        rt.settle().await.unwrap();
    });
    let seen = seen(&snapshotter);
    let counters = nonzero(&seen);
    assert_eq!(counters["reactifact_deliveries_total{kind=notify,outcome=failed}"], 1);
    assert_eq!(
        counters["reactifact_deliveries_total{kind=notify,outcome=delivered}"],
        1
    );
    assert_eq!(counters["reactifact_deliveries_total{kind=notify,outcome=dead}"], 1);
    assert_eq!(counters["reactifact_delivery_attempts_total{kind=notify}"], 3);
    assert_eq!(counters["reactifact_intents_committed_total{kind=notify}"], 2);
    assert_eq!(
        counters["reactifact_runs_committed_total{agent=orders,produce=process_order}"],
        2
    );
    // Delivered one (jittered) backoff after its commit.
    let backoff = policy().delay("notify:order:1", 1).as_secs_f64();
    assert_samples(
        &seen.histograms["reactifact_delivery_latency_seconds{kind=notify}"],
        &[backoff],
    );
    assert_no_secret(&seen);
}

#[test]
fn an_expired_lease_reclaimed_and_the_outbox_gauges() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    with_recorder(&recorder, || async {
        // No dispatcher: the two intents stay pending.
        let mut rt = shop(2).build().unwrap();
        rt.run().await.unwrap();
        let ledger = rt.context().ledger();
        tokio::time::advance(Duration::from_secs(5)).await;
        ledger.record_metrics().await.unwrap();
        let gauges = seen(&snapshotter).gauges;
        assert_eq!(gauges["reactifact_outbox_intents{status=pending}"], 2.0);
        assert_eq!(gauges["reactifact_outbox_intents{status=delivered}"], 0.0);
        assert_samples(&[gauges["reactifact_outbox_oldest_pending_age_seconds"]], &[5.0]);
        assert_eq!(gauges.len(), 12, "ten statuses, retrying, and the age: {gauges:?}");

        // A holder claims one and dies; once its lease expires a drainer reclaims it.
        let outbox = rt.context().outbox();
        // The process's clock now: the commit's time, 5 s later.
        let committed = ledger.get("notify:order:1").await.unwrap().unwrap().recorded_at();
        let owner: Arc<str> = Arc::from("a holder that dies");
        let request = reactifact_core::store::ClaimRequest {
            scope: &Scope::all(),
            limit: 1,
            owner: &owner,
            lease: Duration::from_secs(1),
            now: committed + Duration::from_secs(5),
            policy: reactifact_core::store::ClaimPolicy::none(),
        };
        let claimed = outbox.claim(request).await.unwrap();
        assert_eq!(claimed.claims.len(), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        let drainer = reactifact_core::Drainer::builder(outbox, |_: Intent| async { Ok::<(), DispatchError>(()) })
            .build()
            .expect("valid delivery options");
        assert_eq!(drainer.flush().await.unwrap().delivered, 2);
        ledger.record_metrics().await.unwrap();
        let seen = seen(&snapshotter);
        assert_eq!(nonzero(&seen)["reactifact_leases_reclaimed_total"], 1);
        assert_eq!(seen.gauges["reactifact_outbox_intents{status=pending}"], 0.0);
        assert_eq!(seen.gauges["reactifact_outbox_intents{status=delivered}"], 2.0);
        assert_eq!(seen.gauges["reactifact_outbox_oldest_pending_age_seconds"], 0.0);
    });
}

#[test]
fn without_a_recorder_nothing_is_recorded_and_nothing_breaks() {
    // The metrics of a turn run outside any recorder go nowhere; a recorder installed for a
    // later turn receives that turn's.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let mut rt = shop(1)
        .dispatcher(|_: Intent| async { Ok::<(), DispatchError>(()) })
        .build()
        .unwrap();
    runtime.block_on(rt.run()).unwrap();
    rt.context_mut().create("order:2", order()).unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(rt.run())).unwrap();
    let seen = seen(&snapshotter);
    let counters = nonzero(&seen);
    assert_eq!(
        counters["reactifact_runs_committed_total{agent=orders,produce=process_order}"],
        1
    );
    assert_eq!(
        counters["reactifact_deliveries_total{kind=notify,outcome=delivered}"],
        1
    );
}

/// Asks a metered `llm` call per order (1,200 tokens in, 300 out, cost 450; `calls` counts
/// the calls made), then fails while `fail` is set, after the call, so that the turn fails and
/// the order runs again with the answer kept for it.
fn triage(calls: Arc<AtomicU32>, fail: Arc<AtomicBool>) -> Produce {
    Produce::new("triage", move |call: ProduceCall<Order>| {
        let (calls, fail) = (calls.clone(), fail.clone());
        async move {
            let category: String = call
                .record_metered("llm", call.trigger.id.as_str(), || async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(("billing".to_owned(), Usage::tokens(1_200, 300).with_cost(450)))
                })
                .await?;
            if fail.load(Ordering::SeqCst) {
                return Err(ProduceError::msg("the answer did not parse"));
            }
            let id = call.trigger.id.to_string();
            call.effects.upsert(
                format!("receipt:{id}"),
                Receipt {
                    order: category,
                    total_cents: call.trigger.data.total_cents,
                },
            );
            Ok(())
        }
    })
    .creates::<Receipt>()
}

#[test]
fn the_tokens_and_cost_of_metered_calls_made_are_counted_not_of_answers_reused() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let calls = Arc::new(AtomicU32::new(0));
    let fail = Arc::new(AtomicBool::new(true));
    with_recorder(&recorder, || async {
        let mut ctx = Context::new("shop");
        ctx.create("order:1", order()).unwrap();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("support").produce(triage(calls.clone(), fail.clone())))
            .build()
            .unwrap();
        // The call is made, then the run fails the turn: its tokens were spent, and count.
        assert!(rt.run().await.is_err());
        // The retry gets the answer back without calling: nothing more counts.
        fail.store(false, Ordering::SeqCst);
        let report = rt.run().await.unwrap();
        assert_eq!(report.usage[0].reused, 1, "{:?}", report.usage);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Another order: a call made, counted.
        rt.context_mut().create("order:2", order()).unwrap();
        rt.run().await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    });
    let seen = seen(&snapshotter);
    let usage: BTreeMap<&str, u64> = nonzero(&seen)
        .into_iter()
        .filter(|(name, _)| name.starts_with("reactifact_call_"))
        .collect();
    assert_eq!(
        usage,
        BTreeMap::from([
            (
                "reactifact_call_cost_total{agent=support,model=llm,produce=triage}",
                900
            ),
            (
                "reactifact_call_tokens_in_total{agent=support,model=llm,produce=triage}",
                2_400
            ),
            (
                "reactifact_call_tokens_out_total{agent=support,model=llm,produce=triage}",
                600
            ),
        ]),
        "two calls made, by agent, produce and model (the call's name); the reused answer not counted"
    );
    assert_no_secret(&seen);
}
