//! Human approval between a decision and its effect: an intent acted with
//! `act_with_approval` is committed but not delivered until approved, never after a
//! rejection, and the decision (who, when, why) survives a reopen of the SQLite store, is
//! covered by the row digest, and shows in provenance and the audit export.

mod common;

use std::path::Path;

use common::*;
use reactifact_core::error::{ApprovalError, RetryError};
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::store::Verdict;
use reactifact_core::{Agent, Context, OpenOptions, PendingAction, Produce, ProduceCall, ProduceError, Runtime};

/// The order flow, asking for approval before the `refund` it acts.
fn refund_flow() -> Produce {
    Produce::new("refund_order", |call: ProduceCall<Order>| async move {
        let id = call.trigger.id.to_string();
        call.effects.upsert(
            format!("receipt:{id}"),
            Receipt {
                order: id.clone(),
                total_cents: call.trigger.data.total_cents,
            },
        );
        call.effects.act_with_approval(
            "refund",
            format!("refund:{id}"),
            &Notify {
                customer: call.trigger.data.customer.clone(),
                order: id,
            },
        );
        Ok::<(), ProduceError>(())
    })
    .creates::<Receipt>()
    .creates::<PendingAction>()
}

fn runtime(ctx: Context, recorder: &Recorder) -> Runtime {
    Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(refund_flow()))
        .dispatcher(recorder.dispatcher())
        .build()
        .expect("a valid runtime")
}

/// A store with two orders committed by a turn: `refund:order:1` and `refund:order:2` await
/// approval.
async fn store_with_two_refunds(path: &Path, recorder: &Recorder) {
    let mut ctx = Context::open(path, "main").unwrap();
    ctx.create("order:1", order("ada", 1200)).unwrap();
    ctx.create("order:2", order("bob", 800)).unwrap();
    let mut rt = runtime(ctx, recorder);
    rt.run().await.expect("the turn commits");
    rt.settle().await.expect("nothing to deliver");
    assert!(recorder.sent().is_empty(), "nothing awaiting approval is delivered");
}

#[tokio::test]
async fn an_intent_awaiting_approval_survives_a_reopen_and_is_delivered_once_after_approval() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let recorder = Recorder::default();
    store_with_two_refunds(&path, &recorder).await;

    // A restart: the intents still await approval, and no drain hands them out.
    let ctx = Context::open(&path, "main").unwrap();
    ctx.verify().expect("the log verifies");
    let mut rt = runtime(ctx, &recorder);
    let d = rt.context().ledger().get("refund:order:1").await.unwrap().unwrap();
    assert_eq!((d.status(), d.decision()), (DeliveryStatus::AwaitingApproval, None));
    rt.run().await.unwrap();
    rt.flush().await.unwrap();
    assert!(recorder.sent().is_empty());

    let approved = rt.approve("refund:order:1", "ada@ops").await.expect("approve");
    assert_eq!(approved.status(), DeliveryStatus::Pending);
    rt.settle().await.unwrap();
    assert_eq!(recorder.sent(), ["refund:order:1"], "delivered once after approval");
    // Approving again changes nothing and sends nothing.
    let again = rt.approve("refund:order:1", "someone else").await.expect("idempotent");
    assert_eq!(again.status(), DeliveryStatus::Delivered);
    assert_eq!(again.decision().map(|d| d.by.as_str()), Some("ada@ops"));
    rt.settle().await.unwrap();
    drop(rt);

    // Another restart: the decision is kept, nothing is sent again, and re-deriving the
    // decision (a produce re-run on the same trigger) creates no second intent.
    let mut ctx = Context::open_with(&path, "main", OpenOptions::default().checkpoint_every(1)).unwrap();
    ctx.verify().expect("the log verifies");
    ctx.update("order:1", order("ada", 1200)).unwrap();
    let mut rt = runtime(ctx, &recorder);
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    assert_eq!(recorder.sent(), ["refund:order:1"]);
    let d = rt.context().ledger().get("refund:order:1").await.unwrap().unwrap();
    let decision = d.decision().expect("the decision survives a reopen");
    assert_eq!(
        (
            d.status(),
            decision.verdict,
            decision.by.as_str(),
            decision.reason.as_deref()
        ),
        (DeliveryStatus::Delivered, Verdict::Approved, "ada@ops", None)
    );
    assert_eq!(
        rt.context()
            .ledger()
            .get("refund:order:2")
            .await
            .unwrap()
            .unwrap()
            .status(),
        DeliveryStatus::AwaitingApproval
    );
}

