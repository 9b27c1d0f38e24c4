//! Joins by key: a produce that runs when artifacts of two or more kinds sharing a key are all
//! present (an order and its payment, keyed by order id), and its absent form (an order with
//! no payment).
//!
//! A join is declared on a [`Produce`] with a key function for its trigger type
//! ([`Produce::key`]) and one per other part ([`Produce::join`] for a part that must be present,
//! [`Produce::absent`] for one that must not be). The runtime keeps an index per part, from key
//! to the ids of that kind holding it, so finding the other parts of a key is a hash lookup:
//! never a scan of the state. The index is derived from the state alone — rebuilt from it when a
//! runtime first runs (after an open of a durable store, from a checkpoint or not) and kept in
//! step with every commit after it, O(what the commit changed) — and synchronised before each
//! generation's matching, so the index a generation matches with is the one of the snapshot its
//! runs read.
//!
//! See `docs/scheduler-semantics.md` ("Joins") for the matching rules.

use std::collections::BTreeSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use foldhash::HashMap;
use serde::Serialize;

use crate::model::artifact::{encode, Artifact, ArtifactId, ArtifactType, Generation, Kind, ReadError, Record, Stored};
use crate::model::event::EventKind;
use crate::model::hash::CommitHash;
use crate::model::panic::panic_message;
use crate::model::patch::Op;
use crate::run::generation::Slot;
use crate::run::produce::{Agent, Produce, ProduceCall};
use crate::session::context::Context;
use crate::state::commit::Commit;
use crate::state::live::State;
use crate::state::snapshot::Snapshot;

/// A key as the index compares it: the key function's value, encoded as artifacts are
/// (MessagePack), so keys of different integer types with one value are equal.
pub(crate) type JoinKey = Box<[u8]>;

/// A key function over a stored artifact of one kind: `None` if it does not decode, or the
/// function panicked or returned something that does not serialize.
type KeyFn = dyn Fn(&Stored) -> Option<JoinKey> + Send + Sync;

/// The parts a join run was matched with: every present part, in declaration order and, within
/// a part, in id order. Shared, not copied, between the matcher and the run.
pub(crate) type Parts = Arc<[Arc<Stored>]>;

/// One declared part of a join besides the trigger.
#[derive(Clone)]
pub(crate) struct Part {
    pub(crate) ty: ArtifactType,
    key: Arc<KeyFn>,
    /// The absent form: the produce runs only while no artifact of this kind has the key.
    pub(crate) absent: bool,
}

/// What a produce declares of a join: the trigger's key function and the other parts.
#[derive(Clone, Default)]
pub(crate) struct JoinSpec {
    trigger_key: Option<Arc<KeyFn>>,
    pub(crate) parts: Vec<Part>,
}

impl JoinSpec {
    /// Whether the produce is a join (it has a part besides its trigger).
    pub(crate) fn is_join(&self) -> bool {
        !self.parts.is_empty()
    }

    /// Whether a key function for the trigger was declared.
    pub(crate) fn has_key(&self) -> bool {
        self.trigger_key.is_some()
    }
}

fn key_fn<T, K, F>(produce: &Arc<str>, f: F) -> Arc<KeyFn>
where
    T: Artifact,
    K: Serialize,
    F: Fn(&Record<T>) -> K + Send + Sync + 'static,
{
    let produce = produce.clone();
    Arc::new(move |stored: &Stored| {
        let record = stored.decode::<T>().ok()?;
        match std::panic::catch_unwind(AssertUnwindSafe(|| f(&record))) {
            Ok(key) => encode(&key).ok().map(Vec::into_boxed_slice),
            Err(panic) => {
                tracing::warn!(produce = %produce, artifact_id = %stored.id, kind = %stored.kind, panic = %panic_message(&panic), "a join key function panicked; the artifact is not in the join index");
                None
            }
        }
    })
}

