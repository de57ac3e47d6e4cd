//! Outbound HTTP to webhook endpoints (hyper + rustls): connection reuse per endpoint,
//! separate connect and total deadlines, no redirects, the SSRF guard, and the first 1 KiB
//! of every response; and publishes to broker destinations (`broker`: Redis Streams, NATS
//! JetStream, AMQP, each client crate linked only in its own submodule). Architecture
//! invariant: the only module that talks to webhook endpoints and brokers. It decides
//! nothing about retries; it reports what happened.
//!
//! - `deliver/connect.rs`: the connector under TLS (one per pool: connect deadline and
//!   route): resolve, the SSRF guard (`net::is_forbidden`), then connect directly or
//!   `CONNECT` through a proxy to the checked address (`net/proxy.rs`: proxy URLs and the
//!   `no_proxy` rules, pure). A route with TLS material (`ClientTls`: an endpoint's client
//!   certificate, opened key and CA bundle) gets a pool of its own, keyed by the material's
//!   digest; `spec::check_tls` validates it when written, and `sign/seal.rs` seals the key
//!   under `[secrets] key` (AES-256-GCM, ring), and the OAuth2 client secret too
//!   (`worker/target.rs` opens them once per claim; `seal::open_oauth2` opens the secret for
//!   the API's token view: tokens are cached by the credentials in clear).
//! - `deliver/oauth.rs`: the node's OAuth2 token cache and the token request, through the
//!   same guarded client; `Deliverer::send_authorized` sends with the token and refreshes
//!   once on a 401; the worker turns a failed token request into `auth:token`
//!   (`classify::token_failed`).
//! - Broker destinations (`Deliverer::publish`): `deliver/broker.rs` and one submodule per
//!   client crate, which only it links (`tidy.rs`): `deliver/redis.rs` (XADD),
//!   `deliver/nats.rs` (JetStream publish, `Nats-Msg-Id`), `deliver/amqp.rs` (publisher
//!   confirms), and a batching endpoint's pipelined round of them (`Deliverer::publish_round`);
//!   the worker's `Transport::Broker` sends a broker endpoint's attempt through it,
//!   its password or token opened from `[secrets]` once per claim (`worker/target.rs`).
//! - `deliver/otlp.rs`: the span exporter's HTTP client (`telemetry`), Herald's hyper.
//! - `deliver/relay.rs`: `herald listen`'s connections (`Deliverer::relay`): a `listen`
//!   endpoint's request goes down its listener's connection and the answer the listener
//!   posts back is the attempt's outcome, as an HTTP answer would be.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::classify::{self, Outcome, Response, TransportErrorKind};
use crate::model::Millis;
use crate::net::is_forbidden;

mod amqp;
mod broker;
mod connect;
mod nats;
mod oauth;
pub mod otlp;
mod redis;
pub mod relay;
pub use broker::Message;
pub use connect::Via;
pub use oauth::{Authorized, Token, TokenState};

/// How much of a response body is kept with the attempt.
pub const BODY_PREFIX: usize = 1024;
/// How much of a response body is read (to keep the connection reusable) before giving up
/// on it; the most of it an exchange may keep (a batch's answer names the events refused).
pub const BODY_DRAIN: usize = 64 * 1024;

/// A request ready to go out.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    pub route: Route,
    /// Keep the response headers (only a classify plugin reads them; copying them on
    /// every answer is wasted work otherwise).
    pub keep_headers: bool,
    /// How much of the response body to keep: [`BODY_PREFIX`], or up to [`BODY_DRAIN`]
    /// when the answer is read (a batch's).
    pub keep_body: usize,
    /// The engine's time as it sends: an HTTP-date `Retry-After` is read against it.
    pub now: Millis,
}

/// How a request leaves the node: its deadlines (and, through them, its connection pool).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    pub connect_timeout: Duration,
    /// The total deadline of one request (not part of the pool's identity).
    pub timeout: Duration,
    pub via: Via,
    /// The endpoint's client certificate and private CA, if any.
    pub tls: Option<Arc<ClientTls>>,
}

