//! Pruning, on the stores of this crate (memory and SQLite): `Ledger::prune` deletes old final
//! rows in batches, oldest first, and nothing else (not a row pending, in flight, failed,
//! dead, held or awaiting approval); a pruned key registered again is never registered, claimed
//! or delivered again; a scoped ledger prunes the whole store; `Ledger::prune_every` runs on
//! tokio's paused clock, with a stop in the middle of a pass and `Duration::MAX` /
//! `usize::MAX` from outside. PostgreSQL runs the same through `reactifact-postgres`'s tests.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use reactifact_core::ledger::{DeliveryStatus, Ledger, PruneOptions, StatusCounts};
use reactifact_core::store::{ClaimPolicy, ClaimRequest, FailedAttempt, OutboxStore, Outcome, Recording};
use reactifact_core::{Agent, Context, OpenOptions, Runtime, Scope};
use reactifact_store_contract::{at, ContractHarness, ContractStore, MemoryHarness, SqliteHarness};
use tokio::time::Instant;

const HOUR: Duration = Duration::from_secs(3600);
const MINUTE: Duration = Duration::from_secs(60);

// ---- stores ---------------------------------------------------------------------------------

/// A temporary directory for a store file (in `/dev/shm` where there is one).
fn temp_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    shm.is_dir()
        .then(|| tempfile::tempdir_in(shm).ok())
        .flatten()
        .unwrap_or_else(|| tempfile::tempdir().expect("a temporary directory"))
}

/// Each check, once per store.
macro_rules! on_every_store {
    ($($check:ident),* $(,)?) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test(start_paused = true)]
                async fn $check() {
                    super::$check(&MemoryHarness).await;
                }
            )*
        }
        mod sqlite {
            use super::*;
            $(
                #[tokio::test(start_paused = true)]
                async fn $check() {
                    super::$check(&SqliteHarness).await;
                }
            )*
        }
    };
}

on_every_store!(
    a_prune_deletes_old_final_rows_in_batches_and_nothing_else,
    keep_cancelled_and_max_batches_limit_a_pass,
    batches_take_the_oldest_rows_first,
    a_pruned_key_registered_again_is_never_claimed,
    a_scoped_ledger_prunes_the_whole_store,
    the_largest_batch_and_age_from_outside,
    the_schedule_prunes_rows_as_they_age,
    a_stop_while_a_pass_runs_drops_it_and_keeps_its_batches,
    the_longest_interval_and_pause_from_outside,
);

// ---- helpers --------------------------------------------------------------------------------

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}:{i}")).collect()
}

async fn register(store: &mut dyn ContractStore, session: &str, keys: &[String], now: SystemTime) {
    let pairs: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "email")).collect();
    store.register(session, &pairs, now).await;
}

async fn claim_all(
    outbox: &dyn OutboxStore,
    scope: &Scope,
    who: &str,
    lease: Duration,
    now: SystemTime,
) -> Vec<Recording> {
    let owner: Arc<str> = Arc::from(who);
    let claimed = outbox
        .claim(ClaimRequest {
            scope,
            limit: 10_000,
            owner: &owner,
            lease,
            now,
            policy: ClaimPolicy::none(),
        })
        .await
        .expect("claim");
    claimed
        .claims
        .iter()
        .map(|d| Recording {
            key: d.key().clone(),
            token: d.token(),
            outcome: Outcome::Delivered,
        })
        .collect()
}

/// Claims every due intent of `scope` at `now` and records `outcome` for each at `now`.
async fn settle(outbox: &dyn OutboxStore, scope: &Scope, now: SystemTime, outcome: Outcome) -> usize {
    let mut recordings = claim_all(outbox, scope, "settler", HOUR, now).await;
    for r in &mut recordings {
        r.outcome = outcome.clone();
    }
    outbox.record(&recordings, now).await.expect("record");
    recordings.len()
}

fn tally(c: &StatusCounts) -> [u64; 9] {
    [
        c.delivered,
        c.cancelled,
        c.rejected,
        c.pending,
        c.in_flight,
        c.failed,
        c.dead,
        c.held,
        c.awaiting_approval,
    ]
}

