//! Pruning on PostgreSQL: [`PostgresOutbox::prune`] and [`PostgresOutbox::prune_every`] are
//! the core's [`Ledger::prune`] and [`Ledger::prune_every`] over this outbox (the options, the
//! loop over the batches and the schedule are written there once, for every store), and the
//! batch statement a purge runs here.
//!
//! A batch is one statement, in a transaction of its own ([`OutboxStore::purge`]): it locks
//! up to a batch of final rows last changed before the cut-off, oldest first, from the
//! partial index `outbox_final` (`(updated_at, seq) WHERE status IN (delivered, cancelled,
//! rejected)`) with `FOR UPDATE SKIP LOCKED`, writes a tombstone for each key into
//! `outbox_purged`, deletes the keys' attempt histories and attachments and deletes the rows.
//! Rows pending, in flight, failed, dead, held or awaiting approval are never touched; a row
//! another transaction holds locked is skipped (the next pass takes it). Each batch commits
//! before the next begins, so no lock is held longer than one batch, and several pruners (in
//! several processes) share the work instead of waiting for each other.
//!
//! A tombstone is what keeps a pruned key from coming back: registering it again (a retry, a
//! replay or another branch re-deriving the same intent) inserts nothing, so the key is never
//! delivered twice. Tombstones are never deleted; each is a key and a time (about 40 bytes
//! plus the key).
//!
//! [`OutboxStore::purge`]: reactifact_core::store::OutboxStore::purge

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use reactifact_core::error::StoreError;
use reactifact_core::ledger::{Ledger, PurgeFilter};

use crate::outbox::PostgresOutbox;

/// The pruning's options and reports, and its default batch, now the core's (for every
/// store); re-exported here so that their paths in this crate keep building.
pub use reactifact_core::ledger::{PruneOptions, PruneReport, PruneSummary, DEFAULT_PRUNE_BATCH};

/// The batch statement of a purge (and so of a prune) of the final rows `filter` admits: `$1`
/// the cut-off (ms), `$2` the batch size, `$3` the tombstones' time (ms). The rows' attempt
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
    /// [`Ledger::prune`] of this outbox: deletes the final rows last changed more than
    /// `options.age()` ago, in batches, each batch one statement in a transaction of its own,
    /// oldest first, skipping rows another transaction holds locked. Each deleted key leaves a
    /// tombstone, so it is never registered (nor delivered) again.
    ///
    /// # Errors
    /// [`StoreError::Backend`] for an error of the server; the batches committed before it
    /// stay committed.
    pub async fn prune(&self, options: &PruneOptions) -> Result<PruneReport, StoreError> {
        self.ledger().prune(options).await
    }

    /// [`Ledger::prune_every`] of this outbox: prunes at once and then once every `every`
    /// until `stop` completes (passes never pile up, a failed pass is logged and the schedule
    /// goes on, a stop drops a running pass), and returns what it did. `every` is at least
    /// 1 ms and at most about a century.
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
        let ledger = self.ledger();
        async move { ledger.prune_every(every, options, stop).await }
    }

    /// The ledger of this outbox (a handle sharing its pool).
    fn ledger(&self) -> Ledger {
        Ledger::new(Arc::new(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

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
        let intents = reactifact_store_contract::new_intents("a", 1, &keys);
        outbox.register_alone(&intents, SystemTime::UNIX_EPOCH).await.unwrap();
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        let driver = tokio::spawn(connection);
        client
            .batch_execute(&format!("ANALYZE \"{schema}\".outbox"))
            .await
            .unwrap();
        let mut plans = Vec::new();
        // The statements of a prune's batches: every final row, or delivered ones only.
        for filter in [PurgeFilter::Final, PurgeFilter::Delivered] {
            let sql = statement(&format!("\"{schema}\""), filter);
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
        drop(client);
        let _ = driver.await;
    }
}
