//! A hash map that is flat while one owner writes it and copy-on-write while it is shared.
//!
//! The live state is read by a generation's produces through a snapshot and written only by
//! the commit, after every run has finished and dropped its snapshot; so in the common case
//! nothing shares the map when it is written, and a plain hash map written in place does.
//! What outlives a generation — a [`Snapshot`](crate::Snapshot) a user keeps, a fork, a
//! checkpoint being encoded, a state rebuilt for time travel — shares the flat base through an
//! `Arc`. While it does, writes go to a small persistent map of changes over the base (the
//! *delta*): a clone of the whole layered map stays O(1) and a write to a shared one costs
//! O(log d) in the delta's size d, not a copy of the base. The delta is folded into the base as
//! soon as the base is no longer shared (at the next write), or, if it stays shared, into a
//! copy of the base once the delta outgrows [`fold_at`] — a copy of n entries every n / 8
//! writes at most, so a write's amortised cost stays O(1).

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::Arc;

/// The hasher of both layers: fast and seeded per process (ids are short strings and SipHash
/// showed up in profiles). Iteration order is never relied on.
type Hasher = foldhash::fast::RandomState;

type Flat<K, V> = std::collections::HashMap<K, V, Hasher>;

/// Changes over the base: `Some` sets a value, `None` removes the base's.
type Delta<K, V> = imbl::GenericHashMap<K, Option<V>, Hasher, imbl::shared_ptr::DefaultSharedPtr>;

/// The largest delta kept over a shared base of `base` entries before the base is copied.
fn fold_at(base: usize) -> usize {
    (base / 8).max(1024)
}

/// A hash map with O(1) clones that writes in place while it is not shared (see the module).
pub(crate) struct Layered<K, V> {
    base: Arc<Flat<K, V>>,
    delta: Delta<K, V>,
    len: usize,
}

impl<K, V> Default for Layered<K, V> {
    fn default() -> Self {
        Layered {
            base: Arc::default(),
            delta: Delta::default(),
            len: 0,
        }
    }
}