/// A store holding, all last changed long ago (2023) unless said: 10 delivered, 5 cancelled,
/// 2 rejected, 4 pending, 4 in flight (leased for 80 years), 3 failed with a retry, 3 dead,
/// 2 held, 3 awaiting approval, and 3 delivered now (session `r`).
async fn mixed(store: &mut dyn ContractStore) -> Arc<dyn OutboxStore> {
    let o = store.outbox();
    let old = at(0);
    register(store, "a", &keys("delivered", 10), old).await;
    assert_eq!(settle(&*o, &Scope::all(), old, Outcome::Delivered).await, 10);
    register(store, "a", &keys("failed", 3), old).await;
    let next = FailedAttempt::RetryAt(SystemTime::now() + HOUR * 1000);
    let error = "503".to_owned();
    settle(&*o, &Scope::all(), old, Outcome::Failed { error, next }).await;
    register(store, "a", &keys("dead", 3), old).await;
    let (error, next) = ("410".to_owned(), FailedAttempt::Dead);
    settle(&*o, &Scope::all(), old, Outcome::Failed { error, next }).await;
    register(store, "a", &keys("held", 2), old).await;
    let reason = "no route".to_owned();
    settle(&*o, &Scope::all(), old, Outcome::Held { reason }).await;
    register(store, "a", &keys("inflight", 4), old).await;
    let held = claim_all(&*o, &Scope::all(), "holder", HOUR * 24 * 365 * 80, old).await;
    assert_eq!(held.len(), 4);
    register(store, "a", &keys("cancelled", 5), old).await;
    for key in keys("cancelled", 5) {
        o.cancel(&key, "customer left", old).await.expect("cancel");
    }
    let pairs = [("rejected:0", "email"), ("rejected:1", "email")];
    store.register_awaiting("a", &pairs, old).await;
    for (key, _) in pairs {
        o.reject(key, "ops", "too much", old).await.expect("reject");
    }
    let awaiting = keys("awaiting", 3);
    let pairs: Vec<(&str, &str)> = awaiting.iter().map(|k| (k.as_str(), "email")).collect();
    store.register_awaiting("a", &pairs, old).await;
    register(store, "a", &keys("pending", 4), old).await;
    let now = SystemTime::now();
    register(store, "r", &keys("recent", 3), now).await;
    assert_eq!(settle(&*o, &Scope::session("r"), now, Outcome::Delivered).await, 3);
    let counts = o.counts(&Scope::all()).await.unwrap();
    assert_eq!(tally(&counts), [13, 5, 2, 4, 4, 3, 3, 2, 3], "{counts:?}");
    o
}

/// The keys that are not final, each in its status, after any prune.
const UNTOUCHED: [(&str, DeliveryStatus); 7] = [
    ("pending:0", DeliveryStatus::Pending),
    ("inflight:0", DeliveryStatus::InFlight),
    ("failed:0", DeliveryStatus::Failed),
    ("dead:0", DeliveryStatus::Dead),
    ("held:0", DeliveryStatus::Held),
    ("awaiting:0", DeliveryStatus::AwaitingApproval),
    ("recent:0", DeliveryStatus::Delivered),
];

async fn assert_untouched(o: &dyn OutboxStore) {
    for (key, status) in UNTOUCHED {
        let entry = o.get(key).await.unwrap().unwrap_or_else(|| panic!("{key} was pruned"));
        assert_eq!(entry.status(), status, "{key}");
    }
}

// ---- one pass -------------------------------------------------------------------------------

async fn a_prune_deletes_old_final_rows_in_batches_and_nothing_else(h: &dyn ContractHarness) {
    let mut store = h.fresh().await;
    let o = mixed(&mut *store).await;
    let ledger = Ledger::new(o.clone());
    let report = ledger.prune(&PruneOptions::older_than(HOUR).batch(4)).await.unwrap();
    // 10 delivered, 5 cancelled and 2 rejected, old: four full batches and one of 1.
    assert_eq!((report.deleted, report.batches, report.complete), (17, 5, true));
    let counts = o.counts(&Scope::all()).await.unwrap();
    assert_eq!(tally(&counts), [3, 0, 0, 4, 4, 3, 3, 2, 3], "{counts:?}");
    for key in ["delivered:0", "delivered:9", "cancelled:0", "rejected:1"] {
        assert!(o.get(key).await.unwrap().is_none(), "{key} was pruned");
        assert!(o.attempts(key).await.unwrap().is_none(), "{key}'s history went with it");
    }
    assert_untouched(&*o).await;
    // Nothing old and final is left: the next pass is one empty batch.
    let again = ledger.prune(&PruneOptions::older_than(HOUR)).await.unwrap();
    assert_eq!((again.deleted, again.batches, again.complete), (0, 1, true));
}

