//! The support agent as a process of its own over a SQLite file (`support-agent --agent`):
//! it adds the tickets the file lacks, triages every ticket, approves the refunds (an
//! operator's stand-in), delivers every intent to the MCP server and exits. Run again on the
//! same file, it resumes where the last process stopped — however it stopped: the SIGKILL
//! test (`tests/support_kill.rs`) kills it at random points and restarts it.
//!
//! Runs execute one at a time (one model call in flight at a time), so the model calls a
//! killed process leaves unanswered are the ones the next process asks again.

use std::path::PathBuf;

use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::{Agent, ArtifactId, Context, Runtime};
use reactifact_mcp::McpDispatcher;
use reactifact_model::ChatClient;

use super::agent::{triage, ModelSettings, Order, Orders, Ticket, Triage};

/// What a step of the process returns.
pub type Outcome<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The agent the produce runs in.
pub const AGENT: &str = "support";

/// The session a store holds.
pub const SESSION: &str = "support";

/// Who approves the refunds in the `--agent` process.
pub const OPERATOR: &str = "operator@example.com";

/// The five kinds of ticket, cycled by [`tickets`]: (customer, subject, body, order status,
/// paid cents). The first and the last are billing tickets whose orders are paid: refunds.
const TEMPLATES: [(&str, &str, &str, &str, u64); 5] = [
    (
        "ada",
        "Charged twice this month",
        "My card was charged twice for this order. Please refund one of them.",
        "delivered",
        1900,
    ),
    (
        "bob",
        "The app closes at start",
        "Since yesterday's update the app crashes as soon as I open it.",
        "delivered",
        0,
    ),
    (
        "cy",
        "Cannot sign in",
        "I forgot my password and the reset link never arrives.",
        "delivered",
        4500,
    ),
    (
        "dee",
        "Where is my parcel",
        "When will my parcel arrive?",
        "in transit",
        2400,
    ),
    (
        "eve",
        "Parcel never arrived",
        "My order never came. I would like my money back, a refund to my card.",
        "lost",
        3200,
    ),
];

/// `count` tickets, `ticket:1` … `ticket:{count}`, cycling through five kinds (billing twice
/// in five: a refund each), each about an order of its own (`A1` …).
pub fn tickets(count: usize) -> Vec<(ArtifactId, Ticket)> {
    (1..=count)
        .map(|n| {
            let (customer, subject, body, _, _) = TEMPLATES[(n - 1) % TEMPLATES.len()];
            let ticket = Ticket {
                customer: format!("{customer}{n}@example.com"),
                order: format!("A{n}"),
                subject: subject.to_owned(),
                body: body.to_owned(),
            };
            (ArtifactId::from(format!("ticket:{n}")), ticket)
        })
        .collect()
}

/// The orders of [`tickets`]`(count)`.
pub fn orders(count: usize) -> Orders {
    Orders::new((1..=count).map(|n| {
        let (_, _, _, status, paid_cents) = TEMPLATES[(n - 1) % TEMPLATES.len()];
        Order {
            id: format!("A{n}"),
            status: status.to_owned(),
            paid_cents,
        }
    }))
}

/// How the `--agent` process runs.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// The SQLite file (created if missing).
    pub db: PathBuf,
    /// The model server's base URL (`http://127.0.0.1:<port>/v1`).
    pub model_url: String,
    /// The model's name.
    pub model: String,
    /// The MCP server's URL (`http://127.0.0.1:<port>/mcp`).
    pub mcp_url: String,
    /// How many tickets the store holds ([`tickets`]).
    pub tickets: usize,
}

/// Runs the agent to the end over `options.db`: adds the tickets it lacks, runs turns until
/// no event is queued, approves every refund awaiting approval, and delivers every intent.
/// Returns how many triages the store holds.
///
/// # Errors
/// When the store, the model or the MCP server fails.
pub async fn run_agent(options: &AgentOptions) -> Outcome<usize> {
    let mut context = Context::open(&options.db, SESSION)?;
    for (id, ticket) in tickets(options.tickets) {
        if context.get::<Ticket>(id.as_str())?.is_none() {
            context.create(id, ticket)?;
        }
    }
    let mut rt = Runtime::builder(context)
        .resource(ChatClient::new(&options.model_url, None)?)
        .resource(ModelSettings {
            model: options.model.clone(),
        })
        .resource(orders(options.tickets))
        .agent(Agent::new(AGENT).produce(triage))
        .dispatcher(McpDispatcher::new(&options.mcp_url)?)
        .max_concurrency(1)
        .build()?;
    while rt.context().queued_events() > 0 {
        rt.run().await?;
    }
    let ledger = rt.context().ledger();
    for (id, _) in tickets(options.tickets) {
        let Some(triage) = rt.context().get::<Triage>(&super::agent::triage_id(&id))? else {
            continue;
        };
        for key in &triage.data.intents {
            let waiting = ledger
                .get(key)
                .await?
                .is_some_and(|d| d.status() == DeliveryStatus::AwaitingApproval);
            if waiting {
                rt.approve(key, OPERATOR).await?;
            }
        }
    }
    rt.settle().await?;
    Ok(rt.context().list::<Triage>().count())
}
