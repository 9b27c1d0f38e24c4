use reactifact_core::{produce, Artifact, ProduceCall};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Order {
    total_cents: u64,
}

#[derive(Serialize, Deserialize, Artifact)]
struct Receipt {
    total_cents: u64,
}

#[produce(Receipt)]
async fn process_order<T>(call: ProduceCall<Order>) {
    let _ = call;
}

fn main() {}
