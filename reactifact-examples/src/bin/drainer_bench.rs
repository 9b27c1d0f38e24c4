//! Delivery throughput of standalone drainer processes on one SQLite file: N committed intents,
//! drained by K processes at once, each a `Drainer` over `SqliteOutbox::open(path)`.
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin drainer-bench -- 20000 --drainers 2 --concurrency 64
//! ```
//!
//! Prints one JSON line: n, drainers, concurrency, synchronous, seconds, deliveries_per_sec.
//! The time runs from the drainers' start until the file counts every intent delivered. Exits non-zero unless
//! every intent was delivered exactly once across all processes (each child writes the keys it
//! sent to a file of its own; the parent checks them).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use reactifact_core::{
    Agent, Budget, Context, DispatchError, Drainer, Intent, OpenOptions, OutboxStore, Runtime, SqliteOutbox,
    Synchronous,
};
use reactifact_examples::order_flow::{process_order, Order};

struct Options {
    n: u64,
    drainers: usize,
    concurrency: usize,
    synchronous: Synchronous,
}

fn parse(args: &mut impl Iterator<Item = String>) -> Result<Options, String> {
    let mut options = Options {
        n: 20_000,
        drainers: 1,
        concurrency: 64,
        synchronous: Synchronous::Full,
    };
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--drainers" => options.drainers = value("--drainers")?.parse().map_err(|e| format!("--drainers: {e}"))?,
            "--concurrency" => {
                options.concurrency = value("--concurrency")?
                    .parse()
                    .map_err(|e| format!("--concurrency: {e}"))?
            }
            "--normal" => options.synchronous = Synchronous::Normal,
            n => options.n = n.parse().map_err(|e| format!("N: {e}"))?,
        }
    }
    Ok(options)
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

/// In a child: drains the file until nothing waits, writing the keys it sent to `out`.
async fn drain(path: &Path, out: &Path, concurrency: usize) -> Result<(), String> {
    let outbox = SqliteOutbox::open(path).map_err(|e| e.to_string())?;
    let sent = Arc::new(Mutex::new(Vec::new()));
    let record = sent.clone();
    let drainer = Drainer::builder(outbox, move |intent: Intent| {
        record.lock().unwrap().push(intent.key().to_string());
        std::future::ready(Ok::<(), DispatchError>(()))
    })
    .concurrency(concurrency)
    .build();
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
        let (path, out, concurrency) = (args.nth(1), args.next(), args.next());
        let (Some(path), Some(out), Some(concurrency)) = (path, out, concurrency.and_then(|c| c.parse().ok())) else {
            eprintln!("--child PATH OUT CONCURRENCY");
            return ExitCode::from(2);
        };
        return match runtime.block_on(drain(Path::new(&path), Path::new(&out), concurrency)) {
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
    if let Err(e) = runtime.block_on(prepare(&path, &options)) {
        eprintln!("drainer-bench: {e}");
        return ExitCode::FAILURE;
    }
    let exe = std::env::current_exe().expect("the benchmark's own path");
    let outs: Vec<PathBuf> = (0..options.drainers).map(|k| dir.join(format!("sent-{k}"))).collect();
    let started = Instant::now();
    let children: Vec<_> = outs
        .iter()
        .map(|out| {
            Command::new(&exe)
                .arg("--child")
                .arg(&path)
                .arg(out)
                .arg(options.concurrency.to_string())
                .spawn()
                .expect("a drainer process")
        })
        .collect();
    // The time until the file says every intent is delivered (the children's own settles then
    // take up to a second more to see that the others are done).
    let watcher = SqliteOutbox::open(&path).expect("the file's outbox");
    let delivered = runtime.block_on(async {
        loop {
            let counts = watcher.counts(&reactifact_core::Scope::all()).await;
            if counts.map_or(true, |c| c.delivered >= options.n) {
                return started.elapsed();
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    });
    drop(watcher);
    let mut ok = true;
    for mut child in children {
        ok &= child.wait().is_ok_and(|status| status.success());
    }
    let seconds = delivered.as_secs_f64();
    let mut seen = HashSet::new();
    let mut total = 0u64;
    for out in &outs {
        for key in std::fs::read_to_string(out).unwrap_or_default().lines() {
            total += 1;
            seen.insert(key.to_owned());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{{\"n\":{},\"drainers\":{},\"concurrency\":{},\"synchronous\":\"{:?}\",\"seconds\":{seconds:.3},\"deliveries_per_sec\":{:.0},\"sent\":{total},\"distinct\":{}}}",
        options.n,
        options.drainers,
        options.concurrency,
        options.synchronous,
        options.n as f64 / seconds,
        seen.len()
    );
    if !ok || total != options.n || seen.len() as u64 != options.n {
        eprintln!(
            "drainer-bench: expected each of {} keys sent once; sent {total}, {} distinct",
            options.n,
            seen.len()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
