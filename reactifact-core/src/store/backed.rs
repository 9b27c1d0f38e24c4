//! The one durable session above every backend: a session of a [`LogStore`] (memory, SQLite,
//! PostgreSQL or another crate's), as a context keeps it. It encodes what the context writes
//! into rows and fences each append on the generation it last saw; it decodes and checks the
//! rows it reads back (the chain of a branch's ancestors, the newest checkpoint that checks
//! out, the commits after it, the histories merges reach); it writes checkpoints on threads of
//! their own. No backend loads, checks or fences a log itself.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::task::{Poll, Wake};

use super::codec::{self, hash32, CheckpointBody};
use super::in_flight::InFlight;
use super::log_store::{Act, Append, CheckpointRow, ClaimOrder, CommitRow, LogStore, OutboxCheck, SessionRow};
use super::outbox::ClaimRequest;
use super::outbox::{BoxFuture, Claimed, OutboxStore};
use super::{OpenError, OpenOptions, StoreError};
use crate::model::artifact::Generation;
use crate::model::delivery::NewIntent;
use crate::model::event::QueuedEvent;
use crate::model::hash::{CommitHash, StateHash};
use crate::model::patch::Op;
use crate::state::commit::Commit;
use crate::state::live::State;
use crate::state::refold::VerifyError;

/// One session of a [`LogStore`].
pub(crate) struct Backed {
    backend: Arc<dyn LogStore>,
    session: String,
    /// The generation this context loaded or last committed: appends are fenced on it.
    generation: u64,
    read_only: bool,
    /// The session has no row yet: [`Backed::settle`] writes it.
    new_session: bool,
    /// The checkpoints being written (see [`Backed::write_checkpoint`]), waited for on drop.
    checkpointing: Arc<InFlight>,
}

/// Why rows could not be loaded.
enum LoadError {
    Store(StoreError),
    Corrupt(String),
}

impl From<StoreError> for LoadError {
    fn from(e: StoreError) -> Self {
        LoadError::Store(e)
    }
}

impl LoadError {
    fn into_history(self) -> VerifyError {
        VerifyError::History {
            detail: match self {
                LoadError::Store(e) => e.to_string(),
                LoadError::Corrupt(detail) => detail,
            },
        }
    }
}

/// Waits for `future` by blocking this thread (a [`LogStore`]'s futures complete without the
/// caller's executor, see its docs): the direct writes and the whole-log reads that block
/// their caller, as they do on SQLite.
///
/// The future runs outside tokio's cooperative budget: on a runtime's thread whose task has
/// spent its budget, a tokio future (a `spawn_blocking` handle) would otherwise answer
/// `Pending` and defer its wake-up to the scheduler, which this blocked thread never returns
/// to.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let future = tokio::task::unconstrained(future);
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

/// A commit from its row, its hashes checked for length and its runs decoded.
fn decode_commit(row: &CommitRow) -> Result<Commit, String> {
    let generation = row.generation;
    let what = |field: &str| format!("commit {generation} of session `{}`: {field}", row.session);
    let optional = |bytes: &Option<Vec<u8>>, field: &str| {
        bytes
            .as_deref()
            .map(|b| hash32(b, &what(field)).map(CommitHash))
            .transpose()
    };
    Ok(Commit {
        generation: Generation(generation),
        hash: CommitHash(hash32(&row.hash, &what("its hash"))?),
        parent: optional(&row.parent, "its parent")?,
        merged: optional(&row.merged, "its merged parent")?,
        state_hash: StateHash(hash32(&row.state_hash, &what("its state hash"))?),
        events_consumed: usize::try_from(row.events_consumed).map_err(|_| what("its consumed events"))?,
        runs: codec::decode_runs(&row.runs)
            .map_err(|e| format!("{}: {e}", what("its runs do not decode")))?
            .into(),
    })
}

/// The sessions whose rows hold `session`'s log, root first, each with the generations it
/// contributes, `(from, upto]` (as the SQLite store's chain).
async fn chain(backend: &dyn LogStore, session: &str, row: &SessionRow) -> Result<Vec<(String, u64, u64)>, LoadError> {
    let mut ancestry = Ancestry::new(session);
    let mut fork = row.fork.clone();
    while let Some((parent, at)) = fork {
        let Some(parent_row) = backend.session(&parent).await? else {
            return Err(LoadError::Corrupt(format!("the parent session `{parent}` is missing")));
        };
        ancestry.push_parent(parent, at).map_err(LoadError::Corrupt)?;
        fork = parent_row.fork;
    }
    Ok(ancestry.segments())
}

