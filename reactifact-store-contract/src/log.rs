//! The log side of the contract: what every [`LogStore`] must do, written once against
//! `Arc<dyn LogStore>` from the trait's documentation, and run against each store (the
//! in-memory [`MemoryStore`], a PostgreSQL one, …).
//!
//! A store's tests implement [`LogHarness`] (a fresh, empty store per check) and call
//! [`run_all_log`], or the checks one by one ([`for_each_log_check!`](crate::for_each_log_check)
//! names them). Every check panics with a message naming the rule it found broken. Rows are
//! made up: hashes are arbitrary 32-byte values and runs arbitrary bytes (a store keeps rows
//! and checks none of them), and every time is explicit ([`at`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reactifact_core::audit::{CommitHash, ContentHash, VerifyError};
use reactifact_core::runtime::{Generation, Origin};
use reactifact_core::store::{
    Act, AnswerRow, Append, BoxFuture, CheckpointRow, ClaimOrder, ClaimPolicy, ClaimRequest, Claimed, CommitRow,
    DeliveryStatus, FenceToken, LogStore, MemoryStore, NewIntent, OutboxCheck, OutboxStore, Outcome, PurgeFilter,
    Recording, Scope, SessionRow, SqliteStore,
};
use reactifact_core::{ActionKey, Intent};

use crate::{at, new_intents, trace_of};

/// Creates fresh log stores for the checks.
pub trait LogHarness: Send + Sync {
    /// A new, empty store (no session, no row, an empty outbox).
    fn fresh(&self) -> BoxFuture<'_, Arc<dyn LogStore>>;

    /// Two handles on one new, empty store, as two processes sharing it would hold them (for
    /// [`racing_appends_one_wins`]). By default one [`fresh`](LogHarness::fresh) store, twice:
    /// a store whose handles share nothing (connections, locks) overrides it, so that the
    /// appends race where the store's fence is.
    fn fresh_pair(&self) -> BoxFuture<'_, (Arc<dyn LogStore>, Arc<dyn LogStore>)> {
        Box::pin(async move {
            let store = self.fresh().await;
            (store.clone(), store)
        })
    }
}

/// The harness of [`MemoryStore`]: a new store, with an outbox of its own, per check.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryLogHarness;

impl LogHarness for MemoryLogHarness {
    fn fresh(&self) -> BoxFuture<'_, Arc<dyn LogStore>> {
        Box::pin(async { MemoryStore::new() as Arc<dyn LogStore> })
    }
}

/// The harness of [`SqliteStore`]: a new file per check, in a temporary directory the
/// harness keeps (and removes) with itself. Its pair is two stores opened on one file: two
/// connections, racing in SQLite's own locks.
#[derive(Debug, Default)]
pub struct SqliteLogHarness {
    dirs: std::sync::Mutex<Vec<tempfile::TempDir>>,
}

impl SqliteLogHarness {
    /// A new file's path, in a directory kept until the harness is dropped.
    fn new_file(&self) -> std::path::PathBuf {
        let dir = crate::temp_dir();
        let path = dir.path().join("log.db");
        self.dirs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(dir);
        path
    }
}

impl LogHarness for SqliteLogHarness {
    fn fresh(&self) -> BoxFuture<'_, Arc<dyn LogStore>> {
        let path = self.new_file();
        Box::pin(async move { SqliteStore::open(&path).expect("a new store file") as Arc<dyn LogStore> })
    }

    fn fresh_pair(&self) -> BoxFuture<'_, (Arc<dyn LogStore>, Arc<dyn LogStore>)> {
        let path = self.new_file();
        Box::pin(async move {
            let first = SqliteStore::open(&path).expect("a new store file");
            let second = SqliteStore::open(&path).expect("the same file again");
            (first as Arc<dyn LogStore>, second as Arc<dyn LogStore>)
        })
    }
}

/// Runs every log check against fresh stores of `harness`. Run it on a multi-threaded
/// runtime, so that [`racing_appends_one_wins`] races.
pub async fn run_all_log(harness: &dyn LogHarness) {
    macro_rules! run_each {
        ($($check:ident),* $(,)?) => {
            $($check(harness).await;)*
        };
    }
    crate::for_each_log_check!(run_each);
}

/// Calls the macro `$m` with the names of the log checks, each an `async fn (&dyn
/// LogHarness)` of this crate: the one list [`run_all_log`] runs and a store's tests turn into
/// a test each (on a multi-threaded runtime: one check races appends on worker threads).
///
/// ```ignore
/// macro_rules! memory_log_checks {
///     ($($check:ident),* $(,)?) => { $(
///         #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
///         async fn $check() { reactifact_store_contract::$check(&MyLogHarness).await }
///     )* };
/// }
/// reactifact_store_contract::for_each_log_check!(memory_log_checks);
/// ```
#[macro_export]
macro_rules! for_each_log_check {
    ($m:ident) => {
        $m!(
            missing_session_reads_none,
            create_session_once,
            append_moves_row_and_adds_commit,
            commits_read_their_bounds_and_own_rows,
            stale_append_writes_nothing,
            append_never_moves_consumed_back,
            racing_appends_one_wins,
            append_registers_intents,
            append_claims_as_claim_would,
            consume_is_fenced,
            checkpoints_replace_and_keep_newest,
            answers_kept_in_order_and_dropped_by_run,
            futures_need_no_executor,
            branch_reads_its_own_rows,
            verify_outbox_consistent,
            verify_outbox_missing,
            verify_outbox_forged,
        );
    };
}

// ---- helpers ----

/// 32 bytes derived from `text`: a made-up hash.
fn digest(text: &str) -> Vec<u8> {
    ContentHash::of(text.as_bytes()).0.to_vec()
}

/// A made-up commit row of `session` at `generation` (`tag` tells two rows of one generation
/// apart), whose parent is `parent`'s hash.
fn commit(session: &str, generation: u64, tag: &str, parent: Option<&CommitRow>) -> CommitRow {
    CommitRow::new(
        session.to_owned(),
        generation,
        digest(&format!("commit {session} {generation} {tag}")),
        parent.map(|p| p.hash.clone()),
        None,
        digest(&format!("state {session} {generation} {tag}")),
        generation % 3,
        format!("runs of {session} {generation} {tag}").into_bytes(),
    )
}

