//! `parked list` and `parked rearm`: the events a serving runtime parked after a produce failed
//! on every attempt its retry policy allowed (`Parked`), and re-arming one
//! (`Context::rearm`).

use reactifact_core::error::{RearmError, StoreError, WriteError};
use reactifact_core::ledger::{Parked, RETRY_TIMER_PREFIX};
use reactifact_core::{Context, Record, Timer};
use serde_json::{json, Value};

use super::Env;
use crate::cli::ParkedCommand;
use crate::failure::{Failure, Outcome};
use crate::output::{cut, json_time, print_json, time, Table};

/// How many times a re-arm is written again after another writer committed to the session
/// first (each time on the new head).
const CONFLICT_RETRIES: usize = 8;

/// Runs a `parked` command.
pub fn parked(env: &Env, command: ParkedCommand) -> Outcome {
    match command {
        ParkedCommand::List { session } => list(env, session.as_deref()),
        ParkedCommand::Rearm { id, session } => rearm(env, &id, session.as_deref()),
    }
}

/// A parked event as JSON: the schema of `parked list`'s entries and `parked rearm`'s
/// `rearmed`.
fn parked_json(record: &Record<Parked>) -> Value {
    let run = &record.data.run;
    json!({
        "id": record.id.as_str(),
        "agent": run.agent,
        "produce": run.produce,
        "trigger": run.trigger.as_str(),
        "event": run.event.as_str(),
        "attempts": run.attempts,
        "parked_at": time(record.data.parked_at),
        "error": run.error,
    })
}

/// The session's parked events, in the order they were first parked.
fn parked_events(ctx: &Context) -> Outcome<Vec<Record<Parked>>> {
    ctx.parked()
        .map(|record| record.map_err(|e| Failure::input(format!("a parked event does not read: {e}"))))
        .collect()
}

fn list(env: &Env, session: Option<&str>) -> Outcome {
    let session = env.store.session(session)?;
    let ctx = env.store.open_session(&session, false)?;
    let parked = parked_events(&ctx)?;
    if env.json {
        print_json(&json!({
            "session": session,
            "parked": parked.iter().map(parked_json).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    if parked.is_empty() {
        outln!("no parked events in session {session}");
        return Ok(());
    }
    let mut table = Table::new(&[
        "ID",
        "AGENT",
        "PRODUCE",
        "TRIGGER",
        "EVENT",
        "ATTEMPTS",
        "PARKED AT",
        "ERROR",
    ]);
    for record in &parked {
        let run = &record.data.run;
        table.row(vec![
            record.id.to_string(),
            run.agent.clone(),
            run.produce.clone(),
            run.trigger.to_string(),
            run.event.as_str().to_owned(),
            run.attempts.to_string(),
            time(record.data.parked_at),
            cut(&run.error, 60),
        ]);
    }
    table.print();
    Ok(())
}

fn rearm(env: &Env, id: &str, session: Option<&str>) -> Outcome {
    let session = env.store.session(session)?;
    let mut ctx = env.store.open_session_for_write(&session)?;
    let mut conflicts = 0;
    let rearmed = loop {
        // What is re-armed, as it is on the head the re-arm commits on (the commit deletes it).
        let parked = ctx.get::<Parked>(id).ok().flatten();
        match env.wait(ctx.rearm(id)) {
            Ok(()) => break parked,
            // Another writer (a runtime serving the session) committed first: read its
            // commits and re-arm on the new head.
            Err(RearmError::Write(WriteError::Store(StoreError::Conflict { .. }))) if conflicts < CONFLICT_RETRIES => {
                conflicts += 1;
                env.wait(ctx.catch_up())
                    .map_err(|e| Failure::input(format!("session {session} could not be read: {e}")))?;
            }
            Err(e) => return Err(refused(&session, id, e)),
        }
    };
    let Some(rearmed) = rearmed else {
        return Err(Failure::input(format!("parked event `{id}` could not be read back")));
    };
    let run = &rearmed.data.run;
    let timer_id = Timer::id_of(&format!("{RETRY_TIMER_PREFIX}{}", run.name()));
    let due = ctx.get::<Timer>(timer_id.as_str()).ok().flatten().map(|t| t.data.at);
    if env.json {
        print_json(&json!({
            "session": session,
            "generation": ctx.generation().0,
            "rearmed": parked_json(&rearmed),
            "retry": {
                "id": timer_id.as_str(),
                "due_at": json_time(due),
            },
        }));
        return Ok(());
    }
    outln!(
        "re-armed {id} in session {session} at generation {}: {}/{} runs again on {} (retry {timer_id} due {}), \
         with its retry policy's attempts anew, at the next turn of a runtime with that produce",
        ctx.generation().0,
        run.agent,
        run.produce,
        run.trigger,
        due.map_or_else(|| "now".to_owned(), time),
    );
    Ok(())
}

/// What a refused re-arm tells the operator.
fn refused(session: &str, id: &str, e: RearmError) -> Failure {
    match e {
        RearmError::NotParked { .. } => Failure::input(format!(
            "no parked event `{id}` in session {session}; `reactifact parked list` lists them"
        )),
        e => Failure::input(format!("parked event `{id}` could not be re-armed: {e}")),
    }
}
