//! Open time of a SQLite session against its history, with and without checkpoints.
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin open-bench -- 1000000 1005000
//! cargo run --release -p reactifact-examples --bin open-bench -- 100000 --ids 100000 --samples 5
//! ```
//!
//! For each N, writes a session of N commits to a new file (`synchronous = NORMAL`; untimed),
//! one direct write per commit: commit `i` creates or updates `order:{i % K}` (`--ids K`,
//! default 10,000), so the state holds K orders whatever N, and every 1,000 commits a turn of a
//! runtime consumes the queued events (no produce reacts to orders), as a running runtime would:
//! the queue is part of what a checkpoint holds. Checkpoints are written every
//! `--every` commits (default 10,000, the default of `OpenOptions::checkpoint_every`), so the
//! newest is at N rounded down to a multiple of it and an open replays the N mod `--every`
//! commits after it. A copy of the file without its checkpoints is then opened the way a file
//! of schema version 2 was: from the first commit.
//!
//! Timed, `--samples` times each (default 7; at least 3 for the whole-log opens, which cost
//! seconds): `Context::open` of the file (from its newest checkpoint), `Context::open` of the
//! copy (every commit), and `Context::checkpoint` of the head (encoding and writing the state).
//! Opens read a warm page cache. Prints one JSON line per N with medians, minima and maxima in
//! milliseconds and the file size. Exits non-zero if the two opens disagree on the generation
//! or the state hash.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use reactifact_core::store::{Synchronous, DEFAULT_CHECKPOINT_EVERY};
use reactifact_core::{Agent, Context, OpenOptions, Produce, ProduceCall, ProduceError, Runtime};
use reactifact_examples::order_flow::{Order, Receipt};

/// How many commits' events wait before a turn consumes them.
const CONSUME_EVERY: u64 = 1_000;

struct Options {
    commits: Vec<u64>,
    ids: u64,
    every: u64,
    samples: usize,
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        commits: Vec::new(),
        ids: 10_000,
        every: DEFAULT_CHECKPOINT_EVERY,
        samples: 7,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--ids" => options.ids = value("--ids")?.parse().map_err(|e| format!("--ids: {e}"))?,
            "--every" => options.every = value("--every")?.parse().map_err(|e| format!("--every: {e}"))?,
            "--samples" => options.samples = value("--samples")?.parse().map_err(|e| format!("--samples: {e}"))?,
            n => options.commits.push(n.parse().map_err(|e| format!("N: {e}"))?),
        }
    }
    if options.commits.is_empty() {
        options.commits = vec![1_000_000];
    }
    if options.samples == 0 || options.ids == 0 || options.every == 0 {
        return Err("--samples, --ids and --every must be at least 1".into());
    }
    Ok(options)
}

fn options(every: u64) -> OpenOptions {
    OpenOptions::new()
        .synchronous(Synchronous::Normal)
        .checkpoint_every(every)
}

/// Writes `commits` commits, commit `i` writing `order:{i % ids}`, and consumes their events
/// every [`CONSUME_EVERY`] commits, as a runtime would: a turn of a runtime whose only produce
/// reacts to receipts (which nothing writes here) consumes them without a commit.
async fn write(path: &Path, commits: u64, ids: u64, every: u64) -> Result<(), String> {
    let ctx = Context::open_with(path, "orders", options(every)).map_err(|e| e.to_string())?;
    let idle = Produce::new("on_receipt", |_: ProduceCall<Receipt>| async {
        Ok::<(), ProduceError>(())
    });
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("idle").produce(idle))
        .build()
        .map_err(|e| e.to_string())?;
    for i in 0..commits {
        let order = Order {
            customer: format!("customer-{}", i % 97),
            total_cents: i,
        };
        rt.context_mut()
            .create(format!("order:{}", i % ids), order)
            .map_err(|e| e.to_string())?;
        if (i + 1) % CONSUME_EVERY == 0 {
            rt.run().await.map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The file's copy without checkpoints.
fn strip(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to).map_err(|e| e.to_string())?;
    let conn = rusqlite::Connection::open(to).map_err(|e| e.to_string())?;
    conn.execute_batch("DELETE FROM checkpoints;")
        .map_err(|e| e.to_string())
}

/// (median, min, max) in milliseconds.
fn stats(mut samples: Vec<f64>) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    (samples[samples.len() / 2], samples[0], samples[samples.len() - 1])
}

fn time_open(path: &Path, samples: usize) -> Result<(Vec<f64>, Context), String> {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..samples {
        drop(last.take());
        let start = Instant::now();
        let ctx = Context::open_with(path, "orders", options(0)).map_err(|e| e.to_string())?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
        last = Some(ctx);
    }
    Ok((times, last.expect("at least one sample")))
}

async fn run(options: &Options) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("reactifact-open-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for &n in &options.commits {
        let path = dir.join(format!("with-{n}.db"));
        let bare = dir.join(format!("without-{n}.db"));
        let start = Instant::now();
        write(&path, n, options.ids, options.every).await?;
        let setup_s = start.elapsed().as_secs_f64();
        strip(&path, &bare)?;
        let size_mb = std::fs::metadata(&path).map_err(|e| e.to_string())?.len() as f64 / 1e6;

        let (with, ctx) = time_open(&path, options.samples)?;
        let (without, whole) = time_open(&bare, options.samples.max(3))?;
        if (ctx.generation(), ctx.state_hash()) != (whole.generation(), whole.state_hash()) {
            return Err(format!(
                "N = {n}: the open from a checkpoint gives generation {} and state {}, the whole log {} and {}",
                ctx.generation().0,
                ctx.state_hash(),
                whole.generation().0,
                whole.state_hash()
            ));
        }
        let mut checkpoint = Vec::new();
        for _ in 0..options.samples {
            let start = Instant::now();
            ctx.checkpoint().await.map_err(|e| e.to_string())?;
            checkpoint.push(start.elapsed().as_secs_f64() * 1e3);
        }
        let queued = whole.queued_events();
        let (w, wo, c) = (stats(with), stats(without), stats(checkpoint));
        println!(
            "{{\"commits\":{n},\"ids\":{},\"every\":{},\"tail\":{},\"queued\":{queued},\"file_mb\":{size_mb:.1},\"setup_s\":{setup_s:.1},\
             \"open_checkpoint_ms\":{{\"median\":{:.2},\"min\":{:.2},\"max\":{:.2},\"n\":{}}},\
             \"open_whole_log_ms\":{{\"median\":{:.1},\"min\":{:.1},\"max\":{:.1},\"n\":{}}},\
             \"checkpoint_write_ms\":{{\"median\":{:.2},\"min\":{:.2},\"max\":{:.2},\"n\":{}}},\"speedup\":{:.0}}}",
            options.ids,
            options.every,
            n % options.every,
            w.0,
            w.1,
            w.2,
            options.samples,
            wo.0,
            wo.1,
            wo.2,
            options.samples.max(3),
            c.0,
            c.1,
            c.2,
            options.samples,
            wo.0 / w.0,
        );
        drop((ctx, whole));
        for file in [&path, &bare] {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
        }
    }
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("open-bench: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("open-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
