//! Branches: fork a context, run the branches independently, diff them, merge them back.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use crate::model::action::{ActionKey, Payload, PendingAction};
use crate::model::artifact::{Artifact, ArtifactId, Generation, Kind, ReadError, Record, Stored, Version};
use crate::model::field_diff::{diff_bytes, FieldDiff};
use crate::model::hash::{CommitHash, ContentHash};
use crate::model::patch::{Op, PutMode};
use crate::model::relation::Relation;
use crate::session::context::{CommitFailure, Context};
use crate::state::commit::{Commit, CommitError, RunRecord};
use crate::state::graph::{Histories, Past, Path, Side as HistorySide};
use crate::state::live::{Rewound, StateView};
use crate::state::log::Log;
use crate::state::readers::Readers;
use crate::state::refold::{Checks, Refold, VerifyError};
use crate::store::StoreError;

/// Forking a context failed; nothing was created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForkError {
    /// The commit to fork at is not in the log.
    #[error("cannot fork at generation {generation}: the log ends at generation {head}")]
    NoSuchCommit {
        /// The generation asked for.
        generation: Generation,
        /// The last generation of the log.
        head: Generation,
    },
    /// Rebuilding the state at a past commit failed: the log does not verify.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// The store could not create the branch's session.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An artifact's content on one side of a merge or a diff.
#[derive(Clone, Debug)]
pub struct ArtifactState {
    /// The artifact's kind.
    pub kind: Kind,
    /// Its version on this side.
    pub version: Version,
    /// Its content hash.
    pub hash: ContentHash,
    stored: Arc<Stored>,
}

impl ArtifactState {
    fn of(stored: &Arc<Stored>) -> Self {
        ArtifactState {
            kind: stored.kind,
            version: stored.version,
            hash: stored.hash,
            stored: stored.clone(),
        }
    }

    /// Decodes the content as `T`.
    ///
    /// # Errors
    /// As [`Context::get`].
    pub fn decode<T: Artifact>(&self) -> Result<Record<T>, ReadError> {
        self.stored.decode()
    }
}

/// An id changed to different content on both sides of a merge.
#[derive(Clone, Debug)]
pub struct Conflict {
    /// The artifact.
    pub id: ArtifactId,
    /// Its content at the common ancestor (`None`: it did not exist).
    pub base: Option<ArtifactState>,
    /// Its content on our side (`None`: deleted or never created).
    pub ours: Option<ArtifactState>,
    /// Its content on their side.
    pub theirs: Option<ArtifactState>,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |s: &Option<ArtifactState>| match s {
            Some(s) => format!("{} {} ({})", s.kind, s.version, s.hash.short()),
            None => "absent".to_owned(),
        };
        write!(
            f,
            "`{}`: base {}, ours {}, theirs {}",
            self.id,
            side(&self.base),
            side(&self.ours),
            side(&self.theirs)
        )
    }
}

/// Which side a resolved conflict takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Keep our content.
    Ours,
    /// Take their content.
    Theirs,
}

/// What a merge does with conflicts.
pub enum Resolution {
    /// Report them and apply nothing (the default of [`Context::merge`]).
    Fail,
    /// Keep our side of every conflict.
    Ours,
    /// Take their side of every conflict.
    Theirs,
    /// Ask a function, conflict by conflict.
    With(Box<dyn Fn(&Conflict) -> Side + Send + Sync>),
}

impl Resolution {
    /// Resolves each conflict with `choose`.
    pub fn with(choose: impl Fn(&Conflict) -> Side + Send + Sync + 'static) -> Self {
        Resolution::With(Box::new(choose))
    }

    fn choose(&self, conflict: &Conflict) -> Option<Side> {
        match self {
            Resolution::Fail => None,
            Resolution::Ours => Some(Side::Ours),
            Resolution::Theirs => Some(Side::Theirs),
            Resolution::With(choose) => Some(choose(conflict)),
        }
    }
}

impl fmt::Debug for Resolution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resolution::Fail => "Fail",
            Resolution::Ours => "Ours",
            Resolution::Theirs => "Theirs",
            Resolution::With(_) => "With(..)",
        })
    }
}

