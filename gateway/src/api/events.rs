//! Event intake and the read side: events, deliveries with their attempts, dead letters.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};

use super::doc::ErrorCode;
use super::extract::{
    EventsWrite, ItemPath, Path, Query, RawBody, Read, ScopeMarker, TenantAuth, TenantPath, TraceHeaders, TraceParent,
};
use super::{ApiError, AppState, query_rfc3339, rfc3339};
use crate::intake::{self, Checks, IntakeLimits};
use crate::model::*;
use crate::store::{DeliveryFilter, IngestOutcome, StoreError};
use crate::telemetry::Span;

fn limits(state: &AppState) -> IntakeLimits {
    IntakeLimits::from_config(&state.config)
}

/// An accepted event: durable, with its deliveries.
#[derive(Serialize, ToSchema)]
pub(crate) struct AcceptedOut {
    id: String,
    /// Deliveries the event has (the existing ones for a duplicate).
    deliveries: u32,
    /// The id was already stored with this type and payload: nothing new was written.
    duplicate: bool,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct AcceptedList {
    data: Vec<AcceptedOut>,
}

fn accepted(id: &EventId, o: &IngestOutcome) -> AcceptedOut {
    AcceptedOut { id: id.to_string(), deliveries: o.deliveries, duplicate: o.duplicate }
}

/// `POST /v1/tenants/{tenant}/events`: 202 only after the event and its deliveries commit.
/// The body stays raw bytes: the payload is borrowed from it, never re-serialised.
#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/events", tag = "events", operation_id = "create_event",
    params(TenantPath, TraceHeaders), request_body = intake::EventIn<'_>,
    responses(
        (status = 202, description = "Stored with its deliveries", body = AcceptedOut),
        (status = 409, description = "`conflict`: the id was used with another type or payload", body = super::doc::ErrorBody),
        (status = 422, description = "`invalid_request`: the tenant enforces its event catalog and the payload fails its type's schema (the message names the path), or the catalog lacks the type", body = super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["events:write"]), ("admin_token" = [])),
)]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<EventsWrite>,
    TraceParent(trace): TraceParent,
    RawBody(body): RawBody,
) -> Result<(StatusCode, Json<AcceptedOut>), ApiError> {
    let mut span = state.telemetry.intake("POST /v1/tenants/{tenant}/events", trace.as_ref());
    let result = async {
        let input = intake::parse_one(&body)?;
        let limits = limits(&state);
        let checks = Checks { limits: &limits, catalog: &state.catalog };
        let mut event = intake::prepare(&tenant, &input, checks, state.clock.now(), &mut rand::rng())?;
        event.trace = events_trace(span.as_ref(), trace);
        let outcomes = accept(&state, vec![event], span.as_ref()).await?;
        let (id, outcome) = &outcomes[0];
        Ok((StatusCode::ACCEPTED, Json(accepted(id, outcome))))
    }
    .await;
    answered(span.as_mut(), &tenant, 1, result.as_ref().map(|_| ()));
    result
}

/// The trace context a request's events are stored with: its intake span's when spans are
/// exported (one event's life is then one trace, under the producer's trace id), else the
/// producer's as posted.
fn events_trace(span: Option<&Span>, posted: Option<TraceContext>) -> Option<TraceContext> {
    span.map(Span::context).or(posted)
}

/// Notes on an intake span what became of its request.
fn answered(span: Option<&mut Span>, tenant: &TenantId, events: usize, result: Result<(), &ApiError>) {
    let Some(span) = span else { return };
    span.set("herald.tenant", tenant.to_string());
    span.set("herald.events", events as i64);
    match result {
        Ok(()) => span.set("http.response.status_code", 202),
        Err(e) => {
            span.set("http.response.status_code", i64::from(e.status.as_u16()));
            span.fail(e.message.clone());
        }
    }
}

/// `POST /v1/tenants/{tenant}/events/batch`: `{"events": [...]}`, all or nothing.
#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/events/batch", tag = "events", operation_id = "create_events",
    params(TenantPath, TraceHeaders), request_body = intake::BatchIn<'_>,
    responses(
        (status = 202, description = "All stored with their deliveries", body = AcceptedList),
        (status = 409, description = "`conflict`: an id was used with another type or payload", body = super::doc::ErrorBody),
        (status = 422, description = "`invalid_request`: an event fails the tenant's enforced event catalog (`events[i].payload.…`)", body = super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["events:write"]), ("admin_token" = [])),
)]
pub(crate) async fn create_batch(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<EventsWrite>,
    TraceParent(trace): TraceParent,
    RawBody(body): RawBody,
) -> Result<(StatusCode, Json<AcceptedList>), ApiError> {
    let mut span = state.telemetry.intake("POST /v1/tenants/{tenant}/events/batch", trace.as_ref());
    let mut count = 0;
    let result = async {
        let limits = limits(&state);
        let checks = Checks { limits: &limits, catalog: &state.catalog };
        let mut events = intake::prepare_batch(&tenant, &body, checks, state.clock.now(), &mut rand::rng())?;
        count = events.len();
        // The request's context is the parent of each of its events.
        let trace = events_trace(span.as_ref(), trace);
        if trace.is_some() {
            events.iter_mut().for_each(|e| e.trace.clone_from(&trace));
        }
        let outcomes = accept(&state, events, span.as_ref()).await?;
        let data = outcomes.iter().map(|(id, o)| accepted(id, o)).collect();
        Ok((StatusCode::ACCEPTED, Json(AcceptedList { data })))
    }
    .await;
    answered(span.as_mut(), &tenant, count, result.as_ref().map(|_| ()));
    result
}

