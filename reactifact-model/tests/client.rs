//! The client against the stand-in server: answers, tool calls, usage, retries and what is
//! not retried, broken answers, and the JSON the server receives.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reactifact_model::stand_in::{Reply, StandIn};
use reactifact_model::{
    ChatAnswer, ChatClient, ChatRequest, FinishReason, Message, ModelError, RetryPolicy, TokenUsage, Tool, ToolCall,
    ToolChoice,
};
use serde_json::json;
use tokio::time::Instant;

fn assert_send<T: Send>(value: T) -> T {
    value
}

fn request() -> ChatRequest {
    ChatRequest::new("small-model")
        .system("Classify the ticket.")
        .user("I was charged twice \"again\"\nplease help")
        .max_tokens(8)
}

/// A client of `server` whose attempts have no timeout, so that under tokio's paused clock
/// only the retries' waits are timers.
fn client(server: &StandIn) -> ChatClient {
    ChatClient::new(server.base_url(), Some("sk-test".into()))
        .unwrap()
        .with_timeout(Duration::MAX)
}

/// A stand-in that answers with `replies` in turn, then with the last one again.
async fn scripted(replies: Vec<Reply>) -> StandIn {
    StandIn::start(move |index, _| replies[(index as usize).min(replies.len() - 1)].clone())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_text_answer_with_its_usage() {
    let server = scripted(vec![Reply::text("billing", 31, 1)]).await;
    let answer = assert_send(client(&server).complete(&request())).await.unwrap();
    assert_eq!(
        answer,
        ChatAnswer {
            content: Some("billing".into()),
            tool_calls: Vec::new(),
            finish_reason: Some(FinishReason::Stop),
            usage: TokenUsage {
                prompt_tokens: 31,
                completion_tokens: 1
            },
        }
    );
    assert_eq!(answer.text(), "billing");
    assert_eq!(answer.metered(), reactifact_core::runtime::Usage::tokens(31, 1));
    assert_eq!(server.requests(), 1);
    let received = &server.received()[0];
    assert_eq!(received.authorization.as_deref(), Some("Bearer sk-test"));
    assert_eq!(
        received.body,
        json!({
            "model": "small-model",
            "messages": [
                {"role": "system", "content": "Classify the ticket."},
                {"role": "user", "content": "I was charged twice \"again\"\nplease help"},
            ],
            "max_tokens": 8,
        })
    );
}

#[tokio::test]
async fn an_answer_without_usage_counts_no_tokens_and_no_key_sends_no_authorization() {
    let server = scripted(vec![Reply::status(
        200,
        r#"{"choices":[{"message":{"role":"assistant","content":"hi"}}]}"#,
    )])
    .await;
    let client = ChatClient::new(format!("{}/", server.base_url()), None).unwrap();
    let answer = client.complete(&request()).await.unwrap();
    assert_eq!(answer.usage, TokenUsage::default());
    assert_eq!(answer.finish_reason, None);
    assert_eq!(server.received()[0].authorization, None);
}

fn refund_tool() -> Tool {
    Tool::new(
        "refund",
        "Refund an order in full.",
        json!({"type": "object", "properties": {"order": {"type": "integer"}}, "required": ["order"]}),
    )
}

#[tokio::test]
async fn tool_calls_are_parsed_and_the_conversation_is_sent_as_openai_expects() {
    let calls = vec![
        ToolCall::new("call_a", "refund", r#"{"order": 17}"#),
        ToolCall::new("call_b", "lookup", r#"{"customer":"ada"}"#),
    ];
    let server = scripted(vec![
        Reply::tool_calls(calls.clone(), 80, 24),
        Reply::text("Refunded.", 120, 2),
    ])
    .await;
    let client = client(&server);
    let mut ask = ChatRequest::new("gpt-test")
        .system("You are a support agent.")
        .user("Refund order 17.")
        .tool(refund_tool())
        .tool(Tool::new("lookup", "Look a customer up.", json!({"type": "object"})))
        .tool_choice(ToolChoice::Auto)
        .temperature(0.0);

    let first = client.complete(&ask).await.unwrap();
    assert_eq!(first.content, None);
    assert_eq!(first.tool_calls, calls);
    assert_eq!(first.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(
        first.usage,
        TokenUsage {
            prompt_tokens: 80,
            completion_tokens: 24
        }
    );
    assert_eq!(first.tool_calls[0].parsed_arguments().unwrap(), json!({"order": 17}));

    ask.messages.push(first.message());
    ask.messages.push(Message::tool("call_a", r#"{"refunded":true}"#));
    ask.messages.push(Message::tool("call_b", "ada@example.com"));
    let second = client.complete(&ask).await.unwrap();
    assert_eq!(second.text(), "Refunded.");

    let received = server.received();
    assert_eq!(received.len(), 2);
    let tools = json!([
        {"type": "function", "function": {
            "name": "refund",
            "description": "Refund an order in full.",
            "parameters": {"type": "object", "properties": {"order": {"type": "integer"}}, "required": ["order"]},
        }},
        {"type": "function", "function": {"name": "lookup", "description": "Look a customer up.", "parameters": {"type": "object"}}},
    ]);
    assert_eq!(
        received[0].body,
        json!({
            "model": "gpt-test",
            "messages": [
                {"role": "system", "content": "You are a support agent."},
                {"role": "user", "content": "Refund order 17."},
            ],
            "tools": tools,
            "tool_choice": "auto",
            "temperature": 0.0,
        })
    );
    assert_eq!(
        received[1].body["messages"],
        json!([
            {"role": "system", "content": "You are a support agent."},
            {"role": "user", "content": "Refund order 17."},
            {"role": "assistant", "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "refund", "arguments": "{\"order\": 17}"}},
                {"id": "call_b", "type": "function", "function": {"name": "lookup", "arguments": "{\"customer\":\"ada\"}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_a", "content": "{\"refunded\":true}"},
            {"role": "tool", "tool_call_id": "call_b", "content": "ada@example.com"},
        ])
    );
}

#[test]
fn tool_choices_are_written_as_openai_expects() {
    for (choice, expected) in [
        (ToolChoice::Auto, json!("auto")),
        (ToolChoice::None, json!("none")),
        (ToolChoice::Required, json!("required")),
        (
            ToolChoice::Function("refund".into()),
            json!({"type": "function", "function": {"name": "refund"}}),
        ),
    ] {
        assert_eq!(serde_json::to_value(&choice).unwrap(), expected);
        assert_eq!(serde_json::from_value::<ToolChoice>(expected).unwrap(), choice);
    }
    assert!(serde_json::from_value::<ToolChoice>(json!("sometimes")).is_err());
}

#[test]
fn a_request_round_trips_and_equal_requests_encode_to_equal_bytes() {
    let build = || {
        ChatRequest::new("m")
            .system("s")
            .user("u")
            .message(Message::Assistant {
                content: Some("thinking".into()),
                tool_calls: vec![ToolCall::new("c1", "refund", r#"{"order":1}"#)],
            })
            .message(Message::tool("c1", "done"))
            .tool(refund_tool())
            .tool_choice(ToolChoice::Function("refund".into()))
            .max_tokens(10)
            .temperature(0.5)
    };
    let request = build();
    // As a recorded call encodes it (rmp-serde, named fields), and as JSON.
    let packed = rmp_serde::to_vec_named(&request).unwrap();
    assert_eq!(packed, rmp_serde::to_vec_named(&build()).unwrap());
    assert_eq!(rmp_serde::from_slice::<ChatRequest>(&packed).unwrap(), request);
    let json = serde_json::to_string(&request).unwrap();
    assert_eq!(json, serde_json::to_string(&build()).unwrap());
    assert_eq!(serde_json::from_str::<ChatRequest>(&json).unwrap(), request);
    // The answer too round-trips as a recorded call keeps it.
    let answer = ChatAnswer {
        content: None,
        tool_calls: vec![ToolCall::new("c1", "refund", r#"{"order":1}"#)],
        finish_reason: Some(FinishReason::Other("eos".into())),
        usage: TokenUsage {
            prompt_tokens: 3,
            completion_tokens: 4,
        },
    };
    let packed = rmp_serde::to_vec_named(&answer).unwrap();
    assert_eq!(rmp_serde::from_slice::<ChatAnswer>(&packed).unwrap(), answer);
}

#[tokio::test(start_paused = true)]
async fn a_429_is_retried_after_its_retry_after_then_succeeds() {
    let server = scripted(vec![
        Reply::status(429, r#"{"error":{"message":"slow down"}}"#).header("retry-after", "7"),
        Reply::text("billing", 10, 1),
    ])
    .await;
    let started = Instant::now();
    let answer = client(&server).complete(&request()).await.unwrap();
    assert_eq!(answer.text(), "billing");
    assert_eq!(server.requests(), 2);
    // The first backoff is 1 s; the answer asked for 7.
    assert!(started.elapsed() >= Duration::from_secs(7), "{:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_beyond_the_cap_fails_at_once() {
    let server = scripted(vec![
        Reply::status(429, "quota").header("retry-after", "3600"),
        Reply::text("never asked", 1, 1),
    ])
    .await;
    let started = Instant::now();
    let error = client(&server).complete(&request()).await.unwrap_err();
    assert!(
        matches!(&error, ModelError::Status { status: 429, retry_after: Some(d), .. } if *d == Duration::from_secs(3600)),
        "{error}"
    );
    assert_eq!(server.requests(), 1);
    assert_eq!(started.elapsed(), Duration::ZERO);

    // A higher cap waits for it.
    let server = scripted(vec![
        Reply::status(503, "busy").header("retry-after", "3600"),
        Reply::text("after an hour", 1, 1),
    ])
    .await;
    let patient = client(&server).with_retry(RetryPolicy::default().max_retry_after(Duration::from_secs(7200)));
    assert_eq!(patient.complete(&request()).await.unwrap().text(), "after an hour");
    assert!(started.elapsed() >= Duration::from_secs(3600));
}

#[tokio::test(start_paused = true)]
async fn server_errors_are_retried_with_a_backoff_that_doubles_until_the_attempts_run_out() {
    let server = scripted(vec![
        Reply::status(500, "oops"),
        Reply::status(502, "bad gateway"),
        Reply::text("third time", 1, 1),
    ])
    .await;
    let started = Instant::now();
    assert_eq!(client(&server).complete(&request()).await.unwrap().text(), "third time");
    assert_eq!(server.requests(), 3);
    assert_eq!(started.elapsed().as_secs(), 3, "1 s, then 2 s");

    let server = scripted(vec![Reply::status(503, "down for good")]).await;
    let started = Instant::now();
    let error = client(&server).complete(&request()).await.unwrap_err();
    assert!(
        matches!(&error, ModelError::Status { status: 503, body, .. } if body == "down for good"),
        "{error}"
    );
    assert!(error.is_retryable());
    assert_eq!(server.requests(), 4, "the default is 4 attempts");
    assert_eq!(started.elapsed().as_secs(), 7, "1 + 2 + 4 s");

    let server = scripted(vec![Reply::status(500, "oops")]).await;
    let once = client(&server).with_retry(RetryPolicy::none());
    once.complete(&request()).await.unwrap_err();
    assert_eq!(server.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_bad_request_is_not_retried() {
    for status in [400, 401, 404, 422] {
        let server = scripted(vec![Reply::status(status, "bad model"), Reply::text("no", 1, 1)]).await;
        let error = client(&server).complete(&request()).await.unwrap_err();
        assert!(
            matches!(&error, ModelError::Status { status: s, .. } if *s == status),
            "{error}"
        );
        assert!(!error.is_retryable());
        assert!(error.to_string().contains("bad model"), "{error}");
        assert_eq!(server.requests(), 1, "{status}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_connection_is_a_transport_error_and_retried() {
    let server = scripted(vec![Reply::dropped(), Reply::text("back", 1, 1)]).await;
    assert_eq!(client(&server).complete(&request()).await.unwrap().text(), "back");
    assert_eq!(server.requests(), 2);

    let server = scripted(vec![Reply::dropped()]).await;
    let error = client(&server)
        .with_retry(RetryPolicy::none())
        .complete(&request())
        .await
        .unwrap_err();
    assert!(matches!(error, ModelError::Transport { .. }), "{error}");
    assert!(error.is_retryable());
}

#[tokio::test(start_paused = true)]
async fn a_success_that_is_not_a_chat_completion_is_malformed_and_not_retried() {
    for body in [
        "<html>gateway</html>",
        "",
        "{\"choices\":[]}",
        "{\"object\":\"chat.completion\"}",
    ] {
        let server = scripted(vec![Reply::status(200, body)]).await;
        let error = client(&server).complete(&request()).await.unwrap_err();
        assert!(matches!(error, ModelError::Malformed { .. }), "{body}: {error}");
        assert!(!error.is_retryable());
        assert_eq!(server.requests(), 1, "{body}");
    }
}

#[tokio::test]
async fn an_oversized_answer_is_malformed_and_an_error_body_is_cut_to_its_start() {
    let huge = Reply::text("a".repeat(5 << 20), 1, 1);
    let server = scripted(vec![huge]).await;
    let error = client(&server).complete(&request()).await.unwrap_err();
    assert!(matches!(error, ModelError::Malformed { .. }), "{error}");
    assert!(error.to_string().contains("larger than"), "{error}");

    let server = scripted(vec![Reply::status(400, "x".repeat(100_000))]).await;
    let ModelError::Status { body, .. } = client(&server).complete(&request()).await.unwrap_err() else {
        panic!("a status error");
    };
    assert_eq!(body, "x".repeat(512));
}

#[tokio::test(start_paused = true)]
async fn a_server_that_never_answers_times_out_as_transport() {
    let server = scripted(vec![Reply::never()]).await;
    let client = client(&server)
        .with_timeout(Duration::from_secs(30))
        .with_retry(RetryPolicy::none());
    let started = Instant::now();
    let error = client.complete(&request()).await.unwrap_err();
    assert!(matches!(error, ModelError::Transport { .. }), "{error}");
    assert!(error.to_string().contains("no answer within 30s"), "{error}");
    assert!(started.elapsed() >= Duration::from_secs(30));
}

#[tokio::test]
async fn an_unreachable_server_is_a_transport_error_naming_it() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = ChatClient::new(format!("http://user:pw@{addr}/v1?key=s3cret"), Some("sk-s3cret".into()))
        .unwrap()
        .with_retry(RetryPolicy::none());
    let error = client.complete(&request()).await.unwrap_err();
    assert!(matches!(error, ModelError::Transport { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains(&addr.to_string()), "{message}");
    assert!(!message.contains("s3cret") && !message.contains("pw@"), "{message}");
}

#[tokio::test]
async fn the_stand_in_counts_what_it_received_and_refuses_what_is_not_a_chat_request() {
    let asked = Arc::new(AtomicU64::new(0));
    let seen = asked.clone();
    let server = StandIn::start(move |_, _| {
        seen.fetch_add(1, Ordering::SeqCst);
        Reply::text("ok", 1, 1)
    })
    .await
    .unwrap();
    client(&server).complete(&request()).await.unwrap();

    // Another process reads the count over HTTP; a body that is no chat request is counted
    // and answered 400 without asking the function.
    let http = reqwest::Client::new();
    let refused = http
        .post(format!("{}/chat/completions", server.base_url()))
        .body("{\"messages\": 3}")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let count: serde_json::Value = serde_json::from_slice(
        &http
            .get(format!("http://{}/requests", server.addr()))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(count, json!({"requests": 2}));
    assert_eq!(server.requests(), 2);
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(server.received()[1].index, 1);
}
