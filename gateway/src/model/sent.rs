//! What Herald sent on one attempt, as its record keeps it: the headers as they went out,
//! and the body only when it is not the event's own envelope (a transform plugin changed
//! it), cut at [`MAX_SENT_BODY`]. Pure: building one reads no store and no clock.

/// Longest body an attempt keeps, in bytes; a longer one is kept cut (see
/// [`SentRequest::truncated`]). Bounds what a transform can add to the store per attempt.
pub const MAX_SENT_BODY: usize = 64 * 1024;

/// The request of one attempt as the receiver got it (signatures included: the receiver
/// saw them; nothing that was not in the request, such as the endpoint's secret, is here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentRequest {
    /// The headers in the order Herald sent them (the HTTP client adds `host` and
    /// `content-length`), as a JSON array of `[name, value]` pairs: encoded once by the
    /// attempt, so the store's writer copies text and never serialises.
    pub headers_json: String,
    /// The body when a transform plugin changed it: its first [`MAX_SENT_BODY`] bytes, any
    /// bytes that are not UTF-8 shown as U+FFFD. `None`: the body was Herald's envelope of
    /// the event's stored payload, which is not stored twice.
    pub body: Option<String>,
    /// Bytes in the body as sent (before any cut).
    pub body_size: u64,
}

impl SentRequest {
    /// The record of sending `headers` and `body`; `body_is_envelope`: no transform changed
    /// Herald's envelope, so only its size is kept.
    pub fn new(headers: &[(String, String)], body: &[u8], body_is_envelope: bool) -> SentRequest {
        SentRequest {
            headers_json: serde_json::to_string(headers).expect("string pairs serialise"),
            body: (!body_is_envelope).then(|| text_prefix(body)),
            body_size: body.len() as u64,
        }
    }

    /// The headers as sent; `Err` only for text this type did not write.
    pub fn headers(&self) -> Result<Vec<(String, String)>, serde_json::Error> {
        serde_json::from_str(&self.headers_json)
    }

    /// The stored body is only the first [`MAX_SENT_BODY`] bytes of what was sent.
    pub fn truncated(&self) -> bool {
        self.body.is_some() && self.body_size > MAX_SENT_BODY as u64
    }
}

/// The first [`MAX_SENT_BODY`] bytes of `body` as text, cut before a character split by
/// the limit rather than through it.
fn text_prefix(body: &[u8]) -> String {
    let cut = &body[..body.len().min(MAX_SENT_BODY)];
    let cut = match std::str::from_utf8(cut) {
        Err(e) if e.error_len().is_none() => &cut[..e.valid_up_to()],
        _ => cut,
    };
    String::from_utf8_lossy(cut).into_owned()
}

/// The JSON envelope a receiver gets by default; the payload bytes are kept exactly.
pub fn envelope(event_id: &str, event_type: &str, created_at: super::Millis, payload: &str) -> String {
    let s = |v: &str| serde_json::to_string(v).expect("string serializes");
    format!(
        "{{\"id\":{},\"type\":{},\"timestamp\":{},\"data\":{}}}",
        s(event_id),
        s(event_type),
        s(&super::rfc3339(created_at)),
        payload
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers() -> Vec<(String, String)> {
        vec![("content-type".into(), "application/json".into()), ("x-a".into(), "\"quoted\"".into())]
    }

    #[test]
    fn an_envelope_body_keeps_only_its_size() {
        let s = SentRequest::new(&headers(), b"{\"id\":1}", true);
        assert_eq!((s.body.as_deref(), s.body_size, s.truncated()), (None, 8, false));
        assert_eq!(s.headers().unwrap(), headers());
    }

    #[test]
    fn a_changed_body_is_kept_and_cut_at_the_limit() {
        let small = SentRequest::new(&[], b"{\"text\":\"hi\"}", false);
        assert_eq!((small.body.as_deref(), small.truncated()), (Some("{\"text\":\"hi\"}"), false));
        let exact = SentRequest::new(&[], &vec![b'a'; MAX_SENT_BODY], false);
        assert_eq!((exact.body.as_ref().map(String::len), exact.truncated()), (Some(MAX_SENT_BODY), false));
        let big = SentRequest::new(&[], &vec![b'a'; MAX_SENT_BODY + 1], false);
        assert_eq!((big.body.as_ref().map(String::len), big.truncated()), (Some(MAX_SENT_BODY), true));
        assert_eq!(big.body_size, MAX_SENT_BODY as u64 + 1);
    }

    #[test]
    fn a_cut_never_splits_a_character_and_binary_shows_as_replacement() {
        let mut body = vec![b'a'; MAX_SENT_BODY - 1];
        body.extend("é".as_bytes());
        let s = SentRequest::new(&[], &body, false);
        assert_eq!(s.body.as_ref().map(String::len), Some(MAX_SENT_BODY - 1));
        assert!(s.truncated());
        let binary = SentRequest::new(&[], &[0xff, b'x'], false);
        assert_eq!(binary.body.as_deref(), Some("\u{fffd}x"));
    }

    #[test]
    fn envelope_keeps_payload_bytes() {
        let e = envelope("evt_1", "a.b", 0, "{\"x\": 1.50}");
        assert_eq!(
            e,
            "{\"id\":\"evt_1\",\"type\":\"a.b\",\"timestamp\":\"1970-01-01T00:00:00Z\",\"data\":{\"x\": 1.50}}"
        );
        serde_json::from_str::<serde_json::Value>(&e).unwrap();
    }
}
