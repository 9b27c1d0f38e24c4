//! Procedural macros for reactifact. Use them through `reactifact-core`, which re-exports them.
//!
//! The macros are built in a later step; this crate currently exports nothing.
