//! Validation of what tenants and producers store: the size limits of every stored text
//! field and the rules of an endpoint's spec, shared by the API, `config` and `ops`. It
//! composes the policies (`schedule`, `pace`, `sign`, `net`), so it sits above them. Pure:
//! no I/O, no clock.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use crate::model::{
    AmqpTarget, EndpointKind, EndpointSpec, HttpTarget, NatsTarget, RedisTarget, SecretEntry, ShapeError,
    TEMPLATE_PLACEHOLDERS, Target, validate_type_filter,
};
use crate::schedule::{RetryOverride, RetryPolicy};

/// Longest endpoint URL, in bytes.
pub const MAX_URL: usize = 2048;
/// Longest endpoint description, in bytes.
pub const MAX_DESCRIPTION: usize = 1024;
/// Most entries in an endpoint's `event_types` filter.
pub const MAX_EVENT_TYPES: usize = 100;
/// Most custom headers on an endpoint.
pub const MAX_HEADERS: usize = 20;
/// Longest endpoint `user_agent`, in bytes.
pub const MAX_USER_AGENT: usize = 256;
/// Longest custom header name, in bytes.
pub const MAX_HEADER_NAME: usize = 128;
/// Longest custom header value, in bytes (sent on every attempt).
pub const MAX_HEADER_VALUE: usize = 2048;
/// Longest tenant name, in bytes.
pub const MAX_TENANT_NAME: usize = 256;
/// Longest free-text filter value (a replay's `endpoint`, `type`, `reason`), in bytes.
pub const MAX_FILTER_TEXT: usize = 256;

/// A refused field: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct SpecError {
    pub field: String,
    pub reason: String,
}

impl SpecError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        SpecError { field: field.into(), reason: reason.into() }
    }
}

/// What an endpoint spec is checked against that comes from configuration.
#[derive(Debug, Clone, Copy)]
pub struct SpecRules<'a> {
    /// The node's retry policy, which a per-endpoint override must still make valid.
    pub retry: &'a RetryPolicy,
    /// The longest total request deadline allowed.
    pub max_timeout: Duration,
    /// Whether IP-literal URLs may name private, loopback or link-local addresses.
    pub allow_private_destinations: bool,
}

/// Free text every backend stores alike: at most `max` bytes and no NUL (Postgres `text`
/// cannot hold one; Rust strings are valid UTF-8 already).
pub fn check_text(field: &str, value: &str, max: usize) -> Result<(), SpecError> {
    if value.len() > max {
        return Err(SpecError::new(field, format!("is {} bytes, over the limit of {max}", value.len())));
    }
    if value.contains('\0') {
        return Err(SpecError::new(field, "must not contain a NUL character"));
    }
    Ok(())
}

/// A webhook URL: http(s), a host, no credentials, at most [`MAX_URL`] bytes, and (unless
/// allowed) no IP literal the SSRF guard would refuse anyway. Returns it normalised.
pub fn validate_url(raw: &str, allow_private: bool) -> Result<String, SpecError> {
    check_url("url", raw, allow_private)
}

/// [`validate_url`] for the URL in `field` (an endpoint's `url`, an OAuth2 `token_url`).
pub fn check_url(field: &str, raw: &str, allow_private: bool) -> Result<String, SpecError> {
    check_url_of(field, raw, allow_private, EndpointKind::Http)
}

