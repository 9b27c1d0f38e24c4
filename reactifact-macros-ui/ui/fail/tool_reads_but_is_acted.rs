use reactifact_core::tools::{Reads, Tool};
use reactifact_core::{produce, Agent, Artifact, PendingAction, ProduceCall, ProduceError};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Ticket {
    text: String,
}

struct LookupOrder;

#[derive(Serialize, Deserialize)]
struct Lookup {
    order: String,
}

impl Tool for LookupOrder {
    const NAME: &'static str = "lookup_order";
    const DESCRIPTION: &'static str = "Look an order up.";
    type Args = Lookup;
    type Effect = Reads;
    fn parameters() -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }
}

// A tool that only reads cannot become an intent.
#[produce(also_creates = [PendingAction], tools = [LookupOrder])]
async fn support(call: ProduceCall<Ticket>) -> Result<(), ProduceError> {
    call.act_tool::<LookupOrder>(r#"{"order": "order:7"}"#)?;
    Ok(())
}

fn main() {
    let _ = Agent::new("support").produce(support);
}
