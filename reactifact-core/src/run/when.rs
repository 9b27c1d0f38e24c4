//! Condition helpers for the common cases of [`Produce::when`](crate::Produce::when) and
//! `#[produce(.., when = ..)]`: a field of the trigger equals a value, its status is a value.
//!
//! ```
//! use reactifact_core::{produce, when::field_equals, Artifact, ProduceCall};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, Artifact)]
//! struct Order { status: String, total_cents: u64 }
//!
//! /// Runs only for orders whose status is `"paid"`.
//! #[produce(when = field_equals("status", "paid"))]
//! async fn ship(call: ProduceCall<Order>) {
//!     let _ = call;
//! }
//! # let _ = reactifact_core::Agent::new("shipping").produce(ship);
//! ```
//!
//! A helper compares the field's value as serde serializes it, so it works with any field type
//! that implements `Serialize`: a string, a number, a bool, a unit enum variant (which
//! serializes as its name: `status_is(Status::Paid)` and `status_is("Paid")` are the same
//! condition). Numbers compare by value across integer types (`5u8` equals `5u64`), but an
//! integer never equals a float.
//!
//! A field the trigger does not have — misspelt, skipped by `#[serde(skip_serializing_if)]`,
//! or on a trigger that does not serialize as a struct or map — makes the condition **not
//! hold**: the produce does not run, and a `debug` event (target `reactifact_core::when`) names
//! the artifact, its kind and the field. A field path may name a nested field with dots:
//! `"customer.country"`.

use serde::Serialize;
use serde_json::Value;

use crate::model::artifact::Record;
use crate::state::snapshot::Snapshot;

/// A condition that holds when the trigger's field `field` (a dotted path for a nested field)
/// equals `value`, compared as serde serializes both. A missing field does not hold (see the
/// [module docs](self)).
///
/// The trigger type is inferred from where the condition goes: `#[produce(.., when =
/// field_equals(..))]` and `produce.when::<Order, _>(field_equals(..))` need nothing more;
/// elsewhere name it, `field_equals::<Order>(..)`.
///
/// ```
/// use reactifact_core::{when::field_equals, Artifact, Produce, ProduceCall};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)] struct Order { status: String }
/// impl Artifact for Order { const KIND: &'static str = "order"; }
///
/// let ship = Produce::new("ship", |call: ProduceCall<Order>| async move { let _ = call; })
///     .when::<Order, _>(field_equals("status", "paid"));
/// # let _ = ship;
/// ```
///
/// # Panics
/// If `value` cannot be serialized as a JSON-like value (a map with keys that are not strings).
pub fn field_equals<T: Serialize>(
    field: &str,
    value: impl Serialize,
) -> impl Fn(&Snapshot, &Record<T>) -> bool + Send + Sync + 'static {
    let expected = serde_json::to_value(value)
        .unwrap_or_else(|e| panic!("the value `field_equals(\"{field}\", ..)` compares with does not serialize: {e}"));
    let path: Vec<String> = field.split('.').map(str::to_owned).collect();
    let field = field.to_owned();
    move |_snapshot: &Snapshot, record: &Record<T>| match field_of(&record.data, &path) {
        Some(found) => found == expected,
        None => {
            tracing::debug!(
                target: "reactifact_core::when",
                artifact_id = %record.id,
                kind = std::any::type_name::<T>(),
                field = %field,
                "the trigger has no such field; the condition does not hold"
            );
            false
        }
    }
}

/// [`field_equals`] on the field `status`: the trigger's status is `value`.
///
/// ```
/// use reactifact_core::{produce, when::status_is, Artifact, ProduceCall};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, PartialEq)]
/// enum Status { Open, Paid }
///
/// #[derive(Serialize, Deserialize, Artifact)]
/// struct Invoice { status: Status }
///
/// #[produce(when = status_is(Status::Paid))]
/// async fn archive(call: ProduceCall<Invoice>) {
///     let _ = call;
/// }
/// # let _ = reactifact_core::Agent::new("books").produce(archive);
/// ```
///
/// # Panics
/// As [`field_equals`].
pub fn status_is<T: Serialize>(
    value: impl Serialize,
) -> impl Fn(&Snapshot, &Record<T>) -> bool + Send + Sync + 'static {
    field_equals("status", value)
}

/// The value at `path` in `data`, as serde serializes it; `None` if there is none.
fn field_of<T: Serialize>(data: &T, path: &[String]) -> Option<Value> {
    let mut value = serde_json::to_value(data).ok()?;
    for key in path {
        value = match value {
            Value::Object(mut map) => map.remove(key)?,
            _ => return None,
        };
    }
    Some(value)
}
