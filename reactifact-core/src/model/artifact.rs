//! Artifacts: typed, serde-serializable values stored under stable string ids.

use std::any::TypeId;
use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, OnceLock, RwLock};

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

/// The stable id of an artifact, such as `"receipt:42"`. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ArtifactId(Arc<str>);

impl ArtifactId {
    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The address of the shared text: the same for every clone of one id.
    pub(crate) fn addr(&self) -> usize {
        Arc::as_ptr(&self.0).cast::<u8>().addr()
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
        ArtifactId(Arc::from(s))
    }
}

impl From<String> for ArtifactId {
    fn from(s: String) -> Self {
        ArtifactId(Arc::from(s))
    }
}

impl From<&String> for ArtifactId {
    fn from(s: &String) -> Self {
        ArtifactId(Arc::from(s.as_str()))
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
#[derive(Clone, Copy, Eq, PartialOrd, Ord)]
pub struct Kind(&'static str);

impl std::hash::Hash for Kind {
    /// The name's hash, consistent with its equality.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl PartialEq for Kind {
    /// The names' equality; the same name is usually the same text, and then the addresses
    /// say it without reading the text.
    fn eq(&self, other: &Kind) -> bool {
        std::ptr::eq(self.0, other.0) || self.0 == other.0
    }
}

impl Kind {
    /// The kind of artifact type `T`.
    pub fn of<T: Artifact>() -> Kind {
        Kind(T::KIND)
    }

    /// Interns a kind name read at run time (from a store or a log), so that it compares equal
    /// to [`Kind::of`] for the type that declares it. Each distinct name is allocated once.
    pub fn intern(name: &str) -> Kind {
        static NAMES: OnceLock<RwLock<HashSet<&'static str>>> = OnceLock::new();
        let names = NAMES.get_or_init(Default::default);
        if let Some(found) = names.read().unwrap_or_else(|e| e.into_inner()).get(name) {
            return Kind(found);
        }
        let mut names = names.write().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = names.get(name) {
            return Kind(found);
        }
        let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
        names.insert(leaked);
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
        fmt::Debug::fmt(self.0, f)
    }
}

impl Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
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
    fn kinds_are_equal_by_name_wherever_their_text_lives() {
        let elsewhere: &'static str = Box::leak(String::from("receipt").into_boxed_str());
        let (here, there) = (Kind("receipt"), Kind(elsewhere));
        assert!(!std::ptr::eq(here.as_str(), there.as_str()));
        assert_eq!(here, there);
        let hasher = std::collections::hash_map::RandomState::new();
        assert_eq!(hasher.hash_one(here), hasher.hash_one(there));
        assert_eq!(here.cmp(&there), std::cmp::Ordering::Equal);
        assert_ne!(here, Kind("receipts"));
        assert_ne!(here, Kind("invoice"));
        assert_eq!(Kind::intern(elsewhere), Kind("receipt"));
    }
}
