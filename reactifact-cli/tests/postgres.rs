//! The CLI on a PostgreSQL store, through the real binary: every command reads a store that
//! an application wrote over `Context::open_store` as it reads the same flow in a SQLite file
//! (the same documents, times aside); the operator's writes change the ledger as the store's
//! operations define; the inspecting commands write nothing; and a missing or older store,
//! an unreachable server, a bad URL are clear errors (exit 2) that never show a password.
//!
//! Runs when `REACTIFACT_TEST_POSTGRES_URL` is set (and then must pass: an unreachable server
//! fails it); each test writes its store in a schema of its own, dropped afterwards.

mod binary;
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use binary::{reactifact, Run};
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::store::OutboxStore;
use reactifact_core::Context;
use reactifact_postgres::{PostgresOptions, PostgresStore};
use serde_json::Value;

/// The variable CI sets to the test server's URL.
const URL_VAR: &str = "REACTIFACT_TEST_POSTGRES_URL";

/// The test server's URL; `None` (after saying so) when the variable is unset.
fn url(test: &str) -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            println!("skipped {test}: {URL_VAR} is not set");
            None
        }
    }
}

/// A schema of the test server, named `rfcli_{tag}_{pid}_{n}`, dropped when this is dropped
/// (also when the test panics).
struct Schema {
    url: String,
    name: String,
}

impl Schema {
    fn new(url: &str, tag: &str) -> Schema {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Schema {
            url: url.to_owned(),
            name: format!("rfcli_{tag}_{}_{n}", std::process::id()),
        }
    }

    /// The store's URL, the schema in its query.
    fn store_url(&self) -> String {
        with_param(&self.url, &format!("schema={}", self.name))
    }

    /// Runs `reactifact --store URL?schema=S args…`.
    fn run(&self, args: &[&str]) -> Run {
        let store = self.store_url();
        let mut all = vec!["--store", store.as_str()];
        all.extend(args);
        reactifact(&all)
    }

    /// Runs `reactifact --json --store URL?schema=S args…`, which must succeed.
    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend(args);
        self.run(&all).ok().json()
    }

    /// Writes the demonstration flow ([`support::write`], [`support::settle`]) into the
    /// schema, as an application does: a runtime over `Context::open_store`.
    fn build(&self) {
        let options = PostgresOptions::new(&self.url).schema(&self.name).pool_size(2);
        block_on(async {
            let store = PostgresStore::open(options).await.expect("the test store opens");
            let ctx = Context::open_store(store.clone(), "orders").await.unwrap();
            let ctx = support::write(ctx).await;
            let outbox: Arc<dyn OutboxStore> = store.outbox().clone();
            support::settle(&*outbox).await;
            drop(ctx);
        });
    }

    /// The ledger entry of `key`, read with the library.
    fn entry(&self, key: &str) -> Option<reactifact_core::ledger::Delivery> {
        let options = PostgresOptions::new(&self.url).schema(&self.name).pool_size(1);
        block_on(async {
            let store = PostgresStore::open(options).await.unwrap();
            store.outbox().get(key).await.unwrap()
        })
    }

    fn status(&self, key: &str) -> Option<DeliveryStatus> {
        self.entry(key).map(|d| d.status())
    }

    /// Every row of the store's tables, as text, in a stable order.
    fn contents(&self) -> String {
        let s = &self.name;
        query_text(
            &self.url,
            &format!(
                "SELECT string_agg(t, E'\\n' ORDER BY t) FROM (
                   SELECT 'outbox ' || o::text AS t FROM \"{s}\".outbox o
                   UNION ALL SELECT 'members ' || m::text FROM \"{s}\".outbox_members m
                   UNION ALL SELECT 'purged ' || p::text FROM \"{s}\".outbox_purged p
                   UNION ALL SELECT 'sessions ' || x::text FROM \"{s}\".sessions x
                   UNION ALL SELECT 'commits ' || c::text FROM \"{s}\".commits c
                   UNION ALL SELECT 'checkpoints ' || k::text FROM \"{s}\".checkpoints k
                   UNION ALL SELECT 'version ' || v::text FROM \"{s}\".schema_version v) rows"
            ),
        )
    }

    /// Whether the schema exists.
    fn exists(&self) -> bool {
        query_text(
            &self.url,
            &format!(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = '{}')::text",
                self.name
            ),
        ) == "true"
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        // A thread of its own: this may run while a test's runtime is blocked on.
        let dropped = std::thread::spawn(move || {
            let _ = execute(&url, &format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"));
        })
        .join();
        if dropped.is_err() {
            eprintln!("the test schema {} could not be dropped", self.name);
        }
    }
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

