use reactifact_core::{produce, Agent, Artifact, ProduceCall, Record};
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
struct Refund {
    order_id: u64,
}

#[derive(Serialize, Deserialize, Artifact)]
struct Shipment {
    order_id: u64,
}

fn refund_order(refund: &Record<Refund>) -> u64 {
    refund.data.order_id
}

/// Ships an order once it is paid, unless it was refunded.
#[produce(
    Shipment,
    when = |_, o| o.data.id > 0,
    key = |o| o.data.id,
    join(Payment, key = |p| p.data.order_id),
    absent(Refund, key = refund_order),
    debounce
)]
async fn ship(call: ProduceCall<Order>) {
    let payment = call.joined::<Payment>().unwrap().unwrap();
    call.effects.upsert(
        format!("shipment:{}", payment.data.order_id),
        Shipment {
            order_id: payment.data.order_id,
        },
    );
}

fn main() {
    let produce = reactifact_core::IntoProduce::into_produce(ship);
    assert!(produce.is_join());
    let _ = Agent::new("shipping").produce(ship);
}
