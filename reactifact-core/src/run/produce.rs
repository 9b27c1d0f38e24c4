//! Produces (reactions to one artifact type) and the agents that group them.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::model::artifact::{Artifact, ArtifactId, ArtifactType, Generation, Kind, ReadError, Record, Stored};
use crate::model::event::{EventKind, EventKinds};
use crate::model::patch::EffectError;
use crate::outbox::dispatcher::BoxError;
use crate::run::effects::{Buffer, Dynamic, Effects};
use crate::run::join::{JoinSpec, Parts};
use crate::run::resources::{DeclaredResource, ResourceType, Resources};
use crate::state::commit::CommitError;
use crate::state::snapshot::Snapshot;

/// The error a produce returns. Converts from any `std::error::Error` with `?`, or build one
/// with [`ProduceError::msg`].
pub struct ProduceError(BoxError);

impl ProduceError {
    /// An error with a plain message.
    pub fn msg(message: impl fmt::Display) -> Self {
        ProduceError(message.to_string().into())
    }

    /// The underlying error.
    pub fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// Unwraps the underlying error.
    pub fn into_inner(self) -> BoxError {
        self.0
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for ProduceError {
    fn from(e: E) -> Self {
        ProduceError(Box::new(e))
    }
}

impl fmt::Debug for ProduceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for ProduceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Why one produce run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunFailure {
    /// The produce returned an error.
    #[error("{0}")]
    Returned(ProduceError),
    /// The trigger artifact could not be read as the produce's input type.
    #[error(transparent)]
    Trigger(#[from] ReadError),
    /// An effect could not be recorded.
    #[error(transparent)]
    Effect(#[from] EffectError),
    /// The produce wrote a type it did not declare.
    #[error("wrote `{id}` of kind `{kind}`, which the produce does not declare; add it to `#[produce(.., also_creates = [..])]` or to the produce's outputs")]
    UndeclaredOutput {
        /// The id written.
        id: ArtifactId,
        /// The undeclared kind.
        kind: Kind,
    },
    /// Its patch does not apply to the state.
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// The produce panicked.
    #[error("panicked: {0}")]
    Panicked(String),
}

/// A produce run that failed, with where it ran.
#[derive(Debug, thiserror::Error)]
#[error("produce `{produce}` (agent `{agent}`) on `{trigger}` failed: {failure}")]
pub struct ProduceFailure {
    /// The agent the produce belongs to.
    pub agent: String,
    /// The produce's name.
    pub produce: String,
    /// The artifact that triggered the run.
    pub trigger: ArtifactId,
    /// What went wrong.
    #[source]
    pub failure: RunFailure,
}

/// What a produce receives: its trigger, the snapshot it reads and the effects it writes to;
/// for a join (see [`Produce::join`]), the parts it joins, through
/// [`joined`](ProduceCall::joined) and [`joined_all`](ProduceCall::joined_all).
///
/// `T` is the trigger type; `D` names the produce's declared outputs (see
/// [`DeclaredOutput`](crate::DeclaredOutput)); the `#[produce]` macro fills it in.
#[non_exhaustive]
pub struct ProduceCall<T, D = Dynamic> {
    /// The artifact whose event triggered the run, as it is in the snapshot; for a deletion
    /// ([`EventKind::Deleted`]), the last version before it was deleted (the snapshot no
    /// longer holds it).
    pub trigger: Record<T>,
    /// What happened to it: `Created` or `Updated` by default; `Deleted` for a produce that
    /// reacts to deletions (see [`Produce::on`]); `Stale` for a staleness rerun (see
    /// [`Produce::stale`]).
    pub event: EventKind,
    /// The state before this generation; every produce of the generation reads the same one.
    /// Reads through it are recorded as the run's provenance (see [`Snapshot`]).
    pub snapshot: Snapshot,
    /// Where the produce records what should change.
    pub effects: Effects<D>,
    /// The generation being computed.
    pub generation: Generation,
    /// For a join run, the parts it joins (see [`ProduceCall::joined`]).
    pub(crate) joined: Option<Parts>,
    /// The runtime's resources.
    pub(crate) resources: Resources,
    /// The run's buffer, where its recorded calls are kept.
    pub(crate) buffer: Arc<Mutex<Buffer>>,
}

impl<T, D> ProduceCall<T, D> {
    /// The resource of type `R` registered on the runtime
    /// ([`RuntimeBuilder::resource`](crate::RuntimeBuilder::resource)): a model client, its
    /// configuration, reference data. The produce declares it
    /// (`#[produce(.., uses = [R])]`, or [`Produce::uses`] for one built by hand), and the
    /// runtime's builder refuses a produce whose resource nobody registered, so for a
    /// declared resource this never fails.
    ///
    /// # Panics
    /// If no `R` was registered — possible only for a produce built with [`Produce::new`] that
    /// did not declare `R` with [`Produce::uses`]; the run then fails with the panic's message,
    /// which names the type. [`try_resource`](ProduceCall::try_resource) does not panic.
    pub fn resource<R: DeclaredResource<D>>(&self) -> &R {
        match self.resources.get::<R>() {
            Some(resource) => resource,
            None => panic!(
                "no resource of type `{}` is registered; register it with RuntimeBuilder::resource and declare it on the produce (`uses = [..]`)",
                std::any::type_name::<R>()
            ),
        }
    }

    /// The resource of type `R`, or `None` if none was registered.
    pub fn try_resource<R: DeclaredResource<D>>(&self) -> Option<&R> {
        self.resources.get::<R>()
    }
}

/// Turns what a produce function returns into the runtime's result: `()` or any
/// `Result<(), E>` with `E: Into<ProduceError>`.
#[diagnostic::on_unimplemented(
    message = "a produce must return `()` or `Result<(), E>` where `E` converts into `ProduceError`, not `{Self}`",
    label = "this produce returns `{Self}`",
    note = "`ProduceError` converts from any `std::error::Error + Send + Sync + 'static`; for a plain message use `ProduceError::msg(..)`"
)]
pub trait IntoProduceResult {
    /// The conversion.
    fn into_produce_result(self) -> Result<(), ProduceError>;
}

impl IntoProduceResult for () {
    fn into_produce_result(self) -> Result<(), ProduceError> {
        Ok(())
    }
}

impl<E: Into<ProduceError>> IntoProduceResult for Result<(), E> {
    fn into_produce_result(self) -> Result<(), ProduceError> {
        self.map_err(Into::into)
    }
}

/// A place for one run of a produce at a time ([`Produce::start`]): the run is written into
/// it, polling it runs the run, and it is empty again once the run ended (the produce's future
/// is dropped then, not when the slot is). A generation keeps the slot of a run that ended at
/// its first poll for its produce's next run, so such runs box nothing.
pub(crate) type RunSlot = Pin<Box<dyn RunCell>>;

/// A [`RunSlot`]'s contents: polled, it yields how its run ended.
pub(crate) trait RunCell: Future<Output = Result<(), RunFailure>> + Send {
    /// Starts a run in the slot, in place of the ended one (if any).
    fn start(self: Pin<&mut Self>, input: RunInput);

    /// The [`Produce::id`] of the produce whose runs it holds.
    fn produce(&self) -> u64;
}

pin_project_lite::pin_project! {
    /// A [`RunCell`] for the runs `build` makes (the closure over one produce's function that
    /// [`Produce::declared`] makes, so that `F` is its runs' own future type).
    struct RunCellOf<B, F> {
        produce: u64,
        build: B,
        #[pin]
        run: Option<F>,
    }
}

impl<B, F: Future<Output = Result<(), RunFailure>>> Future for RunCellOf<B, F> {
    type Output = Result<(), RunFailure>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let mut run = self.project().run;
        let running = run
            .as_mut()
            .as_pin_mut()
            .expect("a run slot is polled only between its start and the run's end");
        let ended = std::task::ready!(running.poll(cx));
        run.set(None);
        std::task::Poll::Ready(ended)
    }
}

impl<B, F> RunCell for RunCellOf<B, F>
where
    B: Fn(RunInput) -> F + Send,
    F: Future<Output = Result<(), RunFailure>> + Send,
{
    fn start(self: Pin<&mut Self>, input: RunInput) {
        let mut this = self.project();
        let run = (this.build)(input);
        this.run.set(Some(run));
    }

    fn produce(&self) -> u64 {
        self.produce
    }
}

/// Everything the runtime hands to one run.
pub(crate) struct RunInput {
    pub(crate) trigger: Arc<Stored>,
    pub(crate) event: EventKind,
    pub(crate) snapshot: Snapshot,
    pub(crate) buffer: Arc<Mutex<Buffer>>,
    pub(crate) generation: Generation,
    /// For a join run, the parts it was matched with.
    pub(crate) joined: Option<Parts>,
    pub(crate) resources: Resources,
}

/// Makes an empty [`RunSlot`] for the produce's runs.
type Handler = dyn Fn() -> RunSlot + Send + Sync;
type Condition = dyn Fn(&Snapshot, &Stored) -> bool + Send + Sync;

/// A produce: an async function that reacts to one artifact type and writes only through
/// its [`Effects`].
///
/// Build one with the `#[produce]` macro, or by hand with [`Produce::new`] and declare its
/// outputs with [`creates`](Produce::creates); the runtime checks every patch against them.
///
/// ```
/// use reactifact_core::{Artifact, PendingAction, Produce, ProduceCall, ProduceError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)] struct Order { total_cents: u64 }
/// impl Artifact for Order { const KIND: &'static str = "order"; }
/// #[derive(Serialize, Deserialize)] struct Receipt { order: String }
/// impl Artifact for Receipt { const KIND: &'static str = "receipt"; }
///
/// let produce = Produce::new("process_order", |call: ProduceCall<Order>| async move {
///     let id = call.trigger.id.to_string();
///     call.effects.upsert(format!("receipt:{id}"), Receipt { order: id.clone() });
///     call.effects.act("notify", format!("notify:{id}"), &call.trigger.data.total_cents);
///     Ok::<(), ProduceError>(())
/// })
/// .creates::<Receipt>()
/// .creates::<PendingAction>();
/// assert_eq!(produce.outputs().len(), 2);
/// ```
#[derive(Clone)]
pub struct Produce {
    pub(crate) name: Arc<str>,
    pub(crate) trigger: ArtifactType,
    outputs: Vec<Kind>,
    /// The Rust types behind `outputs` (a kind may be claimed by more than one: the runtime's
    /// builder refuses that).
    output_types: Vec<ArtifactType>,
    condition: Option<Arc<Condition>>,
    /// The event kinds it reacts to.
    events: EventKinds,
    /// At most one run per trigger per generation.
    debounce: bool,
    /// The join it declares, if any (see [`Produce::join`]).
    pub(crate) join: JoinSpec,
    /// The resources it declares it uses.
    uses: Vec<ResourceType>,
    handler: Arc<Handler>,
    /// Tells its run slots from other produces' (clones share it, and their function).
    id: u64,
    /// How many operations its last run recorded: the next run's buffer is made with room for
    /// as many, so a produce that writes the same number each time grows and trims nothing.
    ops_hint: Arc<AtomicU32>,
}

/// One run of `f` on `input`: the trigger decoded, the call built and `f`'s future started
/// (a trigger that does not decode fails the run without calling `f`).
fn run_of<T, D, F, Fut>(f: &F, input: RunInput) -> impl Future<Output = Result<(), RunFailure>> + Send + 'static
where
    T: Artifact,
    D: 'static,
    F: Fn(ProduceCall<T, D>) -> Fut,
    Fut: Future + Send + 'static,
    Fut::Output: IntoProduceResult,
{
    let started = match input.trigger.decode::<T>() {
        Err(e) => Err(RunFailure::Trigger(e)),
        Ok(trigger) => {
            // The produce's snapshot records its reads; the one behind `effects` does not (its
            // existence check for `act` is the runtime's, not the produce's).
            let buffer = input.buffer.clone();
            let call = ProduceCall {
                trigger,
                event: input.event,
                snapshot: input.snapshot.tracked(input.buffer.clone()),
                effects: Effects::new(input.buffer, input.snapshot),
                generation: input.generation,
                joined: input.joined,
                resources: input.resources,
                buffer,
            };
            // A join run read its parts: they are its provenance, whether it reads them again
            // or not.
            for part in call.joined.iter().flat_map(|parts| parts.iter()) {
                call.snapshot.meta(part.id.as_str());
            }
            Ok(f(call))
        }
    };
    async move {
        match started {
            Ok(run) => run.await.into_produce_result().map_err(RunFailure::Returned),
            Err(failure) => Err(failure),
        }
    }
}

impl Produce {
    /// A produce reacting to `T`, whose outputs are checked at run time. Declare them with
    /// [`creates`](Produce::creates).
    pub fn new<T, F, Fut>(name: impl Into<Arc<str>>, f: F) -> Self
    where
        T: Artifact,
        F: Fn(ProduceCall<T>) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: IntoProduceResult,
    {
        Self::declared::<T, Dynamic, F, Fut>(name, f)
    }