async fn keep_cancelled_and_max_batches_limit_a_pass(h: &dyn ContractHarness) {
    let mut store = h.fresh().await;
    let o = mixed(&mut *store).await;
    let ledger = Ledger::new(o.clone());
    let options = PruneOptions::older_than(HOUR).keep_cancelled().batch(3);
    let first = ledger.prune(&options.clone().max_batches(2)).await.unwrap();
    assert_eq!((first.deleted, first.batches, first.complete), (6, 2, false));
    let rest = ledger.prune(&options).await.unwrap();
    // 4 old delivered rows left: one full batch and one of 1.
    assert_eq!((rest.deleted, rest.batches, rest.complete), (4, 2, true));
    let counts = o.counts(&Scope::all()).await.unwrap();
    assert_eq!(
        (counts.delivered, counts.cancelled, counts.rejected),
        (3, 5, 2),
        "{counts:?}"
    );
    assert_untouched(&*o).await;
    // Without `keep_cancelled` they go too.
    let all = ledger.prune(&PruneOptions::older_than(HOUR)).await.unwrap();
    assert_eq!(all.deleted, 7);
}

async fn batches_take_the_oldest_rows_first(h: &dyn ContractHarness) {
    let mut store = h.fresh().await;
    let o = store.outbox();
    // Registered in one order, made final in another: the prune follows the last change.
    register(&mut *store, "a", &keys("k", 4), at(0)).await;
    let mut claims = claim_all(&*o, &Scope::all(), "d", HOUR, at(1)).await;
    let finished_at = [40, 10, 30, 20]; // k:1 first, then k:3, k:2, k:0
    for (recording, ms) in claims.drain(..).zip(finished_at) {
        o.record(&[recording], at(ms)).await.expect("record");
    }
    let ledger = Ledger::new(o.clone());
    let left = |n| {
        let o = o.clone();
        async move {
            let mut left = Vec::new();
            for key in keys("k", 4) {
                if o.get(&key).await.unwrap().is_some() {
                    left.push(key);
                }
            }
            assert_eq!(left.len(), n);
            left
        }
    };
    let one = PruneOptions::older_than(HOUR).batch(1).max_batches(1);
    ledger.prune(&one).await.unwrap();
    assert_eq!(left(3).await, ["k:0", "k:2", "k:3"]);
    ledger.prune(&one.clone().batch(2)).await.unwrap();
    assert_eq!(left(1).await, ["k:0"]);
}

async fn a_pruned_key_registered_again_is_never_claimed(h: &dyn ContractHarness) {
    let mut store = h.fresh().await;
    let o = store.outbox();
    let receipts = keys("receipt", 20);
    register(&mut *store, "a", &receipts, at(0)).await;
    settle(&*o, &Scope::all(), at(0), Outcome::Delivered).await;
    let cancelled = keys("cancelled", 5);
    register(&mut *store, "a", &cancelled, at(0)).await;
    for key in &cancelled {
        o.cancel(key, "no", at(1)).await.unwrap();
    }
    let report = Ledger::new(o.clone())
        .prune(&PruneOptions::older_than(HOUR))
        .await
        .unwrap();
    assert_eq!(report.deleted, 25);

    // A retry, a replay or another session re-derives the same intents, now and later.
    let now = SystemTime::now();
    register(&mut *store, "a", &receipts, now).await;
    register(&mut *store, "b", &receipts, now).await;
    register(&mut *store, "b", &cancelled, now + HOUR).await;
    let pairs: Vec<(&str, &str)> = receipts.iter().map(|k| (k.as_str(), "email")).collect();
    store.register_awaiting("c", &pairs, now).await;
    let counts = o.counts(&Scope::all()).await.unwrap();
    assert_eq!(counts, StatusCounts::default(), "{counts:?}");
    assert!(claim_all(&*o, &Scope::all(), "late", HOUR, now + HOUR * 24)
        .await
        .is_empty());
    assert!(o.get("receipt:0").await.unwrap().is_none());
}

