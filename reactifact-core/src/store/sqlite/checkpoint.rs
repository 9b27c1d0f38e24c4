//! Checkpoints: the encoded state of a session right after one of its commits, in the
//! `checkpoints` table (schema version 3).
//!
//! A row names its commit by generation, commit hash and state hash, and carries a SHA-256
//! digest over the session, those three and the body. A checkpoint is taken at open only if
//! it checks out: its digest matches, its body decodes, the state it decodes to has the state
//! hash it names, and the session's log has a commit at its generation with its commit hash
//! and state hash. One that does not is skipped with a warning and the next older one (or the
//! first commit) is used instead: a checkpoint never makes an open fail, nor load a state the
//! log does not have. Nothing is written at open; a writable context writes checkpoints
//! later, so a damaged row is replaced by the next one and pruned.

use rusqlite::{params, Connection, OptionalExtension};

use super::{actor, commit_hashes_at, digest as hash_of, millis, LoadError};
use crate::model::artifact::Generation;
use crate::model::hash::{CommitHash, StateHash};
use crate::store::codec;
use crate::store::{Checkpoint, StoredCheckpoint};

/// How many checkpoints of a session the store keeps: the newest, and one to fall back on.
pub(super) const KEEP: i64 = crate::store::CHECKPOINTS_KEPT as i64;

/// Encodes `checkpoint` and writes it for `session`, dropping the session's older checkpoints
/// but the newest [`KEEP`], in one transaction. Runs on the store's thread.
pub(super) fn write(conn: &mut Connection, session: &str, checkpoint: &Checkpoint) -> rusqlite::Result<()> {
    let body = codec::encode_checkpoint(
        &checkpoint.state,
        checkpoint.next_event_seq,
        &checkpoint.events,
        &checkpoint.readers,
    );
    let generation = checkpoint.generation.0;
    let (hash, state_hash) = (checkpoint.hash.as_bytes(), checkpoint.state_hash.as_bytes());
    let digest = codec::checkpoint_digest(session, generation, hash, state_hash, &body);
    let now = millis(std::time::SystemTime::now());
    actor::write(conn, |tx| {
        tx.prepare_cached(
            "INSERT OR REPLACE INTO checkpoints (session, generation, hash, state_hash, body, digest, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            session,
            generation,
            &hash[..],
            &state_hash[..],
            &body,
            &digest[..],
            now
        ])?;
        tx.prepare_cached(
            "DELETE FROM checkpoints WHERE session = ?1 AND generation NOT IN
                 (SELECT generation FROM checkpoints WHERE session = ?1 ORDER BY generation DESC LIMIT ?2)",
        )?
        .execute(params![session, KEEP])?;
        Ok(())
    })
}

/// One stored row.
struct Row {
    generation: u64,
    hash: Vec<u8>,
    state_hash: Vec<u8>,
    body: Vec<u8>,
    digest: Vec<u8>,
}

impl Row {
    fn read(conn: &Connection, session: &str, generation: u64) -> rusqlite::Result<Option<Row>> {
        conn.query_row(
            "SELECT hash, state_hash, body, digest FROM checkpoints WHERE session = ?1 AND generation = ?2",
            params![session, generation],
            |row| {
                Ok(Row {
                    generation,
                    hash: row.get(0)?,
                    state_hash: row.get(1)?,
                    body: row.get(2)?,
                    digest: row.get(3)?,
                })
            },
        )
        .optional()
    }

    /// The names it carries, and its body, checked against its digest and decoded.
    fn check(&self, session: &str) -> Result<(CommitHash, StateHash, codec::CheckpointBody), String> {
        codec::check_checkpoint(
            session,
            self.generation,
            &self.hash,
            &self.state_hash,
            &self.body,
            &self.digest,
        )
    }
}

/// The generations of `session`'s checkpoints, newest first.
fn generations(conn: &Connection, session: &str) -> rusqlite::Result<Vec<u64>> {
    let mut stmt = conn.prepare("SELECT generation FROM checkpoints WHERE session = ?1 ORDER BY generation DESC")?;
    let found = stmt.query_map([session], |row| row.get(0))?.collect();
    found
}

/// The newest checkpoint of `session`'s log at or before its generation `head` that checks
/// out (see the module docs), or `None`. A row that does not check out is skipped with a
/// warning. A branch also takes its ancestors' checkpoints up to where it forked: its log is
/// theirs up to there, and a fork starts with no queued event, so none of the events such a
/// checkpoint holds is queued on the branch (the caller drops those below the session's
/// consumed position).
pub(super) fn newest(conn: &Connection, session: &str, head: u64) -> Result<Option<Checkpoint>, LoadError> {
    let mut candidates = Vec::new();
    for (owner, from, upto) in super::chain(conn, session)?.into_iter().rev() {
        for generation in generations(conn, &owner)? {
            let own = owner == session && generation >= 1 && generation <= head;
            if own || (generation > from && generation <= upto.min(head)) {
                candidates.push((owner.clone(), generation));
            } else if owner == session {
                tracing::warn!(
                    session,
                    generation,
                    head,
                    "a checkpoint names a commit past the session's head; it is skipped"
                );
            }
        }
    }
    // Newest first; at one generation, the session's own before an ancestor's.
    candidates.sort_by_key(|(owner, generation)| (std::cmp::Reverse(*generation), owner != session));
    for (owner, generation) in candidates {
        let Some(row) = Row::read(conn, &owner, generation)? else {
            continue;
        };
        let checked = row.check(&owner).and_then(|(hash, state_hash, body)| {
            match commit_hashes_at(conn, session, generation).map_err(|e| match e {
                LoadError::Sqlite(e) => e.to_string(),
                LoadError::Corrupt(detail) => detail,
            })? {
                Some((h, s)) if h[..] == hash.as_bytes()[..] && s[..] == state_hash.as_bytes()[..] => Ok(Checkpoint {
                    generation: Generation(generation),
                    hash,
                    state_hash,
                    state: body.state,
                    next_event_seq: body.next_event_seq,
                    events: body.events,
                    readers: body.readers,
                }),
                Some(_) => Err(format!(
                    "commit {generation} of the log has another commit hash or state hash"
                )),
                None => Err(format!("the log has no commit {generation}")),
            }
        });
        match checked {
            Ok(checkpoint) => return Ok(Some(checkpoint)),
            Err(detail) => {
                tracing::warn!(session, checkpoint_of = %owner, generation, %detail, "a checkpoint does not check out; it is skipped, and an older one (or the whole log) is used");
            }
        }
    }
    Ok(None)
}

/// Every checkpoint of `session`, oldest first, checked against its digest and decoded.
pub(super) fn all(conn: &Connection, session: &str) -> rusqlite::Result<Vec<StoredCheckpoint>> {
    let consumed_seq: u64 = conn
        .query_row("SELECT consumed_seq FROM sessions WHERE name = ?1", [session], |row| {
            row.get(0)
        })
        .optional()?
        .unwrap_or(0);
    let mut stored = Vec::new();
    for generation in generations(conn, session)?.into_iter().rev() {
        let Some(row) = Row::read(conn, session, generation)? else {
            continue;
        };
        let (hash, state_hash) = (
            hash_of(&row.hash, "its commit hash")
                .map(CommitHash)
                .unwrap_or(CommitHash([0; 32])),
            hash_of(&row.state_hash, "its state hash")
                .map(StateHash)
                .unwrap_or(StateHash([0; 32])),
        );
        stored.push(StoredCheckpoint {
            generation: Generation(generation),
            hash,
            state_hash,
            body: row.check(session).map(|(_, _, body)| body),
            consumed_seq,
        });
    }
    Ok(stored)
}
