//! The context: versioned working state of one session.

use std::collections::VecDeque;
#[cfg(feature = "sqlite")]
use std::path::Path;
use std::sync::Arc;

use futures_util::FutureExt;
use std::time::Duration;
use tracing::Instrument;

use crate::model::action::Origin;
use crate::model::artifact::{Artifact, ArtifactId, Generation, ReadError, Record};
use crate::model::delivery::NewIntent;
use crate::model::event::{Event, EventKind, QueuedEvent};
use crate::model::hash::{CommitHash, StateHash};
use crate::model::patch::{EffectError, Op};
use crate::model::trace::TraceParent;
use crate::state::commit::{Acted, Apply, Commit, CommitError, Emitted, RunRecord};
use crate::state::graph::Graph;
use crate::state::live::State;
use crate::state::log::{Base, Log};
use crate::state::readers::Readers;
use crate::state::refold::{Checks, Refold, VerifyError};
use crate::state::snapshot::Snapshot;
use crate::state::writes::Writes;
#[cfg(feature = "sqlite")]
use crate::store::backed::block_on;
use crate::store::ledger::Ledger;
use crate::store::log_store::LogStore;
use crate::store::memory::MemoryOutbox;
use crate::store::outbox::{ClaimRequest, Claimed, OutboxStore, Scope};
#[cfg(feature = "sqlite")]
use crate::store::SqliteStore;
use crate::store::{Backed, Checkpoint, CommitDelta, Loaded, OpenError, OpenOptions, StoreError};

/// The room the event queue keeps whatever its length (a few pages of events).
const SPARE_EVENTS: usize = 1024;

/// A direct write to a context (seeding, [`Context::create`](crate::Context::create) and
/// friends) failed; nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The value could not be encoded, or a pending action was written directly.
    #[error(transparent)]
    Effect(#[from] EffectError),
    /// The write does not apply to the current state.
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// The durable store could not persist the commit.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The versioned working state of one session: current artifacts and relations, the commit
/// log, the FIFO queue of events waiting for a generation, and the delivery ledger.
///
/// Seed it with direct writes ([`create`](Context::create), [`update`](Context::update),
/// [`transaction`](Context::transaction)); they commit and emit events exactly like a
/// generation does. Then hand it to a [`Runtime`](crate::Runtime).
///
/// ```
/// use reactifact_core::{Artifact, Context};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Debug, PartialEq)]
/// struct Order { total_cents: u64 }
/// impl Artifact for Order { const KIND: &'static str = "order"; }
///
/// let mut ctx = Context::new("orders");
/// ctx.create("order:1", Order { total_cents: 1200 })?;
/// let order = ctx.get::<Order>("order:1")?.expect("just created");
/// assert_eq!(order.data.total_cents, 1200);
/// assert_eq!(ctx.queued_events(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Context {
    session: Arc<str>,
    /// Shared with the snapshots taken of it: one reference count per snapshot, and the commit
    /// writes it in place once they are gone.
    state: Arc<State>,
    /// The commit log; from a checkpoint, only the commits after it are held (see
    /// [`Log`]).
    log: Log,
    events: VecDeque<QueuedEvent>,
    next_event_seq: u64,
    /// The outbox of the store: the delivery ledger, shared with forks and every other drain
    /// of the store.
    outbox: Arc<dyn OutboxStore>,
    /// The in-memory outbox, when no durable store registers this context's intents in its
    /// commits: the context registers them itself.
    memory: Option<Arc<MemoryOutbox>>,
    /// Merge levels, commits reached through merges, and how to undo the log's commits.
    graph: Graph,
    /// The durable home of the session; `None` in memory.
    store: Option<Backed>,
    /// How long this process leases an in-flight delivery.
    lease: Duration,
    /// A commit was cut off (its future dropped) while its store write was under way: whether
    /// the store has it is unknown, so the context writes nothing more until it is reopened.
    cut: bool,
    /// A checkpoint is written after every commit whose generation is a multiple of this (0:
    /// none).
    checkpoint_every: u64,
    /// The runs that watch what they read (staleness), by what they read.
    readers: Readers,
}

/// A commit's changes to the state while its store write is under way: dropped before
/// [`keep`](CutCommit::keep) (the commit's future was dropped), it takes them back and marks
/// the context cut off.
struct CutCommit<'a, 'b> {
    apply: Option<Apply<'a>>,
    cut: &'b mut bool,
}

impl<'a> CutCommit<'a, '_> {
    fn keep(mut self) -> Apply<'a> {
        self.apply.take().expect("kept once")
    }
}

impl Drop for CutCommit<'_, '_> {
    fn drop(&mut self) {
        if let Some(apply) = self.apply.take() {
            apply.rollback();
            *self.cut = true;
            tracing::error!("a commit was cut off while its store write was under way; the context writes nothing more until it is reopened");
        }
    }
}

/// What a runtime's generation commit does besides committing, in the same store write.
pub(crate) struct GenerationCommit<'a> {
    /// Whether a produce of the runtime may react to an event, given the readers index after
    /// the commit. The events the commit emits that none reacts to, at the head of the queue,
    /// are consumed by the commit itself (counted in its
    /// [`events_consumed`](Commit::events_consumed)), instead of by a write of their own in the
    /// next generation.
    pub(crate) reacts: &'a (dyn Fn(&Emitted, Generation, &Readers) -> bool + Sync),
    /// The commit also claims, for the runtime's drain, up to this many due intents of the
    /// session (the ones it registers among them) in its transaction, for this lease owner
    /// and under this lease. Only a durable store claims; the memory outbox is claimed from
    /// by the drain.
    pub(crate) claim: Option<TurnClaim<'a>>,
    /// The trace context of each run committed (in the order of the runs given), kept beside
    /// the intents it acts (`Intent::trace_parent`), not hashed.
    pub(crate) traces: &'a [Option<TraceParent>],
}

