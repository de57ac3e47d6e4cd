//! What the broker destinations share: the message a broker attempt publishes, one
//! connection per destination (by URL and credentials) connected once at a time, a
//! reconnect backoff that fails attempts fast (with the last error) while it lasts, and
//! the SSRF guard applied to a broker's host, each connection pinned to the address it
//! checked. No client crate is linked here.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::classify::{Outcome, TransportErrorKind};
use crate::model::{Destination, EndpointKind};
use crate::net::is_forbidden;

/// One message for a broker destination.
#[derive(Debug, Clone)]
pub struct Message {
    pub kind: EndpointKind,
    /// The broker's URL (no credentials: they are in `destination`).
    pub url: String,
    pub destination: Arc<Destination>,
    /// The rendered template: the stream, the subject or the routing key.
    pub target: String,
    /// The broker-side id of this delivery (JetStream's `Nats-Msg-Id`, AMQP's
    /// `message-id`): one per delivery (tenant, endpoint, event) and replay, the same on
    /// each of its retries. Never the webhook id alone: two deliveries of one event (two
    /// endpoints, or two tenants' `evt_1`) are two messages, and a broker that dedupes on
    /// the id would keep one. The webhook id travels in the `webhook-id` header.
    pub dedupe_id: String,
    /// No earlier attempt of this delivery (since its last replay) was made: a broker
    /// that says it already holds the id is not answering for this delivery.
    pub first_attempt: bool,
    /// The webhook headers (`webhook-id`, `webhook-timestamp`, `webhook-signature`, …).
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    pub connect_timeout: Duration,
    /// The deadline of the whole publish, its acknowledgement included.
    pub timeout: Duration,
}

/// What tells one destination's connection from another's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Key {
    url: String,
    destination: Arc<Destination>,
}

impl Key {
    pub(super) fn of(m: &Message) -> Key {
        Key { url: m.url.clone(), destination: m.destination.clone() }
    }
}

/// The first reconnect backoff and the longest.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// One connection per destination, of a client type `C` (cheap to clone: a handle).
pub(super) struct Pool<C> {
    slots: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<Slot<C>>>>>,
}

impl<C> Default for Pool<C> {
    fn default() -> Self {
        Pool { slots: Mutex::default() }
    }
}

struct Slot<C> {
    conn: Option<C>,
    failures: u32,
    /// Until when a new connect is not tried, and what the last one said.
    backoff: Option<(Instant, Outcome)>,
}

impl<C: Clone> Pool<C> {
    /// The destination's connection, connecting it if it has none (one connect at a time;
    /// others wait for it). While a failed connect's backoff lasts, `Err` repeats its error.
    pub(super) async fn get<F, Fut>(&self, key: &Key, connect: F) -> Result<C, Outcome>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, Outcome>>,
    {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(key.clone()).or_insert_with(|| Arc::new(tokio::sync::Mutex::new(Slot::new()))).clone()
        };
        let mut slot = slot.lock().await;
        if let Some(c) = &slot.conn {
            return Ok(c.clone());
        }
        if let Some((until, last)) = &slot.backoff
            && Instant::now() < *until
        {
            return Err(last.clone());
        }
        match connect().await {
            Ok(c) => {
                slot.conn = Some(c.clone());
                slot.failures = 0;
                slot.backoff = None;
                Ok(c)
            }
            Err(e) => {
                slot.failures = slot.failures.saturating_add(1);
                let wait = BACKOFF_FIRST.saturating_mul(1 << slot.failures.min(16).saturating_sub(1)).min(BACKOFF_MAX);
                slot.backoff = Some((Instant::now() + wait, e.clone()));
                Err(e)
            }
        }
    }

    /// Forgets the destination's connection (it failed): the next attempt connects anew.
    pub(super) async fn forget(&self, key: &Key) {
        let slot = self.slots.lock().unwrap_or_else(|e| e.into_inner()).get(key).cloned();
        if let Some(slot) = slot {
            slot.lock().await.conn = None;
        }
    }
}

impl<C> Slot<C> {
    fn new() -> Self {
        Slot { conn: None, failures: 0, backoff: None }
    }
}

/// A transport failure.
pub(super) fn failed(kind: TransportErrorKind, detail: impl Into<String>) -> Outcome {
    Outcome::Transport { kind, detail: detail.into() }
}

/// The broker's acknowledgement, as an attempt records it: a `200` whose body says what
/// the broker answered (the entry id, the stream sequence, the confirm).
pub(super) fn acknowledged(answer: String) -> Outcome {
    Outcome::Response(crate::classify::Response {
        status: 200,
        retry_after: None,
        headers: Vec::new(),
        body_prefix: answer,
    })
}

/// The SSRF guard of a node's broker connections.
#[derive(Debug, Clone, Copy)]
pub(super) struct Guard {
    pub(super) allow_private: bool,
}

