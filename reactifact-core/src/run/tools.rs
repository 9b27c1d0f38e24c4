//! Tools a model can call: declared on the produce (`#[produce(.., tools = [..])]`), each
//! either reading the world (a recorded call) or acting on it (an intent whose key the model
//! cannot change).
//!
//! A model that asks to call a tool names it and gives its arguments as JSON. Nothing the
//! model makes up goes into an intent's key: [`ProduceCall::act_tool`] parses the arguments
//! into the tool's typed [`Tool::Args`] and keys the intent by the tool, the trigger and the
//! hash of those arguments as they encode ([`tool_key`]) — so a model asked again (a retry, a
//! crash and a restart, a later version of the trigger) that asks for the same call in other
//! words (another tool-call id, its JSON keys in another order, other whitespace) derives the
//! same key, and the outbox delivers it once.

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::model::action::{ActionKey, PendingAction};
use crate::model::artifact::{self, ArtifactId};
use crate::model::hash::content_hash;
use crate::outbox::dispatcher::BoxError;
use crate::run::call_fn::CallFn;
use crate::run::calls::CallError;
use crate::run::effects::DeclaredOutput;
use crate::run::produce::ProduceCall;

/// A tool a model can call, declared on the produces that offer it with
/// `#[produce(.., tools = [IssueRefund])]`.
///
/// What calling it does is its [`Effect`](Tool::Effect): [`Reads`] (it reads the world: the
/// produce runs it as a recorded call with [`ProduceCall::read_tool`]), [`Acts`] (a side
/// effect: [`ProduceCall::act_tool`] records it as an intent of kind [`NAME`](Tool::NAME),
/// delivered after the commit by the dispatcher for that kind) or [`ActsWithApproval`] (an
/// intent that waits for an operator's approval). Acting with a tool that only reads, or
/// reading through one that acts, does not compile.
///
/// ```
/// use reactifact_core::tools::{Acts, Tool};
/// use serde::{Deserialize, Serialize};
///
/// /// Refunds an order, in cents.
/// struct IssueRefund;
///
/// #[derive(Serialize, Deserialize)]
/// struct Refund { order: String, cents: u64 }
///
/// impl Tool for IssueRefund {
///     const NAME: &'static str = "issue_refund";
///     const DESCRIPTION: &'static str = "Refund an order, in cents.";
///     type Args = Refund;
///     type Effect = Acts;
///     fn parameters() -> serde_json::Value {
///         serde_json::json!({
///             "type": "object",
///             "properties": {"order": {"type": "string"}, "cents": {"type": "integer"}},
///             "required": ["order", "cents"]
///         })
///     }
/// }
/// ```
pub trait Tool: 'static {
    /// The name the model calls it by; for a tool that acts, also its intents' kind (the
    /// dispatcher routes on it) and the first part of their keys.
    const NAME: &'static str;
    /// What it does, for the model.
    const DESCRIPTION: &'static str;
    /// Its arguments, parsed from the JSON the model gives. They are the payload of its
    /// intents, and their encoding is hashed into the intent's key, so they must encode the
    /// same way each time (a `BTreeMap`, not a `HashMap`).
    type Args: Serialize + DeserializeOwned;
    /// What a call of it does: [`Reads`], [`Acts`] or [`ActsWithApproval`].
    type Effect: ToolEffect;
    /// The JSON schema of [`Args`](Tool::Args), as the model is shown it.
    fn parameters() -> serde_json::Value;
}

/// What calling a [`Tool`] does: [`Reads`], [`Acts`] or [`ActsWithApproval`]. Sealed.
pub trait ToolEffect: sealed::Sealed + 'static {
    /// The effect as a value, for listings.
    const KIND: ToolKind;
}

/// A [`ToolEffect`] that acts on the world: [`Acts`] or [`ActsWithApproval`].
#[diagnostic::on_unimplemented(
    message = "a tool whose effect is `{Self}` does not act",
    label = "this tool only reads",
    note = "a tool that reads runs as a recorded call: `call.read_tool::<T>(arguments, ..)`; one that acts declares `type Effect = Acts;` (or `ActsWithApproval`)"
)]
pub trait Acting: ToolEffect {}