/// The claim a commit makes for its runtime's drain ([`GenerationCommit::claim`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TurnClaim<'a> {
    /// At most this many.
    pub(crate) limit: usize,
    /// The lease owner.
    pub(crate) owner: &'a Arc<str>,
    /// The lease.
    pub(crate) lease: Duration,
    /// The drain's rate limits and priorities.
    pub(crate) policy: &'a crate::model::policy::ClaimPolicy,
}

/// Why a commit of runs failed.
pub(crate) enum CommitFailure {
    /// The patch of this run does not apply.
    Patch(usize, CommitError),
    /// The store could not persist the commit.
    Store(StoreError),
}

impl From<CommitFailure> for WriteError {
    fn from(failure: CommitFailure) -> Self {
        match failure {
            CommitFailure::Patch(_, e) => WriteError::Commit(e),
            CommitFailure::Store(e) => WriteError::Store(e),
        }
    }
}

impl Context {
    /// An empty, in-memory context for the named session.
    pub fn new(session: impl Into<String>) -> Self {
        let memory = MemoryOutbox::new();
        Context {
            session: Arc::from(session.into()),
            state: Arc::default(),
            log: Log::default(),
            events: VecDeque::new(),
            next_event_seq: 0,
            outbox: memory.clone(),
            memory: Some(memory),
            graph: Graph::default(),
            store: None,
            lease: OpenOptions::default().lease,
            cut: false,
            checkpoint_every: 0,
            readers: Readers::default(),
        }
    }

    /// Opens (creating if needed) the named session in the SQLite file at `path`, with the
    /// default [`OpenOptions`]: WAL mode, `synchronous = FULL`, a 30-second delivery lease.
    ///
    /// The session is loaded into memory from its newest checkpoint (see
    /// [`OpenOptions::checkpoint_every`]) and the commits after it, or from its first commit
    /// if it has none; every commit is written to the file before it takes effect, in one transaction with the intents it registers in the file's outbox (which
    /// every context and [`Drainer`](crate::Drainer) of the file shares). Reopening resumes
    /// where the last process stopped: queued events are still queued and pending intents
    /// still pending. Intents left in flight by a process that died are delivered again, with
    /// the same idempotency key, by the first drain that runs after their lease expired (see
    /// [`Delivery::expired_leases`](crate::Delivery::expired_leases)).
    ///
    /// # Errors
    /// [`OpenError`] names the path and what is wrong: not a database, corrupt, a newer
    /// schema, a missing session (read-only), or another SQLite error.
    #[cfg(feature = "sqlite")]
    #[allow(clippy::result_large_err)] // see `OpenError::Corrupt`: its source stays unboxed to downcast
    pub fn open(path: impl AsRef<Path>, session: impl Into<String>) -> Result<Self, OpenError> {
        Self::open_with(path, session, OpenOptions::default())
    }

    /// [`open`](Context::open) with options.
    ///
    /// # Errors
    /// As [`open`](Context::open).
    #[cfg(feature = "sqlite")]
    #[allow(clippy::result_large_err)] // see `OpenError::Corrupt`: its source stays unboxed to downcast
    pub fn open_with(
        path: impl AsRef<Path>,
        session: impl Into<String>,
        options: OpenOptions,
    ) -> Result<Self, OpenError> {
        let session = session.into();
        let path = path.as_ref();
        let file = SqliteStore::open_file(path, &session, &options)?;
        let opened = block_on(Backed::open(file.clone(), &session, &options, path.into()));
        let (mut store, mut loaded) = opened.map_err(|e| file.file_error(e))?;
        let mut context = Context::new(session);
        let base = context.restore(&mut loaded).map_err(|e| OpenError::Corrupt {
            path: path.into(),
            detail: e.to_string(),
            source: Some(e),
        })?;
        // Only a log that verified is written to.
        file.settle(&context.session, &loaded.commits)?;
        block_on(store.settle()).map_err(|e| file.file_error(e))?;
        let outbox = store.outbox();
        context.install(store, outbox, base, loaded, &options);
        Ok(context)
    }

    /// Opens (creating if needed) the named session of a store of another crate — a
    /// [`LogStore`], such as the PostgreSQL store of `reactifact-postgres` — with the default
    /// [`OpenOptions`]: a 30-second delivery lease, a checkpoint every 10,000 commits.
    ///
    /// As [`open`](Context::open) does for a SQLite file: the session is loaded from its
    /// newest checkpoint that checks out and the commits after it, every commit is appended
    /// to the store before it takes effect, in one transaction with the intents it registers
    /// in the store's outbox, and reopening resumes where the last process stopped.
    /// Several processes may open one session: their commits are fenced on the session's
    /// generation, so one of two racing commits fails with [`StoreError::Conflict`] and
    /// changes nothing; a [`Runtime`](crate::Runtime) then reads the other's commits and runs
    /// its generation again on them (see [`TurnReport::conflicts`](crate::TurnReport::conflicts)).
    /// Every runtime writing one session must run the same agents and produces: the session's
    /// consumed events are shared, and a runtime consumes the events none of its produces
    /// reacts to.
    ///
    /// A direct write ([`create`](Context::create) and friends) waits for the store by
    /// blocking its thread, as on SQLite; a runtime's generations do not.
    ///
    /// # Errors
    /// [`OpenError::Store`] for an error of the store; [`OpenError::Corrupt`] (naming the
    /// store as it describes itself) for a log that does not verify;
    /// [`OpenError::NoSuchSession`] for a missing session opened read-only or with
    /// [`OpenOptions::create`] off.
    #[allow(clippy::result_large_err)] // see `OpenError::Corrupt`: its source stays unboxed to downcast
    pub async fn open_store(store: Arc<dyn LogStore>, session: impl Into<String>) -> Result<Self, OpenError> {
        Self::open_store_with(store, session, OpenOptions::default()).await
    }

