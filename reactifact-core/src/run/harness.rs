//! The produce test harness: one produce run against a given trigger, snapshot and
//! resources, with scripted answers to its recorded calls — no runtime, store or dispatcher.

use std::sync::Arc;
use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::model::action::PendingAction;
use crate::model::artifact::{self, Artifact, ArtifactId, Generation, Kind};
use crate::model::call::{RecordedCall, Usage};
use crate::model::event::EventKind;
use crate::model::patch::Op;
use crate::run::calls::{CallLog, Script, Source};
use crate::run::effects::Buffer;
use crate::run::generation::{check_outputs, start_run, Ended, Run, Slot};
use crate::run::join::Joins;
use crate::run::produce::{Agent, IntoProduce, Produce, RunFailure};
use crate::run::resources::Resources;
use crate::session::context::Context;
use crate::state::commit::Read;

/// Runs one produce once, for a unit test: against a snapshot you fill, on a trigger you
/// give, with resources and scripted answers to its recorded calls; returns what it recorded
/// ([`RunEffects`]: its operations and intents, its reads and calls) without a runtime, a store
/// or a dispatcher. Nothing is committed and nothing is delivered.
///
/// Recorded calls ([`ProduceCall::record`](crate::ProduceCall::record)) are answered from
/// [`answer`](ProduceTest::answer), in order per name; a call with no answer left fails with
/// [`CallError::Miss`](crate::CallError::Miss) ([`MissKind::NotScripted`](crate::MissKind::NotScripted))
/// — the closure is not called — unless [`call_through`](ProduceTest::call_through) is set.
/// [`ProduceCall::now`](crate::ProduceCall::now) reads the time set with
/// [`now`](ProduceTest::now) (the runtime's clock if none is), and
/// [`ProduceCall::rng`](crate::ProduceCall::rng) is seeded with [`seed`](ProduceTest::seed)
/// (0 by default).
///
/// ```
/// use reactifact_core::testing::ProduceTest;
/// use reactifact_core::{produce, Artifact, PendingAction, ProduceCall, ProduceError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Artifact)]
/// struct Ticket { text: String }
/// #[derive(Serialize, Deserialize, Artifact, Debug, PartialEq)]
/// struct Label { category: String }
///
/// #[produce(Label, also_creates = [PendingAction])]
/// async fn triage(call: ProduceCall<Ticket>) -> Result<(), ProduceError> {
///     let text = &call.trigger.data.text;
///     let category: String = call
///         .record("classify", text, || async { Err::<String, _>(std::io::Error::other("offline")) })
///         .await?;
///     call.effects.upsert(format!("label:{}", call.trigger.id), Label { category: category.clone() });
///     call.effects.act("email", format!("email:{}", call.trigger.id), &category);
///     Ok(())
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let effects = ProduceTest::new(triage)
///     .trigger("ticket:1", Ticket { text: "please refund me".into() })
///     .answer("classify", "billing")
///     .run()
///     .await
///     .unwrap();
/// assert_eq!(effects.get::<Label>("label:ticket:1"), Some(Label { category: "billing".into() }));
/// assert_eq!(effects.intent("email:ticket:1").unwrap().payload::<String>().unwrap(), "billing");
/// assert_eq!(effects.requests::<String>("classify"), vec!["please refund me".to_owned()]);
/// # });
/// ```
pub struct ProduceTest {
    produce: Produce,
    context: Context,
    trigger: Option<ArtifactId>,
    event: Option<EventKind>,
    resources: Resources,
    script: Script,
    generation: Generation,
}

impl ProduceTest {
    /// A test of `produce` (a `#[produce]` function or a [`Produce`]).
    pub fn new(produce: impl IntoProduce) -> Self {
        ProduceTest {
            produce: produce.into_produce(),
            context: Context::new("produce-test"),
            trigger: None,
            event: None,
            resources: Resources::new(),
            script: Script::default(),
            generation: Generation(1),
        }
    }

    /// Puts `value` at `id` in the snapshot the run reads (written in order: writing an id
    /// again makes a new version of it).
    ///
    /// # Panics
    /// If `value` does not encode, or `id` holds an artifact of another kind.
    pub fn with<T: Artifact>(mut self, id: impl Into<ArtifactId>, value: T) -> Self {
        let id = id.into();
        if let Err(e) = self.context.create(id.clone(), value) {
            panic!("ProduceTest: `{id}` cannot be written: {e}");
        }
        self
    }

    /// Puts `value` at `id` in the snapshot, and makes it the run's trigger.
    ///
    /// # Panics
    /// As [`with`](ProduceTest::with).
    pub fn trigger<T: Artifact>(mut self, id: impl Into<ArtifactId>, value: T) -> Self {
        let id = id.into();
        self = self.with(id.clone(), value);
        self.trigger = Some(id);
        self
    }

    /// The event the run receives ([`ProduceCall::event`](crate::ProduceCall::event)); by
    /// default `Created` for a trigger at version 1, `Updated` after it. For `Deleted`, the
    /// trigger is deleted from the snapshot before the run, as the runtime runs a deletion's
    /// produces on the last version against a snapshot where it is absent.
    pub fn event(mut self, event: EventKind) -> Self {
        self.event = Some(event);
        self
    }

