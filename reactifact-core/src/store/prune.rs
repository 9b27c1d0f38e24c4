//! Pruning: deleting the final rows of a store's outbox in short batches, once
//! ([`Ledger::prune`]) or on a schedule the application runs ([`Ledger::prune_every`]), for
//! every store alike.
//!
//! A batch is one [`OutboxStore::purge`]: each store deletes up to a batch of final rows last
//! changed before the cut-off, oldest first, with their attempt histories and attachments,
//! and leaves a tombstone for each key, all in one transaction of its own (memory: under its
//! lock; SQLite: one write transaction; PostgreSQL: one statement that skips rows another
//! transaction holds locked). The loop over the batches, the options and the schedule are
//! written here once.
//!
//! A tombstone is what keeps a pruned key from coming back: registering it again (a retry, a
//! replay or another branch re-deriving the same intent) inserts nothing, so the key is never
//! delivered twice. Tombstones are never deleted.
//!
//! [`OutboxStore::purge`]: crate::store::OutboxStore::purge

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use tokio::time::{Instant, MissedTickBehavior};

use crate::store::ledger::Ledger;
use crate::store::outbox::PurgeFilter;
use crate::store::StoreError;

/// The default number of rows one batch of a prune deletes ([`PruneOptions::batch`]).
pub const DEFAULT_PRUNE_BATCH: usize = 1000;

/// The longest interval between two passes of [`Ledger::prune_every`] (about a century): a
/// longer one (`Duration::MAX`) would overflow the clock.
const MAX_INTERVAL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What a prune deletes and how: final rows last changed more than `older_than` ago, in
/// batches. See [`Ledger::prune`].
///
/// ```
/// use std::time::Duration;
/// use reactifact_core::ledger::PruneOptions;
///
/// let week = Duration::from_secs(7 * 24 * 3600);
/// let options = PruneOptions::older_than(week).batch(500).pause(Duration::from_millis(50));
/// assert_eq!((options.age(), options.batch_size()), (week, 500));
/// assert!(options.prunes_cancelled());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PruneOptions {
    older_than: Duration,
    batch: usize,
    cancelled: bool,
    max_batches: Option<u64>,
    pause: Duration,
}

impl PruneOptions {
    /// Deletes delivered **and cancelled** rows (and rejected ones: cancelled by an operator's
    /// decision) last changed more than `older_than` ago — every final row;
    /// [`keep_cancelled`](Self::keep_cancelled) keeps the cancelled and rejected ones — in
    /// batches of [`DEFAULT_PRUNE_BATCH`], until none is left. An age past the process clock's
    /// reach (`Duration::MAX`) deletes nothing.
    pub fn older_than(older_than: Duration) -> Self {
        PruneOptions {
            older_than,
            batch: DEFAULT_PRUNE_BATCH,
            cancelled: true,
            max_batches: None,
            pause: Duration::ZERO,
        }
    }

    /// At most `rows` rows per batch, that is per transaction (at least 1).
    pub fn batch(mut self, rows: usize) -> Self {
        self.batch = rows.max(1);
        self
    }

    /// Deletes delivered rows only; cancelled and rejected rows stay (for an operator to
    /// read).
    pub fn keep_cancelled(mut self) -> Self {
        self.cancelled = false;
        self
    }

    /// At most `batches` batches per pass (at least 1); the rest waits for the next pass.
    pub fn max_batches(mut self, batches: u64) -> Self {
        self.max_batches = Some(batches.max(1));
        self
    }

    /// Waits `pause` between two batches of a pass (default none), to leave the store to
    /// other work. A pause too long for the clock (`Duration::MAX`) is about 30 years.
    pub fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// How old a final row must be to be deleted.
    pub fn age(&self) -> Duration {
        self.older_than
    }

    /// The number of rows per batch.
    pub fn batch_size(&self) -> usize {
        self.batch
    }

    /// Whether cancelled (and rejected) rows are deleted as well as delivered ones.
    pub fn prunes_cancelled(&self) -> bool {
        self.cancelled
    }

