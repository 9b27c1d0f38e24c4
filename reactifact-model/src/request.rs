//! What a produce asks a model: [`ChatRequest`], its [`Message`]s, the [`Tool`]s it offers and
//! the [`ToolChoice`].
//!
//! Every type serializes as the OpenAI chat completions API expects it, and that one encoding
//! is also what a recorded call hashes: the fields are in a fixed order and there are no maps
//! with a random order (a tool's `parameters` is a `serde_json::Value`, whose objects keep
//! their keys sorted, or in insertion order with serde_json's `preserve_order`), so equal
//! requests encode to equal bytes.

use serde::{Deserialize, Serialize};

use crate::tool_call::ToolCall;

/// A chat completions request: the model, the conversation, the tools the model may call.
///
/// Serialized as the body of `POST {base_url}/chat/completions`; optional fields that are not
/// set are left out. Build one with [`ChatRequest::new`] and the builder methods, or with a
/// struct literal.
///
/// ```
/// use reactifact_model::{ChatRequest, Tool};
/// use serde_json::json;
///
/// let request = ChatRequest::new("gpt-4o-mini")
///     .system("You are a support agent.")
///     .user("Please refund order 17.")
///     .tool(Tool::new(
///         "refund",
///         "Refund an order in full.",
///         json!({"type": "object", "properties": {"order": {"type": "integer"}}, "required": ["order"]}),
///     ))
///     .max_tokens(300);
/// assert_eq!(request.messages.len(), 2);
/// ```
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// The model's name, as the server knows it (`gpt-4o-mini`, `llama3.1`).
    pub model: String,
    /// The conversation so far, oldest first.
    pub messages: Vec<Message>,
    /// The tools the model may ask to call (left out of the body when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// Whether and which tool the model must call (the server's default, `auto` when there
    /// are tools, when `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// The most tokens the answer may have (`max_tokens`; the server's default when `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The sampling temperature (the server's default when `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
}

impl ChatRequest {
    /// A request to `model` with no message yet, no tools, and the server's defaults.
    pub fn new(model: impl Into<String>) -> Self {
        ChatRequest {
            model: model.into(),
            messages: Vec::new(),
            tools: Vec::new(),
            tool_choice: None,
            max_tokens: None,
            temperature: None,
        }
    }

    /// The request with `message` appended.
    pub fn message(mut self, message: Message) -> Self {
        self.messages.push(message);
        self
    }

    /// The request with a system message appended.
    pub fn system(self, content: impl Into<String>) -> Self {
        self.message(Message::system(content))
    }

    /// The request with a user message appended.
    pub fn user(self, content: impl Into<String>) -> Self {
        self.message(Message::user(content))
    }

    /// The request with `tool` offered to the model.
    pub fn tool(mut self, tool: Tool) -> Self {
        self.tools.push(tool);
        self
    }

    /// The request with its [`tool_choice`](ChatRequest::tool_choice) set.
    pub fn tool_choice(mut self, choice: ToolChoice) -> Self {
        self.tool_choice = Some(choice);
        self
    }

    /// The request with its [`max_tokens`](ChatRequest::max_tokens) set.
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    /// The request with its [`temperature`](ChatRequest::temperature) set.
    pub fn temperature(mut self, temperature: f32) -> Self {
        self.temperature = Some(temperature);
        self
    }
}

/// One message of a conversation, tagged by its `role` as the OpenAI API writes it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// Instructions for the task: `{"role": "system", "content": …}`.
    System {
        /// The instructions.
        content: String,
    },
    /// What the user says: `{"role": "user", "content": …}`.
    User {
        /// The text.
        content: String,
    },
    /// What the model answered earlier: text, tool calls, or both
    /// (`{"role": "assistant", "content": …, "tool_calls": […]}`; an absent part is left out).
    /// [`ChatAnswer::message`](crate::ChatAnswer::message) makes one from an answer.
    Assistant {
        /// The text, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        /// The tool calls the model asked for, if any.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call: `{"role": "tool", "tool_call_id": …, "content": …}`.
    Tool {
        /// The [`ToolCall::id`] this answers.
        tool_call_id: String,
        /// The result, as text (often JSON).
        content: String,
    },
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message::System {
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message::User {
            content: content.into(),
        }
    }

    /// An assistant message with text only.
    pub fn assistant(content: impl Into<String>) -> Self {
        Message::Assistant {
            content: Some(content.into()),
            tool_calls: Vec::new(),
        }
    }

    /// The result of the tool call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message::Tool {
            tool_call_id: tool_call_id.into(),
            content: content.into(),
        }
    }
}