/// An endpoint's TLS material, parsed: its client certificate chain and key, and CA
/// certificates trusted besides the public roots. Known by a digest (its pool's key);
/// `Debug` shows only that.
pub struct ClientTls {
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    roots: Vec<CertificateDer<'static>>,
    digest: [u8; 32],
}

impl ClientTls {
    /// Parses PEM (validated when written); `Err` says what no longer parses.
    pub fn from_pem(cert: Option<&str>, key: Option<&str>, ca: Option<&str>) -> Result<ClientTls, String> {
        use rustls_pki_types::pem::PemObject;
        use sha2::{Digest, Sha256};
        let certs = |pem: &str| {
            CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())
        };
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((
                certs(c)?,
                PrivateKeyDer::from_pem_slice(k.as_bytes()).map_err(|_| "the client key is not PEM".to_string())?,
            )),
            _ => None,
        };
        let mut h = Sha256::new();
        for part in [cert, key, ca] {
            h.update(part.map_or(0, |p| p.len() as u64 + 1).to_le_bytes());
            h.update(part.unwrap_or("").as_bytes());
        }
        Ok(ClientTls { identity, roots: ca.map(certs).transpose()?.unwrap_or_default(), digest: h.finalize().into() })
    }

    fn config(&self) -> Result<rustls::ClientConfig, rustls::Error> {
        let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
        for c in &self.roots {
            roots.add(c.clone())?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        match &self.identity {
            Some((chain, key)) => builder.with_client_auth_cert(chain.clone(), key.clone_key()),
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientTls({})", hex::encode(&self.digest[..4]))
    }
}

impl PartialEq for ClientTls {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

impl Eq for ClientTls {}

impl std::hash::Hash for ClientTls {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.digest.hash(state)
    }
}

/// What makes connections of two routes interchangeable: one pool each.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    connect_timeout: Duration,
    via: Via,
    tls: Option<Arc<ClientTls>>,
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<connect::Connector>, Full<Bytes>>;

/// The outbound HTTP client, one pool per route, and the node's OAuth2 tokens.
#[derive(Clone)]
pub struct Deliverer {
    allow_private: bool,
    clients: Arc<Mutex<HashMap<PoolKey, HttpsClient>>>,
    tokens: Arc<oauth::Tokens>,
    brokers: Arc<Brokers>,
    /// The `herald listen` connections this node holds.
    relay: Arc<relay::Relay>,
}

/// The broker connections of a node, one pool per kind.
#[derive(Default)]
struct Brokers {
    // `self::`: the submodules, not the client crates each of them alone links.
    redis: self::redis::Redis,
    nats: self::nats::Nats,
    amqp: self::amqp::Amqp,
}

#[derive(Debug, thiserror::Error)]
#[error("destination {0} is a private or loopback address")]
struct Blocked(IpAddr);

#[derive(Debug, thiserror::Error)]
#[error("dns: {0}")]
struct DnsFailed(String);

impl Deliverer {
    pub fn new(allow_private: bool) -> Deliverer {
        Deliverer {
            allow_private,
            clients: Arc::default(),
            tokens: Arc::default(),
            brokers: Arc::default(),
            relay: Arc::default(),
        }
    }

    /// The `herald listen` connections this node holds (`deliver/relay.rs`).
    pub fn relay(&self) -> &Arc<relay::Relay> {
        &self.relay
    }

    /// Publishes one message to a broker destination and waits for its acknowledgement
    /// (within `timeout`); the SSRF guard applies to the broker's host whenever a
    /// connection is opened, and the connection goes to the address it checked.
    pub async fn publish(&self, m: Message) -> Outcome {
        use crate::model::EndpointKind;
        let guard = broker::Guard { allow_private: self.allow_private };
        match m.kind {
            EndpointKind::RedisStream => self.brokers.redis.publish(&m, guard).await,
            EndpointKind::Nats => self.brokers.nats.publish(&m, guard).await,
            EndpointKind::Amqp => self.brokers.amqp.publish(&m, guard).await,
            EndpointKind::Http | EndpointKind::Poll | EndpointKind::Listen => {
                failed(TransportErrorKind::Other, "not a broker destination".into())
            }
        }
    }

    /// Publishes `messages`, one destination's (a batching endpoint's round), as one
    /// pipelined round: every message written to the destination's connection at once,
    /// then each one's acknowledgement awaited (Redis: one pipeline of `XADD`s; NATS: every
    /// publish, then the JetStream acks; AMQP: every publish, then the confirms). One
    /// outcome per message, in order; each message stays its own (headers, id, body).
    pub async fn publish_round(&self, messages: &[Message]) -> Vec<Outcome> {
        use crate::model::EndpointKind;
        let guard = broker::Guard { allow_private: self.allow_private };
        let Some(kind) = messages.first().map(|m| m.kind) else { return Vec::new() };
        match kind {
            EndpointKind::RedisStream => self.brokers.redis.publish_round(messages, guard).await,
            EndpointKind::Nats => self.brokers.nats.publish_round(messages, guard).await,
            EndpointKind::Amqp => self.brokers.amqp.publish_round(messages, guard).await,
            EndpointKind::Http | EndpointKind::Poll | EndpointKind::Listen => {
                vec![failed(TransportErrorKind::Other, "not a broker destination".into()); messages.len()]
            }
        }
    }

    /// The pool for `route`; `Err`: its TLS material does not make a TLS configuration.
    fn client(&self, route: &Route) -> Result<HttpsClient, rustls::Error> {
        let connect_timeout = route.connect_timeout;
        let key = PoolKey { connect_timeout, via: route.via.clone(), tls: route.tls.clone() };
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let tls = route.tls.as_ref().map(|t| t.config()).transpose()?;
        Ok(clients
            .entry(key)
            .or_insert_with(|| {
                let http =
                    connect::Connector { allow_private: self.allow_private, connect_timeout, via: route.via.clone() };
                let builder = hyper_rustls::HttpsConnectorBuilder::new();
                let builder = match tls {
                    Some(config) => builder.with_tls_config(config),
                    None => builder
                        .with_provider_and_webpki_roots(Arc::new(rustls::crypto::ring::default_provider()))
                        .expect("ring provider supports the default protocol versions"),
                };
                let https = builder.https_or_http().enable_http1().enable_http2().wrap_connector(http);
                Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(60))
                    .pool_max_idle_per_host(1024)
                    .build(https)
            })
            .clone())
    }

    /// Sends one request; never follows redirects; never outlives `timeout`.
    pub async fn send(&self, out: Outgoing) -> Outcome {
        let uri: http::Uri = match out.url.parse() {
            Ok(u) => u,
            Err(e) => return failed(TransportErrorKind::Other, format!("bad url: {e}")),
        };
        if let Err(blocked) = self.check_literal(&uri) {
            return failed(TransportErrorKind::Blocked, blocked);
        }
        let mut builder = http::Request::post(uri);
        for (k, v) in &out.headers {
            builder = builder.header(k.as_str(), v.as_str());
        }
        let request = match builder.body(Full::new(out.body)) {
            Ok(r) => r,
            Err(e) => return failed(TransportErrorKind::Other, format!("bad request: {e}")),
        };
        let client = match self.client(&out.route) {
            Ok(c) => c,
            Err(e) => return failed(TransportErrorKind::Tls, format!("the endpoint's TLS settings: {e}")),
        };
        let timeout = out.route.timeout;
        match tokio::time::timeout(timeout, exchange(client, request, (out.keep_headers, out.keep_body), out.now)).await
        {
            Ok(outcome) => outcome,
            Err(_) => failed(TransportErrorKind::Timeout, format!("no answer within {timeout:?}")),
        }
    }

    /// The SSRF guard for a URL whose host is an IP literal (names are checked as they
    /// resolve): `Err` names the refused address.
    fn check_literal(&self, uri: &http::Uri) -> Result<(), String> {
        match uri.host().and_then(|h| h.trim_matches(['[', ']']).parse::<IpAddr>().ok()) {
            Some(ip) if !self.allow_private && is_forbidden(ip) => Err(Blocked(ip).to_string()),
            _ => Ok(()),
        }
    }
}

