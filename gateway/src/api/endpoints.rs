//! Endpoint routes: create, list, read, patch, delete, enable, rotate the signing keys.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::doc::ErrorCode;
use super::extract::{ItemPath, JsonBody, Manage, Path, Query, Read, TenantAuth, TenantPath};
use super::{ApiError, AppState, page_limit, rfc3339};
use crate::config::parse_duration_ms;
use crate::model::*;
use crate::sign::Secret;
use crate::spec::{SpecRules, check_text, check_url_of};
use crate::store::EndpointChange;
use health::{DeliveryStatusOut, HealthOut, health_view, page_health, status_view};
use keys::{PublicKeyOut, RotateIn, Scheme};

mod health;
pub(crate) mod keys;
pub(crate) mod listener;
pub(crate) mod poll;
pub(crate) mod test_filter;
pub(crate) mod verify;

/// An endpoint as posted (create: `url` required) or patched: every field optional.
/// Durations are written `"250ms"`, `"30s"`, `"15m"`, `"24h"`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndpointIn {
    /// `https://` (or `http://`) URL the deliveries go to; for a broker kind, the broker's
    /// (`redis://host:port[/db]`, `nats://host:port`, `amqp://host:port[/vhost]`), without
    /// credentials; for kind `listen`, `listen://<name>`. None (absent or `""`) for kind `poll`.
    url: Option<String>,
    /// `http` (the default), `redis-stream`, `nats`, `amqp`, `poll` (pull delivery: a
    /// consumer reads the deliveries, `GET …/endpoints/{id}/poll`) or `listen` (`herald
    /// listen`: the requests go down a listener's connection, `GET …/endpoints/{id}/listen`).
    /// A broker kind needs `destination`; changing the kind needs the matching `url` and
    /// `destination`. An endpoint cannot become or stop being `poll`.
    kind: Option<EndpointKind>,
    /// A broker kind's settings. Patched field by field (`""` removes one; an omitted
    /// `password` or `token` keeps the stored one); `null` removes them all.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<DestinationIn>, nullable)]
    destination: Option<Option<DestinationIn>>,
    description: Option<String>,
    /// Exact event types and `prefix.*` patterns; empty: every type.
    event_types: Option<Vec<String>>,
    /// A content filter beside `event_types`: an object of clauses over the event as
    /// delivered (`data.…` is the payload; `type`, `id`, `timestamp`) that an event must
    /// match to be delivered here, e.g. `{"data.amount": {"$gte": 100}}`. Operators `$eq`,
    /// `$ne`, `$in`, `$nin`, `$gt`, `$gte`, `$lt`, `$lte`, `$exists`, `$and`, `$or`,
    /// `$not`. Applies to events taken after it is set and to replays. `null` removes it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Object>, nullable)]
    filter: Option<Option<serde_json::Value>>,
    rate_per_sec: Option<f64>,
    burst: Option<u32>,
    max_in_flight: Option<u32>,
    /// The `v1` (HMAC-SHA256) secret: `whsec_` + base64 of 24 to 64 bytes; generated when
    /// the endpoint signs `v1` and has none.
    secret: Option<String>,
    /// The Standard Webhooks signatures every delivery carries: `["v1"]` (the default),
    /// `["v1a"]` (ed25519) or both. A scheme added gets a generated key unless `secret` or
    /// `signing_key` is written with it; a scheme left out loses its keys. Absent: as stored,
    /// plus the scheme of a key written.
    signatures: Option<Vec<Scheme>>,
    /// Write-only: the `v1a` (ed25519) signing key, `whsk_` + base64 of the 32-byte seed (or
    /// of the 64 bytes of seed and public key). Generated when absent; never shown (its
    /// `whpk_` public key is). Sealed under the node's `[secrets] key` when it has one.
    signing_key: Option<String>,
    timeout: Option<String>,
    connect_timeout: Option<String>,
    retry: Option<RetryIn>,
    #[schema(value_type = Option<PluginsIn>)]
    plugins: Option<PluginBindings>,
    /// Custom headers sent with every delivery: at most 20, values visible ASCII or spaces,
    /// none of the names Herald or the HTTP client set.
    headers: Option<BTreeMap<String, String>>,
    /// `none` (the default), `endpoint` (every delivery in intake order, one at a time) or
    /// `key` (in intake order within each event's `ordering_key`; keys go in parallel).
    /// Applies to deliveries created after it is set.
    ordering: Option<DeliveryOrder>,
    /// With `ordering`: `skip` (the default: a dead-lettered delivery lets its key go on) or
    /// `block` (its key waits until it is replayed and delivered).
    ordering_on_dead: Option<DeadHead>,
    /// OAuth2 client credentials (RFC 6749 4.4): Herald sends `Authorization: Bearer` with
    /// a token from `token_url`, cached per node until shortly before it expires. Patched
    /// field by field (an omitted `client_secret` keeps the stored one); `null` removes it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<OAuth2In>, nullable)]
    oauth2: Option<Option<OAuth2In>>,
    /// The egress proxy for this endpoint: `http://[user:pass@]host:port` (HTTP CONNECT),
    /// `"none"` (direct, whatever `delivery.proxy` says), or `""` (the node's, the default).
    proxy: Option<String>,
    /// TLS client certificate (mTLS) and private CA. Patched field by field (`""` removes
    /// one); `null` removes them all.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<TlsIn>, nullable)]
    tls: Option<Option<TlsIn>>,
    /// The `User-Agent` of the endpoint's requests (kind `http`): 1-256 bytes of printable
    /// ASCII; `""` (the default) sends Herald's, `herald/<version>`.
    user_agent: Option<String>,
    /// CloudEvents 1.0 output instead of the Standard Webhooks envelope, any kind:
    /// `{"mode": "binary"}` (`ce-*` headers or the broker's binding, the payload as the
    /// body) or `{"mode": "structured"}` (`application/cloudevents+json`); `source`
    /// defaults to `/herald/tenants/{tenant}`. Replaced whole; `null` removes it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<CloudEvents>, nullable)]
    cloudevents: Option<Option<CloudEvents>>,
    /// Batching: on kind `http` (without `cloudevents`) several events in one request,
    /// `{"type": "batch", "data": [envelope, …]}` signed once; on a broker kind one
    /// pipelined publish of several messages, each as it would go alone. Not for `poll`
    /// or `listen`. Replaced whole; `null` removes it (one event per request, the default).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<BatchIn>, nullable)]
    batch: Option<Option<BatchIn>>,
    /// Pinned payload versions: `{"invoice.paid": 1}` — this endpoint takes events of
    /// `invoice.paid` in version 1 of the type's schema. An event posted against a newer
    /// version is converted down by the type's adapters (plugins, chained when several
    /// steps are needed) before the transform plugin, CloudEvents and the signature; while
    /// an adapter is missing the endpoint is held (`delivery_status.reason` names the type
    /// and versions) and resumes once the adapter is registered. Each type and version must
    /// be in the catalog the tenant sees. Not with `batch`, nor on kind `poll`. Replaced
    /// whole; `{}` removes every pin.
    payload_versions: Option<BTreeMap<String, i64>>,
    /// Verified endpoint (kind `http`): nothing is delivered until the URL has echoed a
    /// signed challenge, sent before the first delivery and again after a URL change (see
    /// `verification` and `POST …/verify`). Written, it wins over the tenant's
    /// `verify_endpoints`; omitted, a new endpoint or a new `url` takes the tenant's
    /// (default `false`).
    verify: Option<bool>,
}

