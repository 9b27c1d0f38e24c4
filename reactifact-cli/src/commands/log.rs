//! `log`: a session's commits, newest first.

use reactifact_admin::json::commit_json;
use reactifact_core::audit::{Commit, Op, RunRecord};
use serde_json::{json, Value};

use super::Env;
use crate::failure::{Failure, Outcome};
use crate::output::{cut, print_json, Table};

/// Shows the last `limit` commits of the session.
pub fn log(env: &Env, session: Option<&str>, limit: usize) -> Outcome {
    let session = env.store.session(session)?;
    let ctx = env.store.open_session(&session, false)?;
    let log = ctx.log().map_err(Failure::history)?;
    let shown: Vec<&Commit> = log.iter().rev().take(limit).collect();
    if env.json {
        let commits: Vec<Value> = shown.iter().map(|c| commit_json(c)).collect();
        print_json(&json!({
            "session": session,
            "generation": ctx.generation().0,
            "commits": commits,
        }));
        return Ok(());
    }
    let mut table = Table::new(&["COMMIT", "HASH", "RUNS", "WRITES", "INTENTS", "WHAT"]);
    for c in &shown {
        let writes = c
            .runs
            .iter()
            .flat_map(|r| &r.ops)
            .filter(|op| !matches!(op, Op::Act { .. }))
            .count();
        let intents = c
            .runs
            .iter()
            .flat_map(|r| &r.ops)
            .filter(|op| matches!(op, Op::Act { .. }))
            .count();
        let what = match c.merged {
            Some(merged) => format!("merge of {}", merged.short()),
            None => summary(&c.runs),
        };
        table.row(vec![
            c.generation.0.to_string(),
            c.hash.short(),
            c.runs.len().to_string(),
            writes.to_string(),
            intents.to_string(),
            cut(&what, 60),
        ]);
    }
    table.print();
    if log.len() > shown.len() {
        outln!("({} older commits; --limit shows more)", log.len() - shown.len());
    }
    Ok(())
}

/// What a commit's runs were: `agent/produce on trigger` for a produce that ran once,
/// `agent/produce ×N` for one that ran N times, `direct write`, in the order they first ran.
fn summary(runs: &[RunRecord]) -> String {
    let mut groups: Vec<(String, usize, Option<String>)> = Vec::new();
    for run in runs {
        let label = match (&run.agent, &run.produce) {
            (Some(agent), Some(produce)) => format!("{agent}/{produce}"),
            _ => "direct write".to_owned(),
        };
        let trigger = run.trigger.as_ref().map(|t| t.id.to_string());
        match groups.iter_mut().find(|(l, _, _)| *l == label) {
            Some(group) => group.1 += 1,
            None => groups.push((label, 1, trigger)),
        }
    }
    groups
        .into_iter()
        .map(|(label, n, trigger)| match (n, trigger) {
            (1, Some(trigger)) => format!("{label} on {trigger}"),
            (1, None) => label,
            (n, _) => format!("{label} ×{n}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
