//! How results are shown: aligned tables and `key value` blocks for people, one JSON document
//! for scripts, and the JSON forms shared by several commands.

use std::io::Write;
use std::time::{Duration, SystemTime};

use reactifact_core::ledger::{Attempt, AttemptOutcome, Decision, Delivery, DeliveryStatus};
use serde::Serialize;
use serde_json::{json, Value};

/// Prints a line on stdout, like `println!`, without panicking when the reader has gone away
/// (`reactifact log | head`): the command then ends quietly with exit 0.
macro_rules! outln {
    () => { $crate::output::emit("") };
    ($($arg:tt)*) => { $crate::output::emit(&format!($($arg)*)) };
}

/// Writes `line` and a newline on stdout (see `outln!`).
pub fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(line.as_bytes()).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("reactifact: stdout: {e}");
        std::process::exit(2);
    }
}

/// A table: a header row and rows, printed with every column but the last padded to its
/// widest cell, two spaces apart.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Self {
        Table {
            rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row.
    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i + 1 < row.len() {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(widths[i] - cell.chars().count() + 2));
                } else {
                    line.push_str(cell);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    /// Prints the table on stdout.
    pub fn print(&self) {
        let text = self.render();
        outln!("{}", text.trim_end_matches('\n'));
    }
}

/// Prints `key value` lines with the values aligned.
pub fn print_fields(fields: &[(&str, String)]) {
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in fields {
        let mut lines = value.lines();
        outln!("{key:width$}  {}", lines.next().unwrap_or(""));
        for line in lines {
            outln!("{:width$}  {line}", "");
        }
    }
}

/// Prints `value` as one pretty-printed JSON document on stdout.
pub fn print_json(value: &impl Serialize) {
    outln!(
        "{}",
        serde_json::to_string_pretty(value).expect("the CLI's JSON documents always serialize")
    );
}

/// A time as RFC 3339 in UTC, to the millisecond.
pub fn time(t: SystemTime) -> String {
    // Stores clamp what they read to the year 9999; a later time (which humantime cannot
    // format, and `to_string` would panic on) shows as milliseconds since the epoch.
    use std::fmt::Write as _;
    let mut out = String::new();
    if write!(out, "{}", humantime::format_rfc3339_millis(t)).is_err() {
        out.clear();
        let ms = t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        let _ = write!(out, "{ms} ms after the Unix epoch");
    }
    out
}

/// An optional time, `-` for none.
pub fn time_or_dash(t: Option<SystemTime>) -> String {
    t.map_or_else(|| "-".to_owned(), time)
}

/// A time for JSON: RFC 3339, or `null`.
pub fn json_time(t: Option<SystemTime>) -> Value {
    t.map_or(Value::Null, |t| Value::String(time(t)))
}

/// A status as the command line and the JSON documents spell it (`in-flight`, …).
pub fn status(status: DeliveryStatus) -> &'static str {
    match status {
        DeliveryStatus::Pending => "pending",
        DeliveryStatus::InFlight => "in-flight",
        DeliveryStatus::Delivered => "delivered",
        DeliveryStatus::Failed => "failed",
        DeliveryStatus::Dead => "dead",
        DeliveryStatus::Held => "held",
        DeliveryStatus::Cancelled => "cancelled",
        DeliveryStatus::AwaitingApproval => "awaiting-approval",
        DeliveryStatus::Rejected => "rejected",
        DeliveryStatus::Blocked => "blocked",
        _ => "unknown",
    }
}

/// How long ago `t` was, in whole seconds, from `now` (0 for a time in the future).
pub fn age(now: SystemTime, t: SystemTime) -> Duration {
    Duration::from_secs(now.duration_since(t).unwrap_or_default().as_secs())
}

/// A value for a table cell, cut to `max` characters with an ellipsis.
pub fn cut(text: &str, max: usize) -> String {
    let flat = text.replace('\n', " ");
    if flat.chars().count() <= max {
        flat
    } else {
        let mut out: String = flat.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// An outcome of an attempt as the command line and the JSON documents spell it
/// (`in-flight`, `delivered`, `failed`, `dead`, `held`, `interrupted`, `expired`).
pub fn attempt_outcome(outcome: &AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::InFlight => "in-flight",
        other => other.name(),
    }
}

/// One attempt of the history, as `outbox show --json` prints it.
pub fn attempt_json(a: &Attempt) -> Value {
    json!({
        "token": a.token.0,
        "number": a.number,
        "owner": &*a.owner,
        "claimed_at": time(a.claimed_at),
        "lease_expires_at": time(a.lease_expires_at),
        "ended_at": json_time(a.ended_at),
        "outcome": attempt_outcome(&a.outcome),
        "error": a.outcome.error(),
        "retry_at": json_time(match &a.outcome {
            AttemptOutcome::Failed { retry_at, .. } => *retry_at,
            _ => None,
        }),
    })
}

/// An operator's approval or rejection as JSON (`null` for none): `verdict` (`approved` or
/// `rejected`), `by`, `at`, `reason`, and `digest`, the action hash it was made on (lowercase
/// hex; `null` for a decision an older build recorded).
pub fn decision_json(decision: Option<&Decision>) -> Value {
    decision.map_or(Value::Null, |d| {
        json!({
            "verdict": d.verdict.to_string(),
            "by": d.by,
            "at": time(d.at),
            "reason": d.reason,
            "digest": d.digest.map(|h| h.to_string()),
        })
    })
}

/// An operator's decision in one line: `approved by ada at … (digest 1a2b…)`, `rejected by bob
/// at … (digest …): why`; `(no digest)` for a decision an older build recorded.
pub fn decision_line(d: &Decision) -> String {
    let mut line = format!("{} by {} at {}", d.verdict, d.by, time(d.at));
    match &d.digest {
        Some(digest) => line.push_str(&format!(" (digest {digest})")),
        None => line.push_str(" (no digest)"),
    }
    if let Some(reason) = &d.reason {
        line.push_str(": ");
        line.push_str(reason);
    }
    line
}

/// A ledger entry as JSON: the schema of `outbox list` entries, `outbox show`, and the entries
/// that `retry` and `cancel` return.
pub fn delivery_json(d: &Delivery) -> Value {
    let origin = d.origin();
    json!({
        "key": d.key().as_str(),
        "kind": d.kind(),
        "status": status(d.status()),
        "attempts": d.attempts(),
        "failed_attempts": d.failed_attempts(),
        "expired_leases": d.expired_leases(),
        "interrupted_attempts": d.interrupted_attempts(),
        "last_error": d.last_error(),
        "cancel_reason": d.cancel_reason(),
        "decision": decision_json(d.decision()),
        "traceparent": d.intent().trace_parent().map(ToString::to_string),
        "token": d.token().0,
        "lease": d.lease().map(|lease| json!({
            "owner": &*lease.owner,
            "expires_at": time(lease.expires_at),
            "token": lease.token.0,
        })),
        "origin": {
            "session": origin.session(),
            "commit": origin.commit().to_string(),
            "generation": origin.generation().0,
            "run": origin.run(),
        },
        "recorded_at": time(d.recorded_at()),
        "updated_at": time(d.updated_at()),
        "delivered_at": json_time(d.delivered_at()),
        "next_attempt_at": json_time(d.next_attempt_at()),
        "not_before": json_time(d.not_before()),
        "group": d.group(),
    })
}
