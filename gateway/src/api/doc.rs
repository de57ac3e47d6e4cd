//! The OpenAPI 3.1 document. Operations come from the handlers' `#[utoipa::path]` and their
//! request and response types (see `api::routes`); this module adds what is common to every
//! operation: the document's head, the two bearer schemes, and the error responses that the
//! extractors and `ApiError` give every route of a kind, so no handler repeats them.

use std::sync::LazyLock;

use axum::http::header::CONTENT_TYPE;
use serde::Serialize;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, OpenApi, OpenApiBuilder, Ref, RefOr, Required, ResponseBuilder,
};
use utoipa::{PartialSchema, ToSchema};

/// The body of every error: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    /// What went wrong, for a human; it starts with the field at fault.
    pub message: String,
}

/// Every error's stable machine code: the one list, so the document names them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: a malformed or non-object JSON body, an unknown field; 422: a field's value.
    InvalidRequest,
    /// 400: a path parameter that cannot be read (invalid UTF-8, NUL).
    InvalidPath,
    /// 400: a bad, repeated or unknown query parameter, or a query where none is taken.
    InvalidQuery,
    /// 401: no bearer token, or an unknown one.
    Unauthorized,
    /// 403: the token lacks the scope, or the route needs the admin token.
    Forbidden,
    /// 404: no such route, tenant (or another tenant's) or object.
    NotFound,
    /// 405: the route does not take that method (see `Allow`).
    MethodNotAllowed,
    /// 409: the object exists, or an event id was reused with another type or payload.
    Conflict,
    /// 408: the request's body paused longer than `server.body_read_timeout`.
    RequestTimeout,
    /// 413: the body is over the limit.
    PayloadTooLarge,
    /// 409: a replay selects dead letters of a paused or disabled endpoint.
    EndpointNotActive,
    /// 410: a `poll` cursor points at deliveries retention purged; read without a cursor.
    CursorExpired,
    /// 422: a plugin upload that is not a valid component (one over the size limit is
    /// `payload_too_large`).
    InvalidPlugin,
    /// 422: the tenant holds as many plugins as it may.
    PluginLimit,
    /// 503: a bound plugin is still loading; try again shortly.
    PluginLoading,
    /// 503: the plugin could not be installed (storage or compiler failure).
    PluginUnavailable,
    /// 503: the store failed; nothing was written.
    StorageUnavailable,
    /// 500: stored data Herald cannot read back.
    InternalError,
}

const ADMIN: &str = "admin_token";
const TENANT: &str = "tenant_token";

/// The document's head, security schemes and shared schemas, before any route is added.
pub(super) fn base() -> OpenApi {
    let bearer = |what: &str| {
        SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).description(Some(what)).build())
    };
    let components = ComponentsBuilder::new()
        .schema("ErrorBody", ErrorBody::schema())
        .schema("ErrorDetail", ErrorDetail::schema())
        .schema("ErrorCode", ErrorCode::schema())
        .security_scheme(
            ADMIN,
            bearer("The admin token (`server.admin_token`): every route, every tenant, every scope."),
        )
        .security_scheme(
            TENANT,
            bearer(
                "A tenant token (`POST /v1/tenants/{tenant}/tokens`): its own tenant only (another \
                 tenant's objects answer 404), and only the scopes it was given. Each operation \
                 names the one it needs: `events:write`, `read`, `manage`, `replay` or `poll` (a \
                 `poll` endpoint's consumer: its pages and acknowledgements, nothing else). A portal \
                 session's token (`POST /v1/portal-sessions/exchange`) is one too, confined to \
                 the customer's routes, its endpoints and, when read-only, to reads.",
            ),
        )
        .build();
    let info = utoipa::openapi::InfoBuilder::new()
        .title("Herald")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(
            "Herald's HTTP API: tenants and their tokens, endpoints, events (202 once durable), \
             deliveries with their attempts, dead letters, replays and plugins. Errors are \
             always `{\"error\": {\"code\", \"message\"}}`.",
        ))
        .build();
    OpenApiBuilder::new().info(info).components(Some(components)).build()
}

/// Adds to every operation the error responses its kind of route can give.
pub(super) fn finish(mut doc: OpenApi) -> OpenApi {
    for (path, item) in doc.paths.paths.iter_mut() {
        let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
        for op in ops.into_iter().flatten() {
            for (status, why) in common_errors(path, op) {
                add_error(op, status, why);
            }
            empty_body_is_an_object(op);
        }
    }
    doc
}

/// The errors that come from the extractors, the URI check and the store, by route kind.
fn common_errors(path: &str, op: &Operation) -> Vec<(u16, &'static str)> {
    let mut out = Vec::new();
    if path == "/readyz" {
        out.push((503, "`storage_unavailable`: the store cannot be reached"));
    }
    if !path.starts_with("/v1/") {
        return out;
    }
    out.push((400, "`invalid_path`, `invalid_query` or `invalid_request`: the request is malformed"));
    out.push((401, "`unauthorized`: no bearer token, or an unknown one"));
    if op.security.is_some() {
        out.push((403, "`forbidden`: the token lacks the scope this operation needs, or is not the admin's"));
    }
    if path.starts_with("/v1/tenants/{tenant}") {
        out.push((404, "`not_found`: no such tenant (or it is another tenant's), or no such object in it"));
    }
    if op.request_body.is_some() {
        out.push((408, "`request_timeout`: the body paused longer than `server.body_read_timeout`"));
        out.push((413, "`payload_too_large`: the body is over the limit"));
        out.push((422, "`invalid_request`: the body is well-formed but a field is invalid"));
    }
    out.push((503, "`storage_unavailable`: the store failed; nothing was written"));
    out
}

/// Operations that read their body themselves (`RawBody`), where an empty body is refused.
const RAW_BODIES: &[&str] = &["create_event", "create_events", "upload_plugin"];

/// `JsonBody` reads an empty body as `{}`, so the body of a JSON route is optional (an
/// empty `PATCH` changes nothing; an empty `rotate-secret` generates the secret).
fn empty_body_is_an_object(op: &mut Operation) {
    if op.operation_id.as_deref().is_some_and(|id| RAW_BODIES.contains(&id)) {
        return;
    }
    if let Some(RefOr::T(body)) = &mut op.request_body {
        body.required = Some(Required::False);
        body.description = Some("An empty body reads as `{}`.".into());
    }
}

fn add_error(op: &mut Operation, status: u16, why: &str) {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
    op.responses
        .responses
        .entry(status.to_string())
        .or_insert_with(|| ResponseBuilder::new().description(why).content("application/json", content).build().into());
}

pub(super) static DOCUMENT: LazyLock<String> =
    LazyLock::new(|| super::document().to_pretty_json().expect("the OpenAPI document serialises"));

/// `GET /openapi.json`.
#[utoipa::path(
    get, path = "/openapi.json", tag = "meta", operation_id = "openapi",
    responses((status = 200, description = "This document (OpenAPI 3.1)", content_type = "application/json", body = Object)),
)]
pub(super) async fn openapi_json() -> ([(axum::http::HeaderName, &'static str); 1], &'static str) {
    ([(CONTENT_TYPE, "application/json")], super::openapi_json())
}
