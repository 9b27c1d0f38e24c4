//! A store named by a URL: `memory:`, a SQLite file (`sqlite:PATH`, `sqlite://PATH` or a plain
//! path) or a PostgreSQL server (`postgres://…[?schema=NAME]`), and the URL shown without its
//! password.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// A store, as a URL names it: what [`connect`](crate::connect) (and `reactifact_postgres::connect`,
/// and the `reactifact` CLI's `--store`) accept.
///
/// | URL | store |
/// | --- | --- |
/// | `memory:` | an in-memory context ([`Context::new`](crate::Context::new)) |
/// | `sqlite:PATH`, `sqlite://PATH`, or a plain `PATH` | the SQLite file at `PATH` |
/// | `postgres://…` or `postgresql://…`, with an optional `?schema=NAME` | a PostgreSQL server (crate `reactifact-postgres`) |
///
/// Schemes are matched without regard to case. A plain path is anything without a
/// `scheme://` prefix (`C:\data\state.db` and `./state.db` are paths); another scheme
/// (`mysql://…`) is refused. The `schema` parameter is taken out of a PostgreSQL URL, so that
/// the driver never sees it; the name is checked by `reactifact-postgres`, not here.
///
/// [`Display`](fmt::Display) and [`Debug`] show the URL with its password replaced by `***`
/// ([`redact_url`]).
///
/// ```
/// use reactifact_core::store::StoreUrl;
///
/// assert_eq!("sqlite:state.db".parse(), Ok(StoreUrl::Sqlite("state.db".into())));
/// assert_eq!(StoreUrl::parse("memory:"), Ok(StoreUrl::Memory));
/// let url = StoreUrl::parse("postgres://app:s3cret@db/app?schema=shop")?;
/// assert_eq!(
///     url,
///     StoreUrl::Postgres { url: "postgres://app:s3cret@db/app".into(), schema: Some("shop".into()) }
/// );
/// assert_eq!(url.to_string(), "postgres://app:***@db/app?schema=shop");
/// assert!(StoreUrl::parse("mysql://db/app").is_err());
/// # Ok::<(), reactifact_core::error::StoreUrlError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// `memory:`: a context in memory only, gone with the process.
    Memory,
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL server.
    Postgres {
        /// The URL for the driver, without its `schema` parameter. It may hold a password:
        /// show it with [`redact_url`].
        url: String,
        /// The schema the URL names (`?schema=NAME`), if it names one, as written.
        schema: Option<String>,
    },
}

/// A store URL does not parse ([`StoreUrl::parse`]). No message names a password.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreUrlError {
    /// The URL is empty (or only spaces).
    #[error(
        "no store URL given: write the path of a SQLite file, sqlite:PATH, memory: or postgres://USER@HOST/DATABASE"
    )]
    Empty,
    /// `sqlite:` or `sqlite://` with nothing after it.
    #[error("`{url}` names no file: write sqlite:PATH")]
    #[non_exhaustive]
    NoPath {
        /// The URL.
        url: String,
    },
    /// `memory:` with something after it.
    #[error("`{url}` names an in-memory store, which has no path: write memory: alone")]
    #[non_exhaustive]
    MemoryPath {
        /// The URL, its password replaced by `***`.
        url: String,
    },
    /// A `scheme://` this crate knows no store for.
    #[error("unsupported store URL `{url}` (scheme `{scheme}`): write the path of a SQLite file, sqlite:PATH, memory: or postgres://USER@HOST/DATABASE")]
    #[non_exhaustive]
    UnsupportedScheme {
        /// The URL, its password replaced by `***`.
        url: String,
        /// The scheme, as written.
        scheme: String,
    },
    /// A PostgreSQL URL whose `schema` parameters name two different schemas.
    #[error("the store URL `{url}` names two schemas: give one")]
    #[non_exhaustive]
    TwoSchemas {
        /// The URL, its password replaced by `***`.
        url: String,
    },
}

impl StoreUrl {
    /// Parses `url`; see [`StoreUrl`] for what it accepts.
    ///
    /// # Errors
    /// [`StoreUrlError`], naming the URL (its password hidden) and what is wrong: an empty
    /// URL, `sqlite:` without a path, `memory:` with one, an unsupported scheme, two schemas.
    pub fn parse(url: &str) -> Result<StoreUrl, StoreUrlError> {
        if url.trim().is_empty() {
            return Err(StoreUrlError::Empty);
        }
        if strip_scheme(url, "postgres://").is_some() || strip_scheme(url, "postgresql://").is_some() {
            let (url, schema) = split_schema(url)?;
            return Ok(StoreUrl::Postgres { url, schema });
        }
        if let Some(path) = strip_scheme(url, "sqlite://").or_else(|| strip_scheme(url, "sqlite:")) {
            if path.is_empty() {
                return Err(StoreUrlError::NoPath { url: url.to_owned() });
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if let Some(rest) = strip_scheme(url, "memory:") {
            if !rest.is_empty() {
                return Err(StoreUrlError::MemoryPath { url: redact_url(url) });
            }
            return Ok(StoreUrl::Memory);
        }
        if let Some((scheme, _)) = url.split_once("://") {
            if !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) {
                return Err(StoreUrlError::UnsupportedScheme {
                    url: redact_url(url),
                    scheme: scheme.to_owned(),
                });
            }
        }
        Ok(StoreUrl::Sqlite(PathBuf::from(url)))
    }
}

impl FromStr for StoreUrl {
    type Err = StoreUrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        StoreUrl::parse(url)
    }
}

