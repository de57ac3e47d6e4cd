//! The console (`/console`): a web page for operators and tenants, served as static files
//! built into the binary (`gateway/console/`, plain ES modules, no build step). It is not
//! an API operation: the page signs in with a token kept in the browser's session storage
//! and does everything through the public API, so it can never do what the token could
//! not. These are the only routes outside `api::routes` (`tests/it/tidy.rs` allows this
//! file alone, and only GETs: paths under `/console`, `/` and `/favicon.ico`); every answer
//! carries a Content Security Policy that allows no inline script and no other origin. `/`
//! sends a browser to the console, and `/favicon.ico` to the console's icon. `/console/portal` is the same
//! page for a tenant's customer (a portal session, see `api::portal`): its policy lets the
//! origins of `portal.frame_ancestors` frame it; the console itself is never framed.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use super::doc::ErrorCode;
use super::{ApiError, AppState};

/// Scripts and styles from this origin only, data from the API on this origin, no frames,
/// no plugins, no inline script or style.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// (file name under `/console/`, content type, bytes).
const ASSETS: &[(&str, &str, &str)] = &[
    ("index.html", "text/html; charset=utf-8", include_str!("../../console/index.html")),
    ("style.css", "text/css; charset=utf-8", include_str!("../../console/style.css")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("../../console/app.js")),
    ("api.js", "text/javascript; charset=utf-8", include_str!("../../console/api.js")),
    ("dom.js", "text/javascript; charset=utf-8", include_str!("../../console/dom.js")),
    ("chart.js", "text/javascript; charset=utf-8", include_str!("../../console/chart.js")),
    ("overview.js", "text/javascript; charset=utf-8", include_str!("../../console/overview.js")),
    ("endpoints.js", "text/javascript; charset=utf-8", include_str!("../../console/endpoints.js")),
    ("deliveries.js", "text/javascript; charset=utf-8", include_str!("../../console/deliveries.js")),
    ("deadletters.js", "text/javascript; charset=utf-8", include_str!("../../console/deadletters.js")),
    ("plugins.js", "text/javascript; charset=utf-8", include_str!("../../console/plugins.js")),
    ("catalog.js", "text/javascript; charset=utf-8", include_str!("../../console/catalog.js")),
    ("audit.js", "text/javascript; charset=utf-8", include_str!("../../console/audit.js")),
    ("favicon.svg", "image/svg+xml", include_str!("../../console/favicon.svg")),
];

/// The file names the console serves (for tests).
pub fn asset_names() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|(name, _, _)| *name)
}

/// Adds the console's routes (GET only) to `router`: its files, and `/` and `/favicon.ico`
/// sent to them.
pub(super) fn mount(router: Router<Arc<AppState>>) -> Router<Arc<AppState>> {
    router
        .route("/", get(|| async { Redirect::temporary("/console/") }))
        .route("/favicon.ico", get(|| async { Redirect::temporary("/console/favicon.svg") }))
        .route("/console", get(|| async { asset("index.html") }))
        .route("/console/", get(|| async { asset("index.html") }))
        .route("/console/portal", get(portal))
        .route("/console/{file}", get(|Path(file): Path<String>| async move { asset(&file) }))
}

/// The portal page: the console's page, framed by the configured origins only.
async fn portal(State(state): State<Arc<AppState>>) -> Response {
    let mut page = asset("index.html");
    let policy = portal_policy(&state.config.portal.frame_ancestors_csp());
    if let Ok(value) = HeaderValue::from_str(&policy) {
        page.headers_mut().insert(header::CONTENT_SECURITY_POLICY, value);
    }
    page
}

/// [`CONTENT_SECURITY_POLICY`] with `frame-ancestors` set to `ancestors`.
pub fn portal_policy(ancestors: &str) -> String {
    let rest = CONTENT_SECURITY_POLICY.strip_suffix("frame-ancestors 'none'").unwrap_or(CONTENT_SECURITY_POLICY);
    format!("{rest}frame-ancestors {ancestors}")
}

fn asset(name: &str) -> Response {
    let Some((_, content_type, body)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such console file").into_response();
    };
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        // The files change with the binary: revalidate rather than run an old page.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, *body).into_response()
}
