//! The attempt history of the SQLite outbox against what a test harness throws at it: an older
//! build still claiming after the upgrade, damaged and out-of-range values in its undigested
//! columns, and a key whose attempts never end.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use reactifact_core::ledger::{AttemptOutcome, FenceToken};
use reactifact_core::store::{
    ClaimPolicy, ClaimRequest, Claimed, FailedAttempt, OutboxStore, Outcome, Recording, SqliteOutbox,
};
use reactifact_core::Scope;

const LEASE: Duration = Duration::from_secs(30);

async fn store_with(dir: &Path, count: u64) -> PathBuf {
    let path = dir.join("state.db");
    commit_orders(&path, "orders", 1..=count).await;
    path
}

fn t0() -> SystemTime {
    SystemTime::now() + Duration::from_secs(1)
}

async fn claim(outbox: &dyn OutboxStore, who: &str, now: SystemTime) -> Claimed {
    let who: Arc<str> = Arc::from(who);
    outbox
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit: 1,
            owner: &who,
            lease: LEASE,
            now,
            policy: ClaimPolicy::none(),
        })
        .await
        .unwrap()
}

fn token_of(claimed: &Claimed) -> FenceToken {
    claimed.claims[0].lease().unwrap().token
}

async fn record(outbox: &dyn OutboxStore, key: &str, token: FenceToken, outcome: Outcome, now: SystemTime) {
    outbox
        .record(
            &[Recording {
                key: key.into(),
                token,
                outcome,
            }],
            now,
        )
        .await
        .unwrap();
}

/// A process of the previous build (schema 3) keeps writing after a new one migrated the file
/// to 4: its claims write only the digested columns, so the last-claim columns keep an
/// earlier claim's values. (Emulated: the old build's claim is the new one's with the four
/// undigested columns put back as they were, which is what the old `Row::update` leaves.) The
/// delivered attempt must not be shown with the owner, claim time and lease of another one.
#[test]
fn a_delivery_claimed_by_an_older_build_never_shows_another_attempt_s_owner() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = runtime.block_on(store_with(dir.path(), 1));
    let outbox = SqliteOutbox::open(&path).unwrap();
    let now = t0();
    let first = runtime.block_on(claim(&*outbox, "new build, drain 1", now));
    let key = first.claims[0].key().to_string();
    runtime.block_on(record(
        &*outbox,
        &key,
        token_of(&first),
        Outcome::Failed {
            error: "503".into(),
            next: FailedAttempt::RetryAt(now),
        },
        now,
    ));
    let conn = rusqlite::Connection::open(&path).unwrap();
    let saved: (String, i64, i64, i64) = conn
        .query_row(
            "SELECT claim_owner, claimed_at, claim_until, claim_token FROM outbox WHERE key = ?1",
            [&key],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    let later = now + Duration::from_secs(60);
    let second = runtime.block_on(claim(&*outbox, "old build, drain 2", later));
    assert_eq!(second.claims.len(), 1);
    // What the old build's claim leaves in the undigested columns: the earlier claim's values.
    conn.execute(
        "UPDATE outbox SET claim_owner = ?2, claimed_at = ?3, claim_until = ?4, claim_token = ?5 WHERE key = ?1",
        rusqlite::params![key, saved.0, saved.1, saved.2, saved.3],
    )
    .unwrap();
    runtime.block_on(record(&*outbox, &key, token_of(&second), Outcome::Delivered, later));
    let attempts = runtime.block_on(outbox.attempts(&key)).unwrap().unwrap();
    // The failed attempt is kept; the delivered one's claim is unknown, so it is not shown.
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(&*attempts[0].owner, "new build, drain 1");
    assert!(matches!(attempts[0].outcome, AttemptOutcome::Failed { .. }));
}

/// A flipped type in an undigested history column skips that row (with a warning), as an
/// unknown outcome code does: the read of an intact entry's history never fails on it.
#[test]
fn a_damaged_history_row_is_skipped_not_failing_the_read() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = runtime.block_on(store_with(dir.path(), 1));
    let outbox = SqliteOutbox::open(&path).unwrap();
    let now = t0();
    let first = runtime.block_on(claim(&*outbox, "drain", now));
    let key = first.claims[0].key().to_string();
    runtime.block_on(record(
        &*outbox,
        &key,
        token_of(&first),
        Outcome::Failed {
            error: "503".into(),
            next: FailedAttempt::AwaitRetry,
        },
        now,
    ));
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("UPDATE outbox_attempts SET owner = X'00ff' WHERE key = ?1", [&key])
        .unwrap();
    assert!(
        runtime.block_on(outbox.get(&key)).unwrap().is_some(),
        "the entry is intact"
    );
    let read = runtime.block_on(outbox.attempts(&key));
    assert_eq!(read.unwrap(), Some(Vec::new()), "the damaged row is skipped");
}

/// A time past the end of year 9999 in an undigested column reads as `FAR_FUTURE`, which
/// every formatter can show.
#[test]
fn a_huge_time_in_the_history_is_clamped_to_far_future() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = runtime.block_on(store_with(dir.path(), 1));
    let outbox = SqliteOutbox::open(&path).unwrap();
    let now = t0();
    let first = runtime.block_on(claim(&*outbox, "drain", now));
    let key = first.claims[0].key().to_string();
    runtime.block_on(record(
        &*outbox,
        &key,
        token_of(&first),
        Outcome::Failed {
            error: "503".into(),
            next: FailedAttempt::AwaitRetry,
        },
        now,
    ));
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE outbox_attempts SET claimed_at = 9000000000000000 WHERE key = ?1",
        [&key],
    )
    .unwrap();
    let attempts = runtime.block_on(outbox.attempts(&key)).unwrap().unwrap();
    assert_eq!(
        attempts[0].claimed_at,
        SystemTime::UNIX_EPOCH + reactifact_core::store::FAR_FUTURE
    );
}

/// Interrupted (and expired) attempts do not count against the retry policy, so a key whose
/// attempt is always cut off (a deadline shorter than its dispatcher, a poison intent that
/// crashes its process) is never final and never purged: its history keeps only the latest
/// `ATTEMPTS_KEPT` attempts, while the entry counts them all.
#[test]
fn the_history_of_a_key_that_is_always_interrupted_keeps_the_latest_attempts() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = runtime.block_on(store_with(dir.path(), 1));
    let outbox = SqliteOutbox::open(&path).unwrap();
    let mut now = t0();
    let mut key = String::new();
    for _ in 0..300 {
        let c = runtime.block_on(claim(&*outbox, "drain", now));
        key = c.claims[0].key().to_string();
        runtime.block_on(record(
            &*outbox,
            &key,
            token_of(&c),
            Outcome::Interrupted {
                reason: "deadline".into(),
            },
            now,
        ));
        now += Duration::from_millis(1);
    }
    let attempts = runtime.block_on(outbox.attempts(&key)).unwrap().unwrap();
    assert_eq!(attempts.len(), reactifact_core::store::ATTEMPTS_KEPT);
    let tokens: Vec<u64> = attempts.iter().map(|a| a.token.0).collect();
    let latest: Vec<u64> = (300 - reactifact_core::store::ATTEMPTS_KEPT as u64 + 1..=300).collect();
    assert_eq!(tokens, latest, "the latest attempts, oldest first");
    let entry = runtime.block_on(outbox.get(&key)).unwrap().unwrap();
    assert_eq!(entry.interrupted_attempts(), 300, "the entry counts every attempt");
}
