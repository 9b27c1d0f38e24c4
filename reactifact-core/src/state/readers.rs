//! The readers index: for each artifact id, the produce runs that read it and want to be run
//! again when it changes (staleness, see `Produce::stale`).
//!
//! A run enters the index when its commit records it with
//! [`RunRecord::watches_reads`](crate::RunRecord::watches_reads); it is keyed by (agent,
//! produce, trigger id), so the newest run of a produce on a trigger replaces the one before it
//! and its reads. Keeping it costs what each commit's watching runs read, and a deletion drops
//! the runs on the deleted trigger. It is derived from the log alone — a refold rebuilds it —
//! and held in persistent maps, so a checkpoint takes it as an O(1) clone and stores it.

use std::sync::Arc;

use crate::model::artifact::{ArtifactId, Generation};
use crate::model::event::EventKind;
use crate::model::patch::Op;
use crate::state::commit::RunRecord;

type Map<K, V> = imbl::GenericHashMap<K, V, foldhash::fast::RandomState, imbl::shared_ptr::DefaultSharedPtr>;

/// A watching produce on one trigger.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ReaderKey {
    pub(crate) agent: Arc<str>,
    pub(crate) produce: Arc<str>,
    pub(crate) trigger: ArtifactId,
}

/// Its newest committed run: the generation it ran in (it read the state before it), the ids
/// it read, and those of them it wrote itself (its own writes do not make it stale).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reader {
    pub(crate) generation: Generation,
    pub(crate) reads: Arc<[ArtifactId]>,
    /// The ids among `reads` that the run's own patch writes, in `reads` order.
    pub(crate) wrote: Arc<[ArtifactId]>,
}

impl Reader {
    /// Whether a change of `id` committed in `generation` is one the run did not see and did
    /// not make: committed in the run's generation (by a sibling) or later.
    pub(crate) fn is_stale_by(&self, id: &str, generation: Generation) -> bool {
        generation > self.generation || (generation == self.generation && !self.wrote.iter().any(|w| w.as_str() == id))
    }
}

/// Which watching runs read which artifact.
#[derive(Clone, Default)]
pub(crate) struct Readers {
    runs: Map<ReaderKey, Reader>,
    /// The keys of the runs that read an id, in key order.
    by_read: Map<ArtifactId, imbl::OrdSet<ReaderKey>>,
    /// The keys of the runs on a trigger id.
    by_trigger: Map<ArtifactId, imbl::OrdSet<ReaderKey>>,
}

impl Readers {
    /// The watching runs that read `id`, in key order.
    pub(crate) fn of<'a>(&'a self, id: &str) -> impl Iterator<Item = (&'a ReaderKey, &'a Reader)> + 'a {
        self.by_read
            .get(id)
            .into_iter()
            .flat_map(|keys| keys.iter())
            .filter_map(|key| self.runs.get(key).map(|reader| (key, reader)))
    }

    /// Every run, in key order: for checkpoints and their verification.
    pub(crate) fn entries(&self) -> Vec<(&ReaderKey, &Reader)> {
        let mut entries: Vec<(&ReaderKey, &Reader)> = self.runs.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        entries
    }

    /// The index of `entries` (as [`entries`](Readers::entries) lists them).
    pub(crate) fn from_entries(entries: impl IntoIterator<Item = (ReaderKey, Reader)>) -> Readers {
        let mut readers = Readers::default();
        for (key, reader) in entries {
            readers.insert(key, reader);
        }
        readers
    }

    /// What commit `generation`, with `runs`, changes: each watching run replaces the one
    /// before it on its trigger (a run that read nothing leaves none), then every run on a
    /// trigger the commit deleted is dropped. A run on a deletion is not kept: its trigger is
    /// gone, so nothing can rerun it.
    pub(crate) fn record<'a>(
        &mut self,
        generation: Generation,
        runs: &[RunRecord],
        deleted: impl IntoIterator<Item = &'a ArtifactId>,
    ) {
        for run in runs {
            let (Some(agent), Some(produce), Some(trigger)) = (&run.agent, &run.produce, &run.trigger) else {
                continue;
            };
            if !run.watches_reads || trigger.event == EventKind::Deleted {
                continue;
            }
            let key = ReaderKey {
                agent: agent.clone(),
                produce: produce.clone(),
                trigger: trigger.id.clone(),
            };
            self.remove(&key);
            if !run.reads.is_empty() {
                let reads: Arc<[ArtifactId]> = run.reads.iter().map(|r| r.id.clone()).collect();
                let wrote: Arc<[ArtifactId]> = reads
                    .iter()
                    .filter(|id| {
                        run.ops
                            .iter()
                            .any(|op| !matches!(op, Op::Link(_) | Op::Unlink(_)) && op.id() == *id)
                    })
                    .cloned()
                    .collect();
                self.insert(
                    key,
                    Reader {
                        generation,
                        reads,
                        wrote,
                    },
                );
            }
        }
        for id in deleted {
            if let Some(keys) = self.by_trigger.get(id).cloned() {
                for key in keys {
                    self.remove(&key);
                }
            }
        }
    }

    fn insert(&mut self, key: ReaderKey, reader: Reader) {
        self.remove(&key);
        for id in reader.reads.iter() {
            self.by_read.entry(id.clone()).or_default().insert(key.clone());
        }
        self.by_trigger
            .entry(key.trigger.clone())
            .or_default()
            .insert(key.clone());
        self.runs.insert(key, reader);
    }

    fn remove(&mut self, key: &ReaderKey) {
        let Some(old) = self.runs.remove(key) else {
            return;
        };
        for id in old.reads.iter() {
            if let Some(keys) = self.by_read.get_mut(id) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_read.remove(id);
                }
            }
        }
        if let Some(keys) = self.by_trigger.get_mut(&key.trigger) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_trigger.remove(&key.trigger);
            }
        }
    }

    /// What differs from `other`, in words; `None` if they hold the same runs.
    pub(crate) fn difference(&self, other: &Readers) -> Option<String> {
        if self.runs.len() != other.runs.len() {
            return Some(format!(
                "it holds {} watching runs, the log {}",
                self.runs.len(),
                other.runs.len()
            ));
        }
        for (key, reader) in self.entries() {
            if other.runs.get(key) != Some(reader) {
                return Some(format!(
                    "its watching run of {}/{} on `{}` is not the log's",
                    key.agent, key.produce, key.trigger
                ));
            }
        }
        None
    }
}

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readers").field("runs", &self.runs.len()).finish()
    }
}
