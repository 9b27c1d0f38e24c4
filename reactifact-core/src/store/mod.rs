//! For the implementers of a store, and for code that opens one: the stores this crate ships
//! (the ledgers [`MemoryOutbox`] and [`SqliteOutbox`], the homes of sessions' logs
//! [`MemoryStore`] and [`SqliteStore`], a context's SQLite file through [`OpenOptions`]), the
//! store URLs (`memory:`, `sqlite:PATH`, `postgres://…`: [`StoreUrl`]), the sessions of a
//! file ([`list_sessions`]), and the two traits every backend implements: [`LogStore`] for
//! the log of each session and its checkpoints, and [`OutboxStore`] for the delivery ledger,
//! with their rows, requests and answers. `docs/stores.md` says what each operation must do;
//! the contract suites check it.

// How the crate uses them: the context always serves reads from memory. A durable session
// (`Backed`, written once above every `LogStore`) appends each commit as one row, in one
// transaction together with the registration of its intents in the store's outbox; on open it
// reads the log back, decodes and checks it, and the context is rebuilt from it. It also keeps
// checkpoints of the state (`Checkpoint`): open starts from the newest one that checks out and
// replays only the commits after it; the older commits are read on demand
// (`Backed::load_before`). The delivery ledger is the store's outbox (`OutboxStore`), never a
// copy in memory. `session/connect.rs` opens a session of a URL.

pub(crate) mod answers;
pub(crate) mod backed;
mod codec;
mod in_flight;
pub(crate) mod ledger;
pub(crate) mod log_store;
pub(crate) mod memory;
mod memory_store;
pub(crate) mod outbox;
pub(crate) mod prune;
mod session_info;
#[cfg(feature = "sqlite")]
mod sqlite;
pub(crate) mod store_url;

use std::path::PathBuf;
use std::time::Duration;

use crate::state::refold::VerifyError;

pub(crate) use backed::{Backed, Checkpoint, CommitDelta, Loaded, StoredCheckpoint};

pub use crate::model::action::{action_group, action_not_before};
pub use crate::model::delivery::{
    reclaimed_error, taken_over_error, Attempt, AttemptOutcome, Decision, Delivery, DeliveryParts, DeliveryStatus,
    FenceToken, Lease, NewIntent, Verdict, ATTEMPTS_KEPT, FAR_FUTURE, MIN_LEASE,
};
pub use crate::model::enqueue::{Enqueue, ENQUEUED_SESSION};
pub use crate::model::outcome::{due_at, LastError, Transition};
pub use crate::model::policy::ClaimPolicy;
pub use crate::model::rate::{micros, RateBucket, RateSpend, RateState};
pub use ledger::Ledger;
pub use log_store::{Act, AnswerRow, Append, CheckpointRow, ClaimOrder, CommitRow, LogStore, OutboxCheck, SessionRow};
pub use memory::MemoryOutbox;
pub use memory_store::MemoryStore;
pub use outbox::{
    check_decision, ApprovalError, BoxFuture, CancelError, ClaimRequest, Claimed, FailedAttempt, LedgerQuery,
    OutboxStore, Outcome, Page, PurgeFilter, Recorded, Recording, RetryError, Scope, StatusCounts, Wakeups,
};
/// The SQLite driver this crate is built with, for [`register_in`]'s transactions.
#[cfg(feature = "sqlite")]
pub use rusqlite;
pub use session_info::SessionInfo;
#[cfg(feature = "sqlite")]
pub use sqlite::register_in;
#[cfg(feature = "sqlite")]
pub use sqlite::sessions::list_sessions;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteOutbox;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
pub use store_url::{redact_url, StoreUrl, StoreUrlError};

