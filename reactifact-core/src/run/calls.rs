//! Recorded calls: how a produce reads the non-deterministic world (a model, an HTTP GET, the
//! clock, randomness) so that a retry, a resume and a replay get the same answer without
//! calling again.
//!
//! Each run has a [`CallLog`]: the calls it asked for, in the order it asked, and where their
//! answers come from ([`Source`]). A live run calls the closure — unless an earlier attempt of
//! the same run, in a generation that did not commit, already has the answer to the same
//! request (the runtime's [`CallCache`]). A replay only reads the run's record: a call it does
//! not have is a [`ReplayMiss`]. The produce test harness answers from a script.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use foldhash::{HashMap, HashMapExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::model::artifact::{self, ArtifactId, Version};
use crate::model::call::{CallOutcome, RecordedCall, Usage};
use crate::model::event::EventKind;
use crate::model::hash::{content_hash, ContentHash};
use crate::outbox::dispatcher::BoxError;
use crate::run::produce::ProduceCall;

/// The name [`ProduceCall::now`] records its reading under.
pub(crate) const NOW: &str = "reactifact.now";
/// The name [`ProduceCall::rng`] records its seed under.
pub(crate) const RNG: &str = "reactifact.rng";
/// Names starting with this are the runtime's own.
const RESERVED: &str = "reactifact.";

/// A recorded call could not give an answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The call itself failed (the closure returned an error); nothing is reused from it: a
    /// retry calls again. In a replay, the error the recorded call failed with.
    #[error("call `{call}` failed: {source}")]
    Failed {
        /// The call's name.
        call: String,
        /// The closure's error.
        #[source]
        source: BoxError,
    },
    /// A replay asked for a call its record does not have, with another request, or whose
    /// answer no longer decodes as the type asked for; the replay oracle reports it as a
    /// divergence ([`Difference::Call`](crate::Difference::Call)).
    #[error(transparent)]
    Miss(#[from] ReplayMiss),
    /// The turn's [`Budget::max_tokens`](crate::Budget::max_tokens) or
    /// [`Budget::max_cost`](crate::Budget::max_cost) is spent, so the call was not made. The
    /// generation is not committed (whatever the produce does with this error): the turn ends
    /// with [`TurnOutcome::TokensExhausted`](crate::TurnOutcome::TokensExhausted) or
    /// [`CostExhausted`](crate::TurnOutcome::CostExhausted), and the next turn runs it again,
    /// reusing the answers its calls already got.
    #[error("call `{call}` was not made: the turn's {limit} budget is spent")]
    BudgetExhausted {
        /// The call's name.
        call: String,
        /// `tokens` or `cost`.
        limit: &'static str,
    },
    /// The request could not be encoded (rmp-serde), so it has no hash to record.
    #[error("call `{call}`: the request does not encode: {source}")]
    Request {
        /// The call's name.
        call: String,
        /// The encoder's error.
        #[source]
        source: rmp_serde::encode::Error,
    },
    /// The answer could not be encoded or decoded back (rmp-serde), so it cannot be recorded
    /// or replayed; the call is recorded as failed.
    #[error("call `{call}`: the answer cannot be recorded: {error}")]
    Answer {
        /// The call's name.
        call: String,
        /// What failed.
        error: String,
    },
    /// The call was asked for after the produce's run had finished (from a task the produce
    /// spawned): nothing can record it any more.
    #[error("call `{call}` was asked for after the produce run finished")]
    RunFinished {
        /// The call's name.
        call: String,
    },
    /// The name is the runtime's own (`reactifact.` begins the names of [`ProduceCall::now`]
    /// and [`ProduceCall::rng`]).
    #[error("call name `{call}` is reserved: names beginning with `reactifact.` are the runtime's own")]
    ReservedName {
        /// The name asked for.
        call: String,
    },
}

/// A call a replay (or a test script) could not answer from its record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("produce `{produce}`, call `{call}` (#{index} of that name): {kind}")]
#[non_exhaustive]
pub struct ReplayMiss {
    /// The produce that asked.
    pub produce: String,
    /// The call's name.
    pub call: String,
    /// Which call of that name in the run, from 0.
    pub index: u32,
    /// What is missing or different.
    pub kind: MissKind,
}

