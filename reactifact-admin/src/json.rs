//! The JSON documents of the console's API and of the CLI's `--json`: one schema, built here
//! for both (docs/cli.md documents each document; docs/console.md refers to it).

use std::time::SystemTime;

use reactifact_core::audit::{Cause, Commit, Op, Provenance, RunRecord, StoredArtifact, VerifyReport};
use reactifact_core::ledger::{Attempt, AttemptOutcome, Decision, Delivery, DeliveryStatus};
use reactifact_core::runtime::{CallOutcome, RecordedCall};
use reactifact_core::store::{SessionInfo, StatusCounts};
use serde_json::{json, Value};

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

/// A recorded call as JSON, as `Context::export_audit` writes it: its name, request hash, the
/// answer's hash and size (never the answer) or the error it failed with, and its usage.
pub fn recorded_call_json(call: &RecordedCall) -> Value {
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
pub fn commit_json(c: &Commit) -> Value {
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
                "calls": r.calls.iter().map(recorded_call_json).collect::<Vec<_>>(),
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

/// A recorded call as `why --json` shows it: its name, the model asked, the tokens and cost it
/// used, its request's hash and how it ended (with its answer's hash).
pub fn call_json(call: &RecordedCall) -> serde_json::Value {
    let (outcome, answer) = match &call.outcome {
        CallOutcome::Answered { hash, .. } => ("answered", Some(hash.to_string())),
        CallOutcome::Failed { .. } => ("failed", None),
        CallOutcome::Unrecordable { .. } => ("unrecordable", None),
        CallOutcome::Abandoned => ("abandoned", None),
        _ => ("other", None),
    };
    json!({
        "name": &*call.name,
        "model": call.model.as_deref(),
        "tokens_in": call.usage.tokens_in,
        "tokens_out": call.usage.tokens_out,
        "cost": call.usage.cost,
        "request": call.request.to_string(),
        "outcome": outcome,
        "answer": answer,
    })
}

/// A cause of the chain as `why --json` shows it.
pub fn cause_json(cause: &Cause<'_>) -> serde_json::Value {
    let record = cause.record;
    json!({
        "generation": cause.generation.0,
        "commit": cause.commit.to_string(),
        "run": cause.run,
        "agent": record.agent.as_deref(),
        "produce": record.produce.as_deref(),
        "outside_write": cause.is_outside_write(),
        "wrote": {"id": cause.wrote.id.as_str(), "version": cause.wrote.version.0, "hash": cause.wrote.hash.to_string()},
        "trigger": record.trigger.as_ref().map(|t| json!({"id": t.id.as_str(), "version": t.version.0, "hash": t.hash.to_string()})),
        "calls": record.calls.iter().map(call_json).collect::<Vec<_>>(),
    })
}

/// A session as `sessions --json` lists it.
pub fn session_json(s: &SessionInfo) -> Value {
    json!({
        "name": s.name,
        "generation": s.generation.0,
        "own_commits": s.commits,
        "head": s.head.map(|h| h.to_string()),
        "forked_from": s.forked_from.as_ref().map(|(parent, at)| json!({"session": parent, "generation": at.0})),
        "consumed_seq": s.consumed_seq,
        "created_at": time(s.created_at),
    })
}

/// The counts of `outbox stats --json`'s `counts`: one per status (as [`status`] spells it),
/// `retrying` (failed ones due again by themselves) and `total`.
pub fn counts_json(counts: &StatusCounts) -> Value {
    let mut statuses = serde_json::Map::new();
    for s in DeliveryStatus::ALL {
        statuses.insert(status(s).to_owned(), json!(counts.of(s)));
    }
    statuses.insert("retrying".to_owned(), json!(counts.retrying));
    statuses.insert("total".to_owned(), json!(counts.total()));
    Value::Object(statuses)
}

/// `why --json`: the intent `key`'s provenance as session `session` recorded it.
pub fn why_json(key: &str, session: &str, p: &Provenance<'_>) -> Value {
    json!({
        "key": key,
        "session": session,
        "generation": p.generation.0,
        "commit": p.commit.to_string(),
        "run": p.run,
        "agent": p.agent(),
        "produce": p.produce(),
        "trigger": p.trigger().map(|t| json!({"id": t.id.as_str(), "version": t.version.0, "hash": t.hash.to_string()})),
        "reads": p.reads().iter().map(|r| json!({"id": r.id.as_str(), "version": r.version.map(|v| v.0)})).collect::<Vec<_>>(),
        "delivery": p.delivery.as_ref().map(delivery_json),
        "requires_approval": p.requires_approval,
        "decision": decision_json(p.decision()),
        "calls": p.calls().iter().map(call_json).collect::<Vec<_>>(),
        "chain": p.chain.iter().map(cause_json).collect::<Vec<_>>(),
    })
}

/// One session's result in `verify --json`'s `sessions`: its log refolded and checked
/// (`report`), or the error the check found, with the commits and head it got to.
pub fn verified_json(session: &str, result: Result<&VerifyReport, (u64, Option<String>, String)>) -> Value {
    match result {
        Ok(report) => json!({
            "session": session, "ok": true, "commits": report.commits,
            "head": report.head.map(|h| h.to_string()), "state_hash": report.state_hash.to_string(), "error": null,
        }),
        Err((commits, head, error)) => json!({
            "session": session, "ok": false, "commits": commits, "head": head, "state_hash": null, "error": error,
        }),
    }
}

/// One session's result in `verify --json`'s `sessions` when its log could not be read at
/// all (a corrupt store).
pub fn unreadable_json(session: &str, error: &str) -> Value {
    json!({
        "session": session, "ok": false, "commits": null, "head": null, "state_hash": null, "error": error,
    })
}

/// The run that recorded an intent, as `outbox show --json`'s `run` shows it.
pub fn run_json(run: &RunRecord) -> Value {
    json!({
        "agent": run.agent.as_deref(),
        "produce": run.produce.as_deref(),
        "trigger": run.trigger.as_ref().map(|t| json!({"id": t.id.as_str(), "version": t.version.0, "hash": t.hash.to_string()})),
        "reads": run.reads.iter().map(|r| json!({"id": r.id.as_str(), "version": r.version.map(|v| v.0)})).collect::<Vec<_>>(),
    })
}

/// `show --json`: artifact `stored` in session `session` right after commit `at`, its content
/// decoded (`null` if it does not decode).
pub fn artifact_json(session: &str, at: u64, stored: &StoredArtifact) -> Value {
    json!({
        "session": session,
        "at": at,
        "id": stored.id.as_str(),
        "kind": stored.kind.as_str(),
        "version": stored.version.0,
        "hash": stored.hash.to_string(),
        "written_in": stored.generation.0,
        "content": crate::json_value::decode(&stored.bytes),
    })
}