/// A broker destination as written. Templates take `{type}` (the event type) and
/// `{tenant}`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DestinationIn {
    /// `redis-stream`: the stream key template (required).
    stream: Option<String>,
    /// `redis-stream`: trim the stream to about this many entries (`XADD … MAXLEN ~ n`);
    /// `0` removes it.
    maxlen: Option<u64>,
    /// `nats`: the subject template (required); a JetStream stream must take it.
    subject: Option<String>,
    /// `amqp`: the exchange (`""`: the default exchange).
    exchange: Option<String>,
    /// `amqp`: the routing key template (required).
    routing_key: Option<String>,
    username: Option<String>,
    /// Write-only: never shown again; stored sealed under the node's `[secrets] key` (without
    /// one, writing it is a 422).
    password: Option<String>,
    /// `nats`: an authentication token, instead of `username` and `password`. Write-only,
    /// sealed like `password`.
    token: Option<String>,
}

/// A broker destination as shown: never the password or token, only whether one is set.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DestinationOut {
    stream: Option<String>,
    maxlen: Option<u64>,
    subject: Option<String>,
    exchange: Option<String>,
    routing_key: Option<String>,
    username: Option<String>,
    password_set: bool,
    token_set: bool,
}

/// TLS material as written, PEM. Checked at once: certificates that parse, a client
/// certificate that has not expired, a key that matches it.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsIn {
    /// The client certificate chain, leaf first.
    client_cert: Option<String>,
    /// Write-only: sealed under the node's `[secrets] key` (a 422 without one).
    client_key: Option<String>,
    /// CA certificates trusted for this endpoint besides the public roots.
    ca_bundle: Option<String>,
}

/// TLS settings as shown: never the key, only that one is set.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TlsOut {
    client_cert: Option<String>,
    client_key_set: bool,
    ca_bundle: Option<String>,
}

/// A field that may be `null` (remove) or absent (keep): `Some(None)` is `null`.
fn present<'de, T: Deserialize<'de>, D: serde::Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// OAuth2 client credentials as written; the secret is write-only.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OAuth2In {
    /// The token endpoint (the SSRF rules of `url` apply).
    token_url: Option<String>,
    client_id: Option<String>,
    /// Write-only: never shown again.
    client_secret: Option<String>,
    scopes: Option<Vec<String>>,
    /// Sent as the `audience` parameter when set; `""` removes it.
    audience: Option<String>,
    /// `client_secret_basic` (default) or `client_secret_post`.
    client_auth: Option<ClientAuth>,
}

/// OAuth2 settings as shown: never the secret, only that one is set.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OAuth2Out {
    token_url: String,
    client_id: String,
    client_secret_set: bool,
    scopes: Vec<String>,
    audience: Option<String>,
    client_auth: ClientAuth,
}

/// What this node knows of the endpoint's OAuth2 token.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OAuth2TokenOut {
    /// `valid` (a cached token), `none` (none fetched yet, or dropped after a 401 or its
    /// expiry), `failing` (the last request failed) or `fetching`.
    state: String,
    /// When the cached token is refreshed (RFC 3339).
    refresh_at: Option<String>,
    /// Token requests since the node started.
    fetches: u64,
    /// The last token error, if the last request failed.
    last_error: Option<String>,
}

/// A retry policy override: any subset; unset fields follow the node's policy.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryIn {
    base: Option<String>,
    factor: Option<f64>,
    cap: Option<String>,
    /// `"full"` or `"<p>%"`.
    jitter: Option<String>,
    max_attempts: Option<u32>,
    ttl: Option<String>,
}

/// An endpoint's batching as written and shown: any subset, the rest take their defaults.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchIn {
    /// Most events in one request: 1 to 1000 (default 100).
    max_events: Option<u32>,
    /// Most bytes of event payloads in one request (default 1 MiB, at most 16 MiB); one
    /// larger event goes alone.
    max_bytes: Option<u64>,
    /// Longest wait for company, from the oldest event's due time: at most `"300s"`
    /// (default `"1s"`; `"0s"` sends what is there).
    max_wait: Option<String>,
}

/// The batching `b` writes, its omitted fields at their defaults.
fn batching(b: BatchIn) -> Result<Batching, ApiError> {
    let max_wait_ms = b.max_wait.map(|t| duration_ms("batch.max_wait", &t)).transpose()?.unwrap_or(1_000);
    Ok(Batching { max_events: b.max_events.unwrap_or(100), max_bytes: b.max_bytes.unwrap_or(1024 * 1024), max_wait_ms })
}

/// Plugins bound to the endpoint, by name within its tenant.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // The schema of `PluginBindings`, which `model` keeps free of the API's types.
pub(crate) struct PluginsIn {
    transform: Option<String>,
    classify: Option<String>,
    sign: Option<String>,
}

fn duration_ms(field: &str, text: &str) -> Result<u64, ApiError> {
    parse_duration_ms(text).map_err(|e| ApiError::unprocessable(format!("{field}: {e}")))
}

