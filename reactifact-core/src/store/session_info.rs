//! What a store says of one of its sessions, whatever the backend.

use std::time::SystemTime;

use crate::model::artifact::Generation;
use crate::model::hash::CommitHash;

/// One session of a store, as every backend lists it: `list_sessions` for a SQLite file (feature `sqlite`),
/// `PostgresStore::sessions` (crate `reactifact-postgres`) for a PostgreSQL store. The same
/// history gives the same values in either (the creation time aside).
///
/// A backend of another crate builds one with [`SessionInfo::new`] and sets the fields it
/// knows; new fields may be added (it is `#[non_exhaustive]`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionInfo {
    /// The session's name.
    pub name: String,
    /// The generation of its last commit (0 for a session without commits): the length of
    /// its log, a branch's log counting its parent's commits up to the fork.
    pub generation: Generation,
    /// The hash of its last commit, `None` for a session without commits.
    pub head: Option<CommitHash>,
    /// For a branch, the session it was forked from and the generation it was forked at.
    pub forked_from: Option<(String, Generation)>,
    /// When the session was created.
    pub created_at: SystemTime,
    /// The position in its event queue up to which its commits consumed events, as the store
    /// keeps it: the events numbered below it are consumed, and reopening the session queues
    /// only the later ones.
    pub consumed_seq: u64,
    /// How many commits the store holds for the session itself. For a root session this is
    /// its generation; a branch's log also reads its parent's commits up to the fork, which
    /// are not counted here (a branch without commits of its own counts 0).
    pub commits: u64,
}

impl SessionInfo {
    /// A session named `name`, created at `created_at`, as it is before its first commit: no
    /// commits, no head, not a branch, no event consumed. Set the other fields (they are
    /// public) to what the store holds.
    pub fn new(name: impl Into<String>, created_at: SystemTime) -> Self {
        SessionInfo {
            name: name.into(),
            generation: Generation(0),
            head: None,
            forked_from: None,
            created_at,
            consumed_seq: 0,
            commits: 0,
        }
    }
}