    /// [`open_store`](Context::open_store) with options ([`OpenOptions::synchronous`] is
    /// SQLite's and has no effect here).
    ///
    /// # Errors
    /// As [`open_store`](Context::open_store).
    #[allow(clippy::result_large_err)] // see `OpenError::Corrupt`: its source stays unboxed to downcast
    pub async fn open_store_with(
        store: Arc<dyn LogStore>,
        session: impl Into<String>,
        options: OpenOptions,
    ) -> Result<Self, OpenError> {
        let session = session.into();
        let description = store.describe();
        let (mut store, mut loaded) = Backed::open(store, &session, &options, description.clone().into()).await?;
        let mut context = Context::new(session);
        let base = context.restore(&mut loaded).map_err(|e| OpenError::Corrupt {
            path: description.into(),
            detail: e.to_string(),
            source: Some(e),
        })?;
        store.settle().await?;
        let outbox = store.outbox();
        context.install(store, outbox, base, loaded, &options);
        Ok(context)
    }

    /// The last step of an open: the restored log, the store and its outbox, the options.
    fn install(
        &mut self,
        store: Backed,
        outbox: Arc<dyn OutboxStore>,
        base: Option<Base>,
        mut loaded: Loaded,
        options: &OpenOptions,
    ) {
        self.lease = options.lease;
        self.checkpoint_every = options.checkpoint_every;
        let commits = std::mem::take(&mut loaded.commits);
        self.log = match base {
            Some(base) => Log::from_checkpoint(base, commits),
            None => Log::new(commits),
        };
        self.outbox = outbox;
        self.memory = None;
        self.store = Some(store);
    }

    /// After a write failed with [`StoreError::Conflict`] (another writer — another process
    /// on the same session of the store — committed first): reads the commits the other writer
    /// appended and applies them, checking each as an open does, queues the events they emit
    /// and drops the events the session has consumed since; the next write is made on the new
    /// head. Returns how many commits were read (0 for an in-memory context). A
    /// [`Runtime`](crate::Runtime) does this itself and runs its generation again; a direct
    /// writer calls it and writes again.
    ///
    /// Runs off the caller's thread.
    ///
    /// # Errors
    /// The store's error; [`StoreError::History`] if a commit read cannot be applied here (a
    /// merge commit, or one that does not check out), after which the context refuses writes,
    /// as after a cut-off commit, until it is reopened.
    pub async fn catch_up(&mut self) -> Result<usize, StoreError> {
        self.check_not_cut()?;
        self.settle_log();
        let Some(store) = &mut self.store else {
            return Ok(0);
        };
        // On an error nothing moved (the store's fence moves with what it read).
        let caught = store.catch_up().await?;
        let describe = store.describe();
        let refused = |detail: String| StoreError::History {
            store: describe.clone(),
            session: self.session.to_string(),
            detail,
        };
        let mut refold = match self.log.head() {
            Some(head) => Refold::resuming(State::clone(&self.state), self.generation(), head, Checks::STATE),
            None => Refold::new(Checks::STATE),
        }
        .keep_undo()
        .keep_readers(self.readers.clone());
        let mut seq = self.next_event_seq;
        let mut events = Vec::new();
        let mut failed = None;
        for commit in &caught.commits {
            if commit.merged.is_some() {
                failed = Some(format!(
                    "another writer merged into the session at generation {}; reopen it",
                    commit.generation
                ));
                break;
            }
            match refold.step(commit) {
                Ok(emitted) => {
                    for mut event in emitted {
                        event.seq = seq;
                        events.push(event);
                        seq += 1;
                    }
                }
                Err(e) => {
                    failed = Some(e.to_string());
                    break;
                }
            }
        }
        if let Some(detail) = failed {
            self.cut = true;
            return Err(refused(detail));
        }
        let readers = refold.readers().cloned().unwrap_or_default();
        let (state, undone) = refold.into_parts();
        for (generation, undone) in undone {
            self.graph.record(generation, Some(undone));
        }
        self.readers = readers;
        let read = caught.commits.len();
        for commit in caught.commits {
            self.log.push(commit);
        }
        self.state = Arc::new(state);
        self.next_event_seq = seq;
        self.events.extend(events);
        self.events.retain(|q| q.seq >= caught.consumed_seq);
        tracing::debug!(session = %self.session, commits = read, generation = self.generation().0, "caught up with another writer");
        Ok(read)
    }

    /// Rebuilds the context from a store's log: from its checkpoint, if it has one, refolds
    /// every commit after it, checking its parent link and the state hash it recorded, and
    /// requeues the events not yet consumed. Returns where the log starts, from a checkpoint.
    fn restore(&mut self, loaded: &mut Loaded) -> Result<Option<Base>, VerifyError> {
        let (mut seq, mut refold, base) = match loaded.checkpoint.take() {
            Some(checkpoint) => {
                let Checkpoint {
                    generation,
                    hash,
                    state,
                    next_event_seq,
                    events,
                    readers,
                    ..
                } = checkpoint;
                self.events
                    .extend(events.into_iter().filter(|q| q.seq >= loaded.consumed_seq));
                let refold = Refold::resuming(state.clone(), generation, hash, Checks::STATE)
                    .keep_undo()
                    .keep_readers(readers.clone());
                let base = Base {
                    generation,
                    hash,
                    state,
                    next_event_seq,
                    readers,
                };
                (next_event_seq, refold, Some(base))
            }
            None => (
                0,
                Refold::keeping_undo(Checks::STATE).keep_readers(Readers::default()),
                None,
            ),
        };
        for commit in &loaded.commits {
            for mut event in refold.step(commit)? {
                if seq >= loaded.consumed_seq {
                    event.seq = seq;
                    self.events.push_back(event);
                }
                seq += 1;
            }
        }
        self.readers = refold.readers().cloned().unwrap_or_default();
        let (state, undone) = refold.into_parts();
        // From a checkpoint the graph knows how to undo the held commits; their merges'
        // histories are read with the older commits, when a merge or a diff needs them.
        self.graph = Graph::restored(&loaded.commits, undone, &loaded.foreign)?;
        self.state = Arc::new(state);
        self.next_event_seq = seq;
        Ok(base)
    }

