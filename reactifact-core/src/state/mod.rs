//! The versioned state, pure: the live state and its relations, snapshots, the commit log and
//! the rules that apply it, the commit graph, and the writes a transaction batches. Nothing
//! here does I/O or imports a layer above `model/`; the context that keeps a state in a store
//! is `session/`'s.

pub(crate) mod commit;
pub(crate) mod commit_hash;
pub(crate) mod graph;
pub(crate) mod layered;
pub(crate) mod live;
pub(crate) mod log;
pub(crate) mod order;
pub(crate) mod readers;
pub(crate) mod refold;
pub(crate) mod snapshot;
pub(crate) mod writes;
