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

pg_checks!(
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
