//! Tenants, tokens, readiness and metrics routes.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::{Admin, ItemPath, JsonBody, Manage, Path, TenantAuth, TenantPath};
use super::{ApiError, AppState, auth, rfc3339};
use crate::model::{OPS_TENANT, Tenant, TenantId, TokenRecord};
use crate::spec::{MAX_TENANT_NAME, check_text};

/// A tenant to create.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantIn {
    /// A slug: lowercase letters, digits and `-`.
    id: String,
    /// A display name; the id when absent.
    #[serde(default)]
    name: Option<String>,
}

/// A tenant.
#[derive(Serialize, ToSchema)]
pub(crate) struct TenantOut {
    id: String,
    name: String,
    /// RFC 3339.
    created_at: String,
}

impl From<Tenant> for TenantOut {
    fn from(t: Tenant) -> TenantOut {
        TenantOut { id: t.id.to_string(), name: t.name, created_at: rfc3339(t.created_at) }
    }
}

#[utoipa::path(
    post, path = "/v1/tenants", tag = "tenants", operation_id = "create_tenant",
    request_body = TenantIn,
    responses(
        (status = 201, description = "Created", body = TenantOut),
        (status = 409, description = "`conflict`: the tenant exists", body = super::doc::ErrorBody),
    ),
    security(("admin_token" = [])),
)]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    _: Admin,
    JsonBody(input): JsonBody<TenantIn>,
) -> Result<(StatusCode, Json<TenantOut>), ApiError> {
    let id = TenantId::parse(&input.id).map_err(|e| ApiError::unprocessable(format!("id: {}", e.0)))?;
    let name = input.name.unwrap_or_else(|| id.to_string());
    check_text("name", &name, MAX_TENANT_NAME)?;
    let tenant = Tenant { name, id, created_at: state.clock.now() };
    crate::store::audit::note_resource(tenant.id.as_str());
    state.store.create_tenant(&tenant).await?;
    Ok((StatusCode::CREATED, Json(tenant.into())))
}

/// `{"scopes": [...]}`: the scopes must be named; a token is never widened by default.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenIn {
    /// One to four of `events:write`, `read`, `manage`, `replay`, each once.
    #[serde(default)]
    scopes: Option<Vec<String>>,
}

/// A token as listed: never the token itself, nor its hash.
#[derive(Serialize, ToSchema)]
pub(crate) struct TokenOut {
    id: String,
    scopes: Vec<String>,
    /// RFC 3339.
    created_at: String,
    /// RFC 3339, to the minute; null until first used.
    last_used_at: Option<String>,
}

/// A new token: the only time the token itself is shown.
#[derive(Serialize, ToSchema)]
pub(crate) struct NewTokenOut {
    #[serde(flatten)]
    info: TokenOut,
    /// The bearer token. Herald keeps only its hash.
    token: String,
    tenant: String,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct TokenList {
    data: Vec<TokenOut>,
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/tokens", tag = "tenants", operation_id = "create_token",
    params(TenantPath), request_body = TokenIn,
    responses((status = 201, description = "Created", body = NewTokenOut)),
    security(("admin_token" = [])),
)]
pub(crate) async fn create_token(
    State(state): State<Arc<AppState>>,
    _: Admin,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    JsonBody(input): JsonBody<TokenIn>,
) -> Result<(StatusCode, Json<NewTokenOut>), ApiError> {
    let scopes = auth::scopes(input.scopes)?;
    let token = auth::secret_token("hrld_");
    let record = TokenRecord::new(auth::hash_token(&token), tenant, scopes, state.clock.now());
    crate::store::audit::note_resource(&record.id);
    state.store.insert_token(&record).await?;
    let out = NewTokenOut { info: token_view(&record), token, tenant: record.tenant.to_string() };
    Ok((StatusCode::CREATED, Json(out)))
}

fn token_view(t: &TokenRecord) -> TokenOut {
    TokenOut {
        id: t.id.clone(),
        scopes: t.scopes.iter().map(|s| s.as_str().to_string()).collect(),
        created_at: rfc3339(t.created_at),
        last_used_at: t.last_used_at.map(rfc3339),
    }
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/tokens", tag = "tenants", operation_id = "list_tokens",
    params(TenantPath),
    responses((status = 200, description = "The tenant's tokens", body = TokenList)),
    security(("admin_token" = [])),
)]
pub(crate) async fn list_tokens(
    State(state): State<Arc<AppState>>,
    _: Admin,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
) -> Result<Json<TokenList>, ApiError> {
    let tokens = state.store.list_tokens(&tenant).await?;
    Ok(Json(TokenList { data: tokens.iter().map(token_view).collect() }))
}

