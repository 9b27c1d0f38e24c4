//! The runtime's long-running mode: turns run when writes arrive through a handle and when
//! timers fall due, its delivery runs beside them, until a stop.

use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::model::call::Usage;
use crate::outbox::drain::instant_after;
use crate::outbox::report::DrainReport;
use crate::run::delivery::Beside;
use crate::run::runtime::{RunError, Runtime, TurnOutcome, TurnReport};

/// The first pause of a serving runtime after a turn its store failed with a retryable error.
const STORE_PAUSE: Duration = Duration::from_millis(50);
/// The longest such pause.
const MAX_STORE_PAUSE: Duration = Duration::from_secs(5);

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
    /// Produce runs that failed (each retried, or parked).
    pub failed_runs: u64,
    /// Runs parked after their last attempt (see [`Parked`](crate::Parked)).
    pub parked: u64,
    /// Intents delivered by the runtime's own delivery.
    pub delivered: u64,
    /// Failed attempts (retried or waiting for `retry`).
    pub failed: u64,
    /// Intents that became dead letters.
    pub dead: u64,
    /// Events still queued when the last `serve` returned (a generation cancelled by the stop
    /// leaves its events queued): the next serve or turn takes them.
    pub queued_events: usize,
    /// Intents of the session still waiting in the ledger when the last `serve` returned:
    /// pending, retrying, or in flight under another holder's lease. The next serve, or any
    /// drainer of the store, delivers them.
    pub waiting_intents: usize,
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
        self.failed_runs += turn.failed_runs.len() as u64;
        self.parked += turn.parked;
        self.usage += turn.total_usage();
    }

    fn add_deliveries(&mut self, drained: &DrainReport) {
        self.delivered += drained.delivered;
        self.failed += drained.failed_count();
        self.dead += drained.dead_count();
    }
}

impl Runtime {
    /// Serves until stopped: applies writes sent through [`handle`](Runtime::handle)s as they
    /// arrive and runs a turn after them; runs a turn when a timer of the session falls due
    /// (see [`Runtime::next_wake_at`]), and `poll` after the last turn at the latest (so that
    /// work committed by another process to the session is noticed); and returns once a stop
    /// ([`RuntimeHandle::stop`](crate::RuntimeHandle::stop) or [`stop_handle`](Runtime::stop_handle)) is asked, after the
    /// turn running then has stopped (a generation still running is cancelled, its events stay
    /// queued). Each turn runs with the runtime's budget.
    ///
    /// With a dispatcher, the runtime's delivery runs beside its turns, never inside them: a
    /// drain of the session's intents with the same claims, leases and fencing as a
    /// [`Drainer`](crate::Drainer)'s, woken as soon as a generation commits an intent or a
    /// handle approves or re-arms one, when a retry falls due or a lease expires, and every
    /// `poll` for intents committed by other processes. A slow dispatcher never delays a turn.
    /// At the stop, deliveries already handed to the dispatcher finish within the shutdown
    /// grace ([`DeliveryOptions::grace`](crate::DeliveryOptions::grace)) and
    /// are recorded; the rest waits in the ledger for the next serve. A store that is briefly
    /// away is ridden out by both.
    ///
    /// Another process writing the same session is taken into account: its commits are read
    /// before each turn, and a handle write that meets its commit is written again on the new
    /// head. Dropping the returned future while it commits (a handle write or a generation)
    /// cuts the commit off: the context then refuses writes
    /// ([`StoreError::CutOff`](crate::StoreError::CutOff)) until it is reopened.
    ///
    /// Nothing a produce does ends the serving: a run that fails (returns an error, panics, or
    /// writes a patch that does not apply) is dropped from its generation, which commits the
    /// rest, and the same commit schedules it to run again after its produce's retry policy's
    /// backoff ([`RuntimeBuilder::produce_retry_policy`](crate::RuntimeBuilder::produce_retry_policy));
    /// after the last attempt its event is parked ([`Parked`](crate::Parked)) for an operator
    /// to re-arm ([`RuntimeHandle::rearm`](crate::RuntimeHandle::rearm)). A store error that is
    /// retryable is ridden out with a pause (50 ms, doubling to 5 s) and the turn runs again.
    ///
    /// # Errors
    /// A fatal store error (a corrupt file, a refused schema: not
    /// [retryable](crate::StoreError::is_retryable)) of a turn or of the delivery, or the
    /// delivery's first failure with [`DeliveryErrors::FailLoud`](crate::DeliveryErrors::FailLoud);
    /// the other part is stopped first. The runtime can serve again after it.
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
        self.served.queued_events = self.context.queued_events();
        self.served.waiting_intents = match delivery {
            Some(_) => drained.waiting,
            // Without a dispatcher, every pending intent of the session waits.
            None => match self.context.ledger().session(self.context.session()).pending().await {
                Ok(pending) => usize::try_from(pending).unwrap_or(usize::MAX),
                Err(e) => {
                    tracing::warn!(error = %e, "the ledger could not be counted");
                    0
                }
            },
        };
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
        // The pause after a turn the store failed with a retryable error, doubling while it
        // fails, up to 5 s.
        let mut pause = STORE_PAUSE;
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
            let turn = match self.run_turn(self.budget).await {
                Ok(turn) => turn,
                // A store that is briefly away (a dropped connection, a busy file) does not end
                // the serving: nothing of the failed generation was written, and it runs again.
                Err(RunError::Store(e)) if e.is_retryable() => {
                    tracing::warn!(error = %e, retry_in = ?pause, "the store failed a turn; serving on after a pause");
                    let stop = self.stop.clone();
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = stop.requested() => {
                            stop.clear();
                            return Ok(());
                        }
                    }
                    pause = (pause * 2).min(MAX_STORE_PAUSE);
                    continue;
                }
                Err(e) => return Err(e),
            };
            pause = STORE_PAUSE;
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
