//! Pull delivery: a `poll` endpoint's consumer reads its deliveries with a resumable cursor
//! (`GET …/endpoints/{id}/poll?cursor=&limit=`) and settles them by acknowledging a cursor
//! (`POST …/endpoints/{id}/poll/ack`), with the scope `poll`.
//!
//! A page holds the unsettled deliveries after its cursor, in the order their intakes
//! committed (`store::Reads::poll_page`), each with the body a push would send (the
//! envelope, or the CloudEvent) and the Standard Webhooks headers a push would carry over
//! it (`webhook-signature` with `v1` and `v1a` as the endpoint signs), signed at the read.
//! A cursor is opaque: the endpoint, the position of the last delivery read and that
//! delivery's id, with a check. Reading it again gives the same page while nothing is
//! acknowledged (at least once); once retention purged the delivery it names, it is
//! expired (`410 cursor_expired`). Acknowledging a cursor settles every unsettled delivery
//! up to it as delivered (an attempt decided by `poll`), idempotently. The queue TTL does
//! not apply: nothing is sent to time out, so a delivery waits until it is acknowledged.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};

use super::super::doc::ErrorCode;
use super::super::extract::{ItemPath, JsonBody, Path, Poll, Query, TenantAuth, bad_query};
use super::super::{ApiError, AppState, rfc3339};
use super::load_of_kind;
use crate::model::{
    CeAttributes, CeHeaders, DeliveryId, Endpoint, EndpointId, EndpointKind, Millis, encode_cloudevent, envelope,
};
use crate::sign::v1a::{SECRET_KEY_PREFIX, SigningKey};
use crate::sign::{self, Secret};
use crate::store::Polled;

/// Most deliveries in one page.
pub const MAX_LIMIT: u32 = 250;
/// A page's size when the query names none.
const DEFAULT_LIMIT: u32 = 50;
/// Deliveries an acknowledgement settles per transaction (it goes on until none is left).
const ACK_BATCH: u32 = 500;

/// Where a page starts.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PollQuery {
    /// The `next_cursor` of an earlier page; absent: from the oldest unsettled delivery.
    cursor: Option<String>,
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 250)]
    limit: Option<u32>,
}

/// One delivery as its consumer reads it: the event, and the request a push would send.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PolledOut {
    /// The event's id (its `webhook-id`).
    id: String,
    #[serde(rename = "type")]
    event_type: String,
    /// When the event was taken (RFC 3339).
    timestamp: String,
    /// The delivery an acknowledgement settles.
    delivery_id: String,
    /// The body a push would send, byte for byte: the Standard Webhooks envelope (or the
    /// CloudEvent). The signature covers exactly this text.
    body: String,
    /// The headers a push would carry with it: `webhook-id`, `webhook-timestamp` (this
    /// read's), `webhook-signature`, `content-type`, the endpoint's custom headers and, in
    /// CloudEvents binary mode, the `ce-*` attributes.
    headers: BTreeMap<String, String>,
}

/// A page of a `poll` endpoint's unsettled deliveries, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PollPage {
    data: Vec<PolledOut>,
    /// Where the next page starts: read it with `?cursor=`, acknowledge it to settle this
    /// page and those before it.
    next_cursor: String,
    /// Whether more unsettled deliveries wait after this page.
    more: bool,
}

/// A cursor whose pages are read and handled.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AckIn {
    /// A `next_cursor` of this endpoint: every delivery up to it is settled.
    cursor: String,
}