/// A merge refused or failed; nothing was applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// Ids changed to different content on both sides, and the resolution is
    /// [`Resolution::Fail`].
    #[error("{} conflicting artifact(s): {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Conflicts(Vec<Conflict>),
    /// The two histories have more than one best common ancestor (a criss-cross: each side
    /// merged the other while neither had seen the other's merge), so no single base says what
    /// each side changed. Merge one of the candidate bases into the other side first, or fork
    /// from one side and redo the other's changes.
    #[error("no single merge base: the histories have {} best common ancestors ({})", .bases.len(), .bases.iter().map(|b| b.short()).collect::<Vec<_>>().join(", "))]
    CrissCross {
        /// The best common ancestors, none an ancestor of another.
        bases: Vec<CommitHash>,
    },
    /// The resolution took their side of a conflict on an intent (`action:{key}`): an intent
    /// recorded on our side cannot be replaced or withdrawn, since its key may have been
    /// delivered already. Resolve intent conflicts with [`Side::Ours`].
    #[error("conflict on intent `{id}`: their side cannot be taken (an intent recorded on our side may have been delivered already); resolve it with our side")]
    IntentConflict {
        /// The pending action's id.
        id: ArtifactId,
    },
    /// Rebuilding the merge base's state failed, or a commit of either history is missing its
    /// parent.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// The merged changes do not apply.
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// The store could not persist the merge commit.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a merge did.
#[derive(Debug)]
#[non_exhaustive]
pub struct MergeReport {
    /// The merge commit, or `None` if their head was already merged (nothing to do).
    pub generation: Option<Generation>,
    /// The merge base: the best common ancestor of the two heads (`None`: unrelated histories,
    /// merged from the empty state).
    pub ancestor: Option<CommitHash>,
    /// Artifacts that took their side.
    pub taken: Vec<ArtifactId>,
    /// Conflicts resolved by the [`Resolution`], with the side each took.
    pub resolved: Vec<(Conflict, Side)>,
}

/// What changed between two states.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Diff {
    /// Created: absent before, present after.
    pub created: Vec<(ArtifactId, ArtifactState)>,
    /// Updated: present on both sides with different content, with the changed fields where
    /// the content is a map or struct.
    pub updated: Vec<Updated>,
    /// Deleted: present before, absent after.
    pub deleted: Vec<(ArtifactId, ArtifactState)>,
    /// Relations added.
    pub linked: Vec<Relation>,
    /// Relations removed.
    pub unlinked: Vec<Relation>,
}

impl Diff {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.created.is_empty()
            && self.updated.is_empty()
            && self.deleted.is_empty()
            && self.linked.is_empty()
            && self.unlinked.is_empty()
    }
}

/// An artifact whose content changed.
#[derive(Debug)]
pub struct Updated {
    /// The artifact.
    pub id: ArtifactId,
    /// Before.
    pub before: ArtifactState,
    /// After.
    pub after: ArtifactState,
    /// The fields that differ (path, before, after), where both decode as maps or structs.
    pub fields: Vec<FieldDiff>,
}

/// The ids and relations a run of commits touches.
#[derive(Default)]
struct Touched {
    ids: BTreeSet<ArtifactId>,
    relations: BTreeSet<Relation>,
}

impl Touched {
    fn add<'a>(&mut self, commits: impl IntoIterator<Item = &'a Commit>) {
        for op in commits
            .into_iter()
            .flat_map(|c| c.runs.iter())
            .flat_map(|r: &RunRecord| &r.ops)
        {
            match op {
                Op::Link(r) | Op::Unlink(r) => {
                    self.relations.insert(r.clone());
                }
                _ => {
                    self.ids.insert(op.id().clone());
                }
            }
        }
    }

    /// What either side changed since `base`: the commits on the way from it to each head.
    fn since(histories: &Histories<'_>, paths: &[Path<'_>; 2]) -> Self {
        let mut touched = Touched::default();
        for path in paths {
            touched.add(path.commits(histories));
        }
        touched
    }

    /// Relations that a deletion of a touched id may have removed, on any of the states.
    fn add_relations_of(&mut self, states: &[&dyn StateView]) {
        for id in &self.ids {
            for state in states {
                self.relations.extend(state.relations_touching(id));
            }
        }
    }
}

fn same(a: Option<&Arc<Stored>>, b: Option<&Arc<Stored>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.kind == b.kind && a.hash == b.hash,
        _ => false,
    }
}

fn is_intent(stored: Option<&Arc<Stored>>) -> bool {
    stored.is_some_and(|s| s.kind == Kind::of::<PendingAction>())
}

