use reactifact_core::{produce, Agent, Artifact};
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
async fn process_order() {}

fn main() {
    let _ = Agent::new("billing").produce(process_order);
}
