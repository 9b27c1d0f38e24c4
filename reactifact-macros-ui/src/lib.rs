//! The compile-time tests of reactifact's macros live in `tests/macro_ui.rs`, their cases in
//! `ui/`; this library is empty. The crate exists so that trybuild builds the cases against a
//! lean set of dev-dependencies (the core, serde), not those of the integration crate.