    /// A produce whose effects are typed by the declarations `D`; declare its outputs with
    /// [`creates`](Produce::creates). This is what `#[produce]` expands to; prefer the macro.
    pub fn declared<T, D, F, Fut>(name: impl Into<Arc<str>>, f: F) -> Self
    where
        T: Artifact,
        D: 'static,
        F: Fn(ProduceCall<T, D>) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: IntoProduceResult,
    {
        let f = Arc::new(f);
        let id = {
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            NEXT.fetch_add(1, Ordering::Relaxed)
        };
        let handler = move || -> RunSlot {
            let f = f.clone();
            Box::pin(RunCellOf {
                produce: id,
                build: move |input: RunInput| run_of::<T, D, F, Fut>(&f, input),
                run: None,
            })
        };
        Produce {
            name: name.into(),
            trigger: ArtifactType::of::<T>(),
            outputs: Vec::new(),
            output_types: Vec::new(),
            condition: None,
            events: EventKinds::DEFAULT,
            debounce: false,
            join: JoinSpec::default(),
            uses: Vec::new(),
            handler: Arc::new(handler),
            id,
            ops_hint: Arc::default(),
        }
    }

    /// Declares `O` as an output: the produce may create, upsert or create_once it (and act,
    /// for [`PendingAction`](crate::PendingAction)).
    pub fn creates<O: Artifact>(mut self) -> Self {
        let output = ArtifactType::of::<O>();
        if !self.outputs.contains(&output.kind) {
            self.outputs.push(output.kind);
        }
        if !self.output_types.iter().any(|t| t.type_id == output.type_id) {
            self.output_types.push(output);
        }
        self
    }