impl<K: Clone, V: Clone> Clone for Layered<K, V> {
    /// O(1): shares the base and the delta.
    fn clone(&self) -> Self {
        Layered {
            base: Arc::clone(&self.base),
            delta: self.delta.clone(),
            len: self.len,
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Layered<K, V> {
    /// The value under `key`.
    #[inline]
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if !self.delta.is_empty() {
            if let Some(changed) = self.delta.get(key) {
                return changed.as_ref();
            }
        }
        self.base.get(key)
    }

    /// How many values are stored.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Sets the value under `key` (`None` removes it) and returns the one it replaces.
    pub(crate) fn set(&mut self, key: K, value: Option<V>) -> Option<V> {
        if let Some(base) = Arc::get_mut(&mut self.base) {
            if !self.delta.is_empty() {
                fold(base, std::mem::take(&mut self.delta));
            }
            let old = match value {
                Some(value) => base.insert(key, value),
                None => base.remove(&key),
            };
            self.len = base.len();
            return old;
        }
        let old = self.get(&key).cloned();
        self.len = self.len + usize::from(value.is_some()) - usize::from(old.is_some());
        self.delta.insert(key, value);
        if self.delta.len() > fold_at(self.base.len()) {
            let mut base = Flat::clone(&self.base);
            fold(&mut base, std::mem::take(&mut self.delta));
            self.base = Arc::new(base);
        }
        old
    }

    /// Makes room for up to `additional` more entries at once, if the map writes in place and
    /// they are at least as many as it holds: a commit that large would grow the table more
    /// than once, one growth at a time. (Smaller commits grow it as they go, so a commit of
    /// updates never enlarges a table it does not fill.)
    pub(crate) fn reserve(&mut self, additional: usize) {
        if additional < self.len {
            return;
        }
        if let Some(base) = Arc::get_mut(&mut self.base) {
            base.reserve(additional);
        }
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        let delta = &self.delta;
        let kept = self
            .base
            .iter()
            .filter(move |(key, _)| delta.is_empty() || !delta.contains_key(*key));
        let changed = delta.iter().filter_map(|(key, value)| Some((key, value.as_ref()?)));
        kept.chain(changed)
    }

    /// Every value, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.iter().map(|(_, value)| value)
    }

    /// Whether writing now would write in place (nothing shares the base); for tests.
    #[cfg(test)]
    fn is_flat(&self) -> bool {
        self.delta.is_empty() && Arc::strong_count(&self.base) == 1
    }
}

fn fold<K: Hash + Eq + Clone, V: Clone>(base: &mut Flat<K, V>, delta: Delta<K, V>) {
    base.reserve(delta.len());
    for (key, value) in delta {
        match value {
            Some(value) => base.insert(key, value),
            None => base.remove(&key),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(map: &Layered<u32, u32>) -> Vec<(u32, u32)> {
        let mut entries: Vec<_> = map.iter().map(|(k, v)| (*k, *v)).collect();
        entries.sort_unstable();
        entries
    }

    #[test]
    fn an_unshared_map_writes_in_place() {
        let mut map = Layered::default();
        for i in 0..100 {
            assert_eq!(map.set(i, Some(i)), None);
        }
        assert_eq!(map.set(7, None), Some(7));
        assert_eq!(map.set(8, Some(80)), Some(8));
        assert!(map.is_flat());
        assert_eq!(map.len(), 99);
        assert_eq!(map.get(&8), Some(&80));
        assert_eq!(map.get(&7), None);
    }

    #[test]
    fn a_clone_keeps_what_it_saw_while_the_original_changes() {
        let mut map = Layered::default();
        for i in 0..10 {
            map.set(i, Some(i));
        }
        let kept = map.clone();
        map.set(3, None);
        map.set(4, Some(40));
        map.set(20, Some(20));
        assert!(!map.is_flat(), "the base is shared: the writes went to the delta");
        assert_eq!(sorted(&kept), (0..10).map(|i| (i, i)).collect::<Vec<_>>());
        assert_eq!(kept.len(), 10);
        assert_eq!(map.len(), 10);
        assert_eq!(map.get(&3), None);
        assert_eq!(map.get(&4), Some(&40));
        assert_eq!(map.get(&20), Some(&20));
        assert!(map.get(&3).is_none());
        let mut expected: Vec<_> = (0..10)
            .filter(|&i| i != 3)
            .map(|i| (i, if i == 4 { 40 } else { i }))
            .collect();
        expected.push((20, 20));
        assert_eq!(sorted(&map), expected);

        // Once the clone is gone, the next write folds the delta into the base in place.
        drop(kept);
        map.set(21, Some(21));
        assert!(map.is_flat());
        expected.push((21, 21));
        assert_eq!(sorted(&map), expected);
        assert_eq!(map.len(), 11);
    }

    #[test]
    fn a_delta_over_a_base_that_stays_shared_is_folded_into_a_copy() {
        let mut map = Layered::default();
        for i in 0..10 {
            map.set(i, Some(i));
        }
        let kept = map.clone();
        let writes = fold_at(10) as u32 + 1;
        for i in 0..writes {
            map.set(100 + i, Some(i));
        }
        assert!(map.is_flat(), "the delta was folded into a copy of the base");
        assert_eq!(map.len(), 10 + writes as usize);
        assert_eq!(kept.len(), 10);
        assert_eq!(sorted(&kept), (0..10).map(|i| (i, i)).collect::<Vec<_>>());
        assert_eq!(map.get(&(100 + writes - 1)), Some(&(writes - 1)));
    }

    #[test]
    fn room_is_made_at_once_only_for_a_write_at_least_as_large_as_the_map() {
        let mut map = Layered::default();
        for i in 0..1000 {
            map.set(i, Some(i));
        }
        let capacity = map.base.capacity();
        map.reserve(999);
        assert_eq!(
            map.base.capacity(),
            capacity,
            "a smaller batch grows the table as it goes"
        );
        map.reserve(100_000);
        assert!(map.base.capacity() >= 101_000);
        let kept = map.clone();
        let capacity = map.base.capacity();
        map.reserve(1_000_000);
        assert_eq!(map.base.capacity(), capacity, "a shared base is not touched");
        drop(kept);
    }

    #[test]
    fn clones_of_clones_each_see_their_own_writes() {
        let mut a = Layered::default();
        a.set(1, Some(1));
        let mut b = a.clone();
        b.set(2, Some(2));
        let mut c = b.clone();
        c.set(1, None);
        a.set(3, Some(3));
        assert_eq!(sorted(&a), vec![(1, 1), (3, 3)]);
        assert_eq!(sorted(&b), vec![(1, 1), (2, 2)]);
        assert_eq!(sorted(&c), vec![(2, 2)]);
        assert_eq!((a.len(), b.len(), c.len()), (2, 2, 1));
    }
}
