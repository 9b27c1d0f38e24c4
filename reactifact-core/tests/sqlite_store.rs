//! The SQLite store: persistence, resume, leases, and clear errors for bad input.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use reactifact_core::error::{OpenError, ReadError, RunError, StoreError, WriteError};
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::TurnOutcome;
use reactifact_core::{Agent, Context, DeliveryOptions, DispatchError, Intent, OpenOptions, Runtime};

fn runtime(ctx: Context, recorder: &Recorder) -> Runtime {
    Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_session_survives_reopening_with_its_state_log_and_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let recorder = Recorder::default();
    let (hash, head, commits) = {
        let mut ctx = Context::open(&path, "orders").unwrap();
        assert_eq!(ctx.store_description(), format!("sqlite:{}", path.display()));
        ctx.create("order:1", order("ada", 1200)).unwrap();
        ctx.link("order:1", "placed_by", "order:1").unwrap();
        let mut rt = runtime(ctx, &recorder);
        rt.run().await.unwrap();
        let ctx = rt.into_context();
        (ctx.state_hash(), ctx.head(), ctx.log().unwrap().len())
    };
    let ctx = Context::open(&path, "orders").unwrap();
    assert_eq!(ctx.state_hash(), hash);
    assert_eq!(ctx.head(), head);
    assert_eq!(ctx.log().unwrap().len(), commits);
    assert_eq!(ctx.queued_events(), 0);
    let receipt = ctx.get::<Receipt>("receipt:order:1").unwrap().unwrap();
    assert_eq!(receipt.data.total_cents, 1200);
    let delivery = ctx.ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(delivery.status(), DeliveryStatus::Delivered);
    assert_eq!(delivery.attempts(), 1);
    assert_eq!(ctx.list::<reactifact_core::PendingAction>().count(), 1);
    assert_eq!(ctx.snapshot().relations().count(), 1);

    // Re-deriving in a new process sends nothing: the ledger remembers the key.
    let mut rt = runtime(ctx, &recorder);
    rt.context_mut().update("order:1", order("ada", 1500)).unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!((report.runs, report.deliveries.delivered), (1, 0));
    assert_eq!(recorder.sent(), ["notify:order:1"]);
}

#[tokio::test]
async fn queued_events_and_pending_intents_resume_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut ctx = Context::open(&path, "orders").unwrap();
        ctx.create("order:1", order("ada", 1)).unwrap();
        ctx.create("order:2", order("bob", 2)).unwrap();
        // No dispatcher: the intent of order:1 stays pending; order:2's event stays queued.
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .build()
            .unwrap();
        let report = rt
            .run_with(reactifact_core::runtime::Budget::UNLIMITED.max_runs(1))
            .await
            .unwrap();
        assert_eq!(report.outcome, TurnOutcome::RunsExhausted);
        assert_eq!(rt.context().ledger().pending().await.unwrap(), 1);
        assert_eq!(
            rt.context().queued_events(),
            3,
            "order:2, receipt:order:1, action:notify:order:1"
        );
    }
    let ctx = Context::open(&path, "orders").unwrap();
    assert_eq!(ctx.queued_events(), 3);
    assert_eq!(ctx.ledger().pending().await.unwrap(), 1);
    let recorder = Recorder::default();
    let mut rt = runtime(ctx, &recorder);
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(recorder.sent(), ["notify:order:1", "notify:order:2"]);
    assert_eq!(rt.context().queued_events(), 0);
    let ctx = Context::open(&path, "orders").unwrap_or_else(|e| panic!("{e}"));
    drop(rt);
    assert_eq!(ctx.queued_events(), 0);
}

#[test]
fn events_of_direct_writes_stay_queued_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut ctx = Context::open(&path, "orders").unwrap();
        ctx.create("order:1", order("ada", 1)).unwrap();
        ctx.create("order:2", order("bob", 2)).unwrap();
    }
    let ctx = Context::open(&path, "orders").unwrap();
    let queued: Vec<_> = ctx.events().map(|e| e.id.to_string()).collect();
    assert_eq!(queued, ["order:1", "order:2"]);
    assert!(ctx
        .events()
        .all(|e| e.kind == reactifact_core::audit::EventKind::Created));
}

