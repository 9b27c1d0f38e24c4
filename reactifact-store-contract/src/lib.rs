//! The store contract suite: what every [`OutboxStore`] must do, written once against
//! `Arc<dyn OutboxStore>` and a registration hook, and run against each store (memory,
//! SQLite, and the stores of other crates such as a PostgreSQL one).
//!
//! A store's tests implement [`ContractHarness`] (a fresh, empty store per check, and a way to
//! register intents as a commit of a session at a given time would) and call [`run_all`], or
//! the checks one by one. Every check panics with a message naming what was violated.
//!
//! All times are explicit ([`at`]): the suite never sleeps and never reads a clock.
//!
//! The log side has a suite of its own: a [`LogStore`](reactifact_core::store::LogStore)'s
//! tests implement [`LogHarness`] (a fresh, empty store per check) and call [`run_all_log`]
//! (or the checks [`for_each_log_check!`] names, one by one); [`MemoryLogHarness`] runs it
//! against the in-memory [`MemoryStore`](reactifact_core::store::MemoryStore).
//!
//! A crate of its own, not compiled into the library; not published, and it may change with
//! any release of the core.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reactifact_core::audit::{CommitHash, ContentHash};
use reactifact_core::runtime::Generation;
use reactifact_core::runtime::Origin;
use reactifact_core::runtime::TraceParent;
use reactifact_core::store::Verdict;
use reactifact_core::store::{micros, RateBucket};
use reactifact_core::store::{
    ApprovalError, BoxFuture, CancelError, ClaimPolicy, ClaimRequest, Claimed, FailedAttempt, LedgerQuery, OutboxStore,
    Outcome, PurgeFilter, Recorded, Recording, RetryError, Scope, StatusCounts,
};
use reactifact_core::store::{Attempt, AttemptOutcome, Delivery, DeliveryStatus, FenceToken, NewIntent};
use reactifact_core::store::{MemoryOutbox, SqliteOutbox};
use reactifact_core::Context;
use reactifact_core::{ActionKey, Intent, PendingAction, RateLimit};

mod log;
pub use log::{
    answers_kept_in_order_and_dropped_by_run, append_claims_as_claim_would, append_moves_row_and_adds_commit,
    append_never_moves_consumed_back, append_registers_intents, branch_reads_its_own_rows,
    checkpoints_replace_and_keep_newest, commits_read_their_bounds_and_own_rows, consume_is_fenced,
    create_session_once, futures_need_no_executor, missing_session_reads_none, racing_appends_one_wins, run_all_log,
    stale_append_writes_nothing, verify_outbox_consistent, verify_outbox_forged, verify_outbox_missing, LogHarness,
    MemoryLogHarness, SqliteLogHarness,
};

/// Creates fresh stores for the checks.
pub trait ContractHarness: Send + Sync {
    /// A new, empty store.
    fn fresh(&self) -> BoxFuture<'_, Box<dyn ContractStore>>;
}

/// One store under test.
pub trait ContractStore: Send {
    /// The store's outbox.
    fn outbox(&self) -> Arc<dyn OutboxStore>;

    /// Registers `intents`, in order, as one commit made at `now` would: new keys pending
    /// (or awaiting approval) and due at `now` (or at their `not_before`, if later), owned by
    /// their origin's session; keys already held attached to that session unless final or
    /// purged. The store must take `now` as the commit time (whole milliseconds).
    fn register_intents(&mut self, intents: Vec<NewIntent>, now: SystemTime) -> BoxFuture<'_, ()>;

    /// Registers `keys` (key, kind) as [`new_intents`] of one commit of `session` at `now`.
    fn register<'a>(
        &'a mut self,
        session: &'a str,
        keys: &'a [(&'a str, &'a str)],
        now: SystemTime,
    ) -> BoxFuture<'a, ()> {
        self.register_intents(new_intents(session, next_generation(), keys), now)
    }

    /// Registers `keys` as [`approval_intents`]: new keys awaiting approval, not due.
    fn register_awaiting<'a>(
        &'a mut self,
        session: &'a str,
        keys: &'a [(&'a str, &'a str)],
        now: SystemTime,
    ) -> BoxFuture<'a, ()> {
        self.register_intents(approval_intents(session, next_generation(), keys), now)
    }
}

/// A generation for the next registration: distinct across every store of the process (the
/// checks never read it back, but no two commits of one store share one).
fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The harness of [`SqliteOutbox`]: each fresh store is a new file in a temporary directory,
/// created by a `Context` and then opened as a standalone outbox; intents are registered
/// through the outbox's `register` (the one a commit runs in its transaction), at exactly
/// the suite's `now`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SqliteHarness;

struct SqliteContractStore {
    outbox: Arc<SqliteOutbox>,
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
            Box::new(SqliteContractStore { outbox, _dir: dir }) as Box<dyn ContractStore>
        })
    }
}

impl ContractStore for SqliteContractStore {
    fn outbox(&self) -> Arc<dyn OutboxStore> {
        self.outbox.clone()
    }

    fn register_intents(&mut self, intents: Vec<NewIntent>, now: SystemTime) -> BoxFuture<'_, ()> {
        let registered = self.outbox.register_intents(intents, now);
        Box::pin(async move { registered.await.expect("registration commits") })
    }
}

/// The harness of [`MemoryOutbox`]: registers through `MemoryOutbox::register`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryHarness;

struct MemoryStore {
    outbox: Arc<MemoryOutbox>,
}

impl ContractHarness for MemoryHarness {
    fn fresh(&self) -> BoxFuture<'_, Box<dyn ContractStore>> {
        Box::pin(async {
            Box::new(MemoryStore {
                outbox: MemoryOutbox::new(),
            }) as Box<dyn ContractStore>
        })
    }
}

impl ContractStore for MemoryStore {
    fn outbox(&self) -> Arc<dyn OutboxStore> {
        self.outbox.clone()
    }

    fn register_intents(&mut self, intents: Vec<NewIntent>, now: SystemTime) -> BoxFuture<'_, ()> {
        self.outbox.register_intents(intents, now);
        Box::pin(std::future::ready(()))
    }
}

/// The intents a commit of `session` at `generation` would hand its store for `keys`: the
/// payload is the key's bytes, encoded. (A harness of another crate's store registers these.)
pub fn new_intents(session: &str, generation: u64, keys: &[(&str, &str)]) -> Vec<NewIntent> {
    intents_of(session, generation, keys, false, None, None)
}

/// [`new_intents`] for intents that require approval
/// ([`Effects::act_with_approval`](reactifact_core::Effects::act_with_approval)).
pub fn approval_intents(session: &str, generation: u64, keys: &[(&str, &str)]) -> Vec<NewIntent> {
    intents_of(session, generation, keys, true, None, None)
}

/// [`new_intents`] for intents not delivered before `not_before`
/// ([`IntentBuilder::not_before`](reactifact_core::runtime::IntentBuilder::not_before)), and
/// waiting for approval if `requires_approval`.
pub fn scheduled_intents(
    session: &str,
    generation: u64,
    keys: &[(&str, &str)],
    not_before: SystemTime,
    requires_approval: bool,
) -> Vec<NewIntent> {
    let not_before = u64::try_from(
        not_before
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis(),
    )
    .expect("fits");
    intents_of(session, generation, keys, requires_approval, Some(not_before), None)
}

/// [`new_intents`] in the ordering group `group`
/// ([`IntentBuilder::group`](reactifact_core::runtime::IntentBuilder::group)), waiting for
/// approval if `requires_approval`.
pub fn grouped_intents(
    session: &str,
    generation: u64,
    keys: &[(&str, &str)],
    group: &str,
    requires_approval: bool,
) -> Vec<NewIntent> {
    intents_of(session, generation, keys, requires_approval, None, Some(group))
}

fn intents_of(
    session: &str,
    generation: u64,
    keys: &[(&str, &str)],
    requires_approval: bool,
    not_before: Option<u64>,
    group: Option<&str>,
) -> Vec<NewIntent> {
    let session: Arc<str> = Arc::from(session);
    keys.iter()
        .enumerate()
        .map(|(run, &(key, kind))| {
            let payload = rmp_serde::to_vec_named(&key).expect("a string encodes");
            let action = PendingAction {
                kind: kind.to_owned(),
                key: key.to_owned(),
                payload: payload.clone(),
                requires_approval,
                not_before,
                group: group.map(str::to_owned),
            };
            let bytes = rmp_serde::to_vec_named(&action).expect("a PendingAction encodes");
            NewIntent {
                intent: Intent::new(
                    ActionKey::from(key),
                    kind,
                    payload,
                    Origin::new(
                        session.clone(),
                        CommitHash([generation as u8; 32]),
                        Generation(generation),
                        run as u32,
                    ),
                    0,
                )
                .with_trace_parent(Some(trace_of(key))),
                action_hash: ContentHash::of(&bytes),
                bytes: Arc::from(bytes),
            }
        })
        .collect()
}

/// The trace context [`new_intents`] gives the intent of `key` (derived from the key, so
/// that a check knows which one each entry must carry).
pub fn trace_of(key: &str) -> TraceParent {
    let digest = ContentHash::of(key.as_bytes()).0;
    let mut trace_id = [0; 16];
    let mut parent_id = [0; 8];
    trace_id.copy_from_slice(&digest[..16]);
    parent_id.copy_from_slice(&digest[16..24]);
    trace_id[0] |= 1;
    parent_id[0] |= 1;
    TraceParent::new(trace_id, parent_id, digest[24] & 1).expect("ids are not zero")
}

/// The suite's clock: `ms` milliseconds after a fixed instant (2023-11-14).
pub fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(BASE_MS + ms)
}

const BASE_MS: u64 = 1_700_000_000_000;

/// `t` as milliseconds after [`at`]`(0)` (for messages and the model).
fn ms(t: SystemTime) -> u64 {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).expect("after the epoch");
    u64::try_from(since.as_millis()).expect("fits") - BASE_MS
}

/// Runs every check against fresh stores of `harness`.
pub async fn run_all(harness: &dyn ContractHarness) {
    macro_rules! run_each {
        ($($check:ident),* $(,)?) => {
            $($check(harness).await;)*
        };
    }
    for_each_check!(run_each);
    concurrent_claimers_are_disjoint(harness).await;
    differential(harness, 0x5eed, 400).await;
}

/// Calls the macro `$m` with the names of the suite's checks of one store, each an `async fn
/// (&dyn ContractHarness)` of this crate: the one list [`run_all`] runs and a store's tests
/// turn into a test each. (`concurrent_claimers_are_disjoint`, which wants worker threads, and
/// `differential`, which takes a seed and a number of steps, are called on their own.)
///
/// ```ignore
/// macro_rules! memory_checks {
///     ($($check:ident),* $(,)?) => { $(
///         #[tokio::test]
///         async fn $check() { reactifact_store_contract::$check(&MyHarness).await }
///     )* };
/// }
/// reactifact_store_contract::for_each_check!(memory_checks);
/// ```
#[macro_export]
macro_rules! for_each_check {
    ($m:ident) => {
        $m!(
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
            scheduled_waits_for_not_before,
            group_in_order_one_at_a_time,
            group_dead_head_blocks,
            group_with_approvals,
            sessions_take_turns,
            rate_limit_spends_across_claims,
            rate_limit_shared_and_paused,
            priorities_order_claims,
            retry_cancel_legality,
            approval_awaits_and_is_never_claimed,
            approve_reject_legality,
            decision_bound_to_digest,
            rejected_is_final_and_purged,
            purge_rules,
            purge_by_status,
            attempt_history,
            trace_context_kept,
            queries,
        );
    };
}

// ---- helpers ----

const OWNER: &str = "drainer-1";
const LEASE: Duration = Duration::from_secs(30);

async fn claim_with(
    o: &dyn OutboxStore,
    scope: &Scope,
    limit: usize,
    owner: &str,
    lease: Duration,
    now: SystemTime,
) -> Claimed {
    claim_under(o, scope, limit, owner, lease, ClaimPolicy::none(), now).await
}

async fn claim_under(
    o: &dyn OutboxStore,
    scope: &Scope,
    limit: usize,
    owner: &str,
    lease: Duration,
    policy: &ClaimPolicy,
    now: SystemTime,
) -> Claimed {
    let owner: Arc<str> = Arc::from(owner);
    o.claim(ClaimRequest {
        scope,
        limit,
        owner: &owner,
        lease,
        now,
        policy,
    })
    .await
    .unwrap_or_else(|e| panic!("claim failed: {e}"))
}

async fn claim(o: &dyn OutboxStore, limit: usize, now: SystemTime) -> Claimed {
    claim_with(o, &Scope::all(), limit, OWNER, LEASE, now).await
}

fn keys(claimed: &Claimed) -> Vec<&str> {
    claimed.claims.iter().map(|d| d.key().as_str()).collect()
}

async fn get(o: &dyn OutboxStore, key: &str) -> Delivery {
    o.get(key)
        .await
        .unwrap_or_else(|e| panic!("get({key}) failed: {e}"))
        .unwrap_or_else(|| panic!("get({key}): the store does not hold the key"))
}

async fn record(o: &dyn OutboxStore, key: &str, token: FenceToken, outcome: Outcome, now: SystemTime) -> Recorded {
    let recording = [Recording {
        key: ActionKey::from(key),
        token,
        outcome,
    }];
    let mut out = o
        .record(&recording, now)
        .await
        .unwrap_or_else(|e| panic!("record failed: {e}"));
    assert_eq!(out.len(), 1, "record returns one result per recording");
    out.remove(0)
}

async fn counts(o: &dyn OutboxStore, scope: &Scope) -> StatusCounts {
    o.counts(scope).await.unwrap_or_else(|e| panic!("counts failed: {e}"))
}

fn failed(next: FailedAttempt) -> Outcome {
    Outcome::Failed {
        error: "boom".to_owned(),
        next,
    }
}

async fn fresh(h: &dyn ContractHarness) -> (Box<dyn ContractStore>, Arc<dyn OutboxStore>) {
    let store = h.fresh().await;
    let outbox = store.outbox();
    (store, outbox)
}

// ---- checks ----

/// A key is registered once: registering it again neither duplicates nor resets it.
pub async fn register_once_per_key(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("k1", "x"), ("k2", "x")], at(0)).await;
    let c = claim(&*o, 1, at(10)).await;
    assert_eq!(
        keys(&c),
        ["k1"],
        "register_once: the first registered key is claimed first"
    );
    s.register("a", &[("k1", "x"), ("k3", "x")], at(20)).await;
    s.register("a", &[("k3", "x")], at(30)).await;
    let k1 = get(&*o, "k1").await;
    assert_eq!(
        k1.status(),
        DeliveryStatus::InFlight,
        "register_once: a second registration reset k1"
    );
    assert_eq!(k1.token(), FenceToken(1), "register_once: token of k1");
    assert_eq!(k1.recorded_at(), at(0), "register_once: recorded_at of k1 changed");
    assert_eq!(
        get(&*o, "k3").await.recorded_at(),
        at(20),
        "register_once: k3 registered at its first commit"
    );
    let total = counts(&*o, &Scope::all()).await.total();
    assert_eq!(total, 3, "register_once: three keys, counted once each");
    let page = o.list(&LedgerQuery::default()).await.expect("list");
    let listed: Vec<&str> = page.entries.iter().map(|d| d.key().as_str()).collect();
    assert_eq!(
        listed,
        ["k1", "k2", "k3"],
        "register_once: list in registration order, once each"
    );
}

