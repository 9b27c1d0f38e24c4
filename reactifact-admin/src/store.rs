//! Which store the console (and the CLI) works on — a SQLite file, or a `postgres://` URL
//! with its schema from the URL's `?schema=` or a separate name — and how it is opened: only
//! through the store's own operations, so that both are safe while runtimes and drainers run.
//!
//! A PostgreSQL store is never created or migrated here: the schema is probed first (a
//! missing store or an older version is an error), and a store opened without writes connects
//! with `default_transaction_read_only=on`, so the server itself refuses any write.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use reactifact_core::error::{OpenError, StoreError, StoreUrlError};
use reactifact_core::store::{list_sessions, LogStore, OutboxStore, SessionInfo, SqliteOutbox, StoreUrl};
use reactifact_core::{Context, OpenOptions};
use reactifact_postgres::{PostgresOptions, PostgresStore, DEFAULT_SCHEMA};

/// Why a store could not be resolved, opened or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreOpenError {
    /// The store named is not one this crate opens (a bad URL, `memory:`, a schema given for a
    /// SQLite file, a PostgreSQL schema without a store or with an older one).
    #[error("{0}")]
    Input(String),
    /// The store (a SQLite file, or a session of either kind) could not be opened.
    #[error("{source}")]
    Open {
        /// The store as messages name it (see [`Store::shown`]).
        shown: String,
        /// What failed.
        #[source]
        source: Box<OpenError>,
    },
    /// Connecting to a PostgreSQL store, or opening it, failed.
    #[error("{}", unshown(&.0.to_string()))]
    Postgres(#[source] Box<OpenError>),
    /// The store failed while in use.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where the store is.
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

/// Resolves a store URL (and a separately given PostgreSQL schema), with the library's parser
/// ([`StoreUrl`]).
///
/// A plain path, `sqlite:PATH` or `sqlite://PATH` names a SQLite file. A `postgres://` or
/// `postgresql://` URL names a PostgreSQL server; its schema is the URL's `schema` query
/// parameter or `schema` (they must agree when both are given), else [`DEFAULT_SCHEMA`]. Any
/// other URL is refused as unsupported, and so is `memory:` (a store no other process can
/// see).
///
/// # Errors
/// [`StoreOpenError::Input`], naming what is wrong (the messages speak of `--store` and
/// `--schema`, the options that name them on the command line).
pub fn resolve(store: Option<&str>, schema: Option<&str>) -> Result<Location, StoreOpenError> {
    let input = |m: String| StoreOpenError::Input(m);
    let Some(store) = store.filter(|s| !s.is_empty()) else {
        return Err(input(
            "no store given: pass --store PATH (a SQLite file) or --store postgres://USER@HOST/DATABASE, or set REACTIFACT_STORE".to_owned(),
        ));
    };
    let parsed = StoreUrl::parse(store).map_err(|e| match e {
        StoreUrlError::UnsupportedScheme { url, scheme, .. } => input(format!(
            "unsupported store URL `{url}` (scheme `{scheme}`): pass the path of a SQLite store file (or sqlite:PATH), \
             or a postgres:// URL"
        )),
        e => input(e.to_string()),
    })?;
    match parsed {
        StoreUrl::Postgres { url, schema: in_url } => {
            let schema = match (in_url, schema) {
                (Some(a), Some(b)) if a != b => {
                    return Err(input(format!(
                        "the store URL names schema `{a}` and --schema names `{b}`: give one of them"
                    )))
                }
                (Some(a), _) => a,
                (None, Some(b)) => b.to_owned(),
                (None, None) => DEFAULT_SCHEMA.to_owned(),
            };
            Ok(Location::Postgres { url, schema })
        }
        StoreUrl::Sqlite(_) if schema.is_some() => Err(input(
            "--schema names the schema of a PostgreSQL store; this store is a SQLite file".to_owned(),
        )),
        StoreUrl::Sqlite(path) => Ok(Location::Sqlite(path)),
        StoreUrl::Memory => Err(input(
            "`memory:` names an in-memory store, which only the process that made it can see: pass --store PATH \
             (a SQLite file) or --store postgres://USER@HOST/DATABASE"
                .to_owned(),
        )),
        other => Err(input(format!("the CLI cannot open the store `{other}`"))),
    }
}

/// The setting [`read_only_url`] adds, as it appears in the URL.
const SETTING: &str = "-c%20default_transaction_read_only%3Don";

/// `message` without what [`read_only_url`] added to the URL it may quote.
pub fn unshown(message: &str) -> String {
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
    Sqlite {
        path: PathBuf,
        writes: bool,
        /// The file's outbox, opened by the first query that needs it and kept: a console
        /// serves many requests, and an open checks the file and starts the outbox's thread.
        outbox: OnceLock<Arc<dyn OutboxStore>>,
    },
    Postgres {
        store: Arc<PostgresStore>,
        shown: String,
    },
}

/// Runs blocking work — a SQLite file's open, a read of its sessions — on tokio's blocking
/// pool, not on the executor thread that awaits it.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => panic!("the runtime shut down while a SQLite file was being read"),
    }
}

/// An opened store: its sessions, their logs (each opened read-only or for a write) and its
/// outbox, all through the store's own operations.
pub struct Store {
    backend: Backend,
}

