//! `sessions`: the sessions of the store, with their heads. A SQLite file and a PostgreSQL
//! store list the same columns (`store::SessionInfo`, whichever backend read them).

use serde_json::json;

use super::Env;
use crate::failure::Outcome;
use crate::output::{print_json, time, Table};

/// Lists the sessions.
pub fn sessions(env: &Env) -> Outcome {
    let sessions = env.store.sessions()?;
    if env.json {
        let list: Vec<_> = sessions
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "generation": s.generation.0,
                    "own_commits": s.commits,
                    "head": s.head.map(|h| h.to_string()),
                    "forked_from": s.forked_from.as_ref().map(|(parent, at)| json!({"session": parent, "generation": at.0})),
                    "consumed_seq": s.consumed_seq,
                    "created_at": time(s.created_at),
                })
            })
            .collect();
        print_json(&json!({ "sessions": list }));
        return Ok(());
    }
    let mut table = Table::new(&[
        "SESSION",
        "COMMITS",
        "OWN",
        "HEAD",
        "FORKED FROM",
        "CONSUMED",
        "CREATED",
    ]);
    for s in &sessions {
        table.row(vec![
            s.name.clone(),
            s.generation.0.to_string(),
            s.commits.to_string(),
            s.head.map_or_else(|| "-".to_owned(), |h| h.short()),
            s.forked_from
                .as_ref()
                .map_or_else(|| "-".to_owned(), |(parent, at)| format!("{parent} at {}", at.0)),
            s.consumed_seq.to_string(),
            time(s.created_at),
        ]);
    }
    table.print();
    Ok(())
}
