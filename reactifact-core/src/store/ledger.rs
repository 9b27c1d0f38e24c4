//! The delivery ledger, as a program reads it: a handle to the outbox of a store, optionally
//! scoped to some sessions and kinds, whose reads are store queries. Its pruning is in
//! `store/prune.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::model::delivery::{Attempt, Delivery, DeliveryStatus};
use crate::store::outbox::{LedgerQuery, OutboxStore, Page, Scope, StatusCounts};
use crate::store::StoreError;

/// The delivery ledger: one entry per idempotency key, in the order the intents were
/// committed. A key is registered once; a key already in the ledger is never registered
/// again, so it is handed to a dispatcher at most once per successful delivery.
///
/// The ledger belongs to the store, not to a context or a process: a context, the branches
/// forked from it, every other context opened on the same file and every
/// [`Drainer`](crate::Drainer) of it share one ledger, so a key delivered by one is never
/// delivered again by another. `Ledger` is a cheap handle to it; its reads are queries of the
/// store and return copies of the entries.
///
/// A scope narrows what a handle counts and lists, never what it deletes:
/// [`prune`](Ledger::prune) and [`prune_every`](Ledger::prune_every) delete the old final rows
/// of the whole store, on every store alike (memory, SQLite, PostgreSQL, a store of another
/// crate), through [`OutboxStore::purge`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = reactifact_core::Context::new("orders");
/// let ledger = ctx.ledger();
/// assert_eq!(ledger.pending().await?, 0);
/// assert!(ledger.get("welcome:1").await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Ledger {
    outbox: Arc<dyn OutboxStore>,
    scope: Scope,
}

impl Ledger {
    /// The ledger of `outbox`, every session's entries.
    pub fn new(outbox: Arc<dyn OutboxStore>) -> Self {
        Ledger {
            outbox,
            scope: Scope::all(),
        }
    }

    /// The same ledger, counting and listing only what `scope` admits (a prune still covers
    /// the whole store).
    pub fn scoped(&self, scope: Scope) -> Ledger {
        Ledger {
            outbox: self.outbox.clone(),
            scope,
        }
    }

    /// The same ledger, counting and listing only the intents of `session` (those its
    /// commits registered, and those attached to it).
    pub fn session(&self, session: &str) -> Ledger {
        self.scoped(Scope::session(session))
    }

    /// What this handle counts and lists.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The store's outbox.
    pub fn outbox(&self) -> &Arc<dyn OutboxStore> {
        &self.outbox
    }

    /// The entry for `key` (whatever the scope).
    ///
    /// # Errors
    /// [`StoreError`] if the store cannot be read.
    pub async fn get(&self, key: &str) -> Result<Option<Delivery>, StoreError> {
        self.outbox.get(key).await
    }

    /// Every attempt to deliver `key`, oldest first ([`OutboxStore::attempts`]); `None` for a
    /// key the ledger does not hold (whatever the scope).
    ///
    /// # Errors
    /// [`StoreError`] if the store cannot be read.
    pub async fn attempts(&self, key: &str) -> Result<Option<Vec<Attempt>>, StoreError> {
        self.outbox.attempts(key).await
    }

    /// How many intents in scope wait for an attempt: pending ones, and failed ones whose
    /// retry is scheduled.
    ///
    /// # Errors
    /// [`StoreError`] if the store cannot be read.
    pub async fn pending(&self) -> Result<u64, StoreError> {
        let counts = self.counts().await?;
        Ok(counts.pending + counts.retrying)
    }

    /// How many intents in scope are in each status.
    ///
    /// # Errors
    /// [`StoreError`] if the store cannot be read.
    pub async fn counts(&self) -> Result<StatusCounts, StoreError> {
        self.outbox.counts(&self.scope).await
    }

    /// How many intents are in scope, in any status (purged ones not counted).
    ///
    /// # Errors
    /// [`StoreError`] if the store cannot be read.
    pub async fn len(&self) -> Result<u64, StoreError> {
        Ok(self.counts().await?.total())
    }

    /// Whether no intent is in scope.
    ///
    /// # Errors
    /// [`StoreError`] if the store cannot be read.
    pub async fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len().await? == 0)
    }

    /// One page of the entries in scope, in registration order, optionally of one status:
    /// pass `after: None` for the first page and the returned [`Page::next`] for the next.
    ///
    /// # Errors
    /// [`StoreError`] if the store cannot be read.
    pub async fn page(
        &self,
        status: Option<DeliveryStatus>,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let query = LedgerQuery {
            scope: self.scope.clone(),
            status,
            after,
            limit,
        };
        self.outbox.list(&query).await
    }

    /// Every entry in scope, in registration order (read page by page; for large ledgers,
    /// prefer [`page`](Ledger::page)).
    ///
    /// # Errors
    /// [`StoreError`] if the store cannot be read.
    pub async fn entries(&self) -> Result<Vec<Delivery>, StoreError> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let page = self.page(None, after, 1024).await?;
            all.extend(page.entries);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// When the earliest intent in scope is due, or the earliest lease of one in flight
    /// expires (`None` if none waits and none is in flight).
    ///
    /// # Errors
    /// [`StoreError`] if the store cannot be read.
    pub async fn next_due(&self) -> Result<Option<SystemTime>, StoreError> {
        self.outbox.next_due(&self.scope).await
    }

    /// Counts the intents in scope and sets the outbox gauges of the installed metrics recorder
    /// from the counts: [`metric::OUTBOX_INTENTS`](crate::metric::OUTBOX_INTENTS) by status and
    /// [`metric::OUTBOX_OLDEST_PENDING_AGE`](crate::metric::OUTBOX_OLDEST_PENDING_AGE) (two
    /// queries of the store; the count of statuses reads the whole outbox). A serving
    /// [`Drainer`](crate::Drainer) given a
    /// [`metrics_interval`](crate::DrainerBuilder::metrics_interval) calls it that often; any
    /// program may call it as often as it wants fresh gauges. The gauges have no scope label:
    /// record one scope, from one process per store (the whole store, usually).
    ///
    /// # Errors
    /// [`StoreError`] if the store cannot be read; the gauges keep their last values.
    pub async fn record_metrics(&self) -> Result<StatusCounts, StoreError> {
        let counts = self.counts().await?;
        let oldest = match counts.pending {
            0 => None,
            _ => self
                .page(Some(DeliveryStatus::Pending), None, 1)
                .await?
                .entries
                .first()
                .map(|d| {
                    crate::model::time::now()
                        .duration_since(d.recorded_at())
                        .unwrap_or_default()
                }),
        };
        let by_status = DeliveryStatus::ALL.map(|status| (status, counts.of(status)));
        crate::model::telemetry::record_outbox(by_status, counts.retrying, oldest);
        Ok(counts)
    }

    /// Whether `self` and `other` are handles to the same store's ledger.
    pub fn same_as(&self, other: &Ledger) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.outbox), Arc::as_ptr(&other.outbox))
    }
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("store", &self.outbox.describe())
            .field("scope", &self.scope)
            .finish()
    }
}
