//! A PostgreSQL store's sessions are listed as a SQLite file's are, by one type
//! (`store::SessionInfo`): the same history — a root session that consumed events and left
//! one unconsumed, a branch forked at a past commit with commits of its own, a branch
//! without any, a session without commits — gives the same values in both, the creation
//! times aside; a listing on connections the server makes read-only works and changes no row;
//! and a row changed outside reactifact is refused, naming the session.
//! Runs when `REACTIFACT_TEST_POSTGRES_URL` is set (see `common`).

mod common;

use std::path::Path;
use std::time::UNIX_EPOCH;

use reactifact_core::runtime::Generation;
use reactifact_core::store::{list_sessions, SessionInfo};
use reactifact_core::{Agent, Context, Runtime};
use reactifact_postgres::{PostgresOptions, PostgresStore};

use common::flow::{open_store, order, process_order};
use common::Schemas;

/// Runs the order flow on `ctx` until it is idle (no dispatcher: intents stay pending).
async fn run(ctx: Context) -> Context {
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.into_context()
}

/// Writes the history into the store of `orders`, a new session of it: two orders and the
/// flow run on them, then a third order left unprocessed; `what-if` forked at commit 1 with an
/// order of its own, processed; `idle` forked at the head with nothing of its own. The
/// session `empty` is opened by the caller.
async fn write(mut orders: Context) {
    let mut tx = orders.transaction();
    tx.create("order:1", order(1));
    tx.create("order:2", order(2));
    tx.commit().unwrap();
    let mut orders = run(orders).await;
    orders.create("order:3", order(3)).unwrap();
    assert_eq!(orders.queued_events(), 1, "order 3 is left unprocessed");
    let mut branch = orders.fork_at("what-if", Generation(1)).unwrap();
    branch.create("order:9", order(9)).unwrap();
    drop(run(branch).await);
    drop(orders.fork("idle").unwrap());
}

/// The sessions with their creation times set aside.
fn timeless(mut sessions: Vec<SessionInfo>) -> Vec<SessionInfo> {
    for s in &mut sessions {
        s.created_at = UNIX_EPOCH;
    }
    sessions
}

fn sqlite_sessions(path: &Path) -> Vec<SessionInfo> {
    timeless(list_sessions(path).unwrap())
}

