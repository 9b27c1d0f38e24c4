//! The metrics example: the outbox walkthrough's workload, round after round, with the
//! runtime's metrics served to Prometheus.
//!
//! ```sh
//! cargo run -p reactifact-examples --bin metrics                  # serves http://127.0.0.1:9464/metrics
//! cargo run -p reactifact-examples --bin metrics -- --port 0      # on a free port (printed)
//! cargo run -p reactifact-examples --bin metrics -- --rounds 3    # three rounds, then serves on
//! cargo run -p reactifact-examples --bin metrics -- --once        # one round, the metrics on stdout
//! cargo run -p reactifact-examples --bin metrics -- --json-logs   # and the runtime's logs, as JSON on stderr
//! ```
//!
//! The runtime records its metrics through the `metrics` facade and forces no exporter on its
//! users; this program installs one, `metrics-exporter-prometheus`'s recorder (without its
//! HTTP listener), and answers `GET /metrics` with the recorder's rendering from a small
//! HTTP/1.1 server of its own on `127.0.0.1` (`--port N`, default 9464; `--port 0` picks a
//! free port). Its first line on stdout is `serving metrics on http://ADDR/metrics`. Any other
//! path is `404`, a method other than `GET` or `HEAD` is `405`, a request that is not
//! HTTP/1.x is `400`; every connection is closed after one answer.
//!
//! While it serves, it runs the walkthrough (`reactifact_examples::walkthrough`) in memory and
//! on SQLite in a new temporary directory, one round a second, and prints one line per round;
//! `--rounds N` stops after N rounds and serves on until interrupted. The histograms (every
//! metric whose name ends in `_seconds`) have the buckets of `reactifact_examples::prometheus::BUCKETS`. The program's own
//! counter `reactifact_example_rounds_total{outcome="passed"|"failed"}` counts the rounds.
//!
//! `--once` runs one round, prints the rendered metrics to stdout (the walkthrough's lines go
//! to stderr, or nowhere with `--json-logs`) and exits 0 if every case held, 1 if not.
//!
//! `--json-logs` prints the runtime's `tracing` events to stderr as JSON (see
//! `reactifact_examples::logs`).

use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use reactifact_examples::walkthrough::{walk_narrated, Narration, Store};
use reactifact_examples::{logs, prometheus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The port without `--port`: the one commonly used by Prometheus exporters of this kind.
const DEFAULT_PORT: u16 = 9464;

/// The content type of the Prometheus text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// The most a request's head (its request line and headers) may take.
const MAX_HEAD: usize = 8 * 1024;

/// How long a client has to send its request's head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the recorder's upkeep runs (`install_recorder` leaves it to the caller).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The pause between two rounds of the workload.
const PAUSE: Duration = Duration::from_secs(1);

/// The command line.
struct Args {
    port: u16,
    rounds: Option<u64>,
    once: bool,
    json_logs: bool,
}

fn args() -> Result<Args, String> {
    let mut parsed = Args {
        port: DEFAULT_PORT,
        rounds: None,
        once: false,
        json_logs: false,
    };
    let (mut port, mut rounds) = (false, false);
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| -> Result<String, String> {
            let value = args.next().ok_or_else(|| format!("{what} needs a number"))?;
            value.into_string().map_err(|_| format!("{what}: not a number"))
        };
        if arg == "--port" {
            let value = value("--port")?;
            parsed.port = value
                .parse()
                .map_err(|_| format!("--port {value}: not a port number (0 to 65535)"))?;
            port = true;
        } else if arg == "--rounds" {
            let value = value("--rounds")?;
            parsed.rounds = Some(match value.parse() {
                Ok(0) | Err(_) => return Err(format!("--rounds {value}: not a positive number")),
                Ok(n) => n,
            });
            rounds = true;
        } else if arg == "--once" {
            parsed.once = true;
        } else if arg == logs::FLAG {
            parsed.json_logs = true;
        } else {
            return Err(format!(
                "unexpected argument {}; the options are --port N, --rounds N, --once and {}",
                arg.to_string_lossy(),
                logs::FLAG
            ));
        }
    }
    if parsed.once && (port || rounds) {
        return Err("--once serves nothing: it takes neither --port nor --rounds".into());
    }
    Ok(parsed)
}

