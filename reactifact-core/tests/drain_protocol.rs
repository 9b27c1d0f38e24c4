//! The drain's side of the claim protocol, watched through a store that counts what it is
//! asked: a drain never holds more claims than its delivery concurrency (so a crash can
//! re-send at most that many), outcomes are group-committed, and every claim ends in exactly
//! one accepted outcome.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::{order, process_order};
use reactifact_core::{
    ActionKey, Agent, BoxFuture, CancelError, ClaimRequest, Claimed, Context, Delivery, DispatchError, Drainer,
    FenceToken, Intent, LedgerQuery, OutboxStore, Page, Recorded, Recording, RetryError, Runtime, Scope, StatusCounts,
    StoreError,
};

/// An outbox that forwards to another and counts the claims it handed out and not yet saw an
/// accepted outcome for.
struct Watched {
    inner: Arc<dyn OutboxStore>,
    held: Mutex<i64>,
    max_held: Mutex<i64>,
    record_calls: AtomicU64,
    recorded: AtomicU64,
}

impl Watched {
    fn new(inner: Arc<dyn OutboxStore>) -> Arc<Watched> {
        Arc::new(Watched {
            inner,
            held: Mutex::new(0),
            max_held: Mutex::new(0),
            record_calls: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
        })
    }
}

impl OutboxStore for Watched {
    fn describe(&self) -> String {
        format!("watched {}", self.inner.describe())
    }

    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        Box::pin(async move {
            let claimed = self.inner.claim(request).await?;
            let mut held = self.held.lock().unwrap();
            *held += claimed.claims.len() as i64;
            let mut max = self.max_held.lock().unwrap();
            *max = (*max).max(*held);
            Ok(claimed)
        })
    }

    fn record<'a>(
        &'a self,
        outcomes: &'a [Recording],
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Vec<Recorded>, StoreError>> {
        Box::pin(async move {
            self.record_calls.fetch_add(1, Ordering::SeqCst);
            // A write takes time, as an fsync does: outcomes finishing meanwhile wait for it.
            tokio::time::sleep(Duration::from_millis(3)).await;
            let recorded = self.inner.record(outcomes, now).await?;
            let accepted = recorded.iter().filter(|r| matches!(r, Recorded::Accepted(_))).count();
            self.recorded.fetch_add(accepted as u64, Ordering::SeqCst);
            *self.held.lock().unwrap() -= accepted as i64;
            Ok(recorded)
        })
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

    fn purge(&self, before: SystemTime, limit: usize) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.inner.purge(before, limit)
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
}

/// A context with `n` pending intents (committed by a runtime without a dispatcher).
async fn pending(n: u64) -> Context {
    let mut ctx = Context::new("orders");
    let mut tx = ctx.transaction();
    for i in 0..n {
        tx.create(format!("order:{i}"), order("ada", i));
    }
    tx.commit().unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("orders").produce(process_order()))
        .build()
        .unwrap();
    rt.run_with(reactifact_core::Budget::UNLIMITED).await.unwrap();
    rt.into_context()
}

#[tokio::test(start_paused = true)]
async fn a_drain_never_holds_more_claims_than_its_concurrency_and_records_each_once() {
    let ctx = pending(500).await;
    let watched = Watched::new(ctx.outbox());
    let sent = Arc::new(AtomicU64::new(0));
    let count = sent.clone();
    let drainer = Drainer::builder(watched.clone(), move |intent: Intent| {
        count.fetch_add(1, Ordering::SeqCst);
        // Finishing at different times, so outcomes arrive while others are being written.
        let ms = 1 + (intent.key().as_str().len() as u64 * 7 + intent.attempt() as u64) % 5;
        async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<(), DispatchError>(())
        }
    })
    .concurrency(16)
    .build();
    let report = drainer.settle().await.unwrap();
    assert_eq!(report.delivered, 500);
    assert_eq!(sent.load(Ordering::SeqCst), 500);
    assert_eq!(
        watched.recorded.load(Ordering::SeqCst),
        500,
        "each claim ends in one accepted outcome"
    );
    assert_eq!(*watched.held.lock().unwrap(), 0);
    let max = *watched.max_held.lock().unwrap();
    assert!(max <= 16, "held {max} claims at once with a concurrency of 16");
    assert!(max > 1, "the drain ran deliveries concurrently");
}

#[tokio::test(start_paused = true)]
async fn outcomes_finishing_together_are_written_together() {
    let ctx = pending(256).await;
    let watched = Watched::new(ctx.outbox());
    // Every dispatch takes the same time: a whole window of outcomes finishes at once.
    let drainer = Drainer::builder(watched.clone(), |_intent: Intent| async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok::<(), DispatchError>(())
    })
    .concurrency(64)
    .build();
    assert_eq!(drainer.settle().await.unwrap().delivered, 256);
    let calls = watched.record_calls.load(Ordering::SeqCst);
    assert!(calls < 256 / 4, "{calls} writes for 256 outcomes: not group-committed");
}
