//! The PostgreSQL store beyond the contract suite: opening (migrations, refusals, errors,
//! redaction), integrity holds, claims from two pools, and notifications. Runs when
//! `REACTIFACT_TEST_POSTGRES_URL` is set (see `common`), except the tests that need no server.

mod common;

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::store::{ClaimPolicy, ClaimRequest, OutboxStore, Outcome, Recorded, Recording};
use reactifact_core::{ActionKey, DispatchError, Drainer, Intent, Scope};
use reactifact_postgres::{OpenError, PostgresOptions, PostgresOutbox};
use reactifact_store_contract::{at, new_intents};

use common::Schemas;

const PASSWORD: &str = "s3cret-pw";

/// A port on 127.0.0.1 that nothing listens on: bound, then released.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().expect("its address").port();
    drop(listener);
    port
}

/// Every line of an error: its message and each source's.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = format!("{e} | {e:?}");
    let mut source = e.source();
    while let Some(s) = source {
        write!(out, " | {s} | {s:?}").unwrap();
        source = s.source();
    }
    out
}

/// Takes a store of this build back to schema 4, as a build before trace context left it: no
/// `trace_parent` column (and no ordering groups of schema 6, no rate limits of schema 7, no
/// approved digest of schema 8).
async fn downgrade_to_4(client: &tokio_postgres::Client, schema: &str) {
    client
        .batch_execute(&format!(
            "DROP TABLE \"{schema}\".call_answers;
             ALTER TABLE \"{schema}\".outbox DROP COLUMN decided_digest;
             DROP FUNCTION \"{schema}\".outbox_digest(text, text, text, bytea, bigint, bigint, bytea, bytea, bigint,
                 bigint, bigint, bigint, text, bigint, bigint, bigint, bigint, text, text, bigint, bigint, bigint,
                 bigint, text, bigint, text, bytea);
             DROP TABLE \"{schema}\".outbox_rates;
             DROP INDEX \"{schema}\".outbox_kind_due;
             DROP INDEX \"{schema}\".outbox_session_due;
             DROP INDEX \"{schema}\".outbox_group_open;
             ALTER TABLE \"{schema}\".outbox DROP COLUMN grp;
             ALTER TABLE \"{schema}\".outbox DROP COLUMN trace_parent;
             DELETE FROM \"{schema}\".schema_version WHERE version IN (5, 6, 7, 8)"
        ))
        .await
        .unwrap();
}

/// Takes a store of this build back to schema 3, as a build before approvals left it: no
/// decision columns, no 26-column digest, the old final index.
async fn downgrade_to_3(client: &tokio_postgres::Client, schema: &str) {
    downgrade_to_4(client, schema).await;
    client
        .batch_execute(&format!(
            "ALTER TABLE \"{schema}\".outbox DROP COLUMN decision, DROP COLUMN decided_by, DROP COLUMN decided_at,
                 DROP COLUMN decision_reason;
             DROP FUNCTION \"{schema}\".outbox_digest(text, text, text, bytea, bigint, bigint, bytea, bytea, bigint,
                 bigint, bigint, bigint, text, bigint, bigint, bigint, bigint, text, text, bigint, bigint, bigint,
                 bigint, text, bigint, text);
             DROP INDEX \"{schema}\".outbox_rejected;
             DROP INDEX \"{schema}\".outbox_final;
             CREATE INDEX outbox_final ON \"{schema}\".outbox (updated_at, seq) WHERE status IN (2, 6);
             DELETE FROM \"{schema}\".schema_version WHERE version = 4"
        ))
        .await
        .unwrap();
}

/// Every row's key and digest, in key order.
async fn digests(client: &tokio_postgres::Client, schema: &str) -> Vec<(String, Vec<u8>)> {
    let sql = format!("SELECT key, digest FROM \"{schema}\".outbox ORDER BY key");
    client
        .query(&sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, Vec<u8>>(1)))
        .collect()
}

