//! `diff`: what changed between two sessions' heads, or between two commits of a session.

use reactifact_core::branch::{ArtifactState, Diff};
use reactifact_core::runtime::Relation;
use serde_json::{json, Value};

use super::{commit, Env};
use crate::failure::{Failure, Outcome};
use crate::output::print_json;

/// Diffs `a` against `b`: two sessions if both name sessions of the store, otherwise two
/// commits of the session.
pub fn diff(env: &Env, a: &str, b: &str, session: Option<&str>) -> Outcome {
    let sessions = env.store.sessions()?;
    let is_session = |name: &str| sessions.iter().any(|s| s.name == name);
    let (from, to, diff) = if is_session(a) && is_session(b) {
        let ours = env.store.open_session(a, false)?;
        let theirs = env.store.open_session(b, false)?;
        let diff = ours.diff(&theirs).map_err(|e| Failure::input(e.to_string()))?;
        (json!({"session": a}), json!({"session": b}), diff)
    } else {
        let session = env.store.session(session).map_err(|e| {
            if is_session(a) || is_session(b) {
                Failure::input(format!(
                    "`{a}` and `{b}` must both be sessions, or both commits of one session: {}",
                    e.message
                ))
            } else {
                e
            }
        })?;
        let ctx = env.store.open_session(&session, false)?;
        let named = |spec: &str| {
            commit(&ctx, spec).map_err(|e| {
                Failure::input(format!(
                    "`{spec}` is neither a session of the store nor a commit of session `{session}`: {}",
                    e.message
                ))
            })
        };
        let (ga, gb) = (named(a)?, named(b)?);
        let diff = ctx.diff_commits(ga, gb).map_err(|e| Failure::input(e.to_string()))?;
        (
            json!({"session": session, "generation": ga.0}),
            json!({"session": session, "generation": gb.0}),
            diff,
        )
    };
    if env.json {
        print_json(&json!({
            "from": from,
            "to": to,
            "created": diff.created.iter().map(|(id, s)| artifact_json(id.as_str(), s)).collect::<Vec<_>>(),
            "updated": diff.updated.iter().map(|u| json!({
                "id": u.id.as_str(),
                "kind": u.after.kind.as_str(),
                "before": {"version": u.before.version.0, "hash": u.before.hash.to_string()},
                "after": {"version": u.after.version.0, "hash": u.after.hash.to_string()},
                "fields": u.fields.iter().map(|f| json!({"path": f.path, "before": f.recorded, "after": f.replayed})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "deleted": diff.deleted.iter().map(|(id, s)| artifact_json(id.as_str(), s)).collect::<Vec<_>>(),
            "linked": diff.linked.iter().map(relation_json).collect::<Vec<_>>(),
            "unlinked": diff.unlinked.iter().map(relation_json).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    print_diff(&diff);
    Ok(())
}

fn print_diff(diff: &Diff) {
    if diff.is_empty() {
        outln!("no differences");
        return;
    }
    for (id, s) in &diff.created {
        outln!("+ {id}  {} v{}  {}", s.kind.as_str(), s.version.0, s.hash.short());
    }
    for u in &diff.updated {
        outln!(
            "~ {}  {} v{} -> v{}  {} -> {}",
            u.id,
            u.after.kind.as_str(),
            u.before.version.0,
            u.after.version.0,
            u.before.hash.short(),
            u.after.hash.short()
        );
        for f in &u.fields {
            let path = if f.path.is_empty() { "(value)" } else { f.path.as_str() };
            outln!("    {path}: {} -> {}", f.recorded, f.replayed);
        }
    }
    for (id, s) in &diff.deleted {
        outln!("- {id}  {} v{}  {}", s.kind.as_str(), s.version.0, s.hash.short());
    }
    for r in &diff.linked {
        outln!("+ {} -[{}]-> {}", r.from, r.name, r.to);
    }
    for r in &diff.unlinked {
        outln!("- {} -[{}]-> {}", r.from, r.name, r.to);
    }
}

fn artifact_json(id: &str, s: &ArtifactState) -> Value {
    json!({"id": id, "kind": s.kind.as_str(), "version": s.version.0, "hash": s.hash.to_string()})
}

fn relation_json(r: &Relation) -> Value {
    json!({"from": r.from.as_str(), "name": &*r.name, "to": r.to.as_str()})
}
