//! Parsing `#[produce(..)]`: its argument list and the annotated function.

use proc_macro2::{TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{bracketed, Expr, Ident, ItemFn, LitStr, Path, Token, Type};

/// One entry of the argument list, as written.
pub(crate) enum RawArg {
    /// A bare type: the primary output, e.g. `Receipt`.
    Output(Type),
    /// `also_creates = [A, B]`.
    AlsoCreates {
        key: Ident,
        types: Punctuated<Type, Token![,]>,
    },
    /// `uses = [Model, Config]`: the resources the produce reads with `call.resource`.
    Uses {
        key: Ident,
        types: Punctuated<Type, Token![,]>,
    },
    /// `tools = [IssueRefund, LookupOrder]`: the tools a model may call through the produce.
    Tools {
        key: Ident,
        types: Punctuated<Type, Token![,]>,
    },
    /// `name = "…"`.
    Name { key: Ident, value: LitStr },
    /// `when = <expr>`: a condition `Fn(&Snapshot, &Record<T>) -> bool`.
    When { key: Ident, condition: Expr },
    /// `crate = path`: where `reactifact-core` is, for re-exporters.
    Crate { key: Ident, path: Path },
    /// `on = [created, updated, deleted]`: the event kinds the produce reacts to.
    On {
        key: Ident,
        brackets: proc_macro2::Span,
        kinds: Punctuated<Ident, Token![,]>,
    },
    /// `key = <expr>`: the trigger's join key, `Fn(&Record<T>) -> K`.
    Key { key: Ident, function: Expr },
    /// `join(P, key = <expr>)` or `absent(P, key = <expr>)`: a part of a join, with its key
    /// function `Fn(&Record<P>) -> K`.
    Join { key: Ident, part: Type, function: Expr },
    /// A bare flag: `debounce` or `stale`.
    Flag { key: Ident },
    /// `something = …` with a key no option has; its value is skipped.
    Unknown { key: Ident },
}

/// The argument list of `#[produce(..)]`, in order.
pub(crate) struct RawArgs {
    pub(crate) args: Vec<RawArg>,
}

impl Parse for RawArgs {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Vec::new();
        while !input.is_empty() {
            args.push(input.parse()?);
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(RawArgs { args })
    }
}

impl Parse for RawArg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if is_flag(input) {
            return Ok(RawArg::Flag {
                key: Ident::parse_any(input)?,
            });
        }
        if (input.peek(Ident::peek_any) && input.peek2(syn::token::Paren)) && is_join(input) {
            let key = Ident::parse_any(input)?;
            let content;
            syn::parenthesized!(content in input);
            let part: Type = content.parse()?;
            let option = match key.to_string().as_str() {
                "join" => "join",
                _ => "absent",
            };
            let missing = |span| {
                syn::Error::new(
                    span,
                    format_args!(
                        "`{option}` takes the part's type and its key: `{option}({}, key = |p| ..)`",
                        crate::errors::display(&part)
                    ),
                )
            };
            if content.is_empty() {
                return Err(missing(syn::spanned::Spanned::span(&part)));
            }
            content.parse::<Token![,]>()?;
            let word = Ident::parse_any(&content).map_err(|e| missing(e.span()))?;
            if word != "key" {
                return Err(missing(word.span()));
            }
            content.parse::<Token![=]>()?;
            let function: Expr = content.parse()?;
            if !content.is_empty() {
                content.parse::<Token![,]>()?;
                if !content.is_empty() {
                    return Err(content.error(format_args!("unexpected argument; `{option}` takes `(Type, key = ..)`")));
                }
            }
            return Ok(RawArg::Join { key, part, function });
        }
        let is_option = input.peek(Ident::peek_any) && input.peek2(Token![=]) && !input.peek2(Token![==]);
        if !is_option {
            return Ok(RawArg::Output(input.parse()?));
        }
        let key = Ident::parse_any(input)?;
        input.parse::<Token![=]>()?;
        Ok(match key.to_string().as_str() {
            "also_creates" => {
                let content;
                bracketed!(content in input);
                let types = Punctuated::parse_terminated(&content)?;
                RawArg::AlsoCreates { key, types }
            }
            "uses" => {
                let content;
                bracketed!(content in input);
                // syn's own message lists every token a type may start with; say what belongs here.
                let types = Punctuated::parse_terminated(&content).map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "expected a resource type: `uses` lists the types the produce reads, separated by commas, \
                         e.g. `uses = [ModelConfig, Prompt]`",
                    )
                })?;
                RawArg::Uses { key, types }
            }
            "tools" => {
                let content;
                bracketed!(content in input);
                let types = Punctuated::parse_terminated(&content).map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "expected a tool type: `tools` lists the tools a model may call through the produce, \
                         separated by commas, e.g. `tools = [IssueRefund, LookupOrder]`",
                    )
                })?;
                RawArg::Tools { key, types }
            }
            "name" => RawArg::Name {
                key,
                value: input.parse()?,
            },
            "when" => RawArg::When {
                key,
                condition: input.parse()?,
            },
            "key" => RawArg::Key {
                key,
                function: input.parse()?,
            },
            "on" => {
                let content;
                let brackets = bracketed!(content in input);
                let kinds = Punctuated::parse_terminated_with(&content, Ident::parse_any)?;
                RawArg::On {
                    key,
                    brackets: brackets.span.join(),
                    kinds,
                }
            }
            "crate" => RawArg::Crate {
                key,
                path: Path::parse_mod_style(input)?,
            },
            _ => {
                skip_value(input)?;
                RawArg::Unknown { key }
            }
        })
    }
}

/// The bare flags `#[produce]` knows.
pub(crate) const FLAGS: &[&str] = &["debounce", "stale"];

/// Whether the next argument is a bare flag: a lowercase name of one that is the whole
/// argument (a type named like it would be a primary output, which comes first and is
/// capitalised by convention).
fn is_flag(input: ParseStream<'_>) -> bool {
    let fork = input.fork();
    let Ok(ident) = Ident::parse_any(&fork) else {
        return false;
    };
    FLAGS.contains(&ident.to_string().as_str()) && (fork.is_empty() || fork.peek(Token![,]))
}

/// Whether the next argument is `join(..)` or `absent(..)`.
fn is_join(input: ParseStream<'_>) -> bool {
    let fork = input.fork();
    Ident::parse_any(&fork).is_ok_and(|ident| ident == "join" || ident == "absent")
}

/// Skips the tokens of an unknown option's value, up to the next top-level comma.
fn skip_value(input: ParseStream<'_>) -> syn::Result<()> {
    while !input.is_empty() && !input.peek(Token![,]) {
        input.parse::<TokenTree>()?;
    }
    Ok(())
}

/// What `#[produce]` receives: its arguments and the function, parsed independently so that a
/// malformed argument list still lets the function be emitted.
pub(crate) struct ProduceInput {
    pub(crate) args: syn::Result<RawArgs>,
    pub(crate) function: ItemFn,
}

/// Parses the attribute's arguments and the annotated item. Fails only when the item is not a
/// function at all.
pub(crate) fn parse(attr: TokenStream, item: TokenStream) -> syn::Result<ProduceInput> {
    let function = syn::parse2::<ItemFn>(item).map_err(|e| {
        syn::Error::new(
            e.span(),
            format_args!("`#[produce]` goes on an `async fn` taking one `ProduceCall<T>`: {e}"),
        )
    })?;
    Ok(ProduceInput {
        args: syn::parse2(attr),
        function,
    })
}
