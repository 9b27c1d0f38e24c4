//! The shop service's router, in process, over a serving runtime on a temporary SQLite store:
//! an order posted over HTTP is committed, acknowledged with 202, and its confirmation handed
//! to the mail service once — also when the same order id is posted again — and an order that
//! needs approval goes out once approved through `POST /approvals/{key}`.
//!
//! Every wait is on something the service did (an answer, a send counted by the mail
//! service), never a sleep; a generous timeout only keeps a broken build from hanging.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use reactifact_core::{Context, DeliveryStatus, Runtime, ServeReport};
use reactifact_examples::shop::{self, Mailer, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The longest any step may take before the test gives up (a guard, not a synchronisation).
const GUARD: Duration = Duration::from_secs(60);

/// A status code and a body.
struct Answer {
    status: u16,
    content_type: String,
    body: String,
}

/// Sends one HTTP/1.1 request with `connection: close` and reads the whole answer.
async fn request(addr: SocketAddr, method: &str, path: &str, json: Option<&str>) -> Answer {
    let mut stream = TcpStream::connect(addr).await.expect("the service accepts connections");
    let body = json.unwrap_or("");
    let content_type = if json.is_some() {
        "content-type: application/json\r\n"
    } else {
        ""
    };
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{content_type}content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("the request is sent");
    stream.write_all(body.as_bytes()).await.expect("the request is sent");
    let mut raw = Vec::new();
    tokio::time::timeout(GUARD, stream.read_to_end(&mut raw))
        .await
        .expect("the service answers")
        .expect("the answer is read");
    let raw = String::from_utf8(raw).expect("the answer is UTF-8");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an answer has a head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let content_type = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    Answer {
        status,
        content_type,
        body: body.to_owned(),
    }
}

/// A serving shop runtime on a SQLite file in `dir`, and its router on an ephemeral port.
struct Service {
    addr: SocketAddr,
    mailer: Mailer,
    handle: reactifact_core::RuntimeHandle,
    serving: JoinHandle<(Runtime, ServeReport)>,
}

async fn start(dir: &std::path::Path) -> Service {
    let context = Context::open(dir.join("shop.db"), shop::SESSION).expect("a new SQLite store");
    let mailer = Mailer::new(Duration::ZERO, 0);
    let mut runtime = shop::runtime(context, &Settings::default(), &mailer).expect("the shop's runtime builds");
    let handle = runtime.handle();
    let serving = tokio::spawn(async move {
        let report = runtime.serve(Duration::from_secs(1)).await.expect("the runtime serves");
        (runtime, report)
    });
    // A recorder of the test's own, not installed: `/metrics` renders what it holds.
    let metrics = PrometheusBuilder::new().build_recorder().handle();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("an ephemeral port");
    let addr = listener.local_addr().expect("the listener's address");
    let router = shop::router(handle.clone(), metrics);
    tokio::spawn(async move { axum::serve(listener, router).await.expect("the service serves") });
    Service {
        addr,
        mailer,
        handle,
        serving,
    }
}

impl Service {
    async fn post_order(&self, id: &str, total_cents: u64) -> Answer {
        let body = format!(r#"{{"id":"{id}","customer":"Ada","email":"ada@example.com","total_cents":{total_cents}}}"#);
        request(self.addr, "POST", "/orders", Some(&body)).await
    }

    async fn sent(&self, count: u64) {
        tokio::time::timeout(GUARD, self.mailer.wait_for(count))
            .await
            .unwrap_or_else(|_| panic!("{count} emails sent; the mail service has {:?}", self.mailer.sent()));
    }

    /// Stops the runtime and returns it with what it served.
    async fn stop(self) -> (Runtime, ServeReport) {
        self.handle.stop();
        tokio::time::timeout(GUARD, self.serving)
            .await
            .expect("the runtime stops")
            .expect("the runtime does not panic")
    }
}

#[tokio::test]
async fn an_order_posted_twice_is_confirmed_once() {
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path()).await;
    let mailer = service.mailer.clone();

    let answer = service.post_order("42", 1200).await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    let accepted: shop::Accepted = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        accepted,
        shop::Accepted {
            order: "order:42".into(),
            confirmation: "confirm:order:42".into(),
            needs_approval: false,
        }
    );
    service.sent(1).await;

    // The same id again, with another total: committed (a refresh), the produce runs again and
    // derives the same key, which is not sent again. Order 43 comes after it in the inbox, so
    // once 43 is sent, the generation that took the second 42 has committed.
    let again = service.post_order("42", 1300).await;
    assert_eq!(again.status, 202, "{}", again.body);
    assert_eq!(service.post_order("43", 500).await.status, 202);
    service.sent(2).await;

    let (runtime, report) = service.stop().await;
    assert_eq!(mailer.times_sent("confirm:order:42"), 1);
    assert_eq!(mailer.attempts(), 2, "one attempt per order");
    assert_eq!(
        ledger_entry(&runtime, "confirm:order:42").await,
        (DeliveryStatus::Delivered, 1)
    );
    assert_eq!(report.delivered, 2);
    assert_eq!(report.writes, 3);
    let confirmation = runtime
        .context()
        .get::<shop::Confirmation>("confirmation:order:42")
        .expect("the confirmation reads")
        .expect("the produce wrote it");
    assert!(
        confirmation.data.body.contains("13.00"),
        "redrafted: {}",
        confirmation.data.body
    );
}