impl Context {
    /// Forks this context at its head into a branch named `name`: a new context with the same
    /// state (shared structure, O(1)), the same log, an empty event queue, and the same
    /// delivery ledger — so a key delivered on one branch is never delivered on the other.
    /// A context on SQLite forks into a new session of the same file, whose log is shared with
    /// this one up to the fork.
    ///
    /// # Errors
    /// [`ForkError::Store`] if the store cannot create the session (for instance, the name is
    /// taken).
    pub fn fork(&self, name: impl Into<String>) -> Result<Context, ForkError> {
        self.fork_at(name, self.generation())
    }

    /// Forks this context at a past commit: the branch's state is the state after commit
    /// `generation` (rebuilt by replaying the log up to it) and its log ends there.
    ///
    /// # Errors
    /// [`ForkError::NoSuchCommit`] past the head, [`ForkError::Verify`] if the log does not
    /// replay, [`ForkError::Store`] as for [`fork`](Context::fork).
    pub fn fork_at(&self, name: impl Into<String>, generation: Generation) -> Result<Context, ForkError> {
        let name = name.into();
        let head = self.generation();
        if generation > head {
            return Err(ForkError::NoSuchCommit { generation, head });
        }
        let held = self.held_log();
        let (state, events_emitted, log, graph, readers) = if generation == head {
            (
                self.state().clone(),
                self.next_event_seq(),
                held.clone(),
                self.graph().clone(),
                self.readers().clone(),
            )
        } else if let Some(base) = held.base().filter(|b| generation >= b.generation) {
            // At or after the checkpoint the context was opened from: replayed from it.
            let mut refold = Refold::resuming(base.state.clone(), base.generation, base.hash, Checks::STATE)
                .keep_readers(base.readers.clone());
            let mut events = base.next_event_seq;
            let upto = usize::try_from(generation.0 - base.generation.0).unwrap_or(usize::MAX);
            for commit in &held.held()[..upto] {
                events += refold.step(commit)?.len() as u64;
            }
            let readers = refold.readers().cloned().unwrap_or_default();
            (
                refold.into_state(),
                events,
                held.truncated(generation),
                self.graph().truncated(generation),
                readers,
            )
        } else {
            let (log, graph) = self.whole()?;
            let end = usize::try_from(generation.0).unwrap_or(usize::MAX);
            let mut refold = Refold::new(Checks::STATE).keep_readers(Readers::default());
            let mut events = 0;
            for commit in &log[..end] {
                events += refold.step(commit)?.len() as u64;
            }
            let readers = refold.readers().cloned().unwrap_or_default();
            (
                refold.into_state(),
                events,
                Log::new(log[..end].to_vec()),
                graph.truncated(generation),
                readers,
            )
        };
        let head = log.head();
        let store = match self.store() {
            Some(store) => Some(store.fork(&name, generation, head.as_ref(), events_emitted)?),
            None => None,
        };
        Ok(self
            .branch(name, state, log, graph, events_emitted, store)
            .with_readers(readers))
    }

    /// Merges `theirs` into this context, three-way from their merge base — the best common
    /// ancestor of the two heads, reachable from both through parents and merge parents, as
    /// git defines it (see `docs/branching.md`). A change
    /// made on one side only is applied; an id changed to equal content on both sides is
    /// already merged; an id changed to different content on both sides (including a deletion
    /// against an update) is a conflict, and then nothing is applied. Relations merge the
    /// same way (they cannot conflict: a relation is either there or not).
    ///
    /// The merge is one commit with two parents (this context's head and theirs); it emits
    /// events like any commit and never dispatches. Intents: a key both sides recorded is one
    /// intent; an intent only they recorded becomes ours too, and — since branches share the
    /// ledger — is delivered once in all, by whichever drain comes first.
    ///
    /// A merge costs what the two sides changed since the base: the base is found by walking
    /// back from both heads until they meet, and its state is read from a head with the
    /// commits since taken back, not replayed from the first commit.
    ///
    /// # Errors
    /// [`MergeError::Conflicts`] lists every conflict with its base, ours and theirs;
    /// [`MergeError::CrissCross`] names the bases when there is more than one best common
    /// ancestor. Nothing is applied on an error.
    pub fn merge(&mut self, theirs: &Context) -> Result<MergeReport, MergeError> {
        self.merge_with(theirs, Resolution::Fail)
    }

