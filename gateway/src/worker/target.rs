//! An endpoint's material opened once per claim ([`Opened`]): its signing secrets parsed,
//! its sealed credentials opened (OAuth2 client secret, broker password or token, TLS client
//! key) and its TLS client configuration built; and from them how a request leaves
//! ([`Transport`]): an HTTP route (proxy, TLS), with or without OAuth2, a broker, or a
//! `herald listen` connection (`deliver/relay.rs`). What
//! does not open is an [`OpenError`], which says, in one place, why the endpoint is held.
//! It never judges an outcome.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::classify::{Outcome, TransportErrorKind};
use crate::config::DeliveryConfig;
use crate::deliver::relay::RelayRequest;
use crate::deliver::{ClientTls, Message, Outgoing, Route, Via};
use crate::model::{
    Destination, Endpoint, EndpointKind, EndpointSpec, EndpointTls, HttpTarget, Millis, OAuth2, SecretEntry,
    SentRequest, Target, WriteOnly, render_template,
};
use crate::net::proxy::ProxyUrl;
use crate::sign::Secret;
use crate::sign::seal::Sealer;
use crate::sign::v1a::{SECRET_KEY_PREFIX, SigningKey};
use crate::store::Claimed;

/// What a transport sends through: the node's client, its metrics and its clock.
#[derive(Clone, Copy)]
pub(in crate::worker) struct Through<'a> {
    pub(in crate::worker) deliverer: &'a crate::deliver::Deliverer,
    pub(in crate::worker) metrics: &'a crate::metrics::Metrics,
    pub(in crate::worker) clock: &'a crate::clock::Clock,
}

/// What an attempt of one claim sends with: the secrets that sign, and how it leaves.
pub(in crate::worker) struct Opened {
    /// The secrets valid at the claim's time, parsed.
    pub(in crate::worker) secrets: Vec<Secret>,
    /// The `v1a` (ed25519) keys valid at the claim's time, opened.
    pub(in crate::worker) signing_keys: Vec<SigningKey>,
    pub(in crate::worker) transport: Transport,
}

/// How an endpoint's requests leave the node, built once per claim.
pub(in crate::worker) enum Transport {
    /// An HTTP `POST` along `route`, with the node's token for `auth` when it has OAuth2
    /// credentials (opened), as `user_agent` if it has its own. `keep_headers`: a classify
    /// plugin reads the answer's headers; `keep_body`: how much of the answer's body to keep
    /// (more for a batching endpoint, whose receiver may name the events it refused).
    Http {
        url: String,
        route: Route,
        auth: Option<OAuth2>,
        user_agent: Option<String>,
        keep_headers: bool,
        keep_body: usize,
    },
    /// A publish to a broker, its credentials opened (the broker pool's key), to where
    /// `template` names for each event.
    Broker {
        kind: EndpointKind,
        url: String,
        destination: Arc<Destination>,
        template: String,
        connect_timeout: Duration,
        timeout: Duration,
    },
    /// Down the endpoint's listener connection on this node (kind `listen`); the answer the
    /// listener posts back within `timeout` is the outcome.
    Listen { endpoint: String, timeout: Duration, keep_headers: bool },
}

/// A sealed value of an endpoint's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::worker) enum Sealed {
    Password,
    Token,
    ClientSecret,
    ClientKey,
    SigningKey,
}

impl Sealed {
    /// Where it belongs and what it is, as a hold reason names it.
    fn named(self) -> &'static str {
        match self {
            Sealed::Password => "broker:auth: the password",
            Sealed::Token => "broker:auth: the token",
            Sealed::ClientSecret => "oauth2: the client secret",
            Sealed::ClientKey => "tls: the client key",
            Sealed::SigningKey => "signing_key: the signing key",
        }
    }
}

/// Why an endpoint's material does not open: the endpoint is held until a human fixes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::worker) enum OpenError {
    /// A sealed value on a node without a `[secrets] key`.
    NoKey(Sealed),
    /// The node's keys do not open it (sealed under another key, or not sealed at all).
    WrongKey { field: Sealed, why: String },
    /// The TLS material no longer parses.
    BadPem(String),
}

