//! Branches: fork, independent runs, three-way merge without re-sending, diff.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use reactifact_core::{
    Agent, Context, DispatchError, Generation, Intent, MergeError, PendingAction, Resolution, Runtime, Side,
};

fn counting_dispatcher(count: &Arc<AtomicUsize>) -> impl reactifact_core::Dispatcher {
    let count = count.clone();
    move |_: Intent| {
        count.fetch_add(1, Ordering::SeqCst);
        async { Ok::<(), DispatchError>(()) }
    }
}

fn runtime(ctx: Context, sends: &Arc<AtomicUsize>) -> Runtime {
    Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(counting_dispatcher(sends))
        .build()
        .unwrap()
}

#[test]
fn identical_work_on_two_branches_gives_identical_commits() {
    let main = Context::new("main");
    let mut a = main.fork("a").unwrap();
    let mut b = main.fork("b").unwrap();
    a.create("order:1", order("ada", 1)).unwrap();
    b.create("order:1", order("ada", 1)).unwrap();
    assert_eq!(a.head(), b.head(), "the hash chain is content-derived");
    assert_eq!(a.merge(&b).unwrap().generation, None, "nothing to merge");
}

#[tokio::test]
async fn two_branches_reaching_the_same_intent_send_it_once_and_merge_into_one() {
    let mut main = Context::new("main");
    main.create("order:0", order("zoe", 5)).unwrap();
    let sends = Arc::new(AtomicUsize::new(0));
    let mut rt = runtime(main, &sends);
    rt.run().await.unwrap();
    assert_eq!(sends.load(Ordering::SeqCst), 1);

    let branch = rt.context().fork("what-if").unwrap();
    assert_eq!(branch.state_hash(), rt.context().state_hash());
    assert_eq!(branch.queued_events(), 0);
    assert!(branch.ledger().same_as(rt.context().ledger()));
    let mut other = runtime(branch, &sends);

    // The same order arrives on both branches, and each runs it with its own runtime; the
    // branch also gets an order of its own first, so the histories differ.
    rt.context_mut().create("order:1", order("ada", 1200)).unwrap();
    other.context_mut().create("order:2", order("bob", 300)).unwrap();
    other.context_mut().create("order:1", order("ada", 1200)).unwrap();
    rt.run().await.unwrap();
    other.run().await.unwrap();
    assert_eq!(
        sends.load(Ordering::SeqCst),
        3,
        "order:0, order:1 and order:2 once each — order:1 not once per branch"
    );

    let head_before = rt.context().head();
    let report = rt.context_mut().merge(other.context()).unwrap();
    assert_eq!(sends.load(Ordering::SeqCst), 3, "merging never dispatches");
    let merge = rt.context().log().last().unwrap();
    assert_eq!(merge.parent, head_before);
    assert_eq!(merge.merged, other.context().head());
    assert_eq!(report.generation, Some(merge.generation));
    let mut taken: Vec<_> = report.taken.iter().map(|id| id.as_str()).collect();
    taken.sort_unstable();
    assert_eq!(
        taken,
        ["action:notify:order:2", "order:2", "receipt:order:2"],
        "order:1 merged cleanly"
    );
    assert_eq!(rt.context().list::<PendingAction>().count(), 3, "one intent per key");
    assert_eq!(rt.context().ledger().len(), 3);
    rt.run().await.unwrap();
    assert_eq!(sends.load(Ordering::SeqCst), 3);
    rt.context().verify().unwrap();
}

#[tokio::test]
async fn an_intent_only_one_branch_had_is_delivered_once_after_the_merge() {
    let main = Context::new("main");
    let branch = main.fork("b").unwrap();
    let sends = Arc::new(AtomicUsize::new(0));
    // The branch runs without a dispatcher: its intent waits in the shared ledger.
    let mut other = Runtime::builder(branch)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    other.context_mut().create("order:7", order("eve", 7)).unwrap();
    other.run().await.unwrap();
    assert_eq!(other.context().ledger().pending(), 1);

    let mut rt = runtime(main, &sends);
    let report = rt.context_mut().merge(other.context()).unwrap();
    assert_eq!(report.taken.len(), 3, "the order, its receipt and its intent");
    assert_eq!(sends.load(Ordering::SeqCst), 0);
    rt.flush().await.unwrap();
    assert_eq!(sends.load(Ordering::SeqCst), 1);
    rt.flush().await.unwrap();
    assert_eq!(sends.load(Ordering::SeqCst), 1);
}

