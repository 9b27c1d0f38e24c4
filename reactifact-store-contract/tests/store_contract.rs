//! The store contract suite (`reactifact_core::store_contract`), run against every store of
//! this crate: the in-memory outbox, and SQLite below.

use std::sync::Arc;
use std::time::SystemTime;

use reactifact_core::store::{BoxFuture, OutboxStore, SqliteOutbox};
use reactifact_core::Context;
use reactifact_store_contract::{self as contract, ContractHarness, ContractStore, MemoryHarness};

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
    lease_owners_by_scope,
    take_over_dead_owner,
    retry_at_not_before,
    retry_cancel_legality,
    approval_awaits_and_is_never_claimed,
    approve_reject_legality,
    rejected_is_final_and_purged,
    purge_rules,
    purge_by_status,
    attempt_history,
    trace_context_kept,
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

// ---- SQLite ---------------------------------------------------------------------------------

/// The harness of [`SqliteOutbox`]: each fresh store is a new file in a temporary directory,
/// created by a `Context` and then opened as a standalone outbox; intents are registered
/// through the outbox's `register` (the one a commit runs in its transaction), at exactly
/// the suite's `now`.
struct SqliteHarness;

struct SqliteContractStore {
    outbox: Arc<SqliteOutbox>,
    generation: u64,
    /// Kept alive (and removed last) with the store.
    _dir: tempfile::TempDir,
}

/// A temporary directory for a store file: in memory (`/dev/shm`) where there is one, so that
/// the suite's thousands of `synchronous = FULL` transactions do not each wait for a disk
/// (the contract is about what a transaction does, not about its durability).
fn temp_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    shm.is_dir()
        .then(|| tempfile::tempdir_in(shm).ok())
        .flatten()
        .unwrap_or_else(|| tempfile::tempdir().expect("a temporary directory"))
}

impl ContractHarness for SqliteHarness {
    fn fresh(&self) -> BoxFuture<'_, Box<dyn ContractStore>> {
        Box::pin(async {
            let dir = temp_dir();
            let path = dir.path().join("contract.db");
            drop(Context::open(&path, "contract").expect("a new store file"));
            let outbox = SqliteOutbox::open(&path).expect("the file's outbox");
            Box::new(SqliteContractStore {
                outbox,
                generation: 0,
                _dir: dir,
            }) as Box<dyn ContractStore>
        })
    }
}

impl ContractStore for SqliteContractStore {
    fn outbox(&self) -> Arc<dyn OutboxStore> {
        self.outbox.clone()
    }

    fn register<'a>(
        &'a mut self,
        session: &'a str,
        keys: &'a [(&'a str, &'a str)],
        now: SystemTime,
    ) -> BoxFuture<'a, ()> {
        self.generation += 1;
        let registered = self.outbox.register_intents(
            reactifact_store_contract::new_intents(session, self.generation, keys),
            now,
        );
        Box::pin(async move { registered.await.expect("registration commits") })
    }

    fn register_awaiting<'a>(
        &'a mut self,
        session: &'a str,
        keys: &'a [(&'a str, &'a str)],
        now: SystemTime,
    ) -> BoxFuture<'a, ()> {
        self.generation += 1;
        let registered = self.outbox.register_intents(
            reactifact_store_contract::approval_intents(session, self.generation, keys),
            now,
        );
        Box::pin(async move { registered.await.expect("registration commits") })
    }
}

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

sqlite_checks!(
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
    lease_owners_by_scope,
    take_over_dead_owner,
    retry_at_not_before,
    retry_cancel_legality,
    approval_awaits_and_is_never_claimed,
    approve_reject_legality,
    rejected_is_final_and_purged,
    purge_rules,
    purge_by_status,
    attempt_history,
    trace_context_kept,
    queries,
);

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
