//! Intake: validates posted events and hands them to the group committer, so a `202` is
//! only ever answered after the event and all its deliveries are durable. It knows nothing
//! of HTTP status codes.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::model::{EventId, Millis, NewEvent, TenantId, validate_event_type};
use crate::store::{Committer, IngestOutcome, StoreError};

/// Why an event was refused before anything was written.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error("{0}")]
    Invalid(String),
    #[error("payload is {size} bytes, over the limit of {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An event as posted: `{"id"?: "...", "type": "...", "payload": <any JSON>}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventIn<'a> {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub event_type: String,
    #[serde(borrow)]
    pub payload: &'a RawValue,
}

/// A batch as posted: `{"events": [ ... ]}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchIn<'a> {
    #[serde(borrow)]
    pub events: Vec<EventIn<'a>>,
}

/// Limits and defaults intake applies.
#[derive(Debug, Clone, Copy)]
pub struct IntakeLimits {
    pub max_payload_bytes: usize,
    pub max_events_per_request: usize,
    pub ttl_ms: Millis,
}

/// Validates one posted event into a `NewEvent` stamped with `now`.
pub fn prepare(
    tenant: &TenantId,
    input: &EventIn<'_>,
    limits: &IntakeLimits,
    now: Millis,
    rng: &mut impl rand::Rng,
) -> Result<NewEvent, IntakeError> {
    validate_event_type(&input.event_type).map_err(IntakeError::Invalid)?;
    let payload = input.payload.get();
    if payload.len() > limits.max_payload_bytes {
        return Err(IntakeError::TooLarge { size: payload.len(), limit: limits.max_payload_bytes });
    }
    let id = match &input.id {
        Some(id) => EventId::parse(id).map_err(|e| IntakeError::Invalid(e.0))?,
        None => EventId::generate(now, rng),
    };
    Ok(NewEvent {
        tenant: tenant.clone(),
        id,
        event_type: input.event_type.clone(),
        payload: payload.to_string(),
        created_at: now,
        expires_at: now.saturating_add(limits.ttl_ms),
    })
}

/// Parses and validates a whole batch: one bad event refuses the batch, nothing is written.
pub fn prepare_batch(
    tenant: &TenantId,
    body: &[u8],
    limits: &IntakeLimits,
    now: Millis,
    rng: &mut impl rand::Rng,
) -> Result<Vec<NewEvent>, IntakeError> {
    let batch: BatchIn<'_> =
        serde_json::from_slice(body).map_err(|e| IntakeError::Invalid(format!("invalid JSON body: {e}")))?;
    if batch.events.is_empty() {
        return Err(IntakeError::Invalid("events must not be empty".into()));
    }
    if batch.events.len() > limits.max_events_per_request {
        return Err(IntakeError::Invalid(format!(
            "{} events in one request, over the limit of {}",
            batch.events.len(),
            limits.max_events_per_request
        )));
    }
    batch
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            prepare(tenant, e, limits, now, rng).map_err(|err| match err {
                IntakeError::Invalid(m) => IntakeError::Invalid(format!("events[{i}]: {m}")),
                other => other,
            })
        })
        .collect()
}

/// Stores the events durably (group commit) and reports each one's deliveries.
pub async fn accept(committer: &Committer, events: Vec<NewEvent>) -> Result<Vec<IngestOutcome>, IntakeError> {
    Ok(committer.ingest(events).await?)
}
