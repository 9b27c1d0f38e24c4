//! Expansion-level tests: what the macros generate, checked on the token level.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};

use crate::{derive_artifact_tokens, produce_tokens};

/// Expands `#[produce(attr)] item` and parses the result as a file, which also checks that the
/// output is well-formed Rust.
fn produce(attr: TokenStream, item: TokenStream) -> syn::File {
    let out = produce_tokens(attr, item);
    syn::parse2(out.clone()).unwrap_or_else(|e| panic!("expansion does not parse: {e}\n{out}"))
}

fn text(tokens: &impl ToTokens) -> String {
    tokens.to_token_stream().to_string()
}

/// The messages of the `compile_error!`s in an expansion.
fn compile_errors(file: &syn::File) -> Vec<String> {
    let mut messages = Vec::new();
    for item in &file.items {
        if let syn::Item::Macro(m) = item {
            if m.mac.path.segments.last().is_some_and(|s| s.ident == "compile_error") {
                let lit: syn::LitStr = m.mac.parse_body().unwrap();
                messages.push(lit.value());
            }
        }
    }
    messages
}

fn order_produce() -> syn::File {
    produce(
        quote!(Receipt, also_creates = [PendingAction]),
        quote! {
            /// Writes receipts.
            pub async fn process_order(call: ProduceCall<Order>) -> Result<(), ProduceError> {
                call.effects.upsert("receipt:1", Receipt {});
                Ok(())
            }
        },
    )
}

#[test]
fn a_produce_becomes_a_marker_type_with_its_body_as_run() {
    let file = order_produce();
    assert!(compile_errors(&file).is_empty());
    let syn::Item::Struct(marker) = &file.items[0] else {
        panic!("the first item is the marker struct")
    };
    assert_eq!(marker.ident, "process_order");
    assert!(matches!(marker.vis, syn::Visibility::Public(_)));
    // Braces, not a unit struct: the type takes no value name, so a `let` binding named like
    // the produce is allowed, and the registration function can use the name.
    assert!(matches!(&marker.fields, syn::Fields::Named(f) if f.named.is_empty()));
    let docs: Vec<String> = marker
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .map(|a| text(&a.meta))
        .collect();
    assert!(docs[0].contains("Writes receipts."), "{docs:?}");

    let syn::Item::Impl(inherent) = &file.items[1] else {
        panic!("the second item holds the body")
    };
    let syn::ImplItem::Fn(run) = &inherent.items[0] else {
        panic!("run is a function")
    };
    assert_eq!(run.sig.ident, "run");
    assert!(run.sig.asyncness.is_some());
    let syn::FnArg::Typed(param) = &run.sig.inputs[0] else {
        panic!("typed parameter")
    };
    assert_eq!(text(&param.ty), text(&quote!(ProduceCall<Order, process_order>)));
    assert_eq!(
        text(&run.block),
        text(&quote!({
            call.effects.upsert("receipt:1", Receipt {});
            Ok(())
        }))
    );
}

#[test]
fn the_registration_names_trigger_declarations_and_outputs() {
    let file = order_produce();
    let syn::Item::Fn(function) = &file.items[2] else {
        panic!("the third item is the registration function")
    };
    assert_eq!(function.sig.ident, "process_order");
    assert!(function.sig.inputs.is_empty());
    let registration = text(&file.items[2]);
    assert!(registration.contains("fn process_order () -> :: reactifact_core :: __private :: Produce"));
    assert!(registration.contains(
        ":: reactifact_core :: __private :: Produce :: declared :: < Order , process_order , _ , _ > (\"process_order\""
    ));
    assert!(registration.contains(
        "(\"process_order\" , process_order :: run) . creates :: < Receipt > () . creates :: < PendingAction > ()"
    ));
    let declarations: Vec<String> = file.items[3..].iter().map(text).collect();
    assert_eq!(
        declarations,
        [
            "impl :: reactifact_core :: __private :: DeclaredOutput < process_order > for Receipt { }",
            "impl :: reactifact_core :: __private :: DeclaredOutput < process_order > for PendingAction { }",
        ]
    );
}

/// Every token of `tokens`, groups flattened, literals (docs, names) left out.
fn flat_tokens(tokens: TokenStream, out: &mut Vec<String>) {
    for tree in tokens {
        match tree {
            proc_macro2::TokenTree::Group(group) => flat_tokens(group.stream(), out),
            proc_macro2::TokenTree::Literal(_) => out.push("<literal>".to_owned()),
            other => out.push(other.to_string()),
        }
    }
}

