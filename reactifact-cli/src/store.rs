//! Which store a command works on — `--store PATH|URL` or `REACTIFACT_STORE`: a SQLite file,
//! or a `postgres://` URL with its schema from the URL's `?schema=` or `--schema` — and the
//! read-only opens every inspecting command uses.
//!
//! A PostgreSQL store is never created or migrated by the CLI: the schema is probed first
//! (a missing store or an older version is an error), and every command but `outbox retry`,
//! `cancel`, `approve`, `reject` and `purge`, `question answer` and `parked rearm` connects
//! with `default_transaction_read_only=on`, so the server itself refuses any write.

use std::path::PathBuf;
use std::sync::Arc;

use reactifact_core::error::StoreUrlError;
use reactifact_core::store::{list_sessions, LogStore, OutboxStore, SessionInfo, SqliteOutbox, StoreUrl};
use reactifact_core::{Context, OpenOptions};
use reactifact_postgres::{PostgresOptions, PostgresStore, DEFAULT_SCHEMA};

use crate::failure::{Failure, Outcome};

/// Where the store is, as the command line names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL server: the URL without its `schema` parameter, and the schema.
    Postgres {
        /// The URL for the driver (it may hold a password: never print it unredacted).
        url: String,
        /// The schema the store lives in.
        schema: String,
    },
}

/// Resolves `--store` (or `REACTIFACT_STORE`) and `--schema`, with the library's parser
/// ([`StoreUrl`]).
///
/// A plain path, `sqlite:PATH` or `sqlite://PATH` names a SQLite file. A `postgres://` or
/// `postgresql://` URL names a PostgreSQL server; its schema is the URL's `schema` query
/// parameter or `--schema` (they must agree when both are given), else
/// [`DEFAULT_SCHEMA`]. Any other URL is refused as unsupported, and so is `memory:` (a store
/// no other process can see).
pub fn resolve(store: Option<&str>, schema: Option<&str>) -> Outcome<Location> {
    let Some(store) = store.filter(|s| !s.is_empty()) else {
        return Err(Failure::input(
            "no store given: pass --store PATH (a SQLite file) or --store postgres://USER@HOST/DATABASE, or set REACTIFACT_STORE",
        ));
    };
    let parsed = StoreUrl::parse(store).map_err(|e| match e {
        StoreUrlError::UnsupportedScheme { url, scheme, .. } => Failure::input(format!(
            "unsupported store URL `{url}` (scheme `{scheme}`): pass the path of a SQLite store file (or sqlite:PATH), \
             or a postgres:// URL"
        )),
        e => Failure::input(e.to_string()),
    })?;
    match parsed {
        StoreUrl::Postgres { url, schema: in_url } => {
            let schema = match (in_url, schema) {
                (Some(a), Some(b)) if a != b => {
                    return Err(Failure::input(format!(
                        "the store URL names schema `{a}` and --schema names `{b}`: give one of them"
                    )))
                }
                (Some(a), _) => a,
                (None, Some(b)) => b.to_owned(),
                (None, None) => DEFAULT_SCHEMA.to_owned(),
            };
            Ok(Location::Postgres { url, schema })
        }
        StoreUrl::Sqlite(_) if schema.is_some() => Err(Failure::input(
            "--schema names the schema of a PostgreSQL store; this store is a SQLite file",
        )),
        StoreUrl::Sqlite(path) => Ok(Location::Sqlite(path)),
        StoreUrl::Memory => Err(Failure::input(
            "`memory:` names an in-memory store, which only the process that made it can see: pass --store PATH \
             (a SQLite file) or --store postgres://USER@HOST/DATABASE",
        )),
        other => Err(Failure::input(format!("the CLI cannot open the store `{other}`"))),
    }
}

/// The setting [`read_only_url`] adds, as it appears in the URL.
const SETTING: &str = "-c%20default_transaction_read_only%3Don";

/// `message` without what [`read_only_url`] added to the URL it may quote.
fn unshown(message: &str) -> String {
    message
        .replace(&format!("?options={SETTING}"), "")
        .replace(&format!("&options={SETTING}"), "")
        .replace(&format!("%20{SETTING}"), "")
}

/// `url` with the server told to make every transaction of its connections read-only: the
/// `options` parameter gains `-c default_transaction_read_only=on`.
fn read_only_url(url: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut found = false;
    let mut pairs: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some(("options", value)) if !found => {
                found = true;
                format!("options={value}%20{SETTING}")
            }
            _ => pair.to_owned(),
        })
        .collect();
    if !found {
        pairs.push(format!("options={SETTING}"));
    }
    format!("{base}?{}", pairs.join("&"))
}

