//! Replays of dead letters: create and cancel (scope `replay`), follow and list (`read`).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::doc::ErrorCode;
use super::extract::{ItemPath, JsonBody, Path, Query, Read, Replay as ReplayScope, TenantAuth, TenantPath};
use super::{ApiError, AppState, page_limit, parse_rfc3339, rfc3339};
use crate::model::*;
use crate::spec::{MAX_FILTER_TEXT, check_text};

/// Most delivery ids one replay may name.
const MAX_IDS: usize = 10_000;

/// Dead letters to replay: either `ids` or `filter`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayIn {
    /// 1 to 10 000 delivery ids.
    ids: Option<Vec<String>>,
    filter: Option<FilterIn>,
    /// Sent per second, in (0, 10000]; default 10.
    rate_per_sec: Option<f64>,
    /// The most re-queued at a time and not sent yet, 1 to 1000; default 100.
    batch: Option<u32>,
}

/// Which dead letters: every field narrows; `{}` selects them all.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FilterIn {
    endpoint: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    /// A reason (`permanent:422`) or a class of them (`permanent`), as the dead-letter
    /// listing's `reason`.
    reason: Option<String>,
    /// RFC 3339.
    since: Option<String>,
    /// RFC 3339.
    until: Option<String>,
}

/// A replay and its progress. Each delivery it re-queued is in exactly one of
/// `delivered`, `failed`, `returned` and `pending`, so those add up to `requeued`.
#[derive(Serialize, ToSchema)]
pub(crate) struct ReplayOut {
    id: String,
    /// `running` until everything it re-queued has settled (or it is cancelled), then
    /// `done`.
    state: ReplayState,
    /// Dead letters selected when the replay started.
    selected: u64,
    /// Re-queued so far.
    requeued: u64,
    /// Re-queued and attempted at least once since.
    sent: u64,
    delivered: u64,
    /// Sent, and dead letters again.
    failed: u64,
    /// Re-queued and dead letters again without being sent: the replay was cancelled
    /// first (they are back as they were), or their endpoint was disabled.
    returned: u64,
    /// Re-queued and not settled: waiting to be sent, in flight, or waiting for a retry.
    pending: u64,
    rate_per_sec: f64,
    batch: u32,
    ids: Option<Vec<String>>,
    /// The filter as given (`since` and `until` in RFC 3339, UTC).
    filter: Option<FilterOut>,
    /// The endpoints whose dead letters the filter selected but the replay leaves out,
    /// because they were paused or disabled when it started, and why.
    skipped: Vec<SkippedOut>,
    created_at: String,
    updated_at: String,
}

/// A replay's filter.
#[derive(Serialize, ToSchema)]
pub(crate) struct FilterOut {
    endpoint: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    reason: Option<String>,
    /// RFC 3339.
    since: Option<String>,
    /// RFC 3339.
    until: Option<String>,
}

/// An endpoint whose dead letters a replay leaves out.
#[derive(Serialize, ToSchema)]
pub(crate) struct SkippedOut {
    endpoint: String,
    /// `paused` or `disabled`.
    state: String,
    /// Why it is (its `state_reason`).
    reason: Option<String>,
    /// Its dead letters the filter selected.
    dead_letters: u64,
}

fn filter_view(f: &DeadLetterFilter) -> FilterOut {
    FilterOut {
        endpoint: f.endpoint.clone(),
        event_type: f.event_type.clone(),
        reason: f.reason.clone(),
        since: f.since.map(rfc3339),
        until: f.until.map(rfc3339),
    }
}

fn skipped_view(s: &SkippedEndpoint) -> SkippedOut {
    SkippedOut {
        endpoint: s.endpoint.clone(),
        state: s.state.clone(),
        reason: s.reason.clone(),
        dead_letters: s.dead_letters,
    }
}

fn view(p: &ReplayProgress) -> ReplayOut {
    let (r, f) = (&p.replay, &p.figures);
    ReplayOut {
        id: r.id.clone(),
        state: r.state,
        selected: r.selected,
        requeued: r.requeued,
        sent: f.sent,
        delivered: f.delivered,
        failed: f.failed,
        returned: f.returned,
        pending: f.pending,
        rate_per_sec: r.rate_per_sec,
        batch: r.batch,
        ids: r.ids.clone(),
        filter: r.filter.as_ref().map(filter_view),
        skipped: r.filter.iter().flat_map(|f| f.skipped.iter().map(skipped_view)).collect(),
        created_at: rfc3339(r.created_at),
        updated_at: rfc3339(r.updated_at),
    }
}

