//! [`MemoryStore`]: a [`LogStore`] kept in memory, beside a [`MemoryOutbox`] — sessions' rows,
//! commit rows and checkpoint rows under one lock, for tests, for the log contract suite, and
//! for a store of sessions that need not outlive the process.
//!
//! Every operation runs synchronously under the store's [`Mutex`] (never held across an
//! await), so the futures it returns are ready: they need no executor. An append checks the
//! fence, inserts the commit's row, moves the session's row, registers the commit's intents in
//! the outbox and makes its claim, all before the lock is released, so two appends racing for
//! one session never both succeed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::model::action::ActionKey;
use crate::state::refold::VerifyError;
use crate::store::backed::block_on;
use crate::store::log_store::{AnswerRow, Append, CheckpointRow, CommitRow, LogStore, OutboxCheck, SessionRow};
use crate::store::memory::MemoryOutbox;
use crate::store::outbox::{BoxFuture, Claimed, OutboxStore};
use crate::store::StoreError;

/// A [`LogStore`] in memory: what [`Context::open_store`](crate::Context::open_store) opens
/// sessions of, as it opens those of a durable store, with a [`MemoryOutbox`] as its outbox.
///
/// ```
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use reactifact_core::store::MemoryStore;
/// use reactifact_core::Context;
///
/// let store = MemoryStore::new();
/// let ctx = Context::open_store(store.clone(), "orders").await?;
/// drop(ctx);
/// let again = Context::open_store(store, "orders").await?; // the same session, reloaded
/// # Ok(()) }
/// ```
///
/// Unlike a context made with [`Context::new`](crate::Context::new), whose log lives in the
/// context, a session of a `MemoryStore` lives in the store: dropping its context and opening
/// the session again loads it (from its newest checkpoint and the commits after it), several
/// contexts may open one session (their commits fenced on its generation, as on a durable
/// store), and [`Context::verify`](crate::Context::verify) checks the outbox against the log.
/// Nothing survives the process.
///
/// An outbox entry in memory keeps no copy of its committed bytes and no digest (nothing can
/// change them behind the store's back), so [`verify_outbox`](LogStore::verify_outbox) never
/// reports [`VerifyError::OutboxChanged`]; it reports the other two outbox checks, matching each
/// entry born of a commit of the log against the action hash this store registered it with.
pub struct MemoryStore {
    outbox: Arc<MemoryOutbox>,
    log: Mutex<Log>,
}

/// The rows, behind the store's lock.
#[derive(Default)]
struct Log {
    sessions: HashMap<String, Session>,
    /// Each session's checkpoints, by generation.
    checkpoints: HashMap<String, BTreeMap<u64, CheckpointRow>>,
    /// Where the commit row of each hash is: its session and generation (the first appended).
    by_hash: HashMap<Vec<u8>, (String, u64)>,
    /// The action hash of each intent this store's appends registered, by key, origin commit
    /// and run: what [`LogStore::verify_outbox`] compares an entry's act with.
    acted: HashMap<(ActionKey, [u8; 32], u64), [u8; 32]>,
    /// The answers kept before their runs committed, in the order kept.
    answers: Vec<AnswerRow>,
}

/// An act as an entry is matched against it: key, commit, run, kind, action hash.
type ActKey<'a> = (&'a str, [u8; 32], u64, &'a str, [u8; 32]);

/// One session: its row and the commit rows it holds itself.
struct Session {
    row: SessionRow,
    commits: BTreeMap<u64, CommitRow>,
}

impl MemoryStore {
    /// An empty store with an outbox of its own.
    pub fn new() -> Arc<MemoryStore> {
        Self::with_outbox(MemoryOutbox::new())
    }

    /// An empty store whose appends register their intents in `outbox` (shared, say, with a
    /// [`Drainer`](crate::Drainer) made before the store).
    pub fn with_outbox(outbox: Arc<MemoryOutbox>) -> Arc<MemoryStore> {
        Arc::new(MemoryStore {
            outbox,
            log: Mutex::new(Log::default()),
        })
    }

    /// The store's outbox, as its concrete type.
    pub fn memory_outbox(&self) -> &Arc<MemoryOutbox> {
        &self.outbox
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`LogStore::append`], synchronously, under the lock.
    fn append_now(&self, append: Append) -> Result<Option<Claimed>, StoreError> {
        let mut log = self.lock();
        let commit = &append.commit;
        let Some(session) = log.sessions.get_mut(&commit.session) else {
            return Ok(None);
        };
        if session.row.generation != append.expected || session.row.consumed_seq > append.consumed_before {
            return Ok(None);
        }
        if session.commits.contains_key(&commit.generation) {
            // A durable store's unique (session, generation) refuses it the same way.
            return Err(StoreError::backend(
                self.describe(),
                false,
                format!(
                    "session `{}` already holds commit {}",
                    commit.session, commit.generation
                ),
            ));
        }
        session.row.generation = commit.generation;
        session.row.head = Some(commit.hash.clone());
        session.row.consumed_seq = append.consumed_before;
        session.commits.insert(commit.generation, commit.clone());
        log.by_hash
            .entry(commit.hash.clone())
            .or_insert_with(|| (commit.session.clone(), commit.generation));
        for new in &append.intents {
            let origin = new.intent.origin();
            log.acted
                .entry((new.intent.key().clone(), origin.commit().0, origin.run() as u64))
                .or_insert(new.action_hash.0);
        }
        // Under the store's lock: no other append of this store comes between the commit and
        // its registration and claim.
        self.outbox.register(append.intents.into_iter(), append.now);
        let claimed = match &append.claim {
            // The memory outbox's claim is done in its first poll.
            Some(order) => block_on(self.outbox.claim(order.request()))?,
            None => Claimed::default(),
        };
        Ok(Some(claimed))
    }