impl OpenError {
    /// The reason the endpoint is held with: the one place these words are made. A
    /// credential is to be written again; a TLS key that does not open says only why.
    pub(in crate::worker) fn hold_reason(&self) -> String {
        match self {
            OpenError::BadPem(e) => format!("tls: {e}"),
            OpenError::NoKey(Sealed::ClientKey) => "tls: the client key: no [secrets] key on this node".into(),
            OpenError::WrongKey { field: Sealed::ClientKey, why } => format!("tls: the client key: {why}"),
            OpenError::NoKey(field) => format!("{}: no [secrets] key on this node; write it again", field.named()),
            OpenError::WrongKey { field, why } => format!("{} {why}; write it again", field.named()),
        }
    }
}

impl Opened {
    /// Opens `endpoint`'s material at `now` with the node's `sealer` and delivery settings.
    pub(in crate::worker) fn open(
        endpoint: &Endpoint,
        delivery: &DeliveryConfig,
        sealer: Option<&Sealer>,
        now: Millis,
    ) -> Result<Opened, OpenError> {
        let secrets = endpoint.valid_secrets(now).filter_map(|s| Secret::parse(&s.secret).ok()).collect();
        let signing_keys = endpoint
            .valid_secrets(now)
            .filter(|s| s.is_v1a())
            .map(|s| signing_key(s, sealer))
            .collect::<Result<_, _>>()?;
        let spec = &endpoint.spec;
        let transport = match &spec.target {
            Target::Http(t) => http(spec, t, delivery, sealer)?,
            Target::Listen(_) => Transport::Listen {
                endpoint: endpoint.id.to_string(),
                timeout: deadlines(spec).timeout,
                keep_headers: spec.plugins.classify.is_some(),
            },
            broker => {
                let (kind, url, destination, _) = broker.clone().into_flat();
                let d = destination.unwrap_or_default();
                let opened = Destination {
                    password: open(Sealed::Password, d.password.as_ref(), sealer)?.map(WriteOnly::new),
                    token: open(Sealed::Token, d.token.as_ref(), sealer)?.map(WriteOnly::new),
                    ..d
                };
                let template = opened.template(kind).unwrap_or_default().to_string();
                let destination = Arc::new(opened);
                let Route { connect_timeout, timeout, .. } = deadlines(spec);
                Transport::Broker { kind, url, destination, template, connect_timeout, timeout }
            }
        };
        Ok(Opened { secrets, signing_keys, transport })
    }
}

/// A `v1a` key, opened when it is stored sealed (one in clear, not yet sealed, parses as is).
fn signing_key(entry: &SecretEntry, sealer: Option<&Sealer>) -> Result<SigningKey, OpenError> {
    let field = Sealed::SigningKey;
    let plain = match (entry.secret.starts_with(SECRET_KEY_PREFIX), sealer) {
        (true, _) => entry.secret.clone(),
        (false, Some(sealer)) => sealer.open(&entry.secret).map_err(|why| OpenError::WrongKey { field, why })?,
        (false, None) => return Err(OpenError::NoKey(field)),
    };
    SigningKey::parse(&plain).map_err(|e| OpenError::WrongKey { field, why: e.to_string() })
}

/// A sealed value opened (`None`: there is none).
fn open(field: Sealed, sealed: Option<&WriteOnly>, sealer: Option<&Sealer>) -> Result<Option<String>, OpenError> {
    match (sealed, sealer) {
        (None, _) => Ok(None),
        (Some(v), Some(sealer)) => sealer.open(v.expose()).map(Some).map_err(|why| OpenError::WrongKey { field, why }),
        (Some(_), None) => Err(OpenError::NoKey(field)),
    }
}

/// The spec's deadlines, the route's connection settings left direct.
fn deadlines(spec: &EndpointSpec) -> Route {
    Route {
        connect_timeout: Duration::from_millis(spec.connect_timeout_ms),
        timeout: Duration::from_millis(spec.timeout_ms),
        via: Via::Direct,
        tls: None,
    }
}