    /// The most batches one pass runs (`None`: until a batch is short).
    pub fn max_batches_per_pass(&self) -> Option<u64> {
        self.max_batches
    }

    /// The wait between two batches of a pass.
    pub fn pause_between_batches(&self) -> Duration {
        self.pause
    }

    /// The rows a batch deletes, as the store's purge takes them.
    fn filter(&self) -> PurgeFilter {
        if self.cancelled {
            PurgeFilter::Final
        } else {
            PurgeFilter::Delivered
        }
    }
}

/// What one pass of [`Ledger::prune`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneReport {
    /// Rows deleted (each left a tombstone).
    pub deleted: u64,
    /// Batches run (transactions committed), including the last, short or empty one.
    pub batches: u64,
    /// The cut-off, by the process clock (the one commits and drains stamp rows with): rows
    /// last changed before it were candidates.
    pub before: SystemTime,
    /// Whether the pass ran until a batch found fewer rows than a full batch (otherwise it
    /// stopped at [`PruneOptions::max_batches`], and rows may be left for the next pass).
    pub complete: bool,
}

/// What [`Ledger::prune_every`] did until it was stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneSummary {
    /// Passes that ran to their end.
    pub passes: u64,
    /// Passes that failed (each was logged at warn; the next pass runs on schedule).
    pub failed: u64,
    /// Rows deleted by every batch whose answer came back: the batches of the passes that ran
    /// to their end, of the failed ones before their error, and of the pass a stop cut short.
    /// (A batch the stop dropped while the store was running it committed whole or not at
    /// all, and is not counted.)
    pub deleted: u64,
}

impl Ledger {
    /// Deletes the final rows of the store last changed more than `options.age()` ago, in
    /// batches of `options.batch_size()` rows, each batch an
    /// [`OutboxStore::purge`](crate::store::OutboxStore::purge) in a transaction of its own,
    /// oldest first, until a batch finds fewer rows than a full one
    /// (or `max_batches` ran). Delivered rows always; cancelled and rejected rows unless
    /// [`PruneOptions::keep_cancelled`]. Each deleted key leaves a tombstone, so registering it
    /// again never registers it: it is never delivered again.
    ///
    /// Never touches a row that is pending, in flight, failed, dead, held or awaiting approval.
    /// On PostgreSQL a batch skips rows another transaction holds locked (the next pass takes
    /// them), so several pruners share the work.
    ///
    /// **The whole store**, whatever this handle's [`scope`](Ledger::scope): a purge deletes
    /// by status and age, and a final row may be attached to several sessions. The cut-off is
    /// taken by the process clock, the one the process's commits and drains stamp rows with.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use reactifact_core::ledger::PruneOptions;
    ///
    /// let ctx = reactifact_core::Context::new("orders");
    /// let report = ctx.ledger().prune(&PruneOptions::older_than(Duration::from_secs(3600))).await?;
    /// assert_eq!((report.deleted, report.batches, report.complete), (0, 1, true));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StoreError`] if a batch fails (the store is read-only, closed, or its backend fails);
    /// the batches committed before it stay committed.
    pub async fn prune(&self, options: &PruneOptions) -> Result<PruneReport, StoreError> {
        self.prune_counting(options, &AtomicU64::new(0)).await
    }

    /// [`prune`](Self::prune), adding each committed batch's deletions to `deleted` as it
    /// goes (so that a pass dropped or failed midway is still counted).
    async fn prune_counting(&self, options: &PruneOptions, deleted: &AtomicU64) -> Result<PruneReport, StoreError> {
        let before = crate::model::time::now()
            .checked_sub(options.older_than)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut report = PruneReport {
            deleted: 0,
            batches: 0,
            before,
            complete: false,
        };
        let outbox = self.outbox();
        let filter = options.filter();
        loop {
            if report.batches > 0 {
                if options.pause.is_zero() {
                    // A store whose purge never waits (memory) leaves the executor, and a
                    // stop, their turn between batches.
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep_until(crate::model::time::instant_after(Instant::now(), options.pause)).await;
                }
            }
            let n = outbox.purge(filter, before, options.batch).await?;
            deleted.fetch_add(n, Ordering::Relaxed);
            report.batches += 1;
            report.deleted += n;
            if n < u64::try_from(options.batch).unwrap_or(u64::MAX) {
                report.complete = true;
                break;
            }
            if options.max_batches.is_some_and(|max| report.batches >= max) {
                break;
            }
        }
        tracing::debug!(store = %outbox.describe(), deleted = report.deleted, batches = report.batches, "pruned the outbox");
        Ok(report)
    }

