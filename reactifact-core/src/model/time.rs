//! The wall-clock time that commits and drains stamp on the outbox: one clock per process.
//!
//! It is the system time when the process first reads it, advanced by tokio's monotonic
//! clock, so that backoff and leases follow a paused test clock exactly and never jump with the
//! system clock. Every commit and every drain of the process reads this one clock, so an intent
//! that one of them stamps due is due for all of them. Processes on one host agree with each
//! other as far as their system clocks agreed when each first read it (a step of the system
//! clock between two process starts is a skew between them: an intent stamped due by the one
//! ahead is claimed by the other that much later, and a lease is judged expired that much
//! early or late).

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// The anchor: the system time and the monotonic instant at the first reading, both moved a
/// day back together (which changes no reading). tokio's paused clock starts where the real
/// one stood when its runtime was built, which may be before the first reading (another test's
/// runtime read it first, or the reading came a moment after the pause): measured from an
/// anchor a day back, such a clock's time still moves with every advance, instead of standing
/// still until it passes the first reading.
fn anchor() -> &'static (SystemTime, std::time::Instant) {
    static ANCHOR: OnceLock<(SystemTime, std::time::Instant)> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        const BACK: Duration = Duration::from_secs(24 * 60 * 60);
        let (wall, mono) = (SystemTime::now(), std::time::Instant::now());
        match (wall.checked_sub(BACK), mono.checked_sub(BACK)) {
            (Some(wall), Some(mono)) => (wall, mono),
            _ => (wall, mono),
        }
    })
}

/// The time now (see the module documentation).
pub(crate) fn now() -> SystemTime {
    let (wall, mono) = *anchor();
    let elapsed = Instant::now().into_std().saturating_duration_since(mono);
    wall.checked_add(elapsed).unwrap_or(wall)
}

/// The tokio instant at which [`now`] reaches `at` (at most about 30 years ahead, as tokio caps
/// its own timers, so it never overflows).
pub(crate) fn instant_at(at: SystemTime) -> Instant {
    instant_after(Instant::now(), at.duration_since(now()).unwrap_or_default())
}

/// `base + delay` for a delay from outside (a deadline, a grace period, a retry time), which
/// may be as long as `Duration::MAX`: capped at about 30 years, so it never overflows.
pub(crate) fn instant_after(base: Instant, delay: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);
    base.checked_add(delay.min(FAR)).unwrap_or(base)
}
