//! The refold: apply a commit log again from an empty state, checking every commit on the way.
//!
//! [`Refold`] is the one implementation of "apply the log again": opening a durable session
//! ([`Context::open`](crate::Context::open)) and forking rebuild their state with it,
//! [`Context::verify`](crate::Context::verify) checks a whole log with it,
//! [`Context::state_at`](crate::Context::state_at) stops it after a commit, and the replay
//! oracle ([`Context::replay`](crate::Context::replay)) reads the state before each commit
//! from it.

use crate::model::action::{ActionKey, PendingAction};
use crate::model::artifact::{ArtifactId, Generation, Kind};
use crate::model::event::{EventKind, QueuedEvent};
use crate::model::hash::{self, CommitHash, ContentHash, StateHash};
use crate::model::patch::Op;
use crate::state::commit::{Apply, Commit, CommitError, Undone};
use crate::state::live::State;
use crate::state::readers::Readers;

/// The first place where a commit log does not reproduce what it recorded.
///
/// Every variant names the commit it is about (its generation) — all but an unreadable
/// outbox or history, and a changed outbox row of an intent no commit of the log acted;
/// those that can name an artifact or an intent do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The commit sits at another position in the log than its generation says.
    #[error("commit {}: it is the log's entry {}", .generation.0, .position)]
    Numbering {
        /// The generation the commit records.
        generation: Generation,
        /// Its position in the log, counting from 1.
        position: u64,
    },
    /// The commit's parent hash is not the hash of the commit before it.
    #[error("commit {}: its parent is not the commit before it", .generation.0)]
    Parent {
        /// The commit.
        generation: Generation,
    },
    /// An artifact's bytes do not hash to the content hash recorded with them.
    #[error("commit {}: the bytes of `{id}` (kind `{kind}`) do not match its content hash", .generation.0)]
    Content {
        /// The commit.
        generation: Generation,
        /// The artifact written.
        id: ArtifactId,
        /// Its kind.
        kind: Kind,
    },
    /// An intent's payload (as handed to the dispatcher) is not the payload of the pending
    /// action it was committed as.
    #[error("commit {}: the payload of intent `{key}` does not match its pending action", .generation.0)]
    Payload {
        /// The commit.
        generation: Generation,
        /// The intent's key.
        key: ActionKey,
    },
    /// The commit's hash is not the hash of its content (parent, generation, state hash,
    /// number of events consumed, runs): the count, or a run's agent, produce, trigger,
    /// operations or reads were changed. (A commit hashed before the count was covered, under
    /// `reactifact/commit/v1`, is checked without it.)
    #[error("commit {}: its hash does not match its content (recorded {recorded}, computed {computed})", .generation.0)]
    CommitHash {
        /// The commit.
        generation: Generation,
        /// The hash the log recorded.
        recorded: CommitHash,
        /// The hash of the commit's content.
        computed: CommitHash,
    },
    /// A run of the commit does not apply to the state before it.
    #[error("commit {}: replaying it failed: run {run}: {source}", .generation.0)]
    Apply {
        /// The commit.
        generation: Generation,
        /// The run's index in the commit.
        run: usize,
        /// Why the patch does not apply.
        #[source]
        source: CommitError,
    },
    /// Applying the commit does not give the state hash it recorded.
    #[error(
        "commit {}: replaying it does not give the state hash it recorded (recorded {recorded}, replayed {replayed}); it writes {}",
        .generation.0, id_list(.writes, *.more_writes)
    )]
    StateHash {
        /// The commit.
        generation: Generation,
        /// The state hash the log recorded.
        recorded: StateHash,
        /// The state hash the refold gives.
        replayed: StateHash,
        /// The first ids the commit writes (the candidates for a changed artifact).
        writes: Vec<ArtifactId>,
        /// How many more ids it writes.
        more_writes: usize,
    },
    /// An intent the log acted has no row in the store's outbox (and was not purged): it was
    /// removed, or its key changed.
    #[error("commit {}: intent `{key}`, which it acted, has no row in the store's outbox", .generation.0)]
    OutboxMissing {
        /// The first commit of the log that acted the intent (the one that registered it,
        /// unless the intent came in through a merge).
        generation: Generation,
        /// The intent's key.
        key: ActionKey,
    },
    /// An outbox row names a commit of the log as its origin, but no act of that commit (in
    /// the row's run, with the row's key, kind and action hash): it was forged or changed.
    #[error("commit {}: the outbox row of `{key}` names it as its origin, but it did not act it", .generation.0)]
    OutboxForged {
        /// The commit the row names as its origin (by its hash), which acted no such intent.
        generation: Generation,
        /// The row's key.
        key: ActionKey,
    },
    /// An outbox row records an operator's approval (or rejection) bound to a digest that is
    /// not the action hash the log acted for its key, or not the one the row holds: the row's
    /// payload was changed after the decision, or the decision moved to other bytes. A claim
    /// never hands such a row out under that approval (it is held).
    #[error(
        "commit {}: the outbox row of `{key}` was {verdict} for digest {decided}, but the log acted {acted} and the row holds {held}",
        .generation.0
    )]
    OutboxDecision {
        /// The commit that acted the row's key (the row's origin).
        generation: Generation,
        /// The row's key.
        key: ActionKey,
        /// Approved or rejected.
        verdict: crate::model::delivery::Verdict,
        /// The digest the decision is bound to ([`Decision::digest`](crate::ledger::Decision::digest)).
        decided: ContentHash,
        /// The action hash of the commit's act of the key.
        acted: ContentHash,
        /// The action hash the row holds.
        held: ContentHash,
    },
    /// An outbox row does not match its integrity digest, or its bytes their hash: it was
    /// changed outside reactifact.
    #[error("{}", changed_row(.generation, .key, .detail))]
    OutboxChanged {
        /// The first commit of the log that acted the row's key; `None` if none did (the check
        /// covers the store's whole outbox: a row of another session's intent, or a row whose
        /// key was changed).
        generation: Option<Generation>,
        /// The row's key (as far as it reads).
        key: ActionKey,
        /// What does not match.
        detail: String,
    },
    /// The store's outbox could not be read to check it.
    #[error("the store's outbox could not be read: {detail}")]
    OutboxUnreadable {
        /// What the store said.
        detail: String,
    },
    /// The commits before the checkpoint a context was opened from, read from the store on
    /// demand, could not be read, do not decode, or do not lead to the checkpoint's commit.
    #[error("the log before the checkpoint could not be loaded: {detail}")]
    History {
        /// What is wrong.
        detail: String,
    },
    /// A checkpoint the store keeps does not match the log: its digest, its body, its commit
    /// hash or state hash, or the state, event position or queued events it holds are not
    /// those of the log at its commit.
    #[error("checkpoint at commit {}: {detail}", .generation.0)]
    Checkpoint {
        /// The commit the checkpoint names.
        generation: Generation,
        /// What does not match.
        detail: String,
    },
    /// The whole log checks out, but the live state is not the state it refolds to.
    #[error("the live state hash {live} is not the state hash {replayed} the log refolds to (head commit {})", .generation.0)]
    LiveState {
        /// The last commit.
        generation: Generation,
        /// The live state hash.
        live: StateHash,
        /// The state hash of the refolded log.
        replayed: StateHash,
    },
}

