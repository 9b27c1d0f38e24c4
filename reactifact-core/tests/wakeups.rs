//! A serving drainer over a store with wake-ups (`OutboxStore::wakeups`, as PostgreSQL's
//! `LISTEN` gives) claims an intent registered elsewhere as soon as the store says so, not at
//! its next poll; over a store without them it polls, as before. On tokio's paused clock: a
//! poll interval of an hour would let the clock run ahead an hour before a poll found it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use reactifact_core::error::{CancelError, RetryError, StoreError};
use reactifact_core::ledger::{Attempt, Delivery, FenceToken, LedgerQuery, Page, PurgeFilter, StatusCounts};
use reactifact_core::store::{BoxFuture, ClaimRequest, Claimed, OutboxStore, Recorded, Recording, Wakeups};
use reactifact_core::{ActionKey, DispatchError, Drainer, Intent, Scope};
use reactifact_store_contract::{ContractHarness, MemoryHarness};
use tokio::sync::mpsc;

/// The memory outbox, with wake-ups sent by the test.
struct Woken {
    inner: Arc<dyn OutboxStore>,
    wakeups: Mutex<Option<mpsc::UnboundedReceiver<()>>>,
}

impl OutboxStore for Woken {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        self.inner.claim(request)
    }
    fn record<'a>(
        &'a self,
        outcomes: &'a [Recording],
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<Recorded>, StoreError>> {
        self.inner.record(outcomes, now)
    }
    fn submit(&self, outcomes: Vec<Recording>, now: SystemTime) {
        self.inner.submit(outcomes, now)
    }
    fn renew<'a>(
        &'a self,
        held: &'a [(ActionKey, FenceToken)],
        until: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        self.inner.renew(held, until)
    }
    fn retry<'a>(&'a self, key: &'a str, now: SystemTime) -> BoxFuture<'a, Result<Delivery, RetryError>> {
        self.inner.retry(key, now)
    }
    fn cancel<'a>(
        &'a self,
        key: &'a str,
        reason: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, CancelError>> {
        self.inner.cancel(key, reason, now)
    }
    fn approve<'a>(
        &'a self,
        key: &'a str,
        by: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, reactifact_core::error::ApprovalError>> {
        self.inner.approve(key, by, now)
    }
    fn reject<'a>(
        &'a self,
        key: &'a str,
        by: &'a str,
        reason: &'a str,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Delivery, reactifact_core::error::ApprovalError>> {
        self.inner.reject(key, by, reason, now)
    }
    fn purge(&self, filter: PurgeFilter, before: SystemTime, limit: usize) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.inner.purge(filter, before, limit)
    }
    fn attempts<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Vec<Attempt>>, StoreError>> {
        self.inner.attempts(key)
    }
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Delivery>, StoreError>> {
        self.inner.get(key)
    }
    fn list<'a>(&'a self, query: &'a LedgerQuery) -> BoxFuture<'a, Result<Page, StoreError>> {
        self.inner.list(query)
    }
    fn counts<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<StatusCounts, StoreError>> {
        self.inner.counts(scope)
    }
    fn next_due<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Option<SystemTime>, StoreError>> {
        self.inner.next_due(scope)
    }
    fn wakeups(&self) -> Option<Wakeups> {
        let receiver = self.wakeups.lock().unwrap().take()?;
        Some(Box::pin(futures_util::stream::unfold(receiver, |mut r| async move {
            r.recv().await.map(|()| ((), r))
        })))
    }
}

/// A serving drainer over `outbox` (polling every hour) whose dispatcher reports each key.
fn serving(outbox: Arc<dyn OutboxStore>) -> (Drainer, mpsc::UnboundedReceiver<String>) {
    let (sent, delivered) = mpsc::unbounded_channel();
    let drainer = Drainer::builder(outbox, move |intent: Intent| {
        let _ = sent.send(intent.key().to_string());
        std::future::ready(Ok::<(), DispatchError>(()))
    })
    .poll_interval(Duration::from_secs(3600))
    .build()
    .expect("valid delivery options");
    (drainer, delivered)
}

#[tokio::test(start_paused = true)]
async fn a_wake_up_of_the_store_has_a_serving_drainer_claim_at_once() {
    let mut store = MemoryHarness.fresh().await;
    let (wake, wakeups) = mpsc::unbounded_channel();
    let outbox: Arc<dyn OutboxStore> = Arc::new(Woken {
        inner: store.outbox(),
        wakeups: Mutex::new(Some(wakeups)),
    });
    let (drainer, mut delivered) = serving(outbox);
    let stop = drainer.stop_handle();
    let serving = tokio::spawn(async move { drainer.serve(stop).await });
    // Let it find nothing and go idle.
    tokio::task::yield_now().await;
    let started = tokio::time::Instant::now();

    // Another process registers an intent, and the store says so.
    store
        .register(
            "orders",
            &[("notify:order:1", "notify")],
            SystemTime::now() - Duration::from_secs(1),
        )
        .await;
    wake.send(()).unwrap();
    let key = delivered.recv().await.unwrap();
    assert_eq!(key, "notify:order:1");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "delivered after {:?} of the paused clock: at the next poll, not at the wake-up",
        started.elapsed()
    );
    serving.abort();
}

#[tokio::test(start_paused = true)]
async fn without_wake_ups_a_serving_drainer_finds_it_at_its_next_poll() {
    let mut store = MemoryHarness.fresh().await;
    let (drainer, mut delivered) = serving(store.outbox());
    let stop = drainer.stop_handle();
    let serving = tokio::spawn(async move { drainer.serve(stop).await });
    tokio::task::yield_now().await;
    let started = tokio::time::Instant::now();
    store
        .register(
            "orders",
            &[("notify:order:1", "notify")],
            SystemTime::now() - Duration::from_secs(1),
        )
        .await;
    assert_eq!(delivered.recv().await.unwrap(), "notify:order:1");
    assert!(
        started.elapsed() >= Duration::from_secs(3599),
        "found after {:?}",
        started.elapsed()
    );
    serving.abort();
}
