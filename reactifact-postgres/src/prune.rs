//! Pruning: deleting final rows of the outbox in short batches, once
//! ([`PostgresOutbox::prune`]) or on a schedule the user runs ([`PostgresOutbox::prune_every`]).
//!
//! A batch is one statement, in a transaction of its own: it locks up to `batch` final rows
//! last changed before the cut-off, oldest first, from the partial index `outbox_final`
//! (`(updated_at, seq) WHERE status IN (delivered, cancelled, rejected)`) with `FOR UPDATE SKIP
//! LOCKED`, writes a tombstone for each key into `outbox_purged` (as
//! [`OutboxStore::purge`](reactifact_core::store::OutboxStore::purge) does), deletes the keys'
//! attachments and deletes the rows. Rows pending, in flight, failed, dead, held or awaiting approval are never
//! touched; a row another transaction holds locked is skipped (the next pass takes it). Each
//! batch commits before the next begins, so no lock is held longer than one batch, and
//! several pruners (in several processes) share the work instead of waiting for each other.
//!
//! A tombstone is what keeps a pruned key from coming back: registering it again (a retry, a
//! replay or another branch re-deriving the same intent) inserts nothing, so the key is never
//! delivered twice. Tombstones are never deleted; each is a key and a time (about 40 bytes
//! plus the key).

use std::future::Future;
use std::time::{Duration, SystemTime};

use reactifact_core::error::StoreError;
use reactifact_core::ledger::PurgeFilter;
use tokio::time::{Instant, MissedTickBehavior};

use crate::outbox::PostgresOutbox;
use crate::row::ms;

/// The default number of rows one batch deletes.
pub const DEFAULT_PRUNE_BATCH: usize = 1000;

/// What a prune deletes and how: final rows last changed more than `older_than` ago, in
/// batches. See [`PostgresOutbox::prune`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PruneOptions {
    older_than: Duration,
    batch: usize,
    cancelled: bool,
    max_batches: Option<u64>,
    pause: Duration,
}

impl PruneOptions {
    /// Deletes delivered **and cancelled** rows last changed more than `older_than` ago (both
    /// are final; [`keep_cancelled`](Self::keep_cancelled) keeps the cancelled ones), in
    /// batches of [`DEFAULT_PRUNE_BATCH`], until none is left.
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

    /// Deletes delivered rows only; cancelled rows stay (for an operator to read).
    pub fn keep_cancelled(mut self) -> Self {
        self.cancelled = false;
        self
    }

    /// At most `batches` batches per pass (at least 1); the rest waits for the next pass.
    pub fn max_batches(mut self, batches: u64) -> Self {
        self.max_batches = Some(batches.max(1));
        self
    }

    /// Waits `pause` between two batches of a pass (default none), to leave the server to
    /// other work.
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

    /// Whether cancelled rows are deleted as well as delivered ones.
    pub fn prunes_cancelled(&self) -> bool {
        self.cancelled
    }
}

/// What one pass of [`PostgresOutbox::prune`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneReport {
    /// Rows deleted (each left a tombstone).
    pub deleted: u64,
    /// Batches run (transactions committed), including the last, short or empty one.
    pub batches: u64,
    /// The cut-off: rows last changed before it were candidates.
    pub before: SystemTime,
    /// Whether the pass ran until a batch found fewer rows than a full batch (otherwise it
    /// stopped at [`PruneOptions::max_batches`], and rows may be left for the next pass).
    pub complete: bool,
}

/// What [`PostgresOutbox::prune_every`] did until it was stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneSummary {
    /// Passes that ran to their end.
    pub passes: u64,
    /// Passes that failed (each was logged at warn; the next pass runs on schedule).
    pub failed: u64,
    /// Rows deleted over all passes.
    pub deleted: u64,
}

