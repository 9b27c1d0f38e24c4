//! Tools a model calls, declared with `#[produce(.., tools = [..])]`: an acting tool becomes an
//! intent keyed by the trigger and the call's canonical arguments — never by the model's
//! tool-call id — and a reading tool runs as a recorded call.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use reactifact_core::ledger::DeliveryStatus;
use reactifact_core::tools::{tool_key, Acts, ActsWithApproval, Reads, Tool, ToolError};
use reactifact_core::{
    produce, Agent, Artifact, ArtifactId, Context, DispatchError, Intent, PendingAction, ProduceCall, ProduceError,
    Runtime,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
#[artifact(kind = "ticket")]
struct Ticket {
    text: String,
}

#[derive(Serialize, Deserialize, Artifact, Debug, Clone, PartialEq)]
#[artifact(kind = "answer")]
struct Answer {
    text: String,
}

/// Refunds an order: a tool that acts.
struct IssueRefund;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Refund {
    order: String,
    cents: u64,
}

impl Tool for IssueRefund {
    const NAME: &'static str = "issue_refund";
    const DESCRIPTION: &'static str = "Refund an order, in cents.";
    type Args = Refund;
    type Effect = Acts;
    fn parameters() -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {"order": {"type": "string"}, "cents": {"type": "integer"}}})
    }
}

/// Closes an account: a tool that acts once an operator approves.
struct CloseAccount;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Account {
    customer: String,
}

impl Tool for CloseAccount {
    const NAME: &'static str = "close_account";
    const DESCRIPTION: &'static str = "Close a customer's account.";
    type Args = Account;
    type Effect = ActsWithApproval;
    fn parameters() -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {"customer": {"type": "string"}}})
    }
}

/// Looks an order up: a tool that reads.
struct LookupOrder;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Lookup {
    order: String,
}

impl Tool for LookupOrder {
    const NAME: &'static str = "lookup_order";
    const DESCRIPTION: &'static str = "Look an order up.";
    type Args = Lookup;
    type Effect = Reads;
    fn parameters() -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {"order": {"type": "string"}}})
    }
}

/// A stand-in for a model: every time it is asked, it answers the same tool calls with a new
/// tool-call id and the arguments' JSON spelled another way, as models do on a retry.
#[derive(Default)]
struct Model {
    asked: AtomicU64,
}

/// A tool call as a model answers it.
struct ModelToolCall {
    #[allow(dead_code)]
    id: String,
    name: &'static str,
    arguments: String,
}

impl Model {
    fn ask(&self) -> Vec<ModelToolCall> {
        let n = self.asked.fetch_add(1, Ordering::SeqCst);
        let arguments = match n % 3 {
            0 => r#"{"order": "order:7", "cents": 1200}"#.to_owned(),
            1 => r#"{"cents":1200,"order":"order:7"}"#.to_owned(),
            _ => "{\n  \"cents\": 1200.0e0,\n  \"order\": \"order:7\"\n}".replace("1200.0e0", "1200"),
        };
        vec![
            ModelToolCall {
                id: format!("call_{n}_a"),
                name: IssueRefund::NAME,
                arguments,
            },
            ModelToolCall {
                id: format!("call_{n}_b"),
                name: CloseAccount::NAME,
                arguments: format!(r#"{{"customer": "ada", "reason_{n}": null}}"#),
            },
        ]
    }
}

/// The agent's produce: it asks the model (not recorded, so that every run asks again, as
/// after a crash before the commit) and hands each tool call to its effects.
#[produce(Answer, also_creates = [PendingAction], uses = [Arc<Model>], tools = [IssueRefund, CloseAccount])]
async fn agent(call: ProduceCall<Ticket>) -> Result<(), ProduceError> {
    for tool_call in call.resource::<Arc<Model>>().ask() {
        match tool_call.name {
            IssueRefund::NAME => {
                call.act_tool::<IssueRefund>(&tool_call.arguments)?;
            }
            CloseAccount::NAME => {
                call.act_tool::<CloseAccount>(&tool_call.arguments)?;
            }
            other => return Err(ProduceError::msg(format!("unknown tool {other}"))),
        }
    }
    call.effects.upsert(
        format!("answer:{}", call.trigger.id),
        Answer {
            text: call.trigger.data.text.clone(),
        },
    );
    Ok(())
}

/// The keys a dispatcher was handed, in order.
type Sent = Arc<Mutex<Vec<String>>>;

/// A dispatcher that delivers every intent, and the keys it was handed.
fn sent() -> (Sent, impl Fn(Intent) -> std::future::Ready<Result<(), DispatchError>>) {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let log = sent.clone();
    let dispatcher = move |intent: Intent| {
        log.lock().unwrap().push(intent.key().to_string());
        std::future::ready(Ok(()))
    };
    (sent, dispatcher)
}

#[tokio::test]
async fn a_model_that_re_mints_its_tool_call_ids_on_every_retry_makes_one_intent_and_one_send() {
    let model = Arc::new(Model::default());
    let (sent, dispatcher) = sent();
    let mut ctx = Context::new("support");
    ctx.create(
        "ticket:1",
        Ticket {
            text: "refund me".into(),
        },
    )
    .unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("support").produce(agent))
        .resource(model.clone())
        .dispatcher(dispatcher)
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    // Asked again five times (a new version of the ticket each time, so the produce runs
    // again and the model answers again, with new ids and other JSON).
    for attempt in 0..5 {
        rt.context_mut()
            .update(
                "ticket:1",
                Ticket {
                    text: format!("refund me, attempt {attempt}"),
                },
            )
            .unwrap();
        rt.run().await.unwrap();
        rt.settle().await.unwrap();
    }
    assert_eq!(model.asked.load(Ordering::SeqCst), 6, "the model was asked every time");
    let refund = tool_key::<IssueRefund>(
        &ArtifactId::from("ticket:1"),
        &Refund {
            order: "order:7".into(),
            cents: 1200,
        },
    )
    .unwrap();
    assert_eq!(*sent.lock().unwrap(), [refund.to_string()], "one refund, sent once");
    assert!(refund.as_str().starts_with("issue_refund:ticket:1:"), "{refund}");

