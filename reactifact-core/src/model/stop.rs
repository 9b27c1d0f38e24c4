//! The stop signal a runtime's turns, its delivery and drainers watch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Asks a running turn to stop. Cheap to clone; get one from
/// [`Runtime::stop_handle`](crate::Runtime::stop_handle).
///
/// A generation still running is cancelled (nothing of it is committed, its events stay
/// queued); a delivery already handed to the dispatcher finishes and is recorded. The turn
/// returns [`TurnOutcome::Stopped`](crate::runtime::TurnOutcome::Stopped). A stop requested while no turn runs stops the next one.
#[derive(Clone, Debug, Default)]
pub struct StopHandle(Arc<StopState>);

#[derive(Debug, Default)]
struct StopState {
    requested: AtomicBool,
    notify: Notify,
}

impl StopHandle {
    /// Requests the stop.
    pub fn stop(&self) {
        self.0.requested.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    /// Whether a stop is requested and not yet honoured.
    pub fn is_requested(&self) -> bool {
        self.0.requested.load(Ordering::SeqCst)
    }

    pub(crate) fn clear(&self) {
        self.0.requested.store(false, Ordering::SeqCst);
    }

    pub(crate) async fn requested(&self) {
        loop {
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_requested() {
                return;
            }
            notified.await;
        }
    }
}