    pub(crate) fn state(&self) -> &State {
        &self.state
    }

    /// The runs that watch what they read, by what they read.
    pub(crate) fn readers(&self) -> &Readers {
        &self.readers
    }

    /// How many events the log has emitted (the number the next one gets).
    pub(crate) fn next_event_seq(&self) -> u64 {
        self.next_event_seq
    }

    pub(crate) fn store(&self) -> Option<&Backed> {
        self.store.as_ref()
    }

    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }

    pub(crate) fn graph_mut(&mut self) -> &mut Graph {
        self.settle_log();
        &mut self.graph
    }

    /// The log as held.
    pub(crate) fn held_log(&self) -> &Log {
        &self.log
    }

    /// The whole log and the graph of it, reading the commits before the checkpoint the
    /// context was opened from, if any, from its store (once).
    pub(crate) fn whole(&self) -> Result<(&[Commit], &Graph), VerifyError> {
        let load = self
            .store
            .as_ref()
            .map(|store| move |upto: Generation, tail: &[Commit]| store.load_before(upto, tail));
        self.log.whole(load.as_ref().map(|l| l as _), &self.graph)
    }

    /// [`whole`](Context::whole), reading the older commits off the caller's thread (on the
    /// store's), for the async reads of the whole log.
    pub(crate) async fn whole_async(&self) -> Result<(&[Commit], &Graph), VerifyError> {
        if let (Some((upto, held)), Some(store)) = (self.log.to_read(), &self.store) {
            let (prefix, foreign) = store.load_before_async(upto, held).await?;
            self.log.install(prefix, foreign, &self.graph)?;
        }
        self.whole()
    }

    /// Takes the whole log, if it was read, as the one held, before a write.
    fn settle_log(&mut self) {
        if let Some(graph) = self.log.settle() {
            self.graph.union(&graph);
        }
    }

    /// A checkpoint of the head: the commit, an O(1) clone of the state, the event position
    /// and the queued events. `None` before the first commit.
    pub(crate) fn checkpoint_of_head(&self) -> Option<Checkpoint> {
        Some(Checkpoint {
            generation: self.generation(),
            hash: self.log.head()?,
            state_hash: self.state.state_hash(),
            state: State::clone(&self.state),
            next_event_seq: self.next_event_seq,
            events: self.events.iter().cloned().collect(),
            readers: self.readers.clone(),
        })
    }

    /// After a commit: hands the store a checkpoint of it if its generation is due
    /// ([`OpenOptions::checkpoint_every`]). The store encodes and writes it on its own thread,
    /// without the commit waiting for it.
    fn checkpoint_if_due(&self) {
        let generation = self.generation().0;
        if self.checkpoint_every == 0 || generation % self.checkpoint_every != 0 {
            return;
        }
        if let (Some(store), Some(checkpoint)) = (&self.store, self.checkpoint_of_head()) {
            store.checkpoint_later(checkpoint);
        }
    }

    /// Writes a checkpoint of the state at the head now, whatever
    /// [`OpenOptions::checkpoint_every`] says, and waits until it is durable: the next open of
    /// the session starts from it (or from a newer one). The state is handed over as an O(1)
    /// clone and encoded (O(state)) on the store's thread, not on the caller's. The store keeps
    /// the newest two checkpoints of a session. Returns the checkpoint's generation; `None`
    /// for an in-memory context (which has no use for one) or before the first commit.
    ///
    /// # Errors
    /// [`StoreError::ReadOnly`] for a read-only context, [`StoreError::CutOff`] after a cut-off
    /// commit, or the store's error.
    pub async fn checkpoint(&self) -> Result<Option<Generation>, StoreError> {
        self.check_not_cut()?;
        let (Some(store), Some(checkpoint)) = (&self.store, self.checkpoint_of_head()) else {
            return Ok(None);
        };
        let generation = checkpoint.generation;
        store.checkpoint(checkpoint).await?;
        Ok(Some(generation))
    }

    /// A branch of this context: `state`, `log` and its `graph` as given, no queued event, the
    /// same outbox and lease.
    pub(crate) fn branch(
        &self,
        session: String,
        state: State,
        log: Log,
        graph: Graph,
        next_event_seq: u64,
        store: Option<Backed>,
    ) -> Context {
        Context {
            session: Arc::from(session),
            state: Arc::new(state),
            log,
            events: VecDeque::new(),
            next_event_seq,
            outbox: self.outbox.clone(),
            memory: self.memory.clone(),
            graph,
            store,
            lease: self.lease,
            cut: false,
            checkpoint_every: self.checkpoint_every,
            readers: Readers::default(),
        }
    }

    /// This context with the readers index `readers` (a branch's, at its fork point).
    pub(crate) fn with_readers(mut self, readers: Readers) -> Context {
        self.readers = readers;
        self
    }

    /// Where the session lives: `memory`, or `sqlite:{path}`.
    pub fn store_description(&self) -> String {
        self.store
            .as_ref()
            .map_or_else(|| "memory".to_owned(), |s| s.describe())
    }

    /// The session (branch) name.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// An O(1) read-only view of the current state, sharing structure with it.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::shared(Arc::clone(&self.state))
    }

    /// Reads the artifact stored under `id` as a `T`; `Ok(None)` if there is none.
    ///
    /// # Errors
    /// [`ReadError::WrongKind`] if the id holds another kind, [`ReadError::Decode`] if its bytes
    /// do not decode as `T`.
    pub fn get<T: Artifact>(&self, id: &str) -> Result<Option<Record<T>>, ReadError> {
        self.state.read(id)
    }

    /// Every artifact of type `T`, in creation order, decoded one at a time.
    pub fn list<T: Artifact>(&self) -> impl Iterator<Item = Result<Record<T>, ReadError>> + '_ {
        self.state.list()
    }

    /// The events a serving runtime parked (see [`Parked`](crate::Parked)), in the order they
    /// were first parked.
    pub fn parked(&self) -> impl Iterator<Item = Result<Record<crate::model::parked::Parked>, ReadError>> + '_ {
        self.list::<crate::model::parked::Parked>()
    }

    /// How many artifacts exist.
    pub fn len(&self) -> usize {
        self.state.len()
    }

    /// Whether no artifact exists.
    pub fn is_empty(&self) -> bool {
        self.state.len() == 0
    }

    /// The targets of relations `from -[name]-> *`, in id order.
    pub fn related<'a>(&'a self, from: &'a ArtifactId, name: &'a str) -> impl Iterator<Item = &'a ArtifactId> + 'a {
        self.state.related(from, name)
    }

    /// The deterministic digest of every current artifact and relation (O(1): maintained
    /// incrementally by every commit).
    pub fn state_hash(&self) -> StateHash {
        self.state.state_hash()
    }

    /// The whole commit log, oldest first.
    ///
    /// A context opened from a checkpoint holds only the commits after it: the first call
    /// reads the older ones from the store (O(history), blocking the caller's thread while it
    /// reads), refolds them, checking their parent links and state hashes as an open without a
    /// checkpoint does, and keeps them.
    ///
    /// # Errors
    /// [`VerifyError::History`] if the older commits cannot be read, or the refold's error if
    /// one of them does not check out. Never for a context that holds its whole log (in
    /// memory, or opened without a checkpoint).
    pub fn log(&self) -> Result<&[Commit], VerifyError> {
        self.whole().map(|(log, _)| log)
    }

    /// The hash of the last commit, or `None` before the first.
    pub fn head(&self) -> Option<CommitHash> {
        self.log.head()
    }

    /// The generation of the last commit (0 before the first).
    pub fn generation(&self) -> Generation {
        Generation(self.log.len())
    }

    /// How many events wait for a generation.
    pub fn queued_events(&self) -> usize {
        self.events.len()
    }

    /// The queued events, oldest first.
    pub fn events(&self) -> impl Iterator<Item = &Event> + '_ {
        self.events.iter().map(|q| &q.event)
    }

    /// The queued events with their positions (and, for deletions, the version deleted),
    /// oldest first.
    pub(crate) fn queued(&self) -> impl Iterator<Item = &QueuedEvent> + '_ {
        self.events.iter()
    }

    /// The outbox of the context's store: the delivery ledger and its operations, shared
    /// with the context's branches and with every other context and
    /// [`Drainer`](crate::Drainer) of the store. Hand it to a `Drainer` to deliver this
    /// store's intents from another task.
    pub fn outbox(&self) -> Arc<dyn OutboxStore> {
        self.outbox.clone()
    }

    pub(crate) fn outbox_ref(&self) -> &dyn OutboxStore {
        self.outbox.as_ref()
    }

    /// The delivery ledger of the store (every session's intents; scope it with
    /// [`Ledger::session`]).
    pub fn ledger(&self) -> Ledger {
        Ledger::new(self.outbox.clone())
    }

    /// How long this context leases an in-flight delivery.
    pub(crate) fn lease_duration(&self) -> Duration {
        self.lease
    }

    /// Creates `value` at `id`, or refreshes it (a new version only if the content differs).
    /// Emits a `Created` or `Updated` event and commits, like a generation does.
    pub fn create<T: Artifact>(&mut self, id: impl Into<ArtifactId>, value: T) -> Result<(), WriteError> {
        let mut tx = self.transaction();
        tx.create(id, value);
        tx.commit()
    }

    /// Replaces the artifact at `id`; fails with [`CommitError::UnknownId`] if there is none.
    /// Equal content is a no-op: no version, no event, no commit.
    pub fn update<T: Artifact>(&mut self, id: impl Into<ArtifactId>, value: T) -> Result<(), WriteError> {
        let mut tx = self.transaction();
        tx.update(id, value);
        tx.commit()
    }

    /// Deletes the artifact at `id` and its relations; a missing id is a no-op.
    pub fn delete(&mut self, id: impl Into<ArtifactId>) -> Result<(), WriteError> {
        let mut tx = self.transaction();
        tx.delete(id);
        tx.commit()
    }

    /// Adds the relation `from -[name]-> to`; both must exist.
    pub fn link(
        &mut self,
        from: impl Into<ArtifactId>,
        name: &str,
        to: impl Into<ArtifactId>,
    ) -> Result<(), WriteError> {
        let mut tx = self.transaction();
        tx.link(from, name, to);
        tx.commit()
    }

    /// Removes the relation `from -[name]-> to`, if present.
    pub fn unlink(
        &mut self,
        from: impl Into<ArtifactId>,
        name: &str,
        to: impl Into<ArtifactId>,
    ) -> Result<(), WriteError> {
        let mut tx = self.transaction();
        tx.unlink(from, name, to);
        tx.commit()
    }

    /// Starts a batch of direct writes that commits as one generation. Seeding many artifacts
    /// this way costs one commit instead of one per write.
    pub fn transaction(&mut self) -> Transaction<'_> {
        Transaction {
            context: self,
            writes: Writes::new(),
        }
    }

    /// Applies the runs of one generation as one atomic unit, consumes `consumed` queued events,
    /// queues the events the changes emit and registers new intents in the ledger; with a
    /// durable store, all of it is written in one transaction first.
    ///
    /// With `isolate`, a run whose patch does not apply is dropped (and reported in the result)
    /// while the others commit; without it, the first such run fails everything and nothing
    /// changes.
    ///
    /// The store's write blocks this thread until it is durable, as a direct write does; the
    /// runtime's generations use [`commit_runs_async`](Context::commit_runs_async).
    pub(crate) fn commit_runs(
        &mut self,
        runs: Vec<RunRecord>,
        consumed: usize,
        isolate: bool,
        skip_if_unchanged: bool,
        merged: Option<CommitHash>,
    ) -> Result<Vec<(usize, CommitError)>, CommitFailure> {
        let _span = self.commit_span().entered();
        self.commit_runs_via(runs, consumed, isolate, skip_if_unchanged, merged, None)
            .now_or_never()
            .expect("a blocking write completes without waiting")
            .map(|(rejected, _)| rejected)
    }

    /// [`commit_runs`](Context::commit_runs) for a runtime's generation: the store write runs
    /// off this thread (for a durable store: on its own thread), so that a generation's fsync
    /// never blocks an executor thread, and `turn` says what else the commit does in the same
    /// write. Returns, besides the rejected runs, what the commit claimed (`None` if it made no
    /// claim: none was asked for, or the context is in memory).
    pub(crate) async fn commit_generation(
        &mut self,
        runs: Vec<RunRecord>,
        consumed: usize,
        isolate: bool,
        turn: &GenerationCommit<'_>,
    ) -> Result<(Vec<(usize, CommitError)>, Option<Claimed>), CommitFailure> {
        let span = self.commit_span();
        self.commit_runs_via(runs, consumed, isolate, false, None, Some(turn))
            .instrument(span)
            .await
    }

    fn commit_span(&self) -> tracing::Span {
        tracing::debug_span!("commit", session = %self.session, generation = self.generation().next().0)
    }

    async fn commit_runs_via(
        &mut self,
        mut runs: Vec<RunRecord>,
        consumed: usize,
        isolate: bool,
        skip_if_unchanged: bool,
        merged: Option<CommitHash>,
        turn: Option<&GenerationCommit<'_>>,
    ) -> Result<(Vec<(usize, CommitError)>, Option<Claimed>), CommitFailure> {
        let started = tokio::time::Instant::now();
        self.check_not_cut().map_err(CommitFailure::Store)?;
        self.settle_log();
        let generation = self.generation().next();
        // In place unless a snapshot of the state outlived its generation; then on an O(1)
        // copy of it (see `state::layered`).
        let state = Arc::make_mut(&mut self.state);
        let ops = runs.iter().map(|run| run.ops.len()).sum();
        // Room for every artifact a large commit may create at once (see `Layered::reserve`).
        state.reserve(ops);
        let mut apply = Apply::new(state, generation).with_room(ops);
        let mut rejected = Vec::new();
        for (i, run) in runs.iter().enumerate() {
            // Its position in the commit once the rejected runs before it are dropped.
            apply.run = i - rejected.len();
            if let Err(e) = apply.patch(&run.ops) {
                if isolate {
                    rejected.push((i, e));
                } else {
                    apply.rollback();
                    return Err(CommitFailure::Patch(i, e));
                }
            }
        }
        if skip_if_unchanged && !apply.changed() {
            apply.rollback();
            // A write that changes nothing here may change something at the store's head: it
            // is refused, as a commit would be, if another writer advanced the session.
            if let Some(store) = &self.store {
                match turn {
                    None => store.check_current(),
                    Some(_) => store.check_current_async().await,
                }
                .map_err(CommitFailure::Store)?;
            }
            return Ok((rejected, None));
        }
        if !rejected.is_empty() {
            let mut dropped = rejected.iter().map(|&(i, _)| i).peekable();
            runs = runs
                .into_iter()
                .enumerate()
                .filter(|&(i, _)| dropped.next_if_eq(&i).is_none())
                .map(|(_, run)| run)
                .collect();
        }
        let events = std::mem::take(&mut apply.events);
        let next_seq = self.next_event_seq + events.len() as u64;
        // The readers index after the commit (an O(1) clone, then what its runs change).
        let mut readers = self.readers.clone();
        let deleted = events.iter().filter(|e| e.kind() == EventKind::Deleted);
        readers.record(generation, &runs, deleted.map(|e| e.id()));
        // With nothing else left in the queue, the events this commit emits that no produce
        // reacts to are consumed by the commit itself, not by a write of their own.
        let own_consumed = match turn {
            Some(turn) if self.events.len() == consumed => events
                .iter()
                .take_while(|e| !(turn.reacts)(e, generation, &readers))
                .count(),
            _ => 0,
        };
        let state_hash = apply.state().state_hash();
        let parent = self.log.head();
        let events_consumed = consumed + own_consumed;
        let hash = Commit::compute_hash(
            parent.as_ref(),
            merged.as_ref(),
            generation,
            &state_hash,
            events_consumed,
            &runs,
        );
        let commit = Commit {
            generation,
            parent,
            merged,
            hash,
            state_hash,
            runs: runs.into(),
            events_consumed,
        };
        let now = crate::model::time::now();
        // The trace of the run that acted each intent (`acted.run` counts the kept runs only).
        let trace_of = |run: u32| {
            let mut given = run as usize;
            for &(r, _) in &rejected {
                if r <= given {
                    given += 1;
                }
            }
            turn.and_then(|turn| turn.traces.get(given).copied().flatten())
        };
        let mut acted = std::mem::take(&mut apply.intents);
        let intent_count = acted.len();
        // One origin for the commit, shared by its intents (none for a commit without).
        let origin = (!acted.is_empty()).then(|| Origin::new(self.session.clone(), commit.hash, generation, 0));
        let mut claimed = None;
        if let Some(store) = &mut self.store {
            let intents: Vec<NewIntent> = match &origin {
                Some(origin) => {
                    Acted::into_new_intents(std::mem::take(&mut acted), &commit.runs, origin, trace_of).collect()
                }
                None => Vec::new(),
            };
            let scope = Scope::session(&*self.session);
            let delta = CommitDelta {
                session: &self.session,
                commit: &commit,
                consumed_before: match self.events.get(consumed) {
                    Some(q) => q.seq,
                    None => self.next_event_seq + own_consumed as u64,
                },
                intents: &intents,
                now,
                claim: turn.and_then(|turn| turn.claim).map(|claim| ClaimRequest {
                    scope: &scope,
                    limit: claim.limit,
                    owner: claim.owner,
                    lease: claim.lease,
                    now,
                    policy: claim.policy,
                }),
            };
            let written = match turn {
                None => store.commit(&delta).map(|()| Claimed::default()),
                Some(_) => {
                    // If this future is dropped while the store writes, the write may or may
                    // not land: the state is rolled back and the context refuses further
                    // writes until it is reopened (the guard's drop).
                    let cut = CutCommit {
                        apply: Some(apply),
                        cut: &mut self.cut,
                    };
                    let written = store.commit_async(&delta).await;
                    apply = cut.keep();
                    written
                }
            };
            match written {
                Ok(taken) => claimed = delta.claim.is_some().then_some(taken),
                Err(e) => {
                    apply.rollback();
                    return Err(CommitFailure::Store(e));
                }
            }
            crate::model::telemetry::record_commit(started.elapsed(), intents.iter().map(|new| &new.intent.kind));
        }
        self.graph.record(generation, apply.finish());
        tracing::debug!(commit = %hash.short(), events = events.len(), intents = intent_count, "committed");
        // The committed runs, to read the intents from below (in memory; a store has them).
        let runs = (!acted.is_empty()).then(|| commit.runs.clone());
        self.log.push(commit);
        self.readers = readers;
        self.events.drain(..consumed);
        let first_seq = self.next_event_seq;
        let kept = events.into_iter().enumerate().skip(own_consumed);
        self.events
            .extend(kept.map(|(i, e)| e.queued(first_seq + i as u64, generation)));
        // A burst (a bulk load's events) leaves its room behind once consumed: give the bulk
        // of it back (amortised: the queue must grow fourfold again before the next shrink).
        if self.events.capacity() > SPARE_EVENTS && self.events.len() < self.events.capacity() / 4 {
            self.events.shrink_to(self.events.len() * 2);
        }
        self.next_event_seq = next_seq;
        // In memory the ledger registers the commit's intents from the committed runs, after
        // the commit's temporaries above are gone, and they are counted as it does.
        if self.store.is_none() {
            let mut tally = crate::model::telemetry::CommitTally::new(started.elapsed());
            if let (Some(memory), Some(origin), Some(runs)) = (&self.memory, &origin, &runs) {
                let intents = Acted::into_new_intents(acted, runs, origin, trace_of);
                memory.register(intents.inspect(|new| tally.intent(&new.intent.kind)), now);
            }
            tally.record();
        }
        self.checkpoint_if_due();
        Ok((rejected, claimed))
    }

    fn check_not_cut(&self) -> Result<(), StoreError> {
        if self.cut {
            return Err(StoreError::cut_off(self.store_description(), self.session.to_string()));
        }
        Ok(())
    }

    /// Commits `ops` as one direct write (no agent, produce or trigger); nothing if they
    /// change nothing.
    pub(crate) fn commit_direct(&mut self, ops: Vec<Op>) -> Result<(), WriteError> {
        let run = RunRecord::direct(ops);
        self.commit_runs(vec![run], 0, false, true, None)?;
        Ok(())
    }

    /// [`commit_direct`](Context::commit_direct) with the store's write off the caller's thread,
    /// as a runtime's generations make theirs (a serving runtime's handle writes).
    pub(crate) async fn commit_direct_async(&mut self, ops: Vec<Op>) -> Result<(), WriteError> {
        let run = RunRecord::direct(ops);
        // A direct write consumes no event, its own included, and claims nothing.
        let direct = GenerationCommit {
            reacts: &|_, _, _| true,
            claim: None,
            traces: &[],
        };
        let span = self.commit_span();
        self.commit_runs_via(vec![run], 0, false, true, None, Some(&direct))
            .instrument(span)
            .await?;
        Ok(())
    }

    /// Commits the fire of due timers (`ops`: their updates) as one direct write, off the
    /// caller's thread; the events it emits that none of the runtime's produces `reacts` to are
    /// consumed by the commit itself when nothing else is queued, as a generation's are.
    pub(crate) async fn commit_fires(
        &mut self,
        ops: Vec<Op>,
        reacts: &(dyn Fn(&Emitted, Generation, &Readers) -> bool + Sync),
    ) -> Result<(), WriteError> {
        let run = RunRecord::direct(ops);
        let fire = GenerationCommit {
            reacts,
            claim: None,
            traces: &[],
        };
        let span = self.commit_span();
        self.commit_runs_via(vec![run], 0, false, true, None, Some(&fire))
            .instrument(span)
            .await?;
        Ok(())
    }

    /// When the earliest timer that has not fired is due (see [`Timer`](crate::Timer));
    /// `None` without one. O(log n): the state keeps its unfired timers by due time.
    pub fn next_timer(&self) -> Option<std::time::SystemTime> {
        self.state.next_timer()
    }

    /// How many timers have not fired yet.
    pub fn pending_timers(&self) -> usize {
        self.state.pending_timers()
    }

    /// Consumes queued events that no produce reacts to, without a commit (a durable store
    /// records the consumption, so it survives a restart).
    pub(crate) async fn consume_events(&mut self, count: usize) -> Result<(), StoreError> {
        self.check_not_cut()?;
        if let Some(store) = &mut self.store {
            let before = self.events.get(count).map_or(self.next_event_seq, |q| q.seq);
            store.consume_events(&self.session, before).await?;
        }
        self.events.drain(..count);
        Ok(())
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("session", &self.session)
            .field("artifacts", &self.state.len())
            .field("commits", &self.log.len())
            .field("queued_events", &self.events.len())
            .field("store", &self.outbox.describe())
            .finish()
    }
}

