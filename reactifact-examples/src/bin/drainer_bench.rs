//! Delivery throughput of standalone drainer processes on one store: N committed intents,
//! drained by K processes at once, each a `Drainer` over `SqliteOutbox::open(path)`, or, with
//! `--store postgres`, over `PostgresOutbox::open` of one schema of a PostgreSQL database
//! (the URL from `--url`, or `REACTIFACT_TEST_POSTGRES_URL`).
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin drainer-bench -- 20000 --drainers 2 --concurrency 64
//! cargo run --release -p reactifact-examples --bin drainer-bench -- 100000 --drainers 4 --store postgres \
//!     --url postgres://postgres@127.0.0.1:5432/test
//! ```
//!
//! On PostgreSQL the intents are registered as commits of session `bench` would register them
//! (1,000 per transaction, through `PostgresOutbox::register`), in a schema of the run's own,
//! dropped at the end (registering directly keeps the commits out of the measurement).
//!
//! `--dispatch-ms D` makes each delivery await D ms (a tokio sleep: a dispatcher waiting on a
//! remote service) before it succeeds; the default 0 returns at once.
//!
//! `--groups G` (PostgreSQL) puts intent `i` in the ordering group `order:{i % G}`: each
//! group's intents must reach the receiver one at a time, in registration order. Each child
//! writes when each dispatch started and ended (the host's clock); the parent checks that in
//! every group each dispatch started after the one before it ended, and reports the
//! violations (`order_violations`; any fails the run).
//!
//! Prints one JSON line: n, drainers, concurrency, dispatch_ms, groups, store, synchronous,
//! seconds, deliveries_per_sec, sent, distinct, exactly_once, order_violations. The time runs from the drainers' start
//! until the store has nothing pending or in flight (`next_due` is none, read every 5 ms through
//! the partial indexes), and the counts then say every intent is delivered. Exits non-zero
//! unless every intent was delivered exactly once across all processes (each child writes the
//! keys it sent to a file of its own; the parent checks them: `exactly_once`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use reactifact_core::audit::{CommitHash, ContentHash};
use reactifact_core::runtime::{Budget, Generation, Origin};
use reactifact_core::store::{NewIntent, OutboxStore, SqliteOutbox, Synchronous};
use reactifact_core::{
    ActionKey, Agent, Context, DeliveryOptions, DispatchError, Drainer, Intent, OpenOptions, PendingAction, Runtime,
};
use reactifact_examples::order_flow::{process_order, Order};
use reactifact_postgres::{PostgresOptions, PostgresOutbox};
use sha2::Digest as _;

struct Options {
    n: u64,
    drainers: usize,
    concurrency: usize,
    dispatch_ms: u64,
    synchronous: Synchronous,
    /// `Some(url)` for `--store postgres`.
    postgres: Option<String>,
    /// Ordering groups (0: none).
    groups: u64,
}

fn parse(args: &mut impl Iterator<Item = String>) -> Result<Options, String> {
    let mut options = Options {
        n: 20_000,
        drainers: 1,
        concurrency: 64,
        dispatch_ms: 0,
        synchronous: Synchronous::Full,
        postgres: None,
        groups: 0,
    };
    let mut store = "sqlite".to_owned();
    let mut url = std::env::var("REACTIFACT_TEST_POSTGRES_URL").ok();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--drainers" => options.drainers = value("--drainers")?.parse().map_err(|e| format!("--drainers: {e}"))?,
            "--concurrency" => {
                options.concurrency = value("--concurrency")?
                    .parse()
                    .map_err(|e| format!("--concurrency: {e}"))?
            }
            "--dispatch-ms" => {
                options.dispatch_ms = value("--dispatch-ms")?
                    .parse()
                    .map_err(|e| format!("--dispatch-ms: {e}"))?
            }
            "--groups" => options.groups = value("--groups")?.parse().map_err(|e| format!("--groups: {e}"))?,
            "--normal" => options.synchronous = Synchronous::Normal,
            "--store" => store = value("--store")?,
            "--url" => url = Some(value("--url")?),
            n => options.n = n.parse().map_err(|e| format!("N: {e}"))?,
        }
    }
    match store.as_str() {
        "sqlite" => {}
        "postgres" => {
            options.postgres = Some(url.ok_or("--store postgres needs --url or REACTIFACT_TEST_POSTGRES_URL")?);
        }
        other => return Err(format!("--store: `{other}` is neither sqlite nor postgres")),
    }
    if options.groups > 0 && options.postgres.is_none() {
        return Err("--groups needs --store postgres".to_owned());
    }
    Ok(options)
}

