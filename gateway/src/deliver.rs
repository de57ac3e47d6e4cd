//! Outbound HTTP to webhook endpoints (hyper + rustls): connection reuse per endpoint,
//! separate connect and total deadlines, no redirects, the SSRF guard, and the first 1 KiB
//! of every response. Architecture invariant: the only module that talks to webhook
//! endpoints. It decides nothing about retries; it reports what happened.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioExecutor;

use crate::classify::{self, Outcome, Response, TransportErrorKind};

pub mod headers;

/// How much of a response body is kept with the attempt.
pub const BODY_PREFIX: usize = 1024;
/// How much of a response body is read (to keep the connection reusable) before giving up on it.
const BODY_DRAIN: usize = 64 * 1024;

/// Is `ip` an address webhooks must never reach unless private destinations are allowed?
/// The one judge of every address (literal in a URL or resolved): anything in IANA's IPv4
/// and IPv6 special-purpose registries that is not globally reachable, plus documentation
/// and benchmarking ranges and multicast. IPv6 forms that embed or translate an IPv4
/// address (mapped, compatible, NAT64, 6to4) are judged by that address; Teredo and
/// ORCHID-style tunnels, whose real target is hidden, are refused outright.
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_forbidden_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => is_forbidden_v4(v4),
            None => is_forbidden_v6(v6),
        },
    }
}

/// IANA IPv4 special-purpose registry (every entry not globally reachable), multicast,
/// reserved and broadcast.
fn is_forbidden_v4(v4: Ipv4Addr) -> bool {
    let [a, b, c, _] = v4.octets();
    a == 0                                        // 0.0.0.0/8 "this network"
        || a == 10                                // 10/8 private
        || (a == 100 && (64..128).contains(&b))   // 100.64/10 shared (CGNAT)
        || a == 127                               // loopback
        || (a == 169 && b == 254)                 // link-local, cloud metadata
        || (a == 172 && (16..32).contains(&b))    // 172.16/12 private
        || (a == 192 && b == 0 && c == 0)         // 192.0.0/24 IETF protocol assignments
        || (a == 192 && b == 0 && c == 2)         // TEST-NET-1
        || (a == 192 && b == 31 && c == 196)      // AS112-v4
        || (a == 192 && b == 52 && c == 193)      // AMT
        || (a == 192 && b == 88 && c == 99)       // deprecated 6to4 relay anycast
        || (a == 192 && b == 168)                 // 192.168/16 private
        || (a == 192 && b == 175 && c == 48)      // direct delegation AS112
        || (a == 198 && (b & 0xfe) == 18)         // 198.18/15 benchmarking
        || (a == 198 && b == 51 && c == 100)      // TEST-NET-2
        || (a == 203 && b == 0 && c == 113)       // TEST-NET-3
        || a >= 224 // multicast 224/4, reserved 240/4, broadcast
}

/// The IPv4 address an IPv6 address stands for, when it is a translation or embedding:
/// IPv4-mapped `::ffff:0:0/96`, IPv4-compatible `::/96` (beyond `::` and `::1`), NAT64
/// `64:ff9b::/96` and `64:ff9b:1::/48` (RFC 6052 /48 layout), 6to4 `2002::/16`.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let o = v6.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(tail),
        [0, 0, 0, 0, 0, 0, hi, _] if hi != 0 => Some(tail),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(tail),
        // RFC 6052 /48: the IPv4 address sits in bits 48..64 and 72..88 (bits 64..72 are u).
        // Local-use, but still a translation: the address it reaches decides.
        [0x64, 0xff9b, 1, ..] => Some(Ipv4Addr::new(o[6], o[7], o[9], o[10])),
        [0x2002, ..] => Some(Ipv4Addr::new(o[2], o[3], o[4], o[5])),
        _ => None,
    }
}

/// IANA IPv6 special-purpose registry (every entry not globally reachable), plus tunnels
/// whose real destination Herald cannot judge, multicast and site-local.
fn is_forbidden_v6(v6: Ipv6Addr) -> bool {
    let s = v6.segments();
    v6.is_unspecified()                            // ::
        || v6.is_loopback()                        // ::1
        || s[0] == 0                               // rest of ::/16 (incl. ::ffff:0:0:0/96 SIIT)
        || (s[0] == 0x0100 && s[1..4] == [0, 0, 0]) // 100::/64 discard-only
        || (s[0] == 0x2001 && s[1] < 0x0200)       // 2001::/23 IETF protocol assignments (Teredo, benchmarking, ORCHID)
        || (s[0] == 0x2001 && s[1] == 0x0db8)      // 2001:db8::/32 documentation
        || (s[0] == 0x3fff && s[1] < 0x1000)        // 3fff::/20 documentation
        || s[0] == 0x5f00                          // 5f00::/16 SRv6 SIDs
        || (s[0] & 0xfe00) == 0xfc00               // fc00::/7 unique-local
        || (s[0] & 0xffc0) == 0xfe80               // fe80::/10 link-local
        || (s[0] & 0xffc0) == 0xfec0               // fec0::/10 site-local (deprecated)
        || (s[0] & 0xff00) == 0xff00 // ff00::/8 multicast
}

