//! What the broker destinations share: the message a broker attempt publishes, one
//! connection per destination (by URL and credentials) connected once at a time, a
//! reconnect backoff that fails attempts fast (with the last error) while it lasts, and
//! the SSRF guard applied to a broker's host. No client crate is linked here.

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
    /// The webhook id: JetStream's `Nats-Msg-Id`, AMQP's `message-id`.
    pub id: String,
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

/// The SSRF guard for a broker URL: every address its host resolves to must be allowed.
/// The client resolves the name again as it connects; what it may reach differently is
/// what DNS changes in between.
pub(super) async fn guard(url: &str, default_port: u16, allow_private: bool, within: Duration) -> Result<(), Outcome> {
    if allow_private {
        return Ok(());
    }
    let parsed = url::Url::parse(url).map_err(|e| failed(TransportErrorKind::Other, format!("bad url: {e}")))?;
    let port = parsed.port().unwrap_or(default_port);
    let addrs: Vec<IpAddr> = match parsed.host() {
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
    match addrs.into_iter().find(|ip| is_forbidden(*ip)) {
        Some(ip) => {
            Err(failed(TransportErrorKind::Blocked, format!("destination {ip} is a private or loopback address")))
        }
        None => Ok(()),
    }
}

/// The headers a broker message carries: the webhook headers, not the HTTP client's.
pub(super) fn message_headers(m: &Message) -> impl Iterator<Item = (&str, &str)> {
    m.headers.iter().filter(|(k, _)| !k.eq_ignore_ascii_case("user-agent")).map(|(k, v)| (k.as_str(), v.as_str()))
}
