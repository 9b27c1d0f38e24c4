//! Verification and time travel: refold the commit log from an empty state and check every
//! hash it recorded.
//!
//! [`Refold`] is the one implementation of "apply the log again": opening a durable session
//! ([`Context::open`]) rebuilds its state with it, [`Context::verify`] checks a whole log with
//! it, [`Context::state_at`] stops it after a commit, and the replay oracle
//! ([`Context::replay`]) reads the state before each commit from it.

use crate::model::action::{ActionKey, PendingAction};
use crate::model::artifact::{ArtifactId, Generation, Kind};
use crate::model::event::Event;
use crate::model::hash::{self, CommitHash, StateHash};
use crate::model::patch::Op;
use crate::state::commit::{Apply, Commit, CommitError, Undone};
use crate::state::context::Context;
use crate::state::live::State;
use crate::state::snapshot::Snapshot;

/// The first place where a commit log does not reproduce what it recorded.
///
/// Every variant names the commit (its generation); those that can name an artifact or an
/// intent do.
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
    /// runs): a run's agent, produce, trigger, operations or reads were changed.
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

/// Which hashes a [`Refold`] checks besides parent links, numbering and state hashes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checks {
    /// Recompute every artifact's content hash from its bytes and check intent payloads.
    pub(crate) content: bool,
    /// Recompute every commit hash.
    pub(crate) commit_hash: bool,
}

impl Checks {
    /// Parent links, numbering and state hashes: what opening a durable session checks (its
    /// decoder derives content hashes from the bytes, so they cannot disagree).
    pub(crate) const STATE: Checks = Checks {
        content: false,
        commit_hash: false,
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
        }
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

    /// Checks and applies the next commit; returns the events it emits. On error the state is
    /// as it was before the commit.
    pub(crate) fn step(&mut self, commit: &Commit) -> Result<Vec<Event>, VerifyError> {
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
            let computed = commit.recompute_hash();
            if computed != commit.hash {
                return Err(VerifyError::CommitHash {
                    generation,
                    recorded: commit.hash,
                    computed,
                });
            }
        }
        let mut apply = Apply::new(&mut self.state, generation);
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
        self.parent = Some(commit.hash);
        self.next = generation.next();
        Ok(events)
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
                id,
                hash,
                bytes,
                payload,
                ..
            } => {
                if hash::content_hash(bytes) != *hash {
                    return Err(VerifyError::Content {
                        generation,
                        id: id.clone(),
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

/// Verifies a commit log on its own (for instance a copy of [`Context::log`]): refolds it from
/// the empty state and checks every commit's numbering, parent link, content hashes, intent
/// payloads, commit hash and state hash, in log order.
///
/// # Errors
/// The first mismatch, as a [`VerifyError`] naming the commit and, where it can, the id.
pub fn verify_log(log: &[Commit]) -> Result<VerifyReport, VerifyError> {
    let mut refold = Refold::new(Checks::ALL);
    for commit in log {
        refold.step(commit)?;
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
    /// Reads only; runs no produce and calls no dispatcher.
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
        let report = verify_log(self.log())?;
        if report.state_hash != self.state_hash() {
            return Err(VerifyError::LiveState {
                generation: self.generation(),
                live: self.state_hash(),
                replayed: report.state_hash,
            });
        }
        Ok(report)
    }

    /// Time travel: the state as it was right after commit `generation` (`Generation(0)` is
    /// the empty state before the first commit), as a read-only [`Snapshot`].
    ///
    /// The log is refolded up to that commit, checking each commit's parent link and state
    /// hash on the way; no produce runs and no dispatcher is called. The snapshot's
    /// [`state_hash`](Snapshot::state_hash) is the one that commit recorded.
    ///
    /// # Errors
    /// [`TimeTravelError::NoSuchCommit`] past the head; [`TimeTravelError::Verify`] if a commit
    /// up to `generation` does not refold.
    pub fn state_at(&self, generation: Generation) -> Result<Snapshot, TimeTravelError> {
        let log = self.log();
        let end = usize::try_from(generation.0)
            .ok()
            .filter(|&end| end <= log.len())
            .ok_or(TimeTravelError::NoSuchCommit {
                generation,
                head: self.generation(),
            })?;
        let mut refold = Refold::new(Checks::STATE);
        for commit in &log[..end] {
            refold.step(commit)?;
        }
        Ok(Snapshot::new(refold.into_state()))
    }
}
