//! The outbox: the delivery ledger, the drain that hands intents to a dispatcher with
//! retries, backoff and a dead letter, the dispatcher trait, and the typed router.

pub(crate) mod dispatcher;
pub(crate) mod drain;
pub(crate) mod drainer;
pub(crate) mod ledger;
pub(crate) mod router;
