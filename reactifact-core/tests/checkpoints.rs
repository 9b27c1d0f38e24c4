//! Checkpoints of the SQLite store: a session reopened from its newest checkpoint is the
//! session reopened from its first commit (state, queued events, log, provenance, time travel,
//! forks, merges); a checkpoint that does not check out is skipped without the open writing
//! anything; `verify` refuses a damaged one; and an open from a checkpoint does not read the
//! commits before it.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use reactifact_core::audit::{Event, VerifyError};
use reactifact_core::error::{OpenError, StoreError};
use reactifact_core::runtime::Generation;
use reactifact_core::store::Synchronous;
use reactifact_core::{Agent, Context, OpenOptions, Runtime};

const EVERY: u64 = 10;

fn options() -> OpenOptions {
    OpenOptions::new()
        .synchronous(Synchronous::Normal)
        .checkpoint_every(EVERY)
}

fn runtime(ctx: Context, recorder: &Recorder) -> Runtime {
    Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap()
}

fn sql(path: &Path, statements: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(statements).unwrap();
}

fn checkpoint_generations(path: &Path, session: &str) -> Vec<u64> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT generation FROM checkpoints WHERE session = ?1 ORDER BY generation")
        .unwrap();
    let found = stmt
        .query_map([session], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    found
}

/// Flips one byte in the middle of a checkpoint's body.
fn flip_body_byte(path: &Path, session: &str, generation: u64) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut body: Vec<u8> = conn
        .query_row(
            "SELECT body FROM checkpoints WHERE session = ?1 AND generation = ?2",
            rusqlite::params![session, generation],
            |row| row.get(0),
        )
        .unwrap();
    let at = body.len() / 2;
    body[at] ^= 0x01;
    conn.execute(
        "UPDATE checkpoints SET body = ?3 WHERE session = ?1 AND generation = ?2",
        rusqlite::params![session, generation, body],
    )
    .unwrap();
}

/// The file's bytes, and whether a `-wal` or `-shm` file is beside it.
fn file_state(path: &Path) -> (Vec<u8>, bool, bool) {
    let beside = |suffix: &str| PathBuf::from(format!("{}{suffix}", path.display())).exists();
    (std::fs::read(path).unwrap(), beside("-wal"), beside("-shm"))
}

/// A session of about 30 commits on `path`, with checkpoints every 10: orders seeded one
/// commit each, a turn (receipts, delivered intents), updates, a deletion, a relation, a
/// branch forked at generation 5 with an order of its own, and orders left queued across the
/// last checkpoints. Every handle is dropped on return, so the checkpoints are on file.
async fn write_history(path: &Path) {
    let recorder = Recorder::default();
    let mut ctx = Context::open_with(path, "main", options()).unwrap();
    for i in 1..=5 {
        ctx.create(format!("order:{i}"), order("ada", i)).unwrap();
    }
    let mut branch = runtime(ctx.fork("what-if").unwrap(), &recorder);
    branch.context_mut().create("order:50", order("bob", 50)).unwrap();
    branch.run().await.unwrap();
    drop(branch);
    for i in 6..=12 {
        ctx.create(format!("order:{i}"), order("ada", i)).unwrap();
    }
    let mut rt = runtime(ctx, &recorder);
    rt.run().await.unwrap();
    let ctx = rt.context_mut();
    ctx.update("order:1", order("ada", 1001)).unwrap();
    ctx.delete("order:2").unwrap();
    ctx.link("order:3", "next", "order:4").unwrap();
    while ctx.generation().0 < 33 {
        let i = ctx.generation().0 + 100;
        ctx.create(format!("order:{i}"), order("eve", i)).unwrap();
    }
}

/// A copy of the file without its checkpoints: opens from the first commit.
fn without_checkpoints(path: &Path, dir: &Path) -> PathBuf {
    let copy = dir.join("no-checkpoints.db");
    std::fs::copy(path, &copy).unwrap();
    sql(&copy, "DELETE FROM checkpoints;");
    copy
}

fn events(ctx: &Context) -> Vec<Event> {
    ctx.events().cloned().collect()
}

async fn audit(ctx: &Context) -> String {
    let mut out = Vec::new();
    ctx.export_audit(&mut out).await.unwrap();
    String::from_utf8(out).unwrap()
}

