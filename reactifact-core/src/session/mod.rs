//! One session of a store: the [`Context`](crate::Context) that holds a session's state, its
//! queued events and its log in memory and keeps them in a store (memory, SQLite, or a
//! backend of another crate) with its outbox; its branches and merges; the re-arming of a
//! parked event; and `connect`, which opens a session from a store URL.

pub(crate) mod branch;
pub(crate) mod connect;
pub(crate) mod context;
pub(crate) mod rearm;