fn failed(kind: TransportErrorKind, detail: String) -> Outcome {
    Outcome::Transport { kind, detail }
}

async fn exchange(
    client: HttpsClient,
    request: http::Request<Full<Bytes>>,
    (keep_headers, keep_body): (bool, usize),
    now: Millis,
) -> Outcome {
    let response = match client.request(request).await {
        Ok(r) => r,
        Err(e) => return failed(kind_of(&e), error_chain(&e)),
    };
    let status = response.status().as_u16();
    let headers: Vec<(String, String)> = match keep_headers {
        true => response
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect(),
        false => Vec::new(),
    };
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| classify::parse_retry_after(v, UNIX_EPOCH + Duration::from_millis(now.max(0) as u64)));
    let mut body = response.into_body();
    let mut kept = Vec::with_capacity(256);
    let mut read = 0usize;
    while read < BODY_DRAIN {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    read += data.len();
                    let room = keep_body.saturating_sub(kept.len());
                    kept.extend_from_slice(&data[..data.len().min(room)]);
                }
            }
            Some(Err(_)) | None => break,
        }
    }
    let body_prefix = String::from_utf8_lossy(&kept).into_owned();
    Outcome::Response(Response { status, retry_after, headers, body_prefix })
}

/// An error and its sources, `: `-separated.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The innermost of I/O errors wrapped in one another, and whether one of them carries a
/// TLS error. hyper-rustls wraps tokio-rustls' `io::Error` (which carries the handshake's
/// `rustls::Error`: an unknown issuer, an expired certificate, a wrong name) in another
/// `io::Error`, and `io::Error::source` skips the wrapped error: walking `source` alone
/// never meets the TLS error, and a certificate failure would be retried as `other`.
fn innermost_io(mut io: &std::io::Error) -> (&std::io::Error, bool) {
    loop {
        match io.get_ref() {
            Some(inner) if inner.is::<rustls::Error>() => return (io, true),
            Some(inner) => match inner.downcast_ref::<std::io::Error>() {
                Some(wrapped) => io = wrapped,
                None => return (io, false),
            },
            None => return (io, false),
        }
    }
}

