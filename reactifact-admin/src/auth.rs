//! Every request's authentication and authorization: a bearer token compared in constant
//! time, the operator role for state-changing requests, and the CSRF proof they carry.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::api::Shared;
use crate::config::{Role, Token};
use crate::error::ApiError;

/// The header a state-changing request must carry, with the value `1`: a browser sends no
/// custom header on a cross-site form post or simple request, and a cross-site script cannot
/// add one without a CORS preflight, which this router never grants.
pub const CSRF_HEADER: &str = "x-reactifact-csrf";

/// Who made a request, as its token says: in the request's extensions after authentication.
#[derive(Clone, Debug)]
pub struct Principal {
    /// The token's principal name.
    pub name: String,
    /// The token's role.
    pub role: Role,
}

/// `a == b` in time that depends on neither's content: the SHA-256 digests of both are
/// compared byte by byte without an early exit.
fn same(a: &str, b: &str) -> bool {
    let (x, y) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    x.iter().zip(y.iter()).fold(0u8, |acc, (p, q)| acc | (p ^ q)) == 0
}

/// The token `presented` matches, checked against every token (no early exit).
fn find<'a>(tokens: &'a [Token], presented: &str) -> Option<&'a Token> {
    let mut found = None;
    for token in tokens {
        if same(&token.secret, presented) && found.is_none() {
            found = Some(token);
        }
    }
    found
}

fn unauthorized(message: &str) -> Response {
    let mut response = ApiError {
        status: StatusCode::UNAUTHORIZED,
        message: message.to_owned(),
    }
    .into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

fn forbidden(message: &str) -> Response {
    ApiError {
        status: StatusCode::FORBIDDEN,
        message: message.to_owned(),
    }
    .into_response()
}

/// The middleware: authenticates, authorizes, and hands the request on with its
/// [`Principal`].
pub(crate) async fn authenticate(State(shared): State<Arc<Shared>>, mut request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(presented) = presented else {
        return unauthorized("missing bearer token: send `Authorization: Bearer TOKEN`");
    };
    let Some(token) = find(&shared.config.tokens, presented) else {
        return unauthorized("the bearer token is not valid");
    };
    let method = request.method();
    if method != Method::GET && method != Method::HEAD {
        if token.role != Role::Operator {
            return forbidden(&format!(
                "token `{}` is read-only; this request changes state and needs an operator token",
                token.principal
            ));
        }
        let proof = request.headers().get(CSRF_HEADER).map(HeaderValue::as_bytes);
        if proof != Some(b"1".as_slice()) {
            return forbidden("a state-changing request must carry the header `X-Reactifact-Csrf: 1`");
        }
    }
    let principal = Principal {
        name: token.principal.clone(),
        role: token.role,
    };
    request.extensions_mut().insert(principal);
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_themselves() {
        let tokens = vec![
            Token::new("ada", "0123456789abcdef", Role::Operator).unwrap(),
            Token::new("bob", "fedcba9876543210", Role::ReadOnly).unwrap(),
        ];
        assert_eq!(find(&tokens, "0123456789abcdef").map(|t| t.principal()), Some("ada"));
        assert_eq!(find(&tokens, "fedcba9876543210").map(|t| t.principal()), Some("bob"));
        assert!(find(&tokens, "0123456789abcde").is_none());
        assert!(find(&tokens, "0123456789abcdef0").is_none());
        assert!(find(&tokens, "").is_none());
    }
}
