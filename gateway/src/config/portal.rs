//! `[portal]`: the embeddable customer portal. Which origins may frame it (its page's CSP
//! `frame-ancestors`; the admin console stays `'none'`), the base of the links minted for
//! it, and whether a portal session may reach the tenant's plugins.

use super::{ConfigError, RawPortal, invalid};

/// `[portal]`, validated.
#[derive(Debug, Clone)]
pub struct PortalConfig {
    /// Origins (`https://app.example.com`) allowed to embed the portal in a frame; empty:
    /// none may (`frame-ancestors 'none'`).
    pub frame_ancestors: Vec<String>,
    /// Prefixed to minted portal links (`https://herald.example.com`); `None`: links are
    /// relative to the API's own origin.
    pub public_url: Option<String>,
    /// Whether portal sessions may see and manage the tenant's plugins.
    pub plugins: bool,
    /// The lifetimes a minted session may ask for, in seconds.
    pub ttl_secs: std::ops::RangeInclusive<u64>,
}

/// The longest a portal session may last, in seconds (a day).
pub const MAX_PORTAL_TTL_SECS: u64 = 86_400;

impl RawPortal {
    pub(super) fn validate(&self) -> Result<PortalConfig, ConfigError> {
        let frame_ancestors = self
            .frame_ancestors
            .iter()
            .enumerate()
            .map(|(i, text)| origin(text).map_err(|e| invalid(&format!("portal.frame_ancestors[{i}]"), e)))
            .collect::<Result<_, _>>()?;
        let public_url = match self.public_url.trim() {
            "" => None,
            text => {
                let url = url::Url::parse(text).map_err(|e| invalid("portal.public_url", format!("{text:?}: {e}")))?;
                if !matches!(url.scheme(), "http" | "https") || !url.has_host() || url.query().is_some() {
                    return Err(invalid("portal.public_url", "must be an http:// or https:// URL without a query"));
                }
                Some(text.trim_end_matches('/').to_string())
            }
        };
        if !(1..=3600).contains(&self.min_ttl_secs) {
            return Err(invalid("portal.min_ttl_secs", "must be 1 to 3600"));
        }
        let ttl_secs = self.min_ttl_secs..=MAX_PORTAL_TTL_SECS;
        Ok(PortalConfig { frame_ancestors, public_url, plugins: self.plugins, ttl_secs })
    }
}

/// An origin as CSP names it: `scheme://host[:port]`, nothing after it (a trailing `/` is
/// dropped), so a typo cannot widen or silently void the policy.
fn origin(text: &str) -> Result<String, String> {
    let bare = text.trim().trim_end_matches('/');
    let url = url::Url::parse(bare).map_err(|e| format!("{text:?} is not an origin: {e}"))?;
    let exact = url.origin().ascii_serialization();
    let plain = !bare.contains(['*', ';', ' ', ',', '\'']);
    if !plain || !matches!(url.scheme(), "http" | "https") || !url.has_host() || !exact.eq_ignore_ascii_case(bare) {
        return Err(format!("{text:?} must be an origin: http(s)://host[:port] with no path, query or wildcard"));
    }
    Ok(exact)
}

impl PortalConfig {
    /// The portal page's `frame-ancestors` source list.
    pub fn frame_ancestors_csp(&self) -> String {
        if self.frame_ancestors.is_empty() { "'none'".into() } else { self.frame_ancestors.join(" ") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_exact() {
        assert_eq!(origin("https://app.example.com").unwrap(), "https://app.example.com");
        assert_eq!(origin("https://app.example.com/").unwrap(), "https://app.example.com");
        assert_eq!(origin("http://127.0.0.1:8081").unwrap(), "http://127.0.0.1:8081");
        for bad in ["app.example.com", "https://*.example.com", "https://a.test/path", "ftp://a.test", "*", "'self'"] {
            assert!(origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bad_origin_names_its_key() {
        let raw = RawPortal { frame_ancestors: vec!["https://ok.test".into(), "nope".into()], ..Default::default() };
        let e = raw.validate().unwrap_err().to_string();
        assert!(e.contains("portal.frame_ancestors[1]"), "{e}");
    }
}