impl fmt::Display for StoreUrl {
    /// The URL, its password replaced by `***`: `memory:`, `sqlite:PATH`, or the PostgreSQL URL
    /// with its schema.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreUrl::Postgres { url, schema } => {
                f.write_str(&redact_url(url))?;
                match schema {
                    Some(schema) if url[host_start(url)..].contains('?') => write!(f, "&schema={schema}"),
                    Some(schema) => write!(f, "?schema={schema}"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("Memory"),
            StoreUrl::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            StoreUrl::Postgres { url, schema } => f
                .debug_struct("Postgres")
                .field("url", &redact_url(url))
                .field("schema", schema)
                .finish(),
        }
    }
}

/// `url` after `scheme` (matched without regard to case), if it starts with it.
fn strip_scheme<'a>(url: &'a str, scheme: &str) -> Option<&'a str> {
    let head = url.get(..scheme.len())?;
    head.eq_ignore_ascii_case(scheme).then(|| &url[scheme.len()..])
}

/// Where the userinfo of `url` (`scheme://user:password@`) ends, at its last `@` before the
/// path, if it has one: the start of the host. A password with an unescaped `?`, `#` or `@`
/// is still taken as the password (the path starts at the first `/` after the scheme).
fn host_start(url: &str) -> usize {
    let Some(scheme_end) = url.find("://") else {
        return 0;
    };
    let authority = scheme_end + 3;
    let path = url[authority..].find('/').map_or(url.len(), |at| authority + at);
    url[authority..path]
        .rfind('@')
        .map_or(authority, |at| authority + at + 1)
}

/// The URL without its `schema` query parameters, and the schema they name.
fn split_schema(url: &str) -> Result<(String, Option<String>), StoreUrlError> {
    let host = host_start(url);
    let Some(question) = url[host..].find('?').map(|at| host + at) else {
        return Ok((url.to_owned(), None));
    };
    let (base, query) = (&url[..question], &url[question + 1..]);
    let mut schema: Option<&str> = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((key, value)) if key.eq_ignore_ascii_case("schema") => {
                if schema.is_some_and(|s| s != value) {
                    return Err(StoreUrlError::TwoSchemas { url: redact_url(url) });
                }
                schema = Some(value);
            }
            _ if pair.is_empty() => {}
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, schema.map(str::to_owned)))
}

