//! A context's commit log: the commits it holds in memory and, for a context opened from a
//! checkpoint, the older ones, which stay in its store until something asks for them.
//!
//! A context opened from a checkpoint at commit G holds the state right after G (the
//! checkpoint's, [`Base`]) and the commits after it. What needs only those — the head, new
//! commits, time travel and forks at G or later — never reads the older commits. What needs
//! the whole log ([`Log::whole`]: [`Context::log`](crate::Context::log), verification,
//! export, replay, provenance, merges and diffs, time travel before G) reads it from the store
//! once, refolds it (checking parent links and state hashes, as an open without a checkpoint
//! does), checks that it leads to G's commit, and keeps it, with the graph of it, for the
//! context's life. The next commit then takes the whole log as the one it holds.

use std::sync::{Arc, OnceLock};

use crate::model::artifact::Generation;
use crate::model::hash::CommitHash;
use crate::state::commit::Commit;
use crate::state::graph::Graph;
use crate::state::live::State;
use crate::state::refold::{Checks, Refold, VerifyError};

/// Reads a session's commits before a generation, and the other sessions' commits their
/// merges reach: the store's `load_before`, as the whole-log reads hand it in.
pub(crate) type LoadBefore<'a> = &'a dyn Fn(Generation, &[Commit]) -> Result<(Vec<Commit>, Vec<Commit>), VerifyError>;

/// Where the commits a log holds start: the state right after commit `generation`.
pub(crate) struct Base {
    pub(crate) generation: Generation,
    pub(crate) hash: CommitHash,
    pub(crate) state: State,
    /// The number the first event after it gets.
    pub(crate) next_event_seq: u64,
    /// The readers index after it.
    pub(crate) readers: crate::state::readers::Readers,
}

/// The whole log, read from the store, and the graph of it.
struct Whole {
    commits: Vec<Commit>,
    graph: Graph,
}

/// A context's commit log (see the module docs). Cloning it is O(held commits), a shallow
/// copy of each (a commit's runs are shared, see [`Runs`](crate::Runs)).
#[derive(Default)]
pub(crate) struct Log {
    /// `None`: the log holds every commit.
    base: Option<Arc<Base>>,
    /// The commits after the base (every commit, without one), oldest first.
    held: Vec<Commit>,
    /// The whole log, once read.
    whole: OnceLock<Arc<Whole>>,
}

impl Clone for Log {
    /// With room for as many commits again, so the clone's next commits (a fork's) do not
    /// copy the log a second time.
    fn clone(&self) -> Self {
        let mut held = Vec::with_capacity(self.held.len() * 2);
        held.extend_from_slice(&self.held);
        Log {
            base: self.base.clone(),
            held,
            whole: self.whole.clone(),
        }
    }
}

impl Log {
    /// A log holding every commit.
    pub(crate) fn new(commits: Vec<Commit>) -> Log {
        Log {
            base: None,
            held: commits,
            whole: OnceLock::new(),
        }
    }

    /// A log starting after a checkpoint, holding the commits after it.
    pub(crate) fn from_checkpoint(base: Base, commits: Vec<Commit>) -> Log {
        Log {
            base: Some(Arc::new(base)),
            held: commits,
            whole: OnceLock::new(),
        }
    }

    /// Where the held commits start, if not at the first commit.
    pub(crate) fn base(&self) -> Option<&Base> {
        self.base.as_deref()
    }

    /// The generation before the first held commit (0 without a base).
    pub(crate) fn base_generation(&self) -> Generation {
        self.base.as_ref().map_or(Generation(0), |b| b.generation)
    }

    /// How many commits the log has (the head's generation).
    pub(crate) fn len(&self) -> u64 {
        self.base_generation().0 + self.held.len() as u64
    }

    /// The hash of the last commit, `None` before the first.
    pub(crate) fn head(&self) -> Option<CommitHash> {
        self.held.last().map(|c| c.hash).or(self.base.as_ref().map(|b| b.hash))
    }

    /// The commits after the base, oldest first.
    pub(crate) fn held(&self) -> &[Commit] {
        &self.held
    }