#[test]
fn different_content_on_both_sides_is_a_conflict_and_nothing_is_applied() {
    let mut main = Context::new("main");
    main.create("order:1", order("ada", 1)).unwrap();
    main.create("order:2", order("bob", 2)).unwrap();
    let mut branch = main.fork("b").unwrap();
    main.update("order:1", order("ada", 10)).unwrap();
    branch.update("order:1", order("ada", 20)).unwrap();
    // A deletion against an update is a conflict too.
    main.delete("order:2").unwrap();
    branch.update("order:2", order("bob", 3)).unwrap();
    // A change only they made would apply, but a conflict applies nothing.
    branch.create("order:3", order("cy", 3)).unwrap();

    let (hash, commits) = (main.state_hash(), main.log().len());
    let MergeError::Conflicts(conflicts) = main.merge(&branch).unwrap_err() else {
        panic!("expected conflicts");
    };
    assert_eq!(conflicts.len(), 2);
    let first = &conflicts[0];
    assert_eq!(first.id.as_str(), "order:1");
    assert_eq!(
        first.base.as_ref().unwrap().decode::<Order>().unwrap().data.total_cents,
        1
    );
    assert_eq!(
        first.ours.as_ref().unwrap().decode::<Order>().unwrap().data.total_cents,
        10
    );
    assert_eq!(
        first
            .theirs
            .as_ref()
            .unwrap()
            .decode::<Order>()
            .unwrap()
            .data
            .total_cents,
        20
    );
    let second = &conflicts[1];
    assert_eq!(second.id.as_str(), "order:2");
    assert!(second.ours.is_none() && second.theirs.is_some() && second.base.is_some());
    assert_eq!((main.state_hash(), main.log().len()), (hash, commits));
    assert!(main.get::<Order>("order:3").unwrap().is_none());
}

#[test]
fn a_resolution_picks_a_side_per_conflict() {
    let mut main = Context::new("main");
    main.create("order:1", order("ada", 1)).unwrap();
    main.create("order:2", order("bob", 2)).unwrap();
    let mut branch = main.fork("b").unwrap();
    main.update("order:1", order("ada", 10)).unwrap();
    branch.update("order:1", order("ada", 20)).unwrap();
    main.update("order:2", order("bob", 30)).unwrap();
    branch.update("order:2", order("bob", 40)).unwrap();

    let report = main
        .merge_with(
            &branch,
            Resolution::with(|c| {
                if c.id.as_str() == "order:1" {
                    Side::Theirs
                } else {
                    Side::Ours
                }
            }),
        )
        .unwrap();
    assert_eq!(report.resolved.len(), 2);
    assert_eq!(main.get::<Order>("order:1").unwrap().unwrap().data.total_cents, 20);
    assert_eq!(main.get::<Order>("order:2").unwrap().unwrap().data.total_cents, 30);
}

#[test]
fn a_fork_at_a_past_commit_starts_from_that_state() {
    let mut main = Context::new("main");
    main.create("order:1", order("ada", 1)).unwrap();
    main.create("order:2", order("bob", 2)).unwrap();
    main.update("order:1", order("ada", 3)).unwrap();
    let past = main.fork_at("past", Generation(1)).unwrap();
    assert_eq!(past.generation(), Generation(1));
    assert_eq!(past.state_hash(), main.log()[0].state_hash);
    assert_eq!(past.get::<Order>("order:1").unwrap().unwrap().data.total_cents, 1);
    assert!(past.get::<Order>("order:2").unwrap().is_none());
    assert!(main.fork_at("future", Generation(9)).is_err());
}

#[test]
fn repeated_merges_find_the_last_merged_commit_as_ancestor() {
    let mut main = Context::new("main");
    main.create("order:1", order("ada", 1)).unwrap();
    let mut branch = main.fork("b").unwrap();
    branch.update("order:1", order("ada", 2)).unwrap();
    main.merge(&branch).unwrap();
    assert_eq!(main.get::<Order>("order:1").unwrap().unwrap().data.total_cents, 2);
    // Nothing new on their side: nothing to do.
    assert_eq!(main.merge(&branch).unwrap().generation, None);
    // Both sides move on; the earlier merge is not a conflict again.
    branch.update("order:1", order("ada", 3)).unwrap();
    main.create("order:9", order("zed", 9)).unwrap();
    main.merge(&branch).unwrap();
    assert_eq!(main.get::<Order>("order:1").unwrap().unwrap().data.total_cents, 3);
    assert!(main.get::<Order>("order:9").unwrap().is_some());
    main.verify().unwrap();
}

#[test]
fn relations_merge_like_artifacts() {
    let mut main = Context::new("main");
    main.create("order:1", order("ada", 1)).unwrap();
    main.create("order:2", order("bob", 2)).unwrap();
    main.link("order:1", "next", "order:2").unwrap();
    let mut branch = main.fork("b").unwrap();
    branch.unlink("order:1", "next", "order:2").unwrap();
    branch.link("order:2", "next", "order:1").unwrap();
    main.merge(&branch).unwrap();
    let rels: Vec<_> = main.snapshot().relations().cloned().collect();
    assert_eq!(rels, [reactifact_core::Relation::new("order:2", "next", "order:1")]);
}

