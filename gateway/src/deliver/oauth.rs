//! OAuth2 client credentials (RFC 6749 §4.4): the node-wide token cache and the token
//! request. One slot per set of credentials (token URL, client, secret, scopes, audience,
//! client authentication), shared by every attempt of every endpoint that uses them. A
//! token is kept until shortly before it expires (a tenth of its lifetime, at most a
//! minute, early); whoever finds the slot empty or stale fetches while the others wait on
//! the slot's lock (single flight). A token the receiver refused (`401`) is dropped once,
//! and only while it is still the slot's token, so concurrent refusals lead to one fetch.
//!
//! The token request goes through the same client as deliveries: the SSRF guard applies
//! to the token URL, and so do the endpoint's proxy and deadlines. Nothing here prints
//! the client secret or a token: errors name the status, the RFC's `error` code or the
//! transport failure.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::{Deliverer, Outgoing, Route, error_chain, kind_of};
use crate::model::{ClientAuth, OAuth2};

/// A token response larger than this is refused.
const MAX_TOKEN_RESPONSE: usize = 64 * 1024;
/// A token without `expires_in` is kept this long (or until a receiver refuses it).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);
/// The most a token is refreshed ahead of its expiry.
const MAX_MARGIN: Duration = Duration::from_secs(60);

/// An access token as cached: its value (never printed) and which fetch produced it.
#[derive(Clone)]
pub struct Token {
    value: Arc<str>,
    generation: u64,
}

impl Token {
    /// The `Authorization` header value.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.value)
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(#{} [redacted])", self.generation)
    }
}

/// A request sent with a token ([`Deliverer::send_authorized`]).
#[derive(Debug)]
pub struct Authorized {
    /// What the last request got; `Err`: the token endpoint gave no token (why, fit for
    /// the attempt record: `auth:token`), and nothing more was sent.
    pub outcome: Result<crate::classify::Outcome, String>,
    /// The headers as sent, the token redacted.
    pub shown: Vec<(String, String)>,
    /// Requests sent: 0 to 2.
    pub requests: u32,
}

/// What this node knows of one set of credentials, for the API and the console.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenState {
    /// How long the cached token is used before it is refreshed (`None`: no token cached).
    pub refresh_in: Option<Duration>,
    /// Tokens requested for these credentials since the node started.
    pub fetches: u64,
    /// The last failed request, if it failed after the last success.
    pub last_error: Option<String>,
}

#[derive(Default)]
struct Slot {
    token: Option<(Token, Instant)>,
    fetches: u64,
    last_error: Option<String>,
}

/// The node's tokens, by credentials.
#[derive(Default)]
pub(super) struct Tokens {
    slots: Mutex<HashMap<[u8; 32], Arc<tokio::sync::Mutex<Slot>>>>,
}

impl Tokens {
    fn slot(&self, auth: &OAuth2) -> Arc<tokio::sync::Mutex<Slot>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry(key(auth)).or_default().clone()
    }
}