/// Everything a user reads of a session, compared between two contexts of it (the audit
/// trail too, with its delivery times, when both deliveries were copied from one file).
async fn assert_same(a: &Context, b: &Context) {
    assert_same_but_audit(a, b).await;
    assert!(audit(a).await == audit(b).await, "audit trail");
}

async fn assert_same_but_audit(a: &Context, b: &Context) {
    assert_eq!(a.generation(), b.generation());
    assert_eq!(a.head(), b.head());
    assert_eq!(a.state_hash(), b.state_hash());
    assert_eq!(events(a), events(b), "queued events");
    let hashes = |ctx: &Context| ctx.log().unwrap().iter().map(|c| c.hash).collect::<Vec<_>>();
    assert_eq!(hashes(a), hashes(b));
    for g in 0..=a.generation().0 {
        let g = Generation(g);
        assert_eq!(
            a.state_at(g).unwrap().state_hash(),
            b.state_at(g).unwrap().state_hash(),
            "state at {g}"
        );
    }
    for key in ["notify:order:3", "notify:order:12"] {
        let (pa, pb) = (a.provenance(key).await.unwrap(), b.provenance(key).await.unwrap());
        assert_eq!(
            pa.map(|p| p.to_string()),
            pb.map(|p| p.to_string()),
            "provenance of {key}"
        );
    }
    a.verify().unwrap();
    b.verify().unwrap();
}

#[tokio::test]
async fn a_session_reopened_from_a_checkpoint_is_the_session_reopened_from_its_first_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write_history(&path).await;
    assert_eq!(
        checkpoint_generations(&path, "main"),
        [20, 30],
        "the newest two are kept"
    );
    let copy = without_checkpoints(&path, dir.path());
    let from_checkpoint = Context::open_with(&path, "main", options()).unwrap();
    let from_start = Context::open_with(&copy, "main", options()).unwrap();
    assert!(
        from_checkpoint.queued_events() > 3,
        "events queued before the checkpoint are still queued"
    );
    assert_same(&from_checkpoint, &from_start).await;

    // Both run the same turn over their queued events, and end in the same state.
    let recorder = Recorder::default();
    let mut a = runtime(from_checkpoint, &recorder);
    let mut b = runtime(from_start, &Recorder::default());
    a.run().await.unwrap();
    b.run().await.unwrap();
    assert_same_but_audit(a.context(), b.context()).await;
}

#[tokio::test]
async fn forks_and_merges_from_a_checkpoint_give_what_they_give_from_the_first_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write_history(&path).await;
    let copy = without_checkpoints(&path, dir.path());
    let read_only = || options().read_only(true);
    for (g, fork) in [(4, "before"), (25, "after"), (33, "head")] {
        let a = Context::open_with(&path, "main", options()).unwrap();
        let b = Context::open_with(&copy, "main", options()).unwrap();
        let (fa, fb) = (
            a.fork_at(fork, Generation(g)).unwrap(),
            b.fork_at(fork, Generation(g)).unwrap(),
        );
        assert_eq!(fa.state_hash(), fb.state_hash(), "fork at {g}");
        assert_eq!(fa.head(), fb.head(), "fork at {g}");
        drop((fa, fb, a, b));
        // The branch reopens (from its parent's rows) alike on both files.
        let (fa, fb) = (
            Context::open_with(&path, fork, read_only()).unwrap(),
            Context::open_with(&copy, fork, read_only()).unwrap(),
        );
        assert_same(&fa, &fb).await;
    }

    // The branch forked at generation 5, before the checkpoints: its merge base lies before
    // them.
    let mut merged = Vec::new();
    for file in [&path, &copy] {
        let mut main = Context::open_with(file, "main", options()).unwrap();
        let branch = Context::open_with(file, "what-if", options()).unwrap();
        let report = main.merge(&branch).unwrap();
        merged.push((
            report.generation,
            report.ancestor,
            report.taken.clone(),
            main.state_hash(),
            main.head(),
        ));
        assert!(main.get::<Order>("order:50").unwrap().is_some());
        main.verify().unwrap();
    }
    assert_eq!(merged[0], merged[1]);
    // Reopened after the merge, from a checkpoint written on request, alike again.
    let a = Context::open_with(&path, "main", options()).unwrap();
    assert_eq!(a.checkpoint().await.unwrap(), Some(a.generation()));
    drop(a);
    assert_eq!(checkpoint_generations(&path, "main").last(), Some(&34));
    let a = Context::open_with(&path, "main", options()).unwrap();
    let b = Context::open_with(&copy, "main", options()).unwrap();
    assert_same(&a, &b).await;
    let branch = Context::open_with(&path, "what-if", options()).unwrap();
    let mut a = a;
    assert!(
        a.merge(&branch).unwrap().generation.is_none(),
        "the branch's head is merged already"
    );
}

