//! A serving shop process SIGKILLed mid-run, on SQLite and on PostgreSQL: every write it
//! acknowledged is in the store after a restart, the restarted process delivers everything,
//! and the keys sent more than once per kill are at most the delivery concurrency.
//!
//! Per trial (3 per store by default; `REACTIFACT_SERVE_KILL_TRIALS` overrides the count and
//! `REACTIFACT_SERVE_KILL_SEED` the seed):
//!
//! 1. the parent starts a *writer* child (this test binary re-executed, the mode chosen by
//!    environment variables, as in `crash_drainer.rs`) on a fresh store — a SQLite file, or a
//!    schema of its own on the server `REACTIFACT_TEST_POSTGRES_URL` names, opened with
//!    `reactifact_postgres::connect` as `shop-service --store URL` opens it. It serves the
//!    shop's runtime (`shop::runtime_with`: the draft produce, its delivery beside the turns,
//!    8 deliveries at once) and writes orders through the runtime's handle from 8 tasks, each
//!    sending its next order as soon as the last is acknowledged (`create_once`), appending
//!    `A {id}` to an acknowledgement log once each is committed;
//!    the stand-in model takes 20 ms per draft, and its dispatcher appends
//!    `S {key} {attempt} {pid}` to a send log before each attempt, then the stand-in mail
//!    service takes 40 ms (so about 6 of the 8 delivery slots are busy at any time, and a
//!    generation is usually waiting on the model when the kill lands);
//! 2. once the writer has acknowledged 150 orders and started 20 sends, the parent waits a
//!    random 0–50 ms (seeded: fault injection, not synchronisation) and SIGKILLs it;
//! 3. it starts a *resume* child on the same store: it serves the same runtime (no new
//!    writes) until every acknowledged order's confirmation is delivered in its ledger, then
//!    stops itself gracefully and exits 0.
//!
//! Checked per trial, from the store (opened by the parent with `reactifact_postgres::connect`)
//! and the logs: every acknowledged order is stored, with its confirmation and its intent
//! delivered; every acknowledged order's key was sent (an `S` line); and the extra sends (`S`
//! lines beyond the first per key) are at most the delivery concurrency, 8: only an attempt
//! the killed writer had handed to its dispatcher without its outcome being durable is sent
//! again, by the restarted process, with the same key. The suite also requires that the
//! kills left something to resume (orders committed whose confirmation was not yet delivered),
//! or it would have tested nothing.
//!
//! The PostgreSQL case runs when `REACTIFACT_TEST_POSTGRES_URL` is set (CI sets it), and then
//! must pass; without it, it says it skipped.

mod procs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use procs::shop::{connect, logged, postgres_url, Store};
use procs::{
    assert_running, assert_success, block_on, env, killed_by_sigkill, poll_until, read_lines, scratch_dir, spawn_child,
    wait_for, LineLog, Rng,
};
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::ArtifactId;
use reactifact_examples::shop::{self, Confirmation, Mailer, Order, Settings, StandInModel};

/// Writer tasks in the writer child.
const WRITERS: usize = 8;
/// Deliveries at once: the bound on what a kill can leave sent and unrecorded.
const CONCURRENCY: usize = 8;
/// Each draft's model call.
const MODEL_DELAY: Duration = Duration::from_millis(20);
/// Each send.
const SEND_DELAY: Duration = Duration::from_millis(40);
/// Acknowledgements and sends the writer must have made before the kill.
const ACKED_BEFORE_KILL: usize = 150;
const SENT_BEFORE_KILL: usize = 20;
/// The kill lands this many milliseconds (at most) after both.
const KILL_WINDOW_MS: u64 = 50;
/// The writer stops writing after this many orders (it is killed long before).
const MAX_ORDERS: u64 = 100_000;
const CHILD: &str = "serve_kill_child";
const LIMIT: Duration = Duration::from_secs(120);

/// The idempotency key of the order `id`'s confirmation.
fn key_of(id: &str) -> String {
    shop::confirmation_key(&ArtifactId::from(shop::order_id(id)))
}

