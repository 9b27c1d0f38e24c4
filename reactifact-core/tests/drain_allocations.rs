//! The drain's in-memory path allocates per batch of claims, not per intent: an attempt that
//! ends where it starts (an in-process dispatcher that answers at once) reuses the slot of
//! the one before it. Counted with a counting global allocator (this test binary's own), as
//! the difference between draining 3,000 and 1,000 intents, so the fixed cost of a drain
//! (its buffers, the first slot) cancels out. The allocator counts every thread of the
//! process: keep this binary to this one test, or tests running beside it are counted too.

mod common;

use common::*;
use reactifact_core::{Agent, Budget, Context, DispatchError, Drainer, Intent, Runtime};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

/// The system allocator, counting (this test binary's own).
#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

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
    .build();
    let region = Region::new(GLOBAL);
    let report = drainer.flush().await.unwrap();
    // Reallocations count too: a growing buffer may move.
    let made = region.change();
    ((made.allocations + made.reallocations) as u64, report.delivered)
}

#[tokio::test(flavor = "current_thread")]
async fn delivering_an_intent_in_memory_allocates_nothing_of_its_own() {
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