/// A backend's own error, as a [`StoreError`] or an [`OpenError`] carries it: the error of
/// whatever driver the store uses (SQLite's, PostgreSQL's, …), boxed, so that no variant names
/// a driver's type. Downcast it to the driver's type to look inside.
pub type BackendError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A failure of the durable store while the context was in use. The operation that hit it
/// changed nothing: a failed commit is rolled back in memory too.
///
/// Every variant names the store as [`OutboxStore::describe`]
/// does (e.g. `sqlite:/var/lib/app/state.db`). A store of another crate builds these errors
/// with the constructors ([`StoreError::backend`], [`StoreError::conflict`], …); the
/// variants are open to matching, and may gain fields.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend (its driver, its connection, its database) reported an error.
    #[error("store {store}: {source}{}", if *retryable { " (transient: the operation may be tried again)" } else { "" })]
    #[non_exhaustive]
    Backend {
        /// The store, as it describes itself.
        store: String,
        /// Whether the same operation may succeed if tried again later, unchanged: the
        /// database was busy or locked past the store's timeout, or the connection dropped.
        retryable: bool,
        /// The backend's error (for SQLite, a `rusqlite::Error`).
        #[source]
        source: BackendError,
    },
    /// Another writer advanced the session since this context loaded it.
    #[error("session `{session}` in {store} was changed by another writer (this context expected generation {expected}); reopen it")]
    #[non_exhaustive]
    Conflict {
        /// The store, as it describes itself.
        store: String,
        /// The session.
        session: String,
        /// The generation this context last committed.
        expected: u64,
    },
    /// A fork names a session that exists already.
    #[error("session `{session}` already exists in {store}; fork under another name")]
    #[non_exhaustive]
    SessionExists {
        /// The store, as it describes itself.
        store: String,
        /// The session.
        session: String,
    },
    /// The context was opened read-only.
    #[error("session `{session}` in {store} is open read-only")]
    #[non_exhaustive]
    ReadOnly {
        /// The store, as it describes itself.
        store: String,
        /// The session.
        session: String,
    },
    /// The store's connection or worker has ended (it panicked, or the process is exiting):
    /// the operation was not run.
    #[error("the outbox of {store} is closed")]
    #[non_exhaustive]
    Closed {
        /// The store, as it describes itself.
        store: String,
    },
    /// A commit of this context was cut off (its future was dropped) while its store write
    /// was under way, so whether the store has it is unknown: the context took it back and
    /// writes nothing more. Drop the context (the drop waits for the cut-off write to end, so
    /// it cannot land later) and reopen the session to continue from what the store holds.
    #[error("a commit of session `{session}` in {store} was cut off while it was being written; reopen the session to continue from what the store holds")]
    #[non_exhaustive]
    CutOff {
        /// The store.
        store: String,
        /// The session.
        session: String,
    },
    /// The commits of the session before its checkpoint, read on demand (by
    /// [`Context::provenance`](crate::Context::provenance) and the other reads of the whole
    /// log), could not be read or do not check out.
    #[error("the log of session `{session}` in {store} could not be loaded: {detail}")]
    #[non_exhaustive]
    History {
        /// The store, as it describes itself.
        store: String,
        /// The session.
        session: String,
        /// What is wrong.
        detail: String,
    },
    /// A stored outbox row failed its integrity check (it was changed outside reactifact):
    /// the operation was refused. A claim holds such a row instead of failing.
    #[error("the outbox row of `{key}` in {store} failed its integrity check: {detail}")]
    #[non_exhaustive]
    Integrity {
        /// The store, as it describes itself.
        store: String,
        /// The row's key, as far as it reads.
        key: String,
        /// What is wrong.
        detail: String,
    },
}

impl StoreError {
    /// The backend of `store` failed with `source`; `retryable` if the same operation may
    /// succeed when tried again later (busy, locked, a dropped connection).
    pub fn backend(store: impl Into<String>, retryable: bool, source: impl Into<BackendError>) -> Self {
        StoreError::Backend {
            store: store.into(),
            retryable,
            source: source.into(),
        }
    }

    /// Another writer advanced `session` of `store` past generation `expected`.
    pub fn conflict(store: impl Into<String>, session: impl Into<String>, expected: u64) -> Self {
        StoreError::Conflict {
            store: store.into(),
            session: session.into(),
            expected,
        }
    }

    /// `session` already exists in `store`.
    pub fn session_exists(store: impl Into<String>, session: impl Into<String>) -> Self {
        StoreError::SessionExists {
            store: store.into(),
            session: session.into(),
        }
    }

    /// `session` of `store` is open read-only.
    pub fn read_only(store: impl Into<String>, session: impl Into<String>) -> Self {
        StoreError::ReadOnly {
            store: store.into(),
            session: session.into(),
        }
    }

    /// A commit of `session` in `store` was cut off while it was being written.
    pub fn cut_off(store: impl Into<String>, session: impl Into<String>) -> Self {
        StoreError::CutOff {
            store: store.into(),
            session: session.into(),
        }
    }

    /// The connection or worker of `store` has ended.
    pub fn closed(store: impl Into<String>) -> Self {
        StoreError::Closed { store: store.into() }
    }

    /// The outbox row of `key` in `store` failed its integrity check, as `detail` says.
    pub fn integrity(store: impl Into<String>, key: impl Into<String>, detail: impl Into<String>) -> Self {
        StoreError::Integrity {
            store: store.into(),
            key: key.into(),
            detail: detail.into(),
        }
    }

    /// The store the error names, as it describes itself (e.g. `sqlite:/var/lib/app/state.db`).
    pub fn store(&self) -> &str {
        match self {
            StoreError::Backend { store, .. }
            | StoreError::Conflict { store, .. }
            | StoreError::SessionExists { store, .. }
            | StoreError::ReadOnly { store, .. }
            | StoreError::Closed { store }
            | StoreError::CutOff { store, .. }
            | StoreError::History { store, .. }
            | StoreError::Integrity { store, .. } => store,
        }
    }

