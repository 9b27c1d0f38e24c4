//! SQLite files in schema version 1, kept in `tests/fixtures/v1/`, migrate to the current
//! schema at their first writable open, and open and verify with what they hold: the ledger in
//! every state (now outbox rows), a stale in-flight row written after a delivery (which stays
//! delivered), and branches with a merge next to another session. A read-only open of a
//! version-1 file is refused without writing (it would have to migrate).
//!
//! The files were written by `regenerate_v1_fixtures` (ignored) with the code of schema
//! version 1. Once the schema moves on they can no longer be regenerated — that is their
//! point: a newer reactifact must keep opening (or migrating) what an older one wrote.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use reactifact_core::error::OpenError;
use reactifact_core::ledger::{DeliveryStatus, FenceToken};
use reactifact_core::runtime::TurnOutcome;
use reactifact_core::store::{ClaimPolicy, ClaimRequest, OutboxStore, SqliteOutbox};
use reactifact_core::{Agent, Context, DeliveryOptions, DispatchError, Intent, OpenOptions, Runtime, Scope};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/v1")
        .join(name)
}

/// A writable copy of a fixture (opening may write: a reclaim, a new session).
fn copy_of(name: &str, dir: &Path) -> PathBuf {
    let to = dir.join(name);
    std::fs::copy(fixture(name), &to).unwrap();
    to
}

async fn entry(outbox: &SqliteOutbox, key: &str) -> reactifact_core::ledger::Delivery {
    outbox
        .get(key)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{key} is in the outbox"))
}

async fn status(outbox: &SqliteOutbox, key: &str) -> DeliveryStatus {
    entry(outbox, key).await.status()
}

/// A read-only open of a version-1 file is refused, and the file left as it was.
fn refused_read_only(path: &Path, session: &str) {
    let before = std::fs::read(path).unwrap();
    let err = Context::open_with(path, session, OpenOptions::new().read_only(true)).unwrap_err();
    assert!(matches!(err, OpenError::OlderSchema { found: 1, .. }), "{err:?}");
    assert_eq!(std::fs::read(path).unwrap(), before);
}

/// A dispatcher that hangs on every intent, as a process that dies mid-dispatch.
async fn hang(_: Intent) -> Result<(), DispatchError> {
    std::future::pending().await
}

fn billing(ctx: Context) -> reactifact_core::runtime::RuntimeBuilder {
    Runtime::builder(ctx).agent(Agent::new("billing").produce(process_order()))
}

/// Runs a turn and dies mid-dispatch (see `crash_mid_turn`): the file keeps the hung intents
/// in flight.
async fn run_and_die(rt: &mut Runtime) {
    crash_mid_turn(rt).await;
}

