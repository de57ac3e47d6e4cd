//! Plugin versions and removal: `GET …/plugins/{name}/versions`, `POST
//! …/plugins/{name}/rollback`, `DELETE …/plugins/{name}` (refused while an endpoint binds
//! the plugin, by name or pinned as `name@n`).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::bindings::binding;
use super::doc::ErrorCode;
use super::extract::{JsonBody, Manage, Path, PluginPath, Read, TenantAuth};
use super::plugins::{PluginOut, exists, view};
use super::{ApiError, AppState};
use crate::plugin::PluginVersion;

/// One stored version of a plugin.
#[derive(Serialize, ToSchema)]
pub(crate) struct VersionOut {
    /// Bind it as `name@version` to pin it; `name` alone follows the serving version.
    version: u32,
    sha256: String,
    size: u64,
    /// RFC 3339: when it was uploaded.
    created_at: Option<String>,
    /// It serves `name` now.
    current: bool,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct VersionList {
    /// Oldest first; the newest `MAX_VERSIONS` (20) uploads are kept.
    data: Vec<VersionOut>,
}

/// Which stored version is to serve `name` again.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RollbackIn {
    version: u32,
}

fn version_view(v: &PluginVersion) -> VersionOut {
    let created_at = v
        .created_at
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| crate::clock::rfc3339(d.as_millis() as i64));
    VersionOut { version: v.number, sha256: v.sha256.clone(), size: v.size, created_at, current: v.current }
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/plugins/{name}/versions", tag = "plugins", operation_id = "list_plugin_versions",
    params(PluginPath),
    responses((status = 200, description = "The plugin's stored versions", body = VersionList)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn versions(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Path(PluginPath { name, .. }): Path<PluginPath>,
) -> Result<Json<VersionList>, ApiError> {
    exists(&state, &tenant, &name)?;
    let data = state.plugins.versions(tenant.as_str(), &name).iter().map(version_view).collect();
    Ok(Json(VersionList { data }))
}

/// Serves a stored version as `name` again, validated like an upload. Deliveries in
/// flight finish on the version they started with; later ones use this one.
#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/plugins/{name}/rollback", tag = "plugins", operation_id = "rollback_plugin",
    params(PluginPath),
    request_body = RollbackIn,
    responses((status = 200, description = "The version serves", body = PluginOut)),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn rollback(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(PluginPath { name, .. }): Path<PluginPath>,
    JsonBody(input): JsonBody<RollbackIn>,
) -> Result<Json<PluginOut>, ApiError> {
    exists(&state, &tenant, &name)?;
    let info = state.plugins.rollback(tenant.as_str(), &name, input.version).await?;
    Ok(Json(view(&info)))
}

#[utoipa::path(
    delete, path = "/v1/tenants/{tenant}/plugins/{name}", tag = "plugins", operation_id = "delete_plugin",
    params(PluginPath),
    responses(
        (status = 204, description = "Deleted, with its versions"),
        (status = 409, description = "`conflict`: an endpoint binds it", body = super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(PluginPath { name, .. }): Path<PluginPath>,
) -> Result<StatusCode, ApiError> {
    // Check and delete under the tenant's binding lock, which endpoint writes that bind
    // a plugin also hold: no endpoint can bind `name` between the two.
    let _bindings = state.plugin_locks.lock(&tenant).await;
    exists(&state, &tenant, &name)?;
    let bound: Vec<String> = binding(&state, &tenant, &name).await?.iter().map(|e| e.id.to_string()).collect();
    if !bound.is_empty() {
        let message = format!("plugin {name:?} is bound by endpoints {}; unbind it first", bound.join(", "));
        return Err(ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, message));
    }
    state.plugins.delete(tenant.as_str(), &name)?;
    Ok(StatusCode::NO_CONTENT)
}
