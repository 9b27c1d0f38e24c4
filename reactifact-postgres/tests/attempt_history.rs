//! The attempt history of the PostgreSQL outbox with a process of the previous build
//! (schema 2) still writing after the migration, and a record racing a reclaim.

mod common;

use std::sync::Arc;
use std::time::Duration;

use reactifact_core::ledger::{AttemptOutcome, FenceToken, PurgeFilter};
use reactifact_core::store::{ClaimPolicy, ClaimRequest, FailedAttempt, OutboxStore, Outcome, Recording};
use reactifact_core::{ActionKey, Scope};
use reactifact_postgres::{PostgresOptions, PostgresOutbox};
use reactifact_store_contract::{at, new_intents};

use common::Schemas;

async fn claim(o: &PostgresOutbox, owner: &str, limit: usize, now: u64) -> reactifact_core::store::Claimed {
    let owner: Arc<str> = Arc::from(owner);
    o.claim(ClaimRequest {
        scope: &Scope::all(),
        limit,
        owner: &owner,
        lease: Duration::from_secs(60),
        now: at(now),
        policy: ClaimPolicy::none(),
    })
    .await
    .unwrap()
}

async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// A schema-2 process's claim sets only the digested columns: `claim_*` keep an earlier
/// claim's values (emulated by putting them back); the delivered attempt must not be shown
/// with another attempt's owner, claim time and lease.
#[tokio::test]
async fn a_delivery_claimed_by_an_older_build_never_shows_another_attempt_s_owner() {
    let Some(url) = common::url("a_delivery_claimed_by_an_older_build_never_shows_another_attempt_s_owner") else {
        return;
    };
    let schemas = Schemas::new(&url, "rvstale");
    let schema = schemas.name();
    let o = PostgresOutbox::open(PostgresOptions::new(&url).schema(&schema).pool_size(2))
        .await
        .unwrap();
    o.register_alone(&new_intents("a", 1, &[("k", "x")]), at(0))
        .await
        .unwrap();
    let first = claim(&o, "new build", 1, 1).await;
    let t1 = first.claims[0].lease().unwrap().token;
    o.record(
        &[Recording {
            key: ActionKey::from("k"),
            token: t1,
            outcome: Outcome::Failed {
                error: "503".into(),
                next: FailedAttempt::RetryAt(at(2)),
            },
        }],
        at(2),
    )
    .await
    .unwrap();
    let c = client(&url).await;
    let saved = c
        .query_one(
            &format!(
                "SELECT claim_owner, claimed_at, claim_until, claim_token FROM \"{schema}\".outbox WHERE key = 'k'"
            ),
            &[],
        )
        .await
        .unwrap();
    let (owner, claimed, until, token): (String, i64, i64, i64) =
        (saved.get(0), saved.get(1), saved.get(2), saved.get(3));
    let second = claim(&o, "old build", 1, 5_000).await;
    let t2 = second.claims[0].lease().unwrap().token;
    c.execute(
        &format!(
            "UPDATE \"{schema}\".outbox SET claim_owner = $1, claimed_at = $2, claim_until = $3, claim_token = $4 WHERE key = 'k'"
        ),
        &[&owner, &claimed, &until, &token],
    )
    .await
    .unwrap();
    o.record(
        &[Recording {
            key: ActionKey::from("k"),
            token: t2,
            outcome: Outcome::Delivered,
        }],
        at(6_000),
    )
    .await
    .unwrap();
    let history = o.attempts("k").await.unwrap().unwrap();
    // The failed attempt is kept; the delivered one's claim is unknown, so it is not shown.
    assert_eq!(history.len(), 1, "{history:#?}");
    assert_eq!(&*history[0].owner, "new build");
    assert!(matches!(history[0].outcome, AttemptOutcome::Failed { .. }));
}