#[test]
fn generated_code_names_the_runtime_only_through_private() {
    let mut tokens = Vec::new();
    for file in [order_produce(), model_produce()] {
        // Everything but the user's own function, which is item 1.
        for (i, item) in file.items.iter().enumerate() {
            if i != 1 {
                flat_tokens(item.to_token_stream(), &mut tokens);
            }
        }
    }
    let runtime_names = [
        "Vec",
        "Box",
        "Option",
        "Result",
        "Ok",
        "Some",
        "Produce",
        "Kind",
        "IntoProduce",
        "DeclaredOutput",
        "DeclaredResource",
    ];
    for (at, token) in tokens.iter().enumerate() {
        if runtime_names.contains(&token.as_str()) {
            let path = &tokens[at.saturating_sub(3)..at];
            assert_eq!(path, ["__private", ":", ":"], "`{token}` is named without `__private`");
        }
    }
}

/// A produce that uses two resources.
fn model_produce() -> syn::File {
    produce(
        quote!(Summary, uses = [Model, config::Config]),
        quote! {
            async fn summarise(call: ProduceCall<Order>) {
                let _ = call.resource::<Model>();
            }
        },
    )
}

#[test]
fn uses_declares_each_resource_on_the_registration_and_as_an_impl() {
    let file = model_produce();
    assert!(compile_errors(&file).is_empty());
    let registration = text(&file.items[2]);
    assert!(
        registration.contains(
            "summarise :: run) . creates :: < Summary > () . uses :: < Model > () . uses :: < config :: Config > ()"
        ),
        "{registration}"
    );
    let declarations: Vec<String> = file.items[3..].iter().map(text).collect();
    assert_eq!(
        declarations,
        [
            "impl :: reactifact_core :: __private :: DeclaredOutput < summarise > for Summary { }",
            "impl :: reactifact_core :: __private :: DeclaredResource < summarise > for Model { }",
            "impl :: reactifact_core :: __private :: DeclaredResource < summarise > for config :: Config { }",
        ]
    );

    // Without `uses`, or with an empty list, the produce declares no resource.
    for file in [
        order_produce(),
        produce(
            quote!(Summary, uses = []),
            quote!(
                async fn summarise(call: ProduceCall<Order>) {}
            ),
        ),
    ] {
        assert!(compile_errors(&file).is_empty());
        let all = text(&file);
        assert!(!all.contains(". uses") && !all.contains("DeclaredResource"), "{all}");
    }
}

#[test]
fn tools_declares_each_tool_as_an_impl_and_refuses_what_names_no_tool() {
    let file = produce(
        quote!(
            Reply,
            also_creates = [PendingAction],
            tools = [IssueRefund, tools::Lookup]
        ),
        quote!(
            async fn agent(call: ProduceCall<Ticket>) {}
        ),
    );
    assert!(compile_errors(&file).is_empty());
    let declarations: Vec<String> = file.items[3..].iter().map(text).collect();
    assert_eq!(
        declarations,
        [
            "impl :: reactifact_core :: __private :: DeclaredOutput < agent > for Reply { }",
            "impl :: reactifact_core :: __private :: DeclaredOutput < agent > for PendingAction { }",
            "impl :: reactifact_core :: __private :: DeclaredTool < agent > for IssueRefund { }",
            "impl :: reactifact_core :: __private :: DeclaredTool < agent > for tools :: Lookup { }",
        ]
    );

    let file = produce(
        quote!(Reply, tools = [IssueRefund, &Lookup, IssueRefund]),
        quote!(
            async fn agent(call: ProduceCall<Ticket>) {}
        ),
    );
    assert_eq!(
        compile_errors(&file),
        [
            "name the tool type of produce `agent`: `tools = [IssueRefund]`, not `&Lookup`",
            "tool `IssueRefund` is declared twice on produce `agent`; remove this one",
        ]
    );
}

