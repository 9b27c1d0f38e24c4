//! How a request fails: a status and `{ "error": MESSAGE }`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use reactifact_core::error::{OpenError, StoreError};
use serde_json::json;

use crate::store::StoreOpenError;

/// A failed request: 4xx for what the request got wrong, 503 for a store that failed.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
        }
    }

    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::CONFLICT,
            message: message.into(),
        }
    }

    pub(crate) fn store(e: impl std::fmt::Display) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!("the store failed: {e}"),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::store(e)
    }
}

impl From<StoreOpenError> for ApiError {
    fn from(e: StoreOpenError) -> Self {
        match e {
            StoreOpenError::Open { source, .. } if matches!(*source, OpenError::NoSuchSession { .. }) => {
                ApiError::not_found(source.to_string())
            }
            e => ApiError::store(e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}