/// The commits of `session`'s log with a generation in `(after, upto]`, oldest first,
/// checked to be consecutive.
async fn load_range(
    backend: &dyn LogStore,
    chain: &[(String, u64, u64)],
    after: u64,
    upto: u64,
) -> Result<Vec<Commit>, LoadError> {
    let mut commits: Vec<Commit> = Vec::new();
    for (owner, from, to) in chain {
        let (low, high) = ((*from).max(after), (*to).min(upto));
        if low >= high {
            continue;
        }
        for row in backend.commits(owner, low, high).await? {
            let commit = decode_commit(&row).map_err(LoadError::Corrupt)?;
            let expected = commits.last().map_or(after, |c| c.generation.0) + 1;
            if commit.generation.0 != expected {
                return Err(LoadError::Corrupt(format!(
                    "session `{owner}` holds commit {} where commit {expected} belongs",
                    commit.generation.0
                )));
            }
            commits.push(commit);
        }
    }
    Ok(commits)
}

/// The commits of other sessions that the logs' merges reach and the logs do not hold.
async fn load_foreign(backend: &dyn LogStore, logs: &[&[Commit]]) -> Result<Vec<Commit>, LoadError> {
    let log = || logs.iter().flat_map(|l| l.iter());
    let mut wanted: Vec<CommitHash> = log().filter_map(|c| c.merged).collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let own: HashSet<CommitHash> = log().map(|c| c.hash).collect();
    let mut found: std::collections::HashMap<CommitHash, Commit> = std::collections::HashMap::new();
    while let Some(hash) = wanted.pop() {
        if own.contains(&hash) || found.contains_key(&hash) {
            continue;
        }
        // A history merged from another store or from memory is not here.
        let Some(row) = backend.commit_by_hash(&hash.0).await? else {
            continue;
        };
        let commit = decode_commit(&row).map_err(LoadError::Corrupt)?;
        wanted.extend(commit.parent);
        wanted.extend(commit.merged);
        found.insert(hash, commit);
    }
    Ok(found.into_values().collect())
}

/// What [`LogStore::verify_outbox`] checks the outbox against, for the verified `log`: its
/// commits and every act of them, in log order.
pub(crate) fn outbox_check(log: &[Commit]) -> OutboxCheck {
    let mut check = OutboxCheck::default();
    for commit in log {
        check.commits.insert(commit.hash.0, commit.generation);
        for (run, record) in commit.runs.iter().enumerate() {
            for op in &record.ops {
                if let Op::Act { key, action, hash, .. } = op {
                    check.acts.push(Act {
                        key: key.clone(),
                        commit: commit.hash.0,
                        generation: commit.generation,
                        run: run as u64,
                        kind: action.to_string(),
                        action_hash: hash.0,
                    });
                }
            }
        }
    }
    check
}

/// The row of commit `generation` of the log whose rows `chain` names, if it has one.
async fn commit_row_at(
    backend: &dyn LogStore,
    chain: &[(String, u64, u64)],
    generation: u64,
) -> Result<Option<CommitRow>, LoadError> {
    let Some((owner, ..)) = chain
        .iter()
        .find(|(_, from, upto)| *from < generation && generation <= *upto)
    else {
        return Ok(None);
    };
    let rows = backend.commits(owner, generation - 1, generation).await?;
    Ok(rows.into_iter().find(|row| row.generation == generation))
}

