//! Bearer tokens: the admin token from config, tenant tokens (stored hashed) with scopes,
//! or a portal session's token (stored hashed, with its scopes, expiry and limits).

use std::sync::Arc;

use axum::http::{HeaderMap, Method, StatusCode};
use sha2::{Digest, Sha256};

use super::doc::ErrorCode;
use super::reach::{self, Reach, RouteAccess};
use super::{ApiError, AppState};
use crate::model::{Millis, PortalSession, Scope, TenantId, TokenRecord};
use crate::store::audit;

/// Who is calling.
#[derive(Debug, Clone)]
pub enum Caller {
    Admin,
    Tenant(TenantId),
}

/// Who is calling, with what it may do.
#[derive(Debug, Clone)]
pub struct Identity {
    pub caller: Caller,
    pub scopes: Vec<Scope>,
    /// The portal session behind a tenant caller, whose limits apply on top of its scopes.
    pub portal: Option<Arc<PortalSession>>,
}

/// How a portal session's token starts (tenant tokens start `hrld_`): a token is looked up
/// in one table only.
pub const PORTAL_TOKEN_PREFIX: &str = "hps_";

/// What an expired or revoked portal session is told; the portal page shows it as it is.
pub const PORTAL_EXPIRED: &str = "this portal link has expired; ask for a new one";

/// A new secret: `prefix` and 32 random bytes, base64url.
pub fn secret_token(prefix: &str) -> String {
    use base64::Engine;
    use rand::RngCore;
    let mut raw = [0u8; 32];
    rand::rng().fill_bytes(&mut raw);
    format!("{prefix}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw))
}

/// The sha256 hex of a token: what the store keeps.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| unauthorized("missing Authorization: Bearer <token>"))?;
    value
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| unauthorized("Authorization must be \"Bearer <token>\""))
}

fn unauthorized(m: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, m)
}

/// Compares the sha256 digests of two tokens in constant time: the digests have a fixed
/// length, so neither a token's length nor its first differing byte shows in the timing.
fn same_token(a: &str, b: &str) -> bool {
    let (a, b) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Identifies the caller from its token.
pub async fn caller(state: &AppState, headers: &HeaderMap) -> Result<Identity, ApiError> {
    let token = bearer(headers)?;
    if let Some(admin) = &state.config.admin_token
        && same_token(admin.expose(), token)
    {
        audit::note_actor("admin");
        return Ok(Identity { caller: Caller::Admin, scopes: Scope::ALL.to_vec(), portal: None });
    }
    if token.starts_with(PORTAL_TOKEN_PREFIX) {
        let session = portal_session(state, &hash_token(token)).await?;
        let scopes = session.scopes.clone();
        audit::note_actor(format!("portal:{}", session.id));
        return Ok(Identity {
            caller: Caller::Tenant(session.tenant.clone()),
            scopes,
            portal: Some(Arc::new(session)),
        });
    }
    let record = tenant_token(state, hash_token(token)).await?;
    note_use(state, &record.hash);
    audit::note_actor(format!("token:{}", record.id));
    Ok(Identity { caller: Caller::Tenant(record.tenant), scopes: record.scopes, portal: None })
}

/// The live portal session whose token hashes to `hash`. Read from the store on every
/// request, on every backend: a revocation or an expiry holds from the next request on
/// every node, with no cache to miss it.
async fn portal_session(state: &AppState, hash: &str) -> Result<PortalSession, ApiError> {
    let session = state.store.find_portal_session(hash).await?.ok_or_else(|| unauthorized("unknown portal session"))?;
    if !session.live(state.clock.now()) {
        return Err(unauthorized(PORTAL_EXPIRED));
    }
    Ok(session)
}

/// The stored token with `hash`. A SQLite node is the only node of its store, so it caches
/// tokens and drops one from the cache as it revokes it. Nodes sharing Postgres read the
/// token on every request instead (one primary-key lookup): a revocation on any node is
/// then refused by every other from its next request, with no window in which a
/// notification is still on its way, as a cache invalidated by NOTIFY would leave.
async fn tenant_token(state: &AppState, hash: String) -> Result<TokenRecord, ApiError> {
    let Some(cache) = &state.tokens else {
        return state.store.find_token(&hash).await?.ok_or_else(|| unauthorized("unknown token"));
    };
    if let Some(r) = cache.read().unwrap_or_else(|e| e.into_inner()).get(&hash) {
        return Ok(r.clone());
    }
    let r = state.store.find_token(&hash).await?.ok_or_else(|| unauthorized("unknown token"))?;
    cache.write().unwrap_or_else(|e| e.into_inner()).insert(hash, r.clone());
    Ok(r)
}

/// How stale a token's `last_used_at` may be: one write per token per minute per node.
const LAST_USE_PRECISION: Millis = 60_000;

/// Records the token's use in the background, at most once per `LAST_USE_PRECISION`.
fn note_use(state: &AppState, hash: &str) {
    let now = state.clock.now();
    {
        let mut written = state.token_use.lock().unwrap_or_else(|e| e.into_inner());
        if written.get(hash).is_some_and(|&at| now - at < LAST_USE_PRECISION) {
            return;
        }
        written.insert(hash.to_string(), now);
    }
    let (store, hash) = (state.store.clone(), hash.to_string());
    tokio::spawn(async move {
        if let Err(e) = store.touch_token(&hash, now).await {
            tracing::warn!(error = %e, "cannot record a token's last use");
        }
    });
}

/// Drops a revoked token from this node's cache and its last-use bookkeeping.
pub fn forget(state: &AppState, id: &str) {
    if let Some(cache) = &state.tokens {
        cache.write().unwrap_or_else(|e| e.into_inner()).retain(|_, r| r.id != id);
    }
    state.token_use.lock().unwrap_or_else(|e| e.into_inner()).retain(|hash, _| TokenRecord::id_of(hash) != id);
}

/// The distinct scopes named, each known and given once.
pub fn scopes(names: Option<Vec<String>>) -> Result<Vec<Scope>, ApiError> {
    let names =
        names.ok_or_else(|| ApiError::unprocessable("scopes: required (events:write, read, manage, replay, poll)"))?;
    if names.is_empty() || names.len() > Scope::ALL.len() {
        return Err(ApiError::unprocessable(format!("scopes: name 1 to {} scopes", Scope::ALL.len())));
    }
    let mut out: Vec<Scope> = Vec::with_capacity(names.len());
    for n in &names {
        let scope = Scope::parse(n).ok_or_else(|| {
            ApiError::unprocessable(format!("scopes: unknown scope {n:?} (events:write, read, manage, replay, poll)"))
        })?;
        if out.contains(&scope) {
            return Err(ApiError::unprocessable(format!("scopes: {n:?} is named twice")));
        }
        out.push(scope);
    }
    Ok(out)
}

/// Requires the admin token.
pub async fn admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    match caller(state, headers).await?.caller {
        Caller::Admin => Ok(()),
        Caller::Tenant(_) => {
            Err(ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, "this route needs the admin token"))
        }
    }
}

