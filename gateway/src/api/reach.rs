//! What of its tenant a caller reaches, enforced in one place. A portal session limited to
//! some endpoints reaches their objects only: their deliveries and dead letters, the events
//! sent to them, the replays of their dead letters, the plugins bound to them alone (or to
//! none). Every tenant route's extractor (`TenantAuth`) calls [`confine`] before the
//! handler runs: the route's entry in [`CONFINED`] says what its path names, and an object
//! out of reach is absent (`404`). A route without an entry is refused to a limited
//! session, so a route added later cannot reach past the limit by being forgotten (and
//! `tests/it/portal_reach.rs` walks every route of `/openapi.json` with such a session).
//! What a route lists, its handler narrows with the [`Reach`] it is handed: the store's
//! delivery filter carries the endpoints ([`Reach::endpoints`]), and [`narrowed`] pages
//! through what else is kept in Rust, with a cursor that is always an item shown.

use std::sync::Arc;

use axum::http::{Method, StatusCode};

use super::doc::ErrorCode;
use super::{ApiError, AppState};
use crate::model::{DeliveryId, Endpoint, EndpointId, PortalSession, Replay, TenantId};
use crate::store::DeliveryFilter;

/// The route a request matched, as `auth` checks a caller against it.
pub struct RouteAccess<'a> {
    pub method: &'a Method,
    /// The matched path (`/v1/tenants/{tenant}/endpoints/{id}`).
    pub route: &'a str,
    /// The path's `{id}`, if it has one.
    pub id: Option<&'a str>,
    /// The path's `{name}`, if it has one.
    pub name: Option<&'a str>,
    /// The query string, if any.
    pub query: Option<&'a str>,
}

/// Endpoints read per page while looking for a plugin's bindings.
const PAGE: u32 = 500;

/// `tenant`'s endpoints whose hooks bind plugin `name`, following it or pinned
/// (`name@n`), in creation order. Read under the tenant's binding lock when it orders a
/// write (`bindings::PluginLocks`).
pub(super) async fn binding(state: &AppState, tenant: &TenantId, name: &str) -> Result<Vec<Endpoint>, ApiError> {
    let mut found = Vec::new();
    let mut after = None;
    loop {
        let page = state.store.endpoint_page(tenant, after.as_ref(), PAGE, Some(name)).await?;
        let full = page.len() as u32 == PAGE;
        after = page.last().map(|e| e.id.clone());
        found.extend(page.into_iter().filter(|e| e.spec.plugins.binds(name)));
        if !full {
            return Ok(found);
        }
    }
}

/// The endpoints a caller reaches: all of its tenant's, or only some.
#[derive(Debug, Clone, Default)]
pub struct Reach {
    only: Option<Arc<[EndpointId]>>,
    /// The caller is a portal session (limited or not).
    portal: bool,
}

impl Reach {
    /// A portal session's reach (everything for any other caller).
    pub(super) fn of(session: Option<&PortalSession>) -> Reach {
        Reach { only: session.and_then(|s| s.endpoints.as_deref()).map(Arc::from), portal: session.is_some() }
    }

    /// Whether the caller is a portal session: the customer, who sees of the tenant's
    /// audit log only its endpoints' entries.
    pub fn portal(&self) -> bool {
        self.portal
    }

    /// Whether the caller reaches endpoint `id`.
    pub fn sees(&self, id: &EndpointId) -> bool {
        self.only.as_ref().is_none_or(|only| only.contains(id))
    }

    /// Whether the caller is limited to some endpoints: what spans the whole tenant is not
    /// for it.
    pub fn limited(&self) -> bool {
        self.only.is_some()
    }

    /// The endpoints a delivery listing is confined to ([`DeliveryFilter::endpoints`]).
    pub fn endpoints(&self) -> Option<Vec<EndpointId>> {
        self.only.as_ref().map(|only| only.to_vec())
    }

