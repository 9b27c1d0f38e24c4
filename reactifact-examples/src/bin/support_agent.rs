//! The support agent: a model triages support tickets and drafts the replies, and each reply
//! is emailed once, whatever happens.
//!
//! ```sh
//! cargo run -p reactifact-examples --bin support-agent              # the stand-in model
//! OPENAI_API_KEY=… cargo run -p reactifact-examples --features openai-tls --bin support-agent -- --openai
//! cargo run -p reactifact-examples --bin support-agent -- --json-logs   # and the runtime's logs, as JSON on stderr
//! ```
//!
//! Runs the five cases of `reactifact_examples::support::cases` (first run, retry,
//! crash-resume, replay, token budget) on SQLite files in a temporary directory, removed at
//! the end, and prints each claim with `PASS` or `FAIL`; exits non-zero if one fails.
//!
//! `--openai` (built with the `openai` feature) asks an OpenAI-compatible server instead of
//! the stand-in: `OPENAI_BASE_URL` (default `https://api.openai.com/v1`, which needs the
//! `openai-tls` feature), `OPENAI_API_KEY`, and `OPENAI_MODEL` (default `gpt-4o-mini`).
//!
//! `--json-logs` (with or without `--openai`) prints the runtime's `tracing` events to stderr,
//! one JSON object per line with the spans they happened in; `RUST_LOG` sets the level
//! (default `info,reactifact_core=debug`). See `reactifact_examples::logs`.

use std::process::ExitCode;

use reactifact_examples::logs;
use reactifact_examples::support::cases::{Cases, ModelChoice};

/// The model `--openai` asks unless `OPENAI_MODEL` names another.
#[cfg(feature = "openai")]
const DEFAULT_OPENAI_MODEL: &str = "gpt-4o-mini";

/// The command line: `--openai` and `--json-logs`, each optional.
struct Args {
    openai: bool,
    json_logs: bool,
}

fn args() -> Result<Args, String> {
    let mut parsed = Args {
        openai: false,
        json_logs: false,
    };
    for arg in std::env::args_os().skip(1) {
        if arg == "--openai" {
            parsed.openai = true;
        } else if arg == logs::FLAG {
            parsed.json_logs = true;
        } else {
            return Err(format!(
                "unexpected argument {}; the options are --openai and {}",
                arg.to_string_lossy(),
                logs::FLAG
            ));
        }
    }
    Ok(parsed)
}

#[cfg(feature = "openai")]
fn openai_model() -> Result<ModelChoice, String> {
    use reactifact_examples::support::ChatClient;
    use std::sync::Arc;

    let client = ChatClient::from_env().map_err(|e| e.to_string())?;
    let name = match std::env::var("OPENAI_MODEL") {
        Ok(name) if !name.is_empty() => name,
        Ok(_) | Err(std::env::VarError::NotPresent) => DEFAULT_OPENAI_MODEL.to_owned(),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err("environment variable OPENAI_MODEL is not valid unicode".into())
        }
    };
    Ok(ModelChoice::Other {
        describe: client.endpoint().to_owned(),
        client: Arc::new(client),
        name,
    })
}

#[cfg(not(feature = "openai"))]
fn openai_model() -> Result<ModelChoice, String> {
    Err("--openai needs the `openai` feature: \
         cargo run -p reactifact-examples --features openai-tls --bin support-agent -- --openai"
        .into())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let model = match args().and_then(|args| {
        logs::init(args.json_logs).map_err(|e| e.to_string())?;
        if args.openai {
            openai_model()
        } else {
            Ok(ModelChoice::StandIn)
        }
    }) {
        Ok(model) => model,
        Err(e) => {
            eprintln!("support-agent: {e}");
            return ExitCode::from(2);
        }
    };
    let dir = match tempfile::Builder::new().prefix("reactifact-support-").tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("support-agent: cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ok = Cases::new(dir.path(), model).run_all().await;
    if ok {
        println!("\nEvery claim held.");
        ExitCode::SUCCESS
    } else {
        eprintln!("\nsupport-agent: a claim failed (marked FAIL above)");
        ExitCode::FAILURE
    }
}
