//! The support-agent example's model clients: the deterministic stand-in, and
//! reactifact-model's `ChatClient` as a `Model`, against its stand-in server.

use std::sync::Arc;

use reactifact_examples::support::{
    draft_request, triage_request, Category, Completion, CompletionRequest, Model, ModelError, StandIn, DRAFT_SYSTEM,
    TRIAGE_SYSTEM,
};

fn assert_send<T: Send>(value: T) -> T {
    value
}

async fn complete(model: &dyn Model, request: &CompletionRequest) -> Result<Completion, ModelError> {
    assert_send(model.complete(request)).await
}

#[tokio::test]
async fn the_stand_in_triages_by_keywords() {
    let model = StandIn::new();
    let cases = [
        ("Please refund my last order", Category::Billing),
        ("I was CHARGED twice this month", Category::Billing),
        ("The app crashes when I open settings", Category::Bug),
        ("Error 500 on the checkout page", Category::Bug),
        ("I forgot my password", Category::Account),
        ("Login does not accept my email", Category::Account),
        ("What are your opening hours?", Category::General),
        // The rules have an order: billing before bug before account.
        ("The refund page shows an error after login", Category::Billing),
        ("Crash after I reset my password", Category::Bug),
    ];
    for (ticket, category) in cases {
        let answer = complete(&model, &triage_request("any", ticket)).await.unwrap();
        assert_eq!(answer.text, category.as_str(), "{ticket}");
        assert_eq!(Category::parse(&answer.text), Some(category), "{ticket}");
        assert_eq!(answer.tokens_out, 1);
        let words = TRIAGE_SYSTEM.split_whitespace().count() + ticket.split_whitespace().count();
        assert_eq!(answer.tokens_in, words as u64, "{ticket}");
    }
    assert_eq!(model.calls(), cases.len() as u64);
}

#[tokio::test]
async fn the_stand_in_is_a_pure_function_of_the_request() {
    let first = StandIn::new();
    let second = StandIn::new();
    let ticket = "Refund please\nI was charged twice for order 17.";
    for request in [
        triage_request("a", ticket),
        draft_request("a", Category::Billing, ticket),
        draft_request("a", Category::General, ticket),
    ] {
        let one = complete(&first, &request).await.unwrap();
        let again = complete(&first, &request).await.unwrap();
        let elsewhere = complete(&second, &request).await.unwrap();
        assert_eq!(one, again);
        assert_eq!(one, elsewhere);
        assert_eq!(Ok(one), StandIn::answer(&request));
    }
    assert_eq!(first.calls(), 6);
    assert_eq!(second.calls(), 3);
}

#[tokio::test]
async fn the_stand_in_drafts_from_the_named_category_and_the_first_line() {
    let model = StandIn::new();
    let ticket = "\n  Charged twice for order 17  \nPlease look into it.";
    let billing = complete(&model, &draft_request("a", Category::Billing, ticket))
        .await
        .unwrap();
    assert!(
        billing.text.contains("\"Charged twice for order 17\""),
        "{}",
        billing.text
    );
    assert!(billing.text.contains("refund"), "{}", billing.text);
    assert!(!billing.text.contains("Please look into it"), "{}", billing.text);
    assert_eq!(billing.tokens_out, billing.text.split_whitespace().count() as u64);

    // The category comes from the prompt's first line, not from the ticket's words.
    let account = complete(&model, &draft_request("a", Category::Account, ticket))
        .await
        .unwrap();
    assert!(account.text.contains("password"), "{}", account.text);
    assert_ne!(billing.text, account.text);

    // Without a category line the stand-in classifies the prompt itself.
    let request = CompletionRequest {
        model: "a".into(),
        system: DRAFT_SYSTEM.into(),
        prompt: "The app crashes on start".into(),
        max_tokens: 300,
    };
    let bug = complete(&model, &request).await.unwrap();
    assert!(bug.text.contains("\"The app crashes on start\""), "{}", bug.text);
    assert!(bug.text.contains("engineers"), "{}", bug.text);

    // A long first line is quoted in part; a ticket of blank lines has no line to quote.
    let long = format!("{}\nmore", "é".repeat(200));
    let answer = complete(&model, &draft_request("a", Category::General, &long))
        .await
        .unwrap();
    assert!(
        answer.text.contains(&format!("\"{}…\"", "é".repeat(80))),
        "{}",
        answer.text
    );
    let answer = complete(&model, &draft_request("a", Category::General, "\n \n"))
        .await
        .unwrap();
    assert!(answer.text.contains("about your ticket."), "{}", answer.text);
}

#[tokio::test]
async fn the_stand_in_cuts_the_answer_at_max_tokens() {
    let model = StandIn::new();
    let mut request = draft_request("a", Category::General, "Hello there");
    request.max_tokens = 3;
    let answer = complete(&model, &request).await.unwrap();
    assert_eq!(answer.text, "Hello,\n\nThank you");
    assert_eq!(answer.tokens_out, 3);
    request.max_tokens = 0;
    let answer = complete(&model, &request).await.unwrap();
    assert_eq!((answer.text.as_str(), answer.tokens_out), ("", 0));
}