/// Requires access to `tenant` with `scope`; another tenant's objects answer 404. A portal
/// session must also be allowed `access` (see [`portal_allows`]), and is confined to what
/// it reaches of the tenant ([`reach::confine`]).
pub async fn tenant(
    state: &AppState,
    headers: &HeaderMap,
    tenant: &str,
    scope: Scope,
    access: RouteAccess<'_>,
) -> Result<(TenantId, Reach), ApiError> {
    let Identity { caller, scopes, portal } = caller(state, headers).await?;
    let id = TenantId::parse(tenant).map_err(|_| ApiError::not_found("tenant"))?;
    match caller {
        Caller::Tenant(own) if own != id => return Err(ApiError::not_found("tenant")),
        _ => {}
    }
    if let Some(session) = &portal {
        portal_allows(session, state.config.portal.plugins, &access)?;
    }
    if !scopes.contains(&scope) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            format!("this token lacks the {} scope", scope.as_str()),
        ));
    }
    ensure_tenant(state, &id).await?;
    let reach = Reach::of(portal.as_deref());
    reach::confine(state, &id, &reach, &access).await?;
    Ok((id, reach))
}

/// The tenant routes a portal session may use: the customer's own (endpoints, deliveries,
/// dead letters, replays, the catalog to read, the series, its endpoints' audit entries;
/// plugins only when `portal.plugins` allows), never the operator's (tokens, catalog
/// writes, settings, portal sessions). A read-only session may only read; what one limited to some
/// endpoints reaches is [`reach::confine`]'s.
fn portal_allows(session: &PortalSession, plugins: bool, access: &RouteAccess<'_>) -> Result<(), ApiError> {
    let forbidden = |m: &str| ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, m);
    let rest = access.route.strip_prefix("/v1/tenants/{tenant}").unwrap_or("");
    // Trying a filter on an event writes nothing: a read, though it is posted.
    let read = access.method == Method::GET || rest.ends_with("/test-filter");
    let allowed = match rest.split('/').nth(1).unwrap_or("") {
        "endpoints" | "deliveries" | "dead-letters" | "replays" | "series" | "test-filter" => true,
        "events" => read,
        // Its endpoints' entries only (`audit::list_tenant`).
        "audit" => read,
        "event-types" | "branding" => read && !rest.ends_with("/settings"),
        "plugins" => plugins,
        _ => false,
    };
    if !allowed {
        return Err(forbidden("a portal session cannot use this route"));
    }
    if session.read_only && !read {
        return Err(forbidden("this portal session is read-only: it cannot change anything"));
    }
    Ok(())
}

async fn ensure_tenant(state: &AppState, id: &TenantId) -> Result<(), ApiError> {
    if state.tenants.read().unwrap_or_else(|e| e.into_inner()).contains(id) {
        return Ok(());
    }
    if state.store.get_tenant(id).await?.is_none() {
        return Err(ApiError::not_found("tenant"));
    }
    state.tenants.write().unwrap_or_else(|e| e.into_inner()).insert(id.clone());
    Ok(())
}
