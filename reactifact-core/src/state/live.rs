//! The artifact state: a flat map of the artifacts, written in place by the commit while nothing
//! shares it (see [`Layered`]), and persistent indexes, so a snapshot is O(1).

use std::ops::Bound;
use std::sync::Arc;
use std::time::SystemTime;

use crate::model::artifact::{Artifact, ArtifactId, Kind, ReadError, Record, Stored};
use crate::model::hash::{self, SetDigest, StateHash};
use crate::model::relation::Relation;
use crate::model::timer::{self, Timer};
use crate::state::layered::{Keyed, Layered};
use crate::state::order::CreationOrder;

/// What merges and diffs read of a state: an artifact, a relation, an artifact's relations,
/// the state hash. Implemented by [`State`] and by a [`Rewound`] view of one.
pub(crate) trait StateView {
    fn get(&self, id: &str) -> Option<&Arc<Stored>>;
    fn has_relation(&self, relation: &Relation) -> bool;
    /// Every relation that starts or ends at `id`.
    fn relations_touching(&self, id: &ArtifactId) -> Vec<Relation>;
    fn state_hash(&self) -> StateHash;
}

/// A state that commits can be taken back off (see [`undo_commit`](crate::state::commit::undo_commit)).
pub(crate) trait Rewind: StateView {
    /// Sets the artifact stored under `id`, or removes it.
    fn put(&mut self, id: &ArtifactId, value: Option<Arc<Stored>>);
    /// Adds or removes a relation.
    fn set_relation(&mut self, relation: &Relation, present: bool);
}

/// An earlier state seen through a later one, without writing to it: the later state's
/// artifacts and relations except the ones set here. Taking a few commits back off a large
/// state this way costs what they changed, and touches none of the later state's structure
/// (writing to a clone of a persistent map copies every node on the way, each a cold cache line
/// in a large state).
#[derive(Clone)]
pub(crate) struct Rewound<'a> {
    later: &'a State,
    artifacts: std::collections::HashMap<ArtifactId, Option<Arc<Stored>>>,
    relations: std::collections::HashMap<Relation, bool>,
}

impl<'a> Rewound<'a> {
    /// `later` itself, before anything is taken back.
    pub(crate) fn new(later: &'a State) -> Self {
        Rewound {
            later,
            artifacts: Default::default(),
            relations: Default::default(),
        }
    }

    /// The view as a state of its own.
    pub(crate) fn to_state(&self) -> State {
        let mut state = self.later.clone();
        for (id, value) in &self.artifacts {
            state.put(id, value.clone());
        }
        for (relation, &present) in &self.relations {
            state.set_relation(relation, present);
        }
        state
    }
}

impl StateView for Rewound<'_> {
    fn get(&self, id: &str) -> Option<&Arc<Stored>> {
        match self.artifacts.get(id) {
            Some(value) => value.as_ref(),
            None => self.later.get(id),
        }
    }

    fn has_relation(&self, relation: &Relation) -> bool {
        match self.relations.get(relation) {
            Some(&present) => present,
            None => self.later.has_relation(relation),
        }
    }

    fn relations_touching(&self, id: &ArtifactId) -> Vec<Relation> {
        let mut touching: Vec<Relation> = self
            .later
            .relations_touching(id)
            .into_iter()
            .filter(|r| self.relations.get(r) != Some(&false))
            .collect();
        for (relation, &present) in &self.relations {
            if present && (relation.from == *id || relation.to == *id) && !self.later.has_relation(relation) {
                touching.push(relation.clone());
            }
        }
        touching
    }

    fn state_hash(&self) -> StateHash {
        let mut digest = self.later.digest;
        for (id, value) in &self.artifacts {
            if let Some(old) = self.later.get(id.as_str()) {
                digest.remove(&hash::artifact_entry(id.as_str(), old.kind.as_str(), &old.hash));
            }
            if let Some(new) = value {
                digest.add(&hash::artifact_entry(id.as_str(), new.kind.as_str(), &new.hash));
            }
        }
        for (relation, &present) in &self.relations {
            match (self.later.has_relation(relation), present) {
                (false, true) => digest.add(&relation.entry()),
                (true, false) => digest.remove(&relation.entry()),
                _ => {}
            }
        }
        digest.finish()
    }
}

