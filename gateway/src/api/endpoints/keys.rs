//! An endpoint's signing schemes and keys as the API writes and shows them: which of
//! Standard Webhooks' `v1` (HMAC) and `v1a` (ed25519) sign its deliveries, the `v1a` public
//! keys, and the tenant's JWKS, which a receiver reads without a token.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::super::extract::{Path, Query};
use super::super::{ApiError, AppState, rfc3339};
use crate::model::{EndpointId, EndpointSpec, Millis, SecretEntry, TenantId};
use crate::sign::Secret;
use crate::sign::v1a::{PublicKey, SigningKey};

/// A Standard Webhooks signature scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Scheme {
    /// HMAC-SHA256 with the `whsec_` secret.
    V1,
    /// ed25519 with the `whsk_` key; receivers verify with its `whpk_` public key.
    V1a,
}

/// A `v1a` public key as shown.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PublicKeyOut {
    /// `whpk_` + base64 of the 32-byte ed25519 public key.
    public_key: String,
    /// Its RFC 7638 thumbprint: the `kid` of its entry in the tenant's JWKS.
    kid: String,
    /// Until when it still signs (a previous key during a rotation); null for the current one.
    expires_at: Option<String>,
}

/// The schemes `spec` signs with: `v1` first.
pub(super) fn schemes(spec: &EndpointSpec) -> Vec<Scheme> {
    let (v1, v1a) = kinds(&spec.secrets);
    [(v1, Scheme::V1), (v1a, Scheme::V1a)].into_iter().filter(|(on, _)| *on).map(|(_, s)| s).collect()
}

/// Whether `secrets` hold a `v1` secret and a `v1a` key.
fn kinds(secrets: &[SecretEntry]) -> (bool, bool) {
    (secrets.iter().any(|s| !s.is_v1a()), secrets.iter().any(SecretEntry::is_v1a))
}

/// The `v1a` public keys among `entries`, as shown.
pub(super) fn public_keys<'a>(entries: impl Iterator<Item = &'a SecretEntry>) -> Vec<PublicKeyOut> {
    entries
        .filter_map(|s| Some((s, PublicKey::parse(s.public_key.as_deref()?).ok()?)))
        .map(|(s, key)| PublicKeyOut {
            public_key: key.to_string(),
            kid: key.kid(),
            expires_at: s.expires_at.map(rfc3339),
        })
        .collect()
}

/// A new `v1a` entry, the key in clear (sealed with the rest of the spec).
fn v1a_entry(key: &SigningKey) -> SecretEntry {
    SecretEntry { secret: key.to_string(), expires_at: None, public_key: Some(key.public_key().to_string()) }
}

fn parse_secret(s: &str) -> Result<SecretEntry, ApiError> {
    Secret::parse(s).map_err(|e| ApiError::unprocessable(format!("secret: {e}")))?;
    Ok(SecretEntry::v1(s.to_string()))
}

fn parse_signing_key(s: &str) -> Result<SecretEntry, ApiError> {
    let key = SigningKey::parse(s).map_err(|e| ApiError::unprocessable(format!("signing_key: {e}")))?;
    Ok(v1a_entry(&key))
}

/// Which schemes a write asks for: `signatures` when given, else the stored ones plus the
/// scheme of a key written. A key written for a scheme left out is refused.
fn wanted(
    stored: (bool, bool),
    signatures: Option<&[Scheme]>,
    secret: bool,
    signing_key: bool,
) -> Result<(bool, bool), ApiError> {
    let wanted = match signatures {
        Some([]) => return Err(ApiError::unprocessable("signatures: at least one of \"v1\" and \"v1a\"")),
        Some(list) => (list.contains(&Scheme::V1), list.contains(&Scheme::V1a)),
        None => (stored.0 || secret, stored.1 || signing_key),
    };
    if secret && !wanted.0 {
        return Err(ApiError::unprocessable("secret: is a v1 secret, and signatures leaves v1 out"));
    }
    if signing_key && !wanted.1 {
        return Err(ApiError::unprocessable("signing_key: is a v1a key, and signatures leaves v1a out"));
    }
    Ok(wanted)
}

