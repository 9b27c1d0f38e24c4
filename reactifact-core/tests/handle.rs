//! The handle's writes: a bounded inbox (writers wait for room, `try_write` answers `Full` at
//! once and gives the writes back), `create_once` that tells a retried request apart, batches
//! that commit all or nothing, and a stop racing writers: acknowledged means committed, refused
//! means not written.

mod common;

use std::time::Duration;

use common::{order, process_order, Order, Recorder};
use reactifact_core::error::{SubmitError, WriteError};
use reactifact_core::{Agent, Context, Runtime, Writes};

fn runtime(capacity: usize) -> Runtime {
    Runtime::builder(Context::new("orders"))
        .agent(Agent::new("orders").produce(process_order()))
        .dispatcher(Recorder::default().dispatcher())
        .inbox_capacity(capacity)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_full_inbox_makes_writers_wait_and_try_write_answers_full_with_the_writes() {
    let rt = runtime(2);
    let handle = rt.handle();
    // Not serving yet: two writes fill the inbox and wait for their commit.
    let waiting: Vec<_> = (0..2)
        .map(|i| {
            let handle = handle.clone();
            tokio::spawn(async move { handle.create(format!("order:{i}"), order("ada", i)).await })
        })
        .collect();
    tokio::task::yield_now().await;
    let mut writes = Writes::new();
    writes.create("order:9", order("bob", 9));
    let full = handle.try_write(writes).await;
    let Err(SubmitError::Full(given_back)) = full else {
        panic!("expected Full, got {full:?}");
    };
    assert_eq!(given_back.len(), 1, "the writes are given back");
    // A write that waits for room does not get in while the inbox is full.
    let third = tokio::time::timeout(Duration::from_secs(60), handle.create("order:3", order("eve", 3))).await;
    assert!(third.is_err(), "a write got into a full inbox");
    let serving = common::serving(rt, Duration::from_secs(3600));
    for write in waiting {
        write.await.unwrap().unwrap();
    }
    // With room again, the given-back writes go in.
    handle.try_write(given_back).await.unwrap();
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    assert_eq!(report.writes, 3);
    assert_eq!(rt.context().list::<Order>().count(), 3);
    assert!(
        rt.context().get::<Order>("order:3").unwrap().is_none(),
        "the timed-out write was withdrawn"
    );
}

#[tokio::test(start_paused = true)]
async fn create_once_tells_a_retried_request_apart_and_batches_commit_all_or_nothing() {
    let rt = runtime(16);
    let handle = rt.handle();
    let serving = common::serving(rt, Duration::from_secs(3600));
    assert!(handle.create_once("order:1", order("ada", 100)).await.unwrap());
    assert!(
        !handle.create_once("order:1", order("ada", 999)).await.unwrap(),
        "the second is a duplicate"
    );
    // A batch with a write that does not apply writes nothing at all.
    let mut batch = Writes::new();
    batch
        .create("order:2", order("bob", 2))
        .update("order:missing", order("x", 0));
    // Without waiting for room, the same answers.
    assert!(handle.try_create_once("order:4", order("cy", 4)).await.unwrap());
    assert!(!handle.try_create_once("order:4", order("cy", 5)).await.unwrap());
    let refused = handle.write(batch).await;
    assert!(
        matches!(refused, Err(SubmitError::Write(WriteError::Commit(_)))),
        "{refused:?}"
    );
    handle.link("order:1", "follows", "order:1").await.unwrap();
    handle.unlink("order:1", "follows", "order:1").await.unwrap();
    handle.delete("order:1").await.unwrap();
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    assert_eq!(report.refused_writes, 1);
    assert!(rt.context().get::<Order>("order:2").unwrap().is_none());
    assert!(rt.context().get::<Order>("order:1").unwrap().is_none());
    // The duplicate changed nothing: its intent went out once, for the first content.
    let delivery = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(delivery.attempts(), 1);
}

/// Writers racing a stop: every write acknowledged is committed, and every write refused (the
/// runtime stopped and was dropped before it took it) is absent.
#[tokio::test(start_paused = true)]
async fn a_stop_racing_writers_commits_what_it_acknowledged_and_nothing_it_refused() {
    let mut rt = runtime(8);
    let handle = rt.handle();
    let writers: Vec<_> = (0..64)
        .map(|i| {
            let handle = handle.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i)).await;
                (i, handle.create(format!("order:{i}"), order("ada", i)).await)
            })
        })
        .collect();
    let stopper = handle.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        stopper.stop();
    });
    rt.serve(Duration::from_secs(3600)).await.unwrap();
    let ctx = rt.into_context();
    let (mut acknowledged, mut refused) = (0, 0);
    for writer in writers {
        let (i, result) = writer.await.unwrap();
        let there = ctx.get::<Order>(&format!("order:{i}")).unwrap().is_some();
        match result {
            Ok(()) => {
                acknowledged += 1;
                assert!(there, "order:{i} was acknowledged but not committed");
            }
            Err(SubmitError::Closed) => {
                refused += 1;
                assert!(!there, "order:{i} was refused but written");
            }
            Err(e) => panic!("order:{i}: {e}"),
        }
    }
    assert!(
        acknowledged > 0 && refused > 0,
        "{acknowledged} acknowledged, {refused} refused"
    );
}

/// Limits from outside are taken as they come: an inbox of `usize::MAX` writes and a metrics
/// interval of `Duration::MAX` serve (and stop) like any other, without a panic.
#[tokio::test(start_paused = true)]
async fn usize_max_inbox_and_duration_max_metrics_interval_serve() {
    let rt = Runtime::builder(Context::new("orders"))
        .agent(Agent::new("orders").produce(process_order()))
        .dispatcher(Recorder::default().dispatcher())
        .inbox_capacity(usize::MAX)
        .metrics_interval(Duration::MAX)
        .build()
        .unwrap();
    let handle = rt.handle();
    let serving = common::serving(rt, Duration::MAX);
    handle.create("order:1", order("ada", 1)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    handle.stop();
    let (_, report) = serving.await.unwrap();
    assert_eq!((report.writes, report.delivered), (1, 1));
}
