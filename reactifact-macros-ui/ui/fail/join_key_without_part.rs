use reactifact_core::{produce, Agent, Artifact, ProduceCall};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Order {
    id: u64,
}

#[derive(Serialize, Deserialize, Artifact)]
struct Payment {
    order_id: u64,
}

#[derive(Serialize, Deserialize, Artifact)]
struct Shipment {
    order_id: u64,
}

#[produce(Shipment, key = |o| o.data.id)]
async fn ship(call: ProduceCall<Order>) {
    let _ = call;
}

fn main() {
    let _ = Agent::new("shipping").produce(ship);
}
