//! Work a store or a session started on another thread and must see end before it is dropped.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// A count of the work under way.
#[derive(Default)]
pub(crate) struct InFlight {
    running: Mutex<usize>,
    ended: Condvar,
}

/// One piece of work under way: it ends when this is dropped (after the work ran, if it
/// panicked, or if it never ran).
pub(crate) struct Running(Arc<InFlight>);

impl InFlight {
    /// Counts one piece of work under way until the guard is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> Running {
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Running(self.clone())
    }

    /// Waits until no work is under way, at most `limit`; `false` if some still was.
    pub(crate) fn wait(&self, limit: Duration) -> bool {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let (running, _) = self
            .ended
            .wait_timeout_while(running, limit, |running| *running > 0)
            .unwrap_or_else(PoisonError::into_inner);
        *running == 0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.0.running.lock().unwrap_or_else(PoisonError::into_inner);
        *running -= 1;
        if *running == 0 {
            self.0.ended.notify_all();
        }
    }
}
