//! Event kinds: a produce reacts to created, updated and deleted separately (default: created
//! and updated); one reacting to deletions receives the last version, against the snapshot
//! where the artifact is absent — also after a reopen of the SQLite store with the deletion
//! still queued, from a checkpoint, after a failed generation, and in replay and verify.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use common::*;
use reactifact_core::audit::EventKind;
use reactifact_core::error::RunError;
use reactifact_core::runtime::{TurnOutcome, Version};
use reactifact_core::store::Synchronous;
use reactifact_core::{Agent, Context, OpenOptions, Produce, ProduceCall, ProduceError, Runtime};

/// What one run saw: the event kind, the trigger's id, version and total, and whether the
/// snapshot held the trigger.
type Seen = Arc<Mutex<Vec<(EventKind, String, u64, u64, bool)>>>;

/// A produce on orders reacting to `kinds` that records what each run saw and writes an
/// invoice naming the event and the trigger's total (so replay has a patch to compare).
fn watcher(name: &'static str, kinds: &[EventKind], seen: &Seen) -> Produce {
    let seen = seen.clone();
    Produce::new(name, move |call: ProduceCall<Order>| {
        let seen = seen.clone();
        async move {
            let id = call.trigger.id.to_string();
            let present = call.snapshot.contains(&id);
            seen.lock().unwrap().push((
                call.event,
                id.clone(),
                call.trigger.version.0,
                call.trigger.data.total_cents,
                present,
            ));
            call.effects.upsert(
                format!("invoice:{name}:{id}"),
                Invoice {
                    order: format!("{:?} {id} {}", call.event, call.trigger.data.total_cents),
                },
            );
        }
    })
    .creates::<Invoice>()
    .on(kinds.iter().copied())
}

fn runtime(ctx: Context, produces: Vec<Produce>) -> Runtime {
    let agent = produces.into_iter().fold(Agent::new("a"), Agent::produce);
    Runtime::builder(ctx).agent(agent).build().unwrap()
}

fn taken(seen: &Seen) -> Vec<(EventKind, String, u64, u64, bool)> {
    std::mem::take(&mut *seen.lock().unwrap())
}

#[tokio::test]
async fn by_default_a_produce_reacts_to_creations_and_updates_and_not_to_deletions() {
    let seen = Seen::default();
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    let produce = watcher("w", &[EventKind::Created, EventKind::Updated], &seen);
    assert!(Produce::new("plain", |_: ProduceCall<Order>| async {})
        .events()
        .eq([EventKind::Created, EventKind::Updated]));
    let mut rt = runtime(ctx, vec![produce]);
    rt.run().await.unwrap();
    rt.context_mut().update("order:1", order("ada", 200)).unwrap();
    rt.run().await.unwrap();
    rt.context_mut().delete("order:1").unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(
        (report.outcome, report.generations, report.runs),
        (TurnOutcome::Completed, 0, 0)
    );
    assert_eq!(rt.context().queued_events(), 0, "the deletion was consumed");
    let kinds: Vec<EventKind> = taken(&seen).into_iter().map(|s| s.0).collect();
    assert_eq!(kinds, [EventKind::Created, EventKind::Updated]);
}

#[tokio::test]
async fn each_kind_is_reacted_to_separately() {
    let seen = Seen::default();
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    let mut rt = runtime(
        ctx,
        vec![
            watcher("created", &[EventKind::Created], &seen),
            watcher("updated", &[EventKind::Updated], &seen),
            watcher("deleted", &[EventKind::Deleted], &seen),
        ],
    );
    rt.run().await.unwrap();
    rt.context_mut().update("order:1", order("ada", 200)).unwrap();
    rt.run().await.unwrap();
    rt.context_mut().delete("order:1").unwrap();
    rt.run().await.unwrap();
    let runs: Vec<(EventKind, u64)> = taken(&seen).into_iter().map(|s| (s.0, s.2)).collect();
    assert_eq!(
        runs,
        [
            (EventKind::Created, 1),
            (EventKind::Updated, 2),
            (EventKind::Deleted, 2)
        ]
    );
    let invoices: Vec<String> = rt
        .context()
        .list::<Invoice>()
        .map(|i| i.unwrap().id.to_string())
        .collect();
    assert_eq!(
        invoices,
        [
            "invoice:created:order:1",
            "invoice:updated:order:1",
            "invoice:deleted:order:1"
        ]
    );
}

