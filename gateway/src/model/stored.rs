//! The stored form of an endpoint's spec: one flat JSON document, as written before the
//! target was a type (no SQL migration). [`EndpointSpec`] reads and writes through it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    Batching, CloudEvents, DeadHead, DeliveryOrder, Destination, EndpointKind, EndpointSpec, EndpointTls, Filter,
    HttpSettings, OAuth2, PluginBindings, RetryOverrideDoc, SecretEntry, ShapeError, Target,
};

/// The flat document: the shared settings, and the target's as `kind`, `url`,
/// `destination` (a broker's) and `oauth2`, `proxy`, `tls` (HTTP's).
#[derive(Serialize, Deserialize)]
pub(super) struct SpecDoc {
    url: String,
    description: String,
    event_types: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    filter: Option<Filter>,
    rate_per_sec: f64,
    burst: u32,
    max_in_flight: u32,
    timeout_ms: u64,
    connect_timeout_ms: u64,
    #[serde(default)]
    retry: RetryOverrideDoc,
    #[serde(default)]
    plugins: PluginBindings,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    secrets: Vec<SecretEntry>,
    #[serde(default, skip_serializing_if = "DeliveryOrder::is_none")]
    ordering: DeliveryOrder,
    #[serde(default, skip_serializing_if = "DeadHead::is_skip")]
    ordering_on_dead: DeadHead,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cloudevents: Option<CloudEvents>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    batch: Option<Batching>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    payload_versions: BTreeMap<String, i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    oauth2: Option<OAuth2>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    proxy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tls: Option<EndpointTls>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    user_agent: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    verify: bool,
    /// Whether `verify` was written on the endpoint (`HttpTarget::verify_explicit`), stored
    /// only where it differs from `verify`: a document from before the tenant's
    /// `verify_endpoints` reads an endpoint with `verify` as written, one without as
    /// following the tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    verify_explicit: Option<bool>,
    #[serde(default, skip_serializing_if = "EndpointKind::is_http")]
    kind: EndpointKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    destination: Option<Destination>,
}

impl TryFrom<SpecDoc> for EndpointSpec {
    type Error = ShapeError;

    fn try_from(d: SpecDoc) -> Result<EndpointSpec, ShapeError> {
        let verify_explicit = d.verify_explicit.unwrap_or(d.verify);
        let (oauth2, proxy, tls, user_agent, verify) = (d.oauth2, d.proxy, d.tls, d.user_agent, d.verify);
        let http = HttpSettings { oauth2, proxy, tls, user_agent, verify, verify_explicit };
        Ok(EndpointSpec {
            target: Target::from_flat(d.kind, d.url, d.destination, http)?,
            description: d.description,
            event_types: d.event_types,
            filter: d.filter,
            rate_per_sec: d.rate_per_sec,
            burst: d.burst,
            max_in_flight: d.max_in_flight,
            timeout_ms: d.timeout_ms,
            connect_timeout_ms: d.connect_timeout_ms,
            retry: d.retry,
            plugins: d.plugins,
            headers: d.headers,
            secrets: d.secrets,
            ordering: d.ordering,
            ordering_on_dead: d.ordering_on_dead,
            cloudevents: d.cloudevents,
            batch: d.batch,
            payload_versions: d.payload_versions,
        })
    }
}

impl From<EndpointSpec> for SpecDoc {
    fn from(s: EndpointSpec) -> SpecDoc {
        let (kind, url, destination, http) = s.target.into_flat();
        let HttpSettings { oauth2, proxy, tls, user_agent, verify, verify_explicit } = http;
        SpecDoc {
            url,
            description: s.description,
            event_types: s.event_types,
            filter: s.filter,
            rate_per_sec: s.rate_per_sec,
            burst: s.burst,
            max_in_flight: s.max_in_flight,
            timeout_ms: s.timeout_ms,
            connect_timeout_ms: s.connect_timeout_ms,
            retry: s.retry,
            plugins: s.plugins,
            headers: s.headers,
            secrets: s.secrets,
            ordering: s.ordering,
            ordering_on_dead: s.ordering_on_dead,
            cloudevents: s.cloudevents,
            batch: s.batch,
            payload_versions: s.payload_versions,
            oauth2,
            proxy,
            tls,
            user_agent,
            verify,
            verify_explicit: (verify_explicit != verify).then_some(verify_explicit),
            kind,
            destination,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Documents as stored before the target was a type read as they were written, and
    /// write back byte for byte.
    #[test]
    fn stored_documents_read_and_write_back_unchanged() {
        let docs = [
            r#"{"url":"https://example.com/h","description":"","event_types":[],"rate_per_sec":10.0,"burst":10,"max_in_flight":4,"timeout_ms":10000,"connect_timeout_ms":3000,"retry":{},"plugins":{},"headers":{},"secrets":[{"secret":"whsec_x"}],"proxy":"none"}"#,
            r#"{"url":"","description":"","event_types":[],"rate_per_sec":10.0,"burst":10,"max_in_flight":4,"timeout_ms":10000,"connect_timeout_ms":3000,"retry":{},"plugins":{},"headers":{},"secrets":[{"secret":"whsec_x"}],"kind":"poll"}"#,
            r#"{"url":"nats://127.0.0.1:4222","description":"d","event_types":["a.*"],"rate_per_sec":1.0,"burst":1,"max_in_flight":1,"timeout_ms":1000,"connect_timeout_ms":1000,"retry":{},"plugins":{},"headers":{},"secrets":[],"ordering":"key","kind":"nats","destination":{"subject":"h.{type}","token":"v1:k:x"}}"#,
        ];
        for doc in docs {
            let spec: EndpointSpec = serde_json::from_str(doc).unwrap();
            assert_eq!(serde_json::to_string(&spec).unwrap(), doc);
        }
        let spec: EndpointSpec = serde_json::from_str(docs[1]).unwrap();
        assert_eq!(spec.target, Target::Poll(super::super::PollTarget {}));
        let spec: EndpointSpec = serde_json::from_str(docs[2]).unwrap();
        assert!(matches!(&spec.target, Target::Nats(n) if n.subject == "h.{type}" && n.token.is_some()));
    }

    /// `verify_explicit` is stored only where it differs from `verify`: an older document's
    /// `verify: true` reads as written, its absent `verify` as following the tenant.
    #[test]
    fn verify_explicit_is_stored_only_where_it_is_not_verify() {
        let base = r#"{"url":"https://example.com/h","description":"","event_types":[],"rate_per_sec":10.0,"burst":10,"max_in_flight":4,"timeout_ms":10000,"connect_timeout_ms":3000,"retry":{},"plugins":{},"headers":{},"secrets":[]"#;
        for (tail, verify, explicit) in [
            ("}", false, false),
            (r#","verify":true}"#, true, true),
            (r#","verify":true,"verify_explicit":false}"#, true, false),
            (r#","verify_explicit":true}"#, false, true),
        ] {
            let doc = format!("{base}{tail}");
            let spec: EndpointSpec = serde_json::from_str(&doc).unwrap();
            let http = spec.target.as_http().unwrap();
            assert_eq!((http.verify, http.verify_explicit), (verify, explicit), "{tail}");
            assert_eq!(serde_json::to_string(&spec).unwrap(), doc);
        }
    }
}
