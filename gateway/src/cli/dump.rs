//! `herald dump`: a node's tenants, event types, plugin settings and endpoints as the
//! document `herald apply` takes. Secrets are written as references
//! (`{env: HERALD_SECRET_<TENANT>_<ENDPOINT>…}`), never read into the document.

use serde_json::{Value, json};

use super::CliError;
use super::document::{
    DocError, Document, EndpointDoc, EventTypeDoc, Format, PluginDoc, SecretRef, TenantDoc, env_name, write,
};
use super::node::{Node, endpoint_view, secret_set, tenant_state, tenants};

/// What `herald dump` asks for.
#[derive(Debug, Clone)]
pub struct DumpRequest {
    pub api: String,
    pub token: String,
    pub format: Format,
}

/// The node's state as a document, in `format`.
pub async fn dump(req: DumpRequest) -> Result<String, CliError> {
    let node = Node { api: req.api, token: req.token };
    let mut doc = Document::default();
    for (id, name) in tenants(&node).await? {
        let state = tenant_state(&node, &id).await?;
        doc.event_types.extend(state.event_types.values().map(|t| event_type(&id, t)));
        for (plugin, config) in &state.plugins {
            doc.plugins.extend(plugin_settings(&id, plugin, config));
        }
        let mut names = std::collections::BTreeSet::new();
        for out in &state.endpoints {
            let ep = endpoint(&id, out)?;
            if !names.insert(ep.name.clone()) {
                return Err(unnamed(&id, out, "has the description of another endpoint").into());
            }
            doc.endpoints.push(ep);
        }
        doc.tenants.push(TenantDoc { id, name: Some(name) });
    }
    Ok(write(&doc, req.format)?)
}

fn event_type(tenant: &str, t: &Value) -> EventTypeDoc {
    EventTypeDoc {
        tenant: tenant.to_string(),
        name: t["name"].as_str().unwrap_or_default().to_string(),
        description: t["description"].as_str().map(String::from),
        deprecated: t["deprecated"].as_bool(),
        examples: t["examples"].as_array().cloned(),
        schema: Some(t["schema"].clone()).filter(|s| !s.is_null()),
    }
}

/// A plugin's settings, when the tenant set any; each secret as the variable to read it from.
fn plugin_settings(tenant: &str, plugin: &str, config: &Value) -> Option<PluginDoc> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let values: std::collections::BTreeMap<String, String> =
        config["values"].as_object()?.iter().map(|(k, v)| (k.clone(), text(v))).collect();
    let secrets: std::collections::BTreeMap<String, SecretRef> = config["secrets"]
        .as_object()?
        .keys()
        .map(|k| (k.clone(), SecretRef::Env(env_name(&[tenant, "plugin", plugin, k]))))
        .collect();
    (!values.is_empty() || !secrets.is_empty()).then(|| PluginDoc {
        tenant: tenant.to_string(),
        name: plugin.to_string(),
        values,
        secrets,
    })
}

/// An endpoint of the API as the document writes it, its secrets as references.
fn endpoint(tenant: &str, out: &Value) -> Result<EndpointDoc, DocError> {
    let mut view = endpoint_view(out);
    let name = out["description"].as_str().unwrap_or_default().to_string();
    if name.is_empty() {
        return Err(unnamed(tenant, out, "has no description"));
    }
    view.insert("tenant".into(), json!(tenant));
    let var = |what: &str| json!({ "env": env_name(&[tenant, name.as_str(), what]) });
    if view.get("signatures").and_then(Value::as_array).is_some_and(|s| s.iter().any(|s| s == "v1")) {
        view.insert("secret".into(), var(""));
    }
    for (section, field, what) in [
        ("destination", "password", "password"),
        ("destination", "token", "token"),
        ("oauth2", "client_secret", "oauth2"),
        ("tls", "client_key", "tls_key"),
    ] {
        if secret_set(out, section, field)
            && let Some(Value::Object(s)) = view.get_mut(section)
        {
            s.insert(field.into(), var(what));
        }
    }
    serde_json::from_value(Value::Object(view)).map_err(|e| {
        DocError::new(format!("tenant {tenant}, endpoint {}", out["id"].as_str().unwrap_or_default()), e.to_string())
    })
}

/// `apply` matches endpoints by description: one without a unique one cannot be dumped.
fn unnamed(tenant: &str, out: &Value, what: &str) -> DocError {
    let id = out["id"].as_str().unwrap_or_default();
    DocError::new(
        format!("tenant {tenant}, endpoint {id}"),
        format!("{what}; herald apply matches endpoints by description, so give it a unique one"),
    )
}
