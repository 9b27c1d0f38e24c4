//! The public trait a durable store of another crate implements: [`LogStore`], the home of
//! sessions' logs (their commits, their rows and their checkpoints) beside an outbox.
//!
//! The trait deals in rows, not in the core's types: a commit's runs arrive encoded, a
//! checkpoint's body too, and every hash as its bytes. The core encodes, decodes and checks
//! everything it reads back (hashes, parent links, digests), so a store only keeps rows and
//! makes two promises: an append is one transaction, fenced on the session's generation, that
//! registers the commit's intents in the store's outbox (and makes the commit's claim); and a
//! session's row moves only through those appends, [`consume`](LogStore::consume) and
//! [`create_session`](LogStore::create_session). [`Context::open_store`](crate::Context::open_store)
//! opens a session of such a store.
//!
//! Every backend implements it: [`MemoryStore`](crate::store::MemoryStore),
//! [`SqliteStore`](crate::store::SqliteStore) (with the default `sqlite` feature) and the
//! PostgreSQL store (`reactifact_postgres::PostgresStore`); the core's one session above it
//! (`store/backed.rs`) does the same for each.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::model::action::ActionKey;
use crate::model::artifact::Generation;
use crate::model::delivery::NewIntent;
use crate::model::policy::ClaimPolicy;
use crate::state::refold::VerifyError;
use crate::store::outbox::{BoxFuture, ClaimRequest, Claimed, OutboxStore, Scope};
use crate::store::StoreError;

/// A session's row: where its log ends, what it consumed, and where it forked from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionRow {
    /// The generation of its last commit (0 for none).
    pub generation: u64,
    /// The hash of its last commit (the fork point's, for a branch without commits of its
    /// own), as stored.
    pub head: Option<Vec<u8>>,
    /// Its queued events numbered below this one are consumed.
    pub consumed_seq: u64,
    /// For a branch, the session it forked from, and the generation it forked at: its log is
    /// the parent's up to there, then its own commits.
    pub fork: Option<(String, u64)>,
}

impl SessionRow {
    /// A session's row, as a store reads it back.
    pub fn new(generation: u64, head: Option<Vec<u8>>, consumed_seq: u64, fork: Option<(String, u64)>) -> Self {
        SessionRow {
            generation,
            head,
            consumed_seq,
            fork,
        }
    }
}

/// One commit of a session's log, as a store keeps it: one row.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CommitRow {
    /// The session whose rows hold it (for a branch's commit before its fork, an ancestor).
    pub session: String,
    /// Its generation.
    pub generation: u64,
    /// Its hash (32 bytes when intact).
    pub hash: Vec<u8>,
    /// Its parent's hash.
    pub parent: Option<Vec<u8>>,
    /// For a merge commit, the merged head's hash.
    pub merged: Option<Vec<u8>>,
    /// The state hash after it.
    pub state_hash: Vec<u8>,
    /// How many queued events it consumed.
    pub events_consumed: u64,
    /// Its runs, encoded by the core.
    pub runs: Vec<u8>,
}

impl CommitRow {
    /// A commit row, as a store reads it back.
    #[allow(clippy::too_many_arguments)] // one argument per column
    pub fn new(
        session: String,
        generation: u64,
        hash: Vec<u8>,
        parent: Option<Vec<u8>>,
        merged: Option<Vec<u8>>,
        state_hash: Vec<u8>,
        events_consumed: u64,
        runs: Vec<u8>,
    ) -> Self {
        CommitRow {
            session,
            generation,
            hash,
            parent,
            merged,
            state_hash,
            events_consumed,
            runs,
        }
    }
}

/// A claim to make in an append's transaction, owned ([`ClaimRequest`] borrows).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClaimOrder {
    /// Which intents may be claimed.
    pub scope: Scope,
    /// At most this many.
    pub limit: usize,
    /// Who claims.
    pub owner: Arc<str>,
    /// How long each claim is leased from `now`.
    pub lease: Duration,
    /// The time of the claim.
    pub now: SystemTime,
    /// How it chooses among due intents.
    pub policy: ClaimPolicy,
}

impl ClaimOrder {
    /// The claim `request` asks for, owned.
    pub fn of(request: &ClaimRequest<'_>) -> ClaimOrder {
        ClaimOrder {
            scope: request.scope.clone(),
            limit: request.limit,
            owner: request.owner.clone(),
            lease: request.lease,
            now: request.now,
            policy: request.policy.clone(),
        }
    }

    /// The claim, as [`OutboxStore::claim`] takes it.
    pub fn request(&self) -> ClaimRequest<'_> {
        ClaimRequest {
            scope: &self.scope,
            limit: self.limit,
            owner: &self.owner,
            lease: self.lease,
            now: self.now,
            policy: &self.policy,
        }
    }
}