impl Rewind for Rewound<'_> {
    fn put(&mut self, id: &ArtifactId, value: Option<Arc<Stored>>) {
        self.artifacts.insert(id.clone(), value);
    }

    fn set_relation(&mut self, relation: &Relation, present: bool) {
        self.relations.insert(relation.clone(), present);
    }
}

impl StateView for State {
    fn get(&self, id: &str) -> Option<&Arc<Stored>> {
        State::get(self, id)
    }

    fn has_relation(&self, relation: &Relation) -> bool {
        State::has_relation(self, relation)
    }

    fn relations_touching(&self, id: &ArtifactId) -> Vec<Relation> {
        State::relations_touching(self, id)
    }

    fn state_hash(&self) -> StateHash {
        State::state_hash(self)
    }
}

impl Rewind for State {
    fn put(&mut self, id: &ArtifactId, value: Option<Arc<Stored>>) {
        State::put(self, id, value);
    }

    fn set_relation(&mut self, relation: &Relation, present: bool) {
        State::set_relation(self, relation, present);
    }
}

/// A persistent hash map with a fast, per-process seeded hasher (ids are short strings and
/// SipHash showed up in profiles). Iteration order is never relied on.
type Map<K, V> = imbl::GenericHashMap<K, V, foldhash::fast::RandomState, imbl::shared_ptr::DefaultSharedPtr>;

/// Current artifacts and relations. `clone` costs O(1): the artifacts are a [`Layered`] map
/// (flat, written in place unless a clone is alive) and every index is persistent (a map, or
/// for the kinds a [`CreationOrder`]), copying only the path or chunk a write touches while a
/// clone is alive.
#[derive(Clone, Default)]
pub(crate) struct State {
    artifacts: Layered<ArtifactId, Arc<Stored>>,
    /// Per kind, ids in creation order (keyed by `Stored::created`).
    by_kind: Map<Kind, CreationOrder>,
    relations: imbl::OrdSet<Relation>,
    /// Relations with `from` and `to` swapped, to find and drop a deleted artifact's incoming
    /// relations without a scan.
    incoming: imbl::OrdSet<Relation>,
    digest: SetDigest,
    next_created: u64,
    /// The unfired timers (artifacts of kind `timer`) by due time, kept in step by
    /// [`put`](State::put): the runtime finds the due ones and the next one without a scan.
    timers: imbl::OrdSet<(SystemTime, ArtifactId)>,
}

impl Keyed for Arc<Stored> {
    type Key = ArtifactId;
    fn key(&self) -> &ArtifactId {
        &self.id
    }
}

/// How to undo one change to an artifact (16 bytes: a large commit keeps one per write until
/// it is done). A relation's change is undone from the relation and whether it was there.
pub(crate) enum Undo {
    /// The change created this artifact: take it off.
    Created(Arc<Stored>),
    /// The change replaced or deleted this artifact: put it back.
    Replaced(Arc<Stored>),
}

impl Undo {
    /// The id changed.
    pub(crate) fn id(&self) -> &ArtifactId {
        match self {
            Undo::Created(stored) | Undo::Replaced(stored) => &stored.id,
        }
    }
}

