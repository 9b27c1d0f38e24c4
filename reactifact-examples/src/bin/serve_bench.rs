//! `serve-bench`: the shop service's runtime under an open-loop load, in process, without HTTP.
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin serve-bench -- --rate 200 --seconds 30
//! cargo run --release -p reactifact-examples --bin serve-bench -- --dispatch-ms 1000 --fail-every 10
//! cargo run --release -p reactifact-examples --bin serve-bench -- --store postgres \
//!     --url postgres://postgres@127.0.0.1:5432/test
//! cargo run --release -p reactifact-examples --bin serve-bench -- --rate 2000 --seconds 10 --inbox 1000
//! ```
//!
//! Builds the runtime of `reactifact_examples::shop` (the `draft_confirmation` produce, the
//! stand-in model, the stand-in mail service as its dispatcher) on a fresh SQLite file
//! (`synchronous = NORMAL`, in the temporary directory, removed afterwards) or in a fresh
//! schema of a PostgreSQL database (dropped afterwards), serves it, and offers orders at
//! `--rate` per second for `--seconds`, open loop: order `i` is written at `start + i / rate`,
//! each by a task of its own (`create_once` through the runtime's handle), whether or not the
//! earlier ones were acknowledged. Its intake latency runs from that scheduled time to the
//! handle's acknowledgement (the commit), so a write the program could only start late counts
//! its lateness. A write waits for room in the runtime's inbox (`--inbox`), or, with
//! `--try-write`, is refused at once when the inbox is full (`SubmitError::Full`, counted as
//! `full`, not retried).
//!
//! After the offered period it waits (at most 60 s) until the mail service has sent every
//! acknowledged order's confirmation, stops the runtime, reads every acknowledged order back
//! from its context (`uncommitted` counts those missing) and prints a few lines, then one JSON
//! line, last: `intake_p50_ms`, `intake_p99_ms`, `intake_max_ms`, `acknowledged`, `refused`,
//! `full`, `uncommitted`,
//! `delivered` (distinct keys sent), `deliveries_per_sec` (sends from the start to the last
//! send), `delivery_p50_ms`, `delivery_p99_ms` (scheduled time to the send), `duplicates`,
//! `peak_rss_kb` (`VmHWM`), `store`, `rate`, `seconds`, `dispatch_ms`, `model_ms`,
//! `fail_every`, `concurrency`, `inbox`, and the serving runtime's counts. Exits 1 unless every
//! acknowledged order is committed and its confirmation was sent exactly once.
//!
//! Options: `--rate R` (orders/s, default 200), `--seconds S` (default 30), `--dispatch-ms N`
//! (each delivery attempt takes N ms, default 0), `--model-ms N` (each draft takes N ms,
//! default 0), `--fail-every N` (the mail service fails every Nth attempt, retryably; 0, the
//! default, never), `--concurrency N` (deliveries at once, default 256), `--store
//! sqlite|postgres` (default sqlite), `--url URL` (PostgreSQL; default
//! `$REACTIFACT_TEST_POSTGRES_URL`, else `postgres://postgres@127.0.0.1:5432/test`), `--inbox
//! N` (writes the runtime's inbox holds, `RuntimeBuilder::inbox_capacity`; default 1,024),
//! `--try-write` (see above).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use reactifact_core::error::SubmitError;
use reactifact_core::runtime::{ServeReport, DEFAULT_INBOX_CAPACITY};
use reactifact_core::store::Synchronous;
use reactifact_core::{Context, OpenOptions, Runtime, Writes};
use reactifact_examples::shop::{self, confirmation_key, order_id, Mailer, Order, Settings, StandInModel};
use reactifact_postgres::{PostgresOptions, PostgresStore};
use tokio::time::Instant;

const USAGE: &str = "usage: serve-bench [--rate R] [--seconds S] [--dispatch-ms N] [--model-ms N] \
[--fail-every N] [--concurrency N] [--store sqlite|postgres] [--url URL] [--inbox N] [--try-write]";

/// The PostgreSQL server without `--url` or `REACTIFACT_TEST_POSTGRES_URL`.
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// How long the program waits for the deliveries after the offered period.
const DRAIN_WAIT: Duration = Duration::from_secs(60);

/// How often the serving runtime looks at the store without being woken.
const POLL: Duration = Duration::from_millis(250);