    /// [`LogStore::verify_outbox`], synchronously.
    fn verify_now(&self, check: &OutboxCheck) -> Option<VerifyError> {
        let acts: HashSet<ActKey<'_>> = check
            .acts
            .iter()
            .map(|a| (a.key.as_str(), a.commit, a.run, a.kind.as_str(), a.action_hash))
            .collect();
        let log = self.lock();
        for (key, kind, origin) in self.outbox.origins() {
            let commit = origin.commit().0;
            let Some(&generation) = check.commits.get(&commit) else {
                continue; // Born of another session's commit.
            };
            let run = origin.run() as u64;
            // The entry names the commit by its hash and its generation: both must agree, and
            // the act must be this store's registration of it, with the same action hash.
            let acted = origin.generation() == generation
                && log
                    .acted
                    .get(&(key.clone(), commit, run))
                    .is_some_and(|hash| acts.contains(&(key.as_str(), commit, run, &*kind, *hash)));
            if !acted {
                return Some(VerifyError::OutboxForged { generation, key });
            }
        }
        drop(log);
        // The first act (in log order) whose key has neither an entry nor a tombstone.
        let missing = check.acts.iter().find(|act| !self.outbox.holds(act.key.as_str()))?;
        Some(VerifyError::OutboxMissing {
            generation: missing.generation,
            key: missing.key.clone(),
        })
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let log = self.lock();
        f.debug_struct("MemoryStore")
            .field("sessions", &log.sessions.len())
            .field(
                "commits",
                &log.sessions.values().map(|s| s.commits.len()).sum::<usize>(),
            )
            .finish_non_exhaustive()
    }
}

impl LogStore for MemoryStore {
    fn describe(&self) -> String {
        "memory".to_owned()
    }

    fn outbox(&self) -> Arc<dyn OutboxStore> {
        self.outbox.clone()
    }

    fn session<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<SessionRow>, StoreError>> {
        let row = self.lock().sessions.get(name).map(|s| s.row.clone());
        Box::pin(std::future::ready(Ok(row)))
    }

    fn create_session<'a>(&'a self, name: &'a str, row: SessionRow) -> BoxFuture<'a, Result<bool, StoreError>> {
        let created = match self.lock().sessions.entry(name.to_owned()) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(vacant) => {
                vacant.insert(Session {
                    row,
                    commits: BTreeMap::new(),
                });
                true
            }
        };
        Box::pin(std::future::ready(Ok(created)))
    }

    fn commits<'a>(
        &'a self,
        session: &'a str,
        after: u64,
        upto: u64,
    ) -> BoxFuture<'a, Result<Vec<CommitRow>, StoreError>> {
        let rows = match self.lock().sessions.get(session) {
            Some(s) if after < upto => s.commits.range(after + 1..=upto).map(|(_, row)| row.clone()).collect(),
            _ => Vec::new(),
        };
        Box::pin(std::future::ready(Ok(rows)))
    }

    fn commit_by_hash<'a>(&'a self, hash: &'a [u8]) -> BoxFuture<'a, Result<Option<CommitRow>, StoreError>> {
        let log = self.lock();
        let row = log
            .by_hash
            .get(hash)
            .and_then(|(session, generation)| log.sessions.get(session)?.commits.get(generation))
            .cloned();
        Box::pin(std::future::ready(Ok(row)))
    }

    fn append(&self, append: Append) -> BoxFuture<'_, Result<Option<Claimed>, StoreError>> {
        Box::pin(std::future::ready(self.append_now(append)))
    }

    fn consume<'a>(&'a self, session: &'a str, expected: u64, before: u64) -> BoxFuture<'a, Result<bool, StoreError>> {
        let moved = match self.lock().sessions.get_mut(session) {
            Some(s) if s.row.generation == expected && s.row.consumed_seq <= before => {
                s.row.consumed_seq = before;
                true
            }
            _ => false,
        };
        Box::pin(std::future::ready(Ok(moved)))
    }

    fn put_checkpoint(&self, row: CheckpointRow, keep: usize) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut log = self.lock();
        let kept = log.checkpoints.entry(row.session.clone()).or_default();
        kept.insert(row.generation, row);
        while kept.len() > keep {
            kept.pop_first();
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn checkpoints<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<Vec<CheckpointRow>, StoreError>> {
        let rows = self
            .lock()
            .checkpoints
            .get(session)
            .map(|kept| kept.values().cloned().collect())
            .unwrap_or_default();
        Box::pin(std::future::ready(Ok(rows)))
    }

    fn keep_answer(&self, row: AnswerRow) -> BoxFuture<'_, Result<(), StoreError>> {
        self.lock().answers.push(row);
        Box::pin(std::future::ready(Ok(())))
    }

    fn answers<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<Vec<AnswerRow>, StoreError>> {
        let rows = self
            .lock()
            .answers
            .iter()
            .filter(|a| a.session == session)
            .cloned()
            .collect();
        Box::pin(std::future::ready(Ok(rows)))
    }

    fn drop_answers<'a>(
        &'a self,
        session: &'a str,
        runs: &'a [(String, String)],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.lock().answers.retain(|a| {
            a.session != session
                || !runs
                    .iter()
                    .any(|(produce, trigger)| *produce == a.produce && *trigger == a.trigger)
        });
        Box::pin(std::future::ready(Ok(())))
    }

    fn verify_outbox(&self, check: OutboxCheck) -> BoxFuture<'_, Result<Option<VerifyError>, StoreError>> {
        Box::pin(std::future::ready(Ok(self.verify_now(&check))))
    }
}
