//! An intent's origin names its commit by session and hash, so the lookup is right for an
//! intent recorded on a branch, in memory and after a reopen.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use reactifact_core::runtime::{Generation, Origin};
use reactifact_core::{ActionCall, Agent, Context, DispatchError, Intent, Router, Runtime};

fn recording(origins: &Arc<Mutex<Vec<Origin>>>) -> impl reactifact_core::Dispatcher {
    let origins = origins.clone();
    move |intent: Intent| {
        origins.lock().unwrap().push(intent.origin().clone());
        async { Ok::<(), DispatchError>(()) }
    }
}

/// `main` and a branch forked from it both go on committing; the branch records an intent at
/// a generation that `main`'s log holds as another commit (and, later, past `main`'s head).
async fn diverged() -> (Context, Context, Vec<Origin>) {
    let mut main = Context::new("main");
    main.create("seed", order("zoe", 1)).unwrap();
    let mut branch = main.fork("what-if").unwrap();
    main.create(
        "other",
        Receipt {
            order: "x".into(),
            total_cents: 0,
        },
    )
    .unwrap();

    let origins = Arc::new(Mutex::new(Vec::new()));
    branch
        .create(
            "filler",
            Receipt {
                order: "y".into(),
                total_cents: 1,
            },
        )
        .unwrap();
    branch.create("order:1", order("ada", 1200)).unwrap();
    let mut rt = Runtime::builder(branch)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recording(&origins))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let origins = origins.lock().unwrap().clone();
    (main, rt.into_context(), origins)
}

#[tokio::test]
async fn an_intent_recorded_on_a_branch_names_that_branch_and_its_commit() {
    let (main, branch, origins) = diverged().await;
    assert_eq!(origins.len(), 1, "the dispatcher saw the intent once");
    let seen = &origins[0];
    assert_eq!(seen.session(), "what-if");
    assert_eq!(
        seen.generation(),
        Generation(4),
        "seed, filler, order, then the produce's commit"
    );
    assert_eq!(seen.commit(), branch.log().unwrap()[3].hash);

    // On the branch, the documented lookup finds the recording run.
    let commit = branch
        .commit_of(seen)
        .unwrap()
        .expect("the commit is in the branch's log");
    assert_eq!(commit.runs[seen.run()].produce.as_deref(), Some("process_order"));
    // On main, generation 4 does not exist (main is at 2): no panic, no wrong commit.
    assert_eq!(main.generation(), Generation(2));
    assert!(main.commit_of(seen).unwrap().is_none());

    // The ledger, shared by both, keeps the same origin; provenance from main finds no run of
    // its own log, from the branch the right one.
    let delivery = main.ledger().get("notify:order:1").await.unwrap().unwrap();
    assert_eq!(delivery.origin(), seen);
    assert!(main.provenance("notify:order:1").await.unwrap().is_none());
    let why = branch.provenance("notify:order:1").await.unwrap().unwrap();
    assert_eq!(
        (why.generation, why.commit, why.run),
        (seen.generation(), seen.commit(), seen.run())
    );
}

#[tokio::test]
async fn a_generation_from_another_session_never_yields_the_wrong_commit() {
    let mut main = Context::new("main");
    main.create("seed", order("zoe", 1)).unwrap();
    let mut branch = main.fork("b").unwrap();
    // Both are now at generation 2 with different commits.
    main.create("main-only", order("main", 2)).unwrap();
    let origins = Arc::new(Mutex::new(Vec::new()));
    branch.create("order:1", order("ada", 3)).unwrap();
    let mut rt = Runtime::builder(branch)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(recording(&origins))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    main.create("main-again", order("main", 4)).unwrap();
    let origin = origins.lock().unwrap()[0].clone();
    assert_eq!(origin.generation(), Generation(3));
    assert_eq!(
        main.generation(),
        Generation(3),
        "main holds a commit at the same generation"
    );
    assert_ne!(main.log().unwrap()[2].hash, origin.commit());
    assert!(
        main.commit_of(&origin).unwrap().is_none(),
        "main's commit 3 is not the intent's"
    );
    assert!(rt.context().commit_of(&origin).unwrap().is_some());
}

#[tokio::test]
async fn a_router_handler_gets_the_origin_with_session_and_commit() {
    let mut ctx = Context::new("shop");
    ctx.create("order:1", order("ada", 5)).unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let router = {
        let calls = calls.clone();
        Router::new().on("notify", move |call: ActionCall<Notify>| {
            calls.lock().unwrap().push((call.origin.clone(), call.generation));
            async { Ok::<(), DispatchError>(()) }
        })
    };
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(router)
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let (origin, generation) = calls.lock().unwrap()[0].clone();
    assert_eq!(origin.session(), "shop");
    assert_eq!(generation, origin.generation());
    let commit = rt.context().commit_of(&origin).unwrap().unwrap();
    assert_eq!(commit.hash, origin.commit());
    assert_eq!(commit.runs[origin.run()].agent.as_deref(), Some("billing"));
}

#[tokio::test]
async fn the_origin_survives_a_reopen_of_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let mut main = Context::open(&path, "main").unwrap();
    main.create("seed", order("zoe", 1)).unwrap();
    let mut branch = main.fork("what-if").unwrap();
    main.create("main-only", order("main", 2)).unwrap();
    branch.create("order:1", order("ada", 3)).unwrap();
    // No dispatcher: the intent stays pending, so the reopened store must rebuild its origin.
    let mut rt = Runtime::builder(branch)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let before = rt
        .context()
        .ledger()
        .get("notify:order:1")
        .await
        .unwrap()
        .unwrap()
        .origin()
        .clone();
    assert_eq!(before.session(), "what-if");
    drop(rt);
    drop(main);

    let main = Context::open(&path, "main").unwrap();
    let branch = Context::open(&path, "what-if").unwrap();
    for ctx in [&main, &branch] {
        let after = ctx.ledger().get("notify:order:1").await.unwrap().unwrap();
        assert_eq!(after.origin(), &before, "from session {}", ctx.session());
    }
    assert!(main.commit_of(&before).unwrap().is_none());
    let commit = branch.commit_of(&before).unwrap().unwrap();
    assert_eq!(commit.runs[before.run()].produce.as_deref(), Some("process_order"));
}