/// An endpoint URL for a destination of `kind`: one of its schemes (`http(s)`, `redis(s)`,
/// `nats`/`tls`, `amqp(s)`), a host, no credentials (they are write-only fields), and the
/// SSRF rules of a webhook URL.
pub fn check_url_of(field: &str, raw: &str, allow_private: bool, kind: EndpointKind) -> Result<String, SpecError> {
    let err = |reason: String| SpecError::new(field, reason);
    check_text(field, raw, MAX_URL)?;
    let url = url::Url::parse(raw).map_err(|e| err(format!("{raw:?} is not a URL ({e})")))?;
    if !kind.schemes().contains(&url.scheme()) {
        let schemes = kind.schemes().join(" or ");
        return Err(err(format!("scheme must be {schemes} for kind {}, not {:?}", kind.as_str(), url.scheme())));
    }
    // The URL standard reads `http:///x`, `http:/x` and `http:\\x` as `http://x/`: what is
    // stored must be what was written, so the text itself must be `scheme://host…`.
    let written = raw.split_once("://").filter(|(scheme, rest)| {
        scheme.eq_ignore_ascii_case(url.scheme()) && !rest.is_empty() && !rest.starts_with(['/', '\\'])
    });
    if written.is_none() {
        return Err(err(format!("{raw:?} does not start with scheme://host")));
    }
    let host = url.host().ok_or_else(|| err("missing host".into()))?;
    if !url.username().is_empty() || url.password().is_some() {
        let instead = if kind.is_http() { "headers" } else { "destination.username and destination.password" };
        return Err(err(format!("credentials in the URL are not allowed; use {instead}")));
    }
    let ip = match host {
        url::Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
        url::Host::Domain(d) if d.eq_ignore_ascii_case("localhost") => Some(Ipv4Addr::LOCALHOST.into()),
        // A broker URL's scheme is not special to the URL standard: its IP host is a name.
        url::Host::Domain(d) => d.trim_matches(['[', ']']).parse().ok(),
    };
    if let Some(ip) = ip
        && !allow_private
        && crate::net::is_forbidden(ip)
    {
        return Err(err(format!(
            "{ip} is a private, loopback or link-local address (see delivery.allow_private_destinations)"
        )));
    }
    // Normalising percent-encodes, so the stored form is checked too.
    let normalised = url.to_string();
    check_text(field, &normalised, MAX_URL)?;
    Ok(normalised)
}

/// Total and connect deadlines: `0 < connect ≤ timeout ≤ max`.
pub fn check_timeouts(timeout: Duration, connect: Duration, max: Duration) -> Result<(), SpecError> {
    if timeout.is_zero() || timeout > max {
        return Err(SpecError::new("timeout", format!("must be between 1ms and {}", humantime::format_duration(max))));
    }
    if connect.is_zero() || connect > timeout {
        return Err(SpecError::new("connect_timeout", "must be positive and at most timeout"));
    }
    Ok(())
}

/// One custom header: a valid name that neither Herald nor the HTTP layer owns (nor
/// `content-type`, which belongs to the body's producer), and a valid value, both within
/// their size limits.
pub fn check_header(name: &str, value: &str) -> Result<(), SpecError> {
    if name.len() > MAX_HEADER_NAME {
        return Err(SpecError::new("headers", format!("a name is over the limit of {MAX_HEADER_NAME} bytes")));
    }
    let parsed = http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| SpecError::new("headers", format!("{name:?} is not a header name")))?;
    let field = format!("headers.{name}");
    if crate::net::headers::is_reserved(parsed.as_str()) || parsed == http::header::CONTENT_TYPE {
        return Err(SpecError::new(field, "is set by Herald or the HTTP client; choose another name"));
    }
    check_text(&field, value, MAX_HEADER_VALUE)?;
    // The rule a plugin's headers follow too (WIT `header`): what every receiver and proxy
    // reads the same way. `http` would also take tabs and raw non-ASCII bytes.
    if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(SpecError::new(field, "must be visible ASCII or spaces (no tab, control or non-ASCII character)"));
    }
    Ok(())
}

