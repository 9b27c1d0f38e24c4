//! `reactifact_postgres::connect`: a session of the store a URL names. A PostgreSQL URL with
//! `?schema=` opens that schema's store (the driver never sees the parameter) and a reopen
//! sees what was written; SQLite and memory URLs open as the core opens them; bad URLs are
//! errors that name the URL without its password. The server's tests run when
//! `REACTIFACT_TEST_POSTGRES_URL` is set (see `common`).

mod common;

use reactifact_core::error::StoreUrlError;
use reactifact_core::Context;
use reactifact_postgres::{connect, ConnectError, OpenError};

use common::flow::{order, Order};
use common::Schemas;

/// `url` with `?schema=NAME` (or `&schema=NAME`) added.
fn with_schema(url: &str, schema: &str) -> String {
    let join = if url.contains('?') { '&' } else { '?' };
    format!("{url}{join}schema={schema}")
}

/// The store's open errors are the core's one `OpenError`: a program that opens SQLite and
/// PostgreSQL stores matches one type.
#[test]
fn the_open_error_is_the_cores() {
    let same: fn(OpenError) -> reactifact_core::error::OpenError = |e| e;
    let e = same(OpenError::BadSchema { schema: "Bad".into() });
    assert!(e.to_string().contains("invalid schema name `Bad`"), "{e}");
}

fn assert_send<T: Send>(_: &T) {}

#[test]
fn the_future_is_send() {
    assert_send(&connect("postgres://app@db/app?schema=shop", "orders"));
    assert_send(&connect("memory:", String::from("orders")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_url_opens_the_schema_it_names_and_a_reopen_sees_what_was_written() {
    let Some(url) = common::url("a_postgres_url_opens_the_schema_it_names_and_a_reopen_sees_what_was_written") else {
        return;
    };
    let schemas = Schemas::new(&url, "connect");
    let schema = schemas.name();
    // Another parameter beside `schema`, before and after it: the driver gets it, not `schema`.
    for (n, store_url) in [
        with_schema(&url, &schema),
        format!("{}&application_name=rft_connect", with_schema(&url, &schema)),
        with_schema(&format!("{url}?application_name=rft_connect"), &schema),
    ]
    .into_iter()
    .enumerate()
    {
        let mut ctx = connect(&store_url, "orders").await.unwrap_or_else(|e| panic!("{e}"));
        let described = ctx.store_description();
        assert!(
            described.starts_with("postgres://") && described.ends_with(&format!("schema {schema}")),
            "{described}"
        );
        assert!(ctx.outbox().describe().contains(&schema), "{}", ctx.outbox().describe());
        let id = format!("order:{n}");
        ctx.create(id.as_str(), order(n as u64)).unwrap();
        drop(ctx);

        let again = connect(&store_url, "orders").await.unwrap();
        assert_eq!(again.generation().0, n as u64 + 1, "{store_url}");
        let read: Order = again
            .get::<Order>(id.as_str())
            .unwrap()
            .expect("the order was written")
            .data;
        assert_eq!(read.total_cents, order(n as u64).total_cents);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_name_the_store_refuses_is_an_error_before_any_connection() {
    // Nothing listens on port 1: only a check before connecting can give `BadSchema`.
    let url = "postgres://app@127.0.0.1:1/app";
    for bad in ["Shop", "shop-eu", "pg_shop", "1shop", "sh%6Fp", ""] {
        let e = connect(&with_schema(url, bad), "orders").await.unwrap_err();
        assert!(
            matches!(&e, ConnectError::Store { source: OpenError::BadSchema { schema, .. }, .. } if schema == bad),
            "{bad}: {e:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_and_memory_urls_open_as_the_core_opens_them() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("state.db").display());
    let mut ctx = connect(&url, "orders").await.unwrap();
    assert!(
        ctx.store_description().starts_with("sqlite:"),
        "{}",
        ctx.store_description()
    );
    ctx.create("order:1", order(1)).unwrap();
    drop(ctx);
    let again = connect(&url, "orders").await.unwrap();
    assert!(again.get::<Order>("order:1").unwrap().is_some());
    drop(again);
    let same = Context::connect(&url, "orders").await.unwrap();
    assert!(same.get::<Order>("order:1").unwrap().is_some());

    let memory = connect("memory:", "orders").await.unwrap();
    assert_eq!(memory.store_description(), "memory");

    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a database at all, just some text that is long enough").unwrap();
    let e = connect(&text.display().to_string(), "orders").await.unwrap_err();
    assert!(
        matches!(
            &e,
            ConnectError::Core(reactifact_core::error::ConnectError::Open { .. })
        ),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_are_errors_that_name_the_url_without_its_password() {
    assert!(matches!(
        connect("", "s").await,
        Err(ConnectError::Url(StoreUrlError::Empty))
    ));
    assert!(matches!(
        connect("sqlite:", "s").await,
        Err(ConnectError::Url(StoreUrlError::NoPath { .. }))
    ));
    type Expected = fn(&ConnectError) -> bool;
    let cases: [(&str, Expected); 5] = [
        ("mysql://app:hunter2@db/app", |e| {
            matches!(e, ConnectError::Url(StoreUrlError::UnsupportedScheme { .. }))
        }),
        ("postgres://app:hunter2@db/app?schema=a&schema=b", |e| {
            matches!(e, ConnectError::Url(StoreUrlError::TwoSchemas { .. }))
        }),
        ("postgres://app:hunter2@127.0.0.1:1/app?schema=Bad-Name", |e| {
            matches!(
                e,
                ConnectError::Store {
                    source: OpenError::BadSchema { .. },
                    ..
                }
            )
        }),
        ("postgres://app:hunter2@db.internal:notaport/app?schema=shop", |e| {
            matches!(
                e,
                ConnectError::Store {
                    source: OpenError::BadUrl { .. },
                    ..
                }
            )
        }),
        // Nothing listens on port 1: the connection is refused.
        ("postgresql://app:hunter2@127.0.0.1:1/app?schema=shop", |e| {
            matches!(
                e,
                ConnectError::Store {
                    source: OpenError::Connect { .. },
                    ..
                }
            )
        }),
    ];
    for (url, expected) in cases {
        let e = connect(url, "orders").await.unwrap_err();
        assert!(expected(&e), "{url}: {e:?}");
        let text = e.to_string();
        assert!(text.contains("app:***@"), "{url}: {text}");
        assert!(!text.contains("hunter2"), "{url}: {text}");
        assert!(!format!("{e:?}").contains("hunter2"), "{url}: {e:?}");
        let mut source = std::error::Error::source(&e);
        while let Some(inner) = source {
            assert!(!inner.to_string().contains("hunter2"), "{url}: {inner}");
            source = inner.source();
        }
    }
    let e = connect("postgres://app:hunter2@127.0.0.1:1/app?schema=Bad-Name", "orders")
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string().split(": a lowercase").next().unwrap(),
        "connecting to `postgres://app:***@127.0.0.1:1/app?schema=Bad-Name`: invalid schema name `Bad-Name`"
    );
}