/// Maps `input` onto `spec`, checks the plugin bindings against the tenant's plugins, and
/// validates the result as a whole (`EndpointSpec::validate`, shared with config and ops).
/// The target is patched in its flat form (the API's), so a setting the new kind does not
/// take is refused by name, not dropped.
fn apply(state: &AppState, tenant: &TenantId, spec: &mut EndpointSpec, mut input: EndpointIn) -> Result<(), ApiError> {
    let allow_private = state.config.delivery.allow_private_destinations;
    let (kind, stored_url, destination, http) = spec.target.clone().into_flat();
    let kind = input.kind.unwrap_or(kind);
    let url = match input.url.take() {
        // `poll` takes none: anything but `""` is refused by its shape.
        Some(url) if kind.is_pull() => url,
        // Normalised (and checked again below with the rest).
        Some(url) => check_url_of("url", &url, allow_private, kind)?,
        None => stored_url.clone(),
    };
    // A new endpoint (whose stored URL is `""`) or a new URL: the tenant's setting applies.
    let tenant_verify = (kind.is_http() && url != stored_url).then(|| state.catalog.settings(tenant).verify_endpoints);
    let destination = match input.destination.take() {
        None => destination,
        Some(None) => None,
        Some(Some(d)) => Some(self::destination(state, destination, d)?),
    };
    apply_delivery(state, tenant, spec, &mut input)?;
    let http = http_settings(state, http, input, tenant_verify)?;
    // The URL first, as the whole spec's check does: a kind changed without its URL says so.
    if !kind.is_pull() {
        check_url_of("url", &url, allow_private, kind)?;
    }
    spec.target = Target::from_flat(kind, url, destination, http).map_err(crate::spec::SpecError::from)?;
    let rules = SpecRules {
        retry: &state.config.retry,
        max_timeout: crate::config::MAX_TIMEOUT,
        allow_private_destinations: allow_private,
    };
    spec.validate(&rules)?;
    seal_secrets(state, spec);
    Ok(())
}

/// The settings every kind shares, patched.
fn apply_delivery(
    state: &AppState,
    tenant: &TenantId,
    spec: &mut EndpointSpec,
    input: &mut EndpointIn,
) -> Result<(), ApiError> {
    if let Some(d) = input.description.take() {
        spec.description = d;
    }
    if let Some(types) = input.event_types.take() {
        // Against the catalog the tenant enforces, by the rule intake applies to events:
        // a type it would refuse to take, no endpoint can wait for.
        if let Some(refused) = state.catalog.refused_filter(tenant, &types) {
            return Err(ApiError::unprocessable(refused));
        }
        spec.event_types = types;
    }
    match input.filter.take() {
        None => {}
        Some(None) => spec.filter = None,
        Some(Some(f)) => spec.filter = Some(Filter::parse(&f).map_err(|e| ApiError::unprocessable(e.to_string()))?),
    }
    spec.rate_per_sec = input.rate_per_sec.unwrap_or(spec.rate_per_sec);
    spec.burst = input.burst.unwrap_or(spec.burst);
    spec.max_in_flight = input.max_in_flight.unwrap_or(spec.max_in_flight);
    if let Some(t) = input.timeout.take() {
        spec.timeout_ms = duration_ms("timeout", &t)?;
    }
    match input.connect_timeout.take() {
        Some(t) => spec.connect_timeout_ms = duration_ms("connect_timeout", &t)?,
        // Unset, the connect deadline never outlasts the total one: `{"timeout": "2s"}`
        // connects within 2s rather than being refused for the 3s default.
        None => spec.connect_timeout_ms = spec.connect_timeout_ms.min(spec.timeout_ms),
    }
    if let Some(r) = input.retry.take() {
        spec.retry = retry(r, std::mem::take(&mut spec.retry))?;
    }
    if let Some(p) = input.plugins.take() {
        check_bindings(state, tenant, &p)?;
        spec.plugins = p;
    }
    if let Some(h) = input.headers.take() {
        spec.headers = h;
    }
    spec.ordering = input.ordering.unwrap_or(spec.ordering);
    spec.ordering_on_dead = input.ordering_on_dead.unwrap_or(spec.ordering_on_dead);
    if let Some(ce) = input.cloudevents.take() {
        spec.cloudevents = ce;
    }
    if let Some(b) = input.batch.take() {
        spec.batch = b.map(batching).transpose()?;
    }
    if let Some(pins) = input.payload_versions.take() {
        spec.payload_versions = checked_pins(state, tenant, pins)?;
    }
    keys::apply(spec, input.signatures.take(), input.secret.take(), input.signing_key.take())?;
    Ok(())
}

/// Pinned payload versions, against the catalog as the tenant sees it now: a type or
/// version it lacks, no adapter could ever reach.
fn checked_pins(
    state: &AppState,
    tenant: &TenantId,
    pins: BTreeMap<String, i64>,
) -> Result<BTreeMap<String, i64>, ApiError> {
    for (event_type, version) in &pins {
        if let Some(why) = state.catalog.refused_pin(tenant, event_type, *version) {
            return Err(ApiError::unprocessable(format!("payload_versions.{event_type}: {why}")));
        }
    }
    Ok(pins)
}

/// A retry override patched onto the stored one: each field written replaces its own.
fn retry(r: RetryIn, stored: RetryOverrideDoc) -> Result<RetryOverrideDoc, ApiError> {
    Ok(RetryOverrideDoc {
        base_ms: r.base.map(|v| duration_ms("retry.base", &v)).transpose()?.or(stored.base_ms),
        factor: r.factor.or(stored.factor),
        cap_ms: r.cap.map(|v| duration_ms("retry.cap", &v)).transpose()?.or(stored.cap_ms),
        jitter: r.jitter.or(stored.jitter),
        max_attempts: r.max_attempts.or(stored.max_attempts),
        ttl_ms: r.ttl.map(|v| duration_ms("retry.ttl", &v)).transpose()?.or(stored.ttl_ms),
    })
}

