//! Read-only views of a context's state.

use std::sync::Arc;

use crate::model::artifact::{Artifact, ArtifactId, Kind, ReadError, Record, Stored, Version};
use crate::model::hash::{ContentHash, StateHash};
use crate::model::relation::Relation;
use crate::state::live::State;

/// An immutable view of a context's artifacts and relations at one point in time.
///
/// Taking a snapshot costs O(1): it shares structure with the live state. Every produce of a
/// generation reads the same snapshot, taken before the generation, so no produce sees a
/// sibling's writes. Reads decode only the artifacts they return.
///
/// The snapshot a produce receives in its [`ProduceCall`](crate::ProduceCall) records what
/// the run reads — the id and version seen by [`get`](Snapshot::get),
/// [`contains`](Snapshot::contains), [`meta`](Snapshot::meta), and every item
/// [`list`](Snapshot::list) and [`ids`](Snapshot::ids) yield — into the run's
/// [`RunRecord::reads`](crate::RunRecord::reads). Counts and relation queries are not recorded.
#[derive(Clone)]
pub struct Snapshot {
    pub(crate) state: Arc<State>,
    /// Where reads are recorded: the produce run's buffer, or `None` for an untracked view.
    reads: Option<Arc<dyn ReadLog>>,
}

/// Where a tracked snapshot records what it reads: a produce run's effects buffer
/// (`run/effects.rs`).
pub(crate) trait ReadLog: Send + Sync {
    /// `id` was read at `version` (`None`: it was absent).
    fn record_read(&self, id: ArtifactId, version: Option<Version>);
}

impl Snapshot {
    pub(crate) fn new(state: State) -> Self {
        Self::shared(Arc::new(state))
    }

    /// A view of a state shared with its context.
    pub(crate) fn shared(state: Arc<State>) -> Self {
        Snapshot { state, reads: None }
    }

    /// The same view, recording its reads (and those of its clones) into `reads`.
    pub(crate) fn tracked(&self, reads: Arc<dyn ReadLog>) -> Self {
        Snapshot {
            state: self.state.clone(),
            reads: Some(reads),
        }
    }

    #[inline]
    fn track(&self, id: &str, stored: Option<&Arc<Stored>>) {
        if let Some(reads) = &self.reads {
            let (id, version) = match stored {
                Some(stored) => (stored.id.clone(), Some(stored.version)),
                None => (ArtifactId::from(id), None),
            };
            reads.record_read(id, version);
        }
    }

    /// Reads the artifact stored under `id` as a `T`; `Ok(None)` if there is none.
    ///
    /// # Errors
    /// [`ReadError::WrongKind`] if the id holds another kind, [`ReadError::Decode`] if its bytes
    /// do not decode as `T`.
    pub fn get<T: Artifact>(&self, id: &str) -> Result<Option<Record<T>>, ReadError> {
        let stored = self.state.get(id);
        self.track(id, stored);
        stored.map(|s| s.decode()).transpose()
    }

    /// Whether an artifact is stored under `id`.
    pub fn contains(&self, id: &str) -> bool {
        let stored = self.state.get(id);
        self.track(id, stored);
        stored.is_some()
    }

    /// The kind, version and content hash stored under `id`, without decoding it.
    pub fn meta(&self, id: &str) -> Option<(Kind, Version, ContentHash)> {
        let stored = self.state.get(id);
        self.track(id, stored);
        stored.map(|s| (s.kind, s.version, s.hash))
    }

    /// Every artifact of type `T`, in creation order, decoded one at a time.
    pub fn list<T: Artifact>(&self) -> impl Iterator<Item = Result<Record<T>, ReadError>> + '_ {
        self.state.ids_of_kind(Kind::of::<T>()).map(move |id| {
            let stored = self.state.get(id.as_str());
            self.track(id.as_str(), stored);
            stored.expect("kind index names a stored artifact").decode()
        })
    }

    /// The ids of every artifact of type `T`, in creation order, without decoding anything.
    pub fn ids<T: Artifact>(&self) -> impl Iterator<Item = &ArtifactId> + '_ {
        self.state.ids_of_kind(Kind::of::<T>()).inspect(move |id| {
            if self.reads.is_some() {
                self.track(id.as_str(), self.state.get(id.as_str()));
            }
        })
    }

    /// How many artifacts of type `T` exist.
    pub fn count<T: Artifact>(&self) -> usize {
        self.state.count_of_kind(Kind::of::<T>())
    }

    /// How many artifacts exist.
    pub fn len(&self) -> usize {
        self.state.len()
    }

    /// Whether no artifact exists.
    pub fn is_empty(&self) -> bool {
        self.state.len() == 0
    }

    /// The targets of relations `from -[name]-> *`, in id order.
    pub fn related<'a>(&'a self, from: &'a ArtifactId, name: &'a str) -> impl Iterator<Item = &'a ArtifactId> + 'a {
        self.state.related(from, name)
    }

    /// Whether the relation exists.
    pub fn has_relation(&self, relation: &Relation) -> bool {
        self.state.has_relation(relation)
    }

    /// Every relation, ordered by (from, name, to).
    pub fn relations(&self) -> impl Iterator<Item = &Relation> + '_ {
        self.state.relations()
    }

    /// The deterministic digest of every artifact and relation in this snapshot.
    pub fn state_hash(&self) -> StateHash {
        self.state.state_hash()
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("artifacts", &self.state.len())
            .field("state_hash", &self.state.state_hash())
            .finish()
    }
}
