//! The reading commands, driven through the real binary on a store the library wrote: their
//! tables, their `--json` documents (checked against what the library reads), their errors
//! and exit codes, and that they leave the store's bytes as they were.

mod binary;
mod support;

use binary::{reactifact, reactifact_env, store};
use reactifact_core::{Context, OpenOptions};
use serde_json::{json, Value};

fn open(path: &std::path::Path, session: &str) -> Context {
    Context::open_with(path, session, OpenOptions::new().read_only(true)).unwrap()
}

#[test]
fn sessions_lists_every_session_with_its_head_and_fork_point() {
    let store = store();
    let orders = open(&store.path, "orders");
    let branch = open(&store.path, "what-if");
    let doc = store.json(&["sessions"]);
    let sessions = doc["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2);
    assert_eq!(sessions[0]["name"], "orders");
    assert_eq!(sessions[0]["generation"], 4);
    assert_eq!(sessions[0]["own_commits"], 4);
    assert_eq!(sessions[0]["head"], orders.head().unwrap().to_string());
    assert_eq!(sessions[0]["forked_from"], serde_json::Value::Null);
    assert_eq!(sessions[1]["name"], "what-if");
    assert_eq!(sessions[1]["generation"], 6);
    assert_eq!(
        sessions[1]["own_commits"], 2,
        "a branch's own commits, not its parent's"
    );
    assert_eq!(sessions[1]["head"], branch.head().unwrap().to_string());
    assert_eq!(
        sessions[1]["forked_from"],
        json!({"session": "orders", "generation": 4})
    );
    // Every column the library lists, as it lists it.
    let listed = reactifact_core::store::list_sessions(&store.path).unwrap();
    for (doc, info) in sessions.iter().zip(&listed) {
        assert_eq!(doc["name"], info.name.as_str());
        assert_eq!(doc["own_commits"], info.commits);
        assert_eq!(doc["consumed_seq"], info.consumed_seq);
        assert!(info.consumed_seq > 0, "the flow consumed events: {info:?}");
    }
    let keys: Vec<&String> = sessions[1].as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "consumed_seq",
            "created_at",
            "forked_from",
            "generation",
            "head",
            "name",
            "own_commits"
        ]
    );

    let table = store.run(&["sessions"]).ok().stdout;
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("SESSION  COMMITS  OWN  HEAD          FORKED FROM  CONSUMED  CREATED"),
        "{table}"
    );
    assert!(lines[1].starts_with("orders   4        4    "), "{table}");
    assert!(lines[2].starts_with("what-if  6        2    "), "{table}");
    assert!(lines[2].contains("orders at 4"), "{table}");
    let consumed = |line: &str| line.split_whitespace().rev().nth(1).unwrap().to_owned();
    assert_eq!(consumed(lines[1]), listed[0].consumed_seq.to_string(), "{table}");
    assert_eq!(consumed(lines[2]), listed[1].consumed_seq.to_string(), "{table}");
}

#[test]
fn log_shows_the_newest_commits_first_as_the_library_reads_them() {
    let store = store();
    let ctx = open(&store.path, "orders");
    let doc = store.json(&["log", "--session", "orders"]);
    let commits = doc["commits"].as_array().unwrap();
    let generations: Vec<u64> = commits.iter().map(|c| c["generation"].as_u64().unwrap()).collect();
    assert_eq!(generations, [4, 3, 2, 1]);
    for c in commits {
        let at = c["generation"].as_u64().unwrap() as usize - 1;
        assert_eq!(c["hash"], ctx.log().unwrap()[at].hash.to_string());
        assert_eq!(c["state_hash"], ctx.log().unwrap()[at].state_hash.to_string());
    }
    let run = &commits[2]["runs"][0];
    assert_eq!(
        (run["agent"].as_str(), run["produce"].as_str()),
        (Some("billing"), Some("process_order"))
    );
    assert_eq!(run["trigger"]["id"], "order:1");
    assert!(run["ops"]
        .as_array()
        .unwrap()
        .iter()
        .any(|op| op["op"] == "act" && op["key"] == support::DELIVERED));

    let table = store.run(&["log", "--session", "orders", "--limit", "2"]).ok().stdout;
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("COMMIT  HASH"), "{table}");
    assert!(lines[1].starts_with("4 "), "{table}");
    assert!(lines[2].starts_with("3 "), "{table}");
    assert_eq!(lines[3], "(2 older commits; --limit shows more)");
    let all = store.run(&["log", "--session", "orders"]).ok().stdout;
    assert!(all.contains("billing/process_order ×7"), "{all}");
}