/// A portal session limited to some endpoints replays their dead letters only: by a filter
/// naming one of them, or by ids of their deliveries (another's is not found).
async fn within_limit(state: &AppState, auth: &TenantAuth<ReplayScope>, input: &ReplayIn) -> Result<(), ApiError> {
    if !auth.limited() {
        return Ok(());
    }
    if let Some(f) = &input.filter {
        return match f.endpoint.as_deref().map(EndpointId::from_stored) {
            Some(e) if auth.sees(&e) => Ok(()),
            Some(_) => Err(ApiError::not_found("endpoint")),
            None => {
                Err(ApiError::unprocessable("filter.endpoint: this portal session sees only some endpoints: name one"))
            }
        };
    }
    for id in input.ids.iter().flatten() {
        let found = state.store.get_delivery(&auth.tenant, &DeliveryId::from_stored(id.as_str())).await?;
        if !found.is_some_and(|(d, _)| auth.sees(&d.endpoint_id)) {
            return Err(ApiError::not_found("delivery"));
        }
    }
    Ok(())
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/replays", tag = "replays", operation_id = "create_replay",
    params(TenantPath), request_body = ReplayIn,
    responses(
        (status = 202, description = "Started: what a filter selected on endpoints paused or disabled is left out, in `skipped`", body = ReplayOut),
        (status = 404, description = "`filter.endpoint` names no endpoint of the tenant", body = super::doc::ErrorBody),
        (status = 409, description = "`endpoint_not_active`: a delivery named by id is on a paused or disabled endpoint, or everything a filter selected is", body = super::doc::ErrorBody),
    ),
    security(("tenant_token" = ["replay"]), ("admin_token" = [])),
)]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    auth: TenantAuth<ReplayScope>,
    JsonBody(input): JsonBody<ReplayIn>,
) -> Result<(StatusCode, Json<ReplayOut>), ApiError> {
    within_limit(&state, &auth, &input).await?;
    let tenant = auth.tenant;
    let (ids, filter) = selection(&state, &tenant, input.ids, input.filter).await?;
    let (rate_per_sec, batch) = pace(input.rate_per_sec, input.batch)?;
    let (mut selected, blocked) = state.store.dead_selection(&tenant, ids.as_deref(), filter.as_ref()).await?;
    let (filter, left_out) = leave_out(filter, blocked, selected)?;
    selected -= left_out;
    let now = state.clock.now();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_rng(&mut rand::rng());
    let replay = Replay {
        id: new_id("rpl", now, &mut rng),
        tenant,
        state: ReplayState::Running,
        ids,
        filter,
        rate_per_sec,
        batch,
        selected,
        requeued: 0,
        cursor: String::new(),
        next_due_at: now,
        created_at: now,
        updated_at: now,
    };
    crate::store::audit::note_resource(&replay.id);
    state.store.create_replay(&replay).await?;
    state.replayer.launch(replay.id.clone());
    let progress = ReplayProgress { replay, figures: ReplayFigures::default() };
    Ok((StatusCode::ACCEPTED, Json(view(&progress))))
}

/// What a replay selects: 1 to `MAX_IDS` delivery ids, or a filter.
async fn selection(
    state: &AppState,
    tenant: &TenantId,
    ids: Option<Vec<String>>,
    filter: Option<FilterIn>,
) -> Result<(Option<Vec<String>>, Option<DeadLetterFilter>), ApiError> {
    match (ids, filter) {
        (Some(ids), None) if !ids.is_empty() && ids.len() <= MAX_IDS => {
            for id in &ids {
                check_text("ids[]", id, MAX_FILTER_TEXT)?;
            }
            Ok((Some(ids), None))
        }
        (Some(_), None) => Err(ApiError::unprocessable(format!("ids: give 1 to {MAX_IDS} delivery ids"))),
        (None, Some(f)) => Ok((None, Some(dead_letter_filter(state, tenant, f).await?))),
        _ => Err(ApiError::unprocessable("give either ids or filter")),
    }
}

/// The filter checked field by field; the endpoint it names must be `tenant`'s.
async fn dead_letter_filter(state: &AppState, tenant: &TenantId, f: FilterIn) -> Result<DeadLetterFilter, ApiError> {
    for (field, value) in
        [("filter.endpoint", &f.endpoint), ("filter.type", &f.event_type), ("filter.reason", &f.reason)]
    {
        check_text(field, value.as_deref().unwrap_or_default(), MAX_FILTER_TEXT)?;
    }
    if let Some(id) = &f.endpoint {
        let found = state.store.endpoint(&EndpointId::from_stored(id.as_str())).await?;
        if found.is_none_or(|e| e.tenant != *tenant) {
            return Err(ApiError::not_found("endpoint"));
        }
    }
    Ok(DeadLetterFilter {
        endpoint: f.endpoint,
        event_type: f.event_type,
        reason: f.reason,
        since: f.since.map(|s| parse_rfc3339("filter.since", &s)).transpose()?,
        until: f.until.map(|s| parse_rfc3339("filter.until", &s)).transpose()?,
        skipped: Vec::new(),
    })
}