/// One round of the workload: the walkthrough in memory, then on SQLite in a new temporary
/// directory (removed after the round); whether every case held.
async fn round(narration: Narration) -> bool {
    let mut ok = walk_narrated(Store::Memory, narration).await;
    match tempfile::Builder::new().prefix("reactifact-metrics-").tempdir() {
        Ok(dir) => ok &= walk_narrated(Store::Sqlite(dir.path().join("shop.db")), narration).await,
        Err(e) => {
            eprintln!("metrics: cannot create a temporary directory: {e}");
            ok = false;
        }
    }
    let outcome = if ok { "passed" } else { "failed" };
    metrics::counter!("reactifact_example_rounds_total", "outcome" => outcome).increment(1);
    ok
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("metrics: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = logs::init(args.json_logs) {
        eprintln!("metrics: {e}");
        return ExitCode::from(2);
    }
    let handle = match prometheus::install() {
        Ok(handle) => handle,
        Err(e) => {
            eprintln!("metrics: {e}");
            return ExitCode::FAILURE;
        }
    };
    metrics::describe_counter!(
        "reactifact_example_rounds_total",
        "Rounds of the walkthrough workload the metrics example ran, by outcome."
    );

    if args.once {
        let narration = if args.json_logs {
            Narration::Silent
        } else {
            Narration::Stderr
        };
        let ok = round(narration).await;
        print!("{}", handle.render());
        return if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }

    let listener = match TcpListener::bind((Ipv4Addr::LOCALHOST, args.port)).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("metrics: cannot listen on 127.0.0.1:{}: {e}", args.port);
            return ExitCode::FAILURE;
        }
    };
    match listener.local_addr() {
        Ok(addr) => println!("serving metrics on http://{addr}/metrics"),
        Err(e) => {
            eprintln!("metrics: the listener has no address: {e}");
            return ExitCode::FAILURE;
        }
    }
    tokio::spawn(serve(listener, handle.clone()));
    tokio::spawn(upkeep(handle));

    let (mut done, mut failed) = (0u64, 0u64);
    while args.rounds.is_none_or(|rounds| done < rounds) {
        if done > 0 {
            tokio::time::sleep(PAUSE).await;
        }
        let started = Instant::now();
        let ok = round(Narration::Silent).await;
        done += 1;
        failed += u64::from(!ok);
        let what = if ok {
            "every case held, in memory and on SQLite"
        } else {
            "a case failed (see stderr)"
        };
        println!("round {done}: {what} ({} ms)", started.elapsed().as_millis());
    }
    println!("{done} rounds run, {failed} failed; serving until interrupted");
    std::future::pending::<ExitCode>().await
}

/// Runs the recorder's upkeep (draining the histograms' samples) every [`UPKEEP_EVERY`].
async fn upkeep(handle: PrometheusHandle) {
    let mut every = tokio::time::interval(UPKEEP_EVERY);
    loop {
        every.tick().await;
        handle.run_upkeep();
    }
}

/// Accepts connections for ever, answering each on a task of its own.
async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let handle = handle.clone();
                tokio::spawn(async move {
                    if let Err(e) = answer(stream, &handle).await {
                        tracing::debug!(error = %e, "a metrics connection failed");
                    }
                });
            }
            Err(e) => {
                // Out of file descriptors, most likely: wait a little rather than spin.
                tracing::warn!(error = %e, "the metrics listener could not accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// What the client sent before the answer.
enum Received {
    /// The request's head, up to and without its blank line — or all the client sent before
    /// it closed its side.
    Head(Vec<u8>),
    /// More than [`MAX_HEAD`] bytes without the end of a head.
    TooLarge,
}

/// Reads the request's head: up to the blank line that ends it, the client's end of stream,
/// or [`MAX_HEAD`] bytes.
async fn receive(stream: &mut TcpStream) -> std::io::Result<Received> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Received::Head(head));
        }
        // Look for the blank line from a little before the new bytes (it may straddle reads).
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        let tail = &head[from..];
        let end = [&b"\r\n\r\n"[..], b"\n\n"]
            .iter()
            .filter_map(|blank| tail.windows(blank.len()).position(|w| w == *blank))
            .min();
        if let Some(end) = end {
            head.truncate(from + end);
            return Ok(Received::Head(head));
        }
        if head.len() > MAX_HEAD {
            return Ok(Received::TooLarge);
        }
    }
}

/// Answers one connection, then closes it.
async fn answer(mut stream: TcpStream, handle: &PrometheusHandle) -> std::io::Result<()> {
    let response = match tokio::time::timeout(READ_TIMEOUT, receive(&mut stream)).await {
        Err(_) => response("408 Request Timeout", PLAIN, "", "request timed out\n", false),
        Ok(received) => match received? {
            Received::TooLarge => response(
                "431 Request Header Fields Too Large",
                PLAIN,
                "",
                "request too large\n",
                false,
            ),
            Received::Head(head) => route(&head, handle),
        },
    };
    stream.write_all(&response).await?;
    stream.shutdown().await
}

/// The answer to a request whose head is `head`.
fn route(head: &[u8], handle: &PrometheusHandle) -> Vec<u8> {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|b| *b == b' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return response("400 Bad Request", PLAIN, "", "not an HTTP/1.x request\n", false);
    };
    if !version.starts_with(b"HTTP/1.") || target.is_empty() {
        return response("400 Bad Request", PLAIN, "", "not an HTTP/1.x request\n", false);
    }
    let head_only = match method {
        b"GET" => false,
        b"HEAD" => true,
        _ => {
            return response(
                "405 Method Not Allowed",
                PLAIN,
                "allow: GET, HEAD\r\n",
                "only GET and HEAD\n",
                false,
            )
        }
    };
    let path = target.split(|b| *b == b'?').next().unwrap_or_default();
    if path == b"/metrics" {
        response("200 OK", CONTENT_TYPE, "", &handle.render(), head_only)
    } else {
        response(
            "404 Not Found",
            PLAIN,
            "",
            "not found; the metrics are at /metrics\n",
            head_only,
        )
    }
}

/// The content type of the error pages.
const PLAIN: &str = "text/plain; charset=utf-8";

/// An HTTP/1.1 response that closes the connection; `extra` holds further header lines, each
/// ending in CRLF; with `head_only` (a `HEAD` request), without the body.
fn response(status: &str, content_type: &str, extra: &str, body: &str, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n{extra}connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}
