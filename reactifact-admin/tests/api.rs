//! The console's API over a store a small runtime wrote (on SQLite, and on PostgreSQL through
//! `REACTIFACT_TEST_POSTGRES_URL`): each endpoint's document, approving and retrying through
//! it, its authentication, roles and CSRF proof, hidden payloads, a sweep of malformed
//! requests, and a pagination walk while entries are added.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use reactifact_admin::store::{Location, Store};
use reactifact_admin::{router, Config, Role, Token};
use reactifact_core::{
    Agent, Artifact, Context, DispatchError, Intent, PendingAction, Produce, ProduceCall, ProduceError, Runtime,
};
use reactifact_postgres::{PostgresOptions, PostgresStore};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tower::ServiceExt;

const OPERATOR: &str = "operator-secret-0123456789";
const READER: &str = "reader-secret-0123456789";

/// An order; its `channel` is the kind of the intent it records.
#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
#[artifact(kind = "order")]
struct Order {
    customer: String,
    channel: String,
}

#[derive(Serialize, Deserialize, Debug)]
struct Notify {
    customer: String,
}

/// `email` is delivered, `sms` dead (a permanent failure), `refund` awaits approval.
fn runtime(ctx: Context) -> Runtime {
    let notify = Produce::new("notify", |call: ProduceCall<Order>| async move {
        let order = &call.trigger;
        let payload = Notify {
            customer: order.data.customer.clone(),
        };
        let key = format!("{}:{}", order.data.channel, order.id);
        if order.data.channel == "refund" {
            call.effects.act_with_approval("refund", key, &payload);
        } else {
            call.effects.act(&order.data.channel, key, &payload);
        }
        Ok::<(), ProduceError>(())
    })
    .creates::<PendingAction>();
    Runtime::builder(ctx)
        .agent(Agent::new("shop").produce(notify))
        .dispatcher(|intent: Intent| async move {
            match intent.kind() {
                "sms" => Err(DispatchError::permanent("the sms gateway refused the number")),
                _ => Ok(()),
            }
        })
        .build()
        .unwrap()
}

/// Orders `order:{from}..order:{to}` on `channel`, each run and its intent drained.
async fn orders(rt: &mut Runtime, from: usize, to: usize, channel: &str) {
    for i in from..to {
        rt.context_mut()
            .create(
                format!("order:{i}"),
                Order {
                    customer: format!("c{i}@example.com"),
                    channel: channel.into(),
                },
            )
            .unwrap();
    }
    rt.run().await.unwrap();
}

/// The flow: `email:order:1` delivered, `sms:order:2` dead, `refund:order:3` and
/// `refund:order:4` awaiting approval.
async fn write(ctx: Context) -> Runtime {
    let mut rt = runtime(ctx);
    orders(&mut rt, 1, 2, "email").await;
    orders(&mut rt, 2, 3, "sms").await;
    orders(&mut rt, 3, 5, "refund").await;
    rt
}

fn tokens() -> Vec<Token> {
    vec![
        Token::new("ada", OPERATOR, Role::Operator).unwrap(),
        Token::new("bob", READER, Role::ReadOnly).unwrap(),
    ]
}

async fn app(location: Location, show_payloads: bool) -> Router {
    let store = Store::open(location, true).await.unwrap();
    router(
        Config::new(Arc::new(store))
            .tokens(tokens())
            .show_payloads(show_payloads),
    )
}

/// Sends a request; returns the status and the body as JSON (every answer is JSON).
async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("answer {status} is not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, body)
}

async fn get(app: &Router, uri: &str) -> (StatusCode, Value) {
    let request = Request::get(uri)
        .header("authorization", format!("Bearer {READER}"))
        .body(Body::empty())
        .unwrap();
    send(app, request).await
}

async fn post(app: &Router, uri: &str, body: Value) -> (StatusCode, Value) {
    let request = Request::post(uri)
        .header("authorization", format!("Bearer {OPERATOR}"))
        .header("x-reactifact-csrf", "1")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    send(app, request).await
}

fn sqlite() -> (tempfile::TempDir, Location) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    (dir, Location::Sqlite(path))
}

async fn sqlite_flow() -> (tempfile::TempDir, Location, Runtime) {
    let (dir, location) = sqlite();
    let Location::Sqlite(path) = &location else {
        unreachable!()
    };
    let rt = write(Context::open(path, "shop").unwrap()).await;
    (dir, location, rt)
}

