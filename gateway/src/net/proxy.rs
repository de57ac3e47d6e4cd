//! The egress proxy's rules: a proxy URL (`http://[user:pass@]host:port`, HTTP CONNECT) and
//! the `no_proxy` list (host names, `.suffix` domains, IP addresses, CIDRs, or `*`), read
//! as curl reads `NO_PROXY`. Pure: `deliver` applies them. A proxy's `Display` and `Debug`
//! never show its password.

use std::fmt;
use std::net::IpAddr;

/// An HTTP CONNECT proxy.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ProxyUrl {
    pub host: String,
    pub port: u16,
    /// `user:password` as decoded from the URL (sent as `Proxy-Authorization: Basic`).
    credentials: Option<(String, String)>,
}

impl ProxyUrl {
    /// Parses `http://[user[:pass]@]host[:port]` (port 80 when absent; no path).
    pub fn parse(raw: &str) -> Result<ProxyUrl, String> {
        let url = url::Url::parse(raw).map_err(|_| "is not a URL".to_string())?;
        if url.scheme() != "http" {
            return Err(format!("must be an http:// proxy (HTTP CONNECT), not {:?}", url.scheme()));
        }
        let host = url.host_str().filter(|h| !h.is_empty()).ok_or("has no host")?;
        if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
            return Err("must not have a path, query or fragment".into());
        }
        let decode = |s: &str| {
            percent_decode(s).ok_or_else(|| "has credentials that are not valid percent-encoded UTF-8".to_string())
        };
        let credentials = match (url.username(), url.password()) {
            ("", None) => None,
            (user, pass) => Some((decode(user)?, decode(pass.unwrap_or(""))?)),
        };
        Ok(ProxyUrl {
            host: host.trim_matches(['[', ']']).to_string(),
            port: url.port_or_known_default().unwrap_or(80),
            credentials,
        })
    }

    /// The `Proxy-Authorization` value, when the URL has credentials.
    pub fn authorization(&self) -> Option<String> {
        use base64::Engine as _;
        let (user, pass) = self.credentials.as_ref()?;
        Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))))
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Shown as `http://user:***@host:port`: the password never.
impl fmt::Display for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match self.host.contains(':') {
            true => format!("[{}]", self.host),
            false => self.host.clone(),
        };
        match &self.credentials {
            Some((user, _)) => write!(f, "http://{user}:***@{host}:{}", self.port),
            None => write!(f, "http://{host}:{}", self.port),
        }
    }
}

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProxyUrl({self})")
    }
}

/// Destinations that bypass the node's proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct NoProxy {
    all: bool,
    /// Lowercase names; each matches itself and its subdomains (`example.com` and
    /// `.example.com` both match `a.example.com`).
    names: Vec<String>,
    nets: Vec<(IpAddr, u8)>,
}

impl NoProxy {
    /// Parses a comma-separated list (spaces ignored): `*`, names, `.suffixes`, IPs, CIDRs.
    pub fn parse(raw: &str) -> Result<NoProxy, String> {
        let mut list = NoProxy::default();
        for item in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if item == "*" {
                list.all = true;
            } else if let Some((ip, bits)) = item.split_once('/') {
                let ip: IpAddr = ip.parse().map_err(|_| format!("{item:?}: {ip:?} is not an IP address"))?;
                let max = if ip.is_ipv4() { 32 } else { 128 };
                let bits: u8 =
                    bits.parse().ok().filter(|b| *b <= max).ok_or(format!("{item:?}: prefix over /{max}"))?;
                list.nets.push((ip, bits));
            } else if let Ok(ip) = item.trim_matches(['[', ']']).parse::<IpAddr>() {
                list.nets.push((ip, if ip.is_ipv4() { 32 } else { 128 }));
            } else if item.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') {
                list.names.push(item.trim_start_matches('.').to_ascii_lowercase());
            } else {
                return Err(format!("{item:?} is not a host name, IP address or CIDR"));
            }
        }
        Ok(list)
    }

    /// Does a request to `host` (as named in its URL), resolved to `ip`, bypass the proxy?
    pub fn bypasses(&self, host: &str, ip: IpAddr) -> bool {
        let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
        self.all
            || self.names.iter().any(|n| host == *n || host.strip_suffix(n.as_str()).is_some_and(|p| p.ends_with('.')))
            || self.nets.iter().any(|(net, bits)| in_net(ip, *net, *bits))
    }
}

fn in_net(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls() {
        let p = ProxyUrl::parse("http://us%40er:pa%3Ass@proxy.internal:3128").unwrap();
        assert_eq!((p.host.as_str(), p.port), ("proxy.internal", 3128));
        assert_eq!(p.to_string(), "http://us@er:***@proxy.internal:3128");
        assert!(!format!("{p:?}").contains("pa:ss"));
        assert_eq!(p.authorization().unwrap(), "Basic dXNAZXI6cGE6c3M=");
        assert_eq!(ProxyUrl::parse("http://10.0.0.1").unwrap().port, 80);
        for bad in ["https://p:3128", "socks5://p:1080", "http://p:3128/path", "p:3128", "http://"] {
            assert!(ProxyUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn no_proxy_lists() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let l = NoProxy::parse("example.com, .corp.internal,10.0.0.0/8, 192.168.1.7, ::1").unwrap();
        assert!(l.bypasses("example.com", ip("93.184.216.34")));
        assert!(l.bypasses("api.Example.com", ip("93.184.216.34")));
        assert!(!l.bypasses("badexample.com", ip("93.184.216.34")));
        assert!(l.bypasses("a.corp.internal", ip("1.1.1.1")));
        assert!(l.bypasses("x.test", ip("10.1.2.3")));
        assert!(!l.bypasses("x.test", ip("11.1.2.3")));
        assert!(l.bypasses("192.168.1.7", ip("192.168.1.7")));
        assert!(l.bypasses("[::1]", ip("::1")));
        assert!(NoProxy::parse("*").unwrap().bypasses("any", ip("8.8.8.8")));
        assert!(!NoProxy::parse("").unwrap().bypasses("any", ip("8.8.8.8")));
        for bad in ["10.0.0.0/33", "x/8", "a b", "ex@mple"] {
            assert!(NoProxy::parse(bad).is_err(), "{bad}");
        }
    }
}
