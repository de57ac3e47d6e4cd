//! Signs deliveries with a Stripe-style scheme instead of Standard Webhooks:
//!
//! ```text
//! x-herald-signature: t=<timestamp>,v1=<hex HMAC-SHA256(secret, "{timestamp}.{body}")>
//! ```
//!
//! During secret rotation there is one `v1=` entry per valid secret, newest first.
//! The timestamp is the attempt's (`ctx.timestamp`), so every attempt is signed afresh.
//!
//! Configuration: `header` = the header name (default `x-herald-signature`).

use hmac::{Hmac, Mac};
use plugin_sdk::{DeliveryContext, Header, Hooks, Plugin, Request, config};
use sha2::Sha256;

/// The plugin; see the crate docs.
struct SignHmacHex;

const DEFAULT_HEADER: &str = "x-herald-signature";

impl Plugin for SignHmacHex {
    const HOOKS: Hooks = Hooks::SIGN;

    fn sign(ctx: &DeliveryContext, secrets: &[Vec<u8>], req: &Request) -> Result<Vec<Header>, String> {
        if secrets.is_empty() {
            return Err("the endpoint has no signing secret".to_string());
        }
        let header = config("header").unwrap_or_else(|| DEFAULT_HEADER.to_string());
        Ok(vec![(header, signature(ctx.timestamp, secrets, &req.body))])
    }
}

/// `t=<ts>,v1=<hex>[,v1=<hex>…]`, one `v1` per secret.
fn signature(timestamp: u64, secrets: &[Vec<u8>], body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let mut value = format!("t={ts}");
    for secret in secrets {
        let mut mac = keyed(secret);
        mac.update(ts.as_bytes());
        mac.update(b".");
        mac.update(body);
        value.push_str(",v1=");
        value.push_str(&hex::encode(mac.finalize().into_bytes()));
    }
    value
}

/// An HMAC already keyed with `secret`. Keying hashes two blocks, as much work as a short
/// body, so the keyed states of the last few secrets are kept (an endpoint signs with the
/// same one or two secrets for months).
fn keyed(secret: &[u8]) -> Hmac<Sha256> {
    thread_local! {
        static KEYED: std::cell::RefCell<Vec<(Vec<u8>, Hmac<Sha256>)>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    KEYED.with_borrow_mut(|keyed| {
        if let Some((_, mac)) = keyed.iter().find(|(s, _)| s.as_slice() == secret) {
            return mac.clone();
        }
        let mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
        if keyed.len() >= 8 {
            keyed.remove(0);
        }
        keyed.push((secret.to_vec(), mac.clone()));
        mac
    })
}

plugin_sdk::export!(SignHmacHex);

#[cfg(test)]
mod tests {
    use super::signature;

    #[test]
    fn matches_a_known_vector() {
        // python3 -c 'import hmac,hashlib; print(hmac.new(b"secret", b"1700000000.{\"a\":1}", hashlib.sha256).hexdigest())'
        let sig = signature(1_700_000_000, &[b"secret".to_vec()], br#"{"a":1}"#);
        assert_eq!(sig, "t=1700000000,v1=49f24e537407743fa4a0242bb63b94b9a47ee99cbbe071ccd8a22550ae411686");
    }

    #[test]
    fn signs_with_every_secret() {
        let sig = signature(1, &[b"new".to_vec(), b"old".to_vec()], b"body");
        assert_eq!(sig.matches(",v1=").count(), 2);
    }
}
