//! Delivery throughput: N committed intents drained by one `flush`, with a dispatcher that
//! returns at once or awaits a delay, at a given concurrency.
//!
//! ```text
//! cargo run --release -p reactifact-examples --bin delivery-bench -- 100000 --concurrency 256 --delay-ms 1
//! ```
//!
//! Prints one JSON line: n, concurrency, delay_ms, seconds, deliveries_per_sec. Exits non-zero
//! unless every intent was delivered exactly once.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reactifact_core::runtime::{Budget, TurnOutcome};
use reactifact_core::{Agent, Context, DeliveryOptions, DispatchError, Intent, Runtime};
use reactifact_examples::order_flow::{process_order, Order};

struct Options {
    n: u64,
    concurrency: usize,
    delay: Duration,
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        n: 100_000,
        concurrency: 256,
        delay: Duration::ZERO,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--concurrency" => {
                options.concurrency = value("--concurrency")?
                    .parse()
                    .map_err(|e| format!("--concurrency: {e}"))?
            }
            "--delay-ms" => {
                let ms: u64 = value("--delay-ms")?.parse().map_err(|e| format!("--delay-ms: {e}"))?;
                options.delay = Duration::from_millis(ms);
            }
            n => options.n = n.parse().map_err(|e| format!("N: {e}"))?,
        }
    }
    Ok(options)
}

async fn run(options: &Options) -> Result<f64, String> {
    // Commit N intents with no dispatcher: they wait in the ledger.
    let mut ctx = Context::new("bench");
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
        .agent(Agent::new("billing").produce(process_order))
        .build()
        .map_err(|e| e.to_string())?;
    let report = rt.run_with(Budget::UNLIMITED).await.map_err(|e| e.to_string())?;
    if report.outcome != TurnOutcome::Completed
        || rt.context().ledger().pending().await.map_err(|e| e.to_string())? != options.n
    {
        return Err("the intents were not committed".into());
    }

    let sent = Arc::new(Mutex::new(Vec::with_capacity(options.n as usize)));
    let delay = options.delay;
    let dispatcher = {
        let sent = sent.clone();
        move |intent: Intent| {
            let sent = sent.clone();
            async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                sent.lock().unwrap().push(intent.key().clone());
                Ok::<(), DispatchError>(())
            }
        }
    };
    let mut rt = Runtime::builder(rt.into_context())
        .dispatcher(dispatcher)
        .delivery(DeliveryOptions::new().concurrency(options.concurrency))
        .build()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let drained = rt.flush().await.map_err(|e| e.to_string())?;
    let seconds = started.elapsed().as_secs_f64();

    let sent = sent.lock().unwrap();
    let unique: HashSet<_> = sent.iter().collect();
    if drained.delivered != options.n || sent.len() as u64 != options.n || unique.len() != sent.len() {
        return Err(format!(
            "{} delivered, {} sends, {} distinct keys for {} intents",
            drained.delivered,
            sent.len(),
            unique.len(),
            options.n
        ));
    }
    Ok(seconds)
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("delivery-bench: {e}\nusage: delivery-bench [N] [--concurrency C] [--delay-ms D]");
            return ExitCode::from(2);
        }
    };
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime");
    match tokio.block_on(run(&options)) {
        Ok(seconds) => {
            println!(
                "{{\"bench\":\"delivery\",\"n\":{},\"concurrency\":{},\"delay_ms\":{},\"seconds\":{:.6},\"deliveries_per_sec\":{:.0}}}",
                options.n,
                options.concurrency,
                options.delay.as_millis(),
                seconds,
                options.n as f64 / seconds
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("delivery-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
