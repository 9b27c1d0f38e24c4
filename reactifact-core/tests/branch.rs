//! Branches: fork, independent runs, three-way merge without re-sending, diff.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use reactifact_core::branch::{MergeError, Resolution, Side};
use reactifact_core::runtime::Generation;
use reactifact_core::{Agent, Context, DispatchError, Intent, PendingAction, Runtime};

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
    assert!(branch.ledger().same_as(&rt.context().ledger()));
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
    let merge = rt.context().log().unwrap().last().unwrap();
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
    assert_eq!(rt.context().ledger().len().await.unwrap(), 3);
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
    assert_eq!(other.context().ledger().pending().await.unwrap(), 1);

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

    let (hash, commits) = (main.state_hash(), main.log().unwrap().len());
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
    assert_eq!((main.state_hash(), main.log().unwrap().len()), (hash, commits));
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
    assert_eq!(past.state_hash(), main.log().unwrap()[0].state_hash);
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
    assert_eq!(
        rels,
        [reactifact_core::runtime::Relation::new("order:2", "next", "order:1")]
    );
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
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
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
    assert_eq!(branch.log().unwrap().len(), 3, "the parent's commit, then its own");
    assert_eq!(branch.queued_events(), 0);
    branch.verify().unwrap();
    let mut main = Context::open(&path, "main").unwrap();
    assert_eq!(main.log().unwrap().len(), 1);
    main.merge(&branch).unwrap();
    drop(main);
    let main = Context::open(&path, "main").unwrap();
    main.verify().unwrap();
    assert!(main.get::<Receipt>("receipt:order:2").unwrap().is_some());
    assert_eq!(main.log().unwrap().last().unwrap().merged, branch.head());
    // Main runs its own queued order:1; the merged intent of order:2, delivered on the
    // branch, is never sent again.
    let mut rt = keyed(main);
    rt.run().await.unwrap();
    assert_eq!(recorder.sent(), ["notify:order:2", "notify:order:1"]);
}

fn cents(ctx: &Context, id: &str) -> Option<u64> {
    ctx.get::<Order>(id).unwrap().map(|r| r.data.total_cents)
}

/// `main` forks `l`; `l` creates `a`; `l` forks `r`; `l` creates `b`; `main` merges `l`. The
/// merge base of `main` and `r` is then `l`'s commit that created `a`, reachable from `main`
/// only through its merge parent.
fn merged_through_l() -> (Context, Context) {
    let mut main = Context::new("main");
    main.create("order:0", order("zoe", 0)).unwrap();
    let mut l = main.fork("l").unwrap();
    l.create("order:a", order("ada", 1)).unwrap();
    let r = l.fork("r").unwrap();
    l.create("order:b", order("bob", 2)).unwrap();
    main.merge(&l).unwrap();
    (main, r)
}

#[test]
fn a_deletion_merged_through_an_earlier_merge_is_not_lost() {
    let (mut main, mut r) = merged_through_l();
    r.delete("order:a").unwrap();
    let report = main.merge(&r).unwrap();
    assert_eq!(
        report.ancestor,
        Some(r.log().unwrap()[1].hash),
        "the base is l's commit that created a"
    );
    assert_eq!(cents(&main, "order:a"), None, "their deletion is applied");
    assert_eq!(cents(&main, "order:b"), Some(2), "our side (merged from l) is kept");
    main.verify().unwrap();
}

#[test]
fn an_update_merged_through_an_earlier_merge_is_not_a_conflict() {
    let (mut main, mut r) = merged_through_l();
    r.update("order:a", order("ada", 5)).unwrap();
    let report = main.merge(&r).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.resolved.is_empty());
    assert_eq!(cents(&main, "order:a"), Some(5));
    assert_eq!(cents(&main, "order:b"), Some(2));
    let diff = main.diff(&r).unwrap();
    assert_eq!(
        diff.deleted.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["order:b"],
        "r never had b"
    );
    assert!(diff.updated.is_empty() && diff.created.is_empty());
}

