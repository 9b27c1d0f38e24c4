//! `reactifact`: the operator tool of a reactifact store.
//!
//! It inspects a store — its sessions, commit log, state at any commit, diffs, provenance and
//! delivery ledger — verifies and refolds its logs, exports the audit trail, and runs the
//! operator's ledger operations (retry, cancel, purge) through the store's own
//! [`OutboxStore`](reactifact_core::store::OutboxStore) methods, so that fencing applies and they are
//! safe while drainers run. It answers questions and re-arms parked events, each one committed
//! write to a session. It never dispatches anything, and opens the store read-only for every
//! other command. See `docs/cli.md` for every command, its output, its `--json` schema
//! and the exit codes.

#[macro_use]
mod output;
mod cli;
mod commands;
mod failure;
mod progress;
mod store;

use std::process::ExitCode;

use clap::Parser;

use crate::failure::Failure;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with 0; a usage error to stderr with 2.
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("reactifact: {}", failure.message);
            ExitCode::from(failure.code())
        }
    }
}

impl Failure {
    fn code(&self) -> u8 {
        match self.kind {
            failure::Kind::CheckFailed => 1,
            failure::Kind::Input => 2,
        }
    }
}
