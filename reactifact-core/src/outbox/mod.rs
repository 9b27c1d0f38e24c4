//! The outbox's engine: the drain that claims intents from a store's outbox and hands them to
//! a dispatcher with retries, backoff and a dead letter, and its report; the standalone
//! drainer; the delivery options a drainer and a runtime take alike; the dispatcher trait;
//! the typed router; and this process's lease owners, with the take-over of the claims of
//! owners that are provably dead. The ledger itself is the store's (`store/outbox.rs`, read
//! through `store/ledger.rs`).

pub(crate) mod dispatcher;
pub(crate) mod drain;
pub(crate) mod drainer;
pub(crate) mod options;
pub(crate) mod owner;
pub(crate) mod report;
pub(crate) mod router;