/// Registers `n` intents in a new schema of the PostgreSQL database, as commits of session
/// `bench` (1,000 intents each) would: each a `PendingAction` encoded and hashed as a commit
/// encodes and hashes it.
async fn prepare_postgres(url: &str, schema: &str, n: u64, groups: u64) -> Result<Arc<PostgresOutbox>, String> {
    let outbox = PostgresOutbox::open(PostgresOptions::new(url).schema(schema))
        .await
        .map_err(|e| e.to_string())?;
    let mut generation = 0;
    let mut i = 0;
    while i < n {
        generation += 1;
        let end = (i + 1000).min(n);
        let intents: Vec<NewIntent> = (i..end)
            .map(|i| {
                let key = format!("order-confirmation:{i}");
                let payload = rmp_serde::to_vec_named(&format!("c{i}@example.com")).expect("a string encodes");
                let action = PendingAction {
                    kind: "email".to_owned(),
                    key: key.clone(),
                    payload: payload.clone(),
                    requires_approval: false,
                    not_before: None,
                    group: (groups > 0).then(|| format!("order:{}", i % groups)),
                };
                let bytes = rmp_serde::to_vec_named(&action).expect("a PendingAction encodes");
                let origin = Origin::new("bench", CommitHash([generation as u8; 32]), Generation(generation), 0);
                NewIntent {
                    intent: Intent::new(ActionKey::from(key), "email", payload, origin, 0),
                    action_hash: ContentHash(sha2::Sha256::digest(&bytes).into()),
                    bytes: Arc::from(bytes),
                }
            })
            .collect();
        outbox
            .register_alone(&intents, std::time::SystemTime::now())
            .await
            .map_err(|e| e.to_string())?;
        i = end;
    }
    Ok(outbox)
}

/// Commits `n` intents to a new file, with no dispatcher: they wait in its outbox.
async fn prepare(path: &Path, options: &Options) -> Result<(), String> {
    let open = OpenOptions::new().synchronous(options.synchronous);
    let mut ctx = Context::open_with(path, "bench", open).map_err(|e| e.to_string())?;
    let mut tx = ctx.transaction();
    for i in 0..options.n {
        tx.create(
            format!("order:{i}"),
            Order {
                customer: format!("c{i}@example.com"),
                total_cents: i,
            },
        );
    }
    tx.commit().map_err(|e| e.to_string())?;
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("orders").produce(process_order()))
        .budget(Budget::UNLIMITED)
        .build()
        .map_err(|e| e.to_string())?;
    rt.run().await.map_err(|e| e.to_string())?;
    Ok(())
}

