//! A runtime's intake: the handles other tasks write through, the bounded inbox their writes
//! wait in, and how a serving runtime commits them.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Notify};

use crate::model::artifact::{Artifact, ArtifactId};
use crate::model::delivery::Delivery;
use crate::model::patch::{Op, PutMode};
use crate::model::stop::StopHandle;
use crate::outbox::drain::Clock;
use crate::run::runtime::{Runtime, MAX_CONFLICT_RETRIES};
use crate::session::context::{Context, WriteError};
use crate::session::rearm::RearmError;
use crate::state::writes::Writes;
use crate::store::outbox::{ApprovalError, CancelError, OutboxStore, RetryError};
use crate::store::StoreError;

/// How many writes a runtime's inbox holds by default
/// ([`RuntimeBuilder::inbox_capacity`](crate::RuntimeBuilder::inbox_capacity)).
pub const DEFAULT_INBOX_CAPACITY: usize = 1024;

/// What a handle asks a runtime to commit, and where to answer: whether every `create_once`
/// of it created its artifact.
pub(crate) struct Submitted {
    request: Request,
    done: oneshot::Sender<Result<bool, Refused>>,
}

/// What a handle asks a runtime to commit.
enum Request {
    /// These operations, as one commit.
    Writes(Vec<Op>),
    /// The re-arm of the parked event stored at this id.
    Rearm(ArtifactId),
}

/// Why a runtime refused a request.
enum Refused {
    Write(WriteError),
    NotParked(ArtifactId),
}

/// The queue of writes of a runtime: what [`RuntimeHandle`]s send, and a serving runtime
/// commits. Bounded: a writer waits for room.
pub(crate) struct Inbox {
    pub(crate) tx: mpsc::Sender<Submitted>,
    pub(crate) rx: mpsc::Receiver<Submitted>,
    /// Wakes a serving runtime's delivery: its turns committed intents, or a handle changed
    /// the ledger (an approval, a retry). A wake-up sent while it is busy is kept for its next
    /// wait.
    pub(crate) nudge: Arc<Notify>,
    /// The writes received over the runtime's life.
    pub(crate) tally: WriteTally,
}

impl Inbox {
    /// An inbox holding at most `capacity` writes (at least 1, and at most what tokio's
    /// channel can count: `usize::MAX` from outside is that many, not a panic).
    pub(crate) fn new(capacity: usize) -> Self {
        let (tx, rx) = mpsc::channel(capacity.clamp(1, tokio::sync::Semaphore::MAX_PERMITS));
        Inbox {
            tx,
            rx,
            nudge: Arc::new(Notify::new()),
            tally: WriteTally::default(),
        }
    }
}

/// The writes a runtime received through its handles, over its life.
#[derive(Debug, Default)]
pub(crate) struct WriteTally {
    /// Committed.
    pub(crate) committed: u64,
    /// Refused.
    pub(crate) refused: u64,
}

impl WriteTally {
    /// Commits one submitted write to `context` and answers its sender; if another writer
    /// committed to the session first, takes its commits and writes again (at most
    /// [`MAX_CONFLICT_RETRIES`] times). Returns whether the context's head moved (the write
    /// was committed, or another writer's commits were taken).
    pub(crate) async fn commit(&mut self, context: &mut Context, submitted: Submitted) -> bool {
        let head = context.head();
        let Submitted { request, done } = submitted;
        let ops = match request {
            Request::Writes(ops) => ops,
            Request::Rearm(id) => match context.rearm_ops(id) {
                Ok(ops) => ops,
                Err(RearmError::NotParked { id }) => return self.refuse(done, Refused::NotParked(id)),
                Err(RearmError::Write(e)) => return self.refuse(done, Refused::Write(e)),
                Err(RearmError::Closed) => unreachable!("a context's re-arm is not sent"),
            },
        };
        let mut tries = 0;
        let result = loop {
            // A `create_once` is skipped when its id exists as it commits: said before it does.
            let created = ops
                .iter()
                .filter(|op| {
                    matches!(
                        op,
                        Op::Put {
                            mode: PutMode::CreateOnce,
                            ..
                        }
                    )
                })
                .all(|op| context.state().get(op.id().as_str()).is_none());
            match context.commit_direct_async(ops.clone()).await {
                Err(WriteError::Store(StoreError::Conflict { .. })) if tries < MAX_CONFLICT_RETRIES => {
                    crate::model::telemetry::record_conflict();
                    tries += 1;
                    if let Err(e) = context.catch_up().await {
                        break Err(WriteError::Store(e));
                    }
                }
                result => break result.map(|()| created),
            }
        };
        match result {
            Ok(created) => {
                self.committed += 1;
                let _ = done.send(Ok(created));
            }
            Err(e) => {
                self.refuse(done, Refused::Write(e));
            }
        }
        context.head() != head
    }

