//! The commit log and the rules that apply operations to the state.

use std::sync::Arc;

use serde::Serialize;

use crate::model::action::{ActionKey, Intent, Origin, PendingAction};
use crate::model::artifact::{ArtifactId, Generation, Kind, Stored, Version};
use crate::model::call::RecordedCall;
use crate::model::delivery::NewIntent;
use crate::model::event::{Event, EventKind, QueuedEvent};
use crate::model::hash::{CommitHash, ContentHash, HashWriter, StateHash};
use crate::model::patch::{Op, PutMode};
use crate::model::relation::Relation;
use crate::model::trace::TraceParent;
use crate::state::commit_hash;
use crate::state::live::{Rewind, State, Undo};

/// Applying an operation to the state failed. Nothing of the generation (or, in isolation
/// mode, of the patch) is applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// An update names an id that does not exist.
    #[error("update of unknown artifact `{id}` (kind `{kind}`)")]
    UnknownId {
        /// The id updated.
        id: ArtifactId,
        /// The kind the update wrote.
        kind: Kind,
    },
    /// A write would change the kind stored under an id.
    #[error("artifact `{id}` is a `{stored}`; writing a `{written}` under the same id is refused")]
    KindMismatch {
        /// The id written.
        id: ArtifactId,
        /// The kind stored under it.
        stored: Kind,
        /// The kind written.
        written: Kind,
    },
    /// An intent's id, `action:{key}`, holds an artifact that is not a pending action, so the
    /// intent cannot be recorded.
    #[error("intent `{key}` cannot be recorded: `{id}` holds a `{found}`, not a pending action")]
    ActionIdTaken {
        /// The intent's idempotency key.
        key: ActionKey,
        /// `action:{key}`.
        id: ArtifactId,
        /// The kind stored there.
        found: Kind,
    },
    /// A link names an endpoint that does not exist.
    #[error("link `{from}` -[{name}]-> `{to}`: artifact `{missing}` does not exist")]
    UnknownEndpoint {
        /// The relation's source.
        from: ArtifactId,
        /// The relation's name.
        name: String,
        /// The relation's target.
        to: ArtifactId,
        /// The endpoint that is missing.
        missing: ArtifactId,
    },
}

/// The artifact version that triggered a produce run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TriggerRef {
    /// The trigger's id.
    pub id: ArtifactId,
    /// The version the produce read (for a deletion, the version deleted).
    pub version: Version,
    /// Its content hash.
    pub hash: ContentHash,
    /// What the run received in [`ProduceCall::event`](crate::ProduceCall::event). Part of the
    /// commit hash only when it is not the kind the version implies (`Created` for version 1,
    /// `Updated` after it), so runs on those hash as they did before the kind was recorded.
    #[serde(skip_serializing_if = "EventKind::is_inferred")]
    pub event: EventKind,
}

/// One artifact a produce run read through its snapshot: the id, and the version it saw
/// (`None` if nothing was stored under the id).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Read {
    /// The id read.
    pub id: ArtifactId,
    /// The version the run saw, or `None` if the id was absent.
    pub version: Option<Version>,
}

/// The patch of one produce run (or of one direct write) as recorded in a commit.
#[derive(Clone, Debug, Serialize)]
pub struct RunRecord {
    /// The agent, or `None` for a direct write.
    pub agent: Option<Arc<str>>,
    /// The produce, or `None` for a direct write.
    pub produce: Option<Arc<str>>,
    /// What triggered the run, or `None` for a direct write.
    pub trigger: Option<TriggerRef>,
    /// The operations, in the order the produce recorded them.
    pub ops: Vec<Op>,
    /// What the run read through its snapshot, in first-read order, each id once (see
    /// `docs/replay.md` for which reads are recorded). Part of the commit hash; a run that read
    /// nothing hashes as it did before reads were recorded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<Read>,
    /// Whether the produce watches what this run read (it reacts to staleness, see
    /// [`Produce::stale`](crate::Produce::stale)): a later change of any of `reads` runs it
    /// again on the same trigger. Part of the commit hash only when set.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub watches_reads: bool,
    /// The calls the run recorded ([`ProduceCall::record`](crate::ProduceCall::record), the
    /// clock and the random source), in the order it asked for them: what a retry, a resume
    /// and a replay answer them with. Part of the commit hash (each answer by its hash), only
    /// when there are any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<RecordedCall>,
}