/// HTTP's own settings (proxy, TLS, OAuth2, `User-Agent`, `verify`), patched in their flat
/// form. `tenant_verify`: the tenant's `verify_endpoints`, when the write creates the
/// endpoint or changes its URL; it sets `verify` unless the endpoint's own was written.
fn http_settings(
    state: &AppState,
    stored: HttpSettings,
    input: EndpointIn,
    tenant_verify: Option<bool>,
) -> Result<HttpSettings, ApiError> {
    let HttpSettings { mut proxy, tls: mut tls_now, oauth2: mut oauth2_now, user_agent, verify, verify_explicit } =
        stored;
    if let Some(p) = input.proxy {
        proxy = (!p.is_empty()).then_some(p);
    }
    let user_agent = patched(input.user_agent, user_agent);
    match input.tls {
        None => {}
        Some(None) => tls_now = None,
        Some(Some(t)) => tls_now = tls(state, tls_now.take(), t)?,
    }
    match input.oauth2 {
        None => {}
        Some(None) => oauth2_now = None,
        Some(Some(o)) => oauth2_now = Some(oauth2(oauth2_now.take(), o)?),
    }
    let (verify, verify_explicit) = match (input.verify, tenant_verify) {
        (Some(written), _) => (written, true),
        (None, Some(tenant)) if !verify_explicit => (tenant, false),
        (None, _) => (verify, verify_explicit),
    };
    Ok(HttpSettings { oauth2: oauth2_now, proxy, tls: tls_now, user_agent, verify, verify_explicit })
}

/// A text field patched: a new value replaces the stored one, `""` removes it, and an
/// omitted one keeps it.
fn patched(new: Option<String>, old: Option<String>) -> Option<String> {
    match new {
        Some(v) if v.is_empty() => None,
        Some(v) => Some(v),
        None => old,
    }
}

/// A destination patched onto the stored one: a field written replaces it (`""` or a
/// `maxlen` of 0 removes it), one omitted stays. A password or token written is checked in
/// clear and stored sealed under `[secrets] key`, as a TLS client key is: never at rest in
/// clear.
fn destination(state: &AppState, stored: Option<Destination>, input: DestinationIn) -> Result<Destination, ApiError> {
    let stored = stored.unwrap_or_default();
    let pick = patched;
    let secret = |field: &str, new: Option<String>, old: Option<WriteOnly>| match new {
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => {
            check_text(field, &v, crate::spec::MAX_DESTINATION_TEXT)?;
            let sealer = state.config.secrets.as_ref().ok_or_else(|| {
                ApiError::unprocessable(format!("{field}: this node has no [secrets] key to seal it with"))
            })?;
            Ok::<_, ApiError>(Some(WriteOnly::new(sealer.seal(&v, &mut rand::rng()))))
        }
        None => Ok(old),
    };
    Ok(Destination {
        stream: pick(input.stream, stored.stream),
        maxlen: match input.maxlen {
            Some(0) => None,
            Some(n) => Some(n),
            None => stored.maxlen,
        },
        subject: pick(input.subject, stored.subject),
        // `""` is the default exchange, a value of its own.
        exchange: input.exchange.or(stored.exchange),
        routing_key: pick(input.routing_key, stored.routing_key),
        username: pick(input.username, stored.username),
        password: secret("destination.password", input.password, stored.password)?,
        token: secret("destination.token", input.token, stored.token)?,
    })
}

/// TLS settings patched onto the stored ones: checked with the key in clear (the stored
/// one opened), then the key sealed. `None`: nothing left.
fn tls(state: &AppState, stored: Option<EndpointTls>, input: TlsIn) -> Result<Option<EndpointTls>, ApiError> {
    let stored = stored.unwrap_or_default();
    let pick = patched;
    let cert = pick(input.client_cert, stored.client_cert);
    let ca = pick(input.ca_bundle, stored.ca_bundle);
    let sealer = state.config.secrets.as_ref();
    let no_key = || ApiError::unprocessable("tls.client_key: this node has no [secrets] key to seal it with");
    let (key, sealed) = match (input.client_key, stored.client_key) {
        (Some(k), _) if k.is_empty() => (None, None),
        (Some(k), _) => {
            let sealed = sealer.ok_or_else(no_key)?.seal(&k, &mut rand::rng());
            (Some(k), Some(sealed))
        }
        (None, Some(old)) => {
            let plain = sealer
                .ok_or_else(no_key)?
                .open(old.expose())
                .map_err(|e| ApiError::unprocessable(format!("tls.client_key: the stored key {e}; write it again")))?;
            (Some(plain), Some(old.expose().to_string()))
        }
        (None, None) => (None, None),
    };
    let now = state.clock.now() / 1000;
    crate::spec::check_tls(cert.as_deref(), key.as_deref(), ca.as_deref(), now)?;
    let tls = EndpointTls { client_cert: cert, client_key: sealed.map(WriteOnly::new), ca_bundle: ca };
    Ok((tls != EndpointTls::default()).then_some(tls))
}

/// OAuth2 settings patched onto the stored ones (if any); a new configuration needs every
/// required field. A new client secret is checked here, in clear: it is sealed with the
/// rest of the spec (see [`seal_secrets`]).
fn oauth2(stored: Option<OAuth2>, input: OAuth2In) -> Result<OAuth2, ApiError> {
    let required = |field: &str| ApiError::unprocessable(format!("oauth2.{field}: required"));
    let (url, id, secret, scopes, audience, client_auth) = match stored {
        Some(o) => (
            Some(o.token_url),
            Some(o.client_id),
            Some((o.client_secret, o.client_secret_sealed)),
            o.scopes,
            o.audience,
            o.client_auth,
        ),
        None => (None, None, None, Vec::new(), None, ClientAuth::default()),
    };
    let (client_secret, client_secret_sealed) = match (input.client_secret, secret) {
        (Some(new), _) => {
            crate::spec::check_oauth2_secret(&new)?;
            (WriteOnly::new(new), false)
        }
        (None, Some(stored)) => stored,
        (None, None) => return Err(required("client_secret")),
    };
    Ok(OAuth2 {
        token_url: input.token_url.or(url).ok_or_else(|| required("token_url"))?,
        client_id: input.client_id.or(id).ok_or_else(|| required("client_id"))?,
        client_secret,
        client_secret_sealed,
        scopes: input.scopes.unwrap_or(scopes),
        audience: match input.audience {
            Some(a) if a.is_empty() => None,
            Some(a) => Some(a),
            None => audience,
        },
        client_auth: input.client_auth.unwrap_or(client_auth),
    })
}

