//! Artifacts: typed, serde-serializable values stored under stable string ids.

use std::any::TypeId;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock, RwLock};

use arcstr::ArcStr;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::model::hash::ContentHash;

/// Reading a typed artifact failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The id holds an artifact of another kind.
    #[error("artifact `{id}` is a `{stored}`, not a `{expected}` (read as {type_name})")]
    WrongKind {
        /// The id read.
        id: ArtifactId,
        /// The kind stored under it.
        stored: Kind,
        /// The kind of the requested type.
        expected: Kind,
        /// The Rust type requested.
        type_name: &'static str,
    },
    /// The stored bytes no longer decode as the requested type.
    #[error("artifact `{id}` of kind `{kind}` does not decode as {type_name}: {source}")]
    Decode {
        /// The id read.
        id: ArtifactId,
        /// The kind stored under it.
        kind: Kind,
        /// The Rust type requested.
        type_name: &'static str,
        /// What rmp-serde reported.
        #[source]
        source: rmp_serde::decode::Error,
    },
}

/// A value the runtime can store, hash and hand to produces.
///
/// The [`KIND`](Artifact::KIND) is the artifact's stable type name: it is stored next to the
/// bytes, it routes events to produces, and it must not change when the Rust type is renamed or
/// moved. Derive it with `#[derive(Artifact)]` (optionally `#[artifact(kind = "…")]`) or
/// implement it by hand:
///
/// ```
/// use reactifact_core::Artifact;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Order { total_cents: u64 }
///
/// impl Artifact for Order {
///     const KIND: &'static str = "order";
/// }
/// ```
///
/// Content is encoded with rmp-serde using named fields and hashed with SHA-256. The encoding
/// must be deterministic for hashes, replay and verification to hold: a `HashMap` field iterates
/// in a random order and breaks that; use `BTreeMap` (or an ordered map) instead.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an artifact",
    label = "`{Self}` does not implement `Artifact`",
    note = "derive it: `#[derive(Serialize, Deserialize, Artifact)]`, optionally with `#[artifact(kind = \"...\")]`"
)]
pub trait Artifact: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The stable kind name, e.g. `"order"`.
    const KIND: &'static str;
}

/// The stable id of an artifact, such as `"receipt:42"`. Cheap to clone: its text is shared,
/// behind one pointer (8 bytes; the length is kept with the text).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ArtifactId(ArcStr);

impl ArtifactId {
    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The address of the shared text: the same for every clone of one id.
    pub(crate) fn addr(&self) -> usize {
        self.0.as_ptr().addr()
    }
}

impl fmt::Display for ArtifactId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ArtifactId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for ArtifactId {
    fn from(s: &str) -> Self {
        ArtifactId(ArcStr::from(s))
    }
}

impl From<String> for ArtifactId {
    fn from(s: String) -> Self {
        ArtifactId(ArcStr::from(s))
    }
}

impl From<&String> for ArtifactId {
    fn from(s: &String) -> Self {
        ArtifactId(ArcStr::from(s.as_str()))
    }
}

impl From<&ArtifactId> for ArtifactId {
    fn from(id: &ArtifactId) -> Self {
        id.clone()
    }
}

impl Borrow<str> for ArtifactId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ArtifactId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for ArtifactId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for ArtifactId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

/// An artifact's kind name (see [`Artifact::KIND`]). Interned: copying and comparing is cheap.
///
/// One pointer wide: it refers to the `&'static str` of the name (the type's `KIND`, or the one
/// [`Kind::intern`] keeps), so that every stored version, operation and index entry that
/// carries a kind spends 8 bytes on it rather than 16. Ordered by name.
#[derive(Clone, Copy, Eq, PartialOrd, Ord)]
pub struct Kind(&'static &'static str);

impl std::hash::Hash for Kind {
    /// The name's hash, consistent with its equality.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialEq for Kind {
    /// The names' equality; the same name is usually the same text, and then the addresses
    /// say it without reading the text.
    fn eq(&self, other: &Kind) -> bool {
        std::ptr::eq(self.0, other.0) || self.as_str() == other.as_str()
    }
}

impl Kind {
    /// The kind of artifact type `T`.
    pub fn of<T: Artifact>() -> Kind {
        Kind(&T::KIND)
    }

    /// Interns a kind name read at run time (from a store or a log), so that it compares equal
    /// to [`Kind::of`] for the type that declares it. Each distinct name is allocated once.
    pub fn intern(name: &str) -> Kind {
        type Names = HashMap<&'static str, &'static &'static str>;
        static NAMES: OnceLock<RwLock<Names>> = OnceLock::new();
        let names = NAMES.get_or_init(Default::default);
        if let Some(&found) = names.read().unwrap_or_else(|e| e.into_inner()).get(name) {
            return Kind(found);
        }
        let mut names = names.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&found) = names.get(name) {
            return Kind(found);
        }
        let text: &'static str = Box::leak(name.to_owned().into_boxed_str());
        let leaked: &'static &'static str = Box::leak(Box::new(text));
        names.insert(text, leaked);
        Kind(leaked)
    }

    /// The kind name.
    pub fn as_str(&self) -> &'static str {
        self.0
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(*self.0, f)
    }
}