/// The newest checkpoint of the log at or before `head` that checks out (as the SQLite
/// store's: the session's own, or an ancestor's up to where it forked), or `None`; one that
/// does not check out is skipped with a warning.
async fn newest_checkpoint(
    backend: &dyn LogStore,
    session: &str,
    chain: &[(String, u64, u64)],
    head: u64,
) -> Result<Option<Checkpoint>, LoadError> {
    let mut candidates = Vec::new();
    for (owner, from, upto) in chain.iter().rev() {
        for row in backend.checkpoints(owner).await? {
            let generation = row.generation;
            let own = owner == session && generation >= 1 && generation <= head;
            if own || (generation > *from && generation <= (*upto).min(head)) {
                candidates.push(row);
            } else if owner == session {
                tracing::warn!(
                    session,
                    generation,
                    head,
                    "a checkpoint names a commit past the session's head; it is skipped"
                );
            }
        }
    }
    candidates.sort_by_key(|row| (std::cmp::Reverse(row.generation), row.session != session));
    for row in candidates {
        let checked = codec::check_checkpoint(
            &row.session,
            row.generation,
            &row.hash,
            &row.state_hash,
            &row.body,
            &row.digest,
        );
        let checked = match checked {
            Ok((hash, state_hash, body)) => {
                // The log must have that commit, with those hashes (its runs are not decoded:
                // an open from the checkpoint reads none of the commits up to it).
                match commit_row_at(backend, chain, row.generation).await? {
                    Some(at) if at.hash[..] == hash.0[..] && at.state_hash[..] == state_hash.0[..] => Ok(Checkpoint {
                        generation: Generation(row.generation),
                        hash,
                        state_hash,
                        state: body.state,
                        next_event_seq: body.next_event_seq,
                        events: body.events,
                        readers: body.readers,
                    }),
                    Some(_) => Err(format!(
                        "commit {} of the log has another commit hash or state hash",
                        row.generation
                    )),
                    None => Err(format!("the log has no commit {}", row.generation)),
                }
            }
            Err(detail) => Err(detail),
        };
        match checked {
            Ok(checkpoint) => return Ok(Some(checkpoint)),
            Err(detail) => {
                tracing::warn!(session, checkpoint_of = %row.session, generation = row.generation, %detail, "a checkpoint does not check out; it is skipped, and an older one (or the whole log) is used");
            }
        }
    }
    Ok(None)
}

impl Backed {
    /// Where the session keeps the answers of recorded calls before a commit; `None` for a
    /// read-only session.
    pub(crate) fn answers(&self) -> Option<crate::store::answers::AnswerStore> {
        (!self.read_only).then(|| crate::store::answers::AnswerStore::new(self.backend.clone(), &self.session))
    }

    /// Opens session `session` of `backend` and loads it from its newest checkpoint that
    /// checks out and the commits after it, writing nothing: a missing session the options
    /// allow to create loads empty, and is created by [`Backed::settle`] once the caller
    /// checked the log. `path` names the store in the errors (a file's path, or the store's
    /// description).
    pub(crate) async fn open(
        backend: Arc<dyn LogStore>,
        session: &str,
        options: &OpenOptions,
        path: std::path::PathBuf,
    ) -> Result<(Backed, Loaded), OpenError> {
        let failed = |source: StoreError| OpenError::Store {
            session: session.to_owned(),
            source,
        };
        let corrupt = |detail: String| OpenError::Corrupt {
            path: path.clone(),
            detail,
            source: None,
        };
        let load_error = |e: LoadError| match e {
            LoadError::Store(e) => failed(e),
            LoadError::Corrupt(detail) => corrupt(detail),
        };
        let creating = options.create && !options.read_only;
        let row = match backend.session(session).await.map_err(failed)? {
            Some(row) => row,
            None => {
                // Commits of a session without its row: the row was lost or changed. Creating
                // the session afresh would hide them behind an empty log.
                if !backend.commits(session, 0, u64::MAX).await.map_err(failed)?.is_empty() {
                    return Err(corrupt(format!(
                        "the store holds commits of session `{session}` but no such session"
                    )));
                }
                if !creating {
                    return Err(OpenError::NoSuchSession {
                        path,
                        session: session.to_owned(),
                    });
                }
                return Ok((
                    Backed {
                        backend,
                        session: session.to_owned(),
                        generation: 0,
                        read_only: false,
                        new_session: true,
                        checkpointing: Arc::default(),
                    },
                    Loaded {
                        commits: Vec::new(),
                        foreign: Vec::new(),
                        consumed_seq: 0,
                        checkpoint: None,
                    },
                ));
            }
        };
        let chain = chain(&*backend, session, &row).await.map_err(load_error)?;
        let checkpoint = newest_checkpoint(&*backend, session, &chain, row.generation)
            .await
            .map_err(load_error)?;
        let after = checkpoint.as_ref().map_or(0, |c| c.generation.0);
        let commits = load_range(&*backend, &chain, after, row.generation)
            .await
            .map_err(load_error)?;
        if after + commits.len() as u64 != row.generation {
            return Err(corrupt(format!(
                "session `{session}` is at generation {} but its log holds {} commits",
                row.generation,
                after + commits.len() as u64
            )));
        }
        // The row's head is the log's last commit (a row rolled back to an older generation
        // would otherwise show an older head as the session's).
        let last = commits.last().map(|c| c.hash).or(checkpoint.as_ref().map(|c| c.hash));
        if row.generation > 0 && row.fork.as_ref().is_none_or(|(_, at)| row.generation > *at) {
            let head = row
                .head
                .as_deref()
                .map(|h| hash32(h, "the session's head"))
                .transpose()
                .map_err(corrupt)?;
            if head.map(CommitHash) != last {
                return Err(corrupt(format!(
                    "session `{session}` names another head than its log's last commit {}",
                    row.generation
                )));
            }
        }
        let foreign = if checkpoint.is_some() {
            Vec::new()
        } else {
            load_foreign(&*backend, &[&commits]).await.map_err(load_error)?
        };
        Ok((
            Backed {
                backend,
                session: session.to_owned(),
                generation: row.generation,
                read_only: options.read_only,
                new_session: false,
                checkpointing: Arc::default(),
            },
            Loaded {
                commits,
                foreign,
                consumed_seq: row.consumed_seq,
                checkpoint,
            },
        ))
    }