    /// Answers a refused request; false: nothing was committed.
    fn refuse(&mut self, done: oneshot::Sender<Result<bool, Refused>>, refused: Refused) -> bool {
        match &refused {
            Refused::Write(e) => tracing::warn!(error = %e, "a write sent to the runtime was refused"),
            Refused::NotParked(id) => tracing::warn!(id = %id, "a re-arm sent to the runtime names no parked event"),
        }
        self.refused += 1;
        let _ = done.send(Err(refused));
        false
    }
}

/// A write sent through a [`RuntimeHandle`] was not applied; nothing of it was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The write was refused, exactly as the same direct write to the context would be.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// [`try_write`](RuntimeHandle::try_write) found the runtime's inbox full: the writes are
    /// given back, to send again later (or with [`write`](RuntimeHandle::write), which waits
    /// for room).
    #[error("the runtime's inbox is full; the writes were not sent")]
    Full(Writes),
    /// The runtime was dropped before it applied the write.
    #[error("the runtime is gone; the write was not applied")]
    Closed,
}

/// A handle to a runtime, for other tasks of the process (a web handler, say): it sends writes
/// that a [`serve`](Runtime::serve)-ing runtime commits and reacts to, and it stops the
/// runtime. Cheap to clone; get one from [`Runtime::handle`].
///
/// Each call is one commit (like [`Context::create`](crate::Context::create) and friends, or a
/// [`Transaction`](crate::Transaction) for [`write`](Self::write)), durable when the call
/// resolves: a serving runtime commits it at once, even while a generation's produces wait on
/// a model and while deliveries are in flight (a generation whose snapshot the write overtook
/// runs again on it). Writes wait in the runtime's inbox, which holds
/// [`DEFAULT_INBOX_CAPACITY`] writes unless
/// [`RuntimeBuilder::inbox_capacity`](crate::RuntimeBuilder::inbox_capacity) says otherwise: a
/// writer waits for room (backpressure), or, with [`try_write`](Self::try_write), is told at
/// once that it is full. Writes sent while the runtime is not serving wait until it serves
/// (or runs a turn).
///
/// It also carries the operator's decisions on the runtime's ledger — [`approve`](Self::approve),
/// [`reject`](Self::reject), [`retry`](Self::retry), [`cancel`](Self::cancel) — which are the
/// store's own operations (fenced, safe while any drain runs), and wake a serving runtime's
/// delivery, so that an approved or re-armed intent goes out at once rather than at its next
/// poll.
#[derive(Clone)]
pub struct RuntimeHandle {
    tx: mpsc::Sender<Submitted>,
    stop: StopHandle,
    outbox: Arc<dyn OutboxStore>,
    nudge: Arc<Notify>,
}

impl std::fmt::Debug for RuntimeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeHandle")
            .field("outbox", &self.outbox.describe())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Submitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Submitted").finish_non_exhaustive()
    }
}

impl RuntimeHandle {
    /// Wakes the runtime's delivery once `changed` succeeded.
    fn woken<T, E>(&self, changed: Result<T, E>) -> Result<T, E> {
        if changed.is_ok() {
            self.nudge.notify_one();
        }
        changed
    }

    /// Approves an intent awaiting approval, as [`Runtime::approve`] does, and wakes a serving
    /// runtime's delivery, which delivers it at once.
    ///
    /// # Errors
    /// See [`OutboxStore::approve`].
    pub async fn approve(&self, key: &str, by: &str) -> Result<Delivery, ApprovalError> {
        self.woken(self.outbox.approve(key, by, Clock::new().now()).await)
    }

