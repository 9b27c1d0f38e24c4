//! Approvals bound to what they approve: a decision records the action hash of the intent it
//! was made on; no other bytes ever go out under it. Tried the way one would break it on
//! SQLite — the approved row's payload changed in the table, consistently (bytes, action hash
//! and row digest), or in full (its approved digest too) — and on the memory store: a purged
//! key acted again. A file of schema 8 keeps its decisions readable, without a digest.

mod common;

use std::path::Path;

use common::*;
use reactifact_core::audit::{ContentHash, VerifyError};
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::store::{PurgeFilter, Verdict};
use reactifact_core::{Agent, Context, OpenOptions, PendingAction, Produce, ProduceCall, ProduceError, Runtime};
use rusqlite::types::ValueRef;
use sha2::{Digest, Sha256};

/// The order flow, asking for approval before the `refund` it acts.
fn refund_flow() -> Produce {
    Produce::new("refund_order", |call: ProduceCall<Order>| async move {
        let id = call.trigger.id.to_string();
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
    .creates::<PendingAction>()
}

fn runtime(ctx: Context, recorder: &Recorder) -> Runtime {
    Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(refund_flow()))
        .dispatcher(recorder.dispatcher())
        .build()
        .expect("a valid runtime")
}

/// A store whose `refund:order:1` and `refund:order:2` await approval.
async fn store_with_two_refunds(path: &Path) {
    let mut ctx = Context::open(path, "main").unwrap();
    ctx.create("order:1", order("ada", 1200)).unwrap();
    ctx.create("order:2", order("bob", 800)).unwrap();
    let mut rt = runtime(ctx, &Recorder::default());
    rt.run().await.expect("the turn commits");
}

/// The action hash the outbox row of `key` holds.
fn action_hash(conn: &rusqlite::Connection, key: &str) -> ContentHash {
    let hash: Vec<u8> = conn
        .query_row("SELECT action_hash FROM outbox WHERE key = ?1", [key], |r| r.get(0))
        .unwrap();
    ContentHash(hash.try_into().unwrap())
}

/// The digest reactifact keeps beside an outbox row, computed the way it does (what a
/// tamper that means not to be noticed by the digest check recomputes): SHA-256 of a domain
/// and every column but `seq` and `digest`, each with its type and length; the four decision
/// columns only when one is set, and the approved digest only when it is set.
fn row_digest(conn: &rusqlite::Connection, key: &str) -> Vec<u8> {
    const COLUMNS: &str = "key, kind, session, origin_commit, origin_gen, origin_run, action_hash, bytes, \
         recorded_at, status, due_at, token, owner, lease_until, attempts, expired, interrupted, last_error, \
         cancel_reason, updated_at, delivered_at, next_attempt_at, decision, decided_by, decided_at, \
         decision_reason, decided_digest";
    conn.query_row(&format!("SELECT {COLUMNS} FROM outbox WHERE key = ?1"), [key], |row| {
        let value = |at: usize| row.get_ref(at).unwrap();
        let mut digested: Vec<ValueRef<'_>> = (0..22).map(value).collect();
        let decision: Vec<ValueRef<'_>> = (22..26).map(value).collect();
        let decided = value(26);
        if decision.iter().any(|v| *v != ValueRef::Null) || decided != ValueRef::Null {
            digested.extend(decision);
        }
        if decided != ValueRef::Null {
            digested.push(decided);
        }
        let mut h = Sha256::new();
        h.update(b"reactifact/outbox/row/v1\0");
        for v in digested {
            match v {
                ValueRef::Null => h.update([0]),
                ValueRef::Integer(i) => {
                    h.update([1]);
                    h.update(i.to_be_bytes());
                }
                ValueRef::Real(f) => {
                    h.update([2]);
                    h.update(f.to_bits().to_be_bytes());
                }
                ValueRef::Text(t) | ValueRef::Blob(t) => {
                    h.update([if matches!(v, ValueRef::Text(_)) { 3 } else { 4 }]);
                    h.update((t.len() as u64).to_be_bytes());
                    h.update(t);
                }
            }
        }
        Ok(h.finalize().to_vec())
    })
    .unwrap()
}

/// Changes the payload of `key`'s row in the table as a careful tamper would: new
/// `PendingAction` bytes (another customer), the action hash of those bytes, and the row
/// digest over it all — and, with `decided`, the approved digest too. Returns the new hash.
fn change_payload(path: &Path, key: &str, decided: bool) -> ContentHash {
    let conn = rusqlite::Connection::open(path).unwrap();
    let bytes: Vec<u8> = conn
        .query_row("SELECT bytes FROM outbox WHERE key = ?1", [key], |r| r.get(0))
        .unwrap();
    let mut action: PendingAction = rmp_serde::from_slice(&bytes).unwrap();
    action.payload = serde_json::to_vec(&Notify {
        customer: "mallory".into(),
        order: "order:1".into(),
    })
    .unwrap();
    let bytes = rmp_serde::to_vec_named(&action).unwrap();
    let hash = ContentHash::of(&bytes);
    conn.execute(
        "UPDATE outbox SET bytes = ?2, action_hash = ?3 WHERE key = ?1",
        rusqlite::params![key, bytes, &hash.as_bytes()[..]],
    )
    .unwrap();
    if decided {
        conn.execute(
            "UPDATE outbox SET decided_digest = ?2 WHERE key = ?1",
            rusqlite::params![key, &hash.as_bytes()[..]],
        )
        .unwrap();
    }
    let digest = row_digest(&conn, key);
    conn.execute(
        "UPDATE outbox SET digest = ?2 WHERE key = ?1",
        rusqlite::params![key, digest],
    )
    .unwrap();
    hash
}

#[tokio::test]
async fn an_approval_records_the_action_hash_and_survives_a_reopen_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    store_with_two_refunds(&path).await;
    let recorder = Recorder::default();
    {
        let rt = runtime(Context::open(&path, "main").unwrap(), &recorder);
        let approved = rt.approve("refund:order:1", "ada@ops").await.unwrap();
        let rejected = rt.reject("refund:order:2", "bob@ops", "duplicate").await.unwrap();
        let conn = rusqlite::Connection::open(&path).unwrap();
        assert_eq!(
            approved.decision().unwrap().digest,
            Some(action_hash(&conn, "refund:order:1"))
        );
        assert_eq!(
            rejected.decision().unwrap().digest,
            Some(action_hash(&conn, "refund:order:2"))
        );
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mut rt = runtime(Context::open(&path, "main").unwrap(), &recorder);
    rt.context().verify().expect("the log and its outbox verify");
    let d = rt.context().ledger().get("refund:order:1").await.unwrap().unwrap();
    let decision = d.decision().unwrap();
    let hash = action_hash(&conn, "refund:order:1");
    assert_eq!(
        (decision.verdict, decision.digest),
        (Verdict::Approved, Some(hash)),
        "the digest survives a reopen"
    );
    assert_eq!(
        decision.to_string(),
        format!("approved by ada@ops (digest {})", hash.short())
    );
    let why = rt.context().provenance("refund:order:1").await.unwrap().unwrap();
    assert!(
        why.to_string()
            .contains(&format!("approved by ada@ops of digest {}", hash.short())),
        "{why}"
    );
    let mut audit = Vec::new();
    rt.context().export_audit(&mut audit).await.unwrap();
    let audit = String::from_utf8(audit).unwrap();
    assert!(audit.contains(&format!(r#""digest":"{hash}""#)), "{audit}");
    rt.settle().await.unwrap();
    assert_eq!(recorder.sent(), ["refund:order:1"], "the approved bytes go out, once");
}

#[tokio::test]
async fn an_approved_row_whose_payload_was_changed_in_the_table_is_held_never_sent_and_named_by_verify() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    store_with_two_refunds(&path).await;
    let recorder = Recorder::default();
    let approved = {
        let rt = runtime(Context::open(&path, "main").unwrap(), &recorder);
        let d = rt.approve("refund:order:1", "ada@ops").await.unwrap();
        assert_eq!(d.status(), DeliveryStatus::Pending);
        d.decision().unwrap().digest.unwrap()
    };
    let changed = change_payload(&path, "refund:order:1", false);
    assert_ne!(changed, approved);

    let mut rt = runtime(Context::open(&path, "main").unwrap(), &recorder);
    // The row passes its digest check (the tamper recomputed it): only the binding sees it.
    let before = rt.context().ledger().get("refund:order:1").await.unwrap().unwrap();
    assert_eq!(before.status(), DeliveryStatus::Pending);
    rt.settle().await.unwrap();
    rt.settle().await.unwrap();
    assert!(recorder.sent().is_empty(), "bytes nobody approved were sent");
    let held = rt.context().ledger().get("refund:order:1").await.unwrap().unwrap();
    assert_eq!(held.status(), DeliveryStatus::Held);
    let error = held.last_error().unwrap();
    for named in [
        "refund:order:1".to_owned(),
        format!("approved for digest {approved}"),
        format!("its row holds {changed}"),
    ] {
        assert!(error.contains(&named), "{named} not in: {error}");
    }
    assert_eq!(
        held.decision().unwrap().digest,
        Some(approved),
        "the approval and what it approved stay on record"
    );
    // A retry of the hold does not send it either: the approval still does not cover it.
    rt.retry("refund:order:1").await.unwrap();
    rt.settle().await.unwrap();
    assert!(recorder.sent().is_empty());
    assert_eq!(
        rt.context()
            .ledger()
            .get("refund:order:1")
            .await
            .unwrap()
            .unwrap()
            .status(),
        DeliveryStatus::Held
    );

    match rt.context().verify() {
        Err(VerifyError::OutboxDecision {
            generation,
            key,
            verdict,
            decided,
            acted,
            held,
        }) => {
            assert_eq!(
                (key.as_str(), verdict, decided, acted, held),
                ("refund:order:1", Verdict::Approved, approved, approved, changed)
            );
            let message = VerifyError::OutboxDecision {
                generation,
                key,
                verdict,
                decided,
                acted,
                held,
            }
            .to_string();
            assert!(
                message.contains(&format!("commit {}", generation.0))
                    && message.contains("`refund:order:1`")
                    && message.contains(&approved.to_string())
                    && message.contains(&changed.to_string()),
                "{message}"
            );
        }
        other => panic!("verify did not name the approval: {other:?}"),
    }
    // The other intent is untouched: it still awaits its own decision.
    let other = rt.context().ledger().get("refund:order:2").await.unwrap().unwrap();
    assert_eq!(other.status(), DeliveryStatus::AwaitingApproval);
}

/// A row rewritten in full — its bytes, action hash, approved digest and row digest — hands
/// the claim nothing to compare with but itself; `verify`, which compares it with the log,
/// names the approval as bound to bytes the log never acted.
#[tokio::test]
async fn an_approval_moved_to_other_bytes_is_named_by_verify() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    store_with_two_refunds(&path).await;
    let approved = {
        let rt = runtime(Context::open(&path, "main").unwrap(), &Recorder::default());
        let d = rt.approve("refund:order:1", "ada@ops").await.unwrap();
        d.decision().unwrap().digest.unwrap()
    };
    let changed = change_payload(&path, "refund:order:1", true);
    let ctx = Context::open(&path, "main").unwrap();
    match ctx.verify() {
        Err(VerifyError::OutboxDecision {
            key,
            decided,
            acted,
            held,
            ..
        }) => assert_eq!(
            (key.as_str(), decided, acted, held),
            ("refund:order:1", changed, approved, changed)
        ),
        other => panic!("verify did not name the approval: {other:?}"),
    }
}

/// A file as a build of schema 8 left it, with an approval and a rejection recorded before
/// decisions had a digest: read as it is, then migrated; its decisions read without a digest,
/// every row keeps its digest, the approval is honoured as before and the rejection too.
#[tokio::test]
async fn a_schema_8_file_keeps_its_decisions_readable_without_a_digest_and_migrates_rewriting_no_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    store_with_two_refunds(&path).await;
    {
        let rt = runtime(Context::open(&path, "main").unwrap(), &Recorder::default());
        rt.approve("refund:order:1", "ada@ops").await.unwrap();
        rt.reject("refund:order:2", "bob@ops", "duplicate").await.unwrap();
    }
    // As schema 8 wrote them: decisions without a digest, rows digested without one.
    let digests = || -> Vec<(String, Vec<u8>)> {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let mut stmt = conn.prepare("SELECT key, digest FROM outbox ORDER BY seq").unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute("UPDATE outbox SET decided_digest = NULL", []).unwrap();
        for key in ["refund:order:1", "refund:order:2"] {
            let digest = row_digest(&conn, key);
            conn.execute(
                "UPDATE outbox SET digest = ?2 WHERE key = ?1",
                rusqlite::params![key, digest],
            )
            .unwrap();
        }
        conn.execute_batch(
            "DROP TABLE call_answers; DROP INDEX commits_hash; ALTER TABLE outbox DROP COLUMN decided_digest; PRAGMA user_version = 8;",
        )
        .unwrap();
    }
    let before = digests();
    let version = || -> i64 {
        rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap()
    };
    {
        let ctx = Context::open_with(&path, "main", OpenOptions::default().read_only(true)).unwrap();
        let d = ctx.ledger().get("refund:order:1").await.unwrap().unwrap();
        let decision = d.decision().unwrap();
        assert_eq!((decision.verdict, decision.digest), (Verdict::Approved, None));
        ctx.verify().expect("a version-8 file verifies as it is");
    }
    assert_eq!(version(), 8, "a read-only open migrates nothing");

    let recorder = Recorder::default();
    let mut rt = runtime(Context::open(&path, "main").unwrap(), &recorder);
    assert_eq!(version(), 9);
    assert_eq!(digests(), before, "the migration rewrote a row");
    rt.context().verify().expect("every row verifies after the migration");
    let rejected = rt.context().ledger().get("refund:order:2").await.unwrap().unwrap();
    assert_eq!(
        rejected.decision().map(|d| (d.verdict, d.digest, d.reason.as_deref())),
        Some((Verdict::Rejected, None, Some("duplicate")))
    );
    rt.settle().await.unwrap();
    assert_eq!(
        recorder.sent(),
        ["refund:order:1"],
        "an approval without a digest is honoured as before; a rejection never sends"
    );
}

/// On the memory store and SQLite: an approval is bound to the hash of the act the log
/// recorded; a key purged after its approved delivery is never registered again, so acting
/// it anew (a re-run that derives other bytes under it) cannot inherit the approval: nothing
/// is sent.
#[tokio::test]
async fn a_purged_and_re_acted_key_cannot_inherit_an_approval() {
    for durable in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let mut ctx = if durable {
            Context::open(&path, "main").unwrap()
        } else {
            Context::new("main")
        };
        ctx.create("order:1", order("ada", 1200)).unwrap();
        let recorder = Recorder::default();
        let mut rt = runtime(ctx, &recorder);
        rt.run().await.unwrap();
        let approved = rt.approve("refund:order:1", "ada@ops").await.unwrap();
        // Bound to the hash of the act the log recorded (the audit export's intent hash).
        let mut audit = Vec::new();
        rt.context().export_audit(&mut audit).await.unwrap();
        let acted = String::from_utf8(audit)
            .unwrap()
            .lines()
            .flat_map(|line| {
                let commit: serde_json::Value = serde_json::from_str(line).unwrap();
                let runs = commit["runs"].as_array().cloned().unwrap_or_default();
                runs.into_iter()
                    .flat_map(|run| run["intents"].as_array().cloned().unwrap_or_default())
            })
            .find(|intent| intent["key"] == "refund:order:1")
            .map(|intent| intent["hash"].as_str().unwrap().to_owned());
        assert_eq!(
            approved.decision().unwrap().digest.map(|h| h.to_string()),
            acted,
            "durable {durable}"
        );
        rt.settle().await.unwrap();
        assert_eq!(recorder.sent(), ["refund:order:1"], "durable {durable}");
        let far = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
        let purged = rt.context().outbox().purge(PurgeFilter::Final, far, 10).await.unwrap();
        assert_eq!(purged, 1, "durable {durable}");
        // The order changes: the produce runs again and acts the same key with other bytes.
        rt.context_mut().update("order:1", order("mallory", 99_999)).unwrap();
        rt.run().await.unwrap();
        rt.settle().await.unwrap();
        assert_eq!(
            recorder.sent(),
            ["refund:order:1"],
            "durable {durable}: other bytes went out under the old approval"
        );
        assert!(
            rt.context().ledger().get("refund:order:1").await.unwrap().is_none(),
            "durable {durable}: the purged key was registered again"
        );
    }
}