/// Every entry keeps the trace context its first registration gave it, beside the intent: a
/// claim hands it over, every read returns it, and neither a failure, a reclaimed lease, a
/// retry nor a second registration (by another session) changes it.
pub async fn trace_context_kept(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("t1", "x"), ("t2", "x")], at(0)).await;
    for key in ["t1", "t2"] {
        assert_eq!(
            get(&*o, key).await.intent().trace_parent(),
            Some(&trace_of(key)),
            "trace: {key} as registered"
        );
    }
    let c = claim(&*o, 1, at(10)).await;
    assert_eq!(keys(&c), ["t1"], "trace: claim order");
    assert_eq!(
        c.claims[0].intent().trace_parent(),
        Some(&trace_of("t1")),
        "trace: a claim hands it over"
    );
    let failed = Outcome::Failed {
        error: "boom".into(),
        next: FailedAttempt::RetryAt(at(20)),
    };
    record(&*o, "t1", c.claims[0].token(), failed, at(15)).await;
    // Another session commits t1 again: attached, its trace unchanged.
    s.register("b", &[("t1", "x")], at(16)).await;
    let c = claim(&*o, 2, at(20)).await;
    let retried = c
        .claims
        .iter()
        .find(|d| d.key().as_str() == "t1")
        .expect("t1 due again");
    assert_eq!(
        retried.intent().trace_parent(),
        Some(&trace_of("t1")),
        "trace: kept by a retry"
    );
    // Both leases expire; the reclaim keeps it too.
    let c = claim(&*o, 2, at(20) + LEASE + Duration::from_millis(1)).await;
    assert_eq!(c.reclaimed, 2, "trace: both leases reclaimed");
    for d in &c.claims {
        assert_eq!(
            d.intent().trace_parent(),
            Some(&trace_of(d.key().as_str())),
            "trace: kept by a reclaim"
        );
    }
    let page = o.list(&LedgerQuery::default()).await.expect("list");
    for d in &page.entries {
        assert_eq!(
            d.intent().trace_parent(),
            Some(&trace_of(d.key().as_str())),
            "trace: listed"
        );
    }
}

/// A key registered by `a` and committed again by `b` is in `b`'s scope too (attached), and
/// stays there once final; a key already final is not attached.
pub async fn attach_to_committing_session(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("k1", "x"), ("k2", "x")], at(0)).await;
    let c = claim_with(&*o, &Scope::all(), 1, OWNER, LEASE, at(1)).await;
    assert_eq!(keys(&c), ["k1"]);
    let t = c.claims[0].token();
    assert_eq!(
        record(&*o, "k1", t, Outcome::Delivered, at(2)).await,
        Recorded::Accepted(DeliveryStatus::Delivered)
    );
    s.register("b", &[("k2", "x"), ("k1", "x")], at(3)).await;
    let b = Scope::session("b");
    let cb = counts(&*o, &b).await;
    assert_eq!(
        cb.pending, 1,
        "attach: k2 (registered by a, committed by b) is in b's scope: {cb:?}"
    );
    assert_eq!(cb.delivered, 0, "attach: a delivered key is not attached: {cb:?}");
    let c = claim_with(&*o, &b, 10, OWNER, LEASE, at(4)).await;
    assert_eq!(keys(&c), ["k2"], "attach: b's claim takes the attached key");
    assert_eq!(c.claims[0].origin().session(), "a", "attach: the origin stays a's");
    assert_eq!(
        counts(&*o, &Scope::session("a")).await.in_flight,
        1,
        "attach: still in a's scope"
    );
    assert!(claim_with(&*o, &Scope::session("c"), 10, OWNER, LEASE, at(5))
        .await
        .claims
        .is_empty());
    // Once final, an attached key stays in the scope of the session it was attached to.
    assert_eq!(
        record(&*o, "k2", c.claims[0].token(), Outcome::Delivered, at(6)).await,
        Recorded::Accepted(DeliveryStatus::Delivered)
    );
    let cb = counts(&*o, &b).await;
    assert_eq!(
        cb.delivered, 1,
        "attach: a delivered attached key stays in b's scope: {cb:?}"
    );
    assert_eq!(cb.total(), 1, "attach: {cb:?}");
}

/// Claims take only due intents, in the order they fell due, then registration order.
pub async fn claim_due_in_order(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("k1", "x"), ("k2", "x"), ("k3", "x"), ("k4", "x")], at(0))
        .await;
    let c = claim(&*o, 2, at(0)).await;
    assert_eq!(keys(&c), ["k1", "k2"], "order: registration order at one due time");
    let (t1, t2) = (c.claims[0].token(), c.claims[1].token());
    record(&*o, "k1", t1, failed(FailedAttempt::RetryAt(at(50))), at(1)).await;
    record(&*o, "k2", t2, Outcome::Released, at(5)).await;
    s.register("a", &[("k5", "x")], at(10)).await;
    s.register("a", &[("k6", "x")], at(100)).await;
    let c = claim(&*o, 10, at(49)).await;
    assert_eq!(
        keys(&c),
        ["k3", "k4", "k2", "k5"],
        "order: by due time, then registration; k1 not yet due, k6 not before t=100"
    );
    s.register("a", &[("k7", "x")], at(60)).await;
    let c = claim(&*o, 10, at(99)).await;
    assert_eq!(
        keys(&c),
        ["k1", "k7"],
        "order: the retry due at 50 before the intent registered at 60"
    );
    let c = claim(&*o, 10, at(100)).await;
    assert_eq!(
        keys(&c),
        ["k6"],
        "order: a pending intent is due at its registration time"
    );
}

/// A claim puts each intent in flight: token + 1, attempts + 1, the lease, no next attempt.
pub async fn claim_sets_token_attempts_lease(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("k1", "x")], at(0)).await;
    let c = claim_with(&*o, &Scope::all(), 5, "me", Duration::from_millis(700), at(10)).await;
    assert_eq!(c.claims.len(), 1);
    let d = &c.claims[0];
    assert_eq!(d.status(), DeliveryStatus::InFlight, "claim: status");
    assert_eq!(d.attempts(), 1, "claim: attempts");
    assert_eq!(d.intent().attempt(), 1, "claim: the intent's attempt");
    assert_eq!(d.token(), FenceToken(1), "claim: token");
    let lease = d.lease().expect("claim: a lease");
    assert_eq!(
        (&*lease.owner, lease.expires_at, lease.token),
        ("me", at(710), FenceToken(1)),
        "claim: lease"
    );
    assert_eq!(d.updated_at(), at(10), "claim: updated_at");
    assert_eq!(d.next_attempt_at(), None);
    let g = get(&*o, "k1").await;
    assert_eq!(
        (g.status(), g.token(), g.attempts(), g.lease()),
        (d.status(), d.token(), d.attempts(), d.lease()),
        "claim: get agrees"
    );
    record(&*o, "k1", d.token(), Outcome::Released, at(11)).await;
    let c = claim(&*o, 5, at(12)).await;
    let d = &c.claims[0];
    assert_eq!(
        (d.token(), d.attempts()),
        (FenceToken(2), 1),
        "claim: the token grows on every claim, a released attempt is uncounted"
    );
}

/// Claims respect their limit and scope (sessions, kinds); intents of other kinds stay
/// claimable.
pub async fn claim_limit_and_scope(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("a1", "x"), ("a2", "y"), ("a3", "x"), ("a4", "y")], at(0))
        .await;
    s.register("b", &[("b1", "x"), ("b2", "y")], at(0)).await;
    assert!(
        claim(&*o, 0, at(1)).await.claims.is_empty(),
        "scope: limit 0 claims nothing"
    );
    let ax = Scope::session("a").kinds(["x"]);
    let c = claim_with(&*o, &ax, 1, OWNER, LEASE, at(1)).await;
    assert_eq!(keys(&c), ["a1"], "scope: session a, kind x, limit 1");
    let c = claim_with(&*o, &ax, 10, OWNER, LEASE, at(1)).await;
    assert_eq!(keys(&c), ["a3"], "scope: session a, kind x");
    let c = claim_with(&*o, &Scope::all().kinds(["x"]), 10, OWNER, LEASE, at(1)).await;
    assert_eq!(keys(&c), ["b1"], "scope: kind x of any session");
    let c = claim_with(&*o, &Scope::sessions(Scope::all(), ["b", "a"]), 2, OWNER, LEASE, at(1)).await;
    assert_eq!(
        keys(&c),
        ["a2", "a4"],
        "scope: sessions a and b, registration order, limit 2"
    );
    let c = claim(&*o, 10, at(1)).await;
    assert_eq!(keys(&c), ["b2"], "scope: the rest stays claimable");
}

/// Eight concurrent claimers, seven at a time, over 500 intents: disjoint, and together
/// everything. Run it on a multi-threaded runtime to make the claims race.
pub async fn concurrent_claimers_are_disjoint(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    let names: Vec<String> = (0..500).map(|i| format!("k{i:03}")).collect();
    let keys_: Vec<(&str, &str)> = names.iter().map(|k| (k.as_str(), "x")).collect();
    s.register("a", &keys_, at(0)).await;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let o = o.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let c = claim_with(&*o, &Scope::all(), 7, &format!("claimer-{t}"), LEASE, at(1)).await;
                if c.claims.is_empty() {
                    break mine;
                }
                assert!(c.claims.len() <= 7, "concurrent: a claim exceeded its limit");
                mine.extend(c.claims.into_iter().map(|d| d.key().to_string()));
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut seen = HashSet::new();
    for task in tasks {
        for key in task.await.expect("a claimer panicked") {
            assert!(seen.insert(key.clone()), "concurrent: {key} claimed twice");
        }
    }
    assert_eq!(seen.len(), 500, "concurrent: every intent claimed");
}

/// Each outcome moves the intent as the trait documents, and ends the lease.
pub async fn record_outcomes(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    let ks = ["d", "r", "w", "x", "h", "i", "l"];
    let reg: Vec<(&str, &str)> = ks.iter().map(|k| (*k, "x")).collect();
    s.register("a", &reg, at(0)).await;
    let c = claim(&*o, 10, at(1)).await;
    assert_eq!(c.claims.len(), 7);
    let tok = FenceToken(1);
    let outcomes = [
        ("d", Outcome::Delivered, DeliveryStatus::Delivered),
        ("r", failed(FailedAttempt::RetryAt(at(90))), DeliveryStatus::Failed),
        ("w", failed(FailedAttempt::AwaitRetry), DeliveryStatus::Failed),
        ("x", failed(FailedAttempt::Dead), DeliveryStatus::Dead),
        (
            "h",
            Outcome::Held {
                reason: "no route".to_owned(),
            },
            DeliveryStatus::Held,
        ),
        (
            "i",
            Outcome::Interrupted {
                reason: "cut".to_owned(),
            },
            DeliveryStatus::Pending,
        ),
        ("l", Outcome::Released, DeliveryStatus::Pending),
    ];
    for (key, outcome, status) in outcomes {
        let got = record(&*o, key, tok, outcome, at(5)).await;
        assert_eq!(got, Recorded::Accepted(status), "record: {key}");
        let d = get(&*o, key).await;
        assert_eq!(d.status(), status, "record: status of {key}");
        assert!(d.lease().is_none(), "record: the lease of {key} ended");
        assert_eq!(d.updated_at(), at(5), "record: updated_at of {key}");
        assert_eq!(d.token(), tok, "record: the token of {key} unchanged");
        let (attempts, interrupted, error, next, delivered) = match key {
            "d" => (1, 0, None, None, Some(at(5))),
            "r" => (1, 0, Some("boom"), Some(at(90)), None),
            "w" | "x" => (1, 0, Some("boom"), None, None),
            "h" => (0, 0, Some("no route"), None, None),
            "i" => (1, 1, Some("cut"), None, None),
            _ => (0, 0, None, None, None),
        };
        assert_eq!(d.attempts(), attempts, "record: attempts of {key}");
        assert_eq!(d.interrupted_attempts(), interrupted, "record: interrupted of {key}");
        assert_eq!(d.last_error(), error, "record: last_error of {key}");
        assert_eq!(d.next_attempt_at(), next, "record: next_attempt_at of {key}");
        assert_eq!(d.delivered_at(), delivered, "record: delivered_at of {key}");
    }
    let c = claim(&*o, 10, at(5)).await;
    assert_eq!(keys(&c), ["i", "l"], "record: interrupted and released are due at once");
    let counts = counts(&*o, &Scope::all()).await;
    assert_eq!(
        (
            counts.failed,
            counts.retrying,
            counts.dead,
            counts.held,
            counts.delivered
        ),
        (2, 1, 1, 1, 1),
        "record: counts {counts:?}"
    );
}

/// An outcome under a token that does not hold the intent is `Stale`, and changes nothing.
pub async fn stale_token_changes_nothing(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("k1", "x")], at(0)).await;
    claim(&*o, 1, at(1)).await;
    let before = format!("{:?}", get(&*o, "k1").await);
    let got = record(&*o, "k1", FenceToken(2), Outcome::Delivered, at(2)).await;
    assert_eq!(
        got,
        Recorded::Stale {
            status: Some(DeliveryStatus::InFlight),
            token: FenceToken(1)
        },
        "stale: a wrong token"
    );
    assert_eq!(format!("{:?}", get(&*o, "k1").await), before, "stale: nothing changed");
    assert_eq!(
        record(&*o, "k1", FenceToken(1), Outcome::Delivered, at(3)).await,
        Recorded::Accepted(DeliveryStatus::Delivered)
    );
    let got = record(&*o, "k1", FenceToken(1), failed(FailedAttempt::Dead), at(4)).await;
    assert_eq!(
        got,
        Recorded::Stale {
            status: Some(DeliveryStatus::Delivered),
            token: FenceToken(1)
        },
        "stale: after the outcome"
    );
    assert_eq!(
        get(&*o, "k1").await.status(),
        DeliveryStatus::Delivered,
        "stale: delivered stays delivered"
    );
    let got = record(&*o, "nope", FenceToken(1), Outcome::Delivered, at(4)).await;
    assert_eq!(
        got,
        Recorded::Stale {
            status: None,
            token: FenceToken(0)
        },
        "stale: an unknown key"
    );
}