#[test]
fn uses_carries_the_produces_cfg_to_each_resource_impl() {
    let file = produce(
        quote!(uses = [Model]),
        quote! {
            #[cfg(feature = "models")]
            async fn summarise(call: ProduceCall<Order>) {}
        },
    );
    let resource = file
        .items
        .iter()
        .find(|item| text(item).contains("DeclaredResource"))
        .expect("the resource impl");
    assert!(
        text(resource).starts_with("# [cfg (feature = \"models\")] impl"),
        "{}",
        text(resource)
    );
}

#[test]
fn bad_resources_are_each_reported() {
    let file = produce(
        quote!(uses = [Model, &Config, _, Model], uses = [Config]),
        quote!(
            async fn summarise(call: ProduceCall<Order>) {}
        ),
    );
    assert_eq!(
        compile_errors(&file),
        [
            "name the resource type of produce `summarise` without `&`: `uses = [Config]`; `call.resource` already lends it",
            "name the resource type of produce `summarise`: `uses = [ModelConfig]`, not `_`",
            "resource `Model` is declared twice on produce `summarise`; remove this one",
            "duplicate option `uses`; give it once",
        ]
    );
    // The resources that could be read are still declared, so the body's uses type-check.
    let all = text(&file);
    assert!(all.contains("DeclaredResource < summarise > for Model"), "{all}");
    assert!(!all.contains("for & Config") && !all.contains("for _"), "{all}");
}

#[test]
fn a_value_that_is_not_a_type_in_uses_is_reported() {
    let file = produce(
        quote!(uses = [Model, "config"]),
        quote!(
            async fn summarise(call: ProduceCall<Order>) {}
        ),
    );
    let errors = compile_errors(&file);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("expected a resource type: `uses` lists the types the produce reads"),
        "{errors:?}"
    );
    assert!(text(&file).contains("async fn run"));
}

#[test]
fn options_set_the_name_the_condition_and_the_crate_path() {
    let file = produce(
        quote!(
            Receipt,
            name = "billing.process",
            when = |_, order| order.data.total > 0,
            crate = my::rf
        ),
        quote!(
            async fn process_order(call: ProduceCall<Order>) {}
        ),
    );
    assert!(compile_errors(&file).is_empty());
    let all = text(&file);
    assert!(all.contains("\"billing.process\""));
    assert!(all.contains(". when :: < Order , _ > (| _ , order | order . data . total > 0)"));
    assert!(all.contains("my :: rf :: __private :: Produce :: declared"));
    assert!(!all.contains("reactifact_core"));
}

#[test]
fn event_kinds_and_debounce_become_builder_calls() {
    let file = produce(
        quote!(Receipt, on = [deleted, created], debounce, stale),
        quote!(
            async fn process_order(call: ProduceCall<Order>) {}
        ),
    );
    assert!(compile_errors(&file).is_empty());
    let all = text(&file);
    assert!(
        all.contains(
            ". on ([:: reactifact_core :: __private :: EventKind :: Deleted , :: reactifact_core :: __private :: EventKind :: Created])"
        ),
        "{all}"
    );
    assert!(all.contains(". debounce () . stale ()"), "{all}");

    // Without them, neither call: the produce keeps the defaults.
    let all = text(&order_produce());
    assert!(
        !all.contains(". on (") && !all.contains(". debounce (") && !all.contains(". stale ("),
        "{all}"
    );
}

#[test]
fn bad_event_kinds_are_each_reported() {
    let file = produce(
        quote!(Receipt, on = [created, deletd, created]),
        quote!(
            async fn process_order(call: ProduceCall<Order>) {}
        ),
    );
    assert_eq!(
        compile_errors(&file),
        [
            "unknown event kind `deletd` (did you mean `deleted`?); expected `created`, `updated`, `deleted`",
            "event kind `created` is listed twice; give it once",
        ]
    );
}

#[test]
fn no_outputs_declare_nothing() {
    let file = produce(
        quote!(),
        quote!(
            async fn touch(call: ProduceCall<Order>) {}
        ),
    );
    assert!(compile_errors(&file).is_empty());
    let all = text(&file);
    assert!(all.contains("(\"touch\" , touch :: run)"));
    assert!(!all.contains("creates"));
    assert!(!all.contains("DeclaredOutput"));
}

