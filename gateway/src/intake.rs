//! Intake: validates posted events and hands them to the group committer, so a `202` is
//! only ever answered after the event and all its deliveries are durable. It knows nothing
//! of HTTP status codes.
//!
//! A fingerprint of type + payload tells a repeat of an id from a conflicting reuse.
//! `intake::commit` is the one entry for validated events (the events API and the outbox
//! relay): commit, count, wake the engine. It yields to the runtime before the commit and
//! after the hand-over, so under CPU saturation runnable deliveries go before new intake
//! (back-pressure on producers instead of a backlog every delivery waits behind).

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::catalog::{Catalog, Check};
use crate::clock::Clock;
use crate::config::Config;
use crate::json::{Object, within};
use crate::metrics::Metrics;
use crate::model::{
    EndpointId, EventId, Millis, NewEvent, TenantId, event_fingerprint, validate_event_type, validate_ordering_key,
};
use crate::store::{Claimed, Committer, IngestOutcome, StoreError};

/// The delivery engine as the layers above it see it: told of committed work and
/// changes. `worker::Engine` implements it, so intake, the API, the outbox relays and
/// replays never need the engine itself (and `worker` stays above them all).
pub trait Wake: Send + Sync {
    /// These endpoints have new work from op `seq` in the store's order of writes (see
    /// `IngestOutcome::seq`; 0 when unknown).
    fn poke_after(&self, endpoints: &[EndpointId], seq: u64);
    /// Deliveries leased at intake (see `store::Handoff`), for their partitions.
    fn hand_over(&self, leased: &mut dyn Iterator<Item = (EndpointId, Claimed)>);
    /// These endpoints' settings or state changed (committed).
    fn changed(&self, endpoints: &[EndpointId]);
    /// The engine's clock, for the stored times written above it.
    fn clock(&self) -> Clock;
    /// These endpoints have new work.
    fn poke(&self, endpoints: &[EndpointId]) {
        self.poke_after(endpoints, 0);
    }
}

/// The engine, shared by everything above it that wakes it.
pub type Waker = std::sync::Arc<dyn Wake>;