#[tokio::test]
async fn a_rejected_intent_is_never_delivered_not_after_a_reopen_a_retry_or_a_re_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let recorder = Recorder::default();
    store_with_two_refunds(&path, &recorder).await;
    let mut rt = runtime(Context::open(&path, "main").unwrap(), &recorder);
    let rejected = rt
        .reject("refund:order:2", "bob@ops", "duplicate refund")
        .await
        .expect("reject");
    assert_eq!(rejected.status(), DeliveryStatus::Rejected);
    assert!(matches!(
        rt.approve("refund:order:2", "ada@ops").await,
        Err(ApprovalError::AlreadyDecided {
            verdict: Verdict::Rejected,
            ..
        })
    ));
    assert!(matches!(
        rt.retry("refund:order:2").await,
        Err(RetryError::NotFailed {
            status: DeliveryStatus::Rejected,
            ..
        })
    ));
    rt.settle().await.unwrap();
    drop(rt);

    let mut ctx = Context::open(&path, "main").unwrap();
    ctx.verify().expect("the log verifies");
    ctx.update("order:2", order("bob", 801)).unwrap();
    let mut rt = runtime(ctx, &recorder);
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    assert!(recorder.sent().is_empty(), "a rejected intent is never delivered");
    let d = rt.context().ledger().get("refund:order:2").await.unwrap().unwrap();
    let decision = d.decision().expect("kept");
    assert_eq!(
        (
            d.status(),
            decision.verdict,
            decision.by.as_str(),
            decision.reason.as_deref()
        ),
        (
            DeliveryStatus::Rejected,
            Verdict::Rejected,
            "bob@ops",
            Some("duplicate refund")
        )
    );

    // Provenance and the audit trail show the decision.
    let why = rt.context().provenance("refund:order:2").await.unwrap().unwrap();
    assert!(why.requires_approval);
    assert_eq!(why.decision().map(|d| d.verdict), Some(Verdict::Rejected));
    let text = why.to_string();
    assert!(text.contains("required approval: rejected by bob@ops"), "{text}");
    let mut audit = Vec::new();
    rt.context().export_audit(&mut audit).await.unwrap();
    let audit = String::from_utf8(audit).unwrap();
    let line = audit.lines().find(|l| l.contains("refund:order:2")).unwrap();
    let json: serde_json::Value = serde_json::from_str(line).unwrap();
    let intent = json["runs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["intents"].as_array().unwrap())
        .find(|i| i["key"] == "refund:order:2")
        .unwrap();
    assert_eq!(intent["requires_approval"], true);
    assert_eq!(intent["delivery"]["decision"]["verdict"], "rejected");
    assert_eq!(intent["delivery"]["decision"]["by"], "bob@ops");
    assert_eq!(intent["delivery"]["decision"]["reason"], "duplicate refund");
}

#[tokio::test]
async fn the_approval_is_part_of_the_hashed_decision_and_replays_the_same() {
    let run = || async {
        let ctx = seeded([("order:1".to_owned(), order("ada", 1200))]);
        let recorder = Recorder::default();
        let mut rt = runtime(ctx, &recorder);
        rt.run().await.unwrap();
        rt.into_context()
    };
    let (a, b) = (run().await, run().await);
    assert_eq!(
        a.state_hash(),
        b.state_hash(),
        "same state + produces + inputs, same hashes"
    );
    assert_eq!(a.head(), b.head());
    a.verify().expect("verify refolds the approval intent");
    // The same flow acting without approval commits other bytes, so another hash.
    let plain = {
        let ctx = seeded([("order:1".to_owned(), order("ada", 1200))]);
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .build()
            .unwrap();
        rt.run().await.unwrap();
        rt.into_context()
    };
    let action: PendingAction = a.get("action:refund:order:1").unwrap().unwrap().data;
    assert!(action.requires_approval);
    let action: PendingAction = plain.get("action:notify:order:1").unwrap().unwrap().data;
    assert!(!action.requires_approval);
}

