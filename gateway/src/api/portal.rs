//! The customer portal's routes. The operator's backend mints a portal session for one
//! tenant (`POST /v1/tenants/{tenant}/portal-sessions`, admin): a short-lived link whose
//! fragment holds a one-time code. The portal page exchanges the code, once, for a session
//! token (`POST /v1/portal-sessions/exchange`, no other credential), which then acts as a
//! tenant token with the session's scopes and limits until it expires or is revoked
//! (`auth`). Codes and tokens are stored as sha256 hex only. Branding (a name, a logo, an
//! accent colour) is set by the admin and read by the portal through its session.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{self, PORTAL_TOKEN_PREFIX};
use super::extract::{Admin, ItemPath, JsonBody, Manage, Path, Read, TenantAuth, TenantPath};
use super::{ApiError, AppState, rfc3339};
use crate::model::{Branding, EndpointId, PortalSession, Scope};

/// A session's lifetime when the request names none, in seconds.
const DEFAULT_TTL_SECS: u64 = 3600;
/// Most endpoints one session may be limited to.
const MAX_SESSION_ENDPOINTS: usize = 100;
/// The customer's scopes: everything of its own but posting events.
const PORTAL_SCOPES: [Scope; 3] = [Scope::Read, Scope::Manage, Scope::Replay];
/// How a link's one-time code starts.
const CODE_PREFIX: &str = "hpc_";

/// A portal session to mint.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PortalSessionIn {
    /// Some of `read`, `manage`, `replay`; all three when absent.
    #[serde(default)]
    scopes: Option<Vec<String>>,
    /// Seconds the session lasts, `portal.min_ttl_secs` (60 by default) to 86400; 3600
    /// when absent.
    #[serde(default)]
    ttl_secs: Option<u64>,
    /// Refuse every write (`403`), whatever the scopes.
    #[serde(default)]
    read_only: bool,
    /// Limit the session to these endpoints of the tenant (others answer `404` and are
    /// absent from lists; it cannot add one). All of them when absent.
    #[serde(default)]
    endpoints: Option<Vec<String>>,
}

/// A portal session as listed: never its code or token.
#[derive(Serialize, ToSchema)]
pub(crate) struct PortalSessionOut {
    id: String,
    scopes: Vec<&'static str>,
    read_only: bool,
    /// The only endpoints it sees; null: all of the tenant's.
    endpoints: Option<Vec<String>>,
    created_at: String,
    expires_at: String,
    /// `pending` (link not yet opened), `active`, `expired` or `revoked`.
    state: &'static str,
}

/// A minted session: the only time its link is shown.
#[derive(Serialize, ToSchema)]
pub(crate) struct NewPortalSessionOut {
    #[serde(flatten)]
    info: PortalSessionOut,
    /// `/console/portal#code=…` (after `portal.public_url` when set). The code is in the
    /// fragment, which browsers never send to a server, and it can be exchanged once.
    url: String,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct PortalSessionList {
    data: Vec<PortalSessionOut>,
}

/// A link's one-time code, from its fragment.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExchangeIn {
    code: String,
}

/// The session token the portal page keeps (in its tab's session storage).
#[derive(Serialize, ToSchema)]
pub(crate) struct ExchangeOut {
    /// A bearer token for the tenant's routes, with the session's scopes and limits.
    token: String,
    tenant: String,
    expires_at: String,
}

