//! `log`: a session's commits, newest first.

use reactifact_core::audit::{Commit, Op, RunRecord};
use reactifact_core::runtime::{CallOutcome, RecordedCall};
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

/// A recorded call as JSON, as `Context::export_audit` writes it: its name, request hash, the
/// answer's hash and size (never the answer) or the error it failed with, and its usage.
fn call_json(call: &RecordedCall) -> Value {
    let (answer, failed) = match &call.outcome {
        CallOutcome::Answered { hash, bytes } => (Some(json!({"hash": hash.to_string(), "bytes": bytes.len()})), None),
        CallOutcome::Failed { error } | CallOutcome::Unrecordable { error } => (None, Some(error.as_str())),
        CallOutcome::Abandoned => (None, Some("abandoned")),
        _ => (None, None),
    };
    json!({
        "name": &*call.name,
        "request": call.request.to_string(),
        "answer": answer,
        "failed": failed,
        "usage": {"tokens_in": call.usage.tokens_in, "tokens_out": call.usage.tokens_out, "cost": call.usage.cost},
    })
}

/// One operation as JSON.
pub fn op_json(op: &Op) -> Value {
    match op {
        Op::Put {
            mode, id, kind, hash, ..
        } => json!({
            "op": "put", "mode": format!("{mode:?}").to_lowercase(), "id": id.as_str(), "kind": kind.as_str(), "hash": hash.to_string(),
        }),
        Op::Delete { id } => json!({"op": "delete", "id": id.as_str()}),
        Op::Link(r) => json!({"op": "link", "from": r.from.as_str(), "name": &*r.name, "to": r.to.as_str()}),
        Op::Unlink(r) => json!({"op": "unlink", "from": r.from.as_str(), "name": &*r.name, "to": r.to.as_str()}),
        Op::Act { key, action, hash, .. } => json!({
            "op": "act", "key": key.as_str(), "kind": &**action, "id": op.id().as_str(), "hash": hash.to_string(),
        }),
        _ => json!({"op": "other", "id": op.id().as_str()}),
    }
}

/// One commit as JSON: the schema of `log --json` entries.
fn commit_json(c: &Commit) -> Value {
    let runs: Vec<Value> = c
        .runs
        .iter()
        .map(|r| {
            json!({
                "agent": r.agent.as_deref(),
                "produce": r.produce.as_deref(),
                "trigger": r.trigger.as_ref().map(|t| json!({"id": t.id.as_str(), "version": t.version.0, "hash": t.hash.to_string()})),
                "ops": r.ops.iter().map(op_json).collect::<Vec<_>>(),
                "reads": r.reads.iter().map(|read| json!({"id": read.id.as_str(), "version": read.version.map(|v| v.0)})).collect::<Vec<_>>(),
                "calls": r.calls.iter().map(call_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "generation": c.generation.0,
        "hash": c.hash.to_string(),
        "parent": c.parent.map(|h| h.to_string()),
        "merged": c.merged.map(|h| h.to_string()),
        "state_hash": c.state_hash.to_string(),
        "events_consumed": c.events_consumed,
        "runs": runs,
    })
}
