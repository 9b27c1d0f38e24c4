//! What ends a command early: a check that failed (exit 1) or a usage or input error (exit 2),
//! with a message that names what is wrong and, where one exists, the fix.

use reactifact_core::audit::VerifyError;
use reactifact_core::error::{OpenError, StoreError};

/// Which exit code a failure gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `verify` or `replay` found a problem: exit 1.
    CheckFailed,
    /// A usage or input error (a missing file, a wrong URL, an unknown session, id or key, a
    /// store that cannot be read): exit 2.
    Input,
}

/// A command's failure, printed as `reactifact: {message}` on stderr.
#[derive(Debug)]
pub struct Failure {
    /// The exit code's kind.
    pub kind: Kind,
    /// What went wrong, and the fix where one exists.
    pub message: String,
}

impl Failure {
    /// A usage or input error (exit 2).
    pub fn input(message: impl Into<String>) -> Self {
        Failure {
            kind: Kind::Input,
            message: message.into(),
        }
    }

    /// A failed check (exit 1).
    pub fn check(message: impl Into<String>) -> Self {
        Failure {
            kind: Kind::CheckFailed,
            message: message.into(),
        }
    }

    /// The older commits of a session opened from a checkpoint could not be read.
    pub fn history(e: VerifyError) -> Self {
        Failure::input(format!("{e}; `reactifact verify` checks the whole store"))
    }

    /// A store that cannot be read or written while in use.
    pub fn store(e: StoreError) -> Self {
        Failure::input(e.to_string())
    }

    /// Connecting to a PostgreSQL store, or opening it, failed.
    pub fn postgres(e: reactifact_postgres::OpenError) -> Self {
        use reactifact_postgres::OpenError as E;
        match e {
            e @ E::Connect { .. } => Failure::input(format!(
                "{e}; check --store (or REACTIFACT_STORE): the server must be running, and its database must exist and let the user in"
            )),
            e @ E::BadSchema { .. } => {
                Failure::input(format!("{e}; name it with ?schema=NAME in the URL or with --schema"))
            }
            e @ (E::NoStore { .. } | E::OlderSchema { .. }) => Failure::input(format!(
                "{e}; the CLI never creates or migrates a store: open it once with the application (`PostgresStore::open`)"
            )),
            e => Failure::input(e.to_string()),
        }
    }

    /// Opening the store `shown` (its path, or how a PostgreSQL store names itself) failed. A
    /// corrupt log is a failed check when the command checks (`verify`, `replay`), and an
    /// input error otherwise.
    pub fn open(shown: &str, e: OpenError, checking: bool) -> Self {
        match e {
            OpenError::NoSuchFile { .. } => Failure::input(format!(
                "{shown} does not exist; check --store (or REACTIFACT_STORE): the CLI never creates a store"
            )),
            OpenError::Corrupt { .. } if checking => Failure::check(e.to_string()),
            OpenError::Corrupt { .. } => Failure::input(format!("{e}; `reactifact verify` checks the whole store")),
            OpenError::OlderSchema { found, supported, .. } => Failure::input(format!(
                "{shown} has schema version {found}, older than the {supported} this reactifact uses; \
                 open it once for writing with the application (`Context::open`) to upgrade it: the CLI never migrates a store"
            )),
            OpenError::ReadOnlyFile { .. } => Failure::input(format!(
                "{shown} cannot be written (a read-only file or medium); retry, cancel and purge write to the store: \
                 run them as a user who can write it"
            )),
            OpenError::NoSuchSession { session, .. } => {
                Failure::input(format!("{shown} has no session `{session}`; `reactifact sessions` lists them"))
            }
            e => Failure::input(e.to_string()),
        }
    }
}

/// The result of a command.
pub type Outcome<T = ()> = Result<T, Failure>;
