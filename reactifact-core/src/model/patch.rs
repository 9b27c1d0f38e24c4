//! Operations: the compiled form of effects that the runtime applies and records in the log.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::action::{ActionKey, ActionMeta, Payload, PendingAction, ACTION_ID_PREFIX};
use crate::model::artifact::{self, Artifact, ArtifactId, Kind};
use crate::model::hash::{self, ContentHash};
use crate::model::relation::Relation;

/// Recording an effect in a produce's buffer failed; reported when the produce's patch is
/// collected, and fails that produce run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EffectError {
    /// The value could not be encoded.
    #[error("encoding artifact `{id}` of kind `{kind}` failed: {source}")]
    Encode {
        /// The id written.
        id: ArtifactId,
        /// The kind written.
        kind: Kind,
        /// What rmp-serde reported.
        #[source]
        source: rmp_serde::encode::Error,
    },
    /// An intent payload could not be encoded.
    #[error("encoding the payload of action `{key}` ({kind}) failed: {source}")]
    EncodePayload {
        /// The action's idempotency key.
        key: ActionKey,
        /// The action kind.
        kind: String,
        /// What rmp-serde reported.
        #[source]
        source: rmp_serde::encode::Error,
    },
    /// `PendingAction` records are written only through `act`, which registers them in the
    /// delivery ledger.
    #[error("artifact `{id}`: pending actions are recorded with `act(kind, key, payload)`, not written directly")]
    ActionWrittenDirectly {
        /// The id written.
        id: ArtifactId,
    },
    /// Ids starting with `action:` are reserved for the intents `act` records; writing another
    /// kind there would shadow (or be shadowed by) an intent.
    #[error("artifact `{id}`: ids starting with `action:` are reserved for intents recorded with `act(kind, key, payload)`; writing a `{kind}` there is refused")]
    ReservedForIntents {
        /// The id written.
        id: ArtifactId,
        /// The kind written.
        kind: Kind,
    },
    /// An intent names an empty ordering group ([`IntentBuilder::group`](crate::runtime::IntentBuilder::group)).
    #[error("action `{key}`: an ordering group needs a name; leave the group out for an intent without one")]
    EmptyGroup {
        /// The action's idempotency key.
        key: ActionKey,
    },
    /// The effects buffer was used after its produce run had been collected.
    #[error("effects used after the produce run finished (artifact `{id}`); the write was dropped")]
    AfterRun {
        /// The id written.
        id: ArtifactId,
    },
}

/// How a put treats an id that already exists at commit time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum PutMode {
    /// Create, or refresh the existing artifact (a new version only if the content differs).
    Create,
    /// Create or replace; the same rule as `Create`, recorded under its own name.
    Upsert,
    /// Create only if the id does not exist; otherwise skipped.
    CreateOnce,
    /// Replace an existing artifact; an unknown id fails the commit.
    Update,
}

/// One operation of a patch. Patches are built by [`Effects`](crate::Effects) and by direct
/// writes; they are readable in the commit log but never built by users.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub enum Op {
    /// Write an artifact.
    Put {
        /// How an existing id is treated.
        mode: PutMode,
        /// The id written.
        id: ArtifactId,
        /// The artifact's kind.
        kind: Kind,
        /// SHA-256 of `bytes`.
        hash: ContentHash,
        /// The rmp-serde encoding (not part of the commit hash; `hash` stands for it).
        #[serde(skip)]
        bytes: Arc<[u8]>,
    },
    /// Delete an artifact and every relation touching it; a missing id is a no-op.
    Delete {
        /// The id deleted.
        id: ArtifactId,
    },
    /// Add a relation; both endpoints must exist.
    Link(Relation),
    /// Remove a relation; a missing relation is a no-op.
    Unlink(Relation),
    /// Record an intent: a `PendingAction` at `action:{key}` ([`ActionKey::artifact_id`],
    /// which [`Op::id`] returns), skipped if that id exists.
    #[serde(serialize_with = "serialize_act")]
    Act {
        /// The idempotency key.
        key: ActionKey,
        /// The action kind, e.g. `"notify"`.
        action: Arc<str>,
        /// SHA-256 of the `PendingAction` encoding.
        hash: ContentHash,
        /// The `PendingAction` encoding.
        bytes: Arc<[u8]>,
        /// The payload's encoding, as handed to the dispatcher: the payload inside `bytes`,
        /// shared with them (unless a store's log held another: `Context::verify` reports
        /// that).
        payload: Payload,
    },
}