#[tokio::test]
async fn a_changed_decision_column_is_caught_and_never_turns_a_rejection_into_a_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let recorder = Recorder::default();
    store_with_two_refunds(&path, &recorder).await;
    {
        let rt = runtime(Context::open(&path, "main").unwrap(), &recorder);
        rt.reject("refund:order:1", "bob@ops", "no").await.unwrap();
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    // A rejection flipped to an approval, and made due.
    conn.execute(
        "UPDATE outbox SET decision = 1, status = 0, due_at = 0 WHERE key = 'refund:order:1'",
        [],
    )
    .unwrap();
    // An intent awaiting approval made due, without any decision.
    conn.execute(
        "UPDATE outbox SET status = 0, due_at = 0 WHERE key = 'refund:order:2'",
        [],
    )
    .unwrap();
    drop(conn);
    let mut rt = runtime(Context::open(&path, "main").unwrap(), &recorder);
    assert!(
        rt.context().ledger().get("refund:order:1").await.is_err(),
        "a read of the changed row fails its integrity check"
    );
    rt.settle().await.unwrap();
    assert!(
        recorder.sent().is_empty(),
        "neither changed row is handed to a dispatcher"
    );
    for key in ["refund:order:1", "refund:order:2"] {
        let d = rt.context().ledger().get(key).await.unwrap().unwrap();
        assert_eq!(d.status(), DeliveryStatus::Held, "{key}");
        assert!(d.last_error().unwrap().starts_with("integrity:"), "{key}");
    }
    // An operator's retry of the held, never-approved intent puts it back to awaiting
    // approval, not to pending.
    let d = rt.retry("refund:order:2").await.unwrap();
    assert_eq!(d.status(), DeliveryStatus::AwaitingApproval);
    rt.settle().await.unwrap();
    assert!(recorder.sent().is_empty());
    rt.approve("refund:order:2", "ada@ops").await.unwrap();
    rt.settle().await.unwrap();
    assert_eq!(recorder.sent(), ["refund:order:2"]);
}

#[tokio::test]
async fn a_schema_4_file_reads_as_it_is_and_migrates_to_schema_5_keeping_every_digest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let mut ctx = Context::open(&path, "main").unwrap();
        ctx.create("order:1", order("ada", 1200)).unwrap();
        ctx.create("order:2", order("bob", 800)).unwrap();
        let recorder = Recorder::default();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order()))
            .build()
            .unwrap();
        rt.run().await.unwrap();
        drop(recorder);
    }
    // The file as a build of schema 4 left it: no decision columns (and no trace context of
    // schema 6, no group of schema 7), the old final index.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "DROP TABLE call_answers;
             DROP INDEX commits_hash;
             ALTER TABLE outbox DROP COLUMN decided_digest;
             DROP TABLE outbox_rates;
             DROP INDEX outbox_kind_due;
             DROP INDEX outbox_group_open;
             ALTER TABLE outbox DROP COLUMN grp;
             ALTER TABLE outbox DROP COLUMN trace_parent;
             DROP INDEX outbox_rejected;
             DROP INDEX outbox_final;
             CREATE INDEX outbox_final ON outbox (updated_at, seq) WHERE status IN (2, 6);
             ALTER TABLE outbox DROP COLUMN decision;
             ALTER TABLE outbox DROP COLUMN decided_by;
             ALTER TABLE outbox DROP COLUMN decided_at;
             ALTER TABLE outbox DROP COLUMN decision_reason;
             PRAGMA user_version = 4;",
        )
        .unwrap();
    }
    // Read-only: read as it is, the file unchanged.
    {
        let ctx = Context::open_with(&path, "main", OpenOptions::default().read_only(true)).unwrap();
        let d = ctx.ledger().get("notify:order:1").await.unwrap().unwrap();
        assert_eq!((d.status(), d.decision()), (DeliveryStatus::Pending, None));
        let version: i64 = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, 4, "a read-only open migrates nothing");
    }
    // Writable: migrated; every row still passes its digest; delivery works.
    let recorder = Recorder::default();
    let ctx = Context::open(&path, "main").unwrap();
    ctx.verify().expect("the log verifies after the migration");
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    rt.settle().await.unwrap();
    let mut sent = recorder.sent();
    sent.sort();
    assert_eq!(sent, ["notify:order:1", "notify:order:2"]);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(version, 9, "migrated through schema 5 to the current one");
}

