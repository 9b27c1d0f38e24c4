//! For operators: the delivery ledger of a store and what it records of each intent, the
//! reports of drains, and the runs a serving runtime parked.
//!
//! A [`Ledger`] reads and acts on a store's outbox (list, count, approve, reject, retry,
//! cancel, purge); each intent's row is a [`Delivery`] with its [`DeliveryStatus`], its
//! attempts and, while in flight, its [`Lease`].

pub use crate::model::delivery::{Attempt, AttemptOutcome, Decision, Delivery, DeliveryStatus, FenceToken, Lease};
pub use crate::model::parked::{FailedRun, Parked, PARKED_ID_PREFIX, RETRY_TIMER_PREFIX};
pub use crate::outbox::drain::DeliveryFailure;
pub use crate::outbox::owner::reclaim_dead_owners;
pub use crate::outbox::report::DrainReport;
pub use crate::store::ledger::Ledger;
pub use crate::store::outbox::{LedgerQuery, Page, PurgeFilter, Scope, StatusCounts};
pub use crate::store::prune::{PruneOptions, PruneReport, PruneSummary, DEFAULT_PRUNE_BATCH};