/// Why an event was refused before anything was written.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error("{0}")]
    Invalid(String),
    /// `at` is the payload's path (`payload`, `events[3].payload`).
    #[error("{at}: {size} bytes, over the limit of {limit} (server.max_payload_bytes)")]
    TooLarge { at: String, size: usize, limit: usize },
    /// `at` is `payload`, or `events` when one of a batch's payloads is (the depth is
    /// measured on the whole body, before it is parsed).
    #[error("{at}: nests deeper than {limit} levels of arrays and objects")]
    TooDeep { at: &'static str, limit: usize },
    /// The payload fails its type's schema, or the catalog lacks its type, and the tenant
    /// enforces its catalog (`schema_validation: enforce`); the reason names the path.
    #[error("{0}")]
    Schema(String),
    #[error("event {id:?} was already posted with a different type or payload")]
    Conflict {
        id: String,
        /// Its index among the events submitted together.
        at: usize,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An event as posted: `{"id"?: "...", "type": "...", "payload": <any JSON>}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventIn<'a> {
    /// `evt_…`, unique per tenant (a repeat is answered, not stored twice); generated when absent.
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub event_type: String,
    /// Any JSON; its bytes are kept exactly as received.
    #[serde(borrow)]
    #[schema(value_type = serde_json::Value)]
    pub payload: &'a RawValue,
    /// On endpoints ordered by `key`: the order this event is delivered in (say, a customer
    /// id); events without one share the endpoint's default key. 1-256 visible ASCII.
    #[serde(default)]
    pub ordering_key: Option<String>,
}

/// A batch as posted: `{"events": [ ... ]}`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchIn<'a> {
    #[serde(borrow)]
    #[schema(value_type = Vec<EventIn<'_>>)]
    pub events: Vec<Object<EventIn<'a>>>,
}

/// How deeply a payload may nest arrays and objects. Below the JSON parser's own limit
/// (128 levels for the whole body), so a deep payload gets this clear refusal, not a parse
/// error; and receivers and plugins never see a document deeper than this.
pub const MAX_PAYLOAD_DEPTH: usize = 100;

/// Limits and defaults intake applies.
#[derive(Debug, Clone, Copy)]
pub struct IntakeLimits {
    pub max_payload_bytes: usize,
    pub max_events_per_request: usize,
    pub ttl_ms: Millis,
}

impl IntakeLimits {
    /// The limits a node's configuration sets.
    pub fn from_config(config: &Config) -> IntakeLimits {
        IntakeLimits {
            max_payload_bytes: config.max_payload_bytes,
            max_events_per_request: config.max_events_per_request,
            ttl_ms: config.retry.ttl().as_millis() as i64,
        }
    }
}

/// What intake checks an event against: the node's limits and the tenants' event catalogs.
#[derive(Clone, Copy)]
pub struct Checks<'a> {
    pub limits: &'a IntakeLimits,
    pub catalog: &'a Catalog,
}

/// Validates one posted event into a `NewEvent` stamped with `now`: its fields, then its
/// payload against the tenant's event catalog as the tenant's `schema_validation` says
/// (`enforce` refuses it, `warn` counts it).
pub fn prepare(
    tenant: &TenantId,
    input: &EventIn<'_>,
    checks: Checks<'_>,
    now: Millis,
    rng: &mut impl rand::Rng,
) -> Result<NewEvent, IntakeError> {
    let limits = checks.limits;
    validate_event_type(&input.event_type).map_err(|e| IntakeError::Invalid(format!("type: {e}")))?;
    let payload = input.payload.get();
    if payload.len() > limits.max_payload_bytes {
        let (at, size, limit) = ("payload".into(), payload.len(), limits.max_payload_bytes);
        return Err(IntakeError::TooLarge { at, size, limit });
    }
    match checks.catalog.check(tenant, &input.event_type, payload) {
        Check::Pass => {}
        Check::Warned(reason) => tracing::debug!(tenant = %tenant, %reason, "event fails its catalog (warn)"),
        Check::Refused(reason) => return Err(IntakeError::Schema(reason)),
    }
    let id = match &input.id {
        Some(id) => EventId::parse(id).map_err(|e| IntakeError::Invalid(format!("id: {}", e.0)))?,
        None => EventId::generate(now, rng),
    };
    if let Some(key) = &input.ordering_key {
        validate_ordering_key(key).map_err(|e| IntakeError::Invalid(format!("ordering_key: {e}")))?;
    }
    Ok(NewEvent {
        tenant: tenant.clone(),
        id,
        event_type: input.event_type.clone(),
        payload: payload.to_string(),
        fingerprint: event_fingerprint(&input.event_type, payload),
        created_at: now,
        expires_at: now.saturating_add(limits.ttl_ms),
        ordering_key: input.ordering_key.clone(),
        trace: None,
        schema_version: checks.catalog.version(tenant, &input.event_type),
        only: None,
    })
}

/// Validates one event given as separate fields (an outbox row) into a `NewEvent`: the
/// same checks as a posted event, nesting limit first.
pub fn prepare_fields(
    tenant: &TenantId,
    (id, event_type, payload): (&str, &str, &str),
    checks: Checks<'_>,
    now: Millis,
    rng: &mut impl rand::Rng,
) -> Result<NewEvent, IntakeError> {
    let limits = checks.limits;
    if payload.len() > limits.max_payload_bytes {
        let (at, size, limit) = ("payload".into(), payload.len(), limits.max_payload_bytes);
        return Err(IntakeError::TooLarge { at, size, limit });
    }
    if nesting_depth(payload.as_bytes()) > MAX_PAYLOAD_DEPTH {
        return Err(IntakeError::TooDeep { at: "payload", limit: MAX_PAYLOAD_DEPTH });
    }
    // What the events API refuses, a row is refused for too: invalid JSON, a key given twice.
    crate::json::check_strict(payload.as_bytes()).map_err(|e| IntakeError::Invalid(within("payload", &e)))?;
    let payload: &RawValue =
        serde_json::from_str(payload).map_err(|e| IntakeError::Invalid(format!("payload: invalid JSON: {e}")))?;
    let input = EventIn { id: Some(id.to_string()), event_type: event_type.to_string(), payload, ordering_key: None };
    prepare(tenant, &input, checks, now, rng)
}

/// Parses one posted event's body (`{"type": …, "payload": …}`), nesting limit first.
pub fn parse_one(body: &[u8]) -> Result<EventIn<'_>, IntakeError> {
    parse(body, 1, "payload")
}

/// Parses `body` as `T` after checking that nothing in it nests deeper than
/// [`MAX_PAYLOAD_DEPTH`] plus the `envelope` levels around each payload, and that no
/// object in it, payloads included, gives a key twice (receivers' parsers disagree on which
/// copy wins). The body must be an object. Errors start with the field path
/// (`events[2].type: required`); a payload too deep is said of `deep` (what holds it).
fn parse<'a, T: Deserialize<'a>>(body: &'a [u8], envelope: usize, deep: &'static str) -> Result<T, IntakeError> {
    if nesting_depth(body) > MAX_PAYLOAD_DEPTH + envelope {
        return Err(IntakeError::TooDeep { at: deep, limit: MAX_PAYLOAD_DEPTH });
    }
    // Syntax and trailing characters are checked here too, so what follows fails on types only.
    crate::json::check_strict(body).map_err(IntakeError::Invalid)?;
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body)).map(|Object(t)| t).map_err(|e| {
        let at = e.path().to_string();
        IntakeError::Invalid(crate::json::describe(&at, &crate::json::message(e.inner())))
    })
}

/// The deepest nesting of arrays and objects in a JSON text (brackets inside strings do
/// not count). Linear and allocation-free, so it runs before any parsing.
pub fn nesting_depth(json: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Parses and validates a whole batch: one bad event refuses the batch, nothing is written.
pub fn prepare_batch(
    tenant: &TenantId,
    body: &[u8],
    checks: Checks<'_>,
    now: Millis,
    rng: &mut impl rand::Rng,
) -> Result<Vec<NewEvent>, IntakeError> {
    let limits = checks.limits;
    // `{"events": [{"payload": …}]}`: three levels around each payload.
    let batch: BatchIn<'_> = parse(body, 3, "events")?;
    if batch.events.is_empty() {
        return Err(IntakeError::Invalid("events: must not be empty".into()));
    }
    if batch.events.len() > limits.max_events_per_request {
        return Err(IntakeError::Invalid(format!(
            "events: {} events, over the limit of {} (intake.max_events_per_request)",
            batch.events.len(),
            limits.max_events_per_request
        )));
    }
    batch
        .events
        .iter()
        .enumerate()
        .map(|(i, Object(e))| {
            let at = format!("events[{i}]");
            prepare(tenant, e, checks, now, rng).map_err(|err| match err {
                IntakeError::Invalid(m) => IntakeError::Invalid(within(&at, &m)),
                IntakeError::Schema(m) => IntakeError::Schema(within(&at, &m)),
                IntakeError::TooLarge { at: field, size, limit } => {
                    IntakeError::TooLarge { at: format!("{at}.{field}"), size, limit }
                }
                other => other,
            })
        })
        .collect()
}

/// Stores the events durably (group commit) and reports each one's deliveries. An event
/// that reuses a stored id with another type or payload refuses the whole request: the
/// store writes none of it.
pub async fn accept(
    committer: &Committer,
    events: Vec<NewEvent>,
) -> Result<Vec<(EventId, IngestOutcome)>, IntakeError> {
    let ids: Vec<EventId> = events.iter().map(|e| e.id.clone()).collect();
    let outcomes = committer.ingest(events).await?;
    if let Some(at) = outcomes.iter().position(|o| o.conflict) {
        return Err(IntakeError::Conflict { id: ids[at].to_string(), at });
    }
    Ok(ids.into_iter().zip(outcomes).collect())
}

/// The one way validated events enter Herald, for every producer path (the events API,
/// the outbox relay): [`accept`] (timed as `herald_intake_commit_duration_seconds`), then
/// count what was new and wake the engine for the endpoints that got deliveries.
///
/// Delivery goes first when the node is short of CPU: intake yields to the runtime before
/// its commit and again after handing its deliveries over, so each request waits for the
/// tasks already runnable (attempts, partitions) before it is accepted and answered.
/// Producers posting as fast as they can then slow to the pace deliveries go out, instead
/// of piling up a backlog that every delivery waits behind (`herald-bench fanout-tail`).
/// An idle node runs the yielded request again at once.
pub async fn commit(
    committer: &Committer,
    metrics: &Metrics,
    engine: &dyn Wake,
    events: Vec<NewEvent>,
) -> Result<Vec<(EventId, IngestOutcome)>, IntakeError> {
    tokio::task::yield_now().await; // delivery first (see above)
    let mut outcomes = metrics.intake_commit.time(accept(committer, events)).await?;
    let fresh = outcomes.iter().map(|(_, o)| o).filter(|o| !o.duplicate);
    let (new_events, deliveries) = fresh.fold((0u64, 0u64), |(e, d), o| (e + 1, d + u64::from(o.deliveries)));
    metrics.events_accepted.inc_by(new_events);
    metrics.deliveries_created.inc_by(deliveries);
    if deliveries > 0 {
        let mut endpoints: Vec<EndpointId> = outcomes.iter().flat_map(|(_, o)| o.endpoints.iter().cloned()).collect();
        endpoints.sort_unstable();
        endpoints.dedup();
        let seq = outcomes.iter().map(|(_, o)| o.seq).max().unwrap_or(0);
        engine.poke_after(&endpoints, seq);
        engine.hand_over(&mut outcomes.iter_mut().flat_map(|(_, o)| o.leased.drain(..)));
        tokio::task::yield_now().await; // the partitions just woken run before the answer
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_brackets_outside_strings() {
        let cases: &[(&str, usize)] = &[
            ("1", 0),
            ("{}", 1),
            (r#"{"a": [1, {"b": []}]}"#, 4),
            (r#"{"a": "[[[{{{"}"#, 1),
            (r#"{"a": "\"[[["}"#, 1),
            (r#"["\\", [[]]]"#, 3),
        ];
        for (json, want) in cases {
            assert_eq!(nesting_depth(json.as_bytes()), *want, "{json}");
        }
    }

    #[test]
    fn too_deep_payloads_are_refused_before_parsing() {
        let deep = |n: usize| format!(r#"{{"type": "a.b", "payload": {}{}}}"#, "[".repeat(n), "]".repeat(n));
        assert!(parse_one(deep(MAX_PAYLOAD_DEPTH).as_bytes()).is_ok());
        let err = parse_one(deep(MAX_PAYLOAD_DEPTH + 1).as_bytes()).unwrap_err();
        assert!(matches!(err, IntakeError::TooDeep { .. }), "{err}");
        assert!(matches!(parse_one(deep(100_000).as_bytes()), Err(IntakeError::TooDeep { .. })));
    }
}
