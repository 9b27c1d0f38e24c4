//! The webhook dispatcher against a real HTTP server on 127.0.0.1: what it sends and how each
//! answer is classified.

mod support;

use std::time::Duration;

use reactifact_core::DispatchError;
use reactifact_webhook::reqwest::StatusCode;
use reactifact_webhook::{BuildError, Classification, Outgoing, WebhookDispatcher, WebhookError};
use serde::Serialize;
use support::{Reply, Server};

#[derive(Serialize)]
struct Notify {
    customer: String,
    order: String,
    cents: u64,
}

fn payload() -> Vec<u8> {
    rmp_serde::to_vec_named(&Notify {
        customer: "ada".into(),
        order: "order:1".into(),
        cents: 1200,
    })
    .unwrap()
}

fn outgoing(payload: &[u8], attempt: u32) -> Outgoing<'_> {
    Outgoing {
        kind: "notify",
        key: "notify:order:1",
        attempt,
        payload,
        traceparent: None,
    }
}

/// Sends one attempt and returns the outcome as the outbox sees it.
async fn dispatch(dispatcher: &WebhookDispatcher, payload: &[u8], attempt: u32) -> Result<(), DispatchError> {
    dispatcher
        .send(outgoing(payload, attempt))
        .await
        .map_err(WebhookError::into_dispatch_error)
}

#[tokio::test]
async fn a_2xx_is_delivered_with_the_key_the_kind_and_a_json_body() {
    let server = Server::start(vec![Reply::status(204)]).await;
    let dispatcher = WebhookDispatcher::builder()
        .url(server.url("/hook"))
        .header("Authorization", "Bearer t0ken")
        .build()
        .unwrap();
    let payload = payload();
    dispatch(&dispatcher, &payload, 1).await.unwrap();

    let received = server.received();
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!((request.method.as_str(), request.path.as_str()), ("POST", "/hook"));
    assert_eq!(request.header("idempotency-key"), Some("notify:order:1"));
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(request.header("x-reactifact-kind"), Some("notify"));
    assert_eq!(request.header("x-reactifact-attempt"), Some("1"));
    assert_eq!(request.header("authorization"), Some("Bearer t0ken"));
    assert_eq!(
        request.json(),
        serde_json::json!({"customer": "ada", "order": "order:1", "cents": 1200})
    );
}

#[tokio::test]
async fn a_server_that_fails_twice_then_succeeds_gets_the_same_key_each_time() {
    let server = Server::start(vec![
        Reply::status(503).body("busy"),
        Reply::status(503).body("still busy"),
        Reply::status(200).body("ok"),
    ])
    .await;
    let dispatcher = WebhookDispatcher::new(server.url("/hook")).unwrap();
    let payload = payload();

    for attempt in 1..=2 {
        let error = dispatch(&dispatcher, &payload, attempt).await.unwrap_err();
        assert!(!error.is_permanent(), "attempt {attempt}: {error}");
        assert_eq!(error.retry_after_hint(), None);
        let message = error.to_string();
        assert!(message.contains(&server.url("/hook")), "{message}");
        assert!(message.contains("503"), "{message}");
        assert!(message.contains("busy"), "{message}");
    }
    dispatch(&dispatcher, &payload, 3).await.unwrap();

    let received = server.received();
    assert_eq!(received.len(), 3);
    for (i, request) in received.iter().enumerate() {
        assert_eq!(request.header("idempotency-key"), Some("notify:order:1"));
        assert_eq!(
            request.header("x-reactifact-attempt"),
            Some((i + 1).to_string().as_str())
        );
        assert_eq!(request.body, received[0].body);
    }
}

