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

#[derive(Serialize, Deserialize, Artifact)]
#[artifact(knd = "invoice")]
struct Invoice {
    total_cents: u64,
}

fn main() {
    let _ = Invoice::KIND;
}
