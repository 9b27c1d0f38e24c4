//! The PostgreSQL outbox while another transaction pins the xmin horizon: claim latency and
//! dead tuples before, during and after a `REPEATABLE READ` transaction that holds its
//! snapshot for 60 s, with and without pruning.
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin pg-xmin-bench -- --url postgres://postgres@127.0.0.1:5432/test
//! cargo run --release -p reactifact-examples --bin pg-xmin-bench -- --prune      # prune every second
//! cargo run --release -p reactifact-examples --bin pg-xmin-bench -- --before 20 --pin 60 --after 60 --rate 1000
//! ```
//!
//! The workload, in one process, for `before + pin + after` seconds: a producer registers
//! `rate` intents a second (10 per transaction, through `PostgresOutbox::register_alone`);
//! one consumer claims up to 64 at a time (`OutboxStore::claim`, lease 30 s), records them
//! delivered in one batch (`OutboxStore::record`), and sleeps 2 ms after an empty claim. With
//! `--prune`, `prune_every(1 s, older than 2 s)` deletes the delivered rows as it goes. After
//! `before` seconds a connection of its own runs `BEGIN ISOLATION LEVEL REPEATABLE READ;
//! SELECT 1` and keeps the transaction open for `pin` seconds (its snapshot holds back the
//! xmin horizon of the whole server: no row version deleted after it may be vacuumed), then
//! commits. Autovacuum runs with the server's settings.
//!
//! Prints a JSON line every 5 s (`"sample"`) and one per phase at the end (`"phase"`): claims
//! made, the p50/p99 latency of claims that took at least one intent (and of all claims), of
//! records, the outbox table's `n_dead_tup`/`n_live_tup` from `pg_stat_user_tables` (the
//! statistics lag by up to a second or so), its size with indexes, autovacuums so far, and
//! the age of the oldest transaction holding a snapshot on the server (`oldest_snapshot_s`:
//! the pin's while it runs; anyone else's shows here too, and pins the other phases). The
//! schema is the run's own, dropped at the end.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use reactifact_core::audit::{CommitHash, ContentHash};
use reactifact_core::runtime::{Generation, Origin};
use reactifact_core::store::{ClaimPolicy, ClaimRequest, NewIntent, OutboxStore, Outcome, Recording};
use reactifact_core::{ActionKey, Intent, PendingAction, Scope};
use reactifact_postgres::{PostgresOptions, PostgresOutbox, PruneOptions};
use sha2::Digest as _;

struct Options {
    url: String,
    before: u64,
    pin: u64,
    after: u64,
    rate: u64,
    prune: bool,
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        url: std::env::var("REACTIFACT_TEST_POSTGRES_URL").unwrap_or_default(),
        before: 20,
        pin: 60,
        after: 60,
        rate: 1000,
        prune: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let mut number =
            |name: &str| -> Result<u64, String> { value(name)?.parse().map_err(|e| format!("{name}: {e}")) };
        match arg.as_str() {
            "--url" => options.url = value("--url")?,
            "--before" => options.before = number("--before")?,
            "--pin" => options.pin = number("--pin")?,
            "--after" => options.after = number("--after")?,
            "--rate" => options.rate = number("--rate")?.max(10),
            "--prune" => options.prune = true,
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if options.url.is_empty() {
        return Err("needs --url or REACTIFACT_TEST_POSTGRES_URL".into());
    }
    Ok(options)
}

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
    let origin = Origin::new("bench", CommitHash([(i % 251) as u8; 32]), Generation(i / 10 + 1), 0);
    NewIntent {
        intent: Intent::new(ActionKey::from(key), "email", payload, origin, 0),
        action_hash: ContentHash(sha2::Sha256::digest(&bytes).into()),
        bytes: Arc::from(bytes),
    }
}

/// Latencies (ms) since the last sample.
#[derive(Default)]
struct Window {
    claims: Vec<f64>,
    nonempty: Vec<f64>,
    records: Vec<f64>,
    delivered: u64,
}