/// A schema-2 process's purge (its statement, verbatim from 94886a5) leaves the purged key's
/// history behind: `attempts` still answers `None` for the key the ledger no longer holds.
#[tokio::test]
async fn an_older_build_s_purge_leaves_no_history_for_a_purged_key() {
    let Some(url) = common::url("an_older_build_s_purge_leaves_no_history_for_a_purged_key") else {
        return;
    };
    let schemas = Schemas::new(&url, "rvorphan");
    let schema = schemas.name();
    let o = PostgresOutbox::open(PostgresOptions::new(&url).schema(&schema).pool_size(2))
        .await
        .unwrap();
    o.register_alone(&new_intents("a", 1, &[("k", "x")]), at(0))
        .await
        .unwrap();
    let first = claim(&o, "d", 1, 1).await;
    let t1 = first.claims[0].lease().unwrap().token;
    o.record(
        &[Recording {
            key: ActionKey::from("k"),
            token: t1,
            outcome: Outcome::Interrupted { reason: "stop".into() },
        }],
        at(2),
    )
    .await
    .unwrap();
    let second = claim(&o, "d", 1, 3).await;
    let t2 = second.claims[0].lease().unwrap().token;
    o.record(
        &[Recording {
            key: ActionKey::from("k"),
            token: t2,
            outcome: Outcome::Delivered,
        }],
        at(4),
    )
    .await
    .unwrap();
    let s = format!("\"{schema}\"");
    let old_purge = format!(
        "WITH old AS MATERIALIZED (
             SELECT o.seq, o.key FROM {s}.outbox o WHERE o.status IN (2, 6) AND o.updated_at < $1
              ORDER BY o.updated_at, o.seq LIMIT $2 FOR UPDATE SKIP LOCKED
         ), t AS (
             INSERT INTO {s}.outbox_purged (key, purged_at) SELECT key, $3 FROM old ON CONFLICT (key) DO NOTHING
         ), m AS (
             DELETE FROM {s}.outbox_members WHERE key IN (SELECT key FROM old)
         ), d AS (
             DELETE FROM {s}.outbox WHERE seq IN (SELECT seq FROM old) RETURNING 1
         )
         SELECT count(*) FROM d"
    );
    let c = client(&url).await;
    let n: i64 = c
        .query_one(&old_purge, &[&i64::MAX, &1000i64, &0i64])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    assert!(o.get("k").await.unwrap().is_none());
    // The new build's purge never reaches it either (it selects from `outbox`).
    assert_eq!(o.purge(PurgeFilter::Final, at(u64::MAX / 4), 1000).await.unwrap(), 0);
    assert_eq!(o.attempts("k").await.unwrap(), None, "no history for a purged key");
}

/// Records and reclaims of the same keys racing on two pools: every attempt ends once (no
/// token both expired and delivered/failed), and a key's history matches its entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_racing_a_reclaim_ends_each_attempt_once() {
    let Some(url) = common::url("a_record_racing_a_reclaim_ends_each_attempt_once") else {
        return;
    };
    let schemas = Schemas::new(&url, "rvrace");
    let schema = schemas.name();
    let open = || PostgresOutbox::open(PostgresOptions::new(&url).schema(&schema).pool_size(4));
    let a = open().await.unwrap();
    let b = open().await.unwrap();
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    let pairs: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "x")).collect();
    a.register_alone(&new_intents("a", 1, &pairs), at(0)).await.unwrap();
    let taken = claim(&a, "holder", 200, 1).await;
    assert_eq!(taken.claims.len(), 200);
    let barrier = Arc::new(tokio::sync::Barrier::new(200 + 8));
    let mut tasks = Vec::new();
    for d in taken.claims.clone() {
        let (a, barrier) = (a.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let recording = Recording {
                key: d.key().clone(),
                token: d.lease().unwrap().token,
                outcome: if d.key().as_str().ends_with('1') {
                    Outcome::Failed {
                        error: "e".into(),
                        next: FailedAttempt::AwaitRetry,
                    }
                } else {
                    Outcome::Delivered
                },
            };
            barrier.wait().await;
            a.record(&[recording], at(70_000)).await.unwrap();
            0
        }));
    }
    for _ in 0..8 {
        let (b, barrier) = (b.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut n = 0;
            for _ in 0..25 {
                n += claim(&b, "reclaimer", 1, 70_000).await.reclaimed;
            }
            n
        }));
    }
    let mut reclaimed = 0;
    for t in tasks {
        reclaimed += t.await.unwrap();
    }
    println!("reclaimed {reclaimed} of 200");
    for key in &keys {
        let d = a.get(key).await.unwrap().unwrap();
        let history = a.attempts(key).await.unwrap().unwrap();
        let mut tokens: Vec<FenceToken> = history.iter().map(|h| h.token).collect();
        tokens.dedup();
        assert_eq!(tokens.len(), history.len(), "{key}: a token twice {history:#?}");
        let first = &history[0];
        assert_eq!(first.token, FenceToken(1), "{key}: {history:#?} {d:?}");
        match &first.outcome {
            AttemptOutcome::Expired => assert!(d.expired_leases() >= 1, "{key}: {d:?}"),
            AttemptOutcome::Delivered | AttemptOutcome::Failed { .. } => {
                assert_eq!(d.expired_leases(), 0, "{key}: {history:#?} {d:?}")
            }
            other => panic!("{key}: {other:?}"),
        }
    }
}