impl Produce {
    /// Declares the key of the produce's trigger for a join: `key(record)` is compared with
    /// the keys of the parts declared with [`join`](Produce::join) and
    /// [`absent`](Produce::absent). `#[produce(.., key = |o| o.data.id)]` expands to it.
    ///
    /// Keys compare by their MessagePack encoding (as artifacts are stored): use one type for
    /// the keys of every part (a string never equals a number; integers of different widths
    /// with one value are equal). A key function must be a pure function of the record; one
    /// that panics leaves that artifact out of the index (and logs a warning).
    ///
    /// # Panics
    /// If `T` is not the produce's trigger type.
    pub fn key<T, K, F>(mut self, key: F) -> Self
    where
        T: Artifact,
        K: Serialize,
        F: Fn(&Record<T>) -> K + Send + Sync + 'static,
    {
        assert_eq!(
            std::any::TypeId::of::<T>(),
            self.trigger.type_id,
            "the join key of produce `{}` must take its trigger type",
            self.name
        );
        self.join.trigger_key = Some(key_fn(&self.name, key));
        self
    }

    /// Joins the produce's trigger with artifacts of type `P` sharing its key: the produce runs
    /// when an artifact of its trigger type and one of `P` with the same key (see
    /// [`key`](Produce::key)) are both present — on the event of whichever arrives (or
    /// changes) — once per generation per trigger, with the trigger as `call.trigger` and the
    /// part readable through [`ProduceCall::joined`]. `#[produce(.., join(P, key = |p| ..))]`
    /// expands to it. Declare several parts for a join of more than two kinds.
    ///
    /// ```
    /// use reactifact_core::{Artifact, Produce, ProduceCall, Record};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)] struct Order { id: u64 }
    /// impl Artifact for Order { const KIND: &'static str = "order"; }
    /// #[derive(Serialize, Deserialize)] struct Payment { order_id: u64, cents: u64 }
    /// impl Artifact for Payment { const KIND: &'static str = "payment"; }
    /// #[derive(Serialize, Deserialize)] struct Shipment { order_id: u64 }
    /// impl Artifact for Shipment { const KIND: &'static str = "shipment"; }
    ///
    /// let ship = Produce::new("ship", |call: ProduceCall<Order>| async move {
    ///     let payment = call.joined::<Payment>()?.expect("a join run has every part");
    ///     let order_id = payment.data.order_id;
    ///     call.effects.upsert(format!("shipment:{order_id}"), Shipment { order_id });
    ///     Ok::<(), reactifact_core::ProduceError>(())
    /// })
    /// .creates::<Shipment>()
    /// .key(|o: &Record<Order>| o.data.id)
    /// .join(|p: &Record<Payment>| p.data.order_id);
    /// assert!(ship.is_join());
    /// ```
    ///
    /// # Panics
    /// If `P` is the trigger type or a part already declared, or the produce reacts to
    /// deletions (a join reacts to creations and updates of its parts).
    pub fn join<P, K, F>(self, key: F) -> Self
    where
        P: Artifact,
        K: Serialize,
        F: Fn(&Record<P>) -> K + Send + Sync + 'static,
    {
        self.part::<P, K, F>(key, false)
    }

    /// The absent form of a join: the produce runs on an event of its trigger only while no
    /// artifact of type `P` shares the trigger's key (see [`key`](Produce::key)) in the
    /// snapshot the generation reads. A `P` that arrives in the same generation as the trigger,
    /// or earlier, cancels the run; one that arrives later does not undo it. Events of `P`
    /// trigger nothing. Combines with [`join`](Produce::join): every joined part present and
    /// every absent part absent. `#[produce(.., absent(P, key = |p| ..))]` expands to it.
    ///
    /// # Panics
    /// As [`join`](Produce::join).
    pub fn absent<P, K, F>(self, key: F) -> Self
    where
        P: Artifact,
        K: Serialize,
        F: Fn(&Record<P>) -> K + Send + Sync + 'static,
    {
        self.part::<P, K, F>(key, true)
    }