impl EndpointSpec {
    /// Checks the whole spec: URL, description, filter, pacing, deadlines, retry override,
    /// custom headers and secrets. Plugin bindings are resolved by the caller, which knows
    /// the tenant's plugins.
    pub fn validate(&self, rules: &SpecRules<'_>) -> Result<(), SpecError> {
        let allow_private = rules.allow_private_destinations;
        if !self.target.kind().is_pull() {
            check_url_of("url", self.target.url(), allow_private, self.target.kind())?;
        }
        match &self.target {
            Target::Http(_) | Target::Poll(_) | Target::Listen(_) => {}
            Target::RedisStream(t) => check_redis(t)?,
            Target::Nats(t) => check_nats(t)?,
            Target::Amqp(t) => check_amqp(t)?,
        }
        check_text("description", &self.description, MAX_DESCRIPTION)?;
        if self.event_types.len() > MAX_EVENT_TYPES {
            return Err(SpecError::new("event_types", format!("at most {MAX_EVENT_TYPES} entries")));
        }
        for t in &self.event_types {
            validate_type_filter(t).map_err(|reason| SpecError::new("event_types", reason))?;
        }
        crate::pace::Pacer::try_new(self.rate_per_sec, self.burst, self.max_in_flight)
            .map_err(|e| SpecError::new(e.field(), e.to_string()))?;
        check_timeouts(
            Duration::from_millis(self.timeout_ms),
            Duration::from_millis(self.connect_timeout_ms),
            rules.max_timeout,
        )?;
        let retry = |e: crate::schedule::PolicyError| SpecError::new(format!("retry.{}", e.field()), e.to_string());
        rules.retry.with_override(&RetryOverride::from_doc(&self.retry).map_err(retry)?).map_err(retry)?;
        if self.headers.len() > MAX_HEADERS {
            return Err(SpecError::new("headers", format!("at most {MAX_HEADERS} custom headers")));
        }
        for (name, value) in &self.headers {
            check_header(name, value)?;
        }
        for s in &self.secrets {
            check_secret(s)?;
        }
        if let Some(source) = self.cloudevents.as_ref().and_then(|c| c.source.as_deref()) {
            check_ce_source(source)?;
        }
        if let Some(batch) = &self.batch {
            check_batch(batch, self)?;
        }
        check_pins(self)?;
        match &self.target {
            Target::Http(t) => check_http(t, &self.headers, allow_private),
            Target::Poll(_) => check_poll(self),
            _ => Ok(()),
        }
    }
}

/// The most event types an endpoint pins.
pub const MAX_PINS: usize = 100;

/// An endpoint's `payload_versions`: at most [`MAX_PINS`] event type names, each pinned to
/// version 1 or more (whether the catalog has it is the API's check, at write), on a
/// pushing endpoint without batching (a poll page and a batch are built without adapters).
fn check_pins(spec: &EndpointSpec) -> Result<(), SpecError> {
    if spec.payload_versions.is_empty() {
        return Ok(());
    }
    if spec.payload_versions.len() > MAX_PINS {
        return Err(SpecError::new("payload_versions", format!("at most {MAX_PINS} event types")));
    }
    for (event_type, version) in &spec.payload_versions {
        let field = format!("payload_versions.{event_type}");
        crate::model::validate_event_type(event_type).map_err(|e| SpecError::new(&field, e.to_string()))?;
        if *version < 1 {
            return Err(SpecError::new(field, "must be a schema version: 1 or more"));
        }
    }
    if spec.batch.is_some() {
        return Err(SpecError::new("payload_versions", "does not go with batch (a batch is not converted)"));
    }
    if spec.target.kind().is_pull() {
        return Err(SpecError::new("payload_versions", "kind poll takes payloads as posted"));
    }
    Ok(())
}

/// A `poll` endpoint's spec: no plugins (they shape, sign and judge pushes; a page carries
/// the envelope, or the CloudEvent, signed the Standard Webhooks way).
fn check_poll(spec: &EndpointSpec) -> Result<(), SpecError> {
    let p = &spec.plugins;
    let bound = [("plugins.transform", &p.transform), ("plugins.classify", &p.classify), ("plugins.sign", &p.sign)];
    match bound.into_iter().find(|(_, name)| name.is_some()) {
        Some((field, _)) => Err(SpecError::new(field, "kind poll runs no plugins: they shape and judge pushes")),
        None => Ok(()),
    }
}