/// What an acknowledgement settled.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AckOut {
    /// Deliveries this call settled as delivered (0 when they were already: idempotent).
    acknowledged: u64,
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/endpoints/{id}/poll", tag = "endpoints", operation_id = "poll_endpoint",
    params(ItemPath, PollQuery),
    responses(
        (status = 200, description = "A page of unsettled deliveries after the cursor, signed as a push would be", body = PollPage),
        (status = 400, description = "`invalid_query`: a malformed `cursor` or a `limit` out of range", body = super::super::doc::ErrorBody),
        (status = 409, description = "`conflict`: the endpoint is not kind `poll` (its deliveries are pushed)", body = super::super::doc::ErrorBody),
        (status = 410, description = "`cursor_expired`: retention purged what the cursor points at; read without a cursor", body = super::super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["poll"]), ("admin_token" = [])),
)]
pub(crate) async fn poll(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Poll>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
    Query(q): Query<PollQuery>,
) -> Result<Json<PollPage>, ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(bad_query(format!("limit: must be 1 to {MAX_LIMIT}, not {limit}")));
    }
    let endpoint = load_of_kind(&state, &tenant, &id, EndpointKind::Poll, "its deliveries are pushed").await?;
    let at = match q.cursor {
        Some(text) => Cursor::decode(&text).map_err(|e| bad_query(format!("cursor: {e}")))?,
        None => Cursor::start(&endpoint.id),
    };
    current(&state, &endpoint.id, &at).await?;
    let mut found = state.store.poll_page(&endpoint.id, at.position, limit + 1).await?;
    let more = found.len() > limit as usize;
    found.truncate(limit as usize);
    let next = found.last().map_or(at, |d| Cursor::after(&endpoint.id, d));
    let signer = Signer::open(&state, &endpoint)?;
    let data = found.iter().map(|d| signer.item(&state, &endpoint, d)).collect();
    Ok(Json(PollPage { data, next_cursor: next.encode(), more }))
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/endpoints/{id}/poll/ack", tag = "endpoints", operation_id = "ack_poll",
    params(ItemPath), request_body = AckIn,
    responses(
        (status = 200, description = "Every unsettled delivery up to the cursor is delivered", body = AckOut),
        (status = 400, description = "`invalid_request`: a malformed `cursor`", body = super::super::doc::ErrorBody),
        (status = 409, description = "`conflict`: the endpoint is not kind `poll`", body = super::super::doc::ErrorBody),
        (status = 410, description = "`cursor_expired`: retention purged what the cursor points at", body = super::super::doc::ErrorBody),
        (status = 422, description = "`invalid_request`: a cursor of another endpoint", body = super::super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["poll"]), ("admin_token" = [])),
)]
pub(crate) async fn ack(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Poll>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
    JsonBody(input): JsonBody<AckIn>,
) -> Result<Json<AckOut>, ApiError> {
    let endpoint = load_of_kind(&state, &tenant, &id, EndpointKind::Poll, "its deliveries are pushed").await?;
    let at = Cursor::decode(&input.cursor).map_err(|e| ApiError::bad_request(format!("cursor: {e}")))?;
    if at.endpoint != endpoint.id.as_str() {
        return Err(ApiError::unprocessable("cursor: is a cursor of another endpoint"));
    }
    current(&state, &endpoint.id, &at).await?;
    let mut acknowledged = 0;
    loop {
        let n = state.store.ack_polled(&endpoint.id, at.position, state.clock.now(), ACK_BATCH).await?;
        acknowledged += n;
        if n < u64::from(ACK_BATCH) {
            break;
        }
    }
    if acknowledged > 0 {
        state.metrics.tenant(tenant.as_str(), EndpointKind::Poll).acknowledged(acknowledged);
        tracing::info!(tenant = %tenant, endpoint_id = %endpoint.id, acknowledged, "poll deliveries acknowledged");
    }
    Ok(Json(AckOut { acknowledged }))
}

/// Refuses a cursor of another endpoint, and one whose delivery retention purged (`410`).
async fn current(state: &AppState, endpoint: &EndpointId, at: &Cursor) -> Result<(), ApiError> {
    if at.endpoint != endpoint.as_str() {
        return Err(bad_query("cursor: is a cursor of another endpoint"));
    }
    let Some(delivery) = &at.delivery else { return Ok(()) };
    match state.store.poll_position(endpoint, &DeliveryId::from_stored(delivery.as_str())).await? {
        Some(p) if p == at.position => Ok(()),
        Some(_) => Err(bad_query("cursor: does not match the delivery it names")),
        None => Err(ApiError::new(
            StatusCode::GONE,
            ErrorCode::CursorExpired,
            "cursor: retention purged the deliveries it points at; read without a cursor to start from the \
             oldest unsettled delivery",
        )),
    }
}

/// A position in one endpoint's deliveries: after `position` (0: before the first), where
/// `delivery` (the last one read) stood.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cursor {
    endpoint: String,
    position: i64,
    delivery: Option<String>,
}

/// The cursor's version, first in its text.
const CURSOR_VERSION: &str = "pc1";

impl Cursor {
    /// Before the endpoint's first delivery.
    fn start(endpoint: &EndpointId) -> Cursor {
        Cursor { endpoint: endpoint.to_string(), position: 0, delivery: None }
    }

    /// After delivery `d`.
    fn after(endpoint: &EndpointId, d: &Polled) -> Cursor {
        Cursor { endpoint: endpoint.to_string(), position: d.position, delivery: Some(d.delivery.to_string()) }
    }

    fn encode(&self) -> String {
        let text = self.text();
        URL_SAFE_NO_PAD.encode(format!("{text}|{}", check(&text)))
    }

    fn decode(s: &str) -> Result<Cursor, &'static str> {
        let malformed = "is not a cursor Herald gave out (use a next_cursor as it is)";
        let bytes = URL_SAFE_NO_PAD.decode(s).map_err(|_| malformed)?;
        let text = String::from_utf8(bytes).map_err(|_| malformed)?;
        let (body, sum) = text.rsplit_once('|').ok_or(malformed)?;
        let mut parts = body.split('|');
        let (Some(CURSOR_VERSION), Some(endpoint), Some(position), Some(delivery), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed);
        };
        let position: i64 = position.parse().map_err(|_| malformed)?;
        let delivery = (!delivery.is_empty()).then(|| delivery.to_string());
        let cursor = Cursor { endpoint: endpoint.to_string(), position, delivery };
        match sum == check(&cursor.text()) && position >= 0 {
            true => Ok(cursor),
            false => Err(malformed),
        }
    }

    fn text(&self) -> String {
        let delivery = self.delivery.as_deref().unwrap_or_default();
        format!("{CURSOR_VERSION}|{}|{}|{delivery}", self.endpoint, self.position)
    }
}

