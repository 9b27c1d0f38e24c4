//! Provenance ("why was this action sent?"), content-derived keys and the audit export.

mod common;

use common::*;
use reactifact_core::runtime::{Generation, Usage, Version};
use reactifact_core::{Agent, Artifact, Context, PendingAction, Produce, ProduceCall, ProduceError, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Customer {
    email: String,
}

impl Artifact for Customer {
    const KIND: &'static str = "customer";
}

/// Emails the customer of an order, once per order content, reading the customer record.
fn email_customer() -> Produce {
    Produce::new("email_customer", |call: ProduceCall<Order>| async move {
        let customer_id = format!("customer:{}", call.trigger.data.customer);
        let email = call
            .snapshot
            .get::<Customer>(&customer_id)?
            .map(|c| c.data.email)
            .unwrap_or_default();
        call.effects.act("email", call.trigger.key("email"), &email);
        Ok::<(), ProduceError>(())
    })
    .creates::<PendingAction>()
}

async fn flow(ctx: Context, recorder: &Recorder) -> Context {
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .agent(Agent::new("mailer").produce(email_customer()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    rt.run().await.unwrap();
    // A second version of the order: a new email key (new content), the same notify key.
    rt.context_mut().update("order:1", order("ada", 1500)).unwrap();
    rt.run().await.unwrap();
    rt.into_context()
}

fn seed(ctx: &mut Context) {
    let mut tx = ctx.transaction();
    tx.create(
        "customer:ada",
        Customer {
            email: "ada@example.com".into(),
        },
    );
    tx.create("order:1", order("ada", 1200));
    tx.commit().unwrap();
}

#[tokio::test]
async fn provenance_of_an_intent_names_the_order_version_that_caused_it() {
    let recorder = Recorder::default();
    let mut ctx = Context::new("orders");
    seed(&mut ctx);
    let ctx = flow(ctx, &recorder).await;

    let why = ctx
        .provenance("notify:order:1")
        .await
        .unwrap()
        .expect("the intent was recorded");
    assert_eq!((why.agent(), why.produce()), (Some("billing"), Some("process_order")));
    assert_eq!(why.generation, Generation(2));
    assert_eq!(why.commit, ctx.log().unwrap()[1].hash);
    let trigger = why.trigger().unwrap();
    assert_eq!((trigger.id.as_str(), trigger.version), ("order:1", Version(1)));
    assert_eq!(
        trigger.hash,
        ctx.state_at(Generation(1)).unwrap().meta("order:1").unwrap().2
    );
    assert_eq!(why.delivery.as_ref().unwrap().attempts(), 1);
    assert_eq!(
        ctx.intent_origin("notify:order:1").unwrap(),
        Some((Generation(2), why.run))
    );
    assert!(
        why.to_string()
            .contains("by billing/process_order, triggered by `order:1` version 1"),
        "{why}"
    );

    // The email of the second order version: its reads name the customer version it saw.
    let current = ctx.get::<Order>("order:1").unwrap().unwrap();
    let key = current.key("email");
    let why = ctx.provenance(key.as_str()).await.unwrap().unwrap();
    assert_eq!(why.produce(), Some("email_customer"));
    assert_eq!(why.trigger().unwrap().version, Version(2));
    assert_eq!(why.trigger().unwrap().key("email"), key);
    assert_eq!(why.reads().len(), 1);
    assert_eq!(
        (why.reads()[0].id.as_str(), why.reads()[0].version),
        ("customer:ada", Some(Version(1)))
    );
    assert!(ctx.provenance("never:acted").await.unwrap().is_none());
}

#[tokio::test]
async fn content_keys_are_stable_across_re_derivation_and_change_with_content() {
    let recorder = Recorder::default();
    let mut ctx = Context::new("orders");
    seed(&mut ctx);
    let ctx = flow(ctx, &recorder).await;
    let emails: Vec<String> = recorder
        .sent()
        .into_iter()
        .filter(|k| k.starts_with("email:"))
        .collect();
    assert_eq!(emails.len(), 2, "one email per order content: {emails:?}");
    assert_ne!(emails[0], emails[1]);

    // Re-deriving on another context with the same content gives the same first key.
    let mut again = Context::new("again");
    seed(&mut again);
    let record = again.get::<Order>("order:1").unwrap().unwrap();
    assert_eq!(record.key("email").as_str(), emails[0]);
    assert_ne!(record.key("email"), record.key("notify"));

    // Same content under another id: another key.
    again.create("order:2", order("ada", 1200)).unwrap();
    let twin = again.get::<Order>("order:2").unwrap().unwrap();
    assert_eq!(twin.hash, record.hash);
    assert_ne!(twin.key("email"), record.key("email"));
    let _ = ctx;
}

#[tokio::test]
async fn reads_and_provenance_survive_reopening_a_stored_session() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let recorder = Recorder::default();
    let (before, head) = {
        let mut ctx = Context::open(&path, "orders").unwrap();
        seed(&mut ctx);
        let ctx = flow(ctx, &recorder).await;
        let key = ctx.get::<Order>("order:1").unwrap().unwrap().key("email");
        (
            ctx.provenance(key.as_str()).await.unwrap().unwrap().to_string(),
            ctx.head(),
        )
    };
    let ctx = Context::open(&path, "orders").unwrap();
    assert_eq!(ctx.head(), head);
    ctx.verify().unwrap();
    let key = ctx.get::<Order>("order:1").unwrap().unwrap().key("email");
    assert_eq!(ctx.provenance(key.as_str()).await.unwrap().unwrap().to_string(), before);
    assert!(before.contains("reading `customer:ada` version 1"), "{before}");
    drop(ctx);
}

#[tokio::test]
async fn the_audit_export_has_one_json_line_per_generation() {
    let recorder = Recorder::default();
    let mut ctx = Context::new("orders");
    seed(&mut ctx);
    let ctx = flow(ctx, &recorder).await;
    let mut out = Vec::new();
    let lines = ctx.export_audit(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let parsed: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        (lines, parsed.len()),
        (ctx.log().unwrap().len(), ctx.log().unwrap().len())
    );

    let first_run = &parsed[1];
    assert_eq!(first_run["generation"], 2);
    assert_eq!(first_run["hash"], ctx.log().unwrap()[1].hash.to_string());
    assert_eq!(first_run["parent"], ctx.log().unwrap()[0].hash.to_string());
    assert_eq!(first_run["state_hash"], ctx.log().unwrap()[1].state_hash.to_string());
    let billing = &first_run["runs"][0];
    assert_eq!(billing["produce"], "process_order");
    assert_eq!(billing["trigger"]["id"], "order:1");
    assert_eq!(billing["trigger"]["version"], 1);
    assert_eq!(billing["writes"][0]["id"], "receipt:order:1");
    assert_eq!(billing["writes"][0]["op"], "upsert");
    let intent = &billing["intents"][0];
    assert_eq!(intent["key"], "notify:order:1");
    assert_eq!(intent["created"], true);
    assert_eq!(intent["delivery"]["status"], "Delivered");
    assert_eq!(intent["delivery"]["attempts"], 1);
    let mailer = &first_run["runs"][1];
    assert_eq!(mailer["reads"][0]["id"], "customer:ada");
    assert_eq!(mailer["reads"][0]["version"], 1);

    // The run on order:1 version 2 re-derives the notify key: `act` finds the intent in its
    // snapshot and records nothing, so only the new email intent appears.
    let second = parsed.last().unwrap();
    assert_eq!(second["runs"][0]["intents"].as_array().unwrap().len(), 0);
    assert_eq!(second["runs"][1]["intents"][0]["kind"], "email");
}

/// Drafts a thank-you note for a receipt with a model (a recorded model call), and emails it.
fn draft_thanks() -> Produce {
    Produce::new("draft_thanks", |call: ProduceCall<Receipt>| async move {
        let prompt = format!("thank the customer for {}", call.trigger.data.order);
        let text: String = call
            .record_model("draft", "small-model", prompt, move |prompt: String| async move {
                Ok::<_, std::io::Error>((format!("Dear customer: {prompt}"), Usage::tokens(12, 34)))
            })
            .await?;
        call.effects.act("thanks", format!("thanks:{}", call.trigger.id), &text);
        Ok::<(), ProduceError>(())
    })
    .creates::<PendingAction>()
}

#[tokio::test]
async fn why_names_the_recorded_model_call_and_follows_the_triggers_back_to_the_outside_write() {
    let recorder = Recorder::default();
    let mut ctx = Context::new("shop");
    ctx.create("order:1", order("ada", 1200)).unwrap();
    // A second version of the order: the chain must name the version the receipt was made of.
    ctx.update("order:1", order("ada", 1500)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .agent(Agent::new("writer").produce(draft_thanks()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    let ctx = rt.context();
    let why = ctx
        .provenance("thanks:receipt:order:1")
        .await
        .unwrap()
        .expect("the intent has a provenance");
    assert_eq!(why.produce(), Some("draft_thanks"));
    let [call] = why.calls() else {
        panic!("one recorded call: {:?}", why.calls());
    };
    assert_eq!(
        (&*call.name, call.model.as_deref(), call.usage),
        ("draft", Some("small-model"), Usage::tokens(12, 34))
    );
    assert!(call.answer_bytes().is_some(), "the answer is recorded");

    let [receipt, order_write] = &why.chain[..] else {
        panic!("two causes: {:#?}", why.chain);
    };
    assert_eq!(receipt.record.produce.as_deref(), Some("process_order"));
    assert_eq!(receipt.wrote.id.as_str(), "receipt:order:1");
    assert_eq!(
        receipt.record.trigger.as_ref().map(|t| (t.id.as_str(), t.version)),
        Some(("order:1", Version(2)))
    );
    assert!(order_write.is_outside_write());
    assert_eq!(
        (
            order_write.wrote.id.as_str(),
            order_write.wrote.version,
            order_write.generation
        ),
        ("order:1", Version(2), Generation(2)),
        "the write of the version the receipt was made of, not the first"
    );
    assert!(why.started_by().is_some());
    let text = why.to_string();
    assert!(text.contains("calling `draft` (small-model)"), "{text}");
    assert!(
        text.contains("`order:1` version 2 was written from outside in commit 2"),
        "{text}"
    );
}

#[tokio::test]
async fn a_recorded_model_name_survives_a_reopen_of_a_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.db");
    let recorder = Recorder::default();
    let mut ctx = Context::open(&path, "shop").unwrap();
    ctx.create("order:1", order("ada", 1200)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .agent(Agent::new("writer").produce(draft_thanks()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    drop(rt);
    let ctx = Context::open(&path, "shop").unwrap();
    ctx.verify()
        .expect("the log verifies with the model in its hashed records");
    let why = ctx.provenance("thanks:receipt:order:1").await.unwrap().unwrap();
    assert_eq!(why.calls()[0].model.as_deref(), Some("small-model"));
    assert_eq!(why.chain.len(), 2);
}