/// A `v1` secret parses; a `v1a` key's public key parses and, while its secret is in clear
/// (not yet sealed), is that secret's. A sealed one is opened when it signs.
fn check_secret(s: &SecretEntry) -> Result<(), SpecError> {
    use crate::sign::v1a::{PublicKey, SECRET_KEY_PREFIX, SigningKey};
    let Some(public) = &s.public_key else {
        return crate::sign::Secret::parse(&s.secret).map(drop).map_err(|e| SpecError::new("secret", e.to_string()));
    };
    let public = PublicKey::parse(public).map_err(|e| SpecError::new("signing_key", format!("the public key {e}")))?;
    if s.secret.starts_with(SECRET_KEY_PREFIX) {
        let key = SigningKey::parse(&s.secret).map_err(|e| SpecError::new("signing_key", e.to_string()))?;
        if key.public_key() != public {
            return Err(SpecError::new("signing_key", "is not the key of its stored public key"));
        }
    }
    Ok(())
}

impl From<ShapeError> for SpecError {
    fn from(e: ShapeError) -> SpecError {
        SpecError::new(e.field, e.reason)
    }
}

/// An HTTP target's own settings: its `User-Agent`, its proxy, and its OAuth2 credentials
/// (which own the `authorization` header).
fn check_http(
    t: &HttpTarget,
    headers: &std::collections::BTreeMap<String, String>,
    allow_private: bool,
) -> Result<(), SpecError> {
    if let Some(ua) = &t.user_agent {
        check_user_agent(ua)?;
    }
    if let Some(p) = &t.proxy
        && p != "none"
    {
        check_text("proxy", p, MAX_URL)?;
        crate::net::proxy::ProxyUrl::parse(p).map_err(|e| SpecError::new("proxy", format!("{e} (or \"none\")")))?;
    }
    if let Some(auth) = &t.oauth2 {
        check_oauth2(auth, allow_private)?;
        if headers.keys().any(|k| k.eq_ignore_ascii_case("authorization")) {
            return Err(SpecError::new("headers.authorization", "is the OAuth2 token's; remove it or oauth2"));
        }
    }
    Ok(())
}

/// An endpoint's CloudEvents `source`: a URI reference of 1 to [`MAX_DESTINATION_TEXT`]
/// bytes of visible ASCII, whose only placeholder is `{tenant}`.
pub fn check_ce_source(source: &str) -> Result<(), SpecError> {
    let field = "cloudevents.source";
    check_text(field, source, MAX_DESTINATION_TEXT)?;
    if source.is_empty() || !source.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(SpecError::new(field, "must be a URI reference: visible ASCII without spaces, not empty"));
    }
    if source.replace("{tenant}", "x").contains(['{', '}']) {
        return Err(SpecError::new(field, "knows only the placeholder {tenant}"));
    }
    Ok(())
}

/// An endpoint's batching: its bounds, on an HTTP endpoint with Standard Webhooks' envelope
/// (one request for the batch; CloudEvents' batched mode is not built) or on a broker
/// endpoint (a pipelined round of messages, each its own, so CloudEvents go as they would
/// alone). Not on `poll` (its consumer reads pages of its own size) nor `listen` (one
/// developer's listener, one request at a time).
fn check_batch(batch: &crate::model::Batching, spec: &EndpointSpec) -> Result<(), SpecError> {
    batch.check().map_err(|e| SpecError::new(e.field, e.reason))?;
    let kind = spec.target.kind();
    if !kind.is_http() && !kind.is_broker() {
        let why = format!("is only for kinds http, redis-stream, nats and amqp, not {}", kind.as_str());
        return Err(SpecError::new("batch", why));
    }
    if kind.is_http() && spec.cloudevents.is_some() {
        return Err(SpecError::new("batch", "does not go with cloudevents on kind http"));
    }
    Ok(())
}

