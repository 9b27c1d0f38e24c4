//! Read-only views of a context's state.

use crate::artifact::{Artifact, ArtifactId, Kind, Record, Version};
use crate::error::ReadError;
use crate::hash::{ContentHash, StateHash};
use crate::state::{Relation, State};

/// An immutable view of a context's artifacts and relations at one point in time.
///
/// Taking a snapshot costs O(1): it shares structure with the live state. Every produce of a
/// generation reads the same snapshot, taken before the generation, so no produce sees a
/// sibling's writes. Reads decode only the artifacts they return.
#[derive(Clone)]
pub struct Snapshot {
    pub(crate) state: State,
}

impl Snapshot {
    pub(crate) fn new(state: State) -> Self {
        Snapshot { state }
    }

    /// Reads the artifact stored under `id` as a `T`; `Ok(None)` if there is none.
    ///
    /// # Errors
    /// [`ReadError::WrongKind`] if the id holds another kind, [`ReadError::Decode`] if its bytes
    /// do not decode as `T`.
    pub fn get<T: Artifact>(&self, id: &str) -> Result<Option<Record<T>>, ReadError> {
        self.state.read(id)
    }

    /// Whether an artifact is stored under `id`.
    pub fn contains(&self, id: &str) -> bool {
        self.state.get(id).is_some()
    }

    /// The kind, version and content hash stored under `id`, without decoding it.
    pub fn meta(&self, id: &str) -> Option<(Kind, Version, ContentHash)> {
        self.state.get(id).map(|s| (s.kind, s.version, s.hash))
    }

    /// Every artifact of type `T`, in creation order, decoded one at a time.
    pub fn list<T: Artifact>(&self) -> impl Iterator<Item = Result<Record<T>, ReadError>> + '_ {
        self.state.list()
    }

    /// The ids of every artifact of type `T`, in creation order, without decoding anything.
    pub fn ids<T: Artifact>(&self) -> impl Iterator<Item = &ArtifactId> + '_ {
        self.state.ids_of_kind(Kind::of::<T>())
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
