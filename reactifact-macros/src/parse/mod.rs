//! First stage: turn the macro input into raw syntax, without judging it.
//!
//! Only malformed syntax fails here (a missing `=`, an unclosed bracket). Everything that is
//! well-formed but wrong — an unknown option, a duplicate, a synchronous function — is left to
//! [`validate`](crate::validate), which reports all such mistakes together.

pub(crate) mod artifact;
pub(crate) mod produce;
