//! Matching: which produce runs a generation's events call for.
//!
//! For each queued event, oldest first, the produces registered for its artifact kind that
//! react to its event kind, whose condition holds, on the trigger the event names: for a
//! creation or an update, the artifact as it is in the snapshot, if it is still the version the
//! event announced; for a deletion, the version deleted, if the artifact is still absent. The
//! cost is a hash lookup per event and the work it matches, never a scan of the state.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use foldhash::HashMap;

use crate::model::artifact::{ArtifactId, Kind, Stored};
use crate::model::event::{Event, EventKind, QueuedEvent};
use crate::run::generation::{panic_message, Slot};
use crate::run::produce::Agent;
use crate::run::runtime::Runtime;
use crate::state::snapshot::Snapshot;

/// One produce run to execute.
pub(crate) struct Work {
    pub(crate) slot: Slot,
    pub(crate) trigger: Arc<Stored>,
    pub(crate) event: EventKind,
    /// The produce's condition panicked on this trigger, with this message: the run fails
    /// with it instead of running.
    pub(crate) condition_panicked: Option<String>,
}

/// The events a generation takes and the work they match.
pub(crate) struct Batch {
    pub(crate) events: usize,
    pub(crate) work: Vec<Work>,
}

/// Matches queued events, oldest first, to produces. Takes whole events only: an event is
/// consumed exactly when all of its work commits, so it never needs partial bookkeeping.
/// Stops before the first event whose work would exceed `remaining_runs`.
///
/// A debounced produce's work for a trigger it already has work for in the batch replaces that
/// work's trigger and event with the newer ones, in place, and counts no new run.
pub(crate) fn select(rt: &Runtime, snapshot: &Snapshot, remaining_runs: Option<u64>) -> Batch {
    let mut work: Vec<Work> = Vec::new();
    let mut events = 0;
    let mut matched = Vec::new();
    // Where a debounced produce's work for a trigger is, by (agent, produce, trigger id).
    let mut debounced: HashMap<(usize, usize, ArtifactId), usize> = HashMap::default();
    for queued in rt.context.queued() {
        matched.clear();
        match_event(rt, snapshot, queued, &mut matched);
        let placed: Vec<Option<usize>> = matched
            .iter()
            .map(|w| {
                let produce = &rt.agents[w.slot.agent].produces[w.slot.produce];
                if produce.is_debounced() {
                    debounced
                        .get(&(w.slot.agent, w.slot.produce, w.trigger.id.clone()))
                        .copied()
                } else {
                    None
                }
            })
            .collect();
        let new_runs = placed.iter().filter(|p| p.is_none()).count();
        if remaining_runs.is_some_and(|max| (work.len() + new_runs) as u64 > max) {
            break;
        }
        for (w, place) in matched.drain(..).zip(placed) {
            match place {
                Some(i) => work[i] = w,
                None => {
                    if rt.agents[w.slot.agent].produces[w.slot.produce].is_debounced() {
                        debounced.insert((w.slot.agent, w.slot.produce, w.trigger.id.clone()), work.len());
                    }
                    work.push(w);
                }
            }
        }
        events += 1;
    }
    if !rt.uniform_priority {
        // Agents are ranked by priority, so a stable sort by rank gives
        // (priority, event order, registration order).
        work.sort_by_key(|w| w.slot.agent);
    }
    Batch { events, work }
}

/// The trigger an event names, if it is still what the event announced: for a creation or an
/// update, the artifact in the snapshot at the version the event wrote (a later change of the
/// same artifact queued its own event, which triggers the runs instead); for a deletion, the
/// version deleted, while the artifact is absent (created again, its creation triggers them).
fn trigger_of(snapshot: &Snapshot, queued: &QueuedEvent) -> Option<Arc<Stored>> {
    let event = &queued.event;
    let current = snapshot.state.get(event.id.as_str());
    match event.kind {
        EventKind::Deleted => match current {
            Some(_) => None,
            None => queued.deleted.clone(),
        },
        EventKind::Created | EventKind::Updated => current
            .filter(|t| t.version == event.version && t.generation == event.generation)
            .cloned(),
    }
}

fn match_event(rt: &Runtime, snapshot: &Snapshot, queued: &QueuedEvent, work: &mut Vec<Work>) {
    let event = &queued.event;
    let Some(slots) = rt.triggers.get(&event.artifact_kind) else {
        return;
    };
    let produce = |slot: &Slot| &rt.agents[slot.agent].produces[slot.produce];
    if !slots.iter().any(|slot| produce(slot).reacts_to(event.kind)) {
        return;
    }
    let Some(trigger) = trigger_of(snapshot, queued) else {
        return;
    };
    for &slot in slots {
        let produce = produce(&slot);
        if !produce.reacts_to(event.kind) {
            continue;
        }
        // A condition is user code: one that panics fails its run (the generation, unless
        // runs are isolated), instead of unwinding through the runtime.
        let (applies, condition_panicked) =
            match std::panic::catch_unwind(AssertUnwindSafe(|| produce.applies(snapshot, &trigger))) {
                Ok(applies) => (applies, None),
                Err(panic) => (true, Some(panic_message(&panic))),
            };
        if applies {
            work.push(Work {
                slot,
                trigger: trigger.clone(),
                event: event.kind,
                condition_panicked,
            });
        }
    }
}

/// Whether a produce of the runtime may react to `event`: one registered for its artifact kind
/// reacts to its event kind. A commit consumes the events it emits that none reacts to.
pub(crate) fn reacts(agents: &[Agent], triggers: &HashMap<Kind, Vec<Slot>>, event: &Event) -> bool {
    triggers.get(&event.artifact_kind).is_some_and(|slots| {
        slots
            .iter()
            .any(|slot| agents[slot.agent].produces[slot.produce].reacts_to(event.kind))
    })
}
