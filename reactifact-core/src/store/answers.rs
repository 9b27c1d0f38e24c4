//! The answers of recorded calls, kept in the store as they arrive, before the generation of
//! their run commits: after a crash, the re-run of the same run — same produce, same trigger
//! version and content, same event — gets them back without calling again. The runtime drops
//! a produce's answers for a trigger once one of its runs on that trigger commits (the answers
//! are in the commit's run record then, and an earlier version's are of no use).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::artifact::{ArtifactId, Generation, Version};
use crate::model::call::RecordedCall;
use crate::model::event::EventKind;
use crate::model::hash::ContentHash;
use crate::store::codec;
use crate::store::log_store::{AnswerRow, LogStore};
use crate::store::StoreError;

/// Which run an answer belongs to, beside its produce and trigger id: the trigger's version
/// (with the generation that wrote it: an id created again starts at version 1 again), its
/// content, and the event.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AnsweredRun {
    pub(crate) generation: Generation,
    pub(crate) version: Version,
    pub(crate) hash: ContentHash,
    pub(crate) event: EventKind,
}

/// An answer kept, as [`AnswerStore::load`] reads it back.
pub(crate) struct KeptAnswer {
    /// `{agent}/{produce}`.
    pub(crate) produce: String,
    pub(crate) trigger: ArtifactId,
    pub(crate) run: AnsweredRun,
    pub(crate) call: RecordedCall,
}

/// Where one session keeps its answers: its store and its name.
#[derive(Clone)]
pub(crate) struct AnswerStore {
    backend: Arc<dyn LogStore>,
    session: Arc<str>,
}

impl AnswerStore {
    pub(crate) fn new(backend: Arc<dyn LogStore>, session: &str) -> Self {
        AnswerStore {
            backend,
            session: Arc::from(session),
        }
    }

    /// The producer label of a run: `{agent}/{produce}`.
    pub(crate) fn producer(agent: &str, produce: &str) -> String {
        format!("{agent}/{produce}")
    }

    /// Keeps `call`'s answer for the run of `produce` (`{agent}/{produce}`) on `trigger`.
    pub(crate) async fn keep(
        &self,
        produce: String,
        trigger: &ArtifactId,
        run: &AnsweredRun,
        call: &RecordedCall,
    ) -> Result<(), StoreError> {
        let run = rmp_serde::to_vec(run).expect("a run's key always encodes");
        let row = AnswerRow::new(
            self.session.to_string(),
            produce,
            trigger.to_string(),
            run,
            codec::encode_call(call),
        );
        self.backend.keep_answer(row).await
    }

    /// Every answer the session keeps, in the order kept; a row that does not decode (written
    /// by another build) is skipped.
    pub(crate) async fn load(&self) -> Result<Vec<KeptAnswer>, StoreError> {
        let rows = self.backend.answers(&self.session).await?;
        Ok(rows
            .into_iter()
            .filter_map(|row| {
                let run = rmp_serde::from_slice(&row.run).ok()?;
                let call = codec::decode_call(&row.call)?;
                Some(KeptAnswer {
                    produce: row.produce,
                    trigger: ArtifactId::from(row.trigger),
                    run,
                    call,
                })
            })
            .collect())
    }

    /// Drops every answer of the runs of `runs` (`({agent}/{produce}, trigger id)` pairs).
    pub(crate) async fn drop(&self, runs: &[(String, String)]) -> Result<(), StoreError> {
        self.backend.drop_answers(&self.session, runs).await
    }
}
