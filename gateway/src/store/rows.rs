//! Row decoding shared by both backends: one flat `FromRow` struct per table as selected,
//! and its conversion into the domain type. The column types are the same on SQLite and
//! Postgres (TEXT and 64-bit integers), so each struct decodes from either; a backend
//! only writes the SQL.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use super::{Result, StoreError};
use crate::model::*;

/// The columns of a `deliveries` row, as both backends select them into [`DeliveryRow`].
pub(super) const DELIVERY_COLUMNS: &str = "id, tenant_id, event_id, endpoint_id, event_type, state, attempts, \
     next_attempt_at, reason, last_status, last_error, created_at, updated_at";

/// The columns of a `tokens` row, as both backends select them into [`TokenRow`].
pub(super) const TOKEN_COLUMNS: &str = "id, hash, tenant_id, scopes, created_at, last_used_at";

/// The columns of an `attempts` row, as both backends select them into [`AttemptRow`].
pub(super) const ATTEMPT_COLUMNS: &str = "id, delivery_id, number, started_at, duration_ms, status, response_body, \
     error, verdict, decided_by, request_headers, request_body, request_body_size";

/// A first attempt kept in its delivery's row (a delivery it delivered, migration 0025),
/// selected from `deliveries` as [`ATTEMPT_COLUMNS`] are from `attempts`: its number is 1,
/// its status and error the delivery's last. Only where `first_attempt_id IS NOT NULL`.
pub(super) const FIRST_ATTEMPT_COLUMNS: &str = "first_attempt_id, id, CAST(1 AS BIGINT), first_started_at, \
     first_duration_ms, last_status, first_response_body, last_error, first_verdict, first_decided_by, \
     first_request_headers, first_request_body, first_request_body_size";

/// Attempts of a delivery, oldest first (a replayed delivery's numbers keep counting up).
pub(super) const ATTEMPT_ORDER: &str = "ORDER BY started_at, number";

fn corrupt(what: &str, value: impl std::fmt::Display) -> StoreError {
    StoreError::backend(format!("stored {what} is invalid: {value}"))
}

/// A subscriber's content filter as fan-out reads it from the endpoint's spec (JSON text,
/// `None` without one), parsed into its tree. Every commit reads its subscribers afresh (so
/// a change applies to the next event), but a text is parsed once per process: the trees
/// are kept by their text (a cache: emptied when it holds [`MAX_PARSED_FILTERS`]).
pub(super) fn stored_filter(endpoint: &str, text: Option<&str>) -> Result<Option<Arc<Filter>>> {
    let Some(text) = text else { return Ok(None) };
    let parsed = || PARSED_FILTERS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(filter) = parsed().get(text) {
        return Ok(Some(filter.clone()));
    }
    let filter: Arc<Filter> =
        Arc::new(serde_json::from_str(text).map_err(|e| corrupt(&format!("filter of endpoint {endpoint}"), e))?);
    let mut cache = parsed();
    if cache.len() >= MAX_PARSED_FILTERS {
        cache.clear();
    }
    cache.insert(text.to_string(), filter.clone());
    Ok(Some(filter))
}

/// The most filter trees [`stored_filter`] keeps.
const MAX_PARSED_FILTERS: usize = 10_000;

static PARSED_FILTERS: LazyLock<Mutex<HashMap<String, Arc<Filter>>>> = LazyLock::new(Mutex::default);

/// A delivery state as stored.
pub(super) fn delivery_state(stored: &str) -> Result<DeliveryState> {
    DeliveryState::parse(stored).ok_or_else(|| corrupt("delivery state", stored))
}

#[derive(sqlx::FromRow)]
pub(super) struct TenantRow {
    id: String,
    name: String,
    created_at: Millis,
}

impl From<TenantRow> for Tenant {
    fn from(r: TenantRow) -> Tenant {
        Tenant { id: TenantId::from_stored(r.id), name: r.name, created_at: r.created_at }
    }
}

/// A `tokens` row.
#[derive(sqlx::FromRow)]
pub(super) struct TokenRow {
    id: String,
    hash: String,
    tenant_id: String,
    /// Space-separated scope names.
    scopes: String,
    created_at: Millis,
    last_used_at: Option<Millis>,
}

impl From<TokenRow> for TokenRecord {
    fn from(r: TokenRow) -> TokenRecord {
        TokenRecord {
            id: r.id,
            hash: r.hash,
            tenant: TenantId::from_stored(r.tenant_id),
            scopes: r.scopes.split(' ').filter_map(Scope::parse).collect(),
            created_at: r.created_at,
            last_used_at: r.last_used_at,
        }
    }
}

/// An `endpoints` row (`SELECT *`).
#[derive(sqlx::FromRow)]
pub(super) struct EndpointRow {
    id: String,
    tenant_id: String,
    /// JSON `EndpointSpec`.
    spec: String,
    state: String,
    state_reason: Option<String>,
    paused_until: Option<Millis>,
    failing_since: Option<Millis>,
    /// JSON `Verification` (migration 0017); NULL: never tried.
    verification: Option<String>,
    /// The node that took its listener's connection (migration 0022).
    listener: Option<String>,
    state_since: Option<Millis>,
    state_by: Option<String>,
    created_at: Millis,
    updated_at: Millis,
    version: i64,
}

impl TryFrom<EndpointRow> for Endpoint {
    type Error = StoreError;

