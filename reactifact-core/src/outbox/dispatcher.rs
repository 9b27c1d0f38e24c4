//! Dispatchers: the user code that performs an intent's I/O.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::model::action::Intent;
use crate::outbox::drain::{self, AttemptSlot};

/// A boxed error from user code (a produce or a dispatcher).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

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
/// is attempted again after the retry policy's backoff (and no earlier than
/// [`retry_after`](DispatchError::retry_after), if the receiver said when), a permanent one
/// goes straight to the dead letter, and a [`no_route`](DispatchError::no_route) one is held.
/// Converts from any `std::error::Error` with `?` (as retryable).
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

/// Performs the I/O of an intent: sends the email, calls the webhook.
///
/// The outbox calls it only after the intent's generation has committed, once per pending
/// intent. Pass [`Intent::key`] on to the receiver as its idempotency key: delivery is
/// at-least-once, and the effect is exactly-once where the receiver honours the key.
///
/// A plain async closure is a dispatcher:
///
/// ```
/// use reactifact_core::{DispatchError, Intent};
///
/// let dispatcher = |intent: Intent| async move {
///     println!("send {} with key {}", intent.kind(), intent.key());
///     Ok::<(), DispatchError>(())
/// };
/// # fn takes(_: impl reactifact_core::Dispatcher) {}
/// # takes(dispatcher);
/// ```
pub trait Dispatcher: Send + Sync + 'static {
    /// Delivers one intent. An error is recorded in the ledger with the attempt number.
    fn dispatch(&self, intent: Intent) -> impl Future<Output = Result<(), DispatchError>> + Send;
}

impl<F, Fut> Dispatcher for F
where
    F: Fn(Intent) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), DispatchError>> + Send,
{
    fn dispatch(&self, intent: Intent) -> impl Future<Output = Result<(), DispatchError>> + Send {
        self(intent)
    }
}

/// A boxed dispatch, as a [`Router`](crate::Router) holds its routes'.
pub(crate) type DispatchFuture<'a> = Pin<Box<dyn Future<Output = Result<(), DispatchError>> + Send + 'a>>;

/// Object-safe form of [`Dispatcher`], so the runtime can hold any dispatcher.
pub(crate) trait ErasedDispatcher: Send + Sync {
    /// An empty place for the drain's attempts to deliver ([`drain::attempt`]), one at a time.
    /// Built here, where the dispatcher's future has a known type: the attempt and the
    /// dispatch it wraps live inside the slot, and an attempt that ends where it starts leaves
    /// the slot for the next one, so such attempts allocate nothing.
    fn slot(&self) -> AttemptSlot<'_>;
}

impl<D: Dispatcher> ErasedDispatcher for D {
    fn slot(&self) -> AttemptSlot<'_> {
        drain::slot(self)
    }
}