/// Longest destination template or name (stream, subject, exchange, routing key), in bytes.
pub const MAX_DESTINATION_TEXT: usize = 256;

/// An endpoint's `User-Agent`: 1 to [`MAX_USER_AGENT`] bytes of printable ASCII (what every
/// receiver and proxy reads the same way).
pub fn check_user_agent(ua: &str) -> Result<(), SpecError> {
    if ua.is_empty() || ua.len() > MAX_USER_AGENT {
        return Err(SpecError::new("user_agent", format!("must be 1-{MAX_USER_AGENT} bytes, not {}", ua.len())));
    }
    if !ua.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(SpecError::new("user_agent", "must be printable ASCII (no tab, control or non-ASCII character)"));
    }
    Ok(())
}

/// A Redis target's own settings: its stream template, a positive `maxlen`. The password
/// is checked in clear when written, then sealed.
fn check_redis(t: &RedisTarget) -> Result<(), SpecError> {
    check_template("destination.stream", &t.stream, EndpointKind::RedisStream)?;
    if t.maxlen == Some(0) {
        return Err(SpecError::new("destination.maxlen", "must be positive"));
    }
    check_username(t.username.as_deref())
}

/// A NATS target's own settings: its subject template, and a token or a username with its
/// password, not both.
fn check_nats(t: &NatsTarget) -> Result<(), SpecError> {
    check_template("destination.subject", &t.subject, EndpointKind::Nats)?;
    check_username(t.username.as_deref())?;
    if t.token.is_some() && (t.username.is_some() || t.password.is_some()) {
        return Err(SpecError::new("destination.token", "is instead of username and password, not with them"));
    }
    check_password_user(t.password.is_some(), t.username.as_deref())
}

/// An AMQP target's own settings: its routing key template, exchange and credentials.
fn check_amqp(t: &AmqpTarget) -> Result<(), SpecError> {
    check_template("destination.routing_key", &t.routing_key, EndpointKind::Amqp)?;
    if let Some(x) = &t.exchange {
        check_text("destination.exchange", x, MAX_DESTINATION_TEXT)?;
    }
    check_username(t.username.as_deref())?;
    check_password_user(t.password.is_some(), t.username.as_deref())
}

fn check_username(username: Option<&str>) -> Result<(), SpecError> {
    match username {
        Some(u) => check_text("destination.username", u, MAX_DESTINATION_TEXT),
        None => Ok(()),
    }
}

/// A password needs its username (Redis alone takes a password by itself).
fn check_password_user(password: bool, username: Option<&str>) -> Result<(), SpecError> {
    match password && username.is_none() {
        true => Err(SpecError::new("destination.username", "is required with destination.password")),
        false => Ok(()),
    }
}

/// A destination template: not empty, visible ASCII, only the known `{…}` placeholders; a
/// NATS subject has no spaces or wildcards (`*`, `>`) and no empty token.
fn check_template(field: &str, template: &str, kind: EndpointKind) -> Result<(), SpecError> {
    check_text(field, template, MAX_DESTINATION_TEXT)?;
    if template.is_empty() {
        return Err(SpecError::new(field, "must not be empty"));
    }
    if !template.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(SpecError::new(field, "must be visible ASCII without spaces"));
    }
    let mut rest = template.to_string();
    for p in TEMPLATE_PLACEHOLDERS {
        rest = rest.replace(p, "x");
    }
    if rest.contains(['{', '}']) {
        return Err(SpecError::new(field, "knows only the placeholders {type} and {tenant}"));
    }
    if kind == EndpointKind::Nats && (rest.contains(['*', '>']) || rest.split('.').any(str::is_empty)) {
        return Err(SpecError::new(field, "must be a NATS subject without wildcards or empty tokens"));
    }
    Ok(())
}

/// Longest PEM text (a certificate chain, a key, a CA bundle), in bytes.
pub const MAX_PEM: usize = 64 * 1024;