    /// Whether the caller reaches replay `r`: one of its endpoints' dead letters by a
    /// filter naming the endpoint, or by ids of their deliveries only. A replay by a
    /// filter over every endpoint spans the tenant.
    pub async fn replay(&self, state: &AppState, r: &Replay) -> Result<bool, ApiError> {
        if !self.limited() {
            return Ok(true);
        }
        Ok(match (&r.filter, &r.ids) {
            (Some(f), _) => f.endpoint.as_deref().is_some_and(|e| self.sees(&EndpointId::from_stored(e))),
            (None, Some(ids)) => state.store.delivery_endpoints(&r.tenant, ids).await?.iter().all(|e| self.sees(e)),
            (None, None) => false,
        })
    }

    /// Whether some delivery of `tenant`'s event `id` goes to an endpoint in reach.
    async fn event(&self, state: &AppState, tenant: &TenantId, id: &str) -> Result<bool, ApiError> {
        let f = DeliveryFilter {
            tenant: Some(tenant.clone()),
            event: Some(crate::model::EventId::from_stored(id)),
            endpoints: self.endpoints(),
            limit: 1,
            ..DeliveryFilter::default()
        };
        Ok(!state.store.list_deliveries(&f).await?.is_empty())
    }

    /// The hooks by which endpoints out of reach bind plugin `name` (none: the caller may
    /// read and change it).
    async fn plugin_bound_outside(&self, state: &AppState, tenant: &TenantId, name: &str) -> Result<String, ApiError> {
        if !self.limited() {
            return Ok(String::new());
        }
        let outside: Vec<_> = binding(state, tenant, name).await?.into_iter().filter(|e| !self.sees(&e.id)).collect();
        let mut hooks: Vec<&str> = outside.iter().flat_map(|e| e.spec.plugins.hooks_binding(name)).collect();
        hooks.sort_unstable();
        hooks.dedup();
        Ok(match outside.len() {
            0 => String::new(),
            1 => format!("its {} binding is on an endpoint the session does not reach", hooks.join(" and ")),
            n => format!("its {} bindings are on {n} endpoints the session does not reach", hooks.join(" and ")),
        })
    }

    /// Whether the caller reaches plugin `name`: every endpoint binding it is within reach.
    pub async fn plugin(&self, state: &AppState, tenant: &TenantId, name: &str) -> Result<bool, ApiError> {
        Ok(self.plugin_bound_outside(state, tenant, name).await?.is_empty())
    }
}

