//! How results are shown: aligned tables and `key value` blocks for people, one JSON document
//! for scripts (built by `reactifact_admin::json`, the schema the console's API shares).

use std::io::Write;
use std::time::{Duration, SystemTime};

pub use reactifact_admin::json::{attempt_json, attempt_outcome, delivery_json, json_time, status, time};
use reactifact_core::ledger::Decision;
use serde::Serialize;

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

/// An optional time, `-` for none.
pub fn time_or_dash(t: Option<SystemTime>) -> String {
    t.map_or_else(|| "-".to_owned(), time)
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
