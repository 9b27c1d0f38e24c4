//! `--json-logs`, on the programs as built: stderr holds only JSON objects, one per line; the
//! lines carry the correlation fields of the runtime's spans; and no payload reaches a line.

use std::process::{Command, Output};

use serde_json::Value;

/// Runs `program` with `args` and the default log filter; its output, once it succeeded.
fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("the program runs");
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Every line of `stderr`, each parsed as a JSON object; panics naming a line that is not one.
fn json_lines(stderr: &[u8]) -> Vec<(String, Value)> {
    let text = String::from_utf8(stderr.to_vec()).expect("stderr is UTF-8");
    let lines: Vec<(String, Value)> = text
        .lines()
        .map(|line| {
            let value: Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("a stderr line is not JSON ({e}): {line:?}"));
            assert!(value.is_object(), "not a JSON object: {line:?}");
            for field in ["timestamp", "level", "target", "fields"] {
                assert!(value.get(field).is_some(), "no `{field}` in {line:?}");
            }
            (line.to_owned(), value)
        })
        .collect();
    assert!(!lines.is_empty(), "no log line at all");
    lines
}

/// The spans of a line: its current span and the list of spans it happened in.
fn spans(line: &Value) -> impl Iterator<Item = &Value> {
    let current = line.get("span").into_iter();
    let list = line.get("spans").and_then(Value::as_array).into_iter().flatten();
    current.chain(list)
}

/// Whether some line happened in a span named `name` that has all of `fields`.
fn some_line_in(lines: &[(String, Value)], name: &str, fields: &[&str]) -> bool {
    lines.iter().any(|(_, line)| {
        spans(line).any(|span| {
            span.get("name").and_then(Value::as_str) == Some(name)
                && fields.iter().all(|f| span.get(*f).is_some_and(|v| !v.is_null()))
        })
    })
}

/// Every string in `value`, at any depth.
fn strings(value: &Value) -> Vec<&str> {
    match value {
        Value::String(s) => vec![s.as_str()],
        Value::Array(items) => items.iter().flat_map(strings).collect(),
        Value::Object(map) => map.values().flat_map(strings).collect(),
        _ => Vec::new(),
    }
}

#[test]
fn outbox_json_logs_carry_the_produce_and_delivery_spans_and_no_payload() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shop.db");
    // `--json-logs` combines with the program's other argument, the SQLite path.
    let out = run(env!("CARGO_BIN_EXE_outbox"), &["--json-logs", db.to_str().unwrap()]);
    assert!(db.exists(), "the walkthrough used the path given next to --json-logs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Every case held"), "{stdout}");

    let lines = json_lines(&out.stderr);
    assert!(
        some_line_in(&lines, "produce", &["agent", "produce", "artifact_id", "generation"]),
        "no line in a `produce` span with its fields"
    );
    assert!(
        some_line_in(&lines, "delivery", &["action_key", "kind", "attempt"]),
        "no line in a `delivery` span with its fields"
    );
    assert!(
        some_line_in(&lines, "turn", &["turn", "session"]),
        "no line in a `turn` span with its fields"
    );

    // The walkthrough's payloads name their customers: none of them is in a log line's values.
    let customers = ["ada", "bob", "cy", "eve", "fay", "gus", "hal"];
    for (raw, line) in &lines {
        for text in strings(line) {
            assert!(
                !customers
                    .iter()
                    .any(|c| text.split(|ch: char| !ch.is_alphanumeric()).any(|w| w == *c)),
                "a payload's customer reached a log line: {raw}"
            );
            assert!(
                !text.contains("customer"),
                "a payload's field reached a log line: {raw}"
            );
        }
    }
}

#[test]
fn support_agent_json_logs_are_json_and_hold_no_email_address() {
    let out = run(env!("CARGO_BIN_EXE_support-agent"), &["--json-logs"]);
    let lines = json_lines(&out.stderr);
    // Its tickets' payloads hold the customers' addresses; its emails' payloads too.
    for (raw, _) in &lines {
        assert!(
            !raw.contains("@example.com"),
            "a ticket's email address reached a log line: {raw}"
        );
    }
    assert!(
        some_line_in(&lines, "turn", &["turn", "session"]),
        "no line in a `turn` span"
    );
}

#[test]
fn without_the_option_stderr_stays_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        env!("CARGO_BIN_EXE_outbox"),
        &[dir.path().join("shop.db").to_str().unwrap()],
    );
    assert!(
        out.stderr.is_empty(),
        "stderr without --json-logs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_bad_log_filter_is_refused_with_exit_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--json-logs")
        .env("RUST_LOG", "reactifact_core=loud")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("RUST_LOG"), "{stderr}");
}
