//! A shared live state: catch_up while a snapshot of the stale state is kept, then many writes.
#![allow(dead_code)]

mod common;

use common::*;
use reactifact_core::error::{StoreError, WriteError};
use reactifact_core::Context;

#[tokio::test]
async fn catch_up_with_a_kept_snapshot_keeps_both_states_right() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut first = Context::open(&path, "orders").unwrap();
    let mut tx = first.transaction();
    for i in 0..3000 {
        tx.create(format!("order:{i}"), order("ada", i));
    }
    tx.commit().unwrap();
    let mut second = Context::open(&path, "orders").unwrap();
    let stale = second.snapshot();
    let stale_hash = stale.state_hash();
    for g in 0..5u64 {
        let mut tx = first.transaction();
        for i in 0..700 {
            tx.update(format!("order:{i}"), order("bob", 10_000 * (g + 1) + i));
        }
        tx.delete(format!("order:{}", 2000 + g));
        tx.commit().unwrap();
    }
    let err = second.create("order:x", order("x", 1));
    assert!(
        matches!(err, Err(WriteError::Store(StoreError::Conflict { .. }))),
        "{err:?}"
    );
    // A failed catch-up write attempt while the stale snapshot is kept leaves it untouched.
    assert_eq!(second.catch_up().await.unwrap(), 5);
    second.create("order:x", order("x", 1)).unwrap();
    assert_eq!(stale.state_hash(), stale_hash);
    assert_eq!(stale.len(), 3000);
    assert_eq!(stale.get::<Order>("order:5").unwrap().unwrap().data.total_cents, 5);
    assert!(stale.get::<Order>("order:x").unwrap().is_none());
    assert_eq!(second.len(), 3000 - 5 + 1);
    assert_eq!(
        second.get::<Order>("order:5").unwrap().unwrap().data.total_cents,
        50_005
    );
    first.catch_up().await.unwrap();
    assert_eq!(first.state_hash(), second.state_hash());
    second.verify().unwrap();
    drop(second);
    let reopened = Context::open(&path, "orders").unwrap();
    assert_eq!(reopened.state_hash(), first.state_hash());
    assert_eq!(reopened.len(), first.len());
}