#[test]
fn diffs_name_created_updated_fields_deleted_and_relations() {
    let mut main = Context::new("main");
    main.create("order:1", order("ada", 1)).unwrap();
    main.create("order:2", order("bob", 2)).unwrap();
    let mut branch = main.fork("b").unwrap();
    branch.update("order:1", order("ada", 5)).unwrap();
    branch.delete("order:2").unwrap();
    branch.create("order:3", order("cy", 3)).unwrap();
    branch.link("order:1", "next", "order:3").unwrap();

    let diff = main.diff(&branch).unwrap();
    assert_eq!(
        diff.created.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["order:3"]
    );
    assert_eq!(
        diff.deleted.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["order:2"]
    );
    assert_eq!(diff.updated.len(), 1);
    let fields: Vec<_> = diff.updated[0].fields.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(fields, [".total_cents"]);
    assert_eq!(diff.linked.len(), 1);

    let history = branch.diff_commits(Generation(2), branch.generation()).unwrap();
    assert_eq!(
        (history.created.len(), history.updated.len(), history.deleted.len()),
        (1, 1, 1)
    );
    assert!(branch
        .diff_commits(branch.generation(), branch.generation())
        .unwrap()
        .is_empty());
}

/// A small deterministic generator for the property test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Random edits on one side: each touches ids from its own range, or shared ids with content
/// both sides agree on (`total_cents` = the id number), so the two sides never conflict.
fn edit(ctx: &mut Context, rng: &mut Rng, own: u64) {
    for _ in 0..(rng.next() % 6) {
        let shared = rng.next() % 3 == 0;
        let n = if shared {
            rng.next() % 4
        } else {
            own * 100 + rng.next() % 5
        };
        let id = format!("order:{n}");
        match rng.next() % 4 {
            0 if !shared && ctx.get::<Order>(&id).unwrap().is_some() => ctx.delete(id.as_str()).unwrap(),
            1 if !shared => ctx.create(id, order("x", rng.next() % 1000)).unwrap(),
            _ => ctx.create(id, order("x", n)).unwrap(),
        }
    }
}

#[test]
fn merging_non_conflicting_branches_commutes() {
    for seed in 0..200 {
        let mut rng = Rng(seed);
        let mut base = Context::new("base");
        edit(&mut base, &mut rng, 9);
        let mut a = base.fork("a").unwrap();
        let mut b = base.fork("b").unwrap();
        edit(&mut a, &mut rng, 1);
        edit(&mut b, &mut rng, 2);
        let mut a_then_b = a.fork("ab").unwrap();
        let mut b_then_a = b.fork("ba").unwrap();
        a_then_b.merge(&b).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        b_then_a.merge(&a).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(a_then_b.state_hash(), b_then_a.state_hash(), "seed {seed}");
    }
}

#[tokio::test]
async fn branches_live_in_the_sqlite_file_and_merge_there() {
    let dir = std::env::temp_dir().join(format!("reactifact-branch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.db");
    let recorder = Recorder::default();
    let keyed = |ctx: Context| {
        Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(recorder.dispatcher())
            .build()
            .unwrap()
    };
    {
        let mut main = Context::open(&path, "main").unwrap();
        main.create("order:1", order("ada", 1)).unwrap();
        let mut branch = main.fork("b").unwrap();
        assert!(main.fork("b").is_err(), "the name is taken");
        assert_eq!(branch.store_description(), main.store_description());
        assert_eq!(branch.queued_events(), 0, "a fork starts with an empty queue");
        branch.create("order:2", order("bob", 2)).unwrap();
        let mut rt = keyed(branch);
        rt.run().await.unwrap();
    }
    assert_eq!(recorder.sent(), ["notify:order:2"]);
    let branch = Context::open(&path, "b").unwrap();
    assert_eq!(branch.log().len(), 3, "the parent's commit, then its own");
    assert_eq!(branch.queued_events(), 0);
    branch.verify().unwrap();
    let mut main = Context::open(&path, "main").unwrap();
    assert_eq!(main.log().len(), 1);
    main.merge(&branch).unwrap();
    drop(main);
    let main = Context::open(&path, "main").unwrap();
    main.verify().unwrap();
    assert!(main.get::<Receipt>("receipt:order:2").unwrap().is_some());
    assert_eq!(main.log().last().unwrap().merged, branch.head());
    // Main runs its own queued order:1; the merged intent of order:2, delivered on the
    // branch, is never sent again.
    let mut rt = keyed(main);
    rt.run().await.unwrap();
    assert_eq!(recorder.sent(), ["notify:order:2", "notify:order:1"]);
    let _ = std::fs::remove_dir_all(&dir);
}