/// Writes the fixtures into `tests/fixtures/v1/`. Run only with the code of schema version 1:
/// `cargo test -p reactifact-core --test v1_fixtures -- --ignored regenerate`.
#[tokio::test]
#[ignore = "writes the checked-in fixtures; only meaningful with the code of schema version 1"]
async fn regenerate_v1_fixtures() {
    let out = fixture("");
    std::fs::create_dir_all(&out).unwrap();
    for name in ["ledger-states.db", "stale-in-flight.db", "branches.db"] {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(out.join(format!("{name}{suffix}")));
        }
    }

    // Every ledger state, one order each. The steps run in this order so that no later drain
    // or open touches an earlier order's state.
    let path = out.join("ledger-states.db");
    let open = |lease: Duration| Context::open_with(&path, "orders", OpenOptions::new().lease(lease)).unwrap();
    {
        // 1 delivered, 2 failed with a retry in an hour, 3 dead, 4 held.
        let mut ctx = open(Duration::from_secs(300));
        for i in 1..=4 {
            ctx.create(format!("order:{i}"), order("ada", i)).unwrap();
        }
        let mut rt = billing(ctx)
            .delivery(
                DeliveryOptions::new().retry_policy(reactifact_core::RetryPolicy::exponential(
                    Duration::from_secs(3600),
                    Duration::from_secs(3600),
                )),
            )
            .dispatcher(|intent: Intent| async move {
                match intent.key().as_str() {
                    "notify:order:2" => Err(DispatchError::retryable("503 service unavailable")),
                    "notify:order:3" => Err(DispatchError::permanent("550 mailbox unavailable")),
                    "notify:order:4" => Err(DispatchError::no_route("no route for `notify` in this fixture")),
                    _ => Ok(()),
                }
            })
            .build()
            .unwrap();
        assert_eq!(rt.run().await.unwrap().deliveries.delivered, 1);
    }
    {
        // 6 dies in flight under a lease of a century.
        let mut ctx = open(Duration::from_secs(100 * 365 * 86_400));
        ctx.create("order:6", order("bob", 6)).unwrap();
        run_and_die(&mut billing(ctx).dispatcher(hang).build().unwrap()).await;
    }
    {
        // 7 dies in flight under a 30-second lease: long expired when a test opens the file.
        let mut ctx = open(Duration::from_secs(30));
        ctx.create("order:7", order("bob", 7)).unwrap();
        run_and_die(&mut billing(ctx).dispatcher(hang).build().unwrap()).await;
    }
    {
        // 8: a stop cuts off its attempt: pending again, counted as interrupted.
        let mut ctx = open(Duration::from_secs(300));
        ctx.create("order:8", order("eve", 8)).unwrap();
        let mut rt = billing(ctx)
            .dispatcher(hang)
            .delivery(DeliveryOptions::new().grace(Duration::ZERO))
            .build()
            .unwrap();
        let stop = rt.stop_handle();
        let stopper = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            stop.stop();
        };
        let (report, ()) = tokio::join!(rt.run(), stopper);
        assert_eq!(report.unwrap().outcome, TurnOutcome::Stopped);
    }
    {
        // 5 pending: committed by a runtime without a dispatcher.
        let mut ctx = open(Duration::from_secs(300));
        ctx.create("order:5", order("bob", 5)).unwrap();
        billing(ctx).build().unwrap().run().await.unwrap();
    }

    // A stale copy writes "in flight" after another copy wrote "delivered" for the same key.
    let path = out.join("stale-in-flight.db");
    {
        let mut ctx = Context::open(&path, "orders").unwrap();
        ctx.create("order:1", order("ada", 1)).unwrap();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .build()
            .unwrap();
        rt.run().await.unwrap();
    }
    {
        let live = Context::open(&path, "orders").unwrap();
        let stale = Context::open_with(&path, "orders", OpenOptions::new().lease(Duration::ZERO)).unwrap();
        let recorder = Recorder::default();
        let mut live = Runtime::builder(live)
            .dispatcher(recorder.dispatcher())
            .build()
            .unwrap();
        assert_eq!(live.flush().await.unwrap().delivered, 1);
        let mut stale = Runtime::builder(stale)
            .dispatcher(|_: Intent| std::future::pending::<Result<(), DispatchError>>())
            .build()
            .unwrap();
        // The stale copy dies with its "in flight" on file.
        let mut flush = Box::pin(stale.flush());
        assert!(tokio::time::timeout(Duration::from_secs(1), &mut flush).await.is_err());
        std::mem::forget(flush);
    }

    // Branches: a fork with intents of its own merged back, and an unrelated session.
    let path = out.join("branches.db");
    {
        let recorder = Recorder::default();
        let mut main = Runtime::builder(Context::open(&path, "main").unwrap())
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(recorder.dispatcher())
            .build()
            .unwrap();
        main.context_mut().create("order:1", order("ada", 1)).unwrap();
        main.run().await.unwrap();
        let branch = main.context().fork("what-if").unwrap();
        let mut branch = Runtime::builder(branch)
            .agent(Agent::new("billing").produce(process_order()))
            .build()
            .unwrap();
        branch.context_mut().create("order:2", order("bob", 2)).unwrap();
        branch.run().await.unwrap();
        main.context_mut().create("order:3", order("eve", 3)).unwrap();
        main.run().await.unwrap();
        main.context_mut().merge(branch.context()).unwrap();
        main.run().await.unwrap();
        let mut billing = Context::open(&path, "billing").unwrap();
        billing.create("order:9", order("zoe", 9)).unwrap();
    }
    for name in ["ledger-states.db", "stale-in-flight.db", "branches.db"] {
        // Fold the WAL into the file, so the fixture is one file.
        let conn = rusqlite::Connection::open(out.join(name)).unwrap();
        conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
    }
}

