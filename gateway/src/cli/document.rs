//! The document of `herald apply` and `herald dump`: tenants, their event types, plugin
//! settings and endpoints, as YAML or TOML. Secrets are references (`{env: NAME}`,
//! `{file: PATH}`), never clear text; reading a document checks its shape and its
//! references, naming the path of what is wrong.
//! Not an API client: `apply` and `dump` talk to the node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A bad document, a reference that does not resolve, or a node that cannot take it:
/// always the path in the document first.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct DocError {
    pub path: String,
    pub message: String,
}

impl DocError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> DocError {
        DocError { path: path.into(), message: message.into() }
    }
}

/// How a document is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Toml,
}

impl Format {
    /// `.toml` is TOML; anything else (`.yaml`, `.yml`, standard input) YAML.
    pub fn of(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => Format::Toml,
            _ => Format::Yaml,
        }
    }
}

/// The whole document. A tenant it names is managed: its event types, plugin settings and
/// endpoints are what the document says (with `--prune`, nothing else).
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<TenantDoc>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_types: Vec<EventTypeDoc>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plugins: Vec<PluginDoc>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<EndpointDoc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantDoc {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A tenant's own event type (the operator's are not the document's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventTypeDoc {
    pub tenant: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub examples: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
}

/// The tenant's settings of a plugin installed on the node (its code is not in the document).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginDoc {
    pub tenant: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub values: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, SecretRef>,
}

/// An endpoint, matched to the node's by `name`: the endpoint's `description`, unique
/// within its tenant. Fields are the API's (`POST …/endpoints`); one left out is left as
/// the node has it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointDoc {
    pub tenant: String,
    pub name: String,
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination: Option<DestinationDoc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryDoc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugins: Option<BindingsDoc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering_on_dead: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signatures: Option<Vec<String>>,
    /// The `v1` signing secret (`whsec_…`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretRef>,
    /// The `v1a` signing key (`whsk_…`); written when the endpoint is created or starts
    /// signing `v1a`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signing_key: Option<SecretRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oauth2: Option<OAuth2Doc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsDoc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    /// CloudEvents output (`{"mode": …, "source": …}`), as the API takes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloudevents: Option<Value>,
    /// Batching (`{"max_events": …, "max_bytes": …, "max_wait": …}`), as the API takes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<Value>,
    /// Verified endpoint (kind `http`): nothing is delivered until the URL has echoed a
    /// signed challenge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestinationDoc {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maxlen: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exchange: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routing_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<SecretRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<SecretRef>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuth2Doc {
    pub token_url: String,
    pub client_id: String,
    pub client_secret: SecretRef,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsDoc {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_key: Option<SecretRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryDoc {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
}

/// Plugins bound to the endpoint's hooks, by name (or `name@version`) within its tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingsDoc {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transform: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classify: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sign: Option<String>,
}

/// Where a secret is: an environment variable or a file (its text, without the final
/// newline). A document never holds the secret itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretRef {
    Env(String),
    File(PathBuf),
}

impl Serialize for SecretRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        match self {
            SecretRef::Env(name) => map.serialize_entry("env", name)?,
            SecretRef::File(path) => map.serialize_entry("file", path)?,
        }
        map.end()
    }
}

/// Anything but `{env: NAME}` or `{file: PATH}` is refused without repeating it: a secret
/// written in clear by mistake is not echoed into a terminal or a CI log.
impl<'de> Deserialize<'de> for SecretRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SecretRef, D::Error> {
        let refused = || {
            <D::Error as serde::de::Error>::custom(
                "a secret is a reference, {env: NAME} or {file: PATH}, never the secret itself",
            )
        };
        let value = Value::deserialize(d).map_err(|_| refused())?;
        let Some(map) = value.as_object().filter(|m| m.len() == 1) else { return Err(refused()) };
        match map.iter().next() {
            Some((k, Value::String(name))) if k == "env" && !name.is_empty() => Ok(SecretRef::Env(name.clone())),
            Some((k, Value::String(path))) if k == "file" && !path.is_empty() => Ok(SecretRef::File(path.into())),
            _ => Err(refused()),
        }
    }
}

impl SecretRef {
    /// The secret, from the environment or a file (relative to `base`, the document's
    /// folder); one that is unset, unreadable or empty is an error naming the reference.
    pub fn resolve(&self, path: &str, base: &Path) -> Result<String, DocError> {
        let value = match self {
            SecretRef::Env(name) => std::env::var(name)
                .map_err(|_| DocError::new(path, format!("environment variable {name} is not set")))?,
            SecretRef::File(file) => {
                let full = base.join(file);
                std::fs::read_to_string(&full)
                    .map_err(|e| DocError::new(path, format!("cannot read {}: {e}", full.display())))?
                    .trim_end_matches(['\n', '\r'])
                    .to_string()
            }
        };
        if value.is_empty() {
            return Err(DocError::new(path, format!("{} is empty", self.describe())));
        }
        Ok(value)
    }

    fn describe(&self) -> String {
        match self {
            SecretRef::Env(name) => format!("environment variable {name}"),
            SecretRef::File(file) => format!("file {}", file.display()),
        }
    }
}