impl RunRecord {
    /// The run of a direct write: no agent, produce or trigger.
    pub(crate) fn direct(mut ops: Vec<Op>) -> RunRecord {
        // The log keeps the record for the life of the context: not the spare room a
        // transaction's buffer grew by doubling (up to half again its size, for a bulk load).
        ops.shrink_to_fit();
        RunRecord {
            agent: None,
            produce: None,
            trigger: None,
            ops,
            reads: Vec::new(),
            watches_reads: false,
            calls: Vec::new(),
        }
    }
}

/// The runs of a commit, in work order: a shared, immutable list of [`RunRecord`]s, so that
/// copying a commit (a fork's log, a truncated log) never copies its patches. Reads like a
/// slice (`runs.len()`, `runs[0]`, `runs.iter()`, `for run in &commit.runs`); writing through
/// it copies the runs first if another commit shares them.
#[derive(Clone, Default)]
pub struct Runs(Arc<Vec<RunRecord>>);

impl std::ops::Deref for Runs {
    type Target = [RunRecord];

    fn deref(&self) -> &[RunRecord] {
        &self.0
    }
}

/// Copy-on-write: a commit whose runs are shared with another copy gets its own first.
impl std::ops::DerefMut for Runs {
    fn deref_mut(&mut self) -> &mut [RunRecord] {
        Arc::make_mut(&mut self.0).as_mut_slice()
    }
}

impl<'a> IntoIterator for &'a Runs {
    type Item = &'a RunRecord;
    type IntoIter = std::slice::Iter<'a, RunRecord>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl FromIterator<RunRecord> for Runs {
    fn from_iter<I: IntoIterator<Item = RunRecord>>(runs: I) -> Self {
        Runs(Arc::new(runs.into_iter().collect()))
    }
}

/// As the list of runs it holds.
impl Serialize for Runs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl From<Vec<RunRecord>> for Runs {
    fn from(runs: Vec<RunRecord>) -> Self {
        Runs(Arc::new(runs))
    }
}

impl std::fmt::Debug for Runs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

/// One entry of the commit log: everything one generation changed, applied atomically.
#[derive(Clone, Debug)]
pub struct Commit {
    /// The commit's number in the log.
    pub generation: Generation,
    /// The previous commit's hash; `None` for the first commit.
    pub parent: Option<CommitHash>,
    /// For a merge commit, its second parent: the head of the branch merged in.
    pub merged: Option<CommitHash>,
    /// SHA-256 over the rmp-serde encoding of the parent hash, generation, state hash, the
    /// number of events consumed and the runs (each run's agent, produce, trigger, operations
    /// with their content hashes, and reads), followed by the second parent for a merge
    /// commit, under the domain `reactifact/commit/v2`. A commit written before the count was
    /// covered has the `reactifact/commit/v1` hash, the same without the count; verification
    /// accepts either (see `docs/replay.md`).
    pub hash: CommitHash,
    /// The state hash after the commit.
    pub state_hash: StateHash,
    /// The patches, in work order.
    pub runs: Runs,
    /// How many events the commit consumed: from the head of the queue as it was before the
    /// commit, then, if that left it empty, those the commit itself emitted that no produce of
    /// its runtime reacts to. Covered by the commit's hash (not by a `reactifact/commit/v1`
    /// hash, which older commits keep).
    pub events_consumed: usize,
}

/// The domain of a commit hash that covers the number of events consumed.
const COMMIT_V2: &[u8] = b"reactifact/commit/v2";

/// The domain of a commit hash written before the number of events consumed was covered.
const COMMIT_V1: &[u8] = b"reactifact/commit/v1";

impl Commit {
    /// The hash of a commit of these fields: SHA-256 of `reactifact/commit/v2` and
    /// rmp-serde's named encoding of `(parent, generation, state_hash, events_consumed,
    /// runs[, merged])`.
    pub(crate) fn compute_hash(
        parent: Option<&CommitHash>,
        merged: Option<&CommitHash>,
        generation: Generation,
        state_hash: &StateHash,
        events_consumed: usize,
        runs: &[RunRecord],
    ) -> CommitHash {
        Self::hash_with(
            COMMIT_V2,
            parent,
            merged,
            generation,
            state_hash,
            Some(events_consumed),
            runs,
        )
    }

    /// The hash an older build gave a commit of these fields, which does not cover the number
    /// of events consumed: SHA-256 of `reactifact/commit/v1` and rmp-serde's named encoding of
    /// `(parent, generation, state_hash, runs[, merged])`. Verification accepts it for the
    /// commits written before.
    pub(crate) fn compute_hash_v1(
        parent: Option<&CommitHash>,
        merged: Option<&CommitHash>,
        generation: Generation,
        state_hash: &StateHash,
        runs: &[RunRecord],
    ) -> CommitHash {
        Self::hash_with(COMMIT_V1, parent, merged, generation, state_hash, None, runs)
    }

