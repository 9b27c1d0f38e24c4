//! What a drain asks of each claim beyond its scope and limit: the rate limits it spends
//! from, the priorities of kinds, and whether sessions take turns.

use std::sync::Arc;

use crate::model::rate::RateBucket;

/// How a claim chooses among due intents ([`ClaimRequest::policy`](crate::ClaimRequest::policy)):
/// the rate limits it spends from, the priorities of action kinds, and whether sessions take
/// turns. A drain builds it from its [`DeliveryOptions`](crate::DeliveryOptions);
/// [`ClaimPolicy::none`] for plain claims.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimPolicy {
    /// The rate limits: of the intents of a bucket's kinds, at most its
    /// [`allowance`](crate::RateLimit::allowance) at the claim's time are claimed, and the
    /// bucket's state is updated in the claim's transaction.
    pub rates: Vec<RateBucket>,
    /// Priorities of kinds (default 0): after the sessions' turns, a claim takes the due
    /// intents of higher-priority kinds before those of lower ones, and due order among equals.
    pub priorities: Vec<(Arc<str>, i32)>,
    /// Whether sessions take turns: a claim of several sessions first takes the earliest due
    /// intent of each ([`ClaimRequest::takes_turns`](crate::ClaimRequest::takes_turns)).
    pub turns: bool,
}

impl ClaimPolicy {
    /// No rate limit, every kind of priority 0, no turns: due order.
    pub fn none() -> &'static ClaimPolicy {
        static NONE: ClaimPolicy = ClaimPolicy {
            rates: Vec::new(),
            priorities: Vec::new(),
            turns: false,
        };
        &NONE
    }

    /// The priority of `kind` (0 unless stated).
    pub fn priority_of(&self, kind: &str) -> i32 {
        self.priorities
            .iter()
            .find(|(k, _)| &**k == kind)
            .map_or(0, |&(_, p)| p)
    }

    /// Whether a claim must choose kind by kind: some kind is rate-limited or has a priority.
    pub fn by_kind(&self) -> bool {
        !self.rates.is_empty() || self.priorities.iter().any(|&(_, p)| p != 0)
    }
}