    fn part<P, K, F>(mut self, key: F, absent: bool) -> Self
    where
        P: Artifact,
        K: Serialize,
        F: Fn(&Record<P>) -> K + Send + Sync + 'static,
    {
        let ty = ArtifactType::of::<P>();
        assert!(
            ty.kind != self.trigger.kind,
            "produce `{}` cannot join its trigger type `{}` with itself",
            self.name,
            ty.name
        );
        assert!(
            !self.join.parts.iter().any(|p| p.ty.kind == ty.kind),
            "produce `{}` declares the join part `{}` twice",
            self.name,
            ty.name
        );
        assert!(
            !self.reacts_to(EventKind::Deleted),
            "produce `{}` reacts to deletions, so it cannot be a join (a join reacts to creations and updates of its parts)",
            self.name
        );
        self.join.parts.push(Part {
            ty,
            key: key_fn(&self.name, key),
            absent,
        });
        self
    }

    /// Whether the produce is a join (see [`join`](Produce::join) and
    /// [`absent`](Produce::absent)).
    pub fn is_join(&self) -> bool {
        self.join.is_join()
    }

    /// The kinds whose events may run it besides its trigger: its present join parts.
    pub(crate) fn joined_kinds(&self) -> impl Iterator<Item = Kind> + '_ {
        self.join.parts.iter().filter(|p| !p.absent).map(|p| p.ty.kind)
    }
}

impl<T, D> ProduceCall<T, D> {
    /// The joined part of type `P` of a join run (see [`Produce::join`]): the artifact of
    /// kind `P` sharing the trigger's key, as it is in the run's snapshot; the first by id
    /// when several share it (all of them: [`joined_all`](ProduceCall::joined_all)).
    /// `Ok(None)` if `P` is not a present part of the produce's join.
    ///
    /// The parts were read when the run started, so they are among the run's recorded reads
    /// ([`RunRecord::reads`](crate::RunRecord::reads)): its provenance names their versions.
    ///
    /// # Errors
    /// [`ReadError`] if the part does not decode as `P`.
    pub fn joined<P: Artifact>(&self) -> Result<Option<Record<P>>, ReadError> {
        self.joined_stored::<P>().next().map(|s| s.decode()).transpose()
    }

    /// Every joined part of type `P` sharing the trigger's key, in id order (see
    /// [`joined`](ProduceCall::joined)); empty if `P` is not a present part.
    ///
    /// # Errors
    /// [`ReadError`] if one does not decode as `P`.
    pub fn joined_all<P: Artifact>(&self) -> Result<Vec<Record<P>>, ReadError> {
        self.joined_stored::<P>().map(|s| s.decode()).collect()
    }

    fn joined_stored<P: Artifact>(&self) -> impl Iterator<Item = &Arc<Stored>> + '_ {
        let kind = Kind::of::<P>();
        self.joined
            .iter()
            .flat_map(|parts| parts.iter())
            .filter(move |s| s.kind == kind)
    }
}

/// Why a runtime refuses a join produce.
pub(crate) fn check(produce: &Produce) -> Result<(), &'static str> {
    if produce.join.is_join() && !produce.join.has_key() {
        return Err("declares join parts but no key for its trigger; add `.key(..)` (`#[produce(.., key = ..)]`)");
    }
    if !produce.join.is_join() && produce.join.has_key() {
        return Err("declares a join key but no part to join; add `.join::<P, _, _>(..)` or `.absent::<P, _, _>(..)`");
    }
    Ok(())
}

/// The index of one part (or of the trigger) of one join produce: key → ids, and id → key.
struct PartIndex {
    kind: Kind,
    key: Arc<KeyFn>,
    ids: HashMap<JoinKey, BTreeSet<ArtifactId>>,
    keys: HashMap<ArtifactId, JoinKey>,
}

impl PartIndex {
    fn new(kind: Kind, key: Arc<KeyFn>) -> Self {
        PartIndex {
            kind,
            key,
            ids: HashMap::default(),
            keys: HashMap::default(),
        }
    }

