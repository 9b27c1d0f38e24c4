//! The commands, one file per group, and what they share: the store, `--json`, the runtime
//! that awaits the store's queries, and how a commit is named on the command line.

mod audit;
mod console;
mod diff;
mod log;
mod outbox;
mod parked;
mod provenance;
mod question;
mod sessions;
mod show;
mod verify;

use std::future::Future;

use reactifact_core::runtime::Generation;
use reactifact_core::Context;

use crate::cli::{Cli, Command, OutboxCommand, ParkedCommand, QuestionCommand};
use crate::failure::{Failure, Outcome};
use crate::store::{self, Store};

/// What every command gets.
pub struct Env {
    /// The store.
    pub store: Store,
    /// `--json`.
    pub json: bool,
}

impl Env {
    /// Awaits a store query. The store's own threads run the SQLite calls and the log's
    /// PostgreSQL statements.
    pub fn wait<F: Future>(&self, future: F) -> F::Output {
        self.store.wait(future)
    }
}

/// Runs the command the command line names.
pub fn run(cli: Cli) -> Outcome {
    let location = store::resolve(cli.store.as_deref(), cli.schema.as_deref())?;
    if let Command::Console {
        listen,
        token_file,
        show_payloads,
    } = cli.command
    {
        return console::console(location, listen, &token_file, show_payloads);
    }
    // Only the operator's ledger operations, answering a question and re-arming a parked
    // event write; every other command opens the store read-only.
    let writes = matches!(
        cli.command,
        Command::Outbox(
            OutboxCommand::Retry(_)
                | OutboxCommand::Cancel { .. }
                | OutboxCommand::Approve { .. }
                | OutboxCommand::Reject { .. }
                | OutboxCommand::Purge { .. }
        ) | Command::Question(QuestionCommand::Answer { .. })
            | Command::Parked(ParkedCommand::Rearm { .. })
    );
    let env = Env {
        store: Store::open(location, writes)?,
        json: cli.json,
    };
    match cli.command {
        Command::Sessions => sessions::sessions(&env),
        Command::Log { session, limit } => log::log(&env, session.as_deref(), limit),
        Command::Show { id, session, at } => show::show(&env, &id, session.as_deref(), at.as_deref()),
        Command::Diff { a, b, session } => diff::diff(&env, &a, &b, session.as_deref()),
        Command::Why { key, session } => provenance::why(&env, &key, session.as_deref()),
        Command::Graph { key, session, format } => provenance::graph(&env, &key, session.as_deref(), format),
        Command::Outbox(command) => outbox::outbox(&env, command),
        Command::Question(command) => question::question(&env, command),
        Command::Parked(command) => parked::parked(&env, command),
        Command::Verify { session } => verify::verify(&env, session.as_deref()),
        Command::Replay { session, to } => verify::replay(&env, session.as_deref(), to.as_deref()),
        Command::ExportAudit { session } => audit::export_audit(&env, session.as_deref()),
        Command::Console { .. } => unreachable!("served above"),
    }
}

/// The commit of `ctx`'s log that `spec` names: a generation number (`0` is the empty state
/// before the first commit) or a prefix of at least 4 hex digits of a commit's hash.
pub fn commit(ctx: &Context, spec: &str) -> Outcome<Generation> {
    let head = ctx.generation().0;
    let session = ctx.session();
    if !spec.is_empty() && spec.bytes().all(|b| b.is_ascii_digit()) {
        let generation = spec
            .parse::<u64>()
            .map_err(|_| Failure::input(format!("commit `{spec}` is out of range")))?;
        if generation > head {
            return Err(Failure::input(format!(
                "session `{session}` has no commit {generation}: its log ends at commit {head}; `reactifact log` lists them"
            )));
        }
        return Ok(Generation(generation));
    }
    let prefix = spec.to_ascii_lowercase();
    if prefix.len() < 4 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Failure::input(format!(
            "`{spec}` is not a commit: name one by its generation number or by at least 4 hex digits of its hash"
        )));
    }
    let mut found = ctx
        .log()
        .map_err(Failure::history)?
        .iter()
        .filter(|c| c.hash.to_string().starts_with(&prefix))
        .map(|c| c.generation);
    match (found.next(), found.next()) {
        (Some(generation), None) => Ok(generation),
        (None, _) => Err(Failure::input(format!(
            "no commit of session `{session}` has a hash starting with `{prefix}`; `reactifact log` lists them"
        ))),
        (Some(_), Some(_)) => Err(Failure::input(format!(
            "several commits of session `{session}` have a hash starting with `{prefix}`: give more digits"
        ))),
    }
}
