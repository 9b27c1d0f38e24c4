//! `parked list` and `parked rearm` through the real binary, on a SQLite store where a serving
//! runtime parked two orders' events (its produce fails on every order, under a manual retry
//! policy that parks at the first failure; served on tokio's paused clock, stopped through its
//! handle): the list shows them, a re-arm is one committed write that deletes the record and
//! schedules a retry due now (read back with the library), and an unknown id, or one re-armed
//! already, exits 2 and writes nothing.

mod binary;
mod support;

use std::path::{Path, PathBuf};

use binary::reactifact;
use reactifact_core::runtime::Generation;
use reactifact_core::{Context, OpenOptions, Timer};
use support::{parked_id, Order, PARKED_ERROR};
use tempfile::TempDir;

const ORDERS: [&str; 2] = ["order:1", "order:2"];

/// A store whose session `orders` holds two orders, both parked by a serving runtime.
fn parked_store() -> (TempDir, PathBuf) {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("parked.db");
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    tokio.block_on(async {
        let mut ctx = Context::open(&path, "orders").unwrap();
        for (i, id) in ORDERS.iter().enumerate() {
            ctx.create(
                *id,
                Order {
                    customer: format!("customer{i}@example.com"),
                    total_cents: 1_000,
                    channel: "email".into(),
                },
            )
            .unwrap();
        }
        drop(support::park(ctx, &ORDERS).await);
    });
    (dir, path)
}

fn run(path: &Path, args: &[&str]) -> binary::Run {
    let mut all: Vec<&std::ffi::OsStr> = vec!["--store".as_ref(), path.as_os_str()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    reactifact(&all)
}

fn json(path: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend(args);
    run(path, &all).ok().json()
}

/// The session `orders`, read with the library.
fn session(path: &Path) -> Context {
    Context::open_with(path, "orders", OpenOptions::new().read_only(true)).unwrap()
}

fn generation(path: &Path) -> Generation {
    session(path).generation()
}

#[test]
fn parked_events_are_listed_and_re_armed_with_one_commit_each() {
    let (_dir, path) = parked_store();

    // The table: one row per parked event, in the order they were parked.
    let table = run(&path, &["parked", "list"]).ok().stdout;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    for header in [
        "ID",
        "AGENT",
        "PRODUCE",
        "TRIGGER",
        "EVENT",
        "ATTEMPTS",
        "PARKED AT",
        "ERROR",
    ] {
        assert!(lines[0].contains(header), "{table}");
    }
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        &row[..6],
        [
            parked_id("order:1").as_str(),
            "billing",
            "process_order",
            "order:1",
            "created",
            "1"
        ],
        "{table}"
    );
    assert!(lines[1].ends_with(PARKED_ERROR), "{table}");
    assert!(lines[2].starts_with(&parked_id("order:2")), "{table}");

    // The document.
    let listed = json(&path, &["parked", "list"]);
    assert_eq!(listed["session"], "orders", "{listed}");
    let entries = listed["parked"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{listed}");
    let first = &entries[0];
    assert_eq!(first["id"], parked_id("order:1"), "{listed}");
    assert_eq!(
        (
            first["agent"].as_str(),
            first["produce"].as_str(),
            first["trigger"].as_str(),
            first["event"].as_str(),
            first["attempts"].as_u64(),
        ),
        (
            Some("billing"),
            Some("process_order"),
            Some("order:1"),
            Some("created"),
            Some(1)
        ),
        "{listed}"
    );
    assert!(first["error"].as_str().unwrap().contains(PARKED_ERROR), "{listed}");
    assert!(first["parked_at"].as_str().unwrap().ends_with('Z'), "{listed}");
    let mut keys: Vec<&String> = first.as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "agent",
            "attempts",
            "error",
            "event",
            "id",
            "parked_at",
            "produce",
            "trigger"
        ],
        "the documented fields, and only them"
    );

    // An unknown id: exit 2, nothing written.
    let before = generation(&path);
    run(&path, &["parked", "rearm", "parked:billing/process_order/order:9"]).fails(
        2,
        "no parked event `parked:billing/process_order/order:9` in session orders; `reactifact parked list` lists them",
    );
    run(&path, &["parked", "rearm", "order:1"]).fails(2, "no parked event `order:1` in session orders");
    run(&path, &["parked", "rearm", &parked_id("order:1"), "--session", "nope"]).fails(2, "has no session `nope`");
    assert_eq!(generation(&path), before, "a refused re-arm writes nothing");

    // A re-arm: the record is gone, a retry is due now, in one commit.
    let out = run(&path, &["parked", "rearm", &parked_id("order:1")]).ok();
    assert!(
        out.stdout.starts_with(&format!(
            "re-armed {} in session orders at generation {}: billing/process_order runs again on order:1 \
             (retry timer:retry/billing/process_order/order:1 due ",
            parked_id("order:1"),
            before.0 + 1
        )),
        "{out:?}"
    );
    let ctx = session(&path);
    assert_eq!(ctx.generation().0, before.0 + 1, "one commit");
    assert!(ctx
        .get::<reactifact_core::ledger::Parked>(&parked_id("order:1"))
        .unwrap()
        .is_none());
    assert_eq!(ctx.parked().count(), 1, "order:2 is still parked");
    assert_eq!(ctx.pending_timers(), 1);
    let timer = ctx
        .get::<Timer>("timer:retry/billing/process_order/order:1")
        .unwrap()
        .expect("the retry timer")
        .data;
    assert!(!timer.fired);
    drop(ctx);

    // Re-armed already: no longer parked.
    run(&path, &["parked", "rearm", &parked_id("order:1")]).fails(
        2,
        "no parked event `parked:billing/process_order/order:1` in session orders",
    );

    // The document of a re-arm.
    let doc = json(&path, &["parked", "rearm", &parked_id("order:2")]);
    assert_eq!(doc["session"], "orders", "{doc}");
    assert_eq!(doc["generation"], before.0 + 2, "{doc}");
    assert_eq!(doc["rearmed"]["id"], parked_id("order:2"), "{doc}");
    assert_eq!(doc["rearmed"]["trigger"], "order:2", "{doc}");
    assert_eq!(doc["rearmed"]["attempts"], 1, "{doc}");
    assert_eq!(doc["retry"]["id"], "timer:retry/billing/process_order/order:2", "{doc}");
    assert!(doc["retry"]["due_at"].as_str().unwrap().ends_with('Z'), "{doc}");
    let ctx = session(&path);
    assert_eq!(ctx.parked().count(), 0);
    assert_eq!(ctx.pending_timers(), 2);
    drop(ctx);

    let empty = run(&path, &["parked", "list"]).ok().stdout;
    assert_eq!(empty, "no parked events in session orders\n");
    assert_eq!(json(&path, &["parked", "list"])["parked"], serde_json::json!([]));
    run(&path, &["verify"]).ok();
}

#[test]
fn parked_list_opens_the_store_read_only() {
    let (dir, path) = parked_store();
    let before = std::fs::read(&path).unwrap();
    let files = |dir: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let listed = files(dir.path());
    run(&path, &["parked", "list"]).ok();
    json(&path, &["parked", "list"]);
    assert_eq!(std::fs::read(&path).unwrap(), before, "not a byte changed");
    assert_eq!(files(dir.path()), listed, "no file created");
}
