//! Verification (refolding the log and checking every hash) and time travel.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::*;
use reactifact_core::audit::{verify_log, Op, ReplayError, TimeTravelError, VerifyError};
use reactifact_core::error::OpenError;
use reactifact_core::runtime::{Generation, Version};
use reactifact_core::{Agent, Context, OpenOptions, Runtime};

async fn order_flow(ctx: Context) -> Context {
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.context_mut().update("order:1", order("ada", 1500)).unwrap();
    rt.run().await.unwrap();
    rt.into_context()
}

fn seeded_orders() -> Context {
    seeded([
        ("order:1".to_owned(), order("ada", 1200)),
        ("order:2".to_owned(), order("bob", 300)),
    ])
}

#[tokio::test]
async fn an_untouched_log_verifies() {
    let ctx = order_flow(seeded_orders()).await;
    let report = ctx.verify().unwrap();
    assert_eq!(report.commits, ctx.log().unwrap().len());
    assert_eq!(report.head, ctx.head());
    assert_eq!(report.state_hash, ctx.state_hash());
}

/// The index of the run and op writing `id` in commit `generation`.
fn find_op(log: &[reactifact_core::audit::Commit], generation: u64, id: &str) -> (usize, usize) {
    let commit = &log[generation as usize - 1];
    for (r, run) in commit.runs.iter().enumerate() {
        if let Some(o) = run.ops.iter().position(|op| op.id() == id) {
            return (r, o);
        }
    }
    panic!("commit {generation} does not write {id}");
}

#[tokio::test]
async fn a_changed_artifact_byte_is_named_by_commit_and_id() {
    let ctx = order_flow(seeded_orders()).await;
    let mut log = ctx.log().unwrap().to_vec();
    let (r, o) = find_op(&log, 2, "receipt:order:2");
    let Op::Put { bytes, .. } = &mut log[1].runs[r].ops[o] else {
        panic!("a receipt is a put");
    };
    let mut tampered = bytes.to_vec();
    *tampered.last_mut().unwrap() ^= 1;
    *bytes = Arc::from(tampered);

    let err = verify_log(&log).unwrap_err();
    match &err {
        VerifyError::Content { generation, id, kind } => {
            assert_eq!(
                (*generation, id.as_str(), kind.as_str()),
                (Generation(2), "receipt:order:2", "receipt")
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "commit 2: the bytes of `receipt:order:2` (kind `receipt`) do not match its content hash"
    );
}

#[tokio::test]
async fn a_changed_trigger_is_a_commit_hash_mismatch_at_its_commit() {
    let ctx = order_flow(seeded_orders()).await;
    let mut log = ctx.log().unwrap().to_vec();
    let last = log.len() - 1;
    log[last].runs[0].trigger.as_mut().unwrap().version = Version(7);
    let err = verify_log(&log).unwrap_err();
    assert!(
        matches!(err, VerifyError::CommitHash { generation, .. } if generation == Generation(last as u64 + 1)),
        "{err:?}"
    );
    // Earlier commits still verify on their own.
    assert!(verify_log(&log[..last]).is_ok());
}

#[tokio::test]
async fn a_changed_count_of_consumed_events_is_a_commit_hash_mismatch_at_its_commit() {
    let ctx = order_flow(seeded_orders()).await;
    let log = ctx.log().unwrap().to_vec();
    assert!(
        log[1].events_consumed > 0,
        "billing's generation consumed the seeded orders' events"
    );
    for changed in [log[1].events_consumed - 1, log[1].events_consumed + 1] {
        let mut log = log.clone();
        log[1].events_consumed = changed;
        let err = verify_log(&log).unwrap_err();
        assert!(
            matches!(
                err,
                VerifyError::CommitHash {
                    generation: Generation(2),
                    ..
                }
            ),
            "{changed}: {err:?}"
        );
    }
    verify_log(&log).unwrap();
}

#[tokio::test]
async fn a_dropped_commit_breaks_the_parent_chain() {
    let ctx = order_flow(seeded_orders()).await;
    let mut log = ctx.log().unwrap().to_vec();
    log.remove(1);
    let err = verify_log(&log).unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::Numbering {
                generation: Generation(3),
                position: 2
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn time_travel_to_every_commit_gives_the_hash_it_recorded() {
    let ctx = order_flow(seeded_orders()).await;
    assert!(ctx.log().unwrap().len() >= 4);
    for commit in ctx.log().unwrap() {
        let snapshot = ctx.state_at(commit.generation).unwrap();
        assert_eq!(
            snapshot.state_hash(),
            commit.state_hash,
            "commit {}",
            commit.generation.0
        );
    }
    assert!(ctx.state_at(Generation(0)).unwrap().is_empty());

    let after_first_run = ctx.state_at(Generation(2)).unwrap();
    assert_eq!(
        after_first_run
            .get::<Order>("order:1")
            .unwrap()
            .unwrap()
            .data
            .total_cents,
        1200
    );
    assert!(after_first_run.contains("receipt:order:1"));
    let seeded_only = ctx.state_at(Generation(1)).unwrap();
    assert!(!seeded_only.contains("receipt:order:1"));
    assert_eq!(ctx.get::<Order>("order:1").unwrap().unwrap().data.total_cents, 1500);

    let err = ctx.state_at(Generation(99)).unwrap_err();
    assert!(matches!(err, TimeTravelError::NoSuchCommit { .. }), "{err:?}");
}

/// A SQLite file holding the order flow; returns its path.
async fn stored_flow(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("state.db");
    let mut ctx = Context::open(&path, "orders").unwrap();
    ctx.create("order:1", order("ada", 1200)).unwrap();
    order_flow(ctx).await;
    path
}

fn edit_runs(path: &PathBuf, generation: u64, edit: impl FnOnce(&mut Vec<u8>)) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut runs: Vec<u8> = conn
        .query_row("SELECT runs FROM commits WHERE generation = ?1", [generation], |row| {
            row.get(0)
        })
        .unwrap();
    edit(&mut runs);
    conn.execute(
        "UPDATE commits SET runs = ?1 WHERE generation = ?2",
        rusqlite::params![runs, generation],
    )
    .unwrap();
}

fn position(haystack: &[u8], needle: &[u8], last: bool) -> usize {
    let mut hits = haystack
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i);
    if last { hits.next_back() } else { hits.next() }.expect("found in the blob")
}

#[tokio::test]
async fn a_stored_session_verifies_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = stored_flow(&dir).await;
    let ctx = Context::open(&path, "orders").unwrap();
    assert_eq!(ctx.verify().unwrap().commits, ctx.log().unwrap().len());
}

#[tokio::test]
async fn a_changed_trigger_in_a_stored_commit_is_detected_at_that_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = stored_flow(&dir).await;
    // Commit 2 is the first run: its trigger is order:1 version 1, stored as the id, a
    // positive fixint and a 32-byte binary string.
    edit_runs(&path, 2, |runs| {
        let at = position(runs, b"order:1\x01\xc4\x20", false);
        runs[at + 7] = 2;
    });
    // Opening checks parent links and state hashes, which the trigger does not change...
    let ctx = Context::open(&path, "orders").unwrap();
    // ...verification recomputes the commit hash.
    let err = ctx.verify().unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::CommitHash {
                generation: Generation(2),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("commit 2: its hash does not match its content"),
        "{err}"
    );
}