    let ledger = rt.context().ledger();
    let intents = ledger.entries().await.unwrap();
    assert_eq!(intents.len(), 2, "one intent per tool call: {intents:?}");
    let close = tool_key::<CloseAccount>(&ArtifactId::from("ticket:1"), &Account { customer: "ada".into() }).unwrap();
    let closing = ledger.get(close.as_str()).await.unwrap().expect("the approval intent");
    assert_eq!(
        closing.status(),
        DeliveryStatus::AwaitingApproval,
        "a tool with approval waits"
    );
}

#[test]
fn the_key_depends_on_the_trigger_and_the_arguments_only() {
    let ticket = ArtifactId::from("ticket:1");
    let args = |cents| Refund {
        order: "order:7".into(),
        cents,
    };
    let key = tool_key::<IssueRefund>(&ticket, &args(1200)).unwrap();
    assert_eq!(key, tool_key::<IssueRefund>(&ticket, &args(1200)).unwrap());
    assert_ne!(key, tool_key::<IssueRefund>(&ticket, &args(1201)).unwrap());
    assert_ne!(
        key,
        tool_key::<IssueRefund>(&ArtifactId::from("ticket:2"), &args(1200)).unwrap()
    );
}

/// A produce whose model answers arguments of the wrong shape: it gets the error back, names
/// the tool, and records nothing.
#[produce(Answer, also_creates = [PendingAction], tools = [IssueRefund])]
async fn confused(call: ProduceCall<Ticket>) -> Result<(), ProduceError> {
    for arguments in [r#"{"order": 7}"#, "not json", r#"{"order": "order:7"}"#] {
        match call.act_tool::<IssueRefund>(arguments) {
            Err(ToolError::Arguments { tool, reason }) => {
                assert_eq!(tool, "issue_refund");
                assert!(!reason.is_empty());
            }
            other => panic!("{arguments}: {other:?}"),
        }
    }
    call.effects.upsert(
        format!("answer:{}", call.trigger.id),
        Answer {
            text: "please say again".into(),
        },
    );
    Ok(())
}

#[tokio::test]
async fn arguments_of_the_wrong_shape_are_an_error_that_records_nothing() {
    let (sent, dispatcher) = sent();
    let mut ctx = Context::new("support");
    ctx.create("ticket:1", Ticket { text: "?".into() }).unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("support").produce(confused))
        .dispatcher(dispatcher)
        .build()
        .unwrap();
    rt.run().await.unwrap();
    rt.settle().await.unwrap();
    assert!(sent.lock().unwrap().is_empty());
    assert!(rt.context().ledger().entries().await.unwrap().is_empty());
    assert!(rt.context().get::<Answer>("answer:ticket:1").unwrap().is_some());
}

/// Whether [`looks_up`] failed its first run already.
static FAILED_ONCE: AtomicBool = AtomicBool::new(false);

/// Looks the order up through the reading tool, then fails its first run: the retry gets the
/// lookup's answer back without calling again.
#[produce(Answer, uses = [Arc<AtomicU64>], tools = [LookupOrder])]
async fn looks_up(call: ProduceCall<Ticket>) -> Result<(), ProduceError> {
    let calls = call.resource::<Arc<AtomicU64>>().clone();
    let found: String = call
        .read_tool::<LookupOrder, _, _, _, _>(r#"{"order": "order:7"}"#, move |args: Lookup| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(format!("{} shipped", args.order))
        })
        .await?;
    if !FAILED_ONCE.swap(true, Ordering::SeqCst) {
        return Err(ProduceError::msg("a transient failure after the lookup"));
    }
    call.effects
        .upsert(format!("answer:{}", call.trigger.id), Answer { text: found });
    Ok(())
}

#[tokio::test]
async fn a_reading_tool_is_a_recorded_call_a_retry_does_not_repeat() {
    let calls = Arc::new(AtomicU64::new(0));
    let mut ctx = Context::new("support");
    ctx.create(
        "ticket:1",
        Ticket {
            text: "where is it".into(),
        },
    )
    .unwrap();
    let mut rt = Runtime::builder(ctx)
        .agent(Agent::new("support").produce(looks_up))
        .resource(calls.clone())
        .build()
        .unwrap();
    rt.run().await.unwrap_err();
    rt.run().await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the retry reused the recorded answer");
    let answer = rt.context().get::<Answer>("answer:ticket:1").unwrap().unwrap();
    assert_eq!(answer.data.text, "order:7 shipped");
}
