//! Procedural macros for reactifact: [`macro@produce`] and [`derive@Artifact`].
//!
//! Use them through `reactifact-core`, which re-exports both. Each macro runs the same pipeline:
//! parse the input into raw syntax (`parse`), validate it, collecting every mistake spanned on
//! its token (`validate`), then expand the checked model (`expand`). This file only dispatches.
//!
//! Generated code refers to `reactifact-core` only through `::reactifact_core::__private`,
//! whose contents are not public API.

mod errors;
mod expand;
mod kind_name;
mod parse;
mod suggest;
mod validate;

#[cfg(test)]
mod expansion_tests;

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;

/// Turns an `async fn` into a produce whose outputs are checked at compile time.
///
/// ```
/// use reactifact_core::{produce, Agent, Artifact, PendingAction, ProduceCall, ProduceError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Artifact)]
/// struct Order { total_cents: u64 }
///
/// #[derive(Serialize, Deserialize, Artifact)]
/// struct Receipt { order: String, total_cents: u64 }
///
/// /// Writes a receipt for every order and asks the outbox to email it.
/// #[produce(Receipt, also_creates = [PendingAction])]
/// async fn process_order(call: ProduceCall<Order>) -> Result<(), ProduceError> {
///     let order = call.trigger.id.to_string();
///     let total_cents = call.trigger.data.total_cents;
///     call.effects.upsert(format!("receipt:{order}"), Receipt { order: order.clone(), total_cents });
///     call.effects.act("email_receipt", format!("email:{order}"), &total_cents);
///     Ok(())
/// }
///
/// let agent = Agent::new("billing").produce(process_order);
/// # let _ = agent;
/// ```
///
/// The function keeps its body; the macro generates, next to it:
///
/// - a function of the same name, `process_order()`, which builds the produce and is what you
///   register with `Agent::produce(process_order)`;
/// - a type of the same name (a struct with braces, so it takes no value name), which holds the
///   body as `process_order::run` and is what compile errors call the produce;
/// - its registration: the name, the trigger type (`T` of the parameter's `ProduceCall<T>`),
///   the declared outputs and the optional condition;
/// - an implementation of `DeclaredOutput<process_order>` for each declared type. The
///   parameter's `effects` is typed by these declarations, so `create`, `upsert` and
///   `create_once` of any other type — or `act` without `PendingAction` declared — is a compile
///   error. `update`, `delete`, `link` and `unlink` need no declaration;
/// - with `uses = [Model]`, an implementation of `DeclaredResource<process_order>` for each
///   resource, and `.uses::<Model>()` on the registration: `call.resource::<Model>()` compiles
///   for these types only, and the runtime's builder refuses the produce unless a `Model` is
///   registered (`RuntimeBuilder::resource`).
///
/// The body stays reachable as `process_order::run`, with its parameter typed
/// `ProduceCall<Order, process_order>`.
///
/// # Options
///
/// `#[produce(Primary, also_creates = [A, B], uses = [R], name = "…", when = condition, crate = path)]`,
/// every part optional, the primary output first:
///
/// | option | meaning |
/// | --- | --- |
/// | `Primary` | the main output type, e.g. `Receipt` |
/// | `also_creates = [A, B]` | further output types; `PendingAction` to record intents with `act` |
/// | `uses = [R, S]` | the resources the produce reads with `call.resource::<R>()`: any `Send + Sync + 'static` types registered on the runtime (`[]` declares none) |
/// | `name = "…"` | the registered name (default: the function's name); it appears in logs, errors and the commit log |
/// | `when = condition` | runs the produce only when `condition(&Snapshot, &Record<T>) -> bool` holds: a closure or a function path |
/// | `crate = path` | where `reactifact-core` is, for crates that re-export it (default `::reactifact_core`) |
///
/// With no options at all (`#[produce]`), the produce declares nothing: it may only update,
/// delete, link and unlink.
///
/// ```
/// use reactifact_core::{produce, Artifact, ProduceCall, Record, Snapshot};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Artifact)]
/// struct Order { total_cents: u64 }
/// #[derive(Serialize, Deserialize, Artifact)]
/// struct Review { order: String }
///
/// fn is_large(_: &Snapshot, order: &Record<Order>) -> bool {
///     order.data.total_cents > 100_000
/// }
///
/// #[produce(Review, name = "flag_large_orders", when = is_large)]
/// async fn flag(call: ProduceCall<Order>) {
///     let order = call.trigger.id.to_string();
///     call.effects.create(format!("review:{order}"), Review { order });
/// }
/// # let _ = reactifact_core::Agent::new("risk").produce(flag);
/// ```
///
/// # Examples
///
/// A produce that only records intents, and one that returns nothing:
///
/// ```
/// use reactifact_core::{produce, Agent, Artifact, PendingAction, ProduceCall};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Artifact)]
/// struct Signup { email: String }
///
/// #[produce(PendingAction)]
/// async fn welcome(call: ProduceCall<Signup>) {
///     let email = call.trigger.data.email.clone();
///     call.effects.act("send_welcome", format!("welcome:{email}"), &email);
/// }
///
/// let agent = Agent::new("mail").produce(welcome);
/// # let _ = agent;
/// ```
///
/// A produce that reads a resource registered on the runtime; without one, the runtime is not
/// built:
///
/// ```
/// use reactifact_core::{produce, Agent, Artifact, BuildError, Context, ProduceCall, Runtime};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Artifact)]
/// struct Ticket { text: String }
/// #[derive(Serialize, Deserialize, Artifact)]
/// struct Triage { queue: String }
///
/// struct Routing { default_queue: String }
///
/// #[produce(Triage, uses = [Routing])]
/// async fn triage(call: ProduceCall<Ticket>) {
///     let queue = call.resource::<Routing>().default_queue.clone();
///     call.effects.create(format!("triage:{}", call.trigger.id), Triage { queue });
/// }
///
/// let refused = Runtime::builder(Context::new("support"))
///     .agent(Agent::new("support").produce(triage))
///     .build();
/// assert!(matches!(refused, Err(BuildError::MissingResource { .. })));
///
/// let built = Runtime::builder(Context::new("support"))
///     .resource(Routing { default_queue: "general".into() })
///     .agent(Agent::new("support").produce(triage))
///     .build();
/// assert!(built.is_ok());
/// ```
///
/// # Errors you may see
///
/// Writing a type the produce did not declare:
///
/// ```text
/// error[E0277]: `Invoice` is not a declared output of produce `process_order`
///   --> src/billing.rs:18:35
///    |
/// 18 |     call.effects.upsert("invoice:1", Invoice { total_cents: 5 });
///    |                  ------            ^^^^^^^^^^^^^^^^^^^^^^^^^^ produce `process_order` does not declare `Invoice`
/// ```
///
/// The fix is in the note: add the type to the declaration, e.g.
/// `#[produce(Receipt, also_creates = [Invoice])]`. `act` without `PendingAction` declared
/// reports `PendingAction` the same way. Reading a resource the produce did not declare reads
/// alike:
///
/// ```text
/// error[E0277]: `Prompt` is not a declared resource of produce `summarise`
///   --> src/writer.rs:25:34
///    |
/// 25 |     let prompt = call.resource::<Prompt>().text;
///    |                       --------   ^^^^^^ produce `summarise` does not declare it uses `Prompt`
///    |
///    = note: declare it on the produce: `#[produce(.., uses = [Prompt])]`
/// ```
///
/// Each of these is reported on the offending token, all in one build, and the function is
/// still emitted so that the rest of the crate keeps compiling:
///
/// | message | cause |
/// | --- | --- |
/// | ``produce `p` must be an `async fn` `` | the `async` is missing |
/// | ``produce `p` takes one parameter: `call: ProduceCall<T>` `` | no parameter |
/// | ``produce `p` takes exactly one parameter`` | a second parameter; read state through `call.snapshot` |
/// | ``produce `p` takes `ProduceCall<T>` … not `Order` `` | the parameter has another type |
/// | ``#[produce]` fills in the second parameter of `ProduceCall` `` | `ProduceCall<T, D>` written out |
/// | ``produce `p` returns `u64`; a produce returns `()` or `Result<(), E>` `` | another return type |
/// | ``produce `p` cannot be generic`` | type or lifetime parameters |
/// | ``unknown option `also_create` (did you mean `also_creates`?)`` | a misspelt option |
/// | ``duplicate option `name` `` | an option given twice |
/// | ``` `Receipt` is declared twice on produce `p` ``` | a type listed twice among the outputs |
/// | ``resource `Config` is declared twice on produce `p` `` | a type listed twice in `uses` |
/// | `expected a resource type: …` | something other than a type in `uses = [..]` |
/// | ``name the resource type of produce `p` without `&` …`` | `uses = [&Config]`; `call.resource` already lends it |
/// | ``` `Cell<u64>` cannot be shared between threads safely ``` | a resource that is not `Send + Sync`: every run shares it |
/// | `the primary output comes first` | a bare type after an option |
/// | ``the trait bound `Refund: Artifact` is not satisfied`` | a trigger or output type without `#[derive(Artifact)]` |
#[proc_macro_attribute]
pub fn produce(attr: TokenStream, item: TokenStream) -> TokenStream {
    produce_tokens(attr.into(), item.into()).into()
}

