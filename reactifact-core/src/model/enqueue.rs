//! An intent enqueued outside a commit: in a transaction of the application's own (the
//! transactional outbox), for the store's drainers to deliver like any other.

use std::time::SystemTime;

use serde::Serialize;

use crate::model::action::{ActionKey, ActionMeta, Intent, Origin};
use crate::model::artifact::Generation;
use crate::model::delivery::{ceil_millis, unix_millis, NewIntent, FAR_FUTURE};
use crate::model::hash::CommitHash;
use crate::model::patch::{EffectError, Op};

/// The session an [`Enqueue`] registers its intent under unless told otherwise.
pub const ENQUEUED_SESSION: &str = "enqueued";

/// An intent for a store's outbox that no commit made: build it, then register it inside a
/// transaction the application owns, beside its own rows — PostgreSQL:
/// `PostgresOutbox::register(&tx, &[intent], now)` on a tokio-postgres transaction, or
/// `PostgresOutbox::register_sqlx(&mut tx, ..)` on an sqlx one (feature `sqlx` of
/// `reactifact-postgres`); SQLite: `store::register_in` on a rusqlite
/// transaction of the store's file.
/// The transaction commits the row and the intent together, or neither: a rolled-back
/// transaction leaves nothing to deliver.
///
/// The store's drainers deliver it as they deliver a committed intent — claims, leases,
/// fencing, retries, the attempt history, approval, ordering groups, `not_before` — and the
/// CLI and the ledger list it. It is **outside the hash chain**: no commit acted it, so its
/// origin names no commit (the all-zero hash, generation 0), `verify` and `replay` do not
/// check it against a log, and `why` finds no run behind it. Its key is its idempotency key,
/// as for any intent: a key the outbox holds already (or purged) is not registered again.
///
/// ```
/// use reactifact_core::store::Enqueue;
///
/// let intent = Enqueue::new("email", "welcome:42", &"ada@example.com")
///     .group("user:42")
///     .build()?;
/// assert_eq!(intent.intent.origin().session(), "enqueued");
/// assert_eq!(intent.group().as_deref(), Some("user:42"));
/// # Ok::<(), reactifact_core::error::EffectError>(())
/// ```
#[must_use = "an intent is registered only by a store's `register`"]
pub struct Enqueue<'a, P: ?Sized> {
    kind: &'a str,
    key: ActionKey,
    payload: &'a P,
    session: &'a str,
    meta: ActionMeta,
}

impl<'a, P: Serialize + ?Sized> Enqueue<'a, P> {
    /// An intent of `kind` with idempotency `key` and `payload` (encoded with rmp-serde, named
    /// fields, as a produce's intents are), under the session [`ENQUEUED_SESSION`].
    pub fn new(kind: &'a str, key: impl Into<ActionKey>, payload: &'a P) -> Self {
        Enqueue {
            kind,
            key: key.into(),
            payload,
            session: ENQUEUED_SESSION,
            meta: ActionMeta::default(),
        }
    }

    /// Registers it under `session` (default [`ENQUEUED_SESSION`]): drainers and scopes that
    /// name sessions see it there.
    pub fn session(mut self, session: &'a str) -> Self {
        self.session = session;
        self
    }

    /// Puts it in an ordering group, as
    /// [`IntentBuilder::group`](crate::runtime::IntentBuilder::group) does.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.meta.group = Some(group.into());
        self
    }

    /// Not delivered before `at`, as
    /// [`IntentBuilder::not_before`](crate::runtime::IntentBuilder::not_before) says.
    pub fn not_before(mut self, at: SystemTime) -> Self {
        let at = ceil_millis(at.min(SystemTime::UNIX_EPOCH + FAR_FUTURE));
        self.meta.not_before = Some(unix_millis(at));
        self
    }

    /// Waits for an operator's approval before delivery.
    pub fn with_approval(mut self) -> Self {
        self.meta.requires_approval = true;
        self
    }

    /// The intent, encoded as a produce's `act` encodes one.
    ///
    /// # Errors
    /// [`EffectError::EncodePayload`] if the payload does not encode,
    /// [`EffectError::EmptyGroup`] for an empty group name.
    pub fn build(self) -> Result<NewIntent, EffectError> {
        let Op::Act {
            hash,
            action,
            key,
            bytes,
            payload,
        } = Op::act_as(self.kind, self.key, self.payload, &self.meta)?
        else {
            unreachable!("act_as makes an act");
        };
        let origin = Origin::new(self.session, CommitHash([0; 32]), Generation(0), 0);
        Ok(NewIntent {
            intent: Intent::new(key, &*action, payload, origin, 0),
            bytes,
            action_hash: hash,
        })
    }
}