/// Every endpoint's document, and approving, rejecting, retrying and cancelling through the
/// API, on a store written by the flow.
async fn documents_and_operations(app: &Router) {
    let (status, doc) = get(app, "/sessions").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["sessions"][0]["name"], "shop");
    assert!(doc["sessions"][0]["generation"].as_u64().unwrap() >= 4);

    let (_, doc) = get(app, "/sessions/shop/log?limit=2").await;
    let commits = doc["commits"].as_array().unwrap();
    assert_eq!(commits.len(), 2);
    let head = doc["generation"].as_u64().unwrap();
    assert_eq!(commits[0]["generation"], head);
    assert_eq!(commits[1]["generation"], head - 1);
    assert_eq!(doc["next"], head - 2);
    let (_, older) = get(app, &format!("/sessions/shop/log?before={}&limit=1000", head - 2)).await;
    assert_eq!(older["commits"][0]["generation"], head - 2);
    assert_eq!(older["commits"].as_array().unwrap().len() as u64, head - 2);
    assert_eq!(older["next"], Value::Null);

    let (_, doc) = get(app, "/sessions/shop/artifacts/order:1").await;
    assert_eq!(doc["kind"], "order");
    assert_eq!(doc["content"]["customer"], "c1@example.com");
    let (status, _) = get(app, "/sessions/shop/artifacts/order:3?at=1").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "order 3 is written after commit 1");

    let (_, doc) = get(app, "/outbox/counts").await;
    let counts = &doc["counts"];
    assert_eq!(
        (
            counts["delivered"].clone(),
            counts["dead"].clone(),
            counts["awaiting-approval"].clone(),
            counts["total"].clone()
        ),
        (json!(1), json!(1), json!(2), json!(4))
    );

    let (_, doc) = get(app, "/outbox?status=dead").await;
    assert_eq!(doc["entries"].as_array().unwrap().len(), 1);
    assert_eq!(doc["entries"][0]["key"], "sms:order:2");
    assert_eq!(doc["entries"][0]["last_error"], "the sms gateway refused the number");
    let (_, doc) = get(app, "/outbox?kind=refund&key_prefix=refund:order:4").await;
    assert_eq!(doc["entries"].as_array().unwrap().len(), 1);

    let (_, doc) = get(app, "/outbox/email:order:1").await;
    assert_eq!(doc["status"], "delivered");
    assert_eq!(doc["payload"], Value::Null, "payloads are hidden by default");
    assert_eq!(doc["payload_hidden"], true);
    assert_eq!(doc["payload_sha256"].as_str().unwrap().len(), 64);
    assert!(doc["payload_bytes"].as_u64().unwrap() > 0);
    assert_eq!(doc["attempt_history"][0]["outcome"], "delivered");
    assert_eq!(doc["run"]["produce"], "notify");
    assert_eq!(doc["why"]["key"], "email:order:1");
    assert_eq!(doc["why"]["agent"], "shop");
    assert_eq!(doc["why"]["chain"][0]["wrote"]["id"], "order:1");
    assert_eq!(doc["why"]["chain"][0]["outside_write"], true);
    assert!(doc["traceparent"].is_string() || doc["traceparent"].is_null());

    let (_, doc) = get(app, "/approvals").await;
    let keys: Vec<&str> = doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["refund:order:3", "refund:order:4"]);

    let (status, doc) = post(app, "/outbox/refund:order:3/approve", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(doc["approved"][0]["status"], "pending");
    assert_eq!(
        doc["approved"][0]["decision"]["by"], "ada",
        "the decision names the token's principal"
    );
    let (status, doc) = post(app, "/outbox/refund:order:4/reject", json!({"reason": "duplicate"})).await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(doc["rejected"][0]["status"], "rejected");
    assert_eq!(doc["rejected"][0]["decision"]["by"], "ada");
    assert_eq!(doc["rejected"][0]["decision"]["reason"], "duplicate");
    let (status, _) = post(app, "/outbox/refund:order:4/approve", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (_, doc) = get(app, "/approvals").await;
    assert_eq!(doc["entries"], json!([]));

    let (status, doc) = post(app, "/outbox/sms:order:2/retry", Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(doc["retried"][0]["status"], "pending");
    let (status, doc) = post(app, "/outbox/email:order:1/retry", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(doc["error"].as_str().unwrap().contains("is delivered"));
    let (status, doc) = post(app, "/outbox/sms:order:2/cancel", json!({"reason": "wrong number"})).await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(doc["cancelled"][0]["cancel_reason"], "wrong number (by ada)");
    let (status, _) = post(app, "/outbox/nope:1/retry", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, doc) = get(app, "/verify").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["sessions"][0]["session"], "shop");
}

#[tokio::test]
async fn every_endpoint_answers_its_document_on_sqlite() {
    let (_dir, location, mut rt) = sqlite_flow().await;
    let app = app(location, false).await;
    documents_and_operations(&app).await;
    // The approved refund is delivered by the next drain; the API shows it.
    rt.run().await.unwrap();
    let (_, doc) = get(&app, "/outbox/refund:order:3").await;
    assert_eq!(doc["status"], "delivered");
    assert_eq!(doc["decision"]["verdict"], "approved");
}

#[tokio::test]
async fn payloads_show_when_the_config_enables_them() {
    let (_dir, location, _rt) = sqlite_flow().await;
    let app = app(location, true).await;
    let (_, doc) = get(&app, "/outbox/email:order:1").await;
    assert_eq!(doc["payload"], json!({"customer": "c1@example.com"}));
    assert_eq!(doc["payload_hidden"], false);
}

#[tokio::test]
async fn requests_without_a_valid_token_role_or_csrf_proof_are_refused() {
    let (_dir, location, _rt) = sqlite_flow().await;
    let app = app(location, false).await;
    let request = |method: Method, uri: &str, headers: &[(&str, &str)]| {
        let mut builder = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(Body::empty()).unwrap()
    };
    let (status, doc) = send(&app, request(Method::GET, "/sessions", &[])).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(doc["error"].as_str().unwrap().contains("missing bearer token"));
    let (status, _) = send(&app, request(Method::GET, "/nowhere", &[])).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "an unknown path tells nothing without a token"
    );
    for bad in ["Bearer wrong-secret-0123456789", "Basic YWRhOnB3", "Bearer ", OPERATOR] {
        let (status, _) = send(&app, request(Method::GET, "/sessions", &[("authorization", bad)])).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{bad}");
    }
    let approve = "/outbox/refund:order:3/approve";
    let reader = format!("Bearer {READER}");
    let operator = format!("Bearer {OPERATOR}");
    let (status, doc) = send(
        &app,
        request(
            Method::POST,
            approve,
            &[("authorization", &reader), ("x-reactifact-csrf", "1")],
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(doc["error"].as_str().unwrap().contains("read-only"));
    // A form posted from another site: no custom header, whatever its origin.
    let (status, doc) = send(
        &app,
        request(
            Method::POST,
            approve,
            &[
                ("authorization", &operator),
                ("origin", "https://evil.example"),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(doc["error"].as_str().unwrap().contains("X-Reactifact-Csrf"));
    let (status, _) = send(
        &app,
        request(
            Method::POST,
            approve,
            &[("authorization", &operator), ("x-reactifact-csrf", "0")],
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (_, doc) = get(&app, "/approvals").await;
    assert_eq!(
        doc["entries"].as_array().unwrap().len(),
        2,
        "no refused request approved anything"
    );
}

#[tokio::test]
async fn malformed_requests_answer_a_json_4xx_on_every_route() {
    let (_dir, location, _rt) = sqlite_flow().await;
    let app = app(location, false).await;
    let huge = "x".repeat(30_000);
    let numbers = [
        "-1".to_owned(),
        "abc".to_owned(),
        "1.5".to_owned(),
        u64::MAX.to_string(),
        "18446744073709551616".to_owned(),
        "%FF".to_owned(),
        huge.clone(),
    ];
    let gets = [
        "/sessions",
        "/sessions/shop/log",
        "/sessions/shop/artifacts/order:1",
        "/outbox",
        "/outbox/counts",
        "/outbox/email:order:1",
        "/approvals",
        "/verify",
    ];
    let mut queries: Vec<String> = Vec::new();
    for name in [
        "limit",
        "after",
        "before",
        "at",
        "status",
        "kind",
        "session",
        "key_prefix",
        "bogus",
        "",
    ] {
        for value in &numbers {
            queries.push(format!("{name}={value}"));
        }
    }
    queries.extend([
        "limit=0".into(),
        "limit=1001".into(),
        "status=sent".into(),
        "limit=1&limit=2".into(),
    ]);
    queries.extend(["%FF%FE=1".into(), "&&&".into(), "a".into(), format!("{huge}={huge}")]);
    for route in gets {
        for query in &queries {
            let uri = format!("{route}?{query}");
            let (status, doc) = get(&app, &uri).await;
            assert!(
                status.is_success() || status.is_client_error(),
                "{status} for {}",
                &uri[..uri.len().min(120)]
            );
            if !status.is_success() {
                assert!(doc["error"].is_string(), "{doc}");
            }
        }
    }
    let paths = [
        "/sessions/%FF%FE/log",
        "/sessions/%FF/artifacts/%FE",
        "/outbox/%FF%FE",
        "/outbox/%C0%80/approve",
        "/sessions/nope/log",
        "/sessions/shop/artifacts/nope",
        "/outbox/nope",
    ];
    for uri in paths {
        let (status, doc) = get(&app, uri).await;
        assert!(status.is_client_error(), "{status} for {uri}");
        assert!(doc["error"].is_string());
    }
    let long = format!("/outbox/{huge}");
    let (status, _) = get(&app, &long).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for uri in [
        "/outbox/%FF/approve",
        "/outbox/refund:order:3/reject",
        "/outbox/refund:order:3/approve?x=1",
        "/outbox/sms:order:2/retry?limit=18446744073709551616",
        "/sessions",
    ] {
        for body in [
            json!({"reason": 5}),
            json!(["reason"]),
            json!({"other": "x"}),
            json!({"reason": ""}),
            json!(huge),
        ] {
            let (status, doc) = post(&app, uri, body).await;
            assert!(status.is_client_error(), "{status} for POST {uri}");
            assert!(doc["error"].is_string());
        }
    }
    let request = Request::post("/outbox/refund:order:3/cancel")
        .header("authorization", format!("Bearer {OPERATOR}"))
        .header("x-reactifact-csrf", "1")
        .body(Body::from(vec![0xff, 0xfe, b'{']))
        .unwrap();
    let (status, _) = send(&app, request).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (_, doc) = get(&app, "/outbox/counts").await;
    assert_eq!(
        doc["counts"]["awaiting-approval"], 2,
        "no malformed request changed anything"
    );
}

#[tokio::test]
async fn pagination_walks_every_entry_once_while_entries_are_added() {
    let (_dir, location, mut rt) = sqlite_flow().await;
    let app = app(location, false).await;
    let mut seen: Vec<String> = Vec::new();
    let mut after: Option<u64> = None;
    let mut added = 100;
    loop {
        let uri = match after {
            Some(a) => format!("/outbox?limit=3&after={a}"),
            None => "/outbox?limit=3".to_owned(),
        };
        let (status, doc) = get(&app, &uri).await;
        assert_eq!(status, StatusCode::OK);
        seen.extend(
            doc["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["key"].as_str().unwrap().to_owned()),
        );
        let Some(next) = doc["next"].as_u64() else { break };
        after = Some(next);
        // New entries registered between pages, after the cursor.
        if added < 106 {
            orders(&mut rt, added, added + 2, "email").await;
            added += 2;
        }
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "an entry was seen twice: {seen:?}");
    assert!(added > 100, "entries were added during the walk");
    for i in (1..5).chain(100..added) {
        let expected = ["email", "sms", "refund"]
            .iter()
            .map(|c| format!("{c}:order:{i}"))
            .find(|k| seen.contains(k));
        assert!(expected.is_some(), "order {i}'s intent was not seen: {seen:?}");
    }
    let (_, doc) = get(&app, "/outbox/counts").await;
    assert_eq!(doc["counts"]["total"], seen.len());
}

static SCHEMAS: AtomicUsize = AtomicUsize::new(0);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_its_document_on_postgres() {
    let url = std::env::var("REACTIFACT_TEST_POSTGRES_URL")
        .expect("REACTIFACT_TEST_POSTGRES_URL names the test server (postgres://USER@HOST/DATABASE)");
    let schema = format!(
        "rfadmin_{}_{}",
        std::process::id(),
        SCHEMAS.fetch_add(1, Ordering::Relaxed)
    );
    assert!(schema.len() <= 48);
    let options = PostgresOptions::new(&url).schema(&schema).pool_size(2);
    let store = PostgresStore::open(options).await.unwrap();
    let ctx = Context::open_store(store.clone(), "shop").await.unwrap();
    let mut rt = write(ctx).await;
    let app = app(
        Location::Postgres {
            url: url.clone(),
            schema: schema.clone(),
        },
        false,
    )
    .await;
    documents_and_operations(&app).await;
    rt.run().await.unwrap();
    let (_, doc) = get(&app, "/outbox/refund:order:3").await;
    assert_eq!(doc["status"], "delivered");
    drop((rt, app, store));
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}
