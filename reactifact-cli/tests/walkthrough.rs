//! The `reactifact` binary on the stores the outbox walkthrough writes
//! (`reactifact_examples::walkthrough`, the `outbox` program's cases): on SQLite, and on
//! PostgreSQL when `REACTIFACT_TEST_POSTGRES_URL` is set. Every reading command answers from
//! what the walkthrough left, and leaves it as it was.

mod binary;
mod support;

use binary::{reactifact, Run};
use reactifact_examples::walkthrough::{postgres_store, walk, Store};
use serde_json::Value;

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// Runs `reactifact --store STORE args…`.
fn run(store: &str, args: &[&str]) -> Run {
    let mut all = vec!["--store", store];
    all.extend(args);
    reactifact(&all)
}

/// Runs `reactifact --json --store STORE args…`, which must succeed.
fn json(store: &str, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend(args);
    run(store, &all).ok().json()
}

/// What the walkthrough leaves, as the CLI reads it: its four sessions, the six
/// notifications delivered once each (with the attempts of cases 6 and 7), the one case 8
/// rejected, a log that verifies, provenance, the audit trail and the replay.
fn check_the_walkthrough_store(store: &str) {
    let sessions = json(store, &["sessions"]);
    let names: Vec<&str> = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["approvals", "shop", "shop-with-support", "two-agents"],
        "{sessions}"
    );
    assert_eq!(sessions["sessions"][2]["forked_from"]["session"], "shop");

    let verify = json(store, &["verify"]);
    assert_eq!(verify["ok"], true, "{verify}");

    let stats = json(store, &["outbox", "stats"]);
    assert_eq!(stats["counts"]["delivered"], 6, "{stats}");
    assert_eq!(stats["counts"]["rejected"], 1, "{stats}");
    assert_eq!(stats["counts"]["total"], 7, "{stats}");
    // Case 8: who approved and who rejected, in the ledger, provenance and the audit trail.
    let approved = json(store, &["outbox", "show", "notify:order:8"]);
    assert_eq!(approved["status"], "delivered", "{approved}");
    assert_eq!(approved["decision"]["verdict"], "approved", "{approved}");
    assert_eq!(approved["decision"]["by"], "ops:carol", "{approved}");
    let rejected = json(store, &["outbox", "list", "--status", "rejected"]);
    assert_eq!(rejected["entries"][0]["key"], "notify:order:9", "{rejected}");
    assert_eq!(rejected["entries"][0]["decision"]["by"], "ops:dan", "{rejected}");
    assert_eq!(
        rejected["entries"][0]["decision"]["reason"], "the refund was already paid by hand",
        "{rejected}"
    );
    assert_eq!(rejected["entries"][0]["attempts"], 0, "{rejected}");
    let why = json(store, &["why", "notify:order:9"]);
    assert_eq!(why["requires_approval"], true, "{why}");
    assert_eq!(why["decision"]["verdict"], "rejected", "{why}");
    let audit = run(store, &["export-audit", "--session", "approvals"]).ok().stdout;
    assert!(audit.contains(r#""requires_approval":true"#), "{audit}");
    assert!(audit.contains(r#""by":"ops:dan""#), "{audit}");
    let list = json(store, &["outbox", "list", "--session", "shop"]);
    let keys: Vec<&str> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        ["notify:order:1", "notify:order:4", "notify:order:6", "notify:order:7"],
        "{list}"
    );

    // Case 7: two 503s, then delivered; case 6: dead, re-armed, delivered.
    let outcomes = |key: &str| -> Vec<(String, Option<String>)> {
        json(store, &["outbox", "show", key])["attempt_history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["outcome"].as_str().unwrap().to_owned(),
                    a["error"].as_str().map(str::to_owned),
                )
            })
            .collect()
    };
    let unavailable = Some("503 service unavailable".to_owned());
    assert_eq!(
        outcomes("notify:order:7"),
        [
            ("failed".to_owned(), unavailable.clone()),
            ("failed".to_owned(), unavailable),
            ("delivered".to_owned(), None)
        ]
    );
    assert_eq!(
        outcomes("notify:order:6"),
        [
            ("dead".to_owned(), Some("550 mailbox unavailable".to_owned())),
            ("delivered".to_owned(), None)
        ]
    );
    assert_eq!(outcomes("notify:order:1"), [("delivered".to_owned(), None)]);

    let why = json(store, &["why", "notify:order:4"]);
    assert_eq!(why["session"], "shop", "{why}");
    assert_eq!(why["produce"], "process_order", "{why}");
    assert_eq!(why["trigger"]["id"], "order:4", "{why}");
    assert_eq!(why["delivery"]["status"], "delivered", "{why}");
    let graph = run(store, &["graph", "notify:order:3", "--format", "dot"]).ok().stdout;
    assert!(graph.starts_with("digraph"), "{graph}");

    let log = json(store, &["log", "--session", "shop"]);
    let commits = log["commits"].as_array().unwrap().len();
    let audit = run(store, &["export-audit", "--session", "shop"]).ok().stdout;
    assert_eq!(audit.lines().count(), commits, "one line per commit");
    for line in audit.lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    }
    let replay = json(store, &["replay", "--session", "shop"]);
    assert_eq!(replay["ok"], true, "{replay}");
    let show = json(store, &["show", "receipt:order:1", "--session", "shop"]);
    assert_eq!(
        show["content"]["total_cents"], 1500,
        "case 2 re-derived the receipt: {show}"
    );
}

#[test]
fn the_cli_reads_the_sqlite_store_the_walkthrough_writes_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.db");
    assert!(
        block_on(walk(Store::Sqlite(path.clone()))),
        "the walkthrough's cases hold"
    );
    let wal = dir.path().join("shop.db-wal");
    let files = || (std::fs::read(&path).unwrap(), std::fs::read(&wal).ok());
    let before = files();
    check_the_walkthrough_store(path.to_str().unwrap());
    assert!(files() == before, "a reading command changed the file or its WAL");
}

#[test]
fn the_cli_reads_the_postgres_store_the_walkthrough_writes() {
    let Ok(url) = std::env::var("REACTIFACT_TEST_POSTGRES_URL") else {
        println!("skipped: REACTIFACT_TEST_POSTGRES_URL is not set");
        return;
    };
    let (ok, schema) = block_on(async {
        let store = postgres_store(&url).await.expect("the walkthrough's store opens");
        let schema = match &store {
            Store::Postgres(store, _) => store.outbox().schema().to_owned(),
            _ => unreachable!("a PostgreSQL store"),
        };
        (walk(store).await, schema)
    });
    // The walkthrough leaves its schema in place for the CLI; this test drops it.
    struct DropSchema(String, String);
    impl Drop for DropSchema {
        fn drop(&mut self) {
            let (url, schema) = (self.0.clone(), self.1.clone());
            block_on(async move {
                if let Ok((client, connection)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
                    tokio::spawn(connection);
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                        .await;
                }
            });
        }
    }
    let _drop = DropSchema(url.clone(), schema.clone());
    assert!(ok, "the walkthrough's cases hold on PostgreSQL");
    let separator = if url.contains('?') { '&' } else { '?' };
    let store = format!("{url}{separator}schema={schema}");
    check_the_walkthrough_store(&store);
}