/// An endpoint's TLS material as written (the key in clear, before it is sealed): PEM
/// certificates that parse, a leaf that has not expired at `now` (Unix seconds), a key
/// that rustls can sign with and that matches the leaf, CA certificates usable as trust
/// anchors. A certificate needs its key and a key its certificate.
pub fn check_tls(cert: Option<&str>, key: Option<&str>, ca: Option<&str>, now: i64) -> Result<(), SpecError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs = |field: &str, pem: &str| -> Result<Vec<CertificateDer<'static>>, SpecError> {
        check_text(field, pem, MAX_PEM)?;
        let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SpecError::new(field, format!("is not PEM: {}", pem_reason(&e))))?;
        match certs.is_empty() {
            true => Err(SpecError::new(field, "holds no PEM CERTIFICATE")),
            false => Ok(certs),
        }
    };
    match (cert, key) {
        (Some(_), None) => return Err(SpecError::new("tls.client_key", "is required with tls.client_cert")),
        (None, Some(_)) => return Err(SpecError::new("tls.client_cert", "is required with tls.client_key")),
        _ => {}
    }
    if let (Some(cert), Some(key)) = (cert, key) {
        let chain = certs("tls.client_cert", cert)?;
        // The parser's own error is its internals (`Parsing Error: Error(Der(…))`).
        let (_, leaf) = x509_parser::parse_x509_certificate(&chain[0]).map_err(|_| {
            SpecError::new("tls.client_cert", "holds a CERTIFICATE section that is not an X.509 certificate")
        })?;
        let not_after = leaf.validity().not_after.timestamp();
        if not_after <= now {
            return Err(SpecError::new("tls.client_cert", format!("expired at {}", leaf.validity().not_after)));
        }
        check_text("tls.client_key", key, MAX_PEM)?;
        let der = PrivateKeyDer::from_pem_slice(key.as_bytes())
            .map_err(|_| SpecError::new("tls.client_key", "is not a PEM private key (PKCS#8, PKCS#1 or SEC1)"))?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&der)
            .map_err(|e| SpecError::new("tls.client_key", format!("is not a usable key ({e})")))?;
        // `Unknown` (a key type whose public half rustls cannot derive) is let through: the
        // receiver's handshake is the judge then.
        let matched = rustls::sign::CertifiedKey::new(chain, signer).keys_match();
        if let Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) = matched {
            return Err(SpecError::new("tls.client_key", "does not match tls.client_cert"));
        }
    }
    if let Some(ca) = ca {
        let mut roots = rustls::RootCertStore::empty();
        for c in certs("tls.ca_bundle", ca)? {
            roots.add(c).map_err(|e| SpecError::new("tls.ca_bundle", format!("holds an unusable CA ({e})")))?;
        }
    }
    Ok(())
}

/// Why PEM text does not parse, in words (the parser's own text shows the markers it
/// missed as lists of byte values).
pub fn pem_reason(e: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error;
    let text = |bytes: &[u8]| {
        let s = String::from_utf8_lossy(bytes);
        let s = s.trim();
        if s.chars().count() > 80 { format!("{}…", s.chars().take(80).collect::<String>()) } else { s.to_string() }
    };
    match e {
        // `end_marker` is the section's label (`CERTIFICATE`).
        Error::MissingSectionEnd { end_marker } => {
            format!("a section has no \"-----END {}-----\" line", text(end_marker))
        }
        Error::IllegalSectionStart { line } => format!("malformed section start {:?}", text(line)),
        Error::Base64Decode(_) => "a section's body is not valid base64".into(),
        Error::NoItemsFound => "no PEM section found".into(),
        Error::SectionTooLarge => "a section is over 256 MB".into(),
        other => other.to_string(),
    }
}

/// Longest OAuth2 client id, client secret, scope or audience, in bytes.
pub const MAX_OAUTH2_TEXT: usize = 1024;
/// Most OAuth2 scopes.
pub const MAX_OAUTH2_SCOPES: usize = 32;