    /// The held commit `generation`, if it is held.
    pub(crate) fn held_at(&self, generation: Generation) -> Option<&Commit> {
        let at = generation.0.checked_sub(self.base_generation().0 + 1)?;
        self.held.get(usize::try_from(at).ok()?)
    }

    /// Appends a commit. The whole log, if it was read, must have been taken in first
    /// ([`settle`](Log::settle)).
    pub(crate) fn push(&mut self, commit: Commit) {
        debug_assert!(self.whole.get().is_none(), "settle the log before writing to it");
        self.held.push(commit);
    }

    /// The log cut after commit `end`, which is the base's or a held one's.
    pub(crate) fn truncated(&self, end: Generation) -> Log {
        let keep = usize::try_from(end.0 - self.base_generation().0).unwrap_or(usize::MAX);
        Log {
            base: self.base.clone(),
            held: self.held[..keep.min(self.held.len())].to_vec(),
            whole: OnceLock::new(),
        }
    }

    /// If the whole log was read, makes it the held one and returns its graph, for the
    /// context to take into its own (before a write).
    pub(crate) fn settle(&mut self) -> Option<Graph> {
        let whole = self.whole.take()?;
        let whole = Arc::try_unwrap(whole).unwrap_or_else(|shared| Whole {
            commits: shared.commits.clone(),
            graph: shared.graph.clone(),
        });
        self.base = None;
        self.held = whole.commits;
        Some(whole.graph)
    }

    /// The whole log and the graph of it; `graph` is the graph of the held commits. Without a
    /// base, that is the held log; otherwise the older commits are read with `load` (once:
    /// the commits before a generation, and the other sessions' commits the merges of those
    /// and of the held ones reach), refolded and checked against the base.
    ///
    /// # Errors
    /// [`VerifyError::History`] if the older commits cannot be read or do not lead to the
    /// base's commit; the error of the refold if one of them does not check out.
    pub(crate) fn whole<'a>(
        &'a self,
        load: Option<LoadBefore<'_>>,
        graph: &'a Graph,
    ) -> Result<(&'a [Commit], &'a Graph), VerifyError> {
        let Some(base) = &self.base else {
            return Ok((&self.held, graph));
        };
        if let Some(whole) = self.whole.get() {
            return Ok((&whole.commits, &whole.graph));
        }
        let load = load.ok_or_else(|| VerifyError::History {
            detail: "the context has no store to read them from".into(),
        })?;
        let (prefix, foreign) = load(base.generation, &self.held)?;
        self.install(prefix, foreign, graph)?;
        let whole = self.whole.get().expect("just installed");
        Ok((&whole.commits, &whole.graph))
    }

    /// The generation of the base and the held commits, if the whole log is still to be read.
    pub(crate) fn to_read(&self) -> Option<(Generation, Vec<Commit>)> {
        let base = self.base.as_ref()?;
        self.whole.get().is_none().then(|| (base.generation, self.held.clone()))
    }

    /// Takes the older commits read from the store (and the merged histories they reach) as
    /// the start of the whole log: refolds them, checks that they lead to the base, and keeps
    /// the whole log with its graph.
    pub(crate) fn install(
        &self,
        mut commits: Vec<Commit>,
        foreign: Vec<Commit>,
        graph: &Graph,
    ) -> Result<(), VerifyError> {
        let Some(base) = &self.base else {
            return Ok(());
        };
        if self.whole.get().is_some() {
            return Ok(());
        }
        let mut refold = Refold::keeping_undo(Checks::STATE);
        for commit in &commits {
            refold.step(commit)?;
        }
        if refold.head() != Some(base.hash) {
            return Err(VerifyError::History {
                detail: format!(
                    "commit {} of the log is not the commit the checkpoint names",
                    base.generation.0
                ),
            });
        }
        let (_, undone) = refold.into_parts();
        commits.extend(self.held.iter().cloned());
        let mut whole_graph = Graph::restored(&commits, undone, &foreign)?;
        whole_graph.union(graph);
        let _ = self.whole.set(Arc::new(Whole {
            commits,
            graph: whole_graph,
        }));
        Ok(())
    }
}