/// Implements `Artifact` for a struct or enum: its kind name is `#[artifact(kind = "…")]`, or
/// the type's name in snake_case.
///
/// The type must also be a serde type (`Serialize` and `Deserialize`), `Send`, `Sync` and
/// `'static`. The kind is stored next to every artifact and routes events to produces: keep it
/// stable when you rename or move the type, by writing it out.
///
/// ```
/// use reactifact_core::Artifact;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Artifact)]
/// struct PurchaseOrder { total_cents: u64 }
/// assert_eq!(PurchaseOrder::KIND, "purchase_order");
///
/// #[derive(Serialize, Deserialize, Artifact)]
/// #[artifact(kind = "billing.receipt")]
/// enum Receipt { Paid { cents: u64 }, Refunded }
/// assert_eq!(Receipt::KIND, "billing.receipt");
/// ```
///
/// # Options
///
/// | option | meaning |
/// | --- | --- |
/// | `#[artifact(kind = "…")]` | the kind name (default: the type name in snake_case, `PurchaseOrder` → `purchase_order`) |
/// | `#[artifact(crate = path)]` | where `reactifact-core` is, for crates that re-export it |
///
/// # Examples
///
/// Maps inside an artifact must iterate in a fixed order, or hashes and replay break: use
/// `BTreeMap`, never `HashMap`.
///
/// ```
/// use std::collections::BTreeMap;
/// use reactifact_core::Artifact;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Artifact)]
/// #[artifact(kind = "cart")]
/// struct Cart { lines: BTreeMap<String, u32> }
/// # assert_eq!(Cart::KIND, "cart");
/// ```
///
/// # Errors you may see
///
/// | message | cause |
/// | --- | --- |
/// | ``` `#[derive(Artifact)]` is for structs and enums ``` | a union |
/// | ``` `#[derive(Artifact)]` needs a concrete type ``` | a generic type: every instantiation would share one kind; implement `Artifact` by hand per instantiation |
/// | ``unknown option `knd` in `#[artifact(..)]` (did you mean `kind`?)`` | a misspelt option |
/// | ``duplicate option `name` `` | an option given twice |
/// | `the artifact kind must not be empty` | `kind = ""` |
/// | ``the trait bound `Invoice: Serialize` is not satisfied`` | serde's derives are missing |
#[proc_macro_derive(Artifact, attributes(artifact))]
pub fn derive_artifact(item: TokenStream) -> TokenStream {
    derive_artifact_tokens(item.into()).into()
}

/// `#[produce]` on `proc_macro2` tokens: parse → validate → expand.
fn produce_tokens(attr: TokenStream2, item: TokenStream2) -> TokenStream2 {
    let input = match parse::produce::parse(attr, item.clone()) {
        Ok(input) => input,
        Err(error) => {
            let errors = error.to_compile_error();
            return quote::quote!(#errors #item);
        }
    };
    match validate::produce::validate(input) {
        Ok(model) => expand::produce::expand(model),
        Err(invalid) => expand::produce::expand_invalid(*invalid),
    }
}

/// `#[derive(Artifact)]` on `proc_macro2` tokens: parse → validate → expand.
fn derive_artifact_tokens(item: TokenStream2) -> TokenStream2 {
    let input = match parse::artifact::parse(item) {
        Ok(input) => input,
        Err(error) => return error.to_compile_error(),
    };
    match validate::artifact::validate(input) {
        Ok(model) => expand::artifact::expand(&model),
        Err(invalid) => {
            let errors = invalid.error.to_compile_error();
            let fallback = invalid.fallback.as_ref().map(expand::artifact::expand);
            quote::quote!(#errors #fallback)
        }
    }
}