#[tokio::test]
async fn open_from_a_checkpoint_reads_no_commit_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write_history(&path).await;
    let expected = Context::open(&path, "main").unwrap().state_hash();
    // Commit 3's runs no longer decode.
    sql(
        &path,
        "UPDATE commits SET runs = x'c1c1' WHERE session = 'main' AND generation = 3;",
    );

    let ctx = Context::open_with(&path, "main", options()).unwrap();
    assert_eq!((ctx.state_hash(), ctx.generation()), (expected, Generation(33)));
    assert!(ctx.state_at(Generation(31)).is_ok(), "time travel after the checkpoint");
    // What needs the older commits reads them, and reports the damage.
    let err = ctx.verify().unwrap_err();
    assert!(
        matches!(&err, VerifyError::History { detail } if detail.contains("commit 3")),
        "{err}"
    );
    assert!(matches!(ctx.log(), Err(VerifyError::History { .. })));
    assert!(ctx.state_at(Generation(5)).is_err());
    let err = ctx.provenance("notify:order:3").await.unwrap_err();
    assert!(matches!(err, StoreError::History { .. }), "{err}");
    drop(ctx);
    // A read-only open starts from the checkpoint too.
    let ctx = Context::open_with(&path, "main", options().read_only(true)).unwrap();
    assert_eq!(ctx.state_hash(), expected);
    drop(ctx);

    // Without checkpoints, the open reads every commit and refuses the file.
    sql(&path, "DELETE FROM checkpoints;");
    let err = Context::open_with(&path, "main", options()).unwrap_err();
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err}");
}

#[tokio::test]
async fn a_damaged_checkpoint_is_skipped_without_writing_and_verify_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write_history(&path).await;
    let (hash, queued) = {
        let ctx = Context::open(&path, "main").unwrap();
        (ctx.state_hash(), events(&ctx))
    };
    flip_body_byte(&path, "main", 30);

    // A read-only open falls back to the checkpoint at 20 and leaves the file as it was.
    let before = file_state(&path);
    let ctx = Context::open_with(&path, "main", options().read_only(true)).unwrap();
    assert_eq!((ctx.state_hash(), events(&ctx)), (hash, queued.clone()));
    drop(ctx);
    assert!(before == file_state(&path), "a read-only open wrote to the file");

    // Both damaged: the whole log.
    flip_body_byte(&path, "main", 20);
    let ctx = Context::open_with(&path, "main", options().read_only(true)).unwrap();
    assert_eq!((ctx.state_hash(), events(&ctx)), (hash, queued.clone()));
    let err = ctx.verify().unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::Checkpoint {
                generation: Generation(20),
                ..
            }
        ),
        "{err}"
    );
    drop(ctx);

    // A writable open too; the next checkpoint (on request) replaces the damaged ones.
    let ctx = Context::open_with(&path, "main", options()).unwrap();
    assert_eq!((ctx.state_hash(), events(&ctx)), (hash, queued));
    assert!(matches!(ctx.verify(), Err(VerifyError::Checkpoint { .. })));
    ctx.checkpoint().await.unwrap();
    assert_eq!(checkpoint_generations(&path, "main"), [30, 33]);
    sql(&path, "DELETE FROM checkpoints WHERE generation = 30;");
    ctx.verify().unwrap();
}