#[tokio::test]
async fn commit_hashes_are_the_same_in_memory_and_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let flow = |ctx: Context| async move {
        let mut ctx = ctx;
        ctx.create("order:1", order("ada", 1)).unwrap();
        ctx.create("order:2", order("bob", 2)).unwrap();
        let mut rt = runtime(ctx, &Recorder::default());
        rt.run().await.unwrap();
        rt.context().log().unwrap().iter().map(|c| c.hash).collect::<Vec<_>>()
    };
    let memory = flow(Context::new("orders")).await;
    let sqlite = flow(Context::open(dir.path().join("s.db"), "orders").unwrap()).await;
    assert_eq!(memory, sqlite);
}

#[tokio::test]
async fn sessions_in_one_file_are_independent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut a = Context::open(&path, "a").unwrap();
    let mut b = Context::open(&path, "b").unwrap();
    a.create("order:1", order("ada", 1)).unwrap();
    b.create("order:1", order("bob", 2)).unwrap();
    b.create("order:2", order("bob", 3)).unwrap();
    drop((a, b));
    let a = Context::open(&path, "a").unwrap();
    let b = Context::open(&path, "b").unwrap();
    assert_eq!(a.get::<Order>("order:1").unwrap().unwrap().data.customer, "ada");
    assert_eq!((a.len(), b.len()), (1, 2));
}

#[tokio::test(start_paused = true)]
async fn an_in_flight_delivery_whose_lease_expired_is_delivered_again_with_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut ctx = Context::open_with(&path, "orders", OpenOptions::new().lease(Duration::ZERO)).unwrap();
        ctx.create("order:1", order("ada", 1)).unwrap();
        // The dispatcher never returns, and the process "dies" with the intent in flight.
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(|_: Intent| std::future::pending::<Result<(), DispatchError>>())
            .build()
            .unwrap();
        crash_mid_turn(&mut rt).await;
    }
    // A lease of zero is taken as the shortest one; the restart comes after it expired.
    tokio::time::sleep(reactifact_core::store::MIN_LEASE).await;
    let ctx = Context::open_with(&path, "orders", OpenOptions::new().read_only(true)).unwrap();
    let entry = ctx.ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        entry.status(),
        DeliveryStatus::InFlight,
        "read-only opens reclaim nothing"
    );
    assert!(entry.lease().unwrap().owner.contains(&std::process::id().to_string()));
    drop(ctx);

    // Opening changes nothing in the outbox: the first claim of any drain reclaims the
    // expired lease.
    let ctx = Context::open(&path, "orders").unwrap();
    let entry = ctx.ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!((entry.status(), entry.attempts()), (DeliveryStatus::InFlight, 1));
    let recorder = Recorder::default();
    let mut rt = runtime(ctx, &recorder);
    rt.run().await.unwrap();
    assert_eq!(recorder.sent(), ["notify:order:1"]);
    let entry = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        (entry.status(), entry.attempts(), entry.expired_leases()),
        (DeliveryStatus::Delivered, 2, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_live_drain_delivers_a_crashed_holders_intent_once_its_lease_expires() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let lease = Duration::from_secs(60);
    {
        let mut ctx = Context::open_with(&path, "orders", OpenOptions::new().lease(lease)).unwrap();
        ctx.create("order:1", order("ada", 1)).unwrap();
        // The dispatcher never answers and the process dies: the file keeps the intent in
        // flight under this holder's lease.
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(|_: Intent| std::future::pending::<Result<(), DispatchError>>())
            .build()
            .unwrap();
        crash_mid_turn(&mut rt).await;
    }
    // A quick restart: the lease has not expired, so open leaves the intent in flight.
    let ctx = Context::open_with(&path, "orders", OpenOptions::new().lease(lease)).unwrap();
    assert_eq!(
        ctx.ledger().get("notify:order:1").await.unwrap().unwrap().status(),
        DeliveryStatus::InFlight
    );
    let recorder = Recorder::default();
    let mut rt = runtime(ctx, &recorder);
    let report = rt.flush().await.unwrap();
    assert_eq!(report.delivered, 0, "the lease still holds");
    assert_eq!(report.waiting, 1, "the intent in flight is waiting, not forgotten");

    // Riding it out: the drain sleeps until the lease expires, reclaims it and delivers it
    // with the same key — without another restart.
    let started = tokio::time::Instant::now();
    let report = rt.settle().await.unwrap();
    assert_eq!(report.delivered, 1);
    assert_eq!(recorder.sent(), ["notify:order:1"]);
    assert!(started.elapsed() <= lease, "waited {:?}", started.elapsed());
    let entry = rt.context().ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        (entry.status(), entry.attempts(), entry.expired_leases()),
        (DeliveryStatus::Delivered, 2, 1)
    );
    drop(rt);
    let entry = Context::open(&path, "orders")
        .unwrap()
        .ledger()
        .get("notify:order:1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((entry.status(), entry.expired_leases()), (DeliveryStatus::Delivered, 1));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_turn_writes_its_outcomes_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut ctx = Context::open(&path, "orders").unwrap();
        let mut tx = ctx.transaction();
        tx.create("order:1", order("ada", 1)).create("order:2", order("bob", 2));
        tx.commit().unwrap();
        // order:1 is refused with a 400 at once; order:2 hangs until the caller gives up.
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(|intent: Intent| async move {
                if intent.key().as_str() == "notify:order:1" {
                    return Err(DispatchError::permanent("400 bad request"));
                }
                std::future::pending().await
            })
            .delivery(DeliveryOptions::new().timeout(None))
            .build()
            .unwrap();
        assert!(tokio::time::timeout(Duration::from_secs(1), rt.run()).await.is_err());
    }
    // The file says what happened, not "in flight" for both until the lease expires.
    let ctx = Context::open_with(&path, "orders", OpenOptions::new().read_only(true)).unwrap();
    let refused = ctx.ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!((refused.status(), refused.attempts()), (DeliveryStatus::Dead, 1));
    let cut_off = ctx.ledger().get("notify:order:2").await.unwrap().unwrap();
    assert_eq!(
        (cut_off.status(), cut_off.attempts(), cut_off.interrupted_attempts()),
        (DeliveryStatus::Pending, 1, 1)
    );
    drop(ctx);
    // A restart delivers the cut-off one at once, with the same key, and not the 400.
    let recorder = Recorder::default();
    let mut rt = runtime(Context::open(&path, "orders").unwrap(), &recorder);
    assert_eq!(rt.flush().await.unwrap().delivered, 1);
    assert_eq!(recorder.sent(), ["notify:order:2"]);
}

