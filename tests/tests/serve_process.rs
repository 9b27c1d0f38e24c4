//! The shop service in a child process, on SQLite, through a run in which its mail service
//! fails every 3rd attempt with a retryable 503 and its model fails every 10th call (so every
//! 10th draft fails and is retried by the produce's retry policy): the service stays up for the
//! whole run and every order posted over HTTP is confirmed, once.
//!
//! 1. The parent starts the child: this test binary re-executed (the mode chosen by
//!    environment variables, as in `crash_drainer.rs`), which serves the shop's runtime and
//!    router (`shop::runtime`, `shop::router`, `shop::serve`: what `shop-service` runs) on an
//!    ephemeral port of 127.0.0.1, on a fresh SQLite file opened with
//!    `reactifact_postgres::connect("sqlite:PATH")`, and writes the port to a file.
//! 2. The parent posts N = 300 orders over HTTP from 4 threads, every 10th twice: each first
//!    post must answer 201, each second one 200 (`create_once`: the id exists).
//! 3. It polls the file's outbox until all N confirmations are delivered, checking on every
//!    round that the child is still running.
//! 4. It sends SIGTERM; the child stops gracefully and writes what its mail service sent, per
//!    key, and its `ServeReport` to a file, then exits 0.
//!
//! Checked: every order's key reached the mail service exactly once (no process died, so no
//! key may be sent twice); nothing was lost (every order is in the file with its confirmation,
//! its intent delivered); the runtime retried failed drafts (`failed_runs` > 0) and failed
//! deliveries (`failed` > 0) and parked nothing; the duplicates wrote nothing. The child's
//! retry policies start at 100 ms and allow 12 draft attempts and 25 email attempts, so that
//! no key's attempts all fail by chance (with 8, as by default, one key in 6,561 would).

mod procs;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use procs::shop::{connect, Store};
use procs::{
    assert_running, assert_success, block_on, counts, env, http, open_outbox, poll_until, scratch_dir, spawn_child,
    terminate, wait_for,
};
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::{RetryPolicy, Scope};
use reactifact_examples::shop::{self, Admission, Confirmation, Mailer, Order, Settings, StandInModel};

/// Orders posted.
const N: usize = 300;
/// Threads posting them.
const POSTERS: usize = 4;
/// The mail service fails every this many attempts (a retryable 503).
const MAIL_FAILS_EVERY: u64 = 3;
/// The model fails every this many calls.
const MODEL_FAILS_EVERY: u64 = 10;
/// Deliveries at once in the child.
const CONCURRENCY: usize = 8;
const CHILD: &str = "serve_process_child";
/// Turns a hang into a failure.
const LIMIT: Duration = Duration::from_secs(180);

/// The child's entry point: the shop service until SIGTERM; a no-op unless the parent set the
/// environment.
#[test]
fn serve_process_child() {
    let (Some(store), Some(port_file), Some(out)) = (
        env("REACTIFACT_SP_STORE"),
        env("REACTIFACT_SP_PORT"),
        env("REACTIFACT_SP_OUT"),
    ) else {
        return;
    };
    // The runtime's warnings (each failed attempt and draft) go to the child's stderr file.
    reactifact_examples::logs::init_service(false, "warn").expect("the child's logs");
    block_on(async {
        let context = connect(&store).await;
        let mailer = Mailer::new(Duration::from_millis(1), MAIL_FAILS_EVERY);
        let settings = Settings {
            model: StandInModel::new(Duration::ZERO).failing_every(MODEL_FAILS_EVERY),
            delivery_concurrency: CONCURRENCY,
            // Attempts enough that no run and no email fails on every one of them (a key
            // failing 8 attempts running, as the default allows, is about 1 in 6,561 with a
            // third of all attempts failing: too likely over 300 keys), and short backoffs.
            produce_retry: RetryPolicy::exponential(Duration::from_millis(100), Duration::from_secs(1))
                .max_attempts(12),
            delivery_retry: RetryPolicy::exponential(Duration::from_millis(100), Duration::from_secs(1))
                .max_attempts(25),
            ..Settings::default()
        };
        let runtime = shop::runtime(context, &settings, &mailer).expect("the shop's runtime builds");
        let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let app = shop::router(runtime.handle(), metrics, Admission::new(settings.inbox_capacity));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let addr = listener.local_addr().expect("the listener's address");
        // Written whole, then renamed: the parent never reads half an address.
        let partial = format!("{port_file}.partial");
        std::fs::write(&partial, addr.to_string()).expect("write the address");
        std::fs::rename(&partial, &port_file).expect("publish the address");
        // SIGTERM; or, for an orphan whose parent failed, the limit.
        let shutdown = async {
            tokio::select! {
                _ = shop::terminated() => {}
                () = tokio::time::sleep(2 * LIMIT) => eprintln!("no SIGTERM within {:?}; stopping", 2 * LIMIT),
            }
        };
        let report = shop::serve(runtime, listener, app, shutdown)
            .await
            .expect("the service serves until SIGTERM");
        let mut lines: Vec<String> = mailer
            .sent()
            .iter()
            .map(|(key, sent)| format!("sent {key} {}", sent.times))
            .collect();
        lines.sort();
        lines.push(format!(
            "report writes={} refused={} runs={} failed_runs={} parked={} delivered={} failed={} dead={}",
            report.writes,
            report.refused_writes,
            report.runs,
            report.failed_runs,
            report.parked,
            report.delivered,
            report.failed,
            report.dead
        ));
        std::fs::write(&out, lines.join("\n") + "\n").expect("write what was sent");
    });
}

/// The order posted as the `i`-th.
fn order_json(i: usize) -> String {
    format!(
        r#"{{"id":"{i}","customer":"customer {i}","email":"c{i}@example.com","total_cents":{}}}"#,
        100 + i
    )
}

