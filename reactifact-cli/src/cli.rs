//! The command line, as clap parses it.

use clap::{Args, Parser, Subcommand, ValueEnum};
use reactifact_core::ledger::DeliveryStatus;

/// Inspect and operate a reactifact store: its sessions, commit log, state, provenance and
/// delivery ledger. It never dispatches anything and opens the store read-only, except for
/// `outbox retry`, `cancel`, `approve`, `reject` and `purge`, `question answer` and
/// `parked rearm`.
#[derive(Debug, Parser)]
#[command(
    name = "reactifact",
    version,
    after_help = "Exit codes: 0 ok, 1 a check failed (verify, replay), 2 a usage or input error.\n\
                  The store is --store PATH|URL or REACTIFACT_STORE. See docs/cli.md for every command and its --json schema."
)]
pub struct Cli {
    /// The store: the path of a SQLite file (or sqlite:PATH), or a PostgreSQL server's URL
    /// (postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?schema=NAME]).
    #[arg(long, global = true, env = "REACTIFACT_STORE", value_name = "PATH|URL")]
    pub store: Option<String>,

    /// The schema (namespace) of a PostgreSQL store, if the URL's `?schema=` does not name
    /// it (default: reactifact).
    #[arg(long, global = true, value_name = "NAME")]
    pub schema: Option<String>,

    /// Print one JSON document (the command's documented schema) instead of a table.
    #[arg(long, global = true)]
    pub json: bool,

    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The sessions of the store, with their heads.
    Sessions,
    /// The commit log of a session, newest first.
    Log {
        /// The session (default: the store's only session).
        #[arg(long)]
        session: Option<String>,
        /// Show at most this many commits.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// One artifact: its kind, version, content hash and content.
    Show {
        /// The artifact's id, e.g. `receipt:order:1`.
        id: String,
        /// The session (default: the store's only session).
        #[arg(long)]
        session: Option<String>,
        /// The state right after this commit (a generation number or a hash prefix) instead
        /// of the head.
        #[arg(long, value_name = "COMMIT")]
        at: Option<String>,
    },
    /// What changed between two sessions (their heads), or between two commits of a session.
    Diff {
        /// A session, or a commit (a generation number, 0 for the empty state, or a hash
        /// prefix) of --session.
        a: String,
        /// A session, or a commit of --session.
        b: String,
        /// The session whose commits A and B name (default: the store's only session).
        #[arg(long)]
        session: Option<String>,
    },
    /// Why an intent exists: the commit, agent, produce, trigger and reads that recorded it.
    Why {
        /// The intent's idempotency key.
        key: String,
        /// The session to look in (default: the session that recorded the intent).
        #[arg(long)]
        session: Option<String>,
    },
    /// An intent's provenance as a graph (Mermaid or Graphviz DOT).
    Graph {
        /// The intent's idempotency key.
        key: String,
        /// The session to look in (default: the session that recorded the intent).
        #[arg(long)]
        session: Option<String>,
        /// The graph language.
        #[arg(long, value_enum, default_value_t = GraphFormat::Mermaid)]
        format: GraphFormat,
    },
    /// The delivery ledger.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// The questions produces asked a human (`Effects::ask`), and their answers.
    #[command(subcommand)]
    Question(QuestionCommand),
    /// The events a serving runtime parked after a produce failed on every attempt its retry
    /// policy allowed, and re-arming them.
    #[command(subcommand)]
    Parked(ParkedCommand),
    /// Refold the log of each session (or of one) from the empty state and check every hash,
    /// and the outbox against the log.
    Verify {
        /// Only this session (default: every session of the store).
        #[arg(long)]
        session: Option<String>,
    },
    /// Refold a session's log up to a commit, checking every hash, and show the state there.
    /// (No produce runs: the CLI has none. Replaying produces is `Runtime::replay`.)
    Replay {
        /// The session (default: the store's only session).
        #[arg(long)]
        session: Option<String>,
        /// Stop after this commit (a generation number or a hash prefix; default: the head).
        #[arg(long, value_name = "COMMIT")]
        to: Option<String>,
    },
    /// The audit trail of a session, one JSON object per commit and line, on stdout.
    ExportAudit {
        /// The session (default: the store's only session).
        #[arg(long)]
        session: Option<String>,
    },
    /// Serve the operator console's JSON API (docs/console.md) for the store until stopped:
    /// it prints the address it listens on. Requests need a bearer token from the token file.
    Console {
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1:7878", value_name = "ADDR:PORT")]
        listen: std::net::SocketAddr,
        /// The token file: one token a line, `ROLE PRINCIPAL SECRET` (ROLE `read-only` or
        /// `operator`).
        #[arg(long, env = "REACTIFACT_CONSOLE_TOKENS", value_name = "FILE")]
        token_file: std::path::PathBuf,
        /// Show intents' payloads instead of their SHA-256 and size.
        #[arg(long)]
        show_payloads: bool,
    },
}

/// The `question` commands.
#[derive(Debug, Subcommand)]
pub enum QuestionCommand {
    /// The session's questions, in id order: pending and answered.
    List {
        /// The session (default: the store's only session).
        #[arg(long)]
        session: Option<String>,
        /// Only the questions not answered yet.
        #[arg(long)]
        pending: bool,
    },
    /// Answer a pending question (`Context::answer`): one committed write to the session,
    /// whose update event runs, on the runtime's next turn, the produces triggered by the
    /// question. The first answer stands.
    Answer {
        /// The question's id, e.g. `question:refund:order:1`.
        id: String,
        /// The answer.
        #[arg(long)]
        answer: String,
        /// Who answers, kept with the question.
        #[arg(long, value_name = "NAME")]
        by: String,
        /// The session (default: the store's only session).
        #[arg(long)]
        session: Option<String>,
    },
}

/// The `parked` commands.
#[derive(Debug, Subcommand)]
pub enum ParkedCommand {
    /// The session's parked events, in the order they were first parked: the produce, its
    /// trigger and event, the attempts and the last error.
    List {
        /// The session (default: the store's only session).
        #[arg(long)]
        session: Option<String>,
    },
    /// Re-arm a parked event (`Context::rearm`): one committed write to the session that
    /// deletes the record and schedules a retry of its produce, due now, with its retry
    /// policy's attempts anew; the next turn of a runtime with that produce runs it.
    Rearm {
        /// The parked event's id, e.g. `parked:orders/process_order/order:1`.
        id: String,
        /// The session (default: the store's only session).
        #[arg(long)]
        session: Option<String>,
    },
}

/// The `outbox` commands.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// The ledger's entries in registration order, a page at a time.
    List {
        /// Only entries in this status.
        #[arg(long, value_enum)]
        status: Option<StatusArg>,
        /// Only entries of this action kind.
        #[arg(long)]
        kind: Option<String>,
        /// Only the intents of this session (registered by it or attached to it).
        #[arg(long)]
        session: Option<String>,
        /// At most this many entries.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Start after this cursor (the `next` of the previous page).
        #[arg(long, value_name = "CURSOR")]
        after: Option<u64>,
    },
    /// One entry: its delivery state, every attempt (with its lease and error), payload and
    /// provenance.
    Show {
        /// The intent's idempotency key.
        key: String,
    },
    /// Counts by status and by kind, and the age of the oldest pending intent.
    Stats {
        /// Only the intents of this session.
        #[arg(long)]
        session: Option<String>,
    },
    /// Re-arm a failed, dead or held intent (the store's `retry`): pending, due now.
    Retry(RetryArgs),
    /// Cancel a pending, failed, dead or held intent for good (the store's `cancel`).
    Cancel {
        /// The intent's idempotency key.
        key: String,
        /// Why, kept with the entry.
        #[arg(long, default_value = "cancelled with the reactifact CLI")]
        reason: String,
    },
    /// Approve an intent awaiting approval (the store's `approve`): pending, due now; the
    /// ledger records who approved it and when.
    Approve {
        /// The intent's idempotency key.
        key: String,
        /// Who approves, kept with the entry.
        #[arg(long, value_name = "NAME")]
        by: String,
    },
    /// Reject an intent awaiting approval (the store's `reject`): final, never delivered; the
    /// ledger records who rejected it, when and why.
    Reject {
        /// The intent's idempotency key.
        key: String,
        /// Who rejects, kept with the entry.
        #[arg(long, value_name = "NAME")]
        by: String,
        /// Why, kept with the entry.
        #[arg(long, default_value = "rejected with the reactifact CLI")]
        reason: String,
    },
    /// Delete final entries (delivered, cancelled, rejected, or any of them) last changed
    /// longer ago than a duration, with their attempt histories (the store's `purge`). Their
    /// keys are remembered: never registered again.
    #[command(group = clap::ArgGroup::new("which").required(true).multiple(true).args(["delivered", "cancelled", "rejected"]))]
    Purge {
        /// Delete delivered entries.
        #[arg(long)]
        delivered: bool,
        /// Delete cancelled entries.
        #[arg(long)]
        cancelled: bool,
        /// Delete rejected entries.
        #[arg(long)]
        rejected: bool,
        /// Only entries last changed longer ago than this, e.g. `30d`, `12h`, `1h 30m`.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        older_than: std::time::Duration,
    },
}

