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

#[derive(Serialize, Deserialize, Artifact)]
struct Invoice {
    total_cents: u64,
}

#[produce(Receipt, also_creates = [reactifact_core::PendingAction])]
async fn process_order(call: ProduceCall<Order>) {
    let total_cents = call.trigger.data.total_cents;
    call.effects.create_once("invoice:1", Invoice { total_cents });
}

fn main() {
    let _ = Agent::new("billing").produce(process_order);
}