/// The longest interval between passes (about a century): a longer one (`Duration::MAX`)
/// would overflow the clock.
const MAX_INTERVAL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The batch statement of a purge or a prune of the final rows `filter` admits: `$1` the
/// cut-off (ms), `$2` the batch size, `$3` the tombstones' time (ms). The rows' attempt
/// histories and attachments go with them.
pub(crate) fn statement(s: &str, filter: PurgeFilter) -> String {
    // The literal list lets the planner prove the partial index's predicate.
    let statuses = filter.codes().iter().map(u8::to_string).collect::<Vec<_>>().join(", ");
    format!(
        "WITH old AS MATERIALIZED (
             SELECT o.seq, o.key FROM {s}.outbox o WHERE o.status IN ({statuses}) AND o.updated_at < $1
              ORDER BY o.updated_at, o.seq LIMIT $2 FOR UPDATE SKIP LOCKED
         ), t AS (
             INSERT INTO {s}.outbox_purged (key, purged_at) SELECT key, $3 FROM old ON CONFLICT (key) DO NOTHING
         ), m AS (
             DELETE FROM {s}.outbox_members WHERE key IN (SELECT key FROM old)
         ), a AS (
             DELETE FROM {s}.outbox_attempts WHERE key IN (SELECT key FROM old)
         ), d AS (
             DELETE FROM {s}.outbox WHERE seq IN (SELECT seq FROM old) RETURNING 1
         )
         SELECT count(*) FROM d"
    )
}

impl PostgresOutbox {
    /// Deletes the final rows last changed more than `options.age()` ago, in batches of
    /// `options.batch_size()` rows, each batch in a transaction of its own, oldest first, until
    /// a batch finds fewer rows than a full one (or `max_batches` ran). Delivered rows always;
    /// cancelled rows unless [`PruneOptions::keep_cancelled`]. Each deleted key leaves a
    /// tombstone, so registering it again never registers it (it is never delivered again).
    ///
    /// Never touches a row that is pending, in flight, failed, dead or held, and skips rows
    /// another transaction holds locked.
    ///
    /// # Errors
    /// [`StoreError::Backend`] for an error of the server; the batches committed before it
    /// stay committed.
    pub async fn prune(&self, options: &PruneOptions) -> Result<PruneReport, StoreError> {
        let now = SystemTime::now();
        let before = now.checked_sub(options.older_than).unwrap_or(SystemTime::UNIX_EPOCH);
        let mut report = PruneReport {
            deleted: 0,
            batches: 0,
            before,
            complete: false,
        };
        let sql = self.prune_sql(options.cancelled);
        let limit = i64::try_from(options.batch).unwrap_or(i64::MAX);
        let cut = ms(before);
        loop {
            if report.batches > 0 && !options.pause.is_zero() {
                tokio::time::sleep(options.pause).await;
            }
            let client = self.pooled().await?;
            let err = |e| crate::connect::store_error(self.name(), e);
            let stmt = client.prepare_cached(sql).await.map_err(err)?;
            let stamp = ms(SystemTime::now());
            let deleted: i64 = client
                .query_one(&stmt, &[&cut, &limit, &stamp])
                .await
                .map_err(err)?
                .get(0);
            drop(client);
            report.batches += 1;
            report.deleted += u64::try_from(deleted).unwrap_or(0);
            if deleted < limit {
                report.complete = true;
                break;
            }
            if options.max_batches.is_some_and(|max| report.batches >= max) {
                break;
            }
        }
        tracing::debug!(store = %self.name(), deleted = report.deleted, batches = report.batches, "pruned the outbox");
        Ok(report)
    }

    /// Prunes as [`prune`](Self::prune) does, once at once and then once every `every`, until
    /// `stop` completes; returns what it did. A pass that takes longer than `every` delays
    /// the next (passes never pile up); a failed pass is logged and the schedule goes on. A
    /// stop ends the wait at once, and drops a pass that is running: its batches committed
    /// so far stay, its current batch (one statement in one transaction) commits or rolls
    /// back whole. `every` is at least 1 ms and at most about a century.
    ///
    /// Spawn it next to the application's drainers, in one process or several (their batches
    /// skip each other's rows):
    ///
    /// ```no_run
    /// # async fn example(outbox: std::sync::Arc<reactifact_postgres::PostgresOutbox>) {
    /// use std::time::Duration;
    /// use reactifact_postgres::PruneOptions;
    ///
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// let pruner = tokio::spawn(async move {
    ///     let week = Duration::from_secs(7 * 24 * 3600);
    ///     outbox
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
    pub fn prune_every<'a>(
        &'a self,
        every: Duration,
        options: PruneOptions,
        stop: impl Future<Output = ()> + Send + 'a,
    ) -> impl Future<Output = PruneSummary> + Send + 'a {
        let options = std::sync::Arc::new(options);
        schedule(every, stop, move || {
            let options = options.clone();
            async move { self.prune(&options).await.map(|report| report.deleted) }
        })
    }
}

