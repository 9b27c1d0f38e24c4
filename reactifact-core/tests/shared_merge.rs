//! Merges and diffs of forks whose flat bases are shared (kept snapshots, forks of
//! forks), including a refused merge (conflict) that must apply nothing.
#![allow(dead_code)]

mod common;

use std::collections::BTreeMap;

use common::*;
use reactifact_core::branch::MergeError;
use reactifact_core::runtime::Generation;
use reactifact_core::Context;

fn contents(ctx: &Context) -> BTreeMap<String, u64> {
    ctx.list::<Order>()
        .map(|r| r.unwrap())
        .map(|r| (r.id.to_string(), r.data.total_cents))
        .collect()
}

fn fresh_hash(model: &BTreeMap<String, u64>) -> reactifact_core::audit::StateHash {
    let mut ctx = Context::new("fresh");
    let mut tx = ctx.transaction();
    for (id, total) in model {
        tx.create(id.clone(), order("c", *total));
    }
    tx.commit().unwrap();
    ctx.state_hash()
}

#[test]
fn merges_of_forks_of_forks_over_shared_bases() {
    let mut main = Context::new("main");
    let mut tx = main.transaction();
    for i in 0..3000u64 {
        tx.create(format!("order:{i}"), order("c", i));
    }
    tx.commit().unwrap();
    let _kept_main = main.snapshot();
    let mut a = main.fork("a").unwrap();
    let _kept_a = a.snapshot();
    let mut b = a.fork("b").unwrap();
    let mut model = contents(&main);
    // Disjoint changes on each branch, more than the delta holds before a copy.
    for g in 0..3u64 {
        let mut tx = a.transaction();
        for i in 0..600 {
            tx.update(format!("order:{i}"), order("c", 100_000 + g * 1000 + i));
        }
        tx.commit().unwrap();
        let mut tx = b.transaction();
        for i in 1000..1600 {
            tx.update(format!("order:{i}"), order("c", 200_000 + g * 1000 + i));
        }
        tx.delete(format!("order:{}", 2000 + g));
        tx.commit().unwrap();
        let mut tx = main.transaction();
        tx.create(format!("order:main{g}"), order("c", g));
        tx.commit().unwrap();
    }
    for i in 0..600u64 {
        model.insert(format!("order:{i}"), 100_000 + 2000 + i);
    }
    for i in 1000..1600u64 {
        model.insert(format!("order:{i}"), 200_000 + 2000 + i);
    }
    for g in 0..3u64 {
        model.remove(&format!("order:{}", 2000 + g));
        model.insert(format!("order:main{g}"), g);
    }
    let diff = main.diff(&b).unwrap();
    assert_eq!(
        diff.deleted.len() + diff.created.len() + diff.updated.len(),
        3 + 3 + 600
    );
    // A conflicting change on `a` and `main`: the merge is refused and applies nothing.
    a.update("order:5", order("c", 1)).unwrap();
    main.update("order:5", order("c", 2)).unwrap();
    let before = (main.state_hash(), main.generation(), contents(&main));
    let err = main.merge(&a).unwrap_err();
    assert!(matches!(err, MergeError::Conflicts { .. }), "{err:?}");
    assert_eq!((main.state_hash(), main.generation(), contents(&main)), before);
    // Undo the conflict on `a`, then merge both.
    a.update("order:5", order("c", 2)).unwrap();
    main.merge(&a).unwrap();
    main.merge(&b).unwrap();
    let mut expected = model.clone();
    expected.insert("order:5".into(), 2);
    assert_eq!(contents(&main), expected);
    assert_eq!(main.state_hash(), fresh_hash(&expected));
    main.verify().unwrap();
    // The diff of the merged main against a past commit of its own log refolds right.
    let d = main.diff_commits(Generation(1), main.generation()).unwrap();
    assert!(!d.is_empty());
}
