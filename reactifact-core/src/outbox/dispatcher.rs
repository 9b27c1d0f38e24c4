//! Dispatchers: the user code that performs an intent's I/O.

use std::future::Future;
use std::pin::Pin;

use crate::error::DispatchError;
use crate::model::action::Intent;

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

pub(crate) type DispatchFuture<'a> = Pin<Box<dyn Future<Output = Result<(), DispatchError>> + Send + 'a>>;

/// Object-safe form of [`Dispatcher`], so the runtime can hold any dispatcher.
pub(crate) trait ErasedDispatcher: Send + Sync {
    fn dispatch_boxed(&self, intent: Intent) -> DispatchFuture<'_>;
}

impl<D: Dispatcher> ErasedDispatcher for D {
    fn dispatch_boxed(&self, intent: Intent) -> DispatchFuture<'_> {
        Box::pin(self.dispatch(intent))
    }
}
