//! [`connect`]: a session of the store a URL names, opened without blocking the caller's
//! thread.

use crate::session::context::Context;
use crate::store::store_url::{redact_url, StoreUrl, StoreUrlError};
use crate::store::OpenError;

/// Connecting to a store by URL failed ([`connect`]); nothing was written. No message names
/// a password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL does not parse.
    #[error(transparent)]
    Url(#[from] StoreUrlError),
    /// The URL names a PostgreSQL server, which this crate cannot open.
    #[error("`{url}` names a PostgreSQL store, which reactifact-core cannot open: call `reactifact_postgres::connect` (crate reactifact-postgres), which accepts every URL `reactifact_core::connect` does")]
    #[non_exhaustive]
    Postgres {
        /// The URL, its password replaced by `***`.
        url: String,
    },
    /// The URL names a SQLite store, and this build of the crate leaves SQLite out (its
    /// `sqlite` feature, on by default, is off).
    #[error(
        "`{url}` names a SQLite store, which this build of reactifact-core leaves out: enable its `sqlite` feature"
    )]
    #[non_exhaustive]
    SqliteNotBuilt {
        /// The URL, its password replaced by `***`.
        url: String,
    },
    /// The store refused to open the session (a file that is not a reactifact store, a
    /// corrupt log, a newer schema, …).
    #[error("connecting to `{url}` (session `{session}`): {source}")]
    #[non_exhaustive]
    Open {
        /// The URL, its password replaced by `***`.
        url: String,
        /// The session.
        session: String,
        /// What the store said.
        #[source]
        source: OpenError,
    },
    /// The thread that opened the store ended without an answer: the open panicked, or the
    /// runtime is shutting down.
    #[error("connecting to `{url}` (session `{session}`): the open did not finish: {detail}")]
    #[non_exhaustive]
    Interrupted {
        /// The URL, its password replaced by `***`.
        url: String,
        /// The session.
        session: String,
        /// What happened.
        detail: String,
    },
}

/// Opens (creating if needed) the named session of the store `url` names, with the default
/// [`OpenOptions`](crate::OpenOptions):
///
/// - `memory:`: a new in-memory context ([`Context::new`]);
/// - `sqlite:PATH`, `sqlite://PATH` or a plain path: the SQLite file at `PATH`, as
///   [`Context::open`] opens it, but on a blocking thread (tokio's `spawn_blocking` under a
///   tokio runtime, a thread of its own otherwise), so the future never blocks an executor
///   thread.
///
/// A `postgres://` or `postgresql://` URL is refused with [`ConnectError::Postgres`]: this
/// crate has no PostgreSQL driver. `reactifact_postgres::connect` (crate
/// `reactifact-postgres`) takes every URL this function takes, and those too. See
/// [`StoreUrl`] for the URLs in full. The future is `Send`.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = reactifact_core::connect("sqlite:state.db", "orders").await?;
/// let scratch = reactifact_core::connect("memory:", "what-if").await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`ConnectError`], naming the URL (its password hidden): a URL that does not parse, a
/// PostgreSQL URL, or the store's [`OpenError`] (as [`Context::open`] returns it).
#[allow(clippy::result_large_err)] // see `OpenError::Corrupt`: its source stays unboxed to downcast
pub async fn connect(url: &str, session: impl Into<String>) -> Result<Context, ConnectError> {
    let session = session.into();
    match StoreUrl::parse(url)? {
        StoreUrl::Memory => Ok(Context::new(session)),
        #[cfg(not(feature = "sqlite"))]
        StoreUrl::Sqlite(_) => Err(ConnectError::SqliteNotBuilt { url: redact_url(url) }),
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => {
            let shown = redact_url(url);
            let opening = session.clone();
            match off_thread(move || Context::open(path, opening)).await {
                Ok(Ok(context)) => Ok(context),
                Ok(Err(source)) => Err(ConnectError::Open {
                    url: shown,
                    session,
                    source,
                }),
                Err(detail) => Err(ConnectError::Interrupted {
                    url: shown,
                    session,
                    detail,
                }),
            }
        }
        StoreUrl::Postgres { .. } => Err(ConnectError::Postgres { url: redact_url(url) }),
    }
}

impl Context {
    /// [`connect`]: opens (creating if needed) the named session of the store `url` names —
    /// `memory:`, `sqlite:PATH`, `sqlite://PATH` or a plain path — without blocking the
    /// caller's thread.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), reactifact_core::error::ConnectError> {
    /// let ctx = reactifact_core::Context::connect("sqlite:state.db", "orders").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`connect`].
    #[allow(clippy::result_large_err)] // see `OpenError::Corrupt`: its source stays unboxed to downcast
    pub async fn connect(url: &str, session: impl Into<String>) -> Result<Context, ConnectError> {
        connect(url, session).await
    }
}

