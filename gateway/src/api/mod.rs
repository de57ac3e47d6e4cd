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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::config::Config;
use crate::intake::IntakeError;
use crate::metrics::Metrics;
use crate::model::{TenantId, TokenRecord};
use crate::store::{Committer, DynStore, StoreError};

mod auth;
mod bindings;
mod console;
mod doc;
mod endpoints;
mod event_types;
mod events;
mod extract;
mod insight;
pub(crate) mod listen;
mod plugin_config;
mod plugin_stats;
mod plugin_versions;
mod plugins;
mod portal;
mod reach;
mod replays;
mod tenants;
mod test_send;
mod whoami;

pub use auth::hash_token;
pub use console::{CONTENT_SECURITY_POLICY, asset_names as console_assets};
pub use doc::ErrorCode;

/// Shared state of every request handler.
pub struct AppState {
    pub config: Arc<Config>,
    /// The engine's clock: stored times the API writes are on the engine's time.
    pub clock: crate::clock::Clock,
    pub store: DynStore,
    pub committer: Committer,
    pub metrics: Arc<Metrics>,
    /// The delivery engine, told of committed new work (`poke`) and of committed endpoint
    /// changes (`changed`: this node's partitions and, through the store, the others').
    pub engine: crate::intake::Waker,
    pub replayer: crate::replay::Replayer,
    pub plugins: crate::plugin::PluginHost,
    /// The event catalog intake checks events against (refreshed after every write of it).
    pub catalog: Arc<crate::catalog::Catalog>,
    /// The outbox relays' status (for `/readyz`); empty without `[[outbox]]` sources.
    pub outbox: crate::outbox::Relays,
    /// The engine's client, for what this node knows of endpoints' OAuth2 tokens.
    pub deliverer: Option<crate::deliver::Deliverer>,
    /// Tenant tokens by hash, and when each one's last use was written. `None` on a shared
    /// store: see `auth::caller`.
    pub(crate) tokens: Option<RwLock<HashMap<String, TokenRecord>>>,
    pub(crate) token_use: std::sync::Mutex<HashMap<String, crate::model::Millis>>,
    pub(crate) tenants: RwLock<HashSet<TenantId>>,
    /// Orders plugin deletes and uploads with endpoint writes that bind plugins.
    pub(crate) plugin_locks: bindings::PluginLocks,
    /// Intake spans, when exported.
    pub telemetry: crate::telemetry::Telemetry,
}

impl AppState {
    pub fn new(
        config: Arc<Config>,
        store: DynStore,
        committer: Committer,
        metrics: Arc<Metrics>,
        engine: crate::intake::Waker,
        replayer: crate::replay::Replayer,
        plugins: crate::plugin::PluginHost,
    ) -> Arc<AppState> {
        let tokens = (!config.store_kind.is_shared()).then(RwLock::default);
        Arc::new(AppState {
            config,
            clock: engine.clock(),
            catalog: Arc::new(crate::catalog::Catalog::new(metrics.clone())),
            store,
            committer,
            metrics,
            engine,
            replayer,
            plugins,
            outbox: Default::default(),
            deliverer: None,
            tokens,
            token_use: Default::default(),
            tenants: RwLock::default(),
            plugin_locks: Default::default(),
            telemetry: Default::default(),
        })
    }

    /// The state with the engine's client (before it is shared).
    pub fn with_deliverer(mut self: Arc<Self>, deliverer: crate::deliver::Deliverer) -> Arc<Self> {
        if let Some(state) = Arc::get_mut(&mut self) {
            state.deliverer = Some(deliverer);
        }
        self
    }

    /// The state with the node's span export (before it is shared).
    pub fn with_telemetry(mut self: Arc<Self>, telemetry: crate::telemetry::Telemetry) -> Arc<Self> {
        if let Some(state) = Arc::get_mut(&mut self) {
            state.telemetry = telemetry;
        }
        self
    }

    /// The state with the node's event catalog (before it is shared).
    pub fn with_catalog(mut self: Arc<Self>, catalog: Arc<crate::catalog::Catalog>) -> Arc<Self> {
        if let Some(state) = Arc::get_mut(&mut self) {
            state.catalog = catalog;
        }
        self
    }

    /// The state with the outbox relays' status (before it is shared).
    pub fn with_outbox(mut self: Arc<Self>, relays: crate::outbox::Relays) -> Arc<Self> {
        if let Some(state) = Arc::get_mut(&mut self) {
            state.outbox = relays;
        }
        self
    }
}

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
        // Runs on matched routes only, before their extractors.
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

/// An API error: a status, a stable machine code and a human message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: ErrorCode,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }
    /// `408`: the body paused longer than `server.body_read_timeout`.
    pub fn body_timeout(timeout: &listen::BodyTimeout) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, ErrorCode::RequestTimeout, timeout.to_string())
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest, message)
    }
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::InvalidRequest, message)
    }
    pub fn not_found(what: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, format!("{what} not found"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = doc::ErrorBody { error: doc::ErrorDetail { code: self.code, message: self.message } };
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, m),
            StoreError::NotFound(m) => ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, m),
            StoreError::Backend(m) => {
                tracing::error!(error = %m, "storage error");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::StorageUnavailable,
                    "storage is unavailable; nothing was accepted",
                )
            }
            // Logged once by the committer when the store became unreachable, not per request.
            StoreError::Unreachable => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::StorageUnavailable,
                "storage is unreachable; nothing was accepted",
            ),
        }
    }
}

impl From<IntakeError> for ApiError {
    fn from(e: IntakeError) -> Self {
        match e {
            IntakeError::Invalid(m) => ApiError::bad_request(m),
            IntakeError::Schema(m) => ApiError::unprocessable(m),
            e @ IntakeError::TooDeep { .. } => ApiError::unprocessable(e.to_string()),
            e @ IntakeError::Conflict { .. } => ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, e.to_string()),
            e @ IntakeError::TooLarge { .. } => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge, e.to_string())
            }
            IntakeError::Store(s) => s.into(),
        }
    }
}

impl From<crate::spec::SpecError> for ApiError {
    fn from(e: crate::spec::SpecError) -> Self {
        ApiError::unprocessable(e.to_string())
    }
}

pub(crate) use crate::clock::rfc3339;

/// A listing's `limit`: 1 to 1000, 100 when absent.
pub(crate) fn page_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    match limit {
        None => Ok(100),
        Some(n @ 1..=1000) => Ok(n),
        Some(n) => Err(extract::bad_query(format!("limit: {n} is not 1 to 1000"))),
    }
}

/// Parses RFC 3339 into milliseconds (a body field's; see [`query_rfc3339`]).
pub(crate) fn parse_rfc3339(field: &str, s: &str) -> Result<i64, ApiError> {
    rfc3339_ms(s).ok_or_else(|| ApiError::bad_request(format!("{field}: {s:?} is not an RFC 3339 timestamp")))
}

/// Parses a query parameter's RFC 3339 into milliseconds; a bad one is `invalid_query`.
pub(crate) fn query_rfc3339(param: &str, s: &str) -> Result<i64, ApiError> {
    rfc3339_ms(s).ok_or_else(|| extract::bad_query(format!("{param}: {s:?} is not an RFC 3339 timestamp")))
}

fn rfc3339_ms(s: &str) -> Option<i64> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
}