/// Seals the OAuth2 client secret and the `v1a` signing keys under `[secrets] key` when the
/// node has one: a new one, and one stored in clear (before secrets were sealed, or by a
/// node without a key) at the endpoint's next write, whatever it changes. Without a key
/// they stay as written.
fn seal_secrets(state: &AppState, spec: &mut EndpointSpec) {
    let Some(sealer) = state.config.secrets.as_ref() else { return };
    for entry in spec.secrets.iter_mut().filter(|s| s.is_v1a()) {
        if entry.secret.starts_with(crate::sign::v1a::SECRET_KEY_PREFIX) {
            entry.secret = sealer.seal(&entry.secret, &mut rand::rng());
        }
    }
    let Target::Http(HttpTarget { oauth2: Some(auth), .. }) = &mut spec.target else { return };
    if !auth.client_secret_sealed {
        auth.client_secret = WriteOnly::new(sealer.seal(auth.client_secret.expose(), &mut rand::rng()));
        auth.client_secret_sealed = true;
    }
}

/// Loads the pinned versions (`name@n`) that `input` binds, off the async runtime, so
/// that `check_bindings` finds them; one that is not stored stays unknown.
async fn load_pinned(state: &AppState, tenant: &TenantId, input: &EndpointIn) {
    let Some(p) = &input.plugins else { return };
    for name in [&p.transform, &p.classify, &p.sign].into_iter().flatten() {
        state.plugins.ensure_pinned(tenant.as_str(), name).await;
    }
}

/// Bindings resolve within the tenant only: another tenant's plugin is as unknown as one
/// that does not exist.
fn check_bindings(state: &AppState, tenant: &TenantId, p: &PluginBindings) -> Result<(), ApiError> {
    use crate::plugin::Hook;
    for (hook, name) in [(Hook::Transform, &p.transform), (Hook::Classify, &p.classify), (Hook::Sign, &p.sign)] {
        let Some(name) = name else { continue };
        let field = format!("plugins.{}", hook.as_str());
        match state.plugins.get(tenant.as_str(), name) {
            Some(hooks) if hooks.contains(hook) => {}
            Some(_) => {
                return Err(ApiError::unprocessable(format!(
                    "{field}: plugin {name:?} does not implement {}",
                    hook.as_str()
                )));
            }
            None if state.plugins.loading(tenant.as_str(), name) => {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::PluginLoading,
                    format!("{field}: plugin {name:?} is still loading; try again shortly"),
                ));
            }
            None => {
                check_text(&field, name, 64)?;
                return Err(ApiError::unprocessable(format!("{field}: no plugin {name:?} in this tenant")));
            }
        }
    }
    Ok(())
}

/// An endpoint as the API shows it (secrets are never listed here). Times are RFC 3339.
#[derive(Serialize, ToSchema)]
pub(crate) struct EndpointOut {
    id: String,
    tenant: String,
    url: String,
    kind: EndpointKind,
    destination: Option<DestinationOut>,
    description: String,
    event_types: Vec<String>,
    /// The content filter as written (null: none).
    #[schema(value_type = Option<Object>)]
    filter: Option<serde_json::Value>,
    rate_per_sec: f64,
    burst: u32,
    max_in_flight: u32,
    timeout: String,
    connect_timeout: String,
    /// The endpoint's own override; null fields follow the node's policy.
    retry: RetryIn,
    #[schema(value_type = PluginsIn)]
    plugins: PluginBindings,
    headers: BTreeMap<String, String>,
    ordering: DeliveryOrder,
    ordering_on_dead: DeadHead,
    /// The signatures its deliveries carry (`v1`, `v1a`).
    signatures: Vec<Scheme>,
    oauth2: Option<OAuth2Out>,
    /// The endpoint's own proxy (password shown as `***`) or `"none"`; null: the node's.
    proxy: Option<String>,
    tls: Option<TlsOut>,
    /// The endpoint's own `User-Agent`; null: Herald's.
    user_agent: Option<String>,
    /// Its CloudEvents output (null: the Standard Webhooks envelope).
    cloudevents: Option<CloudEvents>,
    /// Pinned payload versions: event type → the schema version it takes (`{}`: none).
    payload_versions: BTreeMap<String, i64>,
    /// Its batching (null: one event per request).
    batch: Option<BatchIn>,
    /// Whether deliveries wait for the URL to echo a signed challenge.
    verify: bool,
    /// Where that verification stands; absent when `verify` is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    verification: Option<verify::VerificationOut>,
    state: EndpointState,
    state_reason: Option<String>,
    paused_until: Option<String>,
    failing_since: Option<String>,
    /// Where its deliveries stand (computed when read, never written).
    delivery_status: DeliveryStatusOut,
    created_at: String,
    updated_at: String,
}

/// A created endpoint: the view, its `v1` signing secret and its `v1a` public key (each
/// when it signs with that scheme).
#[derive(Serialize, ToSchema)]
pub(crate) struct EndpointCreated {
    #[serde(flatten)]
    endpoint: EndpointOut,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    public_keys: Vec<PublicKeyOut>,
}

/// One endpoint with its recent health: the pacing settings and what they produce.
#[derive(Serialize, ToSchema)]
pub(crate) struct EndpointDetail {
    #[serde(flatten)]
    endpoint: EndpointOut,
    health: HealthOut,
    /// This node's OAuth2 token for the endpoint (null without `oauth2`).
    token: Option<OAuth2TokenOut>,
    /// The `v1a` public keys that sign now, the current one first (empty without `v1a`).
    public_keys: Vec<PublicKeyOut>,
}

/// What this node knows of `e`'s OAuth2 token.
fn token_view(state: &AppState, e: &Endpoint) -> Option<OAuth2TokenOut> {
    let auth = e.spec.target.as_http()?.oauth2.as_ref()?;
    let deliverer = state.deliverer.as_ref()?;
    // The tokens are cached by the credentials in clear, as the worker uses them.
    let auth = match crate::sign::seal::open_oauth2(auth, state.config.secrets.as_deref()) {
        Ok(auth) => auth,
        Err(e) => {
            return Some(OAuth2TokenOut { state: "failing".into(), refresh_at: None, fetches: 0, last_error: Some(e) });
        }
    };
    let Some(t) = deliverer.token_state(&auth) else {
        return Some(OAuth2TokenOut { state: "fetching".into(), refresh_at: None, fetches: 0, last_error: None });
    };
    let now = state.clock.now();
    let state = match (&t.last_error, t.refresh_in) {
        (Some(_), _) => "failing",
        (None, Some(d)) if !d.is_zero() => "valid",
        _ => "none",
    };
    Some(OAuth2TokenOut {
        state: state.into(),
        refresh_at: t.refresh_in.filter(|d| !d.is_zero()).map(|d| rfc3339(now + d.as_millis() as i64)),
        fetches: t.fetches,
        last_error: t.last_error,
    })
}