/// The cache key: a digest of everything that makes a token (the secret included, so a new
/// secret fetches a new token; the digest keeps it out of the map in clear).
fn key(auth: &OAuth2) -> [u8; 32] {
    let mut h = Sha256::new();
    let parts = [auth.token_url.as_str(), auth.client_id.as_str(), auth.client_secret.expose()];
    for part in parts.into_iter().chain(auth.scopes.iter().map(String::as_str)) {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.update([0xff]);
    h.update(auth.audience.as_deref().unwrap_or("\u{0}").as_bytes());
    h.update([auth.client_auth as u8]);
    h.finalize().into()
}

impl Deliverer {
    /// A token for `auth`: the cached one while it is fresh, else one fetched now (one
    /// fetch at a time per credentials; the others wait for it). `Err`: why the token
    /// endpoint gave none, fit for the attempt record (`auth:token`).
    pub async fn token(&self, auth: &OAuth2, route: &Route) -> Result<Token, String> {
        let slot = self.tokens.slot(auth);
        let mut slot = slot.lock().await;
        if let Some((token, refresh_at)) = &slot.token
            && Instant::now() < *refresh_at
        {
            return Ok(token.clone());
        }
        slot.token = None;
        slot.fetches += 1;
        let generation = slot.fetches;
        match self.fetch(auth, route).await {
            Ok((value, lifetime)) => {
                let margin = (lifetime / 10).min(MAX_MARGIN);
                let token = Token { value: value.into(), generation };
                slot.token = Some((token.clone(), Instant::now() + lifetime.saturating_sub(margin)));
                slot.last_error = None;
                Ok(token)
            }
            Err(e) => {
                slot.last_error = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Sends `out` with the node's token for `auth` as its only `authorization` (a
    /// plugin's own goes). A `401` drops the token, fetches another and sends once more;
    /// what that second request gets is the outcome (a second `401`: the 401 rule).
    pub async fn send_authorized(&self, out: Outgoing, auth: &OAuth2) -> Authorized {
        let Outgoing { url, mut headers, body, route, keep_headers, keep_body, now } = out;
        headers.retain(|(k, _)| !k.eq_ignore_ascii_case("authorization"));
        // What was sent, the token redacted.
        let mut shown = headers.clone();
        shown.push(("authorization".to_string(), "Bearer [redacted]".to_string()));
        let mut done = Authorized { outcome: Err(String::new()), shown, requests: 0 };

        let mut token = match self.token(auth, &route).await {
            Ok(t) => t,
            Err(e) => return Authorized { outcome: Err(e), ..done },
        };
        loop {
            let mut with_auth = headers.clone();
            with_auth.push(("authorization".to_string(), token.bearer()));
            let out = Outgoing {
                url: url.clone(),
                headers: with_auth,
                body: body.clone(),
                route: route.clone(),
                keep_headers,
                keep_body,
                now,
            };
            let outcome = self.send(out).await;
            done.requests += 1;
            if done.requests > 1 || outcome.http_status() != Some(401) {
                return Authorized { outcome: Ok(outcome), ..done };
            }
            self.token_refused(auth, &token).await;
            token = match self.token(auth, &route).await {
                Ok(t) => t,
                Err(e) => return Authorized { outcome: Err(e), ..done },
            };
        }
    }

    /// The receiver refused `token` (`401`): the next [`Deliverer::token`] fetches a new
    /// one, unless another attempt already did.
    pub async fn token_refused(&self, auth: &OAuth2, token: &Token) {
        let slot = self.tokens.slot(auth);
        let mut slot = slot.lock().await;
        if slot.token.as_ref().is_some_and(|(t, _)| t.generation == token.generation) {
            slot.token = None;
        }
    }

    /// What this node knows of `auth`'s token, without fetching one (`None`: a fetch is
    /// under way).
    pub fn token_state(&self, auth: &OAuth2) -> Option<TokenState> {
        let slot = self.tokens.slot(auth);
        let slot = slot.try_lock().ok()?;
        let now = Instant::now();
        Some(TokenState {
            refresh_in: slot.token.as_ref().map(|(_, at)| at.saturating_duration_since(now)),
            fetches: slot.fetches,
            last_error: slot.last_error.clone(),
        })
    }

    /// One token request: the access token and how long it lives.
    async fn fetch(&self, auth: &OAuth2, route: &Route) -> Result<(String, Duration), String> {
        let uri: http::Uri = auth.token_url.parse().map_err(|e| format!("bad token URL: {e}"))?;
        self.check_literal(&uri)?;
        let (form, basic) = token_request(auth);
        let mut builder = http::Request::post(uri)
            .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, concat!("herald/", env!("CARGO_PKG_VERSION")));
        if let Some(basic) = basic {
            builder = builder.header(http::header::AUTHORIZATION, basic);
        }
        let request = builder.body(Full::new(Bytes::from(form))).map_err(|e| format!("bad token request: {e}"))?;
        let client = self.client(route).map_err(|e| format!("tls: {e}"))?;
        let exchange = async {
            let response =
                client.request(request).await.map_err(|e| format!("{}: {}", kind_of(&e), error_chain(&e)))?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_TOKEN_RESPONSE)
                .collect()
                .await
                .map_err(|e| format!("reading the token response: {e}"))?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        let (status, body) = tokio::time::timeout(route.timeout, exchange)
            .await
            .map_err(|_| format!("timeout: no token within {:?}", route.timeout))??;
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        if !status.is_success() {
            // Only the RFC's error code: a description may quote what was sent.
            let code = json["error"].as_str().filter(|c| c.len() <= 64 && c.bytes().all(|b| b.is_ascii_graphic()));
            return Err(match code {
                Some(code) => format!("HTTP {} from the token endpoint ({code})", status.as_u16()),
                None => format!("HTTP {} from the token endpoint", status.as_u16()),
            });
        }
        let token = json["access_token"]
            .as_str()
            .filter(|t| !t.is_empty() && t.bytes().all(|b| (0x21..0x7f).contains(&b)))
            .ok_or("the token response has no usable access_token")?;
        if let Some(kind) = json["token_type"].as_str()
            && !kind.eq_ignore_ascii_case("bearer")
        {
            return Err(format!("token_type {:?} is not bearer", kind.chars().take(32).collect::<String>()));
        }
        let lifetime = match &json["expires_in"] {
            serde_json::Value::Number(n) => Duration::from_secs(n.as_u64().unwrap_or(0)),
            serde_json::Value::String(s) => Duration::from_secs(s.parse().unwrap_or(0)),
            _ => DEFAULT_LIFETIME,
        };
        Ok((token.to_string(), lifetime))
    }
}

/// The token request's form and, for `client_secret_basic`, its `Authorization` value.
fn token_request(auth: &OAuth2) -> (String, Option<String>) {
    let mut form = form_urlencoded::Serializer::new(String::new());
    form.append_pair("grant_type", "client_credentials");
    if !auth.scopes.is_empty() {
        form.append_pair("scope", &auth.scopes.join(" "));
    }
    if let Some(aud) = &auth.audience {
        form.append_pair("audience", aud);
    }
    let basic = match auth.client_auth {
        ClientAuth::ClientSecretBasic => {
            // RFC 6749 §2.3.1: both form-encoded before they are joined.
            let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let pair = format!("{}:{}", enc(&auth.client_id), enc(auth.client_secret.expose()));
            Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair)))
        }
        ClientAuth::ClientSecretPost => {
            form.append_pair("client_id", &auth.client_id);
            form.append_pair("client_secret", auth.client_secret.expose());
            None
        }
    };
    (form.finish(), basic)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WriteOnly;

    fn auth(secret: &str) -> OAuth2 {
        OAuth2 {
            token_url: "https://auth.example/token".into(),
            client_id: "c".into(),
            client_secret: WriteOnly::new(secret),
            client_secret_sealed: false,
            scopes: vec!["a".into()],
            audience: None,
            client_auth: ClientAuth::ClientSecretBasic,
        }
    }

    #[test]
    fn credentials_key_the_cache_and_nothing_prints_them() {
        assert_eq!(key(&auth("s1")), key(&auth("s1")));
        assert_ne!(key(&auth("s1")), key(&auth("s2")));
        let mut post = auth("s1");
        post.client_auth = ClientAuth::ClientSecretPost;
        assert_ne!(key(&auth("s1")), key(&post));
        assert!(!format!("{:?}", auth("hunter2")).contains("hunter2"));
        let t = Token { value: "tok-value".into(), generation: 1 };
        assert!(!format!("{t:?}").contains("tok-value"));
    }
}