/// The check of a cursor's text: the first 8 bytes of its SHA-256, in hex (it catches a
/// cursor cut or edited by mistake; it is no secret).
fn check(text: &str) -> String {
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

/// The endpoint's keys valid at the read, opened: what a push at this moment signs with.
struct Signer {
    secrets: Vec<Secret>,
    keys: Vec<SigningKey>,
    now: Millis,
}

impl Signer {
    fn open(state: &AppState, endpoint: &Endpoint) -> Result<Signer, ApiError> {
        let now = state.clock.now();
        let secrets = endpoint.valid_secrets(now).filter_map(|s| Secret::parse(&s.secret).ok()).collect();
        let sealer = state.config.secrets.as_deref();
        let cannot = |why: String| {
            let message = format!("signing_key: the stored key {why}; write it again");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::InternalError, message)
        };
        let mut keys = Vec::new();
        for entry in endpoint.valid_secrets(now).filter(|s| s.is_v1a()) {
            let plain = match (entry.secret.starts_with(SECRET_KEY_PREFIX), sealer) {
                (true, _) => entry.secret.clone(),
                (false, Some(sealer)) => sealer.open(&entry.secret).map_err(cannot)?,
                (false, None) => return Err(cannot("is sealed and this node has no [secrets] key".into())),
            };
            keys.push(SigningKey::parse(&plain).map_err(|e| cannot(e.to_string()))?);
        }
        Ok(Signer { secrets, keys, now })
    }

    /// `d` as a push of it would go out now: its body and headers, signed.
    fn item(&self, state: &AppState, endpoint: &Endpoint, d: &Polled) -> PolledOut {
        let spec = &endpoint.spec;
        let event_id = d.event_id.as_str();
        let mut headers: Vec<(String, String)> = std::iter::once(("content-type".into(), "application/json".into()))
            .chain(spec.headers.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect();
        let body = match &spec.cloudevents {
            None => envelope(event_id, &d.event_type, d.event_created_at, &d.payload).into_bytes(),
            Some(ce) => {
                let attributes = CeAttributes {
                    id: event_id.to_string(),
                    source: ce.source_for(endpoint.tenant.as_str()),
                    event_type: d.event_type.clone(),
                    time: rfc3339(d.event_created_at),
                    dataschema: state.catalog.dataschema(&endpoint.tenant, &d.event_type),
                };
                let data = d.payload.clone().into_bytes();
                encode_cloudevent(ce.mode, &attributes, CeHeaders::Http, &mut headers, data)
            }
        };
        let timestamp = self.now.div_euclid(1000);
        let secrets: Vec<&Secret> = self.secrets.iter().collect();
        let keys: Vec<&SigningKey> = self.keys.iter().collect();
        let signature = sign::signature_header(&secrets, &keys, event_id, timestamp, &body);
        headers.extend([
            (sign::HEADER_ID.to_string(), event_id.to_string()),
            (sign::HEADER_TIMESTAMP.to_string(), timestamp.to_string()),
            (sign::HEADER_SIGNATURE.to_string(), signature),
            ("herald-delivery-id".to_string(), d.delivery.to_string()),
        ]);
        PolledOut {
            id: event_id.to_string(),
            event_type: d.event_type.clone(),
            timestamp: rfc3339(d.event_created_at),
            delivery_id: d.delivery.to_string(),
            // The envelope and a CloudEvent are JSON text; a payload is stored as posted.
            body: String::from_utf8_lossy(&body).into_owned(),
            headers: headers.into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_written_and_refuses_an_edit() {
        let id = EndpointId::from_stored("ep_1");
        let start = Cursor::start(&id);
        assert_eq!(Cursor::decode(&start.encode()), Ok(start));
        let d = Polled {
            position: 42,
            delivery: DeliveryId::from_stored("del_9"),
            event_id: crate::model::EventId::from_stored("evt_1"),
            event_type: "a.b".into(),
            payload: "{}".into(),
            event_created_at: 0,
        };
        let after = Cursor::after(&id, &d);
        let text = after.encode();
        assert_eq!(Cursor::decode(&text).unwrap(), after);
        let edited = URL_SAFE_NO_PAD
            .encode(String::from_utf8(URL_SAFE_NO_PAD.decode(&text).unwrap()).unwrap().replace("|42|", "|41|"));
        for bad in [edited.as_str(), "", "nope", &text[1..], "cGMxfGVwXzF8MHx8MDA"] {
            assert!(Cursor::decode(bad).is_err(), "{bad:?}");
        }
    }
}
