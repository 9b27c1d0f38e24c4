//! The shop service: an HTTP service over a serving runtime. Orders come in over HTTP, are
//! committed through the runtime's handle and acknowledged; a produce drafts each order's
//! confirmation with a (stand-in) model, and the outbox emails it once.
//!
//! ```sh
//! cargo run -p reactifact-examples --bin shop-service
//! cargo run -p reactifact-examples --bin shop-service -- --listen 127.0.0.1:3000 \
//!     --store sqlite:shop.db --dispatch-ms 200 --model-ms 500
//! cargo run -p reactifact-examples --bin shop-service -- \
//!     --store 'postgres://postgres@127.0.0.1:5432/test?schema=shop'
//!
//! curl -i -X POST localhost:3000/orders -H 'content-type: application/json' \
//!     -d '{"id":"42","customer":"Ada","email":"ada@example.com","total_cents":1200}'
//! curl -i -X POST localhost:3000/approvals/confirm:order:43 -H 'content-type: application/json' \
//!     -d '{"by":"alice"}'
//! curl -i -X POST localhost:3000/parked/42/rearm
//! curl localhost:3000/metrics
//! ```
//!
//! The routes are `reactifact_examples::shop::router`'s: `POST /orders` (`201` once a new
//! order is committed, `200` for an id that exists, `503` with `Retry-After` when as many
//! orders as the inbox holds already wait for their commit), `POST /approvals/{key}` (an order
//! of 1,000.00 or more waits for one), `POST /parked/{id}/rearm` (an order whose draft failed
//! on every attempt) and `GET /metrics` (the runtime's and the service's metrics, Prometheus
//! text).
//!
//! Options: `--listen ADDR` (default `127.0.0.1:3000`), `--store URL` (default
//! `sqlite:shop.db`, in the current directory; `sqlite:PATH` or
//! `postgres://USER@HOST/DATABASE?schema=NAME`, opened with `reactifact_postgres::connect`,
//! created if missing, resumed if not), `--dispatch-ms N` (how long the stand-in mail service
//! takes per email, default 0), `--fail-every N` (it fails every Nth attempt with a retryable
//! 503, retried later; default 0, never), `--model-ms N` (how long the stand-in model takes
//! per draft, default 0), `--model-fail-every N` (the model fails every Nth call: the draft is
//! retried, and parked after 5 attempts; default 0, never), `--concurrency N` (deliveries at
//! once, default 64), `--inbox N` (writes the runtime's inbox holds, and orders that may wait
//! for their commit; default 1,024), and `--json-logs` (the logs as JSON).
//!
//! Logs go to stderr, filtered by `RUST_LOG` (default `info`). SIGTERM or Ctrl-C stops the
//! service gracefully: it stops taking connections and finishes the requests under way, then
//! stops the runtime (a generation under way is cancelled and its events stay queued;
//! deliveries under way get its grace period) and prints what it served.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use reactifact_core::runtime::{ServeReport, DEFAULT_INBOX_CAPACITY};
use reactifact_examples::shop::{self, Admission, Mailer, Settings, StandInModel};
use reactifact_examples::{logs, prometheus};

const USAGE: &str = "usage: shop-service [--listen ADDR] [--store URL] [--dispatch-ms N] [--fail-every N] \
[--model-ms N] [--model-fail-every N] [--concurrency N] [--inbox N] [--json-logs]";

/// How often the Prometheus recorder's upkeep runs.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The command line.
struct Args {
    listen: SocketAddr,
    store: String,
    dispatch: Duration,
    fail_every: u64,
    model: Duration,
    model_fail_every: u64,
    concurrency: usize,
    inbox: usize,
    json_logs: bool,
}

fn args() -> Result<Args, String> {
    let mut parsed = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
        store: "sqlite:shop.db".to_owned(),
        dispatch: Duration::ZERO,
        fail_every: 0,
        model: Duration::ZERO,
        model_fail_every: 0,
        concurrency: 64,
        inbox: DEFAULT_INBOX_CAPACITY,
        json_logs: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let number = |name: &str, text: String| {
            text.parse::<u64>()
                .map_err(|_| format!("{name}: `{text}` is not a non-negative integer"))
        };
        let at_least_one = |name: &str, n: u64| match n {
            0 => Err(format!("{name} must be at least 1")),
            n => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        };
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--listen" => {
                let text = value("--listen")?;
                parsed.listen = text
                    .parse()
                    .map_err(|_| format!("--listen: `{text}` is not an address such as 127.0.0.1:3000"))?;
            }
            "--store" => parsed.store = value("--store")?,
            "--dispatch-ms" => parsed.dispatch = Duration::from_millis(number(&arg, value(&arg)?)?),
            "--fail-every" => parsed.fail_every = number(&arg, value(&arg)?)?,
            "--model-ms" => parsed.model = Duration::from_millis(number(&arg, value(&arg)?)?),
            "--model-fail-every" => parsed.model_fail_every = number(&arg, value(&arg)?)?,
            "--concurrency" => parsed.concurrency = at_least_one(&arg, number(&arg, value(&arg)?)?)?,
            "--inbox" => parsed.inbox = at_least_one(&arg, number(&arg, value(&arg)?)?)?,
            flag if flag == logs::FLAG => parsed.json_logs = true,
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    Ok(parsed)
}

/// Runs the recorder's upkeep (draining the histograms' samples) every [`UPKEEP_EVERY`].
async fn upkeep(handle: metrics_exporter_prometheus::PrometheusHandle) {
    let mut every = tokio::time::interval(UPKEEP_EVERY);
    loop {
        every.tick().await;
        handle.run_upkeep();
    }
}

async fn serve(args: Args) -> Result<ServeReport, String> {
    let metrics = prometheus::install().map_err(|e| e.to_string())?;
    tokio::spawn(upkeep(metrics.clone()));
    // `sqlite:PATH` or `postgres://…?schema=NAME`, opened without blocking the executor.
    let context = reactifact_postgres::connect(&args.store, shop::SESSION)
        .await
        .map_err(|e| e.to_string())?;
    let mailer = Mailer::new(args.dispatch, args.fail_every);
    let settings = Settings {
        model: StandInModel::new(args.model).failing_every(args.model_fail_every),
        delivery_concurrency: args.concurrency,
        inbox_capacity: args.inbox,
        ..Settings::default()
    };
    let runtime = shop::runtime(context, &settings, &mailer).map_err(|e| e.to_string())?;
    let app = shop::router(runtime.handle(), metrics, Admission::new(args.inbox));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let store = reactifact_core::store::redact_url(&args.store);
    println!("shop-service listening on http://{address} (store {store})");
    tracing::info!(%address, store = %store, "serving");
    let shutdown = async {
        let signal = shop::terminated().await;
        tracing::info!("{signal}: shutting down");
    };
    shop::serve(runtime, listener, app, shutdown)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("shop-service: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = logs::init_service(args.json_logs, "info") {
        eprintln!("shop-service: {e}");
        return ExitCode::from(2);
    }
    match serve(args).await {
        Ok(report) => {
            println!(
                "shop-service stopped: {} orders and other writes committed ({} refused), {} turns, \
                 {} generations, {} runs ({} failed, {} parked), {} emails delivered, {} failed attempts, \
                 {} dead",
                report.writes,
                report.refused_writes,
                report.turns,
                report.generations,
                report.runs,
                report.failed_runs,
                report.parked,
                report.delivered,
                report.failed,
                report.dead
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("shop-service: {e}");
            ExitCode::FAILURE
        }
    }
}