#[test]
fn sync_then_merge_back_keeps_the_newer_value() {
    let mut a = Context::new("a");
    a.create("order:seed", order("zoe", 0)).unwrap();
    let mut b = a.fork("b").unwrap();
    a.create("order:x", order("x", 1)).unwrap();
    b.create("order:y", order("y", 1)).unwrap();
    b.merge(&a).unwrap();
    assert_eq!(cents(&b, "order:x"), Some(1));
    a.update("order:x", order("x", 2)).unwrap();

    // B's side of x is the value it took from A, which A has changed since: no conflict.
    let mut with_theirs = a.fork("a-theirs").unwrap();
    let report = a.merge(&b).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cents(&a, "order:x"), Some(2));
    assert_eq!(cents(&a, "order:y"), Some(1));
    let taken: Vec<_> = report.taken.iter().map(|id| id.as_str()).collect();
    assert_eq!(taken, ["order:y"]);

    let report = with_theirs.merge_with(&b, Resolution::Theirs).unwrap();
    assert!(report.resolved.is_empty(), "nothing conflicts, so nothing is resolved");
    assert_eq!(cents(&with_theirs, "order:x"), Some(2), "Theirs does not revert x");
    assert_eq!(with_theirs.state_hash(), a.state_hash());
    a.verify().unwrap();
}

#[test]
fn repeated_syncs_in_both_directions_merge_cleanly() {
    let mut a = Context::new("a");
    a.create("order:0", order("zoe", 0)).unwrap();
    let mut b = a.fork("b").unwrap();
    for round in 1..=4u64 {
        a.create(format!("order:a{round}"), order("a", round)).unwrap();
        b.create(format!("order:b{round}"), order("b", round)).unwrap();
        b.update("order:0", order("zoe", round)).unwrap();
        a.merge(&b).unwrap_or_else(|e| panic!("round {round}: {e}"));
        b.merge(&a).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(a.state_hash(), b.state_hash(), "round {round}");
    }
    assert_eq!(cents(&a, "order:0"), Some(4));
    assert_eq!(
        b.merge(&a).unwrap().generation,
        None,
        "a's head is in b's history already"
    );
    a.verify().unwrap();
    b.verify().unwrap();
}

#[test]
fn a_criss_cross_history_is_refused_naming_both_bases() {
    let mut main = Context::new("main");
    main.create("order:0", order("zoe", 0)).unwrap();
    let mut a = main.fork("a").unwrap();
    let mut b = main.fork("b").unwrap();
    a.create("order:a", order("a", 1)).unwrap();
    b.create("order:b", order("b", 1)).unwrap();
    // Each merges the other's head at the same time.
    let a1 = a.fork("a1").unwrap();
    let b1 = b.fork("b1").unwrap();
    a.merge(&b1).unwrap();
    b.merge(&a1).unwrap();
    a.update("order:0", order("zoe", 1)).unwrap();

    let (hash, commits) = (a.state_hash(), a.log().unwrap().len());
    match a.merge(&b) {
        Err(MergeError::CrissCross { bases }) => {
            let mut bases: Vec<_> = bases.into_iter().collect();
            bases.sort();
            let mut expected = vec![a1.head().unwrap(), b1.head().unwrap()];
            expected.sort();
            assert_eq!(bases, expected);
        }
        other => panic!("expected a criss-cross refusal, got {other:?}"),
    }
    assert_eq!(
        (a.state_hash(), a.log().unwrap().len()),
        (hash, commits),
        "nothing applied"
    );
}