    /// The write of an open, once the caller checked the loaded log: the row of a new
    /// session. Another process may create the same session at the same time: either row is
    /// the same empty session (and if it commits first, this context's first commit is a
    /// conflict, which reads that commit).
    pub(crate) async fn settle(&mut self) -> Result<(), OpenError> {
        if std::mem::take(&mut self.new_session) {
            let row = SessionRow::new(0, None, 0, None);
            self.backend
                .create_session(&self.session, row)
                .await
                .map_err(|source| OpenError::Store {
                    session: self.session.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    /// The store's outbox.
    pub(crate) fn outbox(&self) -> Arc<dyn OutboxStore> {
        self.backend.outbox()
    }

    fn check_writable(&self) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::read_only(self.backend.describe(), &self.session));
        }
        Ok(())
    }

    fn append_of(&self, delta: &CommitDelta<'_>) -> Append {
        let commit = delta.commit;
        Append {
            commit: CommitRow::new(
                delta.session.to_owned(),
                commit.generation.0,
                commit.hash.0.to_vec(),
                commit.parent.map(|p| p.0.to_vec()),
                commit.merged.map(|m| m.0.to_vec()),
                commit.state_hash.0.to_vec(),
                commit.events_consumed as u64,
                codec::encode_runs(&commit.runs),
            ),
            expected: self.generation,
            consumed_before: delta.consumed_before,
            intents: delta.intents.to_vec(),
            now: delta.now,
            claim: delta.claim.as_ref().map(ClaimOrder::of),
        }
    }

    /// The session's commits up to `upto` and the foreign commits their merges and `tail`'s
    /// reach ([`Backed::load_before`]).
    async fn read_before(backend: Arc<dyn LogStore>, session: String, upto: u64, tail: Vec<Commit>) -> History {
        let read = async {
            let Some(row) = backend.session(&session).await? else {
                return Err(LoadError::Corrupt(format!("session `{session}` is missing")));
            };
            let chain = chain(&*backend, &session, &row).await?;
            let prefix = load_range(&*backend, &chain, 0, upto).await?;
            if prefix.len() as u64 != upto {
                return Err(LoadError::Corrupt(format!(
                    "session `{session}` has a checkpoint at generation {upto} but {} commits up to it",
                    prefix.len()
                )));
            }
            let foreign = load_foreign(&*backend, &[&prefix, &tail]).await?;
            Ok((prefix, foreign))
        };
        read.await.map_err(LoadError::into_history)
    }

    /// Encodes `checkpoint` and writes it, on a thread of its own (encoding is O(state)),
    /// then sends the result to `done`, or, without one, logs a failure at warn (a checkpoint
    /// only shortens the next open).
    fn write_checkpoint(
        &self,
        checkpoint: Checkpoint,
        done: Option<tokio::sync::oneshot::Sender<Result<(), StoreError>>>,
    ) {
        let backend = self.backend.clone();
        let session = self.session.clone();
        let running = self.checkpointing.start();
        let write = move || {
            // Dropped last, after the store's handle (locals drop in reverse): a session
            // dropped once its checkpoints are written holds the last handle, and closes the
            // store as it drops, not this thread a moment later.
            let _running = running;
            let (backend, session) = (backend, session);
            let body = codec::encode_checkpoint(
                &checkpoint.state,
                checkpoint.next_event_seq,
                &checkpoint.events,
                &checkpoint.readers,
            );
            let (hash, state_hash) = (checkpoint.hash.0, checkpoint.state_hash.0);
            let digest = codec::checkpoint_digest(&session, checkpoint.generation.0, &hash, &state_hash, &body);
            let row = CheckpointRow::new(
                session.clone(),
                checkpoint.generation.0,
                hash.to_vec(),
                state_hash.to_vec(),
                body,
                digest.to_vec(),
            );
            let written = block_on(backend.put_checkpoint(row, CHECKPOINTS_KEPT));
            match (done, written) {
                (Some(done), written) => drop(done.send(written)),
                (None, Err(e)) => {
                    tracing::warn!(session, error = %e, "a checkpoint could not be written; the next open reads more of the log");
                }
                (None, Ok(())) => {}
            }
        };
        // On a thread of its own: tokio's blocking pool measured slower (its thread then
        // waits for another of the pool, which the store's write takes).
        if let Err(e) = std::thread::Builder::new()
            .name("reactifact-checkpoint".into())
            .spawn(write)
        {
            tracing::warn!(error = %e, "no thread could be started to write a checkpoint");
        }
    }
}

impl Drop for Backed {
    /// Waits for the checkpoints still being written: none lands after the session is
    /// dropped, and the store is closed when the last session of it is.
    fn drop(&mut self) {
        if !self.checkpointing.wait(CHECKPOINT_WAIT) {
            tracing::warn!(session = %self.session, "a checkpoint was still being written when its session was dropped");
        }
    }
}

/// How long dropping a session waits for its checkpoints still being written.
const CHECKPOINT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl Backed {
    /// Persists one commit in one transaction: all of it or none of it. (A direct write's
    /// commit: it makes no claim.)
    pub(crate) fn commit(&mut self, delta: &CommitDelta<'_>) -> Result<(), StoreError> {
        block_on(self.commit_async(delta)).map(drop)
    }

    /// [`commit`](Backed::commit) without blocking the caller's thread: a store whose writes
    /// block (an fsync) runs them elsewhere and completes the future when they are durable.
    /// Makes the delta's claim, if it has one, in the same transaction, and returns what it
    /// took.
    pub(crate) fn commit_async<'a>(
        &'a mut self,
        delta: &CommitDelta<'_>,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        let append = self.check_writable().map(|()| self.append_of(delta));
        Box::pin(async move {
            let append = append?;
            let (generation, expected) = (append.commit.generation, append.expected);
            match self.backend.append(append).await? {
                Some(claimed) => {
                    self.generation = generation;
                    Ok(claimed)
                }
                None => Err(StoreError::conflict(self.backend.describe(), &self.session, expected)),
            }
        })
    }