/// What `outbox retry` re-arms.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The intent's idempotency key.
    #[arg(required_unless_present = "all_dead", conflicts_with = "all_dead")]
    pub key: Option<String>,
    /// Every dead intent (of --kind, if given).
    #[arg(long)]
    pub all_dead: bool,
    /// With --all-dead: only intents of this kind.
    #[arg(long, conflicts_with = "key")]
    pub kind: Option<String>,
}

/// A delivery status, as the command line spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StatusArg {
    /// Waiting for a drain.
    Pending,
    /// Claimed by a drain, under a lease.
    InFlight,
    /// The last attempt failed.
    Failed,
    /// A dead letter.
    Dead,
    /// Held: no route, or an integrity failure.
    Held,
    /// Cancelled by an operator.
    Cancelled,
    /// Delivered.
    Delivered,
    /// Awaiting an operator's approval.
    AwaitingApproval,
    /// Rejected by an operator.
    Rejected,
    /// Blocked behind an earlier intent of its ordering group.
    Blocked,
}

impl StatusArg {
    /// The ledger's status.
    pub fn status(self) -> DeliveryStatus {
        match self {
            StatusArg::Pending => DeliveryStatus::Pending,
            StatusArg::InFlight => DeliveryStatus::InFlight,
            StatusArg::Failed => DeliveryStatus::Failed,
            StatusArg::Dead => DeliveryStatus::Dead,
            StatusArg::Held => DeliveryStatus::Held,
            StatusArg::Cancelled => DeliveryStatus::Cancelled,
            StatusArg::Delivered => DeliveryStatus::Delivered,
            StatusArg::AwaitingApproval => DeliveryStatus::AwaitingApproval,
            StatusArg::Rejected => DeliveryStatus::Rejected,
            StatusArg::Blocked => DeliveryStatus::Blocked,
        }
    }
}

/// The graph languages of `graph`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// A Mermaid flowchart.
    Mermaid,
    /// Graphviz DOT.
    Dot,
}

/// A duration such as `30d`, `12h`, `90m`, `1h 30m` (humantime's syntax).
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration ({e}); write e.g. 30d, 12h, 90m or 1h30m"))
}