/// A request ready to go out.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    /// Keep the response headers (only a classify plugin reads them; copying them on
    /// every answer is wasted work otherwise).
    pub keep_headers: bool,
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector<GuardedResolver>>, Full<Bytes>>;

/// The outbound HTTP client, one pool per connect timeout.
#[derive(Clone)]
pub struct Deliverer {
    allow_private: bool,
    clients: Arc<Mutex<HashMap<Duration, HttpsClient>>>,
}

#[derive(Debug, thiserror::Error)]
#[error("destination {0} is a private or loopback address")]
struct Blocked(IpAddr);

#[derive(Debug, thiserror::Error)]
#[error("dns: {0}")]
struct DnsFailed(String);

/// Resolves names off the runtime and drops forbidden addresses (SSRF guard).
#[derive(Clone)]
struct GuardedResolver {
    allow_private: bool,
}

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> = tokio::task::spawn_blocking(move || (host.as_str(), 0).to_socket_addrs())
                .await
                .map_err(|e| DnsFailed(e.to_string()))?
                .map_err(|e| DnsFailed(e.to_string()))?
                .collect();
            if addrs.is_empty() {
                return Err(DnsFailed(format!("{} has no addresses", name.as_str())).into());
            }
            let allowed: Vec<SocketAddr> =
                addrs.iter().copied().filter(|a| allow_private || !is_forbidden(a.ip())).collect();
            if allowed.is_empty() {
                return Err(Blocked(addrs[0].ip()).into());
            }
            Ok(allowed.into_iter())
        })
    }
}

impl Deliverer {
    pub fn new(allow_private: bool) -> Deliverer {
        Deliverer { allow_private, clients: Arc::default() }
    }

    fn client(&self, connect_timeout: Duration) -> HttpsClient {
        let mut clients = self.clients.lock().expect("client map");
        clients
            .entry(connect_timeout)
            .or_insert_with(|| {
                let mut http = HttpConnector::new_with_resolver(GuardedResolver { allow_private: self.allow_private });
                http.enforce_http(false);
                http.set_connect_timeout(Some(connect_timeout));
                http.set_nodelay(true);
                let https = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_provider_and_webpki_roots(Arc::new(rustls::crypto::ring::default_provider()))
                    .expect("ring provider supports the default protocol versions")
                    .https_or_http()
                    .enable_http1()
                    .enable_http2()
                    .wrap_connector(http);
                Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(60))
                    .pool_max_idle_per_host(1024)
                    .build(https)
            })
            .clone()
    }

    /// Sends one request; never follows redirects; never outlives `timeout`.
    pub async fn send(&self, out: Outgoing) -> Outcome {
        let uri: http::Uri = match out.url.parse() {
            Ok(u) => u,
            Err(e) => return failed(TransportErrorKind::Other, format!("bad url: {e}")),
        };
        if let Some(ip) = uri.host().and_then(|h| h.trim_matches(['[', ']']).parse::<IpAddr>().ok())
            && !self.allow_private
            && is_forbidden(ip)
        {
            return failed(TransportErrorKind::Blocked, Blocked(ip).to_string());
        }
        let mut builder = http::Request::post(uri);
        for (k, v) in &out.headers {
            builder = builder.header(k.as_str(), v.as_str());
        }
        let request = match builder.body(Full::new(out.body)) {
            Ok(r) => r,
            Err(e) => return failed(TransportErrorKind::Other, format!("bad request: {e}")),
        };
        let client = self.client(out.connect_timeout);
        match tokio::time::timeout(out.timeout, exchange(client, request, out.keep_headers)).await {
            Ok(outcome) => outcome,
            Err(_) => failed(TransportErrorKind::Timeout, format!("no answer within {:?}", out.timeout)),
        }
    }
}

fn failed(kind: TransportErrorKind, detail: String) -> Outcome {
    Outcome::Transport { kind, detail }
}

