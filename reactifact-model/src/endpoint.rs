//! The endpoint a client posts to: `{base_url}/chat/completions`, checked, and shown with its
//! secrets hidden.

use reqwest::Url;

use crate::error::BuildError;

/// `{base_url}/chat/completions`, checked: `http`, or `https` with the `rustls` feature.
pub(crate) fn endpoint(base_url: &str) -> Result<Url, BuildError> {
    let invalid = |reason: String| BuildError::InvalidUrl {
        url: base_url.to_owned(),
        reason,
    };
    let mut url = Url::parse(base_url).map_err(|error| invalid(error.to_string()))?;
    let refuse = |url: &Url, reason: &str| BuildError::UnsupportedScheme {
        url: shown(url),
        reason: reason.to_owned(),
    };
    match url.scheme() {
        "http" => {}
        "https" if cfg!(feature = "rustls") => {}
        "https" => {
            return Err(refuse(
                &url,
                "https needs TLS: build reactifact-model with the `rustls` feature",
            ))
        }
        _ => return Err(refuse(&url, "only http and https servers can be asked")),
    }
    url.set_fragment(None);
    url.path_segments_mut()
        .map_err(|()| invalid("it cannot have a path".to_owned()))?
        .pop_if_empty()
        .extend(["chat", "completions"]);
    Ok(url)
}

/// The URL as messages show it: any password and the query string are hidden, since either
/// may hold a secret.
pub(crate) fn shown(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    shown.set_fragment(None);
    let had_query = shown.query().is_some();
    shown.set_query(None);
    let mut text = String::from(shown);
    if had_query {
        text.push_str("?…");
    }
    text
}

/// An error's causes on one line. reqwest's own outer message ("error sending request") is
/// left out when there is a cause, since the caller's message already says what failed.
pub(crate) fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let Some(first) = error.source() else {
        return error.to_string();
    };
    let mut out = first.to_string();
    let mut source = first.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_under_the_base_url_with_or_without_a_slash() {
        for base in ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/"] {
            assert_eq!(
                endpoint(base).unwrap().as_str(),
                "http://127.0.0.1:8000/v1/chat/completions"
            );
        }
        for base in ["http://127.0.0.1:8000", "http://127.0.0.1:8000/"] {
            assert_eq!(
                endpoint(base).unwrap().as_str(),
                "http://127.0.0.1:8000/chat/completions"
            );
        }
        let with_query = endpoint("http://h/openai/?api-version=1#top").unwrap();
        assert_eq!(with_query.as_str(), "http://h/openai/chat/completions?api-version=1");
        assert_eq!(shown(&with_query), "http://h/openai/chat/completions?…");
        let with_password = endpoint("http://user:pw@h/v1").unwrap();
        assert_eq!(shown(&with_password), "http://user:***@h/v1/chat/completions");
    }

    #[test]
    fn bad_base_urls_are_refused() {
        assert!(matches!(endpoint("not a url"), Err(BuildError::InvalidUrl { .. })));
        assert!(matches!(
            endpoint("ftp://h/v1"),
            Err(BuildError::UnsupportedScheme { .. })
        ));
        assert!(matches!(
            endpoint("mailto:a@b"),
            Err(BuildError::UnsupportedScheme { .. })
        ));
        let https = endpoint("https://user:pw@api.example.invalid/v1");
        if cfg!(feature = "rustls") {
            assert!(https.is_ok());
        } else {
            let error = https.unwrap_err();
            assert!(error.to_string().contains("rustls"), "{error}");
            assert!(!error.to_string().contains("pw"), "{error}");
        }
    }
}