/// After a reclaim, the old token is stale even before anyone claims the intent again.
pub async fn reclaim_makes_old_token_stale(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("k1", "x")], at(0)).await;
    claim_with(&*o, &Scope::all(), 1, OWNER, Duration::from_millis(100), at(0)).await;
    let c = claim(&*o, 0, at(100)).await;
    assert_eq!(c.reclaimed, 1, "reclaim: a claim at the expiry reclaims");
    let d = get(&*o, "k1").await;
    assert_eq!(d.status(), DeliveryStatus::Pending, "reclaim: pending again");
    assert_eq!(
        (d.expired_leases(), d.token(), d.attempts()),
        (1, FenceToken(1), 1),
        "reclaim: expired, token and attempts"
    );
    assert!(d.lease().is_none(), "reclaim: lease cleared");
    assert_eq!(d.updated_at(), at(100), "reclaim: updated_at");
    let error = d.last_error().unwrap_or_default();
    assert!(
        error.contains(OWNER) && error.contains('1'),
        "reclaim: last_error names the attempt and owner: {error}"
    );
    let got = record(&*o, "k1", FenceToken(1), Outcome::Delivered, at(101)).await;
    assert_eq!(
        got,
        Recorded::Stale {
            status: Some(DeliveryStatus::Pending),
            token: FenceToken(1)
        },
        "reclaim: old token stale"
    );
    let renewed = o
        .renew(&[(ActionKey::from("k1"), FenceToken(1))], at(500))
        .await
        .expect("renew");
    assert_eq!(renewed, [false], "reclaim: the old holder cannot renew");
    let c = claim(&*o, 1, at(102)).await;
    assert_eq!(
        (keys(&c), c.claims[0].token()),
        (vec!["k1"], FenceToken(2)),
        "reclaim: claimed again with the next token"
    );
}

/// Only the holder renews; a renewed lease is not reclaimed before its new expiry.
pub async fn renew_only_for_holder(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("k1", "x"), ("k2", "x")], at(0)).await;
    claim_with(&*o, &Scope::all(), 1, OWNER, Duration::from_millis(100), at(0)).await;
    let held = [
        (ActionKey::from("k1"), FenceToken(1)),
        (ActionKey::from("k1"), FenceToken(7)),
        (ActionKey::from("k2"), FenceToken(0)),
        (ActionKey::from("nope"), FenceToken(1)),
    ];
    let renewed = o.renew(&held, at(500)).await.expect("renew");
    assert_eq!(renewed, [true, false, false, false], "renew: only the holder's token");
    assert_eq!(
        get(&*o, "k1").await.lease().map(|l| l.expires_at),
        Some(at(500)),
        "renew: the new expiry"
    );
    assert_eq!(
        claim(&*o, 0, at(100)).await.reclaimed,
        0,
        "renew: not reclaimed at the old expiry"
    );
    assert_eq!(
        claim(&*o, 0, at(499)).await.reclaimed,
        0,
        "renew: not reclaimed before the new expiry"
    );
    assert_eq!(
        claim(&*o, 0, at(500)).await.reclaimed,
        1,
        "renew: reclaimed at the new expiry"
    );
}

/// A lease expiring at `t` is reclaimed by a claim at `t`, not at `t − 1 ms`; the same claim
/// may take it again.
pub async fn reclaim_only_after_expiry(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("k1", "x")], at(0)).await;
    claim_with(&*o, &Scope::all(), 1, "old", Duration::from_millis(100), at(0)).await;
    let c = claim(&*o, 5, at(99)).await;
    assert_eq!(
        (c.reclaimed, c.claims.len()),
        (0, 0),
        "expiry: nothing reclaimed 1 ms early"
    );
    assert_eq!(get(&*o, "k1").await.status(), DeliveryStatus::InFlight);
    let c = claim(&*o, 5, at(100)).await;
    assert_eq!(c.reclaimed, 1, "expiry: reclaimed at the expiry");
    assert_eq!(keys(&c), ["k1"], "expiry: the reclaiming claim takes it");
    let d = &c.claims[0];
    assert_eq!((d.token(), d.attempts(), d.expired_leases()), (FenceToken(2), 2, 1));
    assert_eq!(d.lease().map(|l| &*l.owner), Some(OWNER));
}

async fn lease_owners(o: &dyn OutboxStore, scope: &Scope) -> Vec<String> {
    let mut owners: Vec<String> = o
        .lease_owners(scope)
        .await
        .unwrap_or_else(|e| panic!("lease_owners failed: {e}"))
        .iter()
        .map(ToString::to_string)
        .collect();
    owners.sort();
    owners
}

async fn take_over(o: &dyn OutboxStore, owner: &str, now: SystemTime) -> Vec<String> {
    o.take_over(owner, now)
        .await
        .unwrap_or_else(|e| panic!("take_over({owner}) failed: {e}"))
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// `lease_owners` lists each owner of a lease in flight in the scope once (by session, attached
/// session and kind), and forgets an owner whose claims all ended.
pub async fn lease_owners_by_scope(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    assert!(
        lease_owners(&*o, &Scope::all()).await.is_empty(),
        "owners: none in an empty store"
    );
    s.register("a", &[("a1", "x"), ("a2", "y"), ("a3", "x")], at(0)).await;
    s.register("b", &[("b1", "x")], at(0)).await;
    let by_x = Scope::session("a").kinds(["x"]);
    assert_eq!(keys(&claim_with(&*o, &by_x, 1, "da", LEASE, at(1)).await), ["a1"]);
    assert_eq!(
        keys(&claim_with(&*o, &Scope::session("b"), 1, "db", LEASE, at(1)).await),
        ["b1"]
    );
    let by_y = Scope::all().kinds(["y"]);
    assert_eq!(keys(&claim_with(&*o, &by_y, 1, "dy", LEASE, at(1)).await), ["a2"]);
    // A second claim of one owner, and a lease already expired (in flight until reclaimed).
    let short = Duration::from_millis(100);
    assert_eq!(keys(&claim_with(&*o, &by_x, 1, "da", short, at(2)).await), ["a3"]);
    assert_eq!(
        lease_owners(&*o, &Scope::all()).await,
        ["da", "db", "dy"],
        "owners: all"
    );
    assert_eq!(
        lease_owners(&*o, &Scope::session("a")).await,
        ["da", "dy"],
        "owners: session a"
    );
    assert_eq!(
        lease_owners(&*o, &Scope::session("b")).await,
        ["db"],
        "owners: session b"
    );
    assert_eq!(
        lease_owners(&*o, &Scope::all().kinds(["x"])).await,
        ["da", "db"],
        "owners: kind x"
    );
    assert!(
        lease_owners(&*o, &Scope::session("c")).await.is_empty(),
        "owners: a session without intents"
    );
    // b1, committed by `c` too, is attached to it.
    s.register("c", &[("b1", "x")], at(3)).await;
    assert_eq!(
        lease_owners(&*o, &Scope::session("c")).await,
        ["db"],
        "owners: attached"
    );
    // An owner whose claims all ended is no owner any more.
    for (key, outcome) in [("a1", Outcome::Delivered), ("a3", failed(FailedAttempt::AwaitRetry))] {
        let got = record(&*o, key, FenceToken(1), outcome, at(4)).await;
        assert!(matches!(got, Recorded::Accepted(_)), "owners: record {key}: {got:?}");
    }
    assert_eq!(
        lease_owners(&*o, &Scope::session("a")).await,
        ["dy"],
        "owners: da's claims ended"
    );
    assert_eq!(
        lease_owners(&*o, &Scope::all()).await,
        ["db", "dy"],
        "owners: all, after"
    );
}

/// `take_over` puts every claim of a dead owner back to pending at once, as an expired lease is
/// reclaimed (whatever its lease's expiry and its scope), never a claim of another owner; a
/// second take-over takes nothing; the dead owner's late outcome and renewal are stale.
pub async fn take_over_dead_owner(h: &dyn ContractHarness) {
    const DEAD: &str = "pid 41 started 1700000000000000000 on web-1 boot 8c50d1c77560491f ns 4026531836:4026531834 \
                        ticks 208231 drainer 1";
    const LIVE: &str = "pid 42 started 1700000000000000001 on web-1 boot 8c50d1c77560491f ns 4026531836:4026531834 \
                        ticks 208299";
    let hour = Duration::from_secs(3600);
    let (mut s, o) = fresh(h).await;
    s.register(
        "a",
        &[("k1", "x"), ("k2", "x"), ("k3", "x"), ("k4", "x"), ("k5", "x")],
        at(0),
    )
    .await;
    s.register("b", &[("k6", "y")], at(0)).await;
    assert_eq!(
        keys(&claim_with(&*o, &Scope::session("a"), 2, DEAD, hour, at(1)).await),
        ["k1", "k2"]
    );
    assert_eq!(
        keys(&claim_with(&*o, &Scope::session("a"), 1, LIVE, hour, at(2)).await),
        ["k3"]
    );
    assert_eq!(
        keys(&claim_with(&*o, &Scope::session("a"), 1, DEAD, hour, at(3)).await),
        ["k4"]
    );
    let got = record(&*o, "k4", FenceToken(1), Outcome::Delivered, at(4)).await;
    assert_eq!(got, Recorded::Accepted(DeliveryStatus::Delivered));
    // Another scope's claim of the dead owner, whose lease has already expired.
    assert_eq!(
        keys(&claim_with(&*o, &Scope::session("b"), 1, DEAD, Duration::from_millis(2), at(5)).await),
        ["k6"]
    );
    assert_eq!(
        lease_owners(&*o, &Scope::all()).await,
        [DEAD, LIVE],
        "take over: owners before"
    );

    let taken = take_over(&*o, DEAD, at(10)).await;
    assert_eq!(
        taken,
        ["k1", "k2", "k6"],
        "take over: every claim of the owner, in registration order"
    );
    for (key, claimed) in [("k1", 1), ("k2", 1), ("k6", 5)] {
        let d = get(&*o, key).await;
        assert_eq!(d.status(), DeliveryStatus::Pending, "take over: {key} pending again");
        assert_eq!(
            (d.expired_leases(), d.token(), d.attempts(), d.failed_attempts()),
            (1, FenceToken(1), 1, 0),
            "take over: {key} counted as an expired lease, not a failure"
        );
        assert!(d.lease().is_none(), "take over: {key}'s lease cleared");
        assert_eq!(d.updated_at(), at(10), "take over: {key}'s updated_at");
        assert_eq!(d.next_attempt_at(), None, "take over: {key} due at once");
        let error = d.last_error().unwrap_or_default();
        assert!(
            error.contains(DEAD) && error.contains('1'),
            "take over: {key}'s last_error names the attempt and owner: {error}"
        );
        let history = attempts(&*o, key).await;
        let last = history.last().expect("take over: an attempt in the history");
        assert_eq!(
            (last.token, &*last.owner, last.claimed_at, last.ended_at, &last.outcome),
            (FenceToken(1), DEAD, at(claimed), Some(at(10)), &AttemptOutcome::Expired),
            "take over: {key}'s attempt ended as expired"
        );
    }
    // The live owner's claim, and what the dead owner finished, are as they were.
    let k3 = get(&*o, "k3").await;
    assert_eq!(
        k3.status(),
        DeliveryStatus::InFlight,
        "take over: a live owner's claim is never taken"
    );
    assert_eq!(
        k3.lease().map(|l| (&*l.owner, l.token, l.expires_at)),
        Some((LIVE, FenceToken(1), at(2) + hour)),
        "take over: the live owner's lease"
    );
    assert_eq!(
        get(&*o, "k4").await.status(),
        DeliveryStatus::Delivered,
        "take over: delivered stays"
    );
    assert_eq!(
        lease_owners(&*o, &Scope::all()).await,
        [LIVE],
        "take over: owners after"
    );
    let c = counts(&*o, &Scope::all()).await;
    assert_eq!(
        (c.pending, c.in_flight, c.delivered),
        (4, 1, 1),
        "take over: counts (k1, k2, k5, k6 pending; k3 in flight; k4 delivered)"
    );

    // A second take-over, and one of an owner holding nothing, take nothing.
    assert!(
        take_over(&*o, DEAD, at(11)).await.is_empty(),
        "take over: a second takes nothing"
    );
    assert!(
        take_over(&*o, "nobody", at(11)).await.is_empty(),
        "take over: an unknown owner"
    );
    assert_eq!(
        get(&*o, "k1").await.updated_at(),
        at(10),
        "take over: a second changed k1"
    );
    assert_eq!(get(&*o, "k3").await.status(), DeliveryStatus::InFlight);

    // The dead owner's late outcome and renewal are stale.
    let got = record(&*o, "k1", FenceToken(1), Outcome::Delivered, at(12)).await;
    assert_eq!(
        got,
        Recorded::Stale {
            status: Some(DeliveryStatus::Pending),
            token: FenceToken(1)
        },
        "take over: the dead owner's outcome is stale"
    );
    let renewed = o
        .renew(&[(ActionKey::from("k2"), FenceToken(1))], at(500))
        .await
        .expect("renew");
    assert_eq!(renewed, [false], "take over: the dead owner cannot renew");

    // Due at once: the next claim takes them, in due order (k5 was due first), with new tokens.
    let c = claim_with(&*o, &Scope::all(), 10, "drainer-2", LEASE, at(13)).await;
    assert_eq!(keys(&c), ["k5", "k1", "k2", "k6"], "take over: claimed again at once");
    assert_eq!(c.reclaimed, 0, "take over: nothing left to reclaim");
    let k1 = &c.claims[1];
    assert_eq!(
        (k1.token(), k1.attempts()),
        (FenceToken(2), 2),
        "take over: k1 claimed again"
    );
    let got = record(&*o, "k1", FenceToken(1), Outcome::Delivered, at(14)).await;
    assert_eq!(
        got,
        Recorded::Stale {
            status: Some(DeliveryStatus::InFlight),
            token: FenceToken(2)
        },
        "take over: the dead owner's outcome stays stale once claimed again"
    );
    let got = record(&*o, "k1", FenceToken(2), Outcome::Delivered, at(15)).await;
    assert_eq!(
        got,
        Recorded::Accepted(DeliveryStatus::Delivered),
        "take over: the new holder records"
    );
}

/// A failed intent with a retry at `t` is not claimable before `t`, and is at `t`; retry
/// times are kept rounded up to the millisecond.
pub async fn retry_at_not_before(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("k1", "x"), ("k2", "x")], at(0)).await;
    claim(&*o, 2, at(1)).await;
    record(
        &*o,
        "k1",
        FenceToken(1),
        failed(FailedAttempt::RetryAt(at(200))),
        at(10),
    )
    .await;
    let sub = at(300) + Duration::from_micros(500);
    record(&*o, "k2", FenceToken(1), failed(FailedAttempt::RetryAt(sub)), at(10)).await;
    assert_eq!(
        get(&*o, "k2").await.next_attempt_at(),
        Some(at(301)),
        "retry_at: rounded up to the millisecond"
    );
    assert!(
        claim(&*o, 5, at(199)).await.claims.is_empty(),
        "retry_at: not claimable before"
    );
    assert_eq!(
        keys(&claim(&*o, 5, at(200)).await),
        ["k1"],
        "retry_at: claimable at its time"
    );
    assert!(
        claim(&*o, 5, at(300)).await.claims.is_empty(),
        "retry_at: not early for a sub-millisecond time"
    );
    let c = claim(&*o, 5, at(301)).await;
    assert_eq!(keys(&c), ["k2"]);
    assert_eq!(
        c.claims[0].next_attempt_at(),
        None,
        "retry_at: a claim clears next_attempt_at"
    );
}

