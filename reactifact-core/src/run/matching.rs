//! Matching: which produce runs a generation's events call for.
//!
//! For each queued event, oldest first, the produces registered for its artifact kind that
//! react to its event kind, whose condition holds, on the trigger the event names: for a
//! creation or an update, the artifact as it is in the snapshot, if it is still the version the
//! event announced; for a deletion, the version deleted, if the artifact is still absent. Then
//! the staleness reruns the event calls for: the watching runs that read its artifact (from the
//! context's readers index). Debounced and watching produces get at most one run per trigger
//! in the batch. The cost is a hash lookup or two per event and the work it matches, never a
//! scan of the state.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use foldhash::HashMap;

use crate::model::artifact::{ArtifactId, Generation, Kind, Stored};
use crate::model::event::{EventKind, QueuedEvent};
use crate::model::panic::panic_message;
use crate::model::parked::FailedRun;
use crate::model::timer::Timer;
use crate::run::generation::Slot;
use crate::run::join::{self, Parts};
use crate::run::produce::{Agent, Produce};
use crate::run::retries;
use crate::run::runtime::Runtime;
use crate::state::commit::Emitted;
use crate::state::readers::{ReaderKey, Readers};
use crate::state::snapshot::Snapshot;

/// One produce run to execute.
pub(crate) struct Work {
    pub(crate) slot: Slot,
    pub(crate) trigger: Arc<Stored>,
    pub(crate) event: EventKind,
    /// The produce's condition panicked on this trigger, with this message: the run fails
    /// with it instead of running.
    pub(crate) condition_panicked: Option<Box<str>>,
    /// For a join produce, the parts the run joins (set when the set is found complete).
    pub(crate) joined: Option<Parts>,
    /// The events of the batch the run covers, by position: the first and the last (a
    /// debounced run replaces the runs of earlier events; a run that makes another dropped
    /// covers its event too). A generation cut short commits the runs of a prefix of events.
    pub(crate) events: (usize, usize),
    /// For the run again of a run that failed (its retry timer fired), what failed; `None`
    /// for a first run.
    pub(crate) retry: Option<Box<FailedRun>>,
}

/// The events a generation takes and the work they match.
pub(crate) struct Batch {
    pub(crate) events: usize,
    pub(crate) work: Vec<Work>,
}

/// The produces that react to staleness, by (agent, produce) name: what the readers index
/// names them by. Empty, and free, when none does.
pub(crate) struct Watching(HashMap<(Arc<str>, Arc<str>), Slot>);

impl Watching {
    pub(crate) fn of(rt: &Runtime) -> Watching {
        let mut by_name = HashMap::default();
        for (a, agent) in rt.agents.iter().enumerate() {
            for (p, produce) in agent.produces.iter().enumerate() {
                if produce.reacts_to(EventKind::Stale) {
                    by_name.insert(
                        (agent.name.clone(), produce.name_arc().clone()),
                        Slot { agent: a, produce: p },
                    );
                }
            }
        }
        Watching(by_name)
    }

    fn slot(&self, key: &ReaderKey) -> Option<Slot> {
        if self.0.is_empty() {
            return None;
        }
        self.0.get(&(key.agent.clone(), key.produce.clone())).copied()
    }

    /// The watching runs an event makes stale: those that read its artifact and ran in the
    /// event's generation or before it (they read the state before their generation, so a
    /// change committed in it or later is one they did not see) — unless the run wrote the
    /// artifact itself, in its generation.
    fn stale<'a>(
        &'a self,
        readers: &'a Readers,
        id: &'a str,
        generation: Generation,
    ) -> impl Iterator<Item = (Slot, &'a ReaderKey)> + 'a {
        // Without a watching produce, the readers index is not looked at.
        let watched = (!self.0.is_empty()).then(|| readers.of(id));
        watched
            .into_iter()
            .flatten()
            .filter(move |(_, reader)| reader.is_stale_by(id, generation))
            .filter_map(|(key, _)| self.slot(key).map(|slot| (slot, key)))
    }
}

/// How to put back a run of the batch an event changed.
enum Undo {
    /// It was replaced; this is what it was.
    Replaced(Work),
    /// The events it covers were extended; these are the ones it covered.
    Extended((usize, usize)),
}

/// What a matched run does to the work of the batch so far.
enum Place {
    /// A run of its own.
    Push,
    /// It replaces the work at this index (a debounced produce's newer event, or an event that
    /// comes with a staleness rerun already scheduled).
    Replace(usize),
    /// It is already covered by the work at this index (a staleness rerun of a produce that
    /// runs on the trigger anyway, a join's second part).
    Drop(usize),
}

