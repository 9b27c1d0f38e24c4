//! The shop service's router, in process, over a serving runtime on a temporary SQLite store:
//! an order posted over HTTP is committed and acknowledged with 201, and its confirmation
//! handed to the mail service once; the same order id posted again is answered 200 and writes
//! nothing; an order that needs approval goes out once approved through
//! `POST /approvals/{key}`; an order posted while every place of the admission is taken is
//! answered 503 with `Retry-After`, and nothing of it is written; an order whose draft failed
//! on every attempt is parked and goes out once re-armed through `POST /parked/{id}/rearm`.
//!
//! Every wait is on something the service did (an answer, a send counted by the mail
//! service), never a sleep; a generous timeout only keeps a broken build from hanging.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::ServeReport;
use reactifact_core::{Context, RetryPolicy, Runtime};
use reactifact_examples::shop::{self, Admission, Mailer, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The longest any step may take before the test gives up (a guard, not a synchronisation).
const GUARD: Duration = Duration::from_secs(60);

/// A status code, two headers and a body.
struct Answer {
    status: u16,
    content_type: String,
    retry_after: Option<String>,
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
    let header = |wanted: &str| {
        head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case(wanted).then(|| value.trim().to_owned())
        })
    };
    Answer {
        status,
        content_type: header("content-type").unwrap_or_default(),
        retry_after: header("retry-after"),
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
    start_with(dir, Settings::default()).await
}

async fn start_with(dir: &std::path::Path, settings: Settings) -> Service {
    let (service, runtime) = unserved(dir, settings, reactifact_core::runtime::DEFAULT_INBOX_CAPACITY).await;
    service.serve(runtime)
}

/// The router on an ephemeral port over a runtime that does not serve yet
/// ([`Service::serve`] starts it), with `places` orders admitted at once.
async fn unserved(dir: &std::path::Path, settings: Settings, places: usize) -> (Unserved, Runtime) {
    let context = Context::open(dir.join("shop.db"), shop::SESSION).expect("a new SQLite store");
    let mailer = Mailer::new(Duration::ZERO, 0);
    let runtime = shop::runtime(context, &settings, &mailer).expect("the shop's runtime builds");
    let handle = runtime.handle();
    // A recorder of the test's own, not installed: `/metrics` renders what it holds.
    let metrics = PrometheusBuilder::new().build_recorder().handle();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("an ephemeral port");
    let addr = listener.local_addr().expect("the listener's address");
    let admission = Admission::new(places);
    let router = shop::router(handle.clone(), metrics, admission.clone());
    tokio::spawn(async move { axum::serve(listener, router).await.expect("the service serves") });
    let service = Unserved {
        addr,
        mailer,
        handle,
        admission,
    };
    (service, runtime)
}

/// The router of a runtime that does not serve yet.
struct Unserved {
    addr: SocketAddr,
    mailer: Mailer,
    handle: reactifact_core::RuntimeHandle,
    admission: Admission,
}

impl Unserved {
    fn serve(self, mut runtime: Runtime) -> Service {
        let serving = tokio::spawn(async move {
            let report = runtime.serve(shop::POLL).await.expect("the runtime serves");
            (runtime, report)
        });
        Service {
            addr: self.addr,
            mailer: self.mailer,
            handle: self.handle,
            serving,
        }
    }
}