#[test]
fn a_session_must_be_named_when_the_store_has_several_and_must_exist() {
    let store = store();
    store
        .run(&["log"])
        .fails(2, "holds 2 sessions (orders, what-if); name one with --session");
    for command in [
        &["log", "--session", "nope"][..],
        &["show", "order:1", "--session", "nope"],
        &["replay", "--session", "nope"],
        &["verify", "--session", "nope"],
        &["export-audit", "--session", "nope"],
        &["outbox", "list", "--session", "nope"],
        &["outbox", "stats", "--session", "nope"],
        &["why", support::DELIVERED, "--session", "nope"],
    ] {
        let run = store
            .run(command)
            .fails(2, "has no session `nope`; its sessions: orders, what-if");
        assert_eq!(run.stdout, "", "{command:?}");
    }
}

#[test]
fn show_reads_an_artifact_at_the_head_or_right_after_a_commit() {
    let store = store();
    let head = store.json(&["show", "receipt:order:1", "--session", "orders"]);
    assert_eq!(head["version"], 2);
    assert_eq!(head["written_in"], 4);
    assert_eq!(head["content"], json!({"order": "order:1", "total_cents": 1500}));
    let ctx = open(&store.path, "orders");
    assert_eq!(
        head["hash"],
        ctx.snapshot().meta("receipt:order:1").unwrap().2.to_string()
    );

    let before = store.json(&["show", "receipt:order:1", "--session", "orders", "--at", "2"]);
    assert_eq!((before["version"].as_u64(), before["at"].as_u64()), (Some(1), Some(2)));
    assert_eq!(before["content"]["total_cents"], 1200);
    // A commit named by a prefix of its hash.
    let prefix = &ctx.log().unwrap()[1].hash.to_string()[..10];
    let by_hash = store.json(&["show", "receipt:order:1", "--session", "orders", "--at", prefix]);
    assert_eq!(by_hash["version"], 1);

    let text = store.run(&["show", "order:1", "--session", "orders"]).ok().stdout;
    assert!(text.contains("kind        order"), "{text}");
    assert!(text.contains("\"customer\": \"ada@example.org\""), "{text}");

    store
        .run(&["show", "receipt:order:1", "--session", "orders", "--at", "1"])
        .fails(
            2,
            "no artifact `receipt:order:1` in session `orders` at commit 1; it exists at the head (commit 4)",
        );
    store
        .run(&["show", "nothing:1", "--session", "orders"])
        .fails(2, "no artifact `nothing:1` in session `orders` at commit 4");
    store
        .run(&["show", "order:1", "--session", "orders", "--at", "99"])
        .fails(2, "session `orders` has no commit 99: its log ends at commit 4");
    store
        .run(&["show", "order:1", "--session", "orders", "--at", "zz"])
        .fails(2, "`zz` is not a commit");
    store
        .run(&["show", "order:1", "--session", "orders", "--at", "ffffffff"])
        .fails(2, "no commit of session `orders` has a hash starting with `ffffffff`");
}

