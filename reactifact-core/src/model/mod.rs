//! The model: values with no behaviour of their own — artifacts and their ids, kinds and
//! versions, intents and their keys, events, hashes, the operations a patch is made of, lease
//! owners with the rule that proves one dead, and the table of what a delivery's outcome does
//! to its ledger row.
//!
//! Nothing here imports from the rest of the crate.

pub(crate) mod action;
pub(crate) mod artifact;
pub(crate) mod build_error;
pub(crate) mod call;
pub(crate) mod delivery;
pub(crate) mod enqueue;
pub(crate) mod event;
pub(crate) mod field_diff;
pub(crate) mod hash;
pub(crate) mod outcome;
pub(crate) mod owner;
pub(crate) mod panic;
pub(crate) mod parked;
pub(crate) mod patch;
pub(crate) mod policy;
pub(crate) mod question;
pub(crate) mod rate;
pub(crate) mod relation;
pub(crate) mod stop;
pub(crate) mod telemetry;
pub(crate) mod time;
pub(crate) mod timer;
pub(crate) mod trace;
pub(crate) mod turn;