    fn hash_with(
        domain: &[u8],
        parent: Option<&CommitHash>,
        merged: Option<&CommitHash>,
        generation: Generation,
        state_hash: &StateHash,
        events_consumed: Option<usize>,
        runs: &[RunRecord],
    ) -> CommitHash {
        // rmp-serde's named encoding of the tuple, written by `commit_hash` (the same bytes,
        // several times faster).
        let mut writer = HashWriter::new(domain);
        writer.append(|out| {
            commit_hash::header(
                out,
                parent,
                generation,
                state_hash,
                events_consumed.map(|n| n as u64),
                runs.len(),
                merged.is_some(),
            )
        });
        for run in runs {
            writer.append(|out| commit_hash::run(out, run));
        }
        writer.append(|out| commit_hash::trailer(out, merged));
        CommitHash(writer.finish())
    }

    /// [`Commit::compute_hash`] (with `events_consumed`) or [`Commit::compute_hash_v1`]
    /// (without) through rmp-serde, as they were first written: what the tests hold
    /// `commit_hash`'s encoding to.
    #[cfg(test)]
    pub(crate) fn compute_hash_with_serde(
        parent: Option<&CommitHash>,
        merged: Option<&CommitHash>,
        generation: Generation,
        state_hash: &StateHash,
        events_consumed: Option<usize>,
        runs: &[RunRecord],
    ) -> CommitHash {
        let domain = if events_consumed.is_some() {
            COMMIT_V2
        } else {
            COMMIT_V1
        };
        let mut writer = HashWriter::new(domain);
        let mut serializer = rmp_serde::Serializer::new(&mut writer).with_struct_map();
        match (events_consumed.map(|n| n as u64), merged) {
            (None, None) => (parent, generation, state_hash, runs).serialize(&mut serializer),
            (None, Some(merged)) => (parent, generation, state_hash, runs, merged).serialize(&mut serializer),
            (Some(n), None) => (parent, generation, state_hash, n, runs).serialize(&mut serializer),
            (Some(n), Some(merged)) => (parent, generation, state_hash, n, runs, merged).serialize(&mut serializer),
        }
        .expect("commit headers always encode");
        CommitHash(writer.finish())
    }

    /// This commit's hash as its fields say it should be.
    pub(crate) fn recompute_hash(&self) -> CommitHash {
        Self::compute_hash(
            self.parent.as_ref(),
            self.merged.as_ref(),
            self.generation,
            &self.state_hash,
            self.events_consumed,
            &self.runs,
        )
    }

    /// This commit's hash as an older build would have given it: [`Commit::compute_hash_v1`]
    /// of its fields.
    pub(crate) fn recompute_hash_v1(&self) -> CommitHash {
        Self::compute_hash_v1(
            self.parent.as_ref(),
            self.merged.as_ref(),
            self.generation,
            &self.state_hash,
            &self.runs,
        )
    }
}

/// An intent an [`Apply`] created, by its place in the commit: operation `op` of run `run`
/// (counting the runs the commit keeps), an [`Op::Act`]. The committer makes it an [`Intent`]
/// from the committed runs once the commit's hash is known, so that a large commit's list of
/// intents is 8 bytes each, not a copy of each act's parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Acted {
    run: u32,
    op: u32,
}

impl Acted {
    /// The intents `acted` as their store registers them: acted by `runs`, the runs of the
    /// commit `origin` names (its run aside), each in the trace `trace_of` gives for its run.
    pub(crate) fn into_new_intents<'a>(
        acted: Vec<Acted>,
        runs: &'a [RunRecord],
        origin: &'a Origin,
        trace_of: impl Fn(u32) -> Option<TraceParent> + 'a,
    ) -> impl ExactSizeIterator<Item = NewIntent> + 'a {
        acted.into_iter().map(move |Acted { run, op }| {
            let Op::Act {
                key,
                action,
                hash,
                bytes,
                payload,
            } = &runs[run as usize].ops[op as usize]
            else {
                unreachable!("an acted position names an act of its commit")
            };
            NewIntent {
                intent: Intent {
                    key: key.clone(),
                    kind: action.clone(),
                    payload: payload.clone(),
                    origin: origin.with_run(run),
                    attempt: 0,
                    trace: trace_of(run),
                },
                bytes: bytes.clone(),
                action_hash: *hash,
            }
        })
    }
}

