//! Per-kind rate limits across drainer processes on PostgreSQL: a backlog of intents of a
//! limited kind (`mail`) and of an unlimited one (`sms`), served by P processes at once, each
//! a `Drainer` over `PostgresOutbox::open` of one schema with
//! `DeliveryOptions::rate_limit("mail", RateLimit::per_second(R).burst(B))`.
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin rate-bench -- --rate 100 --burst 10 \
//!     --drainers 4 --seconds 30 --url postgres://postgres@127.0.0.1:5432/test
//! ```
//!
//! Options: `--rate R` (per second, 100), `--burst B` (10), `--drainers P` (4), `--seconds S`
//! (30), `--limited L` (`mail` intents; R × S × 2, so that the backlog never runs dry),
//! `--other M` (`sms` intents, 20,000), `--concurrency C` (64), `--url URL` (else
//! `REACTIFACT_TEST_POSTGRES_URL`).
//!
//! The parent registers every intent, both kinds interleaved and due now, in a schema of the
//! run's own (1,000 per transaction, through `PostgresOutbox::register_alone`), dropped at the
//! end. Each child writes one line per dispatch, `key<TAB>unix_micros` (the moment its
//! dispatcher was handed the intent), to a file of its own. After S seconds the parent closes
//! the children's stdin: each stops its drainer and flushes its file.
//!
//! Prints one JSON line: rate, burst, drainers, seconds, mail_sent, mail_distinct,
//! max_mail_in_any_1s_window (over the `mail` sends of every process), allowed_in_window
//! (rate + burst), mail_per_sec_steady (the `mail` sends after the first second, per second
//! after it), sms_sent, sms_seconds_to_all (from the first send to the last `sms`, if every
//! one was sent; else null), duplicates (keys sent more than once). Exits non-zero if a child
//! failed, a key was sent twice, or a 1 s window holds more than rate + burst + 1 `mail` sends.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use reactifact_core::audit::{CommitHash, ContentHash};
use reactifact_core::runtime::{Generation, Origin};
use reactifact_core::store::NewIntent;
use reactifact_core::{ActionKey, DeliveryOptions, DispatchError, Drainer, Intent, PendingAction, RateLimit};
use reactifact_postgres::{PostgresOptions, PostgresOutbox};
use sha2::Digest as _;

/// The run's options, as parsed from the command line.
struct Options {
    rate: u32,
    burst: u32,
    drainers: usize,
    seconds: u64,
    limited: u64,
    other: u64,
    concurrency: usize,
    url: String,
}

fn parse(args: &mut impl Iterator<Item = String>) -> Result<Options, String> {
    let (mut rate, mut burst, mut drainers, mut seconds) = (100u32, 10u32, 4usize, 30u64);
    let (mut limited, mut other, mut concurrency) = (None, 20_000u64, 64usize);
    let mut url = std::env::var("REACTIFACT_TEST_POSTGRES_URL").ok();
    while let Some(arg) = args.next() {
        let value = args.next().ok_or(format!("{arg} needs a value"))?;
        let bad = |e: std::num::ParseIntError| format!("{arg}: {e}");
        match arg.as_str() {
            "--rate" => rate = value.parse().map_err(bad)?,
            "--burst" => burst = value.parse().map_err(bad)?,
            "--drainers" => drainers = value.parse().map_err(bad)?,
            "--seconds" => seconds = value.parse().map_err(bad)?,
            "--limited" => limited = Some(value.parse().map_err(bad)?),
            "--other" => other = value.parse().map_err(bad)?,
            "--concurrency" => concurrency = value.parse().map_err(bad)?,
            "--url" => url = Some(value),
            _ => return Err(format!("unknown option `{arg}`")),
        }
    }
    Ok(Options {
        rate,
        burst,
        drainers,
        seconds,
        limited: limited.unwrap_or(u64::from(rate) * seconds * 2),
        other,
        concurrency,
        url: url.ok_or("--url or REACTIFACT_TEST_POSTGRES_URL is needed")?,
    })
}