/// A tenant's portal branding: shown as text and a CSS colour, never as markup.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BrandingIo {
    /// Up to 100 characters; the tenant's name when empty.
    #[serde(default)]
    name: String,
    /// A base64 `data:` URL of an `image/png`, `image/svg+xml` or `image/jpeg`, at most
    /// 64 KiB; empty for none.
    #[serde(default)]
    logo: String,
    /// `#rrggbb`; empty for the portal's own.
    #[serde(default)]
    accent: String,
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/portal-sessions", tag = "portal", operation_id = "create_portal_session",
    params(TenantPath), request_body = PortalSessionIn,
    responses((status = 201, description = "Minted: its one-time link", body = NewPortalSessionOut)),
    security(("admin_token" = [])),
)]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    _: Admin,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    JsonBody(input): JsonBody<PortalSessionIn>,
) -> Result<(StatusCode, Json<NewPortalSessionOut>), ApiError> {
    let scopes = match input.scopes {
        None => PORTAL_SCOPES.to_vec(),
        names => auth::scopes(names)?,
    };
    if let Some(s) = scopes.iter().find(|s| !PORTAL_SCOPES.contains(s)) {
        return Err(ApiError::unprocessable(format!(
            "scopes: a portal session takes read, manage or replay, not {}",
            s.as_str()
        )));
    }
    let ttl = input.ttl_secs.unwrap_or(DEFAULT_TTL_SECS);
    let bounds = &state.config.portal.ttl_secs;
    if !bounds.contains(&ttl) {
        return Err(ApiError::unprocessable(format!("ttl_secs: {ttl} is not {} to {}", bounds.start(), bounds.end())));
    }
    let endpoints = match input.endpoints {
        Some(ids) => Some(known_endpoints(&state, &tenant, ids).await?),
        None => None,
    };
    let now = state.clock.now();
    let (code, session) = (
        auth::secret_token(CODE_PREFIX),
        PortalSession {
            id: auth::secret_token("ps_").chars().take(3 + 16).collect(),
            tenant,
            scopes,
            read_only: input.read_only,
            endpoints,
            created_at: now,
            expires_at: now.saturating_add(ttl as i64 * 1000),
            exchanged_at: None,
            revoked_at: None,
        },
    );
    crate::store::audit::note_resource(&session.id);
    state.store.insert_portal_session(&session, &auth::hash_token(&code)).await?;
    let base = state.config.portal.public_url.as_deref().unwrap_or("");
    let url = format!("{base}/console/portal#code={code}");
    Ok((StatusCode::CREATED, Json(NewPortalSessionOut { info: view(&session, now), url })))
}

/// The ids, each an endpoint of `tenant` and named once.
async fn known_endpoints(
    state: &AppState,
    tenant: &crate::model::TenantId,
    ids: Vec<String>,
) -> Result<Vec<EndpointId>, ApiError> {
    if ids.is_empty() || ids.len() > MAX_SESSION_ENDPOINTS {
        return Err(ApiError::unprocessable(format!(
            "endpoints: name 1 to {MAX_SESSION_ENDPOINTS} endpoints, or leave it out for all"
        )));
    }
    let mut out: Vec<EndpointId> = Vec::with_capacity(ids.len());
    for id in ids {
        let id = EndpointId::from_stored(id);
        if out.contains(&id) {
            return Err(ApiError::unprocessable(format!("endpoints: {id} is named twice")));
        }
        match state.store.endpoint(&id).await? {
            Some(e) if &e.tenant == tenant => out.push(id),
            _ => return Err(ApiError::unprocessable(format!("endpoints: the tenant has no endpoint {id}"))),
        }
    }
    Ok(out)
}

fn view(s: &PortalSession, now: crate::model::Millis) -> PortalSessionOut {
    let state = match () {
        _ if s.revoked_at.is_some() => "revoked",
        _ if !s.live(now) => "expired",
        _ if s.exchanged_at.is_none() => "pending",
        _ => "active",
    };
    PortalSessionOut {
        id: s.id.clone(),
        scopes: s.scopes.iter().map(|s| s.as_str()).collect(),
        read_only: s.read_only,
        endpoints: s.endpoints.as_ref().map(|ids| ids.iter().map(|e| e.to_string()).collect()),
        created_at: rfc3339(s.created_at),
        expires_at: rfc3339(s.expires_at),
        state,
    }
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/portal-sessions", tag = "portal", operation_id = "list_portal_sessions",
    params(TenantPath),
    responses((status = 200, description = "The tenant's portal sessions, newest first", body = PortalSessionList)),
    security(("admin_token" = [])),
)]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    _: Admin,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
) -> Result<Json<PortalSessionList>, ApiError> {
    let now = state.clock.now();
    let sessions = state.store.list_portal_sessions(&tenant).await?;
    Ok(Json(PortalSessionList { data: sessions.iter().map(|s| view(s, now)).collect() }))
}