/// What a route's path names, as [`confine`] checks it for a session limited to some
/// endpoints.
#[derive(Debug, Clone, Copy)]
enum Confine {
    /// Nothing of any endpoint: the event catalog, the branding, a filter tried on an event
    /// given in the body.
    Shared,
    /// `{id}` is an endpoint.
    Endpoint,
    /// `{id}` is an event: one with a delivery to an endpoint in reach.
    Event,
    /// `{id}` is a delivery.
    Delivery,
    /// `{id}` is a replay ([`Reach::replay`]).
    Replay,
    /// `{name}` is a plugin ([`Reach::plugin`]); one bound out of reach is refused, saying
    /// which binding.
    Plugin,
    /// The `endpoint` query parameter is required and in reach (the series).
    EndpointQuery,
    /// A listing: its handler narrows it with the caller's [`Reach`].
    Listing,
    /// The body names what the route acts on: its handler checks it against the [`Reach`]
    /// (a replay's filter or ids).
    Body,
    /// Not for a limited session, for this reason.
    Refused(&'static str),
}

/// `herald listen` is a developer's tool of the tenant's, not a customer's.
const LISTEN_REFUSED: &str = "this portal session is limited to some endpoints: it cannot listen";

/// Every tenant route a portal session may use (see `auth::portal_allows`), with what its
/// path names. A limited session is refused any route missing here.
const CONFINED: &[(&str, &str, Confine)] = {
    use Confine::*;
    &[
        ("GET", "/v1/tenants/{tenant}/endpoints", Listing),
        (
            "POST",
            "/v1/tenants/{tenant}/endpoints",
            Refused("this portal session is limited to some endpoints: it cannot add one"),
        ),
        ("GET", "/v1/tenants/{tenant}/endpoints/{id}", Endpoint),
        ("PATCH", "/v1/tenants/{tenant}/endpoints/{id}", Endpoint),
        ("DELETE", "/v1/tenants/{tenant}/endpoints/{id}", Endpoint),
        ("POST", "/v1/tenants/{tenant}/endpoints/{id}/enable", Endpoint),
        ("POST", "/v1/tenants/{tenant}/endpoints/{id}/pause", Endpoint),
        ("POST", "/v1/tenants/{tenant}/endpoints/{id}/rotate-secret", Endpoint),
        ("GET", "/v1/tenants/{tenant}/endpoints/{id}/secret", Endpoint),
        ("POST", "/v1/tenants/{tenant}/endpoints/{id}/test-send", Endpoint),
        ("POST", "/v1/tenants/{tenant}/endpoints/{id}/test-filter", Endpoint),
        ("POST", "/v1/tenants/{tenant}/endpoints/{id}/verify", Endpoint),
        ("GET", "/v1/tenants/{tenant}/endpoints/{id}/listen", Refused(LISTEN_REFUSED)),
        ("POST", "/v1/tenants/{tenant}/endpoints/{id}/listen", Refused(LISTEN_REFUSED)),
        ("POST", "/v1/tenants/{tenant}/test-filter", Shared),
        ("GET", "/v1/tenants/{tenant}/events/{id}", Event),
        ("GET", "/v1/tenants/{tenant}/events/{id}/deliveries", Event),
        ("GET", "/v1/tenants/{tenant}/deliveries", Listing),
        ("GET", "/v1/tenants/{tenant}/deliveries/{id}", Delivery),
        ("GET", "/v1/tenants/{tenant}/dead-letters", Listing),
        ("GET", "/v1/tenants/{tenant}/series", EndpointQuery),
        ("POST", "/v1/tenants/{tenant}/replays", Body),
        ("GET", "/v1/tenants/{tenant}/replays", Listing),
        ("GET", "/v1/tenants/{tenant}/replays/{id}", Replay),
        ("POST", "/v1/tenants/{tenant}/replays/{id}/cancel", Replay),
        ("GET", "/v1/tenants/{tenant}/plugins", Listing),
        ("GET", "/v1/tenants/{tenant}/plugins/{name}", Plugin),
        ("PUT", "/v1/tenants/{tenant}/plugins/{name}", Plugin),
        ("DELETE", "/v1/tenants/{tenant}/plugins/{name}", Plugin),
        ("GET", "/v1/tenants/{tenant}/plugins/{name}/versions", Plugin),
        ("POST", "/v1/tenants/{tenant}/plugins/{name}/rollback", Plugin),
        ("GET", "/v1/tenants/{tenant}/plugins/{name}/config", Plugin),
        ("PUT", "/v1/tenants/{tenant}/plugins/{name}/config", Plugin),
        ("GET", "/v1/tenants/{tenant}/event-types", Shared),
        ("GET", "/v1/tenants/{tenant}/event-types/openapi.json", Shared),
        ("GET", "/v1/tenants/{tenant}/event-types/{name}", Shared),
        ("GET", "/v1/tenants/{tenant}/event-types/{name}/versions", Shared),
        ("GET", "/v1/tenants/{tenant}/branding", Shared),
        ("GET", "/v1/tenants/{tenant}/audit", Listing),
    ]
};

/// Confines a request of a caller with `reach` to `tenant`'s objects in reach: the one
/// check every tenant route goes through (from `auth::tenant`), before its handler.
pub(super) async fn confine(
    state: &AppState,
    tenant: &TenantId,
    reach: &Reach,
    access: &RouteAccess<'_>,
) -> Result<(), ApiError> {
    if !reach.limited() {
        return Ok(());
    }
    let forbidden = |m: String| ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, m);
    let Some(&(_, _, confine)) = CONFINED.iter().find(|(m, r, _)| *m == access.method.as_str() && *r == access.route)
    else {
        return Err(forbidden("this route is not open to a portal session limited to some endpoints".into()));
    };
    let id = access.id.unwrap_or_default();
    match confine {
        Confine::Shared | Confine::Listing | Confine::Body => Ok(()),
        Confine::Refused(why) => Err(forbidden(why.into())),
        Confine::Endpoint => match reach.sees(&EndpointId::from_stored(id)) {
            true => Ok(()),
            false => Err(ApiError::not_found("endpoint")),
        },
        Confine::Event => match reach.event(state, tenant, id).await? {
            true => Ok(()),
            false => Err(ApiError::not_found("event")),
        },
        Confine::Delivery => match state.store.get_delivery(tenant, &DeliveryId::from_stored(id)).await? {
            Some((d, _)) if reach.sees(&d.endpoint_id) => Ok(()),
            _ => Err(ApiError::not_found("delivery")),
        },
        Confine::Replay => match state.store.get_replay(tenant, id).await? {
            Some(p) if reach.replay(state, &p.replay).await? => Ok(()),
            _ => Err(ApiError::not_found("replay")),
        },
        Confine::Plugin => {
            let name = access.name.unwrap_or_default();
            let outside = reach.plugin_bound_outside(state, tenant, name).await?;
            match outside.is_empty() {
                true => Ok(()),
                false => Err(forbidden(format!(
                    "plugin {name:?} is out of this portal session's reach: {outside}; a session limited to \
                     some endpoints uses only plugins bound to its endpoints alone, or to none"
                ))),
            }
        }
        Confine::EndpointQuery => {
            let named = form_urlencoded::parse(access.query.unwrap_or_default().as_bytes())
                .find_map(|(k, v)| (k == "endpoint").then(|| EndpointId::from_stored(v.into_owned())));
            match named {
                Some(e) if reach.sees(&e) => Ok(()),
                Some(_) => Err(ApiError::not_found("endpoint")),
                None => {
                    Err(ApiError::unprocessable("endpoint: this portal session sees only some endpoints: name one"))
                }
            }
        }
    }
}

