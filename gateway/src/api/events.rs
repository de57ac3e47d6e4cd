//! Event intake and the read side: events, deliveries with their attempts, dead letters.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::extract::{EventsWrite, Path, Query, RawBody, Read, TenantAuth};
use super::{ApiError, AppState, parse_rfc3339, rfc3339};
use crate::intake::{self, IntakeLimits};
use crate::model::*;
use crate::store::{DeliveryFilter, IngestOutcome};

fn limits(state: &AppState) -> IntakeLimits {
    IntakeLimits {
        max_payload_bytes: state.config.max_payload_bytes,
        max_events_per_request: state.config.max_events_per_request,
        ttl_ms: state.config.retry.ttl().as_millis() as i64,
    }
}

fn outcome_json(id: &EventId, o: &IngestOutcome) -> Value {
    json!({ "id": id, "deliveries": o.deliveries, "duplicate": o.duplicate })
}

/// `POST /v1/tenants/{tenant}/events`: 202 only after the event and its deliveries commit.
/// The body stays raw bytes: the payload is borrowed from it, never re-serialised.
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<EventsWrite>,
    RawBody(body): RawBody,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let input = intake::parse_one(&body)?;
    let event = intake::prepare(&tenant, &input, &limits(&state), crate::clock::now_ms(), &mut rand::rng())?;
    let outcomes = accept(&state, vec![event]).await?;
    after_accept(&state, &outcomes);
    let (id, outcome) = &outcomes[0];
    Ok((StatusCode::ACCEPTED, Json(outcome_json(id, outcome))))
}

/// `POST /v1/tenants/{tenant}/events/batch`: `{"events": [...]}`, all or nothing.
pub(crate) async fn create_batch(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<EventsWrite>,
    RawBody(body): RawBody,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let events = intake::prepare_batch(&tenant, &body, &limits(&state), crate::clock::now_ms(), &mut rand::rng())?;
    let outcomes = accept(&state, events).await?;
    after_accept(&state, &outcomes);
    let data: Vec<Value> = outcomes.iter().map(|(id, o)| outcome_json(id, o)).collect();
    Ok((StatusCode::ACCEPTED, Json(json!({ "data": data }))))
}

/// Hands events to the group committer, timing the wait for the durable commit.
async fn accept(state: &AppState, events: Vec<NewEvent>) -> Result<Vec<(EventId, IngestOutcome)>, ApiError> {
    Ok(state.metrics.intake_commit.time(intake::accept(&state.committer, events)).await?)
}

fn after_accept(state: &AppState, outcomes: &[(EventId, IngestOutcome)]) {
    let fresh = outcomes.iter().map(|(_, o)| o).filter(|o| !o.duplicate);
    let (events, deliveries) = fresh.fold((0u64, 0u64), |(e, d), o| (e + 1, d + u64::from(o.deliveries)));
    state.metrics.events_accepted.inc_by(events);
    state.metrics.deliveries_created.inc_by(deliveries);
    if deliveries > 0 {
        let mut endpoints: Vec<EndpointId> = outcomes.iter().flat_map(|(_, o)| o.endpoints.iter().cloned()).collect();
        endpoints.sort_unstable();
        endpoints.dedup();
        (state.wake)(&endpoints);
    }
}

pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Path((_, id)): Path<(String, String)>,
) -> Result<([(axum::http::HeaderName, &'static str); 1], String), ApiError> {
    let event =
        state.store.get_event(&tenant, &EventId::from_stored(id)).await?.ok_or_else(|| ApiError::not_found("event"))?;
    // Built by hand so the payload's bytes come back exactly as they were posted.
    let head = json!({
        "id": event.id,
        "type": event.event_type,
        "created_at": rfc3339(event.created_at),
        "expires_at": rfc3339(event.expires_at),
    })
    .to_string();
    let body = format!("{},\"payload\":{}}}", &head[..head.len() - 1], event.payload);
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body))
}

/// Query parameters of delivery and dead-letter listings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    state: Option<String>,
    endpoint: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    reason: Option<String>,
    since: Option<String>,
    until: Option<String>,
    after: Option<String>,
    limit: Option<u32>,
}

fn filter(tenant: TenantId, q: ListQuery) -> Result<DeliveryFilter, ApiError> {
    Ok(DeliveryFilter {
        tenant: Some(tenant),
        event: None,
        endpoint: q.endpoint.map(EndpointId::from_stored),
        state: q
            .state
            .map(|s| {
                DeliveryState::parse(&s).ok_or_else(|| ApiError::bad_request(format!("state: unknown state {s:?}")))
            })
            .transpose()?,
        event_type: q.event_type,
        reason: q.reason,
        since: q.since.map(|s| parse_rfc3339("since", &s)).transpose()?,
        until: q.until.map(|s| parse_rfc3339("until", &s)).transpose()?,
        after: q.after.map(DeliveryId::from_stored),
        limit: q.limit.unwrap_or(100).clamp(1, 1000),
    })
}

pub(crate) fn delivery_view(d: &Delivery) -> Value {
    json!({
        "id": d.id,
        "event_id": d.event_id,
        "endpoint_id": d.endpoint_id,
        "event_type": d.event_type,
        "state": d.state,
        "attempts": d.attempts,
        "next_attempt_at": d.next_attempt_at.map(rfc3339),
        "reason": d.reason,
        "last_status": d.last_status,
        "last_error": d.last_error,
        "created_at": rfc3339(d.created_at),
        "updated_at": rfc3339(d.updated_at),
    })
}

fn page(items: Vec<Delivery>, limit: u32) -> Value {
    let next = (items.len() as u32 == limit).then(|| items.last().map(|d| d.id.clone())).flatten();
    json!({ "data": items.iter().map(delivery_view).collect::<Vec<_>>(), "next_after": next })
}

pub(crate) async fn event_deliveries(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Path((_, id)): Path<(String, String)>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let event_id = EventId::from_stored(id);
    if state.store.get_event(&tenant, &event_id).await?.is_none() {
        return Err(ApiError::not_found("event"));
    }
    let mut f = filter(tenant, q)?;
    f.event = Some(event_id);
    let items = state.store.list_deliveries(&f).await?;
    Ok(Json(page(items, f.limit)))
}

pub(crate) async fn list_deliveries(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let f = filter(tenant, q)?;
    let items = state.store.list_deliveries(&f).await?;
    Ok(Json(page(items, f.limit)))
}

pub(crate) async fn dead_letters(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let mut f = filter(tenant.clone(), q)?;
    f.state = Some(DeliveryState::Dead);
    let items = state.store.list_deliveries(&f).await?;
    let counts = state.store.dead_letter_counts(&tenant).await?;
    let mut out = page(items, f.limit);
    out["counts_by_reason"] = counts.into_iter().map(|(r, n)| (r, json!(n))).collect::<serde_json::Map<_, _>>().into();
    Ok(Json(out))
}

pub(crate) async fn get_delivery(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Path((_, id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let (delivery, attempts) = state
        .store
        .get_delivery(&tenant, &DeliveryId::from_stored(id))
        .await?
        .ok_or_else(|| ApiError::not_found("delivery"))?;
    let mut out = delivery_view(&delivery);
    out["attempt_history"] = json!(
        attempts
            .iter()
            .map(|a| json!({
                "id": a.id, "number": a.number, "started_at": rfc3339(a.started_at), "duration_ms": a.duration_ms,
                "status": a.status, "response_body": a.response_body, "error": a.error,
                "verdict": a.verdict, "decided_by": a.decided_by,
            }))
            .collect::<Vec<_>>()
    );
    Ok(Json(out))
}
