//! The API's one error type: a status, a stable machine code and a message, answered as
//! `{"error": {code, message}}`; the store's, intake's and the spec's errors map to it here.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::doc::{self, ErrorCode};
use super::listen;
use crate::intake::IntakeError;
use crate::store::StoreError;

/// An API error: a status, a stable machine code and a human message.
#[derive(Debug)]
pub struct ApiError {
    pub(super) status: StatusCode,
    pub(super) code: ErrorCode,
    pub(super) message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }
    /// `408`: the body paused longer than `server.body_read_timeout`.
    pub fn body_timeout(timeout: &listen::BodyTimeout) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, ErrorCode::RequestTimeout, timeout.to_string())
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest, message)
    }
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::InvalidRequest, message)
    }
    pub fn not_found(what: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, format!("{what} not found"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = doc::ErrorBody { error: doc::ErrorDetail { code: self.code, message: self.message } };
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, m),
            StoreError::NotFound(m) => ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, m),
            StoreError::Backend(m) => {
                tracing::error!(error = %m, "storage error");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::StorageUnavailable,
                    "storage is unavailable; nothing was accepted",
                )
            }
            // Logged once by the committer when the store became unreachable, not per request.
            StoreError::Unreachable => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::StorageUnavailable,
                "storage is unreachable; nothing was accepted",
            ),
        }
    }
}

impl From<IntakeError> for ApiError {
    fn from(e: IntakeError) -> Self {
        match e {
            IntakeError::Invalid(m) => ApiError::bad_request(m),
            IntakeError::Schema(m) => ApiError::unprocessable(m),
            e @ IntakeError::TooDeep { .. } => ApiError::unprocessable(e.to_string()),
            e @ IntakeError::Conflict { .. } => ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, e.to_string()),
            e @ IntakeError::TooLarge { .. } => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge, e.to_string())
            }
            IntakeError::Store(s) => s.into(),
        }
    }
}

impl From<crate::spec::SpecError> for ApiError {
    fn from(e: crate::spec::SpecError) -> Self {
        ApiError::unprocessable(e.to_string())
    }
}
