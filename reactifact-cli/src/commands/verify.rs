//! `verify` and `replay`: refold logs from the empty state checking every hash. Neither runs
//! a produce nor calls a dispatcher.

use std::collections::BTreeSet;

use reactifact_admin::json::{unreadable_json, verified_json};
use reactifact_core::audit::Op;
use reactifact_core::{Artifact, PendingAction};
use serde_json::{json, Value};

use super::{commit, Env};
use crate::failure::{Failure, Outcome};
use crate::output::{print_fields, print_json, Table};
use crate::progress;

/// `verify [--session S]`: every session (or one), each log refolded and checked, and the
/// outbox checked against it. Exit 1 if any fails.
pub fn verify(env: &Env, session: Option<&str>) -> Outcome {
    let names: Vec<String> = match session {
        Some(name) => vec![env.store.session(Some(name))?],
        None => env.store.sessions_checking(true)?.into_iter().map(|s| s.name).collect(),
    };
    let mut results: Vec<Value> = Vec::new();
    let mut failed = Vec::new();
    for name in &names {
        let result = match env.store.open_session(name, true) {
            Ok(ctx) => {
                let bar = progress::bar(ctx.generation().0, name);
                let checked = ctx.verify_with_progress(|_| bar.inc(1));
                bar.finish_and_clear();
                match checked {
                    Ok(report) => verified_json(name, Ok(&report)),
                    Err(e) => verified_json(
                        name,
                        Err((ctx.generation().0, ctx.head().map(|h| h.to_string()), e.to_string())),
                    ),
                }
            }
            Err(failure) if failure.kind == crate::failure::Kind::CheckFailed => {
                unreadable_json(name, &failure.message)
            }
            Err(failure) => return Err(failure),
        };
        if result["ok"] == false {
            failed.push(format!("session `{name}`: {}", result["error"].as_str().unwrap_or("")));
        }
        results.push(result);
    }
    if env.json {
        print_json(&json!({"ok": failed.is_empty(), "sessions": results}));
    } else {
        let mut table = Table::new(&["SESSION", "COMMITS", "HEAD", "STATE HASH", "RESULT"]);
        for r in &results {
            let short = |v: &Value| {
                v.as_str()
                    .map_or_else(|| "-".to_owned(), |s| s.chars().take(12).collect())
            };
            table.row(vec![
                r["session"].as_str().unwrap_or("").to_owned(),
                r["commits"].as_u64().map_or_else(|| "-".to_owned(), |n| n.to_string()),
                short(&r["head"]),
                short(&r["state_hash"]),
                if r["ok"] == true {
                    "ok".to_owned()
                } else {
                    format!("FAILED: {}", r["error"].as_str().unwrap_or(""))
                },
            ]);
        }
        table.print();
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::check(format!("verification failed: {}", failed.join("; "))))
    }
}

/// `replay [--session S] [--to COMMIT]`: refold the log up to a commit, checking every hash,
/// and show the state there.
pub fn replay(env: &Env, session: Option<&str>, to: Option<&str>) -> Outcome {
    let session = env.store.session(session)?;
    let ctx = env.store.open_session(&session, true)?;
    let to = match to {
        Some(spec) => commit(&ctx, spec)?,
        None => ctx.generation(),
    };
    let bar = progress::bar(to.0, &session);
    let refolded = ctx.refold_to(to, |_| bar.inc(1));
    bar.finish_and_clear();
    let (report, snapshot) = match refolded {
        Ok(done) => done,
        Err(e) => {
            if env.json {
                print_json(&json!({"session": session, "ok": false, "to": to.0, "error": e.to_string()}));
            }
            return Err(Failure::check(format!("replay of session `{session}` failed: {e}")));
        }
    };
    // The kinds the refolded commits wrote, counted in the state they give.
    let mut kinds: BTreeSet<&str> = BTreeSet::new();
    // Read by the refold above: a context opened from a checkpoint holds its whole log now.
    let log = ctx
        .log()
        .map_err(|e| Failure::check(format!("replay of session `{session}` failed: {e}")))?;
    for commit in &log[..report.commits] {
        for op in commit.runs.iter().flat_map(|r| &r.ops) {
            match op {
                Op::Put { kind, .. } => {
                    kinds.insert(kind.as_str());
                }
                Op::Act { .. } => {
                    kinds.insert(PendingAction::KIND);
                }
                _ => {}
            }
        }
    }
    let counts: Vec<(&str, usize)> = kinds
        .into_iter()
        .map(|k| (k, snapshot.count_of_kind(k)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let recorded = report.commits.checked_sub(1).map(|i| log[i].state_hash);
    if env.json {
        print_json(&json!({
            "session": session,
            "ok": true,
            "to": to.0,
            "commits": report.commits,
            "head": report.head.map(|h| h.to_string()),
            "state_hash": report.state_hash.to_string(),
            "artifacts": snapshot.len(),
            "relations": snapshot.relations().count(),
            "kinds": counts.iter().map(|(k, n)| (k.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
        }));
        return Ok(());
    }
    print_fields(&[
        ("session", session.clone()),
        (
            "refolded",
            format!("commits 1..={} of {}, every hash checked", report.commits, log.len()),
        ),
        (
            "at",
            report.head.map_or_else(
                || "the empty state".to_owned(),
                |h| format!("commit {} ({})", to.0, h.short()),
            ),
        ),
        (
            "state hash",
            format!(
                "{}{}",
                report.state_hash,
                if recorded == Some(report.state_hash) {
                    " (as recorded)"
                } else {
                    ""
                }
            ),
        ),
        ("artifacts", snapshot.len().to_string()),
        ("relations", snapshot.relations().count().to_string()),
        (
            "by kind",
            if counts.is_empty() {
                "-".to_owned()
            } else {
                counts
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ),
    ]);
    Ok(())
}