/// Runs `pass` at once and then every `every` (a late pass delays the next) until `stop`
/// completes, which drops a running pass.
pub(crate) async fn schedule<F, P>(every: Duration, stop: impl Future<Output = ()> + Send, mut pass: P) -> PruneSummary
where
    P: FnMut() -> F + Send,
    F: Future<Output = Result<u64, StoreError>> + Send,
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
                Ok(deleted) => {
                    summary.passes += 1;
                    summary.deleted += deleted;
                }
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
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A pass that records the (paused) time it ran at, relative to `start`, and deletes 10.
    fn recording(
        start: Instant,
        runs: Arc<Mutex<Vec<Duration>>>,
        takes: Duration,
    ) -> impl FnMut() -> std::pin::Pin<Box<dyn Future<Output = Result<u64, StoreError>> + Send>> + Send {
        move || {
            let runs = runs.clone();
            Box::pin(async move {
                runs.lock().unwrap().push(start.elapsed());
                tokio::time::sleep(takes).await;
                Ok(10)
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
        assert_eq!(
            summary,
            PruneSummary {
                passes: 4,
                failed: 0,
                deleted: 40
            }
        );
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
                        Ok(3)
                    }
                }
            },
        )
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!(
            summary,
            PruneSummary {
                passes: 2,
                failed: 3,
                deleted: 6
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_before_the_first_tick_runs_no_pass() {
        let calls = Arc::new(AtomicU64::new(0));
        let counted = calls.clone();
        let summary = schedule(Duration::from_secs(1), std::future::ready(()), move || {
            counted.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(0))
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

    #[tokio::test]
    async fn a_batch_reads_the_partial_index_of_final_rows() {
        let Ok(url) = std::env::var("REACTIFACT_TEST_POSTGRES_URL") else {
            println!("skipped: REACTIFACT_TEST_POSTGRES_URL is not set");
            return;
        };
        let schema = format!("rft_prune_plan_{}", std::process::id());
        let outbox = PostgresOutbox::open(crate::PostgresOptions::new(&url).schema(&schema))
            .await
            .unwrap();
        let names: Vec<String> = (0..5000).map(|i| format!("k{i}")).collect();
        let keys: Vec<(&str, &str)> = names.iter().map(|k| (k.as_str(), "x")).collect();
        let intents = reactifact_core::store_contract::new_intents("a", 1, &keys);
        outbox.register_alone(&intents, SystemTime::UNIX_EPOCH).await.unwrap();
        let client = outbox.pooled().await.unwrap();
        client
            .batch_execute(&format!("ANALYZE \"{schema}\".outbox"))
            .await
            .unwrap();
        let mut plans = Vec::new();
        for cancelled in [true, false] {
            let sql = outbox.prune_sql(cancelled);
            let rows = client
                .query(&format!("EXPLAIN {sql}"), &[&1_i64, &1000_i64, &1_i64])
                .await
                .unwrap();
            plans.push(
                rows.iter()
                    .map(|r| r.get::<_, String>(0))
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
        }
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .unwrap();
        for plan in plans {
            assert!(plan.contains("Index Scan using outbox_final"), "{plan}");
            assert!(plan.contains("LockRows"), "{plan}");
            assert!(!plan.contains("Seq Scan on outbox o "), "{plan}");
        }
    }

    #[test]
    fn options_clamp_what_would_stall_a_pass() {
        let options = PruneOptions::older_than(Duration::MAX).batch(0).max_batches(0);
        assert_eq!(options.batch_size(), 1);
        assert_eq!(options.max_batches, Some(1));
        assert!(options.prunes_cancelled());
        assert!(!options.keep_cancelled().prunes_cancelled());
    }
}