#[tokio::test]
async fn a_produce_on_deletions_receives_the_last_version_against_a_snapshot_without_it() {
    let seen = Seen::default();
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    ctx.update("order:1", order("ada", 250)).unwrap();
    ctx.delete("order:1").unwrap();
    let mut rt = runtime(ctx, vec![watcher("gone", &[EventKind::Deleted], &seen)]);
    let report = rt.run().await.unwrap();
    assert_eq!((report.generations, report.runs), (1, 1));
    assert_eq!(
        taken(&seen),
        [(EventKind::Deleted, "order:1".to_owned(), 2, 250, false)],
        "the last version (2, total 250), and the snapshot no longer holds it"
    );
    let run = &rt.context().log().unwrap().last().unwrap().runs[0];
    let trigger = run.trigger.as_ref().unwrap();
    assert_eq!(
        (trigger.id.as_str(), trigger.version, trigger.event),
        ("order:1", Version(2), EventKind::Deleted)
    );
    rt.context().verify().unwrap();
    reactifact_core::testing::assert_replays(
        rt.context(),
        &[Agent::new("a").produce(watcher("gone", &[EventKind::Deleted], &Seen::default()))],
    )
    .await;
}

#[tokio::test]
async fn a_deletion_followed_by_a_new_creation_runs_the_creation_only() {
    let seen = Seen::default();
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    let mut rt = runtime(
        ctx,
        vec![watcher(
            "all",
            &[EventKind::Created, EventKind::Updated, EventKind::Deleted],
            &seen,
        )],
    );
    rt.run().await.unwrap();
    taken(&seen);
    rt.context_mut().delete("order:1").unwrap();
    rt.context_mut().create("order:1", order("bob", 7)).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 1);
    assert_eq!(taken(&seen), [(EventKind::Created, "order:1".to_owned(), 1, 7, true)]);
    assert_eq!(rt.context().queued_events(), 0);
}

#[tokio::test]
async fn each_deletion_of_an_id_runs_on_its_own_last_version() {
    // Deleted at version 2, created again, deleted again at version 1: both deletions happened
    // and the id is absent, so an undebounced produce runs on each.
    let seen = Seen::default();
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    ctx.update("order:1", order("ada", 150)).unwrap();
    ctx.delete("order:1").unwrap();
    ctx.create("order:1", order("bob", 7)).unwrap();
    ctx.delete("order:1").unwrap();
    let mut rt = runtime(ctx, vec![watcher("gone", &[EventKind::Deleted], &seen)]);
    let report = rt.run().await.unwrap();
    assert_eq!((report.generations, report.runs), (1, 2));
    let runs: Vec<(u64, u64)> = taken(&seen).into_iter().map(|s| (s.2, s.3)).collect();
    assert_eq!(runs, [(2, 150), (1, 7)]);
    reactifact_core::testing::assert_replays(
        rt.context(),
        &[Agent::new("a").produce(watcher("gone", &[EventKind::Deleted], &Seen::default()))],
    )
    .await;
}

#[tokio::test]
async fn a_condition_on_a_deletion_is_evaluated_on_the_last_version() {
    let seen = Seen::default();
    let mut ctx = Context::new("t");
    ctx.create("order:small", order("ada", 50)).unwrap();
    ctx.create("order:large", order("ada", 500)).unwrap();
    let mut tx = ctx.transaction();
    tx.delete("order:small").delete("order:large");
    tx.commit().unwrap();
    let large_only =
        watcher("gone", &[EventKind::Deleted], &seen).when(|snapshot, order: &reactifact_core::Record<Order>| {
            !snapshot.contains(order.id.as_str()) && order.data.total_cents > 100
        });
    let mut rt = runtime(ctx, vec![large_only]);
    rt.run().await.unwrap();
    let ids: Vec<String> = taken(&seen).into_iter().map(|s| s.1).collect();
    assert_eq!(ids, ["order:large"]);
}

#[tokio::test]
async fn a_deletion_a_generation_makes_is_not_swallowed_by_its_own_commit() {
    // `archive` deletes every order it sees; the deletion is the only event its commit emits
    // and the queue is empty after it, so a commit that consumed its own unwanted events would
    // swallow it. `forget` reacts to deletions and must run in the next generation.
    let seen = Seen::default();
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    let archive = Produce::new("archive", |call: ProduceCall<Order>| async move {
        call.effects.delete(call.trigger.id.clone());
    });
    let mut rt = runtime(ctx, vec![archive, watcher("forget", &[EventKind::Deleted], &seen)]);
    let report = rt.run().await.unwrap();
    assert_eq!((report.generations, report.runs), (2, 2));
    assert_eq!(
        taken(&seen),
        [(EventKind::Deleted, "order:1".to_owned(), 1, 100, false)]
    );
    assert_eq!(rt.context().queued_events(), 0);
}