/// Matches queued events, oldest first, to produces. Takes whole events only: an event is
/// consumed exactly when all of its work commits, so it never needs partial bookkeeping.
/// Stops before the first event whose work would exceed `remaining_runs`.
///
/// Each event matches the produces that react to it (see [`match_event`]) and then the
/// staleness reruns it calls for: the watching runs that read its artifact. A produce that is
/// debounced or watches its reads has at most one run per trigger in the batch: a newer event's
/// run replaces the one scheduled, in place (a staleness rerun never replaces a run and is
/// dropped when one is scheduled), and counts no new run.
///
/// With `bounded_head` (a turn whose budget limits usage), the batch ends before an event whose
/// work would replace or extend a run of the first event: the first event's runs, which a spent
/// budget never refuses (see `generation.rs`), then cover that event alone.
///
/// It takes at most `max_events` events (a generation run again after writes overtook it
/// takes the events it took before).
pub(crate) fn select(
    rt: &Runtime,
    snapshot: &Snapshot,
    watching: &Watching,
    remaining_runs: Option<u64>,
    bounded_head: bool,
    max_events: usize,
) -> Batch {
    let mut work: Vec<Work> = Vec::new();
    let mut events = 0;
    let mut matched = Vec::new();
    // Where the work of a produce that is debounced or watches its reads is, by (agent,
    // produce, trigger id).
    let mut placed: HashMap<(usize, usize, ArtifactId), usize> = HashMap::default();
    let readers = rt.context.readers();
    for queued in rt.context.queued().take(max_events) {
        matched.clear();
        match_event(rt, snapshot, queued, &mut matched);
        for (slot, key) in watching.stale(readers, queued.event.id.as_str(), queued.event.generation) {
            if let Some(w) = rerun(rt, snapshot, slot, key) {
                matched.push(w);
            }
        }
        join::complete(rt, snapshot, &mut matched);
        // Applied in order with an undo log, so an event whose work exceeds the budget leaves
        // the batch as it was.
        let start = work.len();
        // How to put back the runs this event replaced or extended, in the order it did.
        let mut undo: Vec<(usize, Undo)> = Vec::new();
        let mut inserted: Vec<(usize, usize, ArtifactId)> = Vec::new();
        // The event's work would replace or extend a run of the first event (`bounded_head`).
        let mut reaches_head = false;
        for mut w in matched.drain(..) {
            w.events = (events, events);
            let produce = &rt.agents[w.slot.agent].produces[w.slot.produce];
            let single = produce.is_debounced() || produce.reacts_to(EventKind::Stale) || produce.is_join();
            if !single {
                work.push(w);
                continue;
            }
            let key = (w.slot.agent, w.slot.produce, w.trigger.id.clone());
            let place = match placed.get(&key) {
                None => Place::Push,
                Some(&i) if w.event == EventKind::Stale => Place::Drop(i),
                Some(&i) if produce.is_debounced() || work[i].event == EventKind::Stale => Place::Replace(i),
                // A join runs once per trigger per generation: the second part's event finds
                // the set the first one's did.
                Some(&i) if produce.is_join() => Place::Drop(i),
                Some(_) => Place::Push,
            };
            match place {
                Place::Push => {
                    if !placed.contains_key(&key) {
                        placed.insert(key.clone(), work.len());
                        inserted.push(key);
                    }
                    work.push(w);
                }
                Place::Replace(i) | Place::Drop(i) if bounded_head && events > 0 && work[i].events.0 == 0 => {
                    reaches_head = true;
                }
                Place::Replace(i) => {
                    w.events.0 = work[i].events.0;
                    let old = std::mem::replace(&mut work[i], w);
                    undo.push((i, Undo::Replaced(old)));
                }
                Place::Drop(i) => {
                    undo.push((i, Undo::Extended(work[i].events)));
                    work[i].events.1 = events;
                }
            }
        }
        if reaches_head || remaining_runs.is_some_and(|max| work.len() as u64 > max) {
            work.truncate(start);
            for (i, old) in undo.into_iter().rev().filter(|(i, _)| *i < start) {
                match old {
                    Undo::Replaced(old) => work[i] = old,
                    Undo::Extended(events) => work[i].events = events,
                }
            }
            for key in inserted {
                placed.remove(&key);
            }
            break;
        }
        events += 1;
    }
    if !rt.uniform_priority {
        // Agents are ranked by priority, so a stable sort by rank gives
        // (priority, event order, registration order).
        work.sort_by_key(|w| w.slot.agent);
    }
    // The batch lives through the generation's commit: no room left over from growing.
    work.shrink_to_fit();
    Batch { events, work }
}