fn execute(url: &str, sql: &str) -> Result<(), tokio_postgres::Error> {
    block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        let driver = tokio::spawn(connection);
        client.batch_execute(sql).await?;
        drop(client);
        let _ = driver.await;
        Ok(())
    })
}

/// The one text value `sql` selects (`""` for NULL).
fn query_text(url: &str, sql: &str) -> String {
    block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("a connection to the test server");
        let driver = tokio::spawn(connection);
        let row = client
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let text: Option<String> = row.get(0);
        drop(client);
        let _ = driver.await;
        text.unwrap_or_default()
    })
}

/// `url` with one more query parameter.
fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// `url` with `password` as the user's password (the test server trusts its clients, so any
/// password logs in).
fn with_password(url: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (userinfo, host) = rest.split_once('@').expect("the test URL names a user");
    let user = userinfo.split(':').next().unwrap();
    format!("{scheme}://{user}:{password}@{host}")
}

/// `doc` with every time replaced by `"<time>"`, every age by 0 and every trace context by
/// `"<traceparent>"`: what differs between two stores written by the same flow at different
/// moments, in traces of their own.
fn timeless(doc: &Value) -> Value {
    match doc {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if (k.ends_with("_at") || k == "age_seconds") && !v.is_null() {
                        Value::String("<time>".into())
                    } else if k == "traceparent" && !v.is_null() {
                        Value::String("<traceparent>".into())
                    } else {
                        timeless(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(timeless).collect()),
        other => other.clone(),
    }
}

#[test]
fn every_inspecting_command_reads_postgres_as_it_reads_sqlite() {
    let Some(url) = url("every_inspecting_command_reads_postgres_as_it_reads_sqlite") else {
        return;
    };
    let pg = Schema::new(&url, "same");
    pg.build();
    let sqlite = binary::store();
    let commands: &[&[&str]] = &[
        &["sessions"],
        &["log", "--session", "orders"],
        &["log", "--session", "what-if", "--limit", "2"],
        &["show", "receipt:order:1", "--session", "orders"],
        &["show", "receipt:order:1", "--session", "orders", "--at", "2"],
        &["diff", "orders", "what-if"],
        &["diff", "1", "3", "--session", "orders"],
        &["why", support::DEAD],
        &["why", support::BRANCH],
        &["graph", support::DELIVERED],
        &["outbox", "list"],
        &["outbox", "list", "--status", "dead"],
        &["outbox", "list", "--kind", "email", "--session", "what-if"],
        &["outbox", "list", "--limit", "3", "--after", "2"],
        &["outbox", "show", support::DEAD],
        &["outbox", "show", support::IN_FLIGHT],
        &["outbox", "stats"],
        &["outbox", "stats", "--session", "orders"],
        &["verify"],
        &["replay", "--session", "orders", "--to", "2"],
    ];
    for args in commands {
        let (on_pg, on_sqlite) = (pg.json(args), sqlite.json(args));
        assert_eq!(
            timeless(&on_pg),
            timeless(&on_sqlite),
            "`reactifact --json {}` differs between PostgreSQL and SQLite",
            args.join(" ")
        );
    }
    // The same documents include what the flow left: spot-check a few against the store.
    let sessions = pg.json(&["sessions"]);
    assert_eq!(sessions["sessions"][0]["name"], "orders");
    assert_eq!(sessions["sessions"][0]["generation"], 4);
    assert_eq!(sessions["sessions"][1]["name"], "what-if");
    assert_eq!(sessions["sessions"][1]["forked_from"]["session"], "orders");
    assert_eq!(sessions["sessions"][1]["own_commits"], 2);
    assert!(sessions["sessions"][1]["consumed_seq"].as_u64() > Some(0), "{sessions}");
    let dead = pg.json(&["outbox", "show", support::DEAD]);
    assert_eq!(dead["status"], "dead");
    assert_eq!(dead["failed_attempts"], 1);
    assert_eq!(dead["last_error"], "the sms gateway refused the number");
    assert_eq!(dead["payload"]["customer"], "cy@example.com");
    assert_eq!(dead["run"]["produce"], "process_order");
    let delivered = pg.json(&["outbox", "list", "--status", "delivered"]);
    let keys: Vec<&str> = delivered["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, [support::DELIVERED, support::DELIVERED_2, support::BRANCH]);
    let why = pg.json(&["why", support::DEAD]);
    assert_eq!(
        (why["session"].as_str(), why["generation"].as_u64()),
        (Some("orders"), Some(2))
    );
    assert_eq!(why["trigger"]["id"], "order:3");

    // The tables of people, too: the same text once times are set aside.
    for args in [
        &["log", "--session", "orders"][..],
        &["why", support::DEAD],
        &["verify"],
    ] {
        assert_eq!(pg.run(args).ok().stdout, sqlite.run(args).ok().stdout, "{args:?}");
    }
    // `sessions` shows the same columns for both, the creation time (its last) aside.
    let without_time = |run: Run| -> Vec<String> {
        run.ok()
            .stdout
            .lines()
            .map(|line| {
                line.rsplit_once("  ")
                    .map_or(line, |(rest, _)| rest)
                    .trim_end()
                    .to_owned()
            })
            .collect()
    };
    let on_pg = without_time(pg.run(&["sessions"]));
    assert_eq!(on_pg, without_time(sqlite.run(&["sessions"])));
    assert!(on_pg[0].starts_with("SESSION  COMMITS  OWN  HEAD"), "{on_pg:?}");

    // The audit trail: one JSON object per commit, the same lines as SQLite's.
    let lines = |run: Run| -> Vec<Value> {
        run.ok()
            .stdout
            .lines()
            .map(|l| timeless(&serde_json::from_str(l).unwrap()))
            .collect()
    };
    let audit = lines(pg.run(&["export-audit", "--session", "orders"]));
    assert_eq!(audit.len(), 4);
    assert_eq!(audit, lines(sqlite.run(&["export-audit", "--session", "orders"])));

    // Unknown names are the same errors as on a file, naming the store.
    pg.run(&["log", "--session", "nope"])
        .fails(2, "has no session `nope`; its sessions: orders, what-if");
    pg.run(&["log"])
        .fails(2, "holds 2 sessions (orders, what-if); name one with --session");
    pg.run(&["outbox", "show", "nope:1"])
        .fails(2, "no intent with key `nope:1` in the delivery ledger of postgres://");
    pg.run(&["show", "nope:1", "--session", "orders"])
        .fails(2, "no artifact `nope:1` in session `orders`");
}

#[test]
fn the_inspecting_commands_write_nothing_and_the_schema_flag_names_the_store() {
    let Some(url) = url("the_inspecting_commands_write_nothing_and_the_schema_flag_names_the_store") else {
        return;
    };
    let pg = Schema::new(&url, "ro");
    pg.build();
    let before = pg.contents();
    assert!(before.contains("outbox "), "the store holds rows: {before}");
    let by_flag = |args: &[&str]| {
        let mut all = vec!["--store", url.as_str(), "--schema", pg.name.as_str()];
        all.extend(args);
        reactifact(&all).ok()
    };
    for args in [
        &["sessions"][..],
        &["log", "--session", "what-if"],
        &["show", "order:1", "--session", "orders"],
        &["diff", "orders", "what-if"],
        &["why", support::HELD],
        &["graph", support::HELD, "--format", "dot"],
        &["outbox", "list"],
        &["outbox", "show", support::PENDING],
        &["outbox", "stats"],
        &["verify"],
        &["replay", "--session", "orders"],
        &["export-audit", "--session", "what-if"],
    ] {
        by_flag(args);
        pg.run(args).ok();
    }
    assert_eq!(pg.contents(), before, "a read-only command changed the store");
}

#[test]
fn retry_cancel_and_purge_go_through_the_store_s_operations() {
    let Some(url) = url("retry_cancel_and_purge_go_through_the_store_s_operations") else {
        return;
    };
    let pg = Schema::new(&url, "ops");
    pg.build();
    let dead = pg.entry(support::DEAD).unwrap();
    assert_eq!(
        pg.run(&["outbox", "retry", support::DEAD]).ok().stdout,
        "retried sms:order:3: now pending\n"
    );
    let after = pg.entry(support::DEAD).unwrap();
    assert_eq!(after.status(), DeliveryStatus::Pending);
    assert_eq!((after.attempts(), after.token()), (dead.attempts(), dead.token()));
    let before = pg.contents();
    pg.run(&["outbox", "retry", support::DELIVERED]).fails(
        2,
        "intent `email:order:1` is delivered; only failed, dead and held intents can be retried",
    );
    pg.run(&["outbox", "retry", support::IN_FLIGHT]).fails(
        2,
        "intent `later:order:7` is in-flight; only failed, dead and held intents can be retried",
    );
    pg.run(&["outbox", "cancel", support::DELIVERED])
        .fails(2, "intent `email:order:1` is delivered and cannot be cancelled");
    pg.run(&["outbox", "retry", "nope:1"])
        .fails(2, "no intent with key `nope:1` in the delivery ledger");
    assert_eq!(pg.contents(), before, "a refused operation changed nothing");

    // --all-dead: none left of kind sms after the retry above; held fax re-armed by key.
    let none = pg.json(&["outbox", "retry", "--all-dead"]);
    assert_eq!(none["retried"], serde_json::json!([]));
    let held = pg.json(&["outbox", "retry", support::HELD]);
    assert_eq!(held["retried"][0]["status"], "pending");

    let cancelled = pg.json(&["outbox", "cancel", support::FAILED, "--reason", "customer left"]);
    assert_eq!(cancelled["cancelled"][0]["status"], "cancelled");
    assert_eq!(cancelled["cancelled"][0]["cancel_reason"], "customer left");
    let entry = pg.entry(support::FAILED).unwrap();
    assert_eq!(entry.status(), DeliveryStatus::Cancelled);
    assert_eq!(entry.cancel_reason(), Some("customer left"));

    // Nothing is older than a day; everything final is older than nothing.
    assert_eq!(
        pg.json(&["outbox", "purge", "--delivered", "--older-than", "1d"])["purged"],
        0
    );
    let purged = pg.json(&["outbox", "purge", "--delivered", "--older-than", "0s"]);
    assert_eq!(purged["purged"], 3, "three delivered: {purged}");
    assert_eq!(
        pg.status(support::FAILED),
        Some(DeliveryStatus::Cancelled),
        "cancelled: kept"
    );
    let purged = pg.json(&["outbox", "purge", "--cancelled", "--older-than", "0s"]);
    assert_eq!(purged["purged"], 1, "one cancelled: {purged}");
    for key in [
        support::DELIVERED,
        support::DELIVERED_2,
        support::BRANCH,
        support::FAILED,
    ] {
        assert_eq!(pg.status(key), None, "{key} purged");
    }
    assert_eq!(pg.status(support::DEAD), Some(DeliveryStatus::Pending));
    assert_eq!(pg.status(support::IN_FLIGHT), Some(DeliveryStatus::InFlight));
    // Verify still passes: purged keys are remembered, not missing.
    assert_eq!(pg.json(&["verify"])["ok"], true);
}

#[test]
fn a_missing_or_older_store_is_an_error_and_never_created_or_migrated() {
    let Some(url) = url("a_missing_or_older_store_is_an_error_and_never_created_or_migrated") else {
        return;
    };
    let missing = Schema::new(&url, "missing");
    for args in [
        &["sessions"][..],
        &["outbox", "list"],
        &["outbox", "purge", "--delivered", "--older-than", "1d"],
    ] {
        missing.run(args).fails(
            2,
            &format!("no reactifact store in schema `{}` of database `", missing.name),
        );
    }
    assert!(!missing.exists(), "the CLI created the schema");

    // A schema that holds other tables is no store either.
    let foreign = Schema::new(&url, "foreign");
    execute(
        &url,
        &format!("CREATE SCHEMA {0}; CREATE TABLE {0}.t (x int)", foreign.name),
    )
    .unwrap();
    foreign.run(&["sessions"]).fails(2, "no reactifact store in schema");

    // A store at an older version is not migrated.
    let older = Schema::new(&url, "older");
    execute(
        &url,
        &format!(
            "CREATE SCHEMA {0}; CREATE TABLE {0}.schema_version (version integer PRIMARY KEY, description text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()); INSERT INTO {0}.schema_version VALUES (1, 'the outbox')",
            older.name
        ),
    )
    .unwrap();
    older.run(&["outbox", "stats"]).fails(
        2,
        "has schema version 1, older than the 8 this reactifact uses; open it once with the application",
    );
    let version = query_text(
        &url,
        &format!("SELECT max(version)::text FROM {}.schema_version", older.name),
    );
    assert_eq!(version, "1", "the CLI migrated the store");
}

#[test]
fn a_server_that_cannot_be_reached_or_a_bad_url_is_a_clear_error_without_the_password() {
    let Some(url) = url("a_server_that_cannot_be_reached_or_a_bad_url_is_a_clear_error_without_the_password") else {
        return;
    };
    const SECRET: &str = "s3cr3t-Pa55";
    let secret_url = with_password(&url, SECRET);
    // A port with no listener: bound, then released.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let unreachable = format!("postgres://ops:{SECRET}@127.0.0.1:{port}/inventory?schema=orders");
    let runs = [
        reactifact(&["--store", &unreachable, "sessions"]).fails(
            2,
            &format!("cannot connect to postgres at 127.0.0.1:{port}, database `inventory`, user `ops`"),
        ),
        reactifact(&["--store", &unreachable, "outbox", "retry", "--all-dead"])
            .fails(2, "cannot connect to postgres at 127.0.0.1"),
        reactifact(&[
            "--store",
            &format!("postgres://ops:{SECRET}@127.0.0.1:99999/db"),
            "sessions",
        ])
        .fails(2, "invalid postgres url `postgres://ops:***@127.0.0.1:99999/db`"),
        reactifact(&[
            "--store",
            &format!("postgres://ops:{SECRET}@127.0.0.1/db?sslmode=bogus"),
            "log",
        ])
        .fails(2, "invalid postgres url"),
        reactifact(&[
            "--store",
            &format!("postgres://ops:{SECRET}@127.0.0.1/db?schema=No-Such"),
            "log",
        ])
        .fails(2, "invalid schema name `No-Such`"),
        // A server that answers, a schema that holds nothing: the message names the store.
        reactifact(&[
            "--store",
            &with_param(&secret_url, "schema=rfcli_nothing_here"),
            "sessions",
        ])
        .fails(2, "no reactifact store in schema `rfcli_nothing_here`"),
    ];
    for run in &runs {
        assert!(
            !run.stderr.contains(SECRET) && !run.stdout.contains(SECRET),
            "the password is shown: {run:?}"
        );
    }

    // And on success: nothing printed names it either.
    let pg = Schema::new(&url, "secret");
    pg.build();
    let store = with_param(&secret_url, &format!("schema={}", pg.name));
    for args in [
        &["sessions"][..],
        &["outbox", "show", support::DEAD],
        &["log", "--session", "nope"],
    ] {
        let mut all = vec!["--store", store.as_str()];
        all.extend(args);
        let run = reactifact(&all);
        assert!(
            !run.stderr.contains(SECRET) && !run.stdout.contains(SECRET),
            "the password is shown: {run:?}"
        );
    }
}

#[test]
fn a_changed_row_fails_verify_with_exit_1_and_the_other_commands_with_exit_2() {
    let Some(url) = url("a_changed_row_fails_verify_with_exit_1_and_the_other_commands_with_exit_2") else {
        return;
    };
    // A commit's runs changed outside reactifact: the customer of order 1 rewritten in place.
    let log = Schema::new(&url, "tamper_log");
    log.build();
    execute(
        &url,
        &format!(
            "UPDATE {0}.commits SET runs = overlay(runs PLACING convert_to('eve', 'UTF8')
                 FROM position(convert_to('ada@example.com', 'UTF8') IN runs) FOR 3)
              WHERE session = 'orders' AND generation = 1",
            log.name
        ),
    )
    .unwrap();
    let run = log.run(&["--json", "verify"]);
    assert_eq!(run.code, 1, "{run:?}");
    for session in run.json()["sessions"].as_array().unwrap() {
        assert_eq!(session["ok"], false, "{session}");
        let error = session["error"].as_str().unwrap();
        assert!(
            error.contains("commit 1: replaying it does not give the state hash it recorded"),
            "{error}"
        );
    }
    log.run(&["log", "--session", "orders"])
        .fails(2, "is corrupt")
        .fails(2, "`reactifact verify` checks the whole store");
    log.run(&["replay", "--session", "orders"]).fails(1, "commit 1");

    // A ledger row changed outside reactifact: its digest no longer matches.
    let ledger = Schema::new(&url, "tamper_ledger");
    ledger.build();
    execute(
        &url,
        &format!(
            "UPDATE {0}.outbox SET last_error = 'all fine' WHERE key = '{1}'",
            ledger.name,
            support::DEAD
        ),
    )
    .unwrap();
    let run = ledger.run(&["verify"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains(support::DEAD), "{run:?}");
    ledger
        .run(&["outbox", "retry", support::DEAD])
        .fails(2, "failed its integrity check");
    assert_eq!(
        query_text(
            &url,
            &format!(
                "SELECT last_error FROM {}.outbox WHERE key = '{}'",
                ledger.name,
                support::DEAD
            )
        ),
        "all fine",
        "the refused retry changed nothing"
    );

    // PostgresStore::sessions reads each session's own commits, as `sessions` shows them.
    let sessions = block_on(async {
        let options = PostgresOptions::new(&url).schema(&ledger.name).pool_size(1);
        let store = PostgresStore::open(options).await.unwrap();
        store.sessions().await.unwrap()
    });
    let own: Vec<(&str, u64, u64)> = sessions
        .iter()
        .map(|s| (s.name.as_str(), s.generation.0, s.commits))
        .collect();
    assert_eq!(own, [("orders", 4, 4), ("what-if", 6, 2)]);
}

#[test]
fn question_answer_writes_one_commit_to_a_postgres_session() {
    let Some(url) = url("question_answer_writes_one_commit_to_a_postgres_session") else {
        return;
    };
    let pg = Schema::new(&url, "question");
    let options = PostgresOptions::new(&pg.url).schema(&pg.name).pool_size(2);
    block_on(async {
        let store = PostgresStore::open(options.clone())
            .await
            .expect("the test store opens");
        let mut ctx = Context::open_store(store, "desk").await.unwrap();
        ctx.create("question:refund:1", reactifact_core::runtime::Question::new("refund?"))
            .unwrap();
    });
    let listed = pg.json(&["question", "list", "--pending"]);
    assert_eq!(listed["questions"][0]["id"], "question:refund:1", "{listed}");
    let doc = pg.json(&[
        "question",
        "answer",
        "question:refund:1",
        "--answer",
        "yes",
        "--by",
        "ada@ops",
    ]);
    assert_eq!(
        (doc["answered"]["answer"].as_str(), doc["generation"].as_u64()),
        (Some("yes"), Some(2)),
        "{doc}"
    );
    pg.run(&[
        "question",
        "answer",
        "question:refund:1",
        "--answer",
        "no",
        "--by",
        "bob@ops",
    ])
    .fails(2, "already answered by ada@ops");
    pg.run(&["verify"]).ok();
    block_on(async {
        let store = PostgresStore::open(options).await.unwrap();
        let ctx = Context::open_store(store, "desk").await.unwrap();
        let q = ctx
            .get::<reactifact_core::runtime::Question>("question:refund:1")
            .unwrap()
            .unwrap();
        assert_eq!(
            (q.data.answer.as_deref(), q.data.answered_by.as_deref()),
            (Some("yes"), Some("ada@ops"))
        );
    });
}

#[test]
fn parked_events_are_listed_and_re_armed_on_postgres() {
    let Some(url) = url("parked_events_are_listed_and_re_armed_on_postgres") else {
        return;
    };
    let pg = Schema::new(&url, "parked");
    let options = PostgresOptions::new(&pg.url).schema(&pg.name).pool_size(2);
    let parked = support::parked_id("order:1");
    // On tokio's real clock: the driver's timeouts run on tokio's clock, which a paused one
    // would fire while the server answers. The manual policy parks at the first failure, so
    // nothing waits on time.
    block_on(async {
        let store = PostgresStore::open(options.clone())
            .await
            .expect("the test store opens");
        let mut ctx = Context::open_store(store, "orders").await.unwrap();
        ctx.create(
            "order:1",
            support::Order {
                customer: "ada@example.com".into(),
                total_cents: 1_200,
                channel: "email".into(),
            },
        )
        .unwrap();
        drop(support::park(ctx, &["order:1"]).await);
    });

    // Listing writes nothing.
    let before = pg.contents();
    let table = pg.run(&["parked", "list"]).ok().stdout;
    assert!(
        table.lines().nth(1).is_some_and(|row| row.starts_with(&parked)
            && row.contains("billing")
            && row.contains("process_order")
            && row.ends_with(support::PARKED_ERROR)),
        "{table}"
    );
    let listed = pg.json(&["parked", "list"]);
    assert_eq!(listed["session"], "orders", "{listed}");
    assert_eq!(listed["parked"][0]["id"], parked, "{listed}");
    assert_eq!(listed["parked"][0]["event"], "created", "{listed}");
    assert_eq!(listed["parked"][0]["attempts"], 1, "{listed}");
    assert_eq!(pg.contents(), before, "parked list writes nothing");

    pg.run(&["parked", "rearm", "parked:billing/process_order/order:9"])
        .fails(
            2,
            "no parked event `parked:billing/process_order/order:9` in session orders",
        );
    assert_eq!(pg.contents(), before, "a refused re-arm writes nothing");

    let doc = pg.json(&["parked", "rearm", &parked]);
    assert_eq!(doc["rearmed"]["id"], parked, "{doc}");
    assert_eq!(doc["retry"]["id"], "timer:retry/billing/process_order/order:1", "{doc}");
    pg.run(&["parked", "rearm", &parked]).fails(
        2,
        "no parked event `parked:billing/process_order/order:1` in session orders",
    );
    pg.run(&["verify"]).ok();
    block_on(async {
        let store = PostgresStore::open(options).await.unwrap();
        let ctx = Context::open_store(store, "orders").await.unwrap();
        assert_eq!(ctx.parked().count(), 0, "the record is gone");
        assert_eq!(ctx.pending_timers(), 1, "a retry is due");
        assert_eq!(doc["generation"], ctx.generation().0, "{doc}");
    });
}
