use reactifact_core::{produce, Artifact};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Order {
    total_cents: u64,
}

#[derive(Serialize, Deserialize, Artifact)]
struct Receipt {
    total_cents: u64,
}

#[produce(Receipt)]
struct ProcessOrder;

fn main() {}