/// An HTTP target's transport: its deadlines, and its own proxy (guarded as a destination
/// is), none, or the node's (with `delivery.no_proxy`); its TLS material with the client
/// key opened; its OAuth2 client secret opened.
fn http(
    spec: &EndpointSpec,
    t: &HttpTarget,
    delivery: &DeliveryConfig,
    sealer: Option<&Sealer>,
) -> Result<Transport, OpenError> {
    let via = match t.proxy.as_deref() {
        Some("none") => Via::Direct,
        // Validated when written; one that no longer parses is not used.
        Some(url) => match ProxyUrl::parse(url) {
            Ok(p) => Via::Proxy { proxy: Arc::new(p), no_proxy: None, guarded: !delivery.allow_private_destinations },
            Err(_) => Via::Direct,
        },
        None => match &delivery.proxy {
            Some(p) => Via::Proxy { proxy: p.clone(), no_proxy: Some(delivery.no_proxy.clone()), guarded: false },
            None => Via::Direct,
        },
    };
    let tls = t.tls.as_ref().map(|tls| client_tls(tls, sealer)).transpose()?;
    let auth = match &t.oauth2 {
        Some(a) if a.client_secret_sealed => {
            let plain = open(Sealed::ClientSecret, Some(&a.client_secret), sealer)?.unwrap_or_default();
            Some(OAuth2 { client_secret: WriteOnly::new(plain), client_secret_sealed: false, ..a.clone() })
        }
        // Stored as written (before secrets were sealed, or on a node without a key).
        other => other.clone(),
    };
    let route = Route { via, tls, ..deadlines(spec) };
    let (url, user_agent, keep_headers) = (t.url.clone(), t.user_agent.clone(), spec.plugins.classify.is_some());
    let keep_body = if spec.batch.is_some() { crate::deliver::BODY_DRAIN } else { crate::deliver::BODY_PREFIX };
    Ok(Transport::Http { url, route, auth, user_agent, keep_headers, keep_body })
}

/// An endpoint's TLS material, its key opened, parsed into a client configuration.
fn client_tls(t: &EndpointTls, sealer: Option<&Sealer>) -> Result<Arc<ClientTls>, OpenError> {
    let key = open(Sealed::ClientKey, t.client_key.as_ref(), sealer)?;
    let tls = ClientTls::from_pem(t.client_cert.as_deref(), key.as_deref(), t.ca_bundle.as_deref());
    tls.map(Arc::new).map_err(OpenError::BadPem)
}

/// A request built (signed, its headers final), ready to leave.
pub(in crate::worker) struct Request {
    pub(in crate::worker) headers: Vec<(String, String)>,
    pub(in crate::worker) body: Vec<u8>,
    /// The body is still Herald's envelope (no transform changed it).
    pub(in crate::worker) is_envelope: bool,
}

/// What leaving produced.
pub(in crate::worker) enum Sent {
    /// What came back (an answer or a transport failure), and what was sent.
    Answered(Outcome, SentRequest),
    /// The token endpoint gave no token: nothing was sent.
    TokenFailed(String),
}

impl Transport {
    /// Sends `request` for `d` and waits for what comes back.
    pub(in crate::worker) async fn send(&self, via: Through<'_>, d: &Claimed, request: Request) -> Sent {
        let Request { mut headers, body, is_envelope } = request;
        match self {
            Transport::Listen { endpoint, timeout, keep_headers } => {
                let sent = SentRequest::new(&headers, &body, is_envelope);
                let attempt = d.attempts + 1;
                let (id, event, kind) = (d.id.to_string(), d.event_id.to_string(), d.event_type.clone());
                let request = RelayRequest::new(id, event, kind, attempt, headers, &body);
                let now = via.clock.now();
                let outcome = via.deliverer.relay().send(endpoint, request, *keep_headers, now, *timeout).await;
                via.metrics.attempts.inc();
                Sent::Answered(outcome, sent)
            }
            Transport::Broker { .. } => {
                let sent = SentRequest::new(&headers, &body, is_envelope);
                let message = self.message(d, headers, body).expect("a broker transport");
                let outcome = via.deliverer.publish(message).await;
                via.metrics.attempts.inc();
                Sent::Answered(outcome, sent)
            }
            Transport::Http { url, route, auth, user_agent, keep_headers, keep_body } => {
                if let Some(ua) = user_agent {
                    for (_, v) in headers.iter_mut().filter(|(k, _)| k.eq_ignore_ascii_case("user-agent")) {
                        v.clone_from(ua);
                    }
                }
                let out = |headers, body| Outgoing {
                    url: url.clone(),
                    headers,
                    body,
                    route: route.clone(),
                    keep_headers: *keep_headers,
                    keep_body: *keep_body,
                    now: via.clock.now(),
                };
                let Some(auth) = auth else {
                    // Headers encoded once; the body copied only when a transform changed it.
                    let sent = SentRequest::new(&headers, &body, is_envelope);
                    let outcome = via.deliverer.send(out(headers, Bytes::from(body))).await;
                    via.metrics.attempts.inc();
                    return Sent::Answered(outcome, sent);
                };
                let body = Bytes::from(body);
                let authorized = via.deliverer.send_authorized(out(headers, body.clone()), auth).await;
                for _ in 0..authorized.requests {
                    via.metrics.attempts.inc();
                }
                match authorized.outcome {
                    Ok(outcome) => Sent::Answered(outcome, SentRequest::new(&authorized.shown, &body, is_envelope)),
                    Err(e) => Sent::TokenFailed(e),
                }
            }
        }
    }
}

