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

use foldhash::HashMap;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::model::artifact::{self, ArtifactId, Generation, Version};
use crate::model::call::{CallOutcome, RecordedCall, Usage};
use crate::model::event::EventKind;
use crate::model::hash::{content_hash, ContentHash};
use crate::outbox::dispatcher::BoxError;
use crate::run::call_fn::CallFn;
use crate::run::effects::Buffer;
use crate::run::produce::ProduceCall;
use crate::store::answers::{AnswerStore, AnsweredRun};

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
    Miss(Box<ReplayMiss>),
    /// The turn's [`Budget::max_tokens`](crate::Budget::max_tokens) or
    /// [`Budget::max_cost`](crate::Budget::max_cost) is spent, so the call was not made. The
    /// run is not committed (whatever the produce does with this error): its event stays
    /// queued, the turn ends with
    /// [`TurnOutcome::TokensExhausted`](crate::TurnOutcome::TokensExhausted) or
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
    /// The answer could not be encoded, or not decoded back as the type asked for (rmp-serde),
    /// so it cannot be replayed; the call is recorded as unrecordable and a replay gets this
    /// error again. The message names the type, never the answer.
    #[error("call `{call}`: the answer cannot be recorded: {error}")]
    Answer {
        /// The call's name.
        call: String,
        /// What failed, naming the answer's type.
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

impl From<ReplayMiss> for CallError {
    fn from(miss: ReplayMiss) -> Self {
        CallError::Miss(Box::new(miss))
    }
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
    /// Which call of that name the replayed run was asking for, from 0, in the order it asked.
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
    /// The record has no call of that name with this request; `recorded` is the request of
    /// the first of its calls of that name the replay has not asked for.
    #[error("the request differs from the recorded one (recorded {}, replayed {})", recorded.short(), replayed.short())]
    RequestDiffers {
        /// The recorded request's hash.
        recorded: ContentHash,
        /// The replayed request's hash.
        replayed: ContentHash,
    },
    /// The recorded answer does not decode as the type the replayed run asked for.
    #[error("the recorded answer does not decode as `{type_name}`")]
    Undecodable {
        /// The type asked for.
        type_name: &'static str,
    },
    /// The record has the call and the replayed run never asked for it.
    #[error("the run recorded this call and the replay did not ask for it")]
    NotAsked,
    /// A test script ([`ProduceTest`](crate::testing::ProduceTest)) has no answer left for it.
    #[error("the test scripted no answer for it")]
    NotScripted,
}

/// Where a live run keeps the answers of the calls it makes, as they arrive, before its
/// generation commits: its session's store, and which run it is (see `store/answers.rs`).
pub(crate) struct Journal {
    pub(crate) store: AnswerStore,
    pub(crate) agent: Arc<str>,
    pub(crate) produce: Arc<str>,
    pub(crate) trigger: ArtifactId,
    pub(crate) run: AnsweredRun,
}

impl Journal {
    /// Keeps `call`'s answer. A store that fails to keep it is logged: the answer is still
    /// used, and a crash before the commit would ask for it again.
    async fn keep(&self, call: &RecordedCall) {
        let producer = AnswerStore::producer(&self.agent, &self.produce);
        if let Err(e) = self.store.keep(producer, &self.trigger, &self.run, call).await {
            tracing::warn!(
                error = %e,
                call = %call.name,
                agent = %self.agent,
                produce = %self.produce,
                trigger = %self.trigger,
                "the answer of a recorded call could not be kept before the commit; a crash before it asks again"
            );
        }
    }
}

/// Where the answers of a run's calls come from.
pub(crate) enum Source {
    /// A live run: the closure, unless `prior` — what an earlier attempt of the same run, in
    /// a generation that did not commit, recorded — answered the same request.
    Live { prior: Vec<RecordedCall> },
    /// A replay: the run's record only.
    Replay { recorded: Vec<RecordedCall> },
    /// A test script: answers by name, in order; the clock and the seed are fixed.
    Script(Box<Script>),
}

/// The answers scripted for one call name, in order: their encodings and usage.
pub(crate) type Scripted = VecDeque<(Arc<[u8]>, Usage)>;

/// What the produce test harness answers calls with.
#[derive(Clone, Default)]
pub(crate) struct Script {
    pub(crate) answers: HashMap<Arc<str>, Scripted>,
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
    /// The outcome of a turn that ends on it.
    pub(crate) fn outcome(self) -> crate::run::runtime::TurnOutcome {
        match self {
            Exhausted::Tokens => crate::run::runtime::TurnOutcome::TokensExhausted,
            Exhausted::Cost => crate::run::runtime::TurnOutcome::CostExhausted,
        }
    }

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
        if self
            .max_tokens
            .is_some_and(|max| self.tokens.load(Ordering::Relaxed) >= max)
        {
            Some(Exhausted::Tokens)
        } else if self
            .max_cost
            .is_some_and(|max| self.cost.load(Ordering::Relaxed) >= max)
        {
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

/// The calls of one produce run, kept in its effects [`Buffer`] beside its operations and
/// reads (boxed, and only once there is something to keep: a run that records no call costs
/// nothing for them).
pub(crate) struct CallLog {
    /// The produce's name, for the misses it reports (replays and scripts only).
    produce: Option<Arc<str>>,
    source: Source,
    /// The turn's budget, when it limits usage.
    meter: Option<Arc<Meter>>,
    /// Whether a spent budget refuses its metered calls (not for the batch's head events).
    refusable: bool,
    /// One slot per call asked for, in the order asked.
    asked: Vec<Slot>,
    /// Which recorded (or prior) calls were used, by position.
    used: Vec<bool>,
    /// What the calls made by this run used (reused answers use nothing).
    spent: Usage,
    /// What the metered calls made by this run used, by call name, in the order first made
    /// (reused answers are not in it): the usage metrics' source.
    metered: Vec<(Arc<str>, Usage)>,
    /// Closures called (the runtime's own calls, the clock and the seed, not counted).
    made: u64,
    /// Answers reused from an earlier attempt (the runtime's own calls not counted).
    reused: u64,
    miss: Option<Box<ReplayMiss>>,
    deferred: Option<Exhausted>,
    /// Requests as encoded, for the test harness.
    requests: Option<Vec<(Arc<str>, Vec<u8>)>>,
}

/// A call asked for: waiting for its closure (`metered` for
/// [`record_metered`](ProduceCall::record_metered)'s), or ended.
enum Slot {
    Waiting {
        name: Arc<str>,
        request: ContentHash,
        metered: bool,
    },
    Done(RecordedCall),
}

impl Slot {
    fn is(&self, name: &str, request: Option<&ContentHash>) -> bool {
        let (n, r) = match self {
            Slot::Waiting { name, request, .. } => (name, request),
            Slot::Done(call) => (&call.name, &call.request),
        };
        &**n == name && request.is_none_or(|request| r == request)
    }
}

/// What a run's calls came to, once it finished.
#[derive(Default)]
pub(crate) struct Harvest {
    /// Every call asked for, in order; one that never answered is `Abandoned`.
    pub(crate) calls: Vec<RecordedCall>,
    pub(crate) spent: Usage,
    /// What the metered calls made used, by call name (see [`Harvest::record_usage`]).
    pub(crate) metered: Vec<(Arc<str>, Usage)>,
    pub(crate) made: u64,
    pub(crate) reused: u64,
    pub(crate) miss: Option<ReplayMiss>,
    /// A call found the turn's budget spent and was not made.
    pub(crate) deferred: Option<Exhausted>,
    pub(crate) requests: Vec<(Arc<str>, Vec<u8>)>,
    /// The answers of an earlier attempt this one did not reuse (it failed or stopped before
    /// asking for them): kept with its calls if its events stay queued, never recorded.
    pub(crate) leftover: Vec<RecordedCall>,
}

impl Harvest {
    /// The calls of a run that did not start: only its earlier attempt's answers.
    pub(crate) fn not_started(prior: Vec<RecordedCall>) -> Harvest {
        Harvest {
            leftover: prior,
            ..Harvest::default()
        }
    }

    /// Records what the metered calls this run made used, as the usage metrics of the
    /// produce `agent`/`produce` (see `model/telemetry.rs`): tokens in, tokens out and cost
    /// per call name. Answers reused from an earlier attempt, or from the record, are not in
    /// it: only calls made. A live run's harvest is recorded once, where the runtime counts
    /// its usage in the turn's report.
    pub(crate) fn record_usage(&self, agent: &Arc<str>, produce: &Arc<str>) {
        for (name, usage) in &self.metered {
            crate::model::telemetry::record_call_usage(agent, produce, name, *usage);
        }
    }

    /// Whether there is anything to count, record or keep.
    pub(crate) fn is_empty(&self) -> bool {
        self.calls.is_empty()
            && self.leftover.is_empty()
            && self.made == 0
            && self.reused == 0
            && self.deferred.is_none()
    }
}

/// What asking for a call found.
enum Asked {
    /// Answered from the record (or a prior attempt, or the script): the bytes.
    Answered(Arc<[u8]>),
    /// Recorded as ended otherwise (replay): how.
    Ended(CallOutcome),
    /// To be made: the slot its outcome goes in.
    Make(usize),
    /// Refused.
    Refused(CallError),
}

impl CallLog {
    /// A live run's: answers reused from `prior` (an earlier, uncommitted attempt), calls
    /// counted against `meter` and, if `refusable`, refused once it is spent. `None` when
    /// there is neither prior nor meter: nothing to keep until a call.
    pub(crate) fn live(prior: Vec<RecordedCall>, meter: Option<Arc<Meter>>, refusable: bool) -> Option<Self> {
        match prior.is_empty() && meter.is_none() {
            true => None,
            false => {
                let mut log = Self::new(None, Source::Live { prior }, meter);
                log.refusable = refusable;
                Some(log)
            }
        }
    }

    /// A replay's or a script's, whose misses name `produce`.
    pub(crate) fn answering(produce: Arc<str>, source: Source) -> Self {
        Self::new(Some(produce), source, None)
    }

    fn new(produce: Option<Arc<str>>, source: Source, meter: Option<Arc<Meter>>) -> Self {
        let recorded = match &source {
            Source::Live { prior } => prior.len(),
            Source::Replay { recorded } => recorded.len(),
            Source::Script(_) => 0,
        };
        let requests = matches!(source, Source::Script(_)).then(Vec::new);
        CallLog {
            produce,
            source,
            meter,
            refusable: true,
            asked: Vec::new(),
            used: vec![false; recorded],
            spent: Usage::ZERO,
            metered: Vec::new(),
            made: 0,
            reused: 0,
            miss: None,
            deferred: None,
            requests,
        }
    }

    fn produce(&self) -> String {
        self.produce.as_deref().unwrap_or_default().to_owned()
    }

    fn replaying(&self) -> bool {
        matches!(self.source, Source::Replay { .. } | Source::Script(_))
    }

    /// Records a miss (the first is kept) and refuses the call with it.
    fn missed(&mut self, miss: ReplayMiss) -> Asked {
        self.miss.get_or_insert_with(|| Box::new(miss.clone()));
        Asked::Refused(miss.into())
    }

    /// Looks the call up. A call is matched with the record by its name and request: the
    /// `k`-th call a run asks for with one name and request is the `k`-th recorded with them,
    /// whatever order calls of other names or requests were asked or answered in (concurrent
    /// calls inside one produce answer in any order). `metered` calls are the ones a spent
    /// budget refuses.
    fn ask(&mut self, name: &str, request: ContentHash, request_bytes: &[u8], metered: bool) -> Asked {
        let name: Arc<str> = Arc::from(name);
        // Its position among the calls of its name, and among those of its name and request.
        let index = self.asked.iter().filter(|s| s.is(&name, None)).count();
        let occurrence = self.asked.iter().filter(|s| s.is(&name, Some(&request))).count();
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        if let Some(requests) = &mut self.requests {
            requests.push((name.clone(), request_bytes.to_vec()));
        }
        let produce = self.produce();
        let miss = |kind| ReplayMiss {
            produce: produce.clone(),
            call: name.to_string(),
            index,
            kind,
        };
        match &mut self.source {
            Source::Replay { recorded } => {
                let Some(at) = nth_matching(recorded, &name, &request, occurrence) else {
                    // Another request under that name, not yet asked for: the request changed.
                    let other = recorded
                        .iter()
                        .zip(&self.used)
                        .find(|(call, used)| !**used && call.name == name)
                        .map(|(call, _)| call.request);
                    let kind = match other {
                        Some(recorded) => MissKind::RequestDiffers {
                            recorded,
                            replayed: request,
                        },
                        None => MissKind::NotRecorded,
                    };
                    return self.missed(miss(kind));
                };
                self.used[at] = true;
                let call = recorded[at].clone();
                let asked = match &call.outcome {
                    CallOutcome::Answered { bytes, .. } => Asked::Answered(bytes.clone()),
                    other => Asked::Ended(other.clone()),
                };
                self.asked.push(Slot::Done(call));
                asked
            }
            Source::Live { prior } => {
                // The first answer to the same request not reused yet: a call that failed is
                // made again, and identical requests are interchangeable.
                let reuse = prior.iter().zip(&self.used).position(|(call, used)| {
                    !*used
                        && call.name == name
                        && call.request == request
                        && matches!(call.outcome, CallOutcome::Answered { .. })
                });
                if let Some(at) = reuse {
                    self.used[at] = true;
                    let call = prior[at].clone();
                    let bytes = call.answer_bytes().map(Arc::from).expect("an answered call");
                    self.asked.push(Slot::Done(call));
                    if !name.starts_with(RESERVED) {
                        self.reused += 1;
                    }
                    return Asked::Answered(bytes);
                }
                if metered && self.refusable {
                    if let Some(limit) = self.meter.as_ref().and_then(|m| m.exhausted()) {
                        self.deferred.get_or_insert(limit);
                        return Asked::Refused(CallError::BudgetExhausted {
                            call: name.to_string(),
                            limit: limit.limit(),
                        });
                    }
                }
                self.asked.push(Slot::Waiting { name, request, metered });
                Asked::Make(self.asked.len() - 1)
            }
            Source::Script(script) => {
                let scripted = script.answers.get_mut(&name).and_then(VecDeque::pop_front);
                let fixed = match (&*name, scripted) {
                    (_, Some(answer)) => Some(answer),
                    (NOW, None) => script
                        .now
                        .and_then(|t| artifact::encode(&t).ok())
                        .map(|b| (b.into(), Usage::ZERO)),
                    (RNG, None) => artifact::encode(&script.seed).ok().map(|b| (b.into(), Usage::ZERO)),
                    _ => None,
                };
                if let Some((bytes, usage)) = fixed {
                    self.asked.push(Slot::Done(RecordedCall {
                        name,
                        request,
                        outcome: CallOutcome::Answered {
                            hash: content_hash(&bytes),
                            bytes: bytes.clone(),
                        },
                        usage,
                        model: None,
                    }));
                    self.spent += usage;
                    return Asked::Answered(bytes);
                }
                if script.call_through || &*name == NOW {
                    self.asked.push(Slot::Waiting { name, request, metered });
                    return Asked::Make(self.asked.len() - 1);
                }
                self.missed(miss(MissKind::NotScripted))
            }
        }
    }

    /// Records how the call in `slot` ended.
    fn answer(&mut self, slot: usize, outcome: CallOutcome, usage: Usage, model: Option<Arc<str>>) {
        let Some(entry) = self.asked.get_mut(slot) else {
            return;
        };
        let Slot::Waiting { name, request, metered } = entry else {
            return;
        };
        if !name.starts_with(RESERVED) {
            self.made += 1;
        }
        if *metered {
            match self.metered.iter_mut().find(|(n, _)| n == name) {
                Some((_, used)) => *used += usage,
                None => self.metered.push((name.clone(), usage)),
            }
        }
        self.spent += usage;
        if let Some(meter) = &self.meter {
            meter.add(usage);
        }
        *entry = Slot::Done(RecordedCall {
            name: name.clone(),
            request: *request,
            outcome,
            usage,
            model,
        });
    }

    /// Records that the answer to the call of `name` asked for last does not decode as
    /// `type_name`: in a replay, a miss.
    fn undecodable(&mut self, name: &str, type_name: &'static str) -> CallError {
        if !self.replaying() {
            // A reused answer that no longer decodes (the type changed between two attempts
            // in one process): reported, not called again.
            return CallError::Answer {
                call: name.to_owned(),
                error: format!("the recorded answer does not decode as `{type_name}`"),
            };
        }
        let index = self.asked.iter().filter(|s| s.is(name, None)).count().saturating_sub(1);
        let miss = ReplayMiss {
            produce: self.produce(),
            call: name.to_owned(),
            index: u32::try_from(index).unwrap_or(u32::MAX),
            kind: MissKind::Undecodable { type_name },
        };
        self.miss.get_or_insert_with(|| Box::new(miss.clone()));
        miss.into()
    }

    /// What the run's calls came to.
    fn harvest(mut self) -> Harvest {
        // In a replay, a recorded call the run never asked for is a divergence too.
        if self.miss.is_none() {
            if let Source::Replay { recorded } = &self.source {
                if let Some(at) = self.used.iter().position(|used| !used) {
                    let call = &recorded[at];
                    let index = recorded[..at].iter().filter(|c| c.name == call.name).count();
                    self.miss = Some(Box::new(ReplayMiss {
                        produce: self.produce(),
                        call: call.name.to_string(),
                        index: u32::try_from(index).unwrap_or(u32::MAX),
                        kind: MissKind::NotAsked,
                    }));
                }
            }
        }
        let leftover = match self.source {
            Source::Live { prior } => prior
                .into_iter()
                .zip(&self.used)
                .filter(|(call, used)| !**used && matches!(call.outcome, CallOutcome::Answered { .. }))
                .map(|(call, _)| call)
                .collect(),
            _ => Vec::new(),
        };
        Harvest {
            leftover,
            calls: self
                .asked
                .into_iter()
                .map(|slot| match slot {
                    Slot::Done(call) => call,
                    Slot::Waiting { name, request, .. } => RecordedCall {
                        name,
                        request,
                        outcome: CallOutcome::Abandoned,
                        usage: Usage::ZERO,
                        model: None,
                    },
                })
                .collect(),
            spent: self.spent,
            metered: self.metered,
            made: self.made,
            reused: self.reused,
            miss: self.miss.map(|miss| *miss),
            deferred: self.deferred,
            requests: self.requests.unwrap_or_default(),
        }
    }
}

impl Buffer {
    /// Ends the run's calls (later ones are refused) and says what they came to.
    pub(crate) fn take_calls(&mut self) -> Harvest {
        self.take_call_log().harvest()
    }

    /// Ends the run's calls (later ones are refused) and takes their log, unread: `None` for
    /// a run that had nothing to keep and made no call.
    pub(crate) fn take_call_log(&mut self) -> TakenCalls {
        self.calls_taken = true;
        TakenCalls(self.calls.take())
    }
}

/// A finished run's calls, as [`Buffer::take_call_log`] took them (8 bytes: most runs make
/// none, and this is handed along with every run's result).
pub(crate) struct TakenCalls(Option<Box<CallLog>>);

impl TakenCalls {
    /// What they came to.
    pub(crate) fn harvest(self) -> Harvest {
        self.0.map(|log| log.harvest()).unwrap_or_default()
    }
}

/// The position in `calls` of the `n`-th call named `name` with `request`.
fn nth_matching(calls: &[RecordedCall], name: &str, request: &ContentHash, n: usize) -> Option<usize> {
    calls
        .iter()
        .enumerate()
        .filter(|(_, c)| &*c.name == name && c.request == *request)
        .nth(n)
        .map(|(at, _)| at)
}

/// Refuses the runtime's own names.
fn checked(name: &str) -> Result<(), CallError> {
    match name.starts_with(RESERVED) {
        true => Err(CallError::ReservedName { call: name.to_owned() }),
        false => Ok(()),
    }
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

/// The calls of one run, reached through its effects buffer.
struct RunCalls<'a>(&'a Mutex<Buffer>);

impl RunCalls<'_> {
    /// Where the run keeps its answers before the commit, if it does.
    fn journal(&self) -> Option<Arc<Journal>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).journal.clone()
    }

    /// Runs `f` on the run's call log (made on first use), unless the run has finished.
    fn with<R>(&self, name: &str, f: impl FnOnce(&mut CallLog) -> R) -> Result<R, CallError> {
        let mut buffer = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if buffer.is_sealed() || buffer.calls_taken {
            return Err(CallError::RunFinished { call: name.to_owned() });
        }
        let log = buffer
            .calls
            .get_or_insert_with(|| Box::new(CallLog::new(None, Source::Live { prior: Vec::new() }, None)));
        Ok(f(log))
    }

    /// One call, made or answered from the record. `request` is encoded before anything is
    /// awaited, so the future holds its hash and encoding, never the request.
    async fn call<A, E, F, Fut>(
        &self,
        name: &str,
        request: Result<(Vec<u8>, ContentHash), CallError>,
        metered: bool,
        model: Option<Arc<str>>,
        make: F,
    ) -> Result<A, CallError>
    where
        A: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(A, Usage), E>>,
    {
        let (request_bytes, request) = request?;
        let slot = match self.with(name, |log| log.ask(name, request, &request_bytes, metered))? {
            Asked::Answered(bytes) => {
                return match rmp_serde::from_slice(&bytes) {
                    Ok(answer) => Ok(answer),
                    Err(_) => Err(self.with(name, |log| log.undecodable(name, std::any::type_name::<A>()))?),
                };
            }
            Asked::Ended(outcome) => return ended(name, outcome).await,
            Asked::Refused(e) => return Err(e),
            Asked::Make(slot) => slot,
        };
        match make().await {
            Ok((answer, usage)) => match round_trip(&answer) {
                // The produce gets the answer as a replay will: decoded from what is recorded.
                Some((answer, bytes)) => {
                    let outcome = CallOutcome::Answered {
                        hash: content_hash(&bytes),
                        bytes: bytes.into(),
                    };
                    let journal = self.journal();
                    let kept = journal.as_ref().map(|_| RecordedCall {
                        name: Arc::from(name),
                        request,
                        outcome: outcome.clone(),
                        usage,
                        model: model.clone(),
                    });
                    let _ = self.with(name, |log| log.answer(slot, outcome, usage, model));
                    // Kept before the produce gets it: after a crash, the re-run reads it back.
                    if let (Some(journal), Some(call)) = (journal, kept) {
                        journal.keep(&call).await;
                    }
                    Ok(answer)
                }
                None => {
                    let error = format!(
                        "the answer does not round-trip through rmp-serde as `{}`",
                        std::any::type_name::<A>()
                    );
                    let outcome = CallOutcome::Unrecordable { error: error.clone() };
                    let _ = self.with(name, |log| log.answer(slot, outcome, usage, model));
                    Err(CallError::Answer {
                        call: name.to_owned(),
                        error,
                    })
                }
            },
            Err(e) => {
                let source: BoxError = e.into();
                let outcome = CallOutcome::Failed {
                    error: source.to_string(),
                };
                let _ = self.with(name, |log| log.answer(slot, outcome, Usage::ZERO, model));
                Err(CallError::Failed {
                    call: name.to_owned(),
                    source,
                })
            }
        }
    }

    /// A synchronous call of the runtime's own (the clock, a seed): never refused by the
    /// budget, never failing; a replay that misses it records the miss and gets a fresh value.
    fn own<A: Serialize + DeserializeOwned>(&self, name: &'static str, make: impl FnOnce() -> A) -> A {
        let (request_bytes, request) = request_of(name, &()).expect("() always encodes");
        match self.with(name, |log| log.ask(name, request, &request_bytes, false)) {
            Ok(Asked::Answered(bytes)) => match rmp_serde::from_slice(&bytes) {
                Ok(answer) => answer,
                Err(_) => {
                    let _ = self.with(name, |log| log.undecodable(name, std::any::type_name::<A>()));
                    make()
                }
            },
            Ok(Asked::Make(slot)) => {
                let answer = make();
                let outcome = match artifact::encode(&answer) {
                    Ok(bytes) => CallOutcome::Answered {
                        hash: content_hash(&bytes),
                        bytes: bytes.into(),
                    },
                    Err(_) => CallOutcome::Unrecordable {
                        error: format!("`{}` does not encode", std::any::type_name::<A>()),
                    },
                };
                let _ = self.with(name, |log| log.answer(slot, outcome, Usage::ZERO, None));
                answer
            }
            // A miss is recorded (the oracle reports it); the run goes on with a fresh value.
            Ok(Asked::Ended(_) | Asked::Refused(_)) | Err(_) => make(),
        }
    }
}

