//! [`connect`]: a session of the store a URL names — PostgreSQL, SQLite or memory.

use std::sync::Arc;

use reactifact_core::error::StoreUrlError;
use reactifact_core::store::{redact_url, LogStore, StoreUrl};
use reactifact_core::Context;

use crate::connect::{PostgresOptions, DEFAULT_SCHEMA};
use crate::log::PostgresStore;
use crate::OpenError;

/// Connecting to a store by URL failed ([`connect`]). No message names a password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL does not parse.
    #[error(transparent)]
    Url(#[from] StoreUrlError),
    /// A `memory:` or SQLite URL, which [`reactifact_core::connect`] opened, failed there.
    #[error(transparent)]
    Core(#[from] reactifact_core::error::ConnectError),
    /// The PostgreSQL store could not be opened: the URL does not parse as the driver's, the
    /// schema name is not one the store accepts, the server cannot be reached, the schema is
    /// another program's or a newer build's, …
    #[error("connecting to `{url}`: {source}")]
    #[non_exhaustive]
    Store {
        /// The URL, its password replaced by `***`.
        url: String,
        /// What opening the store said.
        #[source]
        source: OpenError,
    },
    /// The store opened, but the session did not (its log does not verify, the server
    /// failed while it was read, …).
    #[error("connecting to `{url}` (session `{session}`): {source}")]
    #[non_exhaustive]
    Session {
        /// The URL, its password replaced by `***`.
        url: String,
        /// The session.
        session: String,
        /// What the core said.
        #[source]
        source: OpenError,
    },
}

/// Opens (creating if needed) the named session of the store `url` names, with the default
/// options: every URL [`reactifact_core::connect`] takes (`memory:`, `sqlite:PATH`,
/// `sqlite://PATH`, a plain path), and a PostgreSQL server, `postgres://…` or
/// `postgresql://…`, with the store's schema in the URL's `schema` parameter
/// ([`DEFAULT_SCHEMA`] without one).
///
/// The `schema` parameter is taken out of the URL before the driver sees it; the rest of
/// the URL is the driver's ([`PostgresOptions::new`]). A PostgreSQL store is opened as
/// [`PostgresStore::open`] opens it (creating the schema or upgrading it) with the default
/// [`PostgresOptions`], and the session as
/// [`Context::open_store`](reactifact_core::Context::open_store) opens it. The future is
/// `Send`, and blocks no executor thread.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = reactifact_postgres::connect("postgres://app@db:5432/app?schema=shop", "orders").await?;
/// let outbox = ctx.outbox(); // for a Drainer: Drainer::builder(outbox, dispatcher)
/// let local = reactifact_postgres::connect("sqlite:state.db", "orders").await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`ConnectError`], naming the URL (its password hidden) and what is wrong: a URL that does
/// not parse ([`ConnectError::Url`]), a schema name the store does not accept, a server that
/// cannot be reached ([`ConnectError::Store`], carrying the [`OpenError`]), a session that
/// does not open ([`ConnectError::Session`]), and the core's errors for the other stores
/// ([`ConnectError::Core`]).
#[allow(clippy::result_large_err)] // the core's `OpenError::Corrupt` keeps its source unboxed to downcast
pub async fn connect(url: &str, session: impl Into<String>) -> Result<Context, ConnectError> {
    let session = session.into();
    let StoreUrl::Postgres {
        url: driver_url,
        schema,
    } = StoreUrl::parse(url)?
    else {
        return Ok(reactifact_core::connect(url, session).await?);
    };
    let shown = redact_url(url);
    let store = PostgresStore::open(options(driver_url, schema))
        .await
        .map_err(|source| ConnectError::Store {
            url: shown.clone(),
            source,
        })?;
    let store: Arc<dyn LogStore> = store;
    Context::open_store(store, session.clone())
        .await
        .map_err(|source| ConnectError::Session {
            url: shown,
            session,
            source,
        })
}

/// The options of the store a PostgreSQL URL names: the driver's URL (without `schema`), and
/// the schema it names, or [`DEFAULT_SCHEMA`].
fn options(driver_url: String, schema: Option<String>) -> PostgresOptions {
    PostgresOptions::new(driver_url).schema(schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options_of(url: &str) -> PostgresOptions {
        match StoreUrl::parse(url).unwrap() {
            StoreUrl::Postgres { url, schema } => options(url, schema),
            other => panic!("{url} parsed as {other:?}"),
        }
    }

    #[test]
    fn the_schema_leaves_the_url_and_defaults_to_the_crates() {
        let plain = options_of("postgres://app:pw@db:5432/app");
        assert_eq!(
            (plain.url(), plain.schema_name()),
            ("postgres://app:pw@db:5432/app", DEFAULT_SCHEMA)
        );
        let named = options_of("postgresql://app@db/app?sslmode=disable&schema=shop&connect_timeout=3");
        assert_eq!(
            (named.url(), named.schema_name()),
            ("postgresql://app@db/app?sslmode=disable&connect_timeout=3", "shop")
        );
        let only = options_of("postgres://app@db/app?schema=shop");
        assert_eq!((only.url(), only.schema_name()), ("postgres://app@db/app", "shop"));
    }
}
