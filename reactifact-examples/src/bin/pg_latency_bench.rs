//! Commit → delivered latency on PostgreSQL: orders committed at a steady rate, delivered by a
//! serving `Drainer` that the store's `LISTEN`/`NOTIFY` wakes.
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin pg-latency-bench -- --rate 500 --seconds 20 \
//!     --url postgres://postgres@127.0.0.1:5432/test [--register-only]
//! ```
//!
//! By default the orders go through the whole runtime: a serving `Runtime` over
//! `Context::open_store` (a `PostgresStore`, no dispatcher of its own) takes each order as a
//! write through its `RuntimeHandle` (one commit), runs `process_order` on what arrived (one
//! generation, whose commit registers the intents and notifies), and a serving `Drainer` of the
//! store's outbox delivers them. Order `i` is written at `start + i / rate` (never earlier; a
//! late write is not made up for by a burst); its latency runs from the moment its write has
//! committed to the moment the drainer hands its intent to the dispatcher — so it covers the
//! generation (produce and commit) as well as the hand-over to the drainer.
//!
//! With `--register-only`, a "commit" is instead a transaction of its own that registers one
//! order's intent through `PostgresOutbox::register` (`BEGIN`, the insert, `pg_notify`,
//! `COMMIT`), and the latency runs from its `COMMIT` being sent: the outbox's share alone.
//! The drainer (concurrency 64, poll interval 250 ms, so a missed notification would show as
//! a latency of up to 250 ms) runs in the same process (one tokio thread) on its own connections. The schema is
//! the run's own, dropped at the end of a run that succeeds.
//!
//! Prints one JSON line: rate, n, seconds, achieved_rate, p50_ms, p90_ms, p99_ms, max_ms,
//! exactly_once. Exits non-zero unless every intent was handed out exactly once.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use reactifact_core::audit::{CommitHash, ContentHash};
use reactifact_core::runtime::{Generation, Origin};
use reactifact_core::store::{NewIntent, OutboxStore};
use reactifact_core::{
    ActionKey, Agent, Context, DeliveryOptions, DispatchError, Drainer, Intent, PendingAction, Runtime,
};
use reactifact_examples::order_flow::{process_order, Order};
use reactifact_postgres::{PostgresOptions, PostgresStore};
use sha2::Digest as _;

struct Options {
    rate: u64,
    seconds: u64,
    url: String,
    register_only: bool,
}

fn parse() -> Result<Options, String> {
    let mut rate = 500;
    let mut seconds = 20;
    let mut url = std::env::var("REACTIFACT_TEST_POSTGRES_URL").ok();
    let mut register_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--rate" => rate = value("--rate")?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--seconds" => seconds = value("--seconds")?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--url" => url = Some(value("--url")?),
            "--register-only" => register_only = true,
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(Options {
        rate: rate.max(1),
        seconds: seconds.max(1),
        url: url.ok_or("needs --url or REACTIFACT_TEST_POSTGRES_URL")?,
        register_only,
    })
}