enum Backend {
    Sqlite { path: PathBuf, writes: bool },
    Postgres { store: Arc<PostgresStore>, shown: String },
}

/// The store a command works on, and the runtime its queries are awaited on.
pub struct Store {
    backend: Backend,
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
        let backend = match location {
            Location::Sqlite(path) => Backend::Sqlite { path, writes },
            Location::Postgres { url, schema } => {
                let options = |url| {
                    PostgresOptions::new(url)
                        .schema(schema.clone())
                        .pool_size(2)
                        .log_connections(1)
                        // Refused under the migration lock, even if the schema changes
                        // after the probe: the CLI never creates or migrates a store.
                        .allow_migration(false)
                };
                let opened = if writes { url.clone() } else { read_only_url(&url) };
                let (store, shown) = runtime.block_on(open_postgres(options(url), options(opened)))?;
                Backend::Postgres { store, shown }
            }
        };
        Ok(Store { backend, runtime })
    }

    /// Awaits a store query.
    pub fn wait<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// The store as messages name it: the file's path, or the server, database and schema
    /// (never a password).
    pub fn shown(&self) -> String {
        match &self.backend {
            Backend::Sqlite { path, .. } => path.display().to_string(),
            Backend::Postgres { shown, .. } => shown.clone(),
        }
    }

    /// The sessions of the store, by name, as both kinds of store list them.
    pub fn sessions(&self) -> Outcome<Vec<SessionInfo>> {
        self.sessions_checking(false)
    }

    /// The sessions of the store, for a command that checks it (`verify`): a corrupt file
    /// is a failed check.
    pub fn sessions_checking(&self, checking: bool) -> Outcome<Vec<SessionInfo>> {
        match &self.backend {
            Backend::Sqlite { path, .. } => list_sessions(path).map_err(|e| Failure::open(&self.shown(), e, checking)),
            Backend::Postgres { store, .. } => self.wait(store.sessions()).map_err(Failure::store),
        }
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
        let options = OpenOptions::new().read_only(true).create(false);
        match &self.backend {
            Backend::Sqlite { path, .. } => {
                Context::open_with(path, session, options).map_err(|e| Failure::open(&self.shown(), e, checking))
            }
            Backend::Postgres { store, .. } => {
                let store: Arc<dyn LogStore> = store.clone();
                self.wait(Context::open_store_with(store, session, options))
                    .map_err(|e| Failure::open(&self.shown(), e, checking))
            }
        }
    }

    /// A session of the store opened for writing (the store was opened for writes): for the
    /// commands that write to a session, `question answer` and `parked rearm`.
    pub fn open_session_for_write(&self, session: &str) -> Outcome<Context> {
        let options = OpenOptions::new().create(false);
        match &self.backend {
            Backend::Sqlite { path, .. } => {
                Context::open_with(path, session, options).map_err(|e| Failure::open(&self.shown(), e, false))
            }
            Backend::Postgres { store, .. } => {
                let store: Arc<dyn LogStore> = store.clone();
                self.wait(Context::open_store_with(store, session, options))
                    .map_err(|e| Failure::open(&self.shown(), e, false))
            }
        }
    }

    /// The store's outbox: read-only unless the store was opened for writes (retry, cancel,
    /// purge), whose operations are the store's own, fenced.
    pub fn outbox(&self) -> Outcome<Arc<dyn OutboxStore>> {
        match &self.backend {
            Backend::Sqlite { path, writes: false } => SqliteOutbox::open_read_only(path)
                .map(|o| o as Arc<dyn OutboxStore>)
                .map_err(|e| Failure::open(&self.shown(), e, false)),
            Backend::Sqlite { path, writes: true } => SqliteOutbox::open(path)
                .map(|o| o as Arc<dyn OutboxStore>)
                .map_err(|e| Failure::open(&self.shown(), e, false)),
            Backend::Postgres { store, .. } => Ok(store.outbox().clone()),
        }
    }
}

