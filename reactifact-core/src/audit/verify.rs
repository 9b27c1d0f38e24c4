//! Verification and time travel: refold the commit log from an empty state (with the
//! [refold](crate::state::refold)) and check every hash it recorded.

use crate::model::artifact::Generation;
use crate::model::hash::{CommitHash, StateHash};
use crate::session::context::Context;
use crate::state::commit::Commit;
use crate::state::readers::Readers;
use crate::state::refold::{Checks, Refold, VerifyError};
use crate::state::snapshot::Snapshot;
use crate::store::StoredCheckpoint;

/// What a successful verification checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// How many commits were refolded.
    pub commits: usize,
    /// The hash of the last commit, `None` for an empty log.
    pub head: Option<CommitHash>,
    /// The state hash the log refolds to.
    pub state_hash: StateHash,
}

/// Time travel asked for a commit the log does not have, or the log does not refold.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TimeTravelError {
    /// The generation is past the head of the log.
    #[error("commit {} does not exist: the log ends at commit {}", .generation.0, .head.0)]
    NoSuchCommit {
        /// The generation asked for.
        generation: Generation,
        /// The last commit of the log.
        head: Generation,
    },
    /// A commit up to the one asked for does not check out.
    #[error(transparent)]
    Verify(#[from] VerifyError),
}

/// Verifies a commit log on its own (for instance a copy of [`Context::log`]): refolds it from
/// the empty state and checks every commit's numbering, parent link, content hashes, intent
/// payloads, commit hash and state hash, in log order.
///
/// # Errors
/// The first mismatch, as a [`VerifyError`] naming the commit and, where it can, the id.
pub fn verify_log(log: &[Commit]) -> Result<VerifyReport, VerifyError> {
    verify_steps(log, &mut |_| {})
}

/// [`verify_log`], calling `progress` with each commit's generation once it is checked.
fn verify_steps(log: &[Commit], progress: &mut dyn FnMut(Generation)) -> Result<VerifyReport, VerifyError> {
    let mut refold = Refold::new(Checks::ALL);
    for commit in log {
        refold.step(commit)?;
        progress(commit.generation);
    }
    Ok(VerifyReport {
        commits: log.len(),
        head: refold.head(),
        state_hash: refold.state().state_hash(),
    })
}

impl Context {
    /// Refolds the whole commit log from the empty state and checks every hash it recorded:
    /// each commit's numbering, parent link, artifact content hashes, intent payloads, commit
    /// hash and state hash, and finally that the live state is the state the log refolds to.
    /// On a durable store it also checks the outbox against the log: every intent the log
    /// acted has a row ([`VerifyError::OutboxMissing`]), every row born of a commit of the log
    /// is an act of it ([`VerifyError::OutboxForged`]), and every row is as reactifact wrote it
    /// ([`VerifyError::OutboxChanged`]), each naming the commit that acted the intent; and
    /// every checkpoint the store keeps against the refold at its commit: its digest, commit
    /// hash, state hash, and the state (every artifact with its version, generation and
    /// bytes, the relations), event position and queued events it holds
    /// ([`VerifyError::Checkpoint`]). A context opened from a
    /// checkpoint reads its older commits first (see [`Context::log`]). Reads only; runs no
    /// produce and calls no dispatcher.
    ///
    /// ```
    /// # use reactifact_core::{Artifact, Context};
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize)] struct Order { total_cents: u64 }
    /// # impl Artifact for Order { const KIND: &'static str = "order"; }
    /// let mut ctx = Context::new("orders");
    /// ctx.create("order:1", Order { total_cents: 1200 })?;
    /// let report = ctx.verify()?;
    /// assert_eq!((report.commits, report.state_hash), (1, ctx.state_hash()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// The first mismatch, as a [`VerifyError`] naming the commit and, where it can, the id.
    pub fn verify(&self) -> Result<VerifyReport, VerifyError> {
        self.verify_with_progress(|_| {})
    }

    /// [`verify`](Context::verify), calling `progress` with each commit's generation once that
    /// commit has been checked (for a progress bar on a long log). The same checks, in the
    /// same order, with the same errors.
    ///
    /// # Errors
    /// As [`verify`](Context::verify).
    pub fn verify_with_progress(&self, mut progress: impl FnMut(Generation)) -> Result<VerifyReport, VerifyError> {
        let log = self.log()?;
        let checkpoints = match self.store() {
            Some(store) => store.checkpoints()?,
            None => Vec::new(),
        };
        let report = if checkpoints.is_empty() {
            verify_steps(log, &mut progress)?
        } else {
            verify_with_checkpoints(log, checkpoints, &mut progress)?
        };
        if report.state_hash != self.state_hash() {
            return Err(VerifyError::LiveState {
                generation: self.generation(),
                live: self.state_hash(),
                replayed: report.state_hash,
            });
        }
        if let Some(store) = self.store() {
            store.verify_outbox(log)?;
        }
        Ok(report)
    }

    /// Time travel: the state as it was right after commit `generation` (`Generation(0)` is
    /// the empty state before the first commit), as a read-only [`Snapshot`].
    ///
    /// The log is refolded up to that commit (from the checkpoint the context was opened from,
    /// if that commit is at or after it), checking each commit's parent link and state hash on
    /// the way; no produce runs and no dispatcher is called. The snapshot's
    /// [`state_hash`](Snapshot::state_hash) is the one that commit recorded.
    ///
    /// # Errors
    /// [`TimeTravelError::NoSuchCommit`] past the head; [`TimeTravelError::Verify`] if a commit
    /// up to `generation` does not refold.
    pub fn state_at(&self, generation: Generation) -> Result<Snapshot, TimeTravelError> {
        if generation > self.generation() {
            return Err(TimeTravelError::NoSuchCommit {
                generation,
                head: self.generation(),
            });
        }
        let held = self.held_log();
        if let Some(base) = held.base().filter(|b| generation >= b.generation) {
            // At or after the checkpoint the context was opened from: refolded from it.
            let mut refold = Refold::resuming(base.state.clone(), base.generation, base.hash, Checks::STATE);
            let upto = usize::try_from(generation.0 - base.generation.0).unwrap_or(usize::MAX);
            for commit in &held.held()[..upto] {
                refold.step(commit)?;
            }
            return Ok(Snapshot::new(refold.into_state()));
        }
        let log = self.log()?;
        let end = usize::try_from(generation.0).unwrap_or(usize::MAX);
        let mut refold = Refold::new(Checks::STATE);
        for commit in &log[..end] {
            refold.step(commit)?;
        }
        Ok(Snapshot::new(refold.into_state()))
    }
}

