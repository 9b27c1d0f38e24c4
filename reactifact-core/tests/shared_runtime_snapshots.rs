//! Snapshots kept by produces across many generations, in isolation mode with a patch
//! that fails to apply every generation (rolled back while a kept snapshot shares the base).
#![allow(dead_code)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use reactifact_core::audit::StateHash;
use reactifact_core::runtime::{ProduceErrors, TurnOutcome};
use reactifact_core::{Agent, Context, Produce, ProduceCall, ProduceError, Runtime, Snapshot};

const CHAIN: u64 = 300;

type Kept = Arc<Mutex<Vec<(Snapshot, StateHash, usize, Vec<(String, u64)>)>>>;

fn contents(snap: &Snapshot) -> Vec<(String, u64)> {
    let mut v: Vec<_> = snap
        .list::<Order>()
        .map(|r| r.unwrap())
        .map(|r| (r.id.to_string(), r.data.total_cents))
        .collect();
    v.extend(
        snap.list::<Receipt>()
            .map(|r| r.unwrap())
            .map(|r| (r.id.to_string(), r.data.total_cents)),
    );
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produces_that_keep_snapshots_across_generations_see_a_frozen_state() {
    let mut ctx = Context::new("t");
    ctx.create("order:0", order("ada", 0)).unwrap();
    let kept: Kept = Arc::default();
    let keep = kept.clone();
    let keeper = Produce::new("keeper", move |call: ProduceCall<Order>| {
        let keep = keep.clone();
        async move {
            let snap = call.effects.snapshot().clone();
            let hash = snap.state_hash();
            let len = snap.len();
            let seen = contents(&snap);
            keep.lock().unwrap().push((snap, hash, len, seen));
            Ok::<(), ProduceError>(())
        }
    });
    let chain = Produce::new("chain", |call: ProduceCall<Order>| async move {
        let k = call.trigger.data.total_cents;
        call.effects.upsert(
            format!("receipt:{}", call.trigger.id),
            Receipt {
                order: call.trigger.id.to_string(),
                total_cents: k,
            },
        );
        if k < CHAIN {
            call.effects.create(format!("order:{}", k + 1), order("ada", k + 1));
        }
        Ok::<(), ProduceError>(())
    })
    .creates::<Receipt>()
    .creates::<Order>();
    // Writes several artifacts, then an update of one that does not exist: the whole patch is
    // dropped (rolled back) every generation.
    let dangling = Produce::new("dangling", |call: ProduceCall<Order>| async move {
        let k = call.trigger.data.total_cents;
        for i in 0..8 {
            call.effects.upsert(
                format!("receipt:ghost:{k}:{i}"),
                Receipt {
                    order: "ghost".into(),
                    total_cents: k,
                },
            );
        }
        call.effects.delete("order:0");
        call.effects.update(
            "receipt:missing",
            Receipt {
                order: "x".into(),
                total_cents: 0,
            },
        );
        Ok::<(), ProduceError>(())
    })
    .creates::<Receipt>();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("a").produce(keeper).produce(dangling).produce(chain))
        .produce_errors(ProduceErrors::Isolate)
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.failed_runs.len() as u64, CHAIN + 1);
    let ctx = rt.context();
    assert_eq!(ctx.len() as u64, 2 * (CHAIN + 1));
    assert!(ctx.get::<Order>("order:0").unwrap().is_some());
    assert!(ctx.get::<Receipt>("receipt:missing").unwrap().is_none());
    ctx.verify().unwrap();
    let kept = kept.lock().unwrap();
    assert_eq!(kept.len() as u64, CHAIN + 1);
    for (i, (snap, hash, len, seen)) in kept.iter().enumerate() {
        assert_eq!(snap.state_hash(), *hash, "kept snapshot {i}: hash");
        assert_eq!(snap.len(), *len, "kept snapshot {i}: len");
        assert_eq!(&contents(snap), seen, "kept snapshot {i}: contents");
        // Generation i's snapshot: orders 0..=i and receipts of 0..i.
        assert_eq!(*len, 2 * i + 1, "kept snapshot {i}: what it saw");
        assert_eq!(
            ctx.state_at(reactifact_core::runtime::Generation(i as u64 + 1))
                .unwrap()
                .state_hash(),
            *hash
        );
    }
}
