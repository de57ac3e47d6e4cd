//! Request extractors: who is calling (the admin, or a tenant token with a scope on an
//! existing tenant), JSON bodies, path and query parameters. Each refuses with the one
//! JSON error shape, so handlers start with what they need instead of a preamble.

use std::marker::PhantomData;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::IntoParams;

use super::doc::ErrorCode;
use super::reach::Reach;
use super::{ApiError, AppState, auth};
use crate::json;
use crate::model::{EndpointId, Scope, TRACEPARENT, TRACESTATE, TenantId, TraceContext};

/// A scope a route needs, as a type: `TenantAuth<Manage>`.
pub trait ScopeMarker: Send + Sync + 'static {
    const SCOPE: Scope;
}

macro_rules! scopes {
    ($($(#[$doc:meta])* $name:ident => $scope:expr;)*) => {$(
        $(#[$doc])*
        pub struct $name;
        impl ScopeMarker for $name {
            const SCOPE: Scope = $scope;
        }
    )*};
}

scopes! {
    /// `events:write`: post events.
    EventsWrite => Scope::EventsWrite;
    /// `read`: read anything of the tenant.
    Read => Scope::Read;
    /// `manage`: endpoints, plugins, secrets.
    Manage => Scope::Manage;
    /// `replay`: start and cancel replays.
    Replay => Scope::Replay;
    /// `poll`: read and acknowledge a `poll` endpoint's deliveries.
    Poll => Scope::Poll;
}

/// The `{tenant}` of the path, once the bearer token is known to reach it with scope `S`
/// and the tenant exists. Another tenant's token gets `404`, as if it did not exist.
pub struct TenantAuth<S: ScopeMarker> {
    pub tenant: TenantId,
    /// What of the tenant the caller reaches (a portal session may be limited to some
    /// endpoints): the route's path is already confined to it, listings narrow with it.
    pub reach: Reach,
    _scope: PhantomData<S>,
}

impl<S: ScopeMarker> TenantAuth<S> {
    /// Whether the caller may see endpoint `id` (a portal session may be limited to some).
    pub fn sees(&self, id: &EndpointId) -> bool {
        self.reach.sees(id)
    }

    /// Whether the caller is a portal session limited to some endpoints: what spans the
    /// whole tenant (its series, a replay by any filter) is not for it.
    pub fn limited(&self) -> bool {
        self.reach.limited()
    }
}

impl<S: ScopeMarker> FromRequestParts<Arc<AppState>> for TenantAuth<S> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let params = RawPathParams::from_request_parts(parts, state).await.map_err(path_error)?;
        let param = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string());
        let (tenant, id, name) = (param("tenant").unwrap_or_default(), param("id"), param("name"));
        let route = parts.extensions.get::<axum::extract::MatchedPath>().map(|m| m.as_str()).unwrap_or_default();
        let (id, name, query) = (id.as_deref(), name.as_deref(), parts.uri.query());
        let access = super::reach::RouteAccess { method: &parts.method, route, id, name, query };
        let (tenant, reach) = auth::tenant(state, &parts.headers, &tenant, S::SCOPE, access).await?;
        Ok(TenantAuth { tenant, reach, _scope: PhantomData })
    }
}

/// The caller holds the admin token.
pub struct Admin;

impl FromRequestParts<Arc<AppState>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, ApiError> {
        auth::admin(state, &parts.headers).await.map(|()| Admin)
    }
}

/// The body as bytes, for routes that parse it themselves (events borrow their payload
/// from it; plugins are binary); a body over the limit is a JSON `413` that names it.
pub struct RawBody(pub Bytes);

impl FromRequest<Arc<AppState>> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        Bytes::from_request(req, state).await.map(RawBody).map_err(|e| {
            if let Some(timeout) = super::listen::BodyTimeout::behind(&e) {
                ApiError::body_timeout(timeout)
            } else if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                let limit = super::body_limit(&state.config);
                let message = format!(
                    "body: over the limit of {limit} bytes (16 events of server.max_payload_bytes, at least 1 MiB, plus 64 KiB)"
                );
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge, message)
            } else {
                ApiError::bad_request(format!("body: {}", e.body_text()))
            }
        })
    }
}

/// A JSON object body deserialised into `T`. An empty body reads as `{}` (an action whose
/// fields are all optional, `POST …/pause`), except on a `PATCH`, which is refused: a
/// change that says nothing is a client's mistake (`{}` still changes nothing). Anything
/// but an object (`[]`, a string, …) is refused rather than coerced, and so is a key given twice
/// in one object (at any depth) and a NUL character in any string or key, which not every
/// store can hold. Every refusal starts with the field path (`retry.base: …`), or `body`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let patch = req.method() == axum::http::Method::PATCH;
        let RawBody(body) = RawBody::from_request(req, state).await?;
        let value: Value = match body.is_empty() {
            true if patch => {
                return Err(ApiError::bad_request(
                    "body: required, a JSON object of the fields to change (none: `{}`)",
                ));
            }
            true => Value::Object(Default::default()),
            false => json::parse_strict(&body).map_err(ApiError::bad_request)?,
        };
        if !value.is_object() {
            return Err(ApiError::bad_request(format!("body: expected a JSON object, got {}", json::kind(&value))));
        }
        if let Value::Object(fields) = &value {
            // The audit log names the fields a write sets, never their values.
            crate::store::audit::note_fields(fields.keys());
        }
        if let Some(at) = find_nul(&value, String::new()) {
            return Err(ApiError::unprocessable(format!("{at}: must not contain a NUL character")));
        }
        serde_path_to_error::deserialize(value).map(JsonBody).map_err(|e| {
            let at = e.path().to_string();
            ApiError::bad_request(json::describe(&at, &json::message(e.inner())))
        })
    }
}

