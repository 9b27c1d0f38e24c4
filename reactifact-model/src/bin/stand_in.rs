//! `reactifact-model-stand-in`: a stand-in chat completions server in a process of its own,
//! answering every request with its last user message ([`stand_in::echo`]).
//!
//! ```sh
//! cargo run -p reactifact-model --features stand-in --bin reactifact-model-stand-in -- --listen 127.0.0.1:0
//! ```
//!
//! It prints `stand-in model listening on http://<addr>/v1` and serves until it is killed;
//! `GET /requests` answers how many chat completions it received.

use std::net::SocketAddr;
use std::process::ExitCode;

use reactifact_model::stand_in;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut listen: SocketAddr = ([127, 0, 0, 1], 0).into();
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--listen", Some(addr)) => match addr.parse() {
                Ok(addr) => listen = addr,
                Err(error) => {
                    eprintln!("--listen {addr}: not a socket address: {error}");
                    return ExitCode::FAILURE;
                }
            },
            _ => {
                eprintln!("unexpected argument {arg}; the one option is --listen <addr> (default 127.0.0.1:0)");
                return ExitCode::FAILURE;
            }
        }
    }
    match stand_in::serve(listen, stand_in::echo).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("the stand-in model server failed: {error}");
            ExitCode::FAILURE
        }
    }
}
