//! Intents: `PendingAction` records, their idempotency keys and the view a dispatcher receives.

use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::model::artifact::{Artifact, ArtifactId, Generation};
use crate::model::hash::CommitHash;
use crate::model::trace::TraceParent;

/// Ids starting with this prefix are reserved for intents: only `act` writes there.
pub(crate) const ACTION_ID_PREFIX: &str = "action:";

/// The idempotency key of an intent. The intent is stored at id `action:{key}`, the ledger is
/// keyed by it, and the dispatcher should pass it on so the receiver can deduplicate.
///
/// Cheap to clone. The key shares one allocation with the id of its `PendingAction`:
/// [`ActionKey::artifact_id`] allocates nothing.
#[derive(Clone)]
pub struct ActionKey(
    /// `action:{key}`: the id of the key's `PendingAction`, of which the key is the tail.
    ArtifactId,
);

impl ActionKey {
    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0.as_str()[ACTION_ID_PREFIX.len()..]
    }

    /// The id of the `PendingAction` artifact recorded for this key: `action:{key}`.
    pub fn artifact_id(&self) -> ArtifactId {
        self.0.clone()
    }

    /// [`ActionKey::artifact_id`], borrowed.
    pub(crate) fn id(&self) -> &ArtifactId {
        &self.0
    }

    /// The address of the key's shared text: the same for every clone of one key, so that a
    /// store can recognise a key it handed out without hashing or comparing the text. (Two
    /// equal keys made apart have different addresses.)
    pub(crate) fn addr(&self) -> usize {
        self.0.addr()
    }

    /// Whether `other` is a clone of this key (the same shared text).
    pub(crate) fn is_clone_of(&self, other: &ActionKey) -> bool {
        self.addr() == other.addr()
    }
}

// Equality, order and hash are those of the key's text (as `Borrow<str>` requires), not of
// the shared `action:` prefix.
impl PartialEq for ActionKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for ActionKey {}