async fn a_scoped_ledger_prunes_the_whole_store(h: &dyn ContractHarness) {
    let mut store = h.fresh().await;
    let o = store.outbox();
    register(&mut *store, "a", &keys("a", 3), at(0)).await;
    register(&mut *store, "b", &keys("b", 4), at(0)).await;
    settle(&*o, &Scope::all(), at(0), Outcome::Delivered).await;
    let scoped = Ledger::new(o.clone()).session("a");
    assert_eq!(scoped.len().await.unwrap(), 3);
    // The scope narrows what the handle counts and lists, not what a prune deletes.
    let report = scoped.prune(&PruneOptions::older_than(HOUR)).await.unwrap();
    assert_eq!(report.deleted, 7);
    assert_eq!(o.counts(&Scope::all()).await.unwrap().total(), 0);
}

async fn the_largest_batch_and_age_from_outside(h: &dyn ContractHarness) {
    let mut store = h.fresh().await;
    let o = mixed(&mut *store).await;
    let ledger = Ledger::new(o.clone());
    // An age past the clock's reach: the cut-off is the epoch, nothing is that old.
    let none = ledger.prune(&PruneOptions::older_than(Duration::MAX)).await.unwrap();
    assert_eq!(none.before, SystemTime::UNIX_EPOCH);
    assert_eq!((none.deleted, none.batches, none.complete), (0, 1, true));
    // The largest batch and batch count: one batch takes every old final row, and is short.
    let options = PruneOptions::older_than(HOUR)
        .batch(usize::MAX)
        .max_batches(u64::MAX)
        .pause(Duration::MAX);
    let start = Instant::now();
    let all = ledger.prune(&options).await.unwrap();
    assert_eq!((all.deleted, all.batches, all.complete), (17, 1, true));
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "a short first batch ends the pass: no pause"
    );
    assert_untouched(&*o).await;
    // An age of zero, an hour on: the recent rows too, and still nothing that is not final.
    tokio::time::advance(HOUR).await;
    let zero = ledger.prune(&PruneOptions::older_than(Duration::ZERO)).await.unwrap();
    assert_eq!((zero.deleted, zero.batches, zero.complete), (3, 1, true));
    for (key, status) in &UNTOUCHED[..UNTOUCHED.len() - 1] {
        assert_eq!(o.get(key).await.unwrap().expect(key).status(), *status, "{key}");
    }
    assert!(o.get("recent:0").await.unwrap().is_none());
}

// ---- the schedule ---------------------------------------------------------------------------

/// Old rows, made final at `at(ms)` (2023).
async fn old_delivered(store: &mut dyn ContractStore, n: usize) -> Arc<dyn OutboxStore> {
    let o = store.outbox();
    register(store, "a", &keys("old", n), at(0)).await;
    assert_eq!(settle(&*o, &Scope::all(), at(0), Outcome::Delivered).await, n);
    o
}

async fn the_schedule_prunes_rows_as_they_age(h: &dyn ContractHarness) {
    let mut store = h.fresh().await;
    let o = old_delivered(&mut *store, 5).await;
    let ledger = Ledger::new(o.clone());
    let (start, began) = (Instant::now(), SystemTime::now());
    let summary = {
        // Rows delivered at 25 min (by the process clock, which the paused clock moves).
        let (o, mut store) = (o.clone(), store);
        let deliver_later = async move {
            tokio::time::sleep(25 * MINUTE).await;
            // The process clock stood at about the system clock's time when the test began.
            let now = began + 25 * MINUTE;
            register(&mut *store, "b", &keys("new", 3), now).await;
            settle(&*o, &Scope::session("b"), now, Outcome::Delivered).await;
            std::future::pending::<()>().await
        };
        let pruner = ledger.prune_every(
            10 * MINUTE,
            PruneOptions::older_than(HOUR).batch(2),
            tokio::time::sleep(95 * MINUTE),
        );
        tokio::select! {
            summary = pruner => summary,
            () = deliver_later => unreachable!(),
        }
    };
    assert_eq!(start.elapsed(), 95 * MINUTE);
    // Passes at 0, 10, …, 90 min: the first took the old rows; the rows of 25 min are not an
    // hour old at 80 min, and are at 90 (cut-off 30 min).
    assert_eq!(
        (summary.passes, summary.failed, summary.deleted),
        (10, 0, 8),
        "{summary:?}"
    );
    assert_eq!(o.counts(&Scope::all()).await.unwrap().total(), 0);
}

