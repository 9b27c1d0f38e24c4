//! Human in the loop, the question side: a produce asks ([`Effects::ask`]), a human answers
//! ([`Context::answer`]), and the answer — an ordinary committed write — wakes the produces
//! triggered by [`Question`].

use crate::model::artifact::{ArtifactId, ReadError};
use crate::model::question::Question;
use crate::run::effects::{DeclaredOutput, Effects};
use crate::session::context::{Context, WriteError};

impl<D> Effects<D> {
    /// Asks a human `text`: a pending [`Question`] at `id`, created only if the id does not
    /// exist at commit time (like [`create_once`](Effects::create_once)), so a re-run of the
    /// produce never resets a question, answered or not. Returns the id. Derive `id` from
    /// stable content (the trigger's id), as for an intent's key.
    ///
    /// The produce must declare the output (`also_creates = [Question]`). The answer comes as
    /// an update of the question ([`Context::answer`]): a produce triggered by `Question`
    /// sees it and acts on it, e.g. with an intent keyed by the question's id.
    pub fn ask(&self, id: impl Into<ArtifactId>, text: impl Into<String>) -> ArtifactId
    where
        Question: DeclaredOutput<D>,
    {
        let id = id.into();
        self.create_once(id.clone(), Question::new(text));
        id
    }
}

/// [`Context::answer`] refused an answer; nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnswerError {
    /// No artifact at the id.
    #[error("no question `{0}` to answer")]
    NoSuchQuestion(ArtifactId),
    /// The id holds another kind of artifact, or a question that does not decode.
    #[error("artifact `{id}` cannot be answered: {source}")]
    NotAQuestion {
        /// The id.
        id: ArtifactId,
        /// Why it does not read as a question.
        #[source]
        source: ReadError,
    },
    /// The question was answered already: the first answer stands.
    #[error("question `{id}` was already answered by {by}")]
    AlreadyAnswered {
        /// The id.
        id: ArtifactId,
        /// Who answered it.
        by: String,
    },
    /// The name of who answers is empty.
    #[error("question `{0}`: an answer must name who gives it")]
    NoAnswerer(ArtifactId),
    /// The answer could not be written.
    #[error(transparent)]
    Write(#[from] WriteError),
}

impl Context {
    /// Answers the pending [`Question`] at `id` with `answer`, given `by`: one committed write
    /// (an update of the question, durable like any other), whose update event runs, on the
    /// next turn, the produces triggered by `Question`. The answer is state: a replay, a
    /// verify and another branch forked after it see the same answer.
    ///
    /// # Errors
    /// [`AnswerError::NoSuchQuestion`], [`AnswerError::NotAQuestion`],
    /// [`AnswerError::AlreadyAnswered`] (the first answer stands), [`AnswerError::NoAnswerer`]
    /// for an empty `by`, [`AnswerError::Write`] if the store refused the write.
    pub fn answer(&mut self, id: &str, answer: impl Into<String>, by: &str) -> Result<(), AnswerError> {
        let question = match self.get::<Question>(id) {
            Ok(Some(question)) => question.data,
            Ok(None) => return Err(AnswerError::NoSuchQuestion(ArtifactId::from(id))),
            Err(source) => {
                return Err(AnswerError::NotAQuestion {
                    id: ArtifactId::from(id),
                    source,
                })
            }
        };
        if question.is_answered() {
            return Err(AnswerError::AlreadyAnswered {
                id: ArtifactId::from(id),
                by: question.answered_by.unwrap_or_default(),
            });
        }
        if by.is_empty() {
            return Err(AnswerError::NoAnswerer(ArtifactId::from(id)));
        }
        self.update(
            id,
            Question {
                answer: Some(answer.into()),
                answered_by: Some(by.to_owned()),
                ..question
            },
        )?;
        Ok(())
    }
}