/// In a child: drains the store (a file's path, or `postgres URL SCHEMA`) until nothing
/// waits, writing the keys it sent to `out`, one a line, each with when its dispatch started
/// and ended (nanoseconds since the Unix epoch, tab-separated).
async fn drain(store: &[String], out: &Path, concurrency: usize, dispatch_ms: u64) -> Result<(), String> {
    let outbox: Arc<dyn OutboxStore> = match store {
        [path] => SqliteOutbox::open(path).map_err(|e| e.to_string())?,
        [_, url, schema] => PostgresOutbox::open(PostgresOptions::new(url).schema(schema))
            .await
            .map_err(|e| e.to_string())?,
        _ => return Err("a store is a path or `postgres URL SCHEMA`".to_owned()),
    };
    let sent = Arc::new(Mutex::new(Vec::new()));
    let record = sent.clone();
    let delay = std::time::Duration::from_millis(dispatch_ms);
    let nanos = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    };
    let drainer = Drainer::builder(outbox, move |intent: Intent| {
        let record = record.clone();
        let started = nanos();
        async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let ended = nanos();
            record
                .lock()
                .unwrap()
                .push(format!("{}\t{started}\t{ended}", intent.key()));
            Ok::<(), DispatchError>(())
        }
    })
    .delivery(DeliveryOptions::new().concurrency(concurrency))
    .build()
    .map_err(|e| e.to_string())?;
    drainer.settle().await.map_err(|e| e.to_string())?;
    let keys = sent.lock().unwrap().join("\n");
    std::fs::write(out, keys).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("--child") {
        let mut rest: Vec<String> = args.skip(1).collect();
        let dispatch_ms = rest.pop().and_then(|c| c.parse().ok());
        let concurrency = rest.pop().and_then(|c| c.parse().ok());
        let out = rest.pop();
        let (Some(out), Some(concurrency), Some(dispatch_ms)) = (out, concurrency, dispatch_ms) else {
            eprintln!("--child (PATH | postgres URL SCHEMA) OUT CONCURRENCY DISPATCH_MS");
            return ExitCode::from(2);
        };
        return match runtime.block_on(drain(&rest, Path::new(&out), concurrency, dispatch_ms)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("drainer: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let options = match parse(&mut args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("drainer-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let dir = std::env::temp_dir().join(format!("drainer-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let path = dir.join("bench.db");
    let schema = format!("drainer_bench_{}", std::process::id());
    let (store, watcher, postgres): (Vec<String>, Arc<dyn OutboxStore>, _) = match &options.postgres {
        None => {
            if let Err(e) = runtime.block_on(prepare(&path, &options)) {
                eprintln!("drainer-bench: {e}");
                return ExitCode::FAILURE;
            }
            let watcher = SqliteOutbox::open(&path).expect("the file's outbox");
            (vec![path.display().to_string()], watcher, None)
        }
        Some(url) => match runtime.block_on(prepare_postgres(url, &schema, options.n, options.groups)) {
            Ok(outbox) => (
                vec!["postgres".to_owned(), url.clone(), schema.clone()],
                outbox.clone() as Arc<dyn OutboxStore>,
                Some(outbox),
            ),
            Err(e) => {
                eprintln!("drainer-bench: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let exe = std::env::current_exe().expect("the benchmark's own path");
    let outs: Vec<PathBuf> = (0..options.drainers).map(|k| dir.join(format!("sent-{k}"))).collect();
    let started = Instant::now();
    let children: Vec<_> = outs
        .iter()
        .map(|out| {
            Command::new(&exe)
                .arg("--child")
                .args(&store)
                .arg(out)
                .arg(options.concurrency.to_string())
                .arg(options.dispatch_ms.to_string())
                .spawn()
                .expect("a drainer process")
        })
        .collect();
    // The time until the store has nothing pending or in flight (the children's own settles
    // then take up to a second more to see that the others are done). `next_due` reads the
    // partial indexes of due rows and leases: cheap next to the drain it watches (a count of
    // the whole table every few ms would not be).
    let all = reactifact_core::Scope::all();
    let delivered = runtime.block_on(async {
        loop {
            if matches!(watcher.next_due(&all).await, Ok(None) | Err(_)) {
                return started.elapsed();
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    });
    let counted = runtime.block_on(watcher.counts(&all)).map_or(0, |c| c.delivered);
    let mut ok = true;
    for mut child in children {
        ok &= child.wait().is_ok_and(|status| status.success());
    }
    {
        if let Some(outbox) = postgres {
            let dropped = runtime.block_on(async {
                let client = outbox.pool().get().await.map_err(|e| e.to_string())?;
                client
                    .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
                    .await
                    .map_err(|e| e.to_string())
            });
            if let Err(e) = dropped {
                eprintln!("drainer-bench: the schema {schema} could not be dropped: {e}");
            }
        }
    }
    drop(watcher);
    let seconds = delivered.as_secs_f64();
    let mut seen = HashSet::new();
    let mut total = 0u64;
    // Each key's dispatch (start, end), by its intent's number.
    let mut dispatches: Vec<(u64, u128, u128)> = Vec::new();
    for out in &outs {
        for line in std::fs::read_to_string(out).unwrap_or_default().lines() {
            let mut fields = line.split('\t');
            let key = fields.next().unwrap_or_default();
            let mut time = || fields.next().and_then(|t| t.parse::<u128>().ok()).unwrap_or(0);
            let (started, ended) = (time(), time());
            total += 1;
            seen.insert(key.to_owned());
            if let Some(i) = key.rsplit(':').next().and_then(|i| i.parse().ok()) {
                dispatches.push((i, started, ended));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let order_violations = order_violations(&mut dispatches, options.groups);
    let exactly_once = ok && total == options.n && seen.len() as u64 == options.n && counted == options.n;
    println!(
        "{{\"n\":{},\"drainers\":{},\"concurrency\":{},\"dispatch_ms\":{},\"groups\":{},\"store\":\"{}\",\"synchronous\":\"{:?}\",\"seconds\":{seconds:.3},\"deliveries_per_sec\":{:.0},\"sent\":{total},\"distinct\":{},\"exactly_once\":{exactly_once},\"order_violations\":{order_violations}}}",
        options.n,
        options.drainers,
        options.concurrency,
        options.dispatch_ms,
        options.groups,
        if options.postgres.is_some() { "postgres" } else { "sqlite" },
        options.synchronous,
        options.n as f64 / seconds,
        seen.len()
    );
    if order_violations > 0 {
        eprintln!("drainer-bench: {order_violations} dispatches of a group started before the one ahead of them ended");
        return ExitCode::FAILURE;
    }
    if !exactly_once {
        eprintln!(
            "drainer-bench: expected each of {} keys sent once and delivered; sent {total}, {} distinct, {counted} delivered",
            options.n,
            seen.len()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// How many dispatches started before the dispatch of the intent ahead of them in their group
/// (intent `i` is in group `i % groups`) had ended; 0 without groups.
fn order_violations(dispatches: &mut [(u64, u128, u128)], groups: u64) -> usize {
    if groups == 0 {
        return 0;
    }
    dispatches.sort_unstable_by_key(|&(i, ..)| (i % groups, i));
    dispatches
        .windows(2)
        .filter(|w| w[0].0 % groups == w[1].0 % groups && w[1].1 < w[0].2)
        .count()
}