    /// Declares that the produce uses the resource `R` ([`ProduceCall::resource`]): the
    /// runtime's builder refuses it unless an `R` is registered
    /// ([`BuildError::MissingResource`](crate::BuildError::MissingResource)), naming the
    /// produce and the type. `#[produce(.., uses = [R])]` expands to it.
    pub fn uses<R: Send + Sync + 'static>(mut self) -> Self {
        let ty = ResourceType::of::<R>();
        if !self.uses.iter().any(|u| u.type_id == ty.type_id) {
            self.uses.push(ty);
        }
        self
    }

    /// The type names of the resources it declares it uses, in declaration order.
    pub fn resources(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.uses.iter().map(|u| u.name)
    }

    /// The type name of the first resource the produce uses that `resources` lacks.
    pub(crate) fn missing_resource(&self, resources: &Resources) -> Option<&'static str> {
        self.uses
            .iter()
            .find(|ty| !resources.contains_type(ty))
            .map(|ty| ty.name)
    }

    /// Runs the produce only when `condition` holds for the trigger, evaluated against the
    /// state when the generation's work is matched. A trigger that does not decode as `T`
    /// counts as holding, so the run reports the decode error.
    ///
    /// # Panics
    /// If `T` is not the produce's trigger type: the condition could never be evaluated.
    pub fn when<T, C>(mut self, condition: C) -> Self
    where
        T: Artifact,
        C: Fn(&Snapshot, &Record<T>) -> bool + Send + Sync + 'static,
    {
        assert_eq!(
            std::any::TypeId::of::<T>(),
            self.trigger.type_id,
            "the condition of produce `{}` must take its trigger type",
            self.name
        );
        self.condition = Some(Arc::new(move |snapshot: &Snapshot, stored: &Stored| {
            stored.decode::<T>().map_or(true, |record| condition(snapshot, &record))
        }));
        self
    }

    /// Sets the kinds of event the produce reacts to, replacing the default (`Created` and
    /// `Updated`); `#[produce(.., on = [created, updated, deleted])]` expands to it.
    ///
    /// A produce that reacts to [`EventKind::Deleted`] runs on the deletion of an artifact of
    /// its trigger type with the last version before the deletion as its trigger
    /// (`ProduceCall::trigger`, with `ProduceCall::event == Deleted`), against the snapshot
    /// before the generation, where the artifact is absent. A deletion matches while the
    /// artifact is still absent: once it is created again, the creation's event triggers the
    /// runs instead. Its condition ([`when`](Produce::when)) is evaluated on that last version.
    ///
    /// ```
    /// use reactifact_core::{Artifact, EventKind, Produce, ProduceCall};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)] struct Order { total_cents: u64 }
    /// impl Artifact for Order { const KIND: &'static str = "order"; }
    ///
    /// let produce = Produce::new("forget_order", |call: ProduceCall<Order>| async move {
    ///     assert_eq!(call.event, EventKind::Deleted);
    /// })
    /// .on([EventKind::Deleted]);
    /// assert!(produce.reacts_to(EventKind::Deleted));
    /// assert!(!produce.reacts_to(EventKind::Created));
    /// ```
    ///
    /// [`EventKind::Stale`] in `kinds` is [`stale`](Produce::stale); `on` keeps it when it is
    /// not listed, so the two compose in either order.
    ///
    /// # Panics
    /// If `kinds` holds none of `Created`, `Updated` and `Deleted`: the produce would never run.
    pub fn on<I>(mut self, kinds: I) -> Self
    where
        I: IntoIterator,
        I::Item: std::borrow::Borrow<EventKind>,
    {
        use std::borrow::Borrow;
        let mut events = kinds
            .into_iter()
            .fold(EventKinds::EMPTY, |set, kind| set.with(*kind.borrow()));
        assert!(
            events.iter().any(|k| k != EventKind::Stale),
            "produce `{}` must react to at least one event kind of created, updated and deleted",
            self.name
        );
        if self.events.contains(EventKind::Stale) {
            events = events.with(EventKind::Stale);
        }
        assert!(
            !(self.join.is_join() && events.contains(EventKind::Deleted)),
            "produce `{}` is a join, so it cannot react to deletions (a join reacts to creations and updates of its parts)",
            self.name
        );
        self.events = events;
        self
    }

    /// Debounces the produce: it runs at most once per generation for one trigger, however
    /// many of the generation's events match it for that trigger, on the newest of them (the
    /// last in queue order: its trigger version and its event kind); the run takes the place of
    /// the first of them in the work order. `#[produce(.., debounce)]` expands to it.
    ///
    /// A creation or an update matches only while it is the artifact's current version, so
    /// events for one artifact in a batch already run a produce once; what debouncing adds is
    /// for the events that each match on their own: several deletions of one id in a batch
    /// (deleted, created again, deleted again), each with its own last version, run once, on
    /// the last deletion. Events a generation does not take (cut off by
    /// [`Budget::max_runs`](crate::Budget::max_runs)) run in a later generation.
    pub fn debounce(mut self) -> Self {
        self.debounce = true;
        self
    }

    /// Makes the produce react to staleness: when an artifact that its newest committed run
    /// on a trigger read (through its snapshot, see [`RunRecord::reads`](crate::RunRecord::reads))
    /// changes after that run — a new version, a deletion, or the creation of an id it read as
    /// absent — it runs again on the same trigger, at its current version, with
    /// [`EventKind::Stale`]; so what it derived is recomputed. A recompute that writes what
    /// is already stored changes nothing (equal content is a no-op) and emits no event, so a
    /// cascade of stale produces stops there. `#[produce(.., stale)]` expands to it.
    ///
    /// Adds [`EventKind::Stale`] to the kinds it reacts to ([`on`](Produce::on)). The rerun is
    /// matched with the event of the change, in the generation that takes it; the produce then
    /// has at most one run per trigger in that generation (a rerun is dropped when it runs on
    /// the trigger anyway). A trigger deleted meanwhile is not rerun. Its runs record
    /// [`RunRecord::watches_reads`](crate::RunRecord::watches_reads), so the index of what they
    /// read is rebuilt from the log (and kept in checkpoints) when a durable store is opened.
    ///
    /// ```
    /// use reactifact_core::{Artifact, EventKind, Produce, ProduceCall};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)] struct Customer { orders: Vec<String> }
    /// impl Artifact for Customer { const KIND: &'static str = "customer"; }
    /// #[derive(Serialize, Deserialize)] struct Order { total_cents: u64 }
    /// impl Artifact for Order { const KIND: &'static str = "order"; }
    /// #[derive(Serialize, Deserialize)] struct Summary { total_cents: u64 }
    /// impl Artifact for Summary { const KIND: &'static str = "summary"; }
    ///
    /// // Recomputed whenever one of the customer's orders changes.
    /// let summarize = Produce::new("summarize", |call: ProduceCall<Customer>| async move {
    ///     let mut total_cents = 0;
    ///     for id in &call.trigger.data.orders {
    ///         if let Ok(Some(order)) = call.snapshot.get::<Order>(id) {
    ///             total_cents += order.data.total_cents;
    ///         }
    ///     }
    ///     call.effects.upsert(format!("summary:{}", call.trigger.id), Summary { total_cents });
    /// })
    /// .creates::<Summary>()
    /// .stale();
    /// assert!(summarize.reacts_to(EventKind::Stale));
    /// ```
    pub fn stale(mut self) -> Self {
        self.events = self.events.with(EventKind::Stale);
        self
    }

    /// Whether the produce is debounced (see [`debounce`](Produce::debounce)).
    pub fn is_debounced(&self) -> bool {
        self.debounce
    }

    /// Whether the produce reacts to events of `kind` (see [`on`](Produce::on)).
    pub fn reacts_to(&self, kind: EventKind) -> bool {
        self.events.contains(kind)
    }

    /// The event kinds the produce reacts to, in the order `EventKind` declares them.
    pub fn events(&self) -> impl Iterator<Item = EventKind> {
        self.events.iter()
    }

    /// The produce's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kind of artifact it reacts to.
    pub fn trigger(&self) -> Kind {
        self.trigger.kind
    }

    /// The kinds it declares.
    pub fn outputs(&self) -> &[Kind] {
        &self.outputs
    }

    /// The Rust types it names: its trigger type, its declared outputs, then its join parts.
    pub(crate) fn types(&self) -> impl Iterator<Item = &ArtifactType> + '_ {
        std::iter::once(&self.trigger)
            .chain(&self.output_types)
            .chain(self.join.parts.iter().map(|p| &p.ty))
    }

    pub(crate) fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    pub(crate) fn applies(&self, snapshot: &Snapshot, trigger: &Stored) -> bool {
        self.condition.as_ref().is_none_or(|c| c(snapshot, trigger))
    }

    /// Starts a run with `input` in `spare` — an empty slot of this produce's runs, kept from
    /// one that ended (see [`RunSlot`]) — or in a new slot (also in place of a slot of another
    /// produce's runs, which would run the other produce).
    pub(crate) fn start(&self, spare: Option<RunSlot>, input: RunInput) -> RunSlot {
        let mut slot = spare
            .filter(|slot| slot.produce() == self.id)
            .unwrap_or_else(|| (self.handler)());
        slot.as_mut().start(input);
        slot
    }

    /// Room for the operations of a run: as many as its last run recorded, up to 64 (a run
    /// that writes more grows its buffer as it goes; one bulk run does not make every later
    /// run reserve its size).
    pub(crate) fn ops_hint(&self) -> usize {
        (self.ops_hint.load(Ordering::Relaxed) as usize).min(64)
    }

    /// What a finished run records for [`Produce::ops_hint`]; shared by its future.
    pub(crate) fn ops_recorder(&self) -> Arc<AtomicU32> {
        self.ops_hint.clone()
    }

    pub(crate) fn declares(&self, kind: Kind) -> bool {
        self.outputs.contains(&kind)
    }
}

