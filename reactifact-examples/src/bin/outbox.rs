//! The outbox walkthrough: an order flow whose notification is sent once, whatever happens.
//!
//! ```sh
//! cargo run -p reactifact-examples --bin outbox            # SQLite file in a temporary directory
//! cargo run -p reactifact-examples --bin outbox -- my.db   # SQLite file at my.db (must not exist)
//! cargo run -p reactifact-examples --bin outbox -- --postgres postgres://postgres@127.0.0.1:5432/test
//! cargo run -p reactifact-examples --bin outbox -- --json-logs   # and the runtime's logs, as JSON on stderr
//! ```
//!
//! An `Order` triggers `process_order`, which upserts a `Receipt` and records a `notify` intent
//! keyed by the order id. The produce performs no I/O: the runtime commits its writes and its
//! intent together, and only then hands the intent to a dispatcher — here a stand-in mail
//! service that counts what it is asked to send.
//!
//! The walkthrough runs seven cases twice, once in memory and once on the embedded SQLite
//! store — and a third time on PostgreSQL when given `--postgres URL`, in a new schema of its
//! own (`walkthrough_<pid>_<time>`, left in place so that the `reactifact` tool can inspect it). Each case checks what it claims and prints one line; the program exits non-zero if
//! any check fails. See `docs/walkthrough.md` for the cases in prose.
//!
//! `--json-logs` (with any of the above) prints the runtime's `tracing` events to stderr, one
//! JSON object per line with the spans they happened in — `turn`, `produce` (agent, produce,
//! artifact id, generation), `commit`, `delivery` (action key, kind, attempt); `RUST_LOG`
//! sets the level (default `info,reactifact_core=debug`). See `reactifact_examples::logs`.

use std::path::PathBuf;
use std::process::ExitCode;

use reactifact_examples::logs;
use reactifact_examples::walkthrough::{postgres_store, sqlite_path, walk, Outcome, Store};

/// The command line: a SQLite path (the first argument that is not an option),
/// `--postgres URL` and `--json-logs`.
struct Args {
    path: Option<PathBuf>,
    postgres: Option<String>,
    json_logs: bool,
}

fn args() -> Outcome<Args> {
    let mut parsed = Args {
        path: None,
        postgres: None,
        json_logs: false,
    };
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--postgres" {
            let url = args.next().ok_or("--postgres needs a URL")?;
            parsed.postgres = Some(url.into_string().map_err(|_| "--postgres: the URL is not UTF-8")?);
        } else if arg == logs::FLAG {
            parsed.json_logs = true;
        } else if parsed.path.is_none() {
            parsed.path = Some(PathBuf::from(arg));
        } else {
            return Err(format!("unexpected argument {}", arg.to_string_lossy()).into());
        }
    }
    Ok(parsed)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("outbox: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = logs::init(args.json_logs) {
        eprintln!("outbox: {e}");
        return ExitCode::from(2);
    }
    let mut ok = walk(Store::Memory).await;
    println!();
    match sqlite_path(args.path) {
        Ok(path) => ok &= walk(Store::Sqlite(path)).await,
        Err(e) => {
            eprintln!("walkthrough on SQLite: {e}");
            ok = false;
        }
    }
    let mut places = "in memory and on SQLite";
    if let Some(url) = &args.postgres {
        println!();
        places = "in memory, on SQLite and on PostgreSQL";
        match postgres_store(url).await {
            Ok(store) => ok &= walk(store).await,
            Err(e) => {
                eprintln!("walkthrough on PostgreSQL: {e}");
                ok = false;
            }
        }
    }
    if ok {
        println!("\nEvery case held, {places}.");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