impl Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(Kind::intern(&name))
    }
}

/// A Rust type that implements [`Artifact`], as a registration records it: its kind, its
/// identity and its name, so that two distinct types claiming one kind are found.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ArtifactType {
    pub(crate) kind: Kind,
    pub(crate) type_id: TypeId,
    pub(crate) name: &'static str,
}

impl ArtifactType {
    pub(crate) fn of<T: Artifact>() -> Self {
        ArtifactType {
            kind: Kind::of::<T>(),
            type_id: TypeId::of::<T>(),
            name: std::any::type_name::<T>(),
        }
    }
}

/// The version of an artifact: 1 when created, +1 on every change of content.
///
/// Writes whose content hash equals the current one create no version.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Version(pub u64);

impl Version {
    /// The version of a newly created artifact.
    pub const FIRST: Version = Version(1);

    /// The version after this one.
    pub fn next(self) -> Version {
        Version(self.0 + 1)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// The number of a commit in a context's log, starting at 1.
///
/// Every commit is a generation: a pass of the runtime, or a direct write such as seeding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Generation(pub u64);

impl Generation {
    /// The generation after this one.
    pub fn next(self) -> Generation {
        Generation(self.0 + 1)
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "g{}", self.0)
    }
}

/// A typed artifact as read from a context or snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct Record<T> {
    /// The artifact's id.
    pub id: ArtifactId,
    /// Its current version.
    pub version: Version,
    /// SHA-256 of its encoded content.
    pub hash: ContentHash,
    /// The generation (commit) that wrote this version.
    pub generation: Generation,
    /// The decoded value.
    pub data: T,
}

/// The stored, encoded form of one artifact version.
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) id: ArtifactId,
    pub(crate) kind: Kind,
    pub(crate) version: Version,
    pub(crate) hash: ContentHash,
    pub(crate) generation: Generation,
    /// Position in creation order, for listing by kind.
    pub(crate) created: u64,
    pub(crate) bytes: Arc<[u8]>,
}

// With its `Arc` counts a stored version takes 104 bytes: glibc's 112-byte chunk, one per
// version stored. A field more would move every version to the next chunk size.
const _: () = assert!(std::mem::size_of::<Stored>() <= 88);

impl Stored {
    pub(crate) fn decode<T: Artifact>(&self) -> Result<Record<T>, ReadError> {
        if self.kind.as_str() != T::KIND {
            return Err(ReadError::WrongKind {
                id: self.id.clone(),
                stored: self.kind,
                expected: Kind::of::<T>(),
                type_name: std::any::type_name::<T>(),
            });
        }
        let data = rmp_serde::from_slice(&self.bytes).map_err(|source| ReadError::Decode {
            id: self.id.clone(),
            kind: self.kind,
            type_name: std::any::type_name::<T>(),
            source,
        })?;
        Ok(Record {
            id: self.id.clone(),
            version: self.version,
            hash: self.hash,
            generation: self.generation,
            data,
        })
    }
}

/// Encodes a value the way every artifact is stored: rmp-serde with named fields.
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    // Small records are the common case: one allocation instead of a few growth steps.
    let mut bytes = Vec::with_capacity(128);
    rmp_serde::encode::write_named(&mut bytes, value)?;
    Ok(bytes)
}

thread_local! {
    /// The buffer [`encode_shared`] writes records into.
    static RECORDS: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(1024));
    /// The buffer [`with_encoded`] writes values into (another, so that what it lends them to
    /// may encode a record).
    static VALUES: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(1024));
}

/// Lends `f` the buffer in `slot`, cleared: `None` (and `f` not called) while it is lent
/// already (a value whose `Serialize` encodes another this way, not done in this crate) or
/// gone (a write from a thread-local's destructor, during the thread's teardown).
fn with_scratch<R>(
    slot: &'static std::thread::LocalKey<std::cell::RefCell<Vec<u8>>>,
    f: impl FnOnce(&mut Vec<u8>) -> R,
) -> Option<R> {
    /// Larger buffers are not kept after use, so one large record does not pin its size.
    const KEEP: usize = 64 * 1024;
    /// The borrowed buffer; dropped — after an encoding, an error or a panic in the value's
    /// `Serialize` — it gives back a buffer larger than `KEEP`.
    struct Scratch<'a>(std::cell::RefMut<'a, Vec<u8>>);
    impl Drop for Scratch<'_> {
        fn drop(&mut self) {
            if self.0.capacity() > KEEP {
                *self.0 = Vec::with_capacity(1024);
            }
        }
    }
    slot.try_with(|scratch| {
        let mut scratch = Scratch(scratch.try_borrow_mut().ok()?);
        scratch.0.clear();
        Some(f(&mut scratch.0))
    })
    .ok()
    .flatten()
}