#[tokio::test]
async fn a_failed_delivery_and_its_retry_are_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut ctx = Context::open(&path, "orders").unwrap();
        ctx.create("order:1", order("ada", 1)).unwrap();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .dispatcher(|_: Intent| async { Err::<(), _>(DispatchError::msg("smtp down")) })
            .delivery(DeliveryOptions::new().errors(reactifact_core::runtime::DeliveryErrors::FailLoud))
            .build()
            .unwrap();
        assert!(matches!(rt.run().await, Err(RunError::Delivery(_))));
    }
    let ctx = Context::open(&path, "orders").unwrap();
    let entry = ctx.ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        (entry.status(), entry.last_error()),
        (DeliveryStatus::Failed, Some("smtp down"))
    );
    let recorder = Recorder::default();
    let rt = runtime(ctx, &recorder);
    rt.retry("notify:order:1").await.unwrap();
    drop(rt);
    let ctx = Context::open(&path, "orders").unwrap();
    assert_eq!(ctx.ledger().pending().await.unwrap(), 1, "the re-arming was persisted");
    let mut rt = runtime(ctx, &recorder);
    assert_eq!(rt.flush().await.unwrap().delivered, 1);
    assert_eq!(recorder.sent(), ["notify:order:1"]);
}

#[tokio::test]
async fn a_second_writer_of_the_same_session_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut first = Context::open(&path, "orders").unwrap();
    let mut second = Context::open(&path, "orders").unwrap();
    first.create("order:1", order("ada", 1)).unwrap();
    let err = second.create("order:2", order("bob", 2)).unwrap_err();
    assert!(matches!(err, WriteError::Store(StoreError::Conflict { .. })), "{err}");
    assert!(err.to_string().contains("changed by another writer"), "{err}");
    assert!(
        second.get::<Order>("order:2").unwrap().is_none(),
        "the refused write was rolled back"
    );
    assert_eq!(second.queued_events(), 0);
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Note {
    text: String,
}

impl reactifact_core::Artifact for Note {
    const KIND: &'static str = "note";
}

