//! Ids starting with `action:` belong to intents: only `act` writes there, and a write of
//! another kind is refused with an error naming the id, never dropped in silence.

mod common;

use common::*;
use reactifact_core::error::{EffectError, RunError, RunFailure, WriteError};
use reactifact_core::{Agent, Context, PendingAction, Produce, ProduceCall, ProduceError, Runtime};

fn assert_reserved(error: &WriteError, id: &str, kind: &str) {
    let WriteError::Effect(EffectError::ReservedForIntents {
        id: found,
        kind: written,
    }) = error
    else {
        panic!("not a refusal of the action namespace: {error}");
    };
    assert_eq!((found.as_str(), written.as_str()), (id, kind));
    let message = error.to_string();
    assert!(
        message.contains(&format!("`{id}`")) && message.contains(kind),
        "{message}"
    );
    assert!(message.contains("act"), "{message}");
}

#[test]
fn direct_writes_of_another_kind_under_action_ids_are_refused() {
    let mut ctx = Context::new("t");
    let error = ctx.create("action:notify:order:1", order("ada", 1)).unwrap_err();
    assert_reserved(&error, "action:notify:order:1", "order");
    let error = ctx.update("action:x", order("ada", 1)).unwrap_err();
    assert_reserved(&error, "action:x", "order");
    let mut tx = ctx.transaction();
    tx.create("order:1", order("ada", 1));
    tx.create_once("action:y", order("bob", 2));
    let error = tx.commit().unwrap_err();
    assert_reserved(&error, "action:y", "order");
    assert!(ctx.is_empty(), "nothing of a refused transaction is written");
    assert!(ctx.log().unwrap().is_empty());
}

#[test]
fn ids_that_only_look_alike_are_not_reserved() {
    let mut ctx = Context::new("t");
    ctx.create("actions:1", order("ada", 1)).unwrap();
    ctx.create("reaction:1", order("ada", 1)).unwrap();
    assert_eq!(ctx.len(), 2);
}

#[tokio::test]
async fn a_produce_writing_another_kind_under_an_action_id_fails_and_commits_nothing() {
    let squatter = Produce::new("squat", |call: ProduceCall<Order>| async move {
        // The id the intent of `process_order` will take.
        call.effects.upsert(
            format!("action:notify:{}", call.trigger.id),
            Receipt {
                order: call.trigger.id.to_string(),
                total_cents: 0,
            },
        );
        Ok::<(), ProduceError>(())
    })
    .creates::<Receipt>();
    let recorder = Recorder::default();
    let ctx = seeded([("order:1".to_owned(), order("ada", 1200))]);
    let before = ctx.state_hash();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("squatter").priority(1).produce(squatter))
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap();
    let error = rt.run().await.unwrap_err();
    let RunError::Produce { first, .. } = &error else {
        panic!("not a produce failure: {error}");
    };
    assert_eq!(first.produce, "squat");
    let RunFailure::Effect(EffectError::ReservedForIntents { id, kind }) = &first.failure else {
        panic!("not a refusal of the action namespace: {error}");
    };
    assert_eq!((id.as_str(), kind.as_str()), ("action:notify:order:1", "receipt"));
    assert_eq!(rt.context().state_hash(), before);
    assert_eq!(rt.context().queued_events(), 1, "the generation's events stay queued");
    assert!(recorder.sent().is_empty());
    assert!(rt
        .context()
        .get::<PendingAction>("action:notify:order:1")
        .unwrap()
        .is_none());
}