/// Every row of the store's tables, as text, in a stable order.
async fn contents(url: &str, schema: &str) -> String {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    let driver = tokio::spawn(connection);
    let s = format!("\"{schema}\"");
    let text: Option<String> = client
        .query_one(
            &format!(
                "SELECT string_agg(t, E'\\n' ORDER BY t) FROM (
                   SELECT 'sessions ' || x::text AS t FROM {s}.sessions x
                   UNION ALL SELECT 'commits ' || c::text FROM {s}.commits c
                   UNION ALL SELECT 'checkpoints ' || k::text FROM {s}.checkpoints k
                   UNION ALL SELECT 'outbox ' || o::text FROM {s}.outbox o
                   UNION ALL SELECT 'members ' || m::text FROM {s}.outbox_members m
                   UNION ALL SELECT 'version ' || v::text FROM {s}.schema_version v) rows"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    drop(client);
    let _ = driver.await;
    text.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_history_lists_the_same_sessions_in_postgres_and_in_sqlite() {
    let Some(url) = common::url("the_same_history_lists_the_same_sessions_in_postgres_and_in_sqlite") else {
        return;
    };
    let schemas = Schemas::new(&url, "sessions_same");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    write(Context::open_store(store.clone(), "orders").await.unwrap()).await;
    drop(Context::open_store(store.clone(), "empty").await.unwrap());

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    write(Context::open(&path, "orders").unwrap()).await;
    drop(Context::open(&path, "empty").unwrap());

    let on_pg = store.sessions().await.unwrap();
    assert!(on_pg.iter().all(|s| s.created_at > UNIX_EPOCH), "{on_pg:?}");
    let on_pg = timeless(on_pg);
    assert_eq!(on_pg, sqlite_sessions(&path), "the same history, the same sessions");

    // What they are, so that two equal mistakes do not pass.
    let names: Vec<&str> = on_pg.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["empty", "idle", "orders", "what-if"], "by name");
    let [empty, idle, orders, branch] = &on_pg[..] else {
        unreachable!()
    };
    assert_eq!(
        *empty,
        SessionInfo::new("empty", UNIX_EPOCH),
        "a session without commits"
    );
    assert_eq!(
        (orders.generation, orders.commits, orders.forked_from.clone()),
        (Generation(3), 3, None)
    );
    assert!(orders.consumed_seq > 0, "{orders:?}");
    assert_eq!(branch.forked_from, Some(("orders".to_owned(), Generation(1))));
    assert_eq!(branch.commits, branch.generation.0 - 1, "a branch's own commits only");
    assert!(branch.commits >= 2, "its order and the flow's run on it: {branch:?}");
    assert!(branch.consumed_seq > 0, "{branch:?}");
    assert_eq!(idle.forked_from, Some(("orders".to_owned(), Generation(3))));
    assert_eq!(
        (idle.generation, idle.head, idle.commits),
        (Generation(3), orders.head, 0)
    );
    let reopened = Context::open_store(store.clone(), "orders").await.unwrap();
    assert_eq!(reopened.generation(), orders.generation);
    assert_eq!(reopened.head(), orders.head);
    assert_eq!(
        reopened.queued_events(),
        1,
        "reopened, only order 3's event is past the consumed position"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_on_read_only_connections_works_and_changes_no_row() {
    let Some(url) = common::url("a_listing_on_read_only_connections_works_and_changes_no_row") else {
        return;
    };
    let schemas = Schemas::new(&url, "sessions_ro");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    write(Context::open_store(store.clone(), "orders").await.unwrap()).await;
    drop(Context::open_store(store.clone(), "empty").await.unwrap());
    let listed = store.sessions().await.unwrap();
    drop(store);

    let before = contents(&url, &schema).await;
    assert!(before.contains("commits "), "{before}");
    // The server refuses any write on these connections, as it does for the CLI.
    let sep = if url.contains('?') { '&' } else { '?' };
    let read_only = format!("{url}{sep}options=-c%20default_transaction_read_only%3Don");
    let options = PostgresOptions::new(&read_only)
        .schema(&schema)
        .pool_size(1)
        .allow_migration(false);
    let reader = PostgresStore::open(options).await.unwrap();
    assert_eq!(reader.sessions().await.unwrap(), listed);
    assert_eq!(reader.sessions().await.unwrap(), listed, "a listing is repeatable");
    drop(reader);
    assert_eq!(contents(&url, &schema).await, before, "listing changed the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_row_changed_outside_reactifact_is_refused_naming_the_session() {
    let Some(url) = common::url("a_session_row_changed_outside_reactifact_is_refused_naming_the_session") else {
        return;
    };
    let schemas = Schemas::new(&url, "sessions_bad");
    for (change, says) in [
        (
            "fork_generation = -1",
            "the fork generation of session `what-if` is negative (-1)",
        ),
        ("head = '\\x00'::bytea", "the head of session `what-if` is 1 bytes long"),
    ] {
        let schema = schemas.name();
        let store = open_store(&url, &schema).await;
        write(Context::open_store(store.clone(), "orders").await.unwrap()).await;
        schemas
            .execute(&format!(
                "UPDATE \"{schema}\".sessions SET {change} WHERE name = 'what-if'"
            ))
            .await;
        let error = store.sessions().await.unwrap_err().to_string();
        assert!(error.contains(says), "{change}: {error}");
    }
}

/// Code written against the old name builds, reading the same fields.
#[allow(deprecated)]
#[test]
fn the_old_name_is_the_same_type() {
    fn old(info: &reactifact_postgres::PgSessionInfo) -> (u64, u64) {
        (info.consumed_seq, info.commits)
    }
    let mut info = SessionInfo::new("orders", UNIX_EPOCH);
    info.consumed_seq = u64::MAX;
    info.commits = 3;
    assert_eq!(old(&info), (u64::MAX, 3));
}