struct Options {
    rate: u64,
    seconds: u64,
    dispatch_ms: u64,
    model_ms: u64,
    fail_every: u64,
    concurrency: usize,
    postgres: bool,
    url: String,
    inbox: usize,
    try_write: bool,
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        rate: 200,
        seconds: 30,
        dispatch_ms: 0,
        model_ms: 0,
        fail_every: 0,
        concurrency: 256,
        postgres: false,
        url: std::env::var("REACTIFACT_TEST_POSTGRES_URL")
            .ok()
            .filter(|url| !url.is_empty())
            .unwrap_or_else(|| DEFAULT_URL.to_owned()),
        inbox: DEFAULT_INBOX_CAPACITY,
        try_write: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let number = |name: &str, text: String| {
            text.replace('_', "")
                .parse::<u64>()
                .map_err(|_| format!("{name}: `{text}` is not a non-negative integer"))
        };
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--rate" => options.rate = number(&arg, value(&arg)?)?,
            "--seconds" => options.seconds = number(&arg, value(&arg)?)?,
            "--dispatch-ms" => options.dispatch_ms = number(&arg, value(&arg)?)?,
            "--model-ms" => options.model_ms = number(&arg, value(&arg)?)?,
            "--fail-every" => options.fail_every = number(&arg, value(&arg)?)?,
            "--concurrency" => options.concurrency = usize::try_from(number(&arg, value(&arg)?)?).unwrap_or(usize::MAX),
            "--store" => match value(&arg)?.as_str() {
                "sqlite" => options.postgres = false,
                "postgres" => options.postgres = true,
                other => return Err(format!("--store: `{other}` is neither `sqlite` nor `postgres`")),
            },
            "--url" => options.url = value(&arg)?,
            "--inbox" => options.inbox = usize::try_from(number(&arg, value(&arg)?)?).unwrap_or(usize::MAX),
            "--try-write" => options.try_write = true,
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    if options.rate == 0 || options.seconds == 0 || options.concurrency == 0 || options.inbox == 0 {
        return Err("--rate, --seconds, --concurrency and --inbox must be at least 1".to_owned());
    }
    Ok(options)
}

/// `VmHWM` of `/proc/self/status`: the process's peak resident set, in kB (0 where procfs is
/// unavailable).
fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The `p`-th percentile (nearest rank) of `sorted`, or `None` if it is empty.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// A number of milliseconds as JSON: three decimals, or `null`.
fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "null".to_owned(), |v| format!("{v:.3}"))
}

/// Where the run keeps its state, removed when the run ends.
enum Store {
    /// A SQLite file in a temporary directory of its own.
    Sqlite(tempfile::TempDir),
    /// A PostgreSQL store in a schema of its own.
    Postgres(Arc<PostgresStore>, String),
}

impl Store {
    async fn new(options: &Options) -> Result<Store, String> {
        if !options.postgres {
            let dir = tempfile::Builder::new()
                .prefix("serve-bench-")
                .tempdir()
                .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
            return Ok(Store::Sqlite(dir));
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let schema = format!("serve_bench_{}_{nanos}", std::process::id());
        let store = PostgresStore::open(PostgresOptions::new(&options.url).schema(&schema))
            .await
            .map_err(|e| format!("cannot open the PostgreSQL store: {e}"))?;
        Ok(Store::Postgres(store, schema))
    }

    fn name(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(..) => "postgres",
        }
    }

    async fn context(&self) -> Result<Context, String> {
        match self {
            Store::Sqlite(dir) => {
                let path = dir.path().join("shop.db");
                let synchronous = OpenOptions::new().synchronous(Synchronous::Normal);
                tokio::task::spawn_blocking(move || {
                    Context::open_with(&path, shop::SESSION, synchronous)
                        .map_err(|e| format!("cannot open the SQLite store: {e}"))
                })
                .await
                .map_err(|e| format!("opening the SQLite store panicked: {e}"))?
            }
            Store::Postgres(store, _) => Context::open_store(store.clone(), shop::SESSION)
                .await
                .map_err(|e| format!("cannot open the PostgreSQL session: {e}")),
        }
    }

    /// Removes what the run stored: the schema (the SQLite directory goes when dropped).
    async fn remove(self) {
        if let Store::Postgres(store, schema) = self {
            let dropped = async {
                let client = store.outbox().pool().get().await.map_err(|e| e.to_string())?;
                client
                    .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
                    .await
                    .map_err(|e| e.to_string())
            };
            if let Err(e) = dropped.await {
                eprintln!("serve-bench: the schema {schema} could not be dropped: {e}");
            }
        }
    }
}

/// What the run measured.
struct Measured {
    /// Intake latencies of the acknowledged orders, in ms, sorted.
    intake: Vec<f64>,
    acknowledged: u64,
    refused: u64,
    /// Writes `try_write` found no room for.
    full: u64,
    /// Acknowledged orders not found in the context after the run.
    uncommitted: u64,
    /// Scheduled time to the first send, in ms, sorted, per acknowledged order sent.
    delivery: Vec<f64>,
    /// Distinct keys sent.
    delivered: u64,
    /// Sends beyond the first of a key.
    duplicates: u64,
    /// Acknowledged orders whose confirmation was not sent within the wait.
    missing: u64,
    deliveries_per_sec: f64,
    offered_seconds: f64,
    attempts: u64,
    report: ServeReport,
}

