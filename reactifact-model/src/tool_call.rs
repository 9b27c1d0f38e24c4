//! [`ToolCall`]: a model's request to call one of the request's tools.

use serde::{Deserialize, Serialize};

/// A model's request to call a tool: which tool, and the arguments it chose, as the raw JSON
/// text the model wrote.
///
/// The model asks in its answer ([`ChatAnswer::tool_calls`](crate::ChatAnswer::tool_calls));
/// the conversation carries the request back in an assistant message
/// ([`Message::Assistant`](crate::Message::Assistant)), followed by one
/// [`Message::Tool`](crate::Message::Tool) per call with the result.
///
/// The `id` is the model's: it pairs a call with its result in the conversation and nothing
/// else. Models mint a new one on every retry, so never derive an idempotency key from it;
/// derive it from the trigger and the call's canonical [`arguments`](ToolCall::arguments).
///
/// Serialized (for the wire, and in a recorded call) as the OpenAI API writes it:
/// `{"id": "call_1", "type": "function", "function": {"name": "…", "arguments": "{…}"}}`.
/// Read leniently: a missing `id` is empty, and `arguments` given as a JSON value rather
/// than a string (as a few local servers do) is taken as that value's JSON text.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(into = "WireToolCall", try_from = "WireToolCall")]
pub struct ToolCall {
    /// The model's id for this call (pairs it with its result; not stable across retries).
    pub id: String,
    /// The tool's name, as the request's [`Tool`](crate::Tool) declared it.
    pub name: String,
    /// The arguments, as the raw JSON text the model gave (not checked: a model may write
    /// invalid JSON or ignore the schema).
    pub arguments: String,
}

impl ToolCall {
    /// A call of tool `name` with `arguments` (JSON text), under the model's `id`.
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// The arguments parsed as JSON.
    ///
    /// # Errors
    /// When the model's text is not JSON.
    pub fn parsed_arguments(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(&self.arguments)
    }
}

/// A tool call as the OpenAI API writes it.
#[derive(Serialize, Deserialize)]
struct WireToolCall {
    #[serde(default)]
    id: String,
    #[serde(rename = "type", default = "function")]
    kind: String,
    function: WireFunction,
}

#[derive(Serialize, Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: serde_json::Value,
}

fn function() -> String {
    "function".to_owned()
}

impl From<ToolCall> for WireToolCall {
    fn from(call: ToolCall) -> Self {
        WireToolCall {
            id: call.id,
            kind: function(),
            function: WireFunction {
                name: call.name,
                arguments: serde_json::Value::String(call.arguments),
            },
        }
    }
}

impl TryFrom<WireToolCall> for ToolCall {
    type Error = String;

    fn try_from(wire: WireToolCall) -> Result<Self, String> {
        if wire.kind != "function" {
            return Err(format!(
                "tool call of type `{}`: only function calls are read",
                wire.kind
            ));
        }
        let arguments = match wire.function.arguments {
            serde_json::Value::String(text) => text,
            serde_json::Value::Null => String::new(),
            value => value.to_string(),
        };
        Ok(ToolCall {
            id: wire.id,
            name: wire.function.name,
            arguments,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_tool_call_is_written_as_the_openai_api_writes_it() {
        let call = ToolCall::new("call_1", "refund", r#"{"order":17}"#);
        let json = serde_json::to_value(&call).unwrap();
        assert_eq!(
            json,
            json!({"id": "call_1", "type": "function", "function": {"name": "refund", "arguments": "{\"order\":17}"}})
        );
        assert_eq!(serde_json::from_value::<ToolCall>(json).unwrap(), call);
        assert_eq!(call.parsed_arguments().unwrap(), json!({"order": 17}));
    }

    #[test]
    fn arguments_given_as_an_object_are_read_as_their_json_text() {
        let call: ToolCall =
            serde_json::from_value(json!({"function": {"name": "refund", "arguments": {"order": 17}}})).unwrap();
        assert_eq!(call, ToolCall::new("", "refund", r#"{"order":17}"#));
    }

    #[test]
    fn a_call_of_another_type_is_refused() {
        let error = serde_json::from_value::<ToolCall>(
            json!({"id": "x", "type": "custom", "function": {"name": "f", "arguments": ""}}),
        )
        .unwrap_err();
        assert!(error.to_string().contains("custom"), "{error}");
    }
}