#[tokio::test]
async fn a_stale_copy_cannot_move_the_consumed_events_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut ctx = Context::open(&path, "orders").unwrap();
        ctx.create(
            "note:1",
            Note {
                text: "no produce reacts to this".into(),
            },
        )
        .unwrap();
    }
    // Two copies of the session, both with the note's event queued.
    let live = Context::open(&path, "orders").unwrap();
    let stale = Context::open(&path, "orders").unwrap();
    let recorder = Recorder::default();
    let mut rt = runtime(live, &recorder);
    rt.context_mut().create("order:1", order("ada", 1)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(recorder.sent(), ["notify:order:1"]);
    assert_eq!(rt.context().queued_events(), 0);
    drop(rt);

    // The stale copy matches the note to no produce and consumes it: that would set the
    // session's consumed pointer back to before the order's events. The store refuses it; the
    // runtime reads the live copy's commits instead, finds nothing left to do, and sends
    // nothing.
    let mut stale = runtime(stale, &recorder);
    let report = stale.run().await.unwrap();
    assert_eq!(report.conflicts, 1, "the stale consumption was refused");
    assert_eq!(report.generations, 0);
    assert_eq!(stale.context().queued_events(), 0);
    assert_eq!(recorder.sent(), ["notify:order:1"]);
    drop(stale);

    // Nothing runs again.
    let reopened = Context::open(&path, "orders").unwrap();
    assert_eq!(reopened.queued_events(), 0, "the consumed events stay consumed");
    let mut rt = runtime(reopened, &recorder);
    let report = rt.run().await.unwrap();
    assert_eq!(report.generations, 0);
    assert_eq!(recorder.sent(), ["notify:order:1"]);
}

#[test]
fn a_file_that_is_not_a_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let text = "these are my notes, not a database\n".repeat(200);
    std::fs::write(&path, &text).unwrap();
    let err = Context::open(&path, "orders").unwrap_err();
    assert!(matches!(err, OpenError::NotADatabase { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!("{} is not a reactifact database (not a SQLite file)", path.display())
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
}

#[tokio::test]
async fn a_truncated_file_is_reported_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut ctx = Context::open(&path, "orders").unwrap();
        let mut tx = ctx.transaction();
        for i in 0..2000 {
            tx.create(format!("order:{i}"), order("ada", i));
        }
        tx.commit().unwrap();
    }
    // Fold the WAL into the main file, then cut it in half.
    let conn = rusqlite_checkpoint(&path);
    drop(conn);
    let len = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len / 2).unwrap();
    drop(file);
    let err = Context::open(&path, "orders").unwrap_err();
    assert!(
        matches!(err, OpenError::Corrupt { .. }),
        "expected a corrupt-file error, got {err:?}"
    );
    assert!(err.to_string().contains("is corrupt"), "{err}");
}

/// Opens and closes the file once more so SQLite checkpoints the WAL into it.
fn rusqlite_checkpoint(path: &std::path::Path) -> Context {
    let ctx = Context::open(path, "orders").unwrap();
    drop(ctx);
    Context::open_with(path, "orders", OpenOptions::new().read_only(true)).unwrap()
}

#[test]
fn a_missing_session_is_an_error_when_opening_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    Context::open(&path, "orders").unwrap();
    let err = Context::open_with(&path, "billing", OpenOptions::new().read_only(true)).unwrap_err();
    assert_eq!(err.to_string(), format!("{} has no session `billing`", path.display()));
    let err = Context::open_with(&path, "billing", OpenOptions::new().create(false)).unwrap_err();
    assert!(matches!(err, OpenError::NoSuchSession { .. }));
}

#[test]
fn a_read_only_context_refuses_writes_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    Context::open(&path, "orders")
        .unwrap()
        .create("order:1", order("ada", 1))
        .unwrap();
    let mut ctx = Context::open_with(&path, "orders", OpenOptions::new().read_only(true)).unwrap();
    let err = ctx.create("order:2", order("bob", 2)).unwrap_err();
    assert!(matches!(err, WriteError::Store(StoreError::ReadOnly { .. })), "{err}");
    assert!(ctx.get::<Order>("order:2").unwrap().is_none());
    let ctx = Context::open(&path, "orders").unwrap();
    assert_eq!(ctx.len(), 1);
}