    /// Marks the session's queued events with a sequence number below `before` consumed,
    /// without blocking the caller's thread.
    pub(crate) fn consume_events<'a>(
        &'a mut self,
        session: &str,
        before: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let session = session.to_owned();
        Box::pin(async move {
            self.check_writable()?;
            if self.backend.consume(&session, self.generation, before).await? {
                Ok(())
            } else {
                Err(StoreError::conflict(
                    self.backend.describe(),
                    &self.session,
                    self.generation,
                ))
            }
        })
    }

    /// [`StoreError::Conflict`] if another writer advanced the session past the generation this
    /// store last saw (a direct write that changes nothing checks this instead of committing).
    /// Blocks the caller's thread, as a direct write does.
    pub(crate) fn check_current(&self) -> Result<(), StoreError> {
        block_on(self.check_current_async())
    }

    /// [`check_current`](Backed::check_current) without blocking the caller's thread (a
    /// serving runtime's handle writes).
    pub(crate) fn check_current_async(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            match self.backend.session(&self.session).await? {
                Some(row) if row.generation == self.generation => Ok(()),
                _ => Err(StoreError::conflict(
                    self.backend.describe(),
                    &self.session,
                    self.generation,
                )),
            }
        })
    }

    /// After a [`StoreError::Conflict`]: reads the commits another writer appended to the
    /// session after the generation this store last saw, and the session's consumed position
    /// now, and fences the next commit on the new head. Off the caller's thread.
    pub(crate) fn catch_up(&mut self) -> BoxFuture<'_, Result<CaughtUp, StoreError>> {
        Box::pin(async move {
            let store = self.backend.describe();
            let history = |detail: String| StoreError::History {
                store: store.clone(),
                session: self.session.clone(),
                detail,
            };
            let Some(row) = self.backend.session(&self.session).await? else {
                return Err(history(format!("session `{}` is missing", self.session)));
            };
            let chain = chain(&*self.backend, &self.session, &row).await.map_err(|e| match e {
                LoadError::Store(e) => e,
                LoadError::Corrupt(detail) => history(detail),
            })?;
            let commits = load_range(&*self.backend, &chain, self.generation, row.generation)
                .await
                .map_err(|e| match e {
                    LoadError::Store(e) => e,
                    LoadError::Corrupt(detail) => history(detail),
                })?;
            if self.generation + commits.len() as u64 != row.generation {
                return Err(history(format!(
                    "session `{}` is at generation {} but its log after {} holds {} commits",
                    self.session,
                    row.generation,
                    self.generation,
                    commits.len()
                )));
            }
            let caught = CaughtUp {
                commits,
                consumed_seq: row.consumed_seq,
            };
            self.generation = row.generation;
            Ok(caught)
        })
    }

    /// Creates the session `branch` in the same store, whose log is this session's up to
    /// commit `at` (with hash `head`), and whose events numbered below `consumed_seq` are
    /// consumed. Returns the store of the new session.
    pub(crate) fn fork(
        &self,
        branch: &str,
        at: Generation,
        head: Option<&CommitHash>,
        consumed_seq: u64,
    ) -> Result<Backed, StoreError> {
        self.check_writable()?;
        let row = SessionRow::new(
            at.0,
            head.map(|h| h.0.to_vec()),
            consumed_seq,
            Some((self.session.clone(), at.0)),
        );
        if !block_on(self.backend.create_session(branch, row))? {
            return Err(StoreError::session_exists(self.backend.describe(), branch));
        }
        Ok(Backed {
            backend: self.backend.clone(),
            session: branch.to_owned(),
            generation: at.0,
            read_only: false,
            new_session: false,
            checkpointing: Arc::default(),
        })
    }

    /// A short description, e.g. `sqlite:/var/lib/app/state.db`.
    pub(crate) fn describe(&self) -> String {
        self.backend.describe()
    }

    /// The outbox checks of [`Context::verify`](crate::Context::verify), given the session's
    /// verified log: every act of the log has an outbox row (or a purge tombstone), every row
    /// born of a commit of the log names an act of that commit with the same action hash, and
    /// every row matches its digest.
    pub(crate) fn verify_outbox(&self, log: &[Commit]) -> Result<(), VerifyError> {
        let check = outbox_check(log);
        match block_on(self.backend.verify_outbox(check)) {
            Ok(None) => Ok(()),
            Ok(Some(e)) => Err(e),
            Err(e) => Err(VerifyError::OutboxUnreadable { detail: e.to_string() }),
        }
    }

    /// Writes `checkpoint` for the session, encoding it off the caller's thread, and drops
    /// the session's older checkpoints but the newest few; the future completes when it is
    /// durable.
    pub(crate) fn checkpoint(&self, checkpoint: Checkpoint) -> BoxFuture<'static, Result<(), StoreError>> {
        let (done, written) = tokio::sync::oneshot::channel();
        let writable = self.check_writable();
        if writable.is_ok() {
            self.write_checkpoint(checkpoint, Some(done));
        }
        let store = self.backend.describe();
        Box::pin(async move {
            writable?;
            written.await.unwrap_or_else(|_| Err(StoreError::closed(store)))
        })
    }

    /// [`checkpoint`](Backed::checkpoint) without waiting for it: a failure is logged at warn
    /// (a checkpoint only shortens the next open).
    pub(crate) fn checkpoint_later(&self, checkpoint: Checkpoint) {
        if !self.read_only {
            self.write_checkpoint(checkpoint, None);
        }
    }

    /// The session's commits up to `upto` (those a context opened from a checkpoint at `upto`
    /// does not hold), oldest first, and the commits of other sessions reachable from the
    /// merge commits of those and of `tail` (the commits after `upto`), as [`Loaded`] has
    /// them. Blocks the caller's thread while it reads.
    ///
    /// # Errors
    /// [`VerifyError::History`] if a commit cannot be read or does not decode.
    pub(crate) fn load_before(&self, upto: Generation, tail: &[Commit]) -> History {
        block_on(Self::read_before(
            self.backend.clone(),
            self.session.clone(),
            upto.0,
            tail.to_vec(),
        ))
    }

    /// [`load_before`](Backed::load_before) without blocking the caller's thread (for the
    /// async reads of the whole log: export, replay, provenance).
    pub(crate) fn load_before_async(&self, upto: Generation, tail: Vec<Commit>) -> BoxFuture<'static, History> {
        Box::pin(Self::read_before(
            self.backend.clone(),
            self.session.clone(),
            upto.0,
            tail,
        ))
    }

    /// Every checkpoint the store keeps of the session, oldest first, with its body decoded
    /// (or why it does not decode or match its digest), for [`Context::verify`](crate::Context::verify).
    ///
    /// # Errors
    /// [`VerifyError::History`] if they cannot be read.
    pub(crate) fn checkpoints(&self) -> Result<Vec<StoredCheckpoint>, VerifyError> {
        let read = async {
            let consumed_seq = self
                .backend
                .session(&self.session)
                .await?
                .map_or(0, |row| row.consumed_seq);
            let rows = self.backend.checkpoints(&self.session).await?;
            Ok::<_, StoreError>((consumed_seq, rows))
        };
        let (consumed_seq, rows) = block_on(read).map_err(|e| VerifyError::History { detail: e.to_string() })?;
        Ok(rows
            .into_iter()
            .map(|row| StoredCheckpoint {
                generation: Generation(row.generation),
                hash: CommitHash(hash32(&row.hash, "").unwrap_or([0; 32])),
                state_hash: StateHash(hash32(&row.state_hash, "").unwrap_or([0; 32])),
                body: codec::check_checkpoint(
                    &row.session,
                    row.generation,
                    &row.hash,
                    &row.state_hash,
                    &row.body,
                    &row.digest,
                )
                .map(|(_, _, body)| body),
                consumed_seq,
            })
            .collect())
    }
}