#[tokio::test]
async fn the_ledger_in_every_state_migrates_as_it_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of("ledger-states.db", dir.path());
    refused_read_only(&path, "orders");
    let ctx = Context::open(&path, "orders").unwrap();
    ctx.verify().unwrap();
    drop(ctx);
    let outbox = SqliteOutbox::open(&path).unwrap();
    assert_eq!(status(&outbox, "notify:order:1").await, DeliveryStatus::Delivered);
    let failed = entry(&outbox, "notify:order:2").await;
    assert_eq!(failed.status(), DeliveryStatus::Failed);
    assert!(failed.next_attempt_at().is_some());
    assert_eq!(status(&outbox, "notify:order:3").await, DeliveryStatus::Dead);
    assert_eq!(status(&outbox, "notify:order:4").await, DeliveryStatus::Held);
    assert_eq!(status(&outbox, "notify:order:5").await, DeliveryStatus::Pending);
    for key in ["notify:order:6", "notify:order:7"] {
        let in_flight = entry(&outbox, key).await;
        assert_eq!(in_flight.status(), DeliveryStatus::InFlight);
        assert_eq!(
            in_flight.lease().unwrap().token,
            FenceToken(1),
            "migrated leases take token 1"
        );
    }
    let interrupted = entry(&outbox, "notify:order:8").await;
    assert_eq!(
        (interrupted.status(), interrupted.interrupted_attempts()),
        (DeliveryStatus::Pending, 1)
    );

    // Open no longer reclaims: a claim reclaims order:7's expired
    // lease and leaves order:6's century.
    let owner: std::sync::Arc<str> = "test".into();
    let claimed = outbox
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit: 10,
            owner: &owner,
            lease: Duration::from_secs(30),
            now: std::time::SystemTime::now(),
            policy: ClaimPolicy::none(),
        })
        .await
        .unwrap();
    assert_eq!(claimed.reclaimed, 1);
    let mut keys: Vec<String> = claimed.claims.iter().map(|d| d.key().to_string()).collect();
    keys.sort();
    // order:2's retry fell due an hour after the fixture was written, long ago.
    assert_eq!(
        keys,
        ["notify:order:2", "notify:order:5", "notify:order:7", "notify:order:8"]
    );
    let seven = entry(&outbox, "notify:order:7").await;
    assert_eq!((seven.expired_leases(), seven.token()), (1, FenceToken(2)));
    assert_eq!(status(&outbox, "notify:order:6").await, DeliveryStatus::InFlight);
}

#[tokio::test]
async fn a_stale_in_flight_row_written_after_a_delivery_does_not_re_arm_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of("stale-in-flight.db", dir.path());
    refused_read_only(&path, "orders");
    let ctx = Context::open(&path, "orders").unwrap();
    ctx.verify().unwrap();
    drop(ctx);
    // The file's last v1 row for the key says "in flight" (a stale copy wrote it after the
    // delivery); delivered is final, so the migrated row is delivered, and no claim takes it.
    let outbox = SqliteOutbox::open(&path).unwrap();
    assert_eq!(status(&outbox, "notify:order:1").await, DeliveryStatus::Delivered);
    let owner: std::sync::Arc<str> = "test".into();
    let claimed = outbox
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit: 10,
            owner: &owner,
            lease: Duration::from_secs(30),
            now: std::time::SystemTime::now() + Duration::from_secs(3600),
            policy: ClaimPolicy::none(),
        })
        .await
        .unwrap();
    assert!(claimed.claims.is_empty() && claimed.integrity.is_empty());
    assert_eq!(status(&outbox, "notify:order:1").await, DeliveryStatus::Delivered);
}

#[tokio::test]
async fn branches_and_a_merge_migrate_reopen_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of("branches.db", dir.path());
    refused_read_only(&path, "main");
    // The first writable open migrates the whole file; the others then open read-only.
    drop(Context::open(&path, "main").unwrap());
    let read_only = OpenOptions::new().read_only(true);
    let main = Context::open_with(&path, "main", read_only.clone()).unwrap();
    let branch = Context::open_with(&path, "what-if", read_only.clone()).unwrap();
    let billing = Context::open_with(&path, "billing", read_only).unwrap();
    for ctx in [&main, &branch, &billing] {
        ctx.verify().unwrap();
    }
    assert!(
        main.log().unwrap().iter().any(|c| c.merged.is_some()),
        "main holds the merge commit"
    );
    assert!(
        main.get::<Order>("order:2").unwrap().is_some(),
        "the branch's order came in"
    );
    assert!(billing.get::<Order>("order:9").unwrap().is_some());
    drop((main, branch, billing));
    let outbox = SqliteOutbox::open(&path).unwrap();
    for key in ["notify:order:1", "notify:order:2", "notify:order:3"] {
        assert_eq!(status(&outbox, key).await, DeliveryStatus::Delivered, "{key}");
    }
    assert_eq!(entry(&outbox, "notify:order:2").await.origin().session(), "what-if");
}