impl PartialOrd for ActionKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ActionKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::hash::Hash for ActionKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl Serialize for ActionKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ActionKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl serde::de::Visitor<'_> for KeyVisitor {
            type Value = ActionKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an idempotency key (a string)")
            }
            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<ActionKey, E> {
                Ok(ActionKey::from(key))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

impl fmt::Display for ActionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for ActionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl From<&str> for ActionKey {
    fn from(key: &str) -> Self {
        // One allocation, the shared text: the usual key is assembled on the stack.
        const ON_STACK: usize = 128;
        let prefix = ACTION_ID_PREFIX.len();
        let len = prefix + key.len();
        if len <= ON_STACK {
            let mut text = [0u8; ON_STACK];
            text[..prefix].copy_from_slice(ACTION_ID_PREFIX.as_bytes());
            text[prefix..len].copy_from_slice(key.as_bytes());
            if let Ok(text) = std::str::from_utf8(&text[..len]) {
                return ActionKey(ArtifactId::from(text));
            }
        }
        ActionKey(ArtifactId::from([ACTION_ID_PREFIX, key].concat()))
    }
}

impl From<String> for ActionKey {
    fn from(key: String) -> Self {
        ActionKey::from(key.as_str())
    }
}

impl From<&String> for ActionKey {
    fn from(key: &String) -> Self {
        ActionKey::from(key.as_str())
    }
}

impl std::borrow::Borrow<str> for ActionKey {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

/// A recorded side effect: what should happen (`kind`), its idempotency key and its payload.
///
/// Produces record one with [`Effects::act`](crate::Effects::act); it is stored as an artifact
/// at `action:{key}` and committed with the state that justified it. Delivery state lives in the
/// [ledger](crate::Ledger), never in this record, so delivering never changes its content hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingAction {
    /// What the action does, e.g. `"notify"`; dispatchers route on it.
    pub kind: String,
    /// The idempotency key.
    pub key: String,
    /// The payload, encoded with rmp-serde (named fields).
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// Whether the intent waits for an operator's approval before it is delivered
    /// ([`Effects::act_with_approval`](crate::Effects::act_with_approval)). Part of the
    /// hashed decision; encoded only when set, so the bytes (and hashes) of every intent that
    /// does not ask for approval are what they were before this field existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requires_approval: bool,
    /// The earliest time the intent may be delivered, in milliseconds since the Unix epoch
    /// ([`IntentBuilder::not_before`](crate::runtime::IntentBuilder::not_before)): until then it is
    /// pending but not due. Part of the hashed decision; encoded only when set, like
    /// `requires_approval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<u64>,
    /// The ordering group the intent belongs to
    /// ([`IntentBuilder::group`](crate::runtime::IntentBuilder::group)): the intents of one
    /// group are handed out one at a time, in registration order. Part of the hashed decision;
    /// encoded only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// What a store reads of an intent's `PendingAction` besides its key and kind: whether it
/// waits for approval, when it falls due at the earliest, and its ordering group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct ActionMeta {
    /// [`PendingAction::requires_approval`].
    #[serde(default)]
    pub(crate) requires_approval: bool,
    /// [`PendingAction::not_before`].
    #[serde(default)]
    pub(crate) not_before: Option<u64>,
    /// [`PendingAction::group`].
    #[serde(default)]
    pub(crate) group: Option<String>,
}

/// What the `PendingAction` encoded in `bytes` asks of its delivery (the defaults for bytes
/// that do not decode as one).
pub(crate) fn action_meta(bytes: &[u8]) -> ActionMeta {
    // Every store asks this of every intent it registers. The bytes of a plain intent, as
    // `act` encodes them, hold neither field: recognised without serde (a tenth of the
    // decode's cost), they answer the defaults, as the decode would. The decode reads the two
    // fields, skipping the others (the payload is not copied).
    if plain_action_payload(bytes).is_some() {
        return ActionMeta::default();
    }
    rmp_serde::from_slice::<ActionMeta>(bytes).unwrap_or_default()
}

/// Whether the `PendingAction` encoded in `bytes` asks for approval (`false` for bytes that
/// do not decode as one).
pub(crate) fn requires_approval(bytes: &[u8]) -> bool {
    action_meta(bytes).requires_approval
}

/// When the `PendingAction` encoded in `bytes` may be delivered at the earliest, in
/// milliseconds since the Unix epoch (`None`: at once, or bytes that do not decode as one).
pub(crate) fn not_before(bytes: &[u8]) -> Option<u64> {
    action_meta(bytes).not_before
}

/// When the `PendingAction` encoded in `bytes` may be delivered at the earliest
/// ([`PendingAction::not_before`]; `None`: at once, or bytes that do not decode as one), for a
/// store that reads it from a row's bytes. A plain intent's bytes are recognised without a
/// decode.
pub fn action_not_before(bytes: &[u8]) -> Option<std::time::SystemTime> {
    not_before(bytes).map(|ms| std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ms))
}

/// The ordering group of the `PendingAction` encoded in `bytes` ([`PendingAction::group`];
/// `None`: none, or bytes that do not decode as one), for a store that reads it from a row's
/// bytes.
pub fn action_group(bytes: &[u8]) -> Option<String> {
    action_meta(bytes).group
}

/// Where the payload lies in the `PendingAction` encoded in `bytes` (`None` for bytes that do
/// not decode as one).
fn payload_span(bytes: &[u8]) -> Option<std::ops::Range<usize>> {
    /// Reads the one field, borrowing it from the bytes.
    #[derive(Deserialize)]
    struct Borrowed<'a> {
        #[serde(borrow, with = "serde_bytes")]
        payload: &'a [u8],
    }
    if let Some(span) = plain_action_payload(bytes) {
        return Some(span);
    }
    let payload = rmp_serde::from_slice::<Borrowed<'_>>(bytes).ok()?.payload;
    let start = payload.as_ptr().addr().checked_sub(bytes.as_ptr().addr())?;
    let span = start..start.checked_add(payload.len())?;
    // (A decoder that copied the field instead of borrowing it would point elsewhere.)
    (bytes.get(span.clone())? == payload).then_some(span)
}

