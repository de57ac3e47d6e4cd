//! The read side the console's pages need, open to any API client: tenants, a page of
//! endpoints with their health beside their pacing, delivery rate and latency over time,
//! and the admin's overview. Every listing is paged and every figure an aggregate over an
//! index, so the answers stay fast with 10k endpoints and 1M deliveries in the store.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::endpoints::{EndpointOut, view};
use super::extract::{Admin, Query, Read, TenantAuth, TenantPath};
use super::tenants::TenantOut;
use super::{ApiError, AppState, page_limit, rfc3339};
use crate::model::*;
use crate::store::{SeriesPoint, SeriesScope};

/// An endpoint's recent delivery health, beside the pacing settings that produce it.
#[derive(Serialize, ToSchema)]
pub(crate) struct HealthOut {
    /// Delivered attempts over attempts; null without attempts.
    success_rate_1h: Option<f64>,
    success_rate_24h: Option<f64>,
    attempts_1h: u64,
    attempts_24h: u64,
    last_success_at: Option<String>,
    last_attempt_at: Option<String>,
    failing_since: Option<String>,
    state: EndpointState,
    /// Deliveries not finished: queued, waiting, delivering or paused.
    backlog: u64,
    dead_letters: u64,
    rate_per_sec: f64,
    burst: u32,
    max_in_flight: u32,
}

/// The health of `endpoint` now.
pub(crate) async fn health(state: &AppState, endpoint: &Endpoint) -> Result<HealthOut, ApiError> {
    let h = state.store.endpoint_health(&endpoint.id, state.clock.now()).await?;
    Ok(health_view(endpoint, h))
}

/// The health of each of `endpoints` now, read for the whole page at once.
async fn page_health(state: &AppState, endpoints: &[Endpoint]) -> Result<Vec<HealthOut>, ApiError> {
    let ids: Vec<EndpointId> = endpoints.iter().map(|e| e.id.clone()).collect();
    let mut found = state.store.endpoint_health_page(&ids, state.clock.now()).await?;
    Ok(endpoints.iter().map(|e| health_view(e, found.remove(&e.id).unwrap_or_default())).collect())
}

fn health_view(endpoint: &Endpoint, h: Health) -> HealthOut {
    let rate = |s: u64, a: u64| (a > 0).then(|| s as f64 / a as f64);
    HealthOut {
        success_rate_1h: rate(h.successes_1h, h.attempts_1h),
        success_rate_24h: rate(h.successes_24h, h.attempts_24h),
        attempts_1h: h.attempts_1h,
        attempts_24h: h.attempts_24h,
        last_success_at: h.last_success_at.map(rfc3339),
        last_attempt_at: h.last_attempt_at.map(rfc3339),
        failing_since: endpoint.failing_since.map(rfc3339),
        state: endpoint.state,
        backlog: h.backlog,
        dead_letters: h.dead_letters,
        rate_per_sec: endpoint.spec.rate_per_sec,
        burst: endpoint.spec.burst,
        max_in_flight: endpoint.spec.max_in_flight,
    }
}

/// Paging of the endpoint listing.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EndpointQuery {
    /// The `next_after` of the previous page.
    after: Option<String>,
    /// Page size (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Include each endpoint's `health` (success rates, backlog, last success).
    health: Option<bool>,
    /// Only the endpoints that bind this plugin to a hook, as `name` or pinned (`name@n`).
    #[param(pattern = "^[a-z0-9_-]{1,64}$")]
    plugin: Option<String>,
}

/// An endpoint, with its health when asked for.
#[derive(Serialize, ToSchema)]
pub(crate) struct EndpointItem {
    #[serde(flatten)]
    endpoint: EndpointOut,
    health: Option<HealthOut>,
}

/// A page of endpoints in creation order; `next_after` is null on the last page.
#[derive(Serialize, ToSchema)]
pub(crate) struct EndpointPage {
    data: Vec<EndpointItem>,
    next_after: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/endpoints", tag = "endpoints", operation_id = "list_endpoints",
    params(TenantPath, EndpointQuery),
    responses((status = 200, description = "A page of the tenant's endpoints", body = EndpointPage)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn list_endpoints(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Query(q): Query<EndpointQuery>,
) -> Result<Json<EndpointPage>, ApiError> {
    let limit = page_limit(q.limit)?;
    let after = q.after.map(EndpointId::from_stored);
    if let Some(name) = q.plugin.as_deref().filter(|n| !crate::plugin::is_slug(n)) {
        return Err(super::extract::bad_query(format!("plugin: {name:?} is not a plugin name (1-64 of [a-z0-9_-])")));
    }
    let endpoints = state.store.endpoint_page(&tenant, after.as_ref(), limit, q.plugin.as_deref()).await?;
    let health: Vec<Option<HealthOut>> = match q.health {
        Some(true) => page_health(&state, &endpoints).await?.into_iter().map(Some).collect(),
        _ => endpoints.iter().map(|_| None).collect(),
    };
    let data = endpoints.iter().zip(health).map(|(e, health)| EndpointItem { endpoint: view(e), health }).collect();
    let next_after = (endpoints.len() as u32 == limit).then(|| endpoints.last().map(|e| e.id.to_string())).flatten();
    Ok(Json(EndpointPage { data, next_after }))
}

#[derive(Serialize, ToSchema)]
pub(crate) struct TenantList {
    data: Vec<TenantOut>,
}

#[utoipa::path(
    get, path = "/v1/tenants", tag = "tenants", operation_id = "list_tenants",
    responses((status = 200, description = "Every tenant", body = TenantList)),
    security(("admin_token" = [])),
)]
pub(crate) async fn list_tenants(State(state): State<Arc<AppState>>, _: Admin) -> Result<Json<TenantList>, ApiError> {
    let tenants = state.store.list_tenants().await?;
    Ok(Json(TenantList { data: tenants.into_iter().map(TenantOut::from).collect() }))
}

