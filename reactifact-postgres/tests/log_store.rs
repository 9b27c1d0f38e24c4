//! Sessions' logs in PostgreSQL ([`PostgresStore`]): a runtime on it commits, delivers and
//! resumes as on SQLite; checkpoints shorten the open; verify checks the outbox against the
//! log; and two OS processes writing one session lose nothing and act no intent twice.
//! Runs when `REACTIFACT_TEST_POSTGRES_URL` is set (see `common`).

mod common;

use std::collections::HashSet;
use std::process::Command;
use std::sync::{Arc, Mutex};

use reactifact_core::audit::VerifyError;
use reactifact_core::error::{OpenError, StoreError, WriteError};
use reactifact_core::runtime::{Budget, Generation, TurnOutcome};
use reactifact_core::{
    Agent, Artifact, Context, DispatchError, Intent, OpenOptions, PendingAction, Produce, ProduceCall, ProduceError,
    Runtime,
};
use reactifact_postgres::{PostgresOptions, PostgresStore};
use serde::{Deserialize, Serialize};

use common::flow::{create_retrying, open_store, order, process_order, processed_once, Order, Receipt};
use common::Schemas;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_on_postgres_commits_delivers_and_resumes() {
    let Some(url) = common::url("a_runtime_on_postgres_commits_delivers_and_resumes") else {
        return;
    };
    let schemas = Schemas::new(&url, "log_rt");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    let mut ctx = Context::open_store(store.clone(), "orders").await.unwrap();
    assert!(
        ctx.store_description().starts_with("postgres://"),
        "{}",
        ctx.store_description()
    );
    let mut tx = ctx.transaction();
    for i in 0..20 {
        tx.create(format!("order:{i}"), order(i));
    }
    tx.commit().unwrap();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let log = sent.clone();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(move |intent: Intent| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(intent.key().to_string());
                Ok::<(), DispatchError>(())
            }
        })
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(report.deliveries.delivered, 20);
    let state_hash = rt.context().state_hash();
    let generation = rt.context().generation();
    drop(rt);

    // Another store handle (another process would do the same) reads what was committed.
    let again = open_store(&url, &schema).await;
    let ctx = Context::open_store(again, "orders").await.unwrap();
    assert_eq!(ctx.generation(), generation);
    assert_eq!(ctx.state_hash(), state_hash);
    assert_eq!(ctx.queued_events(), 0);
    ctx.verify().unwrap();
    let counts = ctx.ledger().counts().await.unwrap();
    assert_eq!(counts.delivered, 20);
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 20);
    assert_eq!(sent.iter().collect::<HashSet<_>>().len(), 20, "every key sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opens_from_its_checkpoint_and_still_verifies_its_whole_log() {
    let Some(url) = common::url("a_session_opens_from_its_checkpoint_and_still_verifies_its_whole_log") else {
        return;
    };
    let schemas = Schemas::new(&url, "log_ckpt");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    let options = OpenOptions::new().checkpoint_every(0);
    let mut ctx = Context::open_store_with(store.clone(), "orders", options.clone())
        .await
        .unwrap();
    for i in 0..7 {
        ctx.create(format!("order:{i}"), order(i)).unwrap();
    }
    assert_eq!(ctx.checkpoint().await.unwrap().map(|g| g.0), Some(7));
    ctx.create("order:7", order(7)).unwrap();
    let state_hash = ctx.state_hash();
    drop(ctx);

    let ctx = Context::open_store_with(store.clone(), "orders", options)
        .await
        .unwrap();
    assert_eq!(ctx.generation().0, 8);
    assert_eq!(ctx.state_hash(), state_hash);
    assert_eq!(ctx.queued_events(), 8, "the events of the checkpoint and of the tail");
    assert_eq!(ctx.log().unwrap().len(), 8, "the older commits are read on demand");
    let report = ctx.verify().unwrap();
    assert_eq!(report.commits, 8);

    // A damaged checkpoint is skipped: the open reads the whole log instead.
    schemas
        .execute(&format!(
            "UPDATE \"{schema}\".checkpoints SET body = body || '\\x00'::bytea"
        ))
        .await;
    let ctx = Context::open_store(store, "orders").await.unwrap();
    assert_eq!(ctx.state_hash(), state_hash);
}

/// Moves the origin run of `notify:order:1`'s outbox row by `by` and writes the digest of
/// what it then holds: a forged row that passes its own check.
fn forge_run(schema: &str, by: i64) -> String {
    forge(schema, "origin_run", by)
}

