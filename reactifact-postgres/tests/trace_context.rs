//! The PostgreSQL outbox keeps each intent's trace context beside it (schema 5, the
//! `trace_parent` column) beyond the contract's check: a commit of a runtime registers it, a
//! damaged value reads as none (or as another valid context) and never holds its row, and a
//! schema-4 store upgrades without rewriting a row. Runs when `REACTIFACT_TEST_POSTGRES_URL` is
//! set (see `common`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use reactifact_core::runtime::TraceParent;
use reactifact_core::store::{ClaimPolicy, ClaimRequest, OutboxStore};
use reactifact_core::{Agent, Context, Runtime, Scope};
use reactifact_postgres::{OpenError, PostgresOptions, PostgresOutbox};
use reactifact_store_contract::{at, new_intents, trace_of};

use common::flow::{open_store, order, process_order};
use common::Schemas;

/// A client of its own, its connection driven by a task.
async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// Every row's key and digest, in key order.
async fn digests(client: &tokio_postgres::Client, schema: &str) -> Vec<(String, Vec<u8>)> {
    let sql = format!("SELECT key, digest FROM \"{schema}\".outbox ORDER BY key");
    client
        .query(&sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, Vec<u8>>(1)))
        .collect()
}

/// The trace context the outbox keeps for `key`.
async fn kept(outbox: &dyn OutboxStore, key: &str) -> Option<TraceParent> {
    outbox
        .get(key)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no entry for {key}"))
        .intent()
        .trace_parent()
        .copied()
}

