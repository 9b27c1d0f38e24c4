//! Pruning against the real server: which rows a prune deletes (final ones older than the
//! cut-off, and nothing else: never a row awaiting approval), its batches, rows other
//! transactions hold locked, keys that must never come back (registered again after a prune,
//! or while one runs), the core's `Ledger` over this store, and the schedule with its stop.
//! The pruning itself is the core's (`reactifact-core/tests/prune.rs` runs it on memory and
//! SQLite, the schedule on the paused clock). Runs when `REACTIFACT_TEST_POSTGRES_URL` is set
//! (see `common`).

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reactifact_core::ledger::{DeliveryStatus, Ledger};
use reactifact_core::store::{ClaimPolicy, ClaimRequest, FailedAttempt, OutboxStore, Outcome, Recording};
use reactifact_core::{ActionKey, Scope};
use reactifact_postgres::{PostgresOutbox, PruneOptions, PruneSummary};
use reactifact_store_contract::{approval_intents, at, new_intents};

use common::Schemas;

const HOUR: Duration = Duration::from_secs(3600);

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}:{i}")).collect()
}

async fn register(outbox: &PostgresOutbox, session: &str, generation: u64, keys: &[String], now: SystemTime) {
    let pairs: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "email")).collect();
    outbox
        .register_alone(&new_intents(session, generation, &pairs), now)
        .await
        .expect("register");
}

/// Claims every due intent (at most `limit`) at `now` and records `outcome` for each at `now`.
async fn settle_with(outbox: &PostgresOutbox, limit: usize, now: SystemTime, outcome: Outcome) -> Vec<ActionKey> {
    let owner: Arc<str> = Arc::from("pruner-test");
    let claimed = outbox
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit,
            owner: &owner,
            lease: HOUR * 1000,
            now,
            policy: ClaimPolicy::none(),
        })
        .await
        .expect("claim");
    let recordings: Vec<Recording> = claimed
        .claims
        .iter()
        .map(|d| Recording {
            key: d.key().clone(),
            token: d.token(),
            outcome: outcome.clone(),
        })
        .collect();
    outbox.record(&recordings, now).await.expect("record");
    claimed.claims.iter().map(|d| d.key().clone()).collect()
}

/// A store holding, all last changed long ago unless said: 1,000 delivered, 300 cancelled,
/// 200 pending, 200 in flight (leased for 80 years), 100 failed with a retry, 100 dead, 50 held,
/// and 150 delivered just now.
async fn mixed(outbox: &PostgresOutbox) {
    let old = at(0);
    register(outbox, "a", 1, &keys("delivered", 1000), old).await;
    assert_eq!(settle_with(outbox, 2000, old, Outcome::Delivered).await.len(), 1000);
    register(outbox, "a", 2, &keys("failed", 100), old).await;
    let next = FailedAttempt::RetryAt(SystemTime::now() + HOUR * 1000);
    settle_with(
        outbox,
        2000,
        old,
        Outcome::Failed {
            error: "503".into(),
            next,
        },
    )
    .await;
    register(outbox, "a", 3, &keys("dead", 100), old).await;
    settle_with(
        outbox,
        2000,
        old,
        Outcome::Failed {
            error: "410".into(),
            next: FailedAttempt::Dead,
        },
    )
    .await;
    register(outbox, "a", 4, &keys("held", 50), old).await;
    settle_with(
        outbox,
        2000,
        old,
        Outcome::Held {
            reason: "no route".into(),
        },
    )
    .await;
    register(outbox, "a", 5, &keys("inflight", 200), old).await;
    let owner: Arc<str> = Arc::from("holder");
    let held = outbox
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit: 1000,
            owner: &owner,
            // Past the year 2100: still held when the test runs.
            lease: HOUR * 24 * 365 * 80,
            now: old,
            policy: ClaimPolicy::none(),
        })
        .await
        .expect("claim");
    assert_eq!(held.claims.len(), 200);
    register(outbox, "a", 6, &keys("cancelled", 300), old).await;
    for key in keys("cancelled", 300) {
        outbox.cancel(&key, "customer left", old).await.expect("cancel");
    }
    register(outbox, "a", 7, &keys("pending", 200), old).await;
    // Session `r`, delivered just now (claimed in its own scope: the pending rows stay).
    register(outbox, "r", 8, &keys("recent", 150), SystemTime::now()).await;
    let owner: Arc<str> = Arc::from("recent");
    let claimed = outbox
        .claim(ClaimRequest {
            scope: &Scope::session("r"),
            limit: 1000,
            owner: &owner,
            lease: HOUR,
            now: SystemTime::now(),
            policy: ClaimPolicy::none(),
        })
        .await
        .expect("claim");
    assert_eq!(claimed.claims.len(), 150);
    let recordings: Vec<Recording> = claimed
        .claims
        .iter()
        .map(|d| Recording {
            key: d.key().clone(),
            token: d.token(),
            outcome: Outcome::Delivered,
        })
        .collect();
    outbox.record(&recordings, SystemTime::now()).await.expect("record");
    let counts = outbox.counts(&Scope::all()).await.unwrap();
    assert_eq!(
        (
            counts.delivered,
            counts.cancelled,
            counts.pending,
            counts.in_flight,
            counts.failed,
            counts.dead,
            counts.held
        ),
        (1150, 300, 200, 200, 100, 100, 50),
        "{counts:?}"
    );
}