/// [`encode`], into shared bytes of exactly the encoding's size: one allocation per value
/// (the encoding is written into a buffer the thread keeps, then copied once).
pub(crate) fn encode_shared<T: Serialize + ?Sized>(value: &T) -> Result<Arc<[u8]>, rmp_serde::encode::Error> {
    with_scratch(&RECORDS, |buffer| {
        rmp_serde::encode::write_named(buffer, value)?;
        Ok(Arc::from(buffer.as_slice()))
    })
    // Without the buffer, a buffer of the value's own.
    .unwrap_or_else(|| encode(value).map(Arc::from))
}

/// `f` of `value`'s encoding ([`encode`]), written into a buffer the thread keeps: no
/// allocation of its own for an encoding that is only read. `f` may use [`encode_shared`].
pub(crate) fn with_encoded<T: Serialize + ?Sized, R>(
    value: &T,
    mut f: impl FnMut(&[u8]) -> R,
) -> Result<R, rmp_serde::encode::Error> {
    let lent = with_scratch(&VALUES, |buffer| {
        rmp_serde::encode::write_named(&mut *buffer, value)?;
        Ok(f(buffer))
    });
    // Without the buffer (`f` was not called), a buffer of the value's own.
    lent.unwrap_or_else(|| Ok(f(&encode(value)?)))
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::Kind;

    #[test]
    fn ids_are_equal_hashed_ordered_and_encoded_by_their_text() {
        use std::collections::{BTreeSet, HashMap};

        use super::ArtifactId;

        let made = ArtifactId::from(String::from("receipt:7"));
        let apart = ArtifactId::from("receipt:7");
        assert_eq!(made, apart);
        assert_ne!(made.addr(), apart.addr());
        assert_eq!(made.clone().addr(), made.addr());
        // `Borrow<str>`: a map keyed by ids is searched with the text alone.
        let map: HashMap<ArtifactId, u32> = [(made.clone(), 1)].into();
        assert_eq!(map.get("receipt:7"), Some(&1));
        assert_eq!(map.get("receipt:8"), None);
        let hasher = std::collections::hash_map::RandomState::new();
        assert_eq!(hasher.hash_one(&made), hasher.hash_one("receipt:7"));
        let order: Vec<ArtifactId> = BTreeSet::from(["b".into(), "a:2".into(), "a:10".into(), "".into()])
            .into_iter()
            .collect();
        assert_eq!(order, ["", "a:10", "a:2", "b"]);
        // An id encodes as its text does (commit hashes and stored logs read it so), and reads
        // back from it.
        let encoded = rmp_serde::to_vec_named(&made).unwrap();
        assert_eq!(encoded, rmp_serde::to_vec_named("receipt:7").unwrap());
        assert_eq!(rmp_serde::from_slice::<ArtifactId>(&encoded).unwrap(), made);
        assert_eq!(serde_json::to_string(&made).unwrap(), "\"receipt:7\"");
        assert_eq!(format!("{made} {made:?}"), "receipt:7 \"receipt:7\"");
        // Text that is not UTF-8 is an error, not a panic.
        assert!(rmp_serde::from_slice::<ArtifactId>(&[0xc4, 2, 0xff, 0xfe]).is_err());
    }

    #[test]
    fn kinds_are_equal_by_name_wherever_their_text_lives() {
        let elsewhere: &'static str = Box::leak(String::from("receipt").into_boxed_str());
        let elsewhere: &'static &'static str = Box::leak(Box::new(elsewhere));
        let (here, there) = (Kind(&"receipt"), Kind(elsewhere));
        assert!(!std::ptr::eq(here.as_str(), there.as_str()));
        assert_eq!(here, there);
        let hasher = std::collections::hash_map::RandomState::new();
        assert_eq!(hasher.hash_one(here), hasher.hash_one(there));
        assert_eq!(here.cmp(&there), std::cmp::Ordering::Equal);
        assert_ne!(here, Kind(&"receipts"));
        assert_ne!(here, Kind(&"invoice"));
        assert_eq!(Kind::intern(elsewhere), Kind(&"receipt"));
        assert_eq!(std::mem::size_of::<Kind>(), 8);
        let names = ["receipts", "invoice", "receipt", "order"].map(Kind::intern);
        let mut sorted = names;
        sorted.sort();
        assert_eq!(sorted.map(|k| k.as_str()), ["invoice", "order", "receipt", "receipts"]);
    }
}