    /// Whether the same operation may succeed if tried again later, unchanged: a backend
    /// error the backend calls transient (for SQLite, a database still busy or locked after
    /// the busy timeout and the store's own retries). A conflict is not: the context must be
    /// reopened first.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Backend { retryable: true, .. })
    }
}

/// Opening a store or a session of it failed; nothing in the store was changed. One type for
/// every backend: some variants are a backend's own (a SQLite file that is not a database, a
/// PostgreSQL server that cannot be reached), the rest are shared.
///
/// `path` names the file opened; for a store of another crate (PostgreSQL) it holds the
/// store's description instead (`postgres://app@db:5432/app schema reactifact`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The file exists but is not a SQLite database.
    #[error("{path} is not a reactifact database (not a SQLite file)")]
    NotADatabase {
        /// The path opened.
        path: PathBuf,
    },
    /// The file is a SQLite database, but damaged or truncated, or its content does not
    /// decode or does not match its own hashes, or its schema version is older than the
    /// tables and columns it holds (its version was changed outside reactifact: migrating it
    /// would fail half way, so it is left as it was).
    #[error("{path} is corrupt: {detail}")]
    Corrupt {
        /// The path opened (for a store of another crate, its description).
        path: PathBuf,
        /// What is wrong, in words (for a log that does not verify, the message of `source`).
        detail: String,
        /// The failed check, when the log decodes but does not verify: it names the commit
        /// and, where one is at fault, the artifact or intent, so a program can tell which
        /// commit is bad without parsing `detail`. `None` when the file itself is damaged or
        /// its rows do not decode.
        #[source]
        source: Option<VerifyError>,
    },
    /// The file is a SQLite database that reactifact did not write (tables of another program,
    /// or a schema version no reactifact writes); nothing in it was changed. (A PostgreSQL
    /// schema of another program is [`OpenError::ForeignSchema`].)
    #[error("{path} is a SQLite database of another program, not a reactifact store; it was left as it was")]
    Foreign {
        /// The path opened.
        path: PathBuf,
    },
    /// The file cannot be written (a read-only file or medium), and it was not opened
    /// read-only.
    #[error("{path} cannot be written (a read-only file or medium); open it with `OpenOptions::read_only` to read it")]
    ReadOnlyFile {
        /// The path opened.
        path: PathBuf,
    },
    /// The store was written by a newer reactifact (a SQLite file's `user_version`, a
    /// PostgreSQL schema's version table).
    #[error("{path} has schema version {found}, newer than the {supported} this reactifact supports; upgrade reactifact to open it")]
    NewerSchema {
        /// The path opened (for a store of another crate, its description).
        path: PathBuf,
        /// The schema version in the store.
        found: i64,
        /// The newest schema version this build knows.
        supported: i64,
    },
    /// The store was written by an older reactifact, and must be upgraded before this use: a
    /// read-only open (which writes nothing), a standalone outbox of a SQLite file, and a
    /// PostgreSQL store opened without `PostgresOptions::allow_migration` refuse it. Open it
    /// once for writing with [`Context::open`](crate::Context::open) (SQLite) or with
    /// migration allowed (PostgreSQL), which migrates it.
    #[error("{path} has schema version {found}, older than the {supported} this reactifact uses; open it once for writing (`Context::open`, or `PostgresStore::open` with migration allowed) to upgrade it")]
    OlderSchema {
        /// The path opened (for a store of another crate, its description).
        path: PathBuf,
        /// The schema version in the store.
        found: i64,
        /// The schema version this build writes.
        supported: i64,
    },
    /// The file does not exist and the context was opened read-only (or with
    /// [`OpenOptions::create`] off); nothing was created. (A PostgreSQL schema without a store
    /// is [`OpenError::NoStore`].)
    #[error("{path} does not exist; open it with `OpenOptions::create` (the default) to start a new store there")]
    NoSuchFile {
        /// The path opened.
        path: PathBuf,
    },
    /// The session does not exist and the context was opened read-only (or with
    /// [`OpenOptions::create`] off).
    #[error("{path} has no session `{session}`")]
    NoSuchSession {
        /// The path opened (for a store of another crate, its description).
        path: PathBuf,
        /// The session asked for.
        session: String,
    },
    /// A store of another crate ([`LogStore`]) failed while the session
    /// was being opened; nothing was written but, for a new session, its row.
    #[error("opening session `{session}`: {source}")]
    Store {
        /// The session.
        session: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// Another error of the backend while opening (for SQLite, a `rusqlite::Error`).
    #[error("opening {path}: {source}")]
    Backend {
        /// The path opened.
        path: PathBuf,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
    /// A server's URL does not parse (PostgreSQL).
    #[error("invalid postgres url `{url}`: {detail}")]
    BadUrl {
        /// The URL, its password replaced by `***`.
        url: String,
        /// What is wrong.
        detail: String,
    },
    /// The schema name is not one the store accepts (PostgreSQL).
    #[error("invalid schema name `{schema}`: a lowercase ASCII letter or `_`, then up to 47 lowercase letters, digits or `_`, not starting with `pg_`")]
    BadSchema {
        /// The name given.
        schema: String,
    },
    /// No connection to the server could be made (it is down, unreachable, refused the
    /// login, or has no such database) (PostgreSQL).
    #[error("cannot connect to postgres at {host}:{port}, database `{database}`, user `{user}`: {source}")]
    Connect {
        /// The host (or socket directory).
        host: String,
        /// The port.
        port: u16,
        /// The database.
        database: String,
        /// The user.
        user: String,
        /// The driver's error.
        #[source]
        source: BackendError,
    },
    /// The schema holds tables, but no reactifact version table: it is another program's
    /// (PostgreSQL).
    #[error("schema `{schema}` of {store} holds tables that are not reactifact's ({tables}); choose another schema")]
    ForeignSchema {
        /// The store, as it describes itself.
        store: String,
        /// The schema.
        schema: String,
        /// Some of its tables.
        tables: String,
    },
    /// The schema holds no store, and the options do not let opening create one
    /// (PostgreSQL, without migration allowed).
    #[error("schema `{schema}` of {store} holds no reactifact store, and the options do not let opening create one")]
    NoStore {
        /// The store, as it describes itself.
        store: String,
        /// The schema.
        schema: String,
    },
    /// The store failed while it was being prepared, before any session was opened (for
    /// PostgreSQL, an error of the server while the schema was checked or migrated).
    #[error("preparing the store: {source}")]
    Prepare {
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

/// How SQLite syncs a commit to disk (`PRAGMA synchronous`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Synchronous {
    /// Every commit is synced before it returns: a committed generation survives a power
    /// loss.
    #[default]
    Full,
    /// In WAL mode, commits are synced at checkpoints: a committed generation survives a
    /// crash of the process, but the last ones may be lost on a power loss. The database is
    /// never corrupted either way.
    Normal,
}

/// Options for [`Context::open_with`](crate::Context::open_with).
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub(crate) read_only: bool,
    pub(crate) create: bool,
    pub(crate) synchronous: Synchronous,
    pub(crate) lease: Duration,
    pub(crate) checkpoint_every: u64,
}

/// How many commits apart a context writes checkpoints by default
/// ([`OpenOptions::checkpoint_every`]).
pub const DEFAULT_CHECKPOINT_EVERY: u64 = 10_000;

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read_only: false,
            create: true,
            synchronous: Synchronous::Full,
            lease: crate::model::delivery::DEFAULT_LEASE,
            checkpoint_every: DEFAULT_CHECKPOINT_EVERY,
        }
    }
}

