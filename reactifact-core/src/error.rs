//! Errors, one enum per operation. Messages are lowercase and name the id and type involved.

use std::fmt;

use crate::model::action::ActionKey;
use crate::model::artifact::{ArtifactId, Kind};
use crate::outbox::ledger::DeliveryStatus;
use crate::store::StoreError;

/// A boxed error from user code (a produce or a dispatcher).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

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
    /// The effects buffer was used after its produce run had been collected.
    #[error("effects used after the produce run finished (artifact `{id}`); the write was dropped")]
    AfterRun {
        /// The id written.
        id: ArtifactId,
    },
}

/// Applying an operation to the state failed. Nothing of the generation (or, in isolation
/// mode, of the patch) is applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// An update names an id that does not exist.
    #[error("update of unknown artifact `{id}` (kind `{kind}`)")]
    UnknownId {
        /// The id updated.
        id: ArtifactId,
        /// The kind the update wrote.
        kind: Kind,
    },
    /// A write would change the kind stored under an id.
    #[error("artifact `{id}` is a `{stored}`; writing a `{written}` under the same id is refused")]
    KindMismatch {
        /// The id written.
        id: ArtifactId,
        /// The kind stored under it.
        stored: Kind,
        /// The kind written.
        written: Kind,
    },
    /// An intent's id, `action:{key}`, holds an artifact that is not a pending action, so the
    /// intent cannot be recorded.
    #[error("intent `{key}` cannot be recorded: `{id}` holds a `{found}`, not a pending action")]
    ActionIdTaken {
        /// The intent's idempotency key.
        key: ActionKey,
        /// `action:{key}`.
        id: ArtifactId,
        /// The kind stored there.
        found: Kind,
    },
    /// A link names an endpoint that does not exist.
    #[error("link `{from}` -[{name}]-> `{to}`: artifact `{missing}` does not exist")]
    UnknownEndpoint {
        /// The relation's source.
        from: ArtifactId,
        /// The relation's name.
        name: String,
        /// The relation's target.
        to: ArtifactId,
        /// The endpoint that is missing.
        missing: ArtifactId,
    },
}

