//! Generated code names nothing relatively: shadowing the prelude changes nothing, and the
//! strictest documentation and qualification lints stay quiet.
#![deny(missing_docs, unused_qualifications, warnings)]

use reactifact_core::{produce, Agent, Artifact, IntoProduce, Kind, PendingAction, Produce, ProduceCall, ProduceError};
use serde::{Deserialize, Serialize};

/// Shadows `Result`.
pub type Result<T> = ::core::result::Result<T, ProduceError>;
/// Shadows `Option`, `Box` and `Vec`.
pub struct Option;
/// Shadows `Box`.
pub struct Box;
/// Shadows `Vec`.
pub struct Vec;
/// Shadows `Ok` and `Err`.
#[allow(non_snake_case)]
pub fn Ok() {}
/// Shadows `Some`.
#[allow(non_snake_case)]
pub fn Some() {}
/// Shadows `Future`.
pub trait Future {}
/// Shadows `Send` and `Sync`.
pub trait Send {}

/// An order.
#[derive(Serialize, Deserialize, Artifact)]
pub struct Order {
    /// Its total.
    pub total_cents: u64,
}

/// A receipt.
#[derive(Serialize, Deserialize, Artifact)]
#[artifact(kind = "receipt")]
pub struct Receipt {
    /// Its total.
    pub total_cents: u64,
}

/// Writes a receipt and records an intent.
#[produce(Receipt, also_creates = [PendingAction])]
pub async fn process_order(call: ProduceCall<Order>) -> Result<()> {
    let total_cents = call.trigger.data.total_cents;
    call.effects.upsert("receipt:1", Receipt { total_cents });
    call.effects.act("email_receipt", "email:1", &total_cents);
    ::core::result::Result::Ok(())
}

/// A produce without docs of its own and without outputs still passes `missing_docs`.
#[produce]
pub async fn touch(call: ProduceCall<Receipt>) {
    call.effects.update(call.trigger.id.clone(), call.trigger.data);
}

mod no_prelude {
    #![no_implicit_prelude]

    use ::reactifact_core::{produce, Artifact, ProduceCall};
    use ::serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, Artifact)]
    pub struct Refund {
        pub total_cents: u64,
    }

    #[produce(Refund, name = "refund")]
    pub async fn refund(call: ProduceCall<super::Order>) {
        let total_cents = call.trigger.data.total_cents;
        call.effects.create("refund:1", Refund { total_cents });
    }
}

fn main() {
    let _ = (Option, Box, Vec, Ok(), Some());
    let produce: Produce = process_order.into_produce();
    ::std::assert_eq!(produce.outputs(), [Kind::of::<Receipt>(), Kind::of::<PendingAction>()]);
    let _ = Agent::new("billing")
        .produce(process_order)
        .produce(touch)
        .produce(no_prelude::refund);
}
