//! Second stage: check the raw syntax against what the macros accept, collecting every
//! mistake with its span, and build the model the expansion works from.

pub(crate) mod artifact;
pub(crate) mod produce;