/// A tool that reads the world and changes nothing there (a lookup, a search): the produce
/// runs it as a recorded call ([`ProduceCall::read_tool`]).
#[derive(Debug, Clone, Copy)]
pub enum Reads {}

/// A tool with a side effect (send, charge, refund): the produce records it as an intent
/// ([`ProduceCall::act_tool`]), delivered once after the commit.
#[derive(Debug, Clone, Copy)]
pub enum Acts {}

/// A tool with a side effect that an operator approves first: recorded as an intent awaiting
/// approval ([`Effects::act_with_approval`](crate::Effects::act_with_approval)).
#[derive(Debug, Clone, Copy)]
pub enum ActsWithApproval {}

/// What calling a tool does, as a value ([`ToolEffect::KIND`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolKind {
    /// [`Reads`].
    Reads,
    /// [`Acts`].
    Acts,
    /// [`ActsWithApproval`].
    ActsWithApproval,
}

impl ToolEffect for Reads {
    const KIND: ToolKind = ToolKind::Reads;
}
impl ToolEffect for Acts {
    const KIND: ToolKind = ToolKind::Acts;
}
impl ToolEffect for ActsWithApproval {
    const KIND: ToolKind = ToolKind::ActsWithApproval;
}
impl Acting for Acts {}
impl Acting for ActsWithApproval {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Reads {}
    impl Sealed for super::Acts {}
    impl Sealed for super::ActsWithApproval {}
}

/// Marks `Self` as a tool that produce `P` declared it offers.
///
/// `#[produce(.., tools = [IssueRefund])]` implements it for `IssueRefund` with `P` the
/// produce, so calling any other tool through that produce's call is a compile error.
/// [`Dynamic`](crate::runtime::Dynamic) accepts every tool.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a declared tool of produce `{P}`",
    label = "produce `{P}` does not declare the tool `{Self}`",
    note = "declare it on the produce: `#[produce(.., tools = [{Self}])]`"
)]
pub trait DeclaredTool<P>: Tool {}

impl<T: Tool> DeclaredTool<crate::run::effects::Dynamic> for T {}

/// A tool call that could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The model's arguments are not the tool's [`Args`](Tool::Args): not JSON, or not of its
    /// shape. Nothing was recorded; tell the model (the message names the tool and what is
    /// wrong) and let it ask again.
    #[error("the arguments of tool `{tool}` are invalid: {reason}")]
    Arguments {
        /// The tool's name.
        tool: &'static str,
        /// What serde_json reported.
        reason: String,
    },
    /// The arguments parsed but do not encode (a type whose `Serialize` fails).
    #[error("the arguments of tool `{tool}` do not encode: {reason}")]
    Encode {
        /// The tool's name.
        tool: &'static str,
        /// What the encoder reported.
        reason: String,
    },
    /// A tool that reads: its recorded call failed.
    #[error(transparent)]
    Call(#[from] CallError),
}

/// The key of the intent a call of tool `U` with `args` makes, for a run triggered by
/// `trigger`: `{tool name}:{trigger id}:{hash}`, where the hash is the first 12 hex digits of
/// the SHA-256 of the arguments' encoding (rmp-serde). Nothing the model makes up is in it:
/// equal arguments for the same trigger make the same key, whatever the model's tool-call id,
/// and however its JSON was spelled.
///
/// # Errors
/// [`ToolError::Encode`] if the arguments do not encode.
pub fn tool_key<U: Tool>(trigger: &ArtifactId, args: &U::Args) -> Result<ActionKey, ToolError> {
    let bytes = encode::<U>(args)?;
    Ok(key_of::<U>(trigger, &bytes))
}

/// The key of a call of `U` whose arguments encode to `bytes`.
fn key_of<U: Tool>(trigger: &ArtifactId, bytes: &[u8]) -> ActionKey {
    ActionKey::from(format!("{}:{trigger}:{}", U::NAME, content_hash(bytes).short()))
}

fn encode<U: Tool>(args: &U::Args) -> Result<Vec<u8>, ToolError> {
    artifact::encode(args).map_err(|error| ToolError::Encode {
        tool: U::NAME,
        reason: error.to_string(),
    })
}