#[tokio::test]
async fn theirs_on_an_intent_conflict_is_refused_and_a_per_conflict_choice_keeps_our_intent() {
    let main = Context::new("main");
    let sends = Arc::new(AtomicUsize::new(0));
    let mut ours = runtime(main.fork("ours").unwrap(), &sends);
    let mut theirs = runtime(main.fork("theirs").unwrap(), &sends);
    // The same key on both sides, with different payloads.
    ours.context_mut().create("order:1", order("ada", 1)).unwrap();
    theirs.context_mut().create("order:1", order("bob", 1)).unwrap();
    ours.run().await.unwrap();
    theirs.run().await.unwrap();
    let key = "action:notify:order:1";
    let our_intent = ours.context().get::<PendingAction>(key).unwrap().unwrap().data;

    let (hash, commits) = (ours.context().state_hash(), ours.context().log().unwrap().len());
    for resolution in [Resolution::Theirs, Resolution::with(|_| Side::Theirs)] {
        match ours.context_mut().merge_with(theirs.context(), resolution) {
            Err(MergeError::IntentConflict { id }) => assert_eq!(id.as_str(), key),
            other => panic!("expected the intent conflict to be refused, got {other:?}"),
        }
        assert_eq!(
            (ours.context().state_hash(), ours.context().log().unwrap().len()),
            (hash, commits),
            "nothing applied"
        );
    }

    let report = ours
        .context_mut()
        .merge_with(
            theirs.context(),
            Resolution::with(|c| {
                if c.id.as_str().starts_with("action:") {
                    Side::Ours
                } else {
                    Side::Theirs
                }
            }),
        )
        .unwrap();
    let sides: Vec<_> = report.resolved.iter().map(|(c, side)| (c.id.as_str(), *side)).collect();
    assert_eq!(
        sides,
        [(key, Side::Ours), ("order:1", Side::Theirs)],
        "the receipts agree"
    );
    let ctx = ours.context();
    assert_eq!(ctx.get::<Order>("order:1").unwrap().unwrap().data.customer, "bob");
    assert_eq!(ctx.get::<PendingAction>(key).unwrap().unwrap().data, our_intent);
    ours.run().await.unwrap();
    assert_eq!(sends.load(Ordering::SeqCst), 1, "one key, delivered once");
}

#[test]
fn sqlite_branches_reopened_merge_through_an_earlier_merge() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut main = Context::open(&path, "main").unwrap();
        main.create("order:0", order("zoe", 0)).unwrap();
        let mut l = main.fork("l").unwrap();
        l.create("order:a", order("ada", 1)).unwrap();
        let mut r = l.fork("r").unwrap();
        l.create("order:b", order("bob", 2)).unwrap();
        main.merge(&l).unwrap();
        r.delete("order:a").unwrap();
    }
    // Reopened, main knows l's commits only through the file.
    let mut main = Context::open(&path, "main").unwrap();
    let r = Context::open(&path, "r").unwrap();
    main.merge(&r).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cents(&main, "order:a"), None);
    assert_eq!(cents(&main, "order:b"), Some(2));
    drop(main);
    let main = Context::open(&path, "main").unwrap();
    main.verify().unwrap();
    assert_eq!(cents(&main, "order:a"), None);
}

/// Random writes of every sort: creates, updates, deletes (with their relations), links and
/// unlinks, several per commit.
fn churn(ctx: &mut Context, rng: &mut Rng, commits: usize) {
    for _ in 0..commits {
        let mut tx = ctx.transaction();
        for _ in 0..1 + rng.next() % 3 {
            let id = format!("order:{}", rng.next() % 6);
            let other = format!("order:{}", rng.next() % 6);
            match rng.next() % 5 {
                0 => {
                    tx.delete(id);
                }
                1 => {
                    tx.link(id, "next", other);
                }
                2 => {
                    tx.unlink(id, "next", other);
                }
                _ => {
                    tx.create(id, order("x", rng.next() % 4));
                }
            }
        }
        // A link to a missing artifact fails the commit; the next one tries again.
        let _ = tx.commit();
    }
}

/// The ids and contents of a snapshot's orders, and its relations.
fn contents(snapshot: &reactifact_core::Snapshot) -> (Vec<(String, u64)>, Vec<reactifact_core::runtime::Relation>) {
    let mut orders: Vec<_> = snapshot
        .list::<Order>()
        .map(|r| r.unwrap())
        .map(|r| (r.id.to_string(), r.data.total_cents))
        .collect();
    orders.sort();
    (orders, snapshot.relations().cloned().collect())
}

