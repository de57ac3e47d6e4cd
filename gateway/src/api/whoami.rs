//! `GET /v1/whoami`: what the calling token may do (admin or a tenant's, and its scopes),
//! so a client such as the console offers only the actions the token is allowed. Reads
//! nothing but the token itself, and needs no scope.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::{self, Caller};
use super::{ApiError, AppState};

/// The calling token.
#[derive(Serialize, ToSchema)]
pub(crate) struct WhoamiOut {
    /// The admin token: every tenant, every scope.
    admin: bool,
    /// The tenant a tenant token belongs to; null for the admin token.
    tenant: Option<String>,
    /// What it may do: `events:write`, `read`, `manage`, `replay` (all four for the admin).
    scopes: Vec<&'static str>,
    /// Present for a portal session's token only: the console then runs as the customer
    /// portal, within these limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    portal: Option<PortalOut>,
}

/// A portal session's limits, beyond its scopes.
#[derive(Serialize, ToSchema)]
pub(crate) struct PortalOut {
    id: String,
    /// Every write is refused.
    read_only: bool,
    /// The only endpoints it sees; null: all of the tenant's.
    endpoints: Option<Vec<String>>,
    expires_at: String,
    /// Whether the operator lets portal sessions reach the tenant's plugins.
    plugins: bool,
}

#[utoipa::path(
    get, path = "/v1/whoami", tag = "tenants", operation_id = "whoami",
    responses((status = 200, description = "The calling token's tenant and scopes", body = WhoamiOut)),
    security(("tenant_token" = []), ("admin_token" = [])),
)]
pub(crate) async fn whoami(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Json<WhoamiOut>, ApiError> {
    let who = auth::caller(&state, &headers).await?;
    let scopes = who.scopes.iter().map(|s| s.as_str()).collect();
    let portal = who.portal.map(|s| PortalOut {
        id: s.id.clone(),
        read_only: s.read_only,
        endpoints: s.endpoints.as_ref().map(|ids| ids.iter().map(|e| e.to_string()).collect()),
        expires_at: super::rfc3339(s.expires_at),
        plugins: state.config.portal.plugins,
    });
    Ok(Json(match who.caller {
        Caller::Admin => WhoamiOut { admin: true, tenant: None, scopes, portal },
        Caller::Tenant(t) => WhoamiOut { admin: false, tenant: Some(t.to_string()), scopes, portal },
    }))
}
