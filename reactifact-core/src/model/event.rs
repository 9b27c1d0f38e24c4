//! Events: derived from committed changes, queued FIFO, consumed by generations.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::artifact::{ArtifactId, Generation, Kind, Stored, Version};

/// What happened to an artifact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// The artifact was created.
    Created,
    /// Its content changed (a write with equal content emits nothing).
    Updated,
    /// It was deleted. Only produces that react to deletions (`on = [deleted]`,
    /// [`Produce::on`](crate::Produce::on)) run on it; they receive the last version as their
    /// trigger.
    Deleted,
    /// Never queued: what a staleness rerun receives in
    /// [`ProduceCall::event`](crate::ProduceCall::event). An artifact that the produce's newest
    /// run on this trigger read has changed since that run (see
    /// [`Produce::stale`](crate::Produce::stale)); the trigger is its current version.
    Stale,
}

impl EventKind {
    /// Every kind, in declaration order.
    pub(crate) const ALL: [EventKind; 4] = [
        EventKind::Created,
        EventKind::Updated,
        EventKind::Deleted,
        EventKind::Stale,
    ];

    /// The kind a run's record can leave out: `Created` for version 1, `Updated` after it.
    pub(crate) fn is_inferred(&self) -> bool {
        matches!(self, EventKind::Created | EventKind::Updated)
    }

    /// The kind a run on `version` received when its record leaves the kind out.
    pub(crate) fn inferred(version: Version) -> EventKind {
        if version == Version::FIRST {
            EventKind::Created
        } else {
            EventKind::Updated
        }
    }

    /// The lowercase name, as `#[produce(.., on = [..])]` spells it.
    pub fn as_str(&self) -> &'static str {
        match self {
            EventKind::Created => "created",
            EventKind::Updated => "updated",
            EventKind::Deleted => "deleted",
            EventKind::Stale => "stale",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of event kinds: which a produce reacts to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EventKinds(u8);

impl EventKinds {
    /// Created and updated: what a produce reacts to unless told otherwise.
    pub(crate) const DEFAULT: EventKinds =
        EventKinds((1 << EventKind::Created as u8) | (1 << EventKind::Updated as u8));

    pub(crate) const EMPTY: EventKinds = EventKinds(0);

    pub(crate) fn contains(self, kind: EventKind) -> bool {
        self.0 & kind.bit() != 0
    }

    pub(crate) fn with(self, kind: EventKind) -> EventKinds {
        EventKinds(self.0 | kind.bit())
    }

    /// The kinds in the set, in declaration order.
    pub(crate) fn iter(self) -> impl Iterator<Item = EventKind> {
        EventKind::ALL.into_iter().filter(move |k| self.contains(*k))
    }
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

/// An event as a commit emits it and the queue keeps it, with its position in the session's
/// sequence; for a deletion, with the artifact deleted (the trigger of the produces that react
/// to deletions).
#[derive(Clone, Debug)]
pub(crate) struct QueuedEvent {
    pub(crate) seq: u64,
    pub(crate) event: Event,
    /// For a deletion, the artifact as it was before it; `None` otherwise.
    pub(crate) deleted: Option<Arc<Stored>>,
}
