//! A support agent: a model reads each support ticket, looks its order up, replies to the
//! customer and asks for a refund where one is due — through tools whose calls are recorded
//! calls and intents, so nothing is sent or paid for twice, whatever happens (the
//! `support-agent` program).
//!
//! - [`agent`]: the agent itself: the [`Ticket`] and [`Triage`] artifacts, the three tools
//!   ([`LookupOrder`] reads, [`SendReply`] acts, [`IssueRefund`] acts once approved), and the
//!   produce [`triage`](fn@agent::triage), which asks the model through reactifact-model's
//!   `ChatClient`.
//! - [`stand_in`]: the scripted model ([`stand_in::answer`], for a
//!   `reactifact_model::stand_in::StandIn` server) and the [`Category`] a triage answers.
//! - [`tool_server`]: [`ToolServer`], the MCP server the replies and refunds are delivered to.
//! - [`cases`]: the `support-agent` program's cases, each checking what it claims.
//! - [`process`]: the agent as a long-running process over a SQLite file (`support-agent
//!   --agent`), the one the SIGKILL test kills.

pub mod agent;
pub mod cases;
pub mod process;
pub mod stand_in;
pub mod tool_server;

pub use agent::{IssueRefund, LookupOrder, ModelSettings, Order, Orders, SendReply, Ticket, Triage};
pub use stand_in::Category;
pub use tool_server::ToolServer;