/// The intents `commit` acts for `keys`, one run each: [`new_intents`] whose origin is the
/// commit (its session, hash and generation).
fn acts_of(commit: &CommitRow, keys: &[(&str, &str)]) -> Vec<NewIntent> {
    let hash: [u8; 32] = commit.hash.as_slice().try_into().expect("a 32-byte hash");
    new_intents(&commit.session, commit.generation, keys)
        .into_iter()
        .enumerate()
        .map(|(run, new)| NewIntent {
            intent: Intent::new(
                new.intent.key().clone(),
                new.intent.kind(),
                new.intent.payload_bytes().to_vec(),
                Origin::new(
                    commit.session.as_str(),
                    CommitHash(hash),
                    Generation(commit.generation),
                    u32::try_from(run).expect("few runs"),
                ),
                0,
            )
            .with_trace_parent(Some(trace_of(new.intent.key().as_str()))),
            ..new
        })
        .collect()
}

/// The act a verified log lists for `intent`.
fn act(intent: &NewIntent) -> Act {
    let origin = intent.intent.origin();
    Act::new(
        intent.intent.key().clone(),
        origin.commit().0,
        origin.generation(),
        origin.run() as u64,
        intent.intent.kind().to_owned(),
        intent.action_hash.0,
    )
}

/// An [`OutboxCheck`] of a log of `commits` that acted `intents`, in log order.
fn check_of(commits: &[&CommitRow], intents: &[&NewIntent]) -> OutboxCheck {
    let mut check = OutboxCheck::default();
    for c in commits {
        let hash: [u8; 32] = c.hash.as_slice().try_into().expect("a 32-byte hash");
        check.commits.insert(hash, Generation(c.generation));
    }
    check.acts = intents.iter().map(|i| act(i)).collect();
    check
}

/// An append of `commit` without a claim.
fn append(commit: &CommitRow, expected: u64, consumed_before: u64, intents: Vec<NewIntent>, now: SystemTime) -> Append {
    Append::new(commit.clone(), expected, consumed_before, intents, now, None)
}

const OWNER: &str = "log-drainer";
const LEASE: Duration = Duration::from_secs(30);

/// The claim of up to `limit` intents of any session by [`OWNER`] at `now`.
fn claim_order(limit: usize, now: SystemTime) -> ClaimOrder {
    let owner: Arc<str> = Arc::from(OWNER);
    ClaimOrder::of(&ClaimRequest {
        scope: &Scope::all(),
        limit,
        owner: &owner,
        lease: LEASE,
        now,
        policy: ClaimPolicy::none(),
    })
}

/// Makes the claim `order` holds through [`OutboxStore::claim`].
async fn claim_now(outbox: &dyn OutboxStore, order: &ClaimOrder) -> Claimed {
    outbox
        .claim(order.request())
        .await
        .unwrap_or_else(|e| panic!("claim failed: {e}"))
}

/// Appends, which must succeed; what its claim took.
async fn appended(store: &dyn LogStore, append: Append, rule: &str) -> Claimed {
    let what = format!("commit {} of `{}`", append.commit.generation, append.commit.session);
    match store.append(append).await {
        Ok(Some(claimed)) => claimed,
        Ok(None) => panic!("{rule}: the append of {what} was refused (None)"),
        Err(e) => panic!("{rule}: the append of {what} failed: {e}"),
    }
}

/// Appends, which must answer `None`.
async fn refused(store: &dyn LogStore, append: Append, rule: &str) {
    let what = format!("commit {} of `{}`", append.commit.generation, append.commit.session);
    match store.append(append).await {
        Ok(None) => {}
        Ok(Some(_)) => panic!("{rule}: the append of {what} must answer None, and it was made"),
        Err(e) => panic!("{rule}: the append of {what} must answer None, and it failed: {e}"),
    }
}

async fn create(store: &dyn LogStore, name: &str, row: SessionRow) -> bool {
    store
        .create_session(name, row)
        .await
        .unwrap_or_else(|e| panic!("create_session({name}) failed: {e}"))
}

/// Creates session `name`, new (generation 0, no head, nothing consumed, no fork).
async fn create_new(store: &dyn LogStore, name: &str) {
    assert!(
        create(store, name, SessionRow::new(0, None, 0, None)).await,
        "create_session: a new name is created (true)"
    );
}

async fn row(store: &dyn LogStore, name: &str) -> Option<SessionRow> {
    store
        .session(name)
        .await
        .unwrap_or_else(|e| panic!("session({name}) failed: {e}"))
}

async fn commits(store: &dyn LogStore, session: &str, after: u64, upto: u64) -> Vec<CommitRow> {
    store
        .commits(session, after, upto)
        .await
        .unwrap_or_else(|e| panic!("commits({session}, {after}, {upto}) failed: {e}"))
}

async fn by_hash(store: &dyn LogStore, hash: &[u8]) -> Option<CommitRow> {
    store
        .commit_by_hash(hash)
        .await
        .unwrap_or_else(|e| panic!("commit_by_hash failed: {e}"))
}

async fn held(outbox: &dyn OutboxStore, key: &str) -> bool {
    outbox
        .get(key)
        .await
        .unwrap_or_else(|e| panic!("outbox get({key}) failed: {e}"))
        .is_some()
}

async fn consume(store: &dyn LogStore, session: &str, expected: u64, before: u64) -> bool {
    store
        .consume(session, expected, before)
        .await
        .unwrap_or_else(|e| panic!("consume({session}, {expected}, {before}) failed: {e}"))
}

async fn verify(store: &dyn LogStore, check: OutboxCheck) -> Option<VerifyError> {
    store
        .verify_outbox(check)
        .await
        .unwrap_or_else(|e| panic!("verify_outbox failed: {e}"))
}

/// Verifies, which must find nothing wrong.
async fn verifies(store: &dyn LogStore, check: OutboxCheck, rule: &str) {
    if let Some(e) = verify(store, check).await {
        panic!("{rule}: verify_outbox must answer Ok(None), got {e:?}");
    }
}