/// The pace asked for: `rate_per_sec` (default 10) and `batch` (default 100).
fn pace(rate_per_sec: Option<f64>, batch: Option<u32>) -> Result<(f64, u32), ApiError> {
    let rate_per_sec = rate_per_sec.unwrap_or(10.0);
    if !(rate_per_sec.is_finite() && rate_per_sec > 0.0 && rate_per_sec <= 10_000.0) {
        return Err(ApiError::unprocessable("rate_per_sec: must be in (0, 10000]"));
    }
    let batch = batch.unwrap_or(100);
    if !(1..=1000).contains(&batch) {
        return Err(ApiError::unprocessable("batch: must be 1 to 1000"));
    }
    Ok((rate_per_sec, batch))
}

/// A replay's selection without the dead letters of endpoints that are not active
/// (`blocked`), which it would not send: a filter leaves them out and says so in its
/// `skipped`; deliveries named by id, or a filter that selected nothing else, are refused.
/// Returns the filter and how many dead letters it left out.
fn leave_out(
    filter: Option<DeadLetterFilter>,
    blocked: Vec<SkippedEndpoint>,
    selected: u64,
) -> Result<(Option<DeadLetterFilter>, u64), ApiError> {
    if blocked.is_empty() {
        return Ok((filter, 0));
    }
    let left_out: u64 = blocked.iter().map(|b| b.dead_letters).sum();
    let list: Vec<String> = blocked
        .iter()
        .map(|b| match &b.reason {
            Some(why) => format!("{} is {} ({why})", b.endpoint, b.state),
            None => format!("{} is {}", b.endpoint, b.state),
        })
        .collect();
    let list = list.join(", ");
    let message = match filter {
        Some(mut f) if left_out < selected => {
            f.skipped = blocked;
            return Ok((Some(f), left_out));
        }
        Some(_) => format!("nothing to replay: every dead letter selected is on an endpoint not active: {list}"),
        None => format!(
            "deliveries named are on endpoints not active: {list}; re-enable them first, \
             or replay by a filter, which leaves them out"
        ),
    };
    Err(ApiError::new(StatusCode::CONFLICT, ErrorCode::EndpointNotActive, message))
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/replays/{id}", tag = "replays", operation_id = "get_replay",
    params(ItemPath),
    responses((status = 200, description = "The replay", body = ReplayOut)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
) -> Result<Json<ReplayOut>, ApiError> {
    let p = state.store.get_replay(&tenant, &id).await?.ok_or_else(|| ApiError::not_found("replay"))?;
    Ok(Json(view(&p)))
}

/// Paging of the replay listing.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReplayQuery {
    /// The `next_after` of the previous page.
    after: Option<String>,
    /// Page size (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// A page of replays, newest first; `next_after` is null on the last page.
#[derive(Serialize, ToSchema)]
pub(crate) struct ReplayPage {
    data: Vec<ReplayOut>,
    next_after: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/replays", tag = "replays", operation_id = "list_replays",
    params(TenantPath, ReplayQuery),
    responses((status = 200, description = "A page of the tenant's replays, newest first", body = ReplayPage)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, reach, .. }: TenantAuth<Read>,
    Query(q): Query<ReplayQuery>,
) -> Result<Json<ReplayPage>, ApiError> {
    let limit = page_limit(q.limit)?;
    let (state, tenant, reach) = (&state, &tenant, &reach);
    let (replays, next_after) = super::reach::narrowed(
        limit,
        q.after,
        |after: Option<String>| async move { Ok(state.store.list_replays(tenant, after.as_deref(), limit).await?) },
        |page: Vec<ReplayProgress>| async move {
            let mut kept = Vec::with_capacity(page.len());
            for p in page {
                if reach.replay(state, &p.replay).await? {
                    kept.push(p);
                }
            }
            Ok(kept)
        },
        |p| p.replay.id.clone(),
    )
    .await?;
    Ok(Json(ReplayPage { data: replays.iter().map(view).collect(), next_after }))
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/replays/{id}/cancel", tag = "replays", operation_id = "cancel_replay",
    params(ItemPath),
    responses((
        status = 200,
        description = "Cancelled: what it had not sent is back among the dead letters, as it was; what it \
            had sent keeps its retries. A replay no longer running is answered as it stands.",
        body = ReplayOut,
    )),
    security(("tenant_token" = ["replay"]), ("admin_token" = [])),
)]
pub(crate) async fn cancel(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<ReplayScope>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
) -> Result<Json<ReplayOut>, ApiError> {
    if state.store.get_replay(&tenant, &id).await?.is_none() {
        return Err(ApiError::not_found("replay"));
    }
    state.replayer.cancel(&tenant, &id, state.clock.now()).await?;
    let p = state.store.get_replay(&tenant, &id).await?.ok_or_else(|| ApiError::not_found("replay"))?;
    Ok(Json(view(&p)))
}