/// An act serializes as it did while it held its id: `key`, `action`, `id` and `hash` (not
/// the bytes, which `hash` stands for), as the commit hash reads them.
fn serialize_act<S: serde::Serializer>(
    key: &ActionKey,
    action: &Arc<str>,
    hash: &ContentHash,
    _bytes: &Arc<[u8]>,
    _payload: &Payload,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut act = serializer.serialize_struct("Act", 4)?;
    act.serialize_field("key", key)?;
    act.serialize_field("action", action)?;
    act.serialize_field("id", key.id())?;
    act.serialize_field("hash", hash)?;
    act.end()
}

/// The action kind as a shared string: the kinds this thread used last are kept (a program
/// has a handful), so an intent of a known kind allocates no copy of its name.
fn interned(kind: &str) -> Arc<str> {
    /// How many kinds a thread keeps.
    const KEPT: usize = 8;
    thread_local! {
        static KINDS: std::cell::RefCell<Vec<Arc<str>>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    KINDS.with_borrow_mut(|kinds| {
        if let Some(at) = kinds.iter().position(|k| **k == *kind) {
            return kinds[at].clone();
        }
        let new: Arc<str> = Arc::from(kind);
        if kinds.len() == KEPT {
            kinds.remove(0);
        }
        kinds.push(new.clone());
        new
    })
}

impl Op {
    /// The artifact this operation writes or deletes (the source, for relations).
    pub fn id(&self) -> &ArtifactId {
        match self {
            Op::Put { id, .. } | Op::Delete { id } => id,
            Op::Act { key, .. } => key.id(),
            Op::Link(r) | Op::Unlink(r) => &r.from,
        }
    }

    /// The kind this operation creates, if it is one that must be declared by its produce:
    /// creating puts and acts. Updates, deletes and relations need no declaration.
    pub(crate) fn created_kind(&self) -> Option<Kind> {
        match self {
            Op::Put {
                mode: PutMode::Update, ..
            } => None,
            Op::Put { kind, .. } => Some(*kind),
            Op::Act { .. } => Some(Kind::of::<PendingAction>()),
            _ => None,
        }
    }

    pub(crate) fn put<T: Artifact>(mode: PutMode, id: ArtifactId, value: &T) -> Result<Op, EffectError> {
        if T::KIND == PendingAction::KIND {
            return Err(EffectError::ActionWrittenDirectly { id });
        }
        if id.as_str().starts_with(ACTION_ID_PREFIX) {
            return Err(EffectError::ReservedForIntents {
                id,
                kind: Kind::of::<T>(),
            });
        }
        match artifact::encode_shared(value) {
            Ok(bytes) => Ok(Op::Put {
                mode,
                hash: hash::content_hash(&bytes),
                kind: Kind::of::<T>(),
                id,
                bytes,
            }),
            Err(source) => Err(EffectError::Encode {
                id,
                kind: Kind::of::<T>(),
                source,
            }),
        }
    }

    /// An intent of kind `action` under `key`, stored at `key.artifact_id()`.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn act<P: Serialize + ?Sized>(action: &str, key: ActionKey, payload: &P) -> Result<Op, EffectError> {
        Op::act_as(action, key, payload, &ActionMeta::default())
    }

    /// [`Op::act`], for an intent that asks what `meta` says of its delivery (approval, a
    /// time before which it is not due).
    pub(crate) fn act_as<P: Serialize + ?Sized>(
        action: &str,
        key: ActionKey,
        payload: &P,
        meta: &ActionMeta,
    ) -> Result<Op, EffectError> {
        if meta.group.as_deref() == Some("") {
            return Err(EffectError::EmptyGroup { key });
        }
        /// Encodes exactly like [`PendingAction`], without copying its fields first.
        #[derive(Serialize)]
        struct PendingActionRef<'a> {
            kind: &'a str,
            key: &'a str,
            #[serde(with = "serde_bytes")]
            payload: &'a [u8],
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            requires_approval: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            not_before: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            group: Option<&'a str>,
        }
        // Encoded once for good, inside the record (the payload's own encoding is written into
        // a buffer the thread keeps): the payload the dispatcher gets is that part of the
        // record's bytes.
        let recorded = artifact::with_encoded(payload, |encoded| {
            let record = PendingActionRef {
                kind: action,
                key: key.as_str(),
                payload: encoded,
                requires_approval: meta.requires_approval,
                not_before: meta.not_before,
                group: meta.group.as_deref(),
            };
            let bytes = artifact::encode_shared(&record)?;
            let payload = Payload::in_record(&bytes).unwrap_or_else(|| Payload::from(encoded));
            Ok((bytes, payload))
        });
        let (bytes, payload) = match recorded {
            Ok(Ok(recorded)) => recorded,
            Err(source) => {
                return Err(EffectError::EncodePayload {
                    key,
                    kind: action.to_owned(),
                    source,
                })
            }
            Ok(Err(source)) => {
                return Err(EffectError::Encode {
                    id: key.artifact_id(),
                    kind: Kind::of::<PendingAction>(),
                    source,
                })
            }
        };
        Ok(Op::Act {
            hash: hash::content_hash(&bytes),
            action: interned(action),
            key,
            bytes,
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_act_stores_a_pending_action_that_decodes() {
        let key = ActionKey::from("k1");
        let op = Op::act("notify", key.clone(), &("ada", 42u32)).unwrap();
        let Op::Act { bytes, payload, .. } = &op else {
            panic!("not an act: {op:?}");
        };
        assert_eq!(op.id().as_str(), "action:k1");
        // The payload is the part of the record that holds it, not a copy.
        let at = bytes.len() - payload.len();
        assert!(std::ptr::eq(&payload[..], &bytes[at..]));
        let action: PendingAction = rmp_serde::from_slice(bytes).unwrap();
        assert_eq!((action.kind.as_str(), action.key.as_str()), ("notify", "k1"));
        assert_eq!(&action.payload[..], &payload[..]);
        assert_eq!(action.payload::<(String, u32)>().unwrap(), ("ada".to_owned(), 42));
        assert!(!action.requires_approval);
        assert!(!crate::model::action::requires_approval(bytes));
    }

    /// A payload whose `Serialize` fails, panics, or records an act of its own while its
    /// encoding is being written.
    struct Awkward(u8);

    impl Serialize for Awkward {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::Error as _;
            match self.0 {
                0 => Err(S::Error::custom("fails mid-encoding")),
                1 => panic!("panics mid-encoding"),
                _ => {
                    // The payload buffer is lent out: this act encodes into one of its own.
                    let inner = Op::act("inner", ActionKey::from("in"), &"nested").unwrap();
                    let Op::Act { payload, .. } = inner else { unreachable!() };
                    s.serialize_bytes(&payload)
                }
            }
        }
    }

    fn payload_of(op: &Op) -> Vec<u8> {
        let Op::Act { bytes, payload, .. } = op else {
            panic!("not an act: {op:?}");
        };
        let action: PendingAction = rmp_serde::from_slice(bytes).unwrap();
        assert_eq!(action.payload, payload[..], "the payload is the record's");
        action.payload
    }

    #[test]
    fn an_act_whose_payload_fails_panics_or_nests_leaves_the_next_act_whole() {
        let key = ActionKey::from("k");
        assert!(matches!(
            Op::act("notify", key.clone(), &Awkward(0)),
            Err(EffectError::EncodePayload { .. })
        ));
        let panicked = std::panic::catch_unwind(|| Op::act("notify", ActionKey::from("k"), &Awkward(1)));
        assert!(panicked.is_err());
        let nested = Op::act("notify", key.clone(), &Awkward(2)).unwrap();
        let expected =
            rmp_serde::to_vec_named(&serde_bytes::Bytes::new(&rmp_serde::to_vec_named(&"nested").unwrap())).unwrap();
        assert_eq!(payload_of(&nested), expected);
        let plain = Op::act("notify", key, &("ada", 42u32)).unwrap();
        assert_eq!(payload_of(&plain), rmp_serde::to_vec_named(&("ada", 42u32)).unwrap());
    }

    #[test]
    fn an_act_that_requires_approval_says_so_in_its_hashed_bytes_and_no_other_act_changes() {
        let key = ActionKey::from("k1");
        let plain = Op::act("notify", key.clone(), &"p").unwrap();
        let meta = ActionMeta {
            requires_approval: true,
            ..ActionMeta::default()
        };
        let approval = Op::act_as("notify", key.clone(), &"p", &meta).unwrap();
        let (Op::Act { bytes: a, hash: ha, .. }, Op::Act { bytes: b, hash: hb, .. }) = (&plain, &approval) else {
            panic!("not acts");
        };
        assert_ne!(ha, hb, "the approval is part of the hashed decision");
        assert!(crate::model::action::requires_approval(b));
        assert!(!crate::model::action::requires_approval(a));
        // The bytes of an act without approval are those of the three-field record.
        let three = rmp_serde::to_vec_named(&PendingAction {
            kind: "notify".into(),
            key: "k1".into(),
            payload: rmp_serde::to_vec_named(&"p").unwrap(),
            requires_approval: false,
            not_before: None,
            group: None,
        })
        .unwrap();
        assert_eq!(&a[..], &three[..]);
        let decoded: PendingAction = rmp_serde::from_slice(b).unwrap();
        assert!(decoded.requires_approval);
    }
}
