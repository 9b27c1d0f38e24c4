//! What a drain did: counts, and lists of the intents that need a look, bounded so that a
//! drain serving for months keeps its memory.

use crate::model::action::ActionKey;
use crate::outbox::drain::DeliveryFailure;

/// What a drain did.
///
/// Each list keeps at most the latest [`LIST_LIMIT`](DrainReport::LIST_LIMIT) × 2 entries: a
/// drain that serves for long lets go of the oldest ones, a [`LIST_LIMIT`](DrainReport::LIST_LIMIT)
/// at a time, and counts them ([`unlisted`](DrainReport::unlisted)); the counts
/// ([`failed_count`](DrainReport::failed_count), [`dead_count`](DrainReport::dead_count)) cover
/// every entry, listed or not. The ledger keeps every intent's history whatever a report lists.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct DrainReport {
    /// Intents delivered.
    pub delivered: u64,
    /// Failed attempts that will be retried (at `next_attempt_at`) or wait for `retry`.
    pub failed: Vec<DeliveryFailure>,
    /// Intents that became dead letters: attempts used up, or a permanent error.
    pub dead: Vec<DeliveryFailure>,
    /// Intents held because no route handles their kind.
    pub held: Vec<ActionKey>,
    /// Intents whose attempt was cut off by a stop or the deadline after the grace period:
    /// the receiver may have seen them, so they are pending again, due at once, and are
    /// delivered again with the same key. Not failures: they do not count against the retry
    /// policy's `max_attempts`.
    pub interrupted: Vec<ActionKey>,
    /// Outcomes rejected as stale: this drain stalled past its lease while delivering these
    /// intents, another drain reclaimed them meanwhile, and the ledger keeps that drain's
    /// record (each was logged at warn).
    pub stale: u64,
    /// Intents whose stored row failed its integrity check when this drain claimed it: each is
    /// held with an `integrity:` error and never handed to a dispatcher (each was logged at
    /// error).
    pub integrity: Vec<ActionKey>,
    /// Intents still waiting when the drain ended: retries not yet due, attempts cut off,
    /// intents not started because of a stop or the deadline, and intents in flight under
    /// another holder's lease (a process that died after handing them out): they are due again
    /// when the lease expires.
    pub waiting: usize,
    /// Entries let go of, per list.
    unlisted: Unlisted,
}

/// How many entries of each list a report let go of.
#[derive(Clone, Copy, Debug, Default)]
struct Unlisted {
    failed: u64,
    dead: u64,
    held: u64,
    interrupted: u64,
    integrity: u64,
}

impl DrainReport {
    /// How many entries a list lets go of at a time, once it holds twice as many.
    pub const LIST_LIMIT: usize = 1024;

    /// Failed attempts, listed in [`failed`](DrainReport::failed) or not.
    pub fn failed_count(&self) -> u64 {
        self.failed.len() as u64 + self.unlisted.failed
    }

    /// Dead letters, listed in [`dead`](DrainReport::dead) or not.
    pub fn dead_count(&self) -> u64 {
        self.dead.len() as u64 + self.unlisted.dead
    }

    /// How many entries the lists let go of, all lists together (zero unless a list reached
    /// twice [`LIST_LIMIT`](DrainReport::LIST_LIMIT)).
    pub fn unlisted(&self) -> u64 {
        let u = &self.unlisted;
        u.failed + u.dead + u.held + u.interrupted + u.integrity
    }

    pub(crate) fn list_failed(&mut self, failure: DeliveryFailure) {
        list(&mut self.failed, failure, &mut self.unlisted.failed);
    }

    pub(crate) fn list_dead(&mut self, failure: DeliveryFailure) {
        list(&mut self.dead, failure, &mut self.unlisted.dead);
    }

    pub(crate) fn list_held(&mut self, key: ActionKey) {
        list(&mut self.held, key, &mut self.unlisted.held);
    }

    pub(crate) fn list_interrupted(&mut self, key: ActionKey) {
        list(&mut self.interrupted, key, &mut self.unlisted.interrupted);
    }

    pub(crate) fn list_integrity(&mut self, keys: impl IntoIterator<Item = ActionKey>) {
        for key in keys {
            list(&mut self.integrity, key, &mut self.unlisted.integrity);
        }
    }

    /// What changes whenever the drain ends an attempt: delivered, failed, dead and held.
    pub(crate) fn progress(&self) -> (u64, u64, u64, u64) {
        (
            self.delivered,
            self.failed_count(),
            self.dead_count(),
            self.held.len() as u64 + self.unlisted.held,
        )
    }
}

/// Adds `entry` to `list`, first letting go of its oldest [`DrainReport::LIST_LIMIT`] entries
/// (counted in `unlisted`) if it holds twice that many.
fn list<T>(list: &mut Vec<T>, entry: T, unlisted: &mut u64) {
    if list.len() >= 2 * DrainReport::LIST_LIMIT {
        list.drain(..DrainReport::LIST_LIMIT);
        *unlisted += DrainReport::LIST_LIMIT as u64;
    }
    list.push(entry);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_keeps_the_latest_entries_and_counts_the_ones_it_let_go_of() {
        let mut report = DrainReport::default();
        let n = 5 * DrainReport::LIST_LIMIT + 3;
        for i in 0..n {
            report.list_held(ActionKey::from(format!("k{i}")));
        }
        assert!(report.held.len() <= 2 * DrainReport::LIST_LIMIT);
        assert_eq!(report.held.len() as u64 + report.unlisted(), n as u64);
        assert_eq!(report.held.last().map(|k| k.as_str()), Some(&*format!("k{}", n - 1)));
        let first_kept: usize = report.held[0].as_str()[1..].parse().unwrap();
        assert_eq!(
            first_kept as u64,
            report.unlisted(),
            "the oldest ones go first, in order"
        );
        assert_eq!(report.progress().3, n as u64);
    }
}
