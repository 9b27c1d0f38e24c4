//! Sessions taking turns in the outbox's claims, on PostgreSQL: a session with a large backlog
//! (`tenant-big`) and sessions with a single intent each (`tenant-small-{i}`), served by one
//! `Drainer` of `Scope::all()` over `PostgresOutbox::open` of one schema. The goal measured: "A
//! session with 100,000 pending and another with 1: the single intent is delivered within one
//! claim batch's time."
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin fair-bench -- --backlog 100000 --concurrency 64 \
//!     --dispatch-ms 1 --probes 5 --url postgres://postgres@127.0.0.1:5432/test
//! ```
//!
//! Options: `--backlog N` (intents of `tenant-big`, 100,000), `--concurrency C` (64),
//! `--dispatch-ms D` (each delivery awaits a tokio sleep of D ms, 1), `--probes P` (5),
//! `--turns on|off` (whether the drainer lets sessions take turns, `DeliveryOptions::take_turns`;
//! on; off is due order, the baseline), `--url URL` (else `REACTIFACT_TEST_POSTGRES_URL`).
//!
//! The backlog is registered due now in a schema of the run's own (1,000 per transaction,
//! through `PostgresOutbox::register_alone`), dropped at the end. Then the drainer starts
//! (concurrency C, 50 ms poll interval); after 1 s, P times 300 ms apart, one intent of session
//! `tenant-small-{i}` is registered in a transaction of its own. Each probe's latency runs from
//! just before its registration to the moment the dispatcher is handed it (the registration's
//! own round trip included). The drainer is stopped once every probe was dispatched, or after
//! 30 s.
//!
//! The time of one claim batch is estimated from outside as C / the big tenant's deliveries
//! per second over the probe window (from the first probe's registration to the last probe's
//! dispatch): the time a batch of C takes at the observed throughput.
//!
//! Prints one JSON line: backlog, concurrency, dispatch_ms, probes, small_latency_ms (each
//! probe's, null if never dispatched), small_latency_median_ms, big_per_sec, batch_time_ms,
//! within_one_batch (probes whose latency is at most batch_time_ms + 50, the drainer's
//! wake-up), big_delivered_before_stop. Exits non-zero if the run failed or a probe was never
//! dispatched.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use reactifact_core::audit::{CommitHash, ContentHash};
use reactifact_core::runtime::{Generation, Origin};
use reactifact_core::store::NewIntent;
use reactifact_core::{ActionKey, DeliveryOptions, DispatchError, Drainer, Intent, PendingAction, Scope};
use reactifact_postgres::{PostgresOptions, PostgresOutbox};
use sha2::Digest as _;

/// The session of the backlog.
const BIG: &str = "tenant-big";
/// The key prefix of the probes' intents.
const SMALL_KEY: &str = "small:";
/// How long the drainer works in the backlog before the first probe.
const WARM_UP: Duration = Duration::from_secs(1);
/// The time between two probes.
const PROBE_SPACING: Duration = Duration::from_millis(300);
/// How long the run waits, from the drainer's start, for every probe to be dispatched.
const GIVE_UP: Duration = Duration::from_secs(30);
/// Added to the batch time for a probe to count as delivered within one batch: the drainer's
/// wake-up.
const WAKE_UP_MS: f64 = 50.0;

/// The run's options, as parsed from the command line.
struct Options {
    backlog: u64,
    concurrency: usize,
    dispatch_ms: u64,
    probes: usize,
    /// Whether sessions take turns (`--turns off`: due order, the baseline).
    turns: bool,
    url: String,
}

fn parse(args: &mut impl Iterator<Item = String>) -> Result<Options, String> {
    let (mut backlog, mut concurrency, mut dispatch_ms, mut probes) = (100_000u64, 64usize, 1u64, 5usize);
    let mut url = std::env::var("REACTIFACT_TEST_POSTGRES_URL").ok();
    let mut turns = true;
    while let Some(arg) = args.next() {
        let value = args.next().ok_or(format!("{arg} needs a value"))?;
        let bad = |e: std::num::ParseIntError| format!("{arg}: {e}");
        match arg.as_str() {
            "--backlog" => backlog = value.parse().map_err(bad)?,
            "--concurrency" => concurrency = value.parse().map_err(bad)?,
            "--dispatch-ms" => dispatch_ms = value.parse().map_err(bad)?,
            "--probes" => probes = value.parse().map_err(bad)?,
            "--url" => url = Some(value),
            "--turns" => {
                turns = match value.as_str() {
                    "on" => true,
                    "off" => false,
                    other => return Err(format!("--turns: `{other}` is neither on nor off")),
                }
            }
            _ => return Err(format!("unknown option `{arg}`")),
        }
    }
    if concurrency == 0 || probes == 0 {
        return Err("--concurrency and --probes must be at least 1".to_owned());
    }
    Ok(Options {
        backlog,
        concurrency,
        dispatch_ms,
        probes,
        turns,
        url: url.ok_or("--url or REACTIFACT_TEST_POSTGRES_URL is needed")?,
    })
}