#[cfg(feature = "sqlite")]
/// Runs `open` on a thread where blocking is allowed: tokio's blocking pool under a tokio
/// runtime, else a thread of its own. Its result, or what stopped it (a panic, a runtime
/// shutting down).
async fn off_thread<T: Send + 'static>(open: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let guarded = move || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(open)).map_err(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            format!("it panicked: {message}")
        })
    };
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        return match handle.spawn_blocking(guarded).await {
            Ok(result) => result,
            Err(e) => Err(format!("its blocking task ended: {e}")),
        };
    }
    let (answer, answered) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("reactifact-connect".into())
        .spawn(move || drop(answer.send(guarded())))
        .map_err(|e| format!("no thread could be started: {e}"))?;
    answered
        .await
        .unwrap_or_else(|_| Err("its thread ended without an answer".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::artifact::Artifact;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Note {
        text: String,
    }

    impl Artifact for Note {
        const KIND: &'static str = "note";
    }

    fn assert_send<T: Send>(_: &T) {}

    #[test]
    fn the_futures_are_send() {
        assert_send(&connect("memory:", "s"));
        assert_send(&connect("memory:", String::from("s")));
        assert_send(&Context::connect("sqlite:x.db", "s"));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_sqlite_url_opens_the_file_and_a_reopen_sees_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        for url in [
            format!("sqlite:{}", path.display()),
            format!("sqlite://{}", path.display()),
            path.display().to_string(),
        ] {
            let mut ctx = connect(&url, "orders").await.unwrap();
            assert!(
                ctx.store_description().starts_with("sqlite:"),
                "{}",
                ctx.store_description()
            );
            let id = format!("note:{}", ctx.generation().0);
            ctx.create(id.as_str(), Note { text: url.clone() }).unwrap();
            drop(ctx);
            let again = Context::connect(&url, "orders").await.unwrap();
            assert_eq!(again.get::<Note>(id.as_str()).unwrap().unwrap().data.text, url);
        }
        let again = Context::open(&path, "orders").unwrap();
        assert_eq!(again.generation().0, 3, "the three URLs named one file");
    }

    #[test]
    fn outside_tokio_the_open_runs_on_a_thread_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("state.db").display());
        // No tokio runtime here: a plain executor that parks the thread until woken.
        let mut ctx = crate::store::backed::block_on(connect(&url, "orders")).unwrap();
        ctx.create("note:1", Note { text: "x".into() }).unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn memory_is_a_new_context() {
        let mut ctx = connect("memory:", "what-if").await.unwrap();
        assert_eq!(ctx.session(), "what-if");
        ctx.create("note:1", Note { text: "x".into() }).unwrap();
        let other = connect("memory:", "what-if").await.unwrap();
        assert!(other.get::<Note>("note:1").unwrap().is_none(), "memory is not shared");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn bad_urls_and_bad_files_are_errors_that_name_the_url() {
        assert!(matches!(
            connect("", "s").await,
            Err(ConnectError::Url(StoreUrlError::Empty))
        ));
        assert!(matches!(
            connect("sqlite:", "s").await,
            Err(ConnectError::Url(StoreUrlError::NoPath { .. }))
        ));
        let e = connect("ftp://u:hunter2@h/x", "s").await.unwrap_err();
        assert!(
            matches!(e, ConnectError::Url(StoreUrlError::UnsupportedScheme { .. })),
            "{e:?}"
        );
        assert!(!e.to_string().contains("hunter2"), "{e}");

        for url in [
            "postgres://app:hunter2@db/app?schema=shop",
            "PostgreSQL://app:hunter2@db/app",
        ] {
            let e = Context::connect(url, "s").await.unwrap_err();
            assert!(matches!(e, ConnectError::Postgres { .. }), "{e:?}");
            let text = e.to_string();
            assert!(text.contains("reactifact_postgres::connect"), "{text}");
            assert!(text.contains("app:***@db/app"), "{text}");
            assert!(
                !text.contains("hunter2") && !format!("{e:?}").contains("hunter2"),
                "{text}"
            );
        }

        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "not a database at all, just some text that is long enough").unwrap();
        let url = format!("sqlite:{}", text.display());
        let e = connect(&url, "orders").await.unwrap_err();
        assert!(
            matches!(
                &e,
                ConnectError::Open {
                    source: OpenError::NotADatabase { .. },
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with(&format!("connecting to `{url}` (session `orders`): ")),
            "{e}"
        );

        // A path SQLite cannot take is an error too, not a panic.
        let e = connect("sqlite:a\0b.db", "orders").await.unwrap_err();
        assert!(matches!(e, ConnectError::Open { .. }), "{e:?}");
        let missing = dir.path().join("no/such/dir/state.db");
        let e = connect(&missing.display().to_string(), "orders").await.unwrap_err();
        assert!(matches!(e, ConnectError::Open { .. }), "{e:?}");
    }
}
