//! Sessions of a [`MemoryStore`] (the in-memory `LogStore`) through `Context::open_store`: a
//! runtime commits and delivers, the session reopened from the store (and from its
//! checkpoints) is the same session and verifies, a second writer is fenced, a fork lives in
//! the store, and verify refuses an outbox entry that names a commit of the log which did not
//! act it.

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use reactifact_core::audit::VerifyError;
use reactifact_core::error::{StoreError, WriteError};
use reactifact_core::runtime::{Generation, Origin, TurnOutcome};
use reactifact_core::store::{MemoryStore, NewIntent, OutboxStore, PurgeFilter};
use reactifact_core::{Agent, Context, Intent, OpenOptions, Runtime};

fn runtime(ctx: Context, recorder: &Recorder) -> Runtime {
    Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recorder.dispatcher())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_session_of_a_memory_store_reopens_as_it_was_and_verifies() {
    let store = MemoryStore::new();
    let options = OpenOptions::new().checkpoint_every(2);
    let mut ctx = Context::open_store_with(store.clone(), "orders", options.clone())
        .await
        .unwrap();
    assert_eq!(ctx.store_description(), "memory");
    let mut tx = ctx.transaction();
    for i in 0..5 {
        tx.create(format!("order:{i}"), order("ada", i));
    }
    tx.commit().unwrap();
    let recorder = Recorder::default();
    let mut rt = runtime(ctx, &recorder);
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.deliveries.delivered, 5);
    // One more commit, left with its events queued.
    rt.context_mut().create("order:9", order("bob", 9)).unwrap();
    rt.context_mut().checkpoint().await.unwrap();
    let (generation, state_hash) = (rt.context().generation(), rt.context().state_hash());
    let log_len = rt.context().log().unwrap().len();
    let queued = rt.context().queued_events();
    assert!(queued > 0, "the last commit's events are queued");
    drop(rt);

    let again = Context::open_store_with(store.clone(), "orders", options)
        .await
        .unwrap();
    assert_eq!(again.generation(), generation, "the session's generation");
    assert_eq!(again.state_hash(), state_hash, "the session's state");
    assert_eq!(again.queued_events(), queued, "its queued events");
    assert_eq!(again.log().unwrap().len(), log_len, "its whole log");
    again.verify().unwrap();
    assert_eq!(again.ledger().counts().await.unwrap().delivered, 5);
    let mut sent = recorder.sent();
    sent.sort();
    assert_eq!(sent, (0..5).map(|i| format!("notify:order:{i}")).collect::<Vec<_>>());

    // The reopened session runs on: the queued order is processed, delivered once.
    let mut rt = runtime(again, &recorder);
    assert_eq!(rt.run().await.unwrap().deliveries.delivered, 1);
    rt.context().verify().unwrap();
    assert_eq!(recorder.sent().len(), 6, "nothing delivered twice");

    // A purged key keeps its tombstone: verify still finds every act's key.
    let far = SystemTime::now() + Duration::from_secs(3600);
    assert_eq!(
        store.memory_outbox().purge(PurgeFilter::Final, far, 100).await.unwrap(),
        6
    );
    rt.context().verify().unwrap();
}

#[tokio::test]
async fn a_second_writer_is_fenced_and_a_fork_lives_in_the_store() {
    let store = MemoryStore::new();
    let mut first = Context::open_store(store.clone(), "orders").await.unwrap();
    let mut second = Context::open_store(store.clone(), "orders").await.unwrap();
    first.create("order:1", order("ada", 1)).unwrap();
    match second.create("order:2", order("bob", 2)) {
        Err(WriteError::Store(StoreError::Conflict { expected, .. })) => assert_eq!(expected, 0),
        other => panic!("a stale writer must be refused, got {other:?}"),
    }
    second.catch_up().await.unwrap();
    second.create("order:2", order("bob", 2)).unwrap();
    assert_eq!(second.generation(), Generation(2));

    let mut branch = second.fork("what-if").unwrap();
    branch.create("order:3", order("cy", 3)).unwrap();
    let reopened = Context::open_store(store.clone(), "what-if").await.unwrap();
    assert_eq!(reopened.state_hash(), branch.state_hash());
    assert_eq!(reopened.generation(), Generation(3));
    reopened.verify().unwrap();
    let parent = Context::open_store(store, "orders").await.unwrap();
    assert_eq!(parent.generation(), Generation(2), "the branch's commit is its own");
    assert_eq!(parent.state_hash(), second.state_hash());
}

#[tokio::test]
async fn verify_refuses_an_outbox_entry_its_commit_did_not_act() {
    let store = MemoryStore::new();
    let ctx = Context::open_store(store.clone(), "orders").await.unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    rt.context_mut().create("order:1", order("ada", 1)).unwrap();
    rt.run().await.unwrap();
    let ctx = rt.context();
    ctx.verify().unwrap();
    let last = ctx.log().unwrap().last().unwrap().clone();

    // An entry registered behind the log's back, naming its last commit as its origin.
    let forged: Vec<NewIntent> = reactifact_store_contract::new_intents("orders", 1, &[("forged", "notify")])
        .into_iter()
        .map(|new| NewIntent {
            intent: Intent::new(
                new.intent.key().clone(),
                new.intent.kind(),
                new.intent.payload_bytes().to_vec(),
                Origin::new("orders", last.hash, last.generation, 0),
                0,
            ),
            ..new
        })
        .collect();
    store.memory_outbox().register_intents(forged, SystemTime::now());
    match ctx.verify() {
        Err(VerifyError::OutboxForged { generation, key }) => {
            assert_eq!((generation, key.as_str()), (last.generation, "forged"));
        }
        other => panic!("verify must refuse the forged entry, got {other:?}"),
    }
}
