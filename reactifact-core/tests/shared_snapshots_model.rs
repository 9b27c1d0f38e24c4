//! Snapshots, forks of forks, failed transactions and time travel over many generations,
//! against a model (a BTreeMap of id -> total), with the state hash checked against a context
//! built fresh from the model.
#![allow(dead_code)]

mod common;

use std::collections::BTreeMap;

use common::*;
use reactifact_core::runtime::Generation;
use reactifact_core::{Context, Snapshot};

use reactifact_core::fastrand::Rng;

type Model = BTreeMap<String, u64>;

fn fresh_hash(model: &Model) -> reactifact_core::audit::StateHash {
    let mut ctx = Context::new("fresh");
    if model.is_empty() {
        return ctx.state_hash();
    }
    let mut tx = ctx.transaction();
    for (id, total) in model {
        tx.create(id.clone(), order("c", *total));
    }
    tx.commit().unwrap();
    ctx.state_hash()
}

fn check_snapshot(what: &str, snap: &Snapshot, model: &Model, keys: u64) {
    assert_eq!(snap.len(), model.len(), "{what}: len");
    assert_eq!(snap.count::<Order>(), model.len(), "{what}: count");
    for k in 0..keys {
        let id = format!("order:{k}");
        let got = snap.get::<Order>(&id).unwrap().map(|r| r.data.total_cents);
        assert_eq!(got, model.get(&id).copied(), "{what}: {id}");
    }
    let listed: Model = snap
        .list::<Order>()
        .map(|r| r.unwrap())
        .map(|r| (r.id.to_string(), r.data.total_cents))
        .collect();
    assert_eq!(&listed, model, "{what}: list");
    assert_eq!(snap.state_hash(), fresh_hash(model), "{what}: state hash");
}

struct Branch {
    ctx: Context,
    model: Model,
    /// The model after each generation (index = generation).
    history: Vec<Model>,
}

#[test]
fn snapshots_forks_and_failed_commits_match_a_model() {
    for seed in 1..=3u64 {
        let mut rng = Rng::with_seed(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let keys = 1500u64;
        let mut branches = vec![Branch {
            ctx: Context::new("main"),
            model: Model::new(),
            history: vec![Model::new()],
        }];
        let mut kept: Vec<(Snapshot, Model, String)> = Vec::new();
        let mut step_total = 0u64;
        for step in 0..500u32 {
            let b = rng.u64(..branches.len() as u64) as usize;
            match rng.u64(..100) {
                0..=2 if branches.len() < 5 => {
                    let name = format!("fork{step}");
                    let ctx = branches[b].ctx.fork(name).unwrap();
                    let model = branches[b].model.clone();
                    let history = branches[b].history.clone();
                    branches.push(Branch { ctx, model, history });
                }
                3..=10 => {
                    let snap = branches[b].ctx.snapshot();
                    kept.push((
                        snap,
                        branches[b].model.clone(),
                        format!("seed {seed} step {step} branch {b}"),
                    ));
                    if kept.len() > 6 {
                        let i = rng.u64(..kept.len() as u64) as usize;
                        kept.swap_remove(i);
                    }
                }
                11..=13 if !kept.is_empty() => {
                    let i = rng.u64(..kept.len() as u64) as usize;
                    kept.swap_remove(i);
                }
                _ => {
                    let br = &mut branches[b];
                    let fail = rng.u64(..6) == 0;
                    let big = rng.u64(..20) == 0;
                    let n = 1 + rng.u64(..if big { 2000 } else { 30 });
                    let mut next = br.model.clone();
                    let before = br.ctx.generation();
                    let mut tx = br.ctx.transaction();
                    for _ in 0..n {
                        step_total += 1;
                        let id = format!("order:{}", rng.u64(..keys));
                        match rng.u64(..4) {
                            0 => {
                                tx.delete(id.clone());
                                next.remove(&id);
                            }
                            1 if next.contains_key(&id) => {
                                tx.update(id.clone(), order("c", step_total));
                                next.insert(id, step_total);
                            }
                            _ => {
                                tx.create(id.clone(), order("c", step_total));
                                next.insert(id, step_total);
                            }
                        }
                    }
                    if fail {
                        tx.update("order:nope", order("c", 0));
                    }
                    let result = tx.commit();
                    if fail {
                        assert!(result.is_err());
                        assert_eq!(br.ctx.generation(), before);
                    } else {
                        result.unwrap();
                        if br.ctx.generation() != before {
                            br.model = next;
                            br.history.push(br.model.clone());
                        } else {
                            assert_eq!(next, br.model, "an unchanged write changed the model");
                        }
                    }
                    let what = format!("seed {seed} step {step} branch {b} live");
                    let snap = br.ctx.snapshot();
                    assert_eq!(br.ctx.len(), br.model.len(), "{what}: ctx len");
                    if rng.u64(..8) == 0 {
                        check_snapshot(&what, &snap, &br.model, keys);
                    }
                }
            }
            if step % 25 == 0 {
                for (snap, model, what) in &kept {
                    check_snapshot(what, snap, model, keys);
                }
            }
        }
        for (snap, model, what) in &kept {
            check_snapshot(what, snap, model, keys);
        }
        for (i, br) in branches.iter().enumerate() {
            let what = format!("seed {seed} branch {i} final");
            check_snapshot(&what, &br.ctx.snapshot(), &br.model, keys);
            br.ctx.verify().unwrap();
            let head = br.ctx.generation().0;
            for g in [0, head / 3, head / 2, head.saturating_sub(1), head] {
                let past = br.ctx.state_at(Generation(g)).unwrap();
                check_snapshot(&format!("{what} state_at {g}"), &past, &br.history[g as usize], keys);
            }
        }
    }
}
