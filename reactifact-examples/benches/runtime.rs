//! Micro-benchmarks of the runtime's hot paths, through its public API.
//!
//! ```text
//! cargo bench -p reactifact-examples --bench runtime
//! cargo bench -p reactifact-examples --bench runtime -- commit     # one group
//! ```
//!
//! - `content_hash`: what the runtime does per artifact — rmp-serde (named fields) then
//!   SHA-256 — for the workload's two records. The floor the runtime's overhead sits on.
//! - `effects_compile`: k writes compiled to operations (encode, hash, build the op) in a
//!   transaction that is dropped uncommitted. `Effects::upsert` runs the same code.
//! - `commit`: `Transaction::commit` of one generation with k creates on an empty context.
//! - `generation`: one turn over k seeded orders without a dispatcher: match, run k produces
//!   (each a receipt and a `notify` intent), validate, commit; the intents stay pending.
//! - `drain`: `Runtime::flush` of k pending intents to an in-process dispatcher.
//! - `turn`: the whole outbox workload for k orders (generation plus drain), as outbox-bench.
//! - `fan_out`: one produce run that records k intents (one order, k notifications): the
//!   cost of `Effects::act` as a run's patch grows. Linear in k is the expectation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use divan::Bencher;
use reactifact_core::runtime::{Budget, TurnOutcome};
use reactifact_core::{
    Agent, Context, DispatchError, Intent, PendingAction, Produce, ProduceCall, ProduceError, Runtime,
};
use serde::Serialize;
use sha2::{Digest, Sha256};

fn main() {
    divan::main();
}

use reactifact_examples::order_flow::{process_order, Notify, Order, Receipt};

fn order(i: usize) -> Order {
    Order {
        customer: format!("c{i}@example.com"),
        total_cents: i as u64,
    }
}

/// A context with `k` orders seeded in one generation.
fn seeded(k: usize) -> Context {
    let mut ctx = Context::new("bench");
    let mut tx = ctx.transaction();
    for i in 0..k {
        tx.create(format!("order:{i}"), order(i));
    }
    tx.commit().expect("seeding commits");
    ctx
}

/// The ids and values of `k` orders, built outside the timed part.
fn orders(k: usize) -> Vec<(String, Order)> {
    (0..k).map(|i| (format!("order:{i}"), order(i))).collect()
}

fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio starts")
}

fn counting_dispatcher(
    count: Arc<AtomicU64>,
) -> impl Fn(Intent) -> std::future::Ready<Result<(), DispatchError>> + Send + Sync + 'static {
    move |_intent: Intent| {
        count.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Ok(()))
    }
}

const SIZES: &[usize] = &[1, 100, 10_000];

/// rmp-serde (named fields) + SHA-256 of the workload's records, as the runtime stores them.
mod content_hash {
    use super::*;

    fn encode_and_hash<T: Serialize>(value: &T) -> [u8; 32] {
        let bytes = rmp_serde::to_vec_named(value).expect("encodes");
        Sha256::digest(&bytes).into()
    }

    #[divan::bench]
    fn receipt(bencher: Bencher) {
        let receipt = Receipt {
            order: "order:12345".to_owned(),
            total_cents: 12345,
        };
        bencher.bench_local(|| encode_and_hash(divan::black_box(&receipt)));
    }

    #[divan::bench]
    fn pending_action(bencher: Bencher) {
        let payload = rmp_serde::to_vec_named(&Notify {
            customer: "c12345@example.com".to_owned(),
            order: "order:12345".to_owned(),
        })
        .expect("encodes");
        let action = PendingAction {
            kind: "notify".to_owned(),
            key: "notify:order:12345".to_owned(),
            payload,
            requires_approval: false,
            not_before: None,
            group: None,
        };
        bencher.bench_local(|| encode_and_hash(divan::black_box(&action)));
    }

    /// Both records of one order: the floor the issue quotes (about 0.22 µs).
    #[divan::bench]
    fn one_order(bencher: Bencher) {
        let receipt = Receipt {
            order: "order:12345".to_owned(),
            total_cents: 12345,
        };
        let notify = Notify {
            customer: "c12345@example.com".to_owned(),
            order: "order:12345".to_owned(),
        };
        bencher.bench_local(|| {
            let r = encode_and_hash(divan::black_box(&receipt));
            let payload = rmp_serde::to_vec_named(divan::black_box(&notify)).expect("encodes");
            let action = PendingAction {
                kind: "notify".to_owned(),
                key: "notify:order:12345".to_owned(),
                payload,
                requires_approval: false,
                not_before: None,
                group: None,
            };
            (r, encode_and_hash(&action))
        });
    }
}

