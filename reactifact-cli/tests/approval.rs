//! `outbox approve` and `outbox reject` through the real binary, on a store of its own whose
//! intents await approval: each is the store's operation (read back with the library), the
//! refusals exit 2 naming the key and status, and `list`, `stats`, `show`, `why` and `purge`
//! know the two statuses.

mod binary;
mod support;

use std::path::{Path, PathBuf};

use binary::reactifact;
use reactifact_core::{
    Agent, Context, DeliveryStatus, OutboxStore, PendingAction, Produce, ProduceCall, ProduceError, Runtime,
    SqliteOutbox, Verdict,
};
use support::{Notify, Order};
use tempfile::TempDir;

/// The action hash (lowercase hex) the outbox row of `key` holds.
fn action_hash(path: &Path, key: &str) -> String {
    let conn = rusqlite::Connection::open(path).unwrap();
    let hash: Vec<u8> = conn
        .query_row("SELECT action_hash FROM outbox WHERE key = ?1", [key], |r| r.get(0))
        .unwrap();
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// A store whose session `refunds` acted `refund:order:1`, `refund:order:2` and
/// `refund:order:3` with approval (no dispatcher: they stay awaiting), and `plain:order:1`
/// without.
fn approval_store() -> (TempDir, PathBuf) {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("approvals.db");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut ctx = Context::open(&path, "refunds").unwrap();
        for (i, customer) in ["ada", "bob", "cy"].iter().enumerate() {
            ctx.create(
                format!("order:{}", i + 1),
                Order {
                    customer: (*customer).into(),
                    total_cents: 10_000,
                    channel: "email".into(),
                },
            )
            .unwrap();
        }
        let refund = Produce::new("refund", |call: ProduceCall<Order>| async move {
            let id = call.trigger.id.to_string();
            let payload = Notify {
                customer: call.trigger.data.customer.clone(),
                order: id.clone(),
            };
            call.effects
                .act_with_approval("refund", format!("refund:{id}"), &payload);
            if id == "order:1" {
                call.effects.act("plain", format!("plain:{id}"), &payload);
            }
            Ok::<(), ProduceError>(())
        })
        .creates::<PendingAction>();
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(refund))
            .build()
            .unwrap();
        rt.run().await.unwrap();
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

fn entry(path: &Path, key: &str) -> reactifact_core::Delivery {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let outbox = SqliteOutbox::open_read_only(path).unwrap();
        outbox.get(key).await.unwrap().unwrap()
    })
}