    fn try_from(r: EndpointRow) -> Result<Endpoint> {
        Ok(Endpoint {
            id: EndpointId::from_stored(r.id),
            tenant: TenantId::from_stored(r.tenant_id),
            spec: serde_json::from_str(&r.spec).map_err(|e| corrupt("endpoint spec", e))?,
            state: EndpointState::parse(&r.state).ok_or_else(|| corrupt("endpoint state", &r.state))?,
            state_reason: r.state_reason,
            paused_until: r.paused_until,
            failing_since: r.failing_since,
            // One that no longer reads is verified again, as a never tried one is.
            verification: r.verification.and_then(|v| serde_json::from_str(&v).ok()),
            listener: r.listener,
            state_since: r.state_since,
            // A name this build does not know reads as not known.
            state_by: r.state_by.as_deref().and_then(StateBy::parse),
            created_at: r.created_at,
            updated_at: r.updated_at,
            version: r.version,
        })
    }
}

/// An `events` row.
#[derive(sqlx::FromRow)]
pub(super) struct EventRow {
    id: String,
    tenant_id: String,
    #[sqlx(rename = "type")]
    event_type: String,
    payload: String,
    created_at: Millis,
    expires_at: Millis,
    schema_version: Option<i64>,
}

impl From<EventRow> for Event {
    fn from(r: EventRow) -> Event {
        Event {
            id: EventId::from_stored(r.id),
            tenant: TenantId::from_stored(r.tenant_id),
            event_type: r.event_type,
            payload: r.payload,
            created_at: r.created_at,
            expires_at: r.expires_at,
            schema_version: r.schema_version,
        }
    }
}

/// A `deliveries` row as [`DELIVERY_COLUMNS`] selects it.
#[derive(sqlx::FromRow)]
pub(super) struct DeliveryRow {
    id: String,
    tenant_id: String,
    event_id: String,
    endpoint_id: String,
    event_type: String,
    state: String,
    attempts: i64,
    next_attempt_at: Option<Millis>,
    reason: Option<String>,
    last_status: Option<i64>,
    last_error: Option<String>,
    created_at: Millis,
    updated_at: Millis,
}

impl TryFrom<DeliveryRow> for Delivery {
    type Error = StoreError;

    fn try_from(r: DeliveryRow) -> Result<Delivery> {
        Ok(Delivery {
            id: DeliveryId::from_stored(r.id),
            tenant: TenantId::from_stored(r.tenant_id),
            event_id: EventId::from_stored(r.event_id),
            endpoint_id: EndpointId::from_stored(r.endpoint_id),
            event_type: r.event_type,
            state: delivery_state(&r.state)?,
            attempts: r.attempts as u32,
            next_attempt_at: r.next_attempt_at,
            reason: r.reason,
            last_status: r.last_status.map(|s| s as u16),
            last_error: r.last_error,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

/// An attempt as [`ATTEMPT_COLUMNS`] (or [`FIRST_ATTEMPT_COLUMNS`]) selects it.
#[derive(sqlx::FromRow)]
pub(super) struct AttemptRow {
    id: String,
    delivery_id: String,
    number: i64,
    started_at: Millis,
    duration_ms: i64,
    status: Option<i64>,
    response_body: Option<String>,
    error: Option<String>,
    verdict: String,
    decided_by: String,
    request_headers: Option<String>,
    request_body: Option<String>,
    request_body_size: Option<i64>,
}

impl From<AttemptRow> for Attempt {
    fn from(r: AttemptRow) -> Attempt {
        Attempt {
            id: r.id,
            delivery_id: DeliveryId::from_stored(r.delivery_id),
            number: r.number as u32,
            started_at: r.started_at,
            duration_ms: r.duration_ms as u64,
            status: r.status.map(|s| s as u16),
            response_body: r.response_body,
            error: r.error,
            verdict: ascii_label(r.verdict),
            decided_by: r.decided_by,
            request: r.request_headers.map(|headers_json| SentRequest {
                headers_json,
                body: r.request_body,
                body_size: r.request_body_size.unwrap_or(0) as u64,
            }),
        }
    }
}

/// A `replays` row (`SELECT *`).
#[derive(sqlx::FromRow)]
pub(super) struct ReplayRow {
    id: String,
    tenant_id: String,
    state: String,
    /// JSON array of delivery ids.
    ids: Option<String>,
    /// JSON `DeadLetterFilter`.
    filter: Option<String>,
    rate_per_sec: f64,
    batch: i64,
    selected: i64,
    requeued: i64,
    cursor: String,
    next_due_at: Millis,
    created_at: Millis,
    updated_at: Millis,
}

impl TryFrom<ReplayRow> for Replay {
    type Error = StoreError;

    fn try_from(r: ReplayRow) -> Result<Replay> {
        fn parse<T: serde::de::DeserializeOwned>(v: Option<String>) -> Result<Option<T>> {
            v.map(|t| serde_json::from_str(&t).map_err(|e| corrupt("replay", e))).transpose()
        }
        Ok(Replay {
            id: r.id,
            tenant: TenantId::from_stored(r.tenant_id),
            state: ReplayState::parse(&r.state).ok_or_else(|| corrupt("replay state", &r.state))?,
            ids: parse(r.ids)?,
            filter: parse(r.filter)?,
            rate_per_sec: r.rate_per_sec,
            batch: r.batch as u32,
            selected: r.selected as u64,
            requeued: r.requeued as u64,
            cursor: r.cursor,
            next_due_at: r.next_due_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

/// Decodes every row of a `Vec` through its conversion.
pub(super) fn all<R, T: TryFrom<R, Error = StoreError>>(rows: Vec<R>) -> Result<Vec<T>> {
    rows.into_iter().map(T::try_from).collect()
}
