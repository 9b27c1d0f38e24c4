//! Tools a model calls through a produce: the [`Tool`] trait, what a call of one does
//! ([`Reads`], [`Acts`], [`ActsWithApproval`]), and the key of the intent an acting tool makes
//! ([`tool_key`]). A produce declares the tools it offers with `#[produce(.., tools = [..])]`
//! and hands the model's calls to [`ProduceCall::act_tool`](crate::ProduceCall::act_tool) and
//! [`ProduceCall::read_tool`](crate::ProduceCall::read_tool); see `docs/agents.md`.

pub use crate::error::ToolError;
pub use crate::run::tools::{
    tool_key, Acting, Acts, ActsWithApproval, DeclaredTool, Reading, Reads, Tool, ToolEffect, ToolIntent, ToolKind,
};
