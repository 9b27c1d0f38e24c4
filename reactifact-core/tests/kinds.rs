//! A runtime refuses ambiguous registrations when it is built: two Rust types with one kind,
//! two agents with one name, two produces with one name in an agent.

use reactifact_core::error::BuildError;
use reactifact_core::{Agent, Artifact, Context, PendingAction, Produce, ProduceCall, Runtime};
use serde::{Deserialize, Serialize};

mod billing {
    use super::*;

    #[derive(Serialize, Deserialize)]
    pub struct Invoice {
        pub cents: u64,
    }

    impl Artifact for Invoice {
        const KIND: &'static str = "invoice";
    }
}

mod tax {
    use super::*;

    #[derive(Serialize, Deserialize)]
    pub struct Invoice {
        pub rate: u32,
    }

    impl Artifact for Invoice {
        const KIND: &'static str = "invoice";
    }
}

#[derive(Serialize, Deserialize)]
struct Order {
    total: u64,
}

impl Artifact for Order {
    const KIND: &'static str = "order";
}

/// A type of the user's that claims the kind of the runtime's own intents.
#[derive(Serialize, Deserialize)]
struct MyAction {
    what: String,
}

impl Artifact for MyAction {
    const KIND: &'static str = "pending_action";
}

fn on<T: Artifact>(name: &str) -> Produce {
    Produce::new(name, |_call: ProduceCall<T>| async {})
}

fn build(agents: Vec<Agent>) -> Result<Runtime, BuildError> {
    agents
        .into_iter()
        .fold(Runtime::builder(Context::new("t")), |b, a| b.agent(a))
        .build()
}

fn assert_names_both_and_the_fix(error: &BuildError, first: &str, second: &str) {
    let message = error.to_string();
    assert!(message.contains(first), "{message}");
    assert!(message.contains(second), "{message}");
    assert!(message.contains("#[artifact(kind = \"...\")]"), "{message}");
}

#[test]
fn two_trigger_types_with_one_kind_are_refused() {
    let error = build(vec![
        Agent::new("billing").produce(on::<billing::Invoice>("bill")),
        Agent::new("tax").produce(on::<tax::Invoice>("tax")),
    ])
    .unwrap_err();
    let BuildError::KindCollision { kind, first, second } = &error else {
        panic!("not a kind collision: {error}");
    };
    assert_eq!(kind.as_str(), "invoice");
    assert_eq!(*first, std::any::type_name::<billing::Invoice>());
    assert_eq!(*second, std::any::type_name::<tax::Invoice>());
    assert_names_both_and_the_fix(&error, "kinds::billing::Invoice", "kinds::tax::Invoice");
}

#[test]
fn a_declared_output_colliding_with_another_produces_trigger_is_refused() {
    let writes_billing = on::<Order>("invoice_order").creates::<billing::Invoice>();
    let error = build(vec![
        Agent::new("billing").produce(writes_billing),
        Agent::new("tax").produce(on::<tax::Invoice>("tax")),
    ])
    .unwrap_err();
    assert!(matches!(error, BuildError::KindCollision { .. }), "{error}");
    assert_names_both_and_the_fix(&error, "kinds::billing::Invoice", "kinds::tax::Invoice");
}

#[test]
fn two_outputs_of_one_produce_with_one_kind_are_refused() {
    let both = on::<Order>("invoice_order")
        .creates::<billing::Invoice>()
        .creates::<tax::Invoice>();
    let error = build(vec![Agent::new("billing").produce(both)]).unwrap_err();
    assert_names_both_and_the_fix(&error, "kinds::billing::Invoice", "kinds::tax::Invoice");
}

#[test]
fn a_type_claiming_the_pending_action_kind_is_refused() {
    let error = build(vec![Agent::new("a").produce(on::<MyAction>("mine"))]).unwrap_err();
    assert_names_both_and_the_fix(&error, std::any::type_name::<PendingAction>(), "kinds::MyAction");
}

/// A type of the user's that claims the kind of the runtime's questions.
#[derive(Serialize, Deserialize)]
struct MyQuestion {
    text: String,
}

impl Artifact for MyQuestion {
    const KIND: &'static str = "question";
}

#[test]
fn a_type_claiming_the_question_kind_is_refused() {
    let error = build(vec![Agent::new("a").produce(on::<MyQuestion>("mine"))]).unwrap_err();
    assert_names_both_and_the_fix(
        &error,
        std::any::type_name::<reactifact_core::runtime::Question>(),
        "kinds::MyQuestion",
    );
}

#[test]
fn one_type_shared_by_many_produces_is_not_a_collision() {
    let rt = build(vec![
        Agent::new("billing")
            .produce(on::<Order>("first").creates::<billing::Invoice>())
            .produce(on::<billing::Invoice>("second").creates::<PendingAction>()),
        Agent::new("audit").produce(on::<Order>("first")),
    ]);
    assert!(rt.is_ok(), "{:?}", rt.err());
}

#[test]
fn two_agents_with_one_name_are_refused() {
    let error = build(vec![
        Agent::new("billing").produce(on::<Order>("a")),
        Agent::new("billing").produce(on::<Order>("b")),
    ])
    .unwrap_err();
    let BuildError::DuplicateAgent { agent } = &error else {
        panic!("not a duplicate agent: {error}");
    };
    assert_eq!(agent, "billing");
    assert!(error.to_string().contains("`billing`"), "{error}");
}

#[test]
fn two_produces_with_one_name_in_an_agent_are_refused() {
    let error = build(vec![Agent::new("billing")
        .produce(on::<Order>("process"))
        .produce(on::<billing::Invoice>("process"))])
    .unwrap_err();
    let BuildError::DuplicateProduce { agent, produce } = &error else {
        panic!("not a duplicate produce: {error}");
    };
    assert_eq!((agent.as_str(), produce.as_str()), ("billing", "process"));
    let message = error.to_string();
    assert!(
        message.contains("`billing`") && message.contains("`process`"),
        "{message}"
    );
}

#[test]
fn one_produce_name_in_two_agents_is_fine() {
    let rt = build(vec![
        Agent::new("billing").produce(on::<Order>("process")),
        Agent::new("audit").produce(on::<Order>("process")),
    ]);
    assert!(rt.is_ok(), "{:?}", rt.err());
}
