//! Every option of `#[produce]` and `#[derive(Artifact)]`.
#![deny(warnings)]

use reactifact_core::{
    produce, Agent, Artifact, EventKind, IntoProduce, Kind, PendingAction, ProduceCall, ProduceError,
};
use serde::{Deserialize, Serialize};

/// A crate that re-exports reactifact, the way a framework would.
mod framework {
    pub use ::reactifact_core as reactifact;
}

#[derive(Serialize, Deserialize, Artifact)]
#[artifact(crate = crate::framework::reactifact)]
struct Order {
    total_cents: u64,
}

#[derive(Serialize, Deserialize, Artifact)]
#[artifact(kind = "billing.receipt", crate = crate::framework::reactifact)]
enum Receipt {
    Paid { cents: u64 },
    Free,
}

#[produce(
    Receipt,
    also_creates = [PendingAction,],
    name = "billing.process_order",
    when = |_snapshot, order| order.data.total_cents > 0,
    crate = crate::framework::reactifact,
)]
async fn process_order(call: ProduceCall<Order>) -> Result<(), ProduceError> {
    let cents = call.trigger.data.total_cents;
    call.effects.create_once(
        "receipt:1",
        if cents > 0 {
            Receipt::Paid { cents }
        } else {
            Receipt::Free
        },
    );
    call.effects.act("email_receipt", "email:1", &cents);
    Ok(())
}

/// A raw identifier is a valid produce name.
#[produce(Receipt)]
async fn r#match(call: ProduceCall<Order>) -> std::io::Result<()> {
    call.effects.upsert("receipt:2", Receipt::Free);
    Ok(())
}

/// Event kinds and the `debounce` flag, through a re-exporting crate.
#[produce(Receipt, on = [created, deleted,], debounce, crate = crate::framework::reactifact)]
async fn on_kinds(call: ProduceCall<Order>) {
    let _ = call.event;
}

/// A flag may come first among the options.
#[produce(Receipt, debounce, on = [r#updated], stale)]
async fn debounced_updates(call: ProduceCall<Order>) {
    let _ = call.event;
}

mod nested {
    use super::*;

    /// Visible outside its module, like the function would be.
    #[produce(Receipt)]
    pub(crate) async fn refund(call: ProduceCall<Order>) -> () {
        let _ = call.generation;
    }
}

#[cfg(any())]
#[produce(Receipt)]
async fn configured_out(call: ProduceCall<DoesNotExist>) {}

fn main() {
    assert_eq!(Order::KIND, "order");
    assert_eq!(Receipt::KIND, "billing.receipt");
    let produce = process_order.into_produce();
    assert_eq!(produce.name(), "billing.process_order");
    assert_eq!(produce.outputs(), [Kind::of::<Receipt>(), Kind::of::<PendingAction>()]);
    assert_eq!(r#match.into_produce().name(), "match");
    let kinds = on_kinds.into_produce();
    assert!(kinds.events().eq([EventKind::Created, EventKind::Deleted]));
    assert!(kinds.is_debounced() && !process_order.into_produce().is_debounced());
    let updates = debounced_updates.into_produce();
    assert!(updates.events().eq([EventKind::Updated, EventKind::Stale]) && updates.is_debounced());
    assert!(!kinds.reacts_to(EventKind::Stale));
    let _ = Agent::new("billing")
        .produce(process_order)
        .produce(r#match)
        .produce(nested::refund)
        .produce(on_kinds)
        .produce(debounced_updates);
}
