//! The SQLite outbox at the `OutboxStore` level: claims are atomic across connections,
//! records and renewals are fenced by the claim's token, expired leases are reclaimed by any
//! claim, scopes follow the registering and attached sessions, operator transitions are
//! checked, and a row changed outside reactifact is held, never handed out, and named by
//! `verify`. Times are passed in explicitly; nothing waits on a clock.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use reactifact_core::audit::VerifyError;
use reactifact_core::error::{CancelError, OpenError, RetryError};
use reactifact_core::ledger::{DeliveryStatus, FenceToken, LedgerQuery, PurgeFilter};
use reactifact_core::runtime::Generation;
use reactifact_core::store::{
    ClaimPolicy, ClaimRequest, Claimed, FailedAttempt, OutboxStore, Outcome, Recorded, Recording, SqliteOutbox,
};
use reactifact_core::{Context, OpenOptions, Scope};

const LEASE: Duration = Duration::from_secs(30);

async fn store_with(dir: &Path, count: u64) -> PathBuf {
    let path = dir.join("state.db");
    commit_orders(&path, "orders", 1..=count).await;
    path
}

/// A moment after every registration of the test.
fn t0() -> SystemTime {
    SystemTime::now() + Duration::from_secs(1)
}

fn owner(name: &str) -> Arc<str> {
    Arc::from(name)
}

async fn claim(outbox: &dyn OutboxStore, scope: &Scope, limit: usize, who: &str, now: SystemTime) -> Claimed {
    let who = owner(who);
    outbox
        .claim(ClaimRequest {
            scope,
            limit,
            owner: &who,
            lease: LEASE,
            now,
            policy: ClaimPolicy::none(),
        })
        .await
        .unwrap()
}

fn keys(claimed: &Claimed) -> Vec<String> {
    claimed.claims.iter().map(|d| d.key().to_string()).collect()
}

fn token_of(claimed: &Claimed, at: usize) -> FenceToken {
    claimed.claims[at].lease().unwrap().token
}

fn recording(key: &str, token: FenceToken, outcome: Outcome) -> Recording {
    Recording {
        key: key.into(),
        token,
        outcome,
    }
}