/// A rejection changed in the file into an approval (with the row made due) is held at the
/// next claim; the operator's retry of the hold, as for any integrity hold, must not deliver
/// it: the held row's decision is dropped, so it awaits a decision again.
#[tokio::test]
async fn a_retry_of_a_held_tampered_rejection_awaits_a_decision_and_never_delivers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let recorder = Recorder::default();
    store_with_two_refunds(&path, &recorder).await;
    {
        let rt = runtime(Context::open(&path, "main").unwrap(), &recorder);
        rt.reject("refund:order:1", "bob@ops", "no").await.unwrap();
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE outbox SET decision = 1, status = 0, due_at = 0 WHERE key = 'refund:order:1'",
        [],
    )
    .unwrap();
    drop(conn);
    let mut rt = runtime(Context::open(&path, "main").unwrap(), &recorder);
    rt.settle().await.unwrap();
    assert!(recorder.sent().is_empty());
    let held = rt.context().ledger().get("refund:order:1").await.unwrap().unwrap();
    assert_eq!(held.status(), DeliveryStatus::Held);
    assert!(held.decision().is_none(), "the untrusted decision is dropped: {held:?}");
    assert!(
        held.last_error().unwrap().contains("decision it held is not trusted"),
        "{held:?}"
    );
    let d = rt.retry("refund:order:1").await.unwrap();
    assert_eq!(d.status(), DeliveryStatus::AwaitingApproval, "{d:?}");
    rt.settle().await.unwrap();
    assert!(recorder.sent().is_empty(), "a rejected intent was delivered");
}

/// A serving runtime (a day between polls, on the paused clock) delivers an intent at once when
/// a handle approves it, and never one a handle rejects.
#[tokio::test(start_paused = true)]
async fn a_handle_s_approval_wakes_a_serving_runtime_and_its_rejection_is_never_delivered() {
    let recorder = Recorder::default();
    let mut ctx = Context::new("main");
    ctx.create("order:1", order("ada", 1200)).unwrap();
    ctx.create("order:2", order("bob", 800)).unwrap();
    let mut rt = runtime(ctx, &recorder);
    let handle = rt.handle();
    let serving = tokio::spawn(async move {
        let report = rt.serve(std::time::Duration::from_secs(24 * 3600)).await;
        (rt, report)
    });
    // Let the first turn commit both intents, awaiting approval.
    while handle.approve("refund:order:1", "ada@ops").await.is_err() {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        handle
            .reject("refund:order:2", "bob@ops", "duplicate")
            .await
            .unwrap()
            .status(),
        DeliveryStatus::Rejected
    );
    // Well before the next poll: the approval woke the runtime, which delivered it.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(recorder.sent(), ["refund:order:1"]);
    assert!(matches!(
        handle.approve("refund:order:2", "ada@ops").await,
        Err(ApprovalError::AlreadyDecided { .. })
    ));
    handle.stop();
    let (rt, report) = serving.await.unwrap();
    report.unwrap();
    assert_eq!(
        recorder.sent(),
        ["refund:order:1"],
        "the rejected intent is never delivered"
    );
    let approved = rt.context().ledger().get("refund:order:1").await.unwrap().unwrap();
    assert_eq!(approved.status(), DeliveryStatus::Delivered);
    assert_eq!(approved.decision().map(|d| d.by.as_str()), Some("ada@ops"));
}
