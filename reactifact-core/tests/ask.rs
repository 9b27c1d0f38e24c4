//! Questions for a human: `effects.ask` creates a pending `Question`; `Context::answer` is an
//! ordinary committed write whose update event wakes the produces triggered by `Question`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use reactifact_core::error::AnswerError;
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::Question;
use reactifact_core::{Agent, Context, PendingAction, Produce, ProduceCall, ProduceError, Runtime};

/// Asks whether to refund each order; counts its runs.
fn ask_flow(runs: Arc<AtomicUsize>) -> Produce {
    Produce::new("ask_refund", move |call: ProduceCall<Order>| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move {
            let id = call.trigger.id.to_string();
            call.effects
                .ask(format!("question:refund:{id}"), format!("refund {id} to its customer?"));
            Ok::<(), ProduceError>(())
        }
    })
    .creates::<Question>()
}

/// Acts on an answered question: a `yes` refunds, anything else does nothing.
fn on_answer() -> Produce {
    Produce::new("refund_on_yes", |call: ProduceCall<Question>| async move {
        let q = &call.trigger.data;
        if q.answer.as_deref() == Some("yes") {
            let key = format!("refund:{}", call.trigger.id);
            call.effects.act("refund", key, &q.text);
        }
        Ok::<(), ProduceError>(())
    })
    .creates::<PendingAction>()
}

fn runtime(ctx: Context, recorder: &Recorder, runs: Arc<AtomicUsize>) -> Runtime {
    Runtime::builder(ctx)
        .agent(Agent::new("support").produce(ask_flow(runs)).produce(on_answer()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap()
}

#[tokio::test]
async fn an_answer_is_a_committed_write_that_wakes_the_produces_waiting_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let recorder = Recorder::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut ctx = Context::open(&path, "main").unwrap();
    ctx.create("order:1", order("ada", 1200)).unwrap();
    ctx.create("order:2", order("bob", 800)).unwrap();
    let mut rt = runtime(ctx, &recorder, runs.clone());
    rt.run().await.unwrap();
    let q = rt
        .context()
        .get::<Question>("question:refund:order:1")
        .unwrap()
        .unwrap();
    assert_eq!(q.data.text, "refund order:1 to its customer?");
    assert!(!q.data.is_answered(), "pending until answered");
    assert!(
        rt.context().list::<PendingAction>().next().is_none(),
        "nothing acted yet"
    );
    // A re-run of the asking produce (the order edited) never resets the question.
    rt.context_mut()
        .answer("question:refund:order:2", "no", "bob@ops")
        .unwrap();
    rt.context_mut().update("order:2", order("bob", 801)).unwrap();
    rt.run().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let q2 = rt
        .context()
        .get::<Question>("question:refund:order:2")
        .unwrap()
        .unwrap();
    assert_eq!(q2.data.answer.as_deref(), Some("no"), "the answer survives a re-ask");
    assert!(recorder.sent().is_empty(), "a `no` acts nothing");
    drop(rt);

    // The question survives a restart; the answer, given then, wakes the waiting produce.
    let mut ctx = Context::open(&path, "main").unwrap();
    ctx.verify().unwrap();
    assert!(!ctx
        .get::<Question>("question:refund:order:1")
        .unwrap()
        .unwrap()
        .data
        .is_answered());
    ctx.answer("question:refund:order:1", "yes", "ada@ops").unwrap();
    let mut rt = runtime(ctx, &recorder, runs.clone());
    rt.run().await.unwrap();
    assert_eq!(recorder.sent(), ["refund:question:refund:order:1"]);
    let d = rt
        .context()
        .ledger()
        .get("refund:question:refund:order:1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.status(), DeliveryStatus::Delivered);
    let q = rt
        .context()
        .get::<Question>("question:refund:order:1")
        .unwrap()
        .unwrap();
    assert_eq!(
        (q.data.answer.as_deref(), q.data.answered_by.as_deref()),
        (Some("yes"), Some("ada@ops"))
    );
    rt.context().verify().expect("the answer is in the verified log");

    // The first answer stands.
    match rt.context_mut().answer("question:refund:order:1", "no", "eve") {
        Err(AnswerError::AlreadyAnswered { by, .. }) => assert_eq!(by, "ada@ops"),
        other => panic!("a second answer must be refused, got {other:?}"),
    }
    assert!(matches!(
        rt.context_mut().answer("question:none", "yes", "ada"),
        Err(AnswerError::NoSuchQuestion(_))
    ));
    assert!(matches!(
        rt.context_mut().answer("order:1", "yes", "ada"),
        Err(AnswerError::NotAQuestion { .. })
    ));
    rt.run().await.unwrap();
    assert_eq!(recorder.sent().len(), 1, "no second delivery");
}

/// Declared with the macro, like an intent: `also_creates = [Question]` types `ask`.
#[reactifact_core::produce(also_creates = [Question])]
async fn ask_by_macro(call: ProduceCall<Order>) {
    call.effects.ask(format!("question:{}", call.trigger.id), "ship it?");
}

#[tokio::test]
async fn a_produce_declares_its_questions_like_its_intents() {
    let ctx = seeded([("order:1".to_owned(), order("ada", 1200))]);
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("support").produce(ask_by_macro))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let q = rt.context().get::<Question>("question:order:1").unwrap().unwrap();
    assert_eq!((q.data.text.as_str(), q.data.answer.as_deref()), ("ship it?", None));
    rt.context_mut().answer("question:order:1", "yes", "").unwrap_err();
    rt.context_mut().answer("question:order:1", "yes", "ada").unwrap();
    assert!(rt
        .context()
        .get::<Question>("question:order:1")
        .unwrap()
        .unwrap()
        .data
        .is_answered());
}
