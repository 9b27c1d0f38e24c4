//! Reads for operator tools: verification and time travel that report their progress commit
//! by commit (for a progress bar on long logs), and a snapshot's artifacts as stored, without
//! knowing their Rust types.

use std::sync::Arc;

use crate::audit::verify::{TimeTravelError, VerifyReport};
use crate::model::artifact::{ArtifactId, Generation, Kind, Version};
use crate::model::hash::ContentHash;
use crate::session::context::Context;
use crate::state::refold::{Checks, Refold};
use crate::state::snapshot::Snapshot;

/// An artifact as a snapshot stores it: its kind, version, content hash, the commit that last
/// wrote it, and its rmp-serde bytes (named fields), for a reader that does not know its Rust
/// type. Built by [`Snapshot::stored`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StoredArtifact {
    /// The artifact's id.
    pub id: ArtifactId,
    /// Its kind.
    pub kind: Kind,
    /// Its version.
    pub version: Version,
    /// Its content hash: the SHA-256 of `bytes`.
    pub hash: ContentHash,
    /// The commit (generation) that last wrote it.
    pub generation: Generation,
    /// Its rmp-serde encoding, with named fields.
    pub bytes: Arc<[u8]>,
}

impl Snapshot {
    /// The artifact stored under `id`, undecoded; `None` if there is none. Not recorded as a
    /// produce's read.
    pub fn stored(&self, id: &str) -> Option<StoredArtifact> {
        self.state.get(id).map(|stored| StoredArtifact {
            id: stored.id.clone(),
            kind: stored.kind,
            version: stored.version,
            hash: stored.hash,
            generation: stored.generation,
            bytes: stored.bytes.clone(),
        })
    }

    /// How many artifacts of the kind named `kind` exist (0 for a kind never stored).
    pub fn count_of_kind(&self, kind: &str) -> usize {
        self.state.count_of_kind(Kind::intern(kind))
    }
}

impl Context {
    /// Time travel with every check of [`verify`](Context::verify): refolds the log from the
    /// empty state up to commit `generation`, checking each commit's numbering, parent link,
    /// content hashes, intent payloads, commit hash and state hash, and calling `progress`
    /// with each commit's generation once it has been checked. Returns what was checked and
    /// the state right after that commit. Runs no produce and calls no dispatcher.
    ///
    /// # Errors
    /// [`TimeTravelError::NoSuchCommit`] past the head; [`TimeTravelError::Verify`] for the
    /// first commit up to `generation` that does not check out.
    pub fn refold_to(
        &self,
        generation: Generation,
        mut progress: impl FnMut(Generation),
    ) -> Result<(VerifyReport, Snapshot), TimeTravelError> {
        let log = self.log()?;
        let end = usize::try_from(generation.0)
            .ok()
            .filter(|&end| end <= log.len())
            .ok_or(TimeTravelError::NoSuchCommit {
                generation,
                head: self.generation(),
            })?;
        let mut refold = Refold::new(Checks::ALL);
        for commit in &log[..end] {
            refold.step(commit)?;
            progress(commit.generation);
        }
        let report = VerifyReport {
            commits: end,
            head: refold.head(),
            state_hash: refold.state().state_hash(),
        };
        Ok((report, Snapshot::new(refold.into_state())))
    }
}
