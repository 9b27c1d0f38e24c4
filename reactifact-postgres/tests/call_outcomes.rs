//! Second review of issue 17: unrecordable and abandoned recorded calls through PostgreSQL
//! (same head, same log, verify and replay after a reopen). Runs when
//! `REACTIFACT_TEST_POSTGRES_URL` is set (see `common`).

mod common;

use std::time::Duration;

use reactifact_core::{Agent, Artifact, Context, Produce, ProduceCall, Runtime};
use serde::{Deserialize, Serialize};

use common::flow::open_store;
use common::Schemas;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Ticket {
    text: String,
}

impl Artifact for Ticket {
    const KIND: &'static str = "ticket";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Out {
    text: String,
}

impl Artifact for Out {
    const KIND: &'static str = "out";
}

/// Encodes as a free string, decodes only as a known label: unrecordable.
#[derive(Debug, Clone)]
struct Lopsided;

impl Serialize for Lopsided {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("free text")
    }
}

impl<'de> Deserialize<'de> for Lopsided {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        enum Known {
            Billing,
        }
        Known::deserialize(d).map(|Known::Billing| Lopsided)
    }
}

fn odd_calls() -> Agent {
    Agent::new("a").produce(
        Produce::new("odd", |call: ProduceCall<Ticket>| async move {
            let unrecordable = call
                .record("crm", "lookup", || async { Ok::<_, std::io::Error>(Lopsided) })
                .await
                .is_err();
            let asked = call.record("llm", "q", || async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, std::io::Error>("late".to_owned())
            });
            let abandoned = tokio::time::timeout(Duration::from_millis(10), asked).await.is_err();
            call.effects.upsert(
                "out:1",
                Out {
                    text: format!("{unrecordable} {abandoned}"),
                },
            );
        })
        .creates::<Out>(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrecordable_and_abandoned_calls_survive_a_postgres_reopen() {
    let Some(url) = common::url("unrecordable_and_abandoned_calls_survive_a_postgres_reopen") else {
        return;
    };
    let schemas = Schemas::new(&url, "review2_calls");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    let mut ctx = Context::open_store(store.clone(), "odd").await.unwrap();
    ctx.create("ticket:1", Ticket { text: "t".into() }).unwrap();
    let mut rt = Runtime::builder(ctx).agent(odd_calls()).build().unwrap();
    rt.run().await.unwrap();
    assert_eq!(
        rt.context().get::<Out>("out:1").unwrap().unwrap().data.text,
        "true true"
    );
    let (head, log) = (rt.context().head(), format!("{:?}", rt.context().log().unwrap()));
    drop(rt);
    let ctx = Context::open_store(open_store(&url, &schema).await, "odd")
        .await
        .unwrap();
    assert_eq!(ctx.head(), head);
    ctx.verify().unwrap();
    let reopened = format!("{:?}", ctx.log().unwrap());
    assert_eq!(reopened, log);
    assert!(
        reopened.contains("Unrecordable") && reopened.contains("Abandoned"),
        "{reopened}"
    );
    ctx.replay(&[odd_calls()]).await.unwrap();
}