    /// Prunes as [`prune`](Self::prune) does (the whole store), once at once and then once
    /// every `every`, until `stop` completes; returns what it did. A pass that takes longer
    /// than `every` delays the next (passes never pile up); a failed pass is logged at warn
    /// and the schedule goes on. A stop ends the wait at once, and drops a pass that is
    /// running: its batches committed so far stay (and are counted), its current batch (one
    /// transaction) commits or rolls back whole. `every` is at least 1 ms and at most about a
    /// century.
    ///
    /// Spawn it next to the application's drainers, in one process or several:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use reactifact_core::ledger::PruneOptions;
    ///
    /// let ledger = reactifact_core::Context::new("orders").ledger();
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// let pruner = tokio::spawn(async move {
    ///     let week = Duration::from_secs(7 * 24 * 3600);
    ///     ledger
    ///         .prune_every(Duration::from_secs(600), PruneOptions::older_than(week), async {
    ///             let _ = stopped.await;
    ///         })
    ///         .await
    /// });
    /// // … at shutdown:
    /// let _ = stop.send(());
    /// let summary = pruner.await.unwrap();
    /// println!("pruned {} rows in {} passes", summary.deleted, summary.passes);
    /// # }
    /// ```
    // The signature states what an `async fn` would leave implicit: the future is `Send`.
    #[allow(clippy::manual_async_fn)]
    pub fn prune_every<'a>(
        &'a self,
        every: Duration,
        options: PruneOptions,
        stop: impl Future<Output = ()> + Send + 'a,
    ) -> impl Future<Output = PruneSummary> + Send + 'a {
        async move {
            let deleted = AtomicU64::new(0);
            let mut summary = {
                let (options, deleted) = (&options, &deleted);
                schedule(every, stop, move || async move {
                    self.prune_counting(options, deleted).await.map(drop)
                })
                .await
            };
            summary.deleted = deleted.load(Ordering::Relaxed);
            summary
        }
    }
}

