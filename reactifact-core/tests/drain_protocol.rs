//! The drain's side of the claim protocol, watched through a store that counts what it is
//! asked: a drain never holds more claims than its delivery concurrency (so a crash can
//! re-send at most that many), outcomes are group-committed, and every claim ends in exactly
//! one accepted outcome.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::{order, process_order};
use reactifact_core::error::{CancelError, RetryError, StoreError};
use reactifact_core::ledger::{Attempt, Delivery, FenceToken, LedgerQuery, Page, PurgeFilter, StatusCounts};
use reactifact_core::store::{BoxFuture, ClaimRequest, Claimed, OutboxStore, Recorded, Recording};
use reactifact_core::{ActionKey, Agent, Context, DeliveryOptions, DispatchError, Drainer, Intent, Runtime, Scope};

/// An outbox that forwards to another and counts the claims it handed out and not yet saw an
/// accepted outcome for.
struct Watched {
    inner: Arc<dyn OutboxStore>,
    held: Mutex<i64>,
    max_held: Mutex<i64>,
    record_calls: AtomicU64,
    recorded: AtomicU64,
    /// How many more writes of outcomes land but answer an error, as when the connection
    /// drops after the commit.
    lose_answers: AtomicU64,
}

impl Watched {
    fn new(inner: Arc<dyn OutboxStore>) -> Arc<Watched> {
        Arc::new(Watched {
            inner,
            held: Mutex::new(0),
            max_held: Mutex::new(0),
            record_calls: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
            lose_answers: AtomicU64::new(0),
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
            let lost = self
                .lose_answers
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if lost.is_ok() {
                return Err(StoreError::backend(
                    self.describe(),
                    true,
                    "connection reset after the commit",
                ));
            }
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
    rt.run_with(reactifact_core::runtime::Budget::UNLIMITED).await.unwrap();
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
    .delivery(DeliveryOptions::new().concurrency(16))
    .build()
    .expect("valid delivery options");
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
    .delivery(DeliveryOptions::new().concurrency(64))
    .build()
    .expect("valid delivery options");
    assert_eq!(drainer.settle().await.unwrap().delivered, 256);
    let calls = watched.record_calls.load(Ordering::SeqCst);
    assert!(calls < 256 / 4, "{calls} writes for 256 outcomes: not group-committed");
}

#[tokio::test(start_paused = true)]
async fn a_serving_drainer_takes_new_intents_while_a_long_dispatch_runs() {
    // One intent whose dispatch takes ten minutes; a second one committed a second later is
    // delivered within the poll interval, not after the long one.
    let ctx = pending(1).await;
    let delivered_at = Arc::new(Mutex::new(Vec::new()));
    let log = delivered_at.clone();
    let started = tokio::time::Instant::now();
    let drainer = Drainer::builder(ctx.outbox(), move |intent: Intent| {
        let log = log.clone();
        async move {
            if intent.key().as_str() == "notify:order:0" {
                tokio::time::sleep(Duration::from_secs(600)).await;
            }
            log.lock().unwrap().push((intent.key().to_string(), started.elapsed()));
            Ok::<(), DispatchError>(())
        }
    })
    .poll_interval(Duration::from_millis(200))
    .delivery(DeliveryOptions::new().timeout(None))
    .build()
    .expect("valid delivery options");
    let stop = drainer.stop_handle();
    let serving = tokio::spawn(async move { drainer.serve(stop).await.unwrap() });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut rt = Runtime::builder(ctx.fork("later").unwrap())
        .agent(Agent::new("orders").produce(process_order()))
        .build()
        .unwrap();
    rt.context_mut().create("order:late", order("bob", 1)).unwrap();
    rt.run().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = delivered_at.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, "notify:order:late");
    assert!(seen[0].1 < Duration::from_millis(1500), "{seen:?}");
    serving.abort();
}

#[tokio::test(start_paused = true)]
async fn a_kind_limit_does_not_let_a_drain_start_more_than_its_concurrency() {
    // Concurrency 2, kind `a` one at a time, due in the order a, a, b, a, a, b, …: while the
    // first `a`'s outcome is being written, the second `a` must not start next to the running
    // `b` — attempts started and not yet acknowledged never exceed 2.
    let acts = reactifact_core::Produce::new("acts", |call: reactifact_core::ProduceCall<common::Order>| async move {
        let kind = if call.trigger.data.total_cents % 3 == 2 {
            "b"
        } else {
            "a"
        };
        call.effects.act(kind, format!("{kind}:{}", call.trigger.id), &1u8);
    })
    .creates::<reactifact_core::PendingAction>();
    let mut ctx = Context::new("orders");
    for i in 0..30 {
        // One commit each: the intents fall due in order.
        ctx.create(format!("order:{i:02}"), order("ada", i)).unwrap();
    }
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("orders").produce(acts))
        .build()
        .unwrap();
    rt.run_with(reactifact_core::runtime::Budget::UNLIMITED).await.unwrap();
    let watched = Watched::new(rt.context().outbox());
    let started = Arc::new(AtomicU64::new(0));
    let count = started.clone();
    let peak = Arc::new(Mutex::new(0i64));
    let seen = peak.clone();
    let probe = watched.clone();
    let drainer = Drainer::builder(watched.clone(), move |intent: Intent| {
        let now = count.fetch_add(1, Ordering::SeqCst) as i64 + 1;
        let unacknowledged = now - probe.recorded.load(Ordering::SeqCst) as i64;
        let mut peak = seen.lock().unwrap();
        *peak = (*peak).max(unacknowledged);
        let ms = if intent.kind() == "a" { 1 } else { 6 };
        async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<(), DispatchError>(())
        }
    })
    .delivery(DeliveryOptions::new().concurrency(2).concurrency_for("a", 1))
    .build()
    .expect("valid delivery options");
    assert_eq!(drainer.settle().await.unwrap().delivered, 30);
    let peak = *peak.lock().unwrap();
    assert!(
        peak <= 2,
        "{peak} attempts started and not acknowledged, with a concurrency of 2"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_of_zero_is_the_shortest_lease_and_a_drain_never_reclaims_its_own_running_deliveries() {
    let ctx = pending(100).await;
    let sent = Arc::new(Mutex::new(Vec::new()));
    let log = sent.clone();
    let drainer = Drainer::builder(ctx.outbox(), move |intent: Intent| {
        log.lock().unwrap().push(intent.key().to_string());
        let ms = 1 + intent.key().as_str().len() as u64 % 7;
        async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<(), DispatchError>(())
        }
    })
    .delivery(DeliveryOptions::new().lease(Duration::ZERO).concurrency(16))
    .build()
    .expect("valid delivery options");
    // (With a zero lease taken as is, the drain kept reclaiming its own deliveries.)
    let report = tokio::time::timeout(Duration::from_secs(60), drainer.settle())
        .await
        .expect("settles")
        .unwrap();
    assert_eq!(report.delivered, 100);
    assert_eq!(report.stale, 0);
    let mut keys = sent.lock().unwrap().clone();
    let total = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!((keys.len(), total), (100, 100), "each key sent once");
}

/// Attempts that end at once and attempts that wait, interleaved, under a concurrency of 4:
/// a waiting attempt keeps its slot while the ones after it reuse another, and every key is
/// attempted exactly once and ends as its dispatch did, whichever path its attempt took (one
/// that is refused, one that panics after waiting).
#[tokio::test(start_paused = true)]
async fn immediate_and_waiting_attempts_share_slots_and_each_key_is_attempted_once() {
    use std::collections::HashMap;

    use reactifact_core::ledger::DeliveryStatus;

    let ctx = pending(300).await;
    let sent: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let log = sent.clone();
    let drainer = Drainer::builder(ctx.outbox(), move |intent: Intent| {
        let key = intent.key().to_string();
        let n: u64 = key.rsplit(':').next().unwrap().parse().unwrap();
        *log.lock().unwrap().entry(key).or_default() += 1;
        async move {
            match n % 3 {
                0 => Ok(()),
                1 => {
                    tokio::time::sleep(Duration::from_millis(1 + n % 7)).await;
                    Ok(())
                }
                // Every thirtieth panics after waiting: a failed attempt, retried later.
                _ if n % 30 == 2 => {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    panic!("dispatcher panics on {n}")
                }
                _ => Err::<(), _>(DispatchError::permanent("refused")),
            }
        }
    })
    .delivery(DeliveryOptions::new().concurrency(4))
    .build()
    .expect("valid delivery options");
    let report = drainer.flush().await.unwrap();
    assert_eq!(report.delivered, 200, "the immediate and the waiting ones");
    let sent = std::mem::take(&mut *sent.lock().unwrap());
    assert_eq!(sent.len(), 300, "every intent was handed to the dispatcher");
    assert!(
        sent.values().all(|&n| n == 1),
        "no intent was attempted twice in one flush"
    );
    let ledger = ctx.ledger();
    for i in 0..300u64 {
        let entry = ledger.get(&format!("notify:order:{i}")).await.unwrap().unwrap();
        let expected = match i % 3 {
            0 | 1 => DeliveryStatus::Delivered,
            _ if i % 30 == 2 => DeliveryStatus::Failed,
            _ => DeliveryStatus::Dead,
        };
        assert_eq!(entry.status(), expected, "order:{i}");
        assert_eq!(entry.attempts(), 1, "order:{i}");
    }
}

/// The answer to a write of outcomes is lost after the write landed (a connection that drops
/// after the commit): the drain writes them again, the store finds them already recorded under
/// the drain's own tokens, and the drain counts them as the deliveries they are — not as
/// stale outcomes another drain overtook — and sends nothing twice.
#[tokio::test(start_paused = true)]
async fn outcomes_whose_answer_was_lost_are_counted_once_as_what_they_recorded() {
    let ctx = pending(4).await;
    let watched = Watched::new(ctx.outbox());
    watched.lose_answers.store(1, Ordering::SeqCst);
    let sent = Arc::new(AtomicU64::new(0));
    let count = sent.clone();
    let drainer = Drainer::builder(watched.clone(), move |intent: Intent| {
        count.fetch_add(1, Ordering::SeqCst);
        async move {
            if intent.key().as_str().ends_with(":3") {
                return Err(DispatchError::permanent("422 unprocessable"));
            }
            Ok::<(), DispatchError>(())
        }
    })
    .build()
    .expect("valid delivery options");
    let report = drainer.flush().await.unwrap();
    assert_eq!(sent.load(Ordering::SeqCst), 4, "each key sent once");
    assert_eq!(
        (report.delivered, report.stale, report.dead.len()),
        (3, 0, 1),
        "{report:?}"
    );
    assert_eq!(watched.lose_answers.load(Ordering::SeqCst), 0, "an answer was lost");
}