/// An intent of `key` (kind `notify`, due now) as a commit of `session` at `generation` would
/// register it: its `PendingAction` encoded and hashed as a commit encodes and hashes it.
fn new_intent(session: &str, generation: u64, key: String) -> NewIntent {
    let payload = rmp_serde::to_vec_named(&key).expect("a string encodes");
    let action = PendingAction {
        kind: "notify".to_owned(),
        key: key.clone(),
        payload: payload.clone(),
        requires_approval: false,
        not_before: None,
        group: None,
    };
    let bytes = rmp_serde::to_vec_named(&action).expect("a PendingAction encodes");
    let origin = Origin::new(session, CommitHash([generation as u8; 32]), Generation(generation), 0);
    NewIntent {
        intent: Intent::new(ActionKey::from(key), "notify", payload, origin, 0),
        action_hash: ContentHash(sha2::Sha256::digest(&bytes).into()),
        bytes: Arc::from(bytes),
    }
}

/// Registers `backlog` intents of session `tenant-big` in the outbox, 1,000 per transaction.
async fn prepare(outbox: &PostgresOutbox, backlog: u64) -> Result<(), String> {
    let mut i = 0;
    let mut generation = 0;
    while i < backlog {
        generation += 1;
        let end = (i + 1000).min(backlog);
        let intents: Vec<NewIntent> = (i..end)
            .map(|i| new_intent(BIG, generation, format!("big:{i}")))
            .collect();
        outbox
            .register_alone(&intents, SystemTime::now())
            .await
            .map_err(|e| e.to_string())?;
        i = end;
    }
    Ok(())
}

/// What the dispatcher saw: the big tenant's dispatches, and when each probe was dispatched.
#[derive(Default)]
struct Seen {
    /// Dispatches of the big tenant's intents.
    big: AtomicU64,
    /// The moment each probe's key was handed to the dispatcher (the first time).
    small: Mutex<HashMap<String, Instant>>,
}

/// What the probes measured.
struct Measured {
    /// Each probe's latency, registration to dispatch (`None`: never dispatched).
    latencies: Vec<Option<Duration>>,
    /// The big tenant's deliveries per second over the probe window.
    big_per_sec: f64,
    /// The big tenant's dispatches when the drainer was stopped.
    big_before_stop: u64,
}