/// Where the payload lies in `bytes`, if they are exactly a MessagePack map of the three
/// entries `kind` (a string), `key` (a string) and `payload` (binary), in that order, and
/// nothing after it: a `PendingAction` encoded without its approval field.
fn plain_action_payload(bytes: &[u8]) -> Option<std::ops::Range<usize>> {
    let Some((&0x83, mut rest)) = bytes.split_first() else {
        return None;
    };
    let mut payload_len = 0;
    for (name, binary) in [("kind", false), ("key", false), ("payload", true)] {
        // A field name as rmp-serde writes it: a fixstr.
        let (&marker, after) = rest.split_first()?;
        let after = (usize::from(marker) == 0xa0 + name.len())
            .then_some(after)?
            .strip_prefix(name.as_bytes())?;
        let (len, after) = string_len(after, binary)?;
        rest = after.get(len..)?;
        payload_len = len;
    }
    rest.is_empty().then(|| bytes.len() - payload_len..bytes.len())
}

/// The length of the MessagePack string (or, if `binary`, the binary value) at the start of
/// `bytes`, and what follows its header.
fn string_len(bytes: &[u8], binary: bool) -> Option<(usize, &[u8])> {
    let (&marker, rest) = bytes.split_first()?;
    match (marker, binary) {
        (0xa0..=0xbf, false) => Some((usize::from(marker & 0x1f), rest)),
        (0xd9, false) | (0xc4, true) => {
            let (&len, rest) = rest.split_first()?;
            Some((usize::from(len), rest))
        }
        (0xda, false) | (0xc5, true) => {
            let (len, rest) = rest.split_first_chunk::<2>()?;
            Some((usize::from(u16::from_be_bytes(*len)), rest))
        }
        (0xdb, false) | (0xc6, true) => {
            let (len, rest) = rest.split_first_chunk::<4>()?;
            Some((usize::try_from(u32::from_be_bytes(*len)).ok()?, rest))
        }
        _ => None,
    }
}

impl Artifact for PendingAction {
    const KIND: &'static str = "pending_action";
}

impl PendingAction {
    /// Decodes the payload as `P`.
    pub fn payload<P: DeserializeOwned>(&self) -> Result<P, rmp_serde::decode::Error> {
        rmp_serde::from_slice(&self.payload)
    }
}

/// An intent's payload: its rmp-serde bytes, as handed to the dispatcher. Reads as a byte
/// slice (`&payload[..]`, `payload.len()`).
///
/// Cheap to clone. The payload of an intent a produce recorded is the part of its
/// `PendingAction` encoding that holds it, shared with it: the payload is encoded once, and
/// holds no allocation of its own. Equal when the bytes are.
#[derive(Clone)]
pub struct Payload {
    /// The buffer the payload is part of.
    buffer: Arc<[u8]>,
    /// Where it starts in `buffer`.
    start: u32,
    /// Its length, or [`Payload::REST`].
    len: u32,
}

impl Payload {
    /// [`Payload::len`] of a payload that is the rest of its buffer, whatever its length
    /// (for a buffer longer than `u32::MAX` bytes).
    const REST: u32 = u32::MAX;

    /// The payload inside the `PendingAction` encoded in `record`, sharing it (`None` for
    /// bytes that do not decode as one).
    pub(crate) fn in_record(record: &Arc<[u8]>) -> Option<Payload> {
        payload_span(record).map(|span| Payload::within(record, span))
    }

    /// The payload at `span` in `buffer`, sharing it (a copy of its own where `span` lies
    /// beyond what 32-bit offsets address; empty where it is not a range of `buffer`).
    fn within(buffer: &Arc<[u8]>, span: std::ops::Range<usize>) -> Payload {
        match (u32::try_from(span.start), u32::try_from(span.len())) {
            (Ok(start), Ok(len)) if len != Self::REST && span.start <= span.end && span.end <= buffer.len() => {
                Payload {
                    buffer: buffer.clone(),
                    start,
                    len,
                }
            }
            _ => Payload::from(buffer.get(span).unwrap_or_default()),
        }
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        let rest = &self.buffer[self.start as usize..];
        match self.len {
            Self::REST => rest,
            len => &rest[..len as usize],
        }
    }
}

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// The payload whose bytes are all of `buffer`, sharing it.
impl From<Arc<[u8]>> for Payload {
    fn from(buffer: Arc<[u8]>) -> Self {
        let len = u32::try_from(buffer.len()).ok().filter(|&len| len != Self::REST);
        Payload {
            buffer,
            start: 0,
            len: len.unwrap_or(Self::REST),
        }
    }
}