/// The row a session has after `commit` was appended to it, from `consumed` on.
fn row_at(commit: &CommitRow, consumed: u64, fork: Option<(String, u64)>) -> SessionRow {
    SessionRow::new(commit.generation, Some(commit.hash.clone()), consumed, fork)
}

// ---- checks ----

/// A session no one created reads `None`.
pub async fn missing_session_reads_none(h: &dyn LogHarness) {
    let store = h.fresh().await;
    assert_eq!(
        row(&*store, "nobody").await,
        None,
        "session: a missing session reads None"
    );
    create_new(&*store, "somebody").await;
    assert_eq!(
        row(&*store, "nobody").await,
        None,
        "session: another session's creation creates no other"
    );
    assert!(
        commits(&*store, "nobody", 0, 10).await.is_empty(),
        "commits: a missing session has no rows"
    );
}

/// `create_session` creates a session once, with the row given (a branch's fork point too),
/// and answers `false`, writing nothing, for a name already taken.
pub async fn create_session_once(h: &dyn LogHarness) {
    let store = h.fresh().await;
    let new = SessionRow::new(0, None, 0, None);
    assert!(
        create(&*store, "s", new.clone()).await,
        "create_session: a new name (true)"
    );
    assert_eq!(
        row(&*store, "s").await,
        Some(new.clone()),
        "create_session: the row reads back"
    );
    let other = SessionRow::new(7, Some(digest("h")), 3, Some(("p".to_owned(), 7)));
    assert!(
        !create(&*store, "s", other.clone()).await,
        "create_session: a taken name answers false"
    );
    assert_eq!(
        row(&*store, "s").await,
        Some(new),
        "create_session: a taken name's row is left as it was"
    );
    assert!(
        create(&*store, "b", other.clone()).await,
        "create_session: a branch (true)"
    );
    assert_eq!(
        row(&*store, "b").await,
        Some(other),
        "create_session: a branch's row reads back (generation, head, consumed, fork)"
    );
}

/// An append at the expected generation moves the session's row to the commit (generation,
/// head, consumed position) and inserts the commit's row as given, read back by `commits` and
/// `commit_by_hash`; an append without a claim takes nothing.
pub async fn append_moves_row_and_adds_commit(h: &dyn LogHarness) {
    let store = h.fresh().await;
    create_new(&*store, "s").await;
    let c1 = commit("s", 1, "a", None);
    let claimed = appended(&*store, append(&c1, 0, 2, Vec::new(), at(1)), "append").await;
    assert!(claimed.claims.is_empty(), "append: without a claim, nothing is claimed");
    assert_eq!(
        row(&*store, "s").await,
        Some(row_at(&c1, 2, None)),
        "append: the row moves to the commit"
    );
    let mut c2 = commit("s", 2, "a", Some(&c1));
    c2.merged = Some(digest("another branch's head"));
    appended(&*store, append(&c2, 1, 2, Vec::new(), at(2)), "append").await;
    assert_eq!(
        row(&*store, "s").await,
        Some(row_at(&c2, 2, None)),
        "append: the row moves again (consumed position equal is allowed)"
    );
    assert_eq!(
        commits(&*store, "s", 0, 2).await,
        [c1.clone(), c2.clone()],
        "append: the commit rows read back as given, oldest first"
    );
    assert_eq!(
        by_hash(&*store, &c2.hash).await,
        Some(c2.clone()),
        "commit_by_hash: finds the row"
    );
    assert_eq!(
        by_hash(&*store, &c1.hash).await,
        Some(c1),
        "commit_by_hash: finds the row"
    );
    assert_eq!(
        by_hash(&*store, &digest("nothing")).await,
        None,
        "commit_by_hash: an unknown hash reads None"
    );
}

/// `commits(session, after, upto)` returns the session's own rows with a generation in
/// `(after, upto]`, oldest first, and no other session's.
pub async fn commits_read_their_bounds_and_own_rows(h: &dyn LogHarness) {
    let store = h.fresh().await;
    create_new(&*store, "s").await;
    create_new(&*store, "t").await;
    let mut s = Vec::new();
    for g in 1..=4 {
        let c = commit("s", g, "s", s.last());
        appended(&*store, append(&c, g - 1, 0, Vec::new(), at(g)), "commits").await;
        s.push(c);
        if g <= 2 {
            let t = commit("t", g, "t", None);
            appended(&*store, append(&t, g - 1, 0, Vec::new(), at(g)), "commits").await;
        }
    }
    assert_eq!(commits(&*store, "s", 0, 4).await, s, "commits: (0, 4] is every row");
    assert_eq!(commits(&*store, "s", 1, 3).await, s[1..3], "commits: (1, 3] is 2 and 3");
    assert_eq!(commits(&*store, "s", 3, 4).await, s[3..], "commits: (3, 4] is 4");
    assert_eq!(commits(&*store, "s", 0, 1).await, s[..1], "commits: (0, 1] is 1");
    assert!(commits(&*store, "s", 2, 2).await.is_empty(), "commits: (2, 2] is empty");
    assert!(
        commits(&*store, "s", 3, 2).await.is_empty(),
        "commits: after > upto is empty"
    );
    assert!(
        commits(&*store, "s", 4, 100).await.is_empty(),
        "commits: after the last, empty"
    );
    assert_eq!(
        commits(&*store, "s", 0, u64::MAX).await,
        s,
        "commits: an upto of u64::MAX is every row"
    );
    let t = commits(&*store, "t", 0, 10).await;
    assert_eq!(
        t.iter().map(|c| (c.session.as_str(), c.generation)).collect::<Vec<_>>(),
        [("t", 1), ("t", 2)],
        "commits: only the session's own rows"
    );
    assert_eq!(
        by_hash(&*store, &t[1].hash).await.map(|c| c.session),
        Some("t".to_owned()),
        "commit_by_hash: finds a row of any session"
    );
}