#[test]
fn diff_commits_matches_the_two_states_in_either_direction() {
    for seed in 0..20 {
        let mut rng = Rng(seed);
        let mut ctx = Context::new("churn");
        churn(&mut ctx, &mut rng, 30);
        let head = ctx.generation().0;
        for _ in 0..20 {
            let (from, to) = (Generation(rng.next() % (head + 1)), Generation(rng.next() % (head + 1)));
            let (before, after) = (
                contents(&ctx.state_at(from).unwrap()),
                contents(&ctx.state_at(to).unwrap()),
            );
            let diff = ctx.diff_commits(from, to).unwrap();
            let ids = |list: &[(reactifact_core::ArtifactId, reactifact_core::branch::ArtifactState)]| {
                let mut ids: Vec<String> = list.iter().map(|(id, _)| id.to_string()).collect();
                ids.sort();
                ids
            };
            let had = |orders: &[(String, u64)], id: &str| orders.iter().find(|(i, _)| i == id).map(|(_, c)| *c);
            let all: std::collections::BTreeSet<&String> = before.0.iter().chain(&after.0).map(|(id, _)| id).collect();
            let (mut created, mut deleted, mut updated) = (Vec::new(), Vec::new(), Vec::new());
            for id in all {
                match (had(&before.0, id), had(&after.0, id)) {
                    (None, Some(_)) => created.push(id.clone()),
                    (Some(_), None) => deleted.push(id.clone()),
                    (Some(b), Some(a)) if a != b => updated.push(id.clone()),
                    _ => {}
                }
            }
            let context = format!("seed {seed}, {from:?} → {to:?}");
            assert_eq!(ids(&diff.created), created, "{context}");
            assert_eq!(ids(&diff.deleted), deleted, "{context}");
            let mut diff_updated: Vec<String> = diff.updated.iter().map(|u| u.id.to_string()).collect();
            diff_updated.sort();
            assert_eq!(diff_updated, updated, "{context}");
            let linked: Vec<_> = after.1.iter().filter(|r| !before.1.contains(r)).cloned().collect();
            let unlinked: Vec<_> = before.1.iter().filter(|r| !after.1.contains(r)).cloned().collect();
            assert_eq!(diff.linked, linked, "{context}");
            assert_eq!(diff.unlinked, unlinked, "{context}");
        }
    }
}

#[test]
fn merges_after_churn_on_both_sides_match_a_merge_rebuilt_from_scratch() {
    // Disjoint ids on each side after a shared, churned history: the merge takes every
    // change of theirs, so the result is their state with our own ids on top.
    for seed in 0..30 {
        let mut rng = Rng(seed);
        let mut base = Context::new("base");
        churn(&mut base, &mut rng, 20);
        let mut ours = base.fork("ours").unwrap();
        let mut theirs = base.fork("theirs").unwrap();
        churn(&mut theirs, &mut rng, 10);
        ours.create("mine:1", order("me", 1)).unwrap();
        ours.merge(&theirs).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        ours.delete("mine:1").unwrap();
        assert_eq!(ours.state_hash(), theirs.state_hash(), "seed {seed}");
        // And back again, through the merge just made.
        churn(&mut theirs, &mut rng, 5);
        ours.merge(&theirs).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(ours.state_hash(), theirs.state_hash(), "seed {seed}");
        ours.verify().unwrap();
    }
}

#[test]
fn a_sqlite_session_that_merged_a_history_from_elsewhere_reopens_and_merges_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut main = Context::open(&path, "main").unwrap();
        main.create("order:0", order("zoe", 0)).unwrap();
        // An in-memory context: its commits are not in the file.
        let mut elsewhere = Context::new("elsewhere");
        elsewhere.create("order:e", order("eve", 1)).unwrap();
        main.merge(&elsewhere).unwrap();
        let mut b = main.fork("b").unwrap();
        b.create("order:b", order("bob", 2)).unwrap();
    }
    let mut main = Context::open(&path, "main").unwrap();
    main.verify().unwrap();
    let b = Context::open(&path, "b").unwrap();
    let report = main.merge(&b).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        report.taken.iter().map(|id| id.as_str()).collect::<Vec<_>>(),
        ["order:b"]
    );
    assert_eq!(cents(&main, "order:e"), Some(1));
}