/// Microseconds since the Unix epoch, now.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Registers `limited` intents of kind `mail` and `other` of kind `sms`, interleaved and due
/// now, in a new schema, as commits of session `bench` (1,000 intents each) would.
async fn prepare(url: &str, schema: &str, limited: u64, other: u64) -> Result<Arc<PostgresOutbox>, String> {
    let outbox = PostgresOutbox::open(PostgresOptions::new(url).schema(schema))
        .await
        .map_err(|e| e.to_string())?;
    let items: Vec<(&str, u64)> = (0..limited.max(other))
        .flat_map(|i| [("mail", i, i < limited), ("sms", i, i < other)])
        .filter(|&(.., wanted)| wanted)
        .map(|(kind, i, _)| (kind, i))
        .collect();
    for (generation, batch) in items.chunks(1000).enumerate() {
        let generation = generation as u64 + 1;
        let intents: Vec<NewIntent> = batch
            .iter()
            .map(|&(kind, i)| {
                let key = format!("{kind}:{i}");
                let payload = rmp_serde::to_vec_named(&format!("to{i}")).expect("a string encodes");
                let action = PendingAction {
                    kind: kind.to_owned(),
                    key: key.clone(),
                    payload: payload.clone(),
                    requires_approval: false,
                    not_before: None,
                    group: None,
                };
                let bytes = rmp_serde::to_vec_named(&action).expect("a PendingAction encodes");
                let origin = Origin::new("bench", CommitHash([generation as u8; 32]), Generation(generation), 0);
                NewIntent {
                    intent: Intent::new(ActionKey::from(key), kind, payload, origin, 0),
                    action_hash: ContentHash(sha2::Sha256::digest(&bytes).into()),
                    bytes: Arc::from(bytes),
                }
            })
            .collect();
        outbox
            .register_alone(&intents, SystemTime::now())
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(outbox)
}

/// In a child: serves a rate-limited drainer of the schema until its stdin closes, writing
/// `key<TAB>unix_micros` to `out` for each intent handed to its dispatcher.
async fn serve(args: &[String]) -> Result<(), String> {
    let [url, schema, out, concurrency, rate, burst] = args else {
        return Err("--child URL SCHEMA OUT CONCURRENCY RATE BURST".to_owned());
    };
    let number = |s: &str| s.parse::<u32>().map_err(|e| format!("{s}: {e}"));
    let limit = RateLimit::per_second(number(rate)?).burst(number(burst)?);
    let outbox = PostgresOutbox::open(PostgresOptions::new(url).schema(schema))
        .await
        .map_err(|e| e.to_string())?;
    let file = File::create(out).map_err(|e| format!("{out}: {e}"))?;
    let sink = Arc::new(Mutex::new(BufWriter::new(file)));
    let record = sink.clone();
    let drainer = Drainer::builder(outbox, move |intent: Intent| {
        let line = format!("{}\t{}\n", intent.key(), now_us());
        record
            .lock()
            .unwrap()
            .write_all(line.as_bytes())
            .expect("the child's output file takes a line");
        async { Ok::<(), DispatchError>(()) }
    })
    .delivery(
        DeliveryOptions::new()
            .concurrency(number(concurrency)? as usize)
            .rate_limit("mail", limit),
    )
    .poll_interval(Duration::from_millis(50))
    .build()
    .map_err(|e| e.to_string())?;
    let stop = drainer.stop_handle();
    let on_eof = stop.clone();
    std::thread::spawn(move || {
        // Nothing is ever written: the parent closes the pipe to stop this child.
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        on_eof.stop();
    });
    drainer.serve(stop).await.map_err(|e| e.to_string())?;
    let flushed = sink.lock().unwrap().flush();
    flushed.map_err(|e| e.to_string())
}

/// The most times of `sorted` (microseconds) within any window of one second.
fn max_in_window(sorted: &[u64]) -> usize {
    let mut start = 0;
    let mut most = 0;
    for (end, &t) in sorted.iter().enumerate() {
        while t - sorted[start] >= 1_000_000 {
            start += 1;
        }
        most = most.max(end + 1 - start);
    }
    most
}

/// Runs the children for the run's seconds and reports what they sent.
fn run(options: &Options, dir: &Path, schema: &str) -> Result<bool, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let outs: Vec<PathBuf> = (0..options.drainers).map(|k| dir.join(format!("sent-{k}"))).collect();
    let mut children = Vec::new();
    for out in &outs {
        let child = Command::new(&exe)
            .arg("--child")
            .args([&options.url, schema])
            .arg(out)
            .args([options.concurrency, options.rate as usize, options.burst as usize].map(|n| n.to_string()))
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| format!("a drainer process: {e}"))?;
        children.push(child);
    }
    std::thread::sleep(Duration::from_secs(options.seconds));
    let stopped = now_us();
    let mut ok = true;
    for child in &mut children {
        drop(child.stdin.take());
    }
    for mut child in children {
        ok &= child.wait().is_ok_and(|status| status.success());
    }
    let mut counts: HashMap<String, u32> = HashMap::new();
    let (mut mail, mut sms) = (Vec::new(), Vec::new());
    for out in &outs {
        for line in std::fs::read_to_string(out).unwrap_or_default().lines() {
            let (key, t) = line.split_once('\t').unwrap_or((line, ""));
            let t: u64 = t.parse().map_err(|e| format!("{line:?}: {e}"))?;
            *counts.entry(key.to_owned()).or_default() += 1;
            if key.starts_with("mail:") {
                mail.push(t);
            } else {
                sms.push(t);
            }
        }
    }
    mail.sort_unstable();
    sms.sort_unstable();
    let distinct = |prefix: &str| counts.keys().filter(|k| k.starts_with(prefix)).count();
    let (mail_distinct, sms_distinct) = (distinct("mail:"), distinct("sms:"));
    let duplicates = counts.values().filter(|&&n| n > 1).count();
    let max_window = max_in_window(&mail);
    let allowed = u64::from(options.rate) + u64::from(options.burst);
    let steady = mail.first().map_or(0.0, |&first| {
        let after = first + 1_000_000;
        let end = stopped.max(*mail.last().unwrap_or(&0));
        let sent = mail.iter().filter(|&&t| t >= after).count();
        if end > after {
            sent as f64 / ((end - after) as f64 / 1e6)
        } else {
            0.0
        }
    });
    let first = mail.first().into_iter().chain(sms.first()).min().copied();
    let sms_to_all = match (first, sms.last()) {
        (Some(first), Some(&last)) if sms_distinct as u64 == options.other => {
            format!("{:.3}", (last - first) as f64 / 1e6)
        }
        _ => "null".to_owned(),
    };
    println!(
        "{{\"rate\":{},\"burst\":{},\"drainers\":{},\"seconds\":{},\"mail_sent\":{},\"mail_distinct\":{mail_distinct},\"max_mail_in_any_1s_window\":{max_window},\"allowed_in_window\":{allowed},\"mail_per_sec_steady\":{steady:.1},\"sms_sent\":{},\"sms_seconds_to_all\":{sms_to_all},\"duplicates\":{duplicates}}}",
        options.rate,
        options.burst,
        options.drainers,
        options.seconds,
        mail.len(),
        sms.len(),
    );
    if !ok {
        eprintln!("rate-bench: a drainer process failed");
    }
    if duplicates > 0 {
        eprintln!("rate-bench: {duplicates} keys were sent more than once");
    }
    if max_window as u64 > allowed + 1 {
        eprintln!("rate-bench: {max_window} mail sends within one second; the limit allows {allowed}");
    }
    Ok(ok && duplicates == 0 && max_window as u64 <= allowed + 1)
}

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("--child") {
        let rest: Vec<String> = args.skip(1).collect();
        return match runtime.block_on(serve(&rest)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rate-bench drainer: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let options = match parse(&mut args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("rate-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let schema = format!("rate_bench_{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("rate-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let outbox = match runtime.block_on(prepare(&options.url, &schema, options.limited, options.other)) {
        Ok(outbox) => outbox,
        Err(e) => {
            eprintln!("rate-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = run(&options, &dir, &schema);
    let dropped = runtime.block_on(async {
        let client = outbox.pool().get().await.map_err(|e| e.to_string())?;
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .map_err(|e| e.to_string())
    });
    if let Err(e) = dropped {
        eprintln!("rate-bench: the schema {schema} could not be dropped: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("rate-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