/// Maps a client error to the kind the classification table speaks of.
fn kind_of(e: &(dyn std::error::Error + 'static)) -> TransportErrorKind {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut connect = false;
    while let Some(err) = cur {
        if err.is::<Blocked>() {
            return TransportErrorKind::Blocked;
        }
        if err.is::<DnsFailed>() {
            return TransportErrorKind::Dns;
        }
        if err.is::<connect::ProxyFailed>() {
            return TransportErrorKind::Other;
        }
        if err.is::<rustls::Error>() {
            return TransportErrorKind::Tls;
        }
        if let Some(ce) = err.downcast_ref::<hyper_util::client::legacy::Error>() {
            connect |= ce.is_connect();
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            let (io, tls) = innermost_io(io);
            if tls {
                return TransportErrorKind::Tls;
            }
            use std::io::ErrorKind::*;
            match io.kind() {
                ConnectionRefused => return TransportErrorKind::ConnectionRefused,
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => {
                    return TransportErrorKind::ConnectionReset;
                }
                TimedOut if connect => return TransportErrorKind::ConnectTimeout,
                TimedOut => return TransportErrorKind::Timeout,
                _ => {}
            }
        }
        if let Some(h) = err.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_canceled() || h.is_closed())
        {
            return TransportErrorKind::ConnectionReset;
        }
        cur = err.source();
    }
    TransportErrorKind::Other
}
