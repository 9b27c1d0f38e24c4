//! Generating `impl Artifact`.

use proc_macro2::TokenStream;
use quote::quote;

use crate::validate::artifact::ArtifactModel;

/// `impl ::reactifact_core::__private::Artifact for Order { const KIND: &'static str = "order"; }`
pub(crate) fn expand(model: &ArtifactModel) -> TokenStream {
    let ArtifactModel { item, kind, krate } = model;
    let ident = &item.ident;
    let (impl_generics, ty_generics, where_clause) = item.generics.split_for_impl();
    quote! {
        #[automatically_derived]
        impl #impl_generics #krate::__private::Artifact for #ident #ty_generics #where_clause {
            const KIND: &'static #krate::__private::str = #kind;
        }
    }
}
