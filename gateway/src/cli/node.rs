//! What `herald apply` and `herald dump` read of a node through its API: the tenants and,
//! per tenant, its own event types, its plugins' settings and its endpoints, each in the
//! document's terms (an endpoint's `description` is its `name`).
//! Never writes; never holds a secret but the `v1` one `apply` compares.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{CliError, call};

/// A node's API and the admin token.
#[derive(Debug, Clone)]
pub(super) struct Node {
    pub api: String,
    pub token: String,
}

impl Node {
    pub async fn get(&self, path: &str) -> Result<Value, CliError> {
        call(&self.api, "GET", path, &self.token, None).await
    }

    pub async fn send(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, CliError> {
        call(&self.api, method, path, &self.token, body).await
    }
}

/// One tenant as the node has it.
#[derive(Debug, Default)]
pub(super) struct TenantState {
    /// The tenant's own types (not the operator's it inherits), by name.
    pub event_types: BTreeMap<String, Value>,
    /// Every plugin installed for the tenant, with the tenant's settings of it.
    pub plugins: BTreeMap<String, Value>,
    /// The endpoints in creation order, as the API shows them.
    pub endpoints: Vec<Value>,
}

/// Every tenant's id and name (the reserved ops tenant is not listed).
pub(super) async fn tenants(node: &Node) -> Result<BTreeMap<String, String>, CliError> {
    let list = node.get("/v1/tenants").await?;
    let rows = list["data"].as_array().cloned().unwrap_or_default();
    Ok(rows
        .iter()
        .filter_map(|t| Some((t["id"].as_str()?.to_string(), t["name"].as_str().unwrap_or_default().to_string())))
        .collect())
}

pub(super) async fn tenant_state(node: &Node, tenant: &str) -> Result<TenantState, CliError> {
    let base = format!("/v1/tenants/{tenant}");
    let types = node.get(&format!("{base}/event-types")).await?;
    let event_types = rows(&types)
        .filter(|t| t["source"] == "tenant")
        .filter_map(|t| Some((t["name"].as_str()?.to_string(), t.clone())))
        .collect();
    let mut plugins = BTreeMap::new();
    let installed = node.get(&format!("{base}/plugins")).await?;
    for name in rows(&installed).filter_map(|p| p["name"].as_str()) {
        plugins.insert(name.to_string(), node.get(&format!("{base}/plugins/{name}/config")).await?);
    }
    let mut endpoints = Vec::new();
    let mut after = String::new();
    loop {
        let page = node.get(&format!("{base}/endpoints?limit=1000{after}")).await?;
        endpoints.extend(rows(&page).cloned());
        match page["next_after"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    Ok(TenantState { event_types, plugins, endpoints })
}

fn rows(list: &Value) -> impl Iterator<Item = &Value> {
    list["data"].as_array().into_iter().flatten()
}

/// An endpoint of the API in the document's terms: `name` for its description, no ids,
/// states or times, no null or empty settings, and no `…_set` flags of write-only secrets.
pub(super) fn endpoint_view(out: &Value) -> Map<String, Value> {
    let mut view = Map::new();
    view.insert("name".into(), out["description"].clone());
    const PLAIN: [&str; 18] = [
        "url",
        "kind",
        "event_types",
        "filter",
        "rate_per_sec",
        "burst",
        "max_in_flight",
        "timeout",
        "connect_timeout",
        "headers",
        "ordering",
        "ordering_on_dead",
        "signatures",
        "proxy",
        "user_agent",
        "cloudevents",
        "batch",
        "verify",
    ];
    // A broker kind never verifies: its `verify: false` says nothing.
    let http = out["kind"] == "http";
    for key in PLAIN {
        if !out[key].is_null() && (http || key != "verify") {
            view.insert(key.into(), out[key].clone());
        }
    }
    for key in ["retry", "plugins", "destination", "oauth2", "tls"] {
        let Some(section) = out[key].as_object() else { continue };
        let kept: Map<String, Value> = section
            .iter()
            .filter(|(k, v)| !v.is_null() && !k.ends_with("_set"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !kept.is_empty() || key == "oauth2" {
            view.insert(key.into(), Value::Object(kept));
        }
    }
    view
}

/// Whether the node holds the write-only secret at `section.field` (`destination.password`,
/// `oauth2.client_secret`, `tls.client_key`) of an endpoint shown as `out`.
pub(super) fn secret_set(out: &Value, section: &str, field: &str) -> bool {
    out[section][format!("{field}_set")].as_bool().unwrap_or(false)
}