/// An intent with a `not_before` is registered pending but not due until then: never claimed
/// earlier, `next_due` names its time, its entry says it; a time already passed is due at
/// once; re-registering the key with another time changes nothing; approved before its time,
/// it stays due at its time; it can be cancelled before it falls due.
pub async fn scheduled_waits_for_not_before(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register_intents(
        scheduled_intents("a", next_generation(), &[("later", "x")], at(1000), false),
        at(0),
    )
    .await;
    s.register("a", &[("now", "x")], at(0)).await;
    s.register_intents(
        scheduled_intents("a", next_generation(), &[("ask", "x")], at(500), true),
        at(0),
    )
    .await;
    s.register_intents(
        scheduled_intents("a", next_generation(), &[("gone", "x")], at(800), false),
        at(0),
    )
    .await;
    let d = get(&*o, "later").await;
    assert_eq!(
        (d.status(), d.not_before()),
        (DeliveryStatus::Pending, Some(at(1000))),
        "scheduled: pending, with its time"
    );
    assert_eq!(
        get(&*o, "now").await.not_before(),
        None,
        "scheduled: a plain intent has none"
    );
    // Another branch (or a retry) acts the key again with another time: the first stands.
    s.register_intents(
        scheduled_intents("b", next_generation(), &[("later", "x")], at(5000), false),
        at(10),
    )
    .await;
    assert_eq!(
        get(&*o, "later").await.not_before(),
        Some(at(1000)),
        "scheduled: the first time stands"
    );
    assert_eq!(
        keys(&claim(&*o, 10, at(1)).await),
        ["now"],
        "scheduled: only the plain intent is due"
    );
    assert_eq!(
        o.next_due(&Scope::all()).await.expect("next_due"),
        Some(at(800)),
        "scheduled: next_due names the earliest time"
    );
    let cancelled = o
        .cancel("gone", "not wanted", at(2))
        .await
        .expect("cancellable before its time");
    assert_eq!(cancelled.status(), DeliveryStatus::Cancelled);
    o.approve("ask", "ada", at(100)).await.expect("approve");
    assert!(
        claim(&*o, 10, at(499)).await.claims.is_empty(),
        "scheduled: approved before its time, not due before it"
    );
    assert_eq!(
        keys(&claim(&*o, 10, at(500)).await),
        ["ask"],
        "scheduled: approved, due at its time"
    );
    assert!(
        claim(&*o, 10, at(999)).await.claims.is_empty(),
        "scheduled: not claimable before its time"
    );
    let c = claim(&*o, 10, at(1000)).await;
    assert_eq!(keys(&c), ["later"], "scheduled: claimable at its time");
    assert_eq!(
        c.claims[0].not_before(),
        Some(at(1000)),
        "scheduled: the claim carries its time"
    );
    // A time already passed at registration: due at once.
    s.register_intents(
        scheduled_intents("a", next_generation(), &[("past", "x")], at(0), false),
        at(2000),
    )
    .await;
    assert_eq!(
        keys(&claim(&*o, 10, at(2000)).await),
        ["past"],
        "scheduled: a past time is due at once"
    );
}

/// Registers `keys` of `group` as one commit of session `a` at `now`.
async fn register_group(
    s: &mut Box<dyn ContractStore>,
    keys: &[(&str, &str)],
    group: &str,
    approval: bool,
    now: SystemTime,
) {
    s.register_intents(grouped_intents("a", next_generation(), keys, group, approval), now)
        .await;
}

/// The intents of one ordering group are handed out one at a time, in registration order:
/// those behind the first open one are blocked (not due, never claimed, counted apart, not
/// in `next_due`), across commits; a retry scheduled for the head keeps them blocked; the
/// head delivered, the next is pending and due at once; a blocked intent can be cancelled
/// (skipped); a group with no open intent takes a new one as its head; other groups and
/// intents without one are not held up.
pub async fn group_in_order_one_at_a_time(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    register_group(&mut s, &[("k1", "x"), ("k2", "x")], "g", false, at(0)).await;
    register_group(&mut s, &[("k3", "y")], "g", false, at(0)).await;
    s.register("a", &[("u", "x")], at(0)).await;
    register_group(&mut s, &[("o1", "x")], "other", false, at(0)).await;
    let k2 = get(&*o, "k2").await;
    assert_eq!(
        (k2.status(), k2.group(), k2.lease().is_none()),
        (DeliveryStatus::Blocked, Some("g"), true),
        "group: behind its head, blocked"
    );
    assert!(!DeliveryStatus::Blocked.is_final(), "group: blocked is not final");
    let c = counts(&*o, &Scope::all()).await;
    assert_eq!(
        (c.pending, c.blocked, c.waiting(), c.total()),
        (3, 2, 3, 5),
        "group: counts"
    );
    let first = claim(&*o, 10, at(1)).await;
    assert_eq!(keys(&first), ["k1", "u", "o1"], "group: only the heads are claimed");
    assert_eq!(
        o.next_due(&Scope::all()).await.expect("next_due"),
        Some(at(1) + LEASE),
        "group: blocked intents are never due (what is next is the leases' expiry)"
    );
    record(
        &*o,
        "k1",
        FenceToken(1),
        failed(FailedAttempt::RetryAt(at(100))),
        at(10),
    )
    .await;
    assert_eq!(
        get(&*o, "k2").await.status(),
        DeliveryStatus::Blocked,
        "group: a failed head still blocks"
    );
    assert_eq!(
        keys(&claim(&*o, 10, at(100)).await),
        ["k1"],
        "group: the head is retried first"
    );
    record(&*o, "k1", FenceToken(2), Outcome::Delivered, at(110)).await;
    let k2 = get(&*o, "k2").await;
    assert_eq!(
        (k2.status(), get(&*o, "k3").await.status()),
        (DeliveryStatus::Pending, DeliveryStatus::Blocked),
        "group: the head delivered, the next is pending, the rest blocked"
    );
    assert_eq!(
        o.next_due(&Scope::all()).await.expect("next_due"),
        Some(at(110)),
        "group: the next is due when the head became final"
    );
    let cancelled = o
        .cancel("k3", "skip it", at(111))
        .await
        .expect("a blocked intent is cancellable");
    assert_eq!(cancelled.status(), DeliveryStatus::Cancelled);
    assert_eq!(
        keys(&claim(&*o, 10, at(111)).await),
        ["k2"],
        "group: the next is claimed"
    );
    record(&*o, "k2", FenceToken(1), Outcome::Delivered, at(120)).await;
    register_group(&mut s, &[("k4", "x")], "g", false, at(130)).await;
    assert_eq!(
        get(&*o, "k4").await.status(),
        DeliveryStatus::Pending,
        "group: with nothing open, a new intent is its group's head"
    );
    // Acting a key of the group again (another branch, a retry) changes nothing.
    register_group(&mut s, &[("k4", "x"), ("k5", "x")], "g", false, at(140)).await;
    assert_eq!(
        get(&*o, "k5").await.status(),
        DeliveryStatus::Blocked,
        "group: behind k4"
    );
    assert_eq!(keys(&claim(&*o, 10, at(140)).await), ["k4"]);
}

/// A dead head blocks its group until an operator acts: retried, it goes out first and then
/// the next; cancelled, the next is released.
pub async fn group_dead_head_blocks(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    register_group(&mut s, &[("d1", "x"), ("d2", "x"), ("d3", "x")], "g", false, at(0)).await;
    claim(&*o, 10, at(1)).await;
    record(&*o, "d1", FenceToken(1), failed(FailedAttempt::Dead), at(2)).await;
    assert_eq!(get(&*o, "d1").await.status(), DeliveryStatus::Dead);
    assert!(
        claim(&*o, 10, at(3)).await.claims.is_empty(),
        "group: a dead head blocks its group"
    );
    assert_eq!(get(&*o, "d2").await.status(), DeliveryStatus::Blocked);
    o.retry("d1", at(4)).await.expect("retry");
    assert_eq!(
        keys(&claim(&*o, 10, at(4)).await),
        ["d1"],
        "group: the retried head goes first"
    );
    record(&*o, "d1", FenceToken(2), failed(FailedAttempt::Dead), at(5)).await;
    o.cancel("d1", "give up", at(6)).await.expect("cancel");
    assert_eq!(
        keys(&claim(&*o, 10, at(6)).await),
        ["d2"],
        "group: the head cancelled, the next goes"
    );
    assert!(
        matches!(o.retry("d3", at(7)).await, Err(RetryError::NotFailed { .. })),
        "group: a blocked intent is not retried"
    );
}

/// Approvals in a group: a head awaiting approval blocks the group; approving a blocked
/// intent is refused (it does not await approval yet); a rejected head releases the next; a
/// released intent that asks for approval awaits it.
pub async fn group_with_approvals(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    register_group(&mut s, &[("ask1", "x")], "g", true, at(0)).await;
    register_group(&mut s, &[("plain", "x")], "g", false, at(0)).await;
    register_group(&mut s, &[("ask2", "x")], "g", true, at(0)).await;
    assert_eq!(get(&*o, "ask1").await.status(), DeliveryStatus::AwaitingApproval);
    assert!(
        matches!(
            o.approve("plain", "ada", at(1)).await,
            Err(ApprovalError::NotAwaiting { .. })
        ),
        "group: a blocked intent does not await approval yet"
    );
    assert!(
        claim(&*o, 10, at(1)).await.claims.is_empty(),
        "group: an awaiting head blocks"
    );
    o.reject("ask1", "ada", "not now", at(2)).await.expect("reject");
    assert_eq!(
        keys(&claim(&*o, 10, at(2)).await),
        ["plain"],
        "group: a rejected head releases the next"
    );
    record(&*o, "plain", FenceToken(1), Outcome::Delivered, at(3)).await;
    let ask2 = get(&*o, "ask2").await;
    assert_eq!(
        ask2.status(),
        DeliveryStatus::AwaitingApproval,
        "group: released, it awaits its approval"
    );
    o.approve("ask2", "ada", at(4)).await.expect("approve");
    assert_eq!(keys(&claim(&*o, 10, at(4)).await), ["ask2"]);
}

/// With turns, a claim of several sessions takes the earliest due intent of each before the
/// rest: one session's backlog delays another's intent by at most one claim. Claims come in
/// due order. A claim scoped by kind, or without turns, takes due order alone.
pub async fn sessions_take_turns(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    let turns = ClaimPolicy {
        turns: true,
        ..ClaimPolicy::default()
    };
    let backlog: Vec<String> = (0..30).map(|i| format!("big{i:02}")).collect();
    let backlog: Vec<(&str, &str)> = backlog.iter().map(|k| (k.as_str(), "x")).collect();
    s.register("big", &backlog, at(0)).await;
    s.register("small", &[("small1", "x")], at(5)).await;
    s.register("other", &[("other1", "x"), ("other2", "x")], at(6)).await;
    let plain = claim(&*o, 2, at(10)).await;
    assert_eq!(keys(&plain), ["big00", "big01"], "without turns: due order");
    let c = claim_by(&*o, &Scope::all(), 5, &turns, at(10)).await;
    assert_eq!(
        keys(&c),
        ["big02", "big03", "big04", "small1", "other1"],
        "a turn for each session, then due order; handed out in due order"
    );
    let c = claim_by(&*o, &Scope::all().sessions(["other", "big"]), 3, &turns, at(10)).await;
    assert_eq!(
        keys(&c),
        ["big05", "big06", "other2"],
        "the sessions of the scope take turns"
    );
    let c = claim_by(&*o, &Scope::all().kinds(["x"]), 3, &turns, at(10)).await;
    assert_eq!(keys(&c), ["big07", "big08", "big09"], "a kind's claim: due order");
    // More sessions wait than a claim takes: which take a turn is drawn for each claim, so
    // that none waits long (the chance that one of two sessions is drawn in none of 40
    // claims of one is 2^-39).
    let more: Vec<String> = (0..40).map(|i| format!("small{i:02}")).collect();
    let more: Vec<(&str, &str)> = more.iter().map(|k| (k.as_str(), "x")).collect();
    s.register("small", &more, at(11)).await;
    let mut taken = Vec::new();
    for _ in 0..40 {
        let c = claim_by(&*o, &Scope::all(), 1, &turns, at(11)).await;
        taken.extend(keys(&c).iter().map(|k| k[..3].to_owned()));
    }
    assert!(
        taken.iter().any(|k| k == "big") && taken.iter().any(|k| k == "sma"),
        "two sessions wait, claims of one: both take turns: {taken:?}"
    );
}

/// Records every claim of `claimed` delivered at `now`.
async fn delivered(o: &dyn OutboxStore, claimed: &Claimed, now: SystemTime) {
    let recordings: Vec<Recording> = claimed
        .claims
        .iter()
        .map(|d| Recording {
            key: d.key().clone(),
            token: d.token(),
            outcome: Outcome::Delivered,
        })
        .collect();
    o.record(&recordings, now).await.expect("record");
}

/// A claim of up to `limit` under `policy`.
async fn claim_by(o: &dyn OutboxStore, scope: &Scope, limit: usize, policy: &ClaimPolicy, now: SystemTime) -> Claimed {
    claim_under(o, scope, limit, OWNER, LEASE, policy, now).await
}

/// A claim of up to 100 that spends from `rates`.
async fn claim_rated(o: &dyn OutboxStore, scope: &Scope, rates: &[RateBucket], now: SystemTime) -> Claimed {
    let policy = ClaimPolicy {
        rates: rates.to_vec(),
        ..ClaimPolicy::default()
    };
    claim_by(o, scope, 100, &policy, now).await
}

/// Kinds of a higher priority are claimed before those of a lower one, whenever they fell
/// due; due order among equals; a rate limit still holds its kind back; the turns of
/// sessions (each session's earliest due intent) come first. Claims are handed out in due
/// order.
pub async fn priorities_order_claims(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("bulk1", "bulk"), ("bulk2", "bulk"), ("bulk3", "bulk")], at(0))
        .await;
    s.register("a", &[("plain1", "plain")], at(1)).await;
    s.register("a", &[("urgent1", "urgent"), ("urgent2", "urgent")], at(2))
        .await;
    let policy = ClaimPolicy {
        priorities: vec![(Arc::from("urgent"), 10), (Arc::from("bulk"), -1)],
        ..ClaimPolicy::default()
    };
    let a = Scope::session("a");
    let c = claim_by(&*o, &a, 2, &policy, at(10)).await;
    assert_eq!(
        keys(&c),
        ["urgent1", "urgent2"],
        "the higher priority first, though later due"
    );
    let c = claim_by(&*o, &a, 2, &policy, at(10)).await;
    assert_eq!(
        keys(&c),
        ["bulk1", "plain1"],
        "priority 0 before -1; handed out in due order"
    );
    // A rate limit holds the urgent kind back: the others fill the claim.
    s.register("a", &[("urgent3", "urgent"), ("urgent4", "urgent")], at(11))
        .await;
    let limited = ClaimPolicy {
        rates: vec![bucket("urgent", &["urgent"], RateLimit::per_second(1))],
        ..policy.clone()
    };
    let c = claim_by(&*o, &a, 2, &limited, at(12)).await;
    assert_eq!(
        keys(&c),
        ["bulk2", "urgent3"],
        "one urgent, as the limit allows, then bulk"
    );
    // Sessions take turns before priorities: a turn is the session's earliest due intent.
    s.register("b", &[("b-bulk", "bulk")], at(13)).await;
    let turns = ClaimPolicy { turns: true, ..policy };
    let c = claim_by(&*o, &Scope::all(), 2, &turns, at(14)).await;
    assert_eq!(
        keys(&c),
        ["bulk3", "b-bulk"],
        "a's turn and b's, before a's urgent intent"
    );
    let c = claim_by(&*o, &Scope::all(), 2, &turns, at(14)).await;
    assert_eq!(keys(&c), ["urgent4"]);
}