/// An append at a stale (or future) generation, or to a missing session, answers `None` and
/// writes nothing: no row moves, no commit row, no intent registered.
pub async fn stale_append_writes_nothing(h: &dyn LogHarness) {
    let store = h.fresh().await;
    let outbox = store.outbox();
    create_new(&*store, "s").await;
    let c1 = commit("s", 1, "winner", None);
    appended(&*store, append(&c1, 0, 1, Vec::new(), at(1)), "stale").await;
    let stale = commit("s", 1, "stale", None);
    let intents = acts_of(&stale, &[("stale-1", "x")]);
    refused(
        &*store,
        append(&stale, 0, 1, intents, at(2)),
        "stale: an append at a stale generation",
    )
    .await;
    let ahead = commit("s", 3, "ahead", None);
    let intents = acts_of(&ahead, &[("ahead-1", "x")]);
    refused(
        &*store,
        append(&ahead, 2, 1, intents, at(2)),
        "stale: an append at a generation ahead",
    )
    .await;
    let ghost = commit("ghost", 1, "ghost", None);
    let intents = acts_of(&ghost, &[("ghost-1", "x")]);
    refused(
        &*store,
        append(&ghost, 0, 0, intents, at(2)),
        "stale: an append to a missing session",
    )
    .await;
    assert_eq!(
        row(&*store, "s").await,
        Some(row_at(&c1, 1, None)),
        "stale: the row did not move"
    );
    assert_eq!(
        commits(&*store, "s", 0, 10).await,
        [c1],
        "stale: no commit row was added"
    );
    for c in [&stale, &ahead, &ghost] {
        assert_eq!(
            by_hash(&*store, &c.hash).await,
            None,
            "stale: a refused commit's row is nowhere"
        );
    }
    assert_eq!(row(&*store, "ghost").await, None, "stale: no session was created");
    for key in ["stale-1", "ahead-1", "ghost-1"] {
        assert!(!held(&*outbox, key).await, "stale: a refused append registered {key}");
    }
}

/// An append whose `consumed_before` is below the session's consumed position answers `None`
/// (a stale copy must not run those events again) and writes nothing.
pub async fn append_never_moves_consumed_back(h: &dyn LogHarness) {
    let store = h.fresh().await;
    let outbox = store.outbox();
    create_new(&*store, "s").await;
    let c1 = commit("s", 1, "a", None);
    appended(&*store, append(&c1, 0, 5, Vec::new(), at(1)), "consumed").await;
    let back = commit("s", 2, "back", Some(&c1));
    let intents = acts_of(&back, &[("back-1", "x")]);
    refused(
        &*store,
        append(&back, 1, 4, intents, at(2)),
        "consumed: an append moving the consumed position back",
    )
    .await;
    assert_eq!(
        row(&*store, "s").await,
        Some(row_at(&c1, 5, None)),
        "consumed: the row did not move"
    );
    assert_eq!(
        commits(&*store, "s", 0, 10).await,
        std::slice::from_ref(&c1),
        "consumed: no commit row"
    );
    assert!(
        !held(&*outbox, "back-1").await,
        "consumed: a refused append registered its intent"
    );
    let c2 = commit("s", 2, "a", Some(&c1));
    appended(
        &*store,
        append(&c2, 1, 5, Vec::new(), at(3)),
        "consumed: equal is allowed",
    )
    .await;
    // A branch starts with what its parent had consumed.
    assert!(
        create(
            &*store,
            "b",
            SessionRow::new(1, Some(c1.hash.clone()), 4, Some(("s".to_owned(), 1)))
        )
        .await
    );
    let b2 = commit("b", 2, "b", Some(&c1));
    refused(
        &*store,
        append(&b2, 1, 3, Vec::new(), at(4)),
        "consumed: a branch's consumed position",
    )
    .await;
    appended(
        &*store,
        append(&b2, 1, 4, Vec::new(), at(4)),
        "consumed: a branch's own position",
    )
    .await;
}

