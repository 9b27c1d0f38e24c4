//! Running produces: produces and agents, the effects buffer they write to, one generation
//! (match, run, validate, commit), and the runtime that repeats generations and drains the
//! outbox, and the timers a turn fires.

pub(crate) mod ask;
pub(crate) mod call_fn;
pub(crate) mod calls;
pub(crate) mod delivery;
pub(crate) mod effects;
pub(crate) mod generation;
pub(crate) mod handle;
pub(crate) mod harness;
pub(crate) mod join;
pub(crate) mod matching;
pub(crate) mod produce;
pub(crate) mod resources;
pub(crate) mod retries;
pub(crate) mod runtime;
pub(crate) mod serve;
pub(crate) mod timers;
pub(crate) mod tools;
pub mod when;
