//! `outbox-bench`: the outbox workload of the Python reference (`shared/peer/outbox_peer.py`)
//! on the Rust runtime, for throughput, linearity and memory measurements.
//!
//! N orders are seeded; one produce per order writes a receipt and a `notify` intent; an
//! in-process dispatcher records every key it is handed. The orders arrive in G batches
//! (seed N/G orders, run a turn, repeat). With `--standing M`, about M artifacts are stored
//! first (M/3 orders already processed: order, receipt and pending action each, all
//! delivered) and only the N new orders are timed.
//!
//! The store is `memory` (default), `sqlite` (an embedded SQLite file, `synchronous = FULL`:
//! one fsync per generation) or `sqlite-normal` (`synchronous = NORMAL`). The SQLite file is
//! created fresh under `--db DIR` (default: the system's temporary directory) and removed
//! after the run. `postgres` is the PostgreSQL store (`PostgresStore`, on the server at `--url`
//! or `REACTIFACT_TEST_POSTGRES_URL`), in a new schema of the run's own, dropped after it.
//!
//! Prints one JSON line per run and exits non-zero unless every key of the timed orders was
//! delivered exactly once. Each line also has the workload's floor, measured in the same
//! process just before the run: per order, building its receipt and its intent, rmp-serde
//! encoding both and SHA-256 hashing both, and nothing else (`floor_us_per_order`, the fastest
//! of three passes over N orders), and the run's cost over it (`over_floor`). See
//! `docs/performance.md`.
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin outbox-bench -- 100000
//! cargo run --release -p reactifact-examples --bin outbox-bench -- 1000 --standing 1000000
//! cargo run --release -p reactifact-examples --bin outbox-bench -- --n 10000 --generations 10 --runs 3
//! cargo run --release -p reactifact-examples --bin outbox-bench -- 1000 --generations 1000 --store postgres \
//!     --url postgres://postgres@127.0.0.1:5432/test
//! ```

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::runtime::{Budget, TurnOutcome};
use reactifact_core::store::Synchronous;
use reactifact_core::{ActionKey, Agent, Context, DispatchError, Intent, OpenOptions, Runtime};

use reactifact_core::PendingAction;
use reactifact_examples::order_flow::{process_order, Notify, Order, Receipt};
use reactifact_postgres::{PostgresOptions, PostgresStore};
use sha2::{Digest, Sha256};

const USAGE: &str = "\
usage: outbox-bench [N] [--n N] [--store memory|sqlite|sqlite-normal|postgres] [--db DIR] [--url URL]
                    [--generations G] [--standing M] [--runs R] [--metrics] [--perf-ctl CTL,ACK]

  N, --n N           orders in the timed workload (default 1000)
  --store S          `memory` (default); `sqlite`: an SQLite file, synchronous = FULL (one fsync
                     per generation); `sqlite-normal`: synchronous = NORMAL; `postgres`: the
                     PostgreSQL store, in a schema of the run's own (dropped afterwards)
  --url URL          the PostgreSQL server (default: $REACTIFACT_TEST_POSTGRES_URL)
  --db DIR           where the SQLite file is created (default: the temporary directory);
                     the file is removed after each run
  --generations G    the orders arrive in G batches: seed N/G orders, run a turn, repeat (default 1)
  --standing M       store about M artifacts first (M/3 processed orders); time only the N new ones
  --runs R           repeat the whole run R times in this process, one JSON line each (default 1;
                     only the first, in a fresh process, measures bytes per artifact)
  --metrics          install a Prometheus recorder (metrics-exporter-prometheus) first, so the
                     runtime's metrics are recorded; the line then counts the rendered samples
  --perf-ctl CTL,ACK switch perf on for each timed turn only: writes `enable` and `disable` to the
                     FIFO CTL and waits for perf's answer on ACK (for `perf stat` or `perf record`
                     with `--control fifo:CTL,ACK -D -1`)";

struct Options {
    n: u64,
    store: String,
    db_dir: std::path::PathBuf,
    generations: u64,
    standing: u64,
    runs: u32,
    url: Option<String>,
    metrics: bool,
    perf: Option<PerfControl>,
}

/// perf's control FIFOs (`perf … --control fifo:CTL,ACK`): profiling switched on around
/// each timed turn only, not the seeding, the standing state or the checks.
struct PerfControl {
    ctl: std::path::PathBuf,
    ack: std::path::PathBuf,
}

