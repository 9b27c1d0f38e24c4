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

#[produce(Shipment, on = [created, deleted], key = |o| o.data.id, join(Payment, key = |p| p.data.order_id))]
async fn ship(call: ProduceCall<Order>) {
    let _ = call;
}

fn main() {
    let _ = Agent::new("shipping").produce(ship);
}
