//! A tenant's own plugin settings: `PUT|GET /v1/tenants/{tenant}/plugins/{name}/config`
//! (scope `manage`). Stored durably, then applied to the node's plugin host (other nodes
//! on a shared store follow within a second, see `app`); secret values are write-only.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::{JsonBody, Manage, Path, PluginPath, TenantAuth};
use super::plugins::exists;
use super::{ApiError, AppState};
use crate::clock::rfc3339;
use crate::model::{PluginSettings, StoredPluginSettings, TenantId};

/// What a secret reads back as.
const MASK: &str = "********";

/// The whole settings map of one plugin; it replaces the previous one.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigIn {
    /// Plain values, shown by `GET`.
    #[serde(default)]
    values: BTreeMap<String, String>,
    /// Secret values: stored and passed to the plugin, never shown again.
    #[serde(default)]
    secrets: BTreeMap<String, String>,
    /// Secrets already stored that keep their value (since `GET` cannot show it).
    #[serde(default)]
    keep_secrets: Vec<String>,
}

/// One plugin's settings as the tenant set them.
#[derive(Serialize, ToSchema)]
pub(crate) struct ConfigOut {
    values: BTreeMap<String, String>,
    /// Every secret key, its value masked as `********`.
    secrets: BTreeMap<String, String>,
    /// Keys the operator fixes (`[plugins.override]`): the plugin reads the operator's
    /// value, not the tenant's.
    overridden: Vec<String>,
    /// RFC 3339; null when the tenant never set any.
    updated_at: Option<String>,
}

#[utoipa::path(
    put, path = "/v1/tenants/{tenant}/plugins/{name}/config", tag = "plugins", operation_id = "put_plugin_config",
    params(PluginPath),
    request_body = ConfigIn,
    responses((status = 200, description = "Stored; calls that start from now on read it", body = ConfigOut)),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn put(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(PluginPath { name, .. }): Path<PluginPath>,
    JsonBody(input): JsonBody<ConfigIn>,
) -> Result<Json<ConfigOut>, ApiError> {
    exists(&state, &tenant, &name)?;
    let mut settings = PluginSettings { values: input.values, secrets: input.secrets };
    if !input.keep_secrets.is_empty() {
        let stored = state.store.plugin_settings(&tenant, &name).await?.map(|s| s.settings.secrets).unwrap_or_default();
        for key in input.keep_secrets {
            let value = stored
                .get(&key)
                .ok_or_else(|| ApiError::unprocessable(format!("keep_secrets: no stored secret {key:?}")))?;
            settings.secrets.entry(key).or_insert_with(|| value.clone());
        }
    }
    settings.validate().map_err(ApiError::unprocessable)?;
    let merged = settings.merged();
    let stored =
        StoredPluginSettings { tenant: tenant.clone(), plugin: name.clone(), settings, updated_at: state.clock.now() };
    state.store.put_plugin_settings(&stored).await?;
    state.plugins.set_tenant_config(tenant.as_str(), &name, merged);
    Ok(Json(view(&state, &tenant, &name, Some(stored))))
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/plugins/{name}/config", tag = "plugins", operation_id = "get_plugin_config",
    params(PluginPath),
    responses((status = 200, description = "The tenant's settings of the plugin, secrets masked", body = ConfigOut)),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn get(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(PluginPath { name, .. }): Path<PluginPath>,
) -> Result<Json<ConfigOut>, ApiError> {
    exists(&state, &tenant, &name)?;
    let stored = state.store.plugin_settings(&tenant, &name).await?;
    Ok(Json(view(&state, &tenant, &name, stored)))
}

fn view(state: &AppState, tenant: &TenantId, name: &str, stored: Option<StoredPluginSettings>) -> ConfigOut {
    let overridden = state.plugins.overridden_keys(tenant.as_str(), name);
    let Some(stored) = stored else {
        return ConfigOut { values: BTreeMap::new(), secrets: BTreeMap::new(), overridden, updated_at: None };
    };
    ConfigOut {
        values: stored.settings.values,
        secrets: stored.settings.secrets.into_keys().map(|k| (k, MASK.to_string())).collect(),
        overridden,
        updated_at: Some(rfc3339(stored.updated_at)),
    }
}