fn bucket(name: &str, kinds: &[&str], limit: RateLimit) -> RateBucket {
    RateBucket {
        name: Arc::from(name),
        kinds: kinds.iter().map(|&k| Arc::from(k)).collect(),
        limit,
    }
}

/// A rate limit's bucket is the store's: each claim takes at most what it allows, in claim
/// order, spends it, and says when it allows more; other kinds are not held back.
pub async fn rate_limit_spends_across_claims(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    let mail: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    let mail: Vec<(&str, &str)> = mail.iter().map(|k| (k.as_str(), "mail")).collect();
    s.register("a", &mail, at(0)).await;
    s.register("a", &[("o1", "other"), ("o2", "other")], at(0)).await;
    // 2 per second, 3 at once: one every 500 ms.
    let rates = [bucket("mail", &["mail"], RateLimit::per_second(2).burst(3))];

    let c = claim_rated(&*o, &Scope::all(), &rates, at(0)).await;
    assert_eq!(
        keys(&c),
        ["m0", "m1", "m2", "o1", "o2"],
        "the burst of the limited kind, and every other"
    );
    assert_eq!(c.throttled, Some(at(500)), "the bucket allows one more at 500 ms");
    delivered(&*o, &c, at(1)).await;
    let c = claim_rated(&*o, &Scope::all(), &rates, at(499)).await;
    assert!(c.claims.is_empty(), "nothing before the bucket refills: {:?}", keys(&c));
    assert_eq!(c.throttled, Some(at(500)));
    let c = claim_rated(&*o, &Scope::all(), &rates, at(500)).await;
    assert_eq!(keys(&c), ["m3"], "one at the steady rate");
    delivered(&*o, &c, at(500)).await;
    let c = claim_rated(&*o, &Scope::all().kinds(["mail"]), &rates, at(1_200)).await;
    assert_eq!(
        keys(&c),
        ["m4"],
        "a claim scoped to the kind spends from the same bucket"
    );
    assert_eq!(c.throttled, Some(at(1_500)));
    delivered(&*o, &c, at(1_200)).await;
    let c = claim_rated(&*o, &Scope::session("a"), &rates, at(60_000)).await;
    assert_eq!(
        keys(&c),
        ["m5", "m6", "m7"],
        "a quiet spell refills no more than the burst"
    );
    delivered(&*o, &c, at(60_000)).await;

    // Without the bucket the kind is not limited (the limit is the claimer's).
    let c = claim(&*o, 100, at(60_000)).await;
    assert_eq!(keys(&c), ["m8", "m9"]);
    delivered(&*o, &c, at(60_000)).await;
    // A bucket that did not run out throttles nothing.
    let c = claim_rated(&*o, &Scope::all(), &rates, at(600_000)).await;
    assert!(c.claims.is_empty());
    assert_eq!(
        c.throttled, None,
        "a full bucket with nothing to take throttles nothing"
    );
}

/// Kinds that share a bucket spend from it together; a pause holds every kind of its bucket
/// back until it ends, and a shorter pause does not end a longer one.
pub async fn rate_limit_shared_and_paused(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register(
        "a",
        &[("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b"), ("c1", "c")],
        at(0),
    )
    .await;
    let rates = [
        bucket("provider", &["a", "b"], RateLimit::per_second(1).burst(2)),
        bucket("other", &["c"], RateLimit::per_second(1)),
    ];
    let c = claim_rated(&*o, &Scope::all(), &rates, at(0)).await;
    assert_eq!(keys(&c), ["a1", "b1", "c1"], "two of the shared bucket, in claim order");

    o.pause("provider", at(5_000)).await.expect("pause");
    o.pause("provider", at(2_000)).await.expect("a shorter pause");
    let states = o.rate_states().await.expect("rate states");
    let names: Vec<&str> = states.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        ["other", "provider"],
        "every bucket spent from or paused, by name"
    );
    assert_eq!(states[1].1.paused_until, micros(at(5_000)), "the longer pause stands");
    let c = claim_rated(&*o, &Scope::all(), &rates, at(4_999)).await;
    assert!(c.claims.is_empty(), "paused: {:?}", keys(&c));
    assert_eq!(c.throttled, Some(at(5_000)), "the pause says when it ends");
    let c = claim_rated(&*o, &Scope::all(), &rates, at(5_000)).await;
    assert_eq!(keys(&c), ["a2", "b2"], "the pause over, the bucket allows its burst");
    // A pause of a bucket no claim has spent from yet.
    s.register("a", &[("c2", "c")], at(5_000)).await;
    o.pause("other", at(9_000)).await.expect("pause");
    assert!(claim_rated(&*o, &Scope::all(), &rates, at(8_000))
        .await
        .claims
        .is_empty());
    assert_eq!(keys(&claim_rated(&*o, &Scope::all(), &rates, at(9_000)).await), ["c2"]);
}

/// An intent that requires approval is registered awaiting it: not due, never claimed (by any
/// scope, at any time), not counted as waiting, and no lease expiry or reclaim touches it.
/// Approved, it is pending and due at once, claimed once, delivered once.
pub async fn approval_awaits_and_is_never_claimed(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register_awaiting("a", &[("ask", "x"), ("ask2", "y")], at(0)).await;
    s.register("a", &[("plain", "x")], at(0)).await;
    let d = get(&*o, "ask").await;
    assert_eq!(
        (d.status(), d.attempts(), d.token(), d.decision(), d.lease().is_none()),
        (DeliveryStatus::AwaitingApproval, 0, FenceToken(0), None, true),
        "approval: registered awaiting approval"
    );
    assert!(!d.status().is_final(), "approval: awaiting approval is not final");
    let c = counts(&*o, &Scope::all()).await;
    assert_eq!(
        (c.awaiting_approval, c.pending, c.waiting(), c.total()),
        (2, 1, 1, 3),
        "approval: counts"
    );
    assert_eq!(
        o.next_due(&Scope::session("a").kinds(["y"])).await.expect("next_due"),
        None,
        "approval: an awaiting intent is never due"
    );
    for scope in [Scope::all(), Scope::session("a"), Scope::all().kinds(["x", "y"])] {
        let got = claim_with(&*o, &scope, 10, OWNER, LEASE, at(u64::from(u32::MAX))).await;
        assert!(
            got.claims.iter().all(|d| d.key().as_str() == "plain"),
            "approval: an awaiting intent is never claimed ({scope:?}): {:?}",
            keys(&got)
        );
    }
    // Re-registering (a retry, another branch) attaches, never re-arms.
    s.register_awaiting("b", &[("ask", "x")], at(5)).await;
    s.register("b", &[("ask2", "y")], at(5)).await;
    assert_eq!(get(&*o, "ask").await.status(), DeliveryStatus::AwaitingApproval);
    assert_eq!(get(&*o, "ask2").await.status(), DeliveryStatus::AwaitingApproval);
    assert_eq!(
        counts(&*o, &Scope::session("b")).await.awaiting_approval,
        2,
        "approval: a re-registering session is attached"
    );
    assert!(claim(&*o, 10, at(10_000_000)).await.claims.is_empty());
    let approved = o.approve("ask", "ada", at(20)).await.expect("approve");
    assert_eq!(
        (approved.status(), approved.updated_at(), approved.attempts()),
        (DeliveryStatus::Pending, at(20), 0),
        "approve: pending, due at once"
    );
    let decision = approved.decision().expect("approve: the decision is kept");
    assert_eq!(
        (
            decision.verdict,
            decision.by.as_str(),
            decision.at,
            decision.reason.as_deref()
        ),
        (Verdict::Approved, "ada", at(20), None),
        "approve: who and when"
    );
    assert_eq!(
        o.next_due(&Scope::all()).await.expect("next_due"),
        Some(at(20)),
        "approve: due at the approval"
    );
    let c = claim(&*o, 10, at(20)).await;
    assert_eq!(keys(&c), ["ask"], "approve: claimed once approved");
    assert_eq!(c.claims[0].decision().map(|d| d.verdict), Some(Verdict::Approved));
    record(&*o, "ask", FenceToken(1), Outcome::Delivered, at(21)).await;
    let d = get(&*o, "ask").await;
    assert_eq!(d.status(), DeliveryStatus::Delivered);
    assert_eq!(
        d.decision().map(|d| (d.verdict, d.by.clone())),
        Some((Verdict::Approved, "ada".to_owned())),
        "approve: the decision outlives the delivery"
    );
    assert!(claim(&*o, 10, at(100_000)).await.claims.is_empty(), "delivered once");
}

/// An approval and a rejection each record the action hash of the intent they were made on
/// ([`Decision::digest`](reactifact_core::ledger::Decision::digest)), kept with the entry; the
/// approved intent is claimed with it.
pub async fn decision_bound_to_digest(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    let intents = approval_intents("a", next_generation(), &[("bound", "x"), ("bound2", "x")]);
    let hashes: Vec<ContentHash> = intents.iter().map(|n| n.action_hash).collect();
    s.register_intents(intents, at(0)).await;
    let approved = o.approve("bound", "ada", at(10)).await.expect("approve");
    let rejected = o.reject("bound2", "bob", "no", at(10)).await.expect("reject");
    assert_eq!(
        (
            approved.decision().and_then(|d| d.digest),
            rejected.decision().and_then(|d| d.digest)
        ),
        (Some(hashes[0]), Some(hashes[1])),
        "decision: bound to the action hash decided on"
    );
    assert_eq!(
        get(&*o, "bound").await.decision().and_then(|d| d.digest),
        Some(hashes[0]),
        "decision: the digest is kept"
    );
    // Approving again changes nothing, the digest included.
    let again = o.approve("bound", "someone", at(20)).await.expect("approve again");
    assert_eq!(again.decision(), approved.decision(), "decision: the first stands");
    let got = claim(&*o, 10, at(30)).await;
    assert_eq!(keys(&got), ["bound"], "decision: the approved bytes are claimed");
    assert_eq!(
        got.claims[0].decision().and_then(|d| d.digest),
        Some(hashes[0]),
        "decision: claimed with its digest"
    );
}

/// What approve and reject accept and refuse.
pub async fn approve_reject_legality(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register_awaiting("a", &[("yes", "x"), ("no", "x"), ("gone", "x"), ("anon", "x")], at(0))
        .await;
    s.register("a", &[("plain", "x")], at(0)).await;
    assert!(
        matches!(o.approve("nope", "ada", at(1)).await, Err(ApprovalError::UnknownKey(_))),
        "approve: unknown key"
    );
    assert!(
        matches!(
            o.reject("nope", "ada", "r", at(1)).await,
            Err(ApprovalError::UnknownKey(_))
        ),
        "reject: unknown key"
    );
    match o.approve("plain", "ada", at(1)).await {
        Err(ApprovalError::NotAwaiting {
            status: DeliveryStatus::Pending,
            ..
        }) => {}
        other => panic!("approve: an intent that asked for no approval must be NotAwaiting, got {other:?}"),
    }
    match o.reject("plain", "ada", "r", at(1)).await {
        Err(ApprovalError::NotAwaiting { .. }) => {}
        other => panic!("reject: an intent that asked for no approval must be NotAwaiting, got {other:?}"),
    }
    assert!(
        matches!(o.approve("anon", "", at(1)).await, Err(ApprovalError::NoDecider { .. })),
        "approve: an empty name is refused"
    );
    assert_eq!(get(&*o, "anon").await.status(), DeliveryStatus::AwaitingApproval);
    // The name is checked before the intent's state: an empty one is refused whatever that is.
    assert!(
        matches!(
            o.approve("plain", "", at(1)).await,
            Err(ApprovalError::NoDecider { .. })
        ),
        "approve: an empty name is refused before NotAwaiting"
    );
    // Retry does not approve.
    match o.retry("anon", at(1)).await {
        Err(RetryError::NotFailed {
            status: DeliveryStatus::AwaitingApproval,
            ..
        }) => {}
        other => panic!("retry: an awaiting intent must be NotFailed, got {other:?}"),
    }
    o.approve("yes", "ada", at(2)).await.expect("approve");
    let again = o.approve("yes", "bob", at(3)).await.expect("approve again is Ok");
    assert_eq!(
        (again.decision().map(|d| d.by.as_str()), again.updated_at()),
        (Some("ada"), at(2)),
        "approve: approving again changes nothing"
    );
    assert!(
        matches!(o.approve("yes", "", at(3)).await, Err(ApprovalError::NoDecider { .. })),
        "approve: approving again with an empty name is refused"
    );
    assert!(
        matches!(
            o.reject("yes", "", "late", at(3)).await,
            Err(ApprovalError::NoDecider { .. })
        ),
        "reject: an empty name is refused before AlreadyDecided"
    );
    assert_eq!(
        get(&*o, "yes").await.decision().map(|d| (d.by.as_str(), d.at)),
        Some(("ada", at(2))),
        "approve: a refused repeat changes nothing"
    );
    match o.reject("yes", "bob", "late", at(3)).await {
        Err(ApprovalError::AlreadyDecided {
            verdict: Verdict::Approved,
            by,
            ..
        }) => assert_eq!(by, "ada"),
        other => panic!("reject: an approved intent must be AlreadyDecided, got {other:?}"),
    }
    let rejected = o.reject("no", "bob", "too risky", at(4)).await.expect("reject");
    assert_eq!(
        (rejected.status(), rejected.updated_at()),
        (DeliveryStatus::Rejected, at(4)),
        "reject: rejected"
    );
    assert_eq!(
        rejected
            .decision()
            .map(|d| (d.verdict, d.by.as_str(), d.at, d.reason.as_deref())),
        Some((Verdict::Rejected, "bob", at(4), Some("too risky"))),
        "reject: who, when and why"
    );
    let again = o
        .reject("no", "carol", "other", at(5))
        .await
        .expect("reject again is Ok");
    assert_eq!(
        again.decision().map(|d| (d.by.as_str(), d.reason.as_deref())),
        Some(("bob", Some("too risky"))),
        "reject: rejecting again changes nothing"
    );
    assert!(
        matches!(
            o.reject("no", "", "other", at(5)).await,
            Err(ApprovalError::NoDecider { .. })
        ),
        "reject: rejecting again with an empty name is refused"
    );
    match o.approve("no", "carol", at(5)).await {
        Err(ApprovalError::AlreadyDecided {
            verdict: Verdict::Rejected,
            ..
        }) => {}
        other => panic!("approve: a rejected intent must be AlreadyDecided, got {other:?}"),
    }
    match o.retry("no", at(5)).await {
        Err(RetryError::NotFailed {
            status: DeliveryStatus::Rejected,
            ..
        }) => {}
        other => panic!("retry: a rejected intent must be NotFailed, got {other:?}"),
    }
    match o.cancel("no", "why", at(5)).await {
        Err(CancelError::NotCancellable {
            status: DeliveryStatus::Rejected,
            ..
        }) => {}
        other => panic!("cancel: a rejected intent must be NotCancellable, got {other:?}"),
    }
    // An awaiting intent can be cancelled; then it is neither approved nor rejected.
    let cancelled = o
        .cancel("gone", "withdrawn", at(6))
        .await
        .expect("cancel an awaiting intent");
    assert_eq!(cancelled.status(), DeliveryStatus::Cancelled);
    match o.approve("gone", "ada", at(7)).await {
        Err(ApprovalError::NotAwaiting {
            status: DeliveryStatus::Cancelled,
            ..
        }) => {}
        other => panic!("approve: a cancelled intent must be NotAwaiting, got {other:?}"),
    }
    let c = claim(&*o, 10, at(1_000_000)).await;
    assert_eq!(
        keys(&c),
        ["plain", "yes"],
        "only approved and plain intents are claimed (in due order)"
    );
    let counts = counts(&*o, &Scope::all()).await;
    assert_eq!(
        (
            counts.rejected,
            counts.awaiting_approval,
            counts.cancelled,
            counts.in_flight
        ),
        (1, 1, 1, 2),
        "counts after decisions"
    );
    let page = o
        .list(&LedgerQuery {
            status: Some(DeliveryStatus::AwaitingApproval),
            ..LedgerQuery::default()
        })
        .await
        .expect("list");
    assert_eq!(
        page.entries.iter().map(|d| d.key().as_str()).collect::<Vec<_>>(),
        ["anon"],
        "list by awaiting approval"
    );
    let page = o
        .list(&LedgerQuery {
            status: Some(DeliveryStatus::Rejected),
            ..LedgerQuery::default()
        })
        .await
        .expect("list");
    assert_eq!(
        page.entries.iter().map(|d| d.key().as_str()).collect::<Vec<_>>(),
        ["no"],
        "list by rejected"
    );
}

