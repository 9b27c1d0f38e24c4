//! Produce retries and parked events: a serving runtime never fails on a produce. A run that
//! fails (returns an error, panics, or writes a patch that does not apply) is dropped from its
//! generation, which commits the rest, and the same commit schedules a retry of that run — a
//! [`Timer`] at `timer:retry/{agent}/{produce}/{trigger}`, due after its produce's retry
//! policy's backoff — or, after the policy's last attempt, parks it: a [`Parked`] record at
//! `parked:{agent}/{produce}/{trigger}`, with its error, until an operator re-arms it.
//!
//! When the retry timer fires, the produce runs again on its trigger as it is then (a trigger
//! deleted meanwhile, or whose condition no longer holds, is not retried), in the generation
//! that takes the fire; if it succeeds, that commit deletes the timer.

use std::time::SystemTime;

use crate::model::artifact::Stored;
use crate::model::event::EventKind;
use crate::model::parked::{FailedRun, Parked, RETRY_TIMER_PREFIX};
use crate::model::patch::{Op, PutMode};
use crate::model::timer::{Timer, TIMER_ID_PREFIX};
use crate::outbox::drain::RetryPolicy;
use crate::run::generation::Slot;
use crate::run::matching::Work;
use crate::run::runtime::Runtime;
use crate::session::context::WriteError;
use crate::state::commit::RunRecord;
use crate::state::snapshot::Snapshot;

/// Whether `id` is a retry timer's.
pub(crate) fn is_retry_timer(id: &str) -> bool {
    id.strip_prefix(TIMER_ID_PREFIX)
        .is_some_and(|key| key.starts_with(RETRY_TIMER_PREFIX))
}

/// The produce, trigger and failed attempts a fired retry timer asks to run again; `None` if
/// the timer has not fired, does not decode, names no produce of `rt`, or its trigger is gone.
pub(crate) fn due_retry(
    rt: &Runtime,
    snapshot: &Snapshot,
    timer: &Stored,
) -> Option<(Slot, std::sync::Arc<Stored>, FailedRun)> {
    let timer = timer.decode::<Timer>().ok()?.data;
    if !timer.fired {
        return None;
    }
    let failed: FailedRun = timer.payload().ok()?;
    let slot = slot_named(rt, &failed.agent, &failed.produce)?;
    let trigger = snapshot.state.get(failed.trigger.as_str())?.clone();
    Some((slot, trigger, failed))
}

fn slot_named(rt: &Runtime, agent: &str, produce: &str) -> Option<Slot> {
    let a = rt.agents.iter().position(|a| a.name() == agent)?;
    let p = rt.agents[a].produces.iter().position(|p| p.name() == produce)?;
    Some(Slot { agent: a, produce: p })
}

/// The write that follows a failed run: a retry timer due after the policy's backoff, or the
/// run parked once the policy's attempts are spent. `failed.attempts` counts this one.
/// Returns the write and whether it parks the run.
pub(crate) fn after_failure(
    failed: FailedRun,
    policy: &RetryPolicy,
    now: SystemTime,
) -> Result<(Op, bool), WriteError> {
    let key = failed.retry_key();
    // A deletion's trigger is gone from the state: such a run is parked at its first failure,
    // as is any run under a policy that does not retry by itself.
    let park = failed.attempts >= policy.attempts() || !policy.is_automatic() || failed.event == EventKind::Deleted;
    let op = if park {
        tracing::error!(agent = %failed.agent, produce = %failed.produce, artifact_id = %failed.trigger, attempts = failed.attempts, error = %failed.error, "produce failed on its last attempt; its event is parked for an operator");
        let id = failed.parked_id();
        Op::put(
            PutMode::Create,
            id,
            &Parked {
                run: failed,
                parked_at: now,
            },
        )
    } else {
        let delay = policy.delay(&key, failed.attempts);
        tracing::warn!(agent = %failed.agent, produce = %failed.produce, artifact_id = %failed.trigger, attempt = failed.attempts, retry_in = ?delay, error = %failed.error, "produce failed; it runs again after the backoff");
        let at = crate::model::timer::after(now, delay);
        let timer =
            Timer::new(key.as_str(), at, &failed).map_err(|source| crate::model::patch::EffectError::Encode {
                id: Timer::id_of(&key),
                kind: crate::model::artifact::Kind::of::<Timer>(),
                source,
            })?;
        Op::put(PutMode::Create, Timer::id_of(&key), &timer)
    };
    Ok((op?, park))
}

/// What a generation of a serving runtime writes about its runs' failures: a retry or a parked
/// record for each run that failed, and the deletion of the retry timer of each retried run
/// that succeeded. One direct run of the generation's commit.
#[derive(Default)]
pub(crate) struct Retries {
    ops: Vec<Op>,
    /// Runs parked.
    pub(crate) parked: u64,
}

impl Retries {
    /// Work `work`'s run failed with `error`: it is retried after its produce's backoff, or
    /// parked once the policy's attempts are spent.
    pub(crate) fn failed(&mut self, rt: &Runtime, work: &Work, error: &str) {
        let agent = &rt.agents[work.slot.agent];
        let produce = &agent.produces[work.slot.produce];
        let failed = FailedRun {
            agent: agent.name().to_owned(),
            produce: produce.name().to_owned(),
            trigger: work.trigger.id.clone(),
            event: work.event,
            attempts: work.retry.as_ref().map_or(0, |r| r.attempts).saturating_add(1),
            error: error.to_owned(),
        };
        let policy = rt.produce_retry_policy(agent.name(), produce.name());
        match after_failure(failed, policy, rt.now()) {
            Ok((op, parked)) => {
                self.parked += u64::from(parked);
                self.ops.push(op);
                if parked {
                    // A parked run's retry timer, if it had one, has done its work.
                    self.succeeded(work);
                }
            }
            Err(e) => tracing::error!(error = %e, "the retry of a failed run could not be written"),
        }
    }

    /// Work `work`, a retried run, succeeded or was parked: its retry timer goes.
    pub(crate) fn succeeded(&mut self, work: &Work) {
        if let Some(failed) = &work.retry {
            self.ops.push(Op::Delete {
                id: Timer::id_of(&failed.retry_key()),
            });
        }
    }

    /// The direct run that writes them, if there is anything to write.
    pub(crate) fn record(&mut self) -> Option<RunRecord> {
        (!self.ops.is_empty()).then(|| RunRecord::direct(std::mem::take(&mut self.ops)))
    }
}