/// A direct write to a context (seeding, [`Context::create`](crate::Context::create) and
/// friends) failed; nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The value could not be encoded, or a pending action was written directly.
    #[error(transparent)]
    Effect(#[from] EffectError),
    /// The write does not apply to the current state.
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// The durable store could not persist the commit.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The error a produce returns. Converts from any `std::error::Error` with `?`, or build one
/// with [`ProduceError::msg`].
pub struct ProduceError(BoxError);

impl ProduceError {
    /// An error with a plain message.
    pub fn msg(message: impl fmt::Display) -> Self {
        ProduceError(message.to_string().into())
    }

    /// The underlying error.
    pub fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// Unwraps the underlying error.
    pub fn into_inner(self) -> BoxError {
        self.0
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for ProduceError {
    fn from(e: E) -> Self {
        ProduceError(Box::new(e))
    }
}

impl fmt::Debug for ProduceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for ProduceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Why one produce run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunFailure {
    /// The produce returned an error.
    #[error("{0}")]
    Returned(ProduceError),
    /// The trigger artifact could not be read as the produce's input type.
    #[error(transparent)]
    Trigger(#[from] ReadError),
    /// An effect could not be recorded.
    #[error(transparent)]
    Effect(#[from] EffectError),
    /// The produce wrote a type it did not declare.
    #[error("wrote `{id}` of kind `{kind}`, which the produce does not declare; add it to `#[produce(.., also_creates = [..])]` or to the produce's outputs")]
    UndeclaredOutput {
        /// The id written.
        id: ArtifactId,
        /// The undeclared kind.
        kind: Kind,
    },
    /// Its patch does not apply to the state.
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// The produce panicked.
    #[error("panicked: {0}")]
    Panicked(String),
}

/// A produce run that failed, with where it ran.
#[derive(Debug, thiserror::Error)]
#[error("produce `{produce}` (agent `{agent}`) on `{trigger}` failed: {failure}")]
pub struct ProduceFailure {
    /// The agent the produce belongs to.
    pub agent: String,
    /// The produce's name.
    pub produce: String,
    /// The artifact that triggered the run.
    pub trigger: ArtifactId,
    /// What went wrong.
    #[source]
    pub failure: RunFailure,
}

/// The longest delay a [`DispatchError::retry_after`] hint can ask for: one day. A longer one
/// is cut to it.
///
/// Receivers ask for seconds to hours (a rate-limit window, a maintenance slot); a hint of
/// days or of `u64::MAX` seconds is far more likely a bug or a hostile answer than a plan, and
/// must not park an intent for centuries. The cap is not the retry policy's `max_delay`
/// (5 minutes by default): that would cut an honest hour-long `Retry-After` short and send
/// the receiver the very traffic it asked us to hold back.
pub const MAX_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);

/// The error a dispatcher returns: what went wrong, and whether trying again can help.
///
/// Errors are *retryable* unless built with [`DispatchError::permanent`]: a retryable failure
/// is attempted again after the retry policy's backoff (and no earlier than [`retry_after`]
/// (DispatchError::retry_after), if the receiver said when), a permanent one goes straight to
/// the dead letter, and a [`no_route`](DispatchError::no_route) one is held. Converts from any `std::error::Error` with `?` (as retryable).
pub struct DispatchError {
    error: BoxError,
    permanent: bool,
    retry_after: Option<std::time::Duration>,
    no_route: bool,
}

impl DispatchError {
    /// A retryable error with a plain message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Self::retryable(message.to_string())
    }

    /// A failure that may succeed later: a timeout, a 503, a refused connection.
    pub fn retryable(error: impl Into<BoxError>) -> Self {
        DispatchError {
            error: error.into(),
            permanent: false,
            retry_after: None,
            no_route: false,
        }
    }

    /// A failure that will not succeed by trying again: a 400, a rejected payload. The intent
    /// goes to the dead letter at once (it can still be re-armed by hand).
    pub fn permanent(error: impl Into<BoxError>) -> Self {
        DispatchError {
            error: error.into(),
            permanent: true,
            retry_after: None,
            no_route: false,
        }
    }

    /// Asks for the next attempt no earlier than `delay` from now (an HTTP `Retry-After`).
    /// The hint is a floor under the retry policy's backoff, not a replacement: the next
    /// attempt waits for the longer of the two, so `Retry-After: 0` does not hurry a retry.
    /// A delay longer than [`MAX_RETRY_AFTER`] (one day) is cut to it. Ignored for permanent
    /// errors and under a manual policy.
    pub fn retry_after(mut self, delay: std::time::Duration) -> Self {
        self.retry_after = Some(delay.min(MAX_RETRY_AFTER));
        self
    }

    /// The dispatcher has no route for the intent's kind (no handler, no URL): the intent is
    /// **held**, neither failed nor dead, and its attempt, which reached no receiver, is not
    /// counted. A held intent stays in the ledger until [`retry`](crate::Runtime::retry)
    /// re-arms it, once a route exists. [`Router`](crate::Router) answers this for a kind it
    /// has no route for; a dispatcher of your own can too. `error` says which kind and what
    /// to configure; it is recorded as the intent's last error.
    pub fn no_route(error: impl Into<BoxError>) -> Self {
        DispatchError {
            error: error.into(),
            permanent: false,
            retry_after: None,
            no_route: true,
        }
    }

    /// Whether the error says no route handles the intent's kind ([`no_route`](Self::no_route)).
    pub fn is_no_route(&self) -> bool {
        self.no_route
    }

    /// Whether the error is permanent.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The delay the receiver asked for, if any (at most [`MAX_RETRY_AFTER`]).
    pub fn retry_after_hint(&self) -> Option<std::time::Duration> {
        self.retry_after
    }

    /// The underlying error.
    pub fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for DispatchError {
    fn from(e: E) -> Self {
        Self::retryable(e)
    }
}

impl fmt::Debug for DispatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DispatchError")
            .field("error", &self.error)
            .field("permanent", &self.permanent)
            .field("retry_after", &self.retry_after)
            .field("no_route", &self.no_route)
            .finish()
    }
}

impl fmt::Display for DispatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

/// A delivery that failed, as recorded in the ledger.
#[derive(Debug, Clone, thiserror::Error)]
#[error("delivery of action `{key}` ({kind}) failed on attempt {attempt}: {error}")]
pub struct DeliveryFailure {
    /// The action's idempotency key.
    pub key: ActionKey,
    /// The action kind.
    pub kind: String,
    /// The attempt number that failed (1 for the first).
    pub attempt: u32,
    /// The dispatcher's error message, as recorded.
    pub error: String,
    /// `Failed` (retried at `next_attempt_at`, or waiting for `retry`) or `Dead`.
    pub status: DeliveryStatus,
    /// When the retry policy tries again, if it does.
    pub next_attempt_at: Option<std::time::SystemTime>,
}

/// A turn ([`Runtime::run`](crate::Runtime::run)) failed. The failure is already recorded: a
/// failed generation left its events queued, a failed delivery is in the ledger.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A produce run failed (fail-loud mode); the generation was not committed and its events
    /// stay queued. `others` counts further failed runs of the same generation.
    #[error("{first}{}", others_suffix(*others))]
    Produce {
        /// The first failed run in work order.
        first: Box<ProduceFailure>,
        /// How many other runs of the generation failed.
        others: usize,
    },
    /// A delivery failed (fail-loud delivery); the failure is recorded in the ledger and the
    /// intent can be re-armed with `retry`.
    #[error(transparent)]
    Delivery(#[from] DeliveryFailure),
    /// The durable store failed; what it was writing did not take effect (a generation stays
    /// uncommitted with its events queued; a delivery outcome is re-derived from its lease).
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn others_suffix(others: usize) -> String {
    match others {
        0 => String::new(),
        1 => " (and 1 other run of the generation)".to_owned(),
        n => format!(" (and {n} other runs of the generation)"),
    }
}

/// [`Runtime::flush`](crate::Runtime::flush) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlushError {
    /// No dispatcher is configured, so nothing can be delivered.
    #[error("no dispatcher is configured; add one with RuntimeBuilder::dispatcher")]
    NoDispatcher,
    /// A delivery failed (fail-loud delivery); it is recorded in the ledger.
    #[error(transparent)]
    Delivery(#[from] DeliveryFailure),
    /// The durable store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// [`Runtime::retry`](crate::Runtime::retry) refused to re-arm an intent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RetryError {
    /// The ledger has no intent with this key.
    #[error("no intent with key `{0}` in the delivery ledger")]
    UnknownKey(ActionKey),
    /// Only failed intents can be re-armed.
    #[error("intent `{key}` is {status}, not failed; only failed intents can be retried")]
    NotFailed {
        /// The key.
        key: ActionKey,
        /// Its current status.
        status: DeliveryStatus,
    },
    /// The durable store could not record the re-arming; the intent is still failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
