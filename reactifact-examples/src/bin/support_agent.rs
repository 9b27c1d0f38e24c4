//! The support agent: a model triages support tickets and drafts the replies, and each reply
//! is emailed once, whatever happens.
//!
//! ```sh
//! cargo run -p reactifact-examples --bin support-agent              # the stand-in model
//! OPENAI_API_KEY=… cargo run -p reactifact-examples --features openai-tls --bin support-agent -- --openai
//! cargo run -p reactifact-examples --bin support-agent -- --json-logs   # and the runtime's logs, as JSON on stderr
//! ```
//!
//! Runs the six cases of `reactifact_examples::support::cases` (first run, retry, re-asked,
//! approval and why, replay, token budget) on SQLite files in a temporary directory, removed
//! at the end, each against a stand-in model server and an MCP server it starts on
//! 127.0.0.1, and prints each claim with `PASS` or `FAIL`; exits non-zero if one fails.
//!
//! `--openai` asks an OpenAI-compatible server instead of the stand-in (the cases that do not
//! need the stand-in's script: first run and replay): `OPENAI_BASE_URL` (default
//! `https://api.openai.com/v1`, which needs the `openai-tls` feature), `OPENAI_API_KEY`, and
//! `OPENAI_MODEL` (default `gpt-4o-mini`).
//!
//! `--agent` runs the agent as a process of its own over a SQLite file until every ticket is
//! triaged and every intent delivered (`reactifact_examples::support::process`; the SIGKILL
//! test kills it and restarts it): `--agent --db FILE --model-url URL --mcp-url URL
//! --tickets N`.
//!
//! `--json-logs` (with or without `--openai`) prints the runtime's `tracing` events to stderr,
//! one JSON object per line with the spans they happened in; `RUST_LOG` sets the level
//! (default `info,reactifact_core=debug`). See `reactifact_examples::logs`.

use std::process::ExitCode;

use reactifact_examples::logs;
use reactifact_examples::support::cases::{Cases, ModelChoice, STAND_IN_NAME};
use reactifact_examples::support::process::{run_agent, AgentOptions};

/// The model `--openai` asks unless `OPENAI_MODEL` names another.
const DEFAULT_OPENAI_MODEL: &str = "gpt-4o-mini";

/// The command line: `--openai` and `--json-logs`, each optional (or `--agent` and its options).
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
                "unexpected argument {}; the options are --openai, {} and --agent",
                arg.to_string_lossy(),
                logs::FLAG
            ));
        }
    }
    Ok(parsed)
}

fn openai_model() -> Result<ModelChoice, String> {
    use reactifact_model::ChatClient;

    let client = ChatClient::from_env().map_err(|e| e.to_string())?;
    let name = match std::env::var("OPENAI_MODEL") {
        Ok(name) if !name.is_empty() => name,
        Ok(_) | Err(std::env::VarError::NotPresent) => DEFAULT_OPENAI_MODEL.to_owned(),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err("environment variable OPENAI_MODEL is not valid unicode".into())
        }
    };
    Ok(ModelChoice::Other {
        client: Box::new(client),
        name,
    })
}

/// `--agent --db FILE --model-url URL --mcp-url URL --tickets N`: the options, after `--agent`.
fn agent_options(args: &[String]) -> Result<AgentOptions, String> {
    let mut options = AgentOptions {
        db: Default::default(),
        model_url: String::new(),
        model: STAND_IN_NAME.to_owned(),
        mcp_url: String::new(),
        tickets: 0,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let value = args.next().ok_or_else(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--db" => options.db = value.into(),
            "--model-url" => options.model_url = value.clone(),
            "--model" => options.model = value.clone(),
            "--mcp-url" => options.mcp_url = value.clone(),
            "--tickets" => options.tickets = value.parse().map_err(|e| format!("--tickets {value}: {e}"))?,
            other => return Err(format!("unexpected argument {other} after --agent")),
        }
    }
    if options.db.as_os_str().is_empty() || options.model_url.is_empty() || options.mcp_url.is_empty() {
        return Err("--agent needs --db, --model-url and --mcp-url".into());
    }
    Ok(options)
}

async fn agent(args: &[String]) -> ExitCode {
    let options = match agent_options(args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("support-agent: {e}");
            return ExitCode::from(2);
        }
    };
    match run_agent(&options).await {
        Ok(triaged) => {
            println!("support-agent: {triaged} tickets triaged, every intent delivered");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("support-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let all: Vec<String> = std::env::args().skip(1).collect();
    if all.first().map(String::as_str) == Some("--agent") {
        return agent(&all[1..]).await;
    }
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
