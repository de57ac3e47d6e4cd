//! Endpoint routes: create, list, read, patch, delete, enable, rotate the secret.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, AppState, auth, body_bytes, parse_json, rfc3339};
use crate::config::parse_duration;
use crate::model::*;
use crate::sign::Secret;
use crate::store::EndpointChange;

/// An endpoint as posted (create) or patched: every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointIn {
    url: Option<String>,
    description: Option<String>,
    event_types: Option<Vec<String>>,
    rate_per_sec: Option<f64>,
    burst: Option<u32>,
    max_in_flight: Option<u32>,
    secret: Option<String>,
    timeout: Option<String>,
    connect_timeout: Option<String>,
    retry: Option<RetryIn>,
    plugins: Option<PluginBindings>,
    headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryIn {
    base: Option<String>,
    factor: Option<f64>,
    cap: Option<String>,
    jitter: Option<String>,
    max_attempts: Option<u32>,
    ttl: Option<String>,
}

fn duration_ms(field: &str, text: &str) -> Result<u64, ApiError> {
    parse_duration(text).map(|d| d.as_millis() as u64).map_err(|e| ApiError::unprocessable(format!("{field}: {e}")))
}

/// Refuses destinations the SSRF guard would refuse anyway, when they are IP literals.
fn validate_url(state: &AppState, raw: &str) -> Result<String, ApiError> {
    let url = url::Url::parse(raw).map_err(|e| ApiError::unprocessable(format!("url: {raw:?} is not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ApiError::unprocessable(format!("url: scheme must be http or https, not {:?}", url.scheme())));
    }
    let host = url.host().ok_or_else(|| ApiError::unprocessable("url: missing host"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ApiError::unprocessable("url: credentials in the URL are not allowed; use headers"));
    }
    let ip = match host {
        url::Host::Ipv4(ip) => Some(std::net::IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => Some(std::net::IpAddr::V6(ip)),
        url::Host::Domain(d) if d.eq_ignore_ascii_case("localhost") => Some(std::net::Ipv4Addr::LOCALHOST.into()),
        url::Host::Domain(_) => None,
    };
    if let Some(ip) = ip
        && !state.config.delivery.allow_private_destinations
        && crate::deliver::is_forbidden(ip)
    {
        return Err(ApiError::unprocessable(format!(
            "url: {ip} is a private, loopback or link-local address (see delivery.allow_private_destinations)"
        )));
    }
    Ok(url.to_string())
}

const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "user-agent",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "webhook-attempt-id",
];

/// Applies `input` onto `spec` and validates the result as a whole.
fn apply(state: &AppState, tenant: &TenantId, spec: &mut EndpointSpec, input: EndpointIn) -> Result<(), ApiError> {
    if let Some(url) = input.url {
        spec.url = validate_url(state, &url)?;
    }
    if let Some(d) = input.description {
        spec.description = d;
    }
    if let Some(types) = input.event_types {
        for t in &types {
            validate_type_filter(t).map_err(ApiError::unprocessable)?;
        }
        spec.event_types = types;
    }
    spec.rate_per_sec = input.rate_per_sec.unwrap_or(spec.rate_per_sec);
    spec.burst = input.burst.unwrap_or(spec.burst);
    spec.max_in_flight = input.max_in_flight.unwrap_or(spec.max_in_flight);
    crate::pace::Pacer::try_new(spec.rate_per_sec, spec.burst, spec.max_in_flight)
        .map_err(|e| ApiError::unprocessable(format!("pacing: {e}")))?;
    if let Some(t) = input.timeout {
        spec.timeout_ms = duration_ms("timeout", &t)?;
    }
    if let Some(t) = input.connect_timeout {
        spec.connect_timeout_ms = duration_ms("connect_timeout", &t)?;
    }
    if spec.timeout_ms == 0 || spec.timeout_ms > crate::config::MAX_TIMEOUT.as_millis() as u64 {
        return Err(ApiError::unprocessable("timeout: must be between 1ms and 30s"));
    }
    if spec.connect_timeout_ms == 0 || spec.connect_timeout_ms > spec.timeout_ms {
        return Err(ApiError::unprocessable("connect_timeout: must be positive and at most timeout"));
    }
    if let Some(r) = input.retry {
        let doc = RetryOverrideDoc {
            base_ms: r.base.map(|v| duration_ms("retry.base", &v)).transpose()?.or(spec.retry.base_ms),
            factor: r.factor.or(spec.retry.factor),
            cap_ms: r.cap.map(|v| duration_ms("retry.cap", &v)).transpose()?.or(spec.retry.cap_ms),
            jitter: r.jitter.or(spec.retry.jitter.take()),
            max_attempts: r.max_attempts.or(spec.retry.max_attempts),
            ttl_ms: r.ttl.map(|v| duration_ms("retry.ttl", &v)).transpose()?.or(spec.retry.ttl_ms),
        };
        let over = doc.to_override().map_err(ApiError::unprocessable)?;
        state.config.retry.with_override(&over).map_err(|e| ApiError::unprocessable(format!("retry: {e}")))?;
        spec.retry = doc;
    }
    if let Some(p) = input.plugins {
        // Bindings resolve within the tenant only: another tenant's plugin is as unknown
        // as one that does not exist.
        use crate::plugin::Hook;
        for (hook, name) in [(Hook::Transform, &p.transform), (Hook::Classify, &p.classify), (Hook::Sign, &p.sign)] {
            let Some(name) = name else { continue };
            match state.plugins.get(tenant.as_str(), name) {
                Some(hooks) if hooks.contains(hook) => {}
                Some(_) => {
                    return Err(ApiError::unprocessable(format!(
                        "plugins.{}: plugin {name:?} does not implement {}",
                        hook.as_str(),
                        hook.as_str()
                    )));
                }
                None if state.plugins.loading(tenant.as_str(), name) => {
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "plugin_loading",
                        format!("plugins.{}: plugin {name:?} is still loading; try again shortly", hook.as_str()),
                    ));
                }
                None => {
                    return Err(ApiError::unprocessable(format!(
                        "plugins.{}: no plugin {name:?} in this tenant",
                        hook.as_str()
                    )));
                }
            }
        }
        spec.plugins = p;
    }
    if let Some(h) = input.headers {
        for (name, value) in &h {
            let parsed = axum::http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ApiError::unprocessable(format!("headers: {name:?} is not a header name")))?;
            if RESERVED_HEADERS.contains(&parsed.as_str()) {
                return Err(ApiError::unprocessable(format!("headers: {name:?} is set by Herald")));
            }
            axum::http::HeaderValue::from_str(value).map_err(|_| {
                ApiError::unprocessable(format!("headers: the value of {name:?} is not a header value"))
            })?;
        }
        spec.headers = h;
    }
    if let Some(s) = input.secret {
        Secret::parse(&s).map_err(|e| ApiError::unprocessable(format!("secret: {e}")))?;
        spec.secrets = vec![SecretEntry { secret: s, expires_at: None }];
    }
    Ok(())
}

