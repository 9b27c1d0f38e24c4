//! The runtime's long-running mode: turns run when writes arrive through a handle, when
//! retries fall due and when leases expire, until a stop.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;
use tracing::Instrument;

use crate::model::artifact::{Artifact, ArtifactId};
use crate::model::call::Usage;
use crate::model::delivery::Delivery;
use crate::model::patch::{Op, PutMode};
use crate::model::relation::Relation;
use crate::outbox::drain::{instant_after, Clock, DrainReport};
use crate::run::delivery::Beside;
use crate::run::runtime::{RunError, Runtime, StopHandle, TurnOutcome, TurnReport, MAX_CONFLICT_RETRIES};
use crate::state::context::{Context, WriteError};
use crate::store::outbox::{ApprovalError, CancelError, OutboxStore, RetryError};
use crate::store::StoreError;

/// A batch of writes sent to a serving runtime, and where to answer.
pub(crate) struct Submitted {
    ops: Result<Vec<Op>, crate::model::patch::EffectError>,
    done: oneshot::Sender<Result<(), WriteError>>,
}

/// The queue of writes of a runtime: what [`RuntimeHandle`]s send, and
/// [`Runtime::serve`] applies.
pub(crate) struct Inbox {
    pub(crate) tx: mpsc::UnboundedSender<Submitted>,
    pub(crate) rx: mpsc::UnboundedReceiver<Submitted>,
    /// Wakes a serving runtime's delivery: its turns committed intents, or a handle changed
    /// the ledger (an approval, a retry). A wake-up sent while it is busy is kept for its next
    /// wait.
    pub(crate) nudge: Arc<Notify>,
    /// The writes received over the runtime's life.
    pub(crate) tally: WriteTally,
}

/// The writes a runtime received through its handles, over its life.
#[derive(Debug, Default)]
pub(crate) struct WriteTally {
    /// Committed.
    pub(crate) committed: u64,
    /// Refused.
    pub(crate) refused: u64,
}

impl Default for Inbox {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Inbox {
            tx,
            rx,
            nudge: Arc::new(Notify::new()),
            tally: WriteTally::default(),
        }
    }
}

/// A write sent through a [`RuntimeHandle`] was not applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The write was refused, exactly as the same direct write to the context would be;
    /// nothing of it was written.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The runtime was dropped before it applied the write.
    #[error("the runtime is gone; the write was not applied")]
    Closed,
}

/// A handle to a runtime, for other tasks of the process: it sends writes that a
/// [`serve`](Runtime::serve)-ing runtime commits (one commit per call, like
/// [`Context::create`](crate::Context::create) and friends) and reacts to, and it stops the
/// runtime. Cheap to clone; get one from [`Runtime::handle`].
///
/// Writes sent while the runtime is not serving wait until it serves (or runs a turn).
///
/// It also carries the operator's decisions on the runtime's ledger — [`approve`](Self::approve),
/// [`reject`](Self::reject), [`retry`](Self::retry), [`cancel`](Self::cancel) — which are the
/// store's own operations (fenced, safe while any drain runs), and wake a serving runtime's
/// delivery, so that an approved or re-armed intent goes out at once rather than at its next
/// poll.
#[derive(Clone)]
pub struct RuntimeHandle {
    tx: mpsc::UnboundedSender<Submitted>,
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
    pub(crate) fn new(
        tx: mpsc::UnboundedSender<Submitted>,
        stop: StopHandle,
        outbox: Arc<dyn OutboxStore>,
        nudge: Arc<Notify>,
    ) -> Self {
        RuntimeHandle {
            tx,
            stop,
            outbox,
            nudge,
        }
    }

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

    async fn submit(&self, ops: Result<Vec<Op>, crate::model::patch::EffectError>) -> Result<(), SubmitError> {
        let (done, answer) = oneshot::channel();
        self.tx.send(Submitted { ops, done }).map_err(|_| SubmitError::Closed)?;
        answer
            .await
            .map_err(|_| SubmitError::Closed)?
            .map_err(SubmitError::Write)
    }

    /// Creates `value` at `id`, or refreshes it; resolves once it is committed.
    ///
    /// # Errors
    /// [`SubmitError::Write`] as [`Context::create`](crate::Context::create) would fail;
    /// [`SubmitError::Closed`] if the runtime is gone.
    pub async fn create<T: Artifact>(&self, id: impl Into<ArtifactId>, value: T) -> Result<(), SubmitError> {
        self.submit(Op::put(PutMode::Create, id.into(), &value).map(|op| vec![op]))
            .await
    }

    /// Replaces the artifact at `id`, which must exist; resolves once it is committed.
    ///
    /// # Errors
    /// As [`create`](RuntimeHandle::create).
    pub async fn update<T: Artifact>(&self, id: impl Into<ArtifactId>, value: T) -> Result<(), SubmitError> {
        self.submit(Op::put(PutMode::Update, id.into(), &value).map(|op| vec![op]))
            .await
    }