async fn measure(options: &Options, context: Context) -> Result<Measured, String> {
    let mailer = Mailer::new(Duration::from_millis(options.dispatch_ms), options.fail_every);
    let settings = Settings {
        model: StandInModel::new(Duration::from_millis(options.model_ms)),
        delivery_concurrency: options.concurrency,
        inbox_capacity: options.inbox,
        ..Settings::default()
    };
    let mut runtime = shop::runtime(context, &settings, &mailer).map_err(|e| e.to_string())?;
    let handle = runtime.handle();
    let serving = tokio::spawn(async move {
        let report = runtime.serve(POLL).await;
        (runtime, report)
    });
    let try_write = options.try_write;

    let n = options.rate * options.seconds;
    let interval = Duration::from_secs_f64(1.0 / options.rate as f64);
    let started = Instant::now();
    let due = |i: u64| started + interval.mul_f64(i as f64);
    let mut writes = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    for i in 0..n {
        let at = due(i);
        tokio::time::sleep_until(at).await;
        let handle = handle.clone();
        writes.push(tokio::spawn(async move {
            let order = Order {
                customer: format!("customer {i}"),
                email: format!("c{i}@example.com"),
                // Below the approval threshold: every confirmation goes out on its own.
                total_cents: 1_000 + i % 50_000,
            };
            let id = order_id(&i.to_string());
            let written = if try_write {
                let mut writes = Writes::new();
                writes.create_once(id, order);
                handle.try_write(writes).await
            } else {
                handle.create_once(id, order).await.map(|_| ())
            };
            (written, at.elapsed())
        }));
    }
    let mut intake = Vec::with_capacity(writes.len());
    let mut acked = Vec::with_capacity(writes.len());
    let mut refused = 0;
    let mut full = 0;
    let mut first_refusal = None;
    for (i, write) in (0..n).zip(writes) {
        match write.await.map_err(|e| format!("a write panicked: {e}"))? {
            (Ok(()), latency) => {
                intake.push(latency.as_secs_f64() * 1000.0);
                acked.push(i);
            }
            (Err(SubmitError::Full(_)), _) => full += 1,
            (Err(e), _) => {
                refused += 1;
                first_refusal.get_or_insert_with(|| e.to_string());
            }
        }
    }
    if let Some(e) = first_refusal {
        eprintln!("serve-bench: {refused} writes refused; the first: {e}");
    }
    let offered_seconds = started.elapsed().as_secs_f64();
    let acknowledged = acked.len() as u64;
    if tokio::time::timeout(DRAIN_WAIT, mailer.wait_for(acknowledged))
        .await
        .is_err()
    {
        eprintln!(
            "serve-bench: {} of {acknowledged} confirmations sent after waiting {} s",
            mailer.delivered(),
            DRAIN_WAIT.as_secs()
        );
    }
    handle.stop();
    let (runtime, report) = serving.await.map_err(|e| format!("the runtime panicked: {e}"))?;
    let report = report.map_err(|e| format!("the runtime stopped on an error: {e}"))?;
    let uncommitted = uncommitted(&runtime, &acked);

    let sent = mailer.sent();
    let mut delivery = Vec::with_capacity(sent.len());
    let mut missing = 0;
    let mut last = started;
    for &i in &acked {
        match sent.get(&confirmation_key(&order_id(&i.to_string()).into())) {
            Some(s) => {
                delivery.push(s.first_at.saturating_duration_since(due(i)).as_secs_f64() * 1000.0);
                last = last.max(s.first_at);
            }
            None => missing += 1,
        }
    }
    let delivered = sent.len() as u64;
    let duplicates = sent.values().map(|s| u64::from(s.times.saturating_sub(1))).sum();
    let span = last.saturating_duration_since(started).as_secs_f64();
    intake.sort_by(f64::total_cmp);
    delivery.sort_by(f64::total_cmp);
    Ok(Measured {
        intake,
        acknowledged,
        refused,
        full,
        uncommitted,
        delivery,
        delivered,
        duplicates,
        missing,
        deliveries_per_sec: if span > 0.0 { delivered as f64 / span } else { 0.0 },
        offered_seconds,
        attempts: mailer.attempts(),
        report,
    })
}

