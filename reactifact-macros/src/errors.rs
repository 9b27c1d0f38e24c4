//! Collecting errors so that one build reports every mistake, each spanned on its token.

/// The errors found so far. Push as many as there are; [`Errors::finish`] turns them into one
/// [`syn::Error`] whose `compile_error!`s point at every offending token.
#[derive(Default)]
pub(crate) struct Errors {
    first: Option<syn::Error>,
}

impl Errors {
    /// Records an error.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.first {
            Some(first) => first.combine(error),
            None => self.first = Some(error),
        }
    }

    /// Records an error spanned on `tokens`.
    pub(crate) fn spanned(&mut self, tokens: impl quote::ToTokens, message: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Takes the recorded errors, if any.
    pub(crate) fn into_error(self) -> Option<syn::Error> {
        self.first
    }
}

/// Renders tokens for a message, without the spaces `quote` puts around `<`, `>`, `::` and `,`.
pub(crate) fn display(tokens: &impl quote::ToTokens) -> String {
    let text = tokens.to_token_stream().to_string();
    let mut out = text
        .replace(" :: ", "::")
        .replace(":: ", "::")
        .replace(" < ", "<")
        .replace("< ", "<")
        .replace(" <", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
        .replace("& ", "&");
    if out.starts_with(" ::") {
        out = out.trim_start().to_owned();
    }
    out
}