#[test]
fn diff_compares_two_sessions_or_two_commits() {
    let store = store();
    let sessions = store.json(&["diff", "orders", "what-if"]);
    let created: Vec<&str> = sessions["created"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(created, ["action:email:order:8", "order:8", "receipt:order:8"]);
    assert_eq!(sessions["updated"], json!([]));
    assert_eq!(sessions["deleted"], json!([]));

    let commits = store.json(&["diff", "2", "4", "--session", "orders"]);
    let updated = commits["updated"].as_array().unwrap();
    let ids: Vec<&str> = updated.iter().map(|u| u["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["order:1", "receipt:order:1"]);
    assert_eq!(updated[1]["before"]["version"], 1);
    assert_eq!(updated[1]["after"]["version"], 2);
    assert_eq!(
        updated[1]["fields"],
        json!([{"path": ".total_cents", "before": "1200", "after": "1500"}])
    );

    let text = store.run(&["diff", "2", "4", "--session", "orders"]).ok().stdout;
    assert!(text.contains("~ receipt:order:1  receipt v1 -> v2"), "{text}");
    assert!(text.contains("    .total_cents: 1200 -> 1500"), "{text}");
    let text = store.run(&["diff", "what-if", "orders"]).ok().stdout;
    assert!(text.starts_with("- action:email:order:8"), "{text}");
    let same = store.run(&["diff", "3", "3", "--session", "orders"]).ok().stdout;
    assert_eq!(same, "no differences\n");

    store.run(&["diff", "orders", "nope"]).fails(
        2,
        "`orders` and `nope` must both be sessions, or both commits of one session",
    );
    store.run(&["diff", "1", "nope", "--session", "orders"]).fails(
        2,
        "`nope` is neither a session of the store nor a commit of session `orders`",
    );
}

#[test]
fn why_and_graph_explain_an_intent() {
    let store = store();
    let why = store.json(&["why", support::DELIVERED]);
    assert_eq!(why["session"], "orders");
    assert_eq!(why["generation"], 2);
    assert_eq!(
        (why["agent"].as_str(), why["produce"].as_str()),
        (Some("billing"), Some("process_order"))
    );
    assert_eq!(why["trigger"]["id"], "order:1");
    assert_eq!(why["trigger"]["version"], 1);
    assert_eq!(why["delivery"]["status"], "delivered");
    let ctx = open(&store.path, "orders");
    assert_eq!(why["commit"], ctx.log().unwrap()[1].hash.to_string());

    assert_eq!(why["reads"], json!([{"id": "receipt:order:1", "version": null}]));
    let text = store.run(&["why", support::DEAD]).ok().stdout;
    assert!(text.contains("reads     receipt:order:3 (absent)"), "{text}");
    assert!(text.contains("run       2 by billing/process_order"), "{text}");
    assert!(text.contains("trigger   order:3 v1"), "{text}");
    assert!(text.contains("delivery  dead after 1 attempt(s)"), "{text}");
    // The branch's intent, found in the branch without naming it.
    assert_eq!(store.json(&["why", support::BRANCH])["session"], "what-if");
    store.run(&["why", support::BRANCH, "--session", "orders"]).fails(
        2,
        "no commit of session `orders` acts `email:order:8`; it was recorded in session `what-if`",
    );
    store
        .run(&["why", "nope:1"])
        .fails(2, "no intent with key `nope:1` in the delivery ledger");

    let mermaid = store.run(&["graph", support::DELIVERED]).ok().stdout;
    assert!(mermaid.starts_with("flowchart LR\n"), "{mermaid}");
    assert!(mermaid.contains("trigger[\"order:1 v1\"]"), "{mermaid}");
    assert!(mermaid.contains("  read0[\"receipt:order:1 (absent)\"]\n"), "{mermaid}");
    assert!(
        mermaid.contains("  trigger -->|triggered| run\n  run -->|acted| intent\n  read0 -.->|read| run\n"),
        "{mermaid}"
    );
    assert!(
        mermaid.contains("intent([\"email:order:1<br/>delivered, 1 attempt(s)\"])"),
        "{mermaid}"
    );
    let dot = store.run(&["graph", support::DELIVERED, "--format", "dot"]).ok().stdout;
    assert!(dot.starts_with("digraph provenance {\n"), "{dot}");
    assert!(dot.contains("trigger -> run [label=\"triggered\"];"), "{dot}");
    assert!(
        dot.contains("  read0 [shape=box, label=\"receipt:order:1 (absent)\"];"),
        "{dot}"
    );
    assert!(dot.contains("read0 -> run [label=\"read\", style=dashed];"), "{dot}");
    assert!(dot.ends_with("}\n"), "{dot}");
    let doc = store.json(&["graph", support::DELIVERED]);
    assert_eq!(
        doc["edges"][0],
        json!({"from": "trigger", "to": "run", "label": "triggered"})
    );
    store.run(&["graph", "nope:1"]).fails(2, "no intent with key `nope:1`");
    store
        .run(&["graph", support::DELIVERED, "--format", "png"])
        .fails(2, "invalid value 'png'");
}

#[test]
fn outbox_list_filters_and_pages_the_ledger() {
    let store = store();
    let all = store.json(&["outbox", "list"]);
    let entries: Vec<(&str, &str)> = all["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["key"].as_str().unwrap(), e["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        entries,
        [
            (support::DELIVERED, "delivered"),
            (support::DELIVERED_2, "delivered"),
            (support::DEAD, "dead"),
            (support::FAILED, "failed"),
            (support::HELD, "held"),
            (support::PENDING, "pending"),
            (support::IN_FLIGHT, "in-flight"),
            (support::BRANCH, "delivered"),
        ]
    );
    assert_eq!(all["next"], serde_json::Value::Null);
    let keys = |doc: &serde_json::Value| -> Vec<String> {
        doc["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["key"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        keys(&store.json(&["outbox", "list", "--status", "dead"])),
        [support::DEAD]
    );
    assert_eq!(
        keys(&store.json(&["outbox", "list", "--status", "in-flight"])),
        [support::IN_FLIGHT]
    );
    assert_eq!(
        keys(&store.json(&["outbox", "list", "--kind", "later"])),
        [support::PENDING, support::IN_FLIGHT]
    );
    assert_eq!(
        keys(&store.json(&["outbox", "list", "--session", "what-if"])),
        [support::BRANCH]
    );
    assert_eq!(
        keys(&store.json(&["outbox", "list", "--kind", "nothing"])),
        Vec::<String>::new()
    );

    let first = store.json(&["outbox", "list", "--limit", "3"]);
    assert_eq!(keys(&first), [support::DELIVERED, support::DELIVERED_2, support::DEAD]);
    let next = first["next"].as_u64().expect("a next page").to_string();
    let second = store.json(&["outbox", "list", "--limit", "3", "--after", &next]);
    assert_eq!(keys(&second), [support::FAILED, support::HELD, support::PENDING]);

    let table = store.run(&["outbox", "list", "--limit", "3"]).ok().stdout;
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("KEY            KIND   STATUS     ATTEMPTS  SESSION"),
        "{table}"
    );
    assert!(lines[3].contains("the sms gateway refused the number"), "{table}");
    assert_eq!(lines[4], format!("(more: --after {next})"));
    store
        .run(&["outbox", "list", "--status", "lost"])
        .fails(2, "invalid value 'lost'");
}

#[test]
fn outbox_show_gives_the_entry_its_lease_payload_and_provenance() {
    let store = store();
    let doc = store.json(&["outbox", "show", support::IN_FLIGHT]);
    assert_eq!(doc["status"], "in-flight");
    assert_eq!(doc["lease"]["owner"], "a drain that died");
    assert_eq!(doc["lease"]["token"], doc["token"]);
    assert_eq!(
        doc["payload"],
        json!({"customer": "gus@example.com", "order": "order:7"})
    );
    assert_eq!(doc["run"]["produce"], "process_order");
    assert_eq!(doc["run"]["trigger"]["id"], "order:7");
    assert_eq!(doc["origin"]["session"], "orders");
    let dead = store.json(&["outbox", "show", support::DEAD]);
    assert_eq!(dead["last_error"], "the sms gateway refused the number");
    assert_eq!(
        (dead["attempts"].as_u64(), dead["expired_leases"].as_u64()),
        (Some(1), Some(0))
    );

    // Every attempt: order 7's found no route (held), then the drain that died holds it.
    let history = doc["attempt_history"].as_array().expect("a history");
    assert_eq!(history.len(), 2, "{history:?}");
    assert_eq!(history[0]["outcome"], "held");
    assert_eq!(history[0]["error"], "no route for kind `later`");
    assert_eq!(history[0]["token"], 1);
    assert!(history[0]["ended_at"].is_string());
    assert_eq!(history[1]["outcome"], "in-flight");
    assert_eq!(history[1]["owner"], "a drain that died");
    assert_eq!(history[1]["token"], doc["token"]);
    assert_eq!(history[1]["lease_expires_at"], doc["lease"]["expires_at"]);
    assert_eq!(history[1]["ended_at"], Value::Null);
    assert_eq!(dead["attempt_history"].as_array().map(Vec::len), Some(1));
    assert_eq!(dead["attempt_history"][0]["outcome"], "dead");
    assert_eq!(
        dead["attempt_history"][0]["error"],
        "the sms gateway refused the number"
    );
    let delivered = store.json(&["outbox", "show", support::DELIVERED]);
    let history = delivered["attempt_history"].as_array().expect("a history");
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0]["outcome"], "delivered");
    assert_eq!(history[0]["ended_at"], delivered["delivered_at"]);
    assert_eq!(history[0]["number"], 1);
    // Order 6's claim was released: not an attempt.
    let pending = store.json(&["outbox", "show", support::PENDING]);
    assert_eq!(
        pending["attempt_history"].as_array().map(Vec::len),
        Some(1),
        "only the held one"
    );

    let text = store.run(&["outbox", "show", support::FAILED]).ok().stdout;
    assert!(text.contains("status        failed"), "{text}");
    assert!(text.contains("OUTCOME"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("1  ") && l.contains("failed") && l.contains("the push service answered 503")),
        "{text}"
    );
    assert!(text.contains("last error    the push service answered 503"), "{text}");
    assert!(
        text.contains("recorded by   billing/process_order, triggered by order:4 v1"),
        "{text}"
    );
    assert!(text.contains("\"customer\": \"di@example.com\""), "{text}");
    store
        .run(&["outbox", "show", "nope:1"])
        .fails(2, "no intent with key `nope:1` in the delivery ledger of");
}

/// `outbox show` (text and JSON) and `outbox list` give the trace context the store kept
/// beside each intent, as the `traceparent` header string; a stored value that does not
/// decode shows as none.
#[test]
fn outbox_show_gives_the_trace_context_the_store_kept() {
    let store = store();
    let kept = {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let outbox = reactifact_core::store::SqliteOutbox::open_read_only(&store.path).unwrap();
            reactifact_core::store::OutboxStore::get(&*outbox, support::FAILED)
                .await
                .unwrap()
                .unwrap()
        })
    };
    let header = kept
        .intent()
        .trace_parent()
        .expect("a produce run's intent keeps its trace context")
        .to_string();
    assert!(header.starts_with("00-") && header.len() == 55, "{header}");
    let doc = store.json(&["outbox", "show", support::FAILED]);
    assert_eq!(doc["traceparent"], header.as_str());
    let all = store.json(&["outbox", "list"]);
    let listed = all["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["key"] == support::FAILED)
        .expect("listed");
    assert_eq!(listed["traceparent"], header.as_str());
    let text = store.run(&["outbox", "show", support::FAILED]).ok().stdout;
    assert!(text.contains(&format!("traceparent   {header}")), "{text}");

    let conn = rusqlite::Connection::open(&store.path).unwrap();
    conn.execute(
        "UPDATE outbox SET trace_parent = X'00' WHERE key = ?1",
        [support::FAILED],
    )
    .unwrap();
    drop(conn);
    let doc = store.json(&["outbox", "show", support::FAILED]);
    assert_eq!(doc["traceparent"], Value::Null, "{doc}");
    assert_eq!(doc["status"], "failed", "the row is intact");
    let text = store.run(&["outbox", "show", support::FAILED]).ok().stdout;
    assert!(text.contains("traceparent   -"), "{text}");
}

