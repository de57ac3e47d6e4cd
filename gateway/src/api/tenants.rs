//! Tenants, tokens, readiness and metrics routes.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use rand::RngCore;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, AppState, auth, body_bytes, parse_json, rfc3339};
use crate::model::{Scope, Tenant, TenantId, TokenRecord};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantIn {
    id: String,
    #[serde(default)]
    name: Option<String>,
}

pub async fn create(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    auth::admin(&state, &headers).await?;
    let body = body_bytes(body)?;
    let input: TenantIn = parse_json(&body)?;
    let id = TenantId::parse(&input.id).map_err(|e| ApiError::unprocessable(e.0))?;
    let tenant = Tenant { name: input.name.unwrap_or_else(|| id.to_string()), id, created_at: crate::clock::now_ms() };
    state.store.create_tenant(&tenant).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": tenant.id, "name": tenant.name, "created_at": rfc3339(tenant.created_at) })),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenIn {
    #[serde(default)]
    scopes: Option<Vec<String>>,
}

pub async fn create_token(
    State(state): State<Arc<AppState>>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    auth::admin(&state, &headers).await?;
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Manage).await?;
    let body = body_bytes(body)?;
    let input: TokenIn = if body.is_empty() { TokenIn { scopes: None } } else { parse_json(&body)? };
    let scopes = match input.scopes {
        None => Scope::ALL.to_vec(),
        Some(names) if names.is_empty() => return Err(ApiError::unprocessable("scopes must not be empty")),
        Some(names) => names
            .iter()
            .map(|n| {
                Scope::parse(n).ok_or_else(|| {
                    ApiError::unprocessable(format!("unknown scope {n:?} (events:write, read, manage, replay)"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let mut raw = [0u8; 32];
    rand::rng().fill_bytes(&mut raw);
    let token = format!("hrld_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw));
    let record = TokenRecord::new(auth::hash_token(&token), tenant, scopes, crate::clock::now_ms());
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

pub async fn list_tokens(
    State(state): State<Arc<AppState>>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    auth::admin(&state, &headers).await?;
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Manage).await?;
    let tokens = state.store.list_tokens(&tenant).await?;
    Ok(Json(json!({ "data": tokens.iter().map(token_view).collect::<Vec<_>>() })))
}

/// Deletes a token; from the next request on, it is refused on every node (see `auth`).
pub async fn revoke_token(
    State(state): State<Arc<AppState>>,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    auth::admin(&state, &headers).await?;
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Manage).await?;
    if !state.store.revoke_token(&tenant, &id).await? {
        return Err(ApiError::not_found("token"));
    }
    auth::forget(&state, &id);
    Ok(StatusCode::NO_CONTENT)
}

pub async fn ready(State(state): State<Arc<AppState>>) -> Result<&'static str, ApiError> {
    state.store.get_tenant(&TenantId::from_stored("-")).await?;
    Ok("ready")
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render())
}