/// Two appends racing for one session (through two handles, on worker threads), round after
/// round: never both succeed, exactly one does, and the session holds the winner's commit
/// only (its row, its head, its intents; none of the loser's).
pub async fn racing_appends_one_wins(h: &dyn LogHarness) {
    const ROUNDS: u64 = 40;
    let (one, two) = h.fresh_pair().await;
    let outbox = one.outbox();
    create_new(&*one, "s").await;
    let mut head: Option<CommitRow> = None;
    for g in 0..ROUNDS {
        let mut racers = Vec::new();
        for (i, store) in [&one, &two].into_iter().enumerate() {
            let c = commit("s", g + 1, &format!("racer-{i}"), head.as_ref());
            let key = format!("race-{g}-{i}");
            let intents = acts_of(&c, &[(key.as_str(), "x")]);
            let store = store.clone();
            let racer = append(&c, g, g, intents, at(g));
            racers.push((c, key, tokio::spawn(async move { store.append(racer).await })));
        }
        let mut winners = Vec::new();
        for (c, key, task) in racers {
            match task.await.expect("an append panicked") {
                Ok(Some(_)) => winners.push((c, key)),
                Ok(None) => assert!(!held(&*outbox, &key).await, "race: the loser registered {key}"),
                Err(e) => panic!("race: an append failed: {e}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "race: round {g}: exactly one of two racing appends succeeds"
        );
        let (won, key) = winners.remove(0);
        assert!(
            held(&*outbox, &key).await,
            "race: the winner's intent {key} is registered"
        );
        assert_eq!(
            row(&*one, "s").await,
            Some(row_at(&won, g, None)),
            "race: round {g}: the row is at the winner's commit"
        );
        assert_eq!(
            commits(&*two, "s", g, g + 1).await,
            std::slice::from_ref(&won),
            "race: round {g}: the winner's commit row, and only it"
        );
        head = Some(won);
    }
}

/// An append registers its intents in the store's outbox, pending and due at its `now`,
/// owned by the appending session; a key the outbox holds already is not registered again
/// (it is attached to the appending session).
pub async fn append_registers_intents(h: &dyn LogHarness) {
    let store = h.fresh().await;
    let outbox = store.outbox();
    create_new(&*store, "s").await;
    create_new(&*store, "t").await;
    let s1 = commit("s", 1, "s", None);
    let intents = acts_of(&s1, &[("k1", "x"), ("k2", "y")]);
    appended(&*store, append(&s1, 0, 0, intents, at(5)), "register").await;
    for (key, kind, run) in [("k1", "x", 0), ("k2", "y", 1)] {
        let d = outbox
            .get(key)
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("register: the append's intent {key} is in the outbox"));
        assert_eq!(d.status(), DeliveryStatus::Pending, "register: {key} is pending");
        assert_eq!(
            d.recorded_at(),
            at(5),
            "register: {key} is recorded at the append's now"
        );
        assert_eq!(d.kind(), kind, "register: {key}'s kind");
        let origin = d.origin();
        assert_eq!(
            (
                origin.session(),
                origin.commit().0.as_slice(),
                origin.generation(),
                origin.run()
            ),
            ("s", s1.hash.as_slice(), Generation(1), run),
            "register: {key}'s origin is the appended commit's run"
        );
    }
    assert_eq!(
        outbox.next_due(&Scope::all()).await.expect("next_due"),
        Some(at(5)),
        "register: due at the append's now"
    );
    let early = claim_now(&*outbox, &claim_order(10, at(4))).await;
    assert!(
        early.claims.is_empty(),
        "register: nothing is due before the append's now"
    );

    let t1 = commit("t", 1, "t", None);
    let intents = acts_of(&t1, &[("k1", "x"), ("k3", "x")]);
    appended(&*store, append(&t1, 0, 0, intents, at(7)), "register").await;
    let k1 = outbox.get("k1").await.expect("get").expect("k1 is held");
    assert_eq!(
        (k1.recorded_at(), k1.origin().session()),
        (at(5), "s"),
        "register: a key already held is not registered again"
    );
    let all = outbox.counts(&Scope::all()).await.expect("counts");
    assert_eq!(all.total(), 3, "register: one entry per key ({all:?})");
    let of_t = outbox.counts(&Scope::session("t")).await.expect("counts");
    assert_eq!(
        of_t.total(),
        2,
        "register: a held key is attached to the appending session ({of_t:?})"
    );

    // k2 delivered and purged: its tombstone keeps an append acting it again from
    // registering it.
    let claimed = claim_now(&*outbox, &claim_order(10, at(8))).await;
    let k2 = claimed
        .claims
        .iter()
        .find(|d| d.key().as_str() == "k2")
        .expect("k2 is claimed");
    let recording = [Recording {
        key: ActionKey::from("k2"),
        token: k2.token(),
        outcome: Outcome::Delivered,
    }];
    outbox.record(&recording, at(9)).await.expect("record");
    assert_eq!(
        outbox.purge(PurgeFilter::Final, at(100), 10).await.expect("purge"),
        1,
        "register: k2 purged"
    );
    let s2 = commit("s", 2, "s", Some(&s1));
    let intents = acts_of(&s2, &[("k2", "y"), ("k4", "y")]);
    appended(&*store, append(&s2, 1, 0, intents, at(101)), "register").await;
    assert!(
        !held(&*outbox, "k2").await,
        "register: a purged key is not registered again"
    );
    assert!(
        held(&*outbox, "k4").await,
        "register: the append's new key is registered"
    );
}

/// An append with a claim registers its intents and then takes exactly what
/// [`OutboxStore::claim`] would take right after it (the same keys, tokens and leases), and
/// answers with it; what it took is in flight; a refused append claims nothing.
pub async fn append_claims_as_claim_would(h: &dyn LogHarness) {
    let with = h.fresh().await;
    let without = h.fresh().await;
    let mut answers = Vec::new();
    for (store, claiming) in [(&with, true), (&without, false)] {
        create_new(&**store, "s").await;
        // Due before the commit: the claim takes it first.
        let c1 = commit("s", 1, "a", None);
        let intents = acts_of(&c1, &[("early", "x")]);
        appended(&**store, append(&c1, 0, 0, intents, at(0)), "claim").await;
        let c2 = commit("s", 2, "a", Some(&c1));
        let intents = acts_of(&c2, &[("c1", "x"), ("c2", "y"), ("c3", "x")]);
        let order = claim_order(3, at(1));
        let claimed = if claiming {
            let mut with_claim = append(&c2, 1, 0, intents, at(1));
            with_claim.claim = Some(order);
            appended(&**store, with_claim, "claim").await
        } else {
            appended(&**store, append(&c2, 1, 0, intents, at(1)), "claim").await;
            claim_now(&*store.outbox(), &order).await
        };
        answers.push(claimed);
    }
    let summary = |c: &Claimed| {
        c.claims
            .iter()
            .map(|d| {
                let lease = d.lease().map(|l| (l.owner.to_string(), l.expires_at, l.token));
                (d.key().to_string(), d.status(), d.attempts(), d.token(), lease)
            })
            .collect::<Vec<_>>()
    };
    let (took, would) = (summary(&answers[0]), summary(&answers[1]));
    assert_eq!(
        took, would,
        "claim: the append's claim takes what a claim right after it would"
    );
    assert_eq!(
        took.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
        ["early", "c1", "c2"],
        "claim: due order, registration order, up to the limit"
    );
    assert!(
        took.iter().all(|c| c.1 == DeliveryStatus::InFlight
            && c.2 == 1
            && c.3 == FenceToken(1)
            && c.4 == Some((OWNER.to_owned(), at(1) + LEASE, FenceToken(1)))),
        "claim: each taken in flight, attempt 1, token 1, leased to the owner: {took:?}"
    );
    let outbox = with.outbox();
    let early = outbox.get("early").await.expect("get").expect("held");
    assert_eq!(
        early.status(),
        DeliveryStatus::InFlight,
        "claim: what the append took is in flight"
    );

    // A refused append makes no claim.
    let stale = commit("s", 2, "stale", None);
    let mut refused_append = append(&stale, 1, 0, Vec::new(), at(2));
    refused_append.claim = Some(claim_order(10, at(2)));
    refused(&*with, refused_append, "claim: a stale append with a claim").await;
    let c3 = outbox.get("c3").await.expect("get").expect("held");
    assert_eq!(
        c3.status(),
        DeliveryStatus::Pending,
        "claim: a refused append claimed c3"
    );
    let rest = claim_now(&*outbox, &claim_order(10, at(2))).await;
    assert_eq!(
        rest.claims.iter().map(|d| d.key().as_str()).collect::<Vec<_>>(),
        ["c3"],
        "claim: the rest stays claimable"
    );
}

/// `consume` moves the consumed position only if the row is at the expected generation and
/// the position does not move back; it changes nothing else.
pub async fn consume_is_fenced(h: &dyn LogHarness) {
    let store = h.fresh().await;
    create_new(&*store, "s").await;
    let c1 = commit("s", 1, "a", None);
    appended(&*store, append(&c1, 0, 1, Vec::new(), at(1)), "consume").await;
    assert!(
        !consume(&*store, "s", 0, 3).await,
        "consume: at a stale generation, false"
    );
    assert!(
        !consume(&*store, "s", 2, 3).await,
        "consume: at a generation ahead, false"
    );
    assert_eq!(
        row(&*store, "s").await,
        Some(row_at(&c1, 1, None)),
        "consume: a refused consume wrote nothing"
    );
    assert!(consume(&*store, "s", 1, 3).await, "consume: at the generation, true");
    assert_eq!(
        row(&*store, "s").await,
        Some(row_at(&c1, 3, None)),
        "consume: the position moves, nothing else"
    );
    assert!(!consume(&*store, "s", 1, 2).await, "consume: moving back, false");
    assert_eq!(
        row(&*store, "s").await,
        Some(row_at(&c1, 3, None)),
        "consume: never moves back"
    );
    assert!(consume(&*store, "s", 1, 3).await, "consume: to the same position, true");
    assert!(
        !consume(&*store, "ghost", 0, 1).await,
        "consume: a missing session, false"
    );
    assert_eq!(row(&*store, "ghost").await, None, "consume: creates no session");
    assert_eq!(commits(&*store, "s", 0, 10).await, [c1], "consume: adds no commit row");
}

/// Checkpoints read back oldest first; one of the same session and generation replaces the
/// old; only the newest `keep` of the session stay (an older one written is the first to
/// go); other sessions' are apart.
pub async fn checkpoints_replace_and_keep_newest(h: &dyn LogHarness) {
    let store = h.fresh().await;
    create_new(&*store, "s").await;
    create_new(&*store, "t").await;
    let checkpoint = |session: &str, generation: u64, tag: &str| {
        CheckpointRow::new(
            session.to_owned(),
            generation,
            digest(&format!("commit {session} {generation}")),
            digest(&format!("state {session} {generation}")),
            format!("body {session} {generation} {tag}").into_bytes(),
            digest(&format!("digest {session} {generation} {tag}")),
        )
    };
    let put = |row: CheckpointRow, keep: usize| {
        let store = store.clone();
        async move {
            store
                .put_checkpoint(row, keep)
                .await
                .unwrap_or_else(|e| panic!("put_checkpoint failed: {e}"))
        }
    };
    let read = |session: &'static str| {
        let store = store.clone();
        async move {
            store
                .checkpoints(session)
                .await
                .unwrap_or_else(|e| panic!("checkpoints({session}) failed: {e}"))
        }
    };
    assert!(read("s").await.is_empty(), "checkpoints: none at first");
    let (s3, s1, s2) = (
        checkpoint("s", 3, "a"),
        checkpoint("s", 1, "a"),
        checkpoint("s", 2, "a"),
    );
    for row in [&s3, &s1, &s2] {
        put(row.clone(), 10).await;
    }
    assert_eq!(
        read("s").await,
        [s1.clone(), s2, s3.clone()],
        "checkpoints: oldest first, as written"
    );
    let s2b = checkpoint("s", 2, "b");
    put(s2b.clone(), 10).await;
    assert_eq!(
        read("s").await,
        [s1.clone(), s2b, s3.clone()],
        "checkpoints: the same generation is replaced"
    );
    let t1 = checkpoint("t", 1, "a");
    put(t1.clone(), 1).await;
    let s4 = checkpoint("s", 4, "a");
    put(s4.clone(), 2).await;
    assert_eq!(
        read("s").await,
        [s3.clone(), s4.clone()],
        "checkpoints: the newest `keep` stay"
    );
    put(s1, 2).await;
    assert_eq!(
        read("s").await,
        [s3, s4],
        "checkpoints: an older one written is the one dropped"
    );
    assert_eq!(read("t").await, [t1], "checkpoints: another session's are its own");
    assert!(
        read("nobody").await.is_empty(),
        "checkpoints: a session without any reads none"
    );
    put(checkpoint("t", 2, "a"), 0).await;
    assert!(read("t").await.is_empty(), "checkpoints: keep 0 drops them all");
}