/// The API view of an endpoint (secrets are never listed here).
pub(crate) fn view(e: &Endpoint) -> Value {
    let s = &e.spec;
    let ms = |v: Option<u64>| v.map(|m| humantime::format_duration(std::time::Duration::from_millis(m)).to_string());
    json!({
        "id": e.id,
        "tenant": e.tenant,
        "url": s.url,
        "description": s.description,
        "event_types": s.event_types,
        "rate_per_sec": s.rate_per_sec,
        "burst": s.burst,
        "max_in_flight": s.max_in_flight,
        "timeout": ms(Some(s.timeout_ms)),
        "connect_timeout": ms(Some(s.connect_timeout_ms)),
        "retry": {
            "base": ms(s.retry.base_ms), "factor": s.retry.factor, "cap": ms(s.retry.cap_ms),
            "jitter": s.retry.jitter, "max_attempts": s.retry.max_attempts, "ttl": ms(s.retry.ttl_ms),
        },
        "plugins": s.plugins,
        "headers": s.headers,
        "state": e.state,
        "state_reason": e.state_reason,
        "paused_until": e.paused_until.map(rfc3339),
        "failing_since": e.failing_since.map(rfc3339),
        "created_at": rfc3339(e.created_at),
        "updated_at": rfc3339(e.updated_at),
    })
}

async fn load(state: &AppState, tenant: &TenantId, id: &str) -> Result<Endpoint, ApiError> {
    match state.store.endpoint(&EndpointId::from_stored(id)).await? {
        Some(e) if &e.tenant == tenant => Ok(e),
        _ => Err(ApiError::not_found("endpoint")),
    }
}

pub async fn create(
    State(state): State<Arc<AppState>>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Manage).await?;
    let body = body_bytes(body)?;
    let input: EndpointIn = parse_json(&body)?;
    if input.url.is_none() {
        return Err(ApiError::unprocessable("url: required"));
    }
    let now = crate::clock::now_ms();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_rng(&mut rand::rng());
    let d = state.config.endpoint_defaults;
    let mut spec = EndpointSpec {
        url: String::new(),
        description: String::new(),
        event_types: Vec::new(),
        rate_per_sec: d.rate_per_sec,
        burst: d.burst,
        max_in_flight: d.max_in_flight,
        timeout_ms: state.config.delivery.timeout.as_millis() as u64,
        connect_timeout_ms: state.config.delivery.connect_timeout.as_millis() as u64,
        retry: RetryOverrideDoc::default(),
        plugins: PluginBindings::default(),
        headers: BTreeMap::new(),
        secrets: vec![SecretEntry { secret: Secret::generate(&mut rng).to_string(), expires_at: None }],
    };
    apply(&state, &tenant, &mut spec, input)?;
    let endpoint = Endpoint {
        id: EndpointId::generate(now, &mut rng),
        tenant,
        spec,
        state: EndpointState::Active,
        state_reason: None,
        paused_until: None,
        failing_since: None,
        created_at: now,
        updated_at: now,
    };
    state.store.insert_endpoint(&endpoint).await?;
    let mut out = view(&endpoint);
    out["secret"] = json!(endpoint.spec.secrets[0].secret);
    Ok((StatusCode::CREATED, Json(out)))
}

