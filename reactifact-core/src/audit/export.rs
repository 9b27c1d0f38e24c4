//! The audit trail: the commit log exported as JSON lines.

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::model::call::{CallOutcome, RecordedCall};
use crate::model::delivery::Delivery;
use crate::model::patch::{Op, PutMode};
use crate::session::context::Context;
use crate::state::commit::Commit;

fn seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn mode_name(mode: PutMode) -> &'static str {
    match mode {
        PutMode::Create => "create",
        PutMode::Upsert => "upsert",
        PutMode::CreateOnce => "create_once",
        PutMode::Update => "update",
    }
}

fn delivery_json(delivery: &Delivery) -> Value {
    json!({
        "status": delivery.status(),
        "attempts": delivery.attempts(),
        "last_error": delivery.last_error(),
        "recorded_at": seconds(delivery.recorded_at()),
        "updated_at": seconds(delivery.updated_at()),
        "delivered_at": delivery.delivered_at().map(seconds),
        "decision": delivery.decision().map(|d| json!({
            "verdict": d.verdict.to_string(),
            "by": d.by,
            "at": seconds(d.at),
            "reason": d.reason,
            "digest": d.digest.map(|h| h.to_string()),
        })),
    })
}

impl Context {
    /// Writes the audit trail: one JSON object per line and per commit (generation), oldest
    /// first, with the commit's `generation`, `hash`, `parent`, `state_hash` and
    /// `events_consumed`, and its `runs`. Each run lists its `agent`, `produce`, `trigger`
    /// (`id`, `version`, `hash`), `reads` (`id`, `version`), `writes` (`op`, `id`, `kind`,
    /// content `hash`; relations with `from`, `name`, `to`) and `intents` (`key`, `kind`,
    /// `id`, `hash`, whether this run `created` it, whether it `requires_approval`, and for
    /// the run that created it the `delivery` from the ledger: `status`, `attempts`,
    /// `last_error`, timestamps in seconds since the Unix epoch, and the operator's
    /// `decision` on an intent that required approval (`verdict` `approved` or `rejected`,
    /// `by`, `at` in seconds, `reason`, and `digest`, the action hash it was made on, `null`
    /// for a decision an older build recorded; `null` for none), and `calls`, its recorded calls
    /// (`name`, `request` hash, `answer` with its `hash` and size in `bytes` — never the answer
    /// itself — or the error it `failed` with, and its `usage`: `tokens_in`, `tokens_out`,
    /// `cost`). Hashes are lowercase hex. Returns the number of lines.
    ///
    /// ```
    /// # use reactifact_core::{Artifact, Context};
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize)] struct Order { total_cents: u64 }
    /// # impl Artifact for Order { const KIND: &'static str = "order"; }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut ctx = Context::new("orders");
    /// ctx.create("order:1", Order { total_cents: 1200 })?;
    /// let mut out = Vec::new();
    /// assert_eq!(ctx.export_audit(&mut out).await?, 1);
    /// assert!(String::from_utf8(out)?.contains(r#""id":"order:1""#));
    /// # Ok(()) }
    /// ```
    ///
    /// A context opened from a checkpoint reads its older commits first (see
    /// [`Context::log`]).
    ///
    /// # Errors
    /// Any error of `out`; an [`io::Error`] of kind `Other` wrapping the
    /// [`VerifyError`](crate::VerifyError) if the older commits cannot be read.
    pub async fn export_audit(&self, mut out: impl io::Write + Send) -> io::Result<usize> {
        // The first act of a key in log order created its intent; later ones were skipped.
        let mut deliveries = foldhash::HashMap::default();
        let ledger = self.ledger();
        let (log, _) = self.whole_async().await.map_err(io::Error::other)?;
        for commit in log {
            for op in commit.runs.iter().flat_map(|run| &run.ops) {
                if let Op::Act { key, .. } = op {
                    if !deliveries.contains_key(key.as_str()) {
                        let delivery = ledger.get(key.as_str()).await.map_err(io::Error::other)?;
                        deliveries.insert(key.as_str(), delivery);
                    }
                }
            }
        }
        let mut acted = foldhash::HashSet::default();
        for commit in log {
            let line =
                serde_json::to_string(&self.audit_line(commit, &mut acted, &deliveries)).map_err(io::Error::other)?;
            out.write_all(line.as_bytes())?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(log.len())
    }

    fn audit_line<'a>(
        &self,
        commit: &'a Commit,
        acted: &mut foldhash::HashSet<&'a str>,
        deliveries: &foldhash::HashMap<&str, Option<Delivery>>,
    ) -> Value {
        let runs: Vec<Value> = commit
            .runs
            .iter()
            .map(|run| {
                let mut writes = Vec::new();
                let mut intents = Vec::new();
                for op in &run.ops {
                    match op {
                        Op::Put {
                            mode, id, kind, hash, ..
                        } => writes.push(json!({
                            "op": mode_name(*mode), "id": id.as_str(), "kind": kind.as_str(), "hash": hash.to_string(),
                        })),
                        Op::Delete { id } => writes.push(json!({ "op": "delete", "id": id.as_str() })),
                        Op::Link(r) | Op::Unlink(r) => writes.push(json!({
                            "op": if matches!(op, Op::Link(_)) { "link" } else { "unlink" },
                            "from": r.from.as_str(), "name": &*r.name, "to": r.to.as_str(),
                        })),
                        Op::Act {
                            key,
                            action,
                            hash,
                            bytes,
                            ..
                        } => {
                            let id = key.id();
                            let created = acted.insert(key.as_str());
                            let delivery = created
                                .then(|| deliveries.get(key.as_str()).cloned().flatten())
                                .flatten()
                                .map(|d| delivery_json(&d));
                            intents.push(json!({
                                "key": key.as_str(), "kind": &**action, "id": id.as_str(), "hash": hash.to_string(),
                                "created": created, "delivery": delivery,
                                "requires_approval": crate::model::action::requires_approval(bytes),
                            }));
                        }
                    }
                }
                json!({
                    "agent": run.agent.as_deref(),
                    "produce": run.produce.as_deref(),
                    "trigger": run.trigger.as_ref().map(|t| json!({
                        "id": t.id.as_str(), "version": t.version.0, "hash": t.hash.to_string(),
                    })),
                    "reads": run.reads.iter().map(|r| json!({
                        "id": r.id.as_str(), "version": r.version.map(|v| v.0),
                    })).collect::<Vec<_>>(),
                    "writes": writes,
                    "intents": intents,
                    "calls": run.calls.iter().map(call_json).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "generation": commit.generation.0,
            "hash": commit.hash.to_string(),
            "parent": commit.parent.map(|p| p.to_string()),
            "state_hash": commit.state_hash.to_string(),
            "events_consumed": commit.events_consumed,
            "runs": runs,
        })
    }
}

/// A recorded call as exported: its name, request hash, answer hash and size (never the
/// answer), or its error, and its usage.
fn call_json(call: &RecordedCall) -> Value {
    let (answer, failed) = match &call.outcome {
        CallOutcome::Answered { hash, bytes } => (Some(json!({"hash": hash.to_string(), "bytes": bytes.len()})), None),
        CallOutcome::Failed { error } | CallOutcome::Unrecordable { error } => (None, Some(error.as_str())),
        CallOutcome::Abandoned => (None, Some("abandoned")),
    };
    json!({
        "name": &*call.name,
        "request": call.request.to_string(),
        "answer": answer,
        "failed": failed,
        "usage": {"tokens_in": call.usage.tokens_in, "tokens_out": call.usage.tokens_out, "cost": call.usage.cost},
    })
}
