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
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

/// The hasher of both layers: fast and seeded per process (ids are short strings and SipHash
/// showed up in profiles). Iteration order is never relied on.
type Hasher = foldhash::fast::RandomState;

/// A value that carries its own key, so the flat table stores the value alone (for the
/// artifacts, an 8-byte `Arc<Stored>` a slot, not a 24-byte id-and-value pair).
pub(crate) trait Keyed {
    /// The key type.
    type Key;
    /// The value's key.
    fn key(&self) -> &Self::Key;
}

/// The flat layer: the values in a table hashed by their keys.
#[derive(Clone)]
struct Flat<V> {
    table: hashbrown::HashTable<V>,
    hasher: Hasher,
}

impl<V> Default for Flat<V> {
    fn default() -> Self {
        Flat {
            table: hashbrown::HashTable::new(),
            hasher: Hasher::default(),
        }
    }
}

impl<V: Keyed> Flat<V>
where
    V::Key: Hash + Eq,
{
    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        V::Key: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.table.find(self.hash(key), |v| {
            // A key usually shares its text with the one stored (an event's id, a trigger's):
            // then the addresses say it, and the stored text is never read (a cache miss in
            // a large state).
            let stored: &Q = v.key().borrow();
            std::ptr::eq(stored, key) || stored == key
        })
    }

    /// Puts `value` under its key; returns the value it replaces.
    fn insert(&mut self, value: V) -> Option<V> {
        let hash = self.hash(value.key());
        let hasher = &self.hasher;
        match self
            .table
            .entry(hash, |v| v.key() == value.key(), |v| hasher.hash_one(v.key()))
        {
            hashbrown::hash_table::Entry::Occupied(mut entry) => Some(std::mem::replace(entry.get_mut(), value)),
            hashbrown::hash_table::Entry::Vacant(entry) => {
                entry.insert(value);
                None
            }
        }
    }

    fn remove(&mut self, key: &V::Key) -> Option<V> {
        match self.table.find_entry(self.hash(key), |v| v.key() == key) {
            Ok(entry) => Some(entry.remove().0),
            Err(_) => None,
        }
    }

    fn reserve(&mut self, additional: usize) {
        let hasher = &self.hasher;
        self.table.reserve(additional, |v| hasher.hash_one(v.key()));
    }

    fn len(&self) -> usize {
        self.table.len()
    }
}

/// Changes over the base: `Some` sets a value, `None` removes the base's.
type Delta<K, V> = imbl::GenericHashMap<K, Option<V>, Hasher, imbl::shared_ptr::DefaultSharedPtr>;

/// The largest delta kept over a shared base of `base` entries before the base is copied.
fn fold_at(base: usize) -> usize {
    (base / 8).max(1024)
}

/// A hash map with O(1) clones that writes in place while it is not shared (see the module).
pub(crate) struct Layered<K, V> {
    base: Arc<Flat<V>>,
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

impl<K: Hash + Eq + Clone, V: Clone + Keyed<Key = K>> Layered<K, V> {
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