async fn a_stop_while_a_pass_runs_drops_it_and_keeps_its_batches(h: &dyn ContractHarness) {
    let mut store = h.fresh().await;
    let o = old_delivered(&mut *store, 10).await;
    let ledger = Ledger::new(o.clone());
    let start = Instant::now();
    // Batches of 2 at 0, 10 and 20 s; the stop at 25 s comes during the pause after the third.
    let options = PruneOptions::older_than(HOUR).batch(2).pause(Duration::from_secs(10));
    let summary = ledger
        .prune_every(HOUR, options.clone(), tokio::time::sleep(Duration::from_secs(25)))
        .await;
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(25),
        "the stop ended the pass at once"
    );
    assert_eq!((summary.passes, summary.failed), (0, 0), "the pass never ended");
    assert_eq!(summary.deleted, 6, "the batches committed before the stop count");
    assert_eq!(o.counts(&Scope::all()).await.unwrap().delivered, 4);
    // The next pass takes the rest.
    let rest = ledger.prune(&options.pause(Duration::ZERO)).await.unwrap();
    assert_eq!((rest.deleted, rest.complete), (4, true));
}

async fn the_longest_interval_and_pause_from_outside(h: &dyn ContractHarness) {
    let mut store = h.fresh().await;
    let o = old_delivered(&mut *store, 3).await;
    let ledger = Ledger::new(o.clone());
    let start = Instant::now();
    // One row a batch, and a pause too long for the clock: the first pass takes one row and
    // waits; an interval too long for the clock: no second pass. The stop ends both.
    let options = PruneOptions::older_than(HOUR).batch(1).pause(Duration::MAX);
    let summary = ledger
        .prune_every(Duration::MAX, options, tokio::time::sleep(HOUR * 24 * 365))
        .await;
    assert_eq!(start.elapsed(), HOUR * 24 * 365);
    assert_eq!(
        (summary.passes, summary.failed, summary.deleted),
        (0, 0, 1),
        "{summary:?}"
    );
    // A whole pass, then nothing for a year.
    let start = Instant::now();
    let summary = ledger
        .prune_every(
            Duration::MAX,
            PruneOptions::older_than(HOUR),
            tokio::time::sleep(HOUR * 24 * 365),
        )
        .await;
    assert_eq!(start.elapsed(), HOUR * 24 * 365);
    assert_eq!(
        (summary.passes, summary.failed, summary.deleted),
        (1, 0, 2),
        "{summary:?}"
    );
}

/// A store whose purge never waits (memory) still leaves the executor to other tasks between
/// batches: a stop sent by another task while a long pass runs is seen at the next batch.
#[tokio::test(start_paused = true)]
async fn memory_a_long_pass_leaves_the_executor_to_a_stop_between_batches() {
    let mut store = MemoryHarness.fresh().await;
    let o = old_delivered(&mut *store, 100).await;
    let ledger = Ledger::new(o.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let pruner = tokio::spawn(async move {
        let options = PruneOptions::older_than(HOUR).batch(1);
        ledger
            .prune_every(HOUR, options, async {
                let _ = stopped.await;
            })
            .await
    });
    // The pruner starts its pass; the stop goes as soon as this task runs again.
    tokio::task::yield_now().await;
    stop.send(()).unwrap();
    let summary = pruner.await.unwrap();
    assert_eq!(summary.passes, 0, "{summary:?}");
    assert!(summary.deleted < 100, "{summary:?}");
    let left = o.counts(&Scope::all()).await.unwrap().delivered;
    assert_eq!(left, 100 - summary.deleted);
}

// ---- SQLite: a store the prune cannot write -------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_read_only_store_fails_each_pass_and_the_schedule_goes_on() {
    let dir = temp_dir();
    let path = dir.path().join("state.db");
    commit_orders(&path, "orders", 1..=3).await;
    let ctx = Context::open_with(&path, "orders", OpenOptions::new().read_only(true)).unwrap();
    let ledger = ctx.ledger();
    assert_eq!(ledger.pending().await.unwrap(), 3);
    assert!(ledger.prune(&PruneOptions::older_than(Duration::ZERO)).await.is_err());
    let start = Instant::now();
    let summary = ledger
        .prune_every(
            Duration::from_secs(10),
            PruneOptions::older_than(Duration::ZERO),
            tokio::time::sleep(Duration::from_secs(35)),
        )
        .await;
    assert_eq!(start.elapsed(), Duration::from_secs(35));
    assert_eq!(
        (summary.passes, summary.failed, summary.deleted),
        (0, 4, 0),
        "{summary:?}"
    );
    assert_eq!(ledger.pending().await.unwrap(), 3);
}