/// How a replayed call differs from its record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MissKind {
    /// The record has no such call: the replayed run asked for more calls of this name.
    #[error("the record has no such call")]
    NotRecorded,
    /// The record's call of that name and position was made with another request.
    #[error("the request differs from the recorded one (recorded {recorded}, replayed {replayed})")]
    RequestDiffers {
        /// The recorded request's hash.
        recorded: ContentHash,
        /// The replayed request's hash.
        replayed: ContentHash,
    },
    /// The recorded answer does not decode as the type the replayed run asked for.
    #[error("the recorded answer does not decode as the type asked for: {error}")]
    Undecodable {
        /// The decoder's error.
        error: String,
    },
    /// The record has the call and the replayed run never asked for it.
    #[error("the run recorded this call and the replay did not ask for it")]
    NotAsked,
    /// A test script ([`ProduceTest`](crate::testing::ProduceTest)) has no answer left for it.
    #[error("the test scripts no answer for it")]
    NotScripted,
}

/// Where the answers of a run's calls come from.
pub(crate) enum Source {
    /// A live run: the closure, unless `prior` — what an earlier attempt of the same run, in
    /// a generation that did not commit, recorded — answered the same request.
    Live { prior: Vec<RecordedCall> },
    /// A replay: the run's record only.
    Replay { recorded: Vec<RecordedCall> },
    /// A test script: answers by name, in order; the clock and the seed are fixed.
    Script(Script),
}

/// What the produce test harness answers calls with.
#[derive(Clone, Default)]
pub(crate) struct Script {
    pub(crate) answers: HashMap<Arc<str>, VecDeque<(Arc<[u8]>, Usage)>>,
    /// Calls without a scripted answer call their closure instead of missing.
    pub(crate) call_through: bool,
    pub(crate) now: Option<SystemTime>,
    pub(crate) seed: u64,
}

/// Why a generation could not go on: the budget a call found spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exhausted {
    Tokens,
    Cost,
}

impl Exhausted {
    fn limit(self) -> &'static str {
        match self {
            Exhausted::Tokens => "tokens",
            Exhausted::Cost => "cost",
        }
    }
}

/// What the calls of one turn have used, against its budget. Shared by the turn's runs.
#[derive(Debug, Default)]
pub(crate) struct Meter {
    tokens: AtomicU64,
    cost: AtomicU64,
    max_tokens: Option<u64>,
    max_cost: Option<u64>,
}

impl Meter {
    pub(crate) fn new(max_tokens: Option<u64>, max_cost: Option<u64>) -> Self {
        Meter {
            max_tokens,
            max_cost,
            ..Meter::default()
        }
    }

    /// The limit that is reached, if one is: a call starts only while neither is.
    pub(crate) fn exhausted(&self) -> Option<Exhausted> {
        if self.max_tokens.is_some_and(|max| self.tokens.load(Ordering::Relaxed) >= max) {
            Some(Exhausted::Tokens)
        } else if self.max_cost.is_some_and(|max| self.cost.load(Ordering::Relaxed) >= max) {
            Some(Exhausted::Cost)
        } else {
            None
        }
    }

    fn add(&self, usage: Usage) {
        let add = |counter: &AtomicU64, n: u64| {
            // Saturating, as `Usage` adds.
            let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_add(n)));
        };
        add(&self.tokens, usage.total_tokens());
        add(&self.cost, usage.cost);
    }
}

/// The calls of one produce run.
pub(crate) struct CallLog {
    produce: Arc<str>,
    inner: Mutex<Inner>,
}

struct Inner {
    source: Source,
    meter: Arc<Meter>,
    /// One slot per call asked for, in the order asked.
    asked: Vec<Slot>,
    /// How many calls of each name were asked for.
    counts: HashMap<Arc<str>, u32>,
    /// Which recorded (or prior) calls were used, by position.
    used: Vec<bool>,
    /// What the calls made by this run used (reused answers use nothing).
    spent: Usage,
    /// Closures called (the runtime's own calls, the clock and the seed, not counted).
    made: u64,
    /// Answers reused from an earlier attempt (the runtime's own calls not counted).
    reused: u64,
    miss: Option<ReplayMiss>,
    deferred: Option<Exhausted>,
    /// Requests as encoded, for the test harness.
    requests: Option<Vec<(Arc<str>, Vec<u8>)>>,
    sealed: bool,
}

