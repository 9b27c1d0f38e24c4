use reactifact_core::{produce, Agent, Artifact, ProduceCall};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Order {
    total_cents: u64,
}

struct ModelConfig;

#[produce(uses = [ModelConfig, "prompt"])]
async fn summarise(call: ProduceCall<Order>) {
    let _ = call.resource::<ModelConfig>();
}

fn main() {
    let _ = Agent::new("writer").produce(summarise);
}