    /// Provides a resource ([`ProduceCall::resource`](crate::ProduceCall::resource)).
    pub fn resource<R: Send + Sync + 'static>(mut self, resource: R) -> Self {
        self.resources.insert(resource);
        self
    }

    /// Scripts the answer to the next call named `name` that has none yet: calls of one name
    /// get their answers in the order scripted.
    ///
    /// # Panics
    /// If `answer` does not encode.
    pub fn answer<A: Serialize + ?Sized>(self, name: &str, answer: &A) -> Self {
        self.answer_metered(name, answer, Usage::ZERO)
    }

    /// Scripts an answer, like [`answer`](ProduceTest::answer), with the usage the call reports
    /// ([`RunEffects::usage`] sums it).
    ///
    /// # Panics
    /// If `answer` does not encode.
    pub fn answer_metered<A: Serialize + ?Sized>(mut self, name: &str, answer: &A, usage: Usage) -> Self {
        let bytes = match artifact::encode(answer) {
            Ok(bytes) => bytes,
            Err(e) => panic!("ProduceTest: the answer scripted for call `{name}` does not encode: {e}"),
        };
        self.script
            .answers
            .entry(Arc::from(name))
            .or_default()
            .push_back((bytes.into(), usage));
        self
    }

    /// Calls without a scripted answer call their closure (and are recorded), instead of
    /// failing as a miss.
    pub fn call_through(mut self) -> Self {
        self.script.call_through = true;
        self
    }

    /// What [`ProduceCall::now`](crate::ProduceCall::now) returns in the run.
    pub fn now(mut self, at: SystemTime) -> Self {
        self.script.now = Some(at);
        self
    }

    /// What [`ProduceCall::rng`](crate::ProduceCall::rng) is seeded with in the run.
    pub fn seed(mut self, seed: u64) -> Self {
        self.script.seed = seed;
        self
    }

    /// The generation the run is told it computes ([`ProduceCall::generation`](crate::ProduceCall::generation)); 1 by default.
    pub fn generation(mut self, generation: Generation) -> Self {
        self.generation = generation;
        self
    }

    /// Runs the produce once and returns what it recorded — if its condition holds for the
    /// trigger, as the runtime would (otherwise nothing runs: [`RunEffects::ran`] is false). A
    /// join produce gets the parts that share its trigger's key in the snapshot.
    ///
    /// # Errors
    /// The [`RunFailure`] the run ended with: the produce's error, a panic, an undeclared
    /// output, an effect that did not encode, a trigger that does not decode.
    ///
    /// # Panics
    /// If no trigger was given, if the produce's trigger type is not the trigger's kind, if it
    /// does not react to the event's kind ([`Produce::on`](crate::Produce::on)), or if it uses
    /// a resource the test does not provide: mistakes in the test itself.
    pub async fn run(mut self) -> Result<RunEffects, RunFailure> {
        let name = self.produce.name().to_owned();
        let Some(id) = self.trigger.take() else {
            panic!("ProduceTest of `{name}`: no trigger; give one with .trigger(id, value)");
        };
        if let Some(missing) = self.produce.missing_resource(&self.resources) {
            panic!(
                "ProduceTest of `{name}`: the produce uses resource `{missing}`, which the test does not provide; add it with .resource(..)"
            );
        }
        let stored = self
            .context
            .snapshot()
            .state
            .get(id.as_str())
            .cloned()
            .expect("the trigger was written");
        if stored.kind != self.produce.trigger() {
            panic!(
                "ProduceTest of `{name}`: the trigger `{id}` is a `{}`, and the produce reacts to `{}`",
                stored.kind,
                self.produce.trigger()
            );
        }
        let event = self.event.unwrap_or(EventKind::inferred(stored.version));
        if event == EventKind::Deleted {
            if let Err(e) = self.context.delete(id.clone()) {
                panic!("ProduceTest of `{name}`: the trigger `{id}` cannot be deleted: {e}");
            }
        }
        if !self.produce.reacts_to(event) {
            panic!(
                "ProduceTest of `{name}`: the produce does not react to {event:?} events; set the event it reacts to with .event(..)"
            );
        }
        let snapshot = self.context.snapshot();
        // The runtime runs the produce only where its condition holds (a condition that
        // panics fails the run).
        let applies = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.produce.applies(&snapshot, &stored)
        }));
        match applies {
            Ok(true) => {}
            Ok(false) => return Ok(RunEffects::default()),
            Err(panic) => {
                return Err(RunFailure::Panicked(format!(
                    "its condition panicked: {}",
                    crate::model::panic::panic_message(&panic)
                )))
            }
        }
        let joined = match self.produce.is_join() {
            false => None,
            true => {
                let agents = [Agent::new("produce-test").produce(self.produce.clone())];
                let mut joins = Joins::of(&agents);
                joins.sync(&self.context);
                match joins.parts(Slot { agent: 0, produce: 0 }, &stored, &snapshot) {
                    Some(parts) => Some(parts),
                    // The set is not complete: the runtime would not run the join.
                    None => return Ok(RunEffects::default()),
                }
            }
        };
        let buffer = Buffer::new(
            Some(CallLog::answering(
                self.produce.name_arc().clone(),
                Source::Script(Box::new(self.script)),
            )),
            self.produce.ops_hint(),
        );
        let run = Run {
            trigger: stored,
            event,
            joined,
            generation: self.generation,
            resources: self.resources,
            buffer,
        };
        let Ended {
            result: output, calls, ..
        } = start_run(&self.produce, run, &snapshot, None).await;
        let harvest = calls.harvest();
        let output = check_outputs(&self.produce, output)?;
        Ok(RunEffects {
            ran: true,
            ops: output.ops,
            reads: output.reads,
            usage: harvest.calls.iter().fold(Usage::ZERO, |sum, c| sum + c.usage),
            calls: harvest.calls,
            requests: harvest.requests,
        })
    }
}

