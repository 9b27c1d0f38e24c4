//! The stores the shop's serving children run on (`serve_process.rs`, `serve_kill.rs`): a
//! SQLite file, or a schema of its own on the PostgreSQL server CI names in
//! `REACTIFACT_TEST_POSTGRES_URL`, each named by the URL `reactifact_postgres::connect` takes;
//! and a dispatcher that logs every attempt before the shop's mail service sends it.

use std::path::Path;
use std::sync::Arc;

use reactifact_core::{Context, DispatchError, Dispatcher, Intent};
use reactifact_examples::shop::{self, Mailer};
use reactifact_postgres::{PostgresOptions, PostgresStore};

use super::LineLog;

/// The variable CI sets to the test server's URL.
pub const POSTGRES_URL_VAR: &str = "REACTIFACT_TEST_POSTGRES_URL";

/// Where a trial's state lives.
#[derive(Clone, Debug)]
pub enum Store {
    /// A SQLite file.
    Sqlite(std::path::PathBuf),
    /// A schema of its own on a PostgreSQL server: the server's URL and the schema.
    Postgres { url: String, schema: String },
}

/// The PostgreSQL server's URL, if the environment names one (then the PostgreSQL tests run,
/// and a server that cannot be reached fails them).
pub fn postgres_url() -> Option<String> {
    std::env::var(POSTGRES_URL_VAR).ok().filter(|url| !url.is_empty())
}

impl Store {
    /// A fresh SQLite file in `dir`.
    pub fn sqlite(dir: &Path, name: &str) -> Store {
        Store::Sqlite(dir.join(format!("{name}.db")))
    }

    /// A fresh schema, `rft_{tag}_{pid}_{n}`, on the server at `url` (created by the first
    /// connect; [`Store::remove`] drops it).
    pub fn postgres(url: &str, tag: &str, n: usize) -> Store {
        Store::Postgres {
            url: url.to_owned(),
            schema: format!("rft_{tag}_{}_{n}", std::process::id()),
        }
    }

    /// The URL `reactifact_postgres::connect` opens: `sqlite:PATH`, or the server's URL with
    /// `schema=NAME`.
    pub fn url(&self) -> String {
        match self {
            Store::Sqlite(path) => format!("sqlite:{}", path.display()),
            Store::Postgres { url, schema } => {
                let separator = if url.contains('?') { '&' } else { '?' };
                format!("{url}{separator}schema={schema}")
            }
        }
    }

    /// `sqlite` or `postgres`.
    pub fn name(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres { .. } => "postgres",
        }
    }

    /// Removes what the trial stored on a PostgreSQL server: its schema. (A SQLite file stays
    /// in the test's scratch directory.)
    pub async fn remove(&self) {
        if let Store::Postgres { url, schema } = self {
            let store = PostgresStore::open(PostgresOptions::new(url).schema(schema))
                .await
                .unwrap_or_else(|e| panic!("open the schema {schema} to drop it: {e}"));
            let client = store.outbox().pool().get().await.expect("a connection");
            client
                .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
                .await
                .unwrap_or_else(|e| panic!("drop the schema {schema}: {e}"));
        }
    }
}

/// Opens the shop's session of the store at `url`, as `shop-service --store URL` does.
pub async fn connect(url: &str) -> Context {
    reactifact_postgres::connect(url, shop::SESSION)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// A dispatcher that appends `S {key} {attempt} {pid}` to `log` before each attempt (the send
/// a receiver may see), then hands the attempt to `mailer`.
pub fn logged(mailer: Mailer, log: LineLog) -> impl Dispatcher {
    let pid = std::process::id();
    let mailer = Arc::new(mailer);
    move |intent: Intent| {
        let mailer = mailer.clone();
        let log = log.clone();
        async move {
            log.line(&format!("S {} {} {pid}", intent.key(), intent.attempt()))
                .map_err(DispatchError::retryable)?;
            mailer.dispatch(intent).await
        }
    }
}