async fn claim_all(outbox: &dyn OutboxStore, now_ms: u64) -> reactifact_core::store::Claimed {
    let owner: Arc<str> = Arc::from("drainer");
    outbox
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit: 10,
            owner: &owner,
            lease: Duration::from_secs(60),
            now: at(now_ms),
            policy: ClaimPolicy::none(),
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn a_runtime_s_commit_registers_the_trace_context_of_the_run_that_acted_it() {
    let Some(url) = common::url("a_runtime_s_commit_registers_the_trace_context_of_the_run_that_acted_it") else {
        return;
    };
    let schemas = Schemas::new(&url, "trace");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    let mut ctx = Context::open_store(store.clone(), "main").await.unwrap();
    ctx.create("order:1", order(1)).unwrap();
    ctx.create("order:2", order(2)).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let outbox = store.outbox();
    let one = kept(&**outbox, "notify:order:1").await.expect("a trace context");
    let two = kept(&**outbox, "notify:order:2").await.expect("a trace context");
    assert_eq!(one.trace_id(), two.trace_id(), "one turn, one trace");
    assert_ne!(one.parent_id(), two.parent_id(), "each run is a span of its own");
    let stored: Vec<u8> = client(&url)
        .await
        .query_one(
            &format!("SELECT trace_parent FROM \"{schema}\".outbox WHERE key = 'notify:order:1'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, one.to_bytes(), "kept as the 25 bytes of its encoding");
    rt.context().verify().expect("the trace context is not part of the log");
}

#[tokio::test]
async fn a_damaged_trace_context_reads_as_none_or_another_and_the_row_is_still_claimed_never_held() {
    let Some(url) =
        common::url("a_damaged_trace_context_reads_as_none_or_another_and_the_row_is_still_claimed_never_held")
    else {
        return;
    };
    let schemas = Schemas::new(&url, "tracedmg");
    let schema = schemas.name();
    let o = PostgresOutbox::open(PostgresOptions::new(&url).schema(&schema).pool_size(2))
        .await
        .unwrap();
    o.register_alone(
        &new_intents(
            "a",
            1,
            &[("short", "x"), ("zero", "x"), ("flipped", "x"), ("intact", "x")],
        ),
        at(0),
    )
    .await
    .unwrap();
    let client = client(&url).await;
    let before = digests(&client, &schema).await;
    client
        .batch_execute(&format!(
            "UPDATE \"{schema}\".outbox SET trace_parent = '\\x00'::bytea WHERE key = 'short';
             UPDATE \"{schema}\".outbox SET trace_parent = decode(repeat('00', 25), 'hex') WHERE key = 'zero';
             UPDATE \"{schema}\".outbox SET trace_parent = set_byte(trace_parent, 0, get_byte(trace_parent, 0) # 255)
              WHERE key = 'flipped';"
        ))
        .await
        .unwrap();
    assert_eq!(
        digests(&client, &schema).await,
        before,
        "the trace context is outside the digest"
    );
    assert_eq!(kept(&*o, "short").await, None);
    assert_eq!(kept(&*o, "zero").await, None);
    let flipped = kept(&*o, "flipped").await.expect("still a valid context");
    assert_ne!(flipped, trace_of("flipped"));
    assert_eq!(flipped.parent_id(), trace_of("flipped").parent_id());
    assert_eq!(kept(&*o, "intact").await, Some(trace_of("intact")));

    let taken = claim_all(&*o, 1).await;
    assert!(
        taken.integrity.is_empty(),
        "a damaged trace context holds nothing: {:?}",
        taken.integrity
    );
    let handed: Vec<(&str, Option<TraceParent>)> = taken
        .claims
        .iter()
        .map(|d| (d.key().as_str(), d.intent().trace_parent().copied()))
        .collect();
    assert_eq!(
        handed,
        [
            ("short", None),
            ("zero", None),
            ("flipped", Some(flipped)),
            ("intact", Some(trace_of("intact"))),
        ]
    );
}

#[tokio::test]
async fn a_schema_4_store_upgrades_to_trace_context_keeping_every_digest() {
    let Some(url) = common::url("a_schema_4_store_upgrades_to_trace_context_keeping_every_digest") else {
        return;
    };
    let schemas = Schemas::new(&url, "traceup");
    let schema = schemas.name();
    let options = || PostgresOptions::new(&url).schema(&schema).pool_size(2);
    let o = PostgresOutbox::open(options()).await.unwrap();
    o.register_alone(&new_intents("a", 1, &[("old", "x"), ("older", "x")]), at(0))
        .await
        .unwrap();
    drop(o);
    // The store as a build of schema 4 left it.
    let client = client(&url).await;
    client
        .batch_execute(&format!(
            "DROP TABLE \"{schema}\".call_answers;
             ALTER TABLE \"{schema}\".outbox DROP COLUMN decided_digest;
             DROP FUNCTION \"{schema}\".outbox_digest(text, text, text, bytea, bigint, bigint, bytea, bytea, bigint,
                 bigint, bigint, bigint, text, bigint, bigint, bigint, bigint, text, text, bigint, bigint, bigint,
                 bigint, text, bigint, text, bytea);
             DROP TABLE \"{schema}\".outbox_rates;
             DROP INDEX \"{schema}\".outbox_kind_due;
             DROP INDEX \"{schema}\".outbox_session_due;
             DROP INDEX \"{schema}\".outbox_group_open;
             ALTER TABLE \"{schema}\".outbox DROP COLUMN grp;
             ALTER TABLE \"{schema}\".outbox DROP COLUMN trace_parent;
             DELETE FROM \"{schema}\".schema_version WHERE version IN (5, 6, 7, 8)"
        ))
        .await
        .unwrap();
    let before = digests(&client, &schema).await;
    let refused = PostgresOutbox::open(options().allow_migration(false))
        .await
        .expect_err("older");
    assert!(
        matches!(
            refused,
            OpenError::OlderSchema {
                found: 4,
                supported: 8,
                ..
            }
        ),
        "{refused:?}"
    );

    let o = PostgresOutbox::open(options()).await.unwrap();
    assert_eq!(digests(&client, &schema).await, before, "the migration rewrites no row");
    assert_eq!(kept(&*o, "old").await, None, "registered before: no trace context");
    o.register_alone(&new_intents("a", 2, &[("new", "x")]), at(1))
        .await
        .unwrap();
    assert_eq!(kept(&*o, "new").await, Some(trace_of("new")));
    let taken = claim_all(&*o, 2).await;
    assert!(taken.integrity.is_empty(), "{:?}", taken.integrity);
    assert_eq!(taken.claims.len(), 3, "rows of schema 4 are claimed");
}