impl OpenOptions {
    /// Read-write, creating the file and the session if missing, `synchronous = FULL`, and a
    /// 30-second delivery lease.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens read-only: nothing is written, a missing file or session is an error, and any
    /// commit or delivery fails with [`StoreError::ReadOnly`].
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Whether a missing session is created (default) or refused with
    /// [`OpenError::NoSuchSession`].
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// How commits are synced to disk.
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// How long a claim of this context's drain is leased (default 30 s). The drain renews
    /// the leases of its running deliveries every third of it, so a dispatch may take longer
    /// than the lease while its process lives; if the process dies, its intents in flight are
    /// delivered again, with the same idempotency key, by the first drain of the store that
    /// runs after the lease expired. A shorter lease recovers a crash sooner; it must outlast
    /// the longest stall of the process's executor (renewals run on it). At least
    /// [`MIN_LEASE`] (shorter is taken as that: a lease that expires before
    /// its first renewal would let the drain reclaim its own running deliveries); a lease
    /// ending past the year 9999 ends then.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(crate::model::delivery::MIN_LEASE);
        self
    }

    /// Writes a checkpoint of the state after every `every`-th commit (generation `every`,
    /// `2 × every`, …); `0` writes none (default [`DEFAULT_CHECKPOINT_EVERY`], 10,000).
    ///
    /// A checkpoint is the encoded live state at one commit, tied to that commit's hash and
    /// state hash: opening the session loads the newest one that checks out and replays only
    /// the commits after it, so open time grows with the state and with at most `every`
    /// commits, not with the whole history. Encoding it costs O(state), on the store's
    /// thread, once per `every` commits (the commit itself hands over an O(1) clone of the
    /// state). The store keeps the newest two of a session. See also
    /// [`Context::checkpoint`](crate::Context::checkpoint).
    pub fn checkpoint_every(mut self, every: u64) -> Self {
        self.checkpoint_every = every;
        self
    }
}
