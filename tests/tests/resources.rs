//! Resources end to end: a produce declares what it reads (`uses = [..]` or `Produce::uses`),
//! the runtime's builder refuses it without them, and a run reads the registered value.

use reactifact_core::error::BuildError;
use reactifact_core::runtime::{Resources, RuntimeBuilder, TurnOutcome};
use reactifact_core::{produce, Agent, Artifact, Context, Produce, ProduceCall, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
struct Order {
    customer: String,
}

#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
struct Greeting {
    text: String,
}

/// A resource: any `Send + Sync + 'static` value, neither an artifact nor serde.
struct Config {
    greeting: String,
}

/// A second resource, registered in none of the tests that expect it missing.
struct Signature(&'static str);

/// Writes what it read from its resource.
#[produce(Greeting, uses = [Config])]
async fn greet(call: ProduceCall<Order>) {
    let config = call.resource::<Config>();
    call.effects.create(
        format!("greeting:{}", call.trigger.id),
        Greeting {
            text: format!("{}, {}", config.greeting, call.trigger.data.customer),
        },
    );
}

/// Uses two resources; the one it names second is the one the tests leave out.
#[produce(Greeting, uses = [Config, Signature])]
async fn greet_signed(call: ProduceCall<Order>) {
    let text = format!(
        "{} -- {}",
        call.resource::<Config>().greeting,
        call.resource::<Signature>().0
    );
    call.effects
        .create(format!("signed:{}", call.trigger.id), Greeting { text });
}

fn seeded() -> Context {
    let mut ctx = Context::new("resources");
    let mut tx = ctx.transaction();
    tx.create("order:1", Order { customer: "ada".into() });
    tx.commit().unwrap();
    ctx
}

/// The builder's refusal, which must be `MissingResource`.
fn missing_resource(builder: RuntimeBuilder) -> (String, String, &'static str, String) {
    match builder.build() {
        Ok(_) => panic!("the runtime was built without a resource a produce uses"),
        Err(error) => {
            let message = error.to_string();
            match error {
                BuildError::MissingResource {
                    agent,
                    produce,
                    resource,
                } => (agent, produce, resource, message),
                other => panic!("expected MissingResource, got {other}"),
            }
        }
    }
}

#[test]
fn a_macro_built_produce_without_its_resource_is_refused_naming_produce_and_type() {
    let (agent, produce, resource, message) =
        missing_resource(Runtime::builder(seeded()).agent(Agent::new("mail").produce(greet)));
    assert_eq!(agent, "mail");
    assert_eq!(produce, "greet");
    assert_eq!(resource, std::any::type_name::<Config>());
    assert!(
        message.contains("`greet`") && message.contains(std::any::type_name::<Config>()),
        "{message}"
    );
}

#[test]
fn the_missing_resource_is_the_one_named_even_when_another_is_registered() {
    // A value of another type is no substitute: resources are found by type.
    let (_, produce, resource, _) = missing_resource(
        Runtime::builder(seeded())
            .resource(Config {
                greeting: "hello".into(),
            })
            .resource(String::from("not a signature"))
            .agent(Agent::new("mail").produce(greet_signed)),
    );
    assert_eq!(produce, "greet_signed");
    assert_eq!(resource, std::any::type_name::<Signature>());
}

#[tokio::test]
async fn with_its_resource_the_turn_writes_what_the_produce_read() {
    let mut rt = Runtime::builder(seeded())
        .resource(Config {
            greeting: "hello".into(),
        })
        .agent(Agent::new("mail").produce(greet))
        .build()
        .unwrap();
    let report = rt.run().await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed);
    let greeting = rt.context().get::<Greeting>("greeting:order:1").unwrap().unwrap();
    assert_eq!(greeting.data.text, "hello, ada");
}

#[tokio::test]
async fn resources_given_as_a_set_satisfy_the_declarations_too() {
    let resources = Resources::new()
        .with(Config { greeting: "hi".into() })
        .with(Signature("the shop"));
    let mut rt = Runtime::builder(seeded())
        .resources(&resources)
        .agent(Agent::new("mail").produce(greet_signed))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let greeting = rt.context().get::<Greeting>("signed:order:1").unwrap().unwrap();
    assert_eq!(greeting.data.text, "hi -- the shop");
}

/// The hand-built equivalent of `greet`.
fn greet_by_hand() -> Produce {
    Produce::new("greet_by_hand", |call: ProduceCall<Order>| async move {
        let greeting = call.resource::<Config>().greeting.clone();
        call.effects
            .create(format!("by_hand:{}", call.trigger.id), Greeting { text: greeting });
    })
    .creates::<Greeting>()
    .uses::<Config>()
}

#[tokio::test]
async fn a_hand_built_produce_that_declares_a_resource_is_checked_the_same_way() {
    let (agent, produce, resource, _) =
        missing_resource(Runtime::builder(seeded()).agent(Agent::new("mail").produce(greet_by_hand())));
    assert_eq!(agent, "mail");
    assert_eq!(produce, "greet_by_hand");
    assert_eq!(resource, std::any::type_name::<Config>());

    let mut rt = Runtime::builder(seeded())
        .resource(Config {
            greeting: "hello".into(),
        })
        .agent(Agent::new("mail").produce(greet_by_hand()))
        .build()
        .unwrap();
    rt.run().await.unwrap();
    let greeting = rt.context().get::<Greeting>("by_hand:order:1").unwrap().unwrap();
    assert_eq!(greeting.data.text, "hello");
}
