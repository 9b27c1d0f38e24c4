//! The outbox's engine: the drain that claims intents from a store's outbox and hands them to
//! a dispatcher with retries, backoff and a dead letter; the standalone drainer; the
//! dispatcher trait; and the typed router. The ledger itself is the store's (`store/outbox.rs`,
//! read through `store/ledger.rs`).

pub(crate) mod dispatcher;
pub(crate) mod drain;
pub(crate) mod drainer;
pub(crate) mod router;
