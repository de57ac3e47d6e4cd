//! Standard Webhooks signing: `whsec_` secrets and `v1,<base64 HMAC-SHA256>` signatures over
//! `id.timestamp.body` (and `v1a`, ed25519, in [`v1a`]). Pure: it must not read the clock
//! (the timestamp is passed in), pick which secrets are valid, or build HTTP requests.

use std::fmt;

use base64::Engine as _;
use base64::alphabet;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use hmac::{Hmac, Mac};
use rand::{CryptoRng, Rng};
use sha2::Sha256;

pub mod seal;
pub mod v1a;

/// Header carrying the event id (stable across attempts and replays).
pub const HEADER_ID: &str = "webhook-id";
/// Header carrying the signing time in unix seconds (fresh on every attempt).
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// Header carrying the space-separated signatures.
pub const HEADER_SIGNATURE: &str = "webhook-signature";

/// Prefix of every serialised secret.
pub const SECRET_PREFIX: &str = "whsec_";
/// Shortest accepted key, in bytes.
pub const MIN_SECRET_LEN: usize = 24;
/// Longest accepted key, in bytes.
pub const MAX_SECRET_LEN: usize = 64;
/// Length of a generated key, in bytes.
pub const GENERATED_SECRET_LEN: usize = 32;

/// An endpoint signing key. `Display` gives the `whsec_…` form; `Debug` hides the key.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

/// A rejected secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The string did not start with `whsec_`.
    #[error("signing secret must start with \"whsec_\"")]
    MissingPrefix,
    /// The part after the prefix was not standard base64.
    #[error("signing secret is not valid base64")]
    Base64,
    /// The key was shorter or longer than allowed.
    #[error("signing secret must be {MIN_SECRET_LEN} to {MAX_SECRET_LEN} bytes, got {0}")]
    Length(usize),
}

/// Standard alphabet, padding optional on input (some generators strip it).
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

impl Secret {
    /// Parses `whsec_<standard base64>` holding a 24- to 64-byte key.
    pub fn parse(s: &str) -> Result<Secret, SecretError> {
        let b64 = s.strip_prefix(SECRET_PREFIX).ok_or(SecretError::MissingPrefix)?;
        let key = LENIENT.decode(b64).map_err(|_| SecretError::Base64)?;
        Secret::from_bytes(key)
    }

    /// Wraps raw key bytes, checking their length.
    pub fn from_bytes(key: Vec<u8>) -> Result<Secret, SecretError> {
        if !(MIN_SECRET_LEN..=MAX_SECRET_LEN).contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        Ok(Secret(key))
    }

    /// The raw key bytes (for signing plugins).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// A new random 32-byte key. Requires a cryptographically secure generator.
    pub fn generate(rng: &mut (impl Rng + CryptoRng)) -> Secret {
        let mut key = vec![0u8; GENERATED_SECRET_LEN];
        rng.fill(&mut key[..]);
        Secret(key)
    }

    fn mac(&self, msg_id: &str, timestamp_secs: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp_secs.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

impl fmt::Display for Secret {
    /// The `whsec_<base64>` form accepted by [`Secret::parse`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SECRET_PREFIX}{}", STANDARD.encode(&self.0))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes redacted>)", self.0.len())
    }
}

/// One `v1,<base64 HMAC-SHA256(key, "{msg_id}.{timestamp_secs}.{body}")>` signature.
pub fn signature(secret: &Secret, msg_id: &str, timestamp_secs: i64, body: &[u8]) -> String {
    let tag = secret.mac(msg_id, timestamp_secs, body).finalize().into_bytes();
    format!("v1,{}", STANDARD.encode(tag))
}

/// The `webhook-signature` header value: one `v1` signature per secret, then one `v1a` per
/// signing key, space-separated, so a receiver holding any one key verifies (during a
/// rotation, and whichever scheme it checks).
pub fn signature_header(
    secrets: &[&Secret],
    keys: &[&v1a::SigningKey],
    msg_id: &str,
    timestamp_secs: i64,
    body: &[u8],
) -> String {
    let mut entries: Vec<String> = secrets.iter().map(|s| signature(s, msg_id, timestamp_secs, body)).collect();
    entries.extend(v1a::signatures(keys, msg_id, timestamp_secs, body));
    entries.join(" ")
}

/// Whether any `v1` entry of a `webhook-signature` header matches `secret`, compared in
/// constant time. Entries of other versions and malformed entries are ignored.
pub fn verify(secret: &Secret, msg_id: &str, timestamp_secs: i64, body: &[u8], header: &str) -> bool {
    header
        .split_ascii_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter_map(|b64| STANDARD.decode(b64).ok())
        .any(|tag| secret.mac(msg_id, timestamp_secs, body).verify_slice(&tag).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TS: i64 = 1_614_265_330;
    const SPEC_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SPEC_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn key(len: usize) -> String {
        format!("whsec_{}", STANDARD.encode(vec![7u8; len]))
    }

    #[test]
    fn standard_webhooks_spec_example() {
        let secret = Secret::parse(SPEC_SECRET).unwrap();
        assert_eq!(signature(&secret, SPEC_ID, SPEC_TS, SPEC_BODY), SPEC_SIG);
        assert!(verify(&secret, SPEC_ID, SPEC_TS, SPEC_BODY, SPEC_SIG));
    }

    #[test]
    fn verify_rejects_any_change() {
        let s = Secret::parse(SPEC_SECRET).unwrap();
        let other = Secret::parse(&key(32)).unwrap();
        let body = br#"{"test": 2432232315}"#;
        assert!(!verify(&s, SPEC_ID, SPEC_TS, body, SPEC_SIG));
        assert!(!verify(&s, "msg_other", SPEC_TS, SPEC_BODY, SPEC_SIG));
        assert!(!verify(&s, SPEC_ID, SPEC_TS + 1, SPEC_BODY, SPEC_SIG));
        assert!(!verify(&other, SPEC_ID, SPEC_TS, SPEC_BODY, SPEC_SIG));
        let wrong_version = SPEC_SIG.replacen("v1,", "v2,", 1);
        for header in ["", "v1,", "v1,!!!", "garbage", &wrong_version, "v1,g0hM9SsE"] {
            assert!(!verify(&s, SPEC_ID, SPEC_TS, SPEC_BODY, header), "{header:?}");
        }
    }

    #[test]
    fn rotation_signs_with_every_secret() {
        let old = Secret::parse(SPEC_SECRET).unwrap();
        let new = Secret::parse(&key(32)).unwrap();
        let header = signature_header(&[&new, &old], &[], SPEC_ID, SPEC_TS, SPEC_BODY);
        let entries: Vec<&str> = header.split(' ').collect();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0], signature(&new, SPEC_ID, SPEC_TS, SPEC_BODY));
        assert_eq!(entries[1], SPEC_SIG);
        assert!(verify(&old, SPEC_ID, SPEC_TS, SPEC_BODY, &header));
        assert!(verify(&new, SPEC_ID, SPEC_TS, SPEC_BODY, &header));
        assert_eq!(signature_header(&[&old], &[], SPEC_ID, SPEC_TS, SPEC_BODY), SPEC_SIG);
        assert_eq!(signature_header(&[], &[], SPEC_ID, SPEC_TS, SPEC_BODY), "");
    }

