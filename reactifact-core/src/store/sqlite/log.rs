//! The log's rows in the file: [`SqliteStore`] as a [`LogStore`]. Sessions, commits and
//! checkpoints are read and written as rows; the core's session (`store/backed.rs`) encodes,
//! decodes and checks them. Every statement runs on the outbox's connection, on its thread.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::outbox::{self, Unwanted};
use super::row::{self, Read};
use super::{millis, store_error, SqliteStore};
use crate::model::action::{ActionKey, Origin};
use crate::model::delivery::NewIntent;
use crate::state::refold::VerifyError;
use crate::store::log_store::{AnswerRow, Append, CheckpointRow, CommitRow, LogStore, OutboxCheck, SessionRow};
use crate::store::outbox::{BoxFuture, Claimed, OutboxStore};
use crate::store::StoreError;

/// The columns [`commit_row`] reads, in its order.
const COMMIT_COLUMNS: &str = "session, generation, hash, parent, merged, state_hash, events_consumed, runs";

/// A commit's row, as stored.
fn commit_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<CommitRow> {
    Ok(CommitRow::new(
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
    ))
}

/// A generation as SQLite's signed integer: beyond `i64::MAX` is no generation a row holds.
fn signed(generation: u64) -> i64 {
    i64::try_from(generation).unwrap_or(i64::MAX)
}

/// Writes a commit's row, registers its intents and makes its claim, in one transaction,
/// fenced on the session's row; `Ok(None)` (nothing written) if the row was not as expected.
fn append(conn: &mut Connection, append: &Append) -> rusqlite::Result<Option<Claimed>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let commit = &append.commit;
    let fenced = tx
        .prepare_cached(
            // Fenced on the generation the appender last saw, and on the consumed events
            // never moving back (a stale copy would run them again).
            "UPDATE sessions SET generation = ?1, head = ?2, consumed_seq = ?3
             WHERE name = ?4 AND generation = ?5 AND consumed_seq <= ?3",
        )?
        .execute(params![
            signed(commit.generation),
            commit.hash,
            signed(append.consumed_before),
            commit.session,
            signed(append.expected),
        ])?;
    if fenced == 0 {
        return Ok(None);
    }
    // `intents` is no longer written: the outbox rows are the ledger.
    tx.prepare_cached(
        "INSERT INTO commits (session, generation, hash, parent, merged, state_hash, events_consumed, intents, runs)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, ?8)",
    )?
    .execute(params![
        commit.session,
        signed(commit.generation),
        commit.hash,
        commit.parent,
        commit.merged,
        commit.state_hash,
        signed(commit.events_consumed),
        commit.runs,
    ])?;
    if !append.intents.is_empty() {
        outbox::register(&tx, &append.intents, millis(append.now))?;
    }
    let claimed = match &append.claim {
        Some(order) => outbox::claim_in(&tx, &order.request())?,
        None => Claimed::default(),
    };
    tx.commit()?;
    Ok(Some(claimed))
}