#[tokio::test]
async fn a_prune_deletes_old_final_rows_in_batches_and_nothing_else() {
    let Some(url) = common::url("a_prune_deletes_old_final_rows_in_batches_and_nothing_else") else {
        return;
    };
    let schemas = Schemas::new(&url, "prune_mix");
    let outbox = schemas.open().await;
    mixed(&outbox).await;

    let report = outbox
        .prune(&PruneOptions::older_than(HOUR).batch(250))
        .await
        .expect("prune");
    // 1,000 delivered and 300 cancelled, old: five full batches of 250 and a sixth of 50.
    assert_eq!(report.deleted, 1300);
    assert_eq!(report.batches, 6);
    assert!(report.complete);
    let counts = outbox.counts(&Scope::all()).await.unwrap();
    assert_eq!(
        (
            counts.delivered,
            counts.cancelled,
            counts.pending,
            counts.in_flight,
            counts.failed,
            counts.dead,
            counts.held
        ),
        (150, 0, 200, 200, 100, 100, 50),
        "{counts:?}"
    );
    for key in ["delivered:0", "delivered:999", "cancelled:0"] {
        assert!(outbox.get(key).await.unwrap().is_none(), "{key} was pruned");
    }
    for (key, status) in [
        ("recent:0", DeliveryStatus::Delivered),
        ("pending:0", DeliveryStatus::Pending),
        ("inflight:0", DeliveryStatus::InFlight),
        ("failed:0", DeliveryStatus::Failed),
        ("dead:0", DeliveryStatus::Dead),
        ("held:0", DeliveryStatus::Held),
    ] {
        assert_eq!(outbox.get(key).await.unwrap().expect(key).status(), status, "{key}");
    }

    // Nothing old and final is left: the next pass is one empty batch.
    let again = outbox.prune(&PruneOptions::older_than(HOUR)).await.unwrap();
    assert_eq!((again.deleted, again.batches, again.complete), (0, 1, true));
}

#[tokio::test]
async fn keep_cancelled_and_max_batches_limit_a_pass() {
    let Some(url) = common::url("keep_cancelled_and_max_batches_limit_a_pass") else {
        return;
    };
    let schemas = Schemas::new(&url, "prune_opts");
    let outbox = schemas.open().await;
    mixed(&outbox).await;

    let first = outbox
        .prune(
            &PruneOptions::older_than(HOUR)
                .keep_cancelled()
                .batch(300)
                .max_batches(2),
        )
        .await
        .unwrap();
    assert_eq!((first.deleted, first.batches, first.complete), (600, 2, false));
    let rest = outbox
        .prune(&PruneOptions::older_than(HOUR).keep_cancelled().batch(300))
        .await
        .unwrap();
    // 400 delivered rows left: one full batch and one of 100.
    assert_eq!((rest.deleted, rest.batches, rest.complete), (400, 2, true));
    let counts = outbox.counts(&Scope::all()).await.unwrap();
    assert_eq!((counts.delivered, counts.cancelled), (150, 300), "{counts:?}");
    assert_eq!(
        outbox.get("cancelled:7").await.unwrap().unwrap().status(),
        DeliveryStatus::Cancelled
    );
}