    /// [`merge`](Context::merge), resolving conflicts with `resolution`.
    ///
    /// # Errors
    /// As [`merge`](Context::merge); with a resolution other than [`Resolution::Fail`],
    /// conflicts are resolved instead of reported, except that taking their side of a conflict
    /// on an intent is refused with [`MergeError::IntentConflict`] (an intent recorded on our
    /// side may have been delivered already; keep ours).
    pub fn merge_with(&mut self, theirs: &Context, resolution: Resolution) -> Result<MergeReport, MergeError> {
        let histories = Histories::new(self.history()?, theirs.history()?);
        let base = match histories.merge_bases()?.as_slice() {
            [] => None,
            [base] => Some(*base),
            bases => {
                return Err(MergeError::CrissCross {
                    bases: bases.iter().map(|b| b.hash()).collect(),
                })
            }
        };
        let ancestor = base.map(|b| b.hash());
        if theirs.head().is_none() || ancestor == theirs.head() {
            // Their head is in our history already.
            return Ok(MergeReport {
                generation: None,
                ancestor,
                taken: Vec::new(),
                resolved: Vec::new(),
            });
        }
        let paths = [histories.path(base, 0)?, histories.path(base, 1)?];
        let base = histories.state_at(base, &paths)?;
        let ours = self.state();
        let their_state = theirs.state();
        let mut touched = Touched::since(&histories, &paths);
        touched.add_relations_of(&[&base, ours, their_state]);

        let mut take = Vec::new();
        let mut conflicts = Vec::new();
        let mut resolved = Vec::new();
        for id in &touched.ids {
            let (b, o, t) = (
                base.get(id.as_str()),
                ours.get(id.as_str()),
                their_state.get(id.as_str()),
            );
            if same(o, t) || same(b, t) {
                continue;
            }
            if same(b, o) {
                take.push((id.clone(), t.cloned()));
                continue;
            }
            let conflict = Conflict {
                id: id.clone(),
                base: b.map(ArtifactState::of),
                ours: o.map(ArtifactState::of),
                theirs: t.map(ArtifactState::of),
            };
            match resolution.choose(&conflict) {
                None => conflicts.push(conflict),
                Some(Side::Theirs) if is_intent(o) || is_intent(t) => {
                    return Err(MergeError::IntentConflict { id: id.clone() });
                }
                Some(side) => {
                    if side == Side::Theirs {
                        take.push((id.clone(), t.cloned()));
                    }
                    resolved.push((conflict, side));
                }
            }
        }
        if !conflicts.is_empty() {
            return Err(MergeError::Conflicts(conflicts));
        }

        // Their changes, as operations: writes (intents as acts), links, unlinks, deletions.
        let mut puts = Vec::new();
        let mut deletes = Vec::new();
        for (id, value) in &take {
            match value {
                Some(stored) if stored.kind == Kind::of::<PendingAction>() => puts.push(act_op(stored)),
                Some(stored) => puts.push(Op::Put {
                    mode: PutMode::Upsert,
                    id: id.clone(),
                    kind: stored.kind,
                    hash: stored.hash,
                    bytes: stored.bytes.clone(),
                }),
                None => deletes.push(Op::Delete { id: id.clone() }),
            }
        }
        let mut links = Vec::new();
        let mut unlinks = Vec::new();
        for relation in &touched.relations {
            let (b, o, t) = (
                base.has_relation(relation),
                ours.has_relation(relation),
                their_state.has_relation(relation),
            );
            if o == b && t != b {
                if t {
                    links.push(Op::Link(relation.clone()));
                } else {
                    unlinks.push(Op::Unlink(relation.clone()));
                }
            }
        }
        let ops: Vec<Op> = puts.into_iter().chain(links).chain(unlinks).chain(deletes).collect();
        let taken = take.into_iter().map(|(id, _)| id).collect();
        let run = RunRecord::direct(ops);
        let absorbed = histories.theirs_unknown_to_ours()?;
        let their_level = histories.head_level(1);
        match self.commit_runs(vec![run], 0, false, false, theirs.head()) {
            Ok(_) => {
                let generation = self.generation();
                self.graph_mut().record_merge(generation, their_level);
                self.graph_mut().absorb(absorbed);
                Ok(MergeReport {
                    generation: Some(generation),
                    ancestor,
                    taken,
                    resolved,
                })
            }
            Err(CommitFailure::Patch(_, e)) => Err(MergeError::Commit(e)),
            Err(CommitFailure::Store(e)) => Err(MergeError::Store(e)),
        }
    }