/// A commit's record of how many events it consumed is in its hash: changed in the file, it
/// fails `verify` and `replay` at that commit. (Opening checks no commit hash, and does not
/// read the count: the session's consumed position says which events are still queued.)
#[tokio::test]
async fn a_changed_count_of_consumed_events_in_a_stored_commit_is_detected_at_that_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = stored_flow(&dir).await;
    let conn = rusqlite::Connection::open(&path).unwrap();
    let consumed: i64 = conn
        .query_row("SELECT events_consumed FROM commits WHERE generation = 2", [], |row| {
            row.get(0)
        })
        .unwrap();
    assert!(consumed > 0, "billing's generation consumed order:1's creation");
    for changed in [consumed - 1, consumed + 1, consumed] {
        conn.execute(
            "UPDATE commits SET events_consumed = ?1 WHERE generation = 2",
            [changed],
        )
        .unwrap();
        let ctx = Context::open_with(&path, "orders", OpenOptions::new().read_only(true)).unwrap();
        let agents = [Agent::new("billing").produce(process_order())];
        if changed == consumed {
            ctx.verify().unwrap();
            ctx.replay(&agents).await.unwrap();
            continue;
        }
        let err = ctx.verify().unwrap_err();
        assert!(
            matches!(
                err,
                VerifyError::CommitHash {
                    generation: Generation(2),
                    ..
                }
            ),
            "{changed}: {err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("commit 2: its hash does not match its content"),
            "{err}"
        );
        match ctx.replay(&agents).await {
            Err(ReplayError::Log(VerifyError::CommitHash {
                generation: Generation(2),
                ..
            })) => {}
            other => panic!("{changed}: expected commit 2's hash to fail the replay, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_changed_intent_payload_in_a_stored_commit_is_named_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = stored_flow(&dir).await;
    // The customer appears in the pending action's bytes and, last, in the payload stored
    // beside them for the dispatcher; change only the latter.
    edit_runs(&path, 2, |runs| {
        let at = position(runs, b"ada", true);
        runs[at..at + 3].copy_from_slice(b"eve");
    });
    let ctx = Context::open(&path, "orders").unwrap();
    let err = ctx.verify().unwrap_err();
    assert_eq!(
        err.to_string(),
        "commit 2: the payload of intent `notify:order:1` does not match its pending action"
    );
}

#[tokio::test]
async fn a_changed_artifact_byte_in_a_stored_commit_fails_opening_at_that_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = stored_flow(&dir).await;
    // The receipt's total (1200 = 0xcd 0x04 0xb0) in commit 2.
    edit_runs(&path, 2, |runs| {
        let at = position(runs, b"\xcd\x04\xb0", false);
        runs[at + 2] = 0xb1;
    });
    let err = Context::open(&path, "orders").unwrap_err();
    // A program tells the bad commit and the ids it writes from the structured source.
    let OpenError::Corrupt {
        source: Some(source), ..
    } = &err
    else {
        panic!("expected a verify error as the source, got {err:?}");
    };
    let VerifyError::StateHash { generation, writes, .. } = source else {
        panic!("expected a state-hash mismatch as the source, got {source:?}");
    };
    assert_eq!(*generation, Generation(2));
    assert!(writes.iter().any(|id| id.as_str() == "receipt:order:1"), "{writes:?}");
    let source = std::error::Error::source(&err).expect("the verify error is the source");
    assert!(source.downcast_ref::<VerifyError>().is_some());
    let message = err.to_string();
    assert!(
        message.contains("commit 2: replaying it does not give the state hash it recorded"),
        "{message}"
    );
    assert!(
        message.contains("it writes `receipt:order:1`, `action:notify:order:1`"),
        "{message}"
    );
}
