//! Shared pieces of the reactifact example programs and benchmarks.

pub mod order_flow {
    //! The order flow of the outbox workload (the same as the Python reference's): an
    //! `Order` triggers `process_order`, which upserts a `Receipt` and records a `notify`
    //! intent keyed by the order id.

    use reactifact_core::{produce, Artifact, PendingAction, ProduceCall};
    use serde::{Deserialize, Serialize};

    /// The trigger of the workload.
    #[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
    #[artifact(kind = "order")]
    pub struct Order {
        /// Who ordered.
        pub customer: String,
        /// The total.
        pub total_cents: u64,
    }

    /// What `process_order` writes for each order.
    #[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
    #[artifact(kind = "receipt")]
    pub struct Receipt {
        /// The order's id.
        pub order: String,
        /// The total.
        pub total_cents: u64,
    }

    /// The payload of the `notify` intent.
    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct Notify {
        /// Whom to notify.
        pub customer: String,
        /// The order's id.
        pub order: String,
    }

    /// A receipt per order and a `notify` intent keyed by the order id.
    #[produce(Receipt, also_creates = [PendingAction])]
    pub async fn process_order(call: ProduceCall<Order>) {
        let id = call.trigger.id.to_string();
        call.effects.upsert(
            format!("receipt:{id}"),
            Receipt {
                order: id.clone(),
                total_cents: call.trigger.data.total_cents,
            },
        );
        call.effects.act(
            "notify",
            format!("notify:{id}"),
            &Notify {
                customer: call.trigger.data.customer.clone(),
                order: id,
            },
        );
    }
}

pub mod logs;
pub mod prometheus;
pub mod shop;
pub mod support;
pub mod walkthrough;
