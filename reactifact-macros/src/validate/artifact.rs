//! Checking a `#[derive(Artifact)]`.

use syn::{Data, DeriveInput, GenericParam, Ident, LitStr};

use crate::kind_name::snake_case;
use crate::parse::artifact::{ArtifactInput, RawArtifactArg};

/// A checked artifact type.
pub(crate) struct ArtifactModel {
    pub(crate) item: DeriveInput,
    /// The kind name: `#[artifact(kind = "…")]`, else the type name in snake_case.
    pub(crate) kind: LitStr,
    pub(crate) krate: syn::Path,
}

/// A derive that failed validation.
pub(crate) struct InvalidArtifact {
    pub(crate) error: syn::Error,
    /// The impl to emit anyway, when the type can have one.
    pub(crate) fallback: Option<ArtifactModel>,
}

/// Checks the input; on error, also returns a model to emit anyway when one can be built, so
/// that uses of the type elsewhere do not add errors of their own.
pub(crate) fn validate(input: ArtifactInput) -> Result<ArtifactModel, Box<InvalidArtifact>> {
    let ArtifactInput { item, args, mut errors } = input;
    let mut kind: Option<LitStr> = None;
    let mut krate: Option<syn::Path> = None;
    let mut seen: Vec<Ident> = Vec::new();
    for arg in args {
        let key = match &arg {
            RawArtifactArg::Kind { key, .. } | RawArtifactArg::Crate { key, .. } => key.clone(),
        };
        if seen.contains(&key) {
            errors.spanned(
                &key,
                format_args!("duplicate option `{key}` in `#[artifact(..)]`; give it once"),
            );
            continue;
        }
        seen.push(key);
        match arg {
            RawArtifactArg::Kind { value, .. } => {
                if value.value().trim().is_empty() {
                    errors.spanned(&value, "the artifact kind must not be empty");
                }
                kind = Some(value);
            }
            RawArtifactArg::Crate { path, .. } => krate = Some(path),
        }
    }

    let name = &item.ident;
    let mut buildable = true;
    if let Data::Union(data) = &item.data {
        errors.spanned(
            data.union_token,
            format_args!(
                "`#[derive(Artifact)]` is for structs and enums; `{name}` is a union, which serde cannot \
                 serialize. Make it an enum"
            ),
        );
        buildable = false;
    }
    if let Some(param) = item
        .generics
        .params
        .iter()
        .find(|p| matches!(p, GenericParam::Type(_) | GenericParam::Const(_)))
    {
        errors.spanned(
            param,
            format_args!(
                "`#[derive(Artifact)]` needs a concrete type: every instantiation of `{name}` would share one \
                 kind. Implement `Artifact` by hand for each instantiation, each with its own `KIND`"
            ),
        );
        buildable = false;
    }

    let kind = kind.unwrap_or_else(|| LitStr::new(&snake_case(&name.to_string()), name.span()));
    let model = ArtifactModel {
        item,
        kind,
        krate: krate.unwrap_or_else(|| syn::parse_quote!(::reactifact_core)),
    };
    match errors.into_error() {
        None => Ok(model),
        Some(error) => Err(Box::new(InvalidArtifact {
            error,
            fallback: buildable.then_some(model),
        })),
    }
}
