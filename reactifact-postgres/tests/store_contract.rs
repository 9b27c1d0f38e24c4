//! The store contract suite (`reactifact_store_contract`) against PostgreSQL, each
//! check in a schema of its own (dropped afterwards). Runs when `REACTIFACT_TEST_POSTGRES_URL`
//! is set; an unreachable server then fails it.

mod common;

use common::PgHarness;
use reactifact_store_contract as contract;

macro_rules! pg_checks {
    ($($check:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                let Some(url) = common::url(stringify!($check)) else { return };
                let harness = PgHarness::new(&url, stringify!($check));
                contract::$check(&harness).await;
            }
        )*
    };
}

reactifact_store_contract::for_each_check!(pg_checks);

/// Eight claimers racing on worker threads, over one pool of four connections: the claims
/// race in the database, not in a queue of this process.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_are_disjoint() {
    let Some(url) = common::url("concurrent_claimers_are_disjoint") else {
        return;
    };
    let harness = PgHarness::new(&url, "concurrent");
    contract::concurrent_claimers_are_disjoint(&harness).await;
}

/// Random operation sequences against the reference model, the SQLite seeds and steps.
#[tokio::test]
async fn differential() {
    let Some(url) = common::url("differential") else { return };
    let harness = PgHarness::new(&url, "differential");
    for seed in [1, 2, 3, 0x5eed, 0xdead_beef, 42] {
        contract::differential(&harness, seed, 300).await;
    }
}

/// The whole suite in one run, as `run_all` gives it to any store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all() {
    let Some(url) = common::url("run_all") else { return };
    let harness = PgHarness::new(&url, "run_all");
    contract::run_all(&harness).await;
}
