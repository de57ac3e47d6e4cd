//! Standard Webhooks `v1a`: ed25519 signatures over `id.timestamp.body`, `whsk_` (secret)
//! and `whpk_` (public) keys, and a public key as a JWK (RFC 8037) named by its RFC 7638
//! thumbprint. Pure, like [`super`]: no clock, no store, no choice of which keys are valid.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ed25519_dalek::{Signature, Signer as _, Verifier as _, VerifyingKey};
use rand::{CryptoRng, Rng};
use sha2::{Digest, Sha256};

use super::LENIENT;

/// Prefix of a serialised secret (signing) key.
pub const SECRET_KEY_PREFIX: &str = "whsk_";
/// Prefix of a serialised public key.
pub const PUBLIC_KEY_PREFIX: &str = "whpk_";

/// An endpoint's ed25519 signing key. `Display` gives `whsk_<base64 of the 32-byte seed>`;
/// `Debug` hides it.
#[derive(Clone)]
pub struct SigningKey(ed25519_dalek::SigningKey);

/// An ed25519 public key. `Display` gives `whpk_<base64 of its 32 bytes>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

/// A rejected key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The string did not start with the kind's prefix.
    #[error("must start with \"{0}\"")]
    MissingPrefix(&'static str),
    /// The part after the prefix was not standard base64.
    #[error("is not valid base64")]
    Base64,
    /// A secret key of the wrong length.
    #[error("must be 32 bytes (the seed) or 64 (the seed, then its public key), got {0}")]
    SecretLength(usize),
    /// A 64-byte secret key whose second half is not the public key of its first.
    #[error("its last 32 bytes are not the public key of its first 32")]
    Mismatch,
    /// A public key of the wrong length, or not a point of the curve.
    #[error("must be a 32-byte ed25519 public key")]
    Public,
}

impl SigningKey {
    /// Parses `whsk_<standard base64>` of the 32-byte seed, or of the 64 bytes of seed and
    /// public key that libsodium (and Svix) write, whose public half must match.
    pub fn parse(s: &str) -> Result<SigningKey, KeyError> {
        let b64 = s.strip_prefix(SECRET_KEY_PREFIX).ok_or(KeyError::MissingPrefix(SECRET_KEY_PREFIX))?;
        let bytes = LENIENT.decode(b64).map_err(|_| KeyError::Base64)?;
        match bytes.len() {
            32 => Ok(SigningKey(ed25519_dalek::SigningKey::from_bytes(&bytes[..].try_into().expect("32 bytes")))),
            64 => ed25519_dalek::SigningKey::from_keypair_bytes(&bytes[..].try_into().expect("64 bytes"))
                .map(SigningKey)
                .map_err(|_| KeyError::Mismatch),
            n => Err(KeyError::SecretLength(n)),
        }
    }

    /// A new key from 32 random bytes. Requires a cryptographically secure generator.
    pub fn generate(rng: &mut (impl Rng + CryptoRng)) -> SigningKey {
        let mut seed = [0u8; 32];
        rng.fill(&mut seed);
        SigningKey(ed25519_dalek::SigningKey::from_bytes(&seed))
    }

    /// Its public key.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    fn sign_message(&self, message: &[u8]) -> [u8; 64] {
        self.0.sign(message).to_bytes()
    }
}

impl fmt::Display for SigningKey {
    /// The `whsk_<base64 seed>` form accepted by [`SigningKey::parse`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SECRET_KEY_PREFIX}{}", STANDARD.encode(self.0.to_bytes()))
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey(<redacted>, public {})", self.public_key())
    }
}

impl PublicKey {
    /// Parses `whpk_<standard base64 of 32 bytes>`.
    pub fn parse(s: &str) -> Result<PublicKey, KeyError> {
        let b64 = s.strip_prefix(PUBLIC_KEY_PREFIX).ok_or(KeyError::MissingPrefix(PUBLIC_KEY_PREFIX))?;
        let bytes = LENIENT.decode(b64).map_err(|_| KeyError::Base64)?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| KeyError::Public)?;
        VerifyingKey::from_bytes(&bytes).map(PublicKey).map_err(|_| KeyError::Public)
    }

    /// The JWK `x` member: base64url of the key, unpadded (RFC 8037).
    pub fn jwk_x(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.0.as_bytes())
    }

    /// The key's RFC 7638 thumbprint (base64url SHA-256 of its required members in
    /// lexicographic order), its `kid`: the same key has the same id wherever it is used.
    pub fn kid(&self) -> String {
        let canonical = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#, self.jwk_x());
        URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
    }

    fn verify_message(&self, message: &[u8], signature: &[u8]) -> bool {
        Signature::from_slice(signature).is_ok_and(|s| self.0.verify(message, &s).is_ok())
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PUBLIC_KEY_PREFIX}{}", STANDARD.encode(self.0.as_bytes()))
    }
}

/// What is signed: `{msg_id}.{timestamp_secs}.{body}`.
fn message(msg_id: &str, timestamp_secs: i64, body: &[u8]) -> Vec<u8> {
    let ts = timestamp_secs.to_string();
    let mut m = Vec::with_capacity(msg_id.len() + ts.len() + body.len() + 2);
    m.extend_from_slice(msg_id.as_bytes());
    m.push(b'.');
    m.extend_from_slice(ts.as_bytes());
    m.push(b'.');
    m.extend_from_slice(body);
    m
}

/// One `v1a,<base64 ed25519 signature>` entry per key, in order.
pub fn signatures(keys: &[&SigningKey], msg_id: &str, timestamp_secs: i64, body: &[u8]) -> Vec<String> {
    if keys.is_empty() {
        return Vec::new();
    }
    let m = message(msg_id, timestamp_secs, body);
    keys.iter().map(|k| format!("v1a,{}", STANDARD.encode(k.sign_message(&m)))).collect()
}