#[tokio::test]
async fn a_checkpoint_naming_another_commit_is_skipped_and_refused_by_verify() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write_history(&path).await;
    let hash = Context::open(&path, "main").unwrap().state_hash();
    // The checkpoint at 30 names commit 29's hash (its digest then no longer matches either).
    sql(
        &path,
        "UPDATE checkpoints SET hash = (SELECT hash FROM commits WHERE session = 'main' AND generation = 29)
         WHERE session = 'main' AND generation = 30;",
    );
    let ctx = Context::open_with(&path, "main", options()).unwrap();
    assert_eq!(ctx.state_hash(), hash);
    let err = ctx.verify().unwrap_err();
    assert!(
        matches!(
            err,
            VerifyError::Checkpoint {
                generation: Generation(30),
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn checkpoints_are_written_every_k_commits_on_request_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut ctx = Context::open_with(&path, "off", options().checkpoint_every(0)).unwrap();
        for i in 0..25 {
            ctx.create(format!("order:{i}"), order("ada", i)).unwrap();
        }
        let mut ctx = Context::open_with(&path, "every-5", options().checkpoint_every(5)).unwrap();
        for i in 0..12 {
            ctx.create(format!("order:{i}"), order("ada", i)).unwrap();
        }
    }
    assert!(checkpoint_generations(&path, "off").is_empty());
    assert_eq!(checkpoint_generations(&path, "every-5"), [5, 10]);
    let ctx = Context::open_with(&path, "off", options().checkpoint_every(0)).unwrap();
    assert_eq!(ctx.checkpoint().await.unwrap(), Some(Generation(25)));
    assert_eq!(checkpoint_generations(&path, "off"), [25]);
    drop(ctx);
    let ctx = Context::open_with(&path, "off", options().read_only(true)).unwrap();
    assert!(matches!(ctx.checkpoint().await, Err(StoreError::ReadOnly { .. })));
    let mut memory = Context::new("memory");
    memory.create("order:1", order("ada", 1)).unwrap();
    assert_eq!(memory.checkpoint().await.unwrap(), None);
}

#[tokio::test]
async fn commits_after_an_open_from_a_checkpoint_extend_the_whole_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write_history(&path).await;
    // The async reads load the older commits off the caller's thread.
    let fresh = Context::open_with(&path, "main", options()).unwrap();
    let why = fresh
        .provenance("notify:order:3")
        .await
        .unwrap()
        .expect("order:3's intent");
    assert!(why.generation.0 < 20, "recorded before the checkpoint");
    assert_eq!(fresh.log().unwrap()[why.generation.0 as usize - 1].hash, why.commit);
    drop(fresh);
    let mut ctx = Context::open_with(&path, "main", options()).unwrap();
    ctx.create("order:900", order("zoe", 900)).unwrap();
    assert_eq!(ctx.log().unwrap().len(), 34);
    // The whole log, once read, is the one the next commits extend.
    ctx.create("order:901", order("zoe", 901)).unwrap();
    let log = ctx.log().unwrap();
    assert_eq!(log.len(), 35);
    assert_eq!(log.last().map(|c| c.hash), ctx.head());
    assert_eq!(log[33].parent, Some(log[32].hash));
    ctx.verify().unwrap();
    let branch = ctx.fork_at("old", Generation(3)).unwrap();
    assert_eq!(branch.state_hash(), log[2].state_hash);
}

#[tokio::test]
async fn a_branch_opens_from_its_parents_checkpoint_before_the_fork() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write_history(&path).await;
    let expected = {
        let main = Context::open_with(&path, "main", options()).unwrap();
        let mut branch = main.fork_at("late", Generation(25)).unwrap();
        branch.create("order:700", order("zoe", 700)).unwrap();
        branch.state_hash()
    };
    assert!(checkpoint_generations(&path, "late").is_empty());
    // Commit 3 (main's, before its checkpoint at 20) no longer decodes: the branch's log
    // holds it, but its open starts from main's checkpoint at 20.
    sql(
        &path,
        "UPDATE commits SET runs = x'c1c1' WHERE session = 'main' AND generation = 3;",
    );
    let branch = Context::open_with(&path, "late", options()).unwrap();
    assert_eq!((branch.state_hash(), branch.generation()), (expected, Generation(26)));
    assert_eq!(branch.queued_events(), 1, "order:700's: the fork started with none");
    assert!(matches!(branch.verify(), Err(VerifyError::History { .. })));
}

/// Dropping a context closes its file at once, even right after checkpoints were written on
/// their own thread: the last connection closes (SQLite folds the write-ahead log into the file
/// and removes it), so a copy of the file taken next holds everything.
#[tokio::test]
async fn dropping_a_context_after_its_checkpoints_closes_the_file_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let wal = dir.path().join("state.db-wal");
    for round in 0..20u64 {
        let mut ctx = Context::open_with(&path, "main", OpenOptions::new().checkpoint_every(1)).unwrap();
        for i in 0..3 {
            ctx.create(format!("order:{round}:{i}"), order("ada", i)).unwrap();
        }
        drop(ctx);
        assert!(
            !wal.exists(),
            "round {round}: the file is still open after its context was dropped"
        );
    }
}
