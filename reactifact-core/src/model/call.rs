//! Recorded calls: the answer of a non-deterministic read a produce made (a model completion,
//! an HTTP GET, the clock, randomness), kept in its run's record, and the usage it reported.

use std::fmt;
use std::ops::{Add, AddAssign};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::hash::ContentHash;

/// What a recorded call reports it used: tokens in and out, and a cost.
///
/// `cost` is a whole number in a unit of your choosing — say millionths of a dollar — so sums
/// are exact and every process adds them up the same way; [`Budget::max_cost`](crate::Budget::max_cost)
/// is in the same unit. Additions saturate at `u64::MAX`.
///
/// ```
/// use reactifact_core::runtime::Usage;
///
/// let usage = Usage::tokens(1_200, 300).with_cost(450) + Usage::tokens(100, 20);
/// assert_eq!(usage.total_tokens(), 1_620);
/// assert_eq!(usage.cost, 450);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens sent (the prompt).
    pub tokens_in: u64,
    /// Tokens received (the completion).
    pub tokens_out: u64,
    /// The cost, in the unit you count it in.
    pub cost: u64,
}

impl Usage {
    /// Nothing used.
    pub const ZERO: Usage = Usage {
        tokens_in: 0,
        tokens_out: 0,
        cost: 0,
    };

    /// `tokens_in` and `tokens_out` tokens, no cost.
    pub fn tokens(tokens_in: u64, tokens_out: u64) -> Self {
        Usage {
            tokens_in,
            tokens_out,
            cost: 0,
        }
    }

    /// The same usage with `cost`.
    pub fn with_cost(self, cost: u64) -> Self {
        Usage { cost, ..self }
    }

    /// Tokens in and out together (saturating).
    pub fn total_tokens(&self) -> u64 {
        self.tokens_in.saturating_add(self.tokens_out)
    }

    /// Whether nothing was used.
    pub fn is_zero(&self) -> bool {
        *self == Usage::ZERO
    }
}

impl Add for Usage {
    type Output = Usage;

    fn add(self, other: Usage) -> Usage {
        Usage {
            tokens_in: self.tokens_in.saturating_add(other.tokens_in),
            tokens_out: self.tokens_out.saturating_add(other.tokens_out),
            cost: self.cost.saturating_add(other.cost),
        }
    }
}

impl AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        *self = *self + other;
    }
}

/// One call a produce run recorded ([`ProduceCall::record`](crate::ProduceCall::record)): its
/// name, the hash of its request, its answer (or the error it failed with) and the usage it
/// reported. Kept in the run's [`RunRecord`](crate::RunRecord), inside the commit hash.
///
/// Its `Debug` leaves the answer out (its size and hash only): recorded answers — a model's
/// reply, a customer's data — are never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct RecordedCall {
    /// The name the produce gave the call (`"llm"`); the clock and the random source record
    /// theirs as `reactifact.now` and `reactifact.rng`.
    pub name: Arc<str>,
    /// SHA-256 of the request's encoding (rmp-serde, named fields).
    pub request: ContentHash,
    /// What it answered.
    pub outcome: CallOutcome,
    /// What it reported it used (zero for a call that reports nothing).
    pub usage: Usage,
    /// The model it asked, for a call recorded with
    /// [`ProduceCall::record_model`](crate::ProduceCall::record_model) (`None` otherwise).
    /// Inside the commit hash when set; a call without it hashes as before it existed.
    pub model: Option<Arc<str>>,
}

/// How a recorded call ended.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallOutcome {
    /// It answered: the answer's encoding (rmp-serde, named fields) and its hash.
    Answered {
        /// SHA-256 of `bytes`.
        hash: ContentHash,
        /// The answer's encoding.
        bytes: Arc<[u8]>,
    },
    /// Its closure failed with this error (displayed). A replay gets the error back; a retry
    /// calls again.
    Failed {
        /// The error, as displayed.
        error: String,
    },
    /// It answered, and the answer could not be recorded: it does not encode, or not decode
    /// back as its type (the message names the type, never the answer). A replay gets
    /// [`CallError::Answer`](crate::CallError::Answer) back; a retry calls again.
    Unrecordable {
        /// What failed.
        error: String,
    },
    /// The produce dropped its future before it answered (a timeout, a `select!`): a replay
    /// never answers it, so the produce takes the same way again.
    Abandoned,
}

impl RecordedCall {
    /// The answer's encoding, if the call answered.
    pub fn answer_bytes(&self) -> Option<&[u8]> {
        match &self.outcome {
            CallOutcome::Answered { bytes, .. } => Some(bytes),
            _ => None,
        }
    }

    /// The answer, decoded as `A`: `None` if the call failed.
    ///
    /// # Errors
    /// If the answer does not decode as `A`.
    pub fn answer<A: serde::de::DeserializeOwned>(&self) -> Option<Result<A, rmp_serde::decode::Error>> {
        self.answer_bytes().map(rmp_serde::from_slice)
    }
}

impl fmt::Debug for RecordedCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordedCall")
            .field("name", &self.name)
            .field("request", &format_args!("{}", self.request.short()))
            .field("outcome", &self.outcome)
            .field("usage", &self.usage)
            .field("model", &self.model)
            .finish()
    }
}

impl fmt::Debug for CallOutcome {
    /// The answer's size and hash, never its bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallOutcome::Answered { hash, bytes } => {
                write!(f, "Answered({} bytes, {})", bytes.len(), hash.short())
            }
            CallOutcome::Failed { error } => f.debug_struct("Failed").field("error", error).finish(),
            CallOutcome::Unrecordable { error } => f.debug_struct("Unrecordable").field("error", error).finish(),
            CallOutcome::Abandoned => f.write_str("Abandoned"),
        }
    }
}

/// The call as the commit hash sees it: the answer by its hash, as operations are.
impl Serialize for RecordedCall {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Hashed<'a> {
            name: &'a str,
            request: &'a ContentHash,
            #[serde(skip_serializing_if = "Option::is_none")]
            answer: Option<&'a ContentHash>,
            #[serde(skip_serializing_if = "Option::is_none")]
            failed: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            unrecordable: Option<&'a str>,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            abandoned: bool,
            #[serde(skip_serializing_if = "Usage::is_zero")]
            usage: Usage,
            #[serde(skip_serializing_if = "Option::is_none")]
            model: Option<&'a str>,
        }
        let mut hashed = Hashed {
            name: &self.name,
            request: &self.request,
            answer: None,
            failed: None,
            unrecordable: None,
            abandoned: false,
            usage: self.usage,
            model: self.model.as_deref(),
        };
        match &self.outcome {
            CallOutcome::Answered { hash, .. } => hashed.answer = Some(hash),
            CallOutcome::Failed { error } => hashed.failed = Some(error),
            CallOutcome::Unrecordable { error } => hashed.unrecordable = Some(error),
            CallOutcome::Abandoned => hashed.abandoned = true,
        }
        hashed.serialize(serializer)
    }
}
