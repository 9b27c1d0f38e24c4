//! Parsing `#[derive(Artifact)]`: the type and its `#[artifact(..)]` attributes.

use proc_macro2::TokenStream;
use syn::{DeriveInput, Ident, LitStr, Path};

use crate::errors::Errors;

/// One `key = value` of an `#[artifact(..)]` attribute, as written.
pub(crate) enum RawArtifactArg {
    /// `kind = "…"`.
    Kind { key: Ident, value: LitStr },
    /// `crate = path`.
    Crate { key: Ident, path: Path },
}

/// What `#[derive(Artifact)]` receives.
pub(crate) struct ArtifactInput {
    pub(crate) item: DeriveInput,
    pub(crate) args: Vec<RawArtifactArg>,
    /// Malformed or unknown `#[artifact(..)]` entries.
    pub(crate) errors: Errors,
}

/// Parses the derive input and every `#[artifact(..)]` attribute on it.
pub(crate) fn parse(item: TokenStream) -> syn::Result<ArtifactInput> {
    let item = syn::parse2::<DeriveInput>(item)?;
    let mut args = Vec::new();
    let mut errors = Errors::default();
    for attr in item.attrs.iter().filter(|a| a.path().is_ident("artifact")) {
        let parsed = attr.parse_nested_meta(|meta| {
            let key = meta.path.get_ident().cloned();
            match key {
                Some(key) if key == "kind" => {
                    let value = meta.value()?.parse()?;
                    args.push(RawArtifactArg::Kind { key, value });
                    Ok(())
                }
                Some(key) if key == "crate" => {
                    let path = Path::parse_mod_style(meta.value()?)?;
                    args.push(RawArtifactArg::Crate { key, path });
                    Ok(())
                }
                _ => {
                    let written = crate::errors::display(&meta.path);
                    let hint = crate::suggest::closest(&written, &["kind", "crate"])
                        .map(|o| format!(" (did you mean `{o}`?)"))
                        .unwrap_or_default();
                    Err(meta.error(format_args!(
                        "unknown option `{written}` in `#[artifact(..)]`{hint}; expected `kind = \"…\"` or `crate = path`"
                    )))
                }
            }
        });
        if let Err(e) = parsed {
            errors.push(e);
        }
    }
    Ok(ArtifactInput { item, args, errors })
}