/// The body of `POST /orders` for order `id`.
fn order_body(id: &str, total_cents: u64) -> String {
    format!(r#"{{"id":"{id}","customer":"Ada","email":"ada@example.com","total_cents":{total_cents}}}"#)
}

impl Service {
    async fn post_order(&self, id: &str, total_cents: u64) -> Answer {
        request(self.addr, "POST", "/orders", Some(&order_body(id, total_cents))).await
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
    assert_eq!(answer.status, 201, "{}", answer.body);
    let accepted: shop::Accepted = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        accepted,
        shop::Accepted {
            order: "order:42".into(),
            created: true,
            confirmation: "confirm:order:42".into(),
            needs_approval: false,
        }
    );
    service.sent(1).await;

    // The same id again (a retried request), even with another total: 200, nothing written;
    // the stored order stands. Order 43 comes after it in the inbox, so once 43 is sent, the
    // second 42 has been answered and nothing of it ran.
    let again = service.post_order("42", 1300).await;
    assert_eq!(again.status, 200, "{}", again.body);
    let again: shop::Accepted = serde_json::from_str(&again.body).unwrap();
    assert!(!again.created);
    assert_eq!(again.confirmation, "confirm:order:42");
    assert_eq!(service.post_order("43", 500).await.status, 201);
    service.sent(2).await;

    let (runtime, report) = service.stop().await;
    assert_eq!(mailer.times_sent("confirm:order:42"), 1);
    assert_eq!(mailer.attempts(), 2, "one attempt per order");
    assert_eq!(
        ledger_entry(&runtime, "confirm:order:42").await,
        (DeliveryStatus::Delivered, 1)
    );
    assert_eq!(report.delivered, 2);
    assert_eq!(report.runs, 2, "the duplicate ran nothing");
    let order = runtime
        .context()
        .get::<shop::Order>("order:42")
        .expect("the order reads")
        .expect("the order is stored");
    assert_eq!(
        (order.data.total_cents, order.version.0),
        (1200, 1),
        "the first order stands"
    );
    let confirmation = runtime
        .context()
        .get::<shop::Confirmation>("confirmation:order:42")
        .expect("the confirmation reads")
        .expect("the produce wrote it");
    assert!(
        confirmation.data.body.contains("12.00"),
        "drafted once, from the first order: {}",
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

    assert_eq!(service.post_order("7", 2500).await.status, 201);
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
    assert_eq!(answer.status, 201, "{}", answer.body);
    assert!(answer.body.contains(r#""needs_approval":true"#), "{}", answer.body);
    // A small order after it: once it is sent, the big one's intent is committed, awaiting
    // approval, and not sent.
    assert_eq!(service.post_order("small", 100).await.status, 201);
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

#[tokio::test]
async fn an_overloaded_service_answers_503_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    // One place, and a runtime that does not serve yet: the first order waits in its inbox,
    // holding the place.
    let (service, runtime) = unserved(dir.path(), Settings::default(), 1).await;
    let addr = service.addr;
    let first = tokio::spawn(async move { request(addr, "POST", "/orders", Some(&order_body("first", 100))).await });
    let started = std::time::Instant::now();
    while service.admission.waiting() < 1 {
        assert!(started.elapsed() < GUARD, "the first order never took its place");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    let refused = request(service.addr, "POST", "/orders", Some(&order_body("second", 100))).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.retry_after.as_deref(), Some("1"));
    assert!(refused.body.contains("overloaded"), "{}", refused.body);

    let service = service.serve(runtime);
    let first = tokio::time::timeout(GUARD, first)
        .await
        .expect("the first order is answered")
        .expect("the request task");
    assert_eq!(first.status, 201, "{}", first.body);
    service.sent(1).await;
    // The refused order was never written: posted again, it is new.
    assert_eq!(service.post_order("second", 100).await.status, 201);
    service.sent(2).await;
    let (runtime, report) = service.stop().await;
    assert_eq!(report.writes, 2);
    assert!(runtime.context().get::<shop::Order>("order:first").unwrap().is_some());
}

#[tokio::test]
async fn an_order_parked_by_a_model_outage_goes_out_once_re_armed() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        // Two attempts, 10 ms apart: parked soon.
        produce_retry: RetryPolicy::exponential(Duration::from_millis(10), Duration::from_millis(10)).max_attempts(2),
        ..Settings::default()
    };
    let model = settings.model.clone();
    model.set_outage(true);
    let service = start_with(dir.path(), settings).await;
    assert_eq!(service.post_order("7", 100).await.status, 201);
    assert_eq!(service.post_order("8", 100).await.status, 201);

    // Both drafts failed twice: their second attempts were their last, and the commit after
    // them parks both. No further call is made until a re-arm.
    let started = std::time::Instant::now();
    while model.calls() < 4 {
        assert!(started.elapsed() < GUARD, "{} model calls", model.calls());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(service.mailer.attempts(), 0);
    let nothing = request(service.addr, "POST", "/parked/nothing/rearm", None).await;
    assert_eq!(nothing.status, 404, "{}", nothing.body);

    model.set_outage(false);
    // By the order's id, and by the parked record's id, percent-encoded: 404 until the commit
    // that parks it.
    let rearm = |path: &'static str| async move {
        let started = std::time::Instant::now();
        loop {
            let answer = request(service.addr, "POST", path, None).await;
            if answer.status != 404 {
                return answer;
            }
            assert!(started.elapsed() < GUARD, "{path}: never parked: {}", answer.body);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let by_order = rearm("/parked/7/rearm").await;
    assert_eq!(by_order.status, 200, "{}", by_order.body);
    let rearmed: shop::Rearmed = serde_json::from_str(&by_order.body).unwrap();
    assert_eq!(rearmed.parked, "parked:shop/draft_confirmation/order:7");
    assert_eq!(rearmed.parked, shop::parked_id(&"order:7".into()));
    let by_id = rearm("/parked/parked:shop%2Fdraft_confirmation%2Forder:8/rearm").await;
    assert_eq!(by_id.status, 200, "{}", by_id.body);
    service.sent(2).await;
    // Re-armed once: a second re-arm finds nothing parked.
    let again = request(service.addr, "POST", "/parked/7/rearm", None).await;
    assert_eq!(again.status, 404, "{}", again.body);
    assert_eq!(model.calls(), 6, "one more call each");

    let (runtime, report) = service.stop().await;
    assert_eq!(report.parked, 2);
    assert_eq!(report.failed_runs, 4);
    assert_eq!(runtime.context().parked().count(), 0);
    for key in ["confirm:order:7", "confirm:order:8"] {
        assert_eq!(
            ledger_entry(&runtime, key).await,
            (DeliveryStatus::Delivered, 1),
            "{key}"
        );
    }
}