/// Deletes a token; from the next request on, it is refused on every node (see `auth`).
#[utoipa::path(
    delete, path = "/v1/tenants/{tenant}/tokens/{id}", tag = "tenants", operation_id = "revoke_token",
    params(ItemPath),
    responses((status = 204, description = "Revoked")),
    security(("admin_token" = [])),
)]
pub(crate) async fn revoke_token(
    State(state): State<Arc<AppState>>,
    _: Admin,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
) -> Result<StatusCode, ApiError> {
    if !state.store.revoke_token(&tenant, &id).await? {
        return Err(ApiError::not_found("token"));
    }
    auth::forget(&state, &id);
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    get, path = "/healthz", tag = "meta", operation_id = "healthz",
    responses((status = 200, description = "The process is up", content_type = "text/plain", body = String)),
)]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the store answers; with the outbox relays' figures.
#[derive(Serialize, ToSchema)]
pub(crate) struct ReadyOut {
    /// Always `ready` (a store that does not answer gives a 503).
    status: &'static str,
    /// One entry per `[[outbox]]` source, in config order.
    outbox: Vec<OutboxOut>,
}

/// An outbox relay's state and backlog.
#[derive(Serialize, ToSchema)]
pub(crate) struct OutboxOut {
    source: String,
    /// `starting`, `relaying`, `store_unavailable` (Herald's store refused the last commit;
    /// rows wait in the outbox) or `producer_unavailable`.
    state: &'static str,
    /// Age in seconds of the oldest unrelayed row (0: none waits; null: not measured yet).
    lag_seconds: Option<f64>,
    /// Rows waiting to be relayed.
    pending: i64,
    /// Rows parked as invalid (`failed_at` and `error` set in the table).
    parked: i64,
    /// The last failure, while not `relaying`.
    error: Option<String>,
}

#[utoipa::path(
    get, path = "/readyz", tag = "meta", operation_id = "readyz",
    responses((status = 200, description = "The store answers", body = ReadyOut)),
)]
pub(crate) async fn ready(State(state): State<Arc<AppState>>) -> Result<Json<ReadyOut>, ApiError> {
    state.store.get_tenant(&TenantId::from_stored("-")).await?;
    let outbox = state
        .outbox
        .status()
        .into_iter()
        .map(|s| OutboxOut {
            source: s.name,
            state: s.state.as_str(),
            lag_seconds: s.lag_seconds,
            pending: s.pending,
            parked: s.parked,
            error: s.error,
        })
        .collect();
    Ok(Json(ReadyOut { status: "ready", outbox }))
}

/// `GET /metrics`: Prometheus text format 0.0.4. The figures that need a query are re-read at most
/// once a second; a failed read leaves the previous ones and is logged, never a 5xx.
#[utoipa::path(
    get, path = "/metrics", tag = "meta", operation_id = "metrics",
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String)),
)]
pub(crate) async fn metrics(
    State(state): State<Arc<AppState>>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let now = state.clock.now();
    if now - state.metrics.snapshot_taken_at() >= 1_000 {
        match state.store.queue_stats(now, crate::metrics::TOP_ENDPOINTS).await {
            Ok(queue) => state.metrics.set_snapshot(crate::metrics::Snapshot {
                taken_at: now,
                queue,
                plugin_instances: state.plugins.warm_instances() as u64,
                plugins: state.plugins.metrics(),
                plugin_latency: state.plugins.latencies(),
            }),
            Err(e) => tracing::warn!(error = %e, "cannot read the queue figures for /metrics"),
        }
    }
    // The Prometheus text format (what `render` writes), not OpenMetrics: no `# EOF`.
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    ([(axum::http::header::CONTENT_TYPE, content_type)], state.metrics.render())
}

#[derive(Serialize, ToSchema)]
pub(crate) struct TenantList {
    data: Vec<TenantOut>,
}

/// The tenants the platform made: every one but Herald's own `herald-ops`, which holds the
/// operational events (its deliveries stay reachable at `/v1/tenants/herald-ops/…`).
pub(crate) async fn platform_tenants(state: &AppState) -> Result<Vec<Tenant>, ApiError> {
    let mut tenants = state.store.list_tenants().await?;
    tenants.retain(|t| t.id.as_str() != OPS_TENANT);
    Ok(tenants)
}

#[utoipa::path(
    get, path = "/v1/tenants", tag = "tenants", operation_id = "list_tenants",
    responses((status = 200, description = "Every tenant but Herald's own `herald-ops`", body = TenantList)),
    security(("admin_token" = [])),
)]
pub(crate) async fn list_tenants(State(state): State<Arc<AppState>>, _: Admin) -> Result<Json<TenantList>, ApiError> {
    let tenants = platform_tenants(&state).await?;
    Ok(Json(TenantList { data: tenants.into_iter().map(TenantOut::from).collect() }))
}
