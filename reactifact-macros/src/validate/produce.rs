//! Checking a `#[produce]` against the shapes it accepts.

use syn::ext::IdentExt;
use syn::{parse_quote, Expr, FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType, Type, TypePath};

use crate::errors::{display, Errors};
use crate::parse::produce::{ProduceInput, RawArg, RawArgs};

/// A checked produce: everything the expansion needs.
pub(crate) struct ProduceModel {
    /// The annotated function, unchanged.
    pub(crate) function: ItemFn,
    /// The name registered with the runtime.
    pub(crate) name: String,
    /// The trigger type, from `ProduceCall<T>`.
    pub(crate) trigger: Type,
    /// The parameter's type with the declarations filled in: `ProduceCall<T, process_order>`.
    pub(crate) declared_call: Type,
    /// The declared outputs, primary first, without duplicates.
    pub(crate) outputs: Vec<Type>,
    /// The `uses = [..]` resources, in order, without duplicates.
    pub(crate) resources: Vec<Type>,
    /// The `tools = [..]` tools, in order, without duplicates.
    pub(crate) tools: Vec<Type>,
    /// The `when = …` condition.
    pub(crate) condition: Option<Expr>,
    /// The `on = [..]` event kinds, as the names of `EventKind` variants, spanned on each.
    pub(crate) on: Option<Vec<Ident>>,
    /// The `debounce` flag.
    pub(crate) debounce: bool,
    /// The `stale` flag.
    pub(crate) stale: bool,
    /// The `key = …` join key of the trigger.
    pub(crate) key: Option<Expr>,
    /// The `join(..)` and `absent(..)` parts, in order: (absent, type, key function).
    pub(crate) parts: Vec<(bool, Type, Expr)>,
    /// Where `reactifact-core` is.
    pub(crate) krate: syn::Path,
}

/// What the fallback expansion needs when validation failed.
pub(crate) struct Invalid {
    pub(crate) function: ItemFn,
    /// The outputs that could be read, still declared so that their imports stay used.
    pub(crate) outputs: Vec<Type>,
    /// The resources that could be read, still declared so that their uses in the body are
    /// checked and their imports stay used.
    pub(crate) resources: Vec<Type>,
    /// The tools that could be read, still declared for the same reason.
    pub(crate) tools: Vec<Type>,
    pub(crate) krate: syn::Path,
    pub(crate) error: syn::Error,
}

/// The options `#[produce]` accepts, for messages.
const OPTIONS: &str =
    "`also_creates = [..]`, `uses = [..]`, `tools = [..]`, `name = \"…\"`, `when = <condition>`, `on = [..]`, `debounce`, `stale`, \
     `key = <key>`, `join(P, key = ..)`, `absent(P, key = ..)` or `crate = path`";

/// Every option's name, for "did you mean" hints.
const OPTION_NAMES: &[&str] = &[
    "also_creates",
    "uses",
    "tools",
    "name",
    "when",
    "on",
    "debounce",
    "stale",
    "key",
    "join",
    "absent",
    "crate",
];

/// The event kinds `on = [..]` accepts, with the `EventKind` variant each names.
const EVENT_KINDS: &[(&str, &str)] = &[("created", "Created"), ("updated", "Updated"), ("deleted", "Deleted")];

/// Checks the arguments and the function together, so that one build reports every mistake.
pub(crate) fn validate(input: ProduceInput) -> Result<ProduceModel, Box<Invalid>> {
    let ProduceInput { args, function } = input;
    let mut errors = Errors::default();

    let options = match args {
        Ok(args) => check_args(args, &function.sig.ident, &mut errors),
        Err(e) => {
            errors.push(e);
            Options::default()
        }
    };
    let krate = options.krate.unwrap_or_else(|| parse_quote!(::reactifact_core));
    let trigger = check_signature(&function, &mut errors);
    if let Some((trigger, _)) = &trigger {
        check_parts(&options.joins, trigger, &function.sig.ident, &mut errors);
    }

    match (errors.into_error(), trigger) {
        (None, Some((trigger, declared_call))) => Ok(ProduceModel {
            name: options.name.unwrap_or_else(|| function.sig.ident.unraw().to_string()),
            function,
            trigger,
            declared_call,
            outputs: options.outputs,
            resources: options.resources,
            tools: options.tools,
            condition: options.condition,
            on: options.on,
            debounce: options.debounce,
            stale: options.stale,
            key: options.key.map(|(_, key)| key),
            parts: options
                .joins
                .into_iter()
                .map(|(keyword, part, function)| (keyword == "absent", part, function))
                .collect(),
            krate,
        }),
        (error, _) => Err(Box::new(Invalid {
            function,
            outputs: options.outputs,
            resources: options.resources,
            tools: options.tools,
            krate,
            error: error.unwrap_or_else(|| syn::Error::new(proc_macro2::Span::call_site(), "invalid produce")),
        })),
    }
}

