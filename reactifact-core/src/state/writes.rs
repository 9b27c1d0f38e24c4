//! A batch of direct writes, built apart from the context that commits it: what a
//! [`Transaction`](crate::Transaction) fills, and what a [`RuntimeHandle`](crate::RuntimeHandle)
//! sends to a serving runtime.

use crate::model::artifact::{Artifact, ArtifactId};
use crate::model::patch::{EffectError, Op, PutMode};
use crate::model::relation::Relation;

/// Direct writes that commit together, as one generation, or not at all: build them with
/// [`create`](Writes::create) and friends, then send them with
/// [`RuntimeHandle::write`](crate::RuntimeHandle::write) (or
/// [`try_write`](crate::RuntimeHandle::try_write)).
///
/// A value that does not encode, or a [`PendingAction`](crate::PendingAction) written directly,
/// makes the whole batch refused with [`WriteError::Effect`](crate::WriteError::Effect) when it
/// is sent, before anything reaches the runtime.
///
/// ```
/// use reactifact_core::{Artifact, Writes};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Order { total_cents: u64 }
/// impl Artifact for Order { const KIND: &'static str = "order"; }
///
/// let mut writes = Writes::new();
/// writes
///     .create_once("order:1", Order { total_cents: 1200 })
///     .link("order:1", "placed_by", "customer:ada");
/// assert_eq!(writes.len(), 2);
/// ```
#[derive(Default)]
#[must_use = "writes do nothing until they are sent"]
pub struct Writes {
    pub(crate) ops: Vec<Op>,
    pub(crate) error: Option<EffectError>,
}

impl Writes {
    /// No writes yet.
    pub fn new() -> Self {
        Writes::default()
    }

    fn push(&mut self, op: Result<Op, EffectError>) -> &mut Self {
        match op {
            Ok(op) => self.ops.push(op),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
        self
    }

    /// Creates `value` at `id`, or refreshes it if it exists (a new version only if its
    /// content differs).
    pub fn create<T: Artifact>(&mut self, id: impl Into<ArtifactId>, value: T) -> &mut Self {
        let op = Op::put(PutMode::Create, id.into(), &value);
        self.push(op)
    }

    /// Creates `value` at `id` only if the id does not exist when the writes commit;
    /// otherwise this write is skipped (the others still apply).
    pub fn create_once<T: Artifact>(&mut self, id: impl Into<ArtifactId>, value: T) -> &mut Self {
        let op = Op::put(PutMode::CreateOnce, id.into(), &value);
        self.push(op)
    }

    /// Replaces the artifact at `id`, which must exist.
    pub fn update<T: Artifact>(&mut self, id: impl Into<ArtifactId>, value: T) -> &mut Self {
        let op = Op::put(PutMode::Update, id.into(), &value);
        self.push(op)
    }

    /// Deletes the artifact at `id` and its relations.
    pub fn delete(&mut self, id: impl Into<ArtifactId>) -> &mut Self {
        self.push(Ok(Op::Delete { id: id.into() }))
    }

    /// Adds the relation `from -[name]-> to`.
    pub fn link(&mut self, from: impl Into<ArtifactId>, name: &str, to: impl Into<ArtifactId>) -> &mut Self {
        self.push(Ok(Op::Link(Relation::new(from, name, to))))
    }

    /// Removes the relation `from -[name]-> to`.
    pub fn unlink(&mut self, from: impl Into<ArtifactId>, name: &str, to: impl Into<ArtifactId>) -> &mut Self {
        self.push(Ok(Op::Unlink(Relation::new(from, name, to))))
    }

    /// How many writes there are.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The operations, or the first write that could not be built.
    pub(crate) fn into_ops(self) -> Result<Vec<Op>, EffectError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.ops),
        }
    }
}

impl std::fmt::Debug for Writes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writes")
            .field("ops", &self.ops.iter().map(Op::id).collect::<Vec<_>>())
            .field("error", &self.error)
            .finish()
    }
}