    /// Sets the value under `key` (`None` removes it) and returns the one it replaces. A
    /// value's own key is `key`. Written in place, the key is not cloned (the table holds the
    /// value alone).
    pub(crate) fn set(&mut self, key: &K, value: Option<V>) -> Option<V> {
        debug_assert!(
            value.as_ref().is_none_or(|v| v.key() == key),
            "a value under another key"
        );
        if let Some(base) = Arc::get_mut(&mut self.base) {
            if !self.delta.is_empty() {
                fold(base, std::mem::take(&mut self.delta));
            }
            let old = match value {
                Some(value) => base.insert(value),
                None => base.remove(key),
            };
            self.len = base.len();
            return old;
        }
        let old = self.get(key).cloned();
        self.len = self.len + usize::from(value.is_some()) - usize::from(old.is_some());
        self.delta.insert(key.clone(), value);
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
            .table
            .iter()
            .map(|value| (value.key(), value))
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

fn fold<K: Hash + Eq + Clone, V: Clone + Keyed<Key = K>>(base: &mut Flat<V>, delta: Delta<K, V>) {
    base.reserve(delta.len());
    for (key, value) in delta {
        match value {
            Some(value) => base.insert(value),
            None => base.remove(&key),
        };
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A value stored with its key, as the live state stores an artifact with its id (also
    /// used by the model test, `tests/shared_layered_model.rs`).
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub(crate) struct Pair(pub(crate) u32, pub(crate) u32);

    impl Keyed for Pair {
        type Key = u32;
        fn key(&self) -> &u32 {
            &self.0
        }
    }

    /// `map.set(key, value)` for a value stored with its key.
    fn set(map: &mut Layered<u32, Pair>, key: u32, value: Option<u32>) -> Option<u32> {
        map.set(&key, value.map(|v| Pair(key, v))).map(|p| p.1)
    }

    fn get(map: &Layered<u32, Pair>, key: u32) -> Option<u32> {
        map.get(&key).map(|p| {
            assert_eq!(p.0, key);
            p.1
        })
    }

    fn sorted(map: &Layered<u32, Pair>) -> Vec<(u32, u32)> {
        let mut entries: Vec<_> = map.iter().map(|(k, v)| (*k, v.1)).collect();
        entries.sort_unstable();
        entries
    }

    #[test]
    fn an_unshared_map_writes_in_place() {
        let mut map = Layered::default();
        for i in 0..100 {
            assert_eq!(set(&mut map, i, Some(i)), None);
        }
        assert_eq!(set(&mut map, 7, None), Some(7));
        assert_eq!(set(&mut map, 8, Some(80)), Some(8));
        assert!(map.is_flat());
        assert_eq!(map.len(), 99);
        assert_eq!(get(&map, 8), Some(80));
        assert_eq!(get(&map, 7), None);
    }

    #[test]
    fn a_clone_keeps_what_it_saw_while_the_original_changes() {
        let mut map = Layered::default();
        for i in 0..10 {
            set(&mut map, i, Some(i));
        }
        let kept = map.clone();
        set(&mut map, 3, None);
        set(&mut map, 4, Some(40));
        set(&mut map, 20, Some(20));
        assert!(!map.is_flat(), "the base is shared: the writes went to the delta");
        assert_eq!(sorted(&kept), (0..10).map(|i| (i, i)).collect::<Vec<_>>());
        assert_eq!(kept.len(), 10);
        assert_eq!(map.len(), 10);
        assert_eq!(get(&map, 3), None);
        assert_eq!(get(&map, 4), Some(40));
        assert_eq!(get(&map, 20), Some(20));
        assert!(get(&map, 3).is_none());
        let mut expected: Vec<_> = (0..10)
            .filter(|&i| i != 3)
            .map(|i| (i, if i == 4 { 40 } else { i }))
            .collect();
        expected.push((20, 20));
        assert_eq!(sorted(&map), expected);

        // Once the clone is gone, the next write folds the delta into the base in place.
        drop(kept);
        set(&mut map, 21, Some(21));
        assert!(map.is_flat());
        expected.push((21, 21));
        assert_eq!(sorted(&map), expected);
        assert_eq!(map.len(), 11);
    }

    #[test]
    fn a_delta_over_a_base_that_stays_shared_is_folded_into_a_copy() {
        let mut map = Layered::default();
        for i in 0..10 {
            set(&mut map, i, Some(i));
        }
        let kept = map.clone();
        let writes = fold_at(10) as u32 + 1;
        for i in 0..writes {
            set(&mut map, 100 + i, Some(i));
        }
        assert!(map.is_flat(), "the delta was folded into a copy of the base");
        assert_eq!(map.len(), 10 + writes as usize);
        assert_eq!(kept.len(), 10);
        assert_eq!(sorted(&kept), (0..10).map(|i| (i, i)).collect::<Vec<_>>());
        assert_eq!(get(&map, 100 + writes - 1), Some(writes - 1));
    }

    #[test]
    fn room_is_made_at_once_only_for_a_write_at_least_as_large_as_the_map() {
        let mut map = Layered::default();
        for i in 0..1000 {
            set(&mut map, i, Some(i));
        }
        let capacity = map.base.table.capacity();
        map.reserve(999);
        assert_eq!(
            map.base.table.capacity(),
            capacity,
            "a smaller batch grows the table as it goes"
        );
        map.reserve(100_000);
        assert!(map.base.table.capacity() >= 101_000);
        let kept = map.clone();
        let capacity = map.base.table.capacity();
        map.reserve(1_000_000);
        assert_eq!(map.base.table.capacity(), capacity, "a shared base is not touched");
        drop(kept);
    }

    #[test]
    fn clones_of_clones_each_see_their_own_writes() {
        let mut a = Layered::default();
        set(&mut a, 1, Some(1));
        let mut b = a.clone();
        set(&mut b, 2, Some(2));
        let mut c = b.clone();
        set(&mut c, 1, None);
        set(&mut a, 3, Some(3));
        assert_eq!(sorted(&a), vec![(1, 1), (3, 3)]);
        assert_eq!(sorted(&b), vec![(1, 1), (2, 2)]);
        assert_eq!(sorted(&c), vec![(2, 2)]);
        assert_eq!((a.len(), b.len(), c.len()), (2, 2, 1));
    }
}