impl PerfControl {
    /// Sends `command` (`enable` or `disable`) and waits until perf has acted on it.
    fn send(&self, command: &str) -> Result<(), String> {
        use std::io::{BufRead, Write};
        let fail = |e: std::io::Error| format!("perf control: {e}");
        let mut ctl = std::fs::OpenOptions::new().write(true).open(&self.ctl).map_err(fail)?;
        writeln!(ctl, "{command}").map_err(fail)?;
        let mut answer = String::new();
        std::io::BufReader::new(std::fs::File::open(&self.ack).map_err(fail)?)
            .read_line(&mut answer)
            .map_err(fail)?;
        Ok(())
    }
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        n: 1000,
        store: "memory".to_owned(),
        db_dir: std::env::temp_dir(),
        generations: 1,
        standing: 0,
        runs: 1,
        url: std::env::var("REACTIFACT_TEST_POSTGRES_URL")
            .ok()
            .filter(|u| !u.is_empty()),
        metrics: false,
        perf: None,
    };
    let mut args = std::env::args().skip(1);
    let mut positional = 0;
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name.to_owned(), Some(value.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--n" | "-n" => options.n = number(&name, &value(&name)?)?,
            "--store" => options.store = value(&name)?,
            "--db" => options.db_dir = value(&name)?.into(),
            "--generations" | "-g" => options.generations = number(&name, &value(&name)?)?,
            "--standing" => options.standing = number(&name, &value(&name)?)?,
            "--runs" => options.runs = number(&name, &value(&name)?)? as u32,
            "--url" => options.url = Some(value(&name)?),
            "--metrics" => options.metrics = true,
            "--perf-ctl" => {
                let fifos = value(&name)?;
                let (ctl, ack) = fifos
                    .split_once(',')
                    .ok_or_else(|| format!("--perf-ctl needs two FIFOs, CTL,ACK; got `{fifos}`"))?;
                options.perf = Some(PerfControl {
                    ctl: ctl.into(),
                    ack: ack.into(),
                });
            }
            other if !other.starts_with('-') && positional == 0 => {
                options.n = number("N", other)?;
                positional += 1;
            }
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    if options.n == 0 {
        return Err("N must be at least 1".to_owned());
    }
    if options.generations == 0 || options.generations > options.n {
        return Err(format!("--generations must be between 1 and N ({})", options.n));
    }
    if options.runs == 0 {
        return Err("--runs must be at least 1".to_owned());
    }
    if !["memory", "sqlite", "sqlite-normal", "postgres"].contains(&options.store.as_str()) {
        return Err(format!(
            "unknown store `{}`: the stores are `memory`, `sqlite`, `sqlite-normal` and `postgres`",
            options.store
        ));
    }
    if options.store == "postgres" && options.url.is_none() {
        return Err("--store postgres needs --url URL (or REACTIFACT_TEST_POSTGRES_URL)".to_owned());
    }
    Ok(options)
}

fn number(name: &str, text: &str) -> Result<u64, String> {
    text.replace('_', "")
        .parse()
        .map_err(|_| format!("{name}: `{text}` is not a non-negative integer"))
}

/// A `kB` field of `/proc/self/status`, in bytes (0 where procfs is unavailable).
fn proc_status_bytes(field: &str) -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Nanoseconds this thread has spent on a CPU (`/proc/thread-self/schedstat`; 0 where it is
/// unavailable). Unlike wall time it leaves out the time the thread waited for a busy core;
/// the kernel updates it at scheduler ticks, so it is coarse (milliseconds) for short runs.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A fresh SQLite file for one run, removed (with its WAL and shared-memory files) on drop.
struct DbFile {
    path: std::path::PathBuf,
}

impl DbFile {
    fn new(dir: &std::path::Path) -> Self {
        DbFile {
            path: dir.join(format!("outbox-bench-{}-{}.db", std::process::id(), nanos())),
        }
    }

    fn companions(&self) -> impl Iterator<Item = std::path::PathBuf> + '_ {
        ["", "-wal", "-shm", "-journal"].into_iter().map(|suffix| {
            let mut name = self.path.clone().into_os_string();
            name.push(suffix);
            name.into()
        })
    }

    /// Bytes on disk: the database and its write-ahead log.
    fn bytes(&self) -> u64 {
        self.companions()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    }
}