/// One commit, for a store to persist in one transaction.
///
/// The store keeps the log, not the state: a session is rebuilt on open by replaying its
/// commits, whose runs carry every operation with its bytes. So a commit is one row however
/// many artifacts it writes.
pub(crate) struct CommitDelta<'a> {
    pub(crate) session: &'a str,
    pub(crate) commit: &'a Commit,
    /// After the commit, the queued events with a lower sequence number are consumed: the
    /// number of the first event still queued (or, if none is, of the first event to come).
    pub(crate) consumed_before: u64,
    /// The intents this commit acted (created `action:{key}` for), in commit order: the
    /// store registers each key it does not hold yet, in the commit's transaction, and
    /// attaches the others to the session.
    pub(crate) intents: &'a [NewIntent],
    /// When the commit is made, by the process's clock: the intents it registers are
    /// recorded, and due, then.
    pub(crate) now: std::time::SystemTime,
    /// A claim to make in the commit's transaction, after its intents are registered, exactly
    /// as [`OutboxStore::claim`] would make it right after the
    /// commit (a generation's own drain, saving the claim its own write).
    pub(crate) claim: Option<ClaimRequest<'a>>,
}

/// What [`Backed::catch_up`] reads: the commits after the generation the store last saw, oldest
/// first, and the session's consumed position.
pub(crate) struct CaughtUp {
    pub(crate) commits: Vec<Commit>,
    pub(crate) consumed_seq: u64,
}

