//! Third stage: generate code from a checked model.
//!
//! Generated code names nothing by a relative path: every item of `reactifact-core` is reached
//! as `::reactifact_core::__private::…` (or through the `crate = path` option), so shadowing
//! `Result`, `Ok`, `Option`, `Box` or `Vec` in the user's module changes nothing.

pub(crate) mod artifact;
pub(crate) mod produce;
