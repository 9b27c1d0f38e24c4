//! Connecting: the options of a [`PostgresOutbox`](crate::PostgresOutbox), the URL, the pool,
//! and the errors of opening a store.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use reactifact_core::error::{BackendError, OpenError, StoreError};
use reactifact_core::store::redact_url;
use tokio_postgres::config::Host;
use tokio_postgres::NoTls;

/// The schema (namespace) a store lives in unless [`PostgresOptions::schema`] names another.
pub const DEFAULT_SCHEMA: &str = "reactifact";

/// How many connections a store's pool opens at most unless [`PostgresOptions::pool_size`]
/// says otherwise.
pub const DEFAULT_POOL_SIZE: usize = 8;

/// How to open a [`PostgresOutbox`](crate::PostgresOutbox): the server's URL, the schema the
/// store lives in, and the pool.
#[derive(Clone)]
pub struct PostgresOptions {
    url: String,
    schema: String,
    pool_size: usize,
    log_connections: usize,
    connect_timeout: Duration,
    migrate: bool,
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("url", &redact_url(&self.url))
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("log_connections", &self.log_connections)
            .field("connect_timeout", &self.connect_timeout)
            .field("migrate", &self.migrate)
            .finish()
    }
}

impl PostgresOptions {
    /// Options for the server at `url` (`postgres://user:password@host:port/database`, or
    /// libpq's `key=value` form), in schema [`DEFAULT_SCHEMA`].
    pub fn new(url: impl Into<String>) -> Self {
        PostgresOptions {
            url: url.into(),
            schema: DEFAULT_SCHEMA.to_owned(),
            pool_size: DEFAULT_POOL_SIZE,
            log_connections: crate::log::DEFAULT_LOG_CONNECTIONS,
            connect_timeout: Duration::from_secs(10),
            migrate: true,
        }
    }

    /// The schema (namespace) the store's tables live in, created if missing: a lowercase
    /// ASCII letter or `_`, then up to 47 lowercase letters, digits or `_`, not starting with
    /// `pg_` (PostgreSQL reserves those). Several stores share one database in schemas of
    /// their own.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// At most this many connections in the store's pool (at least 1).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How many connections a [`PostgresStore`](crate::PostgresStore) keeps for its sessions'
    /// logs, besides the pool (at least 1; default
    /// [`DEFAULT_LOG_CONNECTIONS`](crate::DEFAULT_LOG_CONNECTIONS)). One session's commits
    /// queue on one of them; different sessions of one process commit in parallel on as many.
    pub fn log_connections(mut self, connections: usize) -> Self {
        self.log_connections = connections.max(1);
        self
    }

    /// How long one connection attempt may take (default 10 s), and how long a statement
    /// may wait for a free connection of the pool when all are in use: past it, the statement
    /// fails with a retryable [`StoreError`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Whether opening may create the schema or upgrade it to this build's version (the
    /// default). With `false`, opening a schema that holds no store is refused with
    /// [`OpenError::NoStore`] and one of an older version with [`OpenError::OlderSchema`],
    /// decided under the migration lock, so that a tool that must never change a store (an
    /// operator's, such as the `reactifact` CLI) cannot create one in a race with a `DROP`.
    pub fn allow_migration(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    pub(crate) fn may_migrate(&self) -> bool {
        self.migrate
    }

    pub(crate) fn schema_name(&self) -> &str {
        &self.schema
    }

    pub(crate) fn pool_size_value(&self) -> usize {
        self.pool_size
    }

    pub(crate) fn connect_timeout_value(&self) -> Duration {
        self.connect_timeout
    }

    pub(crate) fn log_connections_value(&self) -> usize {
        self.log_connections
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }
}

/// The parsed URL and how it is named in messages.
pub(crate) struct Target {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) database: String,
    pub(crate) user: String,
}