impl From<Vec<u8>> for Payload {
    fn from(bytes: Vec<u8>) -> Self {
        Payload::from(Arc::<[u8]>::from(bytes))
    }
}

impl From<Box<[u8]>> for Payload {
    fn from(bytes: Box<[u8]>) -> Self {
        Payload::from(Arc::<[u8]>::from(bytes))
    }
}

impl From<std::borrow::Cow<'_, [u8]>> for Payload {
    fn from(bytes: std::borrow::Cow<'_, [u8]>) -> Self {
        Payload::from(Arc::<[u8]>::from(bytes))
    }
}

impl From<&[u8]> for Payload {
    fn from(bytes: &[u8]) -> Self {
        Payload::from(Arc::<[u8]>::from(bytes))
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

impl Eq for Payload {}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self[..], f)
    }
}

/// An intent handed to a dispatcher. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Intent {
    pub(crate) key: ActionKey,
    pub(crate) kind: Arc<str>,
    pub(crate) payload: Payload,
    pub(crate) origin: Origin,
    pub(crate) attempt: u32,
    pub(crate) trace: Option<TraceParent>,
}

/// Where an intent was recorded: the session, the commit and the run that acted it first.
///
/// The delivery ledger is shared by every session of a store, and generations are numbered
/// per session, so a generation alone does not name a commit: the commit hash does. Find the
/// commit with [`Context::commit_of`](crate::Context::commit_of), which checks the hash.
///
/// Cheap to clone: the intents of one commit share its session, hash and generation.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    commit: Arc<CommitOrigin>,
    pub(crate) run: u32,
}

/// The part of an [`Origin`] every intent of one commit has in common.
#[derive(PartialEq, Eq, Hash)]
struct CommitOrigin {
    session: Arc<str>,
    commit: CommitHash,
    generation: Generation,
}

impl Origin {
    /// An origin from its parts, as a store of another crate reads it from its rows.
    pub fn new(session: impl Into<Arc<str>>, commit: CommitHash, generation: Generation, run: u32) -> Self {
        Origin {
            commit: Arc::new(CommitOrigin {
                session: session.into(),
                commit,
                generation,
            }),
            run,
        }
    }

    /// The origin of run `run` of the same commit, sharing its parts.
    pub(crate) fn with_run(&self, run: u32) -> Origin {
        Origin {
            commit: self.commit.clone(),
            run,
        }
    }

    /// The session, shared.
    pub(crate) fn session_name(&self) -> &Arc<str> {
        &self.commit.session
    }

    /// The session (branch) whose commit recorded the intent.
    pub fn session(&self) -> &str {
        &self.commit.session
    }

    /// The hash of the commit that recorded the intent: what identifies it in any session.
    pub fn commit(&self) -> CommitHash {
        self.commit.commit
    }

    /// The commit's generation in [`session`](Origin::session) (a convenience: in another
    /// session, the same generation may be another commit).
    pub fn generation(&self) -> Generation {
        self.commit.generation
    }

    /// The position of the recording run among the commit's runs
    /// (`commit.runs[origin.run()]` names its agent, produce, trigger and reads).
    pub fn run(&self) -> usize {
        self.run as usize
    }
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Origin")
            .field("session", &self.session())
            .field("commit", &self.commit())
            .field("generation", &self.generation())
            .field("run", &self.run)
            .finish()
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "session `{}` commit {} ({}) run {}",
            self.session(),
            self.generation().0,
            self.commit().short(),
            self.run
        )
    }
}

impl Intent {
    /// An intent from its parts, as a store of another crate reads it from its rows: `payload`
    /// is the rmp-serde encoding of the `PendingAction`'s payload, `attempt` the attempt it is
    /// handed to a dispatcher for (0 for a registration).
    pub fn new(
        key: ActionKey,
        kind: impl Into<Arc<str>>,
        payload: impl Into<Payload>,
        origin: Origin,
        attempt: u32,
    ) -> Self {
        Intent {
            key,
            kind: kind.into(),
            payload: payload.into(),
            origin,
            attempt,
            trace: None,
        }
    }

    /// The same intent with `trace` as its [`trace_parent`](Self::trace_parent), as a store
    /// of another crate reads it from its rows.
    pub fn with_trace_parent(mut self, trace: Option<TraceParent>) -> Self {
        self.trace = trace;
        self
    }

