//! Shared by the tests of the PostgreSQL store: the server's URL, schemas of their own that
//! are dropped afterwards, and the store contract harness.

#![allow(dead_code)] // each test binary uses part of it

pub mod flow;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use reactifact_core::store::{BoxFuture, NewIntent, OutboxStore};
use reactifact_postgres::{PostgresOptions, PostgresOutbox};
use reactifact_store_contract::{ContractHarness, ContractStore};

/// The variable CI sets to the test server's URL.
pub const URL_VAR: &str = "REACTIFACT_TEST_POSTGRES_URL";

/// The test server's URL; `None` (after saying so) when the variable is unset, so that a
/// developer without a server can run the other tests. When it is set the tests run, and an
/// unreachable server fails them.
pub fn url(test: &str) -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            println!("skipped {test}: {URL_VAR} is not set");
            None
        }
    }
}

/// Schemas made for one test, each named `rft_{tag}_{pid}_{n}`, all dropped when this is
/// dropped (also when the test panics).
pub struct Schemas {
    url: String,
    tag: String,
    next: AtomicU64,
    made: Mutex<Vec<String>>,
}

impl Schemas {
    /// Schemas for the test `tag` on the server at `url`.
    pub fn new(url: &str, tag: &str) -> Self {
        Schemas {
            url: url.to_owned(),
            tag: tag.to_owned(),
            next: AtomicU64::new(0),
            made: Mutex::new(Vec::new()),
        }
    }

    /// A new schema name (not created: opening a store creates it).
    pub fn name(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("rft_{}_{}_{n}", self.tag, std::process::id());
        self.made.lock().unwrap().push(name.clone());
        name
    }

    /// Drops `schema` with the others (a name made elsewhere).
    pub fn adopt(&self, schema: &str) {
        self.made.lock().unwrap().push(schema.to_owned());
    }

    /// Opens a store in a new schema.
    pub async fn open(&self) -> Arc<PostgresOutbox> {
        let schema = self.name();
        PostgresOutbox::open(PostgresOptions::new(&self.url).schema(schema).pool_size(4))
            .await
            .unwrap_or_else(|e| panic!("the test store opens: {e}"))
    }

    /// Runs `sql` on a connection of its own.
    pub async fn execute(&self, sql: &str) {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .expect("a connection to the test server");
        let driver = tokio::spawn(connection);
        client.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        drop(client);
        let _ = driver.await;
    }
}

impl Drop for Schemas {
    fn drop(&mut self) {
        let made = std::mem::take(&mut *self.made.lock().unwrap_or_else(|e| e.into_inner()));
        if made.is_empty() {
            return;
        }
        let url = self.url.clone();
        // A thread of its own, with a runtime of its own: this may run inside a test's
        // runtime, which cannot be blocked on.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async move {
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
                tokio::spawn(connection);
                for schema in made {
                    client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                        .await?;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("the test schemas could not be dropped: {e}");
        }
    }
}

/// The store contract harness: every fresh store in a new schema; intents registered through
/// [`PostgresOutbox::register`] in a transaction of their own, at exactly the suite's `now`.
pub struct PgHarness {
    pub schemas: Schemas,
}

impl PgHarness {
    pub fn new(url: &str, tag: &str) -> Self {
        PgHarness {
            schemas: Schemas::new(url, tag),
        }
    }
}

struct PgStore {
    outbox: Arc<PostgresOutbox>,
}

impl ContractHarness for PgHarness {
    fn fresh(&self) -> BoxFuture<'_, Box<dyn ContractStore>> {
        Box::pin(async move {
            Box::new(PgStore {
                outbox: self.schemas.open().await,
            }) as Box<dyn ContractStore>
        })
    }
}

impl ContractStore for PgStore {
    fn outbox(&self) -> Arc<dyn OutboxStore> {
        self.outbox.clone()
    }

    fn register_intents(&mut self, intents: Vec<NewIntent>, now: SystemTime) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.outbox
                .register_alone(&intents, now)
                .await
                .unwrap_or_else(|e| panic!("registration commits: {e}"))
        })
    }
}