#[test]
fn two_connections_claiming_at_once_never_take_the_same_key() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = runtime.block_on(store_with(dir.path(), 500));
    let now = t0();
    let barrier = std::sync::Barrier::new(2);
    let taken: Vec<Vec<String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|who| {
                let (path, barrier) = (&path, &barrier);
                scope.spawn(move || {
                    // Its own connection and its own runtime, as another process would have.
                    let outbox = SqliteOutbox::open(path).unwrap();
                    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
                    barrier.wait();
                    let mut mine = Vec::new();
                    loop {
                        let claimed = runtime.block_on(claim(&*outbox, &Scope::all(), 7, who, now));
                        if claimed.claims.is_empty() {
                            return mine;
                        }
                        mine.extend(keys(&claimed));
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let a: HashSet<&String> = taken[0].iter().collect();
    let b: HashSet<&String> = taken[1].iter().collect();
    assert_eq!(a.len(), taken[0].len(), "no key twice to one claimer");
    assert!(a.is_disjoint(&b), "a key was claimed by both");
    assert_eq!(a.len() + b.len(), 500, "{} + {}", a.len(), b.len());
    let outbox = SqliteOutbox::open(&path).unwrap();
    let counts = runtime.block_on(outbox.counts(&Scope::all())).unwrap();
    assert_eq!((counts.in_flight, counts.pending), (500, 0));
}

#[tokio::test]
async fn claims_come_in_registration_order_with_a_growing_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 3).await;
    let outbox = SqliteOutbox::open(&path).unwrap();
    let now = t0();
    let first = claim(&*outbox, &Scope::all(), 2, "a", now).await;
    assert_eq!(keys(&first), ["notify:order:1", "notify:order:2"]);
    let entry = &first.claims[0];
    assert_eq!(
        (entry.status(), entry.attempts(), entry.token()),
        (DeliveryStatus::InFlight, 1, FenceToken(1))
    );
    assert_eq!(entry.intent().payload::<Notify>().unwrap().customer, "ada");
    let lease = entry.lease().unwrap();
    assert_eq!((&*lease.owner, lease.token), ("a", FenceToken(1)));
    assert_eq!(
        keys(&claim(&*outbox, &Scope::all(), 5, "b", now).await),
        ["notify:order:3"]
    );
    assert!(claim(&*outbox, &Scope::all(), 5, "b", now).await.claims.is_empty());
    // Released: pending again, the attempt uncounted; the next claim takes the next token.
    let released = outbox
        .record(&[recording("notify:order:1", FenceToken(1), Outcome::Released)], now)
        .await
        .unwrap();
    assert_eq!(released, [Recorded::Accepted(DeliveryStatus::Pending)]);
    let again = claim(&*outbox, &Scope::all(), 5, "b", now).await;
    assert_eq!(keys(&again), ["notify:order:1"]);
    assert_eq!((again.claims[0].attempts(), token_of(&again, 0)), (1, FenceToken(2)));
}

#[tokio::test]
async fn a_record_with_a_stale_token_is_rejected_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 1).await;
    let outbox = SqliteOutbox::open(&path).unwrap();
    let now = t0();
    let claimed = claim(&*outbox, &Scope::all(), 1, "a", now).await;
    let token = token_of(&claimed, 0);
    let before = outbox.get("notify:order:1").await.unwrap().unwrap();
    let stale = FenceToken(token.0 - 1);
    let answer = outbox
        .record(&[recording("notify:order:1", stale, Outcome::Delivered)], now)
        .await
        .unwrap();
    assert_eq!(
        answer,
        [Recorded::Stale {
            status: Some(DeliveryStatus::InFlight),
            token
        }]
    );
    let after = outbox.get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(format!("{before:?}"), format!("{after:?}"), "nothing changed");
    // A key the store does not hold is stale too.
    let unknown = outbox
        .record(&[recording("notify:order:9", token, Outcome::Delivered)], now)
        .await
        .unwrap();
    assert_eq!(
        unknown,
        [Recorded::Stale {
            status: None,
            token: FenceToken(0)
        }]
    );
    // The holder's own token is accepted.
    let accepted = outbox
        .record(&[recording("notify:order:1", token, Outcome::Delivered)], now)
        .await
        .unwrap();
    assert_eq!(accepted, [Recorded::Accepted(DeliveryStatus::Delivered)]);
    let delivered = outbox.get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(delivered.delivered_at(), Some(reactifact_core_millis(now)));
    assert!(delivered.lease().is_none());
}

/// `t` as the store keeps it: whole milliseconds.
fn reactifact_core_millis(t: SystemTime) -> SystemTime {
    let ms = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as u64;
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

#[tokio::test]
async fn an_expired_lease_is_reclaimed_by_the_next_claim_and_its_late_outcome_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 1).await;
    let outbox = SqliteOutbox::open(&path).unwrap();
    let now = t0();
    let first = claim(&*outbox, &Scope::all(), 1, "dead-holder", now).await;
    let old = token_of(&first, 0);
    // Before expiry: nothing to reclaim, nothing due.
    let early = claim(&*outbox, &Scope::all(), 1, "b", now + LEASE - Duration::from_millis(1)).await;
    assert_eq!((early.reclaimed, early.claims.len()), (0, 0));
    assert_eq!(
        outbox.next_due(&Scope::all()).await.unwrap(),
        Some(reactifact_core_millis(now + LEASE))
    );
    // At expiry, any claim (of any scope) reclaims it; an in-scope one then takes it.
    let other = claim(&*outbox, &Scope::session("nobody"), 1, "b", now + LEASE).await;
    assert_eq!((other.reclaimed, other.claims.len()), (1, 0));
    let entry = outbox.get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        (entry.status(), entry.expired_leases(), entry.token()),
        (DeliveryStatus::Pending, 1, old)
    );
    let error = entry.last_error().unwrap();
    assert!(
        error.contains("attempt 1") && error.contains("dead-holder") && error.contains("expired"),
        "{error}"
    );
    let second = claim(&*outbox, &Scope::all(), 1, "b", now + LEASE).await;
    assert_eq!(keys(&second), ["notify:order:1"]);
    let new = token_of(&second, 0);
    assert_eq!(new, FenceToken(old.0 + 1));
    // The first holder wakes up and reports success: rejected.
    let late = outbox
        .record(&[recording("notify:order:1", old, Outcome::Delivered)], now + LEASE)
        .await
        .unwrap();
    assert_eq!(
        late,
        [Recorded::Stale {
            status: Some(DeliveryStatus::InFlight),
            token: new
        }]
    );
    assert!(
        !outbox
            .renew(&[("notify:order:1".into(), old)], now + LEASE * 3)
            .await
            .unwrap()[0]
    );
}

