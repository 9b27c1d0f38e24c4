//! Timers: durable wake-ups a produce schedules with
//! [`Effects::wake_at`](crate::Effects::wake_at), stored as `Timer` artifacts at
//! `timer:{key}`.

use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::model::artifact::{Artifact, ArtifactId};
use crate::model::delivery::FAR_FUTURE;

/// The prefix of the id [`Effects::wake_at`](crate::Effects::wake_at) stores a timer at.
pub(crate) const TIMER_ID_PREFIX: &str = "timer:";

/// A durable wake-up: at [`at`](Timer::at), the runtime fires it — it commits the timer with
/// [`fired`](Timer::fired) set, an `Updated` event of kind `timer` — and the produces
/// triggered by `Timer` run on it in the next generation.
///
/// Produces schedule one with [`Effects::wake_at`](crate::Effects::wake_at) (declared with
/// `also_creates = [Timer]`); it is stored at `timer:{key}`. A timer is state like any other
/// artifact: it is in the log and the state hash, survives a reopen, is copied by a fork and
/// merged by a merge, and its fire is a commit that replay and verification reproduce.
///
/// Any artifact of kind `timer` is a timer wherever it is stored, so a direct write
/// ([`Context::create`](crate::Context::create)) of one schedules it too.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use reactifact_core::{produce, Agent, Artifact, Context, ProduceCall, Runtime, Timer};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Artifact)]
/// struct Trial { ends_at: SystemTime }
/// #[derive(Serialize, Deserialize, Artifact)]
/// struct Expired { trial: String }
///
/// #[produce(Timer)]
/// async fn schedule_expiry(call: ProduceCall<Trial>) {
///     let trial = call.trigger.id.to_string();
///     call.effects.wake_at(call.trigger.data.ends_at, format!("expire:{trial}"), &trial);
/// }
///
/// #[produce(Expired)]
/// async fn expire(call: ProduceCall<Timer>) {
///     let trial: String = call.trigger.data.payload().expect("a trial id");
///     call.effects.create(format!("expired:{trial}"), Expired { trial });
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
/// let mut rt = Runtime::builder(Context::new("trials"))
///     .agent(Agent::new("trials").produce(schedule_expiry).produce(expire))
///     .build()?;
/// let ends_at = rt.now() + Duration::from_secs(14 * 24 * 3600);
/// rt.context_mut().create("trial:1", Trial { ends_at })?;
/// let report = rt.run().await?;
/// assert_eq!(report.next_wake_at, Some(ends_at)); // not due: the turn completes
///
/// tokio::time::advance(Duration::from_secs(14 * 24 * 3600)).await;
/// let report = rt.run().await?;
/// assert_eq!(report.timers_fired, 1);
/// assert!(rt.context().get::<Expired>("expired:trial:1")?.is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timer {
    /// The key the timer was scheduled under (its id is `timer:{key}`).
    pub key: String,
    /// When it is due, by the runtime's clock ([`Runtime::now`](crate::Runtime::now)).
    pub at: SystemTime,
    /// The payload, encoded with rmp-serde (named fields).
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// Whether the runtime fired it. A fired timer never fires again unless it is scheduled
    /// again with another time or payload.
    pub fired: bool,
}

impl Artifact for Timer {
    const KIND: &'static str = "timer";
}

impl Timer {
    /// An unfired timer: `key` due at `at` (clamped to the times the runtime keeps: from the
    /// Unix epoch to the end of the year 9999) with `payload` encoded with rmp-serde.
    ///
    /// # Errors
    /// The payload's encoding error.
    pub fn new<P: Serialize + ?Sized>(
        key: impl Into<String>,
        at: SystemTime,
        payload: &P,
    ) -> Result<Timer, rmp_serde::encode::Error> {
        Ok(Timer {
            key: key.into(),
            at: clamp(at),
            payload: crate::model::artifact::encode(payload)?,
            fired: false,
        })
    }

    /// The id a timer of `key` is stored at: `timer:{key}`.
    pub fn id_of(key: &str) -> ArtifactId {
        ArtifactId::from(format!("{TIMER_ID_PREFIX}{key}"))
    }

    /// The time `delay` after this timer's [`at`](Timer::at), saturating at the latest time a
    /// timer keeps (so `Duration::MAX` does not overflow). For a periodic wake-up, a produce
    /// triggered by the fire schedules the next one at `call.trigger.data.after(period)`: a time
    /// derived from the trigger, which a retry or a replay derives again.
    pub fn after(&self, delay: Duration) -> SystemTime {
        after(self.at, delay)
    }

    /// Decodes the payload as `P`.
    ///
    /// # Errors
    /// The payload's decoding error.
    pub fn payload<P: DeserializeOwned>(&self) -> Result<P, rmp_serde::decode::Error> {
        rmp_serde::from_slice(&self.payload)
    }
}

/// `at` within the times a timer keeps: not before the Unix epoch (which does not encode) and
/// not after [`FAR_FUTURE`] (the end of the year 9999, what the ledger keeps too).
pub(crate) fn clamp(at: SystemTime) -> SystemTime {
    let far = SystemTime::UNIX_EPOCH + FAR_FUTURE;
    if at < SystemTime::UNIX_EPOCH {
        SystemTime::UNIX_EPOCH
    } else {
        at.min(far)
    }
}

/// `base + delay`, saturating at the latest time a timer keeps (so `Duration::MAX` is
/// "never in practice", not an overflow).
pub(crate) fn after(base: SystemTime, delay: Duration) -> SystemTime {
    clamp(crate::model::delivery::later(base, delay))
}

/// The due time and the fired flag of the timer encoded in `bytes` (decoding only those, not
/// its payload); `None` for bytes of another shape, which are no timer.
fn head(bytes: &[u8]) -> Option<(SystemTime, bool)> {
    #[derive(Deserialize)]
    struct Head {
        at: SystemTime,
        fired: bool,
    }
    rmp_serde::from_slice::<Head>(bytes).ok().map(|h| (h.at, h.fired))
}

/// The due time of the timer encoded in `bytes`, if it is one and has not fired.
pub(crate) fn pending_at(bytes: &[u8]) -> Option<SystemTime> {
    head(bytes).and_then(|(at, fired)| (!fired).then_some(at))
}

/// Whether `bytes` encode a timer that has fired.
pub(crate) fn has_fired(bytes: &[u8]) -> bool {
    head(bytes).is_some_and(|(_, fired)| fired)
}
