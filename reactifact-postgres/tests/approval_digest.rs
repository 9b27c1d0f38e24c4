//! Approvals bound to what they approve, on PostgreSQL: an approval records the action hash
//! it was made on and keeps it across a reopen; an approved row whose payload is then changed
//! in the table (bytes, action hash and row digest, consistently) is held, never sent, and
//! named by `verify`. Runs when `REACTIFACT_TEST_POSTGRES_URL` is set (see `common`).

mod common;

use std::sync::{Arc, Mutex};

use reactifact_core::audit::{ContentHash, VerifyError};
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::store::Verdict;
use reactifact_core::{
    Agent, Context, DispatchError, Intent, PendingAction, Produce, ProduceCall, ProduceError, Runtime,
};

use common::flow::{open_store, order, Order};
use common::Schemas;

/// A `refund` intent per order, acted with approval.
fn refund_flow() -> Produce {
    Produce::new("refund_order", |call: ProduceCall<Order>| async move {
        let id = call.trigger.id.to_string();
        call.effects
            .act_with_approval("refund", format!("refund:{id}"), &call.trigger.data.customer);
        Ok::<(), ProduceError>(())
    })
    .creates::<PendingAction>()
}

fn runtime(ctx: Context, sent: &Arc<Mutex<Vec<String>>>) -> Runtime {
    let log = sent.clone();
    Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(refund_flow()))
        .dispatcher(move |intent: Intent| {
            log.lock().unwrap().push(intent.key().to_string());
            std::future::ready(Ok::<(), DispatchError>(()))
        })
        .build()
        .unwrap()
}

async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// Changes the payload of `key`'s row as a careful tamper would: new `PendingAction` bytes,
/// their action hash, and the row digest over it all. Returns the new action hash.
async fn change_payload(client: &tokio_postgres::Client, schema: &str, key: &str) -> ContentHash {
    let bytes: Vec<u8> = client
        .query_one(
            &format!("SELECT bytes FROM \"{schema}\".outbox WHERE key = $1"),
            &[&key],
        )
        .await
        .unwrap()
        .get(0);
    let mut action: PendingAction = rmp_serde::from_slice(&bytes).unwrap();
    action.payload = b"\"mallory\"".to_vec();
    let bytes = rmp_serde::to_vec_named(&action).unwrap();
    client
        .execute(
            &format!("UPDATE \"{schema}\".outbox SET bytes = $2, action_hash = sha256($2) WHERE key = $1"),
            &[&key, &bytes],
        )
        .await
        .unwrap();
    client
        .execute(
            &format!(
                "UPDATE \"{schema}\".outbox o SET digest = \"{schema}\".outbox_digest(o.key, o.kind, o.session,
                     o.origin_commit, o.origin_gen, o.origin_run, o.action_hash, o.bytes, o.recorded_at, o.status,
                     o.due_at, o.token, o.owner, o.lease_until, o.attempts, o.expired, o.interrupted, o.last_error,
                     o.cancel_reason, o.updated_at, o.delivered_at, o.next_attempt_at, o.decision, o.decided_by,
                     o.decided_at, o.decision_reason, o.decided_digest)
                 WHERE o.key = $1"
            ),
            &[&key],
        )
        .await
        .unwrap();
    ContentHash::of(&bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_row_changed_in_postgres_is_held_never_sent_and_named_by_verify() {
    let Some(url) = common::url("an_approved_row_changed_in_postgres_is_held_never_sent_and_named_by_verify") else {
        return;
    };
    let schemas = Schemas::new(&url, "appr_dig");
    let schema = schemas.name();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let approved = {
        let mut ctx = Context::open_store(open_store(&url, &schema).await, "orders")
            .await
            .unwrap();
        ctx.create("order:1", order(1)).unwrap();
        ctx.create("order:2", order(2)).unwrap();
        let mut rt = runtime(ctx, &sent);
        rt.run().await.unwrap();
        let d = rt.approve("refund:order:1", "ada@ops").await.unwrap();
        let rejected = rt.reject("refund:order:2", "bob@ops", "duplicate").await.unwrap();
        let held: Vec<u8> = client(&url)
            .await
            .query_one(
                &format!("SELECT action_hash FROM \"{schema}\".outbox WHERE key = 'refund:order:2'"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            rejected.decision().and_then(|d| d.digest).map(|h| h.0.to_vec()),
            Some(held),
            "a rejection is bound to the action hash too"
        );
        d.decision().unwrap().digest.expect("an approval records its digest")
    };
    // Reopened: the approval is kept with its digest, and verify passes.
    {
        let ctx = Context::open_store(open_store(&url, &schema).await, "orders")
            .await
            .unwrap();
        let d = ctx.ledger().get("refund:order:1").await.unwrap().unwrap();
        let decision = d.decision().unwrap();
        assert_eq!((decision.verdict, decision.digest), (Verdict::Approved, Some(approved)));
        ctx.verify().expect("verifies before the tamper");
    }

    let client = client(&url).await;
    let changed = change_payload(&client, &schema, "refund:order:1").await;
    assert_ne!(changed, approved);
    let ctx = Context::open_store(open_store(&url, &schema).await, "orders")
        .await
        .unwrap();
    let mut rt = runtime(ctx, &sent);
    let before = rt.context().ledger().get("refund:order:1").await.unwrap().unwrap();
    assert_eq!(
        before.status(),
        DeliveryStatus::Pending,
        "the row passes its digest check: only the binding sees the change"
    );
    rt.settle().await.unwrap();
    rt.settle().await.unwrap();
    assert!(sent.lock().unwrap().is_empty(), "bytes nobody approved were sent");
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
    assert_eq!(held.decision().unwrap().digest, Some(approved));
    match rt.context().verify() {
        Err(VerifyError::OutboxDecision {
            key,
            verdict,
            decided,
            acted,
            held,
            ..
        }) => assert_eq!(
            (key.as_str(), verdict, decided, acted, held),
            ("refund:order:1", Verdict::Approved, approved, approved, changed)
        ),
        other => panic!("verify did not name the approval: {other:?}"),
    }
}
