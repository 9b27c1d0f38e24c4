//! The store contract suite, run against the core's stores: the in-memory outbox, and SQLite.

use reactifact_store_contract::{self as contract, MemoryHarness, SqliteHarness};

macro_rules! memory_checks {
    ($($check:ident),* $(,)?) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $check() {
                    contract::$check(&MemoryHarness).await;
                }
            )*
        }
    };
}

reactifact_store_contract::for_each_check!(memory_checks);

/// Eight claimers racing on worker threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_concurrent_claimers_are_disjoint() {
    contract::concurrent_claimers_are_disjoint(&MemoryHarness).await;
}

/// Random operation sequences against a reference model, several seeds.
#[tokio::test]
async fn memory_differential() {
    for seed in [1, 2, 3, 0x5eed, 0xdead_beef, 42] {
        contract::differential(&MemoryHarness, seed, 600).await;
    }
}

// ---- SQLite ---------------------------------------------------------------------------------

macro_rules! sqlite_checks {
    ($($check:ident),* $(,)?) => {
        mod sqlite {
            use super::*;
            $(
                #[tokio::test]
                async fn $check() {
                    contract::$check(&SqliteHarness).await;
                }
            )*
        }
    };
}

reactifact_store_contract::for_each_check!(sqlite_checks);

/// Eight claimers racing on worker threads, through one outbox (its thread serialises them;
/// tests/sqlite_outbox.rs races two connections of one file).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_concurrent_claimers_are_disjoint() {
    contract::concurrent_claimers_are_disjoint(&SqliteHarness).await;
}

/// Random operation sequences against a reference model, the memory seeds with half the
/// steps: every step reads the whole outbox back (rows, digests, counts of every scope), which
/// in a debug build costs about 3 ms a step on SQLite (600 steps a seed take 12 s in all; these
/// 300 take about 6 s).
#[tokio::test]
async fn sqlite_differential() {
    for seed in [1, 2, 3, 0x5eed, 0xdead_beef, 42] {
        contract::differential(&SqliteHarness, seed, 300).await;
    }
}