#[derive(Default)]
struct Options {
    outputs: Vec<Type>,
    resources: Vec<Type>,
    tools: Vec<Type>,
    name: Option<String>,
    condition: Option<Expr>,
    on: Option<Vec<Ident>>,
    debounce: bool,
    stale: bool,
    /// `key = …`, with its keyword.
    key: Option<(Ident, Expr)>,
    /// `join(..)` and `absent(..)`, with their keywords.
    joins: Vec<(Ident, Type, Expr)>,
    krate: Option<syn::Path>,
}

fn check_args(args: RawArgs, produce: &Ident, errors: &mut Errors) -> Options {
    let mut options = Options::default();
    let mut seen: Vec<Ident> = Vec::new();
    let mut saw_option = false;
    let mut primary: Option<Type> = None;

    for arg in args.args {
        let key = match &arg {
            RawArg::Output(ty) if (primary.is_some() || saw_option) && bare_lowercase(ty).is_some() => {
                // `#[produce(Receipt, debounc)]`: a misspelt flag, not a second output.
                let word = bare_lowercase(ty).expect("checked");
                saw_option = true;
                let hint = crate::suggest::closest(&word.to_string(), OPTION_NAMES)
                    .map(|o| format!(" (did you mean `{o}`?)"))
                    .unwrap_or_default();
                errors.spanned(word, format_args!("unknown option `{word}`{hint}; expected {OPTIONS}"));
                continue;
            }
            RawArg::Output(ty) => {
                if let Some(first) = &primary {
                    errors.spanned(
                        ty,
                        format_args!(
                            "produce `{produce}` already has the primary output `{}`; declare more outputs with \
                             `also_creates = [{}]`",
                            display(first),
                            display(ty)
                        ),
                    );
                } else if saw_option {
                    errors.spanned(
                        ty,
                        format_args!("the primary output comes first: `#[produce({}, ..)]`", display(ty)),
                    );
                } else {
                    primary = Some(ty.clone());
                    push_output(&mut options.outputs, ty.clone(), produce, errors);
                }
                continue;
            }
            RawArg::AlsoCreates { key, .. }
            | RawArg::Uses { key, .. }
            | RawArg::Tools { key, .. }
            | RawArg::Name { key, .. }
            | RawArg::When { key, .. }
            | RawArg::Crate { key, .. }
            | RawArg::On { key, .. }
            | RawArg::Flag { key }
            | RawArg::Key { key, .. }
            | RawArg::Unknown { key } => key.clone(),
            RawArg::Join { key, part, function } => {
                // One per part: repeated, unlike the other options.
                saw_option = true;
                options.joins.push((key.clone(), part.clone(), function.clone()));
                continue;
            }
        };
        saw_option = true;
        if let RawArg::Unknown { key } = &arg {
            let hint = crate::suggest::closest(&key.to_string(), OPTION_NAMES)
                .map(|o| format!(" (did you mean `{o}`?)"))
                .unwrap_or_default();
            errors.spanned(key, format_args!("unknown option `{key}`{hint}; expected {OPTIONS}"));
            continue;
        }
        if seen.contains(&key) {
            errors.spanned(&key, format_args!("duplicate option `{key}`; give it once"));
            continue;
        }
        seen.push(key);
        match arg {
            RawArg::AlsoCreates { types, .. } => {
                for ty in types {
                    push_output(&mut options.outputs, ty, produce, errors);
                }
            }
            RawArg::Uses { types, .. } => {
                for ty in types {
                    push_resource(&mut options.resources, ty, produce, errors);
                }
            }
            RawArg::Tools { types, .. } => {
                for ty in types {
                    push_tool(&mut options.tools, ty, produce, errors);
                }
            }
            RawArg::Name { value, .. } => {
                let name = value.value();
                if name.trim().is_empty() {
                    errors.spanned(&value, "the produce name must not be empty");
                }
                options.name = Some(name);
            }
            RawArg::When { condition, .. } => options.condition = Some(condition),
            RawArg::On { brackets, kinds, .. } => options.on = Some(check_on(brackets, kinds, produce, errors)),
            RawArg::Flag { key } => match key.to_string().as_str() {
                "debounce" => options.debounce = true,
                "stale" => options.stale = true,
                other => unreachable!("`{other}` is not a flag"),
            },
            RawArg::Crate { path, .. } => options.krate = Some(path),
            RawArg::Key { key, function } => options.key = Some((key, function)),
            RawArg::Output(_) | RawArg::Unknown { .. } | RawArg::Join { .. } => unreachable!("handled above"),
        }
    }
    check_join(&options, produce, errors);
    options
}