#[tokio::test]
async fn a_pruned_key_registered_again_is_never_delivered_again() {
    let Some(url) = common::url("a_pruned_key_registered_again_is_never_delivered_again") else {
        return;
    };
    let schemas = Schemas::new(&url, "prune_back");
    let outbox = schemas.open().await;
    let delivered = keys("receipt", 100);
    register(&outbox, "a", 1, &delivered, at(0)).await;
    settle_with(&outbox, 1000, at(0), Outcome::Delivered).await;
    let report = outbox.prune(&PruneOptions::older_than(HOUR)).await.unwrap();
    assert_eq!(report.deleted, 100);

    // A retry, a replay or another session re-derives the same intents.
    register(&outbox, "a", 1, &delivered, SystemTime::now()).await;
    register(&outbox, "b", 9, &delivered, SystemTime::now()).await;
    let counts = outbox.counts(&Scope::all()).await.unwrap();
    assert_eq!(counts, reactifact_core::ledger::StatusCounts::default(), "{counts:?}");
    let owner: Arc<str> = Arc::from("late");
    let claimed = outbox
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit: 1000,
            owner: &owner,
            lease: HOUR,
            now: SystemTime::now() + HOUR,
            policy: ClaimPolicy::none(),
        })
        .await
        .unwrap();
    assert!(claimed.claims.is_empty(), "{:?}", claimed.claims);
}

#[tokio::test]
async fn a_row_another_transaction_holds_is_skipped_not_waited_for() {
    let Some(url) = common::url("a_row_another_transaction_holds_is_skipped_not_waited_for") else {
        return;
    };
    let schemas = Schemas::new(&url, "prune_lock");
    let outbox = schemas.open().await;
    register(&outbox, "a", 1, &keys("k", 10), at(0)).await;
    settle_with(&outbox, 100, at(0), Outcome::Delivered).await;

    // Another connection locks one delivered row and keeps its transaction open.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    let driver = tokio::spawn(connection);
    let s = format!("\"{}\"", outbox.schema());
    client.batch_execute("BEGIN").await.unwrap();
    client
        .execute(&format!("SELECT 1 FROM {s}.outbox WHERE key = 'k:3' FOR UPDATE"), &[])
        .await
        .unwrap();
    // The prune neither waits for it nor fails: it takes the other nine.
    let report = tokio::time::timeout(Duration::from_secs(60), outbox.prune(&PruneOptions::older_than(HOUR)))
        .await
        .expect("a prune does not wait for a locked row")
        .unwrap();
    assert_eq!(report.deleted, 9);
    client.batch_execute("COMMIT").await.unwrap();
    let later = outbox.prune(&PruneOptions::older_than(HOUR)).await.unwrap();
    assert_eq!(later.deleted, 1);
    assert!(outbox.get("k:3").await.unwrap().is_none());
    drop(client);
    let _ = driver.await;
}