/// A batch of direct writes to a [`Context`], committed as one generation by
/// [`commit`](Transaction::commit). Dropping it writes nothing. The writes are [`Writes`]'s
/// (`create`, `create_once`, `update`, `delete`, `link`, `unlink`).
///
/// ```
/// # use reactifact_core::{Artifact, Context};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize)] struct Order { total_cents: u64 }
/// # impl Artifact for Order { const KIND: &'static str = "order"; }
/// let mut ctx = Context::new("orders");
/// let mut tx = ctx.transaction();
/// for i in 0..3 {
///     tx.create(format!("order:{i}"), Order { total_cents: 100 * i });
/// }
/// tx.commit()?;
/// assert_eq!(ctx.generation().0, 1, "one commit");
/// assert_eq!(ctx.queued_events(), 3);
/// # Ok::<(), reactifact_core::error::WriteError>(())
/// ```
#[must_use = "a transaction writes nothing until `commit` is called"]
pub struct Transaction<'a> {
    context: &'a mut Context,
    /// The writes, built with [`Writes`]'s methods (`tx.create(..)` and friends).
    writes: Writes,
}

impl std::ops::Deref for Transaction<'_> {
    type Target = Writes;

    fn deref(&self) -> &Writes {
        &self.writes
    }
}

impl std::ops::DerefMut for Transaction<'_> {
    fn deref_mut(&mut self) -> &mut Writes {
        &mut self.writes
    }
}