/// An OAuth2 client secret as written (in clear): visible ASCII or spaces, required.
pub fn check_oauth2_secret(secret: &str) -> Result<(), SpecError> {
    visible("oauth2.client_secret", secret, false)
}

/// An OAuth2 text field: at most `MAX_OAUTH2_TEXT` bytes of visible ASCII or spaces.
fn visible(field: &str, v: &str, may_be_empty: bool) -> Result<(), SpecError> {
    check_text(field, v, MAX_OAUTH2_TEXT)?;
    if v.is_empty() && !may_be_empty {
        return Err(SpecError::new(field, "is required"));
    }
    if !v.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(SpecError::new(field, "must be visible ASCII or spaces"));
    }
    Ok(())
}

/// OAuth2 client credentials: a token URL the SSRF rules allow (the same as an endpoint's
/// URL), a client id and secret of visible ASCII (RFC 6749 §A.1, A.2), scopes as the RFC
/// spells them (§3.3: no space, quote or backslash), an audience of visible ASCII.
pub fn check_oauth2(auth: &crate::model::OAuth2, allow_private: bool) -> Result<(), SpecError> {
    check_url("oauth2.token_url", &auth.token_url, allow_private)?;
    visible("oauth2.client_id", &auth.client_id, false)?;
    // A sealed secret was checked in clear before it was sealed.
    if !auth.client_secret_sealed {
        check_oauth2_secret(auth.client_secret.expose())?;
    }
    if auth.scopes.len() > MAX_OAUTH2_SCOPES {
        return Err(SpecError::new("oauth2.scopes", format!("at most {MAX_OAUTH2_SCOPES} scopes")));
    }
    for scope in &auth.scopes {
        check_text("oauth2.scopes", scope, MAX_OAUTH2_TEXT)?;
        let ok = !scope.is_empty()
            && scope.bytes().all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b));
        if !ok {
            return Err(SpecError::new(
                "oauth2.scopes",
                format!("{scope:?} is not a scope (RFC 6749 3.3: no space, quote or backslash)"),
            ));
        }
    }
    if let Some(aud) = &auth.audience {
        visible("oauth2.audience", aud, false)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_spec_needs_no_url_and_takes_no_plugin() {
        let retry = crate::schedule::RetryPolicy::default();
        let rules =
            SpecRules { retry: &retry, max_timeout: Duration::from_secs(30), allow_private_destinations: false };
        let mut spec = EndpointSpec::for_test("");
        spec.target = Target::Poll(crate::model::PollTarget {});
        assert_eq!(spec.validate(&rules), Ok(()));
        spec.plugins.sign = Some("mine".into());
        assert_eq!(spec.validate(&rules).unwrap_err().field, "plugins.sign");
    }

    #[test]
    fn text_limits_and_nul() {
        assert!(check_text("f", "ok", 2).is_ok());
        assert_eq!(check_text("f", "abc", 2).unwrap_err().field, "f");
        assert!(check_text("f", "a\0", 9).is_err());
    }

    #[test]
    fn headers_policy_and_limits() {
        assert!(check_header("x-api-key", "v").is_ok());
        for bad in ["herald-tenant", "Webhook-Id", "host", "content-type", "user-agent", "bad name"] {
            assert!(check_header(bad, "v").is_err(), "{bad}");
        }
        assert!(check_header("x-big", &"v".repeat(MAX_HEADER_VALUE + 1)).is_err());
        assert!(check_header("x-words", "Bearer a b~c").is_ok());
        for bad in ["a\tb", "caf\u{e9}", "a\u{7f}", "a\r\nx-evil: 1"] {
            let err = check_header("x-key", bad).unwrap_err();
            assert!(err.to_string().contains("visible ASCII or spaces"), "{bad:?}: {err}");
        }
        assert!(check_header(&"x".repeat(MAX_HEADER_NAME + 1), "v").is_err());
    }

    #[test]
    fn user_agents_are_printable_ascii_of_bounded_length() {
        assert!(check_user_agent("acme-hooks/2.0 (+https://acme.example)").is_ok());
        assert!(check_user_agent(&"u".repeat(MAX_USER_AGENT)).is_ok());
        for bad in ["", "caf\u{e9}", "a\tb", "a\r\nx-evil: 1", &"u".repeat(MAX_USER_AGENT + 1)] {
            let e = check_user_agent(bad).unwrap_err();
            assert!(e.to_string().starts_with("user_agent: "), "{bad:?}: {e}");
        }
    }

    #[test]
    fn cloudevents_sources_are_uri_references_with_only_the_tenant_placeholder() {
        for good in ["/herald/tenants/{tenant}", "https://acme.example/hooks", "urn:acme:{tenant}"] {
            assert!(check_ce_source(good).is_ok(), "{good}");
        }
        for bad in ["", "a b", "/t/{type}", "caf\u{e9}", &"s".repeat(MAX_DESTINATION_TEXT + 1)] {
            let e = check_ce_source(bad).unwrap_err();
            assert_eq!(e.field, "cloudevents.source", "{bad:?}");
        }
    }

    #[test]
    fn urls() {
        assert!(validate_url("https://example.com/hook", false).is_ok());
        assert!(validate_url("http://127.0.0.1/hook", false).is_err());
        assert!(validate_url("http://127.0.0.1/hook", true).is_ok());
        assert!(validate_url(&format!("https://example.com/{}", "a".repeat(MAX_URL)), false).is_err());
        assert!(validate_url("ftp://example.com", false).is_err());
        assert!(validate_url("https://u:p@example.com", false).is_err());
        for hostless in ["http:///x", "http:/x", "http:x", "http:\\\\x/y", "https:////example.com", " http://x/"] {
            let e = validate_url(hostless, true).unwrap_err();
            assert!(e.reason.contains("does not start with scheme://host"), "{hostless:?}: {e}");
        }
    }

    #[test]
    fn broker_urls_take_their_kinds_schemes_and_the_ssrf_rules() {
        let redis = EndpointKind::RedisStream;
        assert!(check_url_of("url", "redis://cache.example.com:6379/0", false, redis).is_ok());
        assert!(check_url_of("url", "redis://127.0.0.1:6379", true, redis).is_ok());
        assert!(check_url_of("url", "redis://127.0.0.1:6379", false, redis).is_err());
        let wrong = check_url_of("url", "https://example.com", false, redis).unwrap_err();
        assert!(wrong.reason.contains("redis or rediss"), "{wrong}");
        let creds = check_url_of("url", "nats://u:p@example.com", false, EndpointKind::Nats).unwrap_err();
        assert!(creds.reason.contains("destination.username"), "{creds}");
        assert!(check_url_of("url", "amqp://mq.example.com/%2f", false, EndpointKind::Amqp).is_ok());
    }

    #[test]
    fn destination_templates() {
        let nats = EndpointKind::Nats;
        assert!(check_template("t", "herald.{tenant}.{type}", nats).is_ok());
        for bad in ["", "a b", "a.*", "a.>", "a..b", "{event}", "x{type"] {
            assert!(check_template("t", bad, nats).is_err(), "{bad:?}");
        }
        assert!(check_template("t", "stream:{type}", EndpointKind::RedisStream).is_ok());
        assert!(check_template("t", "a*b", EndpointKind::RedisStream).is_ok());
    }

    #[test]
    fn timeouts() {
        let s = Duration::from_secs;
        assert!(check_timeouts(s(2), s(2), s(30)).is_ok());
        assert_eq!(check_timeouts(s(31), s(1), s(30)).unwrap_err().field, "timeout");
        assert_eq!(check_timeouts(s(2), s(3), s(30)).unwrap_err().field, "connect_timeout");
        assert_eq!(check_timeouts(s(2), s(0), s(30)).unwrap_err().field, "connect_timeout");
    }
}