impl Store {
    /// Opens the store at `location`: a SQLite file's sessions are opened by each query that
    /// reads them and its outbox once, by the first query that needs it (read-only unless
    /// `writes`; the file is read on tokio's blocking pool, never on an executor thread); a PostgreSQL store is probed (it must exist, at this build's version) and
    /// opened, its connections read-only unless `writes`.
    ///
    /// # Errors
    /// [`StoreOpenError::Input`] for a PostgreSQL schema without a store or with an older
    /// one; [`StoreOpenError::Postgres`] if the server cannot be reached or opened.
    pub async fn open(location: Location, writes: bool) -> Result<Store, StoreOpenError> {
        let backend = match location {
            Location::Sqlite(path) => Backend::Sqlite {
                path,
                writes,
                outbox: OnceLock::new(),
            },
            Location::Postgres { url, schema } => {
                let options = |url| {
                    PostgresOptions::new(url)
                        .schema(schema.clone())
                        .pool_size(2)
                        .log_connections(1)
                        // Refused under the migration lock, even if the schema changes
                        // after the probe: a store is never created or migrated here.
                        .allow_migration(false)
                };
                let opened = if writes { url.clone() } else { read_only_url(&url) };
                let (store, shown) = open_postgres(options(url), options(opened)).await?;
                Backend::Postgres { store, shown }
            }
        };
        Ok(Store { backend })
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
    ///
    /// # Errors
    /// [`StoreOpenError::Open`] for a SQLite file that cannot be read,
    /// [`StoreOpenError::Store`] for a PostgreSQL store that fails.
    pub async fn sessions(&self) -> Result<Vec<SessionInfo>, StoreOpenError> {
        match &self.backend {
            Backend::Sqlite { path, .. } => {
                let path = path.clone();
                blocking(move || list_sessions(&path).map_err(Box::new))
                    .await
                    .map_err(|source| StoreOpenError::Open {
                        shown: self.shown(),
                        source,
                    })
            }
            Backend::Postgres { store, .. } => Ok(store.sessions().await?),
        }
    }

    /// Opens `session`: read-only (its log loaded and refolded, parent links and state hashes
    /// checked; nothing written), or for a write if the store was opened for writes and
    /// `for_write`.
    ///
    /// # Errors
    /// [`StoreOpenError::Open`], with the store's [`OpenError`] (no such session, a corrupt
    /// log, …).
    pub async fn open_session(&self, session: &str, for_write: bool) -> Result<Context, StoreOpenError> {
        let options = if for_write {
            OpenOptions::new().create(false)
        } else {
            OpenOptions::new().read_only(true).create(false)
        };
        let opened = match &self.backend {
            Backend::Sqlite { path, .. } => {
                let (path, session) = (path.clone(), session.to_owned());
                blocking(move || Context::open_with(&path, &session, options).map_err(Box::new)).await
            }
            Backend::Postgres { store, .. } => {
                let store: Arc<dyn LogStore> = store.clone();
                Context::open_store_with(store, session, options)
                    .await
                    .map_err(Box::new)
            }
        };
        opened.map_err(|source| StoreOpenError::Open {
            shown: self.shown(),
            source,
        })
    }

    /// The store's outbox: read-only unless the store was opened for writes, whose operations
    /// (retry, cancel, approve, reject, purge) are the store's own, fenced.
    ///
    /// # Errors
    /// [`StoreOpenError::Open`] for a SQLite file that cannot be opened.
    pub async fn outbox(&self) -> Result<Arc<dyn OutboxStore>, StoreOpenError> {
        let (path, writes, kept) = match &self.backend {
            Backend::Postgres { store, .. } => return Ok(store.outbox().clone()),
            Backend::Sqlite { path, writes, outbox } => (path.clone(), *writes, outbox),
        };
        if let Some(outbox) = kept.get() {
            return Ok(outbox.clone());
        }
        let opened = blocking(move || {
            match writes {
                false => SqliteOutbox::open_read_only(&path).map(|o| o as Arc<dyn OutboxStore>),
                true => SqliteOutbox::open(&path).map(|o| o as Arc<dyn OutboxStore>),
            }
            .map_err(Box::new)
        })
        .await
        .map_err(|source| StoreOpenError::Open {
            shown: self.shown(),
            source,
        })?;
        // Two first queries racing: the first kept wins, the other's is dropped.
        Ok(kept.get_or_init(|| opened).clone())
    }
}

/// Probes the schema (with the URL as given), then opens the store in it (with `opened`,
/// which may ask for read-only connections): a schema without a store, or with one of an
/// older version, is an error (a store is never created or migrated here).
async fn open_postgres(
    given: PostgresOptions,
    opened: PostgresOptions,
) -> Result<(Arc<PostgresStore>, String), StoreOpenError> {
    let probe = PostgresStore::probe(&given)
        .await
        .map_err(|e| StoreOpenError::Postgres(Box::new(e)))?;
    let shown = probe.store.clone();
    match probe.version {
        None => {
            return Err(StoreOpenError::Input(format!(
                "no reactifact store in schema `{}` of database `{}` ({shown}); check --store and the schema \
                 (?schema=NAME or --schema; default `{DEFAULT_SCHEMA}`): the CLI never creates a store",
                probe.schema, probe.database
            )))
        }
        Some(found) if found < probe.supported => {
            return Err(StoreOpenError::Input(format!(
                "{shown} has schema version {found}, older than the {} this reactifact uses; open it once with the \
                 application (`PostgresStore::open`) to upgrade it: the CLI never migrates a store",
                probe.supported
            )))
        }
        Some(_) => {}
    }
    let store = PostgresStore::open(opened)
        .await
        .map_err(|e| StoreOpenError::Postgres(Box::new(e)))?;
    Ok((store, shown))
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
        let resolved = |store, flag| resolve(Some(store), flag).map_err(|e| e.to_string());
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
