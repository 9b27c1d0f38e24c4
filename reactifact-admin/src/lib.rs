//! The reactifact operator console's JSON API: an axum [`Router`] that a service mounts under
//! any prefix (`Router::new().nest("/admin", reactifact_admin::router(config))`), or that
//! `reactifact console` serves on its own.
//!
//! It works on an opened [`Store`](store::Store) through the store's own operations only —
//! reads, and the outbox's fenced approve, reject, retry and cancel — so it is safe while
//! runtimes and drainers run. Every request needs a bearer token ([`Token`]) with a [`Role`];
//! state-changing requests need the operator role and the header `X-Reactifact-Csrf: 1`;
//! payloads are shown as SHA-256 and size unless [`Config::show_payloads`]. Its documents are
//! the CLI's `--json` documents, built by [`json`] for both. See `docs/console.md`.

mod api;
mod auth;
mod config;
mod error;
pub mod json;
pub mod json_value;
mod params;
pub mod store;

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;

pub use auth::{Principal, CSRF_HEADER};
pub use config::{Config, Role, Token, TokenError, MIN_SECRET_LEN};

/// The API's router over `config`: every route behind the authentication middleware.
pub fn router(config: Config) -> Router {
    let shared = Arc::new(api::Shared { config });
    Router::new()
        .route("/sessions", get(api::sessions))
        .route("/sessions/{session}/log", get(api::log))
        .route("/sessions/{session}/artifacts/{id}", get(api::artifact))
        .route("/outbox", get(api::outbox))
        .route("/outbox/counts", get(api::counts))
        .route("/outbox/{key}", get(api::intent))
        .route("/outbox/{key}/approve", post(api::approve))
        .route("/outbox/{key}/reject", post(api::reject))
        .route("/outbox/{key}/retry", post(api::retry))
        .route("/outbox/{key}/cancel", post(api::cancel))
        .route("/approvals", get(api::approvals))
        .route("/verify", get(api::verify))
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::wrong_method)
        .layer(axum::middleware::from_fn_with_state(shared.clone(), auth::authenticate))
        .with_state(shared)
}

/// The examples of the console guide (`docs/console.md`), compiled as doctests.
#[doc = include_str!("../../docs/console.md")]
#[cfg(doctest)]
pub struct ConsoleGuideDoctests;
