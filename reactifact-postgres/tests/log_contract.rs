//! The log contract suite (`reactifact_store_contract::for_each_log_check!`) against
//! [`PostgresStore`], each check in a schema of its own (dropped afterwards). Runs when
//! `REACTIFACT_TEST_POSTGRES_URL` is set; an unreachable server then fails it.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::Schemas;
use reactifact_core::store::{BoxFuture, LogStore};
use reactifact_postgres::{PostgresOptions, PostgresStore};
use reactifact_store_contract::{self as contract, LogHarness};

/// The log harness: every fresh store in a new schema of the test server; a pair is two
/// stores opened on one schema (two processes' handles: their own connections and runtimes,
/// so that racing appends race in the database).
struct PgLogHarness {
    url: String,
    schemas: Schemas,
}

impl PgLogHarness {
    /// Schemas for the check `check`: `rft_lg{N}_{check, cut}_{pid}_{n}`, at most 48
    /// characters (what the store takes), told apart by `N` even where two checks' names
    /// begin alike.
    fn new(url: &str, check: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let cut: String = check.chars().take(24).collect();
        PgLogHarness {
            url: url.to_owned(),
            schemas: Schemas::new(url, &format!("lg{n}_{cut}")),
        }
    }

    async fn open(&self, schema: &str) -> Arc<PostgresStore> {
        PostgresStore::open(PostgresOptions::new(&self.url).schema(schema).pool_size(2))
            .await
            .unwrap_or_else(|e| panic!("the test store opens in schema {schema}: {e}"))
    }

    fn schema(&self) -> String {
        let schema = self.schemas.name();
        assert!(schema.len() <= 48, "schema name {schema} is too long for the store");
        schema
    }
}

impl LogHarness for PgLogHarness {
    fn fresh(&self) -> BoxFuture<'_, Arc<dyn LogStore>> {
        Box::pin(async move {
            let schema = self.schema();
            self.open(&schema).await as Arc<dyn LogStore>
        })
    }

    fn fresh_pair(&self) -> BoxFuture<'_, (Arc<dyn LogStore>, Arc<dyn LogStore>)> {
        Box::pin(async move {
            let schema = self.schema();
            let one = self.open(&schema).await as Arc<dyn LogStore>;
            let two = self.open(&schema).await as Arc<dyn LogStore>;
            (one, two)
        })
    }
}

macro_rules! pg_log_checks {
    ($($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let Some(url) = common::url(stringify!($check)) else { return };
                let harness = PgLogHarness::new(&url, stringify!($check));
                contract::$check(&harness).await;
            }
        )*
    };
}

reactifact_store_contract::for_each_log_check!(pg_log_checks);

/// The whole suite in one run, as `run_all_log` gives it to any store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_log() {
    let Some(url) = common::url("run_all_log") else { return };
    let harness = PgLogHarness::new(&url, "run_all_log");
    contract::run_all_log(&harness).await;
}