#[tokio::test]
async fn the_stand_in_refuses_an_unknown_task_and_counts_the_call() {
    let model = StandIn::new();
    let request = CompletionRequest {
        model: "a".into(),
        system: "Write a poem.".into(),
        prompt: "About refunds".into(),
        max_tokens: 50,
    };
    let error = complete(&model, &request).await.unwrap_err();
    assert!(matches!(error, ModelError::Status { status: 400, .. }), "{error}");
    assert!(!error.is_retryable());
    assert_eq!(model.calls(), 1);
}

#[tokio::test]
async fn a_shared_model_is_a_model() {
    let shared: Arc<dyn Model> = Arc::new(StandIn::new());
    let again: Arc<Arc<dyn Model>> = Arc::new(shared.clone());
    let request = triage_request("a", "my password expired");
    assert_eq!(complete(&shared, &request).await.unwrap().text, "account");
    assert_eq!(complete(&again, &request).await.unwrap().text, "account");
}

#[test]
fn a_request_encodes_its_fields_in_a_fixed_order() {
    let request = triage_request("m", "hi");
    let json = serde_json::to_string(&request).unwrap();
    let expected = format!(
        r#"{{"model":"m","system":{},"prompt":"hi","max_tokens":8}}"#,
        serde_json::to_string(TRIAGE_SYSTEM).unwrap()
    );
    assert_eq!(json, expected);
    assert_eq!(serde_json::from_str::<CompletionRequest>(&json).unwrap(), request);
}

#[test]
fn categories_parse_what_a_model_answers() {
    assert_eq!(Category::parse("billing"), Some(Category::Billing));
    assert_eq!(Category::parse(" Bug.\n"), Some(Category::Bug));
    assert_eq!(Category::parse("ACCOUNT"), Some(Category::Account));
    assert_eq!(Category::parse("general"), Some(Category::General));
    assert_eq!(Category::parse("billing issue"), None);
    assert_eq!(Category::parse(""), None);
    assert_eq!(Category::parse("."), None);
    for category in Category::ALL {
        assert_eq!(Category::parse(category.as_str()), Some(category));
        let json = serde_json::to_string(&category).unwrap();
        assert_eq!(json, format!("\"{}\"", category.as_str()));
        assert_eq!(serde_json::from_str::<Category>(&json).unwrap(), category);
    }
}

// reactifact-model's `ChatClient` as a `Model`, against its stand-in server. The client itself
// (retries, errors, answers) is tested in reactifact-model.

use reactifact_model::stand_in::{Reply, StandIn as StandInServer};
use reactifact_model::{ChatClient, RetryPolicy};
use serde_json::json;

fn request() -> CompletionRequest {
    CompletionRequest {
        model: "small-model".into(),
        system: "Classify the ticket.".into(),
        prompt: "I was charged twice \"again\"\nplease help".into(),
        max_tokens: 8,
    }
}

/// A stand-in answering every request with `reply`, and a client of it that does not retry.
async fn serving(reply: Reply) -> (StandInServer, ChatClient) {
    let server = StandInServer::start(move |_, _| reply.clone()).await.unwrap();
    let client = ChatClient::new(server.base_url(), Some("sk-test".into()))
        .unwrap()
        .with_retry(RetryPolicy::none());
    (server, client)
}

#[tokio::test]
async fn the_adapter_posts_a_chat_completion_and_reads_the_answer() {
    let (server, client) = serving(Reply::text("billing", 31, 1)).await;
    let model: Arc<dyn Model> = Arc::new(client);
    let answer = complete(&model, &request()).await.unwrap();
    assert_eq!(
        answer,
        Completion {
            text: "billing".into(),
            tokens_in: 31,
            tokens_out: 1
        }
    );
    let received = server.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].authorization.as_deref(), Some("Bearer sk-test"));
    assert_eq!(
        received[0].body,
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
async fn the_adapter_keeps_the_status_and_whether_to_retry() {
    for (status, retryable) in [(429, true), (503, true), (400, false), (404, false)] {
        let (_server, client) = serving(Reply::status(status, "{\"error\":\"busy\"}")).await;
        let error = complete(&client, &request()).await.unwrap_err();
        assert_eq!(
            error,
            ModelError::Status {
                status,
                body: "{\"error\":\"busy\"}".into()
            }
        );
        assert_eq!(error.is_retryable(), retryable, "{error}");
    }
}

#[tokio::test]
async fn an_answer_without_text_or_that_is_no_chat_completion_is_malformed() {
    for reply in [
        Reply::tool_calls(vec![reactifact_model::ToolCall::new("c", "f", "{}")], 1, 1),
        Reply::status(200, "<html>gateway</html>"),
    ] {
        let (_server, client) = serving(reply).await;
        let error = complete(&client, &request()).await.unwrap_err();
        assert!(matches!(error, ModelError::Malformed(_)), "{error}");
        assert!(!error.is_retryable(), "{error}");
    }
}

#[tokio::test]
async fn a_broken_connection_is_a_retryable_transport_error_naming_the_endpoint() {
    let (server, client) = serving(Reply::dropped()).await;
    let error = complete(&client, &request()).await.unwrap_err();
    assert!(matches!(error, ModelError::Transport(_)), "{error}");
    assert!(error.is_retryable());
    assert!(error.to_string().contains(&server.addr().to_string()), "{error}");
}