impl Transaction<'_> {
    /// Applies every write as one commit, or none of them. A batch that changes nothing
    /// commits nothing.
    ///
    /// # Errors
    /// [`WriteError::Effect`] if a value did not encode or a pending action was written
    /// directly; [`WriteError::Commit`] if a write does not apply (unknown id on update, a
    /// different kind under an existing id, a link to a missing artifact).
    pub fn commit(self) -> Result<(), WriteError> {
        let ops = self.writes.into_ops()?;
        if ops.is_empty() {
            return Ok(());
        }
        self.context.commit_direct(ops)
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::model::action::{ActionKey, PendingAction};
    use crate::model::patch::PutMode;
    use crate::model::relation::Relation;

    #[derive(Serialize, Deserialize)]
    struct Note(u32);

    impl Artifact for Note {
        const KIND: &'static str = "note";
    }

    #[derive(Serialize, Deserialize)]
    struct Other(u32);

    impl Artifact for Other {
        const KIND: &'static str = "other";
    }

    fn put<T: Artifact>(id: &str, value: &T) -> Op {
        Op::put(PutMode::Upsert, ArtifactId::from(id), value).unwrap()
    }

    fn act(key: &str, payload: &str) -> Op {
        Op::act("notify", ActionKey::from(key), payload).unwrap()
    }

    #[test]
    fn a_rejected_run_takes_its_intents_and_links_back_and_the_kept_runs_intents_keep_their_own_parts() {
        let mut ctx = Context::new("s");
        ctx.commit_direct(vec![put("note:1", &Note(1)), put("other:1", &Other(1))])
            .unwrap();
        let runs = vec![
            // Kept: its intent is its second operation.
            RunRecord::direct(vec![put("note:2", &Note(2)), act("k-first", "one")]),
            // Rejected whole: an act, a link and an update of note:1, then a write of the
            // wrong kind over other:1.
            RunRecord::direct(vec![
                act("k-rejected", "two"),
                Op::Link(Relation::new("note:1", "sees", "other:1")),
                put("note:1", &Note(10)),
                put("other:1", &Note(3)),
            ]),
            // Kept, after the rejected one: its intents are at positions 0 and 2.
            RunRecord::direct(vec![
                act("k-third", "three"),
                put("note:3", &Note(3)),
                act("k-fourth", "four"),
            ]),
        ];
        let Ok(rejected) = ctx.commit_runs(runs, 0, true, false, None) else {
            panic!("the kept runs commit");
        };
        assert_eq!(rejected.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [1]);

        assert_eq!(
            ctx.get::<Note>("note:1").unwrap().unwrap().data.0,
            1,
            "the update was taken back"
        );
        assert_eq!(
            ctx.related(&ArtifactId::from("note:1"), "sees").count(),
            0,
            "the link was taken back"
        );
        assert!(ctx.get::<PendingAction>("action:k-rejected").unwrap().is_none());

        let outbox = ctx.outbox();
        let get = |key: &str| outbox.get(key).now_or_never().unwrap().unwrap();
        assert!(get("k-rejected").is_none(), "a rejected run's intent is not registered");
        for (key, payload, run) in [("k-first", "one", 0), ("k-third", "three", 1), ("k-fourth", "four", 1)] {
            let delivery = get(key).unwrap_or_else(|| panic!("{key} is registered"));
            let intent = delivery.intent();
            assert_eq!(intent.key.as_str(), key);
            assert_eq!(intent.kind.as_ref(), "notify");
            assert_eq!(&intent.payload[..], &rmp_serde::to_vec(payload).unwrap()[..]);
            assert_eq!(intent.origin.run(), run, "{key} names its run among the kept ones");
            let commit = ctx
                .commit_of(&intent.origin)
                .unwrap()
                .expect("the commit is in the log");
            assert_eq!(
                commit.runs[run]
                    .ops
                    .iter()
                    .filter(|op| op.id().as_str() == format!("action:{key}"))
                    .count(),
                1
            );
        }
    }
}