fn pct(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

struct Stats {
    dead: i64,
    live: i64,
    bytes: i64,
    autovacuums: i64,
    /// The oldest transaction holding a snapshot on the server (seconds): ours while pinned,
    /// anyone's otherwise.
    oldest_snapshot_s: f64,
}

async fn stats(outbox: &PostgresOutbox) -> Result<Stats, String> {
    let client = outbox.pool().get().await.map_err(|e| e.to_string())?;
    let row = client
        .query_one(
            "SELECT coalesce(n_dead_tup, 0), coalesce(n_live_tup, 0), pg_total_relation_size(relid), autovacuum_count
               FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'",
            &[&outbox.schema()],
        )
        .await
        .map_err(|e| e.to_string())?;
    let oldest = client
        .query_one(
            "SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0)::float8 FROM pg_stat_activity
              WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(Stats {
        dead: row.get(0),
        live: row.get(1),
        bytes: row.get(2),
        autovacuums: row.get(3),
        oldest_snapshot_s: oldest.get(0),
    })
}

fn line(kind: &str, phase: &str, t: f64, w: &mut Window, s: &Stats, prune: bool) -> String {
    format!(
        "{{\"bench\":\"pg-xmin\",\"{kind}\":\"{phase}\",\"prune\":{prune},\"t\":{t:.1},\"claims\":{},\"delivered\":{},\"claim_p50_ms\":{:.3},\"claim_p99_ms\":{:.3},\"all_claims_p50_ms\":{:.3},\"all_claims_p99_ms\":{:.3},\"record_p50_ms\":{:.3},\"record_p99_ms\":{:.3},\"n_dead_tup\":{},\"n_live_tup\":{},\"table_bytes\":{},\"autovacuums\":{},\"oldest_snapshot_s\":{:.0}}}",
        w.claims.len(),
        w.delivered,
        pct(&mut w.nonempty, 50.0),
        pct(&mut w.nonempty, 99.0),
        pct(&mut w.claims, 50.0),
        pct(&mut w.claims, 99.0),
        pct(&mut w.records, 50.0),
        pct(&mut w.records, 99.0),
        s.dead,
        s.live,
        s.bytes,
        s.autovacuums,
        s.oldest_snapshot_s,
    )
}

async fn run(options: &Options, schema: &str) -> Result<(), String> {
    let outbox = PostgresOutbox::open(PostgresOptions::new(&options.url).schema(schema).pool_size(8))
        .await
        .map_err(|e| e.to_string())?;
    let total = Duration::from_secs(options.before + options.pin + options.after);
    let started = Instant::now();
    let window: Arc<Mutex<Window>> = Arc::default();
    let phase_window: Arc<Mutex<Window>> = Arc::default();

    let producer = {
        let outbox = outbox.clone();
        let every = Duration::from_secs_f64(10.0 / options.rate as f64);
        tokio::spawn(async move {
            let mut i = 0u64;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while started.elapsed() < total {
                tick.tick().await;
                let batch: Vec<NewIntent> = (i..i + 10).map(intent).collect();
                i += 10;
                outbox
                    .register_alone(&batch, SystemTime::now())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<u64, String>(i)
        })
    };
    let consumer = {
        let outbox = outbox.clone();
        let (window, phase_window) = (window.clone(), phase_window.clone());
        tokio::spawn(async move {
            let owner: Arc<str> = Arc::from("xmin-bench");
            while started.elapsed() < total {
                let t = Instant::now();
                let claimed = outbox
                    .claim(ClaimRequest {
                        scope: &Scope::all(),
                        limit: 64,
                        owner: &owner,
                        lease: Duration::from_secs(30),
                        now: SystemTime::now(),
                        policy: ClaimPolicy::none(),
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                let claim_ms = t.elapsed().as_secs_f64() * 1000.0;
                let n = claimed.claims.len();
                let mut record_ms = None;
                if n > 0 {
                    let outcomes: Vec<Recording> = claimed
                        .claims
                        .iter()
                        .map(|d| Recording {
                            key: d.key().clone(),
                            token: d.token(),
                            outcome: Outcome::Delivered,
                        })
                        .collect();
                    let t = Instant::now();
                    outbox
                        .record(&outcomes, SystemTime::now())
                        .await
                        .map_err(|e| e.to_string())?;
                    record_ms = Some(t.elapsed().as_secs_f64() * 1000.0);
                }
                for w in [&window, &phase_window] {
                    let mut w = w.lock().unwrap();
                    w.claims.push(claim_ms);
                    if n > 0 {
                        w.nonempty.push(claim_ms);
                        w.delivered += n as u64;
                    }
                    w.records.extend(record_ms);
                }
                if n == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            Ok::<(), String>(())
        })
    };
    let (stop_pruner, pruner_stopped) = tokio::sync::oneshot::channel::<()>();
    let pruner = options.prune.then(|| {
        let outbox = outbox.clone();
        tokio::spawn(async move {
            outbox
                .prune_every(
                    Duration::from_secs(1),
                    PruneOptions::older_than(Duration::from_secs(2)),
                    async {
                        let _ = pruner_stopped.await;
                    },
                )
                .await
        })
    });

    let phases = [
        ("before", options.before),
        ("pinned", options.pin),
        ("after", options.after),
    ];
    let mut summaries = Vec::new();
    let mut phase_end = Duration::ZERO;
    let mut pin = None;
    for (name, seconds) in phases {
        if name == "pinned" {
            let client = outbox.pool().get().await.map_err(|e| e.to_string())?;
            client
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
                .await
                .map_err(|e| e.to_string())?;
            pin = Some(client);
        }
        if name == "after" {
            if let Some(client) = pin.take() {
                client.batch_execute("COMMIT").await.map_err(|e| e.to_string())?;
            }
        }
        phase_end += Duration::from_secs(seconds);
        loop {
            let left = phase_end.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            tokio::time::sleep(left.min(Duration::from_secs(5))).await;
            let s = stats(&outbox).await?;
            let mut w = std::mem::take(&mut *window.lock().unwrap());
            println!(
                "{}",
                line(
                    "sample",
                    name,
                    started.elapsed().as_secs_f64(),
                    &mut w,
                    &s,
                    options.prune
                )
            );
        }
        let s = stats(&outbox).await?;
        let mut w = std::mem::take(&mut *phase_window.lock().unwrap());
        summaries.push(line(
            "phase",
            name,
            started.elapsed().as_secs_f64(),
            &mut w,
            &s,
            options.prune,
        ));
    }
    producer.await.map_err(|e| e.to_string())??;
    consumer.await.map_err(|e| e.to_string())??;
    let _ = stop_pruner.send(());
    if let Some(pruner) = pruner {
        let summary = pruner.await.map_err(|e| e.to_string())?;
        eprintln!(
            "pruned {} rows in {} passes ({} failed)",
            summary.deleted, summary.passes, summary.failed
        );
    }
    for summary in summaries {
        println!("{summary}");
    }
    let client = outbox.pool().get().await.map_err(|e| e.to_string())?;
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("pg-xmin-bench: {e}\nusage: pg-xmin-bench [--url URL] [--before S] [--pin S] [--after S] [--rate R] [--prune]");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let schema = format!("xmin_bench_{}", std::process::id());
    match runtime.block_on(run(&options, &schema)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pg-xmin-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