/// A rejected intent is final: never claimed, re-registering it changes nothing, and a purge
/// of final (or of rejected) entries deletes it and remembers the key.
pub async fn rejected_is_final_and_purged(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register_awaiting("a", &[("r1", "x"), ("r2", "x")], at(0)).await;
    s.register("a", &[("c", "x"), ("d", "x")], at(0)).await;
    o.reject("r1", "ada", "no", at(1)).await.expect("reject");
    o.reject("r2", "ada", "no", at(5)).await.expect("reject");
    o.cancel("c", "why", at(2)).await.expect("cancel");
    let c = claim(&*o, 10, at(3)).await;
    assert_eq!(keys(&c), ["d"]);
    record(&*o, "d", FenceToken(1), Outcome::Delivered, at(3)).await;
    s.register("b", &[("r1", "x")], at(4)).await;
    assert_eq!(
        counts(&*o, &Scope::session("b")).await.total(),
        0,
        "a rejected key is never attached again"
    );
    assert!(claim(&*o, 10, at(1_000_000)).await.claims.is_empty());
    assert_eq!(
        o.purge(PurgeFilter::Cancelled, at(100), 10).await.expect("purge"),
        1,
        "a purge of cancelled rows leaves rejected ones"
    );
    assert_eq!(
        o.purge(PurgeFilter::Rejected, at(3), 10).await.expect("purge"),
        1,
        "a purge of rejected rows: only those old enough"
    );
    assert!(o.get("r1").await.expect("get").is_none());
    assert_eq!(get(&*o, "d").await.status(), DeliveryStatus::Delivered);
    assert_eq!(
        o.purge(PurgeFilter::Final, at(100), 10).await.expect("purge"),
        2,
        "a purge of final rows takes rejected and delivered ones"
    );
    s.register_awaiting("a", &[("r2", "x")], at(200)).await;
    assert!(
        o.get("r2").await.expect("get").is_none(),
        "a purged key is never registered again"
    );
}

/// What an operator's retry and cancel accept and refuse.
pub async fn retry_cancel_legality(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register(
        "a",
        &[
            ("p", "x"),
            ("f", "x"),
            ("d", "x"),
            ("h", "x"),
            ("ok", "x"),
            ("fly", "x"),
        ],
        at(0),
    )
    .await;
    claim(&*o, 6, at(1)).await;
    record(&*o, "p", FenceToken(1), Outcome::Released, at(2)).await;
    record(&*o, "f", FenceToken(1), failed(FailedAttempt::RetryAt(at(1000))), at(2)).await;
    record(&*o, "d", FenceToken(1), failed(FailedAttempt::Dead), at(2)).await;
    record(&*o, "h", FenceToken(1), Outcome::Held { reason: "r".to_owned() }, at(2)).await;
    record(&*o, "ok", FenceToken(1), Outcome::Delivered, at(2)).await;
    assert!(
        matches!(o.retry("nope", at(3)).await, Err(RetryError::UnknownKey(_))),
        "retry: unknown key"
    );
    for (key, status) in [
        ("p", DeliveryStatus::Pending),
        ("ok", DeliveryStatus::Delivered),
        ("fly", DeliveryStatus::InFlight),
    ] {
        match o.retry(key, at(3)).await {
            Err(RetryError::NotFailed { status: got, .. }) => assert_eq!(got, status, "retry: {key}"),
            other => panic!("retry: {key} ({status}) must be NotFailed, got {other:?}"),
        }
    }
    for key in ["f", "d", "h"] {
        let d = o
            .retry(key, at(4))
            .await
            .unwrap_or_else(|e| panic!("retry: {key}: {e}"));
        assert_eq!(
            (d.status(), d.next_attempt_at(), d.updated_at()),
            (DeliveryStatus::Pending, None, at(4)),
            "retry: {key} re-armed"
        );
    }
    assert_eq!(
        keys(&claim(&*o, 10, at(4)).await),
        ["p", "f", "d", "h"],
        "retry: re-armed intents are due at once"
    );
    for (key, outcome) in [
        ("p", Outcome::Released),
        ("f", failed(FailedAttempt::AwaitRetry)),
        ("d", failed(FailedAttempt::Dead)),
    ] {
        record(&*o, key, FenceToken(2), outcome, at(5)).await;
    }
    assert!(
        matches!(o.cancel("nope", "why", at(6)).await, Err(CancelError::UnknownKey(_))),
        "cancel: unknown key"
    );
    for (key, status) in [
        ("ok", DeliveryStatus::Delivered),
        ("fly", DeliveryStatus::InFlight),
        ("h", DeliveryStatus::InFlight),
    ] {
        match o.cancel(key, "why", at(6)).await {
            Err(CancelError::NotCancellable { status: got, .. }) => assert_eq!(got, status, "cancel: {key}"),
            other => panic!("cancel: {key} ({status}) must be NotCancellable, got {other:?}"),
        }
    }
    for key in ["p", "f", "d"] {
        let d = o
            .cancel(key, "why", at(7))
            .await
            .unwrap_or_else(|e| panic!("cancel: {key}: {e}"));
        assert_eq!(
            (d.status(), d.cancel_reason(), d.updated_at()),
            (DeliveryStatus::Cancelled, Some("why"), at(7)),
            "cancel: {key}"
        );
    }
    let again = o
        .cancel("p", "other", at(8))
        .await
        .expect("cancel: a cancelled intent again is Ok");
    assert_eq!(
        (again.cancel_reason(), again.updated_at()),
        (Some("why"), at(7)),
        "cancel: cancelling again changes nothing"
    );
    match o.retry("p", at(9)).await {
        Err(RetryError::NotFailed {
            status: DeliveryStatus::Cancelled,
            ..
        }) => {}
        other => panic!("retry: a cancelled intent must be NotFailed, got {other:?}"),
    }
    assert!(
        claim(&*o, 10, at(2000)).await.claims.is_empty(),
        "cancel: cancelled intents are never claimed"
    );
}

/// Purge deletes only final entries last changed before the cutoff, oldest first, at most
/// `limit`; a purged key registered again stays absent.
pub async fn purge_rules(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register(
        "a",
        &[("k1", "x"), ("k2", "x"), ("k3", "x"), ("k4", "x"), ("k5", "x")],
        at(0),
    )
    .await;
    claim(&*o, 5, at(1)).await;
    record(&*o, "k2", FenceToken(1), Outcome::Delivered, at(20)).await;
    record(&*o, "k1", FenceToken(1), Outcome::Delivered, at(10)).await;
    record(&*o, "k3", FenceToken(1), Outcome::Released, at(2)).await;
    o.cancel("k3", "no", at(30)).await.expect("cancel");
    record(&*o, "k4", FenceToken(1), Outcome::Released, at(3)).await;
    record(&*o, "k5", FenceToken(1), failed(FailedAttempt::Dead), at(4)).await;
    assert_eq!(
        o.purge(PurgeFilter::Final, at(10), 10).await.expect("purge"),
        0,
        "purge: strictly before the cutoff"
    );
    assert_eq!(
        o.purge(PurgeFilter::Final, at(100), 1).await.expect("purge"),
        1,
        "purge: at most limit"
    );
    assert!(
        o.get("k1").await.expect("get").is_none(),
        "purge: oldest first (k1, changed at 10)"
    );
    assert!(o.get("k2").await.expect("get").is_some(), "purge: k2 is newer");
    assert_eq!(
        o.purge(PurgeFilter::Final, at(100), 10).await.expect("purge"),
        2,
        "purge: the other final ones"
    );
    for key in ["k4", "k5"] {
        assert!(o.get(key).await.expect("get").is_some(), "purge: {key} is not final");
    }
    s.register("b", &[("k1", "x"), ("k3", "x")], at(200)).await;
    assert!(
        o.get("k1").await.expect("get").is_none(),
        "purge: a purged key is not registered again"
    );
    let all = counts(&*o, &Scope::all()).await;
    assert_eq!(
        (all.total(), all.delivered, all.cancelled),
        (2, 0, 0),
        "purge: counts {all:?}"
    );
    assert_eq!(
        keys(&claim(&*o, 10, at(201)).await),
        ["k4"],
        "purge: nothing purged is claimed"
    );
}

/// A purge for delivered entries leaves cancelled ones, and the other way round; both are
/// taken oldest first.
pub async fn purge_by_status(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("d1", "x"), ("c1", "x"), ("d2", "x"), ("c2", "x")], at(0))
        .await;
    claim(&*o, 2, at(1)).await; // d1, c1
    record(&*o, "d1", FenceToken(1), Outcome::Delivered, at(10)).await;
    record(&*o, "c1", FenceToken(1), Outcome::Released, at(10)).await;
    o.cancel("c1", "no", at(11)).await.expect("cancel");
    o.cancel("c2", "no", at(12)).await.expect("cancel");
    claim(&*o, 1, at(13)).await; // d2
    record(&*o, "d2", FenceToken(1), Outcome::Delivered, at(14)).await;
    let present = |o: Arc<dyn OutboxStore>| async move {
        let mut left = Vec::new();
        for key in ["d1", "c1", "d2", "c2"] {
            if o.get(key).await.expect("get").is_some() {
                left.push(key);
            }
        }
        left
    };
    assert_eq!(
        o.purge(PurgeFilter::Cancelled, at(100), 1).await.expect("purge"),
        1,
        "purge cancelled: at most limit"
    );
    assert_eq!(
        present(o.clone()).await,
        ["d1", "d2", "c2"],
        "purge cancelled: the oldest cancelled one"
    );
    assert_eq!(
        o.purge(PurgeFilter::Delivered, at(14), 10).await.expect("purge"),
        1,
        "purge delivered: strictly before the cutoff"
    );
    assert_eq!(
        present(o.clone()).await,
        ["d2", "c2"],
        "purge delivered: only delivered ones"
    );
    assert_eq!(o.purge(PurgeFilter::Delivered, at(100), 10).await.expect("purge"), 1);
    assert_eq!(
        present(o.clone()).await,
        ["c2"],
        "purge delivered: never a cancelled one"
    );
    assert_eq!(o.purge(PurgeFilter::Final, at(100), 10).await.expect("purge"), 1);
    assert!(present(o.clone()).await.is_empty());
    s.register("b", &[("c1", "x"), ("d1", "x")], at(200)).await;
    assert!(
        present(o.clone()).await.is_empty(),
        "purge: a purged key is not registered again"
    );
}

async fn attempts(o: &dyn OutboxStore, key: &str) -> Vec<Attempt> {
    o.attempts(key)
        .await
        .unwrap_or_else(|e| panic!("attempts({key}) failed: {e}"))
        .unwrap_or_else(|| panic!("attempts({key}): the store does not hold the key"))
}

