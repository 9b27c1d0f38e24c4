//! The shop service: an HTTP service over a serving runtime. Orders come in over HTTP, are
//! committed through the runtime's handle and acknowledged; a produce drafts each order's
//! confirmation with a (stand-in) model, and the outbox emails it once.
//!
//! ```sh
//! cargo run -p reactifact-examples --bin shop-service
//! cargo run -p reactifact-examples --bin shop-service -- --listen 127.0.0.1:3000 \
//!     --store sqlite:shop.db --dispatch-ms 200 --model-ms 500
//!
//! curl -i -X POST localhost:3000/orders -H 'content-type: application/json' \
//!     -d '{"id":"42","customer":"Ada","email":"ada@example.com","total_cents":1200}'
//! curl -i -X POST localhost:3000/approvals/confirm:order:43 -H 'content-type: application/json' \
//!     -d '{"by":"alice"}'
//! curl localhost:3000/metrics
//! ```
//!
//! The routes are `reactifact_examples::shop::router`'s: `POST /orders` (answers `202` once
//! the order is committed), `POST /approvals/{key}` (an order of 1,000.00 or more waits for
//! one) and `GET /metrics` (the runtime's and the service's metrics, Prometheus text).
//!
//! Options: `--listen ADDR` (default `127.0.0.1:3000`), `--store sqlite:PATH` (default
//! `sqlite:shop.db`, in the current directory; created if missing, resumed if not),
//! `--dispatch-ms N` (how long the stand-in mail service takes per email, default 0),
//! `--fail-every N` (it fails every Nth attempt, retried later; default 0, never),
//! `--model-ms N` (how long the stand-in model takes per draft, default 0),
//! `--concurrency N` (deliveries at once, default 64), and `--json-logs` (the logs as JSON).
//!
//! Logs go to stderr, filtered by `RUST_LOG` (default `info`). SIGTERM or Ctrl-C stops the
//! service gracefully: it stops taking connections and finishes the requests under way, then
//! stops the runtime (deliveries under way get its grace period) and prints what it served.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use reactifact_core::{Context, ServeReport};
use reactifact_examples::shop::{self, Mailer, Settings};
use reactifact_examples::{logs, prometheus};
use tokio::sync::Notify;

const USAGE: &str = "usage: shop-service [--listen ADDR] [--store sqlite:PATH] [--dispatch-ms N] \
[--fail-every N] [--model-ms N] [--concurrency N] [--json-logs]";

/// How often the serving runtime looks at the store without being woken.
const POLL: Duration = Duration::from_secs(1);

/// How often the Prometheus recorder's upkeep runs.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The command line.
struct Args {
    listen: SocketAddr,
    store: String,
    dispatch: Duration,
    fail_every: u64,
    model: Duration,
    concurrency: usize,
    json_logs: bool,
}

fn args() -> Result<Args, String> {
    let mut parsed = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
        store: "sqlite:shop.db".to_owned(),
        dispatch: Duration::ZERO,
        fail_every: 0,
        model: Duration::ZERO,
        concurrency: 64,
        json_logs: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let number = |name: &str, text: String| {
            text.parse::<u64>()
                .map_err(|_| format!("{name}: `{text}` is not a non-negative integer"))
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
            "--concurrency" => {
                parsed.concurrency = match number(&arg, value(&arg)?)? {
                    0 => return Err("--concurrency must be at least 1".to_owned()),
                    n => usize::try_from(n).unwrap_or(usize::MAX),
                }
            }
            flag if flag == logs::FLAG => parsed.json_logs = true,
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    Ok(parsed)
}

/// Opens the store the `--store` URL names: for now only `sqlite:PATH`, a SQLite file
/// (created if missing), opened off the executor's threads.
async fn open(store: &str) -> Result<Context, String> {
    let Some(path) = store.strip_prefix("sqlite:") else {
        return Err(format!("--store `{store}`: only `sqlite:PATH` is supported"));
    };
    if path.is_empty() {
        return Err("--store sqlite: needs a path".to_owned());
    }
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        Context::open(&path, shop::SESSION).map_err(|e| format!("cannot open the SQLite store {path}: {e}"))
    })
    .await
    .map_err(|e| format!("opening the store panicked: {e}"))?
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT), or when `ended` is notified (the runtime stopped
/// serving on its own).
async fn shutdown(ended: Arc<Notify>) {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C still stops the service");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        result = tokio::signal::ctrl_c() => match result {
            Ok(()) => tracing::info!("Ctrl-C: shutting down"),
            Err(e) => tracing::warn!(error = %e, "cannot listen for Ctrl-C; shutting down"),
        },
        () = terminate => tracing::info!("SIGTERM: shutting down"),
        () = ended.notified() => tracing::warn!("the runtime stopped serving: shutting down"),
    }
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
    let context = open(&args.store).await?;
    let mailer = Mailer::new(args.dispatch, args.fail_every);
    let settings = Settings {
        model_delay: args.model,
        delivery_concurrency: args.concurrency,
    };
    let mut runtime = shop::runtime(context, &settings, &mailer).map_err(|e| e.to_string())?;
    let handle = runtime.handle();
    let ended = Arc::new(Notify::new());
    let serving = {
        let ended = ended.clone();
        tokio::spawn(async move {
            let report = runtime.serve(POLL).await;
            ended.notify_one();
            report
        })
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    println!("shop-service listening on http://{address} (store {})", args.store);
    tracing::info!(%address, store = %args.store, "serving");
    let http = axum::serve(listener, shop::router(handle.clone(), metrics))
        .with_graceful_shutdown(shutdown(ended))
        .await
        .map_err(|e| format!("the HTTP server failed: {e}"));
    // No request is under way any more: stop the runtime (deliveries under way get its grace
    // period) and wait for it.
    handle.stop();
    let report = serving
        .await
        .map_err(|e| format!("the runtime panicked: {e}"))?
        .map_err(|e| format!("the runtime stopped on an error: {e}"))?;
    http.map(|()| report)
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
                 {} generations, {} runs, {} emails delivered, {} failed attempts, {} dead",
                report.writes,
                report.refused_writes,
                report.turns,
                report.generations,
                report.runs,
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