/// Posts orders `first, first + POSTERS, …` below `N`, every 10th twice; returns the statuses
/// that were not as expected.
fn post_orders(addr: &str, first: usize) -> Vec<String> {
    let mut wrong = Vec::new();
    for i in (first..N).step_by(POSTERS) {
        let body = order_json(i);
        match http(addr, "POST", "/orders", Some(&body)) {
            Ok((201, _)) => {}
            other => wrong.push(format!("order {i}: {other:?}")),
        }
        if i % 10 == 0 {
            match http(addr, "POST", "/orders", Some(&body)) {
                Ok((200, answer)) if answer.contains(r#""created":false"#) => {}
                other => wrong.push(format!("order {i} again: {other:?}")),
            }
        }
    }
    wrong
}

/// The child's `sent KEY TIMES` lines, and its report's fields by name.
fn read_out(out: &Path) -> (Vec<(String, u32)>, std::collections::BTreeMap<String, u64>) {
    let text = std::fs::read_to_string(out).expect("the child wrote what it sent");
    let mut sent = Vec::new();
    let mut report = std::collections::BTreeMap::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.first() {
            Some(&"sent") => sent.push((parts[1].to_owned(), parts[2].parse().expect("a count"))),
            Some(&"report") => {
                for field in &parts[1..] {
                    let (name, value) = field.split_once('=').expect("name=value");
                    report.insert(name.to_owned(), value.parse().expect("a number"));
                }
            }
            _ => panic!("unexpected line {line:?}"),
        }
    }
    (sent, report)
}

fn spawn(store: &Store, port_file: &Path, out: &Path, stderr: &Path) -> Child {
    spawn_child(
        CHILD,
        &[
            ("REACTIFACT_SP_STORE", store.url()),
            ("REACTIFACT_SP_PORT", port_file.display().to_string()),
            ("REACTIFACT_SP_OUT", out.display().to_string()),
            ("RUST_LOG", "warn".to_owned()),
        ],
        stderr,
    )
}

#[test]
fn a_serving_process_rides_out_failing_deliveries_and_drafts() {
    let dir: PathBuf = scratch_dir("serve-process");
    let store = Store::sqlite(&dir, "shop");
    let Store::Sqlite(db) = &store else { unreachable!() };
    let (port_file, out, stderr) = (dir.join("port"), dir.join("out"), dir.join("child.stderr"));
    let mut child = spawn(&store, &port_file, &out, &stderr);

    let addr = poll_until(
        LIMIT,
        "the child publishes its address",
        || assert_running(&mut child, "the service", &stderr),
        || std::fs::read_to_string(&port_file).ok(),
    );
    let wrong: Vec<String> = std::thread::scope(|scope| {
        let posters: Vec<_> = (0..POSTERS)
            .map(|first| {
                let addr = addr.as_str();
                scope.spawn(move || post_orders(addr, first))
            })
            .collect();
        posters
            .into_iter()
            .flat_map(|poster| poster.join().expect("a poster"))
            .collect()
    });
    assert!(wrong.is_empty(), "unexpected answers: {wrong:#?}");

    // Every confirmation delivered, while the service keeps running.
    let outbox = open_outbox(db);
    poll_until(
        LIMIT,
        "every confirmation is delivered",
        || assert_running(&mut child, "the service", &stderr),
        || {
            let c = block_on(async { outbox.counts(&Scope::session(shop::SESSION)).await }).expect("count");
            (c.delivered == N as u64 && c.waiting() == 0).then_some(())
        },
    );
    assert_running(&mut child, "the service", &stderr);
    terminate(&child);
    let status = wait_for(&mut child, LIMIT, "the service after SIGTERM", &stderr);
    assert_success(status, "the service", &stderr);

    let (sent, report) = read_out(&out);
    let child_stderr = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert_eq!(
        sent.len(),
        N,
        "keys the mail service sent; the child's stderr:\n{child_stderr}"
    );
    for (key, times) in &sent {
        assert_eq!(*times, 1, "{key} was sent {times} times");
    }
    eprintln!("the child's report: {report:?}");
    assert_eq!(report["delivered"], N as u64);
    assert_eq!(
        report["parked"], 0,
        "a draft failing every 10th call never fails 5 times running"
    );
    assert_eq!(report["dead"], 0);
    assert!(report["failed_runs"] >= 1, "no draft failed: {report:?}");
    assert!(report["failed"] >= 1, "no delivery attempt failed: {report:?}");
    assert_eq!(report["refused"], 0);

    // Nothing lost: every order, its confirmation and its delivered intent are in the file.
    let whole = counts(&*outbox);
    let whole = block_on(whole);
    assert_eq!((whole.delivered, whole.waiting()), (N as u64, 0));
    block_on(async {
        let ctx = connect(&store.url()).await;
        let ledger = ctx.ledger();
        for i in 0..N {
            let order = shop::order_id(&i.to_string());
            let stored = ctx
                .get::<Order>(&order)
                .expect("the order reads")
                .expect("the order is stored");
            assert_eq!(stored.version.0, 1, "{order}: the duplicate post wrote nothing");
            assert!(
                ctx.get::<Confirmation>(&shop::confirmation_id(&order.as_str().into()))
                    .expect("the confirmation reads")
                    .is_some(),
                "{order} has no confirmation"
            );
            let key = shop::confirmation_key(&order.as_str().into());
            let delivery = ledger
                .get(&key)
                .await
                .expect("the ledger reads")
                .expect("the intent is registered");
            assert_eq!(delivery.status(), DeliveryStatus::Delivered, "{key}");
        }
        assert_eq!(ctx.parked().count(), 0);
    });
    let _ = std::fs::remove_dir_all(&dir);
}
