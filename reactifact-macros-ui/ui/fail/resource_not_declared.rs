use reactifact_core::{produce, Agent, Artifact, ProduceCall};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Order {
    total_cents: u64,
}

#[derive(Serialize, Deserialize, Artifact)]
struct Summary {
    text: String,
}

struct ModelConfig {
    name: &'static str,
}

struct Prompt {
    text: &'static str,
}

#[produce(Summary, uses = [ModelConfig])]
async fn summarise(call: ProduceCall<Order>) {
    let model = call.resource::<ModelConfig>().name;
    let prompt = call.resource::<Prompt>().text;
    call.effects.create(
        "summary:1",
        Summary {
            text: format!("{model}: {prompt}"),
        },
    );
}

fn main() {
    let _ = Agent::new("writer").produce(summarise);
}