    /// The W3C trace context to continue from this intent, if one was kept
    /// (`docs/observability.md`). On an intent handed to a dispatcher it is the delivery
    /// attempt's own: the trace of the produce run that committed the intent, with the
    /// attempt's `delivery` span as the parent — send it downstream as the `traceparent`
    /// header (the webhook dispatcher does). On an intent read from the ledger it is the
    /// producing run's, as the store kept it. Not part of the committed decision: it is kept
    /// beside the intent, never hashed, so a replay or a retry makes the same commit whatever
    /// trace it runs in. `None` for an intent committed outside a produce run (a direct write
    /// of a context), or registered by a build that did not keep trace context.
    pub fn trace_parent(&self) -> Option<&TraceParent> {
        self.trace.as_ref()
    }

    /// The idempotency key; pass it to the receiver so it can deduplicate.
    pub fn key(&self) -> &ActionKey {
        &self.key
    }

    /// The action kind, e.g. `"notify"`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Decodes the payload as `P`.
    pub fn payload<P: DeserializeOwned>(&self) -> Result<P, rmp_serde::decode::Error> {
        rmp_serde::from_slice(&self.payload)
    }

    /// The payload's rmp-serde bytes.
    pub fn payload_bytes(&self) -> &[u8] {
        &self.payload
    }

    /// The generation, in [`Origin::session`], of the commit that recorded the intent (a
    /// convenience for `origin().generation()`).
    pub fn generation(&self) -> Generation {
        self.origin.generation()
    }

