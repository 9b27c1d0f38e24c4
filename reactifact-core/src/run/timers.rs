//! Firing timers: before each generation, a turn commits the timers due by the runtime's clock
//! as fired (one direct write for all of them), so that the produces triggered by `Timer` run
//! on the fires in the generations that follow.

use std::time::SystemTime;

use crate::model::artifact::{Generation, Kind, Stored};
use crate::model::patch::{Op, PutMode};
use crate::model::timer::{self, Timer};
use crate::run::matching;
use crate::run::runtime::{RunError, Runtime, MAX_CONFLICT_RETRIES};
use crate::session::context::WriteError;
use crate::state::commit::Emitted;
use crate::state::readers::Readers;
use crate::store::StoreError;

/// Whether a run triggered by `trigger` is a reaction to a fire: a produce triggered by
/// `Timer` runs when its timer fires, never when it is scheduled, rescheduled or cancelled.
/// Any other kind always matches.
pub(crate) fn matches_fire(trigger: &Stored) -> bool {
    trigger.kind != Kind::of::<Timer>() || timer::has_fired(&trigger.bytes)
}

impl Runtime {
    /// The runtime's clock: the time timers fall due by, and the ledger's retries and leases.
    ///
    /// It is the system time when the process first reads it, advanced by tokio's clock, so
    /// that tokio's paused clock drives it in tests (`tokio::time::advance`); every runtime of
    /// the process reads the same one.
    pub fn now(&self) -> SystemTime {
        self.clock().now()
    }

    /// When this runtime fires its next timer: the earliest unfired timer's due time (which
    /// may be now or past); `None` without one, or for a runtime that registers no produce
    /// (which leaves timers, as it leaves events, to a runtime that has produces).
    pub fn next_wake_at(&self) -> Option<SystemTime> {
        if self.triggers.is_empty() {
            return None;
        }
        self.context.state().next_timer()
    }

    /// Commits every timer due now as fired, in one direct write; returns how many fired.
    /// Another writer committing first is taken in (its commits read) and the fire written
    /// again on its head, without the timers it fired meanwhile.
    pub(crate) async fn fire_due_timers(&mut self) -> Result<u64, RunError> {
        if self.triggers.is_empty() {
            return Ok(0);
        }
        let mut conflicts = 0;
        loop {
            let now = self.clock().now();
            let ops = self.fire_ops(now)?;
            if ops.is_empty() {
                return Ok(0);
            }
            let fired = ops.len() as u64;
            // The fire's events no produce may react to are consumed by its own commit, by the
            // rule a generation's commit follows.
            let watching = matching::Watching::of(self);
            let (agents, triggers) = (self.agents.as_slice(), &self.triggers);
            let reacts = |event: &Emitted, generation: Generation, readers: &Readers| {
                matching::reacts(agents, triggers, &watching, event, generation, readers)
            };
            match self.context.commit_fires(ops, &reacts).await {
                Ok(()) => {
                    tracing::debug!(fired, "timers fired");
                    return Ok(fired);
                }
                Err(WriteError::Store(StoreError::Conflict { .. })) if conflicts < MAX_CONFLICT_RETRIES => {
                    crate::model::telemetry::record_conflict();
                    conflicts += 1;
                    self.context.catch_up().await?;
                }
                Err(WriteError::Store(e)) => return Err(RunError::Store(e)),
                // The ops update timers read from the state just now: they apply.
                Err(e) => return Err(RunError::Timers(e)),
            }
        }
    }

    /// The updates that mark the timers due at `now` fired, earliest first.
    fn fire_ops(&self, now: SystemTime) -> Result<Vec<Op>, RunError> {
        let state = self.context.state();
        let mut ops = Vec::new();
        for id in state.timers_due(now) {
            let Some(stored) = state.get(id.as_str()) else {
                continue;
            };
            let mut timer = match stored.decode::<Timer>() {
                Ok(record) => record.data,
                // The index holds only what decodes as a timer.
                Err(_) => continue,
            };
            timer.fired = true;
            let op = Op::put(PutMode::Update, id.clone(), &timer).map_err(|e| RunError::Timers(e.into()))?;
            ops.push(op);
        }
        Ok(ops)
    }
}
