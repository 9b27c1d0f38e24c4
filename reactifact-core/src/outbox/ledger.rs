//! The delivery ledger: per idempotency key, the delivery state of an intent.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use foldhash::HashMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use crate::model::action::{ActionKey, Intent};
pub(crate) use crate::model::delivery::later;
pub use crate::model::delivery::{Delivery, DeliveryStatus, Lease};
pub(crate) use crate::store::outbox::FailedAttempt;
pub use crate::store::outbox::RetryError;

/// Puts this in-flight entry, whose lease expired, back to pending, counting the expired
/// lease and saying why in `last_error`. The caller tracks scheduling.
pub(crate) fn reclaim(entry: &mut Delivery, now: SystemTime) {
    let owner = entry
        .lease
        .take()
        .map_or_else(|| "an unknown drainer".to_owned(), |l| l.owner.to_string());
    entry.status = DeliveryStatus::Pending;
    entry.expired_leases += 1;
    entry.updated_at = now;
    entry.last_error = Some(format!(
        "attempt {} was in flight under the lease of {owner}, which expired before its outcome was recorded; \
         the receiver may have seen it, so it is delivered again with the same key",
        entry.attempts
    ));
}

/// The delivery ledger: one entry per idempotency key, in the order the intents were
/// committed. A key is registered once; a key already in the ledger is never registered
/// again, so it is handed to a dispatcher at most once per successful delivery.
///
/// The ledger belongs to the store, not to one branch: a context and the branches forked from
/// it share one ledger, so a key delivered on one branch is never delivered again on another.
/// `Ledger` is a cheap handle to it; reads return copies of the entries.
#[derive(Clone, Default)]
pub struct Ledger {
    inner: Arc<Mutex<LedgerInner>>,
}

impl Ledger {
    pub(crate) fn lock(&self) -> MutexGuard<'_, LedgerInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The entry for `key`.
    pub fn get(&self, key: &str) -> Option<Delivery> {
        self.lock().get(key).cloned()
    }

    /// Every entry, in commit order (a copy taken now).
    pub fn iter(&self) -> impl Iterator<Item = Delivery> {
        self.lock().entries.clone().into_iter()
    }

    /// How many intents the ledger holds.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether the ledger is empty.
    pub fn is_empty(&self) -> bool {
        self.lock().entries.is_empty()
    }

    /// How many intents wait for an attempt: pending ones, and failed ones whose retry is
    /// scheduled.
    pub fn pending(&self) -> usize {
        self.lock().pending()
    }

    /// When the earliest waiting intent is due, or the earliest lease of an intent in flight
    /// expires (`None` if none waits and none is in flight).
    pub fn next_due(&self) -> Option<SystemTime> {
        self.lock().next_due()
    }

    /// Whether `self` and `other` are the same ledger (a context and its branches).
    pub fn same_as(&self, other: &Ledger) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// The ledger's contents, behind the [`Ledger`] handle's lock.
#[derive(Default)]
pub(crate) struct LedgerInner {
    entries: Vec<Delivery>,
    index: HashMap<ActionKey, usize>,
    /// Pending entries, due now, in commit order (the common case: a queue).
    ready: VecDeque<usize>,
    /// Failed entries with a scheduled retry, by (due time in Unix milliseconds, position).
    scheduled: BTreeSet<(u64, usize)>,
    /// In-flight entries by lease expiry (Unix milliseconds): the positions that took or
    /// renewed a lease expiring then, one vector per batch. An entry that has left flight, or
    /// moved to a renewed lease, is skipped when its old expiry is reclaimed, so recording an
    /// outcome costs nothing here ([`LedgerInner::reclaim_expired`]).
    leases: BTreeMap<u64, Vec<usize>>,
    /// How many entries are in flight.
    in_flight: usize,
}

fn due_key(at: Option<SystemTime>) -> u64 {
    at.map_or(0, |t| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
            .max(1)
    })
}

impl LedgerInner {
    pub(crate) fn get(&self, key: &str) -> Option<&Delivery> {
        self.index.get(key).map(|&i| &self.entries[i])
    }

    /// Pending entries and failed ones with a scheduled retry.
    pub(crate) fn pending(&self) -> usize {
        self.ready.len() + self.scheduled.len()
    }

    /// Entries in flight under a lease: each finishes, or comes back when its lease expires.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// When the next entry is due: a pending one, a scheduled retry, or a lease's expiry.
    pub(crate) fn next_due(&self) -> Option<SystemTime> {
        match self.ready.front() {
            Some(&at) => Some(self.entries[at].updated_at),
            None => {
                let retry = self.scheduled.first().map(|&(due, _)| due);
                let lease = self.leases.keys().next().copied();
                retry.into_iter().chain(lease).min().map(from_due_key)
            }
        }
    }