/// Hands events to intake's durable commit (shared with the outbox relay), in a span of
/// its own under the request's.
async fn accept(
    state: &AppState,
    events: Vec<NewEvent>,
    span: Option<&Span>,
) -> Result<Vec<(EventId, IngestOutcome)>, ApiError> {
    let mut commit = span.map(|s| s.child("herald.commit"));
    let outcomes = intake::commit(&state.committer, &state.metrics, &*state.engine, events).await;
    if let Some(c) = commit.as_mut() {
        match &outcomes {
            Ok(o) => c.set("herald.deliveries", o.iter().map(|(_, o)| i64::from(o.deliveries)).sum::<i64>()),
            Err(e) => c.fail(e.to_string()),
        }
    }
    Ok(outcomes?)
}

/// A stored event; `payload` comes back byte for byte as it was posted.
#[derive(Serialize, ToSchema)]
pub(crate) struct EventOut {
    id: String,
    #[serde(rename = "type")]
    event_type: String,
    created_at: String,
    /// When its undelivered deliveries expire (`created_at` + the queue TTL).
    expires_at: String,
    /// The version of its type's schema it was posted against: the type's latest in the
    /// tenant's event catalog at intake; null when the type had no schema. An endpoint
    /// pinning an older version (`payload_versions`) gets it converted down.
    schema_version: Option<i64>,
    #[schema(value_type = serde_json::Value)]
    payload: Box<RawValue>,
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/events/{id}", tag = "events", operation_id = "get_event",
    params(ItemPath),
    responses((status = 200, description = "The event", body = EventOut)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    auth: TenantAuth<Read>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
) -> Result<Json<EventOut>, ApiError> {
    let event = state
        .store
        .get_event(&auth.tenant, &EventId::from_stored(id))
        .await?
        .ok_or_else(|| ApiError::not_found("event"))?;
    // Intake stored valid JSON; a raw value keeps its bytes as they were posted.
    let payload = RawValue::from_string(event.payload).map_err(|e| {
        tracing::error!(event = %event.id, error = %e, "a stored payload is not JSON");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::InternalError, "the stored payload is not JSON")
    })?;
    Ok(Json(EventOut {
        id: event.id.to_string(),
        event_type: event.event_type,
        created_at: rfc3339(event.created_at),
        expires_at: rfc3339(event.expires_at),
        schema_version: event.schema_version,
        payload,
    }))
}

/// Query parameters of delivery and dead-letter listings. Times are RFC 3339.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// `queued`, `delivering`, `waiting`, `delivered`, `dead` or `paused`.
    state: Option<String>,
    /// An endpoint id.
    endpoint: Option<String>,
    /// An event type.
    #[serde(rename = "type")]
    #[param(rename = "type")]
    event_type: Option<String>,
    /// A dead letter's reason, e.g. `permanent:422`, or a class of them as the metrics
    /// count them (`exhausted`, `expired`, `permanent`, `endpoint_disabled`,
    /// `retry_after_beyond_deadline`, `plugin`, `dropped`, `other`): `permanent` matches
    /// every `permanent:<status>`.
    reason: Option<String>,
    /// Dead (or created) at or after.
    since: Option<String>,
    /// Dead (or created) before.
    until: Option<String>,
    /// The `next_after` of the previous page.
    after: Option<String>,
    /// Page size (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// `asc` (oldest first, the default) or `desc` (newest first; `after` pages to older).
    order: Option<String>,
}

