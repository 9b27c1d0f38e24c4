//! Re-arming a parked event: the operator's answer to a produce that failed on every attempt.

use crate::model::artifact::ArtifactId;
use crate::model::parked::{Parked, PARKED_ID_PREFIX};
use crate::session::context::{Context, WriteError};

/// Re-arming a parked event failed; nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RearmError {
    /// No parked event is stored at this id.
    #[error(
        "no parked event at `{id}` (parked events are stored at `{PARKED_ID_PREFIX}{{agent}}/{{produce}}/{{trigger}}`)"
    )]
    NotParked {
        /// The id given.
        id: ArtifactId,
    },
    /// The write was refused.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The runtime was dropped before it took the re-arm
    /// ([`RuntimeHandle::rearm`](crate::RuntimeHandle::rearm)).
    #[error("the runtime is gone; the re-arm was not applied")]
    Closed,
}

impl Context {
    /// Re-arms the parked event stored at `id` (see [`Parked`]): its record is deleted and a
    /// retry of its produce falls due now, with its retry policy's attempts anew; one commit.
    /// The next turn of a runtime with that produce runs it on its trigger as it is then. A
    /// serving runtime's own re-arm is [`RuntimeHandle::rearm`](crate::RuntimeHandle::rearm).
    ///
    /// # Errors
    /// [`RearmError::NotParked`] if no parked event is stored at `id`; [`RearmError::Write`]
    /// if the commit failed (nothing was written).
    pub async fn rearm(&mut self, id: impl Into<ArtifactId>) -> Result<(), RearmError> {
        let ops = self.rearm_ops(id.into())?;
        Ok(self.commit_direct_async(ops).await?)
    }

    /// The writes that re-arm the parked event stored at `id`.
    pub(crate) fn rearm_ops(&self, id: ArtifactId) -> Result<Vec<crate::model::patch::Op>, RearmError> {
        let parked = match self.get::<Parked>(id.as_str()) {
            Ok(Some(parked)) => parked.data,
            _ => return Err(RearmError::NotParked { id }),
        };
        Ok(parked.rearm_ops(crate::model::time::now()).map_err(WriteError::from)?)
    }
}