    #[test]
    fn both_schemes_sign_v1_first() {
        let secret = Secret::parse(SPEC_SECRET).unwrap();
        let key = v1a::SigningKey::generate(&mut StdRng::seed_from_u64(5));
        let header = signature_header(&[&secret], &[&key], SPEC_ID, SPEC_TS, SPEC_BODY);
        let (v1, rest) = header.split_once(' ').unwrap();
        assert_eq!(v1, SPEC_SIG);
        assert!(rest.starts_with("v1a,") && !rest.contains(' '));
        assert!(verify(&secret, SPEC_ID, SPEC_TS, SPEC_BODY, &header), "v1 ignores the v1a entry");
        assert!(v1a::verify(&key.public_key(), SPEC_ID, SPEC_TS, SPEC_BODY, &header));
        let only = signature_header(&[], &[&key], SPEC_ID, SPEC_TS, SPEC_BODY);
        assert_eq!(only, rest);
    }

    #[test]
    fn secret_length_bounds() {
        let cases = [
            (0, Err(SecretError::Length(0))),
            (16, Err(SecretError::Length(16))),
            (23, Err(SecretError::Length(23))),
            (24, Ok(())),
            (32, Ok(())),
            (64, Ok(())),
            (65, Err(SecretError::Length(65))),
        ];
        for (len, want) in cases {
            assert_eq!(Secret::parse(&key(len)).map(|_| ()), want, "{len} bytes");
            assert_eq!(Secret::from_bytes(vec![1; len]).map(|_| ()), want, "{len} bytes");
        }
    }

    #[test]
    fn secret_parse_errors() {
        let b64 = &SPEC_SECRET["whsec_".len()..];
        let cases = [
            (b64.to_owned(), SecretError::MissingPrefix),
            (format!("WHSEC_{b64}"), SecretError::MissingPrefix),
            (format!(" {SPEC_SECRET}"), SecretError::MissingPrefix),
            ("whsec_not base64!".to_owned(), SecretError::Base64),
            ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS-".to_owned(), SecretError::Base64),
            ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS".to_owned(), SecretError::Base64),
        ];
        for (input, want) in cases {
            assert_eq!(Secret::parse(&input).unwrap_err(), want, "{input:?}");
        }
    }

    #[test]
    fn padding_is_optional_on_input() {
        let padded = key(32);
        assert!(padded.ends_with('='));
        let bare = Secret::parse(padded.trim_end_matches('=')).unwrap();
        assert_eq!(bare.to_string(), padded);
    }

    #[test]
    fn display_round_trips_and_debug_hides_the_key() {
        let s = Secret::parse(SPEC_SECRET).unwrap();
        assert_eq!(s.to_string(), SPEC_SECRET);
        let debug = format!("{s:?}");
        assert_eq!(debug, "Secret(<24 bytes redacted>)");
        assert!(!debug.contains("MfKQ"));
    }

    #[test]
    fn generated_secrets_are_32_random_bytes() {
        let mut rng = StdRng::seed_from_u64(1);
        let a = Secret::generate(&mut rng);
        let b = Secret::generate(&mut rng);
        assert_eq!(a.0.len(), 32);
        assert_ne!(a.0, b.0);
        let reparsed = Secret::parse(&a.to_string()).unwrap();
        assert_eq!(reparsed.0, a.0);
    }

    #[test]
    fn negative_and_zero_timestamps_are_signed_as_decimal() {
        let s = Secret::from_bytes(vec![9; 24]).unwrap();
        for ts in [0, -1, i64::MAX] {
            let sig = signature(&s, "msg", ts, b"");
            assert!(verify(&s, "msg", ts, b"", &sig));
        }
    }
}
