//! Verified endpoints in the API: an endpoint's `verification` as shown, and `POST
//! …/endpoints/{id}/verify` ("verify now"), which makes the handshake due at once. The
//! handshake itself is the engine's (`worker/partition/verify.rs`): the node that paces the
//! endpoint sends it, so this answers with the state it leaves, `pending`, and a page
//! follows it through `GET …/endpoints/{id}`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use super::super::doc::ErrorCode;
use super::super::extract::{ItemPath, Manage, Path, TenantAuth};
use super::super::{ApiError, AppState, rfc3339};
use super::{EndpointOut, load, read_view};
use crate::model::{Endpoint, Verification, VerifyState};

/// Where an endpoint's verification stands (only on an endpoint with `verify`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct VerificationOut {
    /// `pending` (not tried at its current URL, or asked to try now), `verified` or
    /// `failed`; deliveries go out only once `verified`.
    state: VerifyState,
    /// Why the last try failed.
    reason: Option<String>,
    last_tried_at: Option<String>,
    /// When it is tried next (null once verified).
    next_try_at: Option<String>,
}

/// `e`'s verification as shown; `None` when it does not ask for one.
pub(super) fn verification_view(e: &Endpoint) -> Option<VerificationOut> {
    let v = e.verification_now()?;
    let next_try_at = match v.state {
        VerifyState::Verified => None,
        // Pending: due as soon as its node gets to it.
        _ => Some(rfc3339(v.next_try_at.unwrap_or(e.updated_at))),
    };
    Some(VerificationOut { state: v.state, reason: v.reason, last_tried_at: v.last_tried_at.map(rfc3339), next_try_at })
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/endpoints/{id}/verify", tag = "endpoints", operation_id = "verify_endpoint",
    params(ItemPath),
    responses(
        (status = 202, description = "The handshake is due now: `verification.state` is `pending` until the endpoint's node has sent it", body = EndpointOut),
        (status = 409, description = "`conflict`: the endpoint does not ask for verification (`verify` is off, or not kind `http`)", body = super::super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn verify_now(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
) -> Result<(StatusCode, Json<EndpointOut>), ApiError> {
    let mut endpoint = load(&state, &tenant, &id).await?;
    let Some(url) = endpoint.spec.target.as_http().filter(|t| t.verify).map(|t| t.url.clone()) else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::Conflict,
            "verify: the endpoint does not ask for verification; set \"verify\": true first",
        ));
    };
    let v = Verification::requested(endpoint.verification.as_ref(), &url, state.clock.now());
    if !state.store.put_verification(&endpoint.id, &v).await? {
        return Err(ApiError::not_found("endpoint"));
    }
    endpoint.verification = Some(v);
    tracing::info!(tenant = %tenant, endpoint_id = %endpoint.id, "endpoint verification asked for now");
    // A change (a running partition reads the endpoint again) and work (one starts if none
    // runs), so the handshake goes out now even with no delivery waiting.
    state.engine.changed(std::slice::from_ref(&endpoint.id));
    state.engine.poke(std::slice::from_ref(&endpoint.id));
    Ok((StatusCode::ACCEPTED, Json(read_view(&state, &endpoint).await?)))
}