    /// Deletes the artifact at `id` and its relations; resolves once it is committed.
    ///
    /// # Errors
    /// As [`create`](RuntimeHandle::create).
    pub async fn delete(&self, id: impl Into<ArtifactId>) -> Result<(), SubmitError> {
        self.submit(Ok(vec![Op::Delete { id: id.into() }])).await
    }

    /// Adds the relation `from -[name]-> to`; resolves once it is committed.
    ///
    /// # Errors
    /// As [`create`](RuntimeHandle::create).
    pub async fn link(
        &self,
        from: impl Into<ArtifactId>,
        name: &str,
        to: impl Into<ArtifactId>,
    ) -> Result<(), SubmitError> {
        self.submit(Ok(vec![Op::Link(Relation::new(from, name, to))])).await
    }

    /// Asks the runtime to stop: a serving runtime finishes its turn gracefully (see
    /// [`StopHandle`]) and `serve` returns.
    pub fn stop(&self) {
        self.stop.stop();
    }
}

/// What a runtime did while serving, over its life: every [`serve`](Runtime::serve) call adds
/// to it, and each returns the sum so far.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServeReport {
    /// Turns run.
    pub turns: u64,
    /// Generations committed.
    pub generations: u64,
    /// Produce runs committed.
    pub runs: u64,
    /// Generations run again because writes were committed while their runs executed (see
    /// [`TurnReport::overtaken`](crate::TurnReport::overtaken)).
    pub overtaken: u64,
    /// Writes received through handles and committed (also those a turn run directly took).
    pub writes: u64,
    /// Writes received and refused.
    pub refused_writes: u64,
    /// Intents delivered by the runtime's own delivery.
    pub delivered: u64,
    /// Failed attempts (retried or waiting for `retry`).
    pub failed: u64,
    /// Intents that became dead letters.
    pub dead: u64,
    /// What the recorded calls of its turns used (calls made, in committed generations or
    /// not: what a call spent is spent).
    pub usage: Usage,
}

impl ServeReport {
    fn add_turn(&mut self, turn: &TurnReport) {
        self.turns += 1;
        self.generations += turn.generations;
        self.runs += turn.runs;
        self.overtaken += turn.overtaken;
        self.usage += turn.total_usage();
    }

    fn add_deliveries(&mut self, drained: &DrainReport) {
        self.delivered += drained.delivered;
        self.failed += drained.failed.len() as u64;
        self.dead += drained.dead.len() as u64;
    }
}

impl Runtime {
    /// A handle for other tasks to write to this runtime's context and to stop it.
    pub fn handle(&self) -> RuntimeHandle {
        RuntimeHandle::new(
            self.inbox.tx.clone(),
            self.stop.clone(),
            self.context.outbox(),
            self.inbox.nudge.clone(),
        )
    }

    /// Applies the writes that handles sent, each as one commit.
    pub(crate) async fn apply_submitted(&mut self) {
        while let Ok(submitted) = self.inbox.rx.try_recv() {
            self.inbox.tally.commit(&mut self.context, submitted).await;
        }
    }

    /// Serves until stopped: applies writes sent through [`handle`](Runtime::handle)s as they
    /// arrive and runs a turn after them; runs a turn when a timer of the session falls due
    /// (see [`Runtime::next_wake_at`]), and `poll` after the last turn at the latest (so that
    /// work committed by another process to the session is noticed); and returns once a stop
    /// ([`RuntimeHandle::stop`] or [`stop_handle`](Runtime::stop_handle)) is asked, after the
    /// turn running then has stopped (a generation still running is cancelled, its events stay
    /// queued). Each turn runs with the runtime's budget.
    ///
    /// With a dispatcher, the runtime's delivery runs beside its turns, never inside them: a
    /// drain of the session's intents with the same claims, leases and fencing as a
    /// [`Drainer`](crate::Drainer)'s, woken as soon as a generation commits an intent or a
    /// handle approves or re-arms one, when a retry falls due or a lease expires, and every
    /// `poll` for intents committed by other processes. A slow dispatcher never delays a turn.
    /// At the stop, deliveries already handed to the dispatcher finish within the shutdown
    /// grace ([`RuntimeBuilder::shutdown_grace`](crate::RuntimeBuilder::shutdown_grace)) and
    /// are recorded; the rest waits in the ledger for the next serve. A store that is briefly
    /// away is ridden out by both.
    ///
    /// Another process writing the same session is taken into account: its commits are read
    /// before each turn, and a handle write that meets its commit is written again on the new
    /// head. Dropping the returned future while it commits (a handle write or a generation)
    /// cuts the commit off: the context then refuses writes
    /// ([`StoreError::CutOff`](crate::StoreError::CutOff)) until it is reopened.
    ///
    /// # Errors
    /// The first error of a turn ([`RunError`]), or of the delivery (a store error that is
    /// not retryable, or the first failure with
    /// [`DeliveryErrors::FailLoud`](crate::DeliveryErrors::FailLoud)); the other part is
    /// stopped first. The runtime can serve again after it.
    pub async fn serve(&mut self, poll: Duration) -> Result<ServeReport, RunError> {
        let span = tracing::info_span!("serve", session = %self.context.session());
        self.serve_until_stopped(poll.max(Duration::from_millis(1)))
            .instrument(span)
            .await
    }

