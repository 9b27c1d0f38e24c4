//! The commit graph: every commit's parent and, for a merge commit, the head it merged.
//!
//! A context's log is its first-parent chain. Beside it the context keeps a [`Graph`]: the
//! level of each merge commit of the log (to walk the graph newest first), the commits it
//! reached only through merge parents (their bodies, so their history can be walked and
//! replayed), and how to take back the commits of its log that overwrote or deleted
//! something (so a past state is rebuilt from the head). [`Histories`] walks the graphs of two
//! contexts together: merge bases, the path from a base to each head, the state at a base.

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use crate::model::artifact::Generation;
use crate::model::hash::{CommitHash, StateHash};
use crate::state::commit::{undo_commit, Apply, Commit, Undone};
use crate::state::live::{Rewind, Rewound, State, StateView};
use crate::state::refold::VerifyError;

/// A commit reached only through a merge parent, with what the walk needs.
pub(crate) struct Foreign {
    commit: Commit,
    level: u64,
    /// The generation of its merged parent, to find that parent on a log.
    merged_generation: Option<Generation>,
}

/// What a context keeps about its history besides the log (see the module docs). Every field
/// is a persistent map, so a fork clones it in O(1).
///
/// Invariant: every commit reachable from the head is in the log or in `foreign`.
#[derive(Clone, Default)]
pub(crate) struct Graph {
    /// How to undo each commit of the log that did more than create artifacts.
    undone: imbl::OrdMap<Generation, Arc<Undone>>,
    /// The level of each merge commit of the log. A commit's level is one more than its
    /// highest parent's (a first commit's is 1), so a parent's level is below its child's; a
    /// log without merges has level = generation.
    merge_levels: imbl::OrdMap<Generation, u64>,
    /// Commits reachable from the head only through merge parents.
    foreign: imbl::HashMap<CommitHash, Arc<Foreign>>,
}

impl Graph {
    /// Records how to undo the commit just appended to the log.
    pub(crate) fn record(&mut self, generation: Generation, undone: Option<Undone>) {
        if let Some(undone) = undone {
            self.undone.insert(generation, Arc::new(undone));
        }
    }

    /// Records that the log's commit `generation` merged a head of level `merged_level`.
    pub(crate) fn record_merge(&mut self, generation: Generation, merged_level: u64) {
        let parent = self.level(Generation(generation.0.saturating_sub(1)));
        self.merge_levels.insert(generation, 1 + parent.max(merged_level));
    }

    /// The level of the log's commit `generation` (0 for the empty state).
    pub(crate) fn level(&self, generation: Generation) -> u64 {
        match self.merge_levels.range(..=generation).next_back() {
            Some((merge, level)) => level + (generation.0 - merge.0),
            None => generation.0,
        }
    }

    /// The graph of the log cut after commit `end`.
    pub(crate) fn truncated(&self, end: Generation) -> Graph {
        Graph {
            undone: self.undone.split(&end.next()).0,
            merge_levels: self.merge_levels.split(&end.next()).0,
            foreign: self.foreign.clone(),
        }
    }

    /// Adds what `other` knows (of the same history) to this graph.
    pub(crate) fn union(&mut self, other: &Graph) {
        self.undone = std::mem::take(&mut self.undone).union(other.undone.clone());
        self.merge_levels = std::mem::take(&mut self.merge_levels).union(other.merge_levels.clone());
        self.foreign = std::mem::take(&mut self.foreign).union(other.foreign.clone());
    }

    /// Adds commits reached through a merge parent.
    pub(crate) fn absorb(&mut self, foreign: Vec<Arc<Foreign>>) {
        for f in foreign {
            self.foreign.insert(f.commit.hash, f);
        }
    }

    /// Takes the commits of `log` after the first `end` back off `state` (the state after the
    /// whole log), newest first, and checks the state hash commit `end` recorded.
    pub(crate) fn rewind(&self, state: &mut impl Rewind, log: &[Commit], end: usize) -> Result<(), VerifyError> {
        for commit in log[end..].iter().rev() {
            undo_commit(state, commit, self.undone.get(&commit.generation).map(|u| &**u));
        }
        let recorded = end
            .checked_sub(1)
            .map_or_else(|| State::default().state_hash(), |i| log[i].state_hash);
        check_state(state, recorded, Generation(end as u64))
    }