/// Whether any `v1a` entry of a `webhook-signature` header is `key`'s signature. Entries of
/// other versions and malformed entries are ignored.
pub fn verify(key: &PublicKey, msg_id: &str, timestamp_secs: i64, body: &[u8], header: &str) -> bool {
    let m = message(msg_id, timestamp_secs, body);
    header
        .split_ascii_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1a,"))
        .filter_map(|b64| STANDARD.decode(b64).ok())
        .any(|sig| key.verify_message(&m, &sig))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    // RFC 8037, appendix A: the private key `d`, its public key `x`, the thumbprint of the
    // public JWK (A.3), and an Ed25519 signature of a JWS signing input (A.4).
    const RFC_D: &str = "nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A";
    const RFC_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
    const RFC_KID: &str = "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k";
    const RFC_INPUT: &[u8] = b"eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc";
    const RFC_SIG: &str = "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg";

    fn rfc_key() -> SigningKey {
        let seed = URL_SAFE_NO_PAD.decode(RFC_D).unwrap();
        SigningKey::parse(&format!("whsk_{}", STANDARD.encode(seed))).unwrap()
    }

    #[test]
    fn rfc_8037_vectors() {
        let key = rfc_key();
        let public = key.public_key();
        assert_eq!(public.jwk_x(), RFC_X);
        assert_eq!(public.kid(), RFC_KID);
        assert_eq!(URL_SAFE_NO_PAD.encode(key.sign_message(RFC_INPUT)), RFC_SIG);
        assert!(public.verify_message(RFC_INPUT, &URL_SAFE_NO_PAD.decode(RFC_SIG).unwrap()));
    }

    #[test]
    fn signs_id_timestamp_body_and_verifies() {
        let key = rfc_key();
        let public = key.public_key();
        let header = signatures(&[&key], "msg_1", 1_614_265_330, b"{}").join(" ");
        assert!(header.starts_with("v1a,") && !header.contains(' '));
        assert!(verify(&public, "msg_1", 1_614_265_330, b"{}", &header));
        // The same bytes an independent verifier checks: `id.timestamp.body`.
        let sig = STANDARD.decode(&header["v1a,".len()..]).unwrap();
        assert!(public.verify_message(b"msg_1.1614265330.{}", &sig));
        let changed: [(&str, i64, &[u8]); 3] =
            [("msg_2", 1_614_265_330, b"{}"), ("msg_1", 1, b"{}"), ("msg_1", 1_614_265_330, b"{ }")];
        for (id, ts, body) in changed {
            assert!(!verify(&public, id, ts, body, &header), "{id} {ts}");
        }
        let other = SigningKey::generate(&mut StdRng::seed_from_u64(3)).public_key();
        assert!(!verify(&other, "msg_1", 1_614_265_330, b"{}", &header));
        let hmac_only = header.replacen("v1a,", "v1,", 1);
        for bad in ["", "v1a,", "v1a,!!!", &hmac_only, "v1a,AAAA"] {
            assert!(!verify(&public, "msg_1", 1_614_265_330, b"{}", bad), "{bad:?}");
        }
        assert!(signatures(&[], "msg_1", 0, b"").is_empty());
    }

    #[test]
    fn parse_takes_the_seed_or_seed_and_public_key() {
        let key = rfc_key();
        let seed = URL_SAFE_NO_PAD.decode(RFC_D).unwrap();
        let mut pair = seed.clone();
        pair.extend_from_slice(&URL_SAFE_NO_PAD.decode(RFC_X).unwrap());
        let long = SigningKey::parse(&format!("whsk_{}", STANDARD.encode(&pair))).unwrap();
        assert_eq!(long.to_string(), key.to_string(), "displayed as the seed");
        assert_eq!(SigningKey::parse(&key.to_string()).unwrap().public_key(), key.public_key());
        let unpadded = key.to_string().trim_end_matches('=').to_string();
        assert_eq!(SigningKey::parse(&unpadded).unwrap().public_key(), key.public_key());
        let mut wrong = pair.clone();
        wrong[40] ^= 1;
        let cases = [
            (STANDARD.encode(&seed), KeyError::MissingPrefix("whsk_")),
            (format!("whsec_{}", STANDARD.encode(&seed)), KeyError::MissingPrefix("whsk_")),
            ("whsk_not base64!".to_string(), KeyError::Base64),
            (format!("whsk_{}", STANDARD.encode(&seed[..31])), KeyError::SecretLength(31)),
            (format!("whsk_{}", STANDARD.encode([seed.clone(), vec![0]].concat())), KeyError::SecretLength(33)),
            (format!("whsk_{}", STANDARD.encode(wrong)), KeyError::Mismatch),
        ];
        for (input, want) in cases {
            assert_eq!(SigningKey::parse(&input).unwrap_err(), want, "{input:?}");
        }
    }

    #[test]
    fn public_keys_round_trip_and_debug_hides_the_secret() {
        let key = SigningKey::generate(&mut StdRng::seed_from_u64(1));
        let public = key.public_key();
        assert!(public.to_string().starts_with("whpk_"));
        assert_eq!(PublicKey::parse(&public.to_string()).unwrap(), public);
        assert_eq!(PublicKey::parse("whpk_AAAA").unwrap_err(), KeyError::Public);
        assert_eq!(PublicKey::parse("whsk_AAAA").unwrap_err(), KeyError::MissingPrefix("whpk_"));
        let debug = format!("{key:?}");
        let secret = key.to_string();
        assert!(!debug.contains(&secret["whsk_".len()..]) && debug.contains(&public.to_string()), "{debug}");
        assert_ne!(SigningKey::generate(&mut StdRng::seed_from_u64(2)).public_key(), public);
    }
}
