use std::time::{Duration, SystemTime};

use reactifact_core::{produce, Agent, Artifact, ProduceCall};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Booking {
    remind_at_secs: u64,
}

#[derive(Serialize, Deserialize, Artifact)]
struct Confirmation {
    booking: String,
}

#[produce(Confirmation)]
async fn confirm(call: ProduceCall<Booking>) {
    let booking = call.trigger.id.to_string();
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(call.trigger.data.remind_at_secs);
    call.effects.upsert("confirmation:1", Confirmation { booking: booking.clone() });
    call.effects.wake_at(at, "remind:1", &booking);
}

fn main() {
    let _ = Agent::new("bookings").produce(confirm);
}