    /// Puts `id` where `current` (its artifact now, if any) says.
    fn refresh(&mut self, id: &ArtifactId, current: Option<&Arc<Stored>>) {
        let new = current.filter(|s| s.kind == self.kind).and_then(|s| (self.key)(s));
        if let Some(old) = self.keys.get(id) {
            if new.as_ref() == Some(old) {
                return;
            }
            let old = self.keys.remove(id).expect("just found");
            if let Some(ids) = self.ids.get_mut(&old) {
                ids.remove(id);
                if ids.is_empty() {
                    self.ids.remove(&old);
                }
            }
        }
        if let Some(new) = new {
            self.ids.entry(new.clone()).or_default().insert(id.clone());
            self.keys.insert(id.clone(), new);
        }
    }

    fn with_key(&self, key: &JoinKey) -> impl Iterator<Item = &ArtifactId> + '_ {
        self.ids.get(key).into_iter().flatten()
    }

    fn clear(&mut self) {
        self.ids.clear();
        self.keys.clear();
    }
}

/// The indexes of one join produce: its trigger's first, then one per declared part.
struct JoinIndexes {
    indexes: Vec<PartIndex>,
    absent: Vec<bool>,
}

/// The join indexes of a runtime's (or a replay's) join produces, in step with a state.
#[derive(Default)]
pub(crate) struct Joins {
    joins: Vec<JoinIndexes>,
    /// The joins by (agent, produce) name: how the commits of the log name their runs.
    by_name: HashMap<(Arc<str>, Arc<str>), usize>,
    /// The generation of the newest committed run of a join produce on a trigger, by (join,
    /// trigger id), for the runs that matter: those after the oldest queued event (see
    /// [`Joins::already_ran`]). Derived from the log: the commits applied, and on a rebuild the
    /// held commits after the oldest queued event.
    last_run: HashMap<(usize, ArtifactId), Generation>,
    /// The size of `last_run` after it was last pruned ([`Joins::forget_answered`]).
    last_run_pruned: usize,
    by_slot: HashMap<(usize, usize), usize>,
    /// The commit the indexes are in step with: its generation and hash (`None` before the
    /// first); `None` before the first synchronisation.
    synced: Option<(Generation, Option<CommitHash>)>,
}

impl Joins {
    /// Empty indexes for the join produces of `agents` (slots in their order).
    pub(crate) fn of(agents: &[Agent]) -> Joins {
        let mut joins = Joins::default();
        for (a, agent) in agents.iter().enumerate() {
            for (p, produce) in agent.produces.iter().enumerate() {
                let spec = &produce.join;
                let Some(trigger_key) = spec.trigger_key.clone().filter(|_| spec.is_join()) else {
                    continue;
                };
                let mut indexes = vec![PartIndex::new(produce.trigger(), trigger_key)];
                let mut absent = vec![false];
                for part in &spec.parts {
                    indexes.push(PartIndex::new(part.ty.kind, part.key.clone()));
                    absent.push(part.absent);
                }
                joins.by_slot.insert((a, p), joins.joins.len());
                joins
                    .by_name
                    .insert((agent.name.clone(), produce.name_arc().clone()), joins.joins.len());
                joins.joins.push(JoinIndexes { indexes, absent });
            }
        }
        joins
    }

    /// Whether there is any join produce.
    pub(crate) fn is_empty(&self) -> bool {
        self.joins.is_empty()
    }