/// How many checkpoints of a session a store keeps: the newest, and one to fall back on.
pub(crate) const CHECKPOINTS_KEPT: usize = 2;

/// Which sessions' rows hold a session's log: the session itself, then each ancestor with the
/// last generation taken from it (a branch's log is its parent's up to the fork, read from
/// the parent's rows, recursively). Gathered from the session up to the root.
pub(crate) struct Ancestry(Vec<(String, u64)>);

impl Ancestry {
    /// The ancestry of `session`, before its parents are known.
    pub(crate) fn new(session: &str) -> Self {
        Ancestry(vec![(session.to_owned(), u64::MAX)])
    }

    /// The oldest session so far forked from `parent` at generation `at`.
    ///
    /// # Errors
    /// What is wrong, in words, if `parent` is already in the ancestry (or it is absurdly
    /// deep).
    pub(crate) fn push_parent(&mut self, parent: String, at: u64) -> Result<(), String> {
        if self.0.iter().any(|(s, _)| *s == parent) || self.0.len() > 1000 {
            return Err(format!("session `{parent}` is its own ancestor"));
        }
        // A fork of a fork below the parent's own fork point takes less of the grandparent.
        let at = at.min(self.0.last().map_or(u64::MAX, |(_, upto)| *upto));
        self.0.push((parent, at));
        Ok(())
    }

