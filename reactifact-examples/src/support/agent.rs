//! The support agent: one produce, [`triage`](fn@triage), that gives a model a [`Ticket`] and
//! three tools, and hands the tool calls the model makes to its effects.
//!
//! - [`LookupOrder`] reads (`Reads`): the produce runs it as a recorded call
//!   ([`ProduceCall::read_tool`]) against the [`Orders`] resource.
//! - [`SendReply`] acts (`Acts`): an intent, delivered once after the commit — in the
//!   `support-agent` program, as an MCP tool call (reactifact-mcp's `McpDispatcher`).
//! - [`IssueRefund`] acts once an operator approves (`ActsWithApproval`): an intent awaiting
//!   approval, delivered once after `Runtime::approve`.
//!
//! The model is asked through reactifact-model's [`ChatClient::complete_recorded`]: each
//! answer is recorded in the run (and kept in the store as it arrives), so a retry, a resume
//! after a crash and a replay get it back without asking again. An acting tool's intent is
//! keyed by the ticket and the call's canonical arguments ([`ProduceCall::act_tool`]), never
//! by the id the model gave the call, so a model asked again — with new ids — makes no second
//! intent.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use reactifact_core::tools::{Acts, ActsWithApproval, Reads, Tool};
use reactifact_core::{produce, Artifact, ArtifactId, PendingAction, ProduceCall, ProduceError};
use reactifact_model::{ChatAnswer, ChatClient, ChatRequest, Message};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::stand_in::Category;

/// The label of the user message's line naming the customer.
pub const CUSTOMER_LABEL: &str = "Customer:";
/// The label of the user message's line naming the order.
pub const ORDER_LABEL: &str = "Order:";
/// The label of the user message's line with the subject.
pub const SUBJECT_LABEL: &str = "Subject:";

/// The system prompt: what the agent is for and how it uses its tools.
pub const SYSTEM: &str = "You are a support agent. Look the ticket's order up with lookup_order \
first. Then answer with the ticket's category as one word (billing, bug, account or general), \
call send_reply once with a short, polite reply to the customer, and, if the customer was \
charged for an order they should not pay for, call issue_refund with the order and the amount \
paid in cents.";

/// The most model turns one triage takes (each a recorded call: `turn-1`, `turn-2`, …).
pub const MAX_TURNS: usize = 4;

/// A customer's support ticket: the trigger of [`triage`](fn@triage).
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq, Eq)]
#[artifact(kind = "ticket")]
pub struct Ticket {
    /// Who wrote it (the address the reply goes to).
    pub customer: String,
    /// The order it is about.
    pub order: String,
    /// Its subject line.
    pub subject: String,
    /// What the customer wrote.
    pub body: String,
}

impl Ticket {
    /// The ticket as the model reads it: `Customer:`, `Order:` and `Subject:` lines, a blank
    /// line, the body.
    pub fn prompt(&self) -> String {
        format!(
            "{CUSTOMER_LABEL} {}\n{ORDER_LABEL} {}\n{SUBJECT_LABEL} {}\n\n{}",
            self.customer, self.order, self.subject, self.body
        )
    }
}

/// What [`triage`](fn@triage) writes for a ticket, at `triage:{ticket id}`.
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq, Eq)]
#[artifact(kind = "triage")]
pub struct Triage {
    /// The category the model gave the ticket ([`Category::General`] if it gave none).
    pub category: Category,
    /// The keys of the intents the model's tool calls made, in the order it called them.
    pub intents: Vec<String>,
    /// How many model turns it took.
    pub turns: u32,
    /// When the ticket was triaged, in seconds since the Unix epoch, read through the recorded
    /// clock ([`ProduceCall::now`]) so a replay reads the same time.
    pub triaged_at_secs: u64,
}

/// An order, as [`LookupOrder`] answers it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// Its id.
    pub id: String,
    /// Where it is: `delivered`, `in transit`, `lost`, ….
    pub status: String,
    /// What the customer paid, in cents.
    pub paid_cents: u64,
}

/// The order book, a resource: what [`LookupOrder`] reads, and how many times it was read.
#[derive(Clone, Default)]
pub struct Orders {
    orders: Arc<BTreeMap<String, Order>>,
    lookups: Arc<AtomicU64>,
}

impl Orders {
    /// An order book holding `orders`.
    pub fn new(orders: impl IntoIterator<Item = Order>) -> Self {
        Orders {
            orders: Arc::new(orders.into_iter().map(|o| (o.id.clone(), o)).collect()),
            lookups: Arc::default(),
        }
    }

    /// Looks `id` up (and counts the lookup).
    ///
    /// # Errors
    /// When there is no such order.
    pub fn lookup(&self, id: &str) -> Result<Order, String> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.orders.get(id).cloned().ok_or_else(|| format!("no order {id}"))
    }

    /// How many lookups were made.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::SeqCst)
    }
}

/// Which model to ask, a resource. The name goes into every request, so a replay with
/// another name asks for other calls than those recorded, and reports the miss.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSettings {
    /// The model's name, as the server knows it.
    pub model: String,
}

/// The arguments of [`LookupOrder`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The order's id.
    pub order: String,
}

/// Looks an order up: a tool that reads, run as a recorded call.
pub struct LookupOrder;

