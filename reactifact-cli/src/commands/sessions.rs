//! `sessions`: the sessions of the store, with their heads. A SQLite file and a PostgreSQL
//! store list the same columns (`store::SessionInfo`, whichever backend read them).

use reactifact_admin::json::session_json;
use serde_json::json;

use super::Env;
use crate::failure::Outcome;
use crate::output::{print_json, time, Table};

/// Lists the sessions.
pub fn sessions(env: &Env) -> Outcome {
    let sessions = env.store.sessions()?;
    if env.json {
        let list: Vec<_> = sessions.iter().map(session_json).collect();
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
