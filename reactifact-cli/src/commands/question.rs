//! `question list` and `question answer`: the questions produces asked a human
//! (`Effects::ask`), and answering one.

use reactifact_core::error::{AnswerError, StoreError, WriteError};
use reactifact_core::runtime::Question;
use reactifact_core::Context;
use serde_json::{json, Value};

use super::Env;
use crate::cli::QuestionCommand;
use crate::failure::{Failure, Outcome};
use crate::output::{cut, print_json, Table};

/// How many times an answer is written again after another writer committed to the session
/// first (each time on the new head).
const CONFLICT_RETRIES: usize = 8;

/// Runs a `question` command.
pub fn question(env: &Env, command: QuestionCommand) -> Outcome {
    match command {
        QuestionCommand::List { session, pending } => list(env, session.as_deref(), pending),
        QuestionCommand::Answer {
            id,
            answer: text,
            by,
            session,
        } => answer(env, &id, &text, &by, session.as_deref()),
    }
}

fn question_json(id: &str, q: &Question) -> Value {
    json!({
        "id": id,
        "text": q.text,
        "answer": q.answer,
        "answered_by": q.answered_by,
    })
}

/// The session's questions, in id order.
fn questions(ctx: &Context) -> Outcome<Vec<(String, Question)>> {
    let mut all = Vec::new();
    for record in ctx.list::<Question>() {
        let record = record.map_err(|e| Failure::input(format!("a question does not read: {e}")))?;
        all.push((record.id.to_string(), record.data));
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(all)
}

fn list(env: &Env, session: Option<&str>, pending: bool) -> Outcome {
    let session = env.store.session(session)?;
    let ctx = env.store.open_session(&session, false)?;
    let shown: Vec<(String, Question)> = questions(&ctx)?
        .into_iter()
        .filter(|(_, q)| !pending || !q.is_answered())
        .collect();
    if env.json {
        print_json(&json!({
            "session": session,
            "questions": shown.iter().map(|(id, q)| question_json(id, q)).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    if shown.is_empty() {
        outln!(
            "no {}questions in session {session}",
            if pending { "pending " } else { "" }
        );
        return Ok(());
    }
    let mut table = Table::new(&["ID", "STATUS", "ANSWERED BY", "QUESTION", "ANSWER"]);
    for (id, q) in &shown {
        table.row(vec![
            id.clone(),
            if q.is_answered() { "answered" } else { "pending" }.to_owned(),
            q.answered_by.clone().unwrap_or_else(|| "-".to_owned()),
            cut(&q.text, 50),
            q.answer.as_deref().map_or_else(|| "-".to_owned(), |a| cut(a, 30)),
        ]);
    }
    table.print();
    Ok(())
}

fn answer(env: &Env, id: &str, text: &str, by: &str, session: Option<&str>) -> Outcome {
    if by.is_empty() {
        return Err(Failure::input("--by must name who answers".to_owned()));
    }
    let session = env.store.session(session)?;
    let mut ctx = env.store.open_session_for_write(&session)?;
    let mut conflicts = 0;
    loop {
        match ctx.answer(id, text, by) {
            Ok(()) => break,
            // Another writer (a runtime serving the session) committed first: read its
            // commits and answer on the new head.
            Err(AnswerError::Write(WriteError::Store(StoreError::Conflict { .. }))) if conflicts < CONFLICT_RETRIES => {
                conflicts += 1;
                env.wait(ctx.catch_up())
                    .map_err(|e| Failure::input(format!("session {session} could not be read: {e}")))?;
            }
            Err(e) => return Err(refused(&session, id, e)),
        }
    }
    let answered = match ctx.get::<Question>(id) {
        Ok(Some(record)) => record.data,
        _ => return Err(Failure::input(format!("question `{id}` could not be read back"))),
    };
    if env.json {
        print_json(&json!({
            "session": session,
            "generation": ctx.generation().0,
            "answered": question_json(id, &answered),
        }));
        return Ok(());
    }
    outln!(
        "answered {id} (by {by}) in session {session} at generation {}; the produces triggered by the question run on the runtime's next turn",
        ctx.generation().0
    );
    Ok(())
}

/// What a refused answer tells the operator.
fn refused(session: &str, id: &str, e: AnswerError) -> Failure {
    match e {
        AnswerError::NoSuchQuestion(_) => Failure::input(format!("no question `{id}` in session {session}")),
        AnswerError::NotAQuestion { .. } => Failure::input(format!("`{id}` in session {session} is not a question")),
        AnswerError::AlreadyAnswered { by, .. } => Failure::input(format!(
            "question `{id}` was already answered by {by}; the first answer stands"
        )),
        AnswerError::NoAnswerer(_) => Failure::input("--by must name who answers".to_owned()),
        e => Failure::input(format!("question `{id}` could not be answered: {e}")),
    }
}