fn changed_row(generation: &Option<Generation>, key: &ActionKey, detail: &str) -> String {
    match generation {
        Some(generation) => format!(
            "commit {}: the outbox row of `{key}`, which it acted, was changed: {detail}",
            generation.0
        ),
        None => format!("the outbox row of `{key}`, which no commit of this log acted, was changed: {detail}"),
    }
}

fn id_list(ids: &[ArtifactId], more: usize) -> String {
    let mut out = ids.iter().map(|id| format!("`{id}`")).collect::<Vec<_>>().join(", ");
    if ids.is_empty() {
        out.push_str("nothing");
    }
    if more > 0 {
        out.push_str(&format!(" and {more} more"));
    }
    out
}

/// Which hashes a [`Refold`] checks besides parent links, numbering and state hashes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checks {
    /// Recompute every artifact's content hash from its bytes and check intent payloads.
    pub(crate) content: bool,
    /// Recompute every commit hash (a `reactifact/commit/v1` hash, which does not cover the
    /// number of events consumed, is accepted for a commit that has one).
    pub(crate) commit_hash: bool,
}

impl Checks {
    /// Parent links, numbering and state hashes: what opening a durable session checks (its
    /// decoder derives content hashes from the bytes, so they cannot disagree).
    pub(crate) const STATE: Checks = Checks {
        content: false,
        commit_hash: false,
    };
    /// Parent links, numbering, state hashes and commit hashes: what the replay oracle
    /// checks of the log it rebuilds the snapshots from (the content hashes it compares run
    /// by run).
    pub(crate) const COMMITS: Checks = Checks {
        content: false,
        commit_hash: true,
    };
    /// Everything.
    pub(crate) const ALL: Checks = Checks {
        content: true,
        commit_hash: true,
    };
}

