//! The audit log's API side: the middleware that opens each write request's entry (see
//! `store::audit` for how it reaches the change's own transaction), and the two listings,
//! `GET /v1/audit` (admin) and `GET /v1/tenants/{tenant}/audit` (`read`).
//!
//! The middleware runs on matched routes before their extractors. A write (any method but
//! `GET`, `HEAD`, `OPTIONS`) gets an entry: the route's method and path template, the
//! resource its path names (the first segment after `/v1` or the tenant, singular, and the
//! parameter after it; a create's new id is named by its handler,
//! `store::audit::note_resource`), the client's address, the actor, which authentication
//! names (`auth::caller`), and the top-level keys of its JSON body, which `JsonBody` names
//! as it parses it (never their values: secrets are values). Not audited ([`NOT_AUDITED`]):
//! the filter trials, which write nothing, and event intake, `poll` acknowledgements and a listener's answers,
//! which are data, not configuration. Plugin uploads, rollbacks and deletions write files, not rows: their
//! entries are stored after they succeed.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{Admin, Query, Read, TenantAuth, TenantPath, bad_query};
use super::{ApiError, AppState, page_limit, query_rfc3339, rfc3339};
use crate::model::{AuditEntry, AuditFilter, TenantId, new_id};
use crate::store::audit;

/// Write routes that leave no entry: the filter trials, which are posted but write
/// nothing, and event intake, a `poll` consumer's acknowledgements and a listener's
/// answers, which are data rather than configuration (intake is the hot path: it gets no entry to carry, so its
/// commits hold no audit row; an acknowledgement settles deliveries, as a push's 2xx does,
/// and a listener's answer is a delivery's result).
const NOT_AUDITED: [&str; 6] = [
    "/v1/tenants/{tenant}/endpoints/{id}/test-filter",
    "/v1/tenants/{tenant}/endpoints/{id}/listen",
    "/v1/tenants/{tenant}/test-filter",
    "/v1/tenants/{tenant}/events",
    "/v1/tenants/{tenant}/events/batch",
    "/v1/tenants/{tenant}/endpoints/{id}/poll/ack",
];

/// Opens the audit entry of a write request around the rest of its handling. The body
/// is not read here: `extract::JsonBody` names its fields as it parses it.
pub(crate) async fn track(
    State(state): State<Arc<AppState>>,
    matched: MatchedPath,
    req: Request,
    next: Next,
) -> Response {
    let read = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if read || NOT_AUDITED.contains(&matched.as_str()) {
        return next.run(req).await;
    }
    let (mut parts, body) = req.into_parts();
    let params = RawPathParams::from_request_parts(&mut parts, &state).await;
    let req = Request::from_parts(parts, body);
    // A path the handler's own extractor refuses (it writes nothing) is not audited.
    let Ok(params) = params else { return next.run(req).await };
    let client = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip().to_string());
    let param = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string());
    let (kind, resource) = resource_of(matched.as_str(), &param);
    let now = state.clock.now();
    let entry = AuditEntry {
        id: new_id("au", now, &mut rand::rng()),
        at: now,
        actor: "anonymous".into(),
        tenant: param("tenant").map(TenantId::from_stored),
        route: format!("{} {}", req.method(), matched.as_str()),
        kind,
        resource,
        fields: Vec::new(),
        client,
    };
    let (response, unwritten) = audit::scope(entry, next.run(req)).await;
    if let Some(entry) = unwritten.filter(|e| e.kind == "plugin" && response.status().is_success())
        && let Err(e) = state.store.record_audit(&entry).await
    {
        tracing::error!(error = %e, route = %entry.route, "cannot store a plugin change's audit entry");
    }
    response
}

/// What a route's path names: the kind (the first segment after `/v1`, or after the
/// tenant, made singular) and the id (the parameter just after it).
fn resource_of(template: &str, param: &dyn Fn(&str) -> Option<String>) -> (String, Option<String>) {
    let segments: Vec<&str> = template.trim_start_matches("/v1/").split('/').collect();
    let rest = match segments.as_slice() {
        ["tenants", "{tenant}", rest @ ..] if !rest.is_empty() => rest,
        all => all,
    };
    let kind = rest.first().map(|s| s.strip_suffix('s').unwrap_or(*s)).unwrap_or("api").to_string();
    let id = rest.get(1).and_then(|s| s.strip_prefix('{')?.strip_suffix('}')).and_then(param);
    (kind, id)
}

/// One audit log entry.
#[derive(Serialize, ToSchema)]
pub(crate) struct AuditOut {
    id: String,
    /// When (RFC 3339).
    at: String,
    /// `admin`, `token:<token id>`, `portal:<session id>`, or `anonymous`.
    actor: String,
    tenant: Option<String>,
    /// Method and path template.
    route: String,
    /// The kind of resource: `endpoint`, `token`, `event-type`, `plugin`, `replay`…
    kind: String,
    /// The resource's id, when it has one.
    resource: Option<String>,
    /// The names of the fields the request set; never their values.
    fields: Vec<String>,
    /// The client's address.
    client: Option<String>,
}

impl From<AuditEntry> for AuditOut {
    fn from(e: AuditEntry) -> Self {
        AuditOut {
            at: rfc3339(e.at),
            id: e.id,
            actor: e.actor,
            tenant: e.tenant.map(|t| t.to_string()),
            route: e.route,
            kind: e.kind,
            resource: e.resource,
            fields: e.fields,
            client: e.client,
        }
    }
}