impl Guard {
    /// The URL a new connection for `m` opens: every address the broker's host resolves
    /// to must be allowed, and the host is replaced by the first of them, so the client
    /// connects to the address checked and never resolves the name again (no DNS rebinding
    /// between the check and the connect, as for HTTP). A TLS URL (`rediss`, `tls`,
    /// `amqps`) keeps its name, which the handshake needs for SNI and the certificate check.
    /// With private destinations allowed there is nothing to check: the URL as written.
    pub(super) async fn pinned(&self, m: &Message) -> Result<String, Outcome> {
        if self.allow_private {
            return Ok(m.url.clone());
        }
        let mut url =
            url::Url::parse(&m.url).map_err(|e| failed(TransportErrorKind::Other, format!("bad url: {e}")))?;
        let port = url.port().unwrap_or(default_port(url.scheme()));
        let within = m.connect_timeout;
        let addrs: Vec<IpAddr> = match url.host() {
            Some(url::Host::Ipv4(ip)) => vec![ip.into()],
            Some(url::Host::Ipv6(ip)) => vec![ip.into()],
            Some(url::Host::Domain(name)) => {
                let found = tokio::time::timeout(within, tokio::net::lookup_host((name, port)))
                    .await
                    .map_err(|_| failed(TransportErrorKind::Dns, format!("{name}: no answer within {within:?}")))?
                    .map_err(|e| failed(TransportErrorKind::Dns, format!("{name}: {e}")))?;
                found.map(|a| a.ip()).collect()
            }
            None => return Err(failed(TransportErrorKind::Other, "bad url: no host")),
        };
        if let Some(ip) = addrs.iter().find(|ip| is_forbidden(**ip)) {
            let why = format!("destination {ip} is a private or loopback address");
            return Err(failed(TransportErrorKind::Blocked, why));
        }
        let first = *addrs.first().ok_or_else(|| failed(TransportErrorKind::Dns, "the host has no addresses"))?;
        Ok(pin(&mut url, first))
    }
}

/// `url` with its host replaced by `ip`, unless it is a TLS URL.
fn pin(url: &mut url::Url, ip: IpAddr) -> String {
    if !TLS_SCHEMES.contains(&url.scheme()) {
        // Only a URL without a host refuses one, and a parsed broker URL has one.
        let _ = url.set_ip_host(ip);
    }
    url.to_string()
}

/// The broker URL schemes that speak TLS: the client needs the host's name.
const TLS_SCHEMES: [&str; 3] = ["rediss", "tls", "amqps"];

/// A broker scheme's port when the URL names none.
fn default_port(scheme: &str) -> u16 {
    match scheme {
        "redis" | "rediss" => 6379,
        "nats" | "tls" => 4222,
        "amqps" => 5671,
        _ => 5672,
    }
}

/// The headers a broker message carries: the webhook headers, not the HTTP client's.
pub(super) fn message_headers(m: &Message) -> impl Iterator<Item = (&str, &str)> {
    m.headers.iter().filter(|(k, _)| !k.eq_ignore_ascii_case("user-agent")).map(|(k, v)| (k.as_str(), v.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(url: &str) -> Message {
        Message {
            kind: EndpointKind::RedisStream,
            url: url.to_string(),
            destination: Arc::default(),
            target: "s".into(),
            dedupe_id: "dlv_1".into(),
            first_attempt: true,
            headers: Vec::new(),
            body: Bytes::new(),
            connect_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(2),
        }
    }

    /// With the guard on, a name that resolves to a loopback address is refused before any
    /// connect, with the address in the reason; an allowed literal keeps its port and path.
    #[tokio::test]
    async fn the_guard_refuses_forbidden_addresses_and_pins_the_checked_one() {
        let guard = Guard { allow_private: false };
        for url in ["redis://localhost:6379", "nats://127.0.0.1:4222", "amqp://[::1]:5672/%2f", "rediss://localhost"] {
            match guard.pinned(&message(url)).await {
                Err(Outcome::Transport { kind: TransportErrorKind::Blocked, detail }) => {
                    assert!(detail.contains("is a private or loopback address"), "{url}: {detail}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        let public = guard.pinned(&message("amqp://93.184.216.34:5672/%2f")).await.unwrap();
        assert_eq!(public, "amqp://93.184.216.34:5672/%2f");
        // A name is replaced by the address checked; a TLS URL keeps it for the handshake.
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        for (url, want) in [
            ("redis://cache.internal:6380/2", "redis://10.0.0.7:6380/2"),
            ("nats://nats.internal:4222", "nats://10.0.0.7:4222"),
            ("amqp://mq.internal/%2f", "amqp://10.0.0.7/%2f"),
            ("amqps://mq.internal/%2f", "amqps://mq.internal/%2f"),
        ] {
            assert_eq!(pin(&mut url::Url::parse(url).unwrap(), ip), want);
        }
        let allowed = Guard { allow_private: true };
        assert_eq!(allowed.pinned(&message("redis://localhost:6379")).await.unwrap(), "redis://localhost:6379");
    }
}