/// Moves `column` (an integer column of the row) by `by`, and writes a digest that checks out.
fn forge(schema: &str, column: &str, by: i64) -> String {
    let s = format!("\"{schema}\"");
    format!(
        "UPDATE {s}.outbox SET {column} = {column} + ({by}) WHERE key = 'notify:order:1';
         UPDATE {s}.outbox SET digest = {s}.outbox_digest(key, kind, session, origin_commit, origin_gen,
             origin_run, action_hash, bytes, recorded_at, status, due_at, token, owner, lease_until, attempts,
             expired, interrupted, last_error, cancel_reason, updated_at, delivered_at, next_attempt_at,
             decision, decided_by, decided_at, decision_reason)
          WHERE key = 'notify:order:1'"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_a_deleted_outbox_row_and_a_changed_commit_refuses_the_open() {
    let Some(url) = common::url("verify_names_a_deleted_outbox_row_and_a_changed_commit_refuses_the_open") else {
        return;
    };
    let schemas = Schemas::new(&url, "log_verify");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    let ctx = Context::open_store(store.clone(), "orders").await.unwrap();
    let mut ctx = ctx;
    ctx.create("order:1", order(1)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    drop(rt);

    // Commit 1 created the order, commit 2 (billing's generation) acted its intent: each
    // outbox error names it, as every other verify error names its commit.
    let ctx = Context::open_store(store.clone(), "orders").await.unwrap();
    ctx.verify().unwrap();
    let attempts =
        |by: i64| format!("UPDATE \"{schema}\".outbox SET attempts = attempts + ({by}) WHERE key = 'notify:order:1'");
    schemas.execute(&attempts(7)).await;
    match ctx.verify() {
        Err(
            err @ VerifyError::OutboxChanged {
                generation: Some(Generation(2)),
                ..
            },
        ) => assert!(
            err.to_string()
                .starts_with("commit 2: the outbox row of `notify:order:1`, which it acted, was changed: "),
            "{err}"
        ),
        other => panic!("expected the changed row, got {other:?}"),
    }
    schemas.execute(&attempts(-7)).await;
    ctx.verify().unwrap();
    // A row that names commit 2 as its origin, with another run, and a digest that checks out.
    schemas.execute(&forge_run(&schema, 1)).await;
    match ctx.verify() {
        Err(
            err @ VerifyError::OutboxForged {
                generation: Generation(2),
                ..
            },
        ) => assert_eq!(
            err.to_string(),
            "commit 2: the outbox row of `notify:order:1` names it as its origin, but it did not act it"
        ),
        other => panic!("expected the forged row, got {other:?}"),
    }
    schemas.execute(&forge_run(&schema, -1)).await;
    ctx.verify().unwrap();
    // The same with the origin's generation: the row names commit 2 by its hash, but
    // generation 5.
    schemas.execute(&forge(&schema, "origin_gen", 3)).await;
    assert!(
        matches!(
            ctx.verify(),
            Err(VerifyError::OutboxForged {
                generation: Generation(2),
                ..
            })
        ),
        "a row naming another generation of its commit is forged"
    );
    schemas.execute(&forge(&schema, "origin_gen", -3)).await;
    ctx.verify().unwrap();

    schemas
        .execute(&format!("DELETE FROM \"{schema}\".outbox WHERE key = 'notify:order:1'"))
        .await;
    match ctx.verify() {
        Err(err @ VerifyError::OutboxMissing { .. }) => {
            let VerifyError::OutboxMissing { generation, key } = &err else {
                unreachable!()
            };
            assert_eq!((*generation, key.as_str()), (Generation(2), "notify:order:1"));
            assert_eq!(
                err.to_string(),
                "commit 2: intent `notify:order:1`, which it acted, has no row in the store's outbox"
            );
        }
        other => panic!("expected the missing row, got {other:?}"),
    }
    drop(ctx);

    schemas
        .execute(&format!(
            "UPDATE \"{schema}\".commits SET state_hash = sha256(state_hash) WHERE generation = 1"
        ))
        .await;
    match Context::open_store(store, "orders").await {
        Err(OpenError::Corrupt { detail, .. }) => assert!(detail.contains("state hash"), "{detail}"),
        Err(other) => panic!("expected a corrupt log, got {other}"),
        Ok(_) => panic!("a changed commit opened"),
    }
}

/// A commit's record of how many events it consumed is in its hash: changed in its row, it
/// fails `verify` at that commit, and set back it verifies again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_count_of_consumed_events_fails_verify_at_its_commit() {
    let Some(url) = common::url("a_changed_count_of_consumed_events_fails_verify_at_its_commit") else {
        return;
    };
    let schemas = Schemas::new(&url, "log_consumed");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    let mut ctx = Context::open_store(store.clone(), "orders").await.unwrap();
    ctx.create("order:1", order(1)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let consumed = rt.context().log().unwrap()[1].events_consumed as i64;
    assert!(consumed > 0, "billing's generation consumed order:1's creation");
    drop(rt);

    for changed in [consumed + 1, consumed - 1, consumed] {
        schemas
            .execute(&format!(
                "UPDATE \"{schema}\".commits SET events_consumed = {changed} WHERE session = 'orders' AND generation = 2"
            ))
            .await;
        let ctx = Context::open_store(store.clone(), "orders").await.unwrap();
        if changed == consumed {
            ctx.verify().unwrap();
            continue;
        }
        match ctx.verify() {
            Err(err @ VerifyError::CommitHash { .. }) => assert!(
                err.to_string()
                    .starts_with("commit 2: its hash does not match its content"),
                "{changed}: {err}"
            ),
            other => panic!("{changed}: expected commit 2's hash to fail, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_is_refused_then_catches_up_and_a_fork_lives_beside_its_parent() {
    let Some(url) = common::url("a_stale_writer_is_refused_then_catches_up_and_a_fork_lives_beside_its_parent") else {
        return;
    };
    let schemas = Schemas::new(&url, "log_stale");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    let mut first = Context::open_store(store.clone(), "orders").await.unwrap();
    let mut second = Context::open_store(store.clone(), "orders").await.unwrap();
    first.create("order:1", order(1)).unwrap();
    let refused = second.create("order:2", order(2)).unwrap_err();
    assert!(
        matches!(refused, WriteError::Store(StoreError::Conflict { expected: 0, .. })),
        "{refused:?}"
    );
    assert_eq!(second.catch_up().await.unwrap(), 1);
    second.create("order:2", order(2)).unwrap();
    assert_eq!(second.generation().0, 2);
    assert_eq!(second.queued_events(), 2);

    let branch = second.fork("what-if").unwrap();
    let mut branch = branch;
    branch.create("order:3", order(3)).unwrap();
    drop((first, second, branch));
    let parent = Context::open_store(store.clone(), "orders").await.unwrap();
    let branch = Context::open_store(store.clone(), "what-if").await.unwrap();
    assert_eq!(parent.generation().0, 2);
    assert_eq!(branch.generation().0, 3);
    assert!(branch.get::<Order>("order:1").unwrap().is_some());
    assert!(parent.get::<Order>("order:3").unwrap().is_none());
    branch.verify().unwrap();
    assert!(matches!(
        Context::open_store_with(store, "nobody", OpenOptions::new().create(false)).await,
        Err(OpenError::NoSuchSession { .. })
    ));
}

/// The child writer of the two-process test: a no-op unless its variables are set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_writer() {
    let (Ok(url), Ok(schema), Ok(name)) = (
        std::env::var("RFT_CHILD_URL"),
        std::env::var("RFT_CHILD_SCHEMA"),
        std::env::var("RFT_CHILD_NAME"),
    ) else {
        return;
    };
    let n: u64 = std::env::var("RFT_CHILD_ORDERS").unwrap().parse().unwrap();
    let store = open_store(&url, &schema).await;
    let mut ctx = Context::open_store(store, "shared").await.unwrap();
    let mut refused = 0u64;
    // Waits (bounded) until the store holds `count` orders, catching up with the other writer.
    let wait_for = async |ctx: &mut Context, count: usize| {
        for _ in 0..3000 {
            ctx.catch_up().await.unwrap();
            if ctx.list::<Order>().count() >= count {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the other writer's orders never arrived");
    };
    // Both start seeding together (each writes a ready order first, then waits for the
    // other's), and start their runtimes once both seeded.
    // Direct writes: on a conflict, catch up and write again.
    refused += create_retrying(&mut ctx, &format!("order:{name}:ready"), order(0)).await;
    wait_for(&mut ctx, 2).await;
    for i in 0..n {
        refused += create_retrying(&mut ctx, &format!("order:{name}:{i}"), order(i)).await;
    }
    let total: usize = std::env::var("RFT_CHILD_TOTAL").unwrap().parse().unwrap();
    wait_for(&mut ctx, total).await;
    // Then generations, a few runs each, racing the other process's.
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    let mut conflicts = 0;
    loop {
        let report = rt.run_with(Budget::UNLIMITED.max_runs(3)).await.unwrap();
        conflicts += report.conflicts;
        if report.outcome == TurnOutcome::Completed {
            break;
        }
    }
    // Whatever the other process still commits after this one is done is its own to run.
    println!("CHILD {name} refused={refused} conflicts={conflicts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_writing_one_session_lose_nothing_and_act_no_intent_twice() {
    let Some(url) = common::url("two_processes_writing_one_session_lose_nothing_and_act_no_intent_twice") else {
        return;
    };
    let schemas = Schemas::new(&url, "log_race");
    let schema = schemas.name();
    // The schema exists before the children race to open it.
    drop(open_store(&url, &schema).await);
    const ORDERS: u64 = 60;
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            Command::new(&exe)
                .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
                .env("RFT_CHILD_URL", &url)
                .env("RFT_CHILD_SCHEMA", &schema)
                .env("RFT_CHILD_NAME", name)
                .env("RFT_CHILD_ORDERS", ORDERS.to_string())
                .env("RFT_CHILD_TOTAL", (2 * ORDERS + 2).to_string())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut lines = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "a child failed: {stdout}");
        // (The harness may print the test's name on the same line.)
        lines.extend(
            stdout
                .lines()
                .filter_map(|l| l.find("CHILD ").map(|at| l[at..].to_owned())),
        );
    }
    println!("{lines:?}");
    assert_eq!(lines.len(), 2, "both children reported");
    let count = |field: &str| -> u64 {
        lines
            .iter()
            .map(|l| {
                let at = l.find(field).unwrap() + field.len();
                l[at..].split_whitespace().next().unwrap().parse::<u64>().unwrap()
            })
            .sum()
    };
    // The race is real: writes were refused and generations ran again (each child runs
    // dozens of generations over one queue, one of them always finds the other's commit).
    assert!(count("refused=") > 0, "the direct writes never raced: {lines:?}");
    assert!(count("conflicts=") > 0, "the generations never raced: {lines:?}");

    let store = open_store(&url, &schema).await;
    let ctx = Context::open_store(store, "shared").await.unwrap();
    ctx.verify().unwrap();
    // Every order of both writers is there, with its receipt, and each was processed by one
    // committed run.
    for name in ["a", "b"] {
        for i in 0..ORDERS {
            let id = format!("order:{name}:{i}");
            assert!(ctx.get::<Order>(&id).unwrap().is_some(), "{id} was lost");
            assert!(
                ctx.get::<Receipt>(&format!("receipt:{id}")).unwrap().is_some(),
                "{id} has no receipt"
            );
        }
    }
    let processed = processed_once(&ctx);
    assert_eq!(
        processed.len() as u64,
        2 * ORDERS + 2,
        "each order, and each ready order"
    );
    assert_eq!(ctx.queued_events(), 0);
    let counts = ctx.ledger().counts().await.unwrap();
    assert_eq!(counts.pending, 2 * ORDERS + 2, "one intent per order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_connection_the_server_closed_is_connected_again() {
    let Some(url) = common::url("a_log_connection_the_server_closed_is_connected_again") else {
        return;
    };
    let schemas = Schemas::new(&url, "log_reconnect");
    let schema = schemas.name();
    // Connections of this test only, so that terminating them leaves other tests alone.
    let app = format!("rft_reconnect_{}", std::process::id());
    let separator = if url.contains('?') { '&' } else { '?' };
    let store = open_store(&format!("{url}{separator}application_name={app}"), &schema).await;
    let mut ctx = Context::open_store(store.clone(), "orders").await.unwrap();
    ctx.create("order:1", order(1)).unwrap();
    schemas
        .execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{app}'"
        ))
        .await;
    // The first write may still meet the closed connection (a retryable error, nothing
    // written); the next one connects again.
    let mut tries = 0;
    loop {
        tries += 1;
        match ctx.create("order:2", order(2)) {
            Ok(()) => break,
            Err(WriteError::Store(e)) if e.is_retryable() && tries < 3 => continue,
            Err(e) => panic!("after {tries} tries: {e}"),
        }
    }
    assert_eq!(ctx.generation().0, 2);
    drop(ctx);
    let reopened = Context::open_store(store, "orders").await.unwrap();
    assert_eq!(reopened.generation().0, 2);
    assert!(reopened.get::<Order>("order:2").unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_acting_shared_keys_in_opposite_orders_both_commit() {
    let Some(url) = common::url("two_sessions_acting_shared_keys_in_opposite_orders_both_commit") else {
        return;
    };
    let schemas = Schemas::new(&url, "log_deadlock");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    // A produce acting one intent per key of a batch, in the order the batch lists them.
    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    struct Batch {
        keys: Vec<String>,
    }
    impl Artifact for Batch {
        const KIND: &'static str = "batch";
    }
    let act_all = || {
        Produce::new("act_all", |call: ProduceCall<Batch>| async move {
            for key in &call.trigger.data.keys {
                call.effects.act("notify", key.clone(), key);
            }
            Ok::<(), ProduceError>(())
        })
        .creates::<PendingAction>()
    };
    let keys: Vec<String> = (0..300).map(|i| format!("shared:{i}")).collect();
    let mut tasks = Vec::new();
    for (session, forward) in [("forward", true), ("backward", false)] {
        let store = store.clone();
        let mut keys = keys.clone();
        if !forward {
            keys.reverse();
        }
        let produce = act_all();
        tasks.push(tokio::spawn(async move {
            for round in 0..10 {
                let mut ctx = Context::open_store(store.clone(), session).await.unwrap();
                let batch: Vec<String> = keys.iter().map(|k| format!("{k}:{round}")).collect();
                ctx.create(format!("batch:{round}"), Batch { keys: batch }).unwrap();
                let mut rt = Runtime::builder(ctx)
                    .agent(Agent::new("a").produce(produce.clone()))
                    .build()
                    .unwrap();
                rt.run()
                    .await
                    .unwrap_or_else(|e| panic!("{session} round {round}: {e}"));
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let ctx = Context::open_store(store, "forward").await.unwrap();
    assert_eq!(ctx.ledger().counts().await.unwrap().total(), 3000, "every key once");
}

#[tokio::test]
async fn a_refused_log_connection_is_an_error_not_a_panic() {
    let Some(url) = common::url("a_refused_log_connection_is_an_error_not_a_panic") else {
        return;
    };
    let schemas = Schemas::new(&url, "log_refused");
    let schema = schemas.name();
    let role = format!("rft_limited_{}", std::process::id());
    // A role that may hold two connections: the pool's first, and one of the log's three.
    schemas
        .execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN CONNECTION LIMIT 2; GRANT CREATE ON DATABASE test TO {role}"
        ))
        .await;
    // The same server and database, as that role.
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    let limited = format!("{scheme}://{role}@{host}");
    let opened = PostgresStore::open(
        PostgresOptions::new(&limited)
            .schema(&schema)
            .pool_size(1)
            .log_connections(3),
    )
    .await;
    let refused = opened.expect_err("the third connection is refused");
    assert!(refused.to_string().contains("127.0.0.1"), "{refused}");
    drop(schemas);
    let cleanup = Schemas::new(&url, "log_refused_cleanup");
    cleanup
        .execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await;
}

/// A run's recorded call is stored with its commit: a runtime on another store handle replays
/// it from PostgreSQL without calling again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_calls_are_stored_with_the_commit_and_replay_from_postgres() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let Some(url) = common::url("recorded_calls_are_stored_with_the_commit_and_replay_from_postgres") else {
        return;
    };
    let schemas = Schemas::new(&url, "log_calls");
    let schema = schemas.name();
    let calls = Arc::new(AtomicU64::new(0));
    let stamp = |calls: Arc<AtomicU64>| {
        Produce::new("stamp", move |call: ProduceCall<Order>| {
            let calls = calls.clone();
            async move {
                let quote: u64 = call
                    .record("quote", &call.trigger.data.total_cents, || async {
                        Ok::<u64, std::io::Error>(calls.fetch_add(1, Ordering::SeqCst) + 100)
                    })
                    .await?;
                let at = call.now();
                let secs = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
                call.effects.upsert(
                    format!("receipt:{}", call.trigger.id),
                    Receipt {
                        order: format!("{quote}@{secs}"),
                        total_cents: call.trigger.data.total_cents,
                    },
                );
                Ok::<(), ProduceError>(())
            }
        })
        .creates::<Receipt>()
    };
    let store = open_store(&url, &schema).await;
    let mut ctx = Context::open_store(store, "orders").await.unwrap();
    for i in 0..3 {
        ctx.create(format!("order:{i}"), order(i)).unwrap();
    }
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(stamp(calls.clone())))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    drop(rt);

    let again = open_store(&url, &schema).await;
    let ctx = Context::open_store(again, "orders").await.unwrap();
    ctx.verify().unwrap();
    let recorded: Vec<u64> = ctx
        .log()
        .unwrap()
        .iter()
        .flat_map(|c| &c.runs)
        .flat_map(|r| &r.calls)
        .filter(|c| &*c.name == "quote")
        .map(|c| c.answer::<u64>().unwrap().unwrap())
        .collect();
    assert_eq!(recorded.len(), 3);
    ctx.replay(&[Agent::new("billing").produce(stamp(calls.clone()))])
        .await
        .unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "the replay answered from the stored log"
    );
}