/// [`LogStore::keep_answer`], [`LogStore::answers`] and [`LogStore::drop_answers`]: answers
/// read back in the order kept, per session; dropping a run's answers (its produce and trigger)
/// drops every one of them and nothing else.
pub async fn answers_kept_in_order_and_dropped_by_run(h: &dyn LogHarness) {
    let store = h.fresh().await;
    create_new(&*store, "s").await;
    create_new(&*store, "t").await;
    let answer = |session: &str, produce: &str, trigger: &str, n: u8| {
        AnswerRow::new(
            session.to_owned(),
            produce.to_owned(),
            trigger.to_owned(),
            vec![n, 1],
            format!("call {n}").into_bytes(),
        )
    };
    let read = |session: &'static str| {
        let store = store.clone();
        async move {
            store
                .answers(session)
                .await
                .unwrap_or_else(|e| panic!("answers({session}) failed: {e}"))
        }
    };
    assert!(read("s").await.is_empty(), "answers: none at first");
    let rows = [
        answer("s", "a/reply", "ticket:1", 3),
        answer("s", "a/reply", "ticket:2", 1),
        answer("t", "a/reply", "ticket:1", 9),
        answer("s", "a/reply", "ticket:1", 2),
        answer("s", "a/triage", "ticket:1", 7),
    ];
    for row in &rows {
        store
            .keep_answer(row.clone())
            .await
            .unwrap_or_else(|e| panic!("keep_answer failed: {e}"));
    }
    assert_eq!(
        read("s").await,
        [rows[0].clone(), rows[1].clone(), rows[3].clone(), rows[4].clone()],
        "answers: the session's, in the order kept"
    );
    assert_eq!(
        read("t").await,
        [rows[2].clone()],
        "answers: another session's are its own"
    );
    store
        .drop_answers("s", &[("a/reply".to_owned(), "ticket:1".to_owned())])
        .await
        .unwrap_or_else(|e| panic!("drop_answers failed: {e}"));
    assert_eq!(
        read("s").await,
        [rows[1].clone(), rows[4].clone()],
        "answers: dropping a run's drops every answer of its produce on its trigger, and only those"
    );
    assert_eq!(
        read("t").await,
        [rows[2].clone()],
        "answers: dropping touches no other session"
    );
    store
        .drop_answers("s", &[])
        .await
        .unwrap_or_else(|e| panic!("drop_answers of nothing failed: {e}"));
    assert_eq!(read("s").await.len(), 2, "answers: dropping nothing drops nothing");
}

