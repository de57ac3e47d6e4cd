//! Plugin routes: upload (validated, then written atomically), list, read.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::{ApiError, AppState, auth, body_bytes};
use crate::model::Scope;
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
pub async fn upload(
    State(state): State<Arc<AppState>>,
    Path((tenant, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Manage).await?;
    let body = body_bytes(body)?;
    if body.len() > state.config.plugins.max_plugin_bytes {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_plugin",
            format!("plugin is {} bytes, over the limit of {}", body.len(), state.config.plugins.max_plugin_bytes),
        ));
    }
    let info = state.plugins.install(tenant.as_str(), &name, body.to_vec()).await?;
    Ok(Json(view(&info)))
}

pub async fn list(
    State(state): State<Arc<AppState>>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Read).await?;
    let items: Vec<Value> = state.plugins.list(tenant.as_str()).iter().map(view).collect();
    Ok(Json(json!({ "data": items })))
}

pub async fn get_one(
    State(state): State<Arc<AppState>>,
    Path((tenant, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Read).await?;
    let info = state
        .plugins
        .list(tenant.as_str())
        .into_iter()
        .find(|p| p.name == name)
        .ok_or_else(|| ApiError::not_found("plugin"))?;
    Ok(Json(view(&info)))
}