/// One commit to append ([`LogStore::append`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct Append {
    /// The commit's row (its `session` is the session appended to).
    pub commit: CommitRow,
    /// The session's generation the appender last saw: the append is made only if the
    /// session's row is still at it (and then moves it to `commit.generation`).
    pub expected: u64,
    /// After the commit, the session's queued events numbered below this one are consumed
    /// (never moving back).
    pub consumed_before: u64,
    /// The intents the commit acted, in commit order: each key the outbox holds neither as a
    /// row nor as a purge tombstone is registered, pending and due at `now`; a key held by
    /// another session is attached to this one.
    pub intents: Vec<NewIntent>,
    /// When the commit is made.
    pub now: SystemTime,
    /// A claim to make in the same transaction, after the intents are registered, exactly as
    /// [`OutboxStore::claim`] would make it right after the commit.
    pub claim: Option<ClaimOrder>,
}

impl Append {
    /// An append, as the core makes one (and a store's tests build one).
    pub fn new(
        commit: CommitRow,
        expected: u64,
        consumed_before: u64,
        intents: Vec<NewIntent>,
        now: SystemTime,
        claim: Option<ClaimOrder>,
    ) -> Self {
        Append {
            commit,
            expected,
            consumed_before,
            intents,
            now,
            claim,
        }
    }
}

/// A recorded call's answer, kept before the generation of its run commits, as a store keeps
/// it: one row, opaque to the store but for what [`LogStore::drop_answers`] deletes by. After a
/// crash, a re-run of the same run (same produce, same trigger version) gets the answer back
/// without calling again (see `docs/agents.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AnswerRow {
    /// The session.
    pub session: String,
    /// The run's agent and produce, as `{agent}/{produce}`.
    pub produce: String,
    /// The id of the run's trigger.
    pub trigger: String,
    /// The run, encoded by the core: its trigger's version and content, and the event.
    pub run: Vec<u8>,
    /// The call, encoded by the core.
    pub call: Vec<u8>,
}

impl AnswerRow {
    /// An answer row, as a store reads it back.
    pub fn new(session: String, produce: String, trigger: String, run: Vec<u8>, call: Vec<u8>) -> Self {
        AnswerRow {
            session,
            produce,
            trigger,
            run,
            call,
        }
    }
}

/// A checkpoint of a session's state, as a store keeps it: one row, opaque to the store.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointRow {
    /// The session.
    pub session: String,
    /// The commit it is the state after.
    pub generation: u64,
    /// That commit's hash.
    pub hash: Vec<u8>,
    /// That commit's state hash.
    pub state_hash: Vec<u8>,
    /// The encoded state.
    pub body: Vec<u8>,
    /// The core's digest over all of the above.
    pub digest: Vec<u8>,
}

impl CheckpointRow {
    /// A checkpoint row, as a store reads it back.
    pub fn new(
        session: String,
        generation: u64,
        hash: Vec<u8>,
        state_hash: Vec<u8>,
        body: Vec<u8>,
        digest: Vec<u8>,
    ) -> Self {
        CheckpointRow {
            session,
            generation,
            hash,
            state_hash,
            body,
            digest,
        }
    }
}

/// An act of a verified log, for [`LogStore::verify_outbox`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Act {
    /// The intent's key.
    pub key: ActionKey,
    /// The commit that acted it.
    pub commit: [u8; 32],
    /// That commit's generation, which a [`VerifyError`] names.
    pub generation: Generation,
    /// The run of that commit.
    pub run: u64,
    /// Its kind.
    pub kind: String,
    /// The content hash of its `PendingAction` bytes.
    pub action_hash: [u8; 32],
}

impl Act {
    /// An act, as the core lists it for a check (and a store's tests build one).
    pub fn new(
        key: ActionKey,
        commit: [u8; 32],
        generation: Generation,
        run: u64,
        kind: String,
        action_hash: [u8; 32],
    ) -> Self {
        Act {
            key,
            commit,
            generation,
            run,
            kind,
            action_hash,
        }
    }
}

/// What [`LogStore::verify_outbox`] checks the outbox against: a session's verified log.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct OutboxCheck {
    /// Every commit of the log: its hash, with its generation (which a [`VerifyError`] about
    /// a row born of it names).
    pub commits: std::collections::HashMap<[u8; 32], Generation>,
    /// Every act of the log, in log order.
    pub acts: Vec<Act>,
}

impl OutboxCheck {
    /// The first commit of the log that acts `key`, if one does: the commit a
    /// [`VerifyError::OutboxChanged`] or [`VerifyError::OutboxMissing`] for that key names.
    pub fn first_act(&self, key: &str) -> Option<Generation> {
        self.acts
            .iter()
            .find(|act| act.key.as_str() == key)
            .map(|act| act.generation)
    }
}

