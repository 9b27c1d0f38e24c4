//! Edges of the PostgreSQL log: a reclaim the server aborts inside a commit's transaction is
//! reported (and retried) as itself, and every shape of session reopens — forks at 0, forks
//! without commits of their own, a fork of a fork below its parent's fork point, sessions
//! opened from a checkpoint at their head.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reactifact_core::error::RunError;
use reactifact_core::store::{ClaimPolicy, ClaimRequest, OutboxStore};
use reactifact_core::{Agent, Context, DispatchError, Intent, Runtime, Scope};

use common::flow::{open_store, order, process_order};
use common::Schemas;

/// A reclaim the server aborts inside a commit's transaction (here: as a deadlock) must be
/// reported as itself — retried as `Log::append` retries deadlocks, and retryable — not as
/// the claim's "current transaction is aborted" (25P02), which is neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_aborted_in_the_commit_transaction_is_reported_as_itself() {
    let Some(url) = common::url("a_reclaim_aborted_in_the_commit_transaction_is_reported_as_itself") else {
        return;
    };
    let schemas = Schemas::new(&url, "rv2_reclaim");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    let mut ctx = Context::open_store(store.clone(), "orders").await.unwrap();
    ctx.create("order:1", order(1)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    rt.run().await.unwrap(); // no dispatcher: the intent stays pending
    drop(rt);
    // Its holder died: claimed with a lease that has already expired.
    let owner: Arc<str> = Arc::from("dead-holder");
    let claimed = store
        .outbox()
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit: 10,
            owner: &owner,
            lease: Duration::ZERO,
            now: SystemTime::now(),
            policy: ClaimPolicy::none(),
        })
        .await
        .unwrap();
    assert_eq!(claimed.claims.len(), 1);
    // Every reclaim (in flight -> due) is aborted by the server as a deadlock.
    schemas
        .execute(&format!(
            r#"CREATE FUNCTION "{schema}".rv2_fail() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN
                 IF OLD.status = 1 AND NEW.status = 0 THEN
                   RAISE EXCEPTION 'injected deadlock' USING ERRCODE = '40P01';
                 END IF;
                 RETURN NEW;
               END $$;
               CREATE TRIGGER rv2_fail BEFORE UPDATE ON "{schema}".outbox
                 FOR EACH ROW EXECUTE FUNCTION "{schema}".rv2_fail();"#
        ))
        .await;
    let mut ctx = Context::open_store(store.clone(), "orders").await.unwrap();
    ctx.create("order:2", order(2)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(|_: Intent| async { Ok::<(), DispatchError>(()) })
        .build()
        .unwrap();
    let err = rt
        .run()
        .await
        .expect_err("every reclaim in the commit's transaction is aborted");
    let RunError::Store(e) = &err else {
        panic!("a store error: {err}")
    };
    let shown = format!("{e}");
    assert!(
        shown.contains("40P01"),
        "the error names the server's abort of the reclaim, not its consequence: {shown}"
    );
    assert!(e.is_retryable(), "a deadlock is retryable: {shown}");
}

/// The head check of `Backed::open` accepts every valid session shape: a fork at generation
/// 0, a fork with no commits of its own, a fork of a fork (inside the parent's part of the
/// log), a session whose newest checkpoint is its head (no tail), and the same for a fork.
/// Also: a no-op direct write on each (check_current) is accepted when current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_valid_session_shape_reopens() {
    use reactifact_core::runtime::Generation;
    let Some(url) = common::url("every_valid_session_shape_reopens") else {
        return;
    };
    let schemas = Schemas::new(&url, "rv2_shapes");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    let mut main = Context::open_store(store.clone(), "main").await.unwrap();
    let zero = main.fork("at-zero").unwrap();
    drop(zero);
    for i in 0..4 {
        main.create(format!("order:{i}"), order(i)).unwrap();
    }
    let mut b1 = main.fork_at("b1", Generation(2)).unwrap();
    let idle = main.fork("idle").unwrap();
    drop(idle);
    b1.create("order:b1", order(10)).unwrap();
    b1.create("order:b1b", order(11)).unwrap();
    // A fork of b1 inside main's part of b1's log, and one at b1's head.
    let mut b2 = b1.fork_at("b2", Generation(1)).unwrap();
    b2.create("order:b2", order(20)).unwrap();
    let b3 = b1.fork("b3").unwrap();
    drop(b3);
    // Checkpoints at the head: reopened with no tail.
    assert!(main.checkpoint().await.unwrap().is_some());
    assert!(b1.checkpoint().await.unwrap().is_some());
    let expect = [
        ("main", 4),
        ("at-zero", 0),
        ("idle", 4),
        ("b1", 4),
        ("b2", 2),
        ("b3", 4),
    ];
    drop((main, b1, b2));
    for (name, generation) in expect {
        let mut ctx = Context::open_store(store.clone(), name)
            .await
            .unwrap_or_else(|e| panic!("{name} reopens: {e}"));
        assert_eq!(ctx.generation().0, generation, "{name}");
        // A no-op write (the same content again) on a current copy is accepted.
        if generation > 0 {
            ctx.create("order:0", order(0))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        ctx.create("order:new", order(99))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        drop(ctx);
        let ctx = Context::open_store(store.clone(), name)
            .await
            .unwrap_or_else(|e| panic!("{name} reopens after a write: {e}"));
        assert_eq!(ctx.generation().0, generation + 1, "{name}");
    }
}