/// Registers again, held, every act of a verified log whose key has neither an outbox row nor a purge tombstone (see
/// [`SqliteStore::settle`]), in one transaction.
pub(super) fn register_missing(conn: &mut Connection, acts: Vec<NewIntent>, now: i64) -> rusqlite::Result<()> {
    let mut missing: Vec<NewIntent> = Vec::new();
    {
        let mut known = conn.prepare(
            "SELECT EXISTS (SELECT 1 FROM outbox WHERE key = ?1)
                 OR EXISTS (SELECT 1 FROM outbox_purged WHERE key = ?1)",
        )?;
        let mut session_of = conn.prepare("SELECT session FROM commits WHERE hash = ?1 LIMIT 1")?;
        for mut new in acts {
            let key = new.intent.key.clone();
            if missing.iter().any(|m| m.intent.key == key) || known.query_row([key.as_str()], |row| row.get(0))? {
                continue;
            }
            // The session whose commit acted it (a branch's log holds its parent's commits).
            if let Some(session) = session_of
                .query_row([&new.intent.origin.commit().0[..]], |row| row.get::<_, String>(0))
                .optional()?
            {
                let origin = &new.intent.origin;
                new.intent.origin = Origin::new(session, origin.commit(), origin.generation(), origin.run);
            }
            tracing::warn!(action_key = %key, generation = new.intent.origin.generation().0, "an intent of the log had no outbox row (it was lost or changed); it is registered again from the log, held");
            missing.push(new);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    outbox::register_held(&tx, &missing, now)?;
    tx.commit()
}

/// Where an act is: its key, the hash of its commit and its run.
type ActAt<'a> = (&'a str, [u8; 32], u64);

/// The outbox checks of `verify` against a verified log (see [`LogStore::verify_outbox`]).
fn verify_outbox(conn: &Connection, check: &OutboxCheck) -> rusqlite::Result<Option<VerifyError>> {
    // Every row intact; every row born of a commit of this log names an act of it.
    let acts: HashMap<ActAt<'_>, (&str, [u8; 32])> = check
        .acts
        .iter()
        .map(|a| ((a.key.as_str(), a.commit, a.run), (a.kind.as_str(), a.action_hash)))
        .collect();
    let mut stmt = conn.prepare(&format!("SELECT {} FROM outbox ORDER BY seq", row::COLUMNS))?;
    let mut rows = stmt.query([])?;
    while let Some(found) = rows.next()? {
        let row = match row::Row::read(found)? {
            Read::Intact(row) => row,
            Read::Damaged { key, detail, .. } => {
                return Ok(Some(VerifyError::OutboxChanged {
                    generation: check.first_act(&key),
                    key: ActionKey::from(key),
                    detail,
                }))
            }
        };
        if crate::model::hash::content_hash(&row.bytes).as_bytes()[..] != row.action_hash[..] {
            return Ok(Some(VerifyError::OutboxChanged {
                generation: check.first_act(&row.key),
                key: ActionKey::from(row.key.as_str()),
                detail: "its bytes do not hash to its action hash".into(),
            }));
        }
        let Ok(origin) = <[u8; 32]>::try_from(row.origin_commit.as_slice()) else {
            continue;
        };
        let Some(&generation) = check.commits.get(&origin) else {
            continue; // Born of another session's commit.
        };
        if let Some(mismatch) = row.decision_mismatch(check, origin, generation) {
            return Ok(Some(mismatch));
        }
        // The row names the commit by its hash and its generation: both must agree.
        let acted = u64::try_from(row.origin_gen).ok() == Some(generation.0)
            && u64::try_from(row.origin_run)
                .ok()
                .and_then(|run| acts.get(&(row.key.as_str(), origin, run)))
                .is_some_and(|(kind, hash)| *kind == &*row.kind && hash[..] == row.action_hash[..]);
        if !acted {
            return Ok(Some(VerifyError::OutboxForged {
                generation,
                key: ActionKey::from(row.key.as_str()),
            }));
        }
    }
    drop(rows);
    drop(stmt);
    // Every act of the log has a row or a tombstone.
    let mut known = conn.prepare(
        "SELECT EXISTS (SELECT 1 FROM outbox WHERE key = ?1)
             OR EXISTS (SELECT 1 FROM outbox_purged WHERE key = ?1)",
    )?;
    let mut seen: HashSet<&str> = HashSet::new();
    for act in &check.acts {
        if seen.insert(act.key.as_str()) && !known.query_row([act.key.as_str()], |r| r.get::<_, bool>(0))? {
            return Ok(Some(VerifyError::OutboxMissing {
                generation: act.generation,
                key: act.key.clone(),
            }));
        }
    }
    Ok(None)
}

impl SqliteStore {
    /// Runs `op` on the outbox's thread, mapping SQLite's errors.
    fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let name = self.name.clone();
        self.outbox
            .run_write(move |conn| op(conn).map_err(|e| store_error(&name, e)))
    }

    /// [`SqliteStore::run`] for a write: tracked, so that dropping the store waits for it.
    fn write<T: Send + 'static>(
        &self,
        session: &str,
        op: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        if let Err(e) = self.check_writable(session) {
            return Box::pin(std::future::ready(Err(e)));
        }
        let running = self.writes.start();
        self.run(move |conn| {
            let _running = running;
            op(conn)
        })
    }
}

