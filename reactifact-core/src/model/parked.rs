//! Parked events: the trigger of a produce that failed on every attempt its retry policy
//! allowed, kept with its error for an operator, and the retry a failed run waits for.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::model::artifact::{Artifact, ArtifactId, Kind};
use crate::model::event::EventKind;
use crate::model::patch::{EffectError, Op, PutMode};
use crate::model::timer::Timer;

/// The prefix of the id a [`Parked`] record is stored at: `parked:{agent}/{produce}/{trigger}`.
pub const PARKED_ID_PREFIX: &str = "parked:";

/// The prefix of the keys of the [`Timer`](crate::Timer)s a serving runtime schedules to run a
/// failed produce again (`timer:retry/{agent}/{produce}/{trigger}`): reserved, and never seen
/// by produces triggered by `Timer`.
pub const RETRY_TIMER_PREFIX: &str = "retry/";

/// What a failed run is retried on: the produce, its trigger and the event it reacted to, how
/// many attempts failed so far and the last error. The payload of a retry timer, and what a
/// [`Parked`] record holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedRun {
    /// The agent.
    pub agent: String,
    /// The produce.
    pub produce: String,
    /// The id of the artifact it reacted to.
    pub trigger: ArtifactId,
    /// The kind of event it reacted to.
    pub event: EventKind,
    /// Attempts that failed, this one included.
    pub attempts: u32,
    /// The last attempt's error.
    pub error: String,
}

impl FailedRun {
    /// The part of the ids of its retry timer and its parked record that names it:
    /// `{agent}/{produce}/{trigger}`.
    pub fn name(&self) -> String {
        format!("{}/{}/{}", self.agent, self.produce, self.trigger)
    }

    /// The key of its retry timer: `retry/{agent}/{produce}/{trigger}`.
    pub(crate) fn retry_key(&self) -> String {
        format!("{RETRY_TIMER_PREFIX}{}", self.name())
    }

    /// The id of its parked record: `parked:{agent}/{produce}/{trigger}`.
    pub fn parked_id(&self) -> ArtifactId {
        ArtifactId::from(format!("{PARKED_ID_PREFIX}{}", self.name()))
    }
}

/// An event parked by a serving runtime: a produce failed on it (returned an error, panicked or
/// wrote a patch that does not apply) on every attempt its retry policy allowed, so the runtime
/// stopped retrying it and kept it here, with the last error, for an operator. The rest of the
/// runtime went on. Stored at `parked:{agent}/{produce}/{trigger}`, in the log like any
/// artifact, so it survives a restart.
///
/// An operator lists them ([`Context::parked`](crate::Context::parked), the CLI's
/// `reactifact parked list`) and, once the cause is fixed, re-arms one
/// ([`Runtime::rearm`](crate::Runtime::rearm), [`RuntimeHandle::rearm`](crate::RuntimeHandle::rearm),
/// `reactifact parked rearm ID`): the produce then runs again on the trigger as it is then, with
/// its retry policy's attempts anew.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parked {
    /// The failed run.
    pub run: FailedRun,
    /// When it was parked, by the runtime's clock.
    pub parked_at: SystemTime,
}

impl Artifact for Parked {
    const KIND: &'static str = "parked";
}

impl Parked {
    /// The writes that re-arm it: its record deleted and a retry due `now`, with its policy's
    /// attempts anew.
    pub(crate) fn rearm_ops(self, now: SystemTime) -> Result<Vec<Op>, EffectError> {
        let failed = FailedRun {
            attempts: 0,
            ..self.run
        };
        let key = failed.retry_key();
        let id = Timer::id_of(&key);
        let timer = Timer::new(key.as_str(), now, &failed).map_err(|source| EffectError::Encode {
            id: id.clone(),
            kind: Kind::of::<Timer>(),
            source,
        })?;
        Ok(vec![
            Op::Delete { id: failed.parked_id() },
            Op::put(PutMode::Create, id, &timer)?,
        ])
    }
}
