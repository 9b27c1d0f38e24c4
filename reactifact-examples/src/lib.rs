//! Shared pieces of the reactifact example programs.
