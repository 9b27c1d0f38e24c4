//! Allocations on the hot paths, counted with a counting global allocator (this test
//! binary's own), as the difference between 3,000 and 1,000 orders, so that fixed costs
//! cancel out:
//!
//! - the drain's in-memory path allocates per batch of claims, not per intent: an attempt
//!   that ends where it starts (an in-process dispatcher that answers at once) reuses the slot
//!   of the one before it;
//! - a generation allocates, per run, what the run keeps and what its produce allocates
//!   itself, and nothing for running it: a run that ends where it starts leaves its slot to
//!   its produce's next run.
//!
//! The allocator counts every thread of the process: the tests here take `SERIAL` first, so
//! that none counts another's allocations.

mod common;

use common::*;
use reactifact_core::runtime::Budget;
use reactifact_core::{Agent, Context, DispatchError, Drainer, Intent, Runtime};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

/// The system allocator, counting (this test binary's own).
#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Held by each test while it counts.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A context with `n` committed, undelivered `notify` intents.
async fn pending(n: u64) -> Context {
    let ctx = seeded((0..n).map(|i| (format!("order:{i}"), order("ada", i))));
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("orders").produce(process_order()))
        .build()
        .unwrap();
    rt.run_with(Budget::UNLIMITED).await.unwrap();
    rt.into_context()
}

/// Allocations made while a drainer delivers `n` intents, and how many it delivered.
async fn drain_allocations(n: u64) -> (u64, u64) {
    let ctx = pending(n).await;
    let drainer = Drainer::builder(ctx.outbox(), |_intent: Intent| {
        std::future::ready(Ok::<(), DispatchError>(()))
    })
    .build()
    .expect("valid delivery options");
    let region = Region::new(GLOBAL);
    let report = drainer.flush().await.unwrap();
    // Reallocations count too: a growing buffer may move.
    let made = region.change();
    ((made.allocations + made.reallocations) as u64, report.delivered)
}

#[tokio::test(flavor = "current_thread")]
async fn delivering_an_intent_in_memory_allocates_nothing_of_its_own() {
    let _serial = SERIAL.lock().await;
    let (small, delivered_small) = drain_allocations(1_000).await;
    let (large, delivered_large) = drain_allocations(3_000).await;
    assert_eq!((delivered_small, delivered_large), (1_000, 3_000));
    let per_intent = large.saturating_sub(small) as f64 / 2_000.0;
    // Per batch of claims there are a few (the claimed list, the written outcomes); one per
    // intent (a boxed attempt, a cloned string) would make this at least 1.
    assert!(
        per_intent < 0.5,
        "{per_intent:.2} allocations per delivered intent ({small} for 1,000, {large} for 3,000)"
    );
}

/// Allocations made while a runtime without a dispatcher runs the generation of `n` orders.
async fn generation_allocations(n: u64) -> u64 {
    let ctx = seeded((0..n).map(|i| (format!("order:{i}"), order("ada", i))));
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("orders").produce(process_order()))
        .build()
        .unwrap();
    let region = Region::new(GLOBAL);
    let report = rt.run_with(Budget::UNLIMITED).await.unwrap();
    let made = region.change();
    assert_eq!(report.runs, n);
    (made.allocations + made.reallocations) as u64
}

/// Per run of `process_order`, 16.06 measured: 6 allocations are the produce's own (the
/// decoded order's customer, the id as a `String`, two `format!`s, two clones); the rest are
/// the run's buffer and what the commit keeps (the vector of the operations, the encodings,
/// the ids, the stored versions). The run's future is not boxed for each run any more (17.06
/// before): a run that ends at its first poll leaves its slot to the next.
#[tokio::test(flavor = "current_thread")]
async fn a_run_allocates_only_what_it_keeps_and_what_its_produce_allocates() {
    let _serial = SERIAL.lock().await;
    let small = generation_allocations(1_000).await;
    let large = generation_allocations(3_000).await;
    let per_run = large.saturating_sub(small) as f64 / 2_000.0;
    assert!(
        per_run < 16.5,
        "{per_run:.2} allocations per run ({small} for 1,000, {large} for 3,000)"
    );
}