fn duration_text(ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
}

/// `e` as shown, its delivery status read with its health (one statement).
pub(super) async fn read_view(state: &AppState, e: &Endpoint) -> Result<EndpointOut, ApiError> {
    let h = health::health(state, e).await?;
    Ok(view(e, status_view(e, &h, state.clock.now())))
}

pub(crate) fn view(e: &Endpoint, delivery_status: DeliveryStatusOut) -> EndpointOut {
    let s = &e.spec;
    let ms = |v: Option<u64>| v.map(duration_text);
    let (kind, url, destination, http) = s.target.clone().into_flat();
    EndpointOut {
        id: e.id.to_string(),
        tenant: e.tenant.to_string(),
        url,
        kind,
        destination: destination.map(destination_view),
        description: s.description.clone(),
        event_types: s.event_types.clone(),
        filter: s.filter.as_ref().map(|f| f.as_json().clone()),
        rate_per_sec: s.rate_per_sec,
        burst: s.burst,
        max_in_flight: s.max_in_flight,
        timeout: duration_text(s.timeout_ms),
        connect_timeout: duration_text(s.connect_timeout_ms),
        retry: RetryIn {
            base: ms(s.retry.base_ms),
            factor: s.retry.factor,
            cap: ms(s.retry.cap_ms),
            jitter: s.retry.jitter.clone(),
            max_attempts: s.retry.max_attempts,
            ttl: ms(s.retry.ttl_ms),
        },
        plugins: s.plugins.clone(),
        headers: s.headers.clone(),
        ordering: s.ordering,
        ordering_on_dead: s.ordering_on_dead,
        signatures: keys::schemes(s),
        oauth2: http.oauth2.map(oauth2_view),
        proxy: http.proxy.map(|p| match crate::net::proxy::ProxyUrl::parse(&p) {
            Ok(url) => url.to_string(),
            Err(_) => "none".to_string(),
        }),
        tls: http.tls.map(|t| TlsOut {
            client_cert: t.client_cert,
            client_key_set: t.client_key.is_some(),
            ca_bundle: t.ca_bundle,
        }),
        user_agent: http.user_agent,
        cloudevents: s.cloudevents.clone(),
        payload_versions: s.payload_versions.clone(),
        batch: s.batch.map(|b| BatchIn {
            max_events: Some(b.max_events),
            max_bytes: Some(b.max_bytes),
            max_wait: Some(duration_text(b.max_wait_ms)),
        }),
        verify: http.verify,
        verification: verify::verification_view(e),
        state: e.state,
        state_reason: e.state_reason.clone(),
        paused_until: e.paused_until.map(rfc3339),
        failing_since: e.failing_since.map(rfc3339),
        delivery_status,
        created_at: rfc3339(e.created_at),
        updated_at: rfc3339(e.updated_at),
    }
}

/// A broker destination as shown: the password and token only as set or not.
fn destination_view(d: Destination) -> DestinationOut {
    DestinationOut {
        stream: d.stream,
        maxlen: d.maxlen,
        subject: d.subject,
        exchange: d.exchange,
        routing_key: d.routing_key,
        username: d.username,
        password_set: d.password.is_some(),
        token_set: d.token.is_some(),
    }
}

/// OAuth2 settings as shown: the secret only as set or not.
fn oauth2_view(o: OAuth2) -> OAuth2Out {
    OAuth2Out {
        token_url: o.token_url,
        client_id: o.client_id,
        client_secret_set: !o.client_secret.expose().is_empty(),
        scopes: o.scopes,
        audience: o.audience,
        client_auth: o.client_auth,
    }
}

async fn load(state: &AppState, tenant: &TenantId, id: &str) -> Result<Endpoint, ApiError> {
    match state.store.endpoint(&EndpointId::from_stored(id)).await? {
        Some(e) if &e.tenant == tenant => Ok(e),
        _ => Err(ApiError::not_found("endpoint")),
    }
}