/// A call asked for: answered, or waiting for its closure.
enum Slot {
    Waiting { name: Arc<str>, request: ContentHash },
    Done(RecordedCall),
}

/// What a run's calls came to, once it finished.
pub(crate) struct Harvest {
    /// Every call asked for, in order; one that never answered is failed, `abandoned`.
    pub(crate) calls: Vec<RecordedCall>,
    pub(crate) spent: Usage,
    pub(crate) made: u64,
    pub(crate) reused: u64,
    pub(crate) miss: Option<ReplayMiss>,
    pub(crate) deferred: Option<Exhausted>,
    pub(crate) requests: Vec<(Arc<str>, Vec<u8>)>,
}

/// What asking for a call found.
enum Asked {
    /// Answered from the record (or a prior attempt, or the script): the bytes.
    Answered(Arc<[u8]>),
    /// Recorded as failed (replay): the error.
    Failed(String),
    /// To be made: the slot its outcome goes in.
    Make(usize),
    /// Refused.
    Refused(CallError),
}

impl CallLog {
    pub(crate) fn new(produce: Arc<str>, source: Source, meter: Arc<Meter>) -> Arc<Self> {
        let recorded = match &source {
            Source::Live { prior } => prior.len(),
            Source::Replay { recorded } => recorded.len(),
            Source::Script(_) => 0,
        };
        let requests = matches!(source, Source::Script(_)).then(Vec::new);
        Arc::new(CallLog {
            produce,
            inner: Mutex::new(Inner {
                source,
                meter,
                asked: Vec::new(),
                counts: HashMap::new(),
                used: vec![false; recorded],
                spent: Usage::ZERO,
                made: 0,
                reused: 0,
                miss: None,
                deferred: None,
                requests,
                sealed: false,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Looks the call up; `metered` calls are the ones a spent budget refuses.
    fn ask(&self, name: &str, request: ContentHash, request_bytes: &[u8], metered: bool) -> Asked {
        let mut inner = self.lock();
        if inner.sealed {
            return Asked::Refused(CallError::RunFinished { call: name.to_owned() });
        }
        let name: Arc<str> = Arc::from(name);
        let index = {
            let count = inner.counts.entry(name.clone()).or_insert(0);
            let index = *count;
            *count = count.saturating_add(1);
            index
        };
        if let Some(requests) = &mut inner.requests {
            requests.push((name.clone(), request_bytes.to_vec()));
        }
        let miss = |kind| ReplayMiss {
            produce: self.produce.to_string(),
            call: name.to_string(),
            index,
            kind,
        };
        let inner = &mut *inner;
        match &mut inner.source {
            Source::Replay { recorded } => {
                let Some(at) = nth_named(recorded, &name, index) else {
                    return inner.missed(miss(MissKind::NotRecorded));
                };
                inner.used[at] = true;
                let call = &recorded[at];
                if call.request != request {
                    let kind = MissKind::RequestDiffers {
                        recorded: call.request,
                        replayed: request,
                    };
                    return inner.missed(miss(kind));
                }
                inner.asked.push(Slot::Done(call.clone()));
                match &call.outcome {
                    CallOutcome::Answered { bytes, .. } => Asked::Answered(bytes.clone()),
                    CallOutcome::Failed { error } => Asked::Failed(error.clone()),
                }
            }
            Source::Live { prior } => {
                let reuse = nth_named(prior, &name, index).filter(|&at| {
                    prior[at].request == request && matches!(prior[at].outcome, CallOutcome::Answered { .. })
                });
                if let Some(at) = reuse {
                    inner.used[at] = true;
                    let call = prior[at].clone();
                    let bytes = call.answer_bytes().map(Arc::from).expect("an answered call");
                    inner.asked.push(Slot::Done(call));
                    if !name.starts_with(RESERVED) {
                        inner.reused += 1;
                    }
                    return Asked::Answered(bytes);
                }
                if metered {
                    if let Some(limit) = inner.meter.exhausted() {
                        inner.deferred.get_or_insert(limit);
                        return Asked::Refused(CallError::BudgetExhausted {
                            call: name.to_string(),
                            limit: limit.limit(),
                        });
                    }
                }
                inner.asked.push(Slot::Waiting { name, request });
                Asked::Make(inner.asked.len() - 1)
            }
            Source::Script(script) => {
                if let Some((bytes, usage)) = script.answers.get_mut(&name).and_then(VecDeque::pop_front) {
                    inner.asked.push(Slot::Done(RecordedCall {
                        name: name.clone(),
                        request,
                        outcome: CallOutcome::Answered {
                            hash: content_hash(&bytes),
                            bytes: bytes.clone(),
                        },
                        usage,
                    }));
                    inner.spent += usage;
                    return Asked::Answered(bytes);
                }
                let fixed = match &*name {
                    NOW => script.now.map(|t| artifact::encode(&t)),
                    RNG => Some(artifact::encode(&script.seed)),
                    _ => None,
                };
                match fixed {
                    Some(Ok(bytes)) => {
                        let bytes: Arc<[u8]> = bytes.into();
                        inner.asked.push(Slot::Done(RecordedCall {
                            name: name.clone(),
                            request,
                            outcome: CallOutcome::Answered {
                                hash: content_hash(&bytes),
                                bytes: bytes.clone(),
                            },
                            usage: Usage::ZERO,
                        }));
                        Asked::Answered(bytes)
                    }
                    _ if script.call_through || &*name == NOW => {
                        inner.asked.push(Slot::Waiting {
                            name: name.clone(),
                            request,
                        });
                        Asked::Make(inner.asked.len() - 1)
                    }
                    _ => inner.missed(miss(MissKind::NotScripted)),
                }
            }
        }
    }

    /// Records how the call in `slot` ended.
    fn answer(&self, slot: usize, outcome: CallOutcome, usage: Usage) {
        let mut inner = self.lock();
        if let Some(Slot::Waiting { name, .. }) = inner.asked.get(slot) {
            if !name.starts_with(RESERVED) {
                inner.made += 1;
            }
        }
        inner.spent += usage;
        inner.meter.add(usage);
        if let Some(entry) = inner.asked.get_mut(slot) {
            if let Slot::Waiting { name, request } = entry {
                *entry = Slot::Done(RecordedCall {
                    name: name.clone(),
                    request: *request,
                    outcome,
                    usage,
                });
            }
        }
    }

    /// Records a miss of the call of `name` asked for last (its answer does not decode).
    fn undecodable(&self, name: &str, error: String) -> ReplayMiss {
        let mut inner = self.lock();
        let miss = ReplayMiss {
            produce: self.produce.to_string(),
            call: name.to_owned(),
            index: inner.counts.get(name).map_or(0, |n| n.saturating_sub(1)),
            kind: MissKind::Undecodable { error },
        };
        inner.miss.get_or_insert_with(|| miss.clone());
        miss
    }

    fn replaying(&self) -> bool {
        matches!(self.lock().source, Source::Replay { .. } | Source::Script(_))
    }

    /// Ends the run's calls: later ones are refused. What they came to.
    pub(crate) fn harvest(&self) -> Harvest {
        let mut inner = self.lock();
        inner.sealed = true;
        let asked = std::mem::take(&mut inner.asked);
        // In a replay, a recorded call the run never asked for is a divergence too.
        if inner.miss.is_none() {
            if let Source::Replay { recorded } = &inner.source {
                if let Some(at) = inner.used.iter().position(|used| !used) {
                    let call = &recorded[at];
                    let index = recorded[..at].iter().filter(|c| c.name == call.name).count();
                    inner.miss = Some(ReplayMiss {
                        produce: self.produce.to_string(),
                        call: call.name.to_string(),
                        index: u32::try_from(index).unwrap_or(u32::MAX),
                        kind: MissKind::NotAsked,
                    });
                }
            }
        }
        let requests = inner.requests.take().unwrap_or_default();
        Harvest {
            calls: asked
                .into_iter()
                .map(|slot| match slot {
                    Slot::Done(call) => call,
                    Slot::Waiting { name, request } => RecordedCall {
                        name,
                        request,
                        outcome: CallOutcome::Failed {
                            error: "abandoned".to_owned(),
                        },
                        usage: Usage::ZERO,
                    },
                })
                .collect(),
            spent: inner.spent,
            made: inner.made,
            reused: inner.reused,
            miss: inner.miss.take(),
            deferred: inner.deferred,
            requests,
        }
    }
}

impl Inner {
    fn missed(&mut self, miss: ReplayMiss) -> Asked {
        self.miss.get_or_insert_with(|| miss.clone());
        Asked::Refused(CallError::Miss(miss))
    }
}

/// The position in `calls` of the `n`-th call named `name`.
fn nth_named(calls: &[RecordedCall], name: &str, n: u32) -> Option<usize> {
    calls
        .iter()
        .enumerate()
        .filter(|(_, c)| &*c.name == name)
        .nth(n as usize)
        .map(|(at, _)| at)
}

/// Encodes a request and hashes it.
fn request_of<Q: Serialize + ?Sized>(name: &str, request: &Q) -> Result<(Vec<u8>, ContentHash), CallError> {
    let bytes = artifact::encode(request).map_err(|source| CallError::Request {
        call: name.to_owned(),
        source,
    })?;
    let hash = content_hash(&bytes);
    Ok((bytes, hash))
}

impl CallLog {
    /// One call, made or answered from the record.
    async fn call<Q, A, E, F, Fut>(&self, name: &str, request: &Q, make: F) -> Result<A, CallError>
    where
        Q: Serialize + ?Sized,
        A: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(A, Usage), E>>,
    {
        if name.starts_with(RESERVED) {
            return Err(CallError::ReservedName { call: name.to_owned() });
        }
        self.call_named(name, request, true, make).await
    }

    async fn call_named<Q, A, E, F, Fut>(&self, name: &str, request: &Q, metered: bool, make: F) -> Result<A, CallError>
    where
        Q: Serialize + ?Sized,
        A: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(A, Usage), E>>,
    {
        let (request_bytes, request) = request_of(name, request)?;
        let slot = match self.ask(name, request, &request_bytes, metered) {
            Asked::Answered(bytes) => {
                return rmp_serde::from_slice(&bytes).map_err(|e| match self.replaying() {
                    true => CallError::Miss(self.undecodable(name, e.to_string())),
                    // A reused answer that no longer decodes (the type changed between two
                    // attempts in one process): reported, not called again.
                    false => CallError::Answer {
                        call: name.to_owned(),
                        error: e.to_string(),
                    },
                });
            }
            Asked::Failed(error) => {
                return Err(CallError::Failed {
                    call: name.to_owned(),
                    source: error.into(),
                })
            }
            Asked::Refused(e) => return Err(e),
            Asked::Make(slot) => slot,
        };
        match make().await {
            Ok((answer, usage)) => {
                // The produce gets the answer as a replay will: decoded from what is recorded.
                let recorded = artifact::encode(&answer).map_err(|e| e.to_string()).and_then(|bytes| {
                    rmp_serde::from_slice::<A>(&bytes)
                        .map(|a| (a, bytes))
                        .map_err(|e| format!("it does not decode back: {e}"))
                });
                match recorded {
                    Ok((answer, bytes)) => {
                        let outcome = CallOutcome::Answered {
                            hash: content_hash(&bytes),
                            bytes: bytes.into(),
                        };
                        self.answer(slot, outcome, usage);
                        Ok(answer)
                    }
                    Err(error) => {
                        let outcome = CallOutcome::Failed { error: error.clone() };
                        self.answer(slot, outcome, usage);
                        Err(CallError::Answer {
                            call: name.to_owned(),
                            error,
                        })
                    }
                }
            }
            Err(e) => {
                let source: BoxError = e.into();
                let outcome = CallOutcome::Failed {
                    error: source.to_string(),
                };
                self.answer(slot, outcome, Usage::ZERO);
                Err(CallError::Failed {
                    call: name.to_owned(),
                    source,
                })
            }
        }
    }

    /// A synchronous call of the runtime's own (the clock, a seed): never refused by the
    /// budget, never failing; a replay that misses it records the miss and gets `fallback`.
    fn own<A: Serialize + DeserializeOwned>(&self, name: &'static str, make: impl FnOnce() -> A) -> A {
        let (request_bytes, request) = request_of(name, &()).expect("() always encodes");
        match self.ask(name, request, &request_bytes, false) {
            Asked::Answered(bytes) => match rmp_serde::from_slice(&bytes) {
                Ok(answer) => answer,
                Err(e) => {
                    self.undecodable(name, e.to_string());
                    make()
                }
            },
            // A miss is recorded (the oracle reports it); the run goes on with a fresh value.
            Asked::Failed(_) | Asked::Refused(_) => make(),
            Asked::Make(slot) => {
                let answer = make();
                let outcome = match artifact::encode(&answer) {
                    Ok(bytes) => CallOutcome::Answered {
                        hash: content_hash(&bytes),
                        bytes: bytes.into(),
                    },
                    Err(e) => CallOutcome::Failed { error: e.to_string() },
                };
                self.answer(slot, outcome, Usage::ZERO);
                answer
            }
        }
    }
}

impl<T, D> ProduceCall<T, D> {
    /// A recorded call: a read of the non-deterministic world (a model completion, an HTTP GET
    /// of reference data) whose answer is kept in this run's record, inside the commit hash.
    ///
    /// The first execution calls `call` and records `name`, the hash of `request` and the
    /// answer. A retry of the same run (its generation failed, was cancelled, was refused by a
    /// spent budget or lost a race with another writer, and runs again), a replay and the
    /// replay oracle get the recorded answer back without calling `call` — as long as the
    /// request is the same: `request` is what identifies the call, so put in it everything the
    /// answer depends on (the prompt, the model, its settings). The `n`-th call named `name`
    /// in a run is matched with the `n`-th recorded under that name.
    ///
    /// The produce gets the answer as a replay will: decoded from its recorded encoding
    /// (rmp-serde), so `A` must round-trip through serde. A failure of `call` is recorded as
    /// failed and returned ([`CallError::Failed`]); it is not reused: a retry calls again.
    /// Recorded answers are never logged. See `docs/agents.md`.
    ///
    /// ```
    /// use reactifact_core::{produce, Artifact, ProduceCall, ProduceError};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)] struct Ticket { text: String }
    /// impl Artifact for Ticket { const KIND: &'static str = "ticket"; }
    /// #[derive(Serialize, Deserialize)] struct Label { category: String }
    /// impl Artifact for Label { const KIND: &'static str = "label"; }
    ///
    /// async fn classify(text: &str) -> Result<String, std::io::Error> {
    ///     Ok(if text.contains("refund") { "billing" } else { "general" }.to_owned())
    /// }
    ///
    /// #[produce(Label)]
    /// async fn label(call: ProduceCall<Ticket>) -> Result<(), ProduceError> {
    ///     let text = &call.trigger.data.text;
    ///     let category: String = call.record("classify", text, || classify(text)).await?;
    ///     call.effects.upsert(format!("label:{}", call.trigger.id), Label { category });
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// [`CallError::Failed`] when `call` fails; [`CallError::BudgetExhausted`] when the turn's
    /// token or cost budget is spent (the call is not made); [`CallError::Miss`] in a replay
    /// that does not have the call; [`CallError::Request`] and [`CallError::Answer`] when the
    /// request or the answer does not encode; [`CallError::ReservedName`] for a name beginning
    /// with `reactifact.`; [`CallError::RunFinished`] after the run has finished.
    pub async fn record<Q, A, E, F, Fut>(&self, name: &str, request: &Q, call: F) -> Result<A, CallError>
    where
        Q: Serialize + ?Sized,
        A: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<A, E>>,
    {
        self.calls
            .call(name, request, || async move { call().await.map(|answer| (answer, Usage::ZERO)) })
            .await
    }

    /// A recorded call, like [`record`](ProduceCall::record), whose closure also reports what it
    /// used: tokens in and out, and a cost ([`Usage`]). The usage is recorded with the answer,
    /// counted against the turn's [`Budget::max_tokens`](crate::Budget::max_tokens) and
    /// [`Budget::max_cost`](crate::Budget::max_cost) and summed in
    /// [`TurnReport::usage`](crate::TurnReport::usage) — when the call is made; an answer a
    /// retry or a replay gets back from the record costs nothing.
    ///
    /// # Errors
    /// As [`record`](ProduceCall::record).
    pub async fn record_metered<Q, A, E, F, Fut>(&self, name: &str, request: &Q, call: F) -> Result<A, CallError>
    where
        Q: Serialize + ?Sized,
        A: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(A, Usage), E>>,
    {
        self.calls.call(name, request, call).await
    }

    /// The time now, as a recorded call (`reactifact.now`): a retry and a replay of this run
    /// read the same time, so the replay oracle reports no divergence for a produce that reads
    /// the clock through it. It is the runtime's clock, which follows tokio's paused clock in
    /// tests. Each call is a call of its own (the second reads the clock again).
    ///
    /// A replay whose record lacks the reading gets the clock's time and reports the miss.
    pub fn now(&self) -> SystemTime {
        self.calls.own(NOW, crate::model::time::now)
    }

    /// A random number generator seeded by a recorded call (`reactifact.rng`): a retry and a
    /// replay of this run draw the same numbers. Not for cryptography. Each call records a seed
    /// of its own.
    ///
    /// ```
    /// # use reactifact_core::{Artifact, Produce, ProduceCall};
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct Ticket;
    /// # impl Artifact for Ticket { const KIND: &'static str = "ticket"; }
    /// let produce = Produce::new("sample", |call: ProduceCall<Ticket>| async move {
    ///     let mut rng = call.rng();
    ///     let _dice = rng.u8(1..=6);
    /// });
    /// # let _ = produce;
    /// ```
    pub fn rng(&self) -> fastrand::Rng {
        fastrand::Rng::with_seed(self.calls.own(RNG, || fastrand::u64(..)))
    }
}

/// Which run an earlier attempt's answers belong to: the produce (by slot) and the trigger
/// version it ran on, with its event kind.
pub(crate) type RunKey = (usize, usize, ArtifactId, Version, ContentHash, EventKind);

/// The answers of runs whose generation did not commit, for their next attempt; bounded, the
/// oldest runs forgotten first. In memory only: a process that dies before a commit calls
/// again after a restart.
#[derive(Default)]
pub(crate) struct CallCache {
    runs: HashMap<RunKey, Vec<RecordedCall>>,
    order: VecDeque<RunKey>,
}

/// How many runs' answers the cache keeps.
const CACHED_RUNS: usize = 4096;

impl CallCache {
    /// The answers kept for `key`, taken out.
    pub(crate) fn take(&mut self, key: &RunKey) -> Vec<RecordedCall> {
        if self.runs.is_empty() {
            return Vec::new();
        }
        self.runs.remove(key).unwrap_or_default()
    }

    /// Keeps the answered calls of a run that did not commit.
    pub(crate) fn keep(&mut self, key: RunKey, calls: Vec<RecordedCall>) {
        let answered: Vec<RecordedCall> = calls
            .into_iter()
            .filter(|c| matches!(c.outcome, CallOutcome::Answered { .. }))
            .collect();
        if answered.is_empty() {
            return;
        }
        if self.runs.insert(key.clone(), answered).is_none() {
            self.order.push_back(key);
        }
        while self.runs.len() > CACHED_RUNS {
            match self.order.pop_front() {
                Some(old) => {
                    self.runs.remove(&old);
                }
                None => break,
            }
        }
        // Keys taken out since are still in `order`: drop them once it is twice the bound.
        if self.order.len() > 2 * CACHED_RUNS {
            let runs = &self.runs;
            self.order.retain(|k| runs.contains_key(k));
        }
    }
}
