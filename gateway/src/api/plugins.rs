//! Plugin routes: upload (validated, then written atomically), list, read.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::Serialize;
use utoipa::ToSchema;

use super::doc::ErrorCode;
use super::extract::{Manage, Path, PluginPath, Read, TenantAuth, TenantPath};
use super::{ApiError, AppState};
use crate::plugin::{Hook, PluginError, PluginInfo};

/// A plugin: the version serving calls, if any, and the last load error.
#[derive(Serialize, ToSchema)]
pub(crate) struct PluginOut {
    name: String,
    /// `transform`, `classify`, `sign`: the hooks of the serving version.
    hooks: Vec<&'static str>,
    /// Hex SHA-256 of the serving version; empty when none serves.
    sha256: String,
    size: u64,
    /// What the plugin's `describe` says.
    plugin_name: String,
    plugin_version: String,
    /// The statuses `classify` is called for; null: every outcome.
    classify_statuses: Option<Vec<u16>>,
    /// RFC 3339.
    loaded_at: Option<String>,
    /// Milliseconds loading the serving version took: compiling (or mapping the compiled
    /// copy), instantiating, `describe` (for JavaScript, evaluating the source). The
    /// upload or reload pays it; a call's duration does not include it.
    load_ms: Option<f64>,
    /// Being loaded in the background; bound deliveries wait.
    loading: bool,
    /// Why the newest file is not serving (the previous version keeps serving).
    error: Option<String>,
    /// The stored version that serves (see `…/versions`): an upload's, or the one a file
    /// the operator dropped in was recorded as when it loaded; null while none serves.
    version: Option<u32>,
}

/// A plugin with how its calls went.
#[derive(Serialize, ToSchema)]
pub(crate) struct PluginDetail {
    #[serde(flatten)]
    plugin: PluginOut,
    stats: super::plugin_stats::StatsOut,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct PluginList {
    data: Vec<PluginOut>,
}

pub(super) fn view(p: &PluginInfo) -> PluginOut {
    let loaded_at = p
        .loaded_at
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| crate::clock::rfc3339(d.as_millis() as i64));
    PluginOut {
        name: p.name.clone(),
        hooks: p.hooks.iter().map(Hook::as_str).collect(),
        sha256: p.sha256.clone(),
        size: p.size,
        plugin_name: p.plugin_name.clone(),
        plugin_version: p.plugin_version.clone(),
        classify_statuses: p.classify_statuses.clone(),
        loaded_at,
        load_ms: p.load_time.map(|d| (d.as_micros() / 100) as f64 / 10.0),
        loading: p.loading,
        error: p.error.clone(),
        version: p.version,
    }
}

/// A plugin the tenant has (serving, loading or broken), else `404`.
pub(super) fn exists(state: &AppState, tenant: &crate::model::TenantId, name: &str) -> Result<(), ApiError> {
    match state.plugins.list(tenant.as_str()).iter().any(|p| p.name == name) {
        true => Ok(()),
        false => Err(ApiError::not_found("plugin")),
    }
}

impl From<PluginError> for ApiError {
    fn from(e: PluginError) -> Self {
        if let PluginError::NoSuchVersion { .. } = e {
            return ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, e.to_string());
        }
        if let PluginError::TenantLimit { .. } = e {
            return ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::PluginLimit, e.to_string());
        }
        if let PluginError::TooLarge { .. } = e {
            return ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge, e.to_string());
        }
        if e.is_client_error() {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::InvalidPlugin, e.to_string())
        } else {
            tracing::error!(error = %e, "plugin install failed");
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::PluginUnavailable, e.to_string())
        }
    }
}

/// `PUT /v1/tenants/{tenant}/plugins/{name}` with the `.wasm` bytes (or JavaScript source)
/// as the body.
///
/// The body is a stream, read only after the token is checked (the `TenantAuth` extractor
/// runs first) and only up to the plugin size limit: an unauthenticated or oversized upload
/// costs no memory.
#[utoipa::path(
    put, path = "/v1/tenants/{tenant}/plugins/{name}", tag = "plugins", operation_id = "upload_plugin",
    params(PluginPath),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The `.wasm` bytes of a WebAssembly component (`wasm32-wasip2`), or JavaScript source (UTF-8) run on Herald's JavaScript runtime"),
    responses((status = 200, description = "Validated and installed", body = PluginOut)),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn upload(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(PluginPath { name, .. }): Path<PluginPath>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<PluginOut>, ApiError> {
    let (limit, key) = state.plugins.upload_limit(tenant.as_str());
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            format!("plugin is over the limit of {limit} bytes ({key})"),
        )
    };
    let declared = headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let body = axum::body::to_bytes(body, limit).await.map_err(|e| {
        // Besides the limit: the body pausing too long, or the client's connection failing.
        if std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) {
            too_large()
        } else if let Some(timeout) = super::listen::BodyTimeout::behind(&e) {
            ApiError::body_timeout(timeout)
        } else {
            ApiError::bad_request(format!("cannot read the body: {e}"))
        }
    })?;
    // Under the tenant's binding lock: no endpoint pins a version that this upload's
    // pruning is about to delete.
    let _bindings = state.plugin_locks.lock(&tenant).await;
    let pinned = super::bindings::pinned_versions(&state, &tenant, &name).await?;
    let installed = state.plugins.install_keeping(tenant.as_str(), &name, body.to_vec(), pinned).await;
    let info = installed.inspect_err(|e| {
        // The tenant's bytes are at fault: the tenant's error, not the operator's.
        if e.is_client_error() {
            tracing::info!(tenant = %tenant, plugin = %name, error = %e, "plugin upload refused");
        }
    })?;
    Ok(Json(view(&info)))
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/plugins", tag = "plugins", operation_id = "list_plugins",
    params(TenantPath),
    responses((status = 200, description = "The tenant's plugins", body = PluginList)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, reach, .. }: TenantAuth<Read>,
) -> Result<Json<PluginList>, ApiError> {
    let mut data = Vec::new();
    // A portal session limited to some endpoints lists the plugins it reaches.
    for p in state.plugins.list(tenant.as_str()) {
        if reach.plugin(&state, &tenant, &p.name).await? {
            data.push(view(&p));
        }
    }
    Ok(Json(PluginList { data }))
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/plugins/{name}", tag = "plugins", operation_id = "get_plugin",
    params(PluginPath),
    responses((status = 200, description = "The plugin, with how its calls went", body = PluginDetail)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Path(PluginPath { name, .. }): Path<PluginPath>,
) -> Result<Json<PluginDetail>, ApiError> {
    let info = state
        .plugins
        .list(tenant.as_str())
        .into_iter()
        .find(|p| p.name == name)
        .ok_or_else(|| ApiError::not_found("plugin"))?;
    let stats = state.plugins.stats(tenant.as_str(), &name).unwrap_or_default();
    Ok(Json(PluginDetail { plugin: view(&info), stats: super::plugin_stats::view(&stats) }))
}