/// The ledger's status of `key` and its attempts.
async fn ledger_entry(runtime: &Runtime, key: &str) -> (DeliveryStatus, u32) {
    let delivery = runtime
        .context()
        .ledger()
        .get(key)
        .await
        .expect("the ledger reads")
        .expect("the key is registered");
    (delivery.status(), delivery.attempts())
}

#[tokio::test]
async fn the_dispatcher_receives_an_order_once() {
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path()).await;
    let mailer = service.mailer.clone();

    assert_eq!(service.post_order("7", 2500).await.status, 202);
    service.sent(1).await;
    let (runtime, report) = service.stop().await;

    assert_eq!(mailer.times_sent("confirm:order:7"), 1);
    assert_eq!(mailer.attempts(), 1, "one attempt, no retry");
    assert_eq!(report.delivered, 1);
    assert_eq!(
        ledger_entry(&runtime, "confirm:order:7").await,
        (DeliveryStatus::Delivered, 1)
    );
}

#[tokio::test]
async fn a_large_order_waits_for_its_approval() {
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path()).await;
    let mailer = service.mailer.clone();
    let key = "confirm:order:big";

    let answer = service.post_order("big", shop::APPROVAL_THRESHOLD_CENTS).await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    assert!(answer.body.contains(r#""needs_approval":true"#), "{}", answer.body);
    // A small order after it: once it is sent, the big one's intent is committed, awaiting
    // approval, and not sent.
    assert_eq!(service.post_order("small", 100).await.status, 202);
    service.sent(1).await;
    assert_eq!(mailer.times_sent(key), 0);

    let approval = |by: &str| format!(r#"{{"by":"{by}"}}"#);
    let unknown = request(
        service.addr,
        "POST",
        "/approvals/confirm:order:none",
        Some(&approval("alice")),
    )
    .await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let nobody = request(service.addr, "POST", &format!("/approvals/{key}"), Some(&approval(""))).await;
    assert_eq!(nobody.status, 422, "{}", nobody.body);
    let approved = request(
        service.addr,
        "POST",
        &format!("/approvals/{key}"),
        Some(&approval("alice")),
    )
    .await;
    assert_eq!(approved.status, 200, "{}", approved.body);
    service.sent(2).await;
    // Approving again changes nothing: the first decision stands.
    let again = request(
        service.addr,
        "POST",
        &format!("/approvals/{key}"),
        Some(&approval("alice")),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.body);
    // A small order's confirmation never awaited approval.
    let not_held = request(
        service.addr,
        "POST",
        "/approvals/confirm:order:small",
        Some(&approval("alice")),
    )
    .await;
    assert_eq!(not_held.status, 409, "{}", not_held.body);

    let (_runtime, report) = service.stop().await;
    assert_eq!(mailer.times_sent(key), 1);
    assert_eq!(report.delivered, 2);
}

#[tokio::test]
async fn bad_requests_are_refused_and_metrics_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let service = start(dir.path()).await;

    let bad_id = service.post_order("a/b", 100).await;
    assert_eq!(bad_id.status, 422, "{}", bad_id.body);
    assert!(bad_id.body.contains("order id"), "{}", bad_id.body);
    let not_json = request(service.addr, "POST", "/orders", None).await;
    assert!(matches!(not_json.status, 400 | 415 | 422), "{}", not_json.status);
    let metrics = request(service.addr, "GET", "/metrics", None).await;
    assert_eq!(metrics.status, 200);
    assert_eq!(metrics.content_type, shop::PROMETHEUS_CONTENT_TYPE);
    assert_eq!(request(service.addr, "GET", "/nowhere", None).await.status, 404);

    let (_runtime, report) = service.stop().await;
    assert_eq!(report.writes, 0);
}