/// A schema-3 store (before approvals) upgrades in place: no row is rewritten, and every row
/// still passes its digest (the 26-column digest of a row without a decision is the old one);
/// an intent registered afterwards awaits approval, its decision is digested, and a decision
/// changed outside reactifact is caught.
#[tokio::test]
async fn a_schema_3_store_upgrades_to_approvals_keeping_every_digest() {
    let Some(url) = common::url("a_schema_3_store_upgrades_to_approvals_keeping_every_digest") else {
        return;
    };
    let schemas = Schemas::new(&url, "approve");
    let schema = schemas.name();
    let options = || PostgresOptions::new(&url).schema(&schema).pool_size(2);
    let o = PostgresOutbox::open(options()).await.unwrap();
    o.register_alone(&new_intents("a", 1, &[("old", "x"), ("done", "x")]), at(0))
        .await
        .unwrap();
    drop(o);
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    downgrade_to_3(&client, &schema).await;
    let before = digests(&client, &schema).await;
    let refused = PostgresOutbox::open(options().allow_migration(false))
        .await
        .expect_err("older");
    assert!(
        matches!(
            refused,
            OpenError::OlderSchema {
                found: 3,
                supported: 8,
                ..
            }
        ),
        "{refused:?}"
    );

    let o = PostgresOutbox::open(options()).await.unwrap();
    assert_eq!(digests(&client, &schema).await, before, "the migration rewrites no row");
    assert_eq!(o.get("old").await.unwrap().unwrap().status(), DeliveryStatus::Pending);
    let owner: Arc<str> = Arc::from("drainer");
    let taken = o
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit: 10,
            owner: &owner,
            lease: Duration::from_secs(60),
            now: at(1),
            policy: ClaimPolicy::none(),
        })
        .await
        .unwrap();
    assert_eq!(
        taken.claims.len(),
        2,
        "rows of schema 3 are claimed: {:?}",
        taken.integrity
    );
    assert!(taken.integrity.is_empty());
    o.register_alone(
        &reactifact_store_contract::approval_intents("a", 2, &[("ask", "x"), ("ask2", "x")]),
        at(2),
    )
    .await
    .unwrap();
    assert_eq!(
        o.get("ask").await.unwrap().unwrap().status(),
        DeliveryStatus::AwaitingApproval
    );
    o.reject("ask", "bob", "no", at(3)).await.unwrap();
    o.approve("ask2", "ada", at(3)).await.unwrap();
    // A rejection turned into an approval outside reactifact is caught.
    client
        .execute(
            &format!("UPDATE \"{schema}\".outbox SET decision = 1, status = 0, due_at = 0 WHERE key = 'ask'"),
            &[],
        )
        .await
        .unwrap();
    assert!(o.get("ask").await.is_err(), "the changed row fails its digest");
    let taken = o
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit: 10,
            owner: &owner,
            lease: Duration::from_secs(60),
            now: at(4),
            policy: ClaimPolicy::none(),
        })
        .await
        .unwrap();
    let keys: Vec<&str> = taken.claims.iter().map(|d| d.key().as_str()).collect();
    assert_eq!(keys, ["ask2"], "only the approved intent is handed out");
    assert_eq!(taken.integrity, [ActionKey::from("ask")]);
    let held = o.get("ask").await.unwrap().unwrap();
    assert_eq!(held.status(), DeliveryStatus::Held);
    assert!(held.decision().is_none(), "the untrusted decision is dropped: {held:?}");
    // The operator's retry of the hold asks for a decision again: the changed rejection never
    // comes back approved.
    let retried = o.retry("ask", at(5)).await.unwrap();
    assert_eq!(retried.status(), DeliveryStatus::AwaitingApproval, "{retried:?}");
    let taken = o
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit: 10,
            owner: &owner,
            lease: Duration::from_secs(60),
            now: at(6),
            policy: ClaimPolicy::none(),
        })
        .await
        .unwrap();
    assert!(taken.claims.is_empty(), "{:?}", taken.claims);
}

#[tokio::test]
async fn an_unreachable_server_names_host_port_and_database() {
    // No server needed: nothing listens on the port.
    let port = closed_port();
    let url = format!("postgres://postgres:{PASSWORD}@127.0.0.1:{port}/orders_db");
    let e = PostgresOutbox::open(PostgresOptions::new(&url).connect_timeout(Duration::from_secs(5)))
        .await
        .expect_err("nothing listens on the port");
    let message = e.to_string();
    assert!(matches!(e, OpenError::Connect { .. }), "{e:?}");
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert!(message.contains("`orders_db`"), "{message}");
    assert!(message.contains("`postgres`"), "{message}");
    assert!(!chain(&e).contains(PASSWORD), "{}", chain(&e));
}

