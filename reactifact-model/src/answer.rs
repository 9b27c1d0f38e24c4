//! What a model answers: [`ChatAnswer`], with its [`FinishReason`] and [`TokenUsage`], and how
//! a chat completions body is read into one.

use reactifact_core::runtime::Usage;
use serde::{Deserialize, Serialize};

use crate::request::Message;
use crate::tool_call::ToolCall;

/// A model's answer to a [`ChatRequest`](crate::ChatRequest): the first choice's text and
/// tool calls, why the model stopped, and the tokens it counted.
///
/// Plain data that round-trips through serde, so a recorded call keeps it in the run's record
/// and a retry, a resume or a replay gets it back.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct ChatAnswer {
    /// The text, if the model wrote any (a model that only calls tools often writes none).
    pub content: Option<String>,
    /// The tools the model asks to call, in its order (empty if none).
    pub tool_calls: Vec<ToolCall>,
    /// Why the model stopped, if the server said.
    pub finish_reason: Option<FinishReason>,
    /// The tokens the request and the answer used, as the server counted them.
    pub usage: TokenUsage,
}

impl ChatAnswer {
    /// The text, or `""` if there is none.
    pub fn text(&self) -> &str {
        self.content.as_deref().unwrap_or("")
    }

    /// The answer as the assistant message that continues the conversation (its text and tool
    /// calls), to append to the request before the tool results.
    pub fn message(&self) -> Message {
        Message::Assistant {
            content: self.content.clone(),
            tool_calls: self.tool_calls.clone(),
        }
    }

    /// The answer's usage as the runtime meters it: [`Usage::tokens`] of the prompt and the
    /// completion tokens, no cost.
    pub fn metered(&self) -> Usage {
        Usage::tokens(self.usage.prompt_tokens, self.usage.completion_tokens)
    }
}

/// The tokens one completion used, as the server counted them; 0 where the server did not say.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TokenUsage {
    /// Tokens of the request (`usage.prompt_tokens`).
    pub prompt_tokens: u64,
    /// Tokens of the answer (`usage.completion_tokens`).
    pub completion_tokens: u64,
}

/// Why the model stopped writing (`finish_reason`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(from = "String", into = "String")]
pub enum FinishReason {
    /// It finished (`stop`).
    Stop,
    /// It reached `max_tokens` (`length`).
    Length,
    /// It asks to call tools (`tool_calls`; also the older `function_call`).
    ToolCalls,
    /// The server's content filter cut it (`content_filter`).
    ContentFilter,
    /// A reason this client does not know, as the server wrote it.
    Other(String),
}

impl FinishReason {
    /// The reason as the OpenAI API writes it.
    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Other(other) => other,
        }
    }
}

impl From<String> for FinishReason {
    fn from(reason: String) -> Self {
        match reason.as_str() {
            "stop" => FinishReason::Stop,
            "length" => FinishReason::Length,
            "tool_calls" | "function_call" => FinishReason::ToolCalls,
            "content_filter" => FinishReason::ContentFilter,
            _ => FinishReason::Other(reason),
        }
    }
}

impl From<FinishReason> for String {
    fn from(reason: FinishReason) -> Self {
        match reason {
            FinishReason::Other(other) => other,
            known => known.as_str().to_owned(),
        }
    }
}

/// A chat completions body, the parts of it this client reads (the stand-in writes it too).
#[derive(Serialize, Deserialize)]
pub(crate) struct WireAnswer {
    pub(crate) choices: Vec<WireChoice>,
    #[serde(default)]
    pub(crate) usage: Option<WireUsage>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct WireChoice {
    pub(crate) message: WireMessage,
    #[serde(default)]
    pub(crate) finish_reason: Option<String>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct WireMessage {
    pub(crate) role: Option<String>,
    #[serde(default)]
    pub(crate) content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tool_calls: Option<Vec<ToolCall>>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    pub(crate) prompt_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) completion_tokens: Option<u64>,
}

impl WireAnswer {
    /// The body the OpenAI API would write for `answer`.
    #[cfg_attr(not(feature = "stand-in"), allow(dead_code))]
    pub(crate) fn of(answer: &ChatAnswer) -> Self {
        WireAnswer {
            choices: vec![WireChoice {
                message: WireMessage {
                    role: Some("assistant".to_owned()),
                    content: answer.content.clone(),
                    tool_calls: (!answer.tool_calls.is_empty()).then(|| answer.tool_calls.clone()),
                },
                finish_reason: answer.finish_reason.clone().map(String::from),
            }],
            usage: Some(WireUsage {
                prompt_tokens: Some(answer.usage.prompt_tokens),
                completion_tokens: Some(answer.usage.completion_tokens),
            }),
        }
    }
}

/// A 2xx body as an answer: the first choice; `Err` with the reason when it is not a chat
/// completion or has no choice.
pub(crate) fn parse(body: &[u8]) -> Result<ChatAnswer, String> {
    let answer: WireAnswer = serde_json::from_slice(body).map_err(|error| format!("not a chat completion: {error}"))?;
    let choice = answer
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| "the answer has no choice".to_owned())?;
    let usage = answer.usage.map_or(TokenUsage::default(), |usage| TokenUsage {
        prompt_tokens: usage.prompt_tokens.unwrap_or(0),
        completion_tokens: usage.completion_tokens.unwrap_or(0),
    });
    Ok(ChatAnswer {
        content: choice.message.content,
        tool_calls: choice.message.tool_calls.unwrap_or_default(),
        finish_reason: choice.finish_reason.map(FinishReason::from),
        usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_or_are_malformed() {
        let full =
            br#"{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"bug"},"finish_reason":"stop"},
            {"message":{"content":"other"}}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}"#;
        assert_eq!(
            parse(full).unwrap(),
            ChatAnswer {
                content: Some("bug".into()),
                tool_calls: Vec::new(),
                finish_reason: Some(FinishReason::Stop),
                usage: TokenUsage {
                    prompt_tokens: 12,
                    completion_tokens: 1
                },
            }
        );
        let no_usage = br#"{"choices":[{"message":{"content":"hi"}}]}"#;
        assert_eq!(parse(no_usage).unwrap().usage, TokenUsage::default());
        let null_usage = br#"{"choices":[{"message":{"content":"hi"}}],"usage":null}"#;
        assert_eq!(parse(null_usage).unwrap().usage, TokenUsage::default());
        let tools_only = br#"{"choices":[{"message":{"content":null,"tool_calls":null}}]}"#;
        assert_eq!(parse(tools_only).unwrap(), ChatAnswer::default());
        for garbage in [
            &b"<html>oops</html>"[..],
            b"",
            b"[]",
            br#"{"choices":[]}"#,
            br#"{"choices":null}"#,
            br#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":-1}}"#,
            br#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1e400}}"#,
            br#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":18446744073709551616}}"#,
            br#"{"choices":[{"message":{"tool_calls":[{"id":"1","type":"function"}]}}]}"#,
        ] {
            assert!(parse(garbage).is_err(), "{}", String::from_utf8_lossy(garbage));
        }
    }

    #[test]
    fn finish_reasons_keep_what_they_do_not_know() {
        for (text, reason) in [
            ("stop", FinishReason::Stop),
            ("length", FinishReason::Length),
            ("tool_calls", FinishReason::ToolCalls),
            ("content_filter", FinishReason::ContentFilter),
            ("eos", FinishReason::Other("eos".into())),
        ] {
            assert_eq!(FinishReason::from(text.to_owned()), reason);
            assert_eq!(String::from(reason), text);
        }
        assert_eq!(FinishReason::from("function_call".to_owned()), FinishReason::ToolCalls);
    }
}
