//! Events: derived from committed changes, queued FIFO, consumed by generations.

use serde::{Deserialize, Serialize};

use crate::model::artifact::{ArtifactId, Generation, Kind, Version};

/// What happened to an artifact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// The artifact was created.
    Created,
    /// Its content changed (a write with equal content emits nothing).
    Updated,
    /// It was deleted. Deletions are queued and consumed like other events but trigger no
    /// produce: a produce's trigger must exist in the snapshot it reads.
    Deleted,
}

/// A committed change, queued for the next generation. Events are never authored by hand:
/// commits and direct writes emit them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The artifact it happened to.
    pub id: ArtifactId,
    /// The artifact's kind; produces whose trigger type has this kind react.
    pub artifact_kind: Kind,
    /// The version written (for a deletion, the version deleted).
    pub version: Version,
    /// The generation whose commit emitted the event.
    pub generation: Generation,
}

/// An event in the queue, with its position.
#[derive(Clone, Debug)]
pub(crate) struct QueuedEvent {
    pub(crate) seq: u64,
    pub(crate) event: Event,
}
