use reactifact_core::{produce, Agent, Artifact, ProduceCall};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Order {
    total_cents: u64,
}

#[derive(Serialize, Deserialize, Artifact)]
struct Receipt {
    total_cents: u64,
}

#[produce(Receipt, also_creates = [Receipt])]
async fn process_order(call: ProduceCall<Order>) {
    let _ = call;
}

fn main() {
    let _ = Agent::new("billing").produce(process_order);
}