    /// The graph of a log read back from a store: `undone` as the refold of the log gave it,
    /// and `foreign` the store's commits reachable from the log's merge commits that are not
    /// in the log.
    ///
    /// # Errors
    /// [`VerifyError::Parent`] for a commit of the merged histories whose parent is missing.
    pub(crate) fn restored(
        log: &[Commit],
        undone: Vec<(Generation, Undone)>,
        foreign: &[Commit],
    ) -> Result<Graph, VerifyError> {
        let mut graph = Graph::default();
        for (generation, undone) in undone {
            graph.undone.insert(generation, Arc::new(undone));
        }
        if log.iter().all(|c| c.merged.is_none()) {
            return Ok(graph);
        }
        let positions: HashMap<CommitHash, Generation> = log.iter().map(|c| (c.hash, c.generation)).collect();
        let mut pending: HashMap<CommitHash, &Commit> = foreign.iter().map(|c| (c.hash, c)).collect();
        for commit in log {
            if let Some(merged) = commit.merged {
                if let Some(level) = graph.load_foreign(merged, &positions, &mut pending)? {
                    graph.record_merge(commit.generation, level);
                }
            }
        }
        Ok(graph)
    }

    /// Moves `root` and its ancestors from `pending` into `foreign`, with their levels, and
    /// returns the level of `root` (`None` if the store does not have it: a history merged from
    /// elsewhere, walked no further, as are merged parents it does not have). The log's commits
    /// up to the one being recorded have their levels already.
    fn load_foreign(
        &mut self,
        root: CommitHash,
        positions: &HashMap<CommitHash, Generation>,
        pending: &mut HashMap<CommitHash, &Commit>,
    ) -> Result<Option<u64>, VerifyError> {
        if let Some(&generation) = positions.get(&root) {
            return Ok(Some(self.level(generation)));
        }
        if !pending.contains_key(&root) && !self.foreign.contains_key(&root) {
            return Ok(None);
        }
        let mut stack = vec![root];
        while let Some(&hash) = stack.last() {
            if self.foreign.contains_key(&hash) {
                stack.pop();
                continue;
            }
            let commit = pending.get(&hash).expect("only commits in `pending` are stacked");
            let (mut level, mut merged_generation, mut unloaded) = (0, None, None);
            for (parent, merged) in [(commit.parent, false), (commit.merged, true)] {
                let Some(parent) = parent else { continue };
                let (parent_level, generation) = if let Some(&generation) = positions.get(&parent) {
                    (self.level(generation), generation)
                } else if let Some(f) = self.foreign.get(&parent) {
                    (f.level, f.commit.generation)
                } else if pending.contains_key(&parent) {
                    unloaded = Some(parent);
                    break;
                } else if merged {
                    continue;
                } else {
                    return Err(VerifyError::Parent {
                        generation: commit.generation,
                    });
                };
                level = level.max(parent_level);
                if merged {
                    merged_generation = Some(generation);
                }
            }
            if let Some(parent) = unloaded {
                if stack.len() > pending.len() {
                    // Only a cycle stacks more commits than there are: not a history.
                    return Err(VerifyError::Parent {
                        generation: commit.generation,
                    });
                }
                stack.push(parent);
                continue;
            }
            let commit = pending.remove(&hash).expect("looked up above");
            self.foreign.insert(
                hash,
                Arc::new(Foreign {
                    commit: commit.clone(),
                    level: level + 1,
                    merged_generation,
                }),
            );
            stack.pop();
        }
        Ok(Some(self.foreign[&root].level))
    }
}

fn check_state(state: &impl StateView, recorded: StateHash, generation: Generation) -> Result<(), VerifyError> {
    let replayed = state.state_hash();
    if replayed == recorded {
        Ok(())
    } else {
        Err(VerifyError::StateHash {
            generation,
            recorded,
            replayed,
            writes: Vec::new(),
            more_writes: 0,
        })
    }
}