impl std::fmt::Debug for Produce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Produce")
            .field("name", &self.name)
            .field("trigger", &self.trigger.kind)
            .field("outputs", &self.outputs)
            .field("events", &self.events.iter().collect::<Vec<_>>())
            .field("debounce", &self.debounce)
            .field("uses", &self.resources().collect::<Vec<_>>())
            .field(
                "join",
                &self
                    .join
                    .parts
                    .iter()
                    .map(|p| (p.ty.kind, p.absent))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Anything that can be registered on an [`Agent`]: a [`Produce`], or what `#[produce]`
/// generates for an annotated function.
pub trait IntoProduce {
    /// Builds the produce.
    fn into_produce(self) -> Produce;
}

impl IntoProduce for Produce {
    fn into_produce(self) -> Produce {
        self
    }
}

/// A function that builds a produce: what `#[produce]` generates under the annotated
/// function's name, so `Agent::produce(process_order)` registers it.
impl<F: FnOnce() -> Produce> IntoProduce for F {
    fn into_produce(self) -> Produce {
        self()
    }
}

/// A named group of produces with a priority and a concurrency limit.
///
/// Work of agents with a higher priority comes first in a generation's work order; agents
/// of equal priority keep registration order.
#[derive(Clone, Debug)]
pub struct Agent {
    pub(crate) name: Arc<str>,
    pub(crate) priority: i32,
    pub(crate) concurrency: Option<usize>,
    pub(crate) produces: Vec<Produce>,
}

impl Agent {
    /// An agent with priority 0 and no concurrency limit of its own.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Agent {
            name: name.into(),
            priority: 0,
            concurrency: None,
            produces: Vec::new(),
        }
    }

    /// Sets the priority: higher runs earlier in a generation's work order.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Limits how many of this agent's runs execute at once (at least 1).
    pub fn concurrency(mut self, limit: usize) -> Self {
        self.concurrency = Some(limit.max(1));
        self
    }

    /// Registers a produce.
    pub fn produce(mut self, produce: impl IntoProduce) -> Self {
        self.produces.push(produce.into_produce());
        self
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The first produce of `agents` that uses a resource `resources` lacks: its agent, the
/// produce and the resource's type name. The runtime's builder and the replay oracle refuse
/// such a produce.
pub(crate) fn missing_resource<'a>(
    agents: &'a [Agent],
    resources: &Resources,
) -> Option<(&'a Agent, &'a Produce, &'static str)> {
    agents.iter().find_map(|agent| {
        agent.produces.iter().find_map(|produce| {
            produce
                .missing_resource(resources)
                .map(|missing| (agent, produce, missing))
        })
    })
}
