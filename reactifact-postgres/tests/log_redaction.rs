//! The log lines of the PostgreSQL store never carry the URL's password. A test binary of its
//! own: it captures events with a thread-local subscriber, which events of tests running on
//! other threads at the same time could keep from seeing them (tracing caches whether a
//! callsite is wanted).

mod common;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reactifact_core::store::{ClaimPolicy, ClaimRequest, OutboxStore};
use reactifact_core::{ActionKey, Scope};
use reactifact_postgres::{PostgresOptions, PostgresOutbox};
use reactifact_store_contract::{at, new_intents};

use common::Schemas;

const PASSWORD: &str = "s3cret-pw";

/// `url` with `PASSWORD` as its password (trust auth ignores it).
fn with_password(url: &str) -> String {
    let rest = url.strip_prefix("postgres://").expect("a postgres:// URL");
    let (user, host) = rest.split_once('@').expect("a user in the URL");
    let user = user.split(':').next().unwrap_or(user);
    format!("postgres://{user}:{PASSWORD}@{host}")
}

/// A subscriber that keeps every event's fields as text.
struct Capture(Arc<Mutex<String>>);

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = String::new();
        event.record(&mut Fields(&mut line));
        let mut all = self.0.lock().unwrap();
        all.push_str(&line);
        all.push('\n');
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test]
async fn the_log_and_the_store_name_never_carry_the_password() {
    let Some(url) = common::url("the_log_and_the_store_name_never_carry_the_password") else {
        return;
    };
    let schemas = Schemas::new(&url, "redact");
    let schema = schemas.name();
    let lines = Arc::new(Mutex::new(String::new()));
    let _guard = tracing::subscriber::set_default(Capture(lines.clone()));
    let outbox = PostgresOutbox::open(PostgresOptions::new(with_password(&url)).schema(&schema))
        .await
        .expect("trust auth ignores the password");
    // A damaged row, so that the claim logs a warning naming the store.
    outbox
        .register_alone(&new_intents("a", 1, &[("k1", "x")]), at(0))
        .await
        .expect("register");
    schemas
        .execute(&format!("UPDATE \"{schema}\".outbox SET attempts = 9 WHERE key = 'k1'"))
        .await;
    let owner: Arc<str> = Arc::from("d");
    let claimed = outbox
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit: 10,
            owner: &owner,
            lease: Duration::from_secs(30),
            now: at(1),
            policy: ClaimPolicy::none(),
        })
        .await
        .expect("claim");
    assert_eq!(claimed.integrity, [ActionKey::from("k1")]);
    let logged = lines.lock().unwrap().clone();
    assert!(logged.contains("migrated the postgres outbox schema"), "{logged}");
    assert!(logged.contains("integrity check"), "{logged}");
    assert!(logged.contains(&schema), "the lines name the store: {logged}");
    assert!(!logged.contains(PASSWORD), "{logged}");
    let name = outbox.describe();
    assert!(name.contains("127.0.0.1") && name.contains(&schema), "{name}");
    assert!(!name.contains(PASSWORD), "{name}");
    assert!(!format!("{outbox:?}").contains(PASSWORD));
}
