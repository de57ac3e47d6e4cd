//! `POST /v1/tenants/{tenant}/endpoints/{id}/test-send`: one of the catalog's example
//! payloads of a type, sent to one endpoint now. It is an ordinary event (stored, signed,
//! paced, retried, listed with the others) whose only delivery is to that endpoint, whatever
//! the endpoint's event-type filter. The answer comes once it is stored, with the delivery's
//! id: a page follows the attempt through `GET …/deliveries/{id}` rather than holding this
//! request open for an endpoint that may be slow or paced.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::event_types::seen_by;
use super::extract::{ItemPath, JsonBody, Manage, Path, TenantAuth};
use super::{ApiError, AppState};
use crate::intake;
use crate::model::{EndpointId, EventId, NewEvent, event_fingerprint};
use crate::store::DeliveryFilter;

/// Which example to send.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TestSendIn {
    /// A type of the tenant's event catalog (its own or the operator's).
    event_type: String,
    /// Which of the type's examples (0 when absent).
    #[serde(default)]
    example: usize,
}

/// The test event, stored, and its delivery to the endpoint.
#[derive(Serialize, ToSchema)]
pub(crate) struct TestSendOut {
    event_id: String,
    /// Follow its attempts at `GET /v1/tenants/{tenant}/deliveries/{delivery_id}`.
    delivery_id: String,
    endpoint_id: String,
    event_type: String,
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/endpoints/{id}/test-send", tag = "endpoints", operation_id = "test_send",
    params(ItemPath), request_body = TestSendIn,
    responses(
        (status = 202, description = "Stored, with one delivery to this endpoint, sent through the engine like any other", body = TestSendOut),
        (status = 409, description = "`conflict`: the endpoint takes no deliveries (disabled)", body = super::doc::ErrorBody),
        (status = 422, description = "`invalid_request`: no such type in the catalog, or no such example", body = super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn test_send(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
    JsonBody(input): JsonBody<TestSendIn>,
) -> Result<(StatusCode, Json<TestSendOut>), ApiError> {
    let endpoint = match state.store.endpoint(&EndpointId::from_stored(id)).await? {
        Some(e) if e.tenant == tenant => e,
        _ => return Err(ApiError::not_found("endpoint")),
    };
    let t = seen_by(&state, &tenant, &input.event_type).await.map_err(|_| {
        ApiError::unprocessable(format!("event_type: {:?} is not in the tenant's event catalog", input.event_type))
    })?;
    let example = t.examples.get(input.example).ok_or_else(|| {
        ApiError::unprocessable(format!("example: {} has {} examples (0-based)", t.name, t.examples.len()))
    })?;
    let payload = example.to_string();
    let now = state.clock.now();
    let event = NewEvent {
        tenant: tenant.clone(),
        id: EventId::generate(now, &mut rand::rng()),
        fingerprint: event_fingerprint(&t.name, &payload),
        event_type: t.name,
        payload,
        created_at: now,
        expires_at: now.saturating_add(state.config.retry.ttl().as_millis() as i64),
        ordering_key: None,
        trace: None,
        schema_version: (t.version > 0).then_some(t.version),
        only: Some(endpoint.id.clone()),
    };
    let (event_id, event_type) = (event.id.clone(), event.event_type.clone());
    let outcomes = intake::commit(&state.committer, &state.metrics, &*state.engine, vec![event]).await?;
    if outcomes.first().is_none_or(|(_, o)| o.deliveries == 0) {
        return Err(ApiError::from(crate::store::StoreError::Conflict(
            "endpoint: it takes no deliveries now (disabled); enable it first".into(),
        )));
    }
    let filter = DeliveryFilter {
        tenant: Some(tenant),
        event: Some(event_id.clone()),
        endpoint: Some(endpoint.id.clone()),
        limit: 1,
        ..DeliveryFilter::default()
    };
    let delivery = state.store.list_deliveries(&filter).await?.into_iter().next();
    let delivery = delivery.ok_or_else(|| ApiError::not_found("delivery"))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(TestSendOut {
            event_id: event_id.to_string(),
            delivery_id: delivery.id.to_string(),
            endpoint_id: endpoint.id.to_string(),
            event_type,
        }),
    ))
}
