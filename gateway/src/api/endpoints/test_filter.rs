//! `POST …/endpoints/{id}/test-filter` and `POST /v1/tenants/{tenant}/test-filter`: would
//! an event get a delivery on this endpoint (its event types and content filter), or
//! match a filter given in the body, and if not, which clause it fails. Nothing is stored.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::super::extract::{ItemPath, JsonBody, Path, Read, TenantAuth, TenantPath};
use super::super::{ApiError, AppState};
use super::load;
use crate::model::{Filter, Miss, filter_subject, type_filter_matches, validate_event_type};

/// An event to try on the endpoint's own filter.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TestEndpointFilterIn {
    /// The payload, as it would be posted (the filter reads it as `data`).
    payload: Value,
    /// The event's type: checked against the endpoint's `event_types`, and `type` in the
    /// filter. Absent: neither (a filter on `type` finds it missing).
    #[serde(rename = "type")]
    event_type: Option<String>,
}

/// A filter and an event to try it on.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TestFilterIn {
    /// The filter, as an endpoint's `filter` is written.
    #[schema(value_type = Object)]
    filter: Value,
    /// The payload, as it would be posted (the filter reads it as `data`).
    payload: Value,
    /// The event's type (`type` in the filter); absent: missing.
    #[serde(rename = "type")]
    event_type: Option<String>,
}

/// Whether the event matches, and where it failed if it does not.
#[derive(Serialize, ToSchema)]
pub(crate) struct TestFilterOut {
    /// Whether the event would be delivered: its type is one of the endpoint's (when given)
    /// and it matches the filter (when there is one).
    matches: bool,
    /// The filter tried, as written (null: the endpoint has none).
    #[schema(value_type = Option<Object>)]
    filter: Option<Value>,
    /// The first clause the event failed (`at` its place in the filter, or `event_types`),
    /// null when it matches.
    failed: Option<Miss>,
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/endpoints/{id}/test-filter", tag = "endpoints",
    operation_id = "test_endpoint_filter", params(ItemPath), request_body = TestEndpointFilterIn,
    responses((status = 200, description = "Whether the endpoint would get a delivery of the event, and which clause it fails", body = TestFilterOut)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn test_endpoint_filter(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
    JsonBody(input): JsonBody<TestEndpointFilterIn>,
) -> Result<Json<TestFilterOut>, ApiError> {
    let endpoint = load(&state, &tenant, &id).await?;
    let event_type = checked_type(input.event_type)?;
    let spec = &endpoint.spec;
    if let Some(t) = &event_type
        && !type_filter_matches(&spec.event_types, t)
    {
        let failed = Miss {
            at: "event_types".into(),
            clause: spec.event_types.join(", "),
            reason: format!("type {t:?} is none of the endpoint's event types"),
        };
        let filter = spec.filter.as_ref().map(|f| f.as_json().clone());
        return Ok(Json(TestFilterOut { matches: false, filter, failed: Some(failed) }));
    }
    Ok(Json(match &spec.filter {
        Some(f) => tried(f, &state, event_type.as_deref(), input.payload),
        None => TestFilterOut { matches: true, filter: None, failed: None },
    }))
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/test-filter", tag = "endpoints", operation_id = "test_filter",
    params(TenantPath), request_body = TestFilterIn,
    responses(
        (status = 200, description = "Whether the event matches the filter, and which clause it fails", body = TestFilterOut),
        (status = 422, description = "`invalid_request`: the filter is refused, naming the place (`filter.$and[1].data.amount: …`)", body = super::super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn test_filter(
    State(state): State<Arc<AppState>>,
    _auth: TenantAuth<Read>,
    JsonBody(input): JsonBody<TestFilterIn>,
) -> Result<Json<TestFilterOut>, ApiError> {
    let filter = Filter::parse(&input.filter).map_err(|e| ApiError::unprocessable(e.to_string()))?;
    let event_type = checked_type(input.event_type)?;
    Ok(Json(tried(&filter, &state, event_type.as_deref(), input.payload)))
}

fn checked_type(t: Option<String>) -> Result<Option<String>, ApiError> {
    if let Some(t) = &t {
        validate_event_type(t).map_err(|e| ApiError::unprocessable(format!("type: {e}")))?;
    }
    Ok(t)
}

/// `filter` on an event of `event_type` (none: without a type) with `payload`, posted now.
fn tried(filter: &Filter, state: &AppState, event_type: Option<&str>, payload: Value) -> TestFilterOut {
    let mut subject = filter_subject("evt_test", event_type.unwrap_or_default(), state.clock.now(), payload);
    if event_type.is_none()
        && let Some(fields) = subject.as_object_mut()
    {
        fields.remove("type");
    }
    let failed = filter.explain(&subject).err();
    TestFilterOut { matches: failed.is_none(), filter: Some(filter.as_json().clone()), failed }
}
