use reactifact_core::tools::{Acts, Tool};
use reactifact_core::{produce, Agent, Artifact, PendingAction, ProduceCall, ProduceError};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Ticket {
    text: String,
}

struct IssueRefund;

#[derive(Serialize, Deserialize)]
struct Refund {
    cents: u64,
}

impl Tool for IssueRefund {
    const NAME: &'static str = "issue_refund";
    const DESCRIPTION: &'static str = "Refund an order.";
    type Args = Refund;
    type Effect = Acts;
    fn parameters() -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }
}

// The tool is not in `tools = [..]`.
#[produce(also_creates = [PendingAction])]
async fn support(call: ProduceCall<Ticket>) -> Result<(), ProduceError> {
    call.act_tool::<IssueRefund>(r#"{"cents": 100}"#)?;
    Ok(())
}

fn main() {
    let _ = Agent::new("support").produce(support);
}
