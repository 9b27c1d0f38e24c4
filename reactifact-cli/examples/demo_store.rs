//! Writes the demonstration store that `docs/cli.md`'s examples were run on (the same flow
//! the CLI's tests write): `cargo run -p reactifact-cli --example demo_store -- demo.db`, or
//! on PostgreSQL, in a schema that holds no store yet:
//! `cargo run -p reactifact-cli --example demo_store -- postgres://USER@HOST/DATABASE SCHEMA`.

#[path = "../tests/support/mod.rs"]
mod support;

use reactifact_core::Context;
use reactifact_postgres::{redact_url, PostgresOptions, PostgresStore};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [url, schema] if url.starts_with("postgres://") || url.starts_with("postgresql://") => postgres(url, schema),
        [path] => sqlite(std::path::Path::new(path)),
        _ => {
            eprintln!("usage: demo_store PATH (a file that does not exist yet) | demo_store POSTGRES_URL SCHEMA");
            std::process::exit(2);
        }
    }
}

fn sqlite(path: &std::path::Path) {
    if path.exists() {
        eprintln!("{} exists already", path.display());
        std::process::exit(2);
    }
    support::build(path);
    println!("wrote {}", path.display());
}

fn postgres(url: &str, schema: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let options = PostgresOptions::new(url).schema(schema);
        let probe = PostgresStore::probe(&options).await.unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        });
        if probe.version.is_some() {
            eprintln!("schema `{schema}` of {} holds a store already", redact_url(url));
            std::process::exit(2);
        }
        let store = PostgresStore::open(options).await.unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        });
        let ctx = Context::open_store(store.clone(), "orders")
            .await
            .expect("the session opens");
        let ctx = support::write(ctx).await;
        support::settle(&**store.outbox()).await;
        drop(ctx);
        println!("wrote {}", probe.store);
    });
}
