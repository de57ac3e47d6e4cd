//! The customer portal's records: a portal session (what a minted link may do, until when)
//! and a tenant's branding, with the rules a branding must meet. Pure: nothing here reads a
//! store or a clock.

use super::{EndpointId, Millis, Scope, TenantId};

/// A portal session as the store keeps it: the link's one-time code and, once exchanged,
/// the session token, both as sha256 hex only.
#[derive(Debug, Clone)]
pub struct PortalSession {
    /// `ps_` and random characters: names the session in lists and revocations.
    pub id: String,
    pub tenant: TenantId,
    /// The scopes the session's token carries.
    pub scopes: Vec<Scope>,
    /// Every write is refused (`403`), whatever the scopes.
    pub read_only: bool,
    /// The endpoints the session may see and act on; `None`: all of the tenant's.
    pub endpoints: Option<Vec<EndpointId>>,
    pub created_at: Millis,
    pub expires_at: Millis,
    /// When the link was exchanged for a session token (`None`: not yet).
    pub exchanged_at: Option<Millis>,
    pub revoked_at: Option<Millis>,
}

impl PortalSession {
    /// Whether the session may still be used at `now`: not revoked and not expired.
    pub fn live(&self, now: Millis) -> bool {
        self.revoked_at.is_none() && now < self.expires_at
    }

    /// Whether the session may see endpoint `id`.
    pub fn sees(&self, id: &EndpointId) -> bool {
        self.endpoints.as_ref().is_none_or(|only| only.contains(id))
    }
}

/// How a tenant's portal looks: its name, a logo and an accent colour. The page shows the
/// name as text, the logo as an `<img>` source and the colour as a CSS custom property, so
/// no field can become markup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Branding {
    pub name: String,
    /// A `data:` URL of a PNG, SVG or JPEG image; empty: none.
    pub logo: String,
    /// `#rrggbb`; empty: the portal's own.
    pub accent: String,
}

/// Longest branding name, in characters.
pub const MAX_BRAND_NAME: usize = 100;
/// Largest logo, as the `data:` URL's length in bytes (about 48 KiB of image).
pub const MAX_LOGO_BYTES: usize = 64 * 1024;
const LOGO_PREFIXES: [&str; 3] = ["data:image/png;base64,", "data:image/svg+xml;base64,", "data:image/jpeg;base64,"];

impl Branding {
    /// Checks every field; the error names the first that fails (`logo: …`).
    pub fn validate(&self) -> Result<(), String> {
        let name = self.name.trim();
        if name.chars().count() > MAX_BRAND_NAME {
            return Err(format!("name: at most {MAX_BRAND_NAME} characters"));
        }
        if name.chars().any(char::is_control) {
            return Err("name: must not contain control characters".into());
        }
        if !self.logo.is_empty() {
            if self.logo.len() > MAX_LOGO_BYTES {
                return Err(format!("logo: at most {MAX_LOGO_BYTES} bytes as a data: URL"));
            }
            let body = LOGO_PREFIXES.iter().find_map(|p| self.logo.strip_prefix(p)).ok_or_else(|| {
                "logo: must be a base64 data: URL of image/png, image/svg+xml or image/jpeg".to_string()
            })?;
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(body)
                .map_err(|_| "logo: the data: URL's base64 does not decode".to_string())?;
        }
        if !self.accent.is_empty() && !is_hex_colour(&self.accent) {
            return Err(format!("accent: {:?} is not a colour written #rrggbb", self.accent));
        }
        Ok(())
    }
}

fn is_hex_colour(s: &str) -> bool {
    s.len() == 7 && s.starts_with('#') && s[1..].chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brand(name: &str, logo: &str, accent: &str) -> Branding {
        Branding { name: name.into(), logo: logo.into(), accent: accent.into() }
    }

    #[test]
    fn branding_names_the_failing_field() {
        assert_eq!(brand("Acme", "data:image/png;base64,iVBORw0K", "#12abEF").validate(), Ok(()));
        assert_eq!(brand("", "", "").validate(), Ok(()));
        let err = |b: Branding| b.validate().unwrap_err();
        assert!(err(brand("Acme", "", "red")).starts_with("accent:"));
        assert!(err(brand("Acme", "", "#12345")).starts_with("accent:"));
        assert!(err(brand("Acme", "https://x.test/logo.png", "")).starts_with("logo:"));
        assert!(err(brand("Acme", "data:text/html;base64,PGI+", "")).starts_with("logo:"));
        assert!(err(brand("Acme", "data:image/png;base64,@@@", "")).starts_with("logo:"));
        let big = format!("data:image/png;base64,{}", "A".repeat(MAX_LOGO_BYTES));
        assert!(err(brand("Acme", &big, "")).starts_with("logo:"));
        assert!(err(brand(&"x".repeat(MAX_BRAND_NAME + 1), "", "")).starts_with("name:"));
        assert!(err(brand("a\u{7}b", "", "")).starts_with("name:"));
    }

    #[test]
    fn a_session_is_live_until_expiry_or_revocation() {
        let mut s = PortalSession {
            id: "ps_x".into(),
            tenant: TenantId::parse("acme").unwrap(),
            scopes: vec![Scope::Read],
            read_only: false,
            endpoints: Some(vec![EndpointId::from_stored("ep_a")]),
            created_at: 0,
            expires_at: 100,
            exchanged_at: None,
            revoked_at: None,
        };
        assert!(s.live(99) && !s.live(100));
        assert!(s.sees(&EndpointId::from_stored("ep_a")));
        assert!(!s.sees(&EndpointId::from_stored("ep_b")));
        s.revoked_at = Some(50);
        assert!(!s.live(10));
    }
}
