//! A `let` binding may share the produce's name: the name's value is a function, which a
//! binding shadows, not a unit struct, which it could not.
#![deny(warnings)]

use reactifact_core::{produce, Agent, Artifact, ProduceCall};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Artifact)]
struct Review {
    stars: u8,
}

#[derive(Serialize, Deserialize, Artifact)]
struct Summary {
    stars: u8,
}

#[produce(Summary)]
async fn review(call: ProduceCall<Review>) {
    call.effects.upsert(
        "summary",
        Summary {
            stars: call.trigger.data.stars,
        },
    );
}

fn main() {
    let agent = Agent::new("reviews").produce(review);
    let review = Review { stars: 5 };
    assert_eq!(review.stars, 5);
    assert_eq!(agent.name(), "reviews");
}