/// The model's JSON arguments as `U`'s typed arguments.
fn parse<U: Tool>(arguments: &str) -> Result<U::Args, ToolError> {
    // A tool without parameters may be called with no arguments at all.
    let arguments = match arguments.trim() {
        "" => "{}",
        text => text,
    };
    serde_json::from_str(arguments).map_err(|error| ToolError::Arguments {
        tool: U::NAME,
        reason: error.to_string(),
    })
}

/// A tool that acts, as a recorded intent: what [`ProduceCall::act_tool`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolIntent {
    /// The intent's key ([`tool_key`]).
    pub key: ActionKey,
    /// Whether this run recorded it: `false` when an intent with this key exists already (an
    /// earlier run, or an earlier call of this run, made it), which is not recorded again.
    pub recorded: bool,
}

impl<T, D> ProduceCall<T, D> {
    /// Records a model's call of tool `U`, a tool that acts, as an intent: `arguments` (the
    /// JSON the model gave) parsed as [`U::Args`](Tool::Args) are its payload, [`U::NAME`]
    /// its kind, and its key is derived from the trigger and the arguments ([`tool_key`]),
    /// never from the model's tool-call id. A tool whose effect is [`ActsWithApproval`]
    /// records an intent awaiting approval.
    ///
    /// A key already acted — by an earlier run on this trigger, or by an earlier call of this
    /// run with the same arguments — is not acted again ([`ToolIntent::recorded`] is
    /// `false`): a model asked again cannot make a second intent for the same call.
    ///
    /// The produce declares the tool (`tools = [U]`) and [`PendingAction`]
    /// (`also_creates = [PendingAction]`); without either the call does not compile.
    ///
    /// # Errors
    /// [`ToolError::Arguments`] when the arguments are not `U::Args` (nothing is recorded:
    /// give the model the message and let it ask again); [`ToolError::Encode`] when they do
    /// not encode.
    ///
    /// [`U::NAME`]: Tool::NAME
    pub fn act_tool<U>(&self, arguments: &str) -> Result<ToolIntent, ToolError>
    where
        U: DeclaredTool<D>,
        U::Effect: Acting,
        PendingAction: DeclaredOutput<D>,
    {
        let args = parse::<U>(arguments)?;
        let bytes = encode::<U>(&args)?;
        let key = key_of::<U>(&self.trigger.id, &bytes);
        let recorded = match <U::Effect as ToolEffect>::KIND {
            ToolKind::ActsWithApproval => self.effects.act_with_approval(U::NAME, key.clone(), &args),
            ToolKind::Acts | ToolKind::Reads => self.effects.act(U::NAME, key.clone(), &args),
        }
        .is_some();
        Ok(ToolIntent { key, recorded })
    }

    /// Runs a model's call of tool `U`, a tool that reads, as a recorded call named
    /// [`U::NAME`](Tool::NAME) whose request is the parsed arguments: `call` is handed them
    /// ([`CallFn`]: a closure taking nothing, or one taking `U::Args`) and its answer is
    /// recorded, so a retry, a resume and a replay get it back without calling again (see
    /// [`record`](ProduceCall::record)).
    ///
    /// # Errors
    /// [`ToolError::Arguments`] when the arguments are not `U::Args` (nothing is called);
    /// [`ToolError::Call`] as [`record`](ProduceCall::record) fails.
    pub async fn read_tool<U, A, E, F, M>(&self, arguments: &str, call: F) -> Result<A, ToolError>
    where
        U: DeclaredTool<D>,
        U::Effect: Reading,
        A: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: CallFn<U::Args, M>,
        F::Future: Future<Output = Result<A, E>>,
    {
        let args = parse::<U>(arguments)?;
        Ok(self.record(U::NAME, args, call).await?)
    }
}

/// The [`ToolEffect`] of a tool that reads: [`Reads`].
#[diagnostic::on_unimplemented(
    message = "a tool whose effect is `{Self}` acts; it is not read",
    label = "this tool acts on the world",
    note = "a tool that acts becomes an intent: `call.act_tool::<T>(arguments)`"
)]
pub trait Reading: ToolEffect {}

impl Reading for Reads {}