/// Applies an endpoint write's `signatures`, `secret` and `signing_key` to `spec`: a key
/// written replaces its scheme's keys; a scheme asked for without a key gets a generated
/// one; a scheme left out loses its keys. `v1` entries stay first.
pub(super) fn apply(
    spec: &mut EndpointSpec,
    signatures: Option<Vec<Scheme>>,
    secret: Option<String>,
    signing_key: Option<String>,
) -> Result<(), ApiError> {
    let (v1, v1a) = wanted(kinds(&spec.secrets), signatures.as_deref(), secret.is_some(), signing_key.is_some())?;
    let secret = secret.as_deref().map(parse_secret).transpose()?;
    let signing_key = signing_key.as_deref().map(parse_signing_key).transpose()?;
    let (mut hmac, mut ed): (Vec<SecretEntry>, Vec<SecretEntry>) =
        std::mem::take(&mut spec.secrets).into_iter().partition(|s| !s.is_v1a());
    set(&mut hmac, v1, secret, || SecretEntry::v1(Secret::generate(&mut rand::rng()).to_string()));
    set(&mut ed, v1a, signing_key, || v1a_entry(&SigningKey::generate(&mut rand::rng())));
    spec.secrets = hmac.into_iter().chain(ed).collect();
    Ok(())
}

/// One scheme's entries after a write: none when left out, the one written, or a generated
/// one when it has none.
fn set(entries: &mut Vec<SecretEntry>, on: bool, written: Option<SecretEntry>, generate: impl FnOnce() -> SecretEntry) {
    match (on, written) {
        (false, _) => entries.clear(),
        (true, Some(entry)) => *entries = vec![entry],
        (true, None) if entries.is_empty() => entries.push(generate()),
        (true, None) => {}
    }
}

/// A rotation's request: which scheme, and the new key (generated when absent).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RotateIn {
    /// The new `v1` secret (`whsec_…`).
    secret: Option<String>,
    /// The new `v1a` key (`whsk_…`), write-only.
    signing_key: Option<String>,
    /// Rotate only this scheme's key; absent: the scheme of the key written, or every
    /// scheme the endpoint signs with.
    signature: Option<Scheme>,
}

/// What a rotation made: the new keys.
#[derive(Debug, Default)]
pub(super) struct Rotated {
    /// The new `v1` secret, if `v1` was rotated.
    pub(super) secret: Option<String>,
    /// The new `v1a` public key, if `v1a` was rotated.
    pub(super) public_key: Option<PublicKeyOut>,
}

/// Rotates `input`'s schemes: a new key first, the previous ones of those schemes valid until
/// `grace_until` (or their own end, if sooner), the other scheme's untouched; expired ones go.
pub(super) fn rotate(
    spec: &mut EndpointSpec,
    input: RotateIn,
    now: Millis,
    grace_until: Millis,
) -> Result<Rotated, ApiError> {
    let valid: Vec<SecretEntry> =
        spec.secrets.iter().filter(|s| s.expires_at.is_none_or(|t| t > now)).cloned().collect();
    let stored = kinds(&valid);
    let (v1, v1a) = match input.signature {
        Some(Scheme::V1) => (true, false),
        Some(Scheme::V1a) => (false, true),
        None if input.secret.is_some() || input.signing_key.is_some() => {
            (input.secret.is_some(), input.signing_key.is_some())
        }
        None => stored,
    };
    for (asked, has, field, scheme) in [
        (v1, stored.0, if input.secret.is_some() { "secret" } else { "signature" }, "v1"),
        (v1a, stored.1, if input.signing_key.is_some() { "signing_key" } else { "signature" }, "v1a"),
    ] {
        if asked && !has {
            return Err(ApiError::unprocessable(format!(
                "{field}: this endpoint does not sign {scheme}; add it with PATCH {{\"signatures\": …}}"
            )));
        }
    }
    if input.secret.is_some() && !v1 {
        return Err(ApiError::unprocessable("secret: is a v1 secret, and signature is v1a"));
    }
    if input.signing_key.is_some() && !v1a {
        return Err(ApiError::unprocessable("signing_key: is a v1a key, and signature is v1"));
    }
    let new_v1 = match (v1, input.secret) {
        (true, Some(s)) => Some(parse_secret(&s)?),
        (true, None) => Some(SecretEntry::v1(Secret::generate(&mut rand::rng()).to_string())),
        (false, _) => None,
    };
    let new_v1a = match (v1a, input.signing_key) {
        (true, Some(s)) => Some(parse_signing_key(&s)?),
        (true, None) => Some(v1a_entry(&SigningKey::generate(&mut rand::rng()))),
        (false, _) => None,
    };
    let retire = |mut s: SecretEntry| {
        if (s.is_v1a() && v1a) || (!s.is_v1a() && v1) {
            s.expires_at = Some(s.expires_at.unwrap_or(grace_until).min(grace_until));
        }
        s
    };
    let (hmac, ed): (Vec<SecretEntry>, Vec<SecretEntry>) = valid.into_iter().map(retire).partition(|s| !s.is_v1a());
    let rotated = Rotated {
        secret: new_v1.as_ref().map(|s| s.secret.clone()),
        public_key: new_v1a.as_ref().and_then(|s| public_keys(std::iter::once(s)).pop()),
    };
    spec.secrets = new_v1.into_iter().chain(hmac).chain(new_v1a).chain(ed).collect();
    Ok(rotated)
}

