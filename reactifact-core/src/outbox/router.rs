//! Typed routing: a handler per action kind, with the payload decoded to its type.

use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::model::action::{ActionKey, Intent, Origin};
use crate::model::artifact::Generation;
use crate::model::trace::TraceParent;
use crate::outbox::dispatcher::{DispatchError, DispatchFuture, Dispatcher};

/// What a [`Router`] handler receives: the intent with its payload decoded.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ActionCall<P> {
    /// The idempotency key: pass it to the receiver so it can deduplicate.
    pub key: ActionKey,
    /// Which attempt this is: 1 for the first delivery.
    pub attempt: u32,
    /// Where the intent was recorded: the session, the commit (by hash) and the run.
    /// `context.commit_of(&call.origin)?` finds the commit, and its
    /// `runs[call.origin.run()]` names the agent, produce, trigger and reads.
    pub origin: Origin,
    /// The generation of that commit in its session (a convenience for
    /// `origin.generation()`; generations are numbered per session).
    pub generation: Generation,
    /// The decoded payload.
    pub payload: P,
    /// The delivery attempt's W3C trace context, to send downstream
    /// ([`Intent::trace_parent`]).
    pub trace_parent: Option<TraceParent>,
}

type Route = dyn Fn(Intent) -> DispatchFuture<'static> + Send + Sync;

/// A dispatcher that hands each intent to the handler registered for its kind, with the
/// payload decoded to the handler's type.
///
/// An intent whose kind has no route is *held* (status [`Held`](crate::DeliveryStatus::Held)),
/// not dropped and not counted as an attempt; [`Runtime::retry`](crate::Runtime::retry)
/// re-arms it once a route exists. A payload that does not decode as the route's type is a
/// permanent error: retrying cannot fix it.
///
/// ```
/// use reactifact_core::{ActionCall, DispatchError, Router};
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct SendEmail { to: String }
///
/// let router = Router::new().on("send_email", |call: ActionCall<SendEmail>| async move {
///     println!("mail {} with idempotency key {}", call.payload.to, call.key);
///     Ok::<(), DispatchError>(())
/// });
/// # fn takes(_: impl reactifact_core::Dispatcher) {}
/// # takes(router);
/// ```
#[derive(Clone, Default)]
pub struct Router {
    routes: foldhash::HashMap<String, Arc<Route>>,
}

impl Router {
    /// A router with no route.
    pub fn new() -> Self {
        Self::default()
    }

    /// Routes intents of `kind` to `handler`, their payload decoded as `P`. A second route for
    /// the same kind replaces the first.
    pub fn on<P, F, Fut>(mut self, kind: &str, handler: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(ActionCall<P>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), DispatchError>> + Send + 'static,
    {
        let route = move |intent: Intent| -> DispatchFuture<'static> {
            match intent.payload::<P>() {
                Ok(payload) => Box::pin(handler(ActionCall {
                    key: intent.key().clone(),
                    attempt: intent.attempt(),
                    origin: intent.origin().clone(),
                    generation: intent.generation(),
                    payload,
                    trace_parent: intent.trace_parent().copied(),
                })),
                Err(e) => {
                    let error = DispatchError::permanent(format!(
                        "the payload of action `{}` ({}) does not decode as {}: {e}",
                        intent.key(),
                        intent.kind(),
                        std::any::type_name::<P>()
                    ));
                    Box::pin(std::future::ready(Err(error)))
                }
            }
        };
        self.routes.insert(kind.to_owned(), Arc::new(route));
        self
    }

    /// The kinds that have a route.
    pub fn kinds(&self) -> impl Iterator<Item = &str> + '_ {
        self.routes.keys().map(String::as_str)
    }
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut kinds: Vec<_> = self.kinds().collect();
        kinds.sort_unstable();
        f.debug_struct("Router").field("kinds", &kinds).finish()
    }
}

impl Dispatcher for Router {
    fn dispatch(&self, intent: Intent) -> impl Future<Output = Result<(), DispatchError>> + Send {
        match self.routes.get(intent.kind()) {
            Some(route) => route(intent),
            None => {
                let error = DispatchError::no_route(format!(
                    "no route handles action kind `{}`; add one and `retry` the intent",
                    intent.kind()
                ));
                Box::pin(std::future::ready(Err(error)))
            }
        }
    }
}
