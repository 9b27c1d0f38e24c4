//! The store contract suite (`reactifact_core::store_contract`), run against every store of
//! this crate: the in-memory outbox now, SQLite below.

use reactifact_core::store_contract::{self as contract, MemoryHarness};

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

memory_checks!(
    register_once_per_key,
    attach_to_committing_session,
    claim_due_in_order,
    claim_sets_token_attempts_lease,
    claim_limit_and_scope,
    record_outcomes,
    stale_token_changes_nothing,
    reclaim_makes_old_token_stale,
    renew_only_for_holder,
    reclaim_only_after_expiry,
    retry_at_not_before,
    retry_cancel_legality,
    purge_rules,
    queries,
);

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

// ---- SQLite (the lead wires it) -------------------------------------------------------------
//
// TODO(lead): a `SqliteHarness` implementing `contract::ContractHarness`, whose `fresh()`
// creates a store file in a `tempfile::TempDir` (kept alive by the returned store) and whose
// `ContractStore::register(session, keys, now)` commits, through a `Context::open(path,
// session)` of that session, one generation acting each (key, kind) as a `PendingAction`, with
// the commit time `now` (the suite's times are explicit: the commit must be stamped `now`, not
// the wall clock). `outbox()` returns the `SqliteOutbox` of the file as `Arc<dyn OutboxStore>`.
// Then run the same list of checks (and `differential`) against it, e.g. with a
// `sqlite_checks!` macro shaped like `memory_checks!` above, or `contract::run_all(&SqliteHarness)`.