/// One context's history, as [`Histories`] reads it.
pub(crate) struct Side<'a> {
    pub(crate) log: &'a [Commit],
    pub(crate) graph: &'a Graph,
    pub(crate) state: &'a State,
}

/// A commit of either history, with its level.
#[derive(Clone, Copy)]
pub(crate) struct Node<'a> {
    pub(crate) commit: &'a Commit,
    level: u64,
    merged_generation: Option<Generation>,
}

/// The commits of a base's first-parent chain that one side's log does not hold, and where
/// that chain meets the log: the base's state is the log's state after `meet` commits with
/// `foreign` applied (oldest last in the vector), and what the side changed since the base is
/// in `foreign` and in the log after `meet`.
pub(crate) struct Path<'a> {
    pub(crate) side: usize,
    pub(crate) meet: usize,
    pub(crate) foreign: Vec<&'a Commit>,
}

impl Path<'_> {
    /// The commits on the way from the base to the side's head: back along the base's chain,
    /// then forward along the side's log.
    pub(crate) fn commits<'b>(&'b self, sides: &'b Histories<'_>) -> impl Iterator<Item = &'b Commit> + 'b {
        self.foreign
            .iter()
            .copied()
            .chain(&sides.sides[self.side].log[self.meet..])
    }
}

/// The histories of two contexts (ours is side 0, theirs side 1), walked together.
pub(crate) struct Histories<'a> {
    sides: [Side<'a>; 2],
}

const ONE: u8 = 1;
const TWO: u8 = 2;
const STALE: u8 = 4;
const RESULT: u8 = 8;

impl<'a> Histories<'a> {
    pub(crate) fn new(ours: Side<'a>, theirs: Side<'a>) -> Self {
        Histories { sides: [ours, theirs] }
    }