/// Where an [`Apply`] was, to roll back one patch.
#[derive(Clone, Copy)]
pub(crate) struct Savepoint {
    undo: usize,
    relations: usize,
    events: usize,
    intents: usize,
}

/// Applies operations to the state in place, recording how to undo each change, and
/// collects the events and intents they emit. Dropping it without [`Apply::finish`] is a bug:
/// call [`Apply::rollback`] to leave the state as it was.
pub(crate) struct Apply<'a> {
    state: &'a mut State,
    generation: Generation,
    created_counter: u64,
    undo: Vec<Undo>,
    /// The relations changed, each with whether it was there before (undone apart from the
    /// artifacts: the two never depend on each other's order).
    undo_relations: Vec<(Relation, bool)>,
    /// The events the changes emit, in order (the committer numbers and queues the ones it
    /// keeps).
    pub(crate) events: Vec<Emitted>,
    pub(crate) intents: Vec<Acted>,
    /// The position in the commit of the run being applied, recorded in its intents.
    pub(crate) run: usize,
    /// The position in its patch of the operation being applied.
    op_index: usize,
}

impl<'a> Apply<'a> {
    pub(crate) fn new(state: &'a mut State, generation: Generation) -> Self {
        let created_counter = state.created_counter();
        Apply {
            state,
            generation,
            created_counter,
            undo: Vec::new(),
            undo_relations: Vec::new(),
            events: Vec::new(),
            intents: Vec::new(),
            run: 0,
            op_index: 0,
        }
    }

    /// Makes room for what `ops` operations record at most: one undo entry and one event each
    /// (a deletion's relations aside), so that a large commit's vectors grow once, not by
    /// doubling — each doubling a copy of everything so far into fresh pages.
    pub(crate) fn with_room(mut self, ops: usize) -> Self {
        self.undo.reserve(ops);
        self.events.reserve(ops);
        self
    }

    pub(crate) fn savepoint(&self) -> Savepoint {
        Savepoint {
            undo: self.undo.len(),
            relations: self.undo_relations.len(),
            events: self.events.len(),
            intents: self.intents.len(),
        }
    }

    pub(crate) fn rollback_to(&mut self, point: Savepoint) {
        while self.undo.len() > point.undo {
            let undo = self.undo.pop().expect("length checked");
            self.state.undo(undo);
        }
        while self.undo_relations.len() > point.relations {
            let (relation, was) = self.undo_relations.pop().expect("length checked");
            self.state.set_relation(&relation, was);
        }
        self.events.truncate(point.events);
        self.intents.truncate(point.intents);
    }

    /// Undoes everything and restores the creation counter.
    pub(crate) fn rollback(mut self) {
        self.rollback_to(Savepoint {
            undo: 0,
            relations: 0,
            events: 0,
            intents: 0,
        });
        self.state.reset_created_counter(self.created_counter);
    }

    /// Whether anything changed.
    pub(crate) fn changed(&self) -> bool {
        !self.undo.is_empty() || !self.undo_relations.is_empty()
    }

    pub(crate) fn state(&self) -> &State {
        self.state
    }

    /// Keeps the changes (take `events` and `intents` first) and returns how to take them back
    /// off the state later, or `None` if the commit only created artifacts (see [`Undone`]).
    pub(crate) fn finish(self) -> Option<Undone> {
        let overwrote = self.undo.iter().any(|u| matches!(u, Undo::Replaced(_)));
        if !overwrote && self.undo_relations.is_empty() {
            return None;
        }
        let mut undone = Undone {
            artifacts: Vec::new(),
            relations: self.undo_relations,
        };
        let mut seen = std::collections::HashSet::new();
        for undo in self.undo {
            // The first change of an id in the commit holds its value before the commit.
            if seen.insert(undo.id().clone()) {
                if let Undo::Replaced(previous) = undo {
                    undone.artifacts.push((previous.id.clone(), previous));
                }
            }
        }
        Some(undone)
    }

    /// Applies every operation of a patch, or none of them.
    pub(crate) fn patch(&mut self, ops: &[Op]) -> Result<(), CommitError> {
        let point = self.savepoint();
        for (i, op) in ops.iter().enumerate() {
            self.op_index = i;
            if let Err(e) = self.op(op) {
                self.rollback_to(point);
                return Err(e);
            }
        }
        Ok(())
    }