#[tokio::test]
async fn a_renewed_lease_is_not_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 1).await;
    let outbox = SqliteOutbox::open(&path).unwrap();
    let now = t0();
    let claimed = claim(&*outbox, &Scope::all(), 1, "a", now).await;
    let token = token_of(&claimed, 0);
    let renewed = outbox
        .renew(
            &[
                ("notify:order:1".into(), token),
                ("notify:order:1".into(), FenceToken(token.0 + 1)),
            ],
            now + LEASE * 4,
        )
        .await
        .unwrap();
    assert_eq!(renewed, [true, false], "only the holder's token renews");
    let later = claim(&*outbox, &Scope::all(), 1, "b", now + LEASE * 2).await;
    assert_eq!((later.reclaimed, later.claims.len()), (0, 0));
    let entry = outbox.get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        entry.lease().unwrap().expires_at,
        reactifact_core_millis(now + LEASE * 4)
    );
    let done = outbox
        .record(
            &[recording("notify:order:1", token, Outcome::Delivered)],
            now + LEASE * 2,
        )
        .await
        .unwrap();
    assert_eq!(done, [Recorded::Accepted(DeliveryStatus::Delivered)]);
}

#[tokio::test]
async fn a_session_scope_claims_its_own_and_attached_intents_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    commit_orders(&path, "a", [1, 2]).await;
    commit_orders(&path, "b", [3]).await;
    // `b` commits order:2 too: the key is `a`'s, and now attached to `b`.
    commit_orders(&path, "b", [2]).await;
    let outbox = SqliteOutbox::open(&path).unwrap();
    let now = t0();
    let entry = outbox.get("notify:order:2").await.unwrap().unwrap();
    assert_eq!(entry.origin().session(), "a", "registered once, by its first commit");
    let counts = outbox.counts(&Scope::session("b")).await.unwrap();
    assert_eq!(counts.pending, 2);
    let page = outbox
        .list(&LedgerQuery {
            scope: Scope::session("b"),
            ..LedgerQuery::default()
        })
        .await
        .unwrap();
    let listed: Vec<_> = page.entries.iter().map(|d| d.key().to_string()).collect();
    assert_eq!(listed, ["notify:order:2", "notify:order:3"]);
    assert!(claim(&*outbox, &Scope::session("c"), 10, "c", now)
        .await
        .claims
        .is_empty());
    assert!(claim(&*outbox, &Scope::session("b").kinds(["email"]), 10, "b", now)
        .await
        .claims
        .is_empty());
    let b = claim(&*outbox, &Scope::session("b"), 10, "b", now).await;
    assert_eq!(keys(&b), ["notify:order:2", "notify:order:3"]);
    let a = claim(&*outbox, &Scope::session("a"), 10, "a", now).await;
    assert_eq!(
        keys(&a),
        ["notify:order:1"],
        "notify:order:2 is in flight under b's claim"
    );
}

