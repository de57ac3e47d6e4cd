//! Opening a connection to a destination: resolve its name off the runtime, drop the
//! addresses the SSRF guard refuses, then connect directly or through an HTTP CONNECT
//! proxy. Through a proxy the guard still holds: Herald resolves and checks the
//! destination itself and asks the proxy to `CONNECT` to the checked address (never to the
//! name, which the proxy would resolve on its own); TLS keeps the name for SNI and
//! certificate checks, and `Host` names it as usual. The proxy's own address is not
//! guarded when the operator configured it (`delivery.proxy`), and is when an endpoint
//! chose it (unless private destinations are allowed).

use std::future::Future;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Blocked, DnsFailed};
use crate::net::is_forbidden;
use crate::net::proxy::{NoProxy, ProxyUrl};

/// How a route reaches its destinations.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Via {
    Direct,
    /// Through an HTTP CONNECT proxy; `no_proxy` lists destinations that bypass it;
    /// `guarded`: the proxy's own address must pass the SSRF guard.
    Proxy {
        proxy: Arc<ProxyUrl>,
        no_proxy: Option<Arc<NoProxy>>,
        guarded: bool,
    },
}

/// A proxy that did not open the tunnel.
#[derive(Debug, thiserror::Error)]
#[error("proxy {proxy}: {reason}")]
pub(super) struct ProxyFailed {
    proxy: String,
    reason: String,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The connector under TLS: one per connection pool.
#[derive(Clone)]
pub(super) struct Connector {
    pub(super) allow_private: bool,
    pub(super) connect_timeout: Duration,
    pub(super) via: Via,
}

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            let host = uri.host().ok_or_else(|| DnsFailed("the URL has no host".into()))?.to_string();
            let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
            let addrs = resolve(&host, port, me.allow_private).await?;
            let stream = match &me.via {
                Via::Proxy { proxy, no_proxy, guarded }
                    if !no_proxy.as_ref().is_some_and(|n| n.bypasses(&host, addrs[0].ip())) =>
                {
                    me.tunnel(proxy, *guarded, &addrs).await?
                }
                _ => me.direct(&addrs).await?,
            };
            stream.set_nodelay(true)?;
            Ok(TokioIo::new(stream))
        })
    }
}

/// Resolves `host` (an IP literal as itself) and keeps the addresses the guard allows.
async fn resolve(host: &str, port: u16, allow_private: bool) -> Result<Vec<SocketAddr>, BoxError> {
    let bare = host.trim_matches(['[', ']']).to_string();
    let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::task::spawn_blocking(move || (bare.as_str(), port).to_socket_addrs())
            .await
            .map_err(|e| DnsFailed(e.to_string()))?
            .map_err(|e| DnsFailed(e.to_string()))?
            .collect(),
    };
    if addrs.is_empty() {
        return Err(DnsFailed(format!("{host} has no addresses")).into());
    }
    let allowed: Vec<SocketAddr> = addrs.iter().copied().filter(|a| allow_private || !is_forbidden(a.ip())).collect();
    if allowed.is_empty() {
        return Err(Blocked(addrs[0].ip()).into());
    }
    Ok(allowed)
}

impl Connector {
    /// The first address that accepts, each tried within the connect deadline.
    async fn direct(&self, addrs: &[SocketAddr]) -> Result<TcpStream, BoxError> {
        let mut last: Option<std::io::Error> = None;
        for addr in addrs {
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => return Ok(s),
                Ok(Err(e)) => last = Some(e),
                Err(_) => last = Some(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")),
            }
        }
        Err(last.map_or_else(|| "no address to connect to".into(), Into::into))
    }

    /// A tunnel through `proxy` to the first checked destination address it opens.
    async fn tunnel(&self, proxy: &ProxyUrl, guarded: bool, addrs: &[SocketAddr]) -> Result<TcpStream, BoxError> {
        let proxy_addrs = resolve(&proxy.host, proxy.port, self.allow_private || !guarded).await?;
        let failed = |reason: String| ProxyFailed { proxy: proxy.to_string(), reason };
        let mut last: BoxError = failed("no destination address".into()).into();
        for dest in addrs {
            let mut stream = self.direct(&proxy_addrs).await?;
            let target = dest.to_string();
            let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
            if let Some(auth) = proxy.authorization() {
                head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
            }
            head.push_str("\r\n");
            let opened = async {
                stream.write_all(head.as_bytes()).await?;
                read_head(&mut stream).await
            };
            match tokio::time::timeout(self.connect_timeout, opened).await {
                Ok(Ok(status)) if (200..300).contains(&status) => return Ok(stream),
                Ok(Ok(status)) => last = failed(format!("CONNECT {target} answered {status}")).into(),
                Ok(Err(e)) => last = e.into(),
                Err(_) => {
                    last = std::io::Error::new(std::io::ErrorKind::TimedOut, "the proxy did not answer CONNECT").into()
                }
            }
        }
        Err(last)
    }
}

/// Reads a response head byte by byte (nothing past it: the tunnel starts there) and
/// returns its status.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<u16> {
    let mut head = Vec::with_capacity(128);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= 8 * 1024 || stream.read(&mut byte).await? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the proxy closed during CONNECT"));
        }
        head.push(byte[0]);
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let status = std::str::from_utf8(line).ok().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok());
    status.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP answer to CONNECT"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_service::Service;

    /// Through the operator's proxy, a name that resolves to a forbidden address is still
    /// refused, before the proxy is asked anything.
    #[tokio::test]
    async fn the_guard_holds_through_a_proxy() {
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = proxy.local_addr().unwrap();
        let via = Via::Proxy {
            proxy: Arc::new(ProxyUrl::parse(&format!("http://{addr}")).unwrap()),
            no_proxy: None,
            guarded: false,
        };
        let mut c = Connector { allow_private: false, connect_timeout: Duration::from_secs(1), via };
        for url in ["http://localhost:9/hook", "http://127.0.0.1:9/hook", "http://[::1]:9/hook"] {
            let err = c.call(url.parse().unwrap()).await.expect_err(url);
            assert!(err.is::<Blocked>(), "{url}: {err}");
        }
        let accepted = tokio::time::timeout(Duration::from_millis(50), proxy.accept()).await;
        assert!(accepted.is_err(), "the proxy was never contacted");
    }
}