/// `url` with its password replaced by `***`, in the URL form (`scheme://user:pw@host`, and
/// `password=` in its query) and in libpq's `key=value` form (`password=pw`).
///
/// ```
/// assert_eq!(
///     reactifact_core::store::redact_url("postgres://app:s3cret@db/app?schema=shop"),
///     "postgres://app:***@db/app?schema=shop"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_owned();
    // URL form: the userinfo of the authority.
    if let Some(scheme_end) = out.find("://") {
        let authority_start = scheme_end + 3;
        let host = host_start(&out);
        if host > authority_start {
            let userinfo = &out[authority_start..host - 1];
            if let Some(colon) = userinfo.find(':') {
                let from = authority_start + colon + 1;
                out.replace_range(from..host - 1, "***");
            }
        }
    }
    // `password=…` (a query parameter, or a key of the key=value form).
    let mut search = 0;
    while let Some(found) = out[search..].to_ascii_lowercase().find("password=") {
        let start = search + found + "password=".len();
        let rest = &out[start..];
        let end = if let Some(quoted) = rest.strip_prefix('\'') {
            // Quoted: up to the closing quote.
            quoted.find('\'').map_or(out.len(), |q| start + q + 2)
        } else {
            rest.find(['&', ' ']).map_or(out.len(), |e| start + e)
        };
        out.replace_range(start..end, "***");
        search = start + 3;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(url: &str, schema: Option<&str>) -> StoreUrl {
        StoreUrl::Postgres {
            url: url.to_owned(),
            schema: schema.map(str::to_owned),
        }
    }

    #[test]
    fn sqlite_files_memory_and_postgres_urls_parse() {
        for (url, expected) in [
            ("state.db", StoreUrl::Sqlite("state.db".into())),
            ("./data/state.db", StoreUrl::Sqlite("./data/state.db".into())),
            (
                "/var/lib/app/state.db",
                StoreUrl::Sqlite("/var/lib/app/state.db".into()),
            ),
            (r"C:\data\state.db", StoreUrl::Sqlite(r"C:\data\state.db".into())),
            ("sqlite:state.db", StoreUrl::Sqlite("state.db".into())),
            ("SQLite:state.db", StoreUrl::Sqlite("state.db".into())),
            ("sqlite://state.db", StoreUrl::Sqlite("state.db".into())),
            (
                "sqlite:///var/lib/state.db",
                StoreUrl::Sqlite("/var/lib/state.db".into()),
            ),
            ("memory:", StoreUrl::Memory),
            ("MEMORY:", StoreUrl::Memory),
            ("postgres://u@h/db", pg("postgres://u@h/db", None)),
            (
                "postgres://u@h/db?schema=orders",
                pg("postgres://u@h/db", Some("orders")),
            ),
            (
                "postgresql://u@h/db?sslmode=disable&schema=orders&connect_timeout=3",
                pg("postgresql://u@h/db?sslmode=disable&connect_timeout=3", Some("orders")),
            ),
            (
                "POSTGRES://u@h/db?Schema=a&schema=a",
                pg("POSTGRES://u@h/db", Some("a")),
            ),
            ("postgres://u@h/db?schema=", pg("postgres://u@h/db", Some(""))),
            (
                "postgres://u:p?ss@h/db?schema=x",
                pg("postgres://u:p?ss@h/db", Some("x")),
            ),
        ] {
            assert_eq!(StoreUrl::parse(url), Ok(expected.clone()), "{url}");
            assert_eq!(url.parse::<StoreUrl>(), Ok(expected), "{url}");
        }
    }

    #[test]
    fn bad_urls_are_refused_with_what_is_wrong() {
        assert_eq!(StoreUrl::parse(""), Err(StoreUrlError::Empty));
        assert_eq!(StoreUrl::parse("  "), Err(StoreUrlError::Empty));
        for url in ["sqlite:", "sqlite://", "SQLITE:"] {
            let e = StoreUrl::parse(url).unwrap_err();
            assert!(matches!(e, StoreUrlError::NoPath { .. }), "{url}: {e:?}");
            assert_eq!(e.to_string(), format!("`{url}` names no file: write sqlite:PATH"));
        }
        let e = StoreUrl::parse("memory:orders").unwrap_err();
        assert!(matches!(e, StoreUrlError::MemoryPath { .. }), "{e:?}");
        assert!(e.to_string().contains("write memory: alone"), "{e}");
        for (url, scheme) in [
            ("mysql://db/app", "mysql"),
            ("redis+tls://h", "redis+tls"),
            ("http://h/x", "http"),
        ] {
            let e = StoreUrl::parse(url).unwrap_err();
            assert_eq!(
                e,
                StoreUrlError::UnsupportedScheme {
                    url: url.to_owned(),
                    scheme: scheme.to_owned()
                }
            );
            assert!(
                e.to_string()
                    .starts_with(&format!("unsupported store URL `{url}` (scheme `{scheme}`)")),
                "{e}"
            );
        }
        let e = StoreUrl::parse("postgres://u@h/db?schema=a&schema=b").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the store URL `postgres://u@h/db?schema=a&schema=b` names two schemas: give one"
        );
    }

    #[test]
    fn no_error_or_display_names_the_password() {
        for url in [
            "mysql://app:hunter2@db/app",
            "memory://app:hunter2@db",
            "postgres://app:hunter2@db/app?schema=a&schema=b",
            "postgres://db/app?password=hunter2&schema=a&schema=b",
        ] {
            let e = StoreUrl::parse(url).unwrap_err();
            assert!(!e.to_string().contains("hunter2"), "{e}");
            assert!(!format!("{e:?}").contains("hunter2"), "{e:?}");
            assert!(e.to_string().contains("***"), "{e}");
        }
        let url = StoreUrl::parse("postgres://app:hunter2@db/app?sslmode=disable&schema=shop").unwrap();
        assert_eq!(url.to_string(), "postgres://app:***@db/app?sslmode=disable&schema=shop");
        assert!(!format!("{url:?}").contains("hunter2"), "{url:?}");
        assert_eq!(StoreUrl::Sqlite("a.db".into()).to_string(), "sqlite:a.db");
        assert_eq!(StoreUrl::Memory.to_string(), "memory:");
    }

    #[test]
    fn redaction_hides_every_form_of_the_password() {
        for (url, expected) in [
            (
                "postgres://app:s3cret@db.example:5432/test",
                "postgres://app:***@db.example:5432/test",
            ),
            ("postgres://app:s3cret@db.example", "postgres://app:***@db.example"),
            ("postgresql://app:p@ss@host/db", "postgresql://app:***@host/db"),
            ("postgres://app:p?ss@host/db", "postgres://app:***@host/db"),
            ("postgres://app:p#ss@host/db?x=1", "postgres://app:***@host/db?x=1"),
            ("postgres://app@host/db", "postgres://app@host/db"),
            ("postgres://host/db?user=a@b", "postgres://host/db?user=a@b"),
            (
                "postgres://host/db?user=app&password=s3cret&sslmode=disable",
                "postgres://host/db?user=app&password=***&sslmode=disable",
            ),
            (
                "host=h user=app password=s3cret dbname=test",
                "host=h user=app password=*** dbname=test",
            ),
            (
                "host=h password='s3 cret' dbname=test",
                "host=h password=*** dbname=test",
            ),
        ] {
            assert_eq!(redact_url(url), expected, "{url}");
        }
    }
}