#[test]
fn outbox_stats_counts_by_status_and_kind() {
    let store = store();
    let doc = store.json(&["outbox", "stats"]);
    assert_eq!(
        doc["counts"],
        json!({"pending": 1, "in-flight": 1, "delivered": 3, "failed": 1, "retrying": 0, "dead": 1, "held": 1, "cancelled": 0, "awaiting-approval": 0, "rejected": 0, "blocked": 0, "total": 8})
    );
    assert_eq!(doc["by_kind"]["email"], json!({"delivered": 3}));
    assert_eq!(doc["by_kind"]["later"], json!({"pending": 1, "in-flight": 1}));
    assert_eq!(doc["oldest_pending"]["key"], support::PENDING);
    let branch = store.json(&["outbox", "stats", "--session", "what-if"]);
    assert_eq!(branch["counts"]["total"], 1);
    assert_eq!(branch["oldest_pending"], serde_json::Value::Null);

    let text = store.run(&["outbox", "stats"]).ok().stdout;
    assert!(text.contains("\ndead                 1\n"), "{text}");
    assert!(text.contains("\nemail  0        0          3"), "{text}");
    assert!(
        text.contains(&format!("oldest pending: {} (", support::PENDING)),
        "{text}"
    );
}

#[test]
fn outbox_stats_shows_a_paused_rate_limit() {
    let store = store();
    let none = store.json(&["outbox", "stats"]);
    assert_eq!(none["rate_limits"], json!([]), "no bucket yet");
    // A receiver asked the mail kind to wait an hour; another bucket's pause has ended.
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let outbox = reactifact_core::store::SqliteOutbox::open(&store.path).unwrap();
    let now = std::time::SystemTime::now();
    runtime.block_on(async {
        use reactifact_core::store::OutboxStore;
        outbox
            .pause("mail", now + std::time::Duration::from_secs(3600))
            .await
            .unwrap();
        outbox
            .pause("sms", now - std::time::Duration::from_secs(60))
            .await
            .unwrap();
    });
    drop(outbox);
    let doc = store.json(&["outbox", "stats"]);
    let limits = doc["rate_limits"].as_array().unwrap();
    assert_eq!(limits.len(), 2, "{doc}");
    assert_eq!(limits[0]["name"], "mail");
    assert!(limits[0]["paused_until"].is_string(), "{doc}");
    assert_eq!(
        (&limits[1]["name"], &limits[1]["paused_until"]),
        (&json!("sms"), &Value::Null)
    );
    let text = store.run(&["outbox", "stats"]).ok().stdout;
    assert!(
        text.contains("RATE LIMIT") && text.contains("\nsms         -"),
        "{text}"
    );
}