impl Target {
    #[allow(clippy::result_large_err)] // the core's `OpenError::Corrupt` keeps its source unboxed to downcast
    pub(crate) fn parse(options: &PostgresOptions) -> Result<Target, OpenError> {
        let mut config = tokio_postgres::Config::from_str(options.url()).map_err(|e| OpenError::BadUrl {
            url: redact_url(options.url()),
            // The driver's message about a URL may quote the URL.
            detail: redact_url(&e.to_string()),
        })?;
        config.connect_timeout(options.connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name("reactifact");
        }
        let host = match config.get_hosts().first() {
            Some(Host::Tcp(host)) => host.clone(),
            #[cfg(unix)]
            Some(Host::Unix(path)) => path.display().to_string(),
            None => config
                .get_hostaddrs()
                .first()
                .map_or_else(|| "localhost".to_owned(), ToString::to_string),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let user = config.get_user().unwrap_or("").to_owned();
        let database = config.get_dbname().map_or_else(|| user.clone(), str::to_owned);
        Ok(Target {
            config,
            host,
            port,
            database,
            user,
        })
    }

    /// `postgres://user@host:port/database`, as the store names itself (no password).
    pub(crate) fn describe(&self, schema: &str) -> String {
        format!(
            "postgres://{}@{}:{}/{} schema {schema}",
            self.user, self.host, self.port, self.database
        )
    }

    pub(crate) fn connect_error(&self, source: impl Into<BackendError>) -> OpenError {
        OpenError::Connect {
            host: self.host.clone(),
            port: self.port,
            database: self.database.clone(),
            user: self.user.clone(),
            source: source.into(),
        }
    }

    /// The store's pool of at most `size` connections. Every wait is bounded by `timeout` (the
    /// connect timeout): for a free connection when all are in use, and for a new connection
    /// (connect, startup and login); past it the caller gets a retryable store error, never a
    /// wait without end. A connection that closed (a terminated backend, a server restart) is
    /// never handed out again once its closing is seen; one whose closing is not yet seen fails
    /// its first statement with a retryable error.
    #[allow(clippy::result_large_err)] // as `parse`
    pub(crate) fn pool(&self, size: usize, timeout: Duration) -> Result<Pool, OpenError> {
        let manager = Manager::from_config(
            self.config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager)
            .max_size(size)
            .wait_timeout(Some(timeout))
            .create_timeout(Some(timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| self.connect_error(e.to_string()))
    }
}

/// Whether `schema` is a name the store accepts (and so needs no quoting).
pub(crate) fn valid_schema(schema: &str) -> bool {
    let mut chars = schema.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && schema.len() <= 48
        && !schema.starts_with("pg_")
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The driver's error with what the server said in its message: tokio-postgres says only
/// "db error" and keeps the server's message in its source. The source of this error is the
/// `tokio_postgres::Error`.
#[derive(Debug)]
pub(crate) struct DriverError(tokio_postgres::Error);

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(
                f,
                "the server said: {} {} (SQLSTATE {})",
                db.severity(),
                db.message(),
                db.code().code()
            ),
            None => match std::error::Error::source(&self.0) {
                Some(source) => write!(f, "{}: {source}", self.0),
                None => write!(f, "{}", self.0),
            },
        }
    }
}

impl std::error::Error for DriverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl DriverError {
    pub(crate) fn boxed(e: tokio_postgres::Error) -> BackendError {
        Box::new(DriverError(e))
    }
}

/// A store error for a driver's error: retryable for a dropped connection, a serialization
/// failure or a deadlock.
pub(crate) fn store_error(store: &str, e: tokio_postgres::Error) -> StoreError {
    use tokio_postgres::error::SqlState;
    let retryable = e.is_closed()
        || e.code().is_some_and(|c| {
            *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
        })
        || (e.as_db_error().is_none() && e.code().is_none());
    StoreError::backend(store, retryable, DriverError::boxed(e))
}

/// A store error for a pool's error (no connection could be had).
pub(crate) fn pool_error(store: &str, e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => StoreError::backend(store, true, DriverError::boxed(e)),
        other => StoreError::backend(store, true, other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names() {
        for ok in ["reactifact", "_x", "a1_b", &"a".repeat(48)] {
            assert!(valid_schema(ok), "{ok}");
        }
        for bad in ["", "1a", "A", "a-b", "a b", "a\"b", &"a".repeat(49), "é", "pg_x"] {
            assert!(!valid_schema(bad), "{bad}");
        }
    }
}