/// The store's filter for a listing by `auth` with query `q`: the tenant's deliveries to
/// the endpoints the caller reaches.
fn filter<S: ScopeMarker>(auth: &TenantAuth<S>, q: ListQuery) -> Result<DeliveryFilter, ApiError> {
    Ok(DeliveryFilter {
        tenant: Some(auth.tenant.clone()),
        event: None,
        endpoint: q.endpoint.map(EndpointId::from_stored),
        endpoints: auth.reach.endpoints(),
        state: q
            .state
            .map(|s| {
                DeliveryState::parse(&s).ok_or_else(|| super::extract::bad_query(format!("state: unknown state {s:?}")))
            })
            .transpose()?,
        event_type: q.event_type,
        reason: q.reason,
        since: q.since.map(|s| query_rfc3339("since", &s)).transpose()?,
        until: q.until.map(|s| query_rfc3339("until", &s)).transpose()?,
        after: q.after.map(DeliveryId::from_stored),
        limit: super::page_limit(q.limit)?,
        newest_first: match q.order.as_deref() {
            None | Some("asc") => false,
            Some("desc") => true,
            Some(o) => {
                return Err(super::extract::bad_query(format!("order: {o:?} is not asc or desc")));
            }
        },
    })
}

/// One (event, endpoint) pair. Times are RFC 3339.
#[derive(Serialize, ToSchema)]
pub(crate) struct DeliveryOut {
    id: String,
    event_id: String,
    endpoint_id: String,
    event_type: String,
    state: DeliveryState,
    attempts: u32,
    next_attempt_at: Option<String>,
    /// Why a dead letter is dead: `exhausted`, `expired`, `permanent:<status>`,
    /// `endpoint_disabled`, `retry_after_beyond_deadline`, `plugin:<message>`, `dropped`
    /// (a transform plugin dropped it; its reason is `last_error`).
    reason: Option<String>,
    last_status: Option<u16>,
    last_error: Option<String>,
    created_at: String,
    updated_at: String,
}

fn delivery_view(d: &Delivery) -> DeliveryOut {
    DeliveryOut {
        id: d.id.to_string(),
        event_id: d.event_id.to_string(),
        endpoint_id: d.endpoint_id.to_string(),
        event_type: d.event_type.clone(),
        state: d.state,
        attempts: d.attempts,
        next_attempt_at: d.next_attempt_at.map(rfc3339),
        reason: d.reason.clone(),
        last_status: d.last_status,
        last_error: d.last_error.clone(),
        created_at: rfc3339(d.created_at),
        updated_at: rfc3339(d.updated_at),
    }
}

/// A page of deliveries; `next_after` is null on the last page.
#[derive(Serialize, ToSchema)]
pub(crate) struct DeliveryPage {
    data: Vec<DeliveryOut>,
    next_after: Option<String>,
}

/// A page of dead letters, and how many the tenant has by reason.
#[derive(Serialize, ToSchema)]
pub(crate) struct DeadLetterPage {
    #[serde(flatten)]
    page: DeliveryPage,
    counts_by_reason: BTreeMap<String, u64>,
}