    /// Rejects an intent awaiting approval, as [`Runtime::reject`] does: it is never delivered.
    ///
    /// # Errors
    /// See [`OutboxStore::reject`].
    pub async fn reject(&self, key: &str, by: &str, reason: &str) -> Result<Delivery, ApprovalError> {
        self.outbox.reject(key, by, reason, Clock::new().now()).await
    }

    /// Re-arms a failed, dead or held intent, as [`Runtime::retry`] does, and wakes a serving
    /// runtime's delivery, which delivers it at once.
    ///
    /// # Errors
    /// See [`OutboxStore::retry`].
    pub async fn retry(&self, key: &str) -> Result<Delivery, RetryError> {
        self.woken(self.outbox.retry(key, Clock::new().now()).await)
    }

    /// Cancels an intent for good, as [`Runtime::cancel`] does.
    ///
    /// # Errors
    /// See [`OutboxStore::cancel`].
    pub async fn cancel(&self, key: &str, reason: &str) -> Result<Delivery, CancelError> {
        self.outbox.cancel(key, reason, Clock::new().now()).await
    }

    /// Sends `writes` (once there is room in the inbox, or at once) and waits for their commit.
    async fn send(&self, writes: Writes, wait_for_room: bool) -> Result<bool, SubmitError> {
        let ops = writes.into_ops().map_err(WriteError::from)?;
        let (done, answer) = oneshot::channel();
        let submitted = Submitted {
            request: Request::Writes(ops),
            done,
        };
        match wait_for_room {
            true => self.tx.send(submitted).await.map_err(|_| SubmitError::Closed)?,
            false => self.tx.try_send(submitted).map_err(|e| match e {
                mpsc::error::TrySendError::Full(Submitted {
                    request: Request::Writes(ops),
                    ..
                }) => SubmitError::Full(Writes { ops, error: None }),
                _ => SubmitError::Closed,
            })?,
        }
        match answer.await.map_err(|_| SubmitError::Closed)? {
            Ok(created) => Ok(created),
            Err(Refused::Write(e)) => Err(SubmitError::Write(e)),
            Err(Refused::NotParked(_)) => unreachable!("writes are not a re-arm"),
        }
    }

    /// Re-arms the parked event stored at `id` (see [`Parked`](crate::Parked)), as [`Runtime::rearm`] does:
    /// its produce runs again on its trigger, with its retry policy's attempts anew. Resolves
    /// once the re-arm is committed.
    ///
    /// # Errors
    /// [`RearmError::NotParked`] if no parked event is stored at `id`; [`RearmError::Write`]
    /// if the commit failed; [`RearmError::Closed`] if the runtime is gone.
    pub async fn rearm(&self, id: impl Into<ArtifactId>) -> Result<(), RearmError> {
        let (done, answer) = oneshot::channel();
        let submitted = Submitted {
            request: Request::Rearm(id.into()),
            done,
        };
        self.tx.send(submitted).await.map_err(|_| RearmError::Closed)?;
        match answer.await.map_err(|_| RearmError::Closed)? {
            Ok(_) => Ok(()),
            Err(Refused::Write(e)) => Err(RearmError::Write(e)),
            Err(Refused::NotParked(id)) => Err(RearmError::NotParked { id }),
        }
    }

    /// Commits `writes` as one commit, all or none, waiting for room in the runtime's inbox;
    /// resolves once they are committed. Writes that change nothing commit nothing.
    ///
    /// # Errors
    /// [`SubmitError::Write`] as a [`Transaction`](crate::Transaction) of the same writes
    /// would fail; [`SubmitError::Closed`] if the runtime is gone.
    pub async fn write(&self, writes: Writes) -> Result<(), SubmitError> {
        self.send(writes, true).await.map(|_| ())
    }

    /// As [`write`](Self::write), but answers [`SubmitError::Full`] at once, with the writes,
    /// when the runtime's inbox is full (a service may then answer "503, retry later").
    ///
    /// # Errors
    /// As [`write`](Self::write), and [`SubmitError::Full`].
    pub async fn try_write(&self, writes: Writes) -> Result<(), SubmitError> {
        self.send(writes, false).await.map(|_| ())
    }