/// Filters and paging of an audit listing.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only this tenant's entries (the admin listing only).
    tenant: Option<String>,
    /// Only this actor's: `admin`, `token:<id>`, `portal:<session id>`.
    actor: Option<String>,
    /// Only this kind of resource.
    kind: Option<String>,
    /// Only this resource (its id).
    resource: Option<String>,
    /// Only this route: method and path template (`DELETE /v1/tenants/{tenant}/endpoints/{id}`).
    route: Option<String>,
    /// Only entries at or after this time (RFC 3339).
    since: Option<String>,
    /// Only entries before this time (RFC 3339).
    until: Option<String>,
    /// The `next_after` of the previous page.
    after: Option<String>,
    /// Page size (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// A page of audit entries, newest first; `next_after` is null on the last page.
#[derive(Serialize, ToSchema)]
pub(crate) struct AuditPage {
    data: Vec<AuditOut>,
    next_after: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/audit", tag = "audit", operation_id = "list_audit",
    params(AuditQuery),
    responses((status = 200, description = "A page of the audit log, newest first", body = AuditPage)),
    security(("admin_token" = [])),
)]
pub(crate) async fn list_all(
    State(state): State<Arc<AppState>>,
    _: Admin,
    Query(mut q): Query<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    let tenant = q.tenant.take().as_deref().map(TenantId::parse).transpose();
    let tenant = tenant.map_err(|e| bad_query(format!("tenant: {}", e.0)))?;
    let (filter, limit) = filter(q, tenant)?;
    page(&state, &filter, limit).await.map(Json)
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/audit", tag = "audit", operation_id = "list_tenant_audit",
    params(TenantPath, AuditQuery),
    responses((
        status = 200,
        description = "A page of the tenant's audit log, newest first; a portal session sees only its endpoints' \
            entries",
        body = AuditPage,
    )),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn list_tenant(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, reach, .. }: TenantAuth<Read>,
    Query(q): Query<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    if q.tenant.is_some() {
        return Err(bad_query("tenant: not a filter of this listing: the tenant is the path's"));
    }
    let (mut filter, limit) = filter(q, Some(tenant))?;
    if reach.portal() {
        // The customer sees what was done to its endpoints, nothing else of the tenant's.
        if filter.kind.as_deref().is_some_and(|k| k != ENDPOINT) {
            return Err(bad_query("kind: a portal session sees its endpoints' entries only (kind=endpoint)"));
        }
        filter.kind = Some(ENDPOINT.into());
        filter.resources = reach.endpoints().map(|only| only.iter().map(|e| e.as_str().to_string()).collect());
    }
    page(&state, &filter, limit).await.map(Json)
}

/// The kind of an endpoint's entries.
const ENDPOINT: &str = "endpoint";

/// The store's filter and the page size of a listing's query; a bad parameter is refused,
/// named.
fn filter(q: AuditQuery, tenant: Option<TenantId>) -> Result<(AuditFilter, u32), ApiError> {
    let limit = page_limit(q.limit)?;
    let since = q.since.as_deref().map(|s| query_rfc3339("since", s)).transpose()?;
    let until = q.until.as_deref().map(|s| query_rfc3339("until", s)).transpose()?;
    if let (Some(since), Some(until)) = (since, until)
        && until <= since
    {
        return Err(bad_query("until: must be later than since"));
    }
    if let Some(after) = q.after.as_deref().filter(|a| !a.starts_with("au_")) {
        return Err(bad_query(format!("after: {after:?} is not an entry's id (au_…, a page's next_after)")));
    }
    let filter = AuditFilter {
        tenant,
        actor: q.actor,
        kind: q.kind,
        resource: q.resource,
        resources: None,
        route: q.route,
        since,
        until,
        before: q.after,
    };
    Ok((filter, limit))
}

async fn page(state: &AppState, filter: &AuditFilter, limit: u32) -> Result<AuditPage, ApiError> {
    let found = state.store.audit_page(filter, limit).await?;
    let next_after = (found.len() == limit as usize).then(|| found.last().map(|e| e.id.clone())).flatten();
    Ok(AuditPage { data: found.into_iter().map(AuditOut::from).collect(), next_after })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_names_its_resource() {
        let param = |name: &str| Some(format!("<{name}>"));
        let cases = [
            ("/v1/tenants", ("tenant", None)),
            ("/v1/tenants/{tenant}/tokens/{id}", ("token", Some("<id>"))),
            ("/v1/tenants/{tenant}/endpoints", ("endpoint", None)),
            ("/v1/tenants/{tenant}/endpoints/{id}/rotate-secret", ("endpoint", Some("<id>"))),
            ("/v1/tenants/{tenant}/events/batch", ("event", None)),
            ("/v1/tenants/{tenant}/plugins/{name}/config", ("plugin", Some("<name>"))),
            ("/v1/tenants/{tenant}/branding", ("branding", None)),
            ("/v1/event-types/{name}", ("event-type", Some("<name>"))),
            ("/v1/portal-sessions/exchange", ("portal-session", None)),
        ];
        for (route, (kind, id)) in cases {
            let got = resource_of(route, &param);
            assert_eq!((got.0.as_str(), got.1.as_deref()), (kind, id), "{route}");
        }
    }
}