/// The tenant's endpoint `id` if it is of `kind`; else a 409 naming `kind`, and `why` only
/// that kind takes the route.
async fn load_of_kind(
    state: &AppState,
    tenant: &TenantId,
    id: &str,
    kind: EndpointKind,
    why: &str,
) -> Result<Endpoint, ApiError> {
    let endpoint = load(state, tenant, id).await?;
    let actual = endpoint.spec.target.kind();
    if actual != kind {
        let message = format!("kind: the endpoint is kind {}, not {}: {why}", actual.as_str(), kind.as_str());
        return Err(ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, message));
    }
    Ok(endpoint)
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/endpoints", tag = "endpoints", operation_id = "create_endpoint",
    params(TenantPath), request_body = EndpointIn,
    responses((status = 201, description = "Created", body = EndpointCreated)),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    JsonBody(input): JsonBody<EndpointIn>,
) -> Result<(StatusCode, Json<EndpointCreated>), ApiError> {
    if input.url.is_none() && !input.kind.is_some_and(EndpointKind::is_pull) {
        return Err(ApiError::unprocessable("url: required"));
    }
    let now = state.clock.now();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_rng(&mut rand::rng());
    let d = state.config.endpoint_defaults;
    let limits = Limits {
        rate_per_sec: d.rate_per_sec,
        burst: d.burst,
        max_in_flight: d.max_in_flight,
        // Both bounded by the config's checks (at most 30s).
        timeout_ms: state.config.delivery.timeout.as_millis() as u64,
        connect_timeout_ms: state.config.delivery.connect_timeout.as_millis() as u64,
    };
    let mut spec = EndpointSpec::new(Target::http(""), Secret::generate(&mut rng).to_string(), limits);
    // A binding is checked and written under the tenant's plugin lock (see `PluginLocks`).
    let _bindings = match input.plugins.is_some() {
        true => Some(state.plugin_locks.lock(&tenant).await),
        false => None,
    };
    load_pinned(&state, &tenant, &input).await;
    apply(&state, &tenant, &mut spec, input)?;
    let endpoint = Endpoint::new(EndpointId::generate(now, &mut rng), tenant, spec, now);
    crate::store::audit::note_resource(endpoint.id.as_str());
    state.store.insert_endpoint(&endpoint).await?;
    if endpoint.verify_gate(now) != Gate::Open {
        // Verified before its first delivery: the handshake goes out now.
        state.engine.poke(std::slice::from_ref(&endpoint.id));
    }
    let secret = endpoint.spec.secrets.iter().find(|s| !s.is_v1a()).map(|s| s.secret.clone());
    let public_keys = keys::public_keys(endpoint.spec.secrets.iter());
    // New: no attempts, so no health to read.
    let status = status_view(&endpoint, &Health::default(), now);
    Ok((StatusCode::CREATED, Json(EndpointCreated { endpoint: view(&endpoint, status), secret, public_keys })))
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/endpoints/{id}", tag = "endpoints", operation_id = "get_endpoint",
    params(ItemPath),
    responses((status = 200, description = "The endpoint and its health", body = EndpointDetail)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Read>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
) -> Result<Json<EndpointDetail>, ApiError> {
    let endpoint = load(&state, &tenant, &id).await?;
    let h = health::health(&state, &endpoint).await?;
    let token = token_view(&state, &endpoint);
    let now = state.clock.now();
    let public_keys = keys::public_keys(endpoint.valid_secrets(now));
    let out = view(&endpoint, status_view(&endpoint, &h, now));
    Ok(Json(EndpointDetail { endpoint: out, health: health_view(&endpoint, &h), token, public_keys }))
}

#[utoipa::path(
    patch, path = "/v1/tenants/{tenant}/endpoints/{id}", tag = "endpoints", operation_id = "update_endpoint",
    params(ItemPath), request_body = EndpointIn,
    responses((status = 200, description = "Updated; a patch that changes nothing (`{}`) answers the endpoint as it was, and writes nothing", body = EndpointOut)),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn patch(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
    JsonBody(input): JsonBody<EndpointIn>,
) -> Result<Json<EndpointOut>, ApiError> {
    let _bindings = match input.plugins.is_some() {
        true => Some(state.plugin_locks.lock(&tenant).await),
        false => None,
    };
    let mut endpoint = load(&state, &tenant, &id).await?;
    let pull = endpoint.spec.target.kind().is_pull();
    if input.kind.is_some_and(|k| k.is_pull() != pull) {
        // Its deliveries are stored for a consumer (never due) or for the engine: a
        // change of mind is a new endpoint.
        return Err(ApiError::unprocessable(
            "kind: an endpoint cannot become or stop being kind poll; create another endpoint",
        ));
    }
    load_pinned(&state, &tenant, &input).await;
    let before = endpoint.spec.clone();
    apply(&state, &tenant, &mut endpoint.spec, input)?;
    // A patch that changes nothing (`{}`, or the values already set) writes nothing: the
    // row, its `updated_at` and the partition's pacing stay as they were.
    if endpoint.spec == before {
        return Ok(Json(read_view(&state, &endpoint).await?));
    }
    endpoint.updated_at = state.clock.now();
    if !state.store.update_endpoint(&endpoint).await? {
        return Err(ApiError::not_found("endpoint"));
    }
    state.engine.changed(std::slice::from_ref(&endpoint.id));
    if endpoint.verify_gate(endpoint.updated_at) == Gate::Due {
        // Verified (again, at a new URL) before anything more goes out: the handshake now.
        state.engine.poke(std::slice::from_ref(&endpoint.id));
    }
    Ok(Json(read_view(&state, &endpoint).await?))
}

#[utoipa::path(
    delete, path = "/v1/tenants/{tenant}/endpoints/{id}", tag = "endpoints", operation_id = "delete_endpoint",
    params(ItemPath),
    responses((status = 204, description = "Deleted")),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
) -> Result<StatusCode, ApiError> {
    let endpoint = load(&state, &tenant, &id).await?;
    if !state.store.delete_endpoint(&tenant, &endpoint.id, state.clock.now()).await? {
        return Err(ApiError::not_found("endpoint"));
    }
    state.engine.changed(std::slice::from_ref(&endpoint.id));
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/endpoints/{id}/enable", tag = "endpoints", operation_id = "enable_endpoint",
    params(ItemPath),
    responses((status = 200, description = "Active again", body = EndpointOut)),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn enable(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
) -> Result<Json<EndpointOut>, ApiError> {
    let endpoint = load(&state, &tenant, &id).await?;
    state.committer.change_endpoint(EndpointChange::reactivate(endpoint.id.clone(), state.clock.now())).await?;
    tracing::info!(
        tenant = %tenant, endpoint_id = %endpoint.id, state = "active", from = endpoint.state.as_str(),
        "endpoint state change: re-enabled"
    );
    state.engine.changed(std::slice::from_ref(&endpoint.id));
    state.engine.poke(std::slice::from_ref(&endpoint.id));
    Ok(Json(read_view(&state, &load(&state, &tenant, &id).await?).await?))
}

/// A pause: for a while (deliveries wait, then resume on their own) or until re-enabled.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PauseIn {
    /// How long, e.g. `"15m"`; absent: until `enable`.
    #[serde(rename = "for")]
    duration: Option<String>,
    /// Shown with the endpoint's state (1 KiB at most).
    reason: Option<String>,
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/endpoints/{id}/pause", tag = "endpoints", operation_id = "pause_endpoint",
    params(ItemPath), request_body = PauseIn,
    responses((status = 200, description = "Paused", body = EndpointOut)),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn pause(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
    JsonBody(input): JsonBody<PauseIn>,
) -> Result<Json<EndpointOut>, ApiError> {
    let endpoint = load(&state, &tenant, &id).await?;
    let reason = input.reason.unwrap_or_else(|| "paused by an operator".into());
    check_text("reason", &reason, 1024)?;
    let now = state.clock.now();
    let until = input.duration.map(|d| duration_ms("for", &d)).transpose()?.map(|ms| now.saturating_add(ms as i64));
    state
        .committer
        .change_endpoint(EndpointChange {
            endpoint: endpoint.id.clone(),
            state: Some(EndpointState::Paused),
            reason: Some(reason.clone()),
            paused_until: until,
            failing_since: Failing::Unchanged,
            by: StateBy::Operator,
            now,
        })
        .await?;
    tracing::info!(
        tenant = %tenant, endpoint_id = %endpoint.id, state = "paused", reason = %reason,
        "endpoint state change: paused through the API"
    );
    state.engine.changed(std::slice::from_ref(&endpoint.id));
    Ok(Json(read_view(&state, &load(&state, &tenant, &id).await?).await?))
}

/// The new keys, and until when the previous ones of their schemes still sign.
#[derive(Serialize, ToSchema)]
pub(crate) struct RotatedOut {
    /// The new `v1` secret, when `v1` was rotated.
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
    /// The new `v1a` public key, when `v1a` was rotated (its secret key is never shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    public_key: Option<PublicKeyOut>,
    previous_valid_until: String,
}

#[utoipa::path(
    post, path = "/v1/tenants/{tenant}/endpoints/{id}/rotate-secret", tag = "endpoints",
    operation_id = "rotate_endpoint_secret",
    params(ItemPath), request_body = RotateIn,
    responses((status = 200, description = "Rotated", body = RotatedOut)),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn rotate_secret(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
    JsonBody(input): JsonBody<RotateIn>,
) -> Result<Json<RotatedOut>, ApiError> {
    let mut endpoint = load(&state, &tenant, &id).await?;
    let now = state.clock.now();
    let grace_until = now + state.config.delivery.secret_grace.as_millis() as i64;
    let rotated = keys::rotate(&mut endpoint.spec, input, now, grace_until)?;
    seal_secrets(&state, &mut endpoint.spec);
    endpoint.updated_at = now;
    state.store.update_endpoint(&endpoint).await?;
    state.engine.changed(std::slice::from_ref(&endpoint.id));
    Ok(Json(RotatedOut {
        secret: rotated.secret,
        public_key: rotated.public_key,
        previous_valid_until: rfc3339(grace_until),
    }))
}

/// The current `v1` signing secret and every one still valid (during a rotation's grace),
/// and the `v1a` public keys (never their secret keys).
#[derive(Serialize, ToSchema)]
pub(crate) struct SecretsOut {
    /// Absent when the endpoint does not sign `v1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
    secrets: Vec<SecretOut>,
    /// The `v1a` public keys that sign now, the current one first.
    public_keys: Vec<PublicKeyOut>,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct SecretOut {
    secret: String,
    /// Null for the current secret.
    expires_at: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/endpoints/{id}/secret", tag = "endpoints", operation_id = "get_endpoint_secret",
    params(ItemPath),
    responses((status = 200, description = "The signing secrets", body = SecretsOut)),
    security(("tenant_token" = ["manage"]), ("admin_token" = [])),
)]
pub(crate) async fn secret(
    State(state): State<Arc<AppState>>,
    TenantAuth { tenant, .. }: TenantAuth<Manage>,
    Path(ItemPath { id, .. }): Path<ItemPath>,
) -> Result<Json<SecretsOut>, ApiError> {
    let endpoint = load(&state, &tenant, &id).await?;
    let now = state.clock.now();
    let secrets: Vec<SecretOut> = endpoint
        .valid_secrets(now)
        .filter(|s| !s.is_v1a())
        .map(|s| SecretOut { secret: s.secret.clone(), expires_at: s.expires_at.map(rfc3339) })
        .collect();
    let secret = endpoint.spec.secrets.iter().find(|s| !s.is_v1a()).map(|s| s.secret.clone());
    let public_keys = keys::public_keys(endpoint.valid_secrets(now));
    Ok(Json(SecretsOut { secret, secrets, public_keys }))
}

/// Paging of the endpoint listing.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EndpointQuery {
    /// The `next_after` of the previous page.
    after: Option<String>,
    /// Page size (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Include each endpoint's `health` (success rates, backlog, last success).
    health: Option<bool>,
    /// Only the endpoints that bind this plugin to a hook, as `name` or pinned (`name@n`).
    #[param(pattern = "^[a-z0-9_-]{1,64}$")]
    plugin: Option<String>,
}