/// Reads a document: its shape (unknown fields, wrong types, secrets in clear) and then
/// its references (tenants the document names, names given twice).
pub fn parse(text: &str, format: Format) -> Result<Document, DocError> {
    let doc: Document = match format {
        Format::Yaml => serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text)).map_err(|e| {
            let path = display_path(e.path());
            // serde_yaml starts its message with a path of its own, less exact.
            let inner = e.inner().to_string();
            let message = match inner.split_once(": ") {
                Some((own, rest)) if !own.contains(' ') && path.starts_with(own) => rest.to_string(),
                _ => inner,
            };
            DocError::new(path, message)
        })?,
        Format::Toml => serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
            let line = e.inner().span().map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            let at = line.map(|l| format!(" (line {l})")).unwrap_or_default();
            DocError::new(display_path(e.path()), format!("{}{at}", e.inner().message().trim_end()))
        })?,
    };
    check_references(&doc)?;
    Ok(doc)
}

/// `tenants[0].id` rather than serde_path_to_error's `.` for the whole document.
fn display_path(path: &serde_path_to_error::Path) -> String {
    match path.to_string().as_str() {
        "." | "" => "document".to_string(),
        p => p.to_string(),
    }
}

/// Every tenant an item names is in `tenants`, and no name is given twice.
fn check_references(doc: &Document) -> Result<(), DocError> {
    let mut tenants = BTreeSet::new();
    for (i, t) in doc.tenants.iter().enumerate() {
        if !tenants.insert(t.id.as_str()) {
            return Err(DocError::new(format!("tenants[{i}].id"), format!("tenant {:?} is named twice", t.id)));
        }
    }
    let lists = [
        ("event_types", doc.event_types.iter().map(|t| (&t.tenant, &t.name)).collect::<Vec<_>>()),
        ("plugins", doc.plugins.iter().map(|p| (&p.tenant, &p.name)).collect()),
        ("endpoints", doc.endpoints.iter().map(|e| (&e.tenant, &e.name)).collect()),
    ];
    for (list, items) in lists {
        let mut seen = BTreeSet::new();
        for (i, (tenant, name)) in items.into_iter().enumerate() {
            if !tenants.contains(tenant.as_str()) {
                let message = format!("no tenant {tenant:?} in the document's tenants");
                return Err(DocError::new(format!("{list}[{i}].tenant"), message));
            }
            if name.is_empty() {
                return Err(DocError::new(format!("{list}[{i}].name"), "required, not empty"));
            }
            if !seen.insert((tenant, name)) {
                let message = format!("{name:?} is named twice in tenant {tenant}");
                return Err(DocError::new(format!("{list}[{i}].name"), message));
            }
        }
    }
    Ok(())
}

/// The document as text.
pub fn write(doc: &Document, format: Format) -> Result<String, DocError> {
    match format {
        Format::Yaml => serde_yaml::to_string(doc).map_err(|e| DocError::new("document", e.to_string())),
        Format::Toml => toml::to_string(doc).map_err(|e| DocError::new("document", e.to_string())),
    }
}

/// `HERALD_SECRET_<TENANT>_<NAME>[_<WHAT>]`: the variable `dump` names for a secret.
pub fn env_name(parts: &[&str]) -> String {
    let mut name = String::from("HERALD_SECRET");
    for part in parts.iter().filter(|p| !p.is_empty()) {
        name.push('_');
        name.extend(part.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }));
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_documents_name_the_path() {
        let cases = [
            ("tenants: [{id: acme, colour: red}]", "tenants[0].colour: unknown field `colour`"),
            ("tenants: [{id: acme}]\nendpoints: [{tenant: acme, name: a, url: u, burst: many}]", "endpoints[0].burst"),
            ("tenants: [{id: acme}]\nendpoints: [{tenant: nope, name: a, url: u}]", "endpoints[0].tenant: no tenant"),
            (
                "tenants: [{id: acme}]\nendpoints: [{tenant: acme, name: a, url: u, secret: whsec_abc}]",
                "endpoints[0].secret: a secret is a reference",
            ),
            ("tenants: [{id: a}, {id: a}]", "tenants[1].id: tenant \"a\" is named twice"),
        ];
        for (text, says) in cases {
            let e = parse(text, Format::Yaml).expect_err(text).to_string();
            assert!(e.starts_with(says), "{text}: {e}");
            assert!(!e.contains("whsec_abc"), "the secret is not repeated: {e}");
        }
        let e = parse("[[tenants]]\nid = \"acme\"\nname = 5\n", Format::Toml).expect_err("toml").to_string();
        assert!(e.starts_with("tenants[0].name: invalid type") && e.contains("(line 3)"), "{e}");
    }

    #[test]
    fn secret_variables_are_named_after_tenant_and_endpoint() {
        assert_eq!(env_name(&["acme", "billing-eu"]), "HERALD_SECRET_ACME_BILLING_EU");
        assert_eq!(env_name(&["acme", "a b", "oauth2"]), "HERALD_SECRET_ACME_A_B_OAUTH2");
    }
}
