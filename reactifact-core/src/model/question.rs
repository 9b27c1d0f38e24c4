//! Questions for a human: the artifact a produce asks with
//! [`Effects::ask`](crate::Effects::ask), pending until someone answers it with
//! [`Context::answer`](crate::Context::answer).

use serde::{Deserialize, Serialize};

use crate::model::artifact::Artifact;

/// A question a produce asked a human ([`Effects::ask`](crate::Effects::ask)), stored as an
/// artifact at the id the produce chose. Pending while [`answer`](Question::answer) is
/// `None`; answering it ([`Context::answer`](crate::Context::answer)) is an ordinary
/// committed write, whose update event runs the produces triggered by `Question` (which
/// check [`is_answered`](Question::is_answered) and act on the answer).
///
/// Declare it like `PendingAction`: `#[produce(Out, also_creates = [Question])]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Question {
    /// What is asked, as the human reads it.
    pub text: String,
    /// The answer, once given.
    pub answer: Option<String>,
    /// Who answered.
    pub answered_by: Option<String>,
}

impl Artifact for Question {
    const KIND: &'static str = "question";
}

impl Question {
    /// A pending question.
    pub fn new(text: impl Into<String>) -> Self {
        Question {
            text: text.into(),
            answer: None,
            answered_by: None,
        }
    }

    /// Whether it has been answered.
    pub fn is_answered(&self) -> bool {
        self.answer.is_some()
    }
}