/// The child's entry point; a no-op unless the parent set the environment.
#[test]
fn serve_kill_child() {
    let (Some(mode), Some(store), Some(acks), Some(sends), Some(trial)) = (
        env("REACTIFACT_SK_MODE"),
        env("REACTIFACT_SK_STORE"),
        env("REACTIFACT_SK_ACKS"),
        env("REACTIFACT_SK_SENDS"),
        env("REACTIFACT_SK_TRIAL"),
    ) else {
        return;
    };
    reactifact_examples::logs::init_service(false, "warn").expect("the child's logs");
    let sends = LineLog::open(sends.as_ref()).expect("the send log");
    block_on(async {
        let context = connect(&store).await;
        let outbox = context.outbox();
        let settings = Settings {
            model: StandInModel::new(MODEL_DELAY),
            delivery_concurrency: CONCURRENCY,
            ..Settings::default()
        };
        let dispatcher = logged(Mailer::new(SEND_DELAY, 0), sends);
        let mut runtime = shop::runtime_with(context, &settings, dispatcher).expect("the shop's runtime builds");
        let handle = runtime.handle();
        let serving = tokio::spawn(async move { runtime.serve(shop::POLL).await });
        if mode == "write" {
            // Orders from 8 tasks, each acknowledged once committed; until the kill.
            let acks = LineLog::open(acks.as_ref()).expect("the acknowledgement log");
            let next = Arc::new(AtomicU64::new(0));
            let writers: Vec<_> = (0..WRITERS)
                .map(|_| {
                    let (handle, acks, next, trial) = (handle.clone(), acks.clone(), next.clone(), trial.clone());
                    tokio::spawn(async move {
                        loop {
                            let i = next.fetch_add(1, Ordering::SeqCst);
                            if i >= MAX_ORDERS {
                                return;
                            }
                            let id = format!("t{trial}-{i}");
                            let order = Order {
                                customer: format!("customer {i}"),
                                email: format!("c{i}@example.com"),
                                total_cents: 100 + i,
                            };
                            let created = handle
                                .create_once(shop::order_id(&id), order)
                                .await
                                .expect("the runtime commits the order");
                            assert!(created, "{id} is new");
                            acks.line(&format!("A {id}")).expect("append the acknowledgement");
                        }
                    })
                })
                .collect();
            let writing = async {
                for writer in writers {
                    writer.await.expect("a writer");
                }
            };
            // Only an orphan gets past this (its parent failed): the parent kills the writer
            // long before.
            let _ = tokio::time::timeout(LIMIT, writing).await;
            eprintln!("the writer was not killed within {LIMIT:?}; exiting");
            std::process::exit(3);
        }
        // Resume: serve until every acknowledged order's confirmation is delivered.
        let mut waiting: BTreeSet<String> = read_lines(acks.as_ref())
            .iter()
            .map(|line| key_of(line.strip_prefix("A ").expect("an A line")))
            .collect();
        let started = Instant::now();
        while !waiting.is_empty() {
            let mut delivered = Vec::new();
            for key in &waiting {
                if let Some(entry) = outbox.get(key).await.expect("the ledger reads") {
                    if entry.status() == DeliveryStatus::Delivered {
                        delivered.push(key.clone());
                    }
                }
            }
            for key in delivered {
                waiting.remove(&key);
            }
            assert!(
                started.elapsed() < LIMIT,
                "{} acknowledged orders still undelivered, such as {:?}",
                waiting.len(),
                waiting.first()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        handle.stop();
        let report = serving.await.expect("the runtime's task").expect("the runtime serves");
        eprintln!(
            "resumed: {} runs, {} delivered, {} failed attempts",
            report.runs, report.delivered, report.failed
        );
    });
}

/// One trial's figures.
#[derive(Debug)]
struct Row {
    trial: usize,
    delay_ms: u64,
    acked: usize,
    /// `S` lines of the writer, and of the resumed process.
    writer_sends: usize,
    resumed_sends: usize,
    /// Acknowledged orders whose confirmation the writer had not sent when it was killed.
    resumed_keys: usize,
    /// Sends beyond the first per key.
    extras: usize,
    elapsed: Duration,
}

fn trial(dir: &Path, store: &Store, trial: usize, rng: &mut Rng) -> Row {
    let started = Instant::now();
    let name = format!("{}-{trial}", store.name());
    let acks = dir.join(format!("{name}.acks"));
    let sends = dir.join(format!("{name}.sends"));
    let spawn = |mode: &str| {
        let stderr = dir.join(format!("{name}-{mode}.stderr"));
        let env = [
            ("REACTIFACT_SK_MODE", mode.to_owned()),
            ("REACTIFACT_SK_STORE", store.url()),
            ("REACTIFACT_SK_ACKS", acks.display().to_string()),
            ("REACTIFACT_SK_SENDS", sends.display().to_string()),
            ("REACTIFACT_SK_TRIAL", trial.to_string()),
            ("RUST_LOG", "warn".to_owned()),
        ];
        let child = spawn_child(CHILD, &env, &stderr);
        (child, stderr)
    };

    let (mut writer, writer_stderr) = spawn("write");
    poll_until(
        LIMIT,
        "the writer acknowledges orders and sends confirmations",
        || assert_running(&mut writer, "the writer", &writer_stderr),
        || (read_lines(&acks).len() >= ACKED_BEFORE_KILL && read_lines(&sends).len() >= SENT_BEFORE_KILL).then_some(()),
    );
    let delay_ms = rng.range(0, KILL_WINDOW_MS + 1);
    std::thread::sleep(Duration::from_millis(delay_ms));
    writer.kill().expect("SIGKILL the writer");
    let status = wait_for(&mut writer, LIMIT, "the killed writer", &writer_stderr);
    assert!(killed_by_sigkill(status), "the writer ended otherwise: {status}");

    let acked: Vec<String> = read_lines(&acks)
        .iter()
        .map(|line| line.strip_prefix("A ").expect("an A line").to_owned())
        .collect();
    let writer_lines = read_lines(&sends);
    let sent_by_writer: BTreeSet<&str> = writer_lines
        .iter()
        .map(|line| line.split(' ').nth(1).expect("a key"))
        .collect();
    let resumed_keys = acked
        .iter()
        .filter(|id| !sent_by_writer.contains(key_of(id).as_str()))
        .count();

    let (mut resumed, resumed_stderr) = spawn("resume");
    let status = wait_for(&mut resumed, LIMIT, "the resumed service", &resumed_stderr);
    assert_success(status, "the resumed service", &resumed_stderr);

    // Every acknowledged order is stored, with its confirmation and its intent delivered.
    block_on(async {
        let ctx = connect(&store.url()).await;
        let ledger = ctx.ledger();
        for id in &acked {
            let order = shop::order_id(id);
            assert!(
                ctx.get::<Order>(&order).expect("the order reads").is_some(),
                "trial {trial}: the acknowledged order {order} is not in the store"
            );
            let confirmation = shop::confirmation_id(&order.as_str().into());
            assert!(
                ctx.get::<Confirmation>(&confirmation)
                    .expect("the confirmation reads")
                    .is_some(),
                "trial {trial}: {confirmation} is missing"
            );
            let key = key_of(id);
            let delivery = ledger
                .get(&key)
                .await
                .expect("the ledger reads")
                .expect("the intent is registered");
            assert_eq!(delivery.status(), DeliveryStatus::Delivered, "trial {trial}: {key}");
        }
    });

    // Every acknowledged key was sent; sends beyond the first per key ≤ the concurrency.
    let lines = read_lines(&sends);
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    for line in &lines {
        let parts: Vec<&str> = line.split(' ').collect();
        assert_eq!(parts.len(), 4, "malformed send line {line:?}");
        *per_key.entry(parts[1]).or_default() += 1;
    }
    for id in &acked {
        assert!(
            per_key.contains_key(key_of(id).as_str()),
            "trial {trial}: {id} was never sent"
        );
    }
    let extras: usize = per_key.values().map(|n| n - 1).sum();
    let repeated: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        extras <= CONCURRENCY,
        "trial {trial}: {extras} extra sends after one kill, more than the delivery concurrency {CONCURRENCY}: {repeated:?}"
    );
    Row {
        trial,
        delay_ms,
        acked: acked.len(),
        writer_sends: writer_lines.len(),
        resumed_sends: lines.len() - writer_lines.len(),
        resumed_keys,
        extras,
        elapsed: started.elapsed(),
    }
}

fn trials(store_of: impl Fn(&Path, usize) -> Store, tag: &str) {
    let count: usize = std::env::var("REACTIFACT_SERVE_KILL_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let seed: u64 = std::env::var("REACTIFACT_SERVE_KILL_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0x5e7e_c0de);
    let dir = scratch_dir(tag);
    let mut rng = Rng::new(seed);
    let mut rows = Vec::new();
    for n in 0..count {
        let store = store_of(&dir, n);
        let row = trial(&dir, &store, n, &mut rng);
        block_on(store.remove());
        rows.push(row);
    }
    eprintln!("{tag} (seed {seed}):");
    eprintln!("trial delay_ms acked writer_sends resumed_sends resumed_keys extras elapsed");
    for r in &rows {
        eprintln!(
            "{:>5} {:>8} {:>5} {:>12} {:>13} {:>12} {:>6} {:>7.1?}",
            r.trial, r.delay_ms, r.acked, r.writer_sends, r.resumed_sends, r.resumed_keys, r.extras, r.elapsed
        );
    }
    assert!(
        rows.iter().any(|r| r.resumed_keys > 0),
        "no kill left an acknowledged order for the restart to deliver: nothing was tested"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn acknowledged_writes_survive_a_sigkill_of_a_serving_process_on_sqlite() {
    trials(|dir, n| Store::sqlite(dir, &format!("trial-{n}")), "serve-kill-sqlite");
}

#[test]
fn acknowledged_writes_survive_a_sigkill_of_a_serving_process_on_postgres() {
    let Some(url) = postgres_url() else {
        println!(
            "skipped: {} is not set (CI sets it, and then this test runs)",
            procs::shop::POSTGRES_URL_VAR
        );
        return;
    };
    trials(|_, n| Store::postgres(&url, "serve_kill", n), "serve-kill-postgres");
}