#[tokio::test]
async fn no_error_or_debug_output_names_the_password() {
    // A URL that does not parse (no server needed).
    for bad in [
        format!("postgres://app:{PASSWORD}@127.0.0.1:notaport/db"),
        format!("host=127.0.0.1 port=x password={PASSWORD}"),
    ] {
        let e = PostgresOutbox::open(PostgresOptions::new(&bad))
            .await
            .expect_err("a bad URL");
        assert!(matches!(e, OpenError::BadUrl { .. }), "{e:?}");
        assert!(!chain(&e).contains(PASSWORD), "{}", chain(&e));
        assert!(e.to_string().contains("***"), "{e}");
    }
    let options = PostgresOptions::new(format!("postgres://app:{PASSWORD}@127.0.0.1/db"));
    assert!(!format!("{options:?}").contains(PASSWORD), "{options:?}");
}

/// A schema-2 store (before the attempt history) upgrades in place: its rows keep their
/// state, what was in flight shows in the history, and new attempts are kept; with
/// `allow_migration(false)` it is refused and left alone, as is a schema that holds no store.
#[tokio::test]
async fn a_schema_2_store_upgrades_to_the_attempt_history_unless_told_not_to() {
    let Some(url) = common::url("a_schema_2_store_upgrades_to_the_attempt_history_unless_told_not_to") else {
        return;
    };
    let schemas = Schemas::new(&url, "upgrade");
    let schema = schemas.name();
    let options = || PostgresOptions::new(&url).schema(&schema).pool_size(2);
    let o = PostgresOutbox::open(options()).await.unwrap();
    o.register_alone(
        &new_intents("a", 1, &[("done", "x"), ("flying", "x"), ("later", "x")]),
        at(0),
    )
    .await
    .unwrap();
    let owner: Arc<str> = Arc::from("old drainer");
    let claim = |limit: usize, now| {
        let (o, owner) = (o.clone(), owner.clone());
        async move {
            o.claim(ClaimRequest {
                scope: &Scope::all(),
                limit,
                owner: &owner,
                lease: Duration::from_secs(60),
                now,
                policy: ClaimPolicy::none(),
            })
            .await
            .unwrap()
        }
    };
    claim(2, at(1)).await;
    let recording = [Recording {
        key: ActionKey::from("done"),
        token: reactifact_core::ledger::FenceToken(1),
        outcome: Outcome::Delivered,
    }];
    o.record(&recording, at(2)).await.unwrap();
    drop(o);
    // Back to schema 2, as that build left it.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    downgrade_to_3(&client, &schema).await;
    client
        .batch_execute(&format!(
            "ALTER TABLE \"{schema}\".outbox DROP COLUMN claim_owner, DROP COLUMN claimed_at, DROP COLUMN claim_until,
                 DROP COLUMN claim_token;
             DROP INDEX \"{schema}\".outbox_cancelled;
             DROP TABLE \"{schema}\".outbox_attempts;
             DELETE FROM \"{schema}\".schema_version WHERE version = 3"
        ))
        .await
        .unwrap();

    let refused = PostgresOutbox::open(options().allow_migration(false))
        .await
        .expect_err("older");
    assert!(
        matches!(
            refused,
            OpenError::OlderSchema {
                found: 2,
                supported: 8,
                ..
            }
        ),
        "{refused:?}"
    );
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'outbox_attempts'",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0, "a refused open changed nothing");
    let missing = schemas.name();
    let refused = PostgresOutbox::open(PostgresOptions::new(&url).schema(&missing).allow_migration(false))
        .await
        .expect_err("no store");
    assert!(matches!(refused, OpenError::NoStore { .. }), "{refused:?}");
    let created: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&missing],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!created, "a refused open created the schema");

    // The upgrade: the delivered row's attempt predates the history; the one in flight shows.
    let o = PostgresOutbox::open(options()).await.unwrap();
    assert_eq!(
        o.get("done").await.unwrap().unwrap().status(),
        DeliveryStatus::Delivered
    );
    assert_eq!(o.attempts("done").await.unwrap(), Some(Vec::new()));
    let flying = o.attempts("flying").await.unwrap().unwrap();
    assert_eq!(flying.len(), 1);
    assert_eq!(flying[0].outcome, reactifact_core::ledger::AttemptOutcome::InFlight);
    assert_eq!(&*flying[0].owner, "old drainer");
    assert_eq!(flying[0].claimed_at, at(1));
    // Its lease expires; the next claim reclaims it and keeps both attempts.
    let owner: Arc<str> = Arc::from("new drainer");
    let taken = o
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit: 2,
            owner: &owner,
            lease: Duration::from_secs(60),
            now: at(61_000),
            policy: ClaimPolicy::none(),
        })
        .await
        .unwrap();
    assert_eq!(taken.reclaimed, 1);
    let history = o.attempts("flying").await.unwrap().unwrap();
    let outcomes: Vec<_> = history.iter().map(|a| (a.outcome.name(), &*a.owner)).collect();
    assert_eq!(outcomes, [("expired", "old drainer"), ("in flight", "new drainer")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_opens_migrate_once() {
    let Some(url) = common::url("concurrent_first_opens_migrate_once") else {
        return;
    };
    let schemas = Schemas::new(&url, "migrate");
    let schema = schemas.name();
    let mut opens = Vec::new();
    for _ in 0..8 {
        let options = PostgresOptions::new(&url).schema(&schema).pool_size(1);
        opens.push(tokio::spawn(PostgresOutbox::open(options)));
    }
    let mut outboxes = Vec::new();
    for open in opens {
        outboxes.push(
            open.await
                .expect("the task")
                .unwrap_or_else(|e| panic!("a concurrent open failed: {e}")),
        );
    }
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let versions: Vec<i32> = client
        .query(
            &format!("SELECT version FROM \"{schema}\".schema_version ORDER BY 1"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, [1, 2, 3, 4, 5, 6, 7, 8], "one migration row per version");
    // And the store works from every one of them.
    outboxes[3]
        .register_alone(&new_intents("a", 1, &[("k1", "x")]), at(0))
        .await
        .unwrap();
    assert_eq!(
        outboxes[5].get("k1").await.unwrap().unwrap().status(),
        DeliveryStatus::Pending
    );
}

#[tokio::test]
async fn a_newer_or_foreign_schema_is_refused() {
    let Some(url) = common::url("a_newer_or_foreign_schema_is_refused") else {
        return;
    };
    let schemas = Schemas::new(&url, "refuse");
    let newer = schemas.name();
    drop(
        PostgresOutbox::open(PostgresOptions::new(&url).schema(&newer))
            .await
            .unwrap(),
    );
    schemas
        .execute(&format!(
            "INSERT INTO \"{newer}\".schema_version (version, description) VALUES (9, 'from the future')"
        ))
        .await;
    match PostgresOutbox::open(PostgresOptions::new(&url).schema(&newer)).await {
        Err(
            e @ OpenError::NewerSchema {
                found: 9, supported: 8, ..
            },
        ) => {
            let message = e.to_string();
            assert!(message.contains(&newer) && message.contains("newer"), "{message}");
        }
        other => panic!("a newer schema must be refused: {other:?}"),
    }

    let foreign = schemas.name();
    schemas
        .execute(&format!(
            "CREATE SCHEMA \"{foreign}\"; CREATE TABLE \"{foreign}\".users (id int)"
        ))
        .await;
    match PostgresOutbox::open(PostgresOptions::new(&url).schema(&foreign)).await {
        Err(OpenError::ForeignSchema { tables, .. }) => assert_eq!(tables, "users"),
        other => panic!("a foreign schema must be refused: {other:?}"),
    }

    match PostgresOutbox::open(PostgresOptions::new(&url).schema("Bad-Name")).await {
        Err(OpenError::BadSchema { schema, .. }) => assert_eq!(schema, "Bad-Name"),
        other => panic!("a bad schema name must be refused: {other:?}"),
    }
}

async fn claim(outbox: &PostgresOutbox, owner: &str, limit: usize, now: u64) -> reactifact_core::store::Claimed {
    let owner: Arc<str> = Arc::from(owner);
    outbox
        .claim(ClaimRequest {
            scope: &Scope::all(),
            limit,
            owner: &owner,
            lease: Duration::from_secs(300),
            now: at(now),
            policy: ClaimPolicy::none(),
        })
        .await
        .expect("claim")
}

#[tokio::test]
async fn a_changed_row_is_held_on_claim_never_delivered() {
    let Some(url) = common::url("a_changed_row_is_held_on_claim_never_delivered") else {
        return;
    };
    let schemas = Schemas::new(&url, "held");
    let outbox = schemas.open().await;
    let s = format!("\"{}\"", outbox.schema());
    let keys = [
        ("ok", "x"),
        ("attempts", "x"),
        ("bytes", "x"),
        ("rehashed", "x"),
        ("forged", "x"),
    ];
    outbox.register_alone(&new_intents("a", 1, &keys), at(0)).await.unwrap();
    let digest = format!(
        "{s}.outbox_digest(key, kind, session, origin_commit, origin_gen, origin_run, action_hash, bytes, recorded_at, \
         status, due_at, token, owner, lease_until, attempts, expired, interrupted, last_error, cancel_reason, \
         updated_at, delivered_at, next_attempt_at)"
    );
    let forged_bytes = hex(&rmp_bytes("ok"));
    schemas
        .execute(&format!(
            // A changed column, the digest left as it was.
            "UPDATE {s}.outbox SET attempts = 3 WHERE key = 'attempts';
             -- One flipped bit of the committed bytes.
             UPDATE {s}.outbox SET bytes = set_byte(bytes, 1, get_byte(bytes, 1) # 1) WHERE key = 'bytes';
             -- Changed bytes under a recomputed digest: they no longer hash to the action hash.
             UPDATE {s}.outbox SET bytes = set_byte(bytes, 1, get_byte(bytes, 1) # 1) WHERE key = 'rehashed';
             UPDATE {s}.outbox SET digest = {digest} WHERE key = 'rehashed';
             -- Another intent's bytes, with their hash and a recomputed digest.
             UPDATE {s}.outbox SET bytes = '\\x{forged_bytes}', action_hash = sha256('\\x{forged_bytes}') WHERE key = 'forged';
             UPDATE {s}.outbox SET digest = {digest} WHERE key = 'forged';"
        ))
        .await;
    let claimed = claim(&outbox, "d", 10, 1).await;
    let taken: Vec<&str> = claimed.claims.iter().map(|d| d.key().as_str()).collect();
    assert_eq!(taken, ["ok"], "only the intact row is handed out");
    let mut held: Vec<&str> = claimed.integrity.iter().map(ActionKey::as_str).collect();
    held.sort_unstable();
    assert_eq!(held, ["attempts", "bytes", "forged", "rehashed"]);
    for (key, why) in [
        ("attempts", "does not match its digest"),
        ("bytes", "does not match its digest"),
        ("rehashed", "do not hash to its action hash"),
        ("forged", "is for key `ok`"),
    ] {
        let d = outbox
            .get(key)
            .await
            .expect("a held row reads")
            .expect("held, not dropped");
        assert_eq!(d.status(), DeliveryStatus::Held, "{key}");
        let error = d.last_error().unwrap_or_default();
        assert!(
            error.starts_with("integrity: ") && error.contains(why),
            "{key}: {error}"
        );
    }
    assert_eq!(outbox.counts(&Scope::all()).await.unwrap().held, 4);
    // An operator's retry re-arms a held row; its next claim checks it again.
    outbox.retry("rehashed", at(2)).await.expect("retry");
    let again = claim(&outbox, "d", 10, 3).await;
    assert!(again.claims.is_empty(), "{:?}", again.claims);
    assert_eq!(again.integrity, [ActionKey::from("rehashed")]);
}

/// The bytes of the `PendingAction` the contract suite commits for `key` (kind `x`).
fn rmp_bytes(key: &str) -> Vec<u8> {
    new_intents("a", 1, &[(key, "x")])[0].bytes.to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_pools_claiming_together_never_hand_out_a_key_twice() {
    let Some(url) = common::url("two_pools_claiming_together_never_hand_out_a_key_twice") else {
        return;
    };
    let schemas = Schemas::new(&url, "two_pools");
    let schema = schemas.name();
    let open = || PostgresOutbox::open(PostgresOptions::new(&url).schema(&schema).pool_size(3));
    let (first, second) = (open().await.unwrap(), open().await.unwrap());
    let names: Vec<String> = (0..2000).map(|i| format!("k{i:04}")).collect();
    let keys: Vec<(&str, &str)> = names.iter().map(|k| (k.as_str(), "x")).collect();
    for (n, chunk) in keys.chunks(500).enumerate() {
        first
            .register_alone(&new_intents("a", n as u64 + 1, chunk), at(0))
            .await
            .unwrap();
    }
    let mut tasks = Vec::new();
    for (i, outbox) in [first.clone(), second.clone()].into_iter().enumerate() {
        for t in 0..4 {
            let outbox = outbox.clone();
            tasks.push(tokio::spawn(async move {
                let owner = format!("pool {i} task {t}");
                let mut mine = Vec::new();
                loop {
                    let claimed = claim(&outbox, &owner, 16, 1).await;
                    if claimed.claims.is_empty() {
                        break mine;
                    }
                    let outcomes: Vec<Recording> = claimed
                        .claims
                        .iter()
                        .map(|d| Recording {
                            key: d.key().clone(),
                            token: d.token(),
                            outcome: Outcome::Delivered,
                        })
                        .collect();
                    let recorded = outbox.record(&outcomes, at(2)).await.unwrap();
                    assert!(recorded
                        .iter()
                        .all(|r| *r == Recorded::Accepted(DeliveryStatus::Delivered)));
                    mine.extend(claimed.claims.iter().map(|d| d.key().to_string()));
                }
            }));
        }
    }
    let mut seen = HashSet::new();
    let mut per_pool = [0usize; 2];
    for (n, task) in tasks.into_iter().enumerate() {
        let mine = task.await.expect("a claimer panicked");
        per_pool[n / 4] += mine.len();
        for key in mine {
            assert!(seen.insert(key.clone()), "{key} handed out twice");
        }
    }
    assert_eq!(seen.len(), 2000, "every key handed out");
    assert!(per_pool.iter().all(|&n| n > 0), "both pools claimed: {per_pool:?}");
    assert_eq!(second.counts(&Scope::all()).await.unwrap().delivered, 2000);
}

#[tokio::test]
async fn a_registration_wakes_a_listener_of_another_pool() {
    let Some(url) = common::url("a_registration_wakes_a_listener_of_another_pool") else {
        return;
    };
    let schemas = Schemas::new(&url, "notify");
    let schema = schemas.name();
    let open = || PostgresOutbox::open(PostgresOptions::new(&url).schema(&schema).pool_size(1));
    let (drainer, committer) = (open().await.unwrap(), open().await.unwrap());
    let mut wake = drainer.listen();
    // The first wake-up says the listener listens (a drainer then claims once).
    let bound = Duration::from_secs(60);
    assert!(tokio::time::timeout(bound, wake.next()).await.expect("listening"));
    assert!(
        wake.next().now_or_never().is_none(),
        "no wake-up without a registration"
    );
    committer
        .register_alone(&new_intents("a", 1, &[("k1", "x")]), at(0))
        .await
        .unwrap();
    assert!(tokio::time::timeout(bound, wake.next())
        .await
        .expect("woken by the registration"));
    // A registration that registers nothing new (the key is held) does not notify.
    committer
        .register_alone(&new_intents("a", 2, &[("k1", "x")]), at(1))
        .await
        .unwrap();
    committer
        .register_alone(&new_intents("a", 3, &[("k2", "x")]), at(2))
        .await
        .unwrap();
    assert!(tokio::time::timeout(bound, wake.next()).await.expect("woken by k2"));
    assert!(wake.next().now_or_never().is_none(), "one wake-up per notification");
}

#[tokio::test]
async fn a_rolled_back_commit_registers_nothing_and_notifies_no_one() {
    let Some(url) = common::url("a_rolled_back_commit_registers_nothing_and_notifies_no_one") else {
        return;
    };
    let schemas = Schemas::new(&url, "rollback");
    let outbox = schemas.open().await;
    let mut wake = outbox.listen();
    let bound = Duration::from_secs(60);
    assert!(tokio::time::timeout(bound, wake.next()).await.expect("listening"));
    let mut client = outbox.pool().get().await.expect("a connection");
    let tx = client.transaction().await.unwrap();
    outbox
        .register(&*tx, &new_intents("a", 1, &[("k1", "x")]), at(0))
        .await
        .expect("register in the transaction");
    assert!(
        outbox.get("k1").await.unwrap().is_none(),
        "not visible before the commit"
    );
    tx.rollback().await.unwrap();
    assert!(
        outbox.get("k1").await.unwrap().is_none(),
        "a rolled-back commit registers nothing"
    );
    // The next committed registration is the first wake-up: the rolled-back one sent none.
    let tx = client.transaction().await.unwrap();
    outbox
        .register(&*tx, &new_intents("a", 2, &[("k2", "x")]), at(1))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(tokio::time::timeout(bound, wake.next())
        .await
        .expect("woken by the commit"));
    assert!(
        wake.next().now_or_never().is_none(),
        "one wake-up, for the committed registration"
    );
    assert_eq!(
        outbox.get("k2").await.unwrap().unwrap().status(),
        DeliveryStatus::Pending
    );
}

#[tokio::test]
async fn a_commit_on_a_connection_with_other_settings_registers_intact_rows() {
    let Some(url) = common::url("a_commit_on_a_connection_with_other_settings_registers_intact_rows") else {
        return;
    };
    let schemas = Schemas::new(&url, "settings");
    let outbox = schemas.open().await;
    // The application's own connection, with settings that change how values print.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "SET bytea_output = 'escape'; SET search_path = pg_catalog; SET DateStyle = 'German'; \
             SET extra_float_digits = 0; SET TimeZone = 'Pacific/Chatham'",
        )
        .await
        .unwrap();
    outbox
        .register(&client, &new_intents("a", 1, &[("k1", "x"), ("k2", "y")]), at(0))
        .await
        .expect("register");
    let claimed = claim(&outbox, "d", 10, 1).await;
    assert!(claimed.integrity.is_empty(), "{:?}", claimed.integrity);
    let taken: Vec<&str> = claimed.claims.iter().map(|d| d.key().as_str()).collect();
    assert_eq!(taken, ["k1", "k2"]);
    assert_eq!(claimed.claims[0].intent().payload::<String>().unwrap(), "k1");
}

#[tokio::test]
async fn a_claim_dropped_by_its_caller_releases_what_it_took() {
    let Some(url) = common::url("a_claim_dropped_by_its_caller_releases_what_it_took") else {
        return;
    };
    let schemas = Schemas::new(&url, "dropped");
    let outbox = schemas.open().await;
    outbox
        .register_alone(&new_intents("a", 1, &[("k1", "x"), ("k2", "x")]), at(0))
        .await
        .unwrap();
    let owner: Arc<str> = Arc::from("gone");
    let scope = Scope::all();
    let mut claiming = outbox.claim(ClaimRequest {
        scope: &scope,
        limit: 10,
        owner: &owner,
        lease: Duration::from_secs(3600),
        now: at(1),
        policy: ClaimPolicy::none(),
    });
    // Polled once (the claim starts on the runtime), then dropped before its answer: on this
    // current-thread runtime the claim cannot have answered yet.
    assert!((&mut claiming).now_or_never().is_none());
    drop(claiming);
    // The claim still runs, then releases both intents: pending, the attempt uncounted, the
    // token spent. Until then they read as pending with token 0, or in flight.
    let released = async {
        loop {
            let (k1, k2) = (
                outbox.get("k1").await.unwrap().unwrap(),
                outbox.get("k2").await.unwrap().unwrap(),
            );
            if k1.token().0 == 1
                && k2.token().0 == 1
                && k1.status() == DeliveryStatus::Pending
                && k2.status() == DeliveryStatus::Pending
            {
                return (k1, k2);
            }
            tokio::task::yield_now().await;
        }
    };
    let (k1, k2) = tokio::time::timeout(Duration::from_secs(60), released)
        .await
        .expect("the dropped claim released its intents");
    for d in [k1, k2] {
        assert_eq!((d.attempts(), d.lease()), (0, None), "{d:?}");
    }
    let again = claim(&outbox, "live", 10, 2).await;
    assert_eq!(again.claims.len(), 2, "released intents are due at once");
}

#[tokio::test]
async fn the_longest_schema_name_registers_and_notifies() {
    let Some(url) = common::url("the_longest_schema_name_registers_and_notifies") else {
        return;
    };
    let schemas = Schemas::new(&url, "long");
    // 48 bytes, the longest name the store takes, made unique for this run.
    let schema = format!("{:_<48}", format!("rft_long_{}_", std::process::id()));
    assert_eq!(schema.len(), 48);
    schemas.adopt(&schema);
    let outbox = PostgresOutbox::open(PostgresOptions::new(&url).schema(&schema))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut wake = outbox.listen();
    let bound = Duration::from_secs(60);
    assert!(tokio::time::timeout(bound, wake.next()).await.expect("listening"));
    outbox
        .register_alone(&new_intents("a", 1, &[("k1", "x")]), at(0))
        .await
        .unwrap_or_else(|e| panic!("a registration in schema {schema} notifies: {e}"));
    assert!(tokio::time::timeout(bound, wake.next()).await.expect("woken"));
}

#[tokio::test]
async fn a_server_error_says_what_the_server_said() {
    let Some(url) = common::url("a_server_error_says_what_the_server_said") else {
        return;
    };
    let schemas = Schemas::new(&url, "server_error");
    let outbox = schemas.open().await;
    schemas
        .execute(&format!("DROP TABLE \"{}\".outbox CASCADE", outbox.schema()))
        .await;
    let e = outbox.get("k1").await.expect_err("the table is gone");
    let message = e.to_string();
    assert!(
        message.contains(outbox.schema()) && message.contains("does not exist") && message.contains("42P01"),
        "{message}"
    );
    assert!(!e.is_retryable(), "{message}");
}

#[tokio::test]
async fn a_row_changed_while_in_flight_is_held_not_recorded() {
    let Some(url) = common::url("a_row_changed_while_in_flight_is_held_not_recorded") else {
        return;
    };
    let schemas = Schemas::new(&url, "held_in_flight");
    let outbox = schemas.open().await;
    outbox
        .register_alone(&new_intents("a", 1, &[("k1", "x"), ("k2", "x")]), at(0))
        .await
        .unwrap();
    let claimed = claim(&outbox, "d", 10, 1).await;
    assert_eq!(claimed.claims.len(), 2);
    schemas
        .execute(&format!(
            "UPDATE \"{}\".outbox SET lease_until = lease_until + 1 WHERE key IN ('k1', 'k2')",
            outbox.schema()
        ))
        .await;
    let token = claimed.claims[0].token();
    let renewed = outbox
        .renew(&[(ActionKey::from("k2"), token)], at(500))
        .await
        .expect("renew");
    assert_eq!(renewed, [false], "a changed row is not renewed");
    let recorded = outbox
        .record(
            &[Recording {
                key: ActionKey::from("k1"),
                token,
                outcome: Outcome::Delivered,
            }],
            at(2),
        )
        .await
        .expect("record");
    assert_eq!(
        recorded,
        [Recorded::Stale {
            status: Some(DeliveryStatus::Held),
            token
        }]
    );
    let k1 = outbox.get("k1").await.expect("a held row reads").expect("held");
    assert_eq!(k1.status(), DeliveryStatus::Held);
    assert!(k1.last_error().is_some_and(|e| e.starts_with("integrity: ")), "{k1:?}");
    assert!(matches!(
        outbox.get("k2").await,
        Err(reactifact_core::error::StoreError::Integrity { .. })
    ));
}

#[tokio::test]
async fn the_wake_ups_a_serving_drainer_waits_on_come_with_each_registration_of_another_pool() {
    let Some(url) = common::url("the_wake_ups_a_serving_drainer_waits_on_come_with_each_registration_of_another_pool")
    else {
        return;
    };
    let schemas = Schemas::new(&url, "drainwake");
    let schema = schemas.name();
    let open = || PostgresOutbox::open(PostgresOptions::new(&url).schema(&schema).pool_size(2));
    let (outbox, committer) = (open().await.unwrap(), open().await.unwrap());
    // What `Drainer::serve` waits on beside its poll (reactifact-core/tests/wakeups.rs shows a
    // serving drainer claiming at a wake-up).
    let mut wakeups = outbox.wakeups().expect("PostgreSQL wakes its drainers");
    let bound = Duration::from_secs(30);
    // The first says the listener listens (a drain then claims once, for what came before).
    tokio::time::timeout(bound, wakeups.next())
        .await
        .expect("listening")
        .unwrap();
    for generation in 1..=3 {
        assert!(
            wakeups.next().now_or_never().is_none(),
            "a wake-up without a registration"
        );
        let key = format!("k{generation}");
        committer
            .register_alone(&new_intents("a", generation, &[(key.as_str(), "x")]), at(generation))
            .await
            .unwrap();
        tokio::time::timeout(bound, wakeups.next())
            .await
            .expect("woken by the registration")
            .unwrap();
    }
    // A drainer serving the store delivers them (its first claim finds them).
    let (sent, mut delivered) = tokio::sync::mpsc::unbounded_channel();
    let drainer = Drainer::builder(outbox, move |intent: Intent| {
        let _ = sent.send(intent.key().to_string());
        std::future::ready(Ok::<(), DispatchError>(()))
    })
    .poll_interval(Duration::from_secs(3600))
    .build()
    .expect("valid delivery options");
    let stop = drainer.stop_handle();
    let serving = tokio::spawn({
        let stop = stop.clone();
        async move { drainer.serve(stop).await }
    });
    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(tokio::time::timeout(bound, delivered.recv()).await.unwrap().unwrap());
    }
    got.sort();
    assert_eq!(got, ["k1", "k2", "k3"]);
    stop.stop();
    assert_eq!(serving.await.unwrap().unwrap().delivered, 3);
}
