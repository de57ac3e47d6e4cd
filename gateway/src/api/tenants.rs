//! Tenants, tokens, readiness and metrics routes.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use base64::Engine;
use rand::RngCore;
use serde::Deserialize;
use serde_json::{Value, json};

use super::extract::{Admin, JsonBody, Manage, Path, TenantAuth};
use super::{ApiError, AppState, auth, rfc3339};
use crate::model::{MAX_TENANT_NAME, Scope, Tenant, TenantId, TokenRecord, check_text};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantIn {
    id: String,
    #[serde(default)]
    name: Option<String>,
}

pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    _: Admin,
    JsonBody(input): JsonBody<TenantIn>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = TenantId::parse(&input.id).map_err(|e| ApiError::unprocessable(format!("id: {}", e.0)))?;
    let name = input.name.unwrap_or_else(|| id.to_string());
    check_text("name", &name, MAX_TENANT_NAME)?;
    let tenant = Tenant { name, id, created_at: state.clock.now() };
    state.store.create_tenant(&tenant).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": tenant.id, "name": tenant.name, "created_at": rfc3339(tenant.created_at) })),
    ))
}

/// `{"scopes": [...]}`: the scopes must be named; a token is never widened by default.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenIn {
    #[serde(default)]
    scopes: Option<Vec<String>>,
}

/// The distinct scopes named, each known and given once.
fn scopes(names: Option<Vec<String>>) -> Result<Vec<Scope>, ApiError> {
    let names =
        names.ok_or_else(|| ApiError::unprocessable("scopes: required (events:write, read, manage, replay)"))?;
    if names.is_empty() || names.len() > Scope::ALL.len() {
        return Err(ApiError::unprocessable(format!("scopes: name 1 to {} scopes", Scope::ALL.len())));
    }
    let mut out: Vec<Scope> = Vec::with_capacity(names.len());
    for n in &names {
        let scope = Scope::parse(n).ok_or_else(|| {
            ApiError::unprocessable(format!("scopes: unknown scope {n:?} (events:write, read, manage, replay)"))
        })?;
        if out.contains(&scope) {
            return Err(ApiError::unprocessable(format!("scopes: {n:?} is named twice")));
        }
        out.push(scope);
    }
    Ok(out)
}

pub(crate) async fn create_token(
    State(state): State<Arc<AppState>>,
    _: Admin,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    JsonBody(input): JsonBody<TokenIn>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let scopes = scopes(input.scopes)?;
    let mut raw = [0u8; 32];
    rand::rng().fill_bytes(&mut raw);
    let token = format!("hrld_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw));
    let record = TokenRecord::new(auth::hash_token(&token), tenant, scopes, state.clock.now());
    state.store.insert_token(&record).await?;
    let mut out = token_view(&record);
    out["token"] = json!(token);
    out["tenant"] = json!(record.tenant);
    Ok((StatusCode::CREATED, Json(out)))
}

/// A token as listed: never the token itself, nor its hash.
fn token_view(t: &TokenRecord) -> Value {
    let scopes: Vec<&str> = t.scopes.iter().map(|s| s.as_str()).collect();
    json!({
        "id": t.id,
        "scopes": scopes,
        "created_at": rfc3339(t.created_at),
        "last_used_at": t.last_used_at.map(rfc3339),
    })
}

pub(crate) async fn list_tokens(
    State(state): State<Arc<AppState>>,
    _: Admin,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
) -> Result<Json<Value>, ApiError> {
    let tokens = state.store.list_tokens(&tenant).await?;
    Ok(Json(json!({ "data": tokens.iter().map(token_view).collect::<Vec<_>>() })))
}

/// Deletes a token; from the next request on, it is refused on every node (see `auth`).
pub(crate) async fn revoke_token(
    State(state): State<Arc<AppState>>,
    _: Admin,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path((_, id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    if !state.store.revoke_token(&tenant, &id).await? {
        return Err(ApiError::not_found("token"));
    }
    auth::forget(&state, &id);
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn ready(State(state): State<Arc<AppState>>) -> Result<&'static str, ApiError> {
    state.store.get_tenant(&TenantId::from_stored("-")).await?;
    Ok("ready")
}

pub(crate) async fn metrics(
    State(state): State<Arc<AppState>>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render())
}