    async fn serve_until_stopped(&mut self, poll: Duration) -> Result<ServeReport, RunError> {
        let mut drained = DrainReport::default();
        let delivery = Beside::of(self);
        let stop = self.stop.clone();
        self.serving = true;
        let (turns_ended, delivery_ended) = {
            let turns = self.serve_turns(poll);
            let deliveries = async {
                match &delivery {
                    Some(delivery) => delivery.serve(poll, &mut drained).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(turns, deliveries);
            let mut delivery_ended = None;
            let turns_ended = loop {
                tokio::select! {
                    ended = &mut turns => break ended,
                    // A serving drain ends before its stop only on an error: the turns stop too.
                    ended = &mut deliveries, if delivery_ended.is_none() => {
                        delivery_ended = Some(ended);
                        stop.stop();
                    }
                }
            };
            let delivery_ended = match (delivery_ended, &delivery) {
                (Some(ended), _) => ended,
                (None, Some(delivery)) => {
                    delivery.stop();
                    deliveries.await
                }
                (None, None) => Ok(()),
            };
            (turns_ended, delivery_ended)
        };
        self.serving = false;
        self.served.add_deliveries(&drained);
        delivery_ended?;
        turns_ended?;
        Ok(self.serve_report())
    }

    /// What the runtime did while serving, over its life so far.
    pub fn serve_report(&self) -> ServeReport {
        ServeReport {
            writes: self.inbox.tally.committed,
            refused_writes: self.inbox.tally.refused,
            ..self.served.clone()
        }
    }

    /// The turns of a serving runtime, until a stop.
    async fn serve_turns(&mut self, poll: Duration) -> Result<(), RunError> {
        loop {
            // Another process serving the same session may have committed since: its commits
            // are taken first (and its queued work with them, should it have stopped).
            match self.context.catch_up().await {
                Ok(_) => {}
                // A store that is briefly away (a dropped connection, a busy file) does not end
                // the serving: the turn after the next wake-up looks again.
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e, "the session's head could not be read; serving on");
                }
                Err(e) => return Err(e.into()),
            }
            self.apply_submitted().await;
            let turn = self.run_turn(self.budget).await?;
            self.served.add_turn(&turn);
            if turn.outcome == TurnOutcome::Stopped {
                return Ok(());
            }
            if matches!(
                turn.outcome,
                TurnOutcome::GenerationsExhausted | TurnOutcome::RunsExhausted
            ) {
                continue; // more work is queued
            }
            let mut wake = instant_after(Instant::now(), poll);
            if let Some(at) = turn.next_wake_at {
                // A timer falls due: the turn then fires it. One due already, which the turn
                // just run did not fire (it ended on its deadline), is looked at again shortly.
                let at = if at <= self.clock().now() {
                    instant_after(Instant::now(), poll.min(Duration::from_millis(10)))
                } else {
                    self.clock().instant_at(at)
                };
                wake = wake.min(at);
            }
            let stop = self.stop.clone();
            tokio::select! {
                submitted = self.inbox.rx.recv() => {
                    if let Some(submitted) = submitted {
                        self.inbox.tally.commit(&mut self.context, submitted).await;
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
                () = stop.requested() => {
                    stop.clear();
                    return Ok(());
                }
            }
        }
    }
}

impl WriteTally {
    /// Commits one submitted write to `context` and answers its sender; if another writer
    /// committed to the session first, takes its commits and writes again (at most
    /// [`MAX_CONFLICT_RETRIES`] times). Returns whether the context's head moved (the write
    /// was committed, or another writer's commits were taken).
    pub(crate) async fn commit(&mut self, context: &mut Context, submitted: Submitted) -> bool {
        let head = context.head();
        let result = match submitted.ops {
            Ok(ops) => {
                let mut tries = 0;
                loop {
                    match context.commit_direct_async(ops.clone()).await {
                        Err(WriteError::Store(StoreError::Conflict { .. })) if tries < MAX_CONFLICT_RETRIES => {
                            crate::model::telemetry::record_conflict();
                            tries += 1;
                            if let Err(e) = context.catch_up().await {
                                break Err(WriteError::Store(e));
                            }
                        }
                        result => break result,
                    }
                }
            }
            Err(e) => Err(WriteError::from(e)),
        };
        match &result {
            Ok(()) => self.committed += 1,
            Err(e) => {
                tracing::warn!(error = %e, "a write sent to the runtime was refused");
                self.refused += 1;
            }
        }
        let _ = submitted.done.send(result);
        context.head() != head
    }
}