#[test]
fn every_mistake_is_reported_in_one_expansion() {
    let file = produce(
        quote!(
            Receipt,
            also_creates = [Receipt],
            colour = "blue",
            name = "a",
            name = "b"
        ),
        quote!(
            fn process_order(order: Order, extra: u8) -> u64 {
                0
            }
        ),
    );
    let errors = compile_errors(&file);
    let expected = [
        "`Receipt` is declared twice",
        "unknown option `colour`",
        "duplicate option `name`",
        "must be an `async fn`",
        "returns `u64`",
        "takes exactly one parameter",
        "takes `ProduceCall<T>`",
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:#?}");
    for (error, expected) in errors.iter().zip(expected) {
        assert!(error.contains(expected), "{error:?} should contain {expected:?}");
    }
}

#[test]
fn on_error_the_function_is_still_emitted_under_its_names() {
    let item = quote!(
        fn process_order(call: ProduceCall<Order>) {
            let _ = call;
        }
    );
    let file = produce(quote!(Receipt), item);
    assert_eq!(compile_errors(&file).len(), 1);
    let all = text(&file);
    assert!(all.contains("struct process_order { }"));
    assert!(all.contains("fn run (call : ProduceCall < Order >) { let _ = call ; }"));
    assert!(all.contains("fn process_order () -> :: reactifact_core :: __private :: Produce"));
    // The declared types are still named, so their imports stay used.
    assert!(all.contains("DeclaredOutput < process_order > for Receipt"));

    // So are its resources: the body's `call.resource::<Model>()` still type-checks them.
    let file = produce(
        quote!(Receipt, uses = [Model]),
        quote!(
            fn process_order(call: ProduceCall<Order>) {}
        ),
    );
    assert_eq!(compile_errors(&file).len(), 1);
    assert!(text(&file)
        .contains("impl :: reactifact_core :: __private :: DeclaredResource < process_order > for Model { }"));
}

#[test]
fn an_item_that_is_not_a_function_is_returned_with_the_error() {
    let out = produce_tokens(
        quote!(Receipt),
        quote!(
            struct Order;
        ),
    );
    let file: syn::File = syn::parse2(out).unwrap();
    assert_eq!(compile_errors(&file).len(), 1);
    assert!(text(&file).contains("struct Order ;"));
}

#[test]
fn a_malformed_argument_list_keeps_the_function() {
    let file = produce(
        quote!(also_creates = Receipt),
        quote!(
            async fn p(call: ProduceCall<Order>) {}
        ),
    );
    let errors = compile_errors(&file);
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("expected square brackets"), "{errors:?}");
    assert!(text(&file).contains("async fn run"));
}

fn derive(item: TokenStream) -> syn::File {
    syn::parse2(derive_artifact_tokens(item)).unwrap()
}

#[test]
fn derive_artifact_defaults_to_the_snake_case_name() {
    let file = derive(quote!(
        struct PurchaseOrder {
            total: u64,
        }
    ));
    assert_eq!(
        text(&file),
        text(&quote! {
            #[automatically_derived]
            impl ::reactifact_core::__private::Artifact for PurchaseOrder {
                const KIND: &'static ::reactifact_core::__private::str = "purchase_order";
            }
        })
    );
}

#[test]
fn derive_artifact_takes_the_kind_and_crate_from_the_attribute() {
    let file = derive(quote! {
        #[artifact(kind = "billing.receipt", crate = my::rf)]
        enum Receipt { Paid, Free }
    });
    let all = text(&file);
    assert!(all.contains("impl my :: rf :: __private :: Artifact for Receipt"));
    assert!(all.contains("\"billing.receipt\""));
}

#[test]
fn derive_artifact_refuses_unions_generics_and_bad_options() {
    let union = derive(quote!(union Amount { cents: u64, units: u32 }));
    assert!(compile_errors(&union)[0].contains("is a union"));
    assert!(!text(&union).contains("impl"));

    let generic = derive(quote!(
        struct Envelope<T> {
            body: T,
        }
    ));
    assert!(compile_errors(&generic)[0].contains("needs a concrete type"));

    let options = derive(quote! {
        #[artifact(kind = "a", kind = "b")]
        #[artifact(knd = "c")]
        struct Invoice;
    });
    let errors = compile_errors(&options);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].contains("duplicate option `kind`") || errors[1].contains("duplicate option `kind`"));
    assert!(errors.iter().any(|e| e.contains("did you mean `kind`?")));
    // The impl is still emitted, so uses of `Invoice` elsewhere add no errors.
    assert!(text(&options).contains("Artifact for Invoice"));
}