/// Where the first NUL character sits in a JSON document (a dotted path), if anywhere.
fn find_nul(value: &Value, at: String) -> Option<String> {
    let here = |at: &str| if at.is_empty() { "body".to_string() } else { at.to_string() };
    match value {
        Value::String(s) if s.contains('\0') => Some(here(&at)),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| find_nul(v, format!("{at}[{i}]"))),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            let path = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
            if k.contains('\0') { Some(here(&at)) } else { find_nul(v, path) }
        }),
        _ => None,
    }
}

/// `{tenant}`: the tenant's id.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TenantPath {
    /// The tenant's id.
    #[allow(dead_code)] // `TenantAuth` reads it; here for the document.
    pub tenant: String,
}

/// `{tenant}` and `{id}`: one object of the tenant.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ItemPath {
    /// The tenant's id.
    #[allow(dead_code)] // `TenantAuth` reads it; here for the document.
    pub tenant: String,
    /// The object's id.
    pub id: String,
}

/// `{tenant}` and `{name}`: one plugin of the tenant.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct PluginPath {
    /// The tenant's id.
    #[allow(dead_code)] // `TenantAuth` reads it; here for the document.
    pub tenant: String,
    /// The plugin's name (its file name without `.wasm`).
    pub name: String,
}

/// The W3C trace context a producer sent (`traceparent`, `tracestate`): the parent of the
/// events a request posts. A malformed or repeated `traceparent` is no context, as W3C
/// asks of a receiver: intake never refuses an event over it. Repeated `tracestate`
/// headers are one list, joined with commas.
pub struct TraceParent(pub Option<TraceContext>);

/// [`TraceParent`] for the document.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // `TraceParent` reads them; here for the document.
pub struct TraceHeaders {
    /// W3C trace context: the events join this trace, and each attempt sends it on with a
    /// span id of its own. A malformed value is ignored (the event is still accepted).
    traceparent: Option<String>,
    /// Vendors' trace state, passed on as received beside a valid `traceparent` (dropped
    /// when over 512 characters).
    tracestate: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for TraceParent {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let mut parents = parts.headers.get_all(TRACEPARENT).iter();
        let (Some(parent), None) = (parents.next(), parents.next()) else { return Ok(TraceParent(None)) };
        let Ok(parent) = parent.to_str() else { return Ok(TraceParent(None)) };
        let states: Vec<&str> = parts.headers.get_all(TRACESTATE).iter().filter_map(|v| v.to_str().ok()).collect();
        let state = (!states.is_empty()).then(|| states.join(","));
        Ok(TraceParent(TraceContext::parse(parent, state.as_deref())))
    }
}

/// Path parameters; a bad one (invalid UTF-8, wrong shape) is a JSON `400 invalid_path`.
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state).await.map(|p| Path(p.0)).map_err(path_error)
    }
}

fn path_error(e: impl ToString) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidPath, e.to_string())
}

/// Query parameters into `T` (which denies unknown fields): a bad value, a repeated key
/// or an unknown parameter is a JSON `400 invalid_query` that starts with the parameter.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let params = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(params)
            .map(Query)
            .map_err(|e| bad_query(json::describe(&e.path().to_string(), &e.inner().to_string())))
    }
}

/// `400 invalid_query`; `message` starts with the parameter.
pub(crate) fn bad_query(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidQuery, message)
}

/// Routes that read query parameters (through [`Query`]); every other route refuses one.
const ROUTES_WITH_QUERY: &[&str] = &[
    "/v1/audit",
    "/v1/overview",
    "/v1/tenants/{tenant}/audit",
    "/v1/tenants/{tenant}/deliveries",
    "/v1/tenants/{tenant}/dead-letters",
    "/v1/tenants/{tenant}/endpoints",
    "/v1/tenants/{tenant}/endpoints/{id}/poll",
    "/v1/tenants/{tenant}/event-types/openapi.json",
    "/v1/tenants/{tenant}/events/{id}/deliveries",
    "/v1/tenants/{tenant}/jwks.json",
    "/v1/tenants/{tenant}/replays",
    "/v1/tenants/{tenant}/series",
];

/// Middleware on every matched route: refuses a NUL (`%00`) anywhere in the path or query,
/// which no store can hold as text, and a query string on an API route that reads none, so
/// a misspelt filter is an error rather than silently ignored.
pub async fn check_uri(matched: axum::extract::MatchedPath, req: Request, next: Next) -> Response {
    use axum::response::IntoResponse;
    let uri = req.uri();
    if uri.path().contains("%00") {
        return path_error("a path segment contains a NUL character").into_response();
    }
    if let Some(q) = uri.query() {
        if q.contains("%00") {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidQuery,
                "a query value contains a NUL character",
            )
            .into_response();
        }
        // Probes and scrapers (`/healthz`, `/metrics`) may add a query; the API may not.
        let api_route = matched.as_str().starts_with("/v1/");
        // Only reads take a query (`POST …/endpoints` shares its path with the listing).
        let reads = req.method() == axum::http::Method::GET && ROUTES_WITH_QUERY.contains(&matched.as_str());
        if !q.is_empty() && api_route && !reads {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidQuery,
                "this route takes no query parameters",
            )
            .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_is_found_with_its_path() {
        assert_eq!(find_nul(&json!({"a": "ok", "b": {"c": ["x", "y\u{0}"]}}), String::new()), Some("b.c[1]".into()));
        assert_eq!(find_nul(&json!({"k\u{0}": 1}), String::new()), Some("body".into()));
        assert_eq!(find_nul(&json!({"a": [1, "two", {"b": null}]}), String::new()), None);
    }
}