pub async fn list(
    State(state): State<Arc<AppState>>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Read).await?;
    let eps = state.store.list_endpoints(&tenant).await?;
    Ok(Json(json!({ "data": eps.iter().map(view).collect::<Vec<_>>() })))
}

pub async fn get_one(
    State(state): State<Arc<AppState>>,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Read).await?;
    let endpoint = load(&state, &tenant, &id).await?;
    let now = crate::clock::now_ms();
    let h = state.store.endpoint_health(&endpoint.id, now).await?;
    let rate = |s: u64, a: u64| if a == 0 { Value::Null } else { json!(s as f64 / a as f64) };
    let mut out = view(&endpoint);
    // The pacing settings and the outcome they produce, side by side.
    out["health"] = json!({
        "success_rate_1h": rate(h.successes_1h, h.attempts_1h),
        "success_rate_24h": rate(h.successes_24h, h.attempts_24h),
        "attempts_1h": h.attempts_1h,
        "attempts_24h": h.attempts_24h,
        "last_success_at": h.last_success_at.map(rfc3339),
        "last_attempt_at": h.last_attempt_at.map(rfc3339),
        "failing_since": endpoint.failing_since.map(rfc3339),
        "state": endpoint.state,
        "backlog": h.backlog,
        "dead_letters": h.dead_letters,
        "rate_per_sec": endpoint.spec.rate_per_sec,
        "burst": endpoint.spec.burst,
        "max_in_flight": endpoint.spec.max_in_flight,
    });
    Ok(Json(out))
}

pub async fn patch(
    State(state): State<Arc<AppState>>,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Manage).await?;
    let body = body_bytes(body)?;
    let input: EndpointIn = parse_json(&body)?;
    let mut endpoint = load(&state, &tenant, &id).await?;
    apply(&state, &tenant, &mut endpoint.spec, input)?;
    endpoint.updated_at = crate::clock::now_ms();
    if !state.store.update_endpoint(&endpoint).await? {
        return Err(ApiError::not_found("endpoint"));
    }
    Ok(Json(view(&endpoint)))
}

pub async fn delete(
    State(state): State<Arc<AppState>>,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Manage).await?;
    let endpoint = load(&state, &tenant, &id).await?;
    if !state.store.delete_endpoint(&tenant, &endpoint.id, crate::clock::now_ms()).await? {
        return Err(ApiError::not_found("endpoint"));
    }
    Ok(StatusCode::NO_CONTENT)
}

pub async fn enable(
    State(state): State<Arc<AppState>>,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Manage).await?;
    let endpoint = load(&state, &tenant, &id).await?;
    state
        .committer
        .change_endpoint(EndpointChange {
            endpoint: endpoint.id.clone(),
            state: Some(EndpointState::Active),
            reason: None,
            paused_until: None,
            failing_since: Some(None),
            now: crate::clock::now_ms(),
        })
        .await?;
    (state.wake)(std::slice::from_ref(&endpoint.id));
    Ok(Json(view(&load(&state, &tenant, &id).await?)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RotateIn {
    secret: Option<String>,
}

pub async fn rotate_secret(
    State(state): State<Arc<AppState>>,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Manage).await?;
    let body = body_bytes(body)?;
    let input: RotateIn = if body.is_empty() { RotateIn::default() } else { parse_json(&body)? };
    let secret = match input.secret {
        Some(s) => {
            Secret::parse(&s).map_err(|e| ApiError::unprocessable(format!("secret: {e}")))?;
            s
        }
        None => Secret::generate(&mut rand::rng()).to_string(),
    };
    let mut endpoint = load(&state, &tenant, &id).await?;
    let now = crate::clock::now_ms();
    let grace_until = now + state.config.delivery.secret_grace.as_millis() as i64;
    let mut secrets: Vec<SecretEntry> = endpoint
        .valid_secrets(now)
        .map(|s| SecretEntry {
            secret: s.secret.clone(),
            expires_at: Some(s.expires_at.unwrap_or(grace_until).min(grace_until)),
        })
        .collect();
    secrets.insert(0, SecretEntry { secret: secret.clone(), expires_at: None });
    endpoint.spec.secrets = secrets;
    endpoint.updated_at = now;
    state.store.update_endpoint(&endpoint).await?;
    Ok(Json(json!({ "secret": secret, "previous_valid_until": rfc3339(grace_until) })))
}

pub async fn secret(
    State(state): State<Arc<AppState>>,
    Path((tenant, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let tenant = auth::tenant(&state, &headers, &tenant, Scope::Manage).await?;
    let endpoint = load(&state, &tenant, &id).await?;
    let now = crate::clock::now_ms();
    let secrets: Vec<Value> = endpoint
        .valid_secrets(now)
        .map(|s| json!({ "secret": s.secret, "expires_at": s.expires_at.map(rfc3339) }))
        .collect();
    Ok(Json(json!({ "secret": endpoint.spec.secrets[0].secret, "secrets": secrets })))
}