async fn exchange(client: HttpsClient, request: http::Request<Full<Bytes>>, keep_headers: bool) -> Outcome {
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
        .and_then(|v| classify::parse_retry_after(v, crate::clock::wall()));
    let mut body = response.into_body();
    let mut kept = Vec::with_capacity(256);
    let mut read = 0usize;
    while read < BODY_DRAIN {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    read += data.len();
                    let room = BODY_PREFIX.saturating_sub(kept.len());
                    kept.extend_from_slice(&data[..data.len().min(room)]);
                }
            }
            Some(Err(_)) | None => break,
        }
    }
    let body_prefix = String::from_utf8_lossy(&kept).into_owned();
    Outcome::Response(Response { status, retry_after, headers, body_prefix })
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
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
        if err.is::<rustls::Error>() {
            return TransportErrorKind::Tls;
        }
        if let Some(ce) = err.downcast_ref::<hyper_util::client::legacy::Error>() {
            connect |= ce.is_connect();
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every range of IANA's IPv4 and IPv6 special-purpose registries, the embedded and
    /// translated IPv6 forms, and public addresses that must stay reachable.
    #[test]
    #[rustfmt::skip]
    fn ssrf_guard_table() {
        let cases = [
            // address                      forbidden  why
            ("0.0.0.0",                     true),  // this host
            ("0.1.2.3",                     true),  // this network 0/8
            ("10.1.2.3",                    true),  // private
            ("100.64.0.1",                  true),  // shared address space (CGNAT)
            ("100.127.255.254",             true),
            ("100.128.0.1",                 false), // just past CGNAT
            ("127.0.0.1",                   true),  // loopback
            ("127.255.255.254",             true),
            ("169.254.169.254",             true),  // link-local, cloud metadata
            ("172.16.0.1",                  true),  // private
            ("172.31.255.255",              true),
            ("172.32.0.1",                  false),
            ("192.0.0.8",                   true),  // IETF protocol assignments
            ("192.0.0.170",                 true),  // NAT64/DNS64 discovery
            ("192.0.2.10",                  true),  // TEST-NET-1
            ("192.31.196.1",                true),  // AS112-v4
            ("192.52.193.1",                true),  // AMT
            ("192.88.99.1",                 true),  // deprecated 6to4 relay anycast
            ("192.168.1.1",                 true),  // private
            ("192.175.48.1",                true),  // direct delegation AS112
            ("198.18.0.1",                  true),  // benchmarking 198.18/15
            ("198.19.255.255",              true),
            ("198.20.0.1",                  false),
            ("198.51.100.7",                true),  // TEST-NET-2
            ("203.0.113.9",                 true),  // TEST-NET-3
            ("224.0.0.1",                   true),  // multicast
            ("239.255.255.250",             true),
            ("240.0.0.1",                   true),  // reserved
            ("255.255.255.255",             true),  // limited broadcast
            ("8.8.8.8",                     false),
            ("1.1.1.1",                     false),
            ("93.184.215.14",               false),
            ("::",                          true),  // unspecified
            ("::1",                         true),  // loopback
            ("::ffff:127.0.0.1",            true),  // IPv4-mapped
            ("::ffff:10.0.0.1",             true),
            ("::ffff:8.8.8.8",              false), // mapped public: judged as 8.8.8.8
            ("::127.0.0.1",                 true),  // IPv4-compatible
            ("::169.254.169.254",           true),
            ("::8.8.8.8",                   false),
            ("::ffff:0:7f00:1",             true),  // IPv4-translated (SIIT)
            ("64:ff9b::7f00:1",             true),  // NAT64 well-known prefix
            ("64:ff9b::a9fe:a9fe",          true),
            ("64:ff9b::808:808",            false), // NAT64 of 8.8.8.8
            ("64:ff9b:1:7f00:1::",          true),  // local-use NAT64 /48: 127.0.0.1
            ("64:ff9b:1:a00:0:100::",       true),  // 10.0.0.1 (bits 64..72 skipped)
            ("64:ff9b:1:808:8:800::",       false), // 8.8.8.8
            ("100::1",                      true),  // discard-only
            ("2001::1",                     true),  // Teredo
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", true),
            ("2001:1::1",                   true),  // port control anycast
            ("2001:2::1",                   true),  // benchmarking
            ("2001:3::1",                   true),  // AMT
            ("2001:4:112::1",               true),  // AS112-v6
            ("2001:10::1",                  true),  // ORCHID
            ("2001:20::1",                  true),  // ORCHIDv2
            ("2001:db8::1",                 true),  // documentation
            ("2002:7f00:1::1",              true),  // 6to4 of 127.0.0.1
            ("2002:a9fe:a9fe::1",           true),  // 6to4 of 169.254.169.254
            ("2002:c000:204::1",            true),  // 6to4 of 192.0.2.4
            ("2002:808:808::1",             false), // 6to4 of 8.8.8.8
            ("3fff::1",                     true),  // documentation 3fff::/20
            ("3fff:fff::1",                 true),
            ("5f00::1",                     true),  // SRv6 SIDs
            ("fc00::1",                     true),  // unique-local
            ("fd00::1",                     true),
            ("fe80::1",                     true),  // link-local
            ("febf::1",                     true),
            ("fec0::1",                     true),  // site-local
            ("feff::1",                     true),
            ("ff02::1",                     true),  // multicast
            ("ff0e::1",                     true),
            ("2606:4700::1111",             false),
            ("2a00:1450:4001::200e",        false),
            ("2001:200::1",                 false), // past 2001::/23
            ("3fff:1000::1",                false), // past 3fff::/20
        ];
        for (ip, want) in cases {
            assert_eq!(is_forbidden(ip.parse().unwrap()), want, "{ip}");
        }
    }
}