#[test]
fn a_newer_schema_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    Context::open(&path, "orders").unwrap();
    set_user_version(&path, 99);
    let err = Context::open(&path, "orders").unwrap_err();
    assert!(
        matches!(
            err,
            OpenError::NewerSchema {
                found: 99,
                supported: 9,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade reactifact"), "{err}");
}

#[test]
fn a_foreign_file_with_a_negative_schema_version_is_refused_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("foreign.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE notes (body TEXT); PRAGMA user_version = -7;")
            .unwrap();
    }
    let err = Context::open(&path, "orders").unwrap_err();
    assert!(matches!(err, OpenError::Foreign { .. }), "{err:?}");
    let err = Context::open_with(&path, "orders", OpenOptions::new().read_only(true)).unwrap_err();
    assert!(matches!(err, OpenError::Foreign { .. }), "{err:?}");
}

/// Sets `PRAGMA user_version` with the sqlite3 file format directly: the header's 4-byte
/// big-endian field at offset 60.
fn set_user_version(path: &std::path::Path, version: u32) {
    // Make sure the WAL is folded into the main file first.
    drop(Context::open_with(path, "orders", OpenOptions::new().read_only(true)).unwrap());
    let mut bytes = std::fs::read(path).unwrap();
    bytes[60..64].copy_from_slice(&version.to_be_bytes());
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn stored_bytes_that_no_longer_decode_name_the_id_kind_and_type() {
    #[derive(serde::Serialize, serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct OrderV2 {
        customer: String,
        total_cents: u64,
        currency: String,
    }
    impl reactifact_core::Artifact for OrderV2 {
        const KIND: &'static str = "order";
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    Context::open(&path, "orders")
        .unwrap()
        .create("order:1", order("ada", 1))
        .unwrap();
    let ctx = Context::open(&path, "orders").unwrap();
    let err = ctx.get::<OrderV2>("order:1").unwrap_err();
    assert!(matches!(&err, ReadError::Decode { id, .. } if id == "order:1"));
    let message = err.to_string();
    assert!(
        message.contains("`order:1` of kind `order`") && message.contains("OrderV2"),
        "{message}"
    );
}

#[test]
fn a_tampered_commit_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut ctx = Context::open(&path, "orders").unwrap();
        ctx.create("order:1", order("ada", 1)).unwrap();
        ctx.create("order:2", order("bob", 2)).unwrap();
    }
    // Change the customer of order:1 inside the first commit's stored bytes: same length,
    // valid encoding, different content.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let runs: Vec<u8> = conn
        .query_row("SELECT runs FROM commits WHERE generation = 1", [], |row| row.get(0))
        .unwrap();
    let at = runs
        .windows(3)
        .position(|w| w == b"ada")
        .expect("the customer is in the blob");
    let mut tampered = runs.clone();
    tampered[at..at + 3].copy_from_slice(b"eve");
    conn.execute("UPDATE commits SET runs = ?1 WHERE generation = 1", [&tampered])
        .unwrap();
    drop(conn);

    let err = Context::open(&path, "orders").unwrap_err();
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("commit 1: replaying it does not give the state hash it recorded"),
        "{err}"
    );
}

/// Rewrites the outbox row of `key` directly (its digest left as it was), as something
/// outside reactifact would.
fn edit_outbox_row(path: &std::path::Path, key: &str, column: &str, edit: impl FnOnce(&mut Vec<u8>)) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut value: Vec<u8> = conn
        .query_row(
            &format!("SELECT CAST({column} AS BLOB) FROM outbox WHERE key = ?1"),
            [key],
            |row| row.get(0),
        )
        .unwrap();
    edit(&mut value);
    let sql = if column == "bytes" {
        format!("UPDATE outbox SET {column} = ?1 WHERE key = ?2")
    } else {
        format!("UPDATE outbox SET {column} = CAST(?1 AS TEXT) WHERE key = ?2")
    };
    conn.execute(&sql, rusqlite::params![value, key]).unwrap();
}

fn replace_once(blob: &mut [u8], from: &[u8], to: &[u8]) {
    let at = blob
        .windows(from.len())
        .position(|w| w == from)
        .expect("the bytes are in the blob");
    blob[at..at + to.len()].copy_from_slice(to);
}