/// Revokes a session: its link and its token are refused from the next request, on every
/// node (no node caches a session).
#[utoipa::path(
    delete, path = "/v1/tenants/{tenant}/portal-sessions/{id}", tag = "portal", operation_id = "revoke_portal_session",
    params(ItemPath),
    responses((status = 204, description = "Revoked")),
    security(("admin_token" = [])),
)]
pub(crate) async fn revoke(
    State(state): State<Arc<AppState>>,
    _: Admin,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
) -> Result<StatusCode, ApiError> {
    if !state.store.revoke_portal_session(&tenant, &id, state.clock.now()).await? {
        return Err(ApiError::not_found("portal session"));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Exchanges a link's one-time code for the session's token: once, while the session is
/// live. The code is the only credential; a second exchange is refused.
#[utoipa::path(
    post, path = "/v1/portal-sessions/exchange", tag = "portal", operation_id = "exchange_portal_code",
    request_body = ExchangeIn,
    responses((status = 200, description = "The session's token", body = ExchangeOut)),
)]
pub(crate) async fn exchange(
    State(state): State<Arc<AppState>>,
    JsonBody(input): JsonBody<ExchangeIn>,
) -> Result<Json<ExchangeOut>, ApiError> {
    let refused = || {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            super::ErrorCode::Unauthorized,
            "this portal link has expired or was already used; ask for a new one",
        )
    };
    if !input.code.starts_with(CODE_PREFIX) {
        return Err(refused());
    }
    let token = auth::secret_token(PORTAL_TOKEN_PREFIX);
    let hash = auth::hash_token(&token);
    if !state.store.exchange_portal_code(&auth::hash_token(&input.code), &hash, state.clock.now()).await? {
        return Err(refused());
    }
    let session = state.store.find_portal_session(&hash).await?.ok_or_else(refused)?;
    Ok(Json(ExchangeOut { token, tenant: session.tenant.to_string(), expires_at: rfc3339(session.expires_at) }))
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/branding", tag = "portal", operation_id = "get_branding",
    params(TenantPath),
    responses((status = 200, description = "The tenant's portal branding (its name by default)", body = BrandingIo)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn get_branding(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
) -> Result<Json<BrandingIo>, ApiError> {
    let b = state.store.branding(&tenant).await?.unwrap_or_default();
    let name = match b.name.is_empty() {
        true => state.store.get_tenant(&tenant).await?.map(|t| t.name).unwrap_or_else(|| tenant.to_string()),
        false => b.name,
    };
    Ok(Json(BrandingIo { name, logo: b.logo, accent: b.accent }))
}

#[utoipa::path(
    put, path = "/v1/tenants/{tenant}/branding", tag = "portal", operation_id = "put_branding",
    params(TenantPath), request_body = BrandingIo,
    responses((status = 200, description = "Set", body = BrandingIo)),
    security(("admin_token" = [])),
)]
pub(crate) async fn put_branding(
    State(state): State<Arc<AppState>>,
    _: Admin,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    JsonBody(input): JsonBody<BrandingIo>,
) -> Result<Json<BrandingIo>, ApiError> {
    let b = Branding { name: input.name.trim().to_string(), logo: input.logo, accent: input.accent };
    b.validate().map_err(ApiError::unprocessable)?;
    state.store.put_branding(&tenant, &b, state.clock.now()).await?;
    Ok(Json(BrandingIo { name: b.name, logo: b.logo, accent: b.accent }))
}
