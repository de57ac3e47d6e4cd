//! Batching, an endpoint's `batch` setting: several events in one request, and the pure
//! parts of such a request: its envelope (`{"type":"batch","data":[…]}`), its
//! `webhook-id`, and the receiver's answer that accepts part of it (`{"failed": [ids]}`).
//! No I/O, no clock.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Most events in one batch (as Svix allows).
pub const MAX_BATCH_EVENTS: u32 = 1000;
/// Most payload bytes in one batch: 16 MiB.
pub const MAX_BATCH_BYTES: u64 = 16 * 1024 * 1024;
/// Longest wait for company, in milliseconds: 300 s (as Svix allows).
pub const MAX_BATCH_WAIT_MS: u64 = 300_000;
/// The envelope's `type`.
pub const BATCH_TYPE: &str = "batch";

/// An endpoint's batching: at most `max_events` events or `max_bytes` bytes of payload per
/// request, waiting at most `max_wait_ms` from the oldest one's due time for company.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batching {
    pub max_events: u32,
    pub max_bytes: u64,
    pub max_wait_ms: u64,
}

/// Why a batching setting was refused: the field (`batch.…`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchError {
    pub field: &'static str,
    pub reason: String,
}

impl Batching {
    /// Checks the bounds: 1 to [`MAX_BATCH_EVENTS`] events, 1 byte to [`MAX_BATCH_BYTES`],
    /// a wait of at most [`MAX_BATCH_WAIT_MS`].
    pub fn check(&self) -> Result<(), BatchError> {
        if !(1..=MAX_BATCH_EVENTS).contains(&self.max_events) {
            let reason = format!("must be between 1 and {MAX_BATCH_EVENTS}, not {}", self.max_events);
            return Err(BatchError { field: "batch.max_events", reason });
        }
        if !(1..=MAX_BATCH_BYTES).contains(&self.max_bytes) {
            let reason = format!("must be between 1 and {MAX_BATCH_BYTES} bytes, not {}", self.max_bytes);
            return Err(BatchError { field: "batch.max_bytes", reason });
        }
        if self.max_wait_ms > MAX_BATCH_WAIT_MS {
            let reason = format!("must be at most 300s, not {}ms", self.max_wait_ms);
            return Err(BatchError { field: "batch.max_wait", reason });
        }
        Ok(())
    }

    /// Whether `events` events of `bytes` payload bytes fill a batch (nothing more may join).
    pub fn full(&self, events: usize, bytes: u64) -> bool {
        events >= self.max_events as usize || bytes >= self.max_bytes
    }
}

/// The body of a batch: `{"type":"batch","data":[e1,e2,…]}`, each element one event's
/// envelope (or what the endpoint's transform made of it) as it is, when it is JSON, and
/// as a JSON string when it is not.
pub fn batch_envelope<'a>(elements: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut body = format!("{{\"type\":\"{BATCH_TYPE}\",\"data\":[").into_bytes();
    for (i, e) in elements.into_iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(e).is_ok() {
            body.extend_from_slice(e);
        } else {
            let text = String::from_utf8_lossy(e);
            body.extend(serde_json::to_vec(&text).expect("a string serialises"));
        }
    }
    body.extend_from_slice(b"]}");
    body
}

/// A batch's `webhook-id`: `batch_` and 32 hex digits of the SHA-256 of its deliveries'
/// ids (in any order): the same on every retry of the same batch, different for any other.
pub fn batch_id<'a>(delivery_ids: impl IntoIterator<Item = &'a str>) -> String {
    let mut ids: Vec<&str> = delivery_ids.into_iter().collect();
    ids.sort_unstable();
    let mut h = Sha256::new();
    for id in ids {
        h.update(id.as_bytes());
        h.update(b"\n");
    }
    format!("batch_{}", hex::encode(&h.finalize()[..16]))
}

/// The events a receiver refused in a 2xx answer to a batch: its body's `failed`, a list
/// of event ids (`{"failed": ["evt_1", …]}`). `None`: the whole batch is accepted.
pub fn refused_events(body: &str) -> Option<Vec<String>> {
    #[derive(Deserialize)]
    struct Answer {
        failed: Vec<String>,
    }
    let a: Answer = serde_json::from_str(body).ok()?;
    (!a.failed.is_empty()).then_some(a.failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_holds_each_event_as_it_is() {
        let body = batch_envelope([&b"{\"id\":\"evt_1\"}"[..], b"[1, 2.50]", b"not json"]);
        assert_eq!(body, b"{\"type\":\"batch\",\"data\":[{\"id\":\"evt_1\"},[1, 2.50],\"not json\"]}");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["data"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn a_batch_id_is_stable_and_names_its_deliveries() {
        let a = batch_id(["dlv_1", "dlv_2"]);
        assert_eq!(a, batch_id(["dlv_1", "dlv_2"]));
        assert!(a.starts_with("batch_") && a.len() == 6 + 32, "{a}");
        assert_ne!(a, batch_id(["dlv_1"]));
        assert_eq!(a, batch_id(["dlv_2", "dlv_1"]), "claimed again in another order, the same batch");
        assert_ne!(batch_id(["dlv_1", "2"]), batch_id(["dlv_12"]));
    }

    #[test]
    fn a_receiver_refuses_part_of_a_batch_by_naming_the_events() {
        assert_eq!(refused_events("{\"failed\":[\"evt_2\"]}"), Some(vec!["evt_2".to_string()]));
        for whole in ["", "ok", "{}", "{\"failed\":[]}", "{\"failed\":\"evt_2\"}", "[\"evt_2\"]"] {
            assert_eq!(refused_events(whole), None, "{whole:?}");
        }
    }

    #[test]
    fn bounds_name_the_field() {
        let ok = Batching { max_events: 1000, max_bytes: MAX_BATCH_BYTES, max_wait_ms: 300_000 };
        assert_eq!(ok.check(), Ok(()));
        let cases = [
            (Batching { max_events: 0, ..ok }, "batch.max_events"),
            (Batching { max_events: 1001, ..ok }, "batch.max_events"),
            (Batching { max_bytes: 0, ..ok }, "batch.max_bytes"),
            (Batching { max_bytes: MAX_BATCH_BYTES + 1, ..ok }, "batch.max_bytes"),
            (Batching { max_wait_ms: 300_001, ..ok }, "batch.max_wait"),
        ];
        for (b, field) in cases {
            assert_eq!(b.check().unwrap_err().field, field, "{b:?}");
        }
        assert!(ok.full(1000, 0) && ok.full(1, MAX_BATCH_BYTES) && !ok.full(999, 10));
    }
}