#[tokio::test]
async fn retry_cancel_and_purge_are_checked_and_a_purged_key_is_never_registered_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 3).await;
    let outbox = SqliteOutbox::open(&path).unwrap();
    let now = t0();
    let claimed = claim(&*outbox, &Scope::all(), 2, "a", now).await;
    assert!(matches!(
        outbox.retry("notify:order:1", now).await,
        Err(RetryError::NotFailed {
            status: DeliveryStatus::InFlight,
            ..
        })
    ));
    assert!(matches!(
        outbox.cancel("notify:order:1", "no", now).await,
        Err(CancelError::NotCancellable {
            status: DeliveryStatus::InFlight,
            ..
        })
    ));
    let failed = Outcome::Failed {
        error: "503".into(),
        next: FailedAttempt::AwaitRetry,
    };
    let results = outbox
        .record(
            &[
                recording("notify:order:1", token_of(&claimed, 0), Outcome::Delivered),
                recording("notify:order:2", token_of(&claimed, 1), failed),
            ],
            now,
        )
        .await
        .unwrap();
    assert_eq!(
        results,
        [
            Recorded::Accepted(DeliveryStatus::Delivered),
            Recorded::Accepted(DeliveryStatus::Failed)
        ]
    );
    assert!(matches!(
        outbox.retry("notify:order:9", now).await,
        Err(RetryError::UnknownKey(_))
    ));
    assert!(matches!(
        outbox.cancel("notify:order:1", "too late", now).await,
        Err(CancelError::NotCancellable {
            status: DeliveryStatus::Delivered,
            ..
        })
    ));
    let retried = outbox.retry("notify:order:2", now).await.unwrap();
    assert_eq!(
        (retried.status(), retried.last_error()),
        (DeliveryStatus::Pending, Some("503"))
    );
    assert!(matches!(
        outbox.retry("notify:order:2", now).await,
        Err(RetryError::NotFailed {
            status: DeliveryStatus::Pending,
            ..
        })
    ));
    let cancelled = outbox.cancel("notify:order:3", "customer left", now).await.unwrap();
    assert_eq!(
        (cancelled.status(), cancelled.cancel_reason()),
        (DeliveryStatus::Cancelled, Some("customer left"))
    );
    let again = outbox.cancel("notify:order:3", "twice", now).await.unwrap();
    assert_eq!(
        again.cancel_reason(),
        Some("customer left"),
        "cancelling again changes nothing"
    );
    let due = claim(&*outbox, &Scope::all(), 10, "a", now).await;
    assert_eq!(keys(&due), ["notify:order:2"], "a cancelled intent is never claimed");

    // Purge: only final entries last changed before the horizon, at most `limit`.
    assert_eq!(
        outbox.purge(PurgeFilter::Final, now, 10).await.unwrap(),
        0,
        "changed at `now`, not before"
    );
    let later = now + Duration::from_secs(1);
    assert_eq!(outbox.purge(PurgeFilter::Final, later, 1).await.unwrap(), 1);
    assert_eq!(outbox.purge(PurgeFilter::Final, later, 10).await.unwrap(), 1);
    assert!(outbox.get("notify:order:1").await.unwrap().is_none());
    assert!(outbox.get("notify:order:3").await.unwrap().is_none());
    assert_eq!(outbox.counts(&Scope::all()).await.unwrap().total(), 1);
    // Committing the purged key again registers nothing.
    commit_orders(&path, "other", [1]).await;
    assert!(outbox.get("notify:order:1").await.unwrap().is_none());
    // And verify accepts the log: a purged intent has its tombstone.
    Context::open_with(&path, "orders", OpenOptions::new().read_only(true))
        .unwrap()
        .verify()
        .unwrap();
}

/// Runs `sql` on the file directly, as something outside reactifact would.
fn tamper(path: &Path, sql: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(sql).unwrap();
}