/// Checks that a join has both its key and a part, and reacts to no deletion.
fn check_join(options: &Options, produce: &Ident, errors: &mut Errors) {
    match (&options.key, options.joins.first()) {
        (None, Some((keyword, part, _))) => errors.spanned(
            keyword,
            format_args!(
                "produce `{produce}` joins `{}` but declares no key for its trigger; add `key = |t| ..`, the key \
                 the part's key is compared with",
                display(part)
            ),
        ),
        (Some((keyword, _)), None) => errors.spanned(
            keyword,
            format_args!(
                "produce `{produce}` declares a join key but no part to join; add `join(P, key = |p| ..)` or \
                 `absent(P, key = |p| ..)`, or remove `key`"
            ),
        ),
        _ => {}
    }
    if options.joins.is_empty() {
        return;
    }
    for kind in options.on.iter().flatten() {
        if kind == "Deleted" {
            errors.spanned(
                kind,
                format_args!(
                    "produce `{produce}` is a join, so it cannot react to `deleted`: a join runs on creations and \
                     updates of its parts"
                ),
            );
        }
    }
}

/// Checks the join parts against each other and the trigger: each type once, never the
/// trigger's.
fn check_parts(joins: &[(Ident, Type, Expr)], trigger: &Type, produce: &Ident, errors: &mut Errors) {
    let trigger = display(trigger);
    let mut seen: Vec<String> = Vec::new();
    for (_, part, _) in joins {
        let text = display(part);
        if text == trigger {
            errors.spanned(
                part,
                format_args!(
                    "produce `{produce}` cannot join its trigger type `{text}` with itself; join another type"
                ),
            );
        } else if seen.contains(&text) {
            errors.spanned(
                part,
                format_args!("`{text}` is a join part of produce `{produce}` twice; remove this one"),
            );
        } else {
            seen.push(text);
        }
    }
}

/// The word, if `ty` is a single lowercase name: what a misspelt flag parses as.
fn bare_lowercase(ty: &Type) -> Option<&Ident> {
    let Type::Path(TypePath { qself: None, path }) = ty else {
        return None;
    };
    let ident = path.get_ident()?;
    ident
        .unraw()
        .to_string()
        .starts_with(|c: char| c.is_ascii_lowercase())
        .then_some(ident)
}

