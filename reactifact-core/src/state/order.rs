//! The per-kind creation-order index of the live state: the ids of one kind, ordered by
//! `Stored::created`.

use std::cmp::Ordering;
use std::sync::Arc;

use crate::model::artifact::ArtifactId;

/// How many entries a chunk takes by appending before a new chunk is started; a chunk that
/// grows past twice this by inserts in the middle is split.
const CHUNK: usize = 64;

/// One sorted run of the index, shared between clones until one writes to it.
type Chunk = Arc<Vec<(u64, ArtifactId)>>;

/// The ids of one kind in creation order: a persistent vector of sorted chunks of up to 128
/// entries. A clone (a fork, a kept snapshot) is O(1); a write while a clone is alive copies
/// one chunk and a path of the vector. The usual write — an artifact created after every
/// other — appends to the last chunk. An entry costs its position and its id (24 bytes) and
/// an eighth of a pointer, about 24 bytes in all (a persistent B-tree map took about 57).
#[derive(Clone, Default)]
pub(crate) struct CreationOrder {
    chunks: imbl::Vector<Chunk>,
    len: usize,
}

impl CreationOrder {
    /// How many ids the index holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The ids, in creation order.
    pub(crate) fn ids(&self) -> impl Iterator<Item = &ArtifactId> + '_ {
        self.chunks.iter().flat_map(|chunk| chunk.iter().map(|(_, id)| id))
    }

    /// The chunk whose range holds `created` (`Ok`), or where a chunk starting at it would go
    /// (`Err`).
    fn find(&self, created: u64) -> Result<usize, usize> {
        self.chunks
            .binary_search_by(|chunk| match (chunk.first(), chunk.last()) {
                (Some(&(first, _)), _) if first > created => Ordering::Greater,
                (_, Some(&(last, _))) if last < created => Ordering::Less,
                _ => Ordering::Equal,
            })
    }

    /// Puts `id` at position `created` (replacing the id there, if any).
    pub(crate) fn insert(&mut self, created: u64, id: ArtifactId) {
        // (No chunk is ever empty: `remove` drops a chunk it empties.)
        let appends = self
            .chunks
            .back()
            .and_then(|c| c.last())
            .is_none_or(|&(last, _)| last < created);
        if appends {
            match self.chunks.back_mut() {
                Some(last) if last.len() < CHUNK => Arc::make_mut(last).push((created, id)),
                _ => {
                    let mut chunk = Vec::with_capacity(CHUNK);
                    chunk.push((created, id));
                    self.chunks.push_back(Arc::new(chunk));
                }
            }
            self.len += 1;
            return;
        }
        // Between two chunks: the end of the earlier one keeps the order.
        let at = self.find(created).unwrap_or_else(|gap| gap.saturating_sub(1));
        let chunk = Arc::make_mut(self.chunks.get_mut(at).expect("a chunk holds or precedes the position"));
        match chunk.binary_search_by_key(&created, |&(c, _)| c) {
            Ok(pos) => chunk[pos].1 = id,
            Err(pos) => {
                chunk.insert(pos, (created, id));
                self.len += 1;
                if chunk.len() > 2 * CHUNK {
                    let upper = chunk.split_off(CHUNK);
                    self.chunks.insert(at + 1, Arc::new(upper));
                }
            }
        }
    }

    /// Removes the id at position `created`; whether one was there.
    pub(crate) fn remove(&mut self, created: u64) -> bool {
        let Ok(at) = self.find(created) else {
            return false;
        };
        let chunk = Arc::make_mut(self.chunks.get_mut(at).expect("found"));
        let Ok(pos) = chunk.binary_search_by_key(&created, |&(c, _)| c) else {
            return false;
        };
        chunk.remove(pos);
        if chunk.is_empty() {
            self.chunks.remove(at);
        }
        self.len -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A small deterministic generator (no dependency for a test's shuffle).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, bound: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % bound
        }
    }

    fn check(index: &CreationOrder, model: &BTreeMap<u64, ArtifactId>) {
        let ids: Vec<&ArtifactId> = index.ids().collect();
        let want: Vec<&ArtifactId> = model.values().collect();
        assert_eq!(ids, want);
        assert_eq!(index.len(), model.len());
        assert!(index.chunks.iter().all(|c| !c.is_empty() && c.len() <= 2 * CHUNK));
    }

    #[test]
    fn appends_removes_and_inserts_in_the_middle_keep_creation_order() {
        let mut index = CreationOrder::default();
        let mut model = BTreeMap::new();
        let mut rng = Lcg(7);
        for created in 0..2_000u64 {
            let id = ArtifactId::from(format!("a{created}"));
            index.insert(created * 10, id.clone());
            model.insert(created * 10, id);
        }
        check(&index, &model);
        for step in 0..6_000u64 {
            let created = rng.next(25_000);
            match rng.next(3) {
                0 => {
                    let id = ArtifactId::from(format!("b{step}"));
                    index.insert(created, id.clone());
                    model.insert(created, id);
                }
                _ => assert_eq!(
                    index.remove(created),
                    model.remove(&created).is_some(),
                    "remove {created}"
                ),
            }
        }
        check(&index, &model);
        for created in model.keys().copied().collect::<Vec<_>>() {
            assert!(index.remove(created));
        }
        assert_eq!((index.len(), index.chunks.len()), (0, 0));
        assert!(!index.remove(5));
    }

    #[test]
    fn a_clone_is_untouched_by_writes_to_the_original() {
        let mut index = CreationOrder::default();
        for created in 0..500u64 {
            index.insert(created, ArtifactId::from(format!("a{created}")));
        }
        let kept = index.clone();
        let before: Vec<ArtifactId> = kept.ids().cloned().collect();
        index.insert(1_000, ArtifactId::from("new"));
        index.insert(250, ArtifactId::from("replaced"));
        assert!(index.remove(3));
        assert_eq!(kept.ids().cloned().collect::<Vec<_>>(), before);
        assert_eq!((kept.len(), index.len()), (500, 500));
        assert_eq!(index.ids().nth(249).map(ArtifactId::as_str), Some("replaced"));
    }
}
