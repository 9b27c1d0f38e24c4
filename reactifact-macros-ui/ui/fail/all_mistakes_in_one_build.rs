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

// The exception to one mistake per file: every mistake of one produce is reported together.
#[produce(Receipt, Order, colour = "blue", name = "a", name = "b", uses = [Receipt, Receipt])]
fn process_order(call: ProduceCall<Order>, extra: u8) -> u64 {
    let _ = (call, extra);
    0
}

fn main() {
    let _ = Agent::new("billing").produce(process_order);
}