/// Which window a series covers.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SeriesQuery {
    /// `1h` (one-minute buckets, the default) or `24h` (15-minute buckets).
    window: Option<String>,
    /// Only this endpoint's attempts.
    endpoint: Option<String>,
}

/// Attempts per time bucket over a window, every bucket present (oldest first).
#[derive(Serialize, ToSchema)]
pub(crate) struct SeriesOut {
    bucket_seconds: u64,
    points: Vec<PointOut>,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct PointOut {
    /// RFC 3339: the bucket's start.
    start: String,
    attempts: u64,
    /// Attempts answered with a 2xx.
    successes: u64,
    /// Mean and longest attempt duration; null without attempts.
    mean_ms: Option<f64>,
    max_ms: Option<u64>,
}

/// (window, bucket) in milliseconds.
fn window(text: Option<&str>) -> Result<(i64, i64), ApiError> {
    match text.unwrap_or("1h") {
        "1h" => Ok((3_600_000, 60_000)),
        "24h" => Ok((86_400_000, 900_000)),
        other => Err(super::extract::bad_query(format!("window: {other:?} is not 1h or 24h"))),
    }
}

async fn series(state: &AppState, scope: SeriesScope, window_text: Option<&str>) -> Result<SeriesOut, ApiError> {
    let (span, bucket) = window(window_text)?;
    let now = state.clock.now();
    // Whole buckets, ending with the current one.
    let first = (now - span) / bucket * bucket + bucket;
    let found = state.store.attempt_series(&scope, first, bucket).await?;
    let mut by_start: BTreeMap<i64, SeriesPoint> = found.into_iter().map(|p| (p.start, p)).collect();
    let points = (0..span / bucket)
        .map(|i| {
            let start = first + i * bucket;
            let p = by_start.remove(&start).unwrap_or_default();
            PointOut {
                start: rfc3339(start),
                attempts: p.attempts,
                successes: p.successes,
                mean_ms: (p.attempts > 0).then(|| p.total_ms as f64 / p.attempts as f64),
                max_ms: (p.attempts > 0).then_some(p.max_ms),
            }
        })
        .collect();
    Ok(SeriesOut { bucket_seconds: (bucket / 1000) as u64, points })
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/series", tag = "deliveries", operation_id = "get_series",
    params(TenantPath, SeriesQuery),
    responses((status = 200, description = "Attempts, successes and latency per time bucket", body = SeriesOut)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn tenant_series(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Query(q): Query<SeriesQuery>,
) -> Result<Json<SeriesOut>, ApiError> {
    let scope = match q.endpoint {
        Some(id) => match state.store.endpoint(&EndpointId::from_stored(id)).await? {
            Some(e) if e.tenant == tenant => SeriesScope::Endpoint(e.id),
            _ => return Err(ApiError::not_found("endpoint")),
        },
        None => SeriesScope::Tenant(tenant),
    };
    Ok(Json(series(&state, scope, q.window.as_deref()).await?))
}

/// The whole node: tenants, queue depth, endpoints by state, dead letters, delivery rate.
#[derive(Serialize, ToSchema)]
pub(crate) struct OverviewOut {
    tenants: u64,
    /// Deliveries due and unclaimed, and when the oldest of them came due (RFC 3339).
    due: u64,
    oldest_due_at: Option<String>,
    /// `active`, `paused`, `disabled`.
    endpoints_by_state: BTreeMap<String, u64>,
    dead_letters: u64,
    dead_letters_by_tenant: BTreeMap<String, u64>,
    /// Every tenant's attempts over the last hour.
    series: SeriesOut,
}

/// The overview's window.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OverviewQuery {
    /// The series' window: `1h` (one-minute buckets, the default) or `24h` (15-minute buckets).
    window: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/overview", tag = "meta", operation_id = "get_overview",
    params(OverviewQuery),
    responses((status = 200, description = "The node's figures", body = OverviewOut)),
    security(("admin_token" = [])),
)]
pub(crate) async fn overview(
    State(state): State<Arc<AppState>>,
    _: Admin,
    Query(q): Query<OverviewQuery>,
) -> Result<Json<OverviewOut>, ApiError> {
    let stats = state.store.queue_stats(state.clock.now(), 0).await?;
    let tenants = state.store.list_tenants().await?.len() as u64;
    let dead_letters_by_tenant: BTreeMap<String, u64> =
        stats.dead.iter().map(|(t, _, n)| (t.to_string(), *n)).collect();
    Ok(Json(OverviewOut {
        tenants,
        due: stats.due,
        oldest_due_at: stats.oldest_due.map(rfc3339),
        endpoints_by_state: stats.endpoints_by_state.into_iter().collect(),
        dead_letters: dead_letters_by_tenant.values().sum(),
        dead_letters_by_tenant,
        series: series(&state, SeriesScope::All, q.window.as_deref()).await?,
    }))
}
