//! Integration tests for reactifact live in `tests/`; this library is empty.