    fn on_log(&self, side: usize, generation: Generation) -> Option<Node<'a>> {
        let Side { log, graph, .. } = self.sides[side];
        let commit = log.get(usize::try_from(generation.0.checked_sub(1)?).ok()?)?;
        Some(Node {
            commit,
            level: graph.level(generation),
            merged_generation: commit
                .merged
                .and_then(|m| graph.foreign.get(&m))
                .map(|f| f.commit.generation),
        })
    }

    /// The head of a side, `None` before its first commit.
    pub(crate) fn head(&self, side: usize) -> Option<Node<'a>> {
        self.on_log(side, Generation(self.sides[side].log.len() as u64))
    }

    fn find(&self, hash: CommitHash, generation: Option<Generation>) -> Option<Node<'a>> {
        if let Some(generation) = generation {
            for side in 0..2 {
                if let Some(node) = self.on_log(side, generation).filter(|n| n.commit.hash == hash) {
                    return Some(node);
                }
            }
        }
        self.sides.iter().find_map(|side| {
            side.graph.foreign.get(&hash).map(|f| Node {
                commit: &f.commit,
                level: f.level,
                merged_generation: f.merged_generation,
            })
        })
    }

    /// The first parent of `node`: the commit one generation before it (so a walk along first
    /// parents always ends).
    fn parent(&self, node: Node<'a>) -> Result<Option<Node<'a>>, VerifyError> {
        let generation = node.commit.generation;
        node.commit
            .parent
            .map(|hash| {
                let before = Generation(generation.0.checked_sub(1).ok_or(VerifyError::Parent { generation })?);
                self.find(hash, Some(before))
                    .filter(|parent| parent.commit.generation == before)
                    .ok_or(VerifyError::Parent { generation })
            })
            .transpose()
    }

    /// The parent and the merged parent of `node`. A merged parent neither history holds (a
    /// SQLite session that merged a history from another file or from memory, reopened) is
    /// walked no further: the walk may then find an older base and compare more, never less.
    fn parents(&self, node: Node<'a>) -> Result<impl Iterator<Item = Node<'a>>, VerifyError> {
        let merged = node
            .commit
            .merged
            .and_then(|hash| self.find(hash, node.merged_generation));
        Ok(self.parent(node)?.into_iter().chain(merged))
    }

    /// The best common ancestors of the two heads: common ancestors that are not ancestors of
    /// another common ancestor (empty for unrelated histories). Walks back from both heads,
    /// highest level first, and stops when every commit left to visit is below a common
    /// ancestor found, as git's merge-base does: the walk costs the commits since the bases.
    pub(crate) fn merge_bases(&self) -> Result<Vec<Node<'a>>, VerifyError> {
        let (Some(ours), Some(theirs)) = (self.head(0), self.head(1)) else {
            return Ok(Vec::new());
        };
        if ours.commit.hash == theirs.commit.hash {
            return Ok(vec![ours]);
        }
        let mut flags: HashMap<CommitHash, u8> = HashMap::new();
        let mut nodes: Vec<Node<'a>> = Vec::new();
        let mut queue: BinaryHeap<(u64, u64, CommitHash, usize)> = BinaryHeap::new();
        let push = |node: Node<'a>, nodes: &mut Vec<Node<'a>>, queue: &mut BinaryHeap<_>| {
            queue.push((node.level, node.commit.generation.0, node.commit.hash, nodes.len()));
            nodes.push(node);
        };
        flags.insert(ours.commit.hash, ONE);
        flags.insert(theirs.commit.hash, TWO);
        push(ours, &mut nodes, &mut queue);
        push(theirs, &mut nodes, &mut queue);
        let mut results = Vec::new();
        while queue.iter().any(|&(_, _, hash, _)| flags[&hash] & STALE == 0) {
            let (_, _, hash, index) = queue.pop().expect("the queue is not empty");
            let node = nodes[index];
            let entry = flags.get_mut(&hash).expect("queued commits are flagged");
            let mut paint = *entry & (ONE | TWO | STALE);
            if paint == ONE | TWO {
                if *entry & RESULT == 0 {
                    *entry |= RESULT;
                    results.push(node);
                }
                // The ancestors of a common ancestor are not best.
                paint |= STALE;
            }
            for parent in self.parents(node)? {
                let flag = flags.entry(parent.commit.hash).or_default();
                if *flag & paint == paint {
                    continue;
                }
                *flag |= paint;
                push(parent, &mut nodes, &mut queue);
            }
        }
        results.retain(|node| flags[&node.commit.hash] & STALE == 0);
        // A result can still be an ancestor of another one reached by a longer path.
        let mut best = Vec::new();
        for (i, &candidate) in results.iter().enumerate() {
            let mut redundant = false;
            for (j, &other) in results.iter().enumerate() {
                if i != j && self.is_ancestor(candidate, other)? {
                    redundant = true;
                    break;
                }
            }
            if !redundant {
                best.push(candidate);
            }
        }
        Ok(best)
    }

    /// Whether `ancestor` is reachable from `descendant`, walking no lower than its level.
    fn is_ancestor(&self, ancestor: Node<'a>, descendant: Node<'a>) -> Result<bool, VerifyError> {
        let mut seen = HashSet::new();
        let mut stack = vec![descendant];
        while let Some(node) = stack.pop() {
            if node.commit.hash == ancestor.commit.hash {
                return Ok(true);
            }
            for parent in self.parents(node)? {
                if parent.level >= ancestor.level && seen.insert(parent.commit.hash) {
                    stack.push(parent);
                }
            }
        }
        Ok(false)
    }

    /// The way from `base` (`None`: the empty state) to the head of `side`.
    pub(crate) fn path(&self, base: Option<Node<'a>>, side: usize) -> Result<Path<'a>, VerifyError> {
        let mut foreign = Vec::new();
        let mut at = base;
        while let Some(node) = at {
            let generation = node.commit.generation;
            if self
                .on_log(side, generation)
                .is_some_and(|n| n.commit.hash == node.commit.hash)
            {
                return Ok(Path {
                    side,
                    meet: generation.0 as usize,
                    foreign,
                });
            }
            foreign.push(node.commit);
            at = self.parent(node)?;
        }
        Ok(Path { side, meet: 0, foreign })
    }

    /// The state at `base`, rebuilt from the head whose path to it is shorter: its commits
    /// since the meeting point taken back (as a view of the head's state), then the base's own
    /// commits applied, if it is not on that head's log.
    pub(crate) fn state_at(&self, base: Option<Node<'a>>, paths: &[Path<'a>; 2]) -> Result<Past<'a>, VerifyError> {
        let Some(base) = base else {
            return Ok(Past::Built(State::default()));
        };
        let path = paths
            .iter()
            .min_by_key(|p| self.sides[p.side].log.len() - p.meet + p.foreign.len())
            .expect("two paths");
        let side = &self.sides[path.side];
        let mut view = Rewound::new(side.state);
        side.graph.rewind(&mut view, side.log, path.meet)?;
        if path.foreign.is_empty() {
            return Ok(Past::Rewound(view));
        }
        let mut state = view.to_state();
        for commit in path.foreign.iter().rev() {
            let mut apply = Apply::new(&mut state, commit.generation);
            for (run, record) in commit.runs.iter().enumerate() {
                if let Err(source) = apply.patch(&record.ops) {
                    apply.rollback();
                    return Err(VerifyError::Apply {
                        generation: commit.generation,
                        run,
                        source,
                    });
                }
            }
            apply.finish();
        }
        check_state(&state, base.commit.state_hash, base.commit.generation)?;
        Ok(Past::Built(state))
    }

    /// The commits reachable from their head that our graph does not hold (in our log or among
    /// our foreign commits), to absorb once their head is merged.
    pub(crate) fn theirs_unknown_to_ours(&self) -> Result<Vec<Arc<Foreign>>, VerifyError> {
        let ours = &self.sides[0];
        let knows = |node: &Node<'_>| {
            let hash = node.commit.hash;
            ours.graph.foreign.contains_key(&hash)
                || node
                    .commit
                    .generation
                    .0
                    .checked_sub(1)
                    .and_then(|i| ours.log.get(usize::try_from(i).ok()?))
                    .is_some_and(|c| c.hash == hash)
        };
        let mut unknown = Vec::new();
        let mut seen = HashSet::new();
        let mut stack: Vec<Node<'a>> = self.head(1).into_iter().collect();
        while let Some(node) = stack.pop() {
            if knows(&node) || !seen.insert(node.commit.hash) {
                continue;
            }
            unknown.push(Arc::new(Foreign {
                commit: node.commit.clone(),
                level: node.level,
                merged_generation: node.merged_generation,
            }));
            stack.extend(self.parents(node)?);
        }
        Ok(unknown)
    }

    /// The level of a side's head (0 before its first commit).
    pub(crate) fn head_level(&self, side: usize) -> u64 {
        self.head(side).map_or(0, |n| n.level)
    }
}

impl Node<'_> {
    /// The commit's hash.
    pub(crate) fn hash(&self) -> CommitHash {
        self.commit.hash
    }
}

/// A past state: a view of a later state with some commits taken back, or a state of its own.
pub(crate) enum Past<'a> {
    Rewound(Rewound<'a>),
    Built(State),
}

impl StateView for Past<'_> {
    fn get(&self, id: &str) -> Option<&Arc<crate::model::artifact::Stored>> {
        match self {
            Past::Rewound(view) => view.get(id),
            Past::Built(state) => state.get(id),
        }
    }

    fn has_relation(&self, relation: &crate::model::relation::Relation) -> bool {
        match self {
            Past::Rewound(view) => view.has_relation(relation),
            Past::Built(state) => state.has_relation(relation),
        }
    }

    fn relations_touching(&self, id: &crate::model::artifact::ArtifactId) -> Vec<crate::model::relation::Relation> {
        match self {
            Past::Rewound(view) => view.relations_touching(id),
            Past::Built(state) => state.relations_touching(id),
        }
    }

    fn state_hash(&self) -> StateHash {
        match self {
            Past::Rewound(view) => view.state_hash(),
            Past::Built(state) => state.state_hash(),
        }
    }
}
