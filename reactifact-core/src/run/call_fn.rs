//! The closure of a recorded call: one that takes nothing, or one handed the request.

use std::future::Future;

/// The closure a recorded call runs ([`ProduceCall::record`](crate::ProduceCall::record),
/// [`ProduceCall::record_metered`](crate::ProduceCall::record_metered)), in either of two
/// forms:
///
/// - one that takes nothing and borrows what it needs: `|| async { model.ask(&request).await }`;
/// - one handed the request once it is recorded, so that a `move` closure owns it instead of
///   borrowing it: `move |request: Request| async move { model.ask(&request).await }` (name the
///   parameter's type: the form is chosen by the closure's parameters).
///
/// `M` tells the two apart (`()` or `(Q,)`) and is inferred; nothing else implements this.
pub trait CallFn<Q, M> {
    /// The future the closure returns.
    type Future: Future;

    /// The closure with its request: the form that takes none drops the request here, so
    /// that it is not held while the call is awaited (a request that is not `Sync` keeps the
    /// produce's future `Send`).
    fn bind(self, request: Q) -> impl FnOnce() -> Self::Future;
}

impl<F, Fut, Q> CallFn<Q, ()> for F
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    type Future = Fut;

    fn bind(self, request: Q) -> impl FnOnce() -> Fut {
        drop(request);
        self
    }
}

impl<F, Fut, Q> CallFn<Q, (Q,)> for F
where
    F: FnOnce(Q) -> Fut,
    Fut: Future,
{
    type Future = Fut;

    fn bind(self, request: Q) -> impl FnOnce() -> Fut {
        move || self(request)
    }
}
