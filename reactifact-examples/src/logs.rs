//! The example programs' `--json-logs` option: structured logs on stderr, one JSON object per
//! event, each carrying the span it happened in and the list of spans around it — so a line
//! written while a produce ran names its `agent`, `produce`, `artifact_id` and `generation`,
//! and one written during a delivery names its `action_key`, `kind` and `attempt`.
//!
//! Without the option the programs install no subscriber at all (as before): the runtime's
//! `tracing` events go nowhere, and the programs print only their own lines.
//!
//! The level comes from `RUST_LOG` (an [`EnvFilter`] directive such as
//! `warn,reactifact_core=info`); unset or empty, it is [`DEFAULT_FILTER`].

use tracing_subscriber::EnvFilter;

/// The option that turns the JSON logs on.
pub const FLAG: &str = "--json-logs";

/// The filter when `RUST_LOG` is unset or empty: `info` for everything, and `debug` for the
/// runtime, whose `produce`, `commit` and `delivery` spans are debug spans.
pub const DEFAULT_FILTER: &str = "info,reactifact_core=debug";

/// Why the logs could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    /// `RUST_LOG` is not a valid filter.
    #[error("RUST_LOG={value:?} is not a valid log filter: {reason}")]
    Filter {
        /// What `RUST_LOG` holds.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `RUST_LOG` is not valid unicode.
    #[error("environment variable RUST_LOG is not valid unicode")]
    NotUnicode,
    /// A global subscriber was already installed.
    #[error("a tracing subscriber is already installed: {0}")]
    Installed(String),
}

/// Sets up the program's logs: with `json`, a global `tracing` subscriber that prints every
/// event the filter lets through to stderr as one JSON object per line (see the module
/// docs); without it, nothing — the program keeps its plain output.
///
/// A line of the `outbox` program, written by its stand-in mail service during a delivery
/// (wrapped here):
///
/// ```text
/// {"timestamp":"2026-12-02T01:55:17.757798Z","level":"INFO","fields":{"message":"mail service
/// sent the notification","kind":"notify"},"target":"reactifact_examples::walkthrough","span":
/// {"action_key":"notify:order:1","attempt":1,"kind":"notify","name":"delivery"},"spans":[{"session":
/// "shop","turn":1,"name":"turn"},{"action_key":"notify:order:1","attempt":1,"kind":"notify","name":
/// "delivery"}]}
/// ```
pub fn init(json: bool) -> Result<(), LogsError> {
    if !json {
        return Ok(());
    }
    tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .with_span_list(true)
        .with_env_filter(filter(DEFAULT_FILTER)?)
        .with_writer(std::io::stderr)
        .try_init()
        .map_err(|e| LogsError::Installed(e.to_string()))
}

/// Sets up the logs of a long-running program (the `shop-service`): a global `tracing`
/// subscriber that prints every event the filter lets through to stderr, one line each — as
/// text, or with `json` as [`init`] prints them. The level comes from `RUST_LOG`; unset or
/// empty, it is `default_filter` (an [`EnvFilter`] directive such as `info`).
pub fn init_service(json: bool, default_filter: &str) -> Result<(), LogsError> {
    let filter = filter(default_filter)?;
    let installed = if json {
        tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init()
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init()
    };
    installed.map_err(|e| LogsError::Installed(e.to_string()))
}

/// `RUST_LOG`'s filter, or `default`.
fn filter(default: &str) -> Result<EnvFilter, LogsError> {
    let value = match std::env::var(EnvFilter::DEFAULT_ENV) {
        Ok(value) if !value.trim().is_empty() => value,
        Ok(_) | Err(std::env::VarError::NotPresent) => default.to_owned(),
        Err(std::env::VarError::NotUnicode(_)) => return Err(LogsError::NotUnicode),
    };
    EnvFilter::try_new(&value).map_err(|e| LogsError::Filter {
        value,
        reason: e.to_string(),
    })
}
