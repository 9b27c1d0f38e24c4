//! Which store a command works on — `--store PATH|URL` or `REACTIFACT_STORE`: a SQLite file,
//! or a `postgres://` URL with its schema from the URL's `?schema=` or `--schema` — and the
//! read-only opens every inspecting command uses.
//!
//! The resolving and opening are `reactifact_admin::store`'s, which the console shares; this
//! module awaits them on the command's runtime and turns their errors into the CLI's failures.
//! A PostgreSQL store is never created or migrated by the CLI, and every command but `outbox
//! retry`, `cancel`, `approve`, `reject` and `purge`, `question answer` and `parked rearm`
//! connects with `default_transaction_read_only=on`, so the server itself refuses any write.

use std::sync::Arc;

pub use reactifact_admin::store::Location;
use reactifact_admin::store::{self as admin, StoreOpenError};
use reactifact_core::store::{OutboxStore, SessionInfo};
use reactifact_core::Context;

use crate::failure::{Failure, Outcome};

impl Failure {
    /// Resolving or opening the store failed; a corrupt log is a failed check when `checking`.
    pub fn opening(e: StoreOpenError, checking: bool) -> Self {
        match e {
            StoreOpenError::Input(message) => Failure::input(message),
            StoreOpenError::Open { shown, source } => Failure::open(&shown, *source, checking),
            StoreOpenError::Postgres(source) => {
                let mut failure = Failure::postgres(*source);
                failure.message = admin::unshown(&failure.message);
                failure
            }
            StoreOpenError::Store(e) => Failure::store(e),
            e => Failure::input(e.to_string()),
        }
    }
}

/// Resolves `--store` (or `REACTIFACT_STORE`) and `--schema` (see
/// [`reactifact_admin::store::resolve`]).
pub fn resolve(store: Option<&str>, schema: Option<&str>) -> Outcome<Location> {
    admin::resolve(store, schema).map_err(|e| Failure::opening(e, false))
}

/// The store a command works on, and the runtime its queries are awaited on.
pub struct Store {
    store: admin::Store,
    runtime: tokio::runtime::Runtime,
}

impl Store {
    /// Opens the store at `location`: a SQLite file is opened by each query (read-only unless
    /// `writes`); a PostgreSQL store is probed (it must exist, at this build's version) and
    /// opened, its connections read-only unless `writes`.
    pub fn open(location: Location, writes: bool) -> Outcome<Store> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Failure::input(format!("the async runtime could not be started: {e}")))?;
        let store = runtime
            .block_on(admin::Store::open(location, writes))
            .map_err(|e| Failure::opening(e, false))?;
        Ok(Store { store, runtime })
    }

    /// Awaits a store query.
    pub fn wait<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// The store as messages name it: the file's path, or the server, database and schema
    /// (never a password).
    pub fn shown(&self) -> String {
        self.store.shown()
    }

    /// The sessions of the store, by name, as both kinds of store list them.
    pub fn sessions(&self) -> Outcome<Vec<SessionInfo>> {
        self.sessions_checking(false)
    }

    /// The sessions of the store, for a command that checks it (`verify`): a corrupt file
    /// is a failed check.
    pub fn sessions_checking(&self, checking: bool) -> Outcome<Vec<SessionInfo>> {
        self.wait(self.store.sessions())
            .map_err(|e| Failure::opening(e, checking))
    }

    /// The session a command works on: the one named (which must exist), or the store's only
    /// session when none is named.
    pub fn session(&self, named: Option<&str>) -> Outcome<String> {
        let sessions = self.sessions()?;
        let names: Vec<&str> = sessions.iter().map(|s| s.name.as_str()).collect();
        let shown = self.shown();
        match named {
            Some(name) if names.contains(&name) => Ok(name.to_owned()),
            Some(name) => Err(Failure::input(format!(
                "{shown} has no session `{name}`; its sessions: {}",
                list_or_none(&names)
            ))),
            None => match names.as_slice() {
                [only] => Ok((*only).to_owned()),
                [] => Err(Failure::input(format!("{shown} holds no session"))),
                _ => Err(Failure::input(format!(
                    "{shown} holds {} sessions ({}); name one with --session",
                    names.len(),
                    names.join(", ")
                ))),
            },
        }
    }

    /// Checks that `named` is a session of the store (for filters such as `outbox list
    /// --session`).
    pub fn check_session(&self, named: &str) -> Outcome<()> {
        self.session(Some(named)).map(drop)
    }

    /// Opens `session` read-only: its log is loaded and refolded (parent links and state hashes
    /// checked); nothing is written.
    pub fn open_session(&self, session: &str, checking: bool) -> Outcome<Context> {
        self.wait(self.store.open_session(session, false))
            .map_err(|e| Failure::opening(e, checking))
    }

    /// A session of the store opened for writing (the store was opened for writes): for the
    /// commands that write to a session, `question answer` and `parked rearm`.
    pub fn open_session_for_write(&self, session: &str) -> Outcome<Context> {
        self.wait(self.store.open_session(session, true))
            .map_err(|e| Failure::opening(e, false))
    }

    /// The store's outbox: read-only unless the store was opened for writes (retry, cancel,
    /// purge), whose operations are the store's own, fenced.
    pub fn outbox(&self) -> Outcome<Arc<dyn OutboxStore>> {
        self.wait(self.store.outbox()).map_err(|e| Failure::opening(e, false))
    }
}

fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}