    /// Root first, each session with the generations it contributes, `(from, upto]` (at most
    /// `i64::MAX`, as stores keep generations).
    pub(crate) fn segments(self) -> Vec<(String, u64, u64)> {
        let mut from = 0u64;
        self.0
            .into_iter()
            .rev()
            .map(|(session, upto)| {
                let upto = upto.min(i64::MAX as u64);
                let segment = (session, from, upto);
                from = upto;
                segment
            })
            .collect()
    }
}

/// What [`Backed::load_before`] reads: the commits up to the checkpoint, and the other sessions'
/// commits their merges reach.
pub(crate) type History = Result<(Vec<Commit>, Vec<Commit>), VerifyError>;

/// The live state of a session right after one of its commits, as a store keeps it: where
/// open starts instead of the first commit.
#[derive(Clone)]
pub(crate) struct Checkpoint {
    /// The commit.
    pub(crate) generation: Generation,
    /// Its hash.
    pub(crate) hash: CommitHash,
    /// The state hash it recorded, which `state` has.
    pub(crate) state_hash: StateHash,
    /// The state after it (an O(1) clone of the live state, encoded by the store).
    pub(crate) state: State,
    /// The number the next event emitted after it gets.
    pub(crate) next_event_seq: u64,
    /// The events queued right after it, oldest first.
    pub(crate) events: Vec<QueuedEvent>,
    /// The readers index after it (an O(1) clone).
    pub(crate) readers: crate::state::readers::Readers,
}

/// A checkpoint as stored, for verification.
pub(crate) struct StoredCheckpoint {
    /// The commit it names.
    pub(crate) generation: Generation,
    /// The commit hash it names.
    pub(crate) hash: CommitHash,
    /// The state hash it names.
    pub(crate) state_hash: StateHash,
    /// Its body, or why it does not check out (digest, decoding).
    pub(crate) body: Result<CheckpointBody, String>,
    /// The session's consumed position now: every event the checkpoint's commit had emitted
    /// at or after it must be among the checkpoint's queued events.
    pub(crate) consumed_seq: u64,
}

/// Everything a store hands back to rebuild a context.
pub(crate) struct Loaded {
    /// The session's log, oldest first; replaying it rebuilds the state and the event queue.
    pub(crate) commits: Vec<Commit>,
    /// The commits of other sessions reachable from the log's merge commits and not in the log.
    pub(crate) foreign: Vec<Commit>,
    /// Events numbered below this one are consumed.
    pub(crate) consumed_seq: u64,
    /// The newest checkpoint that checked out: `commits` are then the commits after it (and
    /// `foreign` is empty: the graph of merges is read with the older commits, on demand).
    pub(crate) checkpoint: Option<Checkpoint>,
}