/// How many backends of the test database wait for a lock, from `pg_stat_activity`.
async fn lock_waiters(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn wait_for_waiters(client: &tokio_postgres::Client, n: i64) {
    // Bounded poll of the server's own view: the synchronisation is the lock wait.
    for _ in 0..2000 {
        if lock_waiters(client).await >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{n} backends never waited for a lock");
}

/// A registration of a key while a prune of that key is running (its row locked by the prune,
/// the prune not committed): the registration waits for the prune, then finds no row (its
/// snapshot did not see the tombstone either). It must still not register the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_registered_while_its_prune_runs_does_not_come_back() {
    let Some(url) = common::url("a_key_registered_while_its_prune_runs_does_not_come_back") else {
        return;
    };
    let schemas = Schemas::new(&url, "prune_race");
    let outbox = schemas.open().await;
    register(&outbox, "a", 1, &["race:1".to_owned()], at(0)).await;
    settle_with(&outbox, 10, at(0), Outcome::Delivered).await;
    let s = format!("\"{}\"", outbox.schema());

    // Hold the prune inside its transaction: a third connection has inserted the key's
    // tombstone, uncommitted, so the prune's own tombstone insert waits for it, after the prune
    // has locked the row.
    let (blocker, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    let blocker_driver = tokio::spawn(connection);
    let (watcher, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    let watcher_driver = tokio::spawn(connection);
    let waiting_before = lock_waiters(&watcher).await;
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .execute(
            &format!("INSERT INTO {s}.outbox_purged (key, purged_at) VALUES ('race:1', 0)"),
            &[],
        )
        .await
        .unwrap();
    let pruner = {
        let outbox = outbox.clone();
        tokio::spawn(async move { outbox.prune(&PruneOptions::older_than(HOUR)).await })
    };
    wait_for_waiters(&watcher, waiting_before + 1).await;
    let registrar = {
        let outbox = outbox.clone();
        tokio::spawn(async move {
            let pairs = [("race:1", "email")];
            outbox
                .register_alone(&new_intents("b", 2, &pairs), SystemTime::now())
                .await
        })
    };
    wait_for_waiters(&watcher, waiting_before + 2).await;
    // Let the prune go on (its tombstone insert no longer conflicts), and commit.
    blocker.batch_execute("ROLLBACK").await.unwrap();
    let report = pruner.await.unwrap().expect("the prune");
    assert_eq!(report.deleted, 1);
    registrar.await.unwrap().expect("the registration");

    assert!(
        outbox.get("race:1").await.unwrap().is_none(),
        "a pruned key was registered again: {:?}",
        outbox.get("race:1").await.unwrap()
    );
    let counts = outbox.counts(&Scope::all()).await.unwrap();
    assert_eq!(counts.pending, 0, "{counts:?}");
    drop((blocker, watcher));
    let _ = (blocker_driver.await, watcher_driver.await);
}

/// Rows awaiting approval are never pruned; a rejected row is final and pruned with the
/// cancelled ones (kept by `keep_cancelled`).
#[tokio::test]
async fn rows_awaiting_approval_stay_and_rejected_rows_go_with_the_cancelled() {
    let Some(url) = common::url("rows_awaiting_approval_stay_and_rejected_rows_go_with_the_cancelled") else {
        return;
    };
    let schemas = Schemas::new(&url, "prune_approval");
    let outbox = schemas.open().await;
    let awaiting = [("ask:0", "email"), ("ask:1", "email"), ("no:0", "email")];
    outbox
        .register_alone(&approval_intents("a", 1, &awaiting), at(0))
        .await
        .unwrap();
    outbox.reject("no:0", "ops", "too much", at(0)).await.unwrap();
    register(&outbox, "a", 2, &keys("sent", 4), at(0)).await;
    settle_with(&outbox, 100, at(0), Outcome::Delivered).await;

    let kept = outbox
        .prune(&PruneOptions::older_than(HOUR).keep_cancelled())
        .await
        .unwrap();
    assert_eq!(kept.deleted, 4);
    assert_eq!(
        outbox.get("no:0").await.unwrap().unwrap().status(),
        DeliveryStatus::Rejected
    );
    let all = outbox.prune(&PruneOptions::older_than(HOUR)).await.unwrap();
    assert_eq!(all.deleted, 1);
    assert!(outbox.get("no:0").await.unwrap().is_none());
    for key in ["ask:0", "ask:1"] {
        let entry = outbox.get(key).await.unwrap().expect(key);
        assert_eq!(entry.status(), DeliveryStatus::AwaitingApproval, "{key}");
    }
    // The rejected key, asked again, is not asked again.
    outbox
        .register_alone(&approval_intents("b", 3, &[("no:0", "email")]), SystemTime::now())
        .await
        .unwrap();
    assert!(outbox.get("no:0").await.unwrap().is_none());
}

/// The core's `Ledger` over a PostgreSQL outbox prunes as `PostgresOutbox::prune` does (it is
/// the same code), for the whole store whatever its scope, and `usize::MAX` rows a batch and an
/// age of `Duration::MAX` from outside are taken as they are.
#[tokio::test]
async fn the_core_ledger_prunes_a_postgres_store_and_takes_extremes_from_outside() {
    let Some(url) = common::url("the_core_ledger_prunes_a_postgres_store_and_takes_extremes_from_outside") else {
        return;
    };
    let schemas = Schemas::new(&url, "prune_ledger");
    let outbox = schemas.open().await;
    mixed(&outbox).await;
    let ledger = Ledger::new(outbox.clone()).session("nobody");
    let none = ledger.prune(&PruneOptions::older_than(Duration::MAX)).await.unwrap();
    assert_eq!(none.before, SystemTime::UNIX_EPOCH);
    assert_eq!((none.deleted, none.batches, none.complete), (0, 1, true));
    let options = PruneOptions::older_than(HOUR)
        .batch(usize::MAX)
        .max_batches(u64::MAX)
        .pause(Duration::MAX);
    let all = ledger.prune(&options).await.unwrap();
    // One batch takes the 1,000 delivered and 300 cancelled rows, and is short: no pause.
    assert_eq!((all.deleted, all.batches, all.complete), (1300, 1, true));
    let counts = outbox.counts(&Scope::all()).await.unwrap();
    assert_eq!(
        (
            counts.delivered,
            counts.pending,
            counts.in_flight,
            counts.failed,
            counts.dead,
            counts.held
        ),
        (150, 200, 200, 100, 100, 50),
        "{counts:?}"
    );
}

/// Polls the server (bounded) until `outbox` holds `delivered` delivered rows.
async fn until_delivered(outbox: &PostgresOutbox, delivered: u64) {
    for _ in 0..4000 {
        if outbox.counts(&Scope::all()).await.unwrap().delivered == delivered {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the outbox never held {delivered} delivered rows");
}

/// `PostgresOutbox::prune_every` runs the core's schedule on the server: a stop already given
/// runs no pass; a pass prunes the old rows; a stop during a pause between batches drops the
/// pass and keeps what its batches deleted.
#[tokio::test]
async fn the_schedule_prunes_on_the_server_until_stopped() {
    let Some(url) = common::url("the_schedule_prunes_on_the_server_until_stopped") else {
        return;
    };
    let schemas = Schemas::new(&url, "prune_every");
    let outbox = schemas.open().await;
    register(&outbox, "a", 1, &keys("k", 300), at(0)).await;
    settle_with(&outbox, 1000, at(0), Outcome::Delivered).await;

    let summary = outbox
        .prune_every(Duration::ZERO, PruneOptions::older_than(HOUR), std::future::ready(()))
        .await;
    assert_eq!(summary, PruneSummary::default());
    assert_eq!(outbox.counts(&Scope::all()).await.unwrap().delivered, 300);

    // Batches of 100 with a pause longer than the test: the first batch commits, then the
    // pass waits, and the stop comes while it does.
    let options = PruneOptions::older_than(HOUR).batch(100).pause(HOUR * 24);
    let summary = outbox
        .prune_every(Duration::MAX, options, until_delivered(&outbox, 200))
        .await;
    assert_eq!((summary.passes, summary.failed), (0, 0), "{summary:?}");
    assert!(summary.deleted <= 100, "{summary:?}");
    assert_eq!(outbox.counts(&Scope::all()).await.unwrap().delivered, 200);

    // Every millisecond, until the rest is gone: no pass fails.
    let summary = outbox
        .prune_every(
            Duration::from_millis(1),
            PruneOptions::older_than(HOUR).batch(60),
            until_delivered(&outbox, 0),
        )
        .await;
    assert_eq!(summary.failed, 0, "{summary:?}");
    assert!(summary.deleted >= 140 && summary.deleted <= 200, "{summary:?}");
    assert!(outbox.get("k:299").await.unwrap().is_none());
}