/// The answer encoded, and decoded back from that encoding; `None` if either fails.
fn round_trip<A: Serialize + DeserializeOwned>(answer: &A) -> Option<(A, Vec<u8>)> {
    let bytes = artifact::encode(answer).ok()?;
    let decoded = rmp_serde::from_slice(&bytes).ok()?;
    Some((decoded, bytes))
}

/// What a replayed call that did not answer gives back: the error it failed with, or — for a
/// call whose future the produce dropped before it answered — nothing, ever, so the produce
/// takes the other way it took (its timeout elapses again, its other branch wins).
async fn ended<A>(name: &str, outcome: CallOutcome) -> Result<A, CallError> {
    match outcome {
        CallOutcome::Failed { error } => Err(CallError::Failed {
            call: name.to_owned(),
            source: error.into(),
        }),
        CallOutcome::Unrecordable { error } => Err(CallError::Answer {
            call: name.to_owned(),
            error,
        }),
        CallOutcome::Abandoned => std::future::pending().await,
        // Not given here: an answered call is answered, not ended.
        CallOutcome::Answered { .. } => Err(CallError::Answer {
            call: name.to_owned(),
            error: "an answered call was replayed as ended".to_owned(),
        }),
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
    /// answer depends on (the prompt, the model, its settings), and nothing that changes from
    /// one attempt to the next (a `HashMap`, whose iteration order is random, encodes
    /// differently each time: use a `BTreeMap`). The `k`-th call a run asks for with one name
    /// and request is matched with the `k`-th recorded with them, so concurrent calls inside
    /// one produce match whatever order they answer in (identical requests are
    /// interchangeable: tell concurrent ones apart in the request if their answers must not be
    /// swapped in a replay). The request is encoded before the
    /// returned future is first polled; the future does not hold it.
    ///
    /// The produce gets the answer as a replay will: decoded from its recorded encoding
    /// (rmp-serde), so `A` must round-trip through serde. A failure of `call` is recorded as
    /// failed and returned ([`CallError::Failed`]); it is not reused: a retry calls again, and
    /// a replay gets the error back (its message: keep secrets out of your errors, as the
    /// message is kept in the log). A call whose future the produce drops before it answers
    /// (a timeout) is recorded as abandoned; in a replay it never answers, so the produce takes
    /// the same way again. Recorded answers are never logged. See `docs/agents.md`.
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
    /// The closure takes nothing, as above, or is handed the request once it is recorded, so
    /// that a `move` closure owns it ([`CallFn`](crate::runtime::CallFn)):
    /// `call.record("classify", request, move |request: Ask| async move { client.ask(&request).await })`.
    ///
    /// # Errors
    /// [`CallError::Failed`] when `call` fails; [`CallError::Miss`] in a replay
    /// that does not have the call; [`CallError::Request`] and [`CallError::Answer`] when the
    /// request or the answer does not encode; [`CallError::ReservedName`] for a name beginning
    /// with `reactifact.`; [`CallError::RunFinished`] after the run has finished.
    pub fn record<'a, Q, A, E, F, M>(
        &'a self,
        name: &'a str,
        request: Q,
        call: F,
    ) -> impl Future<Output = Result<A, CallError>> + 'a
    where
        Q: Serialize + 'a,
        A: Serialize + DeserializeOwned + 'a,
        E: Into<BoxError> + 'a,
        M: 'a,
        F: CallFn<Q, M> + 'a,
        F::Future: Future<Output = Result<A, E>> + 'a,
    {
        let encoded = checked(name).and_then(|()| request_of(name, &request));
        let call = call.bind(request);
        let make = move || async move { call().await.map(|answer| (answer, Usage::ZERO)) };
        // It reports no usage, so no budget refuses it.
        async move { RunCalls(&self.buffer).call(name, encoded, false, None, make).await }
    }

    /// A recorded call, like [`record`](ProduceCall::record), whose closure also reports what it
    /// used: tokens in and out, and a cost ([`Usage`]). The usage is recorded with the answer,
    /// counted against the turn's [`Budget::max_tokens`](crate::Budget::max_tokens) and
    /// [`Budget::max_cost`](crate::Budget::max_cost) and summed in
    /// [`TurnReport::usage`](crate::TurnReport::usage) — when the call is made; an answer a
    /// retry or a replay gets back from the record costs nothing.
    ///
    /// # Errors
    /// As [`record`](ProduceCall::record), and [`CallError::BudgetExhausted`] when the turn's
    /// token or cost budget is spent (the call is not made).
    pub fn record_metered<'a, Q, A, E, F, M>(
        &'a self,
        name: &'a str,
        request: Q,
        call: F,
    ) -> impl Future<Output = Result<A, CallError>> + 'a
    where
        Q: Serialize + 'a,
        A: Serialize + DeserializeOwned + 'a,
        E: Into<BoxError> + 'a,
        M: 'a,
        F: CallFn<Q, M> + 'a,
        F::Future: Future<Output = Result<(A, Usage), E>> + 'a,
    {
        let encoded = checked(name).and_then(|()| request_of(name, &request));
        let make = call.bind(request);
        async move { RunCalls(&self.buffer).call(name, encoded, true, None, make).await }
    }

    /// A call to a model: a metered call, like [`record_metered`](ProduceCall::record_metered),
    /// that also keeps the name of the model asked with the call
    /// ([`RecordedCall::model`](crate::runtime::RecordedCall::model)), so that the run's
    /// provenance (`reactifact why`) names it beside the call's tokens. The model's name is
    /// not part of what identifies the call: put it in `request` too, so that asking another
    /// model is another call.
    ///
    /// # Errors
    /// As [`record_metered`](ProduceCall::record_metered).
    pub fn record_model<'a, Q, A, E, F, M>(
        &'a self,
        name: &'a str,
        model: &str,
        request: Q,
        call: F,
    ) -> impl Future<Output = Result<A, CallError>> + 'a
    where
        Q: Serialize + 'a,
        A: Serialize + DeserializeOwned + 'a,
        E: Into<BoxError> + 'a,
        M: 'a,
        F: CallFn<Q, M> + 'a,
        F::Future: Future<Output = Result<(A, Usage), E>> + 'a,
    {
        let encoded = checked(name).and_then(|()| request_of(name, &request));
        let make = call.bind(request);
        let model = Some(Arc::from(model));
        async move { RunCalls(&self.buffer).call(name, encoded, true, model, make).await }
    }

    /// The time now, as a recorded call (`reactifact.now`): a retry and a replay of this run
    /// read the same time, so the replay oracle reports no divergence for a produce that reads
    /// the clock through it. It is the runtime's clock, which follows tokio's paused clock in
    /// tests. Each call is a call of its own (the second reads the clock again).
    ///
    /// A replay whose record lacks the reading gets the clock's time and reports the miss.
    pub fn now(&self) -> SystemTime {
        RunCalls(&self.buffer).own(NOW, crate::model::time::now)
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
        fastrand::Rng::with_seed(RunCalls(&self.buffer).own(RNG, || fastrand::u64(..)))
    }
}