#[test]
fn verify_checks_every_session_and_fails_with_exit_1_on_a_changed_store() {
    let store = store();
    let doc = store.json(&["verify"]);
    assert_eq!(doc["ok"], true);
    let sessions = doc["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2);
    assert_eq!(sessions[1]["commits"], 6);
    let text = store.run(&["verify", "--session", "orders"]).ok().stdout;
    assert!(text.lines().nth(1).unwrap().ends_with("  ok"), "{text}");

    // An outbox row changed outside reactifact: its digest no longer matches.
    let conn = rusqlite::Connection::open(&store.path).unwrap();
    conn.execute(
        "UPDATE outbox SET last_error = 'forged' WHERE key = ?1",
        [support::DEAD],
    )
    .unwrap();
    drop(conn);
    let run = store.run(&["verify"]).fails(
        1,
        "verification failed: session `orders`: commit 2: the outbox row of `sms:order:3`, which it acted, was changed",
    );
    // Both sessions' logs hold commit 2 (the branch was forked after it), which acted the key.
    assert_eq!(
        run.stdout
            .matches("FAILED: commit 2: the outbox row of `sms:order:3`, which it acted, was changed")
            .count(),
        2,
        "{run:?}"
    );
    let doc = {
        let run = store.run(&["--json", "verify"]);
        assert_eq!(run.code, 1);
        run.json()
    };
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["sessions"][0]["ok"], false);
}