    /// Brings the indexes in step with `ctx`'s state: applies the commits after the one they
    /// were in step with, O(what those commits changed), or, when they do not follow from it
    /// (the first synchronisation, a context replaced, a merge commit, commits not held),
    /// rebuilds them from the state, O(artifacts of the joined kinds).
    pub(crate) fn sync(&mut self, ctx: &Context) {
        if self.joins.is_empty() {
            return;
        }
        let now = (ctx.generation(), ctx.head());
        if self.synced == Some(now) {
            return;
        }
        let log = ctx.held_log();
        let follows = self.synced.is_some_and(|(generation, head)| {
            generation < now.0
                && (generation.0 + 1..=now.0 .0).all(|g| {
                    log.held_at(Generation(g))
                        .is_some_and(|c| c.merged.is_none() && (g != generation.0 + 1 || c.parent == head))
                })
        });
        if follows {
            let (from, _) = self.synced.expect("follows only from a synchronisation");
            for g in from.0 + 1..=now.0 .0 {
                let commit = log.held_at(Generation(g)).expect("checked above");
                self.apply(commit, ctx.state());
            }
        } else {
            self.rebuild(ctx.state());
            // The runs that may already have answered a queued event: those after the oldest.
            // O(those commits' runs): the held commits are in generation order.
            if let Some(oldest) = ctx.queued().next().map(|q| q.event.generation) {
                let held = log.held();
                for commit in &held[held.partition_point(|c| c.generation <= oldest)..] {
                    self.record_runs(commit);
                }
            }
        }
        self.forget_answered(ctx.queued().next().map(|q| q.event.generation));
        self.synced = Some(now);
    }

    /// Drops the runs no queued or later event can be one that a run already answered: those
    /// no newer than the oldest queued event (`already_ran` needs a run newer than the event's
    /// own version), or every one when nothing is queued (later events come from later
    /// commits). Without it `last_run` would keep an entry per trigger ever run. Runs when the
    /// map has doubled since the last pruning: amortised O(1) per entry.
    fn forget_answered(&mut self, oldest_queued: Option<Generation>) {
        if self.last_run.len() < (2 * self.last_run_pruned).max(1024) {
            return;
        }
        match oldest_queued {
            Some(oldest) => self.last_run.retain(|_, ran| *ran > oldest),
            None => self.last_run.clear(),
        }
        self.last_run_pruned = self.last_run.len();
    }

    /// Rebuilds every index from `state`: O(artifacts of the joined kinds).
    pub(crate) fn rebuild(&mut self, state: &State) {
        self.last_run.clear();
        for join in &mut self.joins {
            for index in &mut join.indexes {
                index.clear();
                let ids: Vec<ArtifactId> = state.ids_of_kind(index.kind).cloned().collect();
                for id in ids {
                    index.refresh(&id, state.get(id.as_str()));
                }
            }
        }
    }

    /// Applies what `commit` changed, with `state` the state after it (or after later
    /// commits, which are applied next): O(the commit's operations × the join parts). A
    /// merge commit rebuilds.
    pub(crate) fn apply(&mut self, commit: &Commit, state: &State) {
        if commit.merged.is_some() {
            self.rebuild(state);
            return;
        }
        self.record_runs(commit);
        for op in commit.runs.iter().flat_map(|run| &run.ops) {
            let id = match op {
                Op::Put { .. } | Op::Delete { .. } | Op::Act { .. } => op.id(),
                Op::Link(_) | Op::Unlink(_) => continue,
            };
            let current = state.get(id.as_str());
            for join in &mut self.joins {
                for index in &mut join.indexes {
                    if current.is_some_and(|s| s.kind == index.kind) || index.keys.contains_key(id) {
                        index.refresh(id, current);
                    }
                }
            }
        }
    }

