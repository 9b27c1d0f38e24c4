//! Which store a command works on: `--store PATH|URL` or `REACTIFACT_STORE`, resolved to a
//! SQLite file, and the read-only opens every inspecting command uses.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use reactifact_core::{list_sessions, Context, OpenOptions, SessionInfo, SqliteOutbox};

use crate::failure::{Failure, Outcome};

/// The store named on the command line, resolved to the path of its SQLite file.
///
/// A plain path, `sqlite:PATH` or `sqlite://PATH` names a SQLite file. A `postgres://` (or
/// `postgresql://`) URL is refused: the PostgreSQL store is not in this build. Any other URL
/// is refused as unsupported.
pub fn resolve(store: Option<&str>) -> Outcome<PathBuf> {
    let Some(store) = store.filter(|s| !s.is_empty()) else {
        return Err(Failure::input(
            "no store given: pass --store PATH (a SQLite file) or set REACTIFACT_STORE",
        ));
    };
    let lower = store.to_ascii_lowercase();
    if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
        return Err(Failure::input(format!(
            "the PostgreSQL store is not available in this build of reactifact, so `{}` cannot be opened; \
             pass the path of a SQLite store file",
            redact(store)
        )));
    }
    if let Some(path) = store
        .strip_prefix("sqlite://")
        .or_else(|| store.strip_prefix("sqlite:"))
    {
        if path.is_empty() {
            return Err(Failure::input(format!("`{store}` names no file: write sqlite:PATH")));
        }
        return Ok(PathBuf::from(path));
    }
    if let Some((scheme, _)) = store.split_once("://") {
        if !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) {
            return Err(Failure::input(format!(
                "unsupported store URL `{}` (scheme `{scheme}`): pass the path of a SQLite store file (or sqlite:PATH)",
                redact(store)
            )));
        }
    }
    Ok(PathBuf::from(store))
}

/// The URL without a password (`user:secret@` becomes `user:***@`), for messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// The sessions of the store file.
pub fn sessions(path: &Path) -> Outcome<Vec<SessionInfo>> {
    sessions_checking(path, false)
}

/// The sessions of the store file, for a command that checks it (`verify`): a corrupt file
/// is a failed check.
pub fn sessions_checking(path: &Path, checking: bool) -> Outcome<Vec<SessionInfo>> {
    list_sessions(path).map_err(|e| Failure::open(path, e, checking))
}

/// The session a command works on: the one named (which must exist), or the store's only
/// session when none is named.
pub fn session(path: &Path, named: Option<&str>) -> Outcome<String> {
    let sessions = sessions(path)?;
    let names: Vec<&str> = sessions.iter().map(|s| s.name.as_str()).collect();
    match named {
        Some(name) if names.contains(&name) => Ok(name.to_owned()),
        Some(name) => Err(Failure::input(format!(
            "{} has no session `{name}`; its sessions: {}",
            path.display(),
            list_or_none(&names)
        ))),
        None => match names.as_slice() {
            [only] => Ok((*only).to_owned()),
            [] => Err(Failure::input(format!("{} holds no session", path.display()))),
            _ => Err(Failure::input(format!(
                "{} holds {} sessions ({}); name one with --session",
                path.display(),
                names.len(),
                names.join(", ")
            ))),
        },
    }
}

/// Checks that `named` is a session of the store (for filters such as `outbox list
/// --session`).
pub fn check_session(path: &Path, named: &str) -> Outcome<()> {
    session(path, Some(named)).map(drop)
}

fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// Opens `session` read-only: its log is loaded and refolded (parent links and state hashes
/// checked); nothing is written.
pub fn open_session(path: &Path, session: &str, checking: bool) -> Outcome<Context> {
    Context::open_with(path, session, OpenOptions::new().read_only(true)).map_err(|e| Failure::open(path, e, checking))
}

/// The store's outbox, read-only.
pub fn outbox_read_only(path: &Path) -> Outcome<Arc<SqliteOutbox>> {
    SqliteOutbox::open_read_only(path).map_err(|e| Failure::open(path, e, false))
}

/// The store's outbox, for the operator's writes (retry, cancel, purge).
pub fn outbox_writable(path: &Path) -> Outcome<Arc<SqliteOutbox>> {
    SqliteOutbox::open(path).map_err(|e| Failure::open(path, e, false))
}