/// Which run an earlier attempt's answers belong to: the produce (by slot) and the trigger
/// version it ran on (with the generation that wrote it: an id created again starts at
/// version 1 again), with its event kind.
pub(crate) type RunKey = (usize, usize, ArtifactId, Generation, Version, ContentHash, EventKind);

/// The answers of runs whose generation did not commit, for their next attempt; bounded, the
/// oldest runs forgotten first. A durable context's runs also keep each answer in the store as
/// it arrives ([`Journal`]), and a runtime's first generation loads them back here, so a
/// process that dies before a commit does not call again after a restart.
#[derive(Default)]
pub(crate) struct CallCache {
    /// Per run, its calls, their answers' size and when they were kept.
    runs: HashMap<RunKey, (Vec<RecordedCall>, usize, u64)>,
    /// The runs in the order they were kept, with when: an entry whose run was taken out (or
    /// kept again since) is stale and skipped.
    order: VecDeque<(RunKey, u64)>,
    /// The answers' bytes kept, in all.
    bytes: usize,
    /// How many times a run was kept.
    stamp: u64,
}

/// How many runs' answers the cache keeps, at most.
const CACHED_RUNS: usize = 4096;
/// How many bytes of answers the cache keeps, at most.
const CACHED_BYTES: usize = 64 << 20;

