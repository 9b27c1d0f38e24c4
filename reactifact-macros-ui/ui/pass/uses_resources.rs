//! `uses = [..]`: a produce reads the resources it declares, and a runtime with them builds.
#![deny(warnings)]

use reactifact_core::{produce, Agent, Artifact, BuildError, Context, IntoProduce, ProduceCall, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Order {
    total_cents: u64,
}

#[derive(Serialize, Deserialize, Artifact)]
struct Summary {
    text: String,
}

/// What the produce reads; no `Artifact`, no serde: a resource is any `Send + Sync + 'static`.
struct ModelConfig {
    name: &'static str,
}

mod prompts {
    /// A resource named by its path.
    pub struct Prompt {
        pub text: &'static str,
    }
}

/// Reads its resources (one of them a foreign type), with a trailing comma in the list.
#[produce(Summary, uses = [ModelConfig, prompts::Prompt, std::time::Duration,])]
async fn summarise(call: ProduceCall<Order>) {
    let model = call.resource::<ModelConfig>().name;
    let _timeout: &std::time::Duration = call.resource();
    let prompt = call.try_resource::<prompts::Prompt>().map_or("", |p| p.text);
    call.effects.create(
        format!("summary:{}", call.trigger.id),
        Summary {
            text: format!("{model}: {prompt} {}", call.trigger.data.total_cents),
        },
    );
}

/// `uses = []` declares no resource.
#[produce(uses = [])]
async fn touch(call: ProduceCall<Order>) {
    let _ = call;
}

#[cfg(any())]
#[produce(uses = [DoesNotExist])]
async fn configured_out(call: ProduceCall<Order>) {}

fn main() {
    let declared = summarise.into_produce();
    assert_eq!(
        declared.resources().collect::<Vec<_>>(),
        [
            std::any::type_name::<ModelConfig>(),
            std::any::type_name::<prompts::Prompt>(),
            std::any::type_name::<std::time::Duration>(),
        ]
    );
    assert_eq!(touch.into_produce().resources().count(), 0);

    let built = Runtime::builder(Context::new("uses"))
        .resource(ModelConfig { name: "small" })
        .resource(prompts::Prompt { text: "summarise" })
        .resource(std::time::Duration::from_secs(30))
        .agent(Agent::new("writer").produce(summarise).produce(touch))
        .build();
    assert!(built.is_ok());

    let missing = Runtime::builder(Context::new("uses"))
        .resource(ModelConfig { name: "small" })
        .agent(Agent::new("writer").produce(summarise))
        .build();
    assert!(matches!(missing, Err(BuildError::MissingResource { .. })));
}
