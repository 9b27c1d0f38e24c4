//! `show`: one artifact, at the head or right after a commit.

use reactifact_admin::json::artifact_json;

use super::{commit, Env};
use crate::failure::{Failure, Outcome};
use crate::output::{print_fields, print_json};
use reactifact_admin::json_value;

/// Shows the artifact `id`.
pub fn show(env: &Env, id: &str, session: Option<&str>, at: Option<&str>) -> Outcome {
    let session = env.store.session(session)?;
    let ctx = env.store.open_session(&session, false)?;
    let at = match at {
        Some(spec) => commit(&ctx, spec)?,
        None => ctx.generation(),
    };
    let snapshot = if at == ctx.generation() {
        ctx.snapshot()
    } else {
        ctx.state_at(at).map_err(|e| Failure::input(e.to_string()))?
    };
    let Some(stored) = snapshot.stored(id) else {
        let hint = if at != ctx.generation() && ctx.snapshot().stored(id).is_some() {
            format!("; it exists at the head (commit {})", ctx.generation().0)
        } else {
            "; `reactifact log` shows what each commit writes".to_owned()
        };
        return Err(Failure::input(format!(
            "no artifact `{id}` in session `{session}` at commit {}{hint}",
            at.0
        )));
    };
    if env.json {
        print_json(&artifact_json(&session, at.0, &stored));
        return Ok(());
    }
    print_fields(&[
        ("id", stored.id.to_string()),
        ("kind", stored.kind.as_str().to_owned()),
        ("version", stored.version.0.to_string()),
        ("hash", stored.hash.to_string()),
        ("written in", format!("commit {}", stored.generation.0)),
        ("at", format!("commit {} of session {session}", at.0)),
        ("content", json_value::pretty(&stored.bytes)),
    ]);
    Ok(())
}
