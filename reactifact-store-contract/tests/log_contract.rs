//! The log contract suite (`for_each_log_check!`) run against the core's `LogStore`s:
//! `MemoryStore` and SQLite's `SqliteStore`.

use reactifact_store_contract::{self as contract, MemoryLogHarness, SqliteLogHarness};

macro_rules! memory_log_checks {
    ($($check:ident),* $(,)?) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    contract::$check(&MemoryLogHarness).await;
                }
            )*
        }
    };
}

reactifact_store_contract::for_each_log_check!(memory_log_checks);

/// The whole suite in one run, as `run_all_log` gives it to any store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_run_all_log() {
    contract::run_all_log(&MemoryLogHarness).await;
}

macro_rules! sqlite_log_checks {
    ($($check:ident),* $(,)?) => {
        mod sqlite {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    contract::$check(&SqliteLogHarness::default()).await;
                }
            )*
        }
    };
}

reactifact_store_contract::for_each_log_check!(sqlite_log_checks);

/// The whole suite in one run, on SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_run_all_log() {
    contract::run_all_log(&SqliteLogHarness::default()).await;
}