impl State {
    pub(crate) fn get(&self, id: &str) -> Option<&Arc<Stored>> {
        self.artifacts.get(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.artifacts.len()
    }

    pub(crate) fn state_hash(&self) -> StateHash {
        self.digest.finish()
    }

    /// Takes the next position in creation order.
    pub(crate) fn next_created(&mut self) -> u64 {
        let n = self.next_created;
        self.next_created += 1;
        n
    }

    pub(crate) fn created_counter(&self) -> u64 {
        self.next_created
    }

    pub(crate) fn reset_created_counter(&mut self, value: u64) {
        self.next_created = value;
    }

    /// Makes room for `additional` more artifacts (see [`Layered::reserve`]).
    pub(crate) fn reserve(&mut self, additional: usize) {
        self.artifacts.reserve(additional);
    }

    /// Sets the artifact stored under `id` (or removes it) and returns what was there.
    /// Keeps the kind index and the state digest in step.
    pub(crate) fn put(&mut self, id: &ArtifactId, value: Option<Arc<Stored>>) -> Option<Arc<Stored>> {
        // What the indexes need of the new version is taken before it moves into the table,
        // so the put clones neither it nor its id.
        let timer = Kind::of::<Timer>();
        let (new, new_timer) = match &value {
            Some(new) => {
                self.digest
                    .add(&hash::artifact_entry(id.as_str(), new.kind.as_str(), &new.hash));
                let due = (new.kind == timer).then(|| timer::pending_at(&new.bytes)).flatten();
                (Some((new.kind, new.created)), due)
            }
            None => (None, None),
        };
        let old = self.artifacts.set(id, value);
        if let Some(old) = &old {
            self.digest
                .remove(&hash::artifact_entry(id.as_str(), old.kind.as_str(), &old.hash));
            if let Some(at) = (old.kind == timer).then(|| timer::pending_at(&old.bytes)).flatten() {
                self.timers.remove(&(at, id.clone()));
            }
        }
        if let Some(at) = new_timer {
            self.timers.insert((at, id.clone()));
        }
        let moved = match (&old, new) {
            (Some(old), Some((kind, created))) => old.created != created || old.kind != kind,
            _ => true,
        };
        if moved {
            if let Some(old) = &old {
                self.unindex(old);
            }
            if let Some((kind, created)) = new {
                self.by_kind.entry(kind).or_default().insert(created, id.clone());
            }
        }
        old
    }

    fn unindex(&mut self, old: &Stored) {
        if let Some(ids) = self.by_kind.get_mut(&old.kind) {
            ids.remove(old.created);
        }
    }

    pub(crate) fn has_relation(&self, relation: &Relation) -> bool {
        self.relations.contains(relation)
    }

    /// The unfired timers due at or before `now`, earliest first (ties in id order):
    /// O(log n + due).
    pub(crate) fn timers_due(&self, now: SystemTime) -> impl Iterator<Item = &ArtifactId> + '_ {
        self.timers
            .iter()
            .take_while(move |(at, _)| *at <= now)
            .map(|(_, id)| id)
    }

    /// When the earliest unfired timer is due; `None` without one.
    pub(crate) fn next_timer(&self) -> Option<SystemTime> {
        self.timers.get_min().map(|(at, _)| *at)
    }

    /// How many timers have not fired.
    pub(crate) fn pending_timers(&self) -> usize {
        self.timers.len()
    }

    /// Adds or removes a relation and returns whether it was present.
    pub(crate) fn set_relation(&mut self, relation: &Relation, present: bool) -> bool {
        let was = self.relations.contains(relation);
        if was != present {
            if present {
                self.relations.insert(relation.clone());
                self.incoming.insert(relation.reversed());
                self.digest.add(&relation.entry());
            } else {
                self.relations.remove(relation);
                self.incoming.remove(&relation.reversed());
                self.digest.remove(&relation.entry());
            }
        }
        was
    }

    /// Every relation that starts or ends at `id`.
    pub(crate) fn relations_touching(&self, id: &ArtifactId) -> Vec<Relation> {
        let outgoing = range_from(&self.relations, id, None).cloned();
        let incoming = range_from(&self.incoming, id, None).map(Relation::reversed);
        outgoing.chain(incoming).collect()
    }

    pub(crate) fn undo(&mut self, undo: Undo) {
        match undo {
            Undo::Created(created) => {
                self.put(&created.id, None);
            }
            Undo::Replaced(previous) => {
                let id = previous.id.clone();
                self.put(&id, Some(previous));
            }
        }
    }