/// Checks `on = [..]`: a known kind each, none twice, at least one. Returns the `EventKind`
/// variants, spanned on the kinds as written.
fn check_on(
    brackets: proc_macro2::Span,
    kinds: syn::punctuated::Punctuated<Ident, syn::Token![,]>,
    produce: &Ident,
    errors: &mut Errors,
) -> Vec<Ident> {
    let known: Vec<&str> = EVENT_KINDS.iter().map(|(k, _)| *k).collect();
    let list = known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
    if kinds.is_empty() {
        errors.push(syn::Error::new(
            brackets,
            format_args!(
                "produce `{produce}` must react to at least one event kind; write some of {list}, or leave `on` out \
                 for `[created, updated]`"
            ),
        ));
        return Vec::new();
    }
    let mut seen: Vec<String> = Vec::new();
    let mut variants = Vec::new();
    for kind in kinds {
        let word = kind.unraw().to_string();
        let Some((_, variant)) = EVENT_KINDS.iter().find(|(k, _)| *k == word) else {
            let hint = crate::suggest::closest(&word, &known)
                .map(|k| format!(" (did you mean `{k}`?)"))
                .unwrap_or_default();
            errors.spanned(
                &kind,
                format_args!("unknown event kind `{word}`{hint}; expected {list}"),
            );
            continue;
        };
        if seen.contains(&word) {
            errors.spanned(&kind, format_args!("event kind `{word}` is listed twice; give it once"));
            continue;
        }
        seen.push(word);
        variants.push(Ident::new(variant, kind.span()));
    }
    variants
}

/// Adds a declared output, refusing one declared already.
fn push_output(outputs: &mut Vec<Type>, ty: Type, produce: &Ident, errors: &mut Errors) {
    let text = display(&ty);
    if outputs.iter().any(|o| display(o) == text) {
        errors.spanned(
            &ty,
            format_args!("`{text}` is declared twice on produce `{produce}`; remove this one"),
        );
    } else {
        outputs.push(ty);
    }
}

/// Adds a resource of `uses = [..]`, refusing one listed already and what cannot name a
/// resource type.
fn push_resource(resources: &mut Vec<Type>, ty: Type, produce: &Ident, errors: &mut Errors) {
    let text = display(&ty);
    match &ty {
        Type::Reference(reference) => {
            errors.spanned(
                &ty,
                format_args!(
                    "name the resource type of produce `{produce}` without `&`: `uses = [{}]`; `call.resource` \
                     already lends it",
                    display(&reference.elem)
                ),
            );
            return;
        }
        Type::Infer(_) | Type::ImplTrait(_) => {
            errors.spanned(
                &ty,
                format_args!("name the resource type of produce `{produce}`: `uses = [ModelConfig]`, not `{text}`"),
            );
            return;
        }
        _ => {}
    }
    if resources.iter().any(|r| display(r) == text) {
        errors.spanned(
            &ty,
            format_args!("resource `{text}` is declared twice on produce `{produce}`; remove this one"),
        );
    } else {
        resources.push(ty);
    }
}

/// Adds a tool of `tools = [..]`, refusing one listed already and what cannot name a tool
/// type.
fn push_tool(tools: &mut Vec<Type>, ty: Type, produce: &Ident, errors: &mut Errors) {
    let text = display(&ty);
    if matches!(ty, Type::Reference(_) | Type::Infer(_) | Type::ImplTrait(_)) {
        errors.spanned(
            &ty,
            format_args!("name the tool type of produce `{produce}`: `tools = [IssueRefund]`, not `{text}`"),
        );
    } else if tools.iter().any(|t| display(t) == text) {
        errors.spanned(
            &ty,
            format_args!("tool `{text}` is declared twice on produce `{produce}`; remove this one"),
        );
    } else {
        tools.push(ty);
    }
}

