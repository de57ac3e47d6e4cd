//! CloudEvents 1.0 output, an endpoint's `cloudevents` setting: its mode and `source`,
//! and the pure encoding of one delivery's request in that mode: binary (`ce-*` headers,
//! the data as the body) or structured (`application/cloudevents+json`, the whole event as
//! JSON). No I/O. The brokers' bindings rename the `ce-*` headers where theirs differ
//! (`deliver`); the signature is made afterwards, over the bytes encoded here.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The `specversion` Herald writes.
pub const SPEC_VERSION: &str = "1.0";
/// The `content-type` of a structured-mode event.
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";
/// The `source` of an endpoint that sets none: its tenant's path.
pub const DEFAULT_SOURCE: &str = "/herald/tenants/{tenant}";

/// An endpoint's CloudEvents output; absent, deliveries carry Standard Webhooks' envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CloudEvents {
    pub mode: CeMode,
    /// The `source` attribute: a URI reference, `{tenant}` replaced by the tenant's id;
    /// absent: [`DEFAULT_SOURCE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// How an event is laid out (CloudEvents HTTP binding §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CeMode {
    /// The attributes as `ce-*` headers, the event's data as the body.
    Binary,
    /// `content-type: application/cloudevents+json`, the whole event as a JSON object.
    Structured,
}

/// One event's attributes, as the attempt knows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CeAttributes {
    /// The event's id.
    pub id: String,
    pub source: String,
    pub event_type: String,
    /// RFC 3339.
    pub time: String,
    /// The schema the catalog holds for the type, when it knows one.
    pub dataschema: Option<String>,
}

impl CloudEvents {
    /// The `source` of the tenant's events through this endpoint.
    pub fn source_for(&self, tenant: &str) -> String {
        self.source.as_deref().unwrap_or(DEFAULT_SOURCE).replace("{tenant}", tenant)
    }
}

/// How a request's headers travel: an HTTP request's (values percent-encoded as the HTTP
/// binding says), or a broker message's (values as they are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CeHeaders {
    Http,
    Broker,
}

/// Encodes a request (its headers and body: the event's data, as a transform left it) as
/// a CloudEvent in `mode`. `datacontenttype` is the request's `content-type`
/// (`application/json` when it has none). Binary: the `ce-*` attributes replace any of the
/// same name the request had. Structured: the body becomes the event, the data inline when
/// it is JSON (`data`), else base64 (`data_base64`).
pub fn encode(
    mode: CeMode,
    a: &CeAttributes,
    via: CeHeaders,
    headers: &mut Vec<(String, String)>,
    body: Vec<u8>,
) -> Vec<u8> {
    let content_type = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map_or_else(|| "application/json".to_string(), |(_, v)| v.clone());
    match mode {
        CeMode::Binary => {
            let ours = attributes(a);
            headers.retain(|(k, _)| match (k.get(..3), k.get(3..)) {
                (Some(p), Some(name)) if p.eq_ignore_ascii_case("ce-") => {
                    !ours.iter().any(|(n, _)| name.eq_ignore_ascii_case(n))
                }
                _ => true,
            });
            let value = |v: String| if via == CeHeaders::Http { header_value(&v) } else { v };
            headers.extend(ours.into_iter().map(|(name, v)| (format!("ce-{name}"), value(v))));
            if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
                headers.push(("content-type".into(), content_type));
            }
            body
        }
        CeMode::Structured => {
            headers.retain(|(k, _)| !k.eq_ignore_ascii_case("content-type"));
            headers.push(("content-type".into(), STRUCTURED_CONTENT_TYPE.into()));
            structured(a, &content_type, &body).into_bytes()
        }
    }
}

/// The attributes Herald sets, by name, `dataschema` only when known.
fn attributes(a: &CeAttributes) -> Vec<(&'static str, String)> {
    let mut all = vec![
        ("specversion", SPEC_VERSION.to_string()),
        ("id", a.id.clone()),
        ("source", a.source.clone()),
        ("type", a.event_type.clone()),
        ("time", a.time.clone()),
    ];
    all.extend(a.dataschema.clone().map(|s| ("dataschema", s)));
    all
}

