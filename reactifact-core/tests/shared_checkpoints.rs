//! Checkpoints of a state whose flat base is shared (snapshots kept, a delta over it),
//! reopen from them, time travel and forks from the checkpoint base, and tampering a copy of
//! the log (copy-on-write runs).
#![allow(dead_code)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use reactifact_core::audit::{verify_log, Op};
use reactifact_core::runtime::Generation;
use reactifact_core::store::Synchronous;
use reactifact_core::{Context, OpenOptions, Snapshot};

use reactifact_core::fastrand::Rng;

type Model = BTreeMap<String, u64>;

fn check(what: &str, snap: &Snapshot, model: &Model) {
    assert_eq!(snap.len(), model.len(), "{what}: len");
    let listed: Model = snap
        .list::<Order>()
        .map(|r| r.unwrap())
        .map(|r| (r.id.to_string(), r.data.total_cents))
        .collect();
    assert_eq!(&listed, model, "{what}: list");
    for (id, total) in model {
        assert_eq!(
            snap.get::<Order>(id).unwrap().unwrap().data.total_cents,
            *total,
            "{what}: {id}"
        );
    }
}

#[test]
fn checkpoints_of_a_shared_state_reopen_refold_and_fork_to_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let options = || OpenOptions::new().synchronous(Synchronous::Normal).checkpoint_every(7);
    let mut rng = Rng::with_seed(0x1234_5678_9abc_def1);
    let mut model = Model::new();
    let mut history = vec![Model::new()];
    let mut kept: Vec<(Snapshot, Model)> = Vec::new();
    let mut n = 0u64;
    {
        let mut ctx = Context::open_with(&path, "s", options()).unwrap();
        for g in 0..120u64 {
            if g % 3 == 0 {
                kept.push((ctx.snapshot(), model.clone()));
                if kept.len() > 3 {
                    kept.remove(0);
                }
            }
            let mut tx = ctx.transaction();
            let writes = if g % 10 == 0 { 1500 } else { 40 };
            for _ in 0..writes {
                n += 1;
                let id = format!("order:{}", rng.u64(..4000));
                if rng.u64(..5) == 0 {
                    tx.delete(id.clone());
                    model.remove(&id);
                } else {
                    tx.create(id.clone(), order("c", n));
                    model.insert(id, n);
                }
            }
            tx.commit().unwrap();
            history.push(model.clone());
            if g % 11 == 0 {
                // A failed commit while snapshots share the base.
                let mut tx = ctx.transaction();
                tx.create("order:ghost", order("c", 0));
                tx.delete("order:1");
                tx.update("order:nope", order("c", 0));
                assert!(tx.commit().is_err());
            }
        }
        for (snap, m) in &kept {
            check("kept", snap, m);
        }
        check("live", &ctx.snapshot(), &model);
        ctx.verify().unwrap();
    }
    // Reopen from the newest checkpoint, and check it, time travel and forks from it.
    let ctx = Context::open_with(&path, "s", options()).unwrap();
    check("reopened", &ctx.snapshot(), &model);
    ctx.verify().unwrap();
    let head = ctx.generation().0;
    assert_eq!(head, 120);
    for g in [0, 1, 50, 115, 118, 119, 120] {
        check(
            &format!("state_at {g}"),
            &ctx.state_at(Generation(g)).unwrap(),
            &history[g as usize],
        );
    }
    let fork = ctx.fork_at("f", Generation(118)).unwrap();
    check("fork_at 118", &fork.snapshot(), &history[118]);
    let diff = ctx.diff_commits(Generation(100), Generation(120)).unwrap();
    let _ = diff;

    // Tampering a copy of the log changes the copy only.
    let mut log = ctx.log().unwrap().to_vec();
    let at = log[119].runs[0]
        .ops
        .iter()
        .position(|op| matches!(op, Op::Put { .. }))
        .unwrap();
    let Op::Put { bytes, .. } = &mut log[119].runs[0].ops[at] else {
        panic!("a put");
    };
    let mut tampered = bytes.to_vec();
    *tampered.last_mut().unwrap() ^= 1;
    *bytes = Arc::from(tampered);
    assert!(verify_log(&log).is_err(), "the tampered copy must not verify");
    ctx.verify().unwrap();
    assert!(verify_log(ctx.log().unwrap()).is_ok());
}