/// A tool the model may ask to call: a function with a name, a description and a JSON schema
/// of its parameters.
///
/// Serialized as the OpenAI API expects:
/// `{"type": "function", "function": {"name": …, "description": …, "parameters": {…}}}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(into = "WireTool", try_from = "WireTool")]
pub struct Tool {
    /// The tool's name, which the model's [`ToolCall::name`] repeats (`^[a-zA-Z0-9_-]{1,64}$`
    /// for OpenAI).
    pub name: String,
    /// What the tool does, for the model to decide when to call it.
    pub description: String,
    /// The JSON schema of the arguments (an object schema).
    pub parameters: serde_json::Value,
}

impl Tool {
    /// A tool named `name`, described by `description`, whose arguments follow the JSON schema
    /// `parameters`.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: serde_json::Value) -> Self {
        Tool {
            name: name.into(),
            description: description.into(),
            parameters,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct WireTool {
    #[serde(rename = "type")]
    kind: String,
    function: WireFunction,
}

#[derive(Serialize, Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    parameters: serde_json::Value,
}

impl From<Tool> for WireTool {
    fn from(tool: Tool) -> Self {
        WireTool {
            kind: "function".to_owned(),
            function: WireFunction {
                name: tool.name,
                description: tool.description,
                parameters: tool.parameters,
            },
        }
    }
}

impl TryFrom<WireTool> for Tool {
    type Error = String;

    fn try_from(wire: WireTool) -> Result<Self, String> {
        if wire.kind != "function" {
            return Err(format!("tool of type `{}`: only function tools are read", wire.kind));
        }
        Ok(Tool {
            name: wire.function.name,
            description: wire.function.description,
            parameters: wire.function.parameters,
        })
    }
}

/// Whether the model must call a tool, and which.
///
/// Serialized as the OpenAI API expects: `"auto"`, `"none"`, `"required"`, or
/// `{"type": "function", "function": {"name": …}}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(into = "WireChoice", try_from = "WireChoice")]
pub enum ToolChoice {
    /// The model decides whether to call tools.
    Auto,
    /// The model calls no tool.
    None,
    /// The model calls at least one tool.
    Required,
    /// The model calls the tool of this name.
    Function(String),
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum WireChoice {
    Mode(String),
    Function {
        #[serde(rename = "type")]
        kind: String,
        function: Named,
    },
}

#[derive(Serialize, Deserialize)]
struct Named {
    name: String,
}

impl From<ToolChoice> for WireChoice {
    fn from(choice: ToolChoice) -> Self {
        match choice {
            ToolChoice::Auto => WireChoice::Mode("auto".to_owned()),
            ToolChoice::None => WireChoice::Mode("none".to_owned()),
            ToolChoice::Required => WireChoice::Mode("required".to_owned()),
            ToolChoice::Function(name) => WireChoice::Function {
                kind: "function".to_owned(),
                function: Named { name },
            },
        }
    }
}

impl TryFrom<WireChoice> for ToolChoice {
    type Error = String;

    fn try_from(wire: WireChoice) -> Result<Self, String> {
        match wire {
            WireChoice::Mode(mode) => match mode.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                other => Err(format!("unknown tool choice `{other}`")),
            },
            WireChoice::Function { kind, function } if kind == "function" => Ok(ToolChoice::Function(function.name)),
            WireChoice::Function { kind, .. } => Err(format!("tool choice of type `{kind}`: only functions are read")),
        }
    }
}