/// A page of `items` (read with [`filter`], so only what the caller reaches).
fn page(items: Vec<Delivery>, limit: u32) -> DeliveryPage {
    let next = (items.len() as u32 == limit).then(|| items.last().map(|d| d.id.to_string())).flatten();
    DeliveryPage { data: items.iter().map(delivery_view).collect(), next_after: next }
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/events/{id}/deliveries", tag = "deliveries", operation_id = "list_event_deliveries",
    params(ItemPath, ListQuery),
    responses((status = 200, description = "The event's deliveries", body = DeliveryPage)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn event_deliveries(
    State(state): State<Arc<AppState>>,
    auth: TenantAuth<Read>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
    Query(q): Query<ListQuery>,
) -> Result<Json<DeliveryPage>, ApiError> {
    let event_id = EventId::from_stored(id);
    if state.store.get_event(&auth.tenant, &event_id).await?.is_none() {
        return Err(ApiError::not_found("event"));
    }
    let mut f = filter(&auth, q)?;
    f.event = Some(event_id);
    let items = state.store.list_deliveries(&f).await?;
    Ok(Json(page(items, f.limit)))
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/deliveries", tag = "deliveries", operation_id = "list_deliveries",
    params(TenantPath, ListQuery),
    responses((status = 200, description = "The tenant's deliveries", body = DeliveryPage)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn list_deliveries(
    State(state): State<Arc<AppState>>,
    auth: TenantAuth<Read>,
    Query(q): Query<ListQuery>,
) -> Result<Json<DeliveryPage>, ApiError> {
    let f = filter(&auth, q)?;
    let items = state.store.list_deliveries(&f).await?;
    Ok(Json(page(items, f.limit)))
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/dead-letters", tag = "deliveries", operation_id = "list_dead_letters",
    params(TenantPath, ListQuery),
    responses((status = 200, description = "The tenant's dead letters", body = DeadLetterPage)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn dead_letters(
    State(state): State<Arc<AppState>>,
    auth: TenantAuth<Read>,
    Query(q): Query<ListQuery>,
) -> Result<Json<DeadLetterPage>, ApiError> {
    let mut f = filter(&auth, q)?;
    f.state = Some(DeliveryState::Dead);
    let items = state.store.list_deliveries(&f).await?;
    // The tenant's counts would tell a session limited to some endpoints of the others'.
    let counts = match auth.limited() {
        true => BTreeMap::new(),
        false => state.store.dead_letter_counts(&f).await?.into_iter().collect(),
    };
    Ok(Json(DeadLetterPage { page: page(items, f.limit), counts_by_reason: counts }))
}

/// One HTTP attempt.
#[derive(Serialize, ToSchema)]
pub(crate) struct AttemptOut {
    /// New on every attempt (the attempt id header).
    id: String,
    number: u32,
    started_at: String,
    duration_ms: u64,
    /// The response's status; null when none came (see `error`).
    status: Option<u16>,
    /// The first KiB of the response body.
    response_body: Option<String>,
    error: Option<String>,
    verdict: String,
    /// `default` (the built-in table) or the classify plugin's name.
    decided_by: String,
    /// What Herald sent; null when nothing was (a plugin dropped the delivery or failed
    /// before sending) and for attempts recorded before Herald kept it.
    request: Option<SentRequestOut>,
}

/// The request of one attempt as the receiver got it, signatures included.
#[derive(Serialize, ToSchema)]
pub(crate) struct SentRequestOut {
    /// `[name, value]` pairs in the order sent: Herald's own headers, the endpoint's custom
    /// headers and those the transform and sign plugins set. The HTTP client adds `host`
    /// and `content-length`.
    headers: Vec<[String; 2]>,
    /// The body as sent. When `body_is_payload`, rebuilt from the stored event (null once
    /// the event is purged); else the body a transform plugin made, its first 64 KiB
    /// (`truncated`), any bytes that are not UTF-8 shown as U+FFFD.
    body: Option<String>,
    /// The body was Herald's envelope of the event's stored payload (no transform changed
    /// it), so the attempt did not store it again.
    body_is_payload: bool,
    /// The body here is only the first 64 KiB of what was sent.
    truncated: bool,
    /// Bytes in the body as sent.
    body_size: u64,
}

/// A delivery with every attempt made.
#[derive(Serialize, ToSchema)]
pub(crate) struct DeliveryDetail {
    #[serde(flatten)]
    delivery: DeliveryOut,
    attempt_history: Vec<AttemptOut>,
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/deliveries/{id}", tag = "deliveries", operation_id = "get_delivery",
    params(ItemPath),
    responses((status = 200, description = "The delivery and its attempts", body = DeliveryDetail)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn get_delivery(
    State(state): State<Arc<AppState>>,
    auth: TenantAuth<Read>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
) -> Result<Json<DeliveryDetail>, ApiError> {
    let tenant = &auth.tenant;
    let (delivery, attempts) = state
        .store
        .get_delivery(tenant, &DeliveryId::from_stored(id))
        .await?
        .ok_or_else(|| ApiError::not_found("delivery"))?;
    // Bodies that were the event's envelope are rebuilt once, from the event.
    let envelope = match attempts.iter().any(|a| a.request.as_ref().is_some_and(|r| r.body.is_none())) {
        true => state
            .store
            .get_event(tenant, &delivery.event_id)
            .await?
            .map(|e| crate::model::envelope(e.id.as_str(), &e.event_type, e.created_at, &e.payload)),
        false => None,
    };
    let attempt_history = attempts
        .into_iter()
        .map(|a| {
            let request = a.request.as_ref().map(|r| sent_view(r, envelope.as_deref())).transpose()?;
            Ok(attempt_view(a, request))
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(Json(DeliveryDetail { delivery: delivery_view(&delivery), attempt_history }))
}

fn sent_view(r: &SentRequest, envelope: Option<&str>) -> Result<SentRequestOut, ApiError> {
    let headers = r.headers().map_err(|e| StoreError::backend(format!("an attempt's stored request headers: {e}")))?;
    Ok(SentRequestOut {
        headers: headers.into_iter().map(|(k, v)| [k, v]).collect(),
        body: r.body.clone().or_else(|| envelope.map(str::to_string)),
        body_is_payload: r.body.is_none(),
        truncated: r.truncated(),
        body_size: r.body_size,
    })
}

fn attempt_view(a: Attempt, request: Option<SentRequestOut>) -> AttemptOut {
    AttemptOut {
        id: a.id,
        number: a.number,
        started_at: rfc3339(a.started_at),
        duration_ms: a.duration_ms,
        status: a.status,
        response_body: a.response_body,
        error: a.error,
        verdict: a.verdict,
        decided_by: a.decided_by,
        request,
    }
}
