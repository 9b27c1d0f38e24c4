//! Relations: directed, named edges between two artifacts.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::artifact::ArtifactId;
use crate::model::hash;

/// A directed, named relation between two artifacts: `from -[name]-> to`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Relation {
    /// The source artifact.
    pub from: ArtifactId,
    /// The relation's name, e.g. `"billed_by"`.
    pub name: Arc<str>,
    /// The target artifact.
    pub to: ArtifactId,
}

impl Relation {
    /// A relation `from -[name]-> to`.
    pub fn new(from: impl Into<ArtifactId>, name: &str, to: impl Into<ArtifactId>) -> Self {
        Relation {
            from: from.into(),
            name: Arc::from(name),
            to: to.into(),
        }
    }

    /// The same relation with `from` and `to` swapped.
    pub(crate) fn reversed(&self) -> Relation {
        Relation {
            from: self.to.clone(),
            name: self.name.clone(),
            to: self.from.clone(),
        }
    }

    /// Its entry in the state digest.
    pub(crate) fn entry(&self) -> [u8; 32] {
        hash::relation_entry(self.from.as_str(), &self.name, self.to.as_str())
    }
}
