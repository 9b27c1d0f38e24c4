//! 20 SIGKILL trials of a worker process — a runtime on a PostgreSQL session that commits
//! generations and delivers their intents — while this process keeps writing new orders to the
//! same session: nothing is lost, every order is processed by exactly one committed run, and a
//! key is sent more than once only if a killed worker had it in flight (its lease expired and
//! another worker delivered it again, with the same key). Runs when
//! `REACTIFACT_TEST_POSTGRES_URL` is set (see `common`).

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::{Agent, Context, DeliveryOptions, DispatchError, Intent, OpenOptions, Runtime};

use common::flow::{create_retrying, open_store, order, process_order, processed_once};
use common::Schemas;

const TRIALS: u64 = 20;
const ORDERS_PER_TRIAL: u64 = 15;
const CONCURRENCY: usize = 4;
const LEASE: Duration = Duration::from_millis(400);

/// A tiny deterministic generator (xorshift), so that a failing trial can be rerun.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The worker: a no-op unless its variables are set. Serves the session until every intent
/// is delivered (or it is killed); its dispatcher appends each key it is handed to its file,
/// then takes 10–50 ms (so that a kill often finds deliveries in flight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_worker() {
    let (Ok(url), Ok(schema), Ok(sent)) = (
        std::env::var("RFT_WORKER_URL"),
        std::env::var("RFT_WORKER_SCHEMA"),
        std::env::var("RFT_WORKER_SENT"),
    ) else {
        return;
    };
    let total: u64 = std::env::var("RFT_WORKER_TOTAL").unwrap().parse().unwrap();
    let store = open_store(&url, &schema).await;
    let ctx = Context::open_store_with(store, "shop", OpenOptions::new().lease(LEASE))
        .await
        .unwrap();
    let file = Arc::new(std::sync::Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(sent)
            .unwrap(),
    ));
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("billing").produce(process_order()))
        .dispatcher(move |intent: Intent| {
            let file = file.clone();
            async move {
                writeln!(file.lock().unwrap(), "{}", intent.key()).unwrap();
                let pause = 10 + intent.key().as_str().bytes().map(u64::from).sum::<u64>() % 40;
                tokio::time::sleep(Duration::from_millis(pause)).await;
                Ok::<(), DispatchError>(())
            }
        })
        .delivery(DeliveryOptions::new().concurrency(CONCURRENCY))
        .build()
        .unwrap();
    loop {
        rt.context_mut().catch_up().await.unwrap();
        rt.run().await.unwrap();
        rt.settle().await.unwrap();
        let counts = rt.context().ledger().counts().await.unwrap();
        if counts.delivered >= total && rt.context().queued_events() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_loses_nothing_and_resends_only_what_it_had_in_flight() {
    let Some(url) = common::url("a_killed_worker_loses_nothing_and_resends_only_what_it_had_in_flight") else {
        return;
    };
    let schemas = Schemas::new(&url, "worker_kill");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    let mut ctx = Context::open_store(store.clone(), "shop").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let total = (TRIALS + 1) * ORDERS_PER_TRIAL;
    let mut rng = Rng(0x5eed_c0de_2026);
    let mut files: Vec<PathBuf> = Vec::new();
    let mut killed = 0;
    for trial in 0..=TRIALS {
        // New orders for this trial, written beside whatever a worker still commits.
        for i in 0..ORDERS_PER_TRIAL {
            create_retrying(&mut ctx, &format!("order:{trial}:{i}"), order(i)).await;
        }
        let sent = dir.path().join(format!("sent-{trial}"));
        files.push(sent.clone());
        let mut worker = Command::new(&exe)
            .args(["--exact", "child_worker", "--test-threads=1"])
            .env("RFT_WORKER_URL", &url)
            .env("RFT_WORKER_SCHEMA", &schema)
            .env("RFT_WORKER_SENT", &sent)
            .env("RFT_WORKER_TOTAL", total.to_string())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        if trial == TRIALS {
            // The last worker is left to finish: every intent delivered.
            let status = worker.wait().unwrap();
            assert!(status.success(), "the last worker failed");
        } else {
            // Killed at a random moment once it delivers (so that a slow start on a loaded
            // machine does not make every kill land before the worker did anything): mid-
            // generation, mid-delivery, between turns. Every third is killed at once instead,
            // wherever its start has got to.
            if trial % 3 != 0 {
                for _ in 0..1000 {
                    let delivering = std::fs::metadata(&sent).is_ok_and(|m| m.len() > 0);
                    if delivering || worker.try_wait().unwrap().is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(rng.below(150))).await;
            if worker.try_wait().unwrap().is_none() {
                worker.kill().unwrap();
                killed += 1;
            }
            worker.wait().unwrap();
        }
    }
    assert!(killed >= TRIALS / 2, "most workers were killed ({killed})");

    // Nothing lost: every order has its receipt, from exactly one committed run.
    ctx.catch_up().await.unwrap();
    ctx.verify().unwrap();
    assert_eq!(processed_once(&ctx).len() as u64, total, "every order was processed");

    // Every key delivered; a key sent twice had its lease expire under a killed worker.
    let mut sends: BTreeMap<String, u64> = BTreeMap::new();
    for file in &files {
        if let Ok(text) = std::fs::read_to_string(file) {
            for key in text.lines() {
                *sends.entry(key.to_owned()).or_default() += 1;
            }
        }
    }
    let page = ctx.ledger().page(None, None, 10_000).await.unwrap();
    assert_eq!(page.entries.len() as u64, total, "one intent per order");
    let mut extra = 0;
    let mut reclaimed = 0;
    for delivery in &page.entries {
        if delivery.expired_leases() > 0 {
            reclaimed += 1;
        }
        let key = delivery.key().as_str();
        assert_eq!(delivery.status(), DeliveryStatus::Delivered, "{key}");
        let sent = sends.get(key).copied().unwrap_or(0);
        assert!(sent >= 1, "{key} was never handed to a dispatcher");
        if sent > 1 {
            // Each send after the first followed the expiry of a killed worker's lease.
            assert!(
                u64::from(delivery.expired_leases()) >= sent - 1,
                "{key} was sent {sent} times but only {} of its leases expired: {delivery:?}",
                delivery.expired_leases()
            );
            extra += sent - 1;
        }
    }
    // At most what the killed workers could have had in flight.
    assert!(
        extra <= killed * CONCURRENCY as u64,
        "{extra} extra sends from {killed} kills"
    );
    // The kills did land mid-delivery: some keys were reclaimed from a dead worker's lease.
    assert!(reclaimed > 0, "no kill found a delivery in flight");
    println!(
        "{killed} workers killed, {reclaimed} keys reclaimed from them, {extra} extra sends, {total} keys delivered"
    );
}