/// Renames the produce of commit 2's runs in the log (same length, so the row still decodes):
/// the state is unchanged, the commit hash no longer matches.
fn rename_produce(path: &std::path::Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut runs: Vec<u8> = conn
        .query_row(
            "SELECT runs FROM commits WHERE session = 'orders' AND generation = 2",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let at = runs
        .windows(13)
        .position(|w| w == b"process_order")
        .expect("the produce's name");
    runs[at..at + 13].copy_from_slice(b"process_ordeR");
    conn.execute(
        "UPDATE commits SET runs = ?1 WHERE session = 'orders' AND generation = 2",
        [runs],
    )
    .unwrap();
}

#[test]
fn replay_refolds_up_to_a_commit_checking_every_hash() {
    let store = store();
    let ctx = open(&store.path, "orders");
    let doc = store.json(&["replay", "--session", "orders", "--to", "2"]);
    assert_eq!(doc["commits"], 2);
    assert_eq!(doc["head"], ctx.log().unwrap()[1].hash.to_string());
    assert_eq!(doc["state_hash"], ctx.log().unwrap()[1].state_hash.to_string());
    assert_eq!(doc["kinds"], json!({"order": 7, "pending_action": 7, "receipt": 7}));
    let empty = store.json(&["replay", "--session", "orders", "--to", "0"]);
    assert_eq!(
        (empty["commits"].as_u64(), empty["artifacts"].as_u64()),
        (Some(0), Some(0))
    );
    let text = store.run(&["replay", "--session", "what-if"]).ok().stdout;
    assert!(
        text.contains("refolded    commits 1..=6 of 6, every hash checked"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "state hash  {} (as recorded)",
            open(&store.path, "what-if").state_hash()
        )),
        "{text}"
    );
    store
        .run(&["replay", "--session", "orders", "--to", "9"])
        .fails(2, "session `orders` has no commit 9");

    rename_produce(&store.path);
    // Before commit 2 the log checks out; through it, the commit hash does not.
    store.json(&["replay", "--session", "orders", "--to", "1"]);
    store.run(&["replay", "--session", "orders"]).fails(
        1,
        "replay of session `orders` failed: commit 2: its hash does not match its content",
    );
    store
        .run(&["verify", "--session", "orders"])
        .fails(1, "commit 2: its hash does not match its content");
    // The branch shares the changed commit.
    store.run(&["verify", "--session", "what-if"]).fails(1, "commit 2");
}