    fn op(&mut self, op: &Op) -> Result<(), CommitError> {
        match op {
            Op::Put {
                mode,
                id,
                kind,
                hash,
                bytes,
            } => self.put(*mode, id, *kind, hash, bytes).map(|_| ()),
            Op::Act { key, hash, bytes, .. } => {
                let id = key.id();
                let pending_action = Kind::of::<PendingAction>();
                if let Some(current) = self.state.get(id.as_str()).filter(|c| c.kind != pending_action) {
                    return Err(CommitError::ActionIdTaken {
                        key: key.clone(),
                        id: id.clone(),
                        found: current.kind,
                    });
                }
                let created = self.put(PutMode::CreateOnce, id, pending_action, hash, bytes)?;
                if created {
                    self.intents.push(Acted {
                        run: self.run as u32,
                        op: self.op_index as u32,
                    });
                }
                Ok(())
            }
            Op::Delete { id } => {
                if let Some(old) = self.state.get(id.as_str()).cloned() {
                    for relation in self.state.relations_touching(id) {
                        let was = self.state.set_relation(&relation, false);
                        self.undo_relations.push((relation, was));
                    }
                    self.state.put(id, None);
                    self.events.push(Emitted {
                        kind: EventKind::Deleted,
                        artifact: old.clone(),
                    });
                    self.undo.push(Undo::Replaced(old));
                }
                Ok(())
            }
            Op::Link(relation) => {
                for end in [&relation.from, &relation.to] {
                    if self.state.get(end.as_str()).is_none() {
                        return Err(CommitError::UnknownEndpoint {
                            from: relation.from.clone(),
                            name: relation.name.to_string(),
                            to: relation.to.clone(),
                            missing: end.clone(),
                        });
                    }
                }
                let was = self.state.set_relation(relation, true);
                if !was {
                    self.undo_relations.push((relation.clone(), was));
                }
                Ok(())
            }
            Op::Unlink(relation) => {
                let was = self.state.set_relation(relation, false);
                if was {
                    self.undo_relations.push((relation.clone(), was));
                }
                Ok(())
            }
        }
    }

    /// Writes one artifact by the rules of `mode`; returns whether it was created.
    fn put(
        &mut self,
        mode: PutMode,
        id: &ArtifactId,
        kind: Kind,
        hash: &ContentHash,
        bytes: &Arc<[u8]>,
    ) -> Result<bool, CommitError> {
        let current = self.state.get(id.as_str());
        let (version, created, event) = match current {
            None if mode == PutMode::Update => {
                return Err(CommitError::UnknownId { id: id.clone(), kind });
            }
            None => (Version::FIRST, self.state.next_created(), EventKind::Created),
            Some(_) if mode == PutMode::CreateOnce => return Ok(false),
            Some(current) if current.kind != kind => {
                return Err(CommitError::KindMismatch {
                    id: id.clone(),
                    stored: current.kind,
                    written: kind,
                });
            }
            Some(current) if current.hash == *hash => return Ok(false),
            Some(current) => (current.version.next(), current.created, EventKind::Updated),
        };
        let stored = Arc::new(Stored {
            id: id.clone(),
            kind,
            version,
            hash: *hash,
            generation: self.generation,
            created,
            bytes: bytes.clone(),
        });
        let previous = self.state.put(id, Some(stored.clone()));
        self.events.push(Emitted {
            kind: event,
            artifact: stored.clone(),
        });
        self.undo.push(match previous {
            Some(previous) => Undo::Replaced(previous),
            None => Undo::Created(stored),
        });
        Ok(event == EventKind::Created)
    }
}

/// An event a change emitted, as an [`Apply`] keeps it until the commit is decided: what
/// happened, and the artifact it happened to (the version written; for a deletion, the
/// version deleted). 16 bytes: a large commit emits one per write, and most of them are
/// consumed by the commit itself, never queued.
pub(crate) struct Emitted {
    kind: EventKind,
    artifact: Arc<Stored>,
}

impl Emitted {
    /// What happened.
    pub(crate) fn kind(&self) -> EventKind {
        self.kind
    }

    /// The id of the artifact it happened to.
    pub(crate) fn id(&self) -> &ArtifactId {
        &self.artifact.id
    }

    /// The kind of the artifact it happened to.
    pub(crate) fn artifact_kind(&self) -> Kind {
        self.artifact.kind
    }