    /// What changed from this context's head to `other`'s: the ids and relations either side
    /// touched since their merge base (any best common ancestor, for a criss-cross history),
    /// compared.
    ///
    /// # Errors
    /// [`VerifyError`] if a commit of either history is missing its parent.
    pub fn diff(&self, other: &Context) -> Result<Diff, VerifyError> {
        let histories = Histories::new(self.history()?, other.history()?);
        let base = histories.merge_bases()?.first().copied();
        let paths = [histories.path(base, 0)?, histories.path(base, 1)?];
        let mut touched = Touched::since(&histories, &paths);
        touched.add_relations_of(&[self.state(), other.state()]);
        Ok(diff_states(self.state(), other.state(), &touched))
    }

    /// What changed from the state after commit `from` to the state after commit `to` of this
    /// context's log (either may be 0, the empty state; `from` may be after `to`). The two
    /// states are rebuilt in one pass, from whichever end is closer: replaying the log up to
    /// the later one, or taking the commits since the earlier one back off the head.
    ///
    /// # Errors
    /// [`VerifyError`] if a generation is past the head or the log does not replay.
    pub fn diff_commits(&self, from: Generation, to: Generation) -> Result<Diff, VerifyError> {
        let (log, graph) = self.whole()?;
        let (low, high) = (from.min(to), from.max(to));
        if high.0 > log.len() as u64 {
            return Err(VerifyError::Numbering {
                generation: high,
                position: log.len() as u64,
            });
        }
        let (low, high) = (low.0 as usize, high.0 as usize);
        let (at_low, at_high) = if high <= log.len() - low {
            let mut refold = Refold::new(Checks::STATE);
            for commit in &log[..low] {
                refold.step(commit)?;
            }
            let at_low = refold.state().clone();
            for commit in &log[low..high] {
                refold.step(commit)?;
            }
            (Past::Built(at_low), Past::Built(refold.into_state()))
        } else {
            let mut view = Rewound::new(self.state());
            graph.rewind(&mut view, log, high)?;
            let at_high = view.clone();
            graph.rewind(&mut view, &log[..high], low)?;
            (Past::Rewound(view), Past::Rewound(at_high))
        };
        let (before, after) = if from <= to {
            (at_low, at_high)
        } else {
            (at_high, at_low)
        };
        let mut touched = Touched::default();
        touched.add(&log[low..high]);
        touched.add_relations_of(&[&before, &after]);
        Ok(diff_states(&before, &after, &touched))
    }

    /// The whole history, for a walk of the graph (read from the store, for a context opened
    /// from a checkpoint).
    fn history(&self) -> Result<HistorySide<'_>, VerifyError> {
        let (log, graph) = self.whole()?;
        Ok(HistorySide {
            log,
            graph,
            state: self.state(),
        })
    }
}

/// The `PendingAction` of theirs as an act, so our ledger registers the intent if it does not
/// know the key (a merge of contexts that do not share a ledger).
fn act_op(stored: &Arc<Stored>) -> Op {
    let decoded = rmp_serde::from_slice::<PendingAction>(&stored.bytes)
        .ok()
        .map(|a| (ActionKey::from(a.key), a.kind))
        .filter(|(key, _)| *key.id() == stored.id)
        .zip(Payload::in_record(&stored.bytes));
    let ((key, action), payload) = match decoded {
        Some(((key, kind), payload)) => ((key, Arc::<str>::from(kind)), payload),
        // Unreachable for content that verified; keep the bytes as a plain write.
        None => {
            return Op::Put {
                mode: PutMode::Upsert,
                id: stored.id.clone(),
                kind: stored.kind,
                hash: stored.hash,
                bytes: stored.bytes.clone(),
            }
        }
    };
    Op::Act {
        key,
        action,
        hash: stored.hash,
        bytes: stored.bytes.clone(),
        payload,
    }
}

fn diff_states(before: &dyn StateView, after: &dyn StateView, touched: &Touched) -> Diff {
    let mut diff = Diff::default();
    for id in &touched.ids {
        match (before.get(id.as_str()), after.get(id.as_str())) {
            (None, Some(a)) => diff.created.push((id.clone(), ArtifactState::of(a))),
            (Some(b), None) => diff.deleted.push((id.clone(), ArtifactState::of(b))),
            (Some(b), Some(a)) if !same(Some(b), Some(a)) => diff.updated.push(Updated {
                id: id.clone(),
                fields: diff_bytes("", &b.bytes, &a.bytes),
                before: ArtifactState::of(b),
                after: ArtifactState::of(a),
            }),
            _ => {}
        }
    }
    for relation in &touched.relations {
        match (before.has_relation(relation), after.has_relation(relation)) {
            (false, true) => diff.linked.push(relation.clone()),
            (true, false) => diff.unlinked.push(relation.clone()),
            _ => {}
        }
    }
    diff
}