impl Tool for LookupOrder {
    const NAME: &'static str = "lookup_order";
    const DESCRIPTION: &'static str = "Look an order up: its status and what the customer paid.";
    type Args = Lookup;
    type Effect = Reads;
    fn parameters() -> serde_json::Value {
        json!({"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]})
    }
}

/// The arguments of [`SendReply`]: an email to the customer.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The customer's address.
    pub to: String,
    /// The subject line.
    pub subject: String,
    /// The reply.
    pub body: String,
}

/// Sends a reply to the customer: a tool that acts (an intent, delivered once).
pub struct SendReply;

impl Tool for SendReply {
    const NAME: &'static str = "send_reply";
    const DESCRIPTION: &'static str = "Send the customer a reply by email.";
    type Args = Reply;
    type Effect = Acts;
    fn parameters() -> serde_json::Value {
        json!({
            "type": "object",
            "properties": {"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
            "required": ["to", "subject", "body"],
        })
    }
}

/// The arguments of [`IssueRefund`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// The order refunded.
    pub order: String,
    /// How much, in cents.
    pub cents: u64,
}

/// Refunds an order: a tool that acts once an operator approves.
pub struct IssueRefund;

impl Tool for IssueRefund {
    const NAME: &'static str = "issue_refund";
    const DESCRIPTION: &'static str = "Refund an order, in cents. An operator approves every refund.";
    type Args = Refund;
    type Effect = ActsWithApproval;
    fn parameters() -> serde_json::Value {
        json!({
            "type": "object",
            "properties": {"order": {"type": "string"}, "cents": {"type": "integer"}},
            "required": ["order", "cents"],
        })
    }
}

/// The tools offered to the model, as the request lists them.
pub fn offered_tools() -> Vec<reactifact_model::Tool> {
    fn tool<T: Tool>() -> reactifact_model::Tool {
        reactifact_model::Tool::new(T::NAME, T::DESCRIPTION, T::parameters())
    }
    vec![tool::<LookupOrder>(), tool::<SendReply>(), tool::<IssueRefund>()]
}

/// The first request of a triage: the system prompt, the ticket and the tools.
pub fn first_request(model: &str, ticket: &Ticket) -> ChatRequest {
    let mut request = ChatRequest::new(model)
        .system(SYSTEM)
        .user(ticket.prompt())
        .max_tokens(400);
    for tool in offered_tools() {
        request = request.tool(tool);
    }
    request
}

/// The id [`triage`](fn@triage) writes the [`Triage`] of `ticket` at: `triage:{ticket id}`.
pub fn triage_id(ticket: &ArtifactId) -> String {
    format!("triage:{ticket}")
}

/// Triages a ticket: asks the model (recorded calls `turn-1`, `turn-2`, … through
/// [`ChatClient::complete_recorded`]) with the ticket and the tools, until it answers without
/// asking to read anything (at most [`MAX_TURNS`] turns). Each tool call is handed to the
/// effects: `lookup_order` runs as a recorded call and its answer goes back to the model;
/// `send_reply` and `issue_refund` become intents keyed by the ticket and their arguments. The
/// last answer's text is the category. Writes the [`Triage`] at `triage:{ticket id}`.
///
/// A failed model call fails the run (fail-loud): the generation is not committed, and the
/// retry reuses the answers the calls already got. A call of an unknown tool, or arguments the
/// tool does not take, fail the run too, naming the tool.
#[produce(
    Triage,
    also_creates = [PendingAction],
    uses = [ChatClient, ModelSettings, Orders],
    tools = [LookupOrder, SendReply, IssueRefund]
)]
pub async fn triage(call: ProduceCall<Ticket>) -> Result<(), ProduceError> {
    let client = call.resource::<ChatClient>();
    let model = call.resource::<ModelSettings>().model.as_str();
    let mut request = first_request(model, &call.trigger.data);
    let mut intents = Vec::new();
    let mut turns = 0;
    let mut last = ChatAnswer::default();
    while turns < MAX_TURNS {
        turns += 1;
        let answer = client
            .complete_recorded(&call, &format!("turn-{turns}"), &request)
            .await?;
        request = request.message(answer.message());
        let mut read = false;
        for tool_call in &answer.tool_calls {
            let result = match tool_call.name.as_str() {
                LookupOrder::NAME => {
                    read = true;
                    let orders = call.resource::<Orders>().clone();
                    let order: Result<Order, String> = call
                        .read_tool::<LookupOrder, _, _, _, _>(&tool_call.arguments, move |args: Lookup| async move {
                            Ok::<_, std::convert::Infallible>(orders.lookup(&args.order))
                        })
                        .await?;
                    match order {
                        Ok(order) => serde_json::to_string(&order).map_err(ProduceError::msg)?,
                        Err(missing) => missing,
                    }
                }
                SendReply::NAME => {
                    let intent = call.act_tool::<SendReply>(&tool_call.arguments)?;
                    intents.push(intent.key.to_string());
                    "sent once the triage is committed".to_owned()
                }
                IssueRefund::NAME => {
                    let intent = call.act_tool::<IssueRefund>(&tool_call.arguments)?;
                    intents.push(intent.key.to_string());
                    "waiting for an operator's approval".to_owned()
                }
                other => return Err(ProduceError::msg(format!("the model called an unknown tool `{other}`"))),
            };
            request = request.message(Message::tool(tool_call.id.clone(), result));
        }
        last = answer;
        if !read {
            break;
        }
    }
    let category = Category::parse(last.text()).unwrap_or(Category::General);
    let triaged_at_secs = call.now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    call.effects.upsert(
        triage_id(&call.trigger.id),
        Triage {
            category,
            intents,
            turns: turns as u32,
            triaged_at_secs,
        },
    );
    Ok(())
}
