//! Pruning against the real server: which rows a prune deletes (final ones older than the
//! cut-off, and nothing else), its batches, rows other transactions hold locked, and keys that
//! must never come back (registered again after a prune, or while one runs). Runs when
//! `REACTIFACT_TEST_POSTGRES_URL` is set (see `common`).

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::store::{ClaimRequest, FailedAttempt, OutboxStore, Outcome, Recording};
use reactifact_core::store_contract::{at, new_intents};
use reactifact_core::{ActionKey, Scope};
use reactifact_postgres::{PostgresOutbox, PruneOptions};

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
