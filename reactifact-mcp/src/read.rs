//! Read-only tools as recorded calls.

use std::future::Future;

use reactifact_core::{CallError, ProduceCall};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::McpError;
use crate::payload::object;
use crate::McpDispatcher;

/// What a read-only tool answered: its structured content and its text content. Kept in the
/// run's record (rmp-serde), so a retry, a resume and a replay get it back as it was.
///
/// Content blocks other than text (images, audio, resources) are not kept. A
/// `structuredContent` of `null` reads as `None`, as it does from the record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolAnswer {
    /// The result's `structuredContent`, if it had any.
    pub structured: Option<Value>,
    /// The result's text blocks, in order.
    pub text: Vec<String>,
}

impl ToolAnswer {
    /// The answer decoded as `R`: from its structured content, or, for a tool without any,
    /// from its text blocks joined and read as JSON.
    pub fn decode<R: DeserializeOwned>(&self) -> Result<R, serde_json::Error> {
        match &self.structured {
            Some(value) => R::deserialize(value),
            None => serde_json::from_str(&self.text.concat()),
        }
    }
}

/// The request a read-only call records: what identifies it.
#[derive(Serialize, Deserialize)]
struct ReadRequest {
    tool: String,
    arguments: Map<String, Value>,
}

impl McpDispatcher {
    /// Calls the read-only tool `tool` with `arguments` (anything that serializes to a JSON
    /// object) as a recorded call of `call`'s run, named `mcp:{tool}`
    /// ([`ProduceCall::record`]): the first execution calls the server and records the answer
    /// in the run's record; a retry of the run (its generation failed and runs again), a
    /// resume and a replay get the recorded answer back without calling the server again —
    /// as long as the tool and arguments are the same, which identify the call.
    ///
    /// No idempotency key is sent: a read has no effect to deduplicate. Call tools with
    /// effects through intents ([`Effects::act`](reactifact_core::Effects::act)), which the
    /// dispatcher delivers.
    ///
    /// # Errors
    /// [`CallError::Failed`] wrapping an [`McpError`] when the arguments are not a JSON
    /// object or the call fails — including a result with `isError: true`
    /// ([`McpError::Tool`]); a failure is not recorded as an answer, so a retry calls again.
    /// The other [`CallError`]s as [`ProduceCall::record`].
    pub fn call_read_only<'a, T, D>(
        &'a self,
        call: &'a ProduceCall<T, D>,
        tool: &'a str,
        arguments: impl Serialize,
    ) -> impl Future<Output = Result<ToolAnswer, CallError>> + Send + 'a
    where
        ProduceCall<T, D>: Sync,
    {
        let name = format!("mcp:{tool}");
        let arguments = serde_json::to_value(arguments)
            .map_err(|e| e.to_string())
            .and_then(object)
            .map_err(|reason| McpError::Arguments {
                tool: tool.to_owned(),
                reason,
            });
        async move {
            let arguments = arguments.map_err(|error| CallError::Failed {
                call: name.clone(),
                source: error.into(),
            })?;
            let request = ReadRequest {
                tool: tool.to_owned(),
                arguments,
            };
            call.record(&name, request, move |request: ReadRequest| async move {
                self.call_tool(&request.tool, request.arguments).await
            })
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_round_trips_through_the_record() {
        let answer = ToolAnswer {
            structured: Some(serde_json::json!({
                "sku": "A-1", "stock": 3, "price": 12.5, "big": u64::MAX, "tags": ["x"], "none": null, "ok": true
            })),
            text: vec!["3 in stock".to_owned()],
        };
        let bytes = rmp_serde::to_vec_named(&answer).unwrap();
        let back: ToolAnswer = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back, answer);
        let empty = ToolAnswer::default();
        let back: ToolAnswer = rmp_serde::from_slice(&rmp_serde::to_vec_named(&empty).unwrap()).unwrap();
        assert_eq!(back, empty);
    }

    #[test]
    fn an_answer_decodes_from_structured_content_or_text() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct Stock {
            stock: u32,
        }
        let structured = ToolAnswer {
            structured: Some(serde_json::json!({"stock": 3})),
            text: vec!["ignored".into()],
        };
        assert_eq!(structured.decode::<Stock>().unwrap(), Stock { stock: 3 });
        let text = ToolAnswer {
            structured: None,
            text: vec![r#"{"stock":"#.into(), "4}".into()],
        };
        assert_eq!(text.decode::<Stock>().unwrap(), Stock { stock: 4 });
    }
}