#[test]
fn export_audit_writes_what_the_library_exports() {
    let store = store();
    let run = store.run(&["export-audit", "--session", "orders"]).ok();
    let ctx = open(&store.path, "orders");
    let mut expected = Vec::new();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    assert_eq!(rt.block_on(ctx.export_audit(&mut expected)).unwrap(), 4);
    assert_eq!(run.stdout.as_bytes(), expected);
    let generations: Vec<u64> = run
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["generation"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(generations, [1, 2, 3, 4]);
    store.run(&["export-audit"]).fails(2, "name one with --session");
}

#[test]
fn reading_commands_leave_the_store_byte_for_byte_as_it_was() {
    let store = store();
    let before = std::fs::read(&store.path).unwrap();
    let files = store.files();
    for command in [
        &["sessions"][..],
        &["log", "--session", "orders"],
        &["show", "order:1", "--session", "orders", "--at", "1"],
        &["diff", "orders", "what-if"],
        &["diff", "1", "4", "--session", "orders"],
        &["why", support::DELIVERED],
        &["graph", support::DELIVERED, "--format", "dot"],
        &["outbox", "list"],
        &["outbox", "show", support::IN_FLIGHT],
        &["outbox", "stats"],
        &["verify"],
        &["replay", "--session", "what-if"],
        &["export-audit", "--session", "orders"],
    ] {
        store.run(command).ok();
        assert_eq!(
            std::fs::read(&store.path).unwrap(),
            before,
            "{command:?} changed the file"
        );
        assert_eq!(store.files(), files, "{command:?} left files behind");
    }
}

#[test]
fn the_store_is_named_by_flag_or_environment_and_bad_names_are_clear_errors() {
    let store = store();
    // REACTIFACT_STORE, and the flag over it.
    let run = reactifact_env(&["sessions"], Some(&store.path)).ok();
    assert!(run.stdout.contains("what-if"), "{run:?}");
    let sqlite_url = format!("sqlite:{}", store.path.display());
    reactifact(&["--store", &sqlite_url, "sessions"]).ok();
    let missing = store.dir.path().join("missing.db");
    reactifact_env(
        &["--store".as_ref(), missing.as_os_str(), "sessions".as_ref()],
        Some(&store.path),
    )
    .fails(
        2,
        "missing.db does not exist; check --store (or REACTIFACT_STORE): the CLI never creates a store",
    );
    assert!(!missing.exists(), "nothing created");

    reactifact(&["sessions"]).fails(
        2,
        "no store given: pass --store PATH (a SQLite file) or --store postgres://USER@HOST/DATABASE, or set REACTIFACT_STORE",
    );
    // PostgreSQL URLs that fail before any connection (the server's cases are in postgres.rs).
    let bad = reactifact(&[
        "--store",
        "postgres://ops:hunter2@db.internal:notaport/app",
        "outbox",
        "list",
    ])
    .fails(2, "invalid postgres url `postgres://ops:***@db.internal:notaport/app`");
    assert!(!bad.stderr.contains("hunter2"), "the password is not echoed: {bad:?}");
    reactifact(&["--store", "postgresql://ops@db.internal/app?schema=Orders", "sessions"])
        .fails(2, "invalid schema name `Orders`");
    reactifact(&[
        "--store",
        "postgres://ops@db.internal/app?schema=a",
        "--schema",
        "b",
        "sessions",
    ])
    .fails(2, "the store URL names schema `a` and --schema names `b`");
    reactifact(&[
        "--store".as_ref(),
        store.path.as_os_str(),
        "--schema".as_ref(),
        "a".as_ref(),
        "sessions".as_ref(),
    ])
    .fails(
        2,
        "--schema names the schema of a PostgreSQL store; this store is a SQLite file",
    );
    reactifact(&["--store", "mysql://db/app", "sessions"])
        .fails(2, "unsupported store URL `mysql://db/app` (scheme `mysql`)");

    let text = store.dir.path().join("notes.txt");
    std::fs::write(&text, "not a database at all, just some text that is long enough").unwrap();
    reactifact(&["--store".as_ref(), text.as_os_str(), "sessions".as_ref()]).fails(2, "is not a reactifact database");
    let empty = store.dir.path().join("empty.db");
    std::fs::write(&empty, "").unwrap();
    reactifact(&["--store".as_ref(), empty.as_os_str(), "verify".as_ref()]).fails(2, "not a reactifact store");

    // Usage errors are exit 2 too; help is exit 0.
    reactifact(&["frobnicate"]).fails(2, "unrecognized subcommand 'frobnicate'");
    let help = reactifact(&["--help"]).ok();
    assert!(help.stdout.contains("Exit codes: 0 ok, 1 a check failed"), "{help:?}");
}

#[test]
fn a_long_log_draws_no_progress_bar_when_stderr_is_not_a_terminal() {
    // 600 commits: past the length at which verify and replay show a bar on a terminal.
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("long.db");
    {
        let options = OpenOptions::new().synchronous(reactifact_core::store::Synchronous::Normal);
        let mut ctx = Context::open_with(&path, "long", options).unwrap();
        for n in 0..600u64 {
            ctx.create(
                format!("receipt:{n}"),
                support::Receipt {
                    order: format!("order:{n}"),
                    total_cents: n,
                },
            )
            .unwrap();
        }
    }
    for command in [&["verify"][..], &["replay", "--to", "599"]] {
        let mut args = vec!["--store", path.to_str().unwrap()];
        args.extend(command);
        let run = reactifact(&args).ok();
        assert_eq!(run.stderr, "", "{command:?} wrote to a stderr that is not a terminal");
    }
    let run = reactifact(&["--json", "--store", path.to_str().unwrap(), "replay", "--to", "599"]).ok();
    assert_eq!(run.json()["artifacts"], 599);
}

#[test]
fn a_damaged_file_fails_verify_with_exit_1_and_other_commands_with_exit_2() {
    let store = store();
    let bytes = std::fs::read(&store.path).unwrap();
    std::fs::write(&store.path, &bytes[..bytes.len() / 2]).unwrap();
    store.run(&["verify"]).fails(1, "is corrupt");
    store
        .run(&["sessions"])
        .fails(2, "is corrupt")
        .fails(2, "`reactifact verify` checks the whole store");
    store.run(&["outbox", "list"]).fails(2, "is corrupt");
}

#[test]
fn a_changed_artifact_byte_fails_the_open_so_verify_reports_it_with_exit_1() {
    let store = store();
    let conn = rusqlite::Connection::open(&store.path).unwrap();
    let mut runs: Vec<u8> = conn
        .query_row(
            "SELECT runs FROM commits WHERE session = 'orders' AND generation = 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let at = runs
        .windows(15)
        .position(|w| w == b"ada@example.com")
        .expect("the customer");
    runs[at..at + 3].copy_from_slice(b"eve");
    conn.execute(
        "UPDATE commits SET runs = ?1 WHERE session = 'orders' AND generation = 1",
        [runs],
    )
    .unwrap();
    drop(conn);
    let doc = {
        let run = store.run(&["--json", "verify"]);
        assert_eq!(run.code, 1, "{run:?}");
        run.json()
    };
    // Both sessions share commit 1; each fails at open, naming the commit.
    for session in doc["sessions"].as_array().unwrap() {
        assert_eq!(session["ok"], false);
        let error = session["error"].as_str().unwrap();
        assert!(
            error.contains("commit 1: replaying it does not give the state hash it recorded"),
            "{error}"
        );
    }
    store
        .run(&["log", "--session", "orders"])
        .fails(2, "is corrupt")
        .fails(2, "`reactifact verify` checks the whole store");
    store.run(&["replay", "--session", "orders"]).fails(1, "commit 1");
}