impl LogStore for SqliteStore {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn outbox(&self) -> Arc<dyn OutboxStore> {
        self.outbox.clone()
    }

    fn session<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<SessionRow>, StoreError>> {
        let name = name.to_owned();
        self.run(move |conn| {
            conn.prepare_cached(
                "SELECT generation, head, consumed_seq, parent, fork_generation FROM sessions WHERE name = ?1",
            )?
            .query_row([name], |row| {
                let fork = match (row.get::<_, Option<String>>(3)?, row.get::<_, Option<u64>>(4)?) {
                    (Some(parent), Some(at)) => Some((parent, at)),
                    _ => None,
                };
                Ok(SessionRow::new(row.get(0)?, row.get(1)?, row.get(2)?, fork))
            })
            .optional()
        })
    }

    fn create_session<'a>(&'a self, name: &'a str, row: SessionRow) -> BoxFuture<'a, Result<bool, StoreError>> {
        let name = name.to_owned();
        self.write(&name.clone(), move |conn| {
            let (parent, at) = row.fork.map_or((None, None), |(parent, at)| (Some(parent), Some(signed(at))));
            let inserted = conn.execute(
                "INSERT OR IGNORE INTO sessions (name, generation, head, consumed_seq, parent, fork_generation, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    name,
                    signed(row.generation),
                    row.head,
                    signed(row.consumed_seq),
                    parent,
                    at,
                    millis(std::time::SystemTime::now()),
                ],
            )?;
            Ok(inserted == 1)
        })
    }

    fn commits<'a>(
        &'a self,
        session: &'a str,
        after: u64,
        upto: u64,
    ) -> BoxFuture<'a, Result<Vec<CommitRow>, StoreError>> {
        let session = session.to_owned();
        self.run(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COMMIT_COLUMNS} FROM commits
                 WHERE session = ?1 AND generation > ?2 AND generation <= ?3 ORDER BY generation"
            ))?;
            let rows = stmt.query_map(params![session, signed(after), signed(upto)], commit_row)?;
            rows.collect()
        })
    }

    fn commit_by_hash<'a>(&'a self, hash: &'a [u8]) -> BoxFuture<'a, Result<Option<CommitRow>, StoreError>> {
        let hash = hash.to_vec();
        // (Through `commits_hash`, schema 9's index of the commits by hash.)
        self.run(move |conn| {
            conn.prepare_cached(&format!("SELECT {COMMIT_COLUMNS} FROM commits WHERE hash = ?1 LIMIT 1"))?
                .query_row([hash], commit_row)
                .optional()
        })
    }

    fn append(&self, commit: Append) -> BoxFuture<'_, Result<Option<Claimed>, StoreError>> {
        // A commit cut off (its future dropped) runs on regardless: what its claim took is
        // then released at once, as a dropped claim's is, not left in flight for a lease.
        let (unwanted, wanted) = Unwanted::pair();
        let session = commit.commit.session.clone();
        let written = self.write(&session, move |conn| {
            let written = append(conn, &commit)?;
            if let Some(claimed) = &written {
                outbox::release_if_unwanted(conn, &wanted, claimed, commit.now)?;
            }
            Ok(written)
        });
        Box::pin(async move {
            let written = written.await;
            unwanted.answered();
            written
        })
    }

    fn consume<'a>(&'a self, session: &'a str, expected: u64, before: u64) -> BoxFuture<'a, Result<bool, StoreError>> {
        let session = session.to_owned();
        self.write(&session.clone(), move |conn| {
            let moved = conn
                .prepare_cached(
                    "UPDATE sessions SET consumed_seq = ?2 WHERE name = ?1 AND generation = ?3 AND consumed_seq <= ?2",
                )?
                .execute(params![session, signed(before), signed(expected)])?;
            Ok(moved == 1)
        })
    }

    fn put_checkpoint(&self, row: CheckpointRow, keep: usize) -> BoxFuture<'_, Result<(), StoreError>> {
        if !self.checkpoints.load(Ordering::Acquire) {
            // Unreachable for a writable store: its file has the table once prepared.
            return Box::pin(std::future::ready(Err(StoreError::read_only(
                self.name.clone(),
                row.session,
            ))));
        }
        let now = millis(std::time::SystemTime::now());
        let session = row.session.clone();
        self.write(&session, move |conn| {
            super::actor::write(conn, |tx| {
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO checkpoints (session, generation, hash, state_hash, body, digest, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?
                .execute(params![
                    row.session,
                    signed(row.generation),
                    row.hash,
                    row.state_hash,
                    row.body,
                    row.digest,
                    now
                ])?;
                tx.prepare_cached(
                    "DELETE FROM checkpoints WHERE session = ?1 AND generation NOT IN
                         (SELECT generation FROM checkpoints WHERE session = ?1 ORDER BY generation DESC LIMIT ?2)",
                )?
                .execute(params![row.session, i64::try_from(keep).unwrap_or(i64::MAX)])?;
                Ok(())
            })
        })
    }

    fn keep_answer(&self, row: AnswerRow) -> BoxFuture<'_, Result<(), StoreError>> {
        if !self.answers.load(Ordering::Acquire) {
            // A read-only store of an older file: nothing runs produces on it.
            return Box::pin(std::future::ready(Ok(())));
        }
        let session = row.session.clone();
        self.write(&session, move |conn| {
            conn.prepare_cached(
                "INSERT INTO call_answers (session, produce, trigger, run, call) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![row.session, row.produce, row.trigger, row.run, row.call])?;
            Ok(())
        })
    }

    fn answers<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<Vec<AnswerRow>, StoreError>> {
        if !self.answers.load(Ordering::Acquire) {
            return Box::pin(std::future::ready(Ok(Vec::new())));
        }
        let session = session.to_owned();
        self.run(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT session, produce, trigger, run, call FROM call_answers WHERE session = ?1 ORDER BY seq",
            )?;
            let rows = stmt.query_map([session], |row| {
                Ok(AnswerRow::new(
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                ))
            })?;
            rows.collect()
        })
    }

    fn drop_answers<'a>(
        &'a self,
        session: &'a str,
        runs: &'a [(String, String)],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        if !self.answers.load(Ordering::Acquire) || runs.is_empty() {
            return Box::pin(std::future::ready(Ok(())));
        }
        let owned = session.to_owned();
        let runs = runs.to_vec();
        self.write(session, move |conn| {
            super::actor::write(conn, |tx| {
                let mut stmt =
                    tx.prepare_cached("DELETE FROM call_answers WHERE session = ?1 AND produce = ?2 AND trigger = ?3")?;
                for (produce, trigger) in &runs {
                    stmt.execute(params![owned, produce, trigger])?;
                }
                Ok(())
            })
        })
    }

    fn checkpoints<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<Vec<CheckpointRow>, StoreError>> {
        if !self.checkpoints.load(Ordering::Acquire) {
            // A file of schema version 2, read as it is.
            return Box::pin(std::future::ready(Ok(Vec::new())));
        }
        let session = session.to_owned();
        self.run(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT session, generation, hash, state_hash, body, digest FROM checkpoints
                 WHERE session = ?1 ORDER BY generation",
            )?;
            let rows = stmt.query_map([session], |row| {
                Ok(CheckpointRow::new(
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                ))
            })?;
            rows.collect()
        })
    }

    fn verify_outbox(&self, check: OutboxCheck) -> BoxFuture<'_, Result<Option<VerifyError>, StoreError>> {
        self.run(move |conn| verify_outbox(conn, &check))
    }
}
