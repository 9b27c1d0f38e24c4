use std::cell::Cell;

use reactifact_core::{produce, Agent, Artifact, ProduceCall};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Order {
    total_cents: u64,
}

/// Shared by every run at once, so a resource must be `Sync`: `Cell` is not.
struct Counter {
    seen: Cell<u64>,
}

#[produce(uses = [Counter])]
async fn count(call: ProduceCall<Order>) {
    let counter = call.resource::<Counter>();
    counter.seen.set(counter.seen.get() + 1);
}

fn main() {
    let _ = Agent::new("stats").produce(count);
}
