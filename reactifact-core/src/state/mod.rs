//! The versioned state: the live state and its relations, snapshots, the commit log and the
//! rules that apply it, the context of one session, its commit graph, and branches.

pub(crate) mod branch;
pub(crate) mod commit;
pub(crate) mod commit_hash;
pub(crate) mod context;
pub(crate) mod graph;
pub(crate) mod layered;
pub(crate) mod live;
pub(crate) mod log;
pub(crate) mod order;
pub(crate) mod readers;
pub(crate) mod rearm;
pub(crate) mod refold;
pub(crate) mod snapshot;
pub(crate) mod writes;