#[test]
fn approve_and_reject_are_the_stores_operations_and_refuse_what_it_refuses() {
    let (_dir, path) = approval_store();
    let waiting = json(&path, &["outbox", "list", "--status", "awaiting-approval"]);
    let keys: Vec<&str> = waiting["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        ["refund:order:1", "refund:order:2", "refund:order:3"],
        "{waiting}"
    );
    assert_eq!(waiting["entries"][0]["status"], "awaiting-approval");
    assert_eq!(waiting["entries"][0]["decision"], serde_json::Value::Null);

    let out = run(&path, &["outbox", "approve", "refund:order:1", "--by", "ada@ops"]).ok();
    // Bound to the action hash the row holds: the bytes the operator approved.
    let approved = action_hash(&path, "refund:order:1");
    assert_eq!(
        out.stdout,
        format!("approved refund:order:1: now pending, digest {approved}\n")
    );
    let d = entry(&path, "refund:order:1");
    let decision = d.decision().unwrap();
    assert_eq!(
        (d.status(), decision.verdict, decision.by.as_str()),
        (DeliveryStatus::Pending, Verdict::Approved, "ada@ops")
    );
    assert_eq!(decision.digest.map(|h| h.to_string()), Some(approved.clone()));
    let doc = json(
        &path,
        &[
            "outbox",
            "reject",
            "refund:order:2",
            "--by",
            "bob@ops",
            "--reason",
            "duplicate",
        ],
    );
    assert_eq!(doc["rejected"][0]["status"], "rejected", "{doc}");
    assert_eq!(doc["rejected"][0]["decision"]["verdict"], "rejected", "{doc}");
    assert_eq!(doc["rejected"][0]["decision"]["by"], "bob@ops", "{doc}");
    assert_eq!(doc["rejected"][0]["decision"]["reason"], "duplicate", "{doc}");
    let rejected = action_hash(&path, "refund:order:2");
    assert_eq!(doc["rejected"][0]["decision"]["digest"], rejected.as_str(), "{doc}");
    assert_eq!(entry(&path, "refund:order:2").status(), DeliveryStatus::Rejected);

    // Refusals: exit 2, nothing changed.
    run(&path, &["outbox", "approve", "refund:order:2", "--by", "ada@ops"])
        .fails(2, "intent `refund:order:2` was already rejected by bob@ops");
    run(&path, &["outbox", "reject", "refund:order:1", "--by", "bob@ops"])
        .fails(2, "intent `refund:order:1` was already approved by ada@ops");
    run(&path, &["outbox", "approve", "plain:order:1", "--by", "ada@ops"])
        .fails(2, "intent `plain:order:1` is pending, not awaiting approval");
    run(&path, &["outbox", "approve", "nope:1", "--by", "ada@ops"]).fails(2, "no intent with key `nope:1`");
    run(&path, &["outbox", "approve", "refund:order:3", "--by", ""]).fails(2, "must name who decided");
    run(&path, &["outbox", "approve", "refund:order:3"]).fails(2, "--by");
    run(&path, &["outbox", "retry", "refund:order:3"]).fails(2, "awaiting-approval");
    assert_eq!(
        entry(&path, "refund:order:3").status(),
        DeliveryStatus::AwaitingApproval
    );
    // Approving again is idempotent, and still needs a name.
    run(&path, &["outbox", "approve", "refund:order:1", "--by", "someone"]).ok();
    assert_eq!(entry(&path, "refund:order:1").decision().unwrap().by, "ada@ops");
    run(&path, &["outbox", "approve", "refund:order:1", "--by", ""]).fails(2, "must name who decided");
    run(&path, &["outbox", "reject", "refund:order:2", "--by", ""]).fails(2, "must name who decided");
    assert_eq!(entry(&path, "refund:order:1").decision().unwrap().by, "ada@ops");

    let stats = json(&path, &["outbox", "stats"]);
    assert_eq!(stats["counts"]["awaiting-approval"], 1, "{stats}");
    assert_eq!(stats["counts"]["rejected"], 1, "{stats}");
    assert_eq!(stats["counts"]["pending"], 2, "{stats}");
    let show = run(&path, &["outbox", "show", "refund:order:2"]).ok().stdout;
    assert!(show.contains("rejected by bob@ops at "), "{show}");
    assert!(show.contains(&format!("(digest {rejected})")), "{show}");
    let shown = json(&path, &["outbox", "show", "refund:order:1"]);
    assert_eq!(shown["decision"]["digest"], approved.as_str(), "{shown}");
    let listed = json(&path, &["outbox", "list"]);
    let first = &listed["entries"].as_array().unwrap()[0];
    assert_eq!(first["decision"]["digest"], approved.as_str(), "{listed}");
    let why = json(&path, &["why", "refund:order:2"]);
    assert_eq!(why["requires_approval"], true, "{why}");
    assert_eq!(why["decision"]["by"], "bob@ops", "{why}");
    assert_eq!(why["decision"]["digest"], rejected.as_str(), "{why}");
    let why = run(&path, &["why", "refund:order:1"]).ok().stdout;
    assert!(why.contains("approved by ada@ops at "), "{why}");
    assert!(why.contains(&format!("(digest {approved})")), "{why}");
    let why = run(&path, &["why", "refund:order:3"]).ok().stdout;
    assert!(why.contains("required, not given yet"), "{why}");
    let why = run(&path, &["why", "plain:order:1"]).ok().stdout;
    assert!(why.contains("not required"), "{why}");

    // Purge: --cancelled leaves the rejected entry, --rejected takes it and remembers the key.
    let doc = json(&path, &["outbox", "purge", "--cancelled", "--older-than", "0s"]);
    assert_eq!(doc["purged"], 0, "{doc}");
    let doc = json(&path, &["outbox", "purge", "--rejected", "--older-than", "0s"]);
    assert_eq!(
        (doc["purged"].clone(), doc["statuses"].clone()),
        (1.into(), serde_json::json!(["rejected"]))
    );
    run(&path, &["outbox", "show", "refund:order:2"]).fails(2, "no intent with key `refund:order:2`");
    let verify = json(&path, &["verify"]);
    assert_eq!(verify["ok"], true, "{verify}");
}
