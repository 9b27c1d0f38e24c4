//! Resources: typed, shared, read-only values a produce reaches through its call — a model
//! client, its configuration, reference data — registered on the runtime builder.

use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Arc;

use foldhash::HashMap;

/// Marks `Self` as a resource that produce `P` declared it uses.
///
/// `#[produce(.., uses = [Model])]` implements it for `Model` with `P` the produce, so asking
/// that produce's call for any other resource ([`ProduceCall::resource`](crate::ProduceCall::resource))
/// is a compile error. [`Dynamic`](crate::Dynamic) accepts every type; the runtime's builder
/// checks what a produce declares with [`Produce::uses`](crate::Produce::uses).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a declared resource of produce `{P}`",
    label = "produce `{P}` does not declare it uses `{Self}`",
    note = "declare it on the produce: `#[produce(.., uses = [{Self}])]`"
)]
pub trait DeclaredResource<P>: Send + Sync + 'static {}

impl<R: Send + Sync + 'static> DeclaredResource<crate::run::effects::Dynamic> for R {}

/// One resource's type, as a produce declares it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResourceType {
    pub(crate) type_id: TypeId,
    pub(crate) name: &'static str,
}

impl ResourceType {
    pub(crate) fn of<R: 'static>() -> Self {
        ResourceType {
            type_id: TypeId::of::<R>(),
            name: std::any::type_name::<R>(),
        }
    }
}

/// A set of resources, at most one per type: what
/// [`RuntimeBuilder::resource`](crate::RuntimeBuilder::resource) fills and every produce run of
/// the runtime reads, and what the replay oracle ([`Context::replay_with`](crate::Context::replay_with))
/// and the produce test harness ([`testing::ProduceTest`](crate::testing::ProduceTest)) take.
///
/// Cheap to clone (the values are shared). Resources are read-only: a produce gets `&R`. A
/// resource that must change (a connection pool, a counter) manages its own interior
/// mutability — and a produce must not act on the world through it: reads of the world go
/// through a recorded call ([`ProduceCall::record`](crate::ProduceCall::record)), so a retry
/// and a replay get the same answer.
///
/// ```
/// use reactifact_core::runtime::Resources;
///
/// struct ModelConfig { name: &'static str }
/// let resources = Resources::new().with(ModelConfig { name: "small" });
/// assert_eq!(resources.get::<ModelConfig>().map(|c| c.name), Some("small"));
/// assert!(resources.get::<String>().is_none());
/// ```
#[derive(Clone, Default)]
pub struct Resources {
    values: Arc<HashMap<TypeId, Entry>>,
}

#[derive(Clone)]
struct Entry {
    value: Arc<dyn Any + Send + Sync>,
    name: &'static str,
}

impl Resources {
    /// No resources.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `value`, replacing a value of the same type.
    pub fn with<R: Send + Sync + 'static>(mut self, value: R) -> Self {
        self.insert(value);
        self
    }

    /// Adds `value`, replacing (and returning) a value of the same type.
    pub fn insert<R: Send + Sync + 'static>(&mut self, value: R) -> Option<Arc<R>> {
        let entry = Entry {
            value: Arc::new(value),
            name: std::any::type_name::<R>(),
        };
        Arc::make_mut(&mut self.values)
            .insert(TypeId::of::<R>(), entry)
            .and_then(|old| old.value.downcast::<R>().ok())
    }

    /// Adds every resource of `other`, replacing values of the same types.
    pub fn extend(&mut self, other: &Resources) {
        if other.is_empty() {
            return;
        }
        let values = Arc::make_mut(&mut self.values);
        for (type_id, entry) in other.values.iter() {
            values.insert(*type_id, entry.clone());
        }
    }

    /// The value of type `R`, if one was added.
    pub fn get<R: 'static>(&self) -> Option<&R> {
        self.values
            .get(&TypeId::of::<R>())
            .and_then(|entry| entry.value.downcast_ref::<R>())
    }

    /// Whether a value of type `R` was added.
    pub fn contains<R: 'static>(&self) -> bool {
        self.values.contains_key(&TypeId::of::<R>())
    }

    pub(crate) fn contains_type(&self, ty: &ResourceType) -> bool {
        self.values.contains_key(&ty.type_id)
    }

    /// How many resources there are.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl fmt::Debug for Resources {
    /// The types only: a resource need not be `Debug`, and may hold a secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.values.values().map(|e| e.name).collect();
        names.sort_unstable();
        f.debug_set().entries(names).finish()
    }
}