/// Applies a commit log to a state, commit by commit, checking each commit on the way.
pub(crate) struct Refold {
    state: State,
    parent: Option<CommitHash>,
    next: Generation,
    checks: Checks,
    /// How to undo each commit stepped, if asked for (see [`Undone`]).
    undone: Option<Vec<(Generation, Undone)>>,
    /// The readers index, kept if asked for.
    readers: Option<Readers>,
    /// Whether the last commit checked has a `reactifact/commit/v1` hash: the next one is
    /// tried that way first (a log written by an older build is v1 throughout).
    legacy_hash: bool,
}

impl Refold {
    /// A refold starting from the empty state.
    pub(crate) fn new(checks: Checks) -> Self {
        Refold {
            state: State::default(),
            parent: None,
            next: Generation(1),
            checks,
            undone: None,
            readers: None,
            legacy_hash: false,
        }
    }

    /// A refold that resumes after commit `generation` (hash `head`) from `state`, the state
    /// right after it (a checkpoint's).
    pub(crate) fn resuming(state: State, generation: Generation, head: CommitHash, checks: Checks) -> Self {
        Refold {
            state,
            parent: Some(head),
            next: generation.next(),
            checks,
            undone: None,
            readers: None,
            legacy_hash: false,
        }
    }

    /// This refold, also keeping how to undo each commit stepped.
    pub(crate) fn keep_undo(mut self) -> Self {
        self.undone = Some(Vec::new());
        self
    }

    /// This refold, also keeping the readers index, from `readers` (the index at the state it
    /// starts from).
    pub(crate) fn keep_readers(mut self, readers: Readers) -> Self {
        self.readers = Some(readers);
        self
    }

    /// The readers index after the commits stepped so far, if kept.
    pub(crate) fn readers(&self) -> Option<&Readers> {
        self.readers.as_ref()
    }

    /// A refold that also keeps how to undo each commit, for a context's [`Graph`](crate::state::graph::Graph).
    pub(crate) fn keeping_undo(checks: Checks) -> Self {
        Refold {
            undone: Some(Vec::new()),
            ..Refold::new(checks)
        }
    }

    /// The state and how to undo each commit stepped (empty unless made by
    /// [`keeping_undo`](Refold::keeping_undo)).
    pub(crate) fn into_parts(self) -> (State, Vec<(Generation, Undone)>) {
        (self.state, self.undone.unwrap_or_default())
    }

    /// The state after the commits stepped so far.
    pub(crate) fn state(&self) -> &State {
        &self.state
    }

    /// The state after the commits stepped so far, taken out.
    pub(crate) fn into_state(self) -> State {
        self.state
    }

    /// The hash of the last commit stepped.
    pub(crate) fn head(&self) -> Option<CommitHash> {
        self.parent
    }

    /// Checks and applies the next commit; returns the events it emits (each deletion with the
    /// version deleted). On error the state is as it was before the commit.
    pub(crate) fn step(&mut self, commit: &Commit) -> Result<Vec<QueuedEvent>, VerifyError> {
        let generation = commit.generation;
        if generation != self.next {
            return Err(VerifyError::Numbering {
                generation,
                position: self.next.0,
            });
        }
        if commit.parent != self.parent {
            return Err(VerifyError::Parent { generation });
        }
        if self.checks.content {
            check_content(commit)?;
        }
        if self.checks.commit_hash {
            // The hash that covers the events consumed, or one of a commit written before it
            // did: a v2 hash never equals the v1 hash of the same content, so a changed count
            // in a v2 commit fails both.
            let hash_of = |legacy: bool| match legacy {
                false => commit.recompute_hash(),
                true => commit.recompute_hash_v1(),
            };
            if hash_of(self.legacy_hash) != commit.hash {
                if hash_of(!self.legacy_hash) != commit.hash {
                    return Err(VerifyError::CommitHash {
                        generation,
                        recorded: commit.hash,
                        computed: commit.recompute_hash(),
                    });
                }
                self.legacy_hash = !self.legacy_hash;
            }
        }
        let ops = commit.runs.iter().map(|run| run.ops.len()).sum();
        let mut apply = Apply::new(&mut self.state, generation).with_room(ops);
        for (run, record) in commit.runs.iter().enumerate() {
            if let Err(source) = apply.patch(&record.ops) {
                apply.rollback();
                return Err(VerifyError::Apply {
                    generation,
                    run,
                    source,
                });
            }
        }
        let replayed = apply.state().state_hash();
        if replayed != commit.state_hash {
            apply.rollback();
            const SHOWN: usize = 8;
            let mut writes: Vec<ArtifactId> = Vec::new();
            let mut more_writes = 0;
            for op in commit.runs.iter().flat_map(|r| &r.ops) {
                if writes.contains(op.id()) {
                    continue;
                }
                if writes.len() < SHOWN {
                    writes.push(op.id().clone());
                } else {
                    more_writes += 1;
                }
            }
            return Err(VerifyError::StateHash {
                generation,
                recorded: commit.state_hash,
                replayed,
                writes,
                more_writes,
            });
        }
        let events = std::mem::take(&mut apply.events);
        if let (Some(undone), Some(list)) = (apply.finish(), &mut self.undone) {
            list.push((generation, undone));
        }
        if let Some(readers) = &mut self.readers {
            let deleted = events.iter().filter(|e| e.kind() == EventKind::Deleted);
            readers.record(generation, &commit.runs, deleted.map(|e| e.id()));
        }
        self.parent = Some(commit.hash);
        self.next = generation.next();
        // Numbered within the commit: a caller that queues them numbers them in its session.
        Ok(events
            .into_iter()
            .enumerate()
            .map(|(i, e)| e.queued(i as u64, generation))
            .collect())
    }
}