/// The staleness rerun of a watching produce on its trigger, at the trigger's current version,
/// if the trigger exists and the produce's condition holds.
fn rerun(rt: &Runtime, snapshot: &Snapshot, slot: Slot, key: &ReaderKey) -> Option<Work> {
    let trigger = snapshot.state.get(key.trigger.as_str())?;
    let produce = &rt.agents[slot.agent].produces[slot.produce];
    if produce.trigger() != trigger.kind || !crate::run::timers::matches_fire(trigger) {
        return None;
    }
    let (applies, condition_panicked) = condition(produce, snapshot, trigger);
    applies.then(|| Work {
        slot,
        trigger: trigger.clone(),
        event: EventKind::Stale,
        condition_panicked,
        joined: None,
        events: (0, 0),
        retry: None,
    })
}

/// Whether the produce's condition holds on `trigger`; a condition that panics counts as
/// holding, with its message, so the run fails with it.
fn condition(produce: &Produce, snapshot: &Snapshot, trigger: &Arc<Stored>) -> (bool, Option<Box<str>>) {
    // A condition is user code: one that panics fails its run (the generation, unless runs
    // are isolated), instead of unwinding through the runtime.
    match std::panic::catch_unwind(AssertUnwindSafe(|| produce.applies(snapshot, trigger))) {
        Ok(applies) => (applies, None),
        Err(panic) => (true, Some(panic_message(&panic).into())),
    }
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
        // Never queued: staleness reruns are matched from the readers index.
        EventKind::Stale => None,
        EventKind::Created | EventKind::Updated => current
            .filter(|t| t.version == event.version && t.generation == event.generation)
            .cloned(),
    }
}

fn match_event(rt: &Runtime, snapshot: &Snapshot, queued: &QueuedEvent, work: &mut Vec<Work>) {
    let event = &queued.event;
    // A retry timer's fire runs the produce that failed again, on its trigger as it is now;
    // produces triggered by `Timer` never see it.
    if event.artifact_kind == Kind::of::<Timer>() && retries::is_retry_timer(event.id.as_str()) {
        // Only its fire, an update; not its scheduling or its deletion.
        let fire = (event.kind == EventKind::Updated)
            .then(|| trigger_of(snapshot, queued))
            .flatten();
        let due = fire.and_then(|timer| retries::due_retry(rt, snapshot, &timer));
        if let Some((slot, trigger, failed)) = due {
            let produce = &rt.agents[slot.agent].produces[slot.produce];
            let (applies, condition_panicked) = condition(produce, snapshot, &trigger);
            let joined = match produce.is_join() {
                true => rt.joins.parts(slot, &trigger, snapshot),
                false => None,
            };
            if applies && (joined.is_some() || !produce.is_join()) {
                work.push(Work {
                    slot,
                    trigger,
                    event: failed.event,
                    condition_panicked,
                    joined,
                    events: (0, 0),
                    retry: Some(Box::new(failed)),
                });
            }
        }
        return;
    }
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
    // A produce triggered by `Timer` reacts to its fire, never to its scheduling.
    if !crate::run::timers::matches_fire(&trigger) {
        return;
    }
    for &slot in slots {
        let produce = produce(&slot);
        if !produce.reacts_to(event.kind) {
            continue;
        }
        if produce.trigger() != event.artifact_kind {
            // A joined part: the run is on the triggers sharing its key.
            for joined in rt.joins.triggers_of(slot, &trigger, snapshot) {
                let (applies, condition_panicked) = condition(produce, snapshot, joined);
                if applies {
                    work.push(Work {
                        slot,
                        trigger: joined.clone(),
                        event: event.kind,
                        condition_panicked,
                        joined: None,
                        events: (0, 0),
                        retry: None,
                    });
                }
            }
            continue;
        }
        let (applies, condition_panicked) = condition(produce, snapshot, &trigger);
        if applies {
            work.push(Work {
                slot,
                trigger: trigger.clone(),
                event: event.kind,
                condition_panicked,
                joined: None,
                events: (0, 0),
                retry: None,
            });
        }
    }
}

/// Whether a produce of the runtime may react to `event`: one registered for its artifact kind
/// reacts to its event kind, or it makes a watching run stale. A commit consumes the events it
/// emits that none reacts to.
pub(crate) fn reacts(
    agents: &[Agent],
    triggers: &HashMap<Kind, Vec<Slot>>,
    watching: &Watching,
    event: &Emitted,
    generation: Generation,
    readers: &Readers,
) -> bool {
    let matched = triggers.get(&event.artifact_kind()).is_some_and(|slots| {
        slots
            .iter()
            .any(|slot| agents[slot.agent].produces[slot.produce].reacts_to(event.kind()))
    });
    // A retry timer's fire runs its produce again.
    let retry = event.kind() == EventKind::Updated
        && event.artifact_kind() == Kind::of::<Timer>()
        && retries::is_retry_timer(event.id().as_str());
    matched
        || retry
        || watching
            .stale(readers, event.id().as_str(), generation)
            .next()
            .is_some()
}