/// Checks the function's shape; returns the trigger type and the rewritten parameter type.
fn check_signature(function: &ItemFn, errors: &mut Errors) -> Option<(Type, Type)> {
    let sig = &function.sig;
    let produce = &sig.ident;
    if sig.asyncness.is_none() {
        errors.spanned(
            sig.fn_token,
            format_args!("produce `{produce}` must be an `async fn`; write `async fn {produce}`"),
        );
    }
    if let Some(constness) = &sig.constness {
        errors.spanned(constness, "a produce cannot be a `const fn`");
    }
    if let Some(unsafety) = &sig.unsafety {
        errors.spanned(unsafety, "a produce cannot be an `unsafe fn`");
    }
    if let Some(abi) = &sig.abi {
        errors.spanned(abi, "a produce cannot have an `extern` ABI");
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.spanned(
            &sig.generics,
            format_args!(
                "produce `{produce}` cannot be generic; it reacts to one trigger type, named in `ProduceCall<T>`"
            ),
        );
    }
    if let Some(variadic) = &sig.variadic {
        errors.spanned(variadic, "a produce cannot be variadic");
    }
    check_return(&sig.output, produce, errors);

    let mut inputs = sig.inputs.iter();
    let Some(first) = inputs.next() else {
        errors.push(syn::Error::new(
            sig.paren_token.span.join(),
            format_args!(
                "produce `{produce}` takes one parameter: `call: ProduceCall<T>`, where `T` is the artifact type \
                 it reacts to"
            ),
        ));
        return None;
    };
    for extra in inputs {
        errors.spanned(
            extra,
            format_args!(
                "produce `{produce}` takes exactly one parameter, `ProduceCall<T>`; remove this one (read \
                 state through `call.snapshot`)"
            ),
        );
    }
    let typed = match first {
        FnArg::Receiver(receiver) => {
            errors.spanned(
                receiver,
                format_args!("produce `{produce}` is a free function; it takes `call: ProduceCall<T>`, not `self`"),
            );
            return None;
        }
        FnArg::Typed(typed) => typed,
    };
    if let Pat::Ident(pat) = &*typed.pat {
        if pat.by_ref.is_some() {
            errors.spanned(pat.by_ref, "the `ProduceCall` parameter is taken by value");
        }
    }
    check_call_type(&typed.ty, produce, errors)
}

/// `()` (or nothing), or any type named `Result`.
fn check_return(output: &ReturnType, produce: &Ident, errors: &mut Errors) {
    let ReturnType::Type(_, ty) = output else {
        return;
    };
    let ok = match &**ty {
        Type::Tuple(tuple) => tuple.elems.is_empty(),
        Type::Path(TypePath { qself: None, path }) => path.segments.last().is_some_and(|s| s.ident == "Result"),
        Type::Paren(paren) => matches!(&*paren.elem, Type::Tuple(t) if t.elems.is_empty()),
        _ => false,
    };
    if !ok {
        errors.spanned(
            ty,
            format_args!(
                "produce `{produce}` returns `{}`; a produce returns `()` or `Result<(), E>` where \
                 `E: Into<ProduceError>`",
                display(ty)
            ),
        );
    }
}

/// `ProduceCall<T>` → (`T`, `ProduceCall<T, produce>`).
fn check_call_type(ty: &Type, produce: &Ident, errors: &mut Errors) -> Option<(Type, Type)> {
    let expected = || {
        format!(
            "produce `{produce}` takes `ProduceCall<T>`, where `T` is the artifact type it reacts to, not `{}`",
            display(ty)
        )
    };
    let Type::Path(TypePath { qself: None, path }) = ty else {
        errors.spanned(ty, expected());
        return None;
    };
    let Some(last) = path.segments.last() else {
        errors.spanned(ty, expected());
        return None;
    };
    if last.ident != "ProduceCall" {
        errors.spanned(ty, expected());
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        errors.spanned(
            ty,
            format_args!("`ProduceCall` needs the trigger type: write `ProduceCall<T>`, where `T` is the artifact type produce `{produce}` reacts to"),
        );
        return None;
    };
    let types: Vec<&Type> = args
        .args
        .iter()
        .filter_map(|a| match a {
            GenericArgument::Type(t) => Some(t),
            _ => None,
        })
        .collect();
    if args.args.len() != 1 || types.len() != 1 {
        let message = if types.len() == 2 {
            format!(
                "`#[produce]` fills in the second parameter of `ProduceCall` from its declaration; write \
                 `ProduceCall<{}>`",
                display(types[0])
            )
        } else {
            format!("`ProduceCall` takes one type, the trigger: `ProduceCall<T>` for produce `{produce}`")
        };
        errors.spanned(args, message);
        return None;
    }
    let trigger = types[0].clone();
    if matches!(trigger, Type::Infer(_)) {
        errors.spanned(
            &trigger,
            format_args!("name the trigger type of produce `{produce}`: `ProduceCall<Order>`"),
        );
        return None;
    }
    let mut declared_call = ty.clone();
    if let Type::Path(TypePath { path, .. }) = &mut declared_call {
        if let Some(PathArguments::AngleBracketed(args)) = path.segments.last_mut().map(|s| &mut s.arguments) {
            args.args.push(GenericArgument::Type(parse_quote!(#produce)));
        }
    }
    Some((trigger, declared_call))
}