// ---- end to end: a runtime's deliveries, pruned, never sent again ---------------------------

/// Delivers orders 1–5 at 0 min, prunes every 10 minutes what is an hour old, delivers order 6
/// at 30 min; then a branch forked before the deliveries re-derives every key: nothing is sent
/// again, neither the pruned keys nor the delivered one.
async fn a_runtime_never_sends_a_pruned_key_again(ctx: Context) {
    let mut branch = ctx.fork("replay").unwrap();
    let recorder = Recorder::default();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(recorder.sent().len(), 5);
    let ledger = rt.context().ledger();
    let start = Instant::now();
    let pruner = {
        let ledger = ledger.clone();
        let options = PruneOptions::older_than(HOUR).batch(2);
        tokio::spawn(async move {
            ledger
                .prune_every(10 * MINUTE, options, tokio::time::sleep(85 * MINUTE))
                .await
        })
    };
    tokio::time::sleep(30 * MINUTE).await;
    rt.context_mut().create("order:6", order("grace", 6)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(recorder.sent().len(), 6);
    let summary = pruner.await.unwrap();
    assert_eq!(start.elapsed(), 85 * MINUTE);
    // Passes at 0, 10, …, 80 min; at 70 the first five are an hour old, order 6 never is.
    assert_eq!(
        (summary.passes, summary.failed, summary.deleted),
        (9, 0, 5),
        "{summary:?}"
    );
    for i in 1..=5 {
        let key = format!("notify:order:{i}");
        assert!(ledger.get(&key).await.unwrap().is_none(), "{key} was pruned");
    }
    let six = ledger.get("notify:order:6").await.unwrap().unwrap();
    assert_eq!(six.status(), DeliveryStatus::Delivered);

    // The branch changes every order: its produce acts every key again.
    for i in 1..=6 {
        branch.create(format!("order:{i}"), order("eve", 100 + i)).unwrap();
    }
    let again = Recorder::default();
    let mut replay = Runtime::builder(branch)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(again.dispatcher())
        .build()
        .unwrap();
    replay.run().await.unwrap();
    assert!(again.sent().is_empty(), "sent again: {:?}", again.sent());
    assert_eq!(ledger.counts().await.unwrap().total(), 1);
    // The branch's own state moved on: its receipts are rewritten, only the sending is not.
    let receipt = replay.context().get::<Receipt>("receipt:order:1").unwrap().unwrap();
    assert_eq!(receipt.data.total_cents, 101);
}

#[tokio::test(start_paused = true)]
async fn memory_a_runtime_never_sends_a_pruned_key_again() {
    let ctx = seeded((1..=5).map(|i| (format!("order:{i}"), order("ada", i))));
    a_runtime_never_sends_a_pruned_key_again(ctx).await;
}

#[tokio::test(start_paused = true)]
async fn sqlite_a_runtime_never_sends_a_pruned_key_again() {
    let dir = temp_dir();
    let mut ctx = Context::open(dir.path().join("state.db"), "orders").unwrap();
    let mut tx = ctx.transaction();
    for i in 1..=5 {
        tx.create(format!("order:{i}"), order("ada", i));
    }
    tx.commit().unwrap();
    a_runtime_never_sends_a_pruned_key_again(ctx).await;
}
