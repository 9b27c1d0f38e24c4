//! A failed commit whose writes cross the delta's copy threshold (the shared base is
//! copied mid-commit), then rolled back in the copy; and a failed run patch in the same spot.
#![allow(dead_code)]

mod common;

use common::*;
use reactifact_core::error::WriteError;
use reactifact_core::Context;

#[test]
fn a_failed_commit_that_copied_the_shared_base_mid_way_rolls_back_fully() {
    let mut ctx = Context::new("t");
    let mut tx = ctx.transaction();
    for i in 0..2000u64 {
        tx.create(format!("order:{i}"), order("c", i));
    }
    tx.commit().unwrap();
    let kept = ctx.snapshot();
    let (hash, len, generation) = (ctx.state_hash(), ctx.len(), ctx.generation());
    // 1500 writes > fold_at(2000) = 1024: the base is copied during this commit.
    let mut tx = ctx.transaction();
    for i in 0..700u64 {
        tx.update(format!("order:{i}"), order("d", i));
        tx.delete(format!("order:{}", 1000 + i));
    }
    for i in 0..100u64 {
        tx.create(format!("order:new{i}"), order("n", i));
    }
    tx.update("order:nope", order("x", 0));
    let err = tx.commit().unwrap_err();
    assert!(matches!(err, WriteError::Commit(_)), "{err:?}");
    assert_eq!((ctx.state_hash(), ctx.len(), ctx.generation()), (hash, len, generation));
    for i in 0..2000u64 {
        let got = ctx.get::<Order>(&format!("order:{i}")).unwrap().unwrap().data;
        assert_eq!(got, order("c", i), "order:{i}");
    }
    assert!(ctx.get::<Order>("order:new0").unwrap().is_none());
    assert_eq!(kept.state_hash(), hash);
    // The same writes without the failure commit, and verify.
    let mut tx = ctx.transaction();
    for i in 0..700u64 {
        tx.update(format!("order:{i}"), order("d", i));
        tx.delete(format!("order:{}", 1000 + i));
    }
    tx.commit().unwrap();
    assert_eq!(ctx.len(), 1300);
    assert_eq!(kept.len(), 2000);
    ctx.verify().unwrap();
    let ids: Vec<String> = ctx.list::<Order>().map(|r| r.unwrap().id.to_string()).collect();
    assert_eq!(ids.len(), 1300);
    assert_eq!(ids[0], "order:0");
    assert_eq!(ids[1299], "order:1999");
}