/// The structured event: the attributes, `datacontenttype`, and the data kept byte for
/// byte when it is JSON.
fn structured(a: &CeAttributes, content_type: &str, body: &[u8]) -> String {
    let s = |v: &str| serde_json::to_string(v).expect("string serializes");
    let mut out = String::from("{");
    for (name, v) in attributes(a) {
        out.push_str(&format!("\"{name}\":{},", s(&v)));
    }
    out.push_str(&format!("\"datacontenttype\":{},", s(content_type)));
    let json = is_json(content_type) && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok();
    match (json, std::str::from_utf8(body)) {
        (true, Ok(text)) => out.push_str(&format!("\"data\":{}}}", text.trim())),
        _ => {
            let b64 = base64::engine::general_purpose::STANDARD.encode(body);
            out.push_str(&format!("\"data_base64\":{}}}", s(&b64)));
        }
    }
    out
}

/// `application/json`, or any `…+json` type (parameters aside).
fn is_json(content_type: &str) -> bool {
    let media = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    media == "application/json" || media.ends_with("+json")
}

/// A header value as the HTTP binding writes one (§3.1.3.2): printable ASCII as is,
/// space, `"`, `%` and everything else percent-encoded as UTF-8.
fn header_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        match b {
            0x21..=0x7e if b != b'"' && b != b'%' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(dataschema: Option<&str>) -> CeAttributes {
        CeAttributes {
            id: "evt_1".into(),
            source: "/herald/tenants/acme".into(),
            event_type: "invoice.paid".into(),
            time: "2026-12-07T15:00:00.000Z".into(),
            dataschema: dataschema.map(String::from),
        }
    }

    fn json_headers() -> Vec<(String, String)> {
        vec![("content-type".into(), "application/json".into()), ("ce-id".into(), "stale".into())]
    }

    #[test]
    fn binary_mode_sets_the_attributes_as_headers_and_keeps_the_data() {
        let mut headers = json_headers();
        let body = encode(CeMode::Binary, &attrs(Some("urn:x")), CeHeaders::Http, &mut headers, b"{\"a\":1}".to_vec());
        assert_eq!(body, b"{\"a\":1}");
        let get = |n: &str| headers.iter().filter(|(k, _)| k == n).map(|(_, v)| v.as_str()).collect::<Vec<_>>();
        assert_eq!(get("ce-id"), ["evt_1"]);
        assert_eq!(get("ce-specversion"), ["1.0"]);
        assert_eq!(get("ce-type"), ["invoice.paid"]);
        assert_eq!(get("ce-dataschema"), ["urn:x"]);
        assert_eq!(get("content-type"), ["application/json"]);
    }

    #[test]
    fn structured_mode_is_one_json_event_with_the_data_inline_or_in_base64() {
        let mut headers = json_headers();
        let body = encode(CeMode::Structured, &attrs(None), CeHeaders::Http, &mut headers, b"{\"a\":1}".to_vec());
        let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(event["specversion"], "1.0");
        assert_eq!(event["id"], "evt_1");
        assert_eq!(event["datacontenttype"], "application/json");
        assert_eq!(event["data"], serde_json::json!({"a": 1}));
        assert!(event.get("dataschema").is_none());
        assert!(headers.contains(&("content-type".into(), STRUCTURED_CONTENT_TYPE.into())));
        let mut text = vec![("content-type".to_string(), "text/plain".to_string())];
        let body = encode(CeMode::Structured, &attrs(None), CeHeaders::Broker, &mut text, b"hi".to_vec());
        let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(event["data_base64"], "aGk=");
    }

    #[test]
    fn header_values_are_percent_encoded_where_the_binding_says() {
        assert_eq!(header_value("a b\"%\u{e9}"), "a%20b%22%25%C3%A9");
        let spaced = CeAttributes { id: "evt 1".into(), ..attrs(None) };
        for (via, want) in [(CeHeaders::Http, "evt%201"), (CeHeaders::Broker, "evt 1")] {
            let mut headers = Vec::new();
            encode(CeMode::Binary, &spaced, via, &mut headers, Vec::new());
            assert!(headers.contains(&("ce-id".into(), want.into())), "{via:?}: {headers:?}");
        }
        assert_eq!(header_value("/herald/tenants/acme"), "/herald/tenants/acme");
        let ce = CloudEvents { mode: CeMode::Binary, source: Some("https://acme.example/{tenant}".into()) };
        assert_eq!(ce.source_for("t1"), "https://acme.example/t1");
        assert_eq!(CloudEvents { source: None, ..ce }.source_for("t1"), "/herald/tenants/t1");
    }
}
