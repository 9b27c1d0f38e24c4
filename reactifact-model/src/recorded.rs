//! [`ChatClient::complete_recorded`]: a model call from a produce, recorded and metered.

use reactifact_core::error::CallError;
use reactifact_core::ProduceCall;

use crate::answer::ChatAnswer;
use crate::client::ChatClient;
use crate::error::ModelError;
use crate::request::ChatRequest;

impl ChatClient {
    /// Asks the model from inside a produce, as a recorded, metered call named `name` that
    /// keeps the model's name ([`ProduceCall::record_model`], so `reactifact why` shows the
    /// model beside the call's tokens): the first execution calls
    /// [`complete`](ChatClient::complete) (with its retries) and records `request`'s hash,
    /// the [`ChatAnswer`] and its usage ([`Usage::tokens`](reactifact_core::runtime::Usage::tokens)
    /// of the answer's prompt and completion tokens). A retried generation, a resume and a
    /// replay get the recorded answer back without calling the model; the turn's token budget
    /// counts the tokens when the call is made.
    ///
    /// The request identifies the call: everything the answer depends on (the model, the
    /// messages, the tools) is in it.
    ///
    /// ```no_run
    /// use reactifact_core::{produce, Artifact, ProduceCall, ProduceError};
    /// use reactifact_model::{ChatClient, ChatRequest};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize, Artifact)]
    /// struct Ticket { text: String }
    /// #[derive(Serialize, Deserialize, Artifact)]
    /// struct Reply { text: String }
    ///
    /// #[produce(Reply, uses = [ChatClient])]
    /// async fn reply(call: ProduceCall<Ticket>) -> Result<(), ProduceError> {
    ///     let model = call.resource::<ChatClient>();
    ///     let request = ChatRequest::new("gpt-4o-mini")
    ///         .system("Draft a short reply to this support ticket.")
    ///         .user(call.trigger.data.text.clone());
    ///     let answer = model.complete_recorded(&call, "draft", &request).await?;
    ///     call.effects.upsert(format!("reply:{}", call.trigger.id), Reply { text: answer.text().to_owned() });
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// As [`ProduceCall::record_model`]: [`CallError::Failed`] holding the [`ModelError`]
    /// (`source.downcast_ref::<ModelError>()`) when the model call failed after its retries;
    /// [`CallError::BudgetExhausted`] when the turn's budget is spent (the model is not called);
    /// [`CallError::Miss`] in a replay that does not have the call.
    pub async fn complete_recorded<T, D>(
        &self,
        call: &ProduceCall<T, D>,
        name: &str,
        request: &ChatRequest,
    ) -> Result<ChatAnswer, CallError> {
        call.record_model(name, &request.model, request, || async {
            let answer = self.complete(request).await?;
            let usage = answer.metered();
            Ok::<_, ModelError>((answer, usage))
        })
        .await
    }
}