/// `{tenant}` of the JWKS route.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct JwksPath {
    /// The tenant's id.
    tenant: String,
}

/// The JWKS route's filter.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct JwksQuery {
    /// Only this endpoint's keys (none if it is not the tenant's).
    endpoint: Option<String>,
}

/// A JSON Web Key Set (RFC 7517).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Jwks {
    keys: Vec<Jwk>,
}

/// One ed25519 public key as a JWK (RFC 8037).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Jwk {
    /// `OKP`.
    kty: &'static str,
    /// `Ed25519`.
    crv: &'static str,
    /// base64url of the public key, unpadded.
    x: String,
    /// The key's RFC 7638 thumbprint.
    kid: String,
    /// `EdDSA`.
    alg: &'static str,
    /// `sig`.
    #[serde(rename = "use")]
    use_: &'static str,
}

/// How long a receiver may cache the key set: a rotation's new key signs beside the
/// previous one (`delivery.secret_grace`), so a set this old still verifies.
const JWKS_MAX_AGE_SECS: u32 = 300;

/// Endpoints read per store page while collecting a tenant's keys.
const JWKS_PAGE: u32 = 500;

#[utoipa::path(
    get, path = "/v1/tenants/{tenant}/jwks.json", tag = "endpoints", operation_id = "tenant_jwks",
    params(JwksPath, JwksQuery),
    responses((status = 200, description = "The `v1a` public keys of the tenant's endpoints that sign now (current and \
        in a rotation's grace), without a token: public keys only. A tenant without any, or unknown, has an empty set \
        (the route tells nothing else).", body = Jwks)),
)]
pub(crate) async fn jwks(
    State(state): State<Arc<AppState>>,
    Path(JwksPath { tenant }): Path<JwksPath>,
    Query(q): Query<JwksQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let now = state.clock.now();
    let mut keys: Vec<Jwk> = Vec::new();
    let mut add = |spec: &EndpointSpec| {
        let valid = spec.secrets.iter().filter(|s| s.expires_at.is_none_or(|t| t > now));
        for key in valid.filter_map(|s| PublicKey::parse(s.public_key.as_deref()?).ok()) {
            let kid = key.kid();
            if !keys.iter().any(|k| k.kid == kid) {
                keys.push(Jwk { kty: "OKP", crv: "Ed25519", x: key.jwk_x(), kid, alg: "EdDSA", use_: "sig" });
            }
        }
    };
    if let Ok(tenant) = TenantId::parse(&tenant) {
        match q.endpoint {
            Some(id) => {
                if let Some(e) = state.store.endpoint(&EndpointId::from_stored(&id)).await?
                    && e.tenant == tenant
                {
                    add(&e.spec);
                }
            }
            None => {
                let mut after: Option<EndpointId> = None;
                loop {
                    let page = state.store.endpoint_page(&tenant, after.as_ref(), JWKS_PAGE, None).await?;
                    page.iter().for_each(|e| add(&e.spec));
                    match page.last() {
                        Some(last) if page.len() == JWKS_PAGE as usize => after = Some(last.id.clone()),
                        _ => break,
                    }
                }
            }
        }
    }
    let headers = [
        (CONTENT_TYPE, "application/json".to_string()),
        (CACHE_CONTROL, format!("public, max-age={JWKS_MAX_AGE_SECS}")),
    ];
    Ok((headers, axum::Json(Jwks { keys })))
}