/// Every attempt is in the history, in token order, with its owner, claim time, lease and
/// outcome; a released claim is not an attempt; purge takes the history with the entry.
pub async fn attempt_history(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    s.register("a", &[("k", "x")], at(0)).await;
    assert!(
        attempts(&*o, "k").await.is_empty(),
        "history: none before the first claim"
    );
    assert!(
        o.attempts("nope").await.expect("attempts").is_none(),
        "history: unknown key"
    );
    let lease = Duration::from_millis(100);
    let claim_as = |owner: &'static str, now: u64| {
        let o = o.clone();
        async move { claim_with(&*o, &Scope::all(), 1, owner, lease, at(now)).await }
    };
    // 1: released (not an attempt). 2: failed with a retry. 3: renewed, then expired.
    // 4: interrupted. 5: in flight, then delivered.
    assert_eq!(keys(&claim_as("d1", 1).await), ["k"]);
    record(&*o, "k", FenceToken(1), Outcome::Released, at(2)).await;
    assert!(
        attempts(&*o, "k").await.is_empty(),
        "history: a released claim is not an attempt"
    );
    claim_as("d1", 3).await;
    record(&*o, "k", FenceToken(2), failed(FailedAttempt::RetryAt(at(10))), at(4)).await;
    claim_as("d2", 10).await;
    assert_eq!(
        o.renew(&[(ActionKey::from("k"), FenceToken(3))], at(300))
            .await
            .expect("renew"),
        [true]
    );
    let c = claim_as("d3", 300).await;
    assert_eq!(c.reclaimed, 1, "history: the renewed lease expired at 300");
    assert_eq!(keys(&c), ["k"]);
    record(
        &*o,
        "k",
        FenceToken(4),
        Outcome::Interrupted {
            reason: "cut".to_owned(),
        },
        at(301),
    )
    .await;
    claim_as("d4", 302).await;
    let attempt = |token: u64, number: u32, owner: &str, claimed: u64, until: u64, ended: Option<u64>, outcome| {
        Attempt::new(
            FenceToken(token),
            number,
            Arc::from(owner),
            at(claimed),
            at(until),
            ended.map(at),
            outcome,
        )
    };
    let mut expected = vec![
        attempt(
            2,
            1,
            "d1",
            3,
            103,
            Some(4),
            AttemptOutcome::Failed {
                error: "boom".to_owned(),
                retry_at: Some(at(10)),
            },
        ),
        attempt(3, 2, "d2", 10, 300, Some(300), AttemptOutcome::Expired),
        attempt(
            4,
            3,
            "d3",
            300,
            400,
            Some(301),
            AttemptOutcome::Interrupted {
                reason: "cut".to_owned(),
            },
        ),
        attempt(5, 4, "d4", 302, 402, None, AttemptOutcome::InFlight),
    ];
    assert_eq!(
        attempts(&*o, "k").await,
        expected,
        "history: ended attempts, then the one in flight"
    );
    record(&*o, "k", FenceToken(5), Outcome::Delivered, at(350)).await;
    expected[3] = attempt(5, 4, "d4", 302, 402, Some(350), AttemptOutcome::Delivered);
    assert_eq!(
        attempts(&*o, "k").await,
        expected,
        "history: the delivered attempt last"
    );
    // Held (uncounted: the next attempt has the same number), then dead.
    s.register("a", &[("h", "x")], at(399)).await;
    claim_as("d1", 400).await;
    record(
        &*o,
        "h",
        FenceToken(1),
        Outcome::Held {
            reason: "no route".to_owned(),
        },
        at(401),
    )
    .await;
    o.retry("h", at(402)).await.expect("retry");
    claim_as("d2", 403).await;
    record(&*o, "h", FenceToken(2), failed(FailedAttempt::Dead), at(404)).await;
    assert_eq!(
        attempts(&*o, "h").await,
        [
            attempt(
                1,
                1,
                "d1",
                400,
                500,
                Some(401),
                AttemptOutcome::Held {
                    reason: "no route".to_owned()
                }
            ),
            attempt(
                2,
                1,
                "d2",
                403,
                503,
                Some(404),
                AttemptOutcome::Dead {
                    error: "boom".to_owned()
                }
            ),
        ],
        "history: held, then dead"
    );
    o.cancel("h", "gave up", at(405)).await.expect("cancel");
    assert_eq!(attempts(&*o, "h").await.len(), 2, "history: a cancel is not an attempt");
    assert_eq!(o.purge(PurgeFilter::Final, at(1000), 10).await.expect("purge"), 2);
    for key in ["k", "h"] {
        assert!(
            o.attempts(key).await.expect("attempts").is_none(),
            "history: purged with {key}"
        );
    }
}

/// Counts, `next_due` and pages.
pub async fn queries(h: &dyn ContractHarness) {
    let (mut s, o) = fresh(h).await;
    assert_eq!(
        o.next_due(&Scope::all()).await.expect("next_due"),
        None,
        "next_due: empty store"
    );
    s.register("a", &[("a1", "x"), ("a2", "y"), ("a3", "x")], at(5)).await;
    s.register("b", &[("b1", "x"), ("b2", "y")], at(7)).await;
    assert_eq!(
        o.next_due(&Scope::all()).await.expect("next_due"),
        Some(at(5)),
        "next_due: the earliest pending"
    );
    assert_eq!(
        o.next_due(&Scope::session("b")).await.expect("next_due"),
        Some(at(7)),
        "next_due: b's"
    );
    let c = claim_with(&*o, &Scope::session("a"), 10, OWNER, Duration::from_millis(100), at(10)).await;
    assert_eq!(c.claims.len(), 3);
    record(&*o, "a1", FenceToken(1), failed(FailedAttempt::RetryAt(at(50))), at(11)).await;
    assert_eq!(
        o.next_due(&Scope::session("a")).await.expect("next_due"),
        Some(at(50)),
        "next_due: a retry before a lease"
    );
    record(&*o, "a1", FenceToken(1), Outcome::Delivered, at(12)).await; // stale: no change
    o.cancel("a1", "no", at(12)).await.expect("cancel");
    assert_eq!(
        o.next_due(&Scope::session("a")).await.expect("next_due"),
        Some(at(110)),
        "next_due: the lease expiry"
    );
    assert_eq!(
        o.next_due(&Scope::all().kinds(["y"])).await.expect("next_due"),
        Some(at(7)),
        "next_due: kind y"
    );
    let a = counts(&*o, &Scope::session("a")).await;
    assert_eq!(
        (a.in_flight, a.cancelled, a.pending, a.total()),
        (2, 1, 0, 3),
        "counts: a {a:?}"
    );
    let x = counts(&*o, &Scope::all().kinds(["x"])).await;
    assert_eq!((x.in_flight, x.cancelled, x.pending), (1, 1, 1), "counts: kind x {x:?}");
    let bx = counts(&*o, &Scope::session("b").kinds(["x"])).await;
    assert_eq!(bx.total(), 1, "counts: b and x {bx:?}");
    assert_eq!(
        counts(&*o, &Scope::session("zz")).await.total(),
        0,
        "counts: an unknown session"
    );
    // Pages of two, in registration order.
    let mut query = LedgerQuery {
        limit: 2,
        ..LedgerQuery::default()
    };
    let mut seen = Vec::new();
    loop {
        let page = o.list(&query).await.expect("list");
        assert!(page.entries.len() <= 2, "list: a page exceeded its limit");
        seen.extend(page.entries.iter().map(|d| d.key().to_string()));
        match page.next {
            Some(next) => query.after = Some(next),
            None => break,
        }
    }
    assert_eq!(
        seen,
        ["a1", "a2", "a3", "b1", "b2"],
        "list: every entry once, in registration order"
    );
    // A limit of 0 is taken as 1: the page moves the cursor on.
    let page = o
        .list(&LedgerQuery {
            limit: 0,
            ..LedgerQuery::default()
        })
        .await
        .expect("list");
    let listed: Vec<&str> = page.entries.iter().map(|d| d.key().as_str()).collect();
    assert_eq!(listed, ["a1"], "list: a limit of 0 is taken as 1");
    assert!(page.next.is_some(), "list: a page of limit 0 has a next page");
    let query = LedgerQuery {
        scope: Scope::all().kinds(["y"]),
        status: Some(DeliveryStatus::Pending),
        ..LedgerQuery::default()
    };
    let page = o.list(&query).await.expect("list");
    let listed: Vec<&str> = page.entries.iter().map(|d| d.key().as_str()).collect();
    assert_eq!((listed, page.next), (vec!["b2"], None), "list: by kind and status");
}

// ---- the differential test ----

/// A tiny xorshift generator, so the differential test needs no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The reference model's entry: everything in whole milliseconds after [`at`]`(0)`.
#[derive(Clone, Debug)]
struct Model {
    key: String,
    kind: String,
    owner: String,
    members: Vec<String>,
    status: DeliveryStatus,
    attempts: u32,
    last_error: Option<String>,
    /// `last_error` is the reclaim sentence naming this owner (compared loosely).
    reclaimed_from: Option<String>,
    recorded: u64,
    updated: u64,
    delivered: Option<u64>,
    lease: Option<(String, u64)>,
    expired: u32,
    interrupted: u32,
    next: Option<u64>,
    token: u64,
    cancel: Option<String>,
    due: Option<u64>,
    purged: bool,
    /// The last claim (owner, claimed at, lease until as last renewed), kept after it ended.
    claim: Option<(String, u64, u64)>,
    /// The attempts that ended other than delivered.
    history: Vec<Attempt>,
    /// Registered awaiting approval.
    approval: bool,
    /// The operator's decision: verdict, by, at, reason.
    decision: Option<(Verdict, String, u64, Option<String>)>,
}

impl Model {
    /// Ends the attempt in flight at `now` with `outcome`, in the history.
    fn end_attempt(&mut self, now: u64, outcome: AttemptOutcome) {
        let (owner, claimed, until) = self.claim.clone().expect("a claim in flight");
        self.history.push(Attempt::new(
            FenceToken(self.token),
            self.attempts,
            Arc::from(owner),
            at(claimed),
            at(until),
            Some(at(now)),
            outcome,
        ));
    }

    /// What `attempts` returns: the history, then the last claim if it is in flight or was
    /// delivered.
    fn attempts(&self) -> Vec<Attempt> {
        let mut attempts = self.history.clone();
        let last = match self.status {
            DeliveryStatus::InFlight => Some((None, AttemptOutcome::InFlight)),
            DeliveryStatus::Delivered => Some((self.delivered.map(at), AttemptOutcome::Delivered)),
            _ => None,
        };
        if let (Some((ended_at, outcome)), Some((owner, claimed, until))) = (last, &self.claim) {
            attempts.push(Attempt::new(
                FenceToken(self.token),
                self.attempts,
                Arc::from(owner.as_str()),
                at(*claimed),
                at(*until),
                ended_at,
                outcome,
            ));
        }
        attempts
    }

    fn in_scope(&self, scope: &Scope) -> bool {
        let sessions = std::iter::once(self.owner.as_str()).chain(self.members.iter().map(String::as_str));
        scope.admits(&self.kind, sessions)
    }

    fn set(&mut self, status: DeliveryStatus, now: u64) {
        self.status = status;
        self.updated = now;
        self.due = match status {
            DeliveryStatus::Pending => Some(now),
            DeliveryStatus::Failed => self.next,
            _ => None,
        };
    }
}

fn check_entry(d: &Delivery, m: &Model, step: usize) {
    let what = format!("differential step {step}, key {}", m.key);
    assert_eq!(d.status(), m.status, "{what}: status");
    assert_eq!(d.kind(), m.kind, "{what}: kind");
    assert_eq!(d.origin().session(), m.owner, "{what}: owner");
    assert_eq!(d.attempts(), m.attempts, "{what}: attempts");
    assert_eq!(d.token(), FenceToken(m.token), "{what}: token");
    assert_eq!(ms(d.recorded_at()), m.recorded, "{what}: recorded_at");
    assert_eq!(ms(d.updated_at()), m.updated, "{what}: updated_at");
    assert_eq!(d.delivered_at().map(ms), m.delivered, "{what}: delivered_at");
    assert_eq!(d.next_attempt_at().map(ms), m.next, "{what}: next_attempt_at");
    assert_eq!(d.expired_leases(), m.expired, "{what}: expired_leases");
    assert_eq!(d.interrupted_attempts(), m.interrupted, "{what}: interrupted");
    assert_eq!(d.cancel_reason(), m.cancel.as_deref(), "{what}: cancel_reason");
    assert_eq!(
        d.decision()
            .map(|x| (x.verdict, x.by.clone(), ms(x.at), x.reason.clone())),
        m.decision,
        "{what}: decision"
    );
    let lease = d.lease().map(|l| (l.owner.to_string(), ms(l.expires_at), l.token));
    assert_eq!(
        lease,
        m.lease.as_ref().map(|(o, e)| (o.clone(), *e, FenceToken(m.token))),
        "{what}: lease"
    );
    match &m.reclaimed_from {
        Some(owner) => {
            let error = d.last_error().unwrap_or_default();
            assert!(
                error.contains(owner.as_str()),
                "{what}: reclaim error names {owner}: {error}"
            );
        }
        None => assert_eq!(d.last_error(), m.last_error.as_deref(), "{what}: last_error"),
    }
}

fn model_counts(model: &[Model], scope: &Scope) -> StatusCounts {
    let mut c = StatusCounts::default();
    for m in model.iter().filter(|m| !m.purged && m.in_scope(scope)) {
        match m.status {
            DeliveryStatus::Pending => c.pending += 1,
            DeliveryStatus::InFlight => c.in_flight += 1,
            DeliveryStatus::Delivered => c.delivered += 1,
            DeliveryStatus::Failed => {
                c.failed += 1;
                c.retrying += u64::from(m.next.is_some());
            }
            DeliveryStatus::Dead => c.dead += 1,
            DeliveryStatus::Held => c.held += 1,
            DeliveryStatus::Cancelled => c.cancelled += 1,
            DeliveryStatus::AwaitingApproval => c.awaiting_approval += 1,
            DeliveryStatus::Rejected => c.rejected += 1,
            other => panic!("the model holds a status it does not know: {other:?}"),
        }
    }
    c
}

fn model_next_due(model: &[Model], scope: &Scope) -> Option<u64> {
    model
        .iter()
        .filter(|m| !m.purged && m.in_scope(scope))
        .filter_map(|m| m.due.or(m.lease.as_ref().map(|l| l.1)))
        .min()
}

