//! An endpoint's recent delivery health beside the pacing that produces it, and its
//! delivery status (`model::delivery_status`, with the latest failed attempt the health
//! read brings): for one endpoint, or for a page of them read at once.

use serde::Serialize;
use utoipa::ToSchema;

use super::super::{ApiError, AppState, rfc3339};
use crate::model::*;

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

/// Where an endpoint's deliveries stand now: `active`, `failing` (since its first failure),
/// `throttled` (the receiver asked for a pause, until `until`), `paused` (held for a human,
/// or by an operator, until `until` if set) or `disabled`.
#[derive(Serialize, ToSchema)]
pub(crate) struct DeliveryStatusOut {
    status: EndpointStatus,
    /// When it entered this status; null: not known (a change made before Herald kept it).
    since: Option<String>,
    /// When a timed pause ends (throttled, or paused for a while); null otherwise.
    until: Option<String>,
    /// Why (its `state_reason`), while throttled, paused or disabled.
    reason: Option<String>,
    /// The latest failed attempt; null without one.
    last_error: Option<LastErrorOut>,
}

/// An endpoint's latest failed attempt.
#[derive(Serialize, ToSchema)]
pub(crate) struct LastErrorOut {
    /// What failed, one of `classify::failure_categories`: `rate_limited`, `server_error`,
    /// `credentials`, `gone`, `permanent`, `unexpected_status` for an answer; `timeout`,
    /// `connect_timeout`, `connection_refused`, `connection_reset`, `dns`, `tls`, `blocked`,
    /// `broker_auth`, `broker_missing`, `plugin`, `other` without one.
    category: String,
    /// The receiver's HTTP status; null when it did not answer.
    status: Option<u16>,
    at: String,
}

/// The delivery status of `endpoint` at `now`, with its health's latest failed attempt.
pub(super) fn status_view(endpoint: &Endpoint, h: &Health, now: Millis) -> DeliveryStatusOut {
    let s = delivery_status(endpoint, h.last_error.clone(), now);
    DeliveryStatusOut {
        status: s.status,
        since: s.since.map(rfc3339),
        until: s.until.map(rfc3339),
        reason: s.reason,
        last_error: s.last_error.map(|l| LastErrorOut {
            category: l.category.to_string(),
            status: l.status,
            at: rfc3339(l.at),
        }),
    }
}

/// The health of `endpoint` now.
pub(super) async fn health(state: &AppState, endpoint: &Endpoint) -> Result<Health, ApiError> {
    Ok(state.store.endpoint_health(&endpoint.id, state.clock.now()).await?)
}

/// The health of each of `endpoints` now, read for the whole page at once.
pub(super) async fn page_health(state: &AppState, endpoints: &[Endpoint]) -> Result<Vec<Health>, ApiError> {
    let ids: Vec<EndpointId> = endpoints.iter().map(|e| e.id.clone()).collect();
    let mut found = state.store.endpoint_health_page(&ids, state.clock.now()).await?;
    Ok(endpoints.iter().map(|e| found.remove(&e.id).unwrap_or_default()).collect())
}

pub(super) fn health_view(endpoint: &Endpoint, h: &Health) -> HealthOut {
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
