//! Plugin routes: upload (validated, then written atomically), list, read.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::extract::{Manage, Path, Read, TenantAuth};
use super::{ApiError, AppState};
use crate::plugin::{Hook, PluginError, PluginInfo};

fn view(p: &PluginInfo) -> Value {
    let loaded_at = p
        .loaded_at
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| crate::clock::rfc3339(d.as_millis() as i64));
    json!({
        "name": p.name,
        "hooks": p.hooks.iter().map(Hook::as_str).collect::<Vec<_>>(),
        "sha256": p.sha256,
        "size": p.size,
        "plugin_name": p.plugin_name,
        "plugin_version": p.plugin_version,
        "classify_statuses": p.classify_statuses,
        "loaded_at": loaded_at,
        "loading": p.loading,
        "error": p.error,
    })
}

impl From<PluginError> for ApiError {
    fn from(e: PluginError) -> Self {
        if let PluginError::TenantLimit { .. } = e {
            return ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "plugin_limit", e.to_string());
        }
        if e.is_client_error() {
            let status = if matches!(e, PluginError::TooLarge { .. }) {
                StatusCode::PAYLOAD_TOO_LARGE
            } else {
                StatusCode::UNPROCESSABLE_ENTITY
            };
            ApiError::new(status, "invalid_plugin", e.to_string())
        } else {
            tracing::error!(error = %e, "plugin install failed");
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "plugin_unavailable", e.to_string())
        }
    }
}

/// `PUT /v1/tenants/{tenant}/plugins/{name}` with the `.wasm` bytes as the body.
///
/// The body is a stream, read only after the token is checked (the `TenantAuth` extractor
/// runs first) and only up to the plugin size limit: an unauthenticated or oversized upload
/// costs no memory.
pub(crate) async fn upload(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path((_, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let limit = state.config.plugins.max_plugin_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_plugin",
            format!("plugin is over the limit of {limit} bytes"),
        )
    };
    let declared = headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let body = axum::body::to_bytes(body, limit).await.map_err(|e| {
        // The only error besides the limit is the client's connection failing mid-body.
        if std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) {
            too_large()
        } else {
            ApiError::bad_request(format!("cannot read the body: {e}"))
        }
    })?;
    let info = state.plugins.install(tenant.as_str(), &name, body.to_vec()).await?;
    Ok(Json(view(&info)))
}

pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
) -> Result<Json<Value>, ApiError> {
    let items: Vec<Value> = state.plugins.list(tenant.as_str()).iter().map(view).collect();
    Ok(Json(json!({ "data": items })))
}

pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Path((_, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let info = state
        .plugins
        .list(tenant.as_str())
        .into_iter()
        .find(|p| p.name == name)
        .ok_or_else(|| ApiError::not_found("plugin"))?;
    Ok(Json(view(&info)))
}
