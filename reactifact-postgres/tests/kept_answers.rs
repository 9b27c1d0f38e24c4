//! The answers of recorded calls kept in PostgreSQL before the commit: a process that stops
//! before its generation commits, started again, gets them back without calling; they are
//! dropped once the run commits. Runs when `REACTIFACT_TEST_POSTGRES_URL` is set (see `common`).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use reactifact_core::store::LogStore;
use reactifact_core::{Agent, Context, Produce, ProduceCall, ProduceError, Runtime};

use common::flow::{open_store, order, Order, Receipt};
use common::Schemas;

/// A model call, then a failure while `fail` holds (the generation does not commit).
fn agent(asked: Arc<AtomicU64>, fail: bool) -> Agent {
    Agent::new("billing").produce(
        Produce::new("price", move |call: ProduceCall<Order>| {
            let asked = asked.clone();
            async move {
                let total: u64 = call
                    .record("price", call.trigger.id.to_string(), move |_: String| async move {
                        asked.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(4200u64)
                    })
                    .await?;
                if fail {
                    return Err(ProduceError::msg("the process is killed before the commit"));
                }
                call.effects.upsert(
                    format!("receipt:{}", call.trigger.id),
                    Receipt {
                        order: call.trigger.id.to_string(),
                        total_cents: total,
                    },
                );
                Ok(())
            }
        })
        .creates::<Receipt>(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_kept_in_postgres_survive_a_stop_before_the_commit() {
    let Some(url) = common::url("answers_kept_in_postgres_survive_a_stop_before_the_commit") else {
        return;
    };
    let schemas = Schemas::new(&url, "kept_answers");
    let schema = schemas.name();
    let store = open_store(&url, &schema).await;
    let asked = Arc::new(AtomicU64::new(0));
    let mut ctx = Context::open_store(store.clone(), "orders").await.unwrap();
    ctx.create("order:1", order(1)).unwrap();
    for (fail, committed) in [(true, false), (true, false), (false, true)] {
        let ctx = Context::open_store(store.clone(), "orders").await.unwrap();
        let mut rt = Runtime::builder(ctx).agent(agent(asked.clone(), fail)).build().unwrap();
        assert_eq!(rt.run().await.is_ok(), committed);
    }
    drop(ctx);
    assert_eq!(asked.load(Ordering::SeqCst), 1, "asked once, across three processes");
    let ctx = Context::open_store(store.clone(), "orders").await.unwrap();
    assert_eq!(
        ctx.get::<Receipt>("receipt:order:1").unwrap().unwrap().data.total_cents,
        4200
    );
    assert!(
        store.answers("orders").await.unwrap().is_empty(),
        "dropped after the commit"
    );
}
