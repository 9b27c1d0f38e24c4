//! Snapshot isolation when the live state is shared: snapshots a user keeps, forks of forks and
//! runs of a runtime all read exactly what they saw while the context keeps committing, however
//! many writes land in between (enough to make the live state copy its shared base), and the
//! context ends in the state the same writes make on a context nothing ever shared.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::*;
use reactifact_core::audit::StateHash;
use reactifact_core::fastrand::Rng;
use reactifact_core::{Agent, Context, Produce, ProduceCall, ProduceError, Runtime, Snapshot};

/// What a context or snapshot should hold: id → (order, creation position).
#[derive(Clone, Default)]
struct Model {
    orders: BTreeMap<String, (Order, u64)>,
    created: u64,
}

impl Model {
    fn ids_in_creation_order(&self) -> Vec<String> {
        let mut ids: Vec<_> = self.orders.iter().map(|(id, (_, at))| (*at, id.clone())).collect();
        ids.sort_unstable();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    /// The state hash of a fresh context holding the same artifacts.
    fn state_hash(&self) -> StateHash {
        let mut fresh = Context::new("fresh");
        if !self.orders.is_empty() {
            let mut tx = fresh.transaction();
            for (id, (order, _)) in &self.orders {
                tx.create(id.as_str(), order.clone());
            }
            tx.commit().unwrap();
        }
        fresh.state_hash()
    }
}

/// Reads every artifact the model names, a few it does not, the list in creation order and
/// the hash, and compares them with the model.
fn check(what: &str, snapshot: &Snapshot, model: &Model) {
    assert_eq!(snapshot.len(), model.orders.len(), "{what}: len");
    assert_eq!(snapshot.count::<Order>(), model.orders.len(), "{what}: count");
    for (id, (order, _)) in &model.orders {
        let read = snapshot.get::<Order>(id).unwrap();
        assert_eq!(read.map(|r| r.data), Some(order.clone()), "{what}: {id}");
    }
    for absent in ["order:absent", "order:-1"] {
        assert!(!snapshot.contains(absent), "{what}: {absent}");
    }
    let listed: Vec<String> = snapshot.ids::<Order>().map(|id| id.to_string()).collect();
    assert_eq!(listed, model.ids_in_creation_order(), "{what}: creation order");
    assert_eq!(snapshot.state_hash(), model.state_hash(), "{what}: state hash");
}

/// Commits one transaction of `writes` random creates, updates and deletes over ids
/// `order:0..ids` to `ctx`, and the same to `model`.
fn write_some(rng: &mut Rng, ctx: &mut Context, model: &mut Model, writes: usize, ids: u32) {
    let mut tx = ctx.transaction();
    let mut touched = std::collections::HashSet::new();
    for _ in 0..writes {
        let id = format!("order:{}", rng.u32(0..ids));
        if !touched.insert(id.clone()) {
            continue; // one change per id and transaction keeps the model simple
        }
        let order = order("c", rng.u64(..));
        match model.orders.get(&id) {
            None => {
                tx.create(id.as_str(), order.clone());
                model.orders.insert(id, (order, model.created));
                model.created += 1;
            }
            Some(_) if rng.u8(..4) == 0 => {
                tx.delete(id.as_str());
                model.orders.remove(&id);
            }
            Some((_, at)) => {
                let at = *at;
                tx.update(id.as_str(), order.clone());
                model.orders.insert(id, (order, at));
            }
        }
    }
    tx.commit().unwrap();
}

#[test]
fn kept_snapshots_and_forks_read_what_they_saw_while_every_side_keeps_committing() {
    let mut rng = Rng::with_seed(18);
    let mut contexts = vec![(Context::new("main"), Model::default())];
    let mut kept: Vec<(String, Snapshot, Model)> = Vec::new();
    for step in 0..400 {
        let which = rng.usize(..contexts.len());
        match rng.u8(..10) {
            0 if contexts.len() < 4 => {
                let (ctx, model) = &contexts[which];
                let fork = ctx.fork(format!("fork-{step}")).unwrap();
                let model = model.clone();
                contexts.push((fork, model));
            }
            1 | 2 => {
                let (ctx, model) = &contexts[which];
                kept.push((
                    format!("snapshot {step} of {}", ctx.session()),
                    ctx.snapshot(),
                    model.clone(),
                ));
            }
            3 if !kept.is_empty() => {
                let (what, snapshot, model) = kept.swap_remove(rng.usize(..kept.len()));
                check(&what, &snapshot, &model);
            }
            _ => {
                // Mostly small commits, sometimes one big enough to outgrow any delta.
                let writes = if rng.u8(..20) == 0 { 3000 } else { rng.usize(1..40) };
                let (ctx, model) = &mut contexts[which];
                write_some(&mut rng, ctx, model, writes, 5000);
            }
        }
    }
    for (what, snapshot, model) in &kept {
        check(what, snapshot, model);
    }
    drop(kept);
    for (ctx, model) in &mut contexts {
        check(ctx.session(), &ctx.snapshot(), model);
        // Writing on after every snapshot is gone: in place again, still the model's state.
        write_some(&mut rng, ctx, model, 200, 5000);
        check(ctx.session(), &ctx.snapshot(), model);
    }
}

#[tokio::test]
async fn a_snapshot_a_produce_keeps_past_its_run_still_reads_its_generation() {
    #[derive(Clone, Default)]
    struct Kept(Arc<Mutex<Vec<Snapshot>>>);

    let kept = Kept::default();
    let stash = kept.clone();
    let keeper = Produce::new("keep", move |call: ProduceCall<Order>| {
        stash.0.lock().unwrap().push(call.snapshot.clone());
        async move {
            call.effects.upsert(
                format!("receipt:{}", call.trigger.id),
                Receipt {
                    order: call.trigger.id.to_string(),
                    total_cents: call.trigger.data.total_cents,
                },
            );
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Receipt>();
    let mut rt = Runtime::builder(Context::new("t"))
        .agent(Agent::new("a").produce(keeper))
        .build()
        .unwrap();
    let mut hashes = Vec::new();
    for batch in 0..5u64 {
        hashes.push(rt.context().state_hash());
        let mut tx = rt.context_mut().transaction();
        for i in 0..600 {
            tx.create(format!("order:{batch}:{i}"), order("c", i));
        }
        tx.commit().unwrap();
        rt.run().await.unwrap();
    }
    let kept = kept.0.lock().unwrap();
    assert_eq!(kept.len(), 3000, "one snapshot per run");
    // Each generation's runs saw the orders of their batch and every earlier batch's receipts,
    // but no receipt of their own generation.
    for (run, snapshot) in kept.iter().enumerate() {
        let batch = run / 600;
        assert_eq!(snapshot.count::<Order>(), (batch + 1) * 600, "run {run}");
        assert_eq!(snapshot.count::<Receipt>(), batch * 600, "run {run}");
        assert!(snapshot
            .get::<Receipt>(&format!("receipt:order:{batch}:0"))
            .unwrap()
            .is_none());
    }
    assert_eq!(rt.context().list::<Receipt>().count(), 3000);
    assert_ne!(hashes[0], rt.context().state_hash());
}
