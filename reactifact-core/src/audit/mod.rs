//! Auditing the log: verification and time travel, the replay oracle, effect provenance and
//! the JSON-lines export.

pub(crate) mod export;
pub(crate) mod inspect;
pub(crate) mod provenance;
pub(crate) mod replay;
pub(crate) mod verify;
