//! `console`: serves `reactifact_admin`'s JSON API for the store until the process is
//! stopped. The store is opened for writes (operators approve, reject, retry and cancel
//! through it), and only through the store's own operations: safe while runtimes and drainers
//! run.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use reactifact_admin::{router, Config, Token};

use crate::failure::{Failure, Outcome};
use crate::store::Location;

/// Serves the console on `listen` with the tokens of `token_file`.
pub fn console(location: Location, listen: SocketAddr, token_file: &Path, show_payloads: bool) -> Outcome {
    let text = std::fs::read_to_string(token_file)
        .map_err(|e| Failure::input(format!("token file {}: {e}", token_file.display())))?;
    let tokens = Token::parse_file(&text).map_err(|e| Failure::input(format!("{}: {e}", token_file.display())))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::input(format!("the async runtime could not be started: {e}")))?;
    runtime.block_on(async {
        let store = reactifact_admin::store::Store::open(location, true)
            .await
            .map_err(|e| Failure::opening(e, false))?;
        let shown = store.shown();
        let app = router(Config::new(Arc::new(store)).tokens(tokens).show_payloads(show_payloads));
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| Failure::input(format!("cannot listen on {listen}: {e}")))?;
        let address = listener
            .local_addr()
            .map_err(|e| Failure::input(format!("cannot listen on {listen}: {e}")))?;
        outln!("reactifact console for {shown} listening on http://{address}");
        axum::serve(listener, app)
            .await
            .map_err(|e| Failure::input(format!("the console stopped: {e}")))
    })
}