/// Checks that every artifact's bytes hash to its recorded content hash and that every
/// intent's payload is the one inside its pending action.
fn check_content(commit: &Commit) -> Result<(), VerifyError> {
    let generation = commit.generation;
    for op in commit.runs.iter().flat_map(|r| &r.ops) {
        match op {
            Op::Put {
                id, kind, hash, bytes, ..
            } if hash::content_hash(bytes) != *hash => {
                return Err(VerifyError::Content {
                    generation,
                    id: id.clone(),
                    kind: *kind,
                });
            }
            Op::Act {
                key,
                hash,
                bytes,
                payload,
                ..
            } => {
                if hash::content_hash(bytes) != *hash {
                    return Err(VerifyError::Content {
                        generation,
                        id: key.artifact_id(),
                        kind: Kind::of::<PendingAction>(),
                    });
                }
                let matches = rmp_serde::from_slice::<PendingAction>(bytes)
                    .is_ok_and(|action| action.payload[..] == payload[..] && action.key == key.as_str());
                if !matches {
                    return Err(VerifyError::Payload {
                        generation,
                        key: key.clone(),
                    });
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::commit::tests::raw_put;
    use crate::state::commit::RunRecord;

    /// Three commits, each writing one artifact; commit `i` consumed `i + 1` events and has
    /// the `reactifact/commit/v1` hash where `v1[i]` says so (an older build wrote it), else
    /// the hash that covers the count.
    fn log(v1: [bool; 3]) -> Vec<Commit> {
        let mut state = State::default();
        let mut parent = None;
        let mut log = Vec::new();
        for (i, legacy) in v1.into_iter().enumerate() {
            let generation = Generation(i as u64 + 1);
            let runs = vec![RunRecord::direct(vec![raw_put(
                &format!("note:{i}"),
                "note",
                &(i as u32),
            )])];
            let mut apply = Apply::new(&mut state, generation);
            apply.patch(&runs[0].ops).unwrap();
            apply.finish();
            let state_hash = state.state_hash();
            let events_consumed = i + 1;
            let hash = match legacy {
                true => Commit::compute_hash_v1(parent.as_ref(), None, generation, &state_hash, &runs),
                false => Commit::compute_hash(parent.as_ref(), None, generation, &state_hash, events_consumed, &runs),
            };
            log.push(Commit {
                generation,
                parent,
                merged: None,
                hash,
                state_hash,
                runs: runs.into(),
                events_consumed,
            });
            parent = Some(hash);
        }
        log
    }

    fn verify(log: &[Commit]) -> Result<(), VerifyError> {
        let mut refold = Refold::new(Checks::ALL);
        for commit in log {
            refold.step(commit)?;
        }
        Ok(())
    }

    /// A log an older build wrote, one it wrote before a newer build went on, and one an older
    /// build went on writing after a newer one (two processes of a rolling upgrade) all verify.
    /// A changed count of consumed events fails its commit's hash, except in a commit an older
    /// build hashed: its hash never covered the count.
    #[test]
    fn commits_hashed_before_the_count_was_covered_still_verify() {
        for v1 in [[true; 3], [false; 3], [true, false, false], [false, true, false]] {
            let log = log(v1);
            verify(&log).unwrap_or_else(|e| panic!("{v1:?}: {e}"));
            for (i, legacy) in v1.into_iter().enumerate() {
                let mut changed = log.clone();
                changed[i].events_consumed -= 1;
                match (legacy, verify(&changed)) {
                    (true, Ok(())) => {}
                    (false, Err(VerifyError::CommitHash { generation, .. })) if generation.0 == i as u64 + 1 => {}
                    (_, other) => panic!("{v1:?}, commit {}: {other:?}", i + 1),
                }
            }
        }
    }
}