    /// Whether an intent is due at `now`, or a lease has expired.
    pub(crate) fn has_due(&self, now: SystemTime) -> bool {
        let now = due_key(Some(now));
        !self.ready.is_empty()
            || self.scheduled.first().is_some_and(|&(due, _)| due <= now)
            || self.leases.keys().next().is_some_and(|&due| due <= now)
    }

    /// Puts every in-flight entry whose lease expired at `now` back to pending, due now (its
    /// holder died, or stalled past its lease, after handing it to a dispatcher: the receiver
    /// may have seen it, so it is delivered again with the same key). Returns their positions,
    /// for the store to record.
    pub(crate) fn reclaim_expired(&mut self, now: SystemTime) -> Vec<usize> {
        let mut reclaimed = Vec::new();
        let now_key = due_key(Some(now));
        while let Some(expiring) = self.leases.first_entry() {
            if *expiring.key() > now_key {
                break;
            }
            let (due, positions) = expiring.remove_entry();
            for at in positions {
                let entry = &self.entries[at];
                let holds = entry.status == DeliveryStatus::InFlight
                    && entry.lease.as_ref().is_some_and(|l| due_key(Some(l.expires_at)) == due);
                if holds {
                    reclaim(&mut self.entries[at], now);
                    self.in_flight -= 1;
                    self.schedule(at);
                    reclaimed.push(at);
                }
            }
        }
        self.forget_leases_if_none_in_flight();
        reclaimed
    }

    /// Drops the expiries of batches that have all left flight.
    fn forget_leases_if_none_in_flight(&mut self) {
        if self.in_flight == 0 {
            self.leases.clear();
        }
    }

    /// Moves the entry at `at` from lease `from` to lease `to`, if it still holds `from`.
    pub(crate) fn renew(&mut self, at: usize, from: &Lease, to: &Lease) -> bool {
        if self.entries[at].lease.as_ref() != Some(from) {
            return false;
        }
        self.entries[at].lease = Some(to.clone());
        self.leases.entry(due_key(Some(to.expires_at))).or_default().push(at);
        true
    }

    /// Clears the lease of an in-flight entry leaving that state.
    fn end_lease(&mut self, at: usize) {
        if self.entries[at].lease.take().is_some() {
            self.in_flight -= 1;
            self.forget_leases_if_none_in_flight();
        }
    }

    /// Tracks the lease of an entry in flight.
    fn track_lease(&mut self, at: usize) {
        let entry = &self.entries[at];
        if let (DeliveryStatus::InFlight, Some(lease)) = (entry.status, &entry.lease) {
            self.leases.entry(due_key(Some(lease.expires_at))).or_default().push(at);
            self.in_flight += 1;
        }
    }

