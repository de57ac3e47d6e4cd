//! Sealing stored secrets under the operator's key (`[secrets] key`): AES-256-GCM (ring),
//! a random 96-bit nonce per value. A sealed value is `v1:<key id>:<base64(nonce ‖
//! ciphertext ‖ tag)>`, the key id being the first 8 hex digits of the key's SHA-256, so a
//! value sealed under a previous key (`[secrets] previous_keys`) is still opened during a
//! rotation. The randomness is an argument: no global RNG here.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rand::{CryptoRng, Rng};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use sha2::{Digest, Sha256};

use crate::model::{OAuth2, WriteOnly};

/// One operator key.
struct Key {
    id: String,
    key: LessSafeKey,
}

impl Key {
    /// A key from its base64 text (32 bytes).
    fn parse(text: &str) -> Result<Key, String> {
        let bytes = STANDARD.decode(text.trim()).map_err(|_| "is not base64".to_string())?;
        if bytes.len() != 32 {
            return Err(format!("must be 32 bytes of base64 (e.g. `openssl rand -base64 32`), not {}", bytes.len()));
        }
        let id = hex::encode(&Sha256::digest(&bytes)[..4]);
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| "is not an AES-256 key")?);
        Ok(Key { id, key })
    }
}

/// The node's sealing keys: the current one seals, every one opens.
pub struct Sealer {
    current: Key,
    previous: Vec<Key>,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let previous: Vec<&str> = self.previous.iter().map(|k| k.id.as_str()).collect();
        write!(f, "Sealer(key {}, previous {previous:?})", self.current.id)
    }
}

impl Sealer {
    /// The current key and the previous ones (base64 of 32 bytes each); `Err` names which
    /// one is wrong (`0` current, `n` the n-th previous) and why.
    pub fn new(current: &str, previous: &[String]) -> Result<Sealer, (usize, String)> {
        Ok(Sealer {
            current: Key::parse(current).map_err(|e| (0, e))?,
            previous: previous
                .iter()
                .enumerate()
                .map(|(i, k)| Key::parse(k).map_err(|e| (i + 1, e)))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Seals `plain` under the current key.
    pub fn seal(&self, plain: &str, rng: &mut (impl Rng + CryptoRng)) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        rng.fill_bytes(&mut nonce);
        let mut data = plain.as_bytes().to_vec();
        self.current
            .key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.current.id.as_bytes()),
                &mut data,
            )
            .expect("AES-GCM seals any length Herald stores");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        format!("v1:{}:{}", self.current.id, STANDARD.encode(out))
    }

    /// Opens a value sealed under the current or a previous key.
    pub fn open(&self, sealed: &str) -> Result<String, String> {
        let mut parts = sealed.splitn(3, ':');
        let (Some("v1"), Some(id), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return Err("not a sealed value".into());
        };
        let key = std::iter::once(&self.current).chain(&self.previous).find(|k| k.id == id).ok_or_else(|| {
            format!("sealed under key {id}, which is neither [secrets] key nor a previous_keys entry")
        })?;
        let bytes = STANDARD.decode(body).map_err(|_| "not a sealed value".to_string())?;
        if bytes.len() < NONCE_LEN {
            return Err("not a sealed value".into());
        }
        let (nonce, data) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| "not a sealed value".to_string())?;
        let mut data = data.to_vec();
        let plain = key
            .key
            .open_in_place(nonce, Aad::from(id.as_bytes()), &mut data)
            .map_err(|_| "does not open".to_string())?;
        String::from_utf8(plain.to_vec()).map_err(|_| "does not open".to_string())
    }
}

/// `auth` with its client secret opened when it is stored sealed; one stored as written (on
/// a node without a key, or before secrets were sealed) as it is. `Err` says why it does not
/// open: this node has no key, or not the one it was sealed under.
pub fn open_oauth2(auth: &OAuth2, sealer: Option<&Sealer>) -> Result<OAuth2, String> {
    if !auth.client_secret_sealed {
        return Ok(auth.clone());
    }
    let sealer = sealer.ok_or("the client secret: no [secrets] key on this node")?;
    let plain = sealer.open(auth.client_secret.expose()).map_err(|e| format!("the client secret {e}"))?;
    Ok(OAuth2 { client_secret: WriteOnly::new(plain), client_secret_sealed: false, ..auth.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const K1: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    const K2: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";

    #[test]
    fn seal_open_and_rotate() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let old = Sealer::new(K1, &[]).unwrap();
        let sealed = old.seal("-----BEGIN PRIVATE KEY-----", &mut rng);
        assert!(sealed.starts_with("v1:") && !sealed.contains("PRIVATE"));
        assert_eq!(old.open(&sealed).unwrap(), "-----BEGIN PRIVATE KEY-----");
        assert_ne!(old.seal("x", &mut rng), old.seal("x", &mut rng), "a nonce per value");
        // Rotation: the new key seals, the old one still opens.
        let rotated = Sealer::new(K2, &[K1.to_string()]).unwrap();
        assert_eq!(rotated.open(&sealed).unwrap(), "-----BEGIN PRIVATE KEY-----");
        assert!(Sealer::new(K2, &[]).unwrap().open(&sealed).unwrap_err().contains("neither"));
        let mut tampered = sealed.clone();
        tampered.replace_range(tampered.len() - 4.., "AAA=");
        assert!(old.open(&tampered).is_err());
        assert_eq!(Sealer::new("c2hvcnQ=", &[]).unwrap_err().0, 0);
        assert_eq!(Sealer::new(K1, &["nope".into()]).unwrap_err().0, 1);
        assert!(!format!("{rotated:?}").contains(K1));
    }

    #[test]
    fn an_oauth2_secret_opens_when_sealed_and_is_used_as_stored_otherwise() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let sealer = Sealer::new(K1, &[]).unwrap();
        let auth = |secret: String, sealed: bool| OAuth2 {
            token_url: "https://auth.example/token".into(),
            client_id: "c".into(),
            client_secret: WriteOnly::new(secret),
            client_secret_sealed: sealed,
            scopes: Vec::new(),
            audience: None,
            client_auth: Default::default(),
        };
        let sealed = auth(sealer.seal("s3cr3t", &mut rng), true);
        let opened = open_oauth2(&sealed, Some(&sealer)).unwrap();
        assert_eq!((opened.client_secret.expose(), opened.client_secret_sealed), ("s3cr3t", false));
        // Stored as written: used as it is, with or without a key.
        let plain = auth("as-written".into(), false);
        assert_eq!(open_oauth2(&plain, Some(&sealer)).unwrap(), plain);
        assert_eq!(open_oauth2(&plain, None).unwrap(), plain);
        // Sealed, on a node without the key it was sealed under, or without any.
        let other = Sealer::new(K2, &[]).unwrap();
        assert!(open_oauth2(&sealed, Some(&other)).unwrap_err().starts_with("the client secret sealed under key"));
        assert_eq!(open_oauth2(&sealed, None).unwrap_err(), "the client secret: no [secrets] key on this node");
    }
}
