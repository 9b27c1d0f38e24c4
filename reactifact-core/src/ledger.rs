//! The delivery ledger: per idempotency key, the delivery state of an intent.

use std::collections::VecDeque;

use foldhash::HashMap;
use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::action::{ActionKey, Intent};
use crate::artifact::{ArtifactId, Generation};
use crate::error::RetryError;

/// Where an intent is in its delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum DeliveryStatus {
    /// Committed and waiting for a drain.
    Pending,
    /// Handed to a dispatcher; the outcome is not recorded yet.
    InFlight,
    /// The dispatcher reported success. Never handed to a dispatcher again.
    Delivered,
    /// The last attempt failed; `retry` re-arms it.
    Failed,
}

impl fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::InFlight => "in flight",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Failed => "failed",
        })
    }
}

/// The ledger entry of one intent. Kept out of the `PendingAction`'s content, so delivery
/// never changes a content hash.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub(crate) intent: Intent,
    pub(crate) status: DeliveryStatus,
    pub(crate) attempts: u32,
    pub(crate) last_error: Option<String>,
    pub(crate) recorded_at: SystemTime,
    pub(crate) updated_at: SystemTime,
    pub(crate) delivered_at: Option<SystemTime>,
    pub(crate) lease: Option<Lease>,
    pub(crate) expired_leases: u32,
}

/// Who holds an in-flight attempt, and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The process (drainer) that handed the intent to its dispatcher.
    pub owner: String,
    /// When the lease expires. An intent still in flight after that is put back to pending
    /// when a durable store is opened, and delivered again with the same idempotency key.
    pub expires_at: SystemTime,
}

impl Delivery {
    /// The idempotency key.
    pub fn key(&self) -> &ActionKey {
        &self.intent.key
    }

    /// The action kind.
    pub fn kind(&self) -> &str {
        &self.intent.kind
    }

    /// The id of the `PendingAction` artifact: `action:{key}`.
    pub fn action_id(&self) -> ArtifactId {
        self.intent.key.artifact_id()
    }

    /// The generation whose commit recorded the intent.
    pub fn generation(&self) -> Generation {
        self.intent.generation
    }

    /// The delivery state.
    pub fn status(&self) -> DeliveryStatus {
        self.status
    }

    /// How many times the intent was handed to a dispatcher.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The error of the last failed attempt, if the last attempt failed.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// When the intent was committed.
    pub fn recorded_at(&self) -> SystemTime {
        self.recorded_at
    }

    /// When the entry last changed.
    pub fn updated_at(&self) -> SystemTime {
        self.updated_at
    }

    /// When the delivery succeeded.
    pub fn delivered_at(&self) -> Option<SystemTime> {
        self.delivered_at
    }

    /// The lease of the attempt in flight, if one is.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// How many attempts ended with an expired lease: the process died (or lost its lease)
    /// after handing the intent to its dispatcher and before recording the outcome, so the
    /// receiver may have seen the intent. Each such attempt was followed by a delivery with
    /// the same idempotency key.
    pub fn expired_leases(&self) -> u32 {
        self.expired_leases
    }

    pub(crate) fn new(intent: Intent, now: SystemTime) -> Self {
        Delivery {
            intent,
            status: DeliveryStatus::Pending,
            attempts: 0,
            last_error: None,
            recorded_at: now,
            updated_at: now,
            delivered_at: None,
            lease: None,
            expired_leases: 0,
        }
    }
}

/// The delivery ledger of a context: one entry per idempotency key, in the order the intents
/// were committed. A key is registered once; a key already in the ledger is never registered
/// again, so it is handed to a dispatcher at most once per successful delivery.
#[derive(Default)]
pub struct Ledger {
    entries: Vec<Delivery>,
    index: HashMap<ActionKey, usize>,
    /// Entries waiting for a drain, in commit order.
    due: VecDeque<usize>,
}

impl Ledger {
    /// The entry for `key`.
    pub fn get(&self, key: &str) -> Option<&Delivery> {
        self.index.get(key).map(|&i| &self.entries[i])
    }

    /// Every entry, in commit order.
    pub fn iter(&self) -> impl Iterator<Item = &Delivery> + '_ {
        self.entries.iter()
    }

    /// How many intents the ledger holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the ledger is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many intents are waiting to be delivered.
    pub fn pending(&self) -> usize {
        self.due.len()
    }

    /// Whether the ledger holds `key`.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Adds an entry, pending if its status is pending. Keys already present are ignored.
    pub(crate) fn insert(&mut self, entry: Delivery) {
        if self.index.contains_key(entry.intent.key.as_str()) {
            return;
        }
        let at = self.entries.len();
        self.index.insert(entry.intent.key.clone(), at);
        if entry.status == DeliveryStatus::Pending {
            self.due.push_back(at);
        }
        self.entries.push(entry);
    }

    pub(crate) fn entry(&self, at: usize) -> &Delivery {
        &self.entries[at]
    }

    /// Takes up to `limit` pending intents and marks them in flight under `lease`, counting an
    /// attempt for each. Returns their positions; [`Ledger::intent_for`] gives each intent.
    pub(crate) fn begin_batch(&mut self, limit: usize, lease: &Lease, now: SystemTime) -> Vec<usize> {
        let take = limit.min(self.due.len());
        let batch: Vec<usize> = self.due.drain(..take).collect();
        for &at in &batch {
            let entry = &mut self.entries[at];
            debug_assert_eq!(entry.status, DeliveryStatus::Pending);
            entry.status = DeliveryStatus::InFlight;
            entry.attempts += 1;
            entry.updated_at = now;
            entry.lease = Some(lease.clone());
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
        let entry = &mut self.entries[at];
        entry.status = DeliveryStatus::Pending;
        entry.attempts -= 1;
        entry.lease = None;
        entry.updated_at = now;
        self.due.push_back(at);
    }

    pub(crate) fn record_delivered(&mut self, at: usize, now: SystemTime) {
        let entry = &mut self.entries[at];
        entry.status = DeliveryStatus::Delivered;
        entry.last_error = None;
        entry.lease = None;
        entry.updated_at = now;
        entry.delivered_at = Some(now);
    }

    pub(crate) fn record_failed(&mut self, at: usize, error: String, now: SystemTime) {
        let entry = &mut self.entries[at];
        entry.status = DeliveryStatus::Failed;
        entry.last_error = Some(error);
        entry.lease = None;
        entry.updated_at = now;
    }

    /// Undoes [`Ledger::rearm`] when the store could not record it.
    pub(crate) fn unarm(&mut self, at: usize) {
        if let Some(pos) = self.due.iter().rposition(|&due| due == at) {
            self.due.remove(pos);
        }
        self.entries[at].status = DeliveryStatus::Failed;
    }

    /// Puts a failed intent back to pending and returns its position.
    pub(crate) fn rearm(&mut self, key: &str, now: SystemTime) -> Result<usize, RetryError> {
        let Some(&at) = self.index.get(key) else {
            return Err(RetryError::UnknownKey(ActionKey::from(key)));
        };
        let entry = &mut self.entries[at];
        if entry.status != DeliveryStatus::Failed {
            return Err(RetryError::NotFailed {
                key: entry.intent.key.clone(),
                status: entry.status,
            });
        }
        entry.status = DeliveryStatus::Pending;
        entry.updated_at = now;
        self.due.push_back(at);
        Ok(at)
    }
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("entries", &self.entries.len())
            .field("pending", &self.due.len())
            .finish()
    }
}