/// The intent of order `i`, encoded and hashed as a commit encodes and hashes it.
fn intent(i: u64) -> NewIntent {
    let key = format!("order-confirmation:{i}");
    let payload = rmp_serde::to_vec_named(&format!("c{i}@example.com")).expect("a string encodes");
    let action = PendingAction {
        kind: "email".to_owned(),
        key: key.clone(),
        payload: payload.clone(),
        requires_approval: false,
        not_before: None,
        group: None,
    };
    let bytes = rmp_serde::to_vec_named(&action).expect("a PendingAction encodes");
    let origin = Origin::new("bench", CommitHash([(i % 251) as u8; 32]), Generation(i + 1), 0);
    NewIntent {
        intent: Intent::new(ActionKey::from(key), "email", payload, origin, 0),
        action_hash: ContentHash(sha2::Sha256::digest(&bytes).into()),
        bytes: Arc::from(bytes),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn run(options: &Options, schema: &str) -> Result<String, String> {
    let store = PostgresStore::open(PostgresOptions::new(&options.url).schema(schema).pool_size(8))
        .await
        .map_err(|e| e.to_string())?;
    let outbox = store.outbox().clone();
    let n = options.rate * options.seconds;
    let committed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let handed: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let drainer = {
        let handed = handed.clone();
        Drainer::builder(outbox.clone() as Arc<dyn OutboxStore>, move |intent: Intent| {
            handed.lock().unwrap().push((intent.key().to_string(), Instant::now()));
            std::future::ready(Ok::<(), DispatchError>(()))
        })
        .delivery(DeliveryOptions::new().concurrency(64))
        .build()
        .map_err(|e| e.to_string())?
    };
    let stop = drainer.stop_handle();
    let serving = {
        let stop = stop.clone();
        tokio::spawn(async move { drainer.serve(stop).await.map(|r| r.delivered) })
    };
    // The runtime that takes the orders (none in `--register-only`).
    let runtime = if options.register_only {
        None
    } else {
        let ctx = Context::open_store(store.clone(), "bench")
            .await
            .map_err(|e| e.to_string())?;
        let mut rt = Runtime::builder(ctx)
            .agent(Agent::new("billing").produce(process_order))
            .build()
            .map_err(|e| e.to_string())?;
        let handle = rt.handle();
        let task = tokio::spawn(async move { rt.serve(Duration::from_millis(250)).await.map(|r| r.generations) });
        Some((handle, task))
    };
    // Let the listener connect before the first commit.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let interval = Duration::from_secs_f64(1.0 / options.rate as f64);
    let started = Instant::now();
    let mut writes = Vec::new();
    for i in 0..n {
        let due = started + interval.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        match &runtime {
            Some((handle, _)) => {
                // The write resolves once committed; the orders keep arriving meanwhile.
                let (handle, committed) = (handle.clone(), committed.clone());
                writes.push(tokio::spawn(async move {
                    let id = format!("order:{i}");
                    let order = Order {
                        customer: format!("c{i}@example.com"),
                        total_cents: i,
                    };
                    handle.create(id.clone(), order).await.map_err(|e| e.to_string())?;
                    committed.lock().unwrap().insert(format!("notify:{id}"), Instant::now());
                    Ok::<(), String>(())
                }));
            }
            None => {
                let new = [intent(i)];
                let mut client = outbox.pool().get().await.map_err(|e| e.to_string())?;
                let tx = client.transaction().await.map_err(|e| e.to_string())?;
                outbox
                    .register(&*tx, &new, SystemTime::now())
                    .await
                    .map_err(|e| e.to_string())?;
                committed
                    .lock()
                    .unwrap()
                    .insert(new[0].intent.key().to_string(), Instant::now());
                tx.commit().await.map_err(|e| e.to_string())?;
            }
        }
    }
    for write in writes {
        write.await.map_err(|e| e.to_string())??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let waited = Instant::now();
    while (handed.lock().unwrap().len() as u64) < n {
        if waited.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Everything handed out; the drainer records its last outcomes as it stops.
    stop.stop();
    if let Some((handle, task)) = runtime {
        handle.stop();
        task.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    }
    let delivered = serving.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    let handed = std::mem::take(&mut *handed.lock().unwrap());
    let committed = std::mem::take(&mut *committed.lock().unwrap());
    let mut latencies = Vec::with_capacity(handed.len());
    let mut seen = std::collections::HashSet::new();
    for (key, at) in &handed {
        seen.insert(key.clone());
        if let Some(sent) = committed.get(key) {
            latencies.push(at.saturating_duration_since(*sent).as_secs_f64() * 1000.0);
        }
    }
    latencies.sort_by(f64::total_cmp);
    let exactly_once = handed.len() as u64 == n && seen.len() as u64 == n && delivered == n;
    let client = outbox.pool().get().await.map_err(|e| e.to_string())?;
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .map_err(|e| e.to_string())?;
    Ok(format!(
        "{{\"bench\":\"pg-latency\",\"commits\":\"{}\",\"rate\":{},\"n\":{n},\"seconds\":{seconds:.3},\"achieved_rate\":{:.1},\"p50_ms\":{:.3},\"p90_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3},\"handed\":{},\"exactly_once\":{exactly_once}}}",
        if options.register_only { "register" } else { "runtime" },
        options.rate,
        n as f64 / seconds,
        percentile(&latencies, 50.0),
        percentile(&latencies, 90.0),
        percentile(&latencies, 99.0),
        latencies.last().copied().unwrap_or(f64::NAN),
        handed.len(),
    ))
    .and_then(|line| {
        if exactly_once {
            Ok(line)
        } else {
            Err(format!("{line}\nnot every intent was handed out exactly once"))
        }
    })
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(e) => {
            eprintln!(
                "pg-latency-bench: {e}\nusage: pg-latency-bench [--rate R] [--seconds S] [--url URL] [--register-only]"
            );
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let schema = format!("latency_bench_{}", std::process::id());
    match runtime.block_on(run(&options, &schema)) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pg-latency-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