/// How many of the `acked` orders the runtime's context does not hold.
fn uncommitted(runtime: &Runtime, acked: &[u64]) -> u64 {
    let context = runtime.context();
    acked
        .iter()
        .filter(|i| !matches!(context.get::<Order>(&order_id(&i.to_string())), Ok(Some(_))))
        .count() as u64
}

async fn run(options: &Options) -> Result<(String, bool), String> {
    let store = Store::new(options).await?;
    let measured = match store.context().await {
        Ok(context) => measure(options, context).await,
        Err(e) => Err(e),
    };
    let name = store.name();
    store.remove().await;
    let m = measured?;
    let offered = options.rate * options.seconds;
    println!(
        "offered {offered} orders at {}/s for {} s on {name} (dispatch {} ms, model {} ms, fail every {}, \
         concurrency {}, inbox {}{}): the offer took {:.3} s",
        options.rate,
        options.seconds,
        options.dispatch_ms,
        options.model_ms,
        options.fail_every,
        options.concurrency,
        options.inbox,
        if options.try_write { ", try_write" } else { "" },
        m.offered_seconds
    );
    println!(
        "intake (scheduled -> acknowledged): p50 {} ms, p99 {} ms, max {} ms; {} acknowledged ({} not in the \
         context after), {} refused, {} found the inbox full",
        ms(percentile(&m.intake, 50.0)),
        ms(percentile(&m.intake, 99.0)),
        ms(m.intake.last().copied()),
        m.acknowledged,
        m.uncommitted,
        m.refused,
        m.full
    );
    println!(
        "delivery (scheduled -> sent): p50 {} ms, p99 {} ms, max {} ms; {} sent ({} duplicates, {} missing) \
         in {} attempts, {:.1}/s",
        ms(percentile(&m.delivery, 50.0)),
        ms(percentile(&m.delivery, 99.0)),
        ms(m.delivery.last().copied()),
        m.delivered,
        m.duplicates,
        m.missing,
        m.attempts,
        m.deliveries_per_sec
    );
    let r = &m.report;
    println!(
        "runtime: {} turns, {} generations, {} runs, {} writes ({} refused), {} delivered, {} failed attempts, {} dead",
        r.turns, r.generations, r.runs, r.writes, r.refused_writes, r.delivered, r.failed, r.dead
    );
    let exactly_once = m.missing == 0 && m.duplicates == 0 && m.uncommitted == 0;
    let line = format!(
        concat!(
            "{{\"bench\":\"serve\",\"store\":\"{}\",\"rate\":{},\"seconds\":{},\"dispatch_ms\":{},",
            "\"model_ms\":{},\"fail_every\":{},\"concurrency\":{},\"inbox\":{},\"try_write\":{},",
            "\"offered\":{},\"offered_seconds\":{:.3},",
            "\"intake_p50_ms\":{},\"intake_p99_ms\":{},\"intake_max_ms\":{},\"acknowledged\":{},",
            "\"refused\":{},\"full\":{},\"uncommitted\":{},\"delivered\":{},\"duplicates\":{},\"missing\":{},\"attempts\":{},",
            "\"deliveries_per_sec\":{:.1},\"delivery_p50_ms\":{},\"delivery_p99_ms\":{},",
            "\"turns\":{},\"generations\":{},\"peak_rss_kb\":{},\"exactly_once\":{}}}"
        ),
        name,
        options.rate,
        options.seconds,
        options.dispatch_ms,
        options.model_ms,
        options.fail_every,
        options.concurrency,
        options.inbox,
        options.try_write,
        offered,
        m.offered_seconds,
        ms(percentile(&m.intake, 50.0)),
        ms(percentile(&m.intake, 99.0)),
        ms(m.intake.last().copied()),
        m.acknowledged,
        m.refused,
        m.full,
        m.uncommitted,
        m.delivered,
        m.duplicates,
        m.missing,
        m.attempts,
        m.deliveries_per_sec,
        ms(percentile(&m.delivery, 50.0)),
        ms(percentile(&m.delivery, 99.0)),
        r.turns,
        r.generations,
        peak_rss_kb(),
        exactly_once,
    );
    Ok((line, exactly_once))
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("serve-bench: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // The logs of the runtime and of the mail service, only when RUST_LOG asks for them.
    if std::env::var_os("RUST_LOG").is_some() {
        if let Err(e) = reactifact_examples::logs::init_service(false, "warn") {
            eprintln!("serve-bench: {e}");
            return ExitCode::from(2);
        }
    }
    let tokio = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(tokio) => tokio,
        Err(e) => {
            eprintln!("serve-bench: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    match tokio.block_on(run(&options)) {
        Ok((line, exactly_once)) => {
            println!("{line}");
            if exactly_once {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "serve-bench: not every acknowledged order is committed with its confirmation sent exactly once"
                );
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("serve-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
