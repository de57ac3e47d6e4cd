//! The admin and intake HTTP API (axum). Architecture invariant: this is the only module
//! that knows HTTP status codes of the API; every error becomes `{"error": {code, message}}`
//! here and nowhere else.
//!
//! Extractors (`TenantAuth<Scope>`, `Admin`, `JsonBody`, `Path`, `Query`) refuse with that
//! shape. `routes` is the one route list: each route is registered with its handler's
//! `#[utoipa::path]` (utoipa-axum), so the router and the OpenAPI document
//! (`GET /openapi.json`; `doc` adds the security schemes and the error responses every route
//! of a kind can give) cannot differ; responses are typed structs, so the document's schemas
//! are the types the handlers serialise. The admin token is compared by digest in constant
//! time; the token cache is local on a SQLite node and bypassed on Postgres, so a revocation
//! holds at once. Portal sessions (`portal`) are never cached on any backend: each request
//! reads its row, so a revocation or an expiry holds at once on every node; `auth` confines
//! a session to the customer's routes and, when read-only, to `GET`. A session limited to
//! some endpoints is confined in one place, `reach`, which every tenant route's extractor
//! (`TenantAuth`) goes through before its handler: its table says what each route's path
//! names (an endpoint, an event, a delivery, a replay, a plugin: one out of reach is absent,
//! a plugin bound out of reach is refused naming the binding), a route missing from it is
//! refused to such a session, and listings narrow with the `Reach` the extractor hands over
//! (the store's delivery filter takes the endpoints; cursors are always an item shown).
//! `tests/it/portal_reach.rs` walks every route of `/openapi.json` with such a session.
//!
//! This file is only the top: the modules, what they export, the route list and the
//! routers built from it. What every handler shares is `state` (`AppState`), `error`
//! (`ApiError`, the one error shape) and `params` (page limits, RFC 3339 times).

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

mod audit;
mod auth;
mod bindings;
mod console;
mod doc;
mod endpoints;
mod error;
mod event_types;
mod events;
mod extract;
mod insight;
pub(crate) mod listen;
mod params;
mod plugin_config;
mod plugin_stats;
mod plugin_versions;
mod plugins;
mod portal;
mod reach;
mod replays;
mod state;
mod tenants;
mod test_send;
mod whoami;

pub(crate) use crate::clock::rfc3339;
pub use auth::hash_token;
pub use console::{CONTENT_SECURITY_POLICY, asset_names as console_assets};
pub use doc::ErrorCode;
pub use error::ApiError;
pub(crate) use params::{page_limit, parse_rfc3339, query_rfc3339};
pub use state::AppState;

/// Every route of the API, each registered together with its OpenAPI operation (the
/// handler's `#[utoipa::path]`): the router and the document come from this one list, so
/// neither can have a route the other lacks (`tests/it/contract.rs` checks it on the wire,
/// `tests/it/tidy.rs` that no route bypasses it).
fn routes() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::with_openapi(doc::base())
        .routes(routes!(tenants::healthz))
        .routes(routes!(tenants::ready))
        .routes(routes!(tenants::metrics))
        .routes(routes!(doc::openapi_json))
        .routes(routes!(tenants::create, tenants::list_tenants))
        .routes(routes!(insight::overview))
        .routes(routes!(tenants::create_token, tenants::list_tokens))
        .routes(routes!(tenants::revoke_token))
        .routes(routes!(whoami::whoami))
        .routes(routes!(endpoints::create, endpoints::list_endpoints))
        .routes(routes!(endpoints::get_one, endpoints::patch, endpoints::delete))
        .routes(routes!(endpoints::enable))
        .routes(routes!(endpoints::pause))
        .routes(routes!(endpoints::rotate_secret))
        .routes(routes!(endpoints::secret))
        .routes(routes!(endpoints::keys::jwks))
        .routes(routes!(test_send::test_send))
        .routes(routes!(endpoints::test_filter::test_endpoint_filter))
        .routes(routes!(endpoints::test_filter::test_filter))
        .routes(routes!(endpoints::verify::verify_now))
        .routes(routes!(endpoints::poll::poll))
        .routes(routes!(endpoints::poll::ack))
        .routes(routes!(endpoints::listener::listen, endpoints::listener::answer))
        .routes(routes!(portal::create, portal::list))
        .routes(routes!(portal::revoke))
        .routes(routes!(portal::exchange))
        .routes(routes!(portal::get_branding, portal::put_branding))
        .routes(routes!(events::create))
        .routes(routes!(events::create_batch))
        .routes(routes!(events::get_one))
        .routes(routes!(events::event_deliveries))
        .routes(routes!(events::list_deliveries))
        .routes(routes!(events::get_delivery))
        .routes(routes!(events::dead_letters))
        .routes(routes!(insight::tenant_series))
        .routes(routes!(replays::create, replays::list))
        .routes(routes!(replays::get_one))
        .routes(routes!(replays::cancel))
        .routes(routes!(plugins::list))
        .routes(routes!(plugins::upload, plugins::get_one, plugin_versions::delete))
        .routes(routes!(plugin_versions::versions))
        .routes(routes!(plugin_versions::rollback))
        .routes(routes!(plugin_config::put, plugin_config::get))
        .routes(routes!(event_types::create, event_types::list))
        .routes(routes!(event_types::export))
        .routes(routes!(event_types::get_one, event_types::patch, event_types::delete))
        .routes(routes!(event_types::versions))
        .routes(routes!(event_types::get_settings, event_types::put_settings))
        .routes(routes!(event_types::create_operator, event_types::list_operator))
        .routes(routes!(event_types::get_operator, event_types::patch_operator, event_types::delete_operator))
        .routes(routes!(event_types::versions_operator))
        .routes(routes!(audit::list_all))
        .routes(routes!(audit::list_tenant))
}

/// The OpenAPI 3.1 document of [`router`]'s routes.
pub fn document() -> utoipa::openapi::OpenApi {
    doc::finish(routes().split_for_parts().1)
}

/// The document as `GET /openapi.json` serves it (and `herald openapi` prints it).
pub fn openapi_json() -> &'static str {
    doc::DOCUMENT.as_str()
}

/// The largest request body the API reads (a plugin upload has its own limit): room for
/// a batch of 16 of the largest events, at least 1 MiB, plus 64 KiB of envelope.
pub(crate) fn body_limit(config: &crate::config::Config) -> usize {
    config.max_payload_bytes.saturating_mul(16).max(1 << 20) + (64 << 10)
}

/// Builds the router; tests may call it without a socket.
pub fn router(state: Arc<AppState>) -> Router {
    let body_limit = body_limit(&state.config);
    let (router, _) = routes().split_for_parts();
    console::mount(router)
        // Runs on matched routes only, before their extractors (the audit entry's inside).
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), audit::track))
        .route_layer(axum::middleware::from_fn(extract::check_uri))
        // Axum adds the `Allow` header to this body.
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                ErrorCode::MethodNotAllowed,
                "this route does not take that method",
            )
        })
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such route") })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// The router of `server.admin_listen`: `/healthz`, `/readyz` and `/metrics` only (the
/// same handlers as the API's), so probes and scrapers have a listener of their own.
pub fn admin_router(state: Arc<AppState>) -> Router {
    let (router, _) = OpenApiRouter::new()
        .routes(routes!(tenants::healthz))
        .routes(routes!(tenants::ready))
        .routes(routes!(tenants::metrics))
        .split_for_parts();
    router
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such route") })
        .with_state(state)
}