    /// The event, emitted by the commit of `generation`.
    pub(crate) fn event(&self, generation: Generation) -> Event {
        Event {
            kind: self.kind,
            id: self.artifact.id.clone(),
            artifact_kind: self.artifact.kind,
            version: self.artifact.version,
            generation,
        }
    }

    /// The event as the queue keeps it, numbered `seq`, emitted by the commit of `generation`.
    pub(crate) fn queued(self, seq: u64, generation: Generation) -> QueuedEvent {
        QueuedEvent {
            seq,
            event: self.event(generation),
            deleted: (self.kind == EventKind::Deleted).then_some(self.artifact),
        }
    }
}

/// How to take one commit back off the state it produced, kept beside the log so that a past
/// state (a merge base, a diff's end) is rebuilt from the head in what changed since, not by
/// replaying the log from the start.
///
/// It lists, for the ids the commit changed that existed before it, their value before it, and
/// every relation change in order. An id the commit wrote that is not listed did not exist
/// before it: it is removed if the commit left it behind. A commit that only created artifacts
/// (most commits) keeps no record at all.
#[derive(Default)]
pub(crate) struct Undone {
    artifacts: Vec<(ArtifactId, Arc<Stored>)>,
    relations: Vec<(Relation, bool)>,
}

/// Takes `commit` back off `state`, which must be the state right after it; `undone` is what
/// [`Apply::finish`] returned for it.
pub(crate) fn undo_commit(state: &mut impl Rewind, commit: &Commit, undone: Option<&Undone>) {
    if let Some(undone) = undone {
        for (relation, was) in undone.relations.iter().rev() {
            state.set_relation(relation, *was);
        }
        for (id, previous) in &undone.artifacts {
            state.put(id, Some(previous.clone()));
        }
    }
    // What is left written by this commit was created by it (a restored value is older).
    for op in commit.runs.iter().flat_map(|r| &r.ops) {
        if matches!(op, Op::Link(_) | Op::Unlink(_)) {
            continue;
        }
        let id = op.id();
        if state
            .get(id.as_str())
            .is_some_and(|s| s.generation == commit.generation)
        {
            state.put(id, None);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::hash;

    /// A put built without `Op::put`'s checks: what a log written before `action:` ids were
    /// reserved for intents may hold.
    pub(crate) fn raw_put(id: &str, kind: &str, value: &impl Serialize) -> Op {
        let bytes = crate::model::artifact::encode(value).unwrap();
        Op::Put {
            mode: PutMode::Create,
            id: ArtifactId::from(id),
            kind: Kind::intern(kind),
            hash: hash::content_hash(&bytes),
            bytes: bytes.into(),
        }
    }

    #[test]
    fn an_act_over_another_kind_under_its_id_is_refused_and_applies_nothing() {
        let mut state = State::default();
        let mut apply = Apply::new(&mut state, Generation(1));
        apply.patch(&[raw_put("action:k1", "order", &("ada", 1u32))]).unwrap();
        apply.finish();
        let before = state.state_hash();

        let mut apply = Apply::new(&mut state, Generation(2));
        let key = ActionKey::from("k1");
        let ops = [
            raw_put("receipt:1", "receipt", &1u32),
            Op::act("notify", key.clone(), &"payload").unwrap(),
        ];
        let error = apply.patch(&ops).unwrap_err();
        assert!(apply.intents.is_empty() && apply.events.is_empty());
        apply.rollback();
        let CommitError::ActionIdTaken {
            key: refused,
            id,
            found,
        } = &error
        else {
            panic!("not a refused act: {error}");
        };
        assert_eq!(
            (refused.as_str(), id.as_str(), found.as_str()),
            ("k1", "action:k1", "order")
        );
        assert_eq!(
            error.to_string(),
            "intent `k1` cannot be recorded: `action:k1` holds a `order`, not a pending action"
        );
        assert_eq!(state.state_hash(), before, "the patch was rolled back whole");
        assert!(state.get("receipt:1").is_none());
    }

    #[test]
    fn an_act_over_an_existing_intent_is_skipped() {
        let mut state = State::default();
        let key = ActionKey::from("k1");
        let act = Op::act("notify", key.clone(), &"payload").unwrap();
        let mut apply = Apply::new(&mut state, Generation(1));
        apply.patch(std::slice::from_ref(&act)).unwrap();
        assert_eq!(apply.intents.len(), 1);
        apply.finish();
        let mut apply = Apply::new(&mut state, Generation(2));
        apply.patch(&[act]).unwrap();
        assert!(apply.intents.is_empty() && !apply.changed());
        apply.finish();
    }
}