impl Drop for DbFile {
    fn drop(&mut self) {
        for path in self.companions() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Where a run keeps its state: a SQLite file or a PostgreSQL schema of its own (none in
/// memory), removed when dropped.
enum Durable {
    Sqlite(DbFile),
    Postgres(Arc<PostgresStore>, String),
}

impl Durable {
    fn new(options: &Options, tokio: &tokio::runtime::Runtime) -> Result<Option<Durable>, String> {
        Ok(match options.store.as_str() {
            "memory" => None,
            "postgres" => {
                let url = options.url.as_deref().unwrap_or_default();
                let schema = format!("outbox_bench_{}_{}", std::process::id(), nanos() % 1_000_000_000);
                let store = tokio
                    .block_on(PostgresStore::open(PostgresOptions::new(url).schema(&schema)))
                    .map_err(|e| format!("cannot open the PostgreSQL store: {e}"))?;
                Some(Durable::Postgres(store, schema))
            }
            _ => Some(Durable::Sqlite(DbFile::new(&options.db_dir))),
        })
    }

    /// Bytes on disk: the SQLite file and its log, or the schema's tables and indexes.
    fn bytes(&self, tokio: &tokio::runtime::Runtime) -> Option<u64> {
        match self {
            Durable::Sqlite(db) => Some(db.bytes()),
            Durable::Postgres(store, schema) => tokio.block_on(async {
                let client = store.outbox().pool().get().await.ok()?;
                let row = client
                    .query_one(
                        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
                               JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'",
                        &[schema],
                    )
                    .await
                    .ok()?;
                u64::try_from(row.get::<_, i64>(0)).ok()
            }),
        }
    }

    fn drop_with(self, tokio: &tokio::runtime::Runtime) {
        if let Durable::Postgres(store, schema) = self {
            let dropped = tokio.block_on(async {
                let client = store.outbox().pool().get().await.map_err(|e| e.to_string())?;
                client
                    .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
                    .await
                    .map_err(|e| e.to_string())
            });
            if let Err(e) = dropped {
                eprintln!("outbox-bench: the schema {schema} could not be dropped: {e}");
            }
        }
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn open_context(
    options: &Options,
    durable: Option<&Durable>,
    tokio: &tokio::runtime::Runtime,
) -> Result<Context, String> {
    match durable {
        None => Ok(Context::new("bench")),
        Some(Durable::Postgres(store, _)) => tokio
            .block_on(Context::open_store(store.clone(), "bench"))
            .map_err(|e| format!("cannot open the PostgreSQL session: {e}")),
        Some(Durable::Sqlite(db)) => {
            let synchronous = if options.store == "sqlite" {
                Synchronous::Full
            } else {
                Synchronous::Normal
            };
            Context::open_with(&db.path, "bench", OpenOptions::new().synchronous(synchronous))
                .map_err(|e| format!("cannot open the SQLite store: {e}"))
        }
    }
}

fn order_id(i: u64) -> String {
    format!("order:{i}")
}

fn order(i: u64) -> Order {
    Order {
        customer: format!("c{i}@example.com"),
        total_cents: i,
    }
}

/// Seeds orders `range` in one transaction (one generation).
fn seed(ctx: &mut Context, range: std::ops::Range<u64>) -> Result<(), String> {
    let mut tx = ctx.transaction();
    for i in range {
        tx.create(order_id(i), order(i));
    }
    tx.commit().map_err(|e| format!("seeding failed: {e}"))
}

struct RunResult {
    seconds: f64,
    cpu_seconds: f64,
    seed_seconds: f64,
    deliveries: u64,
    artifacts: usize,
    rss_growth: u64,
    db_bytes: Option<u64>,
    /// Seconds to reopen the SQLite session afterwards (it replays the log).
    reopen_seconds: Option<f64>,
    generations_committed: u64,
}

fn run_once(options: &Options, tokio: &tokio::runtime::Runtime) -> Result<RunResult, String> {
    let sent: Arc<Mutex<Vec<ActionKey>>> = Arc::new(Mutex::new(Vec::with_capacity(options.n as usize)));
    let rss_before = proc_status_bytes("VmRSS");
    let db = Durable::new(options, tokio)?;
    let result = measure(options, tokio, db.as_ref(), sent, rss_before);
    if let Some(db) = db {
        db.drop_with(tokio);
    }
    result
}

fn measure(
    options: &Options,
    tokio: &tokio::runtime::Runtime,
    db: Option<&Durable>,
    sent: Arc<Mutex<Vec<ActionKey>>>,
    rss_before: u64,
) -> Result<RunResult, String> {
    let mut rt = Runtime::builder(open_context(options, db, tokio)?)
        .agent(Agent::new("billing").produce(process_order))
        .dispatcher({
            let sent = sent.clone();
            move |intent: Intent| {
                sent.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(intent.key().clone());
                std::future::ready(Ok::<(), DispatchError>(()))
            }
        })
        .budget(Budget::UNLIMITED)
        .build()
        .map_err(|e| e.to_string())?;

    // The standing state: M/3 orders, processed and delivered before the clock starts.
    let standing_orders = options.standing.div_ceil(3);
    let first = standing_orders;
    if standing_orders > 0 {
        const CHUNK: u64 = 100_000;
        let mut start = 0;
        while start < standing_orders {
            let end = (start + CHUNK).min(standing_orders);
            seed(rt.context_mut(), start..end)?;
            let report = tokio
                .block_on(rt.run_with(Budget::UNLIMITED))
                .map_err(|e| format!("standing run failed: {e}"))?;
            if report.outcome != TurnOutcome::Completed {
                return Err(format!("standing run ended with {:?}", report.outcome));
            }
            start = end;
        }
        sent.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    // The timed workload: N orders in G batches. Seeding a batch is measured apart.
    let mut seconds = 0.0;
    let mut cpu_ns = 0;
    let mut seed_seconds = 0.0;
    let mut deliveries = 0;
    let mut generations_committed = 0;
    for g in 0..options.generations {
        let start = first + options.n * g / options.generations;
        let end = first + options.n * (g + 1) / options.generations;
        let t0 = Instant::now();
        seed(rt.context_mut(), start..end)?;
        seed_seconds += t0.elapsed().as_secs_f64();
        if let Some(perf) = &options.perf {
            perf.send("enable")?;
        }
        let t1 = Instant::now();
        let c1 = thread_cpu_ns();
        let report = tokio
            .block_on(rt.run_with(Budget::UNLIMITED))
            .map_err(|e| format!("turn failed: {e}"))?;
        cpu_ns += thread_cpu_ns().saturating_sub(c1);
        let t2 = Instant::now();
        if let Some(perf) = &options.perf {
            perf.send("disable")?;
        }
        seconds += (t2 - t1).as_secs_f64();
        if report.outcome != TurnOutcome::Completed {
            return Err(format!("turn ended with {:?}", report.outcome));
        }
        deliveries += report.deliveries.delivered;
        generations_committed += report.generations;
    }

    // Every key of the timed orders delivered exactly once, and nothing else.
    let sent = std::mem::take(&mut *sent.lock().unwrap_or_else(|e| e.into_inner()));
    let mut seen = HashSet::with_capacity(sent.len());
    for key in &sent {
        if !seen.insert(key.as_str()) {
            return Err(format!("key `{key}` was delivered more than once"));
        }
    }
    let ledger = rt.context().ledger();
    for i in first..first + options.n {
        let key = format!("notify:{}", order_id(i));
        if !seen.contains(key.as_str()) {
            return Err(format!("key `{key}` was never delivered"));
        }
        match tokio.block_on(ledger.get(&key)).map_err(|e| e.to_string())? {
            Some(d) if d.status() == DeliveryStatus::Delivered && d.attempts() == 1 => {}
            Some(d) => return Err(format!("key `{key}` is {} after {} attempts", d.status(), d.attempts())),
            None => return Err(format!("key `{key}` is not in the ledger")),
        }
    }
    if sent.len() as u64 != options.n || deliveries != options.n {
        return Err(format!(
            "{} deliveries ({} reported) for {} orders",
            sent.len(),
            deliveries,
            options.n
        ));
    }
    let artifacts = rt.context().len();
    let rss_growth = proc_status_bytes("VmRSS").saturating_sub(rss_before);
    let state_hash = rt.context().state_hash();
    drop(rt);
    let db_bytes = db.and_then(|db| db.bytes(tokio));
    // Reopening replays the whole log: time it, and check it rebuilds the same state.
    let reopen_seconds = match db {
        Some(db) => {
            let t0 = Instant::now();
            let ctx = open_context(options, Some(db), tokio)?;
            let elapsed = t0.elapsed().as_secs_f64();
            if ctx.state_hash() != state_hash {
                return Err("the reopened session has another state hash".to_owned());
            }
            Some(elapsed)
        }
        None => None,
    };
    Ok(RunResult {
        db_bytes,
        reopen_seconds,
        seconds,
        cpu_seconds: cpu_ns as f64 / 1e9,
        seed_seconds,
        deliveries,
        artifacts,
        rss_growth,
        generations_committed,
    })
}

/// The floor of the workload in microseconds per order: build an order's receipt and its
/// `notify` intent (with its payload), rmp-serde-encode both (named fields, as the runtime does)
/// and SHA-256-hash both — what any implementation of the workload must do — and nothing else.
/// The fastest of three passes over `n` orders.
fn floor_us_per_order(n: u64) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let started = Instant::now();
        for i in 0..n {
            let order = format!("order:{i}");
            let receipt = Receipt {
                order: order.clone(),
                total_cents: 100 + i % 9_000,
            };
            let payload = rmp_serde::to_vec_named(&Notify {
                customer: format!("customer-{}", i % 1_000),
                order: order.clone(),
            })
            .expect("the payload encodes");
            let intent = PendingAction {
                kind: "notify".to_owned(),
                key: format!("notify:{order}"),
                payload,
                requires_approval: false,
                not_before: None,
                group: None,
            };
            for bytes in [
                rmp_serde::to_vec_named(&receipt).expect("the receipt encodes"),
                rmp_serde::to_vec_named(&intent).expect("the intent encodes"),
            ] {
                std::hint::black_box(Sha256::digest(&bytes));
            }
        }
        best = best.min(started.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64);
    }
    best
}

fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("outbox-bench: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let tokio = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(tokio) => tokio,
        Err(e) => {
            eprintln!("outbox-bench: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let recorder = match options.metrics {
        false => None,
        true => match reactifact_examples::prometheus::install() {
            Ok(handle) => Some(handle),
            Err(e) => {
                eprintln!("outbox-bench: cannot install the metrics recorder: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    for run in 0..options.runs {
        let floor = floor_us_per_order(options.n);
        let result = match run_once(&options, &tokio) {
            Ok(result) => result,
            Err(e) => {
                eprintln!("outbox-bench: FAILED: {e}");
                return ExitCode::FAILURE;
            }
        };
        let orders_per_sec = options.n as f64 / result.seconds;
        // Only a fresh process measures memory: later runs reuse what the allocator kept.
        let bytes_per_artifact = if run == 0 {
            format!("{:.0}", result.rss_growth as f64 / result.artifacts.max(1) as f64)
        } else {
            "null".to_owned()
        };
        println!(
            "{{\"bench\":\"outbox\",\"n\":{},\"store\":\"{}\",\"generations\":{},\"standing\":{},\
             \"seconds\":{:.6},\"cpu_seconds\":{:.6},\"orders_per_sec\":{:.0},\"us_per_order\":{:.4},\"seed_seconds\":{:.6},\
             \"deliveries\":{},\"committed_generations\":{},\"artifacts\":{},\"peak_rss_bytes\":{},\
             \"bytes_per_artifact\":{},\"db_bytes\":{},\"reopen_seconds\":{},\"floor_us_per_order\":{:.4},\"over_floor\":{:.2}}}",
            options.n,
            options.store,
            options.generations,
            options.standing,
            result.seconds,
            result.cpu_seconds,
            orders_per_sec,
            result.seconds * 1e6 / options.n as f64,
            result.seed_seconds,
            result.deliveries,
            result.generations_committed,
            result.artifacts,
            proc_status_bytes("VmHWM"),
            bytes_per_artifact,
            result.db_bytes.map_or("null".to_owned(), |b| b.to_string()),
            result.reopen_seconds.map_or("null".to_owned(), |s| format!("{s:.6}")),
            floor,
            result.seconds * 1e6 / options.n as f64 / floor,
        );
    }
    if let Some(handle) = recorder {
        // What the runtime recorded, so that a run with metrics shows they were recorded; and
        // what rendering costs (the exporter buckets the buffered samples then).
        let started = Instant::now();
        let page = handle.render();
        let render_seconds = started.elapsed().as_secs_f64();
        let deliveries = page
            .lines()
            .find(|l| l.starts_with("reactifact_deliveries_total{") && l.contains("outcome=\"delivered\""))
            .unwrap_or("none");
        eprintln!(
            "outbox-bench: metrics recorded, {} lines, rendered in {render_seconds:.6} s; {deliveries}",
            page.lines().count()
        );
    }
    ExitCode::SUCCESS
}