/// A durable home for the logs of sessions, beside an outbox: what a store of another crate
/// implements so that [`Context::open_store`](crate::Context::open_store) opens its sessions.
///
/// A store keeps three kinds of rows — sessions, commits and checkpoints — and the outbox's;
/// the core encodes, decodes and checks all of them (see the module docs).
///
/// # Futures
/// Every future must complete without the caller's executor driving anything of the store's:
/// run the I/O on a thread or runtime of the store's own (a direct write of a context, such as
/// [`Context::create`](crate::Context::create), waits for its append by blocking its thread,
/// as [`std::fs`] does, and may run inside any executor or none). Futures are `Send`.
///
/// # Errors
/// [`StoreError`]s the store builds with [`StoreError::backend`] and the other constructors,
/// naming the store as [`describe`](LogStore::describe) does.
pub trait LogStore: Send + Sync + 'static {
    /// A short description for errors and logs, without any password (e.g.
    /// `postgres://app@db:5432/app schema reactifact`).
    fn describe(&self) -> String;

    /// The store's outbox: the one every append registers its intents in.
    fn outbox(&self) -> Arc<dyn OutboxStore>;

    /// The row of session `name`, or `None` if there is no such session.
    fn session<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<SessionRow>, StoreError>>;

    /// Creates session `name` with `row` if no session has that name; `false` (and nothing
    /// written) if one does.
    fn create_session<'a>(&'a self, name: &'a str, row: SessionRow) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// The commit rows that session `session` holds itself (not its ancestors') with a
    /// generation in `(after, upto]`, oldest first.
    fn commits<'a>(
        &'a self,
        session: &'a str,
        after: u64,
        upto: u64,
    ) -> BoxFuture<'a, Result<Vec<CommitRow>, StoreError>>;

    /// The commit row with hash `hash`, of any session, if the store has one.
    fn commit_by_hash<'a>(&'a self, hash: &'a [u8]) -> BoxFuture<'a, Result<Option<CommitRow>, StoreError>>;

    /// Appends a commit in one transaction, if the session's row is at generation
    /// `append.expected` and its consumed position is at most `append.consumed_before`: moves
    /// the row to the commit (generation, head, consumed position), inserts the commit's row,
    /// registers its intents and makes its claim. Returns what the claim took (nothing if it
    /// asked for none), or `None` — with nothing written — if the row was not so: another
    /// writer advanced the session, or consumed further (a stale copy must not run those
    /// events again). Two appends racing for one session must never both succeed.
    fn append(&self, append: Append) -> BoxFuture<'_, Result<Option<Claimed>, StoreError>>;

    /// Marks the session's queued events numbered below `before` consumed, if its row is at
    /// generation `expected` and its consumed position is at most `before`; `false` (nothing
    /// written) otherwise.
    fn consume<'a>(&'a self, session: &'a str, expected: u64, before: u64) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Writes a checkpoint row (replacing one of the same session and generation), then drops
    /// the session's checkpoints but the newest `keep`.
    fn put_checkpoint(&self, row: CheckpointRow, keep: usize) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Every checkpoint row of `session`, oldest first.
    fn checkpoints<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<Vec<CheckpointRow>, StoreError>>;

    /// The outbox checks of [`Context::verify`](crate::Context::verify) against a verified
    /// log: every outbox row matches its digest and its bytes their action hash
    /// ([`VerifyError::OutboxChanged`], naming [`check.first_act`](OutboxCheck::first_act) of
    /// its key); every row whose origin is a commit in `check.commits` names an act of it with
    /// the same run, key, kind and action hash ([`VerifyError::OutboxForged`], naming that
    /// commit's generation); every such row that records an operator's decision bound to a
    /// digest has it equal to that act's action hash and its own ([`VerifyError::OutboxDecision`]);
    /// and every act has a row or a purge tombstone
    /// ([`VerifyError::OutboxMissing`], naming the first act's generation). `Ok(None)` if all
    /// hold.
    fn verify_outbox(&self, check: OutboxCheck) -> BoxFuture<'_, Result<Option<VerifyError>, StoreError>>;

    /// Keeps a recorded call's answer durably, after the answers kept before it, before the
    /// generation of its run commits: the runtime waits for it before the produce gets the
    /// answer. The default keeps nothing (a store without it: a crash before the commit asks
    /// again); every store of reactifact keeps them.
    fn keep_answer(&self, row: AnswerRow) -> BoxFuture<'_, Result<(), StoreError>> {
        let _ = row;
        Box::pin(std::future::ready(Ok(())))
    }

    /// Every answer kept for `session`, in the order kept.
    fn answers<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<Vec<AnswerRow>, StoreError>> {
        let _ = session;
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// Deletes every answer of `session` kept for a run of one of `runs`, each an
    /// `({agent}/{produce}, trigger id)` pair: what the runtime drops once such a run
    /// committed (an answer of an earlier version of the trigger is of no use any more).
    fn drop_answers<'a>(
        &'a self,
        session: &'a str,
        runs: &'a [(String, String)],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (session, runs);
        Box::pin(std::future::ready(Ok(())))
    }
}
