//! Bearer tokens: the admin token from config, or tenant tokens (stored hashed) with scopes.

use axum::http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};

use super::doc::ErrorCode;
use super::{ApiError, AppState};
use crate::model::{Millis, Scope, TenantId, TokenRecord};

/// Who is calling.
#[derive(Debug, Clone)]
pub enum Caller {
    Admin,
    Tenant(TenantId),
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
pub async fn caller(state: &AppState, headers: &HeaderMap) -> Result<(Caller, Vec<Scope>), ApiError> {
    let token = bearer(headers)?;
    if let Some(admin) = &state.config.admin_token
        && same_token(admin.expose(), token)
    {
        return Ok((Caller::Admin, Scope::ALL.to_vec()));
    }
    let record = tenant_token(state, hash_token(token)).await?;
    note_use(state, &record.hash);
    Ok((Caller::Tenant(record.tenant), record.scopes))
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

/// Requires the admin token.
pub async fn admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    match caller(state, headers).await?.0 {
        Caller::Admin => Ok(()),
        Caller::Tenant(_) => {
            Err(ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, "this route needs the admin token"))
        }
    }
}

/// Requires access to `tenant` with `scope`; another tenant's objects answer 404.
pub async fn tenant(state: &AppState, headers: &HeaderMap, tenant: &str, scope: Scope) -> Result<TenantId, ApiError> {
    let (caller, scopes) = caller(state, headers).await?;
    let id = TenantId::parse(tenant).map_err(|_| ApiError::not_found("tenant"))?;
    match caller {
        Caller::Tenant(own) if own != id => return Err(ApiError::not_found("tenant")),
        _ => {}
    }
    if !scopes.contains(&scope) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            format!("this token lacks the {} scope", scope.as_str()),
        ));
    }
    ensure_tenant(state, &id).await?;
    Ok(id)
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