#[tokio::test]
async fn a_failed_deletion_run_stays_queued_and_its_retry_gets_the_same_last_version() {
    let seen = Seen::default();
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 300)).unwrap();
    ctx.delete("order:1").unwrap();
    let failures = Arc::new(std::sync::atomic::AtomicUsize::new(1));
    let flaky = {
        let seen = seen.clone();
        let failures = failures.clone();
        Produce::new("gone", move |call: ProduceCall<Order>| {
            let seen = seen.clone();
            let fail = failures
                .fetch_update(
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                    |n| n.checked_sub(1),
                )
                .is_ok();
            async move {
                seen.lock().unwrap().push((
                    call.event,
                    call.trigger.id.to_string(),
                    call.trigger.version.0,
                    call.trigger.data.total_cents,
                    false,
                ));
                if fail {
                    return Err(ProduceError::msg("not yet"));
                }
                Ok(())
            }
        })
        .on([EventKind::Deleted])
    };
    let mut rt = runtime(ctx, vec![flaky]);
    let err = rt.run().await.unwrap_err();
    assert!(matches!(err, RunError::Produce { .. }), "{err}");
    assert!(
        rt.context().events().any(|e| e.kind == EventKind::Deleted),
        "the deletion stays queued"
    );
    let report = rt.run().await.unwrap();
    assert_eq!(report.runs, 1);
    let runs = taken(&seen);
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0], runs[1], "the retry saw what the failed run saw");
    assert_eq!(runs[1].3, 300);
}

fn options() -> OpenOptions {
    OpenOptions::new().synchronous(Synchronous::Normal)
}

/// Writes `order:1` (two versions) and deletes it, leaving the deletion queued (no runtime
/// ran), plus a later commit so the deletion is not the head.
fn write_deletion(path: &Path, options: OpenOptions) -> Context {
    let mut ctx = Context::open_with(path, "main", options).unwrap();
    ctx.create("order:1", order("ada", 100)).unwrap();
    ctx.update("order:1", order("ada", 420)).unwrap();
    ctx.delete("order:1").unwrap();
    ctx.create(
        "receipt:unrelated",
        Receipt {
            order: "none".into(),
            total_cents: 0,
        },
    )
    .unwrap();
    ctx
}

#[tokio::test]
async fn a_queued_deletion_keeps_its_last_version_across_a_reopen_of_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    drop(write_deletion(&path, options()));

    let seen = Seen::default();
    let ctx = Context::open_with(&path, "main", options()).unwrap();
    assert!(ctx.events().any(|e| e.kind == EventKind::Deleted));
    let mut rt = runtime(ctx, vec![watcher("gone", &[EventKind::Deleted], &seen)]);
    rt.run().await.unwrap();
    assert_eq!(
        taken(&seen),
        [(EventKind::Deleted, "order:1".to_owned(), 2, 420, false)]
    );
    drop(rt);

    // The run's record survives a reopen, with its event kind, and verifies and replays.
    let ctx = Context::open_with(&path, "main", options()).unwrap();
    let run = &ctx.log().unwrap().last().unwrap().runs[0];
    assert_eq!(run.trigger.as_ref().unwrap().event, EventKind::Deleted);
    ctx.verify().unwrap();
    reactifact_core::testing::assert_replays(
        &ctx,
        &[Agent::new("a").produce(watcher("gone", &[EventKind::Deleted], &Seen::default()))],
    )
    .await;
    assert_eq!(ctx.queued_events(), 0);
}

#[tokio::test]
async fn a_queued_deletion_keeps_its_last_version_in_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let ctx = write_deletion(&path, options());
    assert_eq!(ctx.checkpoint().await.unwrap().map(|g| g.0), Some(4));
    drop(ctx);
    // The commits before the checkpoint no longer decode: an open that read them would fail,
    // so the deletion's last version can only come from the checkpoint.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("UPDATE commits SET runs = x'c1c1' WHERE session = 'main' AND generation <= 3;")
        .unwrap();
    drop(conn);

    let seen = Seen::default();
    let ctx = Context::open_with(&path, "main", options()).unwrap();
    let mut rt = runtime(ctx, vec![watcher("gone", &[EventKind::Deleted], &seen)]);
    rt.run().await.unwrap();
    assert_eq!(
        taken(&seen),
        [(EventKind::Deleted, "order:1".to_owned(), 2, 420, false)]
    );
}