/// Up to `limit` items that the caller reaches, read page by page from `fetch` (given the
/// cursor: the key of the last item read) and narrowed by `keep` (which returns a page's
/// items in reach, in order), and the cursor to the next page: the key of the last item
/// kept, never one out of reach. For a caller that reaches everything this is one `fetch`.
pub(super) async fn narrowed<T, K, Page, Kept>(
    limit: u32,
    mut after: Option<K>,
    mut fetch: impl FnMut(Option<K>) -> Page,
    mut keep: impl FnMut(Vec<T>) -> Kept,
    key: impl Fn(&T) -> K,
) -> Result<(Vec<T>, Option<K>), ApiError>
where
    Page: Future<Output = Result<Vec<T>, ApiError>>,
    Kept: Future<Output = Result<Vec<T>, ApiError>>,
{
    let mut out = Vec::new();
    loop {
        let page = fetch(after.take()).await?;
        let full = page.len() as u32 >= limit;
        after = page.last().map(&key);
        for item in keep(page).await? {
            out.push(item);
            if out.len() as u32 >= limit {
                let next = out.last().map(&key);
                return Ok((out, next));
            }
        }
        if !full || after.is_none() {
            return Ok((out, None));
        }
    }
}

#[cfg(test)]
mod tests {
    /// The table names routes that exist: a route renamed leaves no stale entry behind
    /// (which would refuse the renamed route to a limited session without a word why).
    #[test]
    fn every_confined_route_is_routed() {
        let doc = super::super::document();
        for (method, route, _) in super::CONFINED {
            let item = doc.paths.paths.get(*route).unwrap_or_else(|| panic!("{route} is not a route"));
            let operation = match *method {
                "GET" => &item.get,
                "POST" => &item.post,
                "PUT" => &item.put,
                "PATCH" => &item.patch,
                "DELETE" => &item.delete,
                other => panic!("{other}: not a method of the API"),
            };
            assert!(operation.is_some(), "{method} {route} is not a route");
        }
    }
}
