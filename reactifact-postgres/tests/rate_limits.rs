//! Rate limits on PostgreSQL against a claim that stalls while it holds a bucket's row (a
//! process stopped mid-claim, a hung connection): other claims neither wait for it nor take
//! more than the limit; they take the other kinds, and the limited kind again once it is
//! released. A pause meeting the stalled row gives up instead of hanging its drain.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reactifact_core::store::{ClaimPolicy, ClaimRequest, Claimed, OutboxStore, RateBucket};
use reactifact_core::{RateLimit, Scope};
use reactifact_postgres::{PostgresOptions, PostgresOutbox};
use reactifact_store_contract::new_intents;

use common::Schemas;

async fn claim(o: &PostgresOutbox, policy: &ClaimPolicy) -> Claimed {
    let owner: Arc<str> = Arc::from("drainer");
    let scope = Scope::all();
    let claiming = o.claim(ClaimRequest {
        scope: &scope,
        limit: 10,
        owner: &owner,
        lease: Duration::from_secs(60),
        now: SystemTime::now(),
        policy,
    });
    // A guard against a hang, not a measurement: the claim must not wait for the stalled one.
    tokio::time::timeout(Duration::from_secs(20), claiming)
        .await
        .expect("the claim waited for a stalled claim's lock")
        .unwrap()
}

fn keys(claimed: &Claimed) -> Vec<String> {
    let mut keys: Vec<String> = claimed.claims.iter().map(|d| d.key().to_string()).collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_claim_stalled_on_a_bucket_holds_back_only_its_kind_and_only_while_it_stalls() {
    let Some(url) = common::url("a_claim_stalled_on_a_bucket_holds_back_only_its_kind_and_only_while_it_stalls") else {
        return;
    };
    let schemas = Schemas::new(&url, "rlstall");
    let schema = schemas.name();
    let o = PostgresOutbox::open(PostgresOptions::new(&url).schema(&schema).pool_size(4))
        .await
        .unwrap();
    let now = SystemTime::now() - Duration::from_secs(1);
    o.register_alone(
        &new_intents("a", 1, &[("m1", "mail"), ("m2", "mail"), ("s1", "sms"), ("s2", "sms")]),
        now,
    )
    .await
    .unwrap();
    let policy = ClaimPolicy {
        rates: vec![RateBucket {
            name: Arc::from("mail"),
            kinds: vec![Arc::from("mail")],
            limit: RateLimit::per_second(1000).burst(100),
        }],
        ..ClaimPolicy::default()
    };
    // The bucket's row exists (a claim of another kind created it), then another claimer
    // holds it and stalls.
    let first = claim(&o, &policy).await;
    assert_eq!(keys(&first), ["m1", "m2", "s1", "s2"]);
    o.register_alone(
        &new_intents("a", 2, &[("m3", "mail"), ("s3", "sms")]),
        SystemTime::now() - Duration::from_secs(1),
    )
    .await
    .unwrap();
    let (mut stalled, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let holder = stalled.transaction().await.unwrap();
    holder
        .execute(
            &format!("SELECT 1 FROM \"{schema}\".outbox_rates WHERE name = 'mail' FOR UPDATE"),
            &[],
        )
        .await
        .unwrap();

    let during = claim(&o, &policy).await;
    assert_eq!(keys(&during), ["s3"], "the other kind goes on; the limited one waits");
    let soon = during.throttled.expect("the drain is told to look again");
    assert!(soon <= SystemTime::now() + Duration::from_secs(1), "{soon:?}");
    // A pause meeting the stalled row gives up (after its lock timeout), with an error.
    let paused = o.pause("mail", SystemTime::now() + Duration::from_secs(60)).await;
    assert!(paused.is_err(), "the pause waited out the stall: {paused:?}");

    holder.rollback().await.unwrap();
    let after = claim(&o, &policy).await;
    assert_eq!(keys(&after), ["m3"], "released, the limited kind is claimed again");
}