/// An endpoint, with its health when asked for.
#[derive(Serialize, ToSchema)]
pub(crate) struct EndpointItem {
    #[serde(flatten)]
    endpoint: EndpointOut,
    health: Option<HealthOut>,
}

/// A page of endpoints in creation order; `next_after` is null on the last page.
#[derive(Serialize, ToSchema)]
pub(crate) struct EndpointPage {
    data: Vec<EndpointItem>,
    next_after: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/endpoints", tag = "endpoints", operation_id = "list_endpoints",
    params(TenantPath, EndpointQuery),
    responses((status = 200, description = "A page of the tenant's endpoints", body = EndpointPage)),
    security(("tenant_token" = ["read"]), ("admin_token" = [])),
)]
pub(crate) async fn list_endpoints(
    State(state): State<Arc<AppState>>,
    auth: TenantAuth<Read>,
    Query(q): Query<EndpointQuery>,
) -> Result<Json<EndpointPage>, ApiError> {
    let tenant = &auth.tenant;
    let limit = page_limit(q.limit)?;
    let after = q.after.map(EndpointId::from_stored);
    if let Some(name) = q.plugin.as_deref().filter(|n| !crate::plugin::is_slug(n)) {
        return Err(super::extract::bad_query(format!("plugin: {name:?} is not a plugin name (1-64 of [a-z0-9_-])")));
    }
    // A portal session limited to some endpoints finds the others absent.
    let (app, plugin, reach) = (&*state, q.plugin.as_deref(), &auth.reach);
    let (endpoints, next_after) =
        super::reach::narrowed(
            limit,
            after,
            |after: Option<EndpointId>| async move {
                Ok(app.store.endpoint_page(tenant, after.as_ref(), limit, plugin).await?)
            },
            |mut page: Vec<Endpoint>| async move {
                page.retain(|e| reach.sees(&e.id));
                Ok(page)
            },
            |e| e.id.clone(),
        )
        .await?;
    let next_after = next_after.map(|id| id.to_string());
    // Read for every page (one statement): each endpoint's delivery status needs its
    // latest failed attempt; the rest of its health is shown when asked for.
    let now = state.clock.now();
    let health = page_health(&state, &endpoints).await?;
    let data = endpoints
        .iter()
        .zip(health)
        .map(|(e, h)| EndpointItem {
            endpoint: view(e, status_view(e, &h, now)),
            health: (q.health == Some(true)).then(|| health_view(e, &h)),
        })
        .collect();
    Ok(Json(EndpointPage { data, next_after }))
}
