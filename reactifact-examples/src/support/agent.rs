//! The support agent: one produce, [`triage`](fn@triage), that asks a model to classify a [`Ticket`]
//! and to draft a reply, writes a [`Triage`] and records the intent to email the reply.
//!
//! The produce does no I/O of its own. Its two model calls are recorded calls
//! ([`ProduceCall::record_metered`]): the answers are kept in the run's record, inside the
//! commit hash, so a retried generation, a resume and a replay get them back without asking
//! the model again. The email is an intent keyed by the ticket id (`email:{ticket id}`),
//! which the outbox delivers once, after the commit.
//!
//! The model client and the model's name are resources ([`ModelClient`], [`ModelSettings`])
//! registered on the runtime, so the program chooses the client at start-up (the
//! [`StandIn`](super::StandIn), or an OpenAI-compatible server).

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use reactifact_core::runtime::{DeclaredOutput, DeclaredResource, Usage};
use reactifact_core::{produce, Artifact, ArtifactId, PendingAction, ProduceCall, ProduceError};
use serde::{Deserialize, Serialize};

use super::model::{Completion, CompletionRequest, Model};
use super::stand_in::{draft_request, triage_request, Category};

/// A customer's support ticket: the trigger of [`triage`](fn@triage).
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq, Eq)]
#[artifact(kind = "ticket")]
pub struct Ticket {
    /// Who wrote it (the address the reply goes to).
    pub customer: String,
    /// Its subject line.
    pub subject: String,
    /// What the customer wrote.
    pub body: String,
}

impl Ticket {
    /// The ticket as the model reads it: the subject, a blank line, the body.
    pub fn text(&self) -> String {
        format!("{}\n\n{}", self.subject, self.body)
    }
}

/// What [`triage`](fn@triage) writes for a ticket, at `triage:{ticket id}`.
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq, Eq)]
#[artifact(kind = "triage")]
pub struct Triage {
    /// The category the model gave the ticket.
    pub category: Category,
    /// The reply the model drafted (also the body of the email intent).
    pub reply: String,
    /// When the ticket was triaged, in seconds since the Unix epoch, read through the recorded
    /// clock ([`ProduceCall::now`]) so a replay reads the same time.
    pub triaged_at_secs: u64,
}

/// The payload of an `email` intent: the drafted reply, addressed to the customer.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Email {
    /// The customer.
    pub to: String,
    /// `Re: ` and the ticket's subject.
    pub subject: String,
    /// The drafted reply.
    pub body: String,
}

/// The model client, a resource: any [`Model`], chosen when the runtime is built.
#[derive(Clone)]
pub struct ModelClient(pub Arc<dyn Model>);

impl ModelClient {
    /// A resource holding `model`.
    pub fn new(model: impl Model) -> Self {
        ModelClient(Arc::new(model))
    }
}

/// Which model to ask, a resource. The name goes into every request, so a replay with
/// another name asks for other calls than those recorded, and reports the miss.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSettings {
    /// The model's name, as the server knows it.
    pub model: String,
}

/// The kind of the intent [`triage`](fn@triage) records.
pub const EMAIL: &str = "email";

/// The idempotency key of the reply to `ticket`: `email:{ticket id}`. Derived from the ticket
/// id alone, so every run that reaches the decision derives the same key.
pub fn email_key(ticket: &ArtifactId) -> String {
    format!("email:{ticket}")
}

/// The id [`triage`](fn@triage) writes the [`Triage`] of `ticket` at: `triage:{ticket id}`.
pub fn triage_id(ticket: &ArtifactId) -> String {
    format!("triage:{ticket}")
}

/// The tokens a completion reports, as the runtime meters them.
pub fn usage_of(completion: &Completion) -> Usage {
    Usage::tokens(completion.tokens_in, completion.tokens_out)
}

/// Triages a ticket: asks the model for the category (the recorded call `classify`, with
/// [`triage_request`]), then for a reply (`draft`, with [`draft_request`] for that category),
/// stamps the time, upserts the [`Triage`] at `triage:{ticket id}` and records an `email`
/// intent with the reply, keyed `email:{ticket id}`.
///
/// A category the model answers that is not one of [`Category`]'s names is taken as
/// [`Category::General`]. A failed call fails the run, and with it the turn (fail-loud): the
/// generation is not committed, and the retry reuses the answers the calls already got.
#[produce(Triage, also_creates = [PendingAction], uses = [ModelClient, ModelSettings])]
pub async fn triage(call: ProduceCall<Ticket>) -> Result<(), ProduceError> {
    triage_with(&call, |model, category, ticket| draft_request(model, category, ticket)).await
}

/// How the draft request is built from the model's name, the category and the ticket's text.
pub(crate) type DraftRequest = fn(&str, Category, &str) -> CompletionRequest;

/// [`triage`](fn@triage)'s body, with the draft request built by `draft`: the program's replay case runs
/// a produce of the same name with another drafting prompt, to show that a changed prompt is
/// a replay miss naming the call.
pub(crate) async fn triage_with<D>(call: &ProduceCall<Ticket, D>, draft: DraftRequest) -> Result<(), ProduceError>
where
    Triage: DeclaredOutput<D>,
    PendingAction: DeclaredOutput<D>,
    ModelClient: DeclaredResource<D>,
    ModelSettings: DeclaredResource<D>,
{
    let model = call.resource::<ModelClient>().0.clone();
    let name = call.resource::<ModelSettings>().model.as_str();
    let ticket = &call.trigger.data;
    let text = ticket.text();

    let classify = triage_request(name, &text);
    let answer: Completion = call
        .record_metered("classify", &classify, || complete(&model, &classify))
        .await?;
    let category = Category::parse(&answer.text).unwrap_or(Category::General);

    let draft = draft(name, category, &text);
    let reply: Completion = call
        .record_metered("draft", &draft, || complete(&model, &draft))
        .await?;

    let triaged_at_secs = call.now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let id = &call.trigger.id;
    call.effects.upsert(
        triage_id(id),
        Triage {
            category,
            reply: reply.text.clone(),
            triaged_at_secs,
        },
    );
    call.effects.act(
        EMAIL,
        email_key(id),
        &Email {
            to: ticket.customer.clone(),
            subject: format!("Re: {}", ticket.subject),
            body: reply.text,
        },
    );
    Ok(())
}

/// One completion with its usage, as a metered call's closure returns it.
async fn complete(
    model: &Arc<dyn Model>,
    request: &CompletionRequest,
) -> Result<(Completion, Usage), super::model::ModelError> {
    let completion = model.complete(request).await?;
    let usage = usage_of(&completion);
    Ok((completion, usage))
}
