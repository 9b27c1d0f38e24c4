//! A session of a [`LogStore`] of another crate, as the context's [`Store`]: encodes what the
//! context writes into rows, and decodes and checks the rows it reads back.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::task::{Poll, Wake};

use super::codec::{self, hash32};
use super::log_store::{Act, Append, CheckpointRow, ClaimOrder, CommitRow, LogStore, OutboxCheck, SessionRow};
use super::outbox::{BoxFuture, Claimed, OutboxStore};
use super::{
    Ancestry, Checkpoint, CommitDelta, History, Loaded, OpenError, OpenOptions, Store, StoreError, StoredCheckpoint,
    CHECKPOINTS_KEPT,
};
use crate::model::artifact::Generation;
use crate::model::hash::{CommitHash, StateHash};
use crate::model::patch::Op;
use crate::state::commit::Commit;
use crate::state::refold::VerifyError;

/// One session of a [`LogStore`].
pub(crate) struct Backed {
    backend: Arc<dyn LogStore>,
    session: String,
    /// The generation this context loaded or last committed: appends are fenced on it.
    generation: u64,
    read_only: bool,
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
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
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
                // The log must have that commit, with those hashes.
                match load_range(backend, chain, row.generation - 1, row.generation).await {
                    Ok(at) => match at.first() {
                        Some(c) if c.hash == hash && c.state_hash == state_hash => Ok(Checkpoint {
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
                    },
                    Err(LoadError::Corrupt(detail)) => Err(detail),
                    Err(e) => return Err(e),
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
    /// Opens session `session` of `backend` (creating it if missing and the options allow)
    /// and loads it from its newest checkpoint that checks out and the commits after it.
    pub(crate) async fn open(
        backend: Arc<dyn LogStore>,
        session: &str,
        options: &OpenOptions,
    ) -> Result<(Backed, Loaded), OpenError> {
        let store = backend.describe();
        let failed = |source: StoreError| OpenError::Store {
            session: session.to_owned(),
            source,
        };
        let corrupt = |detail: String| OpenError::Corrupt {
            path: store.clone().into(),
            detail,
            source: None,
        };
        let load_error = |e: LoadError| match e {
            LoadError::Store(e) => failed(e),
            LoadError::Corrupt(detail) => corrupt(detail),
        };
        let creating = options.create && !options.read_only;
        let mut row = backend.session(session).await.map_err(failed)?;
        if row.is_none() && creating {
            let new = SessionRow::new(0, None, 0, None);
            // A concurrent open may create it first: either way it exists now.
            backend.create_session(session, new).await.map_err(failed)?;
            row = backend.session(session).await.map_err(failed)?;
        }
        let Some(row) = row else {
            return Err(OpenError::NoSuchSession {
                path: store.clone().into(),
                session: session.to_owned(),
            });
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
            },
            Loaded {
                commits,
                foreign,
                consumed_seq: row.consumed_seq,
                checkpoint,
            },
        ))
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
    /// reach ([`Store::load_before`]).
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
        let spawned = std::thread::Builder::new()
            .name("reactifact-checkpoint".into())
            .spawn(move || {
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
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread could be started to write a checkpoint");
        }
    }
}

impl Store for Backed {
    fn commit(&mut self, delta: &CommitDelta<'_>) -> Result<(), StoreError> {
        block_on(self.commit_async(delta)).map(drop)
    }

    fn commit_async<'a>(&'a mut self, delta: &CommitDelta<'_>) -> BoxFuture<'a, Result<Claimed, StoreError>> {
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

    fn consume_events<'a>(&'a mut self, session: &str, before: u64) -> BoxFuture<'a, Result<(), StoreError>> {
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

    fn check_current(&self) -> Result<(), StoreError> {
        block_on(self.check_current_async())
    }

    fn check_current_async(&self) -> BoxFuture<'_, Result<(), StoreError>> {
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

    fn catch_up(&mut self) -> BoxFuture<'_, Result<super::CaughtUp, StoreError>> {
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
            let caught = super::CaughtUp {
                commits,
                consumed_seq: row.consumed_seq,
            };
            self.generation = row.generation;
            Ok(caught)
        })
    }

    fn fork(
        &self,
        branch: &str,
        at: Generation,
        head: Option<&CommitHash>,
        consumed_seq: u64,
    ) -> Result<Box<dyn Store>, StoreError> {
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
        Ok(Box::new(Backed {
            backend: self.backend.clone(),
            session: branch.to_owned(),
            generation: at.0,
            read_only: false,
        }))
    }

    fn describe(&self) -> String {
        self.backend.describe()
    }

    fn verify_outbox(&self, log: &[Commit]) -> Result<(), VerifyError> {
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
        match block_on(self.backend.verify_outbox(check)) {
            Ok(None) => Ok(()),
            Ok(Some(e)) => Err(e),
            Err(e) => Err(VerifyError::OutboxUnreadable { detail: e.to_string() }),
        }
    }

    fn checkpoint(&self, checkpoint: Checkpoint) -> BoxFuture<'static, Result<(), StoreError>> {
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

    fn checkpoint_later(&self, checkpoint: Checkpoint) {
        if !self.read_only {
            self.write_checkpoint(checkpoint, None);
        }
    }

    fn load_before(&self, upto: Generation, tail: &[Commit]) -> History {
        block_on(Self::read_before(
            self.backend.clone(),
            self.session.clone(),
            upto.0,
            tail.to_vec(),
        ))
    }

    fn load_before_async(&self, upto: Generation, tail: Vec<Commit>) -> BoxFuture<'static, History> {
        Box::pin(Self::read_before(
            self.backend.clone(),
            self.session.clone(),
            upto.0,
            tail,
        ))
    }

    fn checkpoints(&self) -> Result<Vec<StoredCheckpoint>, VerifyError> {
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