/// Commits `notify:order:1` (customer `ada`) without delivering it, and returns the file.
async fn an_undelivered_intent(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("state.db");
    let mut ctx = Context::open(&path, "orders").unwrap();
    ctx.create("order:1", order("ada", 1)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    path
}

/// Claims everything due in the file's outbox.
async fn claim_all(path: &std::path::Path) -> reactifact_core::store::Claimed {
    let outbox = reactifact_core::store::SqliteOutbox::open(path).unwrap();
    let owner: Arc<str> = Arc::from("test");
    reactifact_core::store::OutboxStore::claim(
        &*outbox,
        reactifact_core::store::ClaimRequest {
            scope: &reactifact_core::Scope::all(),
            limit: 100,
            owner: &owner,
            lease: Duration::from_secs(30),
            now: std::time::SystemTime::now() + Duration::from_secs(1),
            policy: reactifact_core::store::ClaimPolicy::none(),
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_changed_payload_in_the_outbox_row_is_never_handed_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = an_undelivered_intent(dir.path()).await;
    edit_outbox_row(&path, "notify:order:1", "bytes", |blob| {
        replace_once(blob, b"ada", b"eve")
    });
    let claimed = claim_all(&path).await;
    assert!(claimed.claims.is_empty(), "the changed payload is not handed out");
    assert_eq!(claimed.integrity, ["notify:order:1".into()]);
    let outbox = reactifact_core::store::SqliteOutbox::open(&path).unwrap();
    let held = reactifact_core::store::OutboxStore::get(&*outbox, "notify:order:1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.status(), DeliveryStatus::Held);
    assert!(
        held.last_error().unwrap().starts_with("integrity:"),
        "{:?}",
        held.last_error()
    );
}

#[tokio::test]
async fn a_changed_key_in_the_outbox_row_neither_loses_the_intent_nor_sends_the_changed_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = an_undelivered_intent(dir.path()).await;
    edit_outbox_row(&path, "notify:order:1", "key", |key| {
        replace_once(key, b"notify:order:1", b"notify:order:7")
    });
    // The log's intent has no row: verify says so; a writable open registers it again from
    // the verified log.
    let read_only = Context::open_with(&path, "orders", OpenOptions::new().read_only(true)).unwrap();
    assert!(read_only.verify().is_err());
    drop(read_only);
    drop(Context::open(&path, "orders").unwrap());
    // Neither key goes out on its own: the changed row fails its check, and the committed
    // intent, registered again from the log, is held (its row may have been a delivered one).
    let claimed = claim_all(&path).await;
    assert!(claimed.claims.is_empty(), "{:?}", claimed.claims);
    assert_eq!(claimed.integrity, ["notify:order:7".into()]);
    let outbox = reactifact_core::store::SqliteOutbox::open(&path).unwrap();
    let held = reactifact_core::store::OutboxStore::get(&*outbox, "notify:order:1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.status(), DeliveryStatus::Held, "the committed intent is not lost");
    assert!(held.last_error().unwrap().starts_with("integrity:"));
    // An operator's retry sends the committed key with the committed payload.
    reactifact_core::store::OutboxStore::retry(&*outbox, "notify:order:1", std::time::SystemTime::now())
        .await
        .unwrap();
    drop(outbox);
    let claimed = claim_all(&path).await;
    let keys: Vec<String> = claimed.claims.iter().map(|d| d.key().to_string()).collect();
    assert_eq!(
        keys,
        ["notify:order:1"],
        "the committed key is handed out, the changed one is not"
    );
    let notify: Notify = claimed.claims[0].intent().payload().unwrap();
    assert_eq!(notify.customer, "ada", "with the committed payload");
}

#[test]
fn a_fork_of_a_fork_below_its_parents_fork_point_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut main = Context::open(&path, "main").unwrap();
    for i in 0..4 {
        main.create(format!("order:{i}"), order("ada", i)).unwrap();
    }
    let mut b1 = main.fork_at("b1", reactifact_core::runtime::Generation(2)).unwrap();
    b1.create("order:b1", order("bob", 10)).unwrap();
    // b2 forks b1 inside the part of b1's log that is main's.
    let mut b2 = b1.fork_at("b2", reactifact_core::runtime::Generation(1)).unwrap();
    b2.create("order:b2", order("cy", 20)).unwrap();
    let state_hash = b2.state_hash();
    drop((main, b1, b2));
    let b2 = Context::open(&path, "b2").unwrap();
    assert_eq!(b2.generation().0, 2);
    assert_eq!(b2.state_hash(), state_hash);
    assert!(b2.get::<Order>("order:0").unwrap().is_some());
    assert!(
        b2.get::<Order>("order:1").unwrap().is_none(),
        "main's second commit is not b2's"
    );
    b2.verify().unwrap();
}
