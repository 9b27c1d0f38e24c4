//! A PostgreSQL store for reactifact: sessions' logs and the delivery ledger in one schema of a
//! PostgreSQL database, shared by any number of processes and drainers.
//!
//! [`connect`] opens a session of the store a URL names: `postgres://…?schema=NAME` here, and
//! every URL [`reactifact_core::connect`] takes (`sqlite:PATH`, `memory:`), so one call serves
//! a program whatever its store:
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let url = std::env::var("STORE").unwrap_or_else(|_| "postgres://app@127.0.0.1/app?schema=shop".into());
//! let ctx = reactifact_postgres::connect(&url, "orders").await?;
//! # Ok(()) }
//! ```
//!
//! [`PostgresStore`] keeps sessions' logs (a [`reactifact_core::store::LogStore`]:
//! `Context::open_store(store, "orders")` opens one); its [`PostgresOutbox`] is the outbox every
//! commit registers its intents in and every drainer claims from.
//!
//! [`PostgresOutbox`] implements [`reactifact_core::store::OutboxStore`] with the semantics of the
//! core's stores (the store contract suite runs against it): claims with leases and fencing
//! tokens, reclaim of expired leases by any claimer, outcomes fenced on the claim's token,
//! renewal, an operator's retry, cancel and purge (with tombstones), and reads by key, page,
//! status and scope. Every row carries a digest of its columns, checked whenever a row is
//! handed out: a row changed outside reactifact is held, never delivered.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use reactifact_postgres::{PostgresOptions, PostgresOutbox};
//!
//! let outbox = PostgresOutbox::open(
//!     PostgresOptions::new("postgres://app@127.0.0.1:5432/app").schema("orders_outbox"),
//! )
//! .await?;
//! let mut wake = outbox.listen(); // a drainer waits on `wake.next()` or its poll interval
//! # Ok(()) }
//! ```
//!
//! - **Where**: each store lives in a schema (namespace) of its own, [`DEFAULT_SCHEMA`] unless
//!   [`PostgresOptions::schema`] names another; opening creates the schema and its tables,
//!   or upgrades them, under an advisory lock, and refuses a schema of a newer build or of
//!   another program.
//! - **Connections**: a pool (deadpool-postgres) of at most
//!   [`PostgresOptions::pool_size`] connections over tokio-postgres, without TLS: this crate
//!   connects with `NoTls` (a server on the same host or a private network). To reach a
//!   server over TLS, put a TLS-terminating proxy beside the process (such as PgBouncer with
//!   `server_tls_sslmode`, or an SSH tunnel).
//! - **Passwords**: no error, log line or `Debug` output of this crate names the password of
//!   the URL ([`redact_url`]).
//! - **Registration**: a commit registers its intents with [`PostgresOutbox::register`] in its
//!   own transaction; it notifies the store's channel, and [`PostgresOutbox::listen`] wakes a
//!   drainer within milliseconds.

mod connect;
mod listen;
mod log;
mod outbox;
mod prune;
mod row;
mod schema;
mod sessions;
mod url;

pub use connect::{PostgresOptions, DEFAULT_POOL_SIZE, DEFAULT_SCHEMA};
pub use listen::Notifications;
pub use log::{PostgresStore, DEFAULT_LOG_CONNECTIONS};
pub use outbox::PostgresOutbox;
pub use prune::{PruneOptions, PruneReport, PruneSummary, DEFAULT_PRUNE_BATCH};
/// Opening the store failed: the core's one [`OpenError`](reactifact_core::error::OpenError),
/// whose `BadUrl`, `BadSchema`, `Connect`, `ForeignSchema`, `NoStore` and `Prepare` variants
/// are this store's.
pub use reactifact_core::error::OpenError;
#[allow(deprecated)] // kept so that code naming it builds; sessions are listed as `SessionInfo`
pub use sessions::PgSessionInfo;
pub use sessions::SchemaProbe;
pub use url::{connect, ConnectError};

/// `url` with its password replaced by `***` (the core's, re-exported: every message of this
/// crate that quotes a URL shows it so).
pub use reactifact_core::store::redact_url;