/// Every future of the store completes without the caller's executor: a thread with no
/// runtime waits for them by parking (as a context's direct writes do).
pub async fn futures_need_no_executor(h: &dyn LogHarness) {
    let store = h.fresh().await;
    let on_thread = store.clone();
    let answered = std::thread::spawn(move || {
        let store = &*on_thread;
        assert!(
            park_on(store.create_session("s", SessionRow::new(0, None, 0, None))).expect("create_session"),
            "no executor: create_session"
        );
        let c1 = commit("s", 1, "a", None);
        let intents = acts_of(&c1, &[("n1", "x")]);
        let mut with_claim = append(&c1, 0, 0, intents.clone(), at(1));
        with_claim.claim = Some(claim_order(1, at(1)));
        let claimed = park_on(store.append(with_claim)).expect("append").expect("appended");
        assert_eq!(claimed.claims.len(), 1, "no executor: the append's claim");
        assert!(
            park_on(store.consume("s", 1, 2)).expect("consume"),
            "no executor: consume"
        );
        let row = park_on(store.session("s")).expect("session");
        let rows = park_on(store.commits("s", 0, 1)).expect("commits");
        let found = park_on(store.commit_by_hash(&c1.hash)).expect("commit_by_hash");
        let check = check_of(&[&c1], &[&intents[0]]);
        let verified = park_on(store.verify_outbox(check)).expect("verify_outbox");
        (row, rows, found, verified.map(|e| e.to_string()), c1)
    })
    .join()
    .unwrap_or_else(|_| panic!("no executor: a future of the store did not complete on a thread without one"));
    let (row, rows, found, verified, c1) = answered;
    assert_eq!(row, Some(row_at(&c1, 2, None)), "no executor: the row");
    assert_eq!(rows, std::slice::from_ref(&c1), "no executor: the commit rows");
    assert_eq!(found, Some(c1), "no executor: commit_by_hash");
    assert_eq!(verified, None, "no executor: verify_outbox");
}

/// Waits for `future` on this thread, parking it until woken; no executor runs.
fn park_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

/// A branch created with `fork: Some((parent, at))` holds only its own rows: `commits` of it
/// never returns its parent's, its appends never touch the parent's rows, and
/// `commit_by_hash` finds each row under its own session.
pub async fn branch_reads_its_own_rows(h: &dyn LogHarness) {
    let store = h.fresh().await;
    create_new(&*store, "p").await;
    let mut p = Vec::new();
    for g in 1..=3 {
        let c = commit("p", g, "p", p.last());
        appended(&*store, append(&c, g - 1, 0, Vec::new(), at(g)), "branch").await;
        p.push(c);
    }
    let fork = Some(("p".to_owned(), 2));
    let start = SessionRow::new(2, Some(p[1].hash.clone()), 0, fork.clone());
    assert!(create(&*store, "b", start.clone()).await, "branch: created");
    assert_eq!(
        row(&*store, "b").await,
        Some(start),
        "branch: its row reads back with its fork point"
    );
    assert!(
        commits(&*store, "b", 0, 10).await.is_empty(),
        "branch: a new branch holds no rows (its parent's are the parent's)"
    );
    let b3 = commit("b", 3, "b", Some(&p[1]));
    appended(&*store, append(&b3, 2, 0, Vec::new(), at(4)), "branch").await;
    assert_eq!(
        row(&*store, "b").await,
        Some(row_at(&b3, 0, fork)),
        "branch: its row moves"
    );
    assert_eq!(
        commits(&*store, "b", 0, 10).await,
        std::slice::from_ref(&b3),
        "branch: reads its own row only"
    );
    assert_eq!(
        commits(&*store, "p", 0, 10).await,
        p,
        "branch: the parent's rows are untouched"
    );
    assert_eq!(
        row(&*store, "p").await,
        Some(row_at(&p[2], 0, None)),
        "branch: the parent's row is untouched"
    );
    assert_eq!(
        by_hash(&*store, &b3.hash).await.map(|c| c.session),
        Some("b".to_owned()),
        "branch: commit_by_hash finds the branch's row"
    );
    let p4 = commit("p", 4, "p", Some(&p[2]));
    appended(
        &*store,
        append(&p4, 3, 0, Vec::new(), at(5)),
        "branch: the parent appends on",
    )
    .await;
    assert_eq!(
        commits(&*store, "b", 0, 10).await,
        [b3],
        "branch: the parent's new row is not the branch's"
    );
}