/// k writes compiled to operations: encode, hash, build the op. Dropped without a commit.
#[divan::bench(args = SIZES)]
fn effects_compile(bencher: Bencher, k: usize) {
    let values = orders(k);
    let mut ctx = Context::new("bench");
    bencher.counter(divan::counter::ItemsCount::new(k)).bench_local(|| {
        let mut tx = ctx.transaction();
        for (id, order) in &values {
            tx.create(id.as_str(), order.clone());
        }
        drop(divan::black_box(tx));
    });
}

/// `Transaction::commit` of one generation with k creates on an empty context.
#[divan::bench(args = SIZES, sample_count = 30)]
fn commit(bencher: Bencher, k: usize) {
    bencher
        .counter(divan::counter::ItemsCount::new(k))
        .with_inputs(|| {
            let ctx = Context::new("bench");
            (ctx, orders(k))
        })
        .bench_local_values(|(mut ctx, values)| {
            let mut tx = ctx.transaction();
            for (id, order) in values {
                tx.create(id, order);
            }
            tx.commit().expect("commits");
            ctx
        });
}

/// One turn over k seeded orders, no dispatcher: the generation alone.
#[divan::bench(args = SIZES, sample_count = 30)]
fn generation(bencher: Bencher, k: usize) {
    let tokio = tokio();
    bencher
        .counter(divan::counter::ItemsCount::new(k))
        .with_inputs(|| {
            Runtime::builder(seeded(k))
                .agent(Agent::new("billing").produce(process_order))
                .budget(Budget::UNLIMITED)
                .build()
                .unwrap()
        })
        .bench_local_values(|mut rt| {
            let report = tokio.block_on(rt.run()).expect("turn succeeds");
            assert_eq!(report.runs, k as u64);
            rt
        });
}

/// `Runtime::flush` of k pending intents to an in-process dispatcher.
#[divan::bench(args = SIZES, sample_count = 30)]
fn drain(bencher: Bencher, k: usize) {
    let tokio = tokio();
    let count = Arc::new(AtomicU64::new(0));
    bencher
        .counter(divan::counter::ItemsCount::new(k))
        .with_inputs(|| {
            // A runtime without a dispatcher leaves the intents pending; a second one over the
            // same context delivers them.
            let mut producer = Runtime::builder(seeded(k))
                .agent(Agent::new("billing").produce(process_order))
                .budget(Budget::UNLIMITED)
                .build()
                .unwrap();
            tokio.block_on(producer.run()).expect("turn succeeds");
            let ctx = producer.into_context();
            assert_eq!(tokio.block_on(ctx.ledger().pending()).unwrap(), k as u64);
            Runtime::builder(ctx)
                .dispatcher(counting_dispatcher(count.clone()))
                .build()
                .unwrap()
        })
        .bench_local_values(|mut rt| {
            let report = tokio.block_on(rt.flush()).expect("flush succeeds");
            assert_eq!(report.delivered, k as u64);
            rt
        });
}

/// The whole outbox workload for k orders: one generation and the drain of its k intents.
#[divan::bench(args = SIZES, sample_count = 30)]
fn turn(bencher: Bencher, k: usize) {
    let tokio = tokio();
    let count = Arc::new(AtomicU64::new(0));
    bencher
        .counter(divan::counter::ItemsCount::new(k))
        .with_inputs(|| {
            Runtime::builder(seeded(k))
                .agent(Agent::new("billing").produce(process_order))
                .dispatcher(counting_dispatcher(count.clone()))
                .budget(Budget::UNLIMITED)
                .build()
                .unwrap()
        })
        .bench_local_values(|mut rt| {
            let report = tokio.block_on(rt.run()).expect("turn succeeds");
            assert_eq!(report.outcome, TurnOutcome::Completed);
            assert_eq!(report.deliveries.delivered, k as u64);
            rt
        });
}

/// One order whose produce records k intents: the run's effects and their commit.
#[divan::bench(args = [10, 100, 1_000, 10_000], sample_count = 20)]
fn fan_out(bencher: Bencher, k: usize) {
    let tokio = tokio();
    let fan_out = Produce::new("notify_all", move |call: ProduceCall<Order>| async move {
        for i in 0..k {
            call.effects
                .act("notify", format!("notify:{}:{i}", call.trigger.id), &i);
        }
        Ok::<(), ProduceError>(())
    })
    .creates::<PendingAction>();
    bencher
        .counter(divan::counter::ItemsCount::new(k))
        .with_inputs(|| {
            Runtime::builder(seeded(1))
                .agent(Agent::new("notifier").produce(fan_out.clone()))
                .budget(Budget::UNLIMITED)
                .build()
                .unwrap()
        })
        .bench_local_values(|mut rt| {
            tokio.block_on(rt.run()).expect("turn succeeds");
            assert_eq!(tokio.block_on(rt.context().ledger().pending()).unwrap(), k as u64);
            rt
        });
}