/// Probes the schema (with the URL as given), then opens the store in it (with `opened`,
/// which may ask for read-only connections): a schema without a store, or with one of an
/// older version, is an error (the CLI neither creates nor migrates a store).
async fn open_postgres(given: PostgresOptions, opened: PostgresOptions) -> Outcome<(Arc<PostgresStore>, String)> {
    let probe = PostgresStore::probe(&given).await.map_err(Failure::postgres)?;
    let shown = probe.store.clone();
    match probe.version {
        None => {
            return Err(Failure::input(format!(
                "no reactifact store in schema `{}` of database `{}` ({shown}); check --store and the schema \
                 (?schema=NAME or --schema; default `{DEFAULT_SCHEMA}`): the CLI never creates a store",
                probe.schema, probe.database
            )))
        }
        Some(found) if found < probe.supported => {
            return Err(Failure::input(format!(
                "{shown} has schema version {found}, older than the {} this reactifact uses; open it once with the \
                 application (`PostgresStore::open`) to upgrade it: the CLI never migrates a store",
                probe.supported
            )))
        }
        Some(_) => {}
    }
    let store = PostgresStore::open(opened).await.map_err(|e| {
        let mut failure = Failure::postgres(e);
        failure.message = unshown(&failure.message);
        failure
    })?;
    Ok((store, shown))
}

fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(url: &str, schema: &str) -> Location {
        Location::Postgres {
            url: url.to_owned(),
            schema: schema.to_owned(),
        }
    }

    #[test]
    fn the_schema_comes_from_the_url_or_the_flag() {
        let resolved = |store, flag| resolve(Some(store), flag).map_err(|e| e.message);
        assert_eq!(
            resolved("postgres://u@h/db", None),
            Ok(pg("postgres://u@h/db", DEFAULT_SCHEMA))
        );
        assert_eq!(
            resolved("postgres://u@h/db?schema=orders", None),
            Ok(pg("postgres://u@h/db", "orders"))
        );
        assert_eq!(
            resolved(
                "postgresql://u@h/db?sslmode=disable&schema=orders&connect_timeout=3",
                None
            ),
            Ok(pg("postgresql://u@h/db?sslmode=disable&connect_timeout=3", "orders"))
        );
        assert_eq!(
            resolved("postgres://u@h/db", Some("orders")),
            Ok(pg("postgres://u@h/db", "orders"))
        );
        assert_eq!(
            resolved("postgres://u@h/db?schema=orders", Some("orders")),
            Ok(pg("postgres://u@h/db", "orders"))
        );
        assert!(resolved("postgres://u@h/db?schema=a", Some("b"))
            .unwrap_err()
            .contains("names schema `a` and --schema names `b`"));
        assert!(resolved("postgres://u:pw@h/db?schema=a&schema=b", None)
            .unwrap_err()
            .contains("postgres://u:***@h/db"));
        assert!(resolved("store.db", Some("a")).unwrap_err().contains("SQLite file"));
        assert_eq!(resolved("sqlite:x.db", None), Ok(Location::Sqlite("x.db".into())));
        assert_eq!(resolved("sqlite://x.db", None), Ok(Location::Sqlite("x.db".into())));
        assert_eq!(resolved("x.db", None), Ok(Location::Sqlite("x.db".into())));
        assert!(resolved("sqlite:", None).unwrap_err().contains("names no file"));
        assert!(resolved("memory:", None).unwrap_err().contains("in-memory store"));
        assert_eq!(
            resolved("mysql://u:pw@db/app", None).unwrap_err(),
            "unsupported store URL `mysql://u:***@db/app` (scheme `mysql`): pass the path of a SQLite store file \
             (or sqlite:PATH), or a postgres:// URL"
        );
    }

    #[test]
    fn read_only_connections_ask_the_server_for_read_only_transactions() {
        assert_eq!(
            read_only_url("postgres://u@h/db"),
            "postgres://u@h/db?options=-c%20default_transaction_read_only%3Don"
        );
        assert_eq!(
            read_only_url("postgres://u@h/db?sslmode=disable"),
            "postgres://u@h/db?sslmode=disable&options=-c%20default_transaction_read_only%3Don"
        );
        assert_eq!(
            read_only_url("postgres://u@h/db?options=-c%20work_mem%3D64MB"),
            "postgres://u@h/db?options=-c%20work_mem%3D64MB%20-c%20default_transaction_read_only%3Don"
        );
        for url in [
            "postgres://u@h/db",
            "postgres://u@h/db?a=b",
            "postgres://u@h/db?options=-c%20x%3D1",
        ] {
            assert_eq!(
                unshown(&format!("`{}`: bad", read_only_url(url))),
                format!("`{url}`: bad")
            );
        }
    }
}