/// `verify_outbox` answers `Ok(None)` for a log whose acts all have entries that name them
/// (a key acted again, another session's entries, a purged key's tombstone and an empty log
/// included).
pub async fn verify_outbox_consistent(h: &dyn LogHarness) {
    let store = h.fresh().await;
    let outbox = store.outbox();
    create_new(&*store, "s").await;
    create_new(&*store, "t").await;
    verifies(&*store, OutboxCheck::default(), "verify: an empty log").await;
    let c1 = commit("s", 1, "a", None);
    let first = acts_of(&c1, &[("v1", "x"), ("v2", "y")]);
    appended(&*store, append(&c1, 0, 0, first.clone(), at(1)), "verify").await;
    let c2 = commit("s", 2, "a", Some(&c1));
    let second = acts_of(&c2, &[("v3", "x"), ("v1", "x")]);
    appended(&*store, append(&c2, 1, 0, second.clone(), at(2)), "verify").await;
    let t1 = commit("t", 1, "t", None);
    appended(
        &*store,
        append(&t1, 0, 0, acts_of(&t1, &[("w1", "x")]), at(3)),
        "verify",
    )
    .await;
    let acts: Vec<&NewIntent> = first.iter().chain(&second).collect();
    let check = || check_of(&[&c1, &c2], &acts);
    verifies(&*store, check(), "verify: a consistent log").await;

    // v2 delivered and purged: its tombstone stands for it.
    let claimed = claim_now(&*outbox, &claim_order(10, at(4))).await;
    let v2 = claimed
        .claims
        .iter()
        .find(|d| d.key().as_str() == "v2")
        .expect("v2 is claimed");
    let recording = [Recording {
        key: ActionKey::from("v2"),
        token: v2.token(),
        outcome: Outcome::Delivered,
    }];
    outbox.record(&recording, at(5)).await.expect("record");
    let purged = outbox.purge(PurgeFilter::Final, at(100), 10).await.expect("purge");
    assert_eq!(purged, 1, "verify: v2 purged");
    assert!(!held(&*outbox, "v2").await, "verify: v2 has no entry");
    verifies(&*store, check(), "verify: a purged key's tombstone counts").await;
}

/// `verify_outbox` reports an act whose key has neither an entry nor a tombstone as
/// `OutboxMissing`, naming the first such act in log order (its key's first act).
pub async fn verify_outbox_missing(h: &dyn LogHarness) {
    let store = h.fresh().await;
    create_new(&*store, "s").await;
    let c1 = commit("s", 1, "a", None);
    let first = acts_of(&c1, &[("v1", "x")]);
    appended(&*store, append(&c1, 0, 0, first.clone(), at(1)), "missing").await;
    // Commits 2 and 3 act keys the outbox never got (their appends carried none).
    let c2 = commit("s", 2, "a", Some(&c1));
    appended(&*store, append(&c2, 1, 0, Vec::new(), at(2)), "missing").await;
    let c3 = commit("s", 3, "a", Some(&c2));
    appended(&*store, append(&c3, 2, 0, Vec::new(), at(3)), "missing").await;
    let lost2 = acts_of(&c2, &[("v1", "x"), ("m2", "x"), ("m1", "x")]);
    let lost3 = acts_of(&c3, &[("m1", "x"), ("m3", "x")]);
    let acts: Vec<&NewIntent> = first.iter().chain(&lost2).chain(&lost3).collect();
    match verify(&*store, check_of(&[&c1, &c2, &c3], &acts)).await {
        Some(VerifyError::OutboxMissing { generation, key }) => assert_eq!(
            (generation, key.as_str()),
            (Generation(2), "m2"),
            "verify: OutboxMissing names the first missing act in log order"
        ),
        other => panic!("verify: an act without an entry must be OutboxMissing (m2 at 2), got {other:?}"),
    }
    let acts: Vec<&NewIntent> = first.iter().chain(&lost3).chain(&lost2[2..]).collect();
    match verify(&*store, check_of(&[&c1, &c2, &c3], &acts)).await {
        Some(VerifyError::OutboxMissing { generation, key }) => assert_eq!(
            (generation, key.as_str()),
            (Generation(3), "m1"),
            "verify: OutboxMissing names the key's first act"
        ),
        other => panic!("verify: an act without an entry must be OutboxMissing (m1 at 3), got {other:?}"),
    }
}

/// `verify_outbox` reports an entry born of a commit of the log that names no act of that
/// commit with its run, key, kind and action hash as `OutboxForged`, naming that commit.
pub async fn verify_outbox_forged(h: &dyn LogHarness) {
    let store = h.fresh().await;
    create_new(&*store, "s").await;
    let c1 = commit("s", 1, "a", None);
    let intents = acts_of(&c1, &[("f1", "x"), ("f2", "y")]);
    appended(&*store, append(&c1, 0, 0, intents.clone(), at(1)), "forged").await;
    let c2 = commit("s", 2, "a", Some(&c1));
    appended(&*store, append(&c2, 1, 0, Vec::new(), at(2)), "forged").await;
    let commits = [&c1, &c2];
    verifies(
        &*store,
        check_of(&commits, &[&intents[0], &intents[1]]),
        "forged: the log as it is verifies",
    )
    .await;
    let mut changed = Vec::new();
    let mut check = check_of(&commits, &[&intents[0]]);
    changed.push(("the log has no act of f2", check.clone()));
    check = check_of(&commits, &[&intents[0], &intents[1]]);
    check.acts[1].action_hash = [9; 32];
    changed.push(("f2's act has another action hash", check.clone()));
    check = check_of(&commits, &[&intents[0], &intents[1]]);
    check.acts[1].run = 0;
    changed.push(("f2's act is of another run", check.clone()));
    check = check_of(&commits, &[&intents[0], &intents[1]]);
    check.acts[1].kind = "x".to_owned();
    changed.push(("f2's act is of another kind", check.clone()));
    check = check_of(&commits, &[&intents[0], &intents[1]]);
    check.acts[1].commit = c2.hash.as_slice().try_into().expect("32 bytes");
    check.acts[1].generation = Generation(2);
    changed.push(("f2 is acted by another commit", check));
    for (what, check) in changed {
        match verify(&*store, check).await {
            Some(VerifyError::OutboxForged { generation, key }) => assert_eq!(
                (generation, key.as_str()),
                (Generation(1), "f2"),
                "forged ({what}): OutboxForged names the entry's commit and key"
            ),
            other => panic!("forged ({what}): must be OutboxForged (f2 at 1), got {other:?}"),
        }
    }
}
