//! Aggregates across endpoints, open to any API client: delivery rate and latency over
//! time, and the admin's overview. Every figure is an aggregate over an index, so the
//! answers stay fast with 10k endpoints and 1M deliveries in the store. (Each resource's
//! own listing lives with the resource: `endpoints`, `tenants`.)
//!
//! The endpoints' page with their health is one grouped statement per page
//! (`endpoints/health.rs`); the SQL of these aggregates is `store/queries/insight.rs`, each
//! bounded by an index.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{Admin, Query, Read, TenantAuth, TenantPath};
use super::{ApiError, AppState, rfc3339};
use crate::model::*;
use crate::store::{SeriesPoint, SeriesScope};

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
    responses(
        (status = 200, description = "Attempts, successes and latency per time bucket", body = SeriesOut),
        (status = 422, description = "`invalid_request`: a portal session limited to some endpoints names none", body = super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn tenant_series(
    State(state): State<Arc<AppState>>,
    auth: TenantAuth<Read>,
    Query(q): Query<SeriesQuery>,
) -> Result<Json<SeriesOut>, ApiError> {
    // A portal session limited to some endpoints names one of them (`reach::confine`).
    let scope = match q.endpoint {
        Some(id) => match state.store.endpoint(&EndpointId::from_stored(id)).await? {
            Some(e) if e.tenant == auth.tenant => SeriesScope::Endpoint(e.id),
            _ => return Err(ApiError::not_found("endpoint")),
        },
        None => SeriesScope::Tenant(auth.tenant),
    };
    Ok(Json(series(&state, scope, q.window.as_deref()).await?))
}

/// The whole node: tenants, queue depth, endpoints by state, dead letters, delivery rate.
#[derive(Serialize, ToSchema)]
pub(crate) struct OverviewOut {
    /// The tenants `GET /v1/tenants` lists (not Herald's own `herald-ops`).
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
    let tenants = super::tenants::platform_tenants(&state).await?.len() as u64;
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
