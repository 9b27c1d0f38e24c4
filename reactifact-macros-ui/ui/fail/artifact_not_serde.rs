use reactifact_core::Artifact;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Order {
    total_cents: u64,
}

#[derive(Serialize, Deserialize, Artifact)]
struct Receipt {
    total_cents: u64,
}

#[derive(Artifact)]
struct Invoice {
    total_cents: u64,
}

fn main() {}