    /// The triggers an event of a joined part (`part`, of a kind the produce joins) calls
    /// for: the artifacts of the produce's trigger type sharing its key in `snapshot`, in id
    /// order.
    pub(crate) fn triggers_of<'a>(
        &'a self,
        slot: Slot,
        part: &'a Stored,
        snapshot: &'a Snapshot,
    ) -> impl Iterator<Item = &'a Arc<Stored>> + 'a {
        let join = self.by_slot.get(&(slot.agent, slot.produce)).map(|&j| &self.joins[j]);
        join.into_iter().flat_map(move |join| {
            let key = join.indexes[1..]
                .iter()
                .zip(&join.absent[1..])
                .find(|(index, absent)| !**absent && index.kind == part.kind)
                .and_then(|(index, _)| index.keys.get(&part.id));
            key.into_iter()
                .flat_map(move |key| join.indexes[0].with_key(key))
                .filter_map(move |id| snapshot.state.get(id.as_str()))
        })
    }

    /// The parts a run of the join produce at `slot` on `trigger` joins, if the set is
    /// complete in `snapshot`: every present part has an artifact with the trigger's key and
    /// no absent part has one. `None` otherwise, or if the trigger has no key.
    pub(crate) fn parts(&self, slot: Slot, trigger: &Stored, snapshot: &Snapshot) -> Option<Parts> {
        let join = &self.joins[*self.by_slot.get(&(slot.agent, slot.produce))?];
        let key = join.indexes[0].keys.get(&trigger.id)?;
        let mut parts = Vec::new();
        for (index, &absent) in join.indexes[1..].iter().zip(&join.absent[1..]) {
            let mut found = index
                .with_key(key)
                .filter_map(|id| snapshot.state.get(id.as_str()))
                .peekable();
            match (absent, found.peek().is_some()) {
                (true, true) | (false, false) => return None,
                (true, false) => {}
                (false, true) => parts.extend(found.cloned()),
            }
        }
        Some(parts.into())
    }

    /// Records the join runs of `commit` (see the field `last_run`): O(its runs).
    fn record_runs(&mut self, commit: &Commit) {
        if self.by_name.is_empty() {
            return;
        }
        for run in &commit.runs {
            let (Some(agent), Some(produce), Some(trigger)) = (&run.agent, &run.produce, &run.trigger) else {
                continue;
            };
            if let Some(&j) = self.by_name.get(&(agent.clone(), produce.clone())) {
                self.last_run.insert((j, trigger.id.clone()), commit.generation);
            }
        }
    }

    /// Whether a committed run of the join produce at `slot` on `trigger` already joined the
    /// set `parts`: it ran in a generation after the one that wrote the current version of the
    /// trigger and of every part, so its snapshot held each of them at that version (a version
    /// written later, or a part deleted and created again, is a newer generation). An event of
    /// the set taken after such a run — a run budget cut the batch between the events of one
    /// set — is one that run already answered.
    fn already_ran(&self, slot: Slot, trigger: &Stored, parts: &[Arc<Stored>]) -> bool {
        let Some(&j) = self.by_slot.get(&(slot.agent, slot.produce)) else {
            return false;
        };
        let Some(&ran) = self.last_run.get(&(j, trigger.id.clone())) else {
            return false;
        };
        std::iter::once(trigger)
            .chain(parts.iter().map(|p| &**p))
            .all(|s| s.generation < ran)
    }

    /// The slot of the produce `produce` of agent `agent` among `agents`, as the replay oracle
    /// finds it: the first agent of that name with a produce of that name.
    pub(crate) fn slot_named(agents: &[Agent], agent: &str, produce: &str) -> Option<Slot> {
        agents
            .iter()
            .enumerate()
            .filter(|(_, a)| a.name() == agent)
            .find_map(|(a, ag)| {
                ag.produces
                    .iter()
                    .position(|p| p.name() == produce)
                    .map(|p| Slot { agent: a, produce: p })
            })
    }
}

/// Completes the join work among `matched` (one event's work): a run of a join produce keeps
/// the parts it joins when its set is complete in `snapshot`, and is dropped otherwise, or when
/// (for an event, not a staleness rerun) a committed run on the trigger already joined that set
/// (see [`Joins::already_ran`]). Other work is left as it is. O(matched work × parts).
pub(crate) fn complete(
    rt: &crate::run::runtime::Runtime,
    snapshot: &Snapshot,
    matched: &mut Vec<crate::run::matching::Work>,
) {
    if rt.joins.is_empty() {
        return;
    }
    matched.retain_mut(|w| {
        if !rt.agents[w.slot.agent].produces[w.slot.produce].is_join() {
            return true;
        }
        w.joined = rt.joins.parts(w.slot, &w.trigger, snapshot);
        match &w.joined {
            None => false,
            Some(parts) => w.event == EventKind::Stale || !rt.joins.already_ran(w.slot, &w.trigger, parts),
        }
    });
}