#[tokio::test]
async fn verify_checks_a_checkpoints_deleted_versions_against_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let ctx = write_deletion(&path, options().checkpoint_every(1));
    ctx.checkpoint().await.unwrap();
    ctx.verify().unwrap();
    drop(ctx);
    let ctx = Context::open_with(&path, "main", options().checkpoint_every(1)).unwrap();
    ctx.verify().unwrap();
    // Opened from the checkpoint and from the first commit, the queue is the same.
    let from_checkpoint: Vec<_> = ctx.events().cloned().collect();
    drop(ctx);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("DELETE FROM checkpoints;").unwrap();
    drop(conn);
    let ctx = Context::open_with(&path, "main", options()).unwrap();
    assert_eq!(ctx.events().cloned().collect::<Vec<_>>(), from_checkpoint);
}

#[tokio::test]
async fn replay_reports_a_deletion_run_that_no_longer_reproduces_its_patch() {
    let seen = Seen::default();
    let mut ctx = Context::new("t");
    ctx.create("order:1", order("ada", 100)).unwrap();
    ctx.delete("order:1").unwrap();
    let mut rt = runtime(ctx, vec![watcher("gone", &[EventKind::Deleted], &seen)]);
    rt.run().await.unwrap();
    rt.replay().await.unwrap();
    let changed = Produce::new("gone", |call: ProduceCall<Order>| async move {
        call.effects.upsert(
            format!("invoice:gone:{}", call.trigger.id),
            Invoice {
                order: "something else".into(),
            },
        );
    })
    .creates::<Invoice>()
    .on([EventKind::Deleted]);
    let err = rt
        .context()
        .replay(&[Agent::new("a").produce(changed)])
        .await
        .unwrap_err();
    let reactifact_core::audit::ReplayError::Diverged(divergence) = err else {
        panic!("not a divergence: {err}");
    };
    assert!(
        matches!(
            divergence.difference,
            reactifact_core::audit::Difference::Content { .. }
        ),
        "{divergence}"
    );
    assert_eq!(divergence.trigger.as_str(), "order:1");
}

#[test]
#[should_panic(expected = "must react to at least one event kind")]
fn an_empty_set_of_kinds_is_refused() {
    let _ = Produce::new("never", |_: ProduceCall<Order>| async {}).on(Vec::<EventKind>::new());
}

#[test]
#[should_panic(expected = "must react to at least one event kind")]
fn staleness_alone_is_refused_by_on() {
    let _ = Produce::new("never", |_: ProduceCall<Order>| async {}).on([EventKind::Stale]);
}

#[test]
fn on_takes_kinds_by_value_or_by_reference_and_keeps_staleness() {
    let plain = || Produce::new("p", |_: ProduceCall<Order>| async {});
    let kinds = vec![EventKind::Deleted, EventKind::Created, EventKind::Deleted];
    assert!(plain().on(&kinds).events().eq([EventKind::Created, EventKind::Deleted]));
    assert!(plain().on(kinds).events().eq([EventKind::Created, EventKind::Deleted]));
    let stale_first = plain().stale().on([EventKind::Updated]);
    let stale_last = plain().on([EventKind::Updated]).stale();
    for p in [stale_first, stale_last] {
        assert!(p.events().eq([EventKind::Updated, EventKind::Stale]), "{p:?}");
    }
    assert!(plain()
        .on([EventKind::Deleted, EventKind::Stale])
        .events()
        .eq([EventKind::Deleted, EventKind::Stale]));
}

#[tokio::test]
async fn a_deletion_another_writer_committed_reaches_a_runtime_that_catches_up_with_its_last_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    Context::open_with(&path, "main", options())
        .unwrap()
        .create("order:1", order("ada", 42))
        .unwrap();
    let seen = Seen::default();
    let kinds = [EventKind::Created, EventKind::Deleted];
    let mut first = runtime(
        Context::open_with(&path, "main", options()).unwrap(),
        vec![watcher("w", &kinds, &Seen::default())],
    );
    let mut second = runtime(
        Context::open_with(&path, "main", options()).unwrap(),
        vec![watcher("w", &kinds, &seen)],
    );
    // The first writer deletes the order before the second runs its creation.
    first.context_mut().delete("order:1").unwrap();
    let report = second.run().await.unwrap();
    assert_eq!(
        report.conflicts, 1,
        "the second's generation was fenced out and run again"
    );
    let runs = taken(&seen);
    assert_eq!(
        runs.last(),
        Some(&(EventKind::Deleted, "order:1".to_owned(), 1, 42, false)),
        "{runs:?}"
    );
    assert_eq!(second.context().queued_events(), 0);
    second.context().verify().unwrap();
}