    /// Creates `value` at `id`, or refreshes it; resolves once it is committed.
    ///
    /// # Errors
    /// [`SubmitError::Write`] as [`Context::create`](crate::Context::create) would fail;
    /// [`SubmitError::Closed`] if the runtime is gone.
    pub async fn create<T: Artifact>(&self, id: impl Into<ArtifactId>, value: T) -> Result<(), SubmitError> {
        let mut writes = Writes::new();
        writes.create(id, value);
        self.write(writes).await
    }

    /// Creates `value` at `id` only if the id does not exist; resolves once it is committed,
    /// with `true` if it created the artifact and `false` if the id existed (nothing was
    /// written). A retried request — the same `POST /orders` sent twice — is told apart this
    /// way.
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub async fn create_once<T: Artifact>(&self, id: impl Into<ArtifactId>, value: T) -> Result<bool, SubmitError> {
        let mut writes = Writes::new();
        writes.create_once(id, value);
        self.send(writes, true).await
    }

    /// As [`create_once`](Self::create_once), but answers [`SubmitError::Full`] at once (with
    /// the write) when the runtime's inbox is full: the call of a service that refuses work
    /// under overload ("503, retry later") instead of queueing its callers.
    ///
    /// # Errors
    /// As [`create_once`](Self::create_once), and [`SubmitError::Full`].
    pub async fn try_create_once<T: Artifact>(&self, id: impl Into<ArtifactId>, value: T) -> Result<bool, SubmitError> {
        let mut writes = Writes::new();
        writes.create_once(id, value);
        self.send(writes, false).await
    }

    /// Replaces the artifact at `id`, which must exist; resolves once it is committed.
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub async fn update<T: Artifact>(&self, id: impl Into<ArtifactId>, value: T) -> Result<(), SubmitError> {
        let mut writes = Writes::new();
        writes.update(id, value);
        self.write(writes).await
    }

    /// Deletes the artifact at `id` and its relations; resolves once it is committed.
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub async fn delete(&self, id: impl Into<ArtifactId>) -> Result<(), SubmitError> {
        let mut writes = Writes::new();
        writes.delete(id);
        self.write(writes).await
    }

    /// Adds the relation `from -[name]-> to`; resolves once it is committed.
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub async fn link(
        &self,
        from: impl Into<ArtifactId>,
        name: &str,
        to: impl Into<ArtifactId>,
    ) -> Result<(), SubmitError> {
        let mut writes = Writes::new();
        writes.link(from, name, to);
        self.write(writes).await
    }

    /// Removes the relation `from -[name]-> to`, if present; resolves once it is committed.
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub async fn unlink(
        &self,
        from: impl Into<ArtifactId>,
        name: &str,
        to: impl Into<ArtifactId>,
    ) -> Result<(), SubmitError> {
        let mut writes = Writes::new();
        writes.unlink(from, name, to);
        self.write(writes).await
    }

    /// Asks the runtime to stop: a serving runtime stops its turns (a generation still running
    /// is cancelled, its events stay queued), lets its deliveries in flight finish within the
    /// grace, and `serve` returns. Writes not yet committed then are refused with
    /// [`SubmitError::Closed`] once the runtime is dropped, or committed by its next serve.
    pub fn stop(&self) {
        self.stop.stop();
    }
}

impl Runtime {
    /// A handle for other tasks to write to this runtime's context and to stop it.
    pub fn handle(&self) -> RuntimeHandle {
        RuntimeHandle {
            tx: self.inbox.tx.clone(),
            stop: self.stop.clone(),
            outbox: self.context.outbox(),
            nudge: self.inbox.nudge.clone(),
        }
    }

    /// Re-arms the parked event stored at `id`, as [`Context::rearm`] does. For a serving
    /// runtime, use [`RuntimeHandle::rearm`].
    ///
    /// # Errors
    /// As [`Context::rearm`].
    pub async fn rearm(&mut self, id: impl Into<ArtifactId>) -> Result<(), RearmError> {
        self.context.rearm(id).await
    }

    /// Commits the writes that handles had sent when it began, each as one commit: at most
    /// that many, so that writers who send again as soon as they are acknowledged cannot keep
    /// the turns from running.
    pub(crate) async fn apply_submitted(&mut self) {
        for _ in 0..self.inbox.rx.len() {
            let Ok(submitted) = self.inbox.rx.try_recv() else {
                break;
            };
            self.inbox.tally.commit(&mut self.context, submitted).await;
        }
    }
}