#[tokio::test]
async fn a_row_whose_status_was_changed_is_held_with_an_integrity_error_never_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 2).await;
    tamper(&path, "UPDATE outbox SET status = 3 WHERE key = 'notify:order:1'");
    let outbox = SqliteOutbox::open(&path).unwrap();
    let now = t0();
    let claimed = claim(&*outbox, &Scope::all(), 10, "a", now).await;
    assert_eq!(keys(&claimed), ["notify:order:2"]);
    assert_eq!(claimed.integrity, ["notify:order:1".into()]);
    let held = outbox.get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(held.status(), DeliveryStatus::Held);
    assert!(
        held.last_error().unwrap().starts_with("integrity:"),
        "{:?}",
        held.last_error()
    );
    assert!(claim(&*outbox, &Scope::all(), 10, "a", now).await.claims.is_empty());
}

#[tokio::test]
async fn changed_bytes_are_held_and_never_handed_out_even_after_a_retry() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 1).await;
    // Same length, valid encoding, another customer; the digest is left as it was.
    tamper(
        &path,
        "UPDATE outbox SET bytes = CAST(replace(CAST(bytes AS TEXT), 'ada', 'eve') AS BLOB)",
    );
    let outbox = SqliteOutbox::open(&path).unwrap();
    let now = t0();
    let claimed = claim(&*outbox, &Scope::all(), 10, "a", now).await;
    assert!(claimed.claims.is_empty());
    assert_eq!(claimed.integrity, ["notify:order:1".into()]);
    // An operator re-arms it: the bytes still do not hash to the committed action.
    outbox.retry("notify:order:1", now).await.unwrap();
    let again = claim(&*outbox, &Scope::all(), 10, "a", now).await;
    assert!(again.claims.is_empty());
    assert_eq!(again.integrity, ["notify:order:1".into()]);
    let held = outbox.get("notify:order:1").await.unwrap().unwrap();
    assert!(held.last_error().unwrap().contains("hash"), "{:?}", held.last_error());
}

#[tokio::test]
async fn verify_names_a_deleted_row_and_a_changed_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 2).await;
    let read_only = || Context::open_with(&path, "orders", OpenOptions::new().read_only(true)).unwrap();
    read_only().verify().unwrap();

    // Commit 1 created the orders, commit 2 (billing's generation) acted every intent: each
    // error names the commit that acted the key, as every other verify error names its commit.
    tamper(&path, "UPDATE outbox SET attempts = 7 WHERE key = 'notify:order:2'");
    match read_only().verify() {
        Err(err @ VerifyError::OutboxChanged { .. }) => {
            let VerifyError::OutboxChanged { generation, key, .. } = &err else {
                unreachable!()
            };
            assert_eq!((*generation, key.as_str()), (Some(Generation(2)), "notify:order:2"));
            assert_eq!(
                err.to_string(),
                "commit 2: the outbox row of `notify:order:2`, which it acted, was changed: \
                 the row does not match its digest (it was changed outside reactifact)"
            );
        }
        other => panic!("expected a changed row, got {other:?}"),
    }
    tamper(&path, "UPDATE outbox SET attempts = 0 WHERE key = 'notify:order:2'");
    read_only().verify().unwrap();

    tamper(&path, "DELETE FROM outbox WHERE key = 'notify:order:1'");
    match read_only().verify() {
        Err(err @ VerifyError::OutboxMissing { .. }) => {
            let VerifyError::OutboxMissing { generation, key } = &err else {
                unreachable!()
            };
            assert_eq!((*generation, key.as_str()), (Generation(2), "notify:order:1"));
            assert_eq!(
                err.to_string(),
                "commit 2: intent `notify:order:1`, which it acted, has no row in the store's outbox"
            );
        }
        other => panic!("expected a missing row, got {other:?}"),
    }
    // A writable open registers the lost intent again from the verified log, held: the lost
    // row may have been a delivered one, so an operator decides.
    let ctx = Context::open(&path, "orders").unwrap();
    ctx.verify().unwrap();
    drop(ctx);
    let outbox = SqliteOutbox::open(&path).unwrap();
    let entry = outbox.get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        (entry.status(), entry.origin().session()),
        (DeliveryStatus::Held, "orders")
    );
    assert!(entry.last_error().unwrap().starts_with("integrity:"));
}