/// Runs `pass` at once and then every `every` (a late pass delays the next) until `stop`
/// completes, which drops a running pass; counts the passes that ended and those that failed
/// (`deleted` is the caller's to fill).
async fn schedule<F, P>(every: Duration, stop: impl Future<Output = ()> + Send, mut pass: P) -> PruneSummary
where
    P: FnMut() -> F + Send,
    F: Future<Output = Result<(), StoreError>> + Send,
{
    let mut summary = PruneSummary::default();
    let every = every.clamp(Duration::from_millis(1), MAX_INTERVAL);
    let mut ticks = tokio::time::interval_at(Instant::now(), every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            () = &mut stop => return summary,
            _ = ticks.tick() => {}
        }
        tokio::select! {
            biased;
            () = &mut stop => return summary,
            done = pass() => match done {
                Ok(()) => summary.passes += 1,
                Err(e) => {
                    summary.failed += 1;
                    tracing::warn!(error = %e, "a pass of the outbox's pruning failed; the next runs on schedule");
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A pass that records the (paused) time it ran at, relative to `start`, and takes `takes`.
    fn recording(
        start: Instant,
        runs: Arc<Mutex<Vec<Duration>>>,
        takes: Duration,
    ) -> impl FnMut() -> std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>> + Send {
        move || {
            let runs = runs.clone();
            Box::pin(async move {
                runs.lock().unwrap().push(start.elapsed());
                tokio::time::sleep(takes).await;
                Ok(())
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn passes_run_at_once_then_every_interval_until_stopped() {
        let start = Instant::now();
        let runs = Arc::new(Mutex::new(Vec::new()));
        let stop = tokio::time::sleep(Duration::from_secs(35));
        let summary = schedule(
            Duration::from_secs(10),
            stop,
            recording(start, runs.clone(), Duration::ZERO),
        )
        .await;
        let secs: Vec<u64> = runs.lock().unwrap().iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [0, 10, 20, 30]);
        assert_eq!((summary.passes, summary.failed), (4, 0));
        // The stop ended the wait at once, not at the next tick.
        assert_eq!(start.elapsed(), Duration::from_secs(35));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_longer_than_the_interval_delays_the_next_instead_of_piling_up() {
        let start = Instant::now();
        let runs = Arc::new(Mutex::new(Vec::new()));
        let stop = tokio::time::sleep(Duration::from_secs(60));
        let summary = schedule(
            Duration::from_secs(10),
            stop,
            recording(start, runs.clone(), Duration::from_secs(25)),
        )
        .await;
        let secs: Vec<u64> = runs.lock().unwrap().iter().map(Duration::as_secs).collect();
        // Each pass starts when the one before ended (25 s later): never two at once, never a
        // burst of missed ticks.
        assert_eq!(secs, [0, 25, 50]);
        // The third pass was cut off by the stop at 60 s: two finished.
        assert_eq!(summary.passes, 2);
        assert_eq!(start.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_pass_is_counted_and_the_schedule_goes_on() {
        let calls = Arc::new(AtomicU64::new(0));
        let counted = calls.clone();
        let summary = schedule(
            Duration::from_secs(1),
            tokio::time::sleep(Duration::from_millis(4500)),
            move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n % 2 == 0 {
                        Err(StoreError::closed("test store"))
                    } else {
                        Ok(())
                    }
                }
            },
        )
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!((summary.passes, summary.failed), (2, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_before_the_first_tick_runs_no_pass() {
        let calls = Arc::new(AtomicU64::new(0));
        let counted = calls.clone();
        let summary = schedule(Duration::from_secs(1), std::future::ready(()), move || {
            counted.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(()))
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert_eq!(summary, PruneSummary::default());
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_interval_runs_one_pass_and_waits_for_the_stop() {
        let start = Instant::now();
        let runs = Arc::new(Mutex::new(Vec::new()));
        let stop = tokio::time::sleep(Duration::from_secs(3600));
        let summary = schedule(Duration::MAX, stop, recording(start, runs.clone(), Duration::ZERO)).await;
        assert_eq!(runs.lock().unwrap().len(), 1);
        assert_eq!(summary.passes, 1);
        assert_eq!(start.elapsed(), Duration::from_secs(3600));
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_interval_is_one_millisecond() {
        let start = Instant::now();
        let runs = Arc::new(Mutex::new(Vec::new()));
        let stop = tokio::time::sleep(Duration::from_micros(3500));
        let summary = schedule(Duration::ZERO, stop, recording(start, runs.clone(), Duration::ZERO)).await;
        let micros: Vec<u128> = runs.lock().unwrap().iter().map(Duration::as_micros).collect();
        assert_eq!(micros, [0, 1000, 2000, 3000]);
        assert_eq!(summary.passes, 4);
    }

    #[test]
    fn options_clamp_what_would_stall_a_pass() {
        let options = PruneOptions::older_than(Duration::MAX).batch(0).max_batches(0);
        assert_eq!(options.batch_size(), 1);
        assert_eq!(options.max_batches_per_pass(), Some(1));
        assert!(options.prunes_cancelled());
        assert_eq!(options.filter(), PurgeFilter::Final);
        let kept = options.keep_cancelled();
        assert!(!kept.prunes_cancelled());
        assert_eq!(kept.filter(), PurgeFilter::Delivered);
    }
}