#[tokio::test]
async fn a_400_is_permanent_and_quotes_the_body() {
    let server = Server::start(vec![Reply::status(400).body("{\"error\": \"unknown customer\"}")]).await;
    let dispatcher = WebhookDispatcher::new(server.url("/hook")).unwrap();
    let error = dispatch(&dispatcher, &payload(), 1).await.unwrap_err();
    assert!(error.is_permanent(), "{error}");
    let webhook = error.as_error().downcast_ref::<WebhookError>().unwrap();
    assert_eq!(webhook.status().map(|s| s.as_u16()), Some(400));
    let message = error.to_string();
    assert!(message.contains("400"), "{message}");
    assert!(message.contains("unknown customer"), "{message}");
    assert!(!message.contains("ada"), "the payload is never quoted: {message}");
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_is_permanent() {
    let server = Server::start(vec![Reply::status(301).header("location", "/elsewhere")]).await;
    let dispatcher = WebhookDispatcher::new(server.url("/hook")).unwrap();
    let error = dispatch(&dispatcher, &payload(), 1).await.unwrap_err();
    assert!(error.is_permanent(), "{error}");
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_429_with_retry_after_is_retryable_with_that_delay() {
    let server = Server::start(vec![Reply::status(429).header("retry-after", "7")]).await;
    let dispatcher = WebhookDispatcher::new(server.url("/hook")).unwrap();
    let error = dispatch(&dispatcher, &payload(), 1).await.unwrap_err();
    assert!(!error.is_permanent(), "{error}");
    assert_eq!(error.retry_after_hint(), Some(Duration::from_secs(7)));
}

#[tokio::test]
async fn a_408_is_retryable() {
    let server = Server::start(vec![Reply::status(408)]).await;
    let dispatcher = WebhookDispatcher::new(server.url("/hook")).unwrap();
    let error = dispatch(&dispatcher, &payload(), 1).await.unwrap_err();
    assert!(!error.is_permanent(), "{error}");
}

#[tokio::test]
async fn a_refused_connection_is_retryable() {
    let url = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}/hook", listener.local_addr().unwrap())
    };
    let dispatcher = WebhookDispatcher::new(&url).unwrap();
    let error = dispatch(&dispatcher, &payload(), 1).await.unwrap_err();
    assert!(!error.is_permanent(), "{error}");
    let webhook = error.as_error().downcast_ref::<WebhookError>().unwrap();
    assert!(matches!(webhook, WebhookError::Connect { .. }), "{webhook}");
    assert!(error.to_string().contains(&url), "{error}");
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_as_retryable() {
    let server = Server::silent().await;
    let dispatcher = WebhookDispatcher::builder()
        .url(server.url("/hook"))
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let error = dispatch(&dispatcher, &payload(), 1).await.unwrap_err();
    assert!(!error.is_permanent(), "{error}");
    let webhook = error.as_error().downcast_ref::<WebhookError>().unwrap();
    assert!(matches!(webhook, WebhookError::Timeout { .. }), "{webhook}");
}

#[tokio::test]
async fn a_kind_without_a_url_is_held_and_named() {
    let server = Server::start(vec![Reply::status(200)]).await;
    let dispatcher = WebhookDispatcher::builder()
        .route("email", server.url("/email"))
        .build()
        .unwrap();
    let error = dispatch(&dispatcher, &payload(), 1).await.unwrap_err();
    assert!(
        error.is_no_route(),
        "held, as a Router holds a kind it has no route for: {error}"
    );
    assert!(!error.is_permanent(), "{error}");
    assert!(error.to_string().contains("`notify`"), "{error}");
    let webhook = error.as_error().downcast_ref::<WebhookError>().unwrap();
    assert!(matches!(webhook, WebhookError::NoRoute { .. }), "{webhook}");
    assert!(server.received().is_empty());
}

#[tokio::test]
async fn a_409_is_retryable_since_the_receiver_may_still_be_processing_the_key() {
    let server = Server::start(vec![Reply::status(409)
        .header("retry-after", "3")
        .body("a request with this idempotency key is in progress")])
    .await;
    let dispatcher = WebhookDispatcher::new(server.url("/hook")).unwrap();
    let error = dispatch(&dispatcher, &payload(), 2).await.unwrap_err();
    assert!(!error.is_permanent(), "{error}");
    assert_eq!(error.retry_after_hint(), Some(Duration::from_secs(3)));
    let webhook = error.as_error().downcast_ref::<WebhookError>().unwrap();
    assert!(webhook.is_retryable());
    assert!(error.to_string().contains("in progress"), "{error}");
}

#[tokio::test]
async fn statuses_can_be_classified_otherwise() {
    let server = Server::start(vec![
        Reply::status(409).body("already processed"),
        Reply::status(503),
        Reply::status(422).header("retry-after", "5"),
        Reply::status(202),
    ])
    .await;
    let dispatcher = WebhookDispatcher::builder()
        .url(server.url("/hook"))
        .classify(409, Classification::Delivered)
        .classify(503, Classification::Permanent)
        .classify(422, Classification::Retryable)
        .classify(202, Classification::Retryable)
        .build()
        .unwrap();
    assert_eq!(
        dispatcher.classification(StatusCode::CONFLICT),
        Classification::Delivered
    );
    assert_eq!(
        dispatcher.classification(StatusCode::BAD_REQUEST),
        Classification::Permanent
    );
    let payload = payload();
    dispatch(&dispatcher, &payload, 1).await.unwrap();
    let error = dispatch(&dispatcher, &payload, 1).await.unwrap_err();
    assert!(error.is_permanent(), "{error}");
    let error = dispatch(&dispatcher, &payload, 1).await.unwrap_err();
    assert!(!error.is_permanent(), "{error}");
    assert_eq!(error.retry_after_hint(), Some(Duration::from_secs(5)));
    let error = dispatch(&dispatcher, &payload, 1).await.unwrap_err();
    assert!(!error.is_permanent() && error.to_string().contains("202"), "{error}");
    assert_eq!(server.received().len(), 4);
}

#[test]
fn the_default_classification_retries_what_may_succeed_later() {
    let class = |code| Classification::default_for(StatusCode::from_u16(code).unwrap());
    for code in [200, 201, 204, 299] {
        assert_eq!(class(code), Classification::Delivered, "{code}");
    }
    for code in [408, 409, 429, 500, 502, 503, 504] {
        assert_eq!(class(code), Classification::Retryable, "{code}");
    }
    for code in [100, 301, 304, 400, 401, 403, 404, 410, 413, 422] {
        assert_eq!(class(code), Classification::Permanent, "{code}");
    }
}

#[test]
fn a_classification_for_a_status_that_does_not_exist_is_refused_at_build() {
    for code in [0, 99, 1000, u16::MAX] {
        let error = WebhookDispatcher::builder()
            .url("http://127.0.0.1:9/hook")
            .classify(code, Classification::Retryable)
            .build()
            .unwrap_err();
        assert!(
            matches!(error, BuildError::InvalidStatus { status } if status == code),
            "{error}"
        );
        assert!(error.to_string().contains(&code.to_string()), "{error}");
    }
}

#[tokio::test]
async fn each_kind_goes_to_its_own_url() {
    let server = Server::start(vec![Reply::status(200)]).await;
    let dispatcher = WebhookDispatcher::builder()
        .url(server.url("/default"))
        .route("email", server.url("/email"))
        .build()
        .unwrap();
    let payload = payload();
    for kind in ["email", "notify"] {
        let outgoing = Outgoing {
            kind,
            key: "k",
            attempt: 1,
            payload: &payload,
            traceparent: None,
        };
        dispatcher.send(outgoing).await.unwrap();
    }
    let paths: Vec<_> = server.received().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/email", "/default"]);
}

#[tokio::test]
async fn a_payload_without_a_json_form_is_permanent_and_not_sent() {
    let server = Server::start(vec![Reply::status(200)]).await;
    let dispatcher = WebhookDispatcher::new(server.url("/hook")).unwrap();
    let payload = rmp_serde::to_vec_named(&std::collections::BTreeMap::from([(1u32, "one")])).unwrap();
    let error = dispatch(&dispatcher, &payload, 1).await.unwrap_err();
    assert!(error.is_permanent(), "{error}");
    assert!(server.received().is_empty());
}