/// [`verify_log`], also checking each checkpoint against the refold at its commit.
fn verify_with_checkpoints(
    log: &[Commit],
    checkpoints: Vec<StoredCheckpoint>,
    progress: &mut dyn FnMut(Generation),
) -> Result<VerifyReport, VerifyError> {
    let mut bodies = std::collections::BTreeMap::new();
    for checkpoint in checkpoints {
        let generation = checkpoint.generation;
        let bad = |detail: String| VerifyError::Checkpoint { generation, detail };
        if generation.0 == 0 || generation.0 > log.len() as u64 {
            return Err(bad(format!(
                "it names commit {}, past the log's head {}",
                generation.0,
                log.len()
            )));
        }
        let body = checkpoint.body.map_err(bad)?;
        // The queue is a run of consecutive events up to the last one emitted, holding every
        // one the session has not consumed since.
        let seqs: Vec<u64> = body.events.iter().map(|q| q.seq).collect();
        let first = seqs.first().copied().unwrap_or(body.next_event_seq);
        let consecutive = seqs.iter().zip(first..).all(|(&seq, expected)| seq == expected)
            && first + seqs.len() as u64 == body.next_event_seq;
        let missing = checkpoint.consumed_seq < body.next_event_seq && first > checkpoint.consumed_seq;
        if !consecutive || missing {
            return Err(bad(format!(
                "its queued events (numbers {seqs:?}) are not the events from the session's consumed position {} up to its next event {}",
                checkpoint.consumed_seq, body.next_event_seq
            )));
        }
        bodies.insert(generation, (checkpoint.hash, checkpoint.state_hash, body));
    }
    // The events emitted that some checkpoint holds as queued, by number.
    let wanted: std::collections::HashSet<u64> = bodies
        .values()
        .flat_map(|(_, _, body)| body.events.iter().map(|q| q.seq))
        .collect();
    let mut emitted = std::collections::HashMap::new();
    let mut seq = 0u64;
    let mut refold = Refold::new(Checks::ALL).keep_readers(Readers::default());
    for commit in log {
        for event in refold.step(commit)? {
            if wanted.contains(&seq) {
                emitted.insert(seq, event);
            }
            seq += 1;
        }
        progress(commit.generation);
        let Some((hash, state_hash, body)) = bodies.get(&commit.generation) else {
            continue;
        };
        let bad = |detail: String| VerifyError::Checkpoint {
            generation: commit.generation,
            detail,
        };
        if *hash != commit.hash {
            return Err(bad(format!(
                "it names commit hash {hash}, the log's commit is {}",
                commit.hash
            )));
        }
        if *state_hash != commit.state_hash {
            return Err(bad(format!(
                "it names state hash {state_hash}, the commit recorded {}",
                commit.state_hash
            )));
        }
        if let Some(detail) = body.state.difference(refold.state()) {
            return Err(bad(format!("its state is not the log's: {detail}")));
        }
        if let Some(detail) = refold.readers().and_then(|log| body.readers.difference(log)) {
            return Err(bad(format!("its readers index is not the log's: {detail}")));
        }
        if body.next_event_seq != seq {
            return Err(bad(format!(
                "it puts the next event at number {}, the log at {seq}",
                body.next_event_seq
            )));
        }
        for queued in &body.events {
            let Some(logged) = emitted.get(&queued.seq) else {
                return Err(bad(format!("its queued event number {} is not the log's", queued.seq)));
            };
            if logged.event != queued.event {
                return Err(bad(format!("its queued event number {} is not the log's", queued.seq)));
            }
            let same_deleted = match (&logged.deleted, &queued.deleted) {
                (None, None) => true,
                (Some(a), Some(b)) => {
                    (a.kind, a.version, a.hash, a.generation, a.created)
                        == (b.kind, b.version, b.hash, b.generation, b.created)
                        && a.bytes == b.bytes
                        && a.id == b.id
                }
                _ => false,
            };
            if !same_deleted {
                return Err(bad(format!(
                    "the version deleted that its queued event number {} holds is not the log's",
                    queued.seq
                )));
            }
        }
    }
    Ok(VerifyReport {
        commits: log.len(),
        head: refold.head(),
        state_hash: refold.state().state_hash(),
    })
}