/// Random operation sequences (seeded) against the store and a trivially correct model (a
/// vector scanned for every operation), comparing every result and, after each step, every
/// entry, the counts and `next_due` of several scopes, and a full listing.
pub async fn differential(h: &dyn ContractHarness, seed: u64, steps: usize) {
    let (mut s, o) = fresh(h).await;
    let mut rng = Rng(seed | 1);
    let mut model: Vec<Model> = Vec::new();
    let mut now = 0u64;
    let sessions = ["a", "b", "c"];
    let owners = ["d1", "d2"];
    let key_names: Vec<String> = (0..24).map(|i| format!("k{i:02}")).collect();
    let kind_of = |i: usize| if i % 3 == 0 { "y" } else { "x" };
    let scopes = [
        Scope::all(),
        Scope::session("a"),
        Scope::session("b"),
        Scope::all().kinds(["x"]),
        Scope::session("c").kinds(["y"]),
        Scope::all().sessions(["a", "c"]),
    ];
    for step in 0..steps {
        now += rng.below(4);
        match rng.below(12) {
            0 | 1 => {
                let session = sessions[rng.below(3) as usize];
                let n = 1 + rng.below(4) as usize;
                let picked: Vec<usize> = (0..n).map(|_| rng.below(key_names.len() as u64) as usize).collect();
                let reg: Vec<(&str, &str)> = picked.iter().map(|&i| (key_names[i].as_str(), kind_of(i))).collect();
                let approval = rng.below(3) == 0;
                if approval {
                    s.register_awaiting(session, &reg, at(now)).await;
                } else {
                    s.register(session, &reg, at(now)).await;
                }
                for &(key, kind) in &reg {
                    match model.iter_mut().find(|m| m.key == key) {
                        Some(m) => {
                            if !m.purged
                                && !m.status.is_final()
                                && m.owner != session
                                && !m.members.iter().any(|x| x == session)
                            {
                                m.members.push(session.to_owned());
                            }
                        }
                        None => model.push(Model {
                            key: key.to_owned(),
                            kind: kind.to_owned(),
                            owner: session.to_owned(),
                            members: Vec::new(),
                            status: if approval {
                                DeliveryStatus::AwaitingApproval
                            } else {
                                DeliveryStatus::Pending
                            },
                            attempts: 0,
                            last_error: None,
                            reclaimed_from: None,
                            recorded: now,
                            updated: now,
                            delivered: None,
                            lease: None,
                            expired: 0,
                            interrupted: 0,
                            next: None,
                            token: 0,
                            cancel: None,
                            due: (!approval).then_some(now),
                            purged: false,
                            claim: None,
                            history: Vec::new(),
                            approval,
                            decision: None,
                        }),
                    }
                }
            }
            2 | 3 => {
                let scope = &scopes[rng.below(scopes.len() as u64) as usize];
                let limit = rng.below(5) as usize;
                let owner = owners[rng.below(2) as usize];
                let lease = 1 + rng.below(12);
                // Half the claims let sessions take turns.
                let policy = ClaimPolicy {
                    turns: rng.below(2) == 0,
                    ..ClaimPolicy::default()
                };
                let request_turns = policy.turns;
                let got = claim_under(&*o, scope, limit, owner, Duration::from_millis(lease), &policy, at(now)).await;
                let mut reclaimed = 0;
                for m in model.iter_mut().filter(|m| !m.purged) {
                    if m.status == DeliveryStatus::InFlight && m.lease.as_ref().is_some_and(|l| l.1 <= now) {
                        m.end_attempt(now, AttemptOutcome::Expired);
                        let (old, _) = m.lease.take().expect("in flight");
                        m.expired += 1;
                        m.reclaimed_from = Some(old);
                        m.set(DeliveryStatus::Pending, now);
                        reclaimed += 1;
                    }
                }
                assert_eq!(got.reclaimed, reclaimed, "differential step {step}: reclaimed");
                let mut due: Vec<(u64, usize)> = model
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| !m.purged && m.in_scope(scope) && m.due.is_some_and(|d| d <= now))
                    .map(|(i, m)| (m.due.expect("due"), i))
                    .collect();
                due.sort();
                // Sessions take turns: the earliest due intent each session registered, then
                // the rest in due order; which sessions get a turn when more wait than the
                // limit is the store's draw.
                let turns = request_turns
                    && scope.kind_filter().is_none()
                    && scope.session_filter().is_none_or(|s| s.len() > 1);
                let heads: Vec<(u64, usize)> = match turns {
                    true => sessions
                        .iter()
                        .filter(|s| scope.session_filter().is_none_or(|f| f.iter().any(|x| &**x == **s)))
                        .filter_map(|s| due.iter().find(|&&(_, i)| model[i].owner == *s).copied())
                        .collect(),
                    false => Vec::new(),
                };
                if heads.len() > limit {
                    let got_keys = keys(&got);
                    due = heads
                        .into_iter()
                        .filter(|&(_, i)| got_keys.contains(&model[i].key.as_str()))
                        .collect();
                    assert_eq!(
                        due.len(),
                        limit,
                        "differential step {step}: a turn each for {limit} sessions: {got_keys:?}"
                    );
                } else {
                    let rest = due
                        .iter()
                        .filter(|d| !heads.contains(d))
                        .copied()
                        .take(limit - heads.len());
                    due = heads.iter().copied().chain(rest).collect();
                }
                due.sort();
                let expected: Vec<&str> = due.iter().map(|&(_, i)| model[i].key.as_str()).collect();
                assert_eq!(
                    keys(&got),
                    expected,
                    "differential step {step}: claim {scope:?} limit {limit} at {now}"
                );
                for &(_, i) in &due {
                    let m = &mut model[i];
                    m.attempts += 1;
                    m.token += 1;
                    m.next = None;
                    m.lease = Some((owner.to_owned(), now + lease));
                    m.claim = Some((owner.to_owned(), now, now + lease));
                    m.set(DeliveryStatus::InFlight, now);
                }
                for d in &got.claims {
                    let m = model.iter().find(|m| m.key == d.key().as_str()).expect("claimed key");
                    check_entry(d, m, step);
                }
            }
            4 | 5 => {
                let i = rng.below(key_names.len() as u64 + 1) as usize;
                let key = key_names.get(i).map_or("nope", String::as_str);
                let current = model.iter().find(|m| m.key == key).map_or(0, |m| m.token);
                let token = current.saturating_sub(rng.below(2));
                let outcome = match rng.below(7) {
                    0 | 1 => Outcome::Delivered,
                    2 => failed(FailedAttempt::RetryAt(
                        at(now + rng.below(10)) + Duration::from_micros(rng.below(2) * 300),
                    )),
                    3 => failed(if rng.below(2) == 0 {
                        FailedAttempt::AwaitRetry
                    } else {
                        FailedAttempt::Dead
                    }),
                    4 => Outcome::Held {
                        reason: "held".to_owned(),
                    },
                    5 => Outcome::Interrupted {
                        reason: "cut".to_owned(),
                    },
                    _ => Outcome::Released,
                };
                let got = record(&*o, key, FenceToken(token), outcome.clone(), at(now)).await;
                let expected = match model.iter_mut().find(|m| m.key == key && !m.purged) {
                    Some(m) if m.status == DeliveryStatus::InFlight && m.token == token => {
                        if let Some(ended) = outcome.attempt_outcome() {
                            m.end_attempt(now, ended);
                        }
                        m.lease = None;
                        let status = match outcome {
                            Outcome::Delivered => {
                                m.last_error = None;
                                m.reclaimed_from = None;
                                m.delivered = Some(now);
                                DeliveryStatus::Delivered
                            }
                            Outcome::Failed { error, next } => {
                                m.last_error = Some(error);
                                m.reclaimed_from = None;
                                match next {
                                    FailedAttempt::RetryAt(t) => {
                                        let since = t.duration_since(at(0)).expect("after");
                                        m.next = Some(
                                            since.as_millis() as u64 + u64::from(since.subsec_nanos() % 1_000_000 != 0),
                                        );
                                        DeliveryStatus::Failed
                                    }
                                    FailedAttempt::AwaitRetry => DeliveryStatus::Failed,
                                    _ => DeliveryStatus::Dead,
                                }
                            }
                            Outcome::Held { reason } => {
                                m.attempts = m.attempts.saturating_sub(1);
                                m.last_error = Some(reason);
                                m.reclaimed_from = None;
                                DeliveryStatus::Held
                            }
                            Outcome::Interrupted { reason } => {
                                m.interrupted += 1;
                                m.last_error = Some(reason);
                                m.reclaimed_from = None;
                                DeliveryStatus::Pending
                            }
                            _ => {
                                m.attempts = m.attempts.saturating_sub(1);
                                DeliveryStatus::Pending
                            }
                        };
                        m.set(status, now);
                        Recorded::Accepted(status)
                    }
                    Some(m) => Recorded::Stale {
                        status: Some(m.status),
                        token: FenceToken(m.token),
                    },
                    None => Recorded::Stale {
                        status: None,
                        token: FenceToken(0),
                    },
                };
                assert_eq!(
                    got, expected,
                    "differential step {step}: record {key} #{token} at {now}"
                );
            }
            6 => {
                let i = rng.below(key_names.len() as u64) as usize;
                let key = key_names[i].as_str();
                let current = model.iter().find(|m| m.key == key).map_or(0, |m| m.token);
                let token = current.saturating_sub(rng.below(2));
                let until = now + 1 + rng.below(15);
                let got = o
                    .renew(&[(ActionKey::from(key), FenceToken(token))], at(until))
                    .await
                    .expect("renew");
                let expected = match model.iter_mut().find(|m| m.key == key && !m.purged) {
                    Some(m) if m.status == DeliveryStatus::InFlight && m.token == token => {
                        m.lease.as_mut().expect("in flight").1 = until;
                        m.claim.as_mut().expect("in flight").2 = until;
                        true
                    }
                    _ => false,
                };
                assert_eq!(got, [expected], "differential step {step}: renew {key} #{token}");
            }
            7 => {
                let key = key_names[rng.below(key_names.len() as u64) as usize].as_str();
                let got = o.retry(key, at(now)).await;
                match model.iter_mut().find(|m| m.key == key && !m.purged) {
                    None => assert!(
                        matches!(got, Err(RetryError::UnknownKey(_))),
                        "differential step {step}: retry {key}: {got:?}"
                    ),
                    Some(m)
                        if matches!(
                            m.status,
                            DeliveryStatus::Failed | DeliveryStatus::Dead | DeliveryStatus::Held
                        ) =>
                    {
                        m.next = None;
                        let unapproved = m.approval && m.decision.is_none();
                        m.set(
                            if unapproved {
                                DeliveryStatus::AwaitingApproval
                            } else {
                                DeliveryStatus::Pending
                            },
                            now,
                        );
                        check_entry(
                            &got.unwrap_or_else(|e| panic!("differential step {step}: retry {key}: {e}")),
                            m,
                            step,
                        );
                    }
                    Some(m) => match got {
                        Err(RetryError::NotFailed { status, .. }) if status == m.status => {}
                        other => panic!("differential step {step}: retry {key} ({}) → {other:?}", m.status),
                    },
                }
            }
            8 => {
                let key = key_names[rng.below(key_names.len() as u64) as usize].as_str();
                let got = o.cancel(key, "stop", at(now)).await;
                match model.iter_mut().find(|m| m.key == key && !m.purged) {
                    None => assert!(
                        matches!(got, Err(CancelError::UnknownKey(_))),
                        "differential step {step}: cancel {key}: {got:?}"
                    ),
                    Some(m) if m.status == DeliveryStatus::Cancelled => {
                        check_entry(&got.expect("cancel of cancelled is Ok"), m, step);
                    }
                    Some(m)
                        if matches!(
                            m.status,
                            DeliveryStatus::Pending
                                | DeliveryStatus::Failed
                                | DeliveryStatus::Dead
                                | DeliveryStatus::Held
                                | DeliveryStatus::AwaitingApproval
                        ) =>
                    {
                        m.next = None;
                        m.cancel = Some("stop".to_owned());
                        m.set(DeliveryStatus::Cancelled, now);
                        check_entry(
                            &got.unwrap_or_else(|e| panic!("differential step {step}: cancel {key}: {e}")),
                            m,
                            step,
                        );
                    }
                    Some(m) => match got {
                        Err(CancelError::NotCancellable { status, .. }) if status == m.status => {}
                        other => panic!("differential step {step}: cancel {key} ({}) → {other:?}", m.status),
                    },
                }
            }
            10 => {
                let key = key_names[rng.below(key_names.len() as u64) as usize].as_str();
                let verdict = if rng.below(2) == 0 {
                    Verdict::Approved
                } else {
                    Verdict::Rejected
                };
                let by = ["ada", "bob", ""][rng.below(3) as usize];
                let got = match verdict {
                    Verdict::Approved => o.approve(key, by, at(now)).await,
                    _ => o.reject(key, by, "no", at(now)).await,
                };
                let what = format!("differential step {step}: {verdict:?} {key} by {by:?}");
                match model.iter_mut().find(|m| m.key == key && !m.purged) {
                    None => assert!(matches!(got, Err(ApprovalError::UnknownKey(_))), "{what}: {got:?}"),
                    // The name first, whatever the intent's state.
                    Some(_) if by.is_empty() => {
                        assert!(matches!(got, Err(ApprovalError::NoDecider { .. })), "{what}: {got:?}")
                    }
                    Some(m) => match &m.decision {
                        Some((v, _, _, _)) if *v == verdict => {
                            check_entry(&got.unwrap_or_else(|e| panic!("{what}: {e}")), m, step)
                        }
                        Some((v, first, _, _)) => match got {
                            Err(ApprovalError::AlreadyDecided {
                                verdict: got_verdict,
                                by: got_by,
                                ..
                            }) if got_verdict == *v && got_by == *first => {}
                            other => panic!("{what}: already decided, got {other:?}"),
                        },
                        None if m.status != DeliveryStatus::AwaitingApproval => match got {
                            Err(ApprovalError::NotAwaiting { status, .. }) if status == m.status => {}
                            other => panic!("{what}: not awaiting ({}), got {other:?}", m.status),
                        },
                        None => {
                            let reason = (verdict == Verdict::Rejected).then(|| "no".to_owned());
                            m.decision = Some((verdict, by.to_owned(), now, reason));
                            m.set(
                                match verdict {
                                    Verdict::Approved => DeliveryStatus::Pending,
                                    _ => DeliveryStatus::Rejected,
                                },
                                now,
                            );
                            check_entry(&got.unwrap_or_else(|e| panic!("{what}: {e}")), m, step);
                        }
                    },
                }
            }
            _ => {
                let before = now.saturating_sub(rng.below(20));
                let limit = rng.below(4) as usize;
                let filter = [
                    PurgeFilter::Final,
                    PurgeFilter::Delivered,
                    PurgeFilter::Cancelled,
                    PurgeFilter::Rejected,
                ][rng.below(4) as usize];
                let got = o.purge(filter, at(before), limit).await.expect("purge");
                let mut finals: Vec<(u64, usize)> = model
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| !m.purged && filter.admits(m.status) && m.updated < before)
                    .map(|(i, m)| (m.updated, i))
                    .collect();
                finals.sort();
                finals.truncate(limit);
                for &(_, i) in &finals {
                    model[i].purged = true;
                }
                assert_eq!(
                    got,
                    finals.len() as u64,
                    "differential step {step}: purge {filter:?} before {before} limit {limit}"
                );
            }
        }
        // Compare the whole state.
        for key in &key_names {
            let got = o.get(key).await.expect("get");
            let m = model.iter().find(|m| &m.key == key && !m.purged);
            assert_eq!(
                o.attempts(key).await.expect("attempts"),
                m.map(Model::attempts),
                "differential step {step}: attempts of {key}"
            );
            match (got, m) {
                (Some(d), Some(m)) => check_entry(&d, m, step),
                (None, None) => {}
                (got, m) => panic!("differential step {step}: get {key}: store {got:?}, model {m:?}"),
            }
        }
        for scope in &scopes {
            assert_eq!(
                counts(&*o, scope).await,
                model_counts(&model, scope),
                "differential step {step}: counts {scope:?}"
            );
            let due = o.next_due(scope).await.expect("next_due").map(ms);
            assert_eq!(
                due,
                model_next_due(&model, scope),
                "differential step {step}: next_due {scope:?}"
            );
        }
        let scope = &scopes[step % scopes.len()];
        let mut query = LedgerQuery {
            scope: scope.clone(),
            limit: 3,
            ..LedgerQuery::default()
        };
        let mut listed = Vec::new();
        loop {
            let page = o.list(&query).await.expect("list");
            listed.extend(page.entries.iter().map(|d| d.key().to_string()));
            match page.next {
                Some(next) => query.after = Some(next),
                None => break,
            }
        }
        let expected: Vec<String> = model
            .iter()
            .filter(|m| !m.purged && m.in_scope(scope))
            .map(|m| m.key.clone())
            .collect();
        assert_eq!(listed, expected, "differential step {step}: list {scope:?}");
    }
}