    /// Whether the ledger holds `key`.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    fn schedule(&mut self, at: usize) {
        let entry = &self.entries[at];
        match (entry.status, entry.next_attempt_at) {
            (DeliveryStatus::Pending, _) => self.ready.push_back(at),
            (DeliveryStatus::Failed, Some(when)) => {
                self.scheduled.insert((due_key(Some(when)), at));
            }
            _ => {}
        }
    }

    fn unschedule(&mut self, at: usize) {
        let entry = &self.entries[at];
        match (entry.status, entry.next_attempt_at) {
            (DeliveryStatus::Pending, _) => {
                if let Some(pos) = self.ready.iter().rposition(|&r| r == at) {
                    self.ready.remove(pos);
                }
            }
            (DeliveryStatus::Failed, Some(when)) => {
                self.scheduled.remove(&(due_key(Some(when)), at));
            }
            _ => {}
        }
    }

    /// Adds an entry, waiting if it is pending or has a scheduled retry. Keys already present
    /// are ignored.
    pub(crate) fn insert(&mut self, entry: Delivery) {
        if self.index.contains_key(entry.intent.key.as_str()) {
            return;
        }
        let at = self.entries.len();
        self.index.insert(entry.intent.key.clone(), at);
        self.entries.push(entry);
        self.schedule(at);
        self.track_lease(at);
    }

    pub(crate) fn entry(&self, at: usize) -> &Delivery {
        &self.entries[at]
    }

    /// Takes up to `limit` intents due at `now` and marks them in flight under `lease`,
    /// counting an attempt for each. Returns their positions; [`LedgerInner::intent_for`] gives
    /// each intent.
    pub(crate) fn begin_batch(&mut self, limit: usize, lease: &Lease, now: SystemTime) -> Vec<usize> {
        let due = due_key(Some(now));
        let mut batch = Vec::with_capacity(limit.min(self.pending()));
        while batch.len() < limit {
            match self.scheduled.first() {
                Some(&(when, at)) if when <= due => {
                    self.scheduled.pop_first();
                    batch.push(at);
                }
                _ => break,
            }
        }
        let take = (limit - batch.len()).min(self.ready.len());
        batch.extend(self.ready.drain(..take));
        for &at in &batch {
            let entry = &mut self.entries[at];
            entry.status = DeliveryStatus::InFlight;
            entry.attempts += 1;
            entry.updated_at = now;
            entry.next_attempt_at = None;
            entry.lease = Some(lease.clone());
        }
        if !batch.is_empty() {
            self.in_flight += batch.len();
            self.leases
                .entry(due_key(Some(lease.expires_at)))
                .or_default()
                .extend_from_slice(&batch);
        }
        batch
    }

    /// The intent at `at`, stamped with its current attempt number.
    pub(crate) fn intent_for(&self, at: usize) -> Intent {
        let entry = &self.entries[at];
        let mut intent = entry.intent.clone();
        intent.attempt = entry.attempts;
        intent
    }

    /// Puts an in-flight intent that was never handed to its dispatcher back to pending,
    /// uncounting its attempt.
    pub(crate) fn release(&mut self, at: usize, now: SystemTime) {
        self.end_lease(at);
        let entry = &mut self.entries[at];
        entry.status = DeliveryStatus::Pending;
        entry.attempts -= 1;
        entry.updated_at = now;
        self.schedule(at);
    }

    pub(crate) fn record_delivered(&mut self, at: usize, now: SystemTime) {
        self.end_lease(at);
        let entry = &mut self.entries[at];
        entry.status = DeliveryStatus::Delivered;
        entry.last_error = None;
        entry.updated_at = now;
        entry.delivered_at = Some(now);
    }

    /// Records a failed attempt: retried at `retry_at`, or, without one, left for `retry`
    /// (`Failed`) or given up (`Dead`).
    pub(crate) fn record_failed(&mut self, at: usize, error: String, outcome: FailedAttempt, now: SystemTime) {
        self.end_lease(at);
        let entry = &mut self.entries[at];
        entry.last_error = Some(error);
        entry.updated_at = now;
        match outcome {
            FailedAttempt::RetryAt(when) => {
                entry.status = DeliveryStatus::Failed;
                // Whole milliseconds, rounded up: what a store keeps, and never early.
                entry.next_attempt_at = Some(from_due_key(due_key(Some(when)) + u64::from(has_sub_millis(when))));
            }
            FailedAttempt::AwaitRetry => entry.status = DeliveryStatus::Failed,
            FailedAttempt::Dead => entry.status = DeliveryStatus::Dead,
        }
        self.schedule(at);
    }

    /// Records an attempt cut off before its outcome was known: pending again, due now, the
    /// attempt counted (the receiver may have seen it) and counted as interrupted.
    pub(crate) fn record_interrupted(&mut self, at: usize, reason: String, now: SystemTime) {
        self.end_lease(at);
        let entry = &mut self.entries[at];
        entry.status = DeliveryStatus::Pending;
        entry.interrupted += 1;
        entry.last_error = Some(reason);
        entry.updated_at = now;
        self.schedule(at);
    }

    /// Records that no route handles the intent's kind: it is held, and its attempt (which
    /// reached no handler) is not counted.
    pub(crate) fn record_held(&mut self, at: usize, reason: String, now: SystemTime) {
        self.end_lease(at);
        let entry = &mut self.entries[at];
        entry.status = DeliveryStatus::Held;
        entry.attempts -= 1;
        entry.last_error = Some(reason);
        entry.updated_at = now;
    }

    /// Puts a failed, dead or held intent back to pending, due now, and returns its position
    /// and what it was, for [`LedgerInner::unarm`].
    pub(crate) fn rearm(&mut self, key: &str, now: SystemTime) -> Result<(usize, Delivery), RetryError> {
        let Some(&at) = self.index.get(key) else {
            return Err(RetryError::UnknownKey(ActionKey::from(key)));
        };
        let status = self.entries[at].status;
        if !matches!(
            status,
            DeliveryStatus::Failed | DeliveryStatus::Dead | DeliveryStatus::Held
        ) {
            return Err(RetryError::NotFailed {
                key: self.entries[at].intent.key.clone(),
                status,
            });
        }
        let before = self.entries[at].clone();
        self.unschedule(at);
        let entry = &mut self.entries[at];
        entry.status = DeliveryStatus::Pending;
        entry.next_attempt_at = None;
        entry.updated_at = now;
        self.schedule(at);
        Ok((at, before))
    }

    /// Undoes [`LedgerInner::rearm`] when the store could not record it.
    pub(crate) fn unarm(&mut self, at: usize, before: Delivery) {
        self.unschedule(at);
        self.entries[at] = before;
        self.schedule(at);
        self.track_lease(at);
    }
}

fn has_sub_millis(t: SystemTime) -> bool {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .is_ok_and(|d| d.subsec_nanos() % 1_000_000 != 0)
}

fn from_due_key(millis: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(millis)
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("Ledger")
            .field("entries", &inner.entries.len())
            .field("pending", &inner.pending())
            .finish()
    }
}
