//! The order flow the log-store tests share: an order, its receipt, and `process_order`,
//! which writes the receipt and acts a `notify` intent keyed by the order id.

use std::collections::HashSet;
use std::sync::Arc;

use reactifact_core::error::{StoreError, WriteError};
use reactifact_core::{Artifact, Context, PendingAction, Produce, ProduceCall, ProduceError};
use reactifact_postgres::{PostgresOptions, PostgresStore};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Order {
    pub customer: String,
    pub total_cents: u64,
}

impl Artifact for Order {
    const KIND: &'static str = "order";
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Receipt {
    pub order: String,
    pub total_cents: u64,
}

impl Artifact for Receipt {
    const KIND: &'static str = "receipt";
}

/// A receipt per order and a `notify` intent keyed by the order id.
pub fn process_order() -> Produce {
    Produce::new("process_order", |call: ProduceCall<Order>| async move {
        let id = call.trigger.id.to_string();
        call.effects.upsert(
            format!("receipt:{id}"),
            Receipt {
                order: id.clone(),
                total_cents: call.trigger.data.total_cents,
            },
        );
        call.effects.act("notify", format!("notify:{id}"), &id);
        Ok::<(), ProduceError>(())
    })
    .creates::<Receipt>()
    .creates::<PendingAction>()
}

pub fn order(i: u64) -> Order {
    Order {
        customer: format!("customer-{i}"),
        total_cents: 100 + i,
    }
}

pub async fn open_store(url: &str, schema: &str) -> Arc<PostgresStore> {
    PostgresStore::open(PostgresOptions::new(url).schema(schema).pool_size(4))
        .await
        .unwrap_or_else(|e| panic!("the test store opens: {e}"))
}

/// Creates `value` at `id`, catching up and writing again while another writer of the session
/// commits first; returns how many times the write was refused.
pub async fn create_retrying(ctx: &mut Context, id: &str, value: Order) -> u64 {
    let mut refused = 0;
    loop {
        match ctx.create(id, value.clone()) {
            Ok(()) => return refused,
            Err(WriteError::Store(StoreError::Conflict { .. })) => {
                refused += 1;
                ctx.catch_up().await.unwrap();
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// The orders `process_order` ran on in the committed log, each asserted to be there once.
pub fn processed_once(ctx: &Context) -> HashSet<String> {
    let mut processed = HashSet::new();
    for commit in ctx.log().unwrap() {
        for run in &commit.runs {
            if run.produce.as_deref() == Some("process_order") {
                let trigger = run.trigger.as_ref().unwrap().id.to_string();
                assert!(processed.insert(trigger.clone()), "{trigger} was processed twice");
            }
        }
    }
    processed
}