impl CallCache {
    /// Whether no run's answers are kept.
    pub(crate) fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The calls kept for `key`, taken out.
    pub(crate) fn take(&mut self, key: &RunKey) -> Vec<RecordedCall> {
        match self.runs.remove(key) {
            Some((calls, bytes, _)) => {
                self.bytes -= bytes;
                calls
            }
            None => Vec::new(),
        }
    }

    /// Keeps the calls of a run whose events stay queued, for its next attempt: all of them,
    /// in place (only the answered ones are reused), when one answered.
    pub(crate) fn keep(&mut self, key: RunKey, calls: Vec<RecordedCall>) {
        if !calls.iter().any(|c| matches!(c.outcome, CallOutcome::Answered { .. })) {
            return;
        }
        let bytes = calls
            .iter()
            .map(|c| c.answer_bytes().map_or(0, <[u8]>::len))
            .sum::<usize>();
        self.stamp += 1;
        if let Some((_, old, _)) = self.runs.insert(key.clone(), (calls, bytes, self.stamp)) {
            self.bytes -= old;
        }
        self.order.push_back((key, self.stamp));
        self.bytes += bytes;
        while self.runs.len() > CACHED_RUNS || self.bytes > CACHED_BYTES {
            let Some((old, stamp)) = self.order.pop_front() else {
                break;
            };
            // Only the entry kept at that stamp: a run kept again since is newer than that.
            if self.runs.get(&old).is_some_and(|(_, _, kept)| *kept == stamp) {
                if let Some((_, bytes, _)) = self.runs.remove(&old) {
                    self.bytes -= bytes;
                }
            }
        }
        // Stale positions (runs taken out or kept again since) pile up in `order`: drop them
        // once it is twice the bound.
        if self.order.len() > 2 * CACHED_RUNS {
            let runs = &self.runs;
            self.order
                .retain(|(k, stamp)| runs.get(k).is_some_and(|(_, _, kept)| kept == stamp));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::telemetry::metric;

    fn key(n: usize) -> RunKey {
        (
            0,
            0,
            ArtifactId::from(format!("ticket:{n}")),
            Generation(1),
            Version(1),
            content_hash(b"t"),
            EventKind::Created,
        )
    }

    fn answered() -> Vec<RecordedCall> {
        let bytes: Arc<[u8]> = Arc::from(&b"\xa2ok"[..]);
        vec![RecordedCall {
            name: Arc::from("llm"),
            request: content_hash(b"q"),
            outcome: CallOutcome::Answered {
                hash: content_hash(&bytes),
                bytes,
            },
            usage: Usage::ZERO,
            model: None,
        }]
    }

    #[test]
    fn the_cache_forgets_the_oldest_run_not_one_kept_again() {
        let mut cache = CallCache::default();
        // A is kept, taken by its next attempt, then B, then A again: A is now the newer.
        cache.keep(key(0), answered());
        assert_eq!(cache.take(&key(0)).len(), 1);
        cache.keep(key(1), answered());
        cache.keep(key(0), answered());
        for n in 2..=CACHED_RUNS {
            cache.keep(key(n), answered());
        }
        assert_eq!(cache.runs.len(), CACHED_RUNS);
        assert!(cache.runs.contains_key(&key(0)), "the run kept again stays");
        assert!(!cache.runs.contains_key(&key(1)), "the oldest is forgotten");
        assert!(cache.take(&key(1)).is_empty());
    }

    /// An answer to `request` for [`CallLog::answer`].
    fn answer_to(request: &[u8]) -> CallOutcome {
        let bytes: Arc<[u8]> = Arc::from(request);
        CallOutcome::Answered {
            hash: content_hash(&bytes),
            bytes,
        }
    }

    /// Asks for a call that is to be made, and answers it with `usage`.
    fn made(log: &mut CallLog, name: &str, request: &[u8], metered: bool, usage: Usage) {
        match log.ask(name, content_hash(request), request, metered) {
            Asked::Make(slot) => log.answer(slot, answer_to(request), usage, None),
            _ => panic!("`{name}` is to be made"),
        }
    }

    #[test]
    fn only_the_metered_calls_made_count_in_the_usage_metrics() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};

        // An earlier attempt of the run answered `llm` q1; this one reuses that answer, makes
        // `llm` q2 and q3 and `embed` q4 (metered), and an unmetered `http` call.
        let prior = vec![RecordedCall {
            name: Arc::from("llm"),
            request: content_hash(b"q1"),
            outcome: answer_to(b"q1"),
            usage: Usage::tokens(1_000, 100).with_cost(50),
            model: None,
        }];
        let mut log = CallLog::live(prior, None, true).expect("a log with a prior answer");
        assert!(matches!(
            log.ask("llm", content_hash(b"q1"), b"q1", true),
            Asked::Answered(_)
        ));
        made(&mut log, "llm", b"q2", true, Usage::tokens(120, 30).with_cost(7));
        made(&mut log, "embed", b"q4", true, Usage::tokens(500, 0).with_cost(1));
        made(&mut log, "llm", b"q3", true, Usage::tokens(80, 20).with_cost(3));
        made(&mut log, "http", b"q5", false, Usage::ZERO);
        // A metered call that failed reported nothing: it counts nothing, and its series exist.
        match log.ask("rerank", content_hash(b"q6"), b"q6", true) {
            Asked::Make(slot) => log.answer(
                slot,
                CallOutcome::Failed {
                    error: "503".to_owned(),
                },
                Usage::ZERO,
                None,
            ),
            _ => panic!("`rerank` is to be made"),
        }
        let harvest = log.harvest();
        assert_eq!((harvest.made, harvest.reused), (5, 1));

        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            harvest.record_usage(&Arc::from("support"), &Arc::from("classify"));
        });
        let mut seen = std::collections::BTreeMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            let DebugValue::Counter(n) = value else {
                panic!("{} is a counter", key.name());
            };
            seen.insert(format!("{}{{{}}}", key.name(), labels.join(",")), n);
        }
        let series = |metric: &str, model: &str| format!("{metric}{{agent=support,produce=classify,model={model}}}");
        let expected: std::collections::BTreeMap<String, u64> = [
            (series(metric::CALL_TOKENS_IN, "llm"), 200),
            (series(metric::CALL_TOKENS_OUT, "llm"), 50),
            (series(metric::CALL_COST, "llm"), 10),
            (series(metric::CALL_TOKENS_IN, "embed"), 500),
            (series(metric::CALL_TOKENS_OUT, "embed"), 0),
            (series(metric::CALL_COST, "embed"), 1),
            (series(metric::CALL_TOKENS_IN, "rerank"), 0),
            (series(metric::CALL_TOKENS_OUT, "rerank"), 0),
            (series(metric::CALL_COST, "rerank"), 0),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            seen, expected,
            "the calls made, by name: not the reused answer, not the unmetered call"
        );
    }

    #[test]
    fn the_cache_is_bounded_by_bytes() {
        let mut cache = CallCache::default();
        let big: Arc<[u8]> = vec![0u8; 40 << 20].into();
        let call = |bytes: &Arc<[u8]>| {
            vec![RecordedCall {
                name: Arc::from("llm"),
                request: content_hash(b"q"),
                outcome: CallOutcome::Answered {
                    hash: content_hash(bytes),
                    bytes: bytes.clone(),
                },
                usage: Usage::ZERO,
                model: None,
            }]
        };
        cache.keep(key(0), call(&big));
        cache.keep(key(1), call(&big));
        assert!(cache.bytes <= CACHED_BYTES);
        assert!(!cache.runs.contains_key(&key(0)) && cache.runs.contains_key(&key(1)));
    }
}