/// The outbox check covers the store's whole outbox: a changed row of another session's
/// intent fails this session's verify too, naming no commit of this log.
#[tokio::test]
async fn verify_names_the_commit_only_of_a_changed_row_its_log_acted() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 1).await;
    commit_orders(&path, "returns", [9]).await;
    tamper(&path, "UPDATE outbox SET attempts = 7 WHERE key = 'notify:order:9'");
    let read_only = |session| Context::open_with(&path, session, OpenOptions::new().read_only(true)).unwrap();
    match read_only("orders").verify() {
        Err(err @ VerifyError::OutboxChanged { generation: None, .. }) => assert_eq!(
            err.to_string(),
            "the outbox row of `notify:order:9`, which no commit of this log acted, was changed: \
             the row does not match its digest (it was changed outside reactifact)"
        ),
        other => panic!("expected a changed row, got {other:?}"),
    }
    match read_only("returns").verify() {
        Err(
            err @ VerifyError::OutboxChanged {
                generation: Some(Generation(2)),
                ..
            },
        ) => assert!(
            err.to_string()
                .starts_with("commit 2: the outbox row of `notify:order:9`, which it acted, was changed: "),
            "{err}"
        ),
        other => panic!("expected a changed row, got {other:?}"),
    }
}

#[test]
fn a_standalone_outbox_refuses_a_missing_file_and_an_older_schema() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    assert!(matches!(
        SqliteOutbox::open(&missing),
        Err(OpenError::NoSuchFile { .. })
    ));
    assert!(!missing.exists(), "nothing was created");
    let v1 = dir.path().join("v1.db");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1/branches.db"),
        &v1,
    )
    .unwrap();
    let before = std::fs::read(&v1).unwrap();
    let err = SqliteOutbox::open(&v1).unwrap_err();
    assert!(matches!(err, OpenError::OlderSchema { found: 1, .. }), "{err:?}");
    assert!(err.to_string().contains("Context::open"), "{err}");
    assert_eq!(std::fs::read(&v1).unwrap(), before);
}

/// An idle claim (nothing due in its scope, no lease expired) is a read: it returns while
/// another connection holds the file's write lock, instead of waiting out the busy timeout.
/// A claim with something to do still takes the lock.
#[tokio::test]
async fn an_idle_claim_takes_no_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_with(dir.path(), 2).await;
    let outbox = SqliteOutbox::open(&path).unwrap();
    let now = t0();
    let taken = claim(&*outbox, &Scope::all(), 10, "d1", now).await;
    assert_eq!(taken.claims.len(), 2);

    let writer = rusqlite::Connection::open(&path).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = std::time::Instant::now();
    for (scope, limit) in [(Scope::all(), 10), (Scope::session("orders"), 10), (Scope::all(), 0)] {
        let idle = tokio::time::timeout(Duration::from_secs(3), claim(&*outbox, &scope, limit, "d2", now))
            .await
            .expect("an idle claim waits for no writer");
        assert!(idle.claims.is_empty() && idle.reclaimed == 0, "{idle:?}");
    }
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());

    // Past the lease there is work: the claim waits for the writer, then reclaims and takes.
    let later = now + LEASE + Duration::from_secs(1);
    let busy = {
        let outbox = outbox.clone();
        tokio::spawn(async move { claim(&*outbox, &Scope::all(), 10, "d2", later).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!busy.is_finished(), "a claim with work to do takes the write lock");
    writer.execute_batch("COMMIT").unwrap();
    let reclaimed = busy.await.unwrap();
    assert_eq!(reclaimed.reclaimed, 2);
    assert_eq!(reclaimed.claims.len(), 2);
}