impl Transport {
    /// Publishes each of `requests` as its own message (its own headers, signature and
    /// dedupe id) in one pipelined round (a batching broker endpoint's); what came back
    /// for each, in order. Not a broker transport: each fails, nothing sent.
    pub(in crate::worker) async fn publish_round(
        &self,
        via: Through<'_>,
        requests: Vec<(&Claimed, Request)>,
    ) -> Vec<(Outcome, SentRequest)> {
        let mut sent = Vec::with_capacity(requests.len());
        let mut messages = Vec::with_capacity(requests.len());
        for (d, Request { headers, body, is_envelope }) in requests {
            sent.push(SentRequest::new(&headers, &body, is_envelope));
            messages.extend(self.message(d, headers, body));
        }
        if messages.len() < sent.len() {
            let not =
                || Outcome::Transport { kind: TransportErrorKind::Other, detail: "not a broker destination".into() };
            return sent.into_iter().map(|s| (not(), s)).collect();
        }
        let outcomes = via.deliverer.publish_round(&messages).await;
        via.metrics.attempts.inc();
        outcomes.into_iter().zip(sent).collect()
    }

    /// `d`'s message to the broker (`None`: not a broker transport).
    fn message(&self, d: &Claimed, headers: Vec<(String, String)>, body: Vec<u8>) -> Option<Message> {
        let Transport::Broker { kind, url, destination, template, connect_timeout, timeout } = self else {
            return None;
        };
        Some(Message {
            kind: *kind,
            url: url.clone(),
            destination: destination.clone(),
            target: render_template(template, &d.event_type, d.tenant.as_str()),
            dedupe_id: dedupe_id(d),
            first_attempt: d.attempts == d.attempt_base,
            headers,
            body: Bytes::from(body),
            connect_timeout: *connect_timeout,
            timeout: *timeout,
        })
    }
}

/// A delivery's id at a broker that dedupes on it: the delivery's own (one per tenant,
/// endpoint and event), and the replay's after a replay (a replay sends again on purpose),
/// so the same across the retries of one send and never shared by two deliveries.
fn dedupe_id(d: &Claimed) -> String {
    match &d.replay {
        Some(replay) => format!("{}:{replay}", d.id),
        None => d.id.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_reasons_name_what_does_not_open() {
        let wrong = |field| OpenError::WrongKey { field, why: "sealed under key k2".into() };
        let cases = [
            (
                OpenError::NoKey(Sealed::Password),
                "broker:auth: the password: no [secrets] key on this node; write it again",
            ),
            (wrong(Sealed::Token), "broker:auth: the token sealed under key k2; write it again"),
            (wrong(Sealed::ClientSecret), "oauth2: the client secret sealed under key k2; write it again"),
            (OpenError::NoKey(Sealed::ClientKey), "tls: the client key: no [secrets] key on this node"),
            (wrong(Sealed::ClientKey), "tls: the client key: sealed under key k2"),
            (OpenError::BadPem("the client key is not PEM".into()), "tls: the client key is not PEM"),
        ];
        for (e, want) in cases {
            assert_eq!(e.hold_reason(), want);
        }
    }
}