/// Registers the probes while the drainer serves, waits for their dispatch (or gives up), and
/// stops the drainer.
async fn probe(
    outbox: &PostgresOutbox,
    options: &Options,
    seen: &Seen,
    stop: impl FnOnce(),
) -> Result<Measured, String> {
    let started = Instant::now();
    tokio::time::sleep(WARM_UP).await;
    let mut registered = Vec::with_capacity(options.probes);
    let mut window_start = None;
    for i in 0..options.probes {
        if i > 0 {
            tokio::time::sleep(PROBE_SPACING).await;
        }
        let key = format!("{SMALL_KEY}{i}");
        let intent = new_intent(&format!("tenant-small-{i}"), 1, key.clone());
        let at = Instant::now();
        window_start.get_or_insert((at, seen.big.load(Ordering::Relaxed)));
        let outcome = outbox.register_alone(&[intent], SystemTime::now()).await;
        if let Err(e) = outcome {
            stop();
            return Err(format!("probe {i}: {e}"));
        }
        registered.push((key, at));
    }
    // Wait for every probe's dispatch, or give up.
    let window_end = loop {
        let done = {
            let small = seen.small.lock().unwrap();
            registered.iter().all(|(key, _)| small.contains_key(key))
        };
        if done || started.elapsed() >= GIVE_UP {
            break (Instant::now(), seen.big.load(Ordering::Relaxed));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    stop();
    let small = seen.small.lock().unwrap().clone();
    let latencies: Vec<Option<Duration>> = registered
        .iter()
        .map(|(key, at)| small.get(key).map(|&t| t.saturating_duration_since(*at)))
        .collect();
    // The window ends when every probe was seen dispatched (within 2 ms), or when the run gave up.
    let (start, big_at_start) = window_start.expect("at least one probe");
    let (end, big_at_end) = window_end;
    let seconds = end.saturating_duration_since(start).as_secs_f64();
    let big_per_sec = if seconds > 0.0 {
        (big_at_end - big_at_start) as f64 / seconds
    } else {
        0.0
    };
    if big_at_end >= options.backlog {
        eprintln!("fair-bench: the backlog ran dry before the last probe was dispatched; use a larger --backlog");
    }
    Ok(Measured {
        latencies,
        big_per_sec,
        big_before_stop: seen.big.load(Ordering::Relaxed),
    })
}

/// Serves the drainer while the probes run, and prints the JSON line. `Ok(false)` when a probe
/// was never dispatched.
async fn run(outbox: Arc<PostgresOutbox>, options: &Options) -> Result<bool, String> {
    prepare(&outbox, options.backlog).await?;
    let seen = Arc::new(Seen::default());
    let record = seen.clone();
    let pause = Duration::from_millis(options.dispatch_ms);
    let drainer = Drainer::builder(outbox.clone(), move |intent: Intent| {
        let now = Instant::now();
        let key = intent.key().to_string();
        if key.starts_with(SMALL_KEY) {
            record.small.lock().unwrap().entry(key).or_insert(now);
        } else {
            record.big.fetch_add(1, Ordering::Relaxed);
        }
        async move {
            tokio::time::sleep(pause).await;
            Ok::<(), DispatchError>(())
        }
    })
    .scope(Scope::all())
    .delivery(
        DeliveryOptions::new()
            .concurrency(options.concurrency)
            .take_turns(options.turns),
    )
    .poll_interval(Duration::from_millis(50))
    .build()
    .map_err(|e| e.to_string())?;
    let stop = drainer.stop_handle();
    let (served, measured) = tokio::join!(
        drainer.serve(stop.clone()),
        probe(&outbox, options, &seen, || stop.stop())
    );
    served.map_err(|e| e.to_string())?;
    let measured = measured?;
    let millis = |d: &Duration| d.as_secs_f64() * 1000.0;
    let mut sorted: Vec<f64> = measured.latencies.iter().flatten().map(millis).collect();
    sorted.sort_by(f64::total_cmp);
    let median = match sorted.len() {
        0 => "null".to_owned(),
        n if n % 2 == 1 => format!("{:.1}", sorted[n / 2]),
        n => format!("{:.1}", (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    };
    let latencies: Vec<String> = measured
        .latencies
        .iter()
        .map(|l| l.as_ref().map_or("null".to_owned(), |l| format!("{:.1}", millis(l))))
        .collect();
    let batch_ms = if measured.big_per_sec > 0.0 {
        options.concurrency as f64 / measured.big_per_sec * 1000.0
    } else {
        f64::INFINITY
    };
    let within = sorted.iter().filter(|&&l| l <= batch_ms + WAKE_UP_MS).count();
    let batch_time = if batch_ms.is_finite() {
        format!("{batch_ms:.1}")
    } else {
        "null".to_owned()
    };
    println!(
        "{{\"backlog\":{},\"concurrency\":{},\"dispatch_ms\":{},\"probes\":{},\"turns\":{},\"small_latency_ms\":[{}],\"small_latency_median_ms\":{median},\"big_per_sec\":{:.1},\"batch_time_ms\":{batch_time},\"within_one_batch\":{within},\"big_delivered_before_stop\":{}}}",
        options.backlog,
        options.concurrency,
        options.dispatch_ms,
        options.probes,
        options.turns,
        latencies.join(","),
        measured.big_per_sec,
        measured.big_before_stop,
    );
    let all = sorted.len() == options.probes;
    if !all {
        eprintln!(
            "fair-bench: {} of {} probes were never dispatched within {GIVE_UP:?}",
            options.probes - sorted.len(),
            options.probes
        );
    }
    Ok(all)
}

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let options = match parse(&mut std::env::args().skip(1)) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("fair-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let schema = format!("fair_bench_{}", std::process::id());
    let outbox = runtime.block_on(PostgresOutbox::open(PostgresOptions::new(&options.url).schema(&schema)));
    let outbox = match outbox {
        Ok(outbox) => outbox,
        Err(e) => {
            eprintln!("fair-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(run(outbox.clone(), &options));
    let dropped = runtime.block_on(async {
        let client = outbox.pool().get().await.map_err(|e| e.to_string())?;
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .map_err(|e| e.to_string())
    });
    if let Err(e) = dropped {
        eprintln!("fair-bench: the schema {schema} could not be dropped: {e}");
    }
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fair-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