impl std::fmt::Debug for ProduceTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProduceTest")
            .field("produce", &self.produce.name())
            .field("trigger", &self.trigger)
            .field("resources", &self.resources)
            .finish_non_exhaustive()
    }
}

/// What one run of [`ProduceTest`] recorded: its patch (operations in order), its reads and
/// its recorded calls — or nothing, when the produce's condition does not hold
/// ([`ran`](RunEffects::ran) is then false).
#[derive(Debug, Default)]
pub struct RunEffects {
    ran: bool,
    ops: Vec<Op>,
    reads: Vec<Read>,
    calls: Vec<RecordedCall>,
    usage: Usage,
    requests: Vec<(Arc<str>, Vec<u8>)>,
}

impl RunEffects {
    /// Whether the produce ran: false when its condition ([`Produce::when`](crate::Produce::when),
    /// `#[produce(.., when = ..)]`) does not hold for the trigger, or when it is a join whose set
    /// the snapshot does not complete, as the runtime would not run it then.
    pub fn ran(&self) -> bool {
        self.ran
    }

    /// The operations, in the order the produce recorded them.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// The value the run last wrote (create, upsert, create_once or update) at `id`, decoded as
    /// `T`; `None` if it wrote none there, or one of another kind.
    ///
    /// # Panics
    /// If the bytes written do not decode as `T` (its kind matched).
    pub fn get<T: Artifact>(&self, id: &str) -> Option<T> {
        self.ops.iter().rev().find_map(|op| match op {
            Op::Put {
                id: at, kind, bytes, ..
            } if at.as_str() == id && *kind == Kind::of::<T>() => Some(decode_written(at, bytes)),
            _ => None,
        })
    }

    /// Every value of type `T` the run wrote, with its id, in order.
    ///
    /// # Panics
    /// As [`get`](RunEffects::get).
    pub fn written<T: Artifact>(&self) -> Vec<(ArtifactId, T)> {
        self.ops
            .iter()
            .filter_map(|op| match op {
                Op::Put { id, kind, bytes, .. } if *kind == Kind::of::<T>() => {
                    Some((id.clone(), decode_written(id, bytes)))
                }
                _ => None,
            })
            .collect()
    }

    /// The intents the run recorded ([`Effects::act`](crate::Effects::act)), in order.
    pub fn intents(&self) -> Vec<PendingAction> {
        self.ops
            .iter()
            .filter_map(|op| match op {
                Op::Act { bytes, .. } => rmp_serde::from_slice(bytes).ok(),
                _ => None,
            })
            .collect()
    }

    /// The intent of idempotency key `key`, if the run recorded it.
    pub fn intent(&self, key: &str) -> Option<PendingAction> {
        self.intents().into_iter().find(|action| action.key == key)
    }

    /// The ids the run deleted, in order.
    pub fn deleted(&self) -> Vec<&ArtifactId> {
        self.ops
            .iter()
            .filter_map(|op| match op {
                Op::Delete { id } => Some(id),
                _ => None,
            })
            .collect()
    }

    /// What the run read through its snapshot, as its record would keep it.
    pub fn reads(&self) -> &[Read] {
        &self.reads
    }

    /// Its recorded calls, in the order asked for, as its record would keep them.
    pub fn calls(&self) -> &[RecordedCall] {
        &self.calls
    }

    /// The requests of the calls named `name`, decoded as `Q`, in the order asked for.
    ///
    /// # Panics
    /// If one does not decode as `Q`.
    pub fn requests<Q: DeserializeOwned>(&self, name: &str) -> Vec<Q> {
        self.requests
            .iter()
            .filter(|(n, _)| &**n == name)
            .map(|(_, bytes)| match rmp_serde::from_slice(bytes) {
                Ok(request) => request,
                Err(e) => panic!("a request of call `{name}` does not decode as the type asked for: {e}"),
            })
            .collect()
    }

    /// What its calls reported they used.
    pub fn usage(&self) -> Usage {
        self.usage
    }
}

fn decode_written<T: Artifact>(id: &ArtifactId, bytes: &[u8]) -> T {
    match rmp_serde::from_slice(bytes) {
        Ok(value) => value,
        Err(e) => panic!("`{id}` was written as a `{}` that does not decode: {e}", T::KIND),
    }
}