    pub(crate) fn read<T: Artifact>(&self, id: &str) -> Result<Option<Record<T>>, ReadError> {
        self.artifacts.get(id).map(|s| s.decode()).transpose()
    }

    pub(crate) fn ids_of_kind(&self, kind: Kind) -> impl Iterator<Item = &ArtifactId> + '_ {
        self.by_kind.get(&kind).into_iter().flat_map(CreationOrder::ids)
    }

    pub(crate) fn list<T: Artifact>(&self) -> impl Iterator<Item = Result<Record<T>, ReadError>> + '_ {
        self.ids_of_kind(Kind::of::<T>()).map(move |id| {
            self.artifacts
                .get(id)
                .expect("kind index names a stored artifact")
                .decode()
        })
    }

    pub(crate) fn count_of_kind(&self, kind: Kind) -> usize {
        self.by_kind.get(&kind).map_or(0, |ids| ids.len())
    }

    pub(crate) fn related<'a>(
        &'a self,
        from: &'a ArtifactId,
        name: &'a str,
    ) -> impl Iterator<Item = &'a ArtifactId> + 'a {
        range_from(&self.relations, from, Some(name)).map(|r| &r.to)
    }

    pub(crate) fn relations(&self) -> impl Iterator<Item = &Relation> + '_ {
        self.relations.iter()
    }

    /// Every artifact, in no particular order (for a checkpoint's encoding).
    pub(crate) fn artifacts(&self) -> impl Iterator<Item = &Arc<Stored>> + '_ {
        self.artifacts.values()
    }

    /// The state with these artifacts and relations, taking creation positions from
    /// `next_created` on (a checkpoint's decoding). Builds the kind index and the digest as
    /// the writes that made them did.
    pub(crate) fn from_parts(
        artifacts: impl IntoIterator<Item = Stored>,
        relations: impl IntoIterator<Item = Relation>,
        next_created: u64,
    ) -> State {
        let mut state = State::default();
        for stored in artifacts {
            let id = stored.id.clone();
            state.put(&id, Some(Arc::new(stored)));
        }
        for relation in relations {
            state.set_relation(&relation, true);
        }
        state.next_created = next_created;
        state
    }

    /// The first difference between two states in anything the live state keeps (artifacts
    /// with every field, relations, the creation counter), in words; `None` if they are the
    /// same.
    pub(crate) fn difference(&self, other: &State) -> Option<String> {
        if self.next_created != other.next_created {
            return Some(format!(
                "its creation counter is {}, not {}",
                self.next_created, other.next_created
            ));
        }
        if self.artifacts.len() != other.artifacts.len() {
            return Some(format!(
                "it holds {} artifacts, not {}",
                self.artifacts.len(),
                other.artifacts.len()
            ));
        }
        for (id, ours) in self.artifacts.iter() {
            let Some(theirs) = other.artifacts.get(id) else {
                return Some(format!("it holds `{id}`, which the log does not"));
            };
            let same = ours.kind == theirs.kind
                && ours.version == theirs.version
                && ours.hash == theirs.hash
                && ours.generation == theirs.generation
                && ours.created == theirs.created
                && ours.bytes == theirs.bytes;
            if !same {
                return Some(format!("`{id}` differs from the log's"));
            }
        }
        if self.relations != other.relations {
            return Some("its relations differ from the log's".to_owned());
        }
        None
    }
}

/// The relations in `set` whose `from` is `from` (and whose name is `name`, if given), found by
/// a range query: O(log n + matches).
fn range_from<'a>(
    set: &'a imbl::OrdSet<Relation>,
    from: &'a ArtifactId,
    name: Option<&'a str>,
) -> impl Iterator<Item = &'a Relation> + 'a {
    let lower = Relation {
        from: from.clone(),
        name: Arc::from(name.unwrap_or("")),
        to: ArtifactId::from(""),
    };
    set.range((Bound::Included(lower), Bound::Unbounded))
        .take_while(move |r| &r.from == from && name.is_none_or(|n| &*r.name == n))
}
