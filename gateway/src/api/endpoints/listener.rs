//! `herald listen` in the API: `GET …/endpoints/{id}/listen` is the listener's one
//! connection to a node (an NDJSON stream of the requests to forward, built and signed by
//! the engine exactly as a webhook's), and `POST …/endpoints/{id}/listen` posts the local
//! URL's answer to one of them back, which the engine records as the attempt's result and
//! classifies as an HTTP answer (`deliver/relay.rs` holds both ends).
//!
//! Taking a connection pins the endpoint to this node (`endpoints.listener`), so the
//! endpoint's partition moves here through the usual hand-over (`worker/members.rs`). The
//! answer is data, like a posted event: it leaves no audit entry (`api/audit.rs`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::super::doc::ErrorCode;
use super::super::extract::{ItemPath, JsonBody, Manage, Path, TenantAuth};
use super::super::{ApiError, AppState};
use super::load_of_kind;
use crate::classify::TransportErrorKind;
use crate::deliver::relay::{Answer, Listening, Relay};
use crate::model::EndpointKind;

/// How often an idle connection carries a `ping` line: a listener gone without a word
/// (killed, its network cut) is found at the next write.
const PING_EVERY: Duration = Duration::from_secs(1);

/// The local URL's answer to one request of the stream, or why there was none.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AnswerIn {
    /// The request's `id`, as the stream gave it.
    request: String,
    /// The local URL's status code; absent when it gave no answer (`error`).
    status: Option<u16>,
    /// The answer's headers, as `[name, value]` pairs.
    #[serde(default)]
    #[schema(value_type = Vec<Vec<String>>)]
    headers: Vec<(String, String)>,
    /// The first KiB of the answer's body (more is cut).
    #[serde(default)]
    body: String,
    /// Instead of `status`: the transport failure (`connection_refused`, `timeout`,
    /// `connection_reset`, `dns`, `tls`, `other`, …).
    #[schema(value_type = Option<String>)]
    error: Option<TransportErrorKind>,
    /// What the listener saw of the failure.
    #[serde(default)]
    detail: String,
}

/// Whether the answer was taken.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AnswerOut {
    /// False when no attempt waits for it (answered already, past the endpoint's
    /// `timeout`, or its connection ended): it is dropped.
    taken: bool,
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/endpoints/{id}/listen", tag = "endpoints", operation_id = "listen_endpoint",
    params(ItemPath),
    responses(
        (status = 200, description = "The listener's connection, until it closes: one JSON object a line. `{\"type\": \"hello\", \"endpoint\", \"node\"}` first, then `{\"type\": \"request\", \"id\", \"delivery_id\", \"event_id\", \"event_type\", \"attempt\", \"headers\": [[name, value]…], \"body\": base64}` for each request to forward (answer it with `POST` on this path), and `{\"type\": \"ping\"}` every second. A newer connection to the same endpoint ends this one.", content_type = "application/x-ndjson", body = String),
        (status = 409, description = "`conflict`: the endpoint is not of kind `listen`", body = super::super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn listen(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
) -> Result<Response, ApiError> {
    let endpoint = load_of_kind(&state, &tenant, &id, EndpointKind::Listen, LISTEN_ONLY).await?;
    let relay = listen_relay(&state)?;
    let Some(listening) = relay.connect(endpoint.id.as_str()) else {
        return Err(stopping());
    };
    state.store.put_listener(&endpoint.id, &state.node_id).await?;
    tracing::info!(tenant = %tenant, endpoint_id = %endpoint.id, "a listener connected");
    // A change (the other nodes read the pin and hand the endpoint over) and work (a
    // partition starts here if none runs).
    let ids = std::slice::from_ref(&endpoint.id);
    state.engine.changed(ids);
    state.engine.poke(ids);
    let hello = json!({"type": "hello", "endpoint": endpoint.id.as_str(), "node": state.node_id});
    let lines = futures::stream::unfold((listening, Some(hello)), |(mut listening, hello)| async move {
        let line = match hello {
            Some(hello) => hello,
            None => next_line(&mut listening).await?,
        };
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        Some((Ok::<_, Infallible>(Bytes::from(bytes)), (listening, None)))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from_stream(lines))
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::InternalError, e.to_string()))
}

/// The next line of the stream: a request, or a ping after [`PING_EVERY`] without one;
/// `None`: the connection is over (replaced, or the node stops).
async fn next_line(listening: &mut Listening) -> Option<Value> {
    tokio::select! {
        request = listening.next() => {
            let mut line = serde_json::to_value(request?).ok()?;
            line["type"] = json!("request");
            Some(line)
        }
        _ = tokio::time::sleep(PING_EVERY) => Some(json!({"type": "ping"})),
    }
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/endpoints/{id}/listen", tag = "endpoints", operation_id = "answer_listen_request",
    params(ItemPath),
    request_body = AnswerIn,
    responses(
        (status = 200, description = "The answer is the attempt's result (`taken`), or nothing waits for it", body = AnswerOut),
        (status = 409, description = "`conflict`: the endpoint is not of kind `listen`", body = super::super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn answer(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
    JsonBody(input): JsonBody<AnswerIn>,
) -> Result<Json<AnswerOut>, ApiError> {
    let endpoint = load_of_kind(&state, &tenant, &id, EndpointKind::Listen, LISTEN_ONLY).await?;
    let relay = listen_relay(&state)?;
    let AnswerIn { request, status, headers, body, error, detail } = input;
    let answer = match (status, error) {
        (Some(status), None) if (100..=599).contains(&status) => Answer::Response { status, headers, body },
        (Some(_), None) => return Err(ApiError::unprocessable("status: must be between 100 and 599")),
        (None, Some(error)) => Answer::Failed { error, detail },
        (Some(_), Some(_)) => return Err(ApiError::unprocessable("error: give status or error, not both")),
        (None, None) => return Err(ApiError::unprocessable("status: required (or error, when there was no answer)")),
    };
    Ok(Json(AnswerOut { taken: relay.answer(endpoint.id.as_str(), &request, answer) }))
}

/// The node's relay, for an endpoint of kind `listen`.
/// Why only an endpoint of kind `listen` takes these routes (its 409's message).
const LISTEN_ONLY: &str = "only an endpoint of kind listen takes a listener";

fn listen_relay(state: &AppState) -> Result<&Arc<Relay>, ApiError> {
    state.deliverer.as_ref().map(|d| d.relay()).ok_or_else(stopping)
}

fn stopping() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::StorageUnavailable, "the node is stopping")
}