    /// Where the intent comes from: the session, the commit (by hash) and the run that
    /// recorded it. [`Context::commit_of`](crate::Context::commit_of) finds the commit;
    /// [`Context::provenance`](crate::Context::provenance) tells the rest: the agent, the
    /// produce, the trigger and what it read.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// Which attempt this is: 1 for the first delivery, 2 after one failure, and so on.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_its_text_and_shares_it_with_its_artifact_id() {
        for text in [
            "k",
            "",
            "notify:order:42",
            "ключ·ü",
            &"x".repeat(121),
            &"y".repeat(122),
            &"é".repeat(200),
        ] {
            let key = ActionKey::from(text);
            assert_eq!(key.as_str(), text);
            assert_eq!(key.to_string(), text);
            assert_eq!(format!("{key:?}"), format!("{text:?}"));
            assert_eq!(key.artifact_id().as_str(), format!("action:{text}"));
            assert_eq!(key, ActionKey::from(text.to_owned()));
        }
        let key = ActionKey::from("notify:1");
        let (a, b) = (key.artifact_id(), key.artifact_id());
        assert!(std::ptr::eq(a.as_str().as_ptr(), b.as_str().as_ptr()), "no copy per id");
    }

    #[test]
    fn keys_compare_hash_and_encode_as_their_text() {
        use std::collections::{BTreeSet, HashMap};
        let keys: BTreeSet<ActionKey> = ["b", "a", "ab"].into_iter().map(ActionKey::from).collect();
        assert_eq!(keys.iter().map(ActionKey::as_str).collect::<Vec<_>>(), ["a", "ab", "b"]);
        let by_key: HashMap<ActionKey, u32> = [(ActionKey::from("k1"), 1)].into_iter().collect();
        assert_eq!(by_key.get("k1"), Some(&1), "Borrow<str> agrees with Hash and Eq");
        let key = ActionKey::from("notify:7");
        let bytes = rmp_serde::to_vec_named(&key).unwrap();
        assert_eq!(bytes, rmp_serde::to_vec_named("notify:7").unwrap());
        assert_eq!(rmp_serde::from_slice::<ActionKey>(&bytes).unwrap(), key);
        assert_eq!(serde_json::to_string(&key).unwrap(), "\"notify:7\"");
        assert_eq!(serde_json::from_str::<ActionKey>("\"notify:7\"").unwrap(), key);
        assert!(serde_json::from_str::<ActionKey>("7").is_err());
    }

    /// The flag as the decode alone reads it.
    fn decoded_flag(bytes: &[u8]) -> bool {
        rmp_serde::from_slice::<PendingAction>(bytes).is_ok_and(|a| a.requires_approval)
    }

    #[test]
    fn a_payload_within_a_buffer_shares_it_and_a_bad_span_is_empty() {
        let buffer: Arc<[u8]> = Arc::from(&b"0123456789"[..]);
        let tail = Payload::within(&buffer, 4..10);
        assert_eq!(&tail[..], b"456789");
        assert!(std::ptr::eq(&tail[..], &buffer[4..]));
        assert_eq!(tail, Payload::from(&b"456789"[..]));
        assert_eq!(&Payload::within(&buffer, 0..0)[..], b"");
        #[allow(clippy::reversed_empty_ranges)]
        for bad in [4..11, 11..12, 6..4] {
            assert_eq!(&Payload::within(&buffer, bad)[..], b"");
        }
        assert_eq!(&Payload::from(buffer.clone())[..], &buffer[..]);
    }

    #[derive(Serialize)]
    struct Reordered {
        payload: serde_bytes::ByteBuf,
        key: String,
        kind: String,
    }

    /// The payload as `payload_span` finds it.
    fn spanned_payload(bytes: &[u8]) -> Option<Vec<u8>> {
        payload_span(bytes).map(|span| bytes[span].to_vec())
    }

    /// The payload as the decode alone reads it.
    fn decoded_payload(bytes: &[u8]) -> Option<Vec<u8>> {
        rmp_serde::from_slice::<PendingAction>(bytes).ok().map(|a| a.payload)
    }

    fn encoded(kind: usize, key: usize, payload: usize, requires_approval: bool) -> Vec<u8> {
        rmp_serde::to_vec_named(&PendingAction {
            kind: "k".repeat(kind),
            key: "x".repeat(key),
            payload: vec![0xc3; payload],
            requires_approval,
            not_before: None,
            group: None,
        })
        .unwrap()
    }

    #[test]
    fn the_approval_flag_of_every_string_and_binary_header_reads_as_the_decode_reads_it() {
        // Lengths on both sides of each header's range: fix, 8-, 16- and 32-bit lengths.
        for len in [0, 1, 31, 32, 255, 256, 65_535, 65_536] {
            for approval in [false, true] {
                for bytes in [
                    encoded(len, 3, 3, approval),
                    encoded(3, len, 3, approval),
                    encoded(3, 3, len, approval),
                ] {
                    assert_eq!(requires_approval(&bytes), approval);
                    assert_eq!(decoded_flag(&bytes), approval);
                    assert_eq!(plain_action_payload(&bytes).is_some(), !approval, "{len} {approval}");
                    assert_eq!(spanned_payload(&bytes), decoded_payload(&bytes), "{len} {approval}");
                }
            }
        }
    }

    #[test]
    fn bytes_not_exactly_a_plain_action_are_left_to_the_decode() {
        let plain = encoded(6, 4, 20, false);
        let asking = encoded(6, 4, 20, true);
        // Every cut of either, and either with a byte after it.
        for bytes in [&plain, &asking] {
            for cut in 0..bytes.len() {
                assert!(plain_action_payload(&bytes[..cut]).is_none());
                assert_eq!(requires_approval(&bytes[..cut]), decoded_flag(&bytes[..cut]));
                assert_eq!(spanned_payload(&bytes[..cut]), decoded_payload(&bytes[..cut]));
            }
            let mut longer = bytes.clone();
            longer.push(0xc3);
            assert!(plain_action_payload(&longer).is_none());
        }
        // The same three entries in another order, or a field renamed, are not recognised;
        // the decode still finds the payload of the reordered record.
        let reordered = rmp_serde::to_vec_named(&Reordered {
            payload: serde_bytes::ByteBuf::from(vec![7u8; 5]),
            key: "k".into(),
            kind: "notify".into(),
        })
        .unwrap();
        assert!(plain_action_payload(&reordered).is_none());
        assert_eq!(spanned_payload(&reordered), Some(vec![7u8; 5]));
        let mut renamed = plain.clone();
        let at = renamed.windows(4).position(|w| w == b"kind").unwrap();
        renamed[at] = b'm';
        assert!(plain_action_payload(&renamed).is_none());
        assert!(!requires_approval(&renamed));
        assert!(plain_action_payload(&rmp_serde::to_vec(&("notify", "k", [1u8])).unwrap()).is_none());
    }
}
