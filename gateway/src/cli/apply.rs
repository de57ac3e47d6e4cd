//! `herald apply -f FILE`: makes a node's tenants, event types, plugin settings and
//! endpoints what a document says, through the API. Everything that can be checked before
//! a write is (the document's shape, its references, every secret reference, the plugins
//! it binds); then it plans the calls, prints them as a diff (`+` created, `~` changed
//! fields, `-` removed) and, unless `--dry-run`, makes them. Idempotent: a node that already
//! matches gets no call at all ("no changes").

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::CliError;
use super::document::{DocError, Document, EndpointDoc, Format, parse};
use super::node::{Node, TenantState, endpoint_view, secret_set, tenant_state, tenants};

/// What `herald apply` asks for.
#[derive(Debug, Clone)]
pub struct ApplyRequest {
    pub api: String,
    pub token: String,
    /// The document; `-` reads standard input (YAML).
    pub file: PathBuf,
    /// Print the plan, write nothing.
    pub dry_run: bool,
    /// Also remove what the managed tenants have and the document does not name.
    pub prune: bool,
}

/// One call of the plan, and how the diff shows it.
#[derive(Debug, Clone)]
pub struct Step {
    /// `+ endpoint acme/billing`, `~ event type acme/invoice.paid`, `- plugin settings acme/chat`.
    pub line: String,
    /// The fields that change, `field: before → after` (a secret only as changed).
    pub fields: Vec<String>,
    method: &'static str,
    path: String,
    body: Option<Value>,
}

/// The plan: empty when the node already matches the document.
#[derive(Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
}

impl Plan {
    /// The diff, one line per step and one indented line per changed field.
    pub fn diff(&self) -> String {
        let mut text = String::new();
        for step in &self.steps {
            text.push_str(&step.line);
            text.push('\n');
            for field in &step.fields {
                text.push_str(&format!("    {field}\n"));
            }
        }
        text
    }
}

/// Reads, checks and plans; then, unless `dry_run`, makes the plan's calls in order
/// (tenants, event types, plugin settings, endpoints, then removals). Answers the plan.
pub async fn apply(req: &ApplyRequest) -> Result<Plan, CliError> {
    let (text, base, format) = read(&req.file)?;
    let doc = parse(&text, format)?;
    let secrets = resolve_secrets(&doc, &base)?;
    let node = Node { api: req.api.clone(), token: req.token.clone() };
    let known = tenants(&node).await?;
    let mut states = BTreeMap::new();
    for t in &doc.tenants {
        let state = match known.contains_key(&t.id) {
            true => tenant_state(&node, &t.id).await?,
            false => TenantState::default(),
        };
        states.insert(t.id.clone(), state);
    }
    check_node(&doc, &known, &states)?;
    let plan = plan(&node, &doc, &known, &states, &secrets, req.prune).await?;
    if !req.dry_run {
        // Each change printed once made: a call that fails leaves the ones above it done.
        for (i, step) in plan.steps.iter().enumerate() {
            node.send(step.method, &step.path, step.body.clone())
                .await
                .map_err(|e| CliError::Step(step.line.clone(), e.to_string()))?;
            let one = Plan { steps: plan.steps[i..=i].to_vec() };
            print!("{}", one.diff());
        }
    }
    Ok(plan)
}

fn read(file: &Path) -> Result<(String, PathBuf, Format), CliError> {
    if file.as_os_str() == "-" {
        let text =
            std::io::read_to_string(std::io::stdin()).map_err(|e| CliError::Unreadable("-".into(), e.to_string()))?;
        return Ok((text, PathBuf::from("."), Format::Yaml));
    }
    let text =
        std::fs::read_to_string(file).map_err(|e| CliError::Unreadable(file.display().to_string(), e.to_string()))?;
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    Ok((text, base, Format::of(file)))
}

/// Every secret the document refers to, by its path (`endpoints[0].secret`): all resolved
/// before anything is written.
fn resolve_secrets(doc: &Document, base: &Path) -> Result<BTreeMap<String, String>, DocError> {
    let mut found = BTreeMap::new();
    for (i, p) in doc.plugins.iter().enumerate() {
        for (key, r) in &p.secrets {
            let path = format!("plugins[{i}].secrets.{key}");
            found.insert(path.clone(), r.resolve(&path, base)?);
        }
    }
    for (i, e) in doc.endpoints.iter().enumerate() {
        let refs = [
            ("secret", e.secret.as_ref()),
            ("signing_key", e.signing_key.as_ref()),
            ("destination.password", e.destination.as_ref().and_then(|d| d.password.as_ref())),
            ("destination.token", e.destination.as_ref().and_then(|d| d.token.as_ref())),
            ("oauth2.client_secret", e.oauth2.as_ref().map(|o| &o.client_secret)),
            ("tls.client_key", e.tls.as_ref().and_then(|t| t.client_key.as_ref())),
        ];
        for (field, r) in refs {
            let Some(r) = r else { continue };
            let path = format!("endpoints[{i}].{field}");
            found.insert(path.clone(), r.resolve(&path, base)?);
        }
    }
    Ok(found)
}

/// What the node must already have: a tenant's name as written (Herald renames no tenant),
/// and every plugin the document configures or binds.
fn check_node(
    doc: &Document,
    known: &BTreeMap<String, String>,
    states: &BTreeMap<String, TenantState>,
) -> Result<(), DocError> {
    for (i, t) in doc.tenants.iter().enumerate() {
        if let (Some(want), Some(have)) = (&t.name, known.get(&t.id))
            && want != have
        {
            let message = format!("tenant {} is named {have:?} on the node, and Herald renames no tenant", t.id);
            return Err(DocError::new(format!("tenants[{i}].name"), message));
        }
    }
    let installed = |tenant: &str, name: &str| {
        let name = name.split('@').next().unwrap_or_default();
        states.get(tenant).is_some_and(|s| s.plugins.contains_key(name))
    };
    let missing = |path: String, tenant: &str, name: &str| {
        DocError::new(path, format!("no plugin {name:?} in tenant {tenant} on the node (install it first)"))
    };
    for (i, p) in doc.plugins.iter().enumerate() {
        if !installed(&p.tenant, &p.name) {
            return Err(missing(format!("plugins[{i}].name"), &p.tenant, &p.name));
        }
    }
    for (i, e) in doc.endpoints.iter().enumerate() {
        let Some(b) = &e.plugins else { continue };
        for (hook, name) in [("transform", &b.transform), ("classify", &b.classify), ("sign", &b.sign)] {
            if let Some(name) = name.as_deref().filter(|n| !installed(&e.tenant, n)) {
                return Err(missing(format!("endpoints[{i}].plugins.{hook}"), &e.tenant, name));
            }
        }
    }
    Ok(())
}

async fn plan(
    node: &Node,
    doc: &Document,
    known: &BTreeMap<String, String>,
    states: &BTreeMap<String, TenantState>,
    secrets: &BTreeMap<String, String>,
    prune: bool,
) -> Result<Plan, CliError> {
    let mut steps = Vec::new();
    for t in doc.tenants.iter().filter(|t| !known.contains_key(&t.id)) {
        let mut body = json!({ "id": t.id });
        if let Some(name) = &t.name {
            body["name"] = json!(name);
        }
        steps.push(step(format!("+ tenant {}", t.id), "POST", "/v1/tenants".into(), Some(body)));
    }
    let empty = TenantState::default();
    let state = |tenant: &str| states.get(tenant).unwrap_or(&empty);
    for t in &doc.event_types {
        steps.extend(event_type_step(t, state(&t.tenant).event_types.get(&t.name)));
    }
    for (i, p) in doc.plugins.iter().enumerate() {
        steps.extend(plugin_step(i, p, state(&p.tenant).plugins.get(&p.name), secrets));
    }
    for (i, e) in doc.endpoints.iter().enumerate() {
        let found = state(&e.tenant).endpoints.iter().find(|out| out["description"] == e.name.as_str());
        steps.extend(endpoint_step(node, i, e, found, secrets).await?);
    }
    if prune {
        for (tenant, s) in states {
            steps.extend(prune_steps(doc, tenant, s));
        }
    }
    Ok(Plan { steps })
}

fn step(line: String, method: &'static str, path: String, body: Option<Value>) -> Step {
    Step { line, fields: Vec::new(), method, path, body }
}

fn event_type_step(t: &super::document::EventTypeDoc, have: Option<&Value>) -> Option<Step> {
    let base = format!("/v1/tenants/{}/event-types", t.tenant);
    let what = format!("event type {}/{}", t.tenant, t.name);
    let Ok(Value::Object(mut want)) = serde_json::to_value(t) else { return None };
    want.remove("tenant");
    want.remove("name");
    let Some(have) = have else {
        want.insert("name".into(), json!(t.name));
        return Some(step(format!("+ {what}"), "POST", base, Some(Value::Object(want))));
    };
    let (body, fields) = changes(&want, have.as_object()?);
    let path = format!("{base}/{}", t.name);
    (!fields.is_empty()).then(|| Step { fields, ..step(format!("~ {what}"), "PATCH", path, Some(body.into())) })
}

/// The fields of `want` that `have` does not match, as a patch and as diff lines.
fn changes(want: &Map<String, Value>, have: &Map<String, Value>) -> (Map<String, Value>, Vec<String>) {
    let mut body = Map::new();
    let mut fields = Vec::new();
    for (key, value) in want {
        let before = have.get(key).unwrap_or(&Value::Null);
        if !same(key, value, before) {
            fields.push(format!("{key}: {before} → {value}"));
            body.insert(key.clone(), value.clone());
        }
    }
    (body, fields)
}

fn plugin_step(
    i: usize,
    p: &super::document::PluginDoc,
    have: Option<&Value>,
    secrets: &BTreeMap<String, String>,
) -> Option<Step> {
    let what = format!("plugin settings {}/{}", p.tenant, p.name);
    let have = have.cloned().unwrap_or_default();
    let values = json!(p.values);
    let keys: BTreeSet<&String> = p.secrets.keys().collect();
    let have_keys: BTreeSet<&String> = have["secrets"].as_object().map(|s| s.keys().collect()).unwrap_or_default();
    let mut fields = Vec::new();
    if !equal(&values, &have["values"]) {
        fields.push(format!("values: {} → {values}", have["values"]));
    }
    if keys != have_keys {
        fields.push(format!("secrets: {have_keys:?} → {keys:?}"));
    }
    if fields.is_empty() {
        return None;
    }
    let resolved: Map<String, Value> =
        p.secrets.keys().map(|k| (k.clone(), json!(secrets[&format!("plugins[{i}].secrets.{k}")]))).collect();
    let path = format!("/v1/tenants/{}/plugins/{}/config", p.tenant, p.name);
    let body = json!({ "values": values, "secrets": resolved });
    Some(Step { fields, ..step(format!("~ {what}"), "PUT", path, Some(body)) })
}

/// The write-only secrets of an endpoint: where each goes in a body, and the `…_set` flag
/// that says the node holds one.
const WRITE_ONLY: [(&str, &str); 4] =
    [("destination", "password"), ("destination", "token"), ("oauth2", "client_secret"), ("tls", "client_key")];

async fn endpoint_step(
    node: &Node,
    i: usize,
    e: &EndpointDoc,
    have: Option<&Value>,
    secrets: &BTreeMap<String, String>,
) -> Result<Option<Step>, CliError> {
    let base = format!("/v1/tenants/{}/endpoints", e.tenant);
    let what = format!("endpoint {}/{}", e.tenant, e.name);
    let secret = |field: &str| secrets.get(&format!("endpoints[{i}].{field}")).map(|s| json!(s));
    let mut want = desired(e);
    let Some(have) = have else {
        want.insert("description".into(), json!(e.name));
        for field in ["secret", "signing_key"] {
            want.extend(secret(field).map(|s| (field.to_string(), s)));
        }
        for (section, field) in WRITE_ONLY {
            if let (Some(Value::Object(s)), Some(v)) = (want.get_mut(section), secret(&format!("{section}.{field}"))) {
                s.insert(field.into(), v);
            }
        }
        return Ok(Some(step(format!("+ {what}"), "POST", base, Some(want.into()))));
    };
    let (mut body, mut fields) = changes(&want, &endpoint_view(have));
    if let Some(v) = secret("secret") {
        let path = format!("{base}/{}/secret", have["id"].as_str().unwrap_or_default());
        if node.get(&path).await?["secret"] != v {
            fields.push("secret: changed".into());
            body.insert("secret".into(), v);
        }
    }
    if body.contains_key("signatures") {
        body.extend(secret("signing_key").map(|s| ("signing_key".to_string(), s)));
    }
    for (section, field) in WRITE_ONLY {
        let Some(v) = secret(&format!("{section}.{field}")) else { continue };
        if body.contains_key(section) || !secret_set(have, section, field) {
            if !body.contains_key(section) {
                fields.push(format!("{section}.{field}: set"));
                body.insert(section.into(), json!({}));
            }
            if let Some(s) = body.get_mut(section).and_then(Value::as_object_mut) {
                s.insert(field.into(), v);
            }
        }
    }
    let path = format!("{base}/{}", have["id"].as_str().unwrap_or_default());
    Ok((!fields.is_empty()).then(|| Step { fields, ..step(format!("~ {what}"), "PATCH", path, Some(body.into())) }))
}

/// The endpoint's settings as the API takes them, without its name, tenant and secrets.
fn desired(e: &EndpointDoc) -> Map<String, Value> {
    let Ok(Value::Object(mut want)) = serde_json::to_value(e) else { return Map::new() };
    for key in ["tenant", "name", "secret", "signing_key"] {
        want.remove(key);
    }
    for (section, field) in WRITE_ONLY {
        if let Some(Value::Object(s)) = want.get_mut(section) {
            s.remove(field);
        }
    }
    want
}

/// With `--prune`: what a managed tenant has and the document does not name.
fn prune_steps(doc: &Document, tenant: &str, state: &TenantState) -> Vec<Step> {
    let base = format!("/v1/tenants/{tenant}");
    let named = |list: Vec<(&String, &String)>| -> BTreeSet<String> {
        list.into_iter().filter(|(t, _)| t.as_str() == tenant).map(|(_, n)| n.clone()).collect()
    };
    let types = named(doc.event_types.iter().map(|t| (&t.tenant, &t.name)).collect());
    let plugins = named(doc.plugins.iter().map(|p| (&p.tenant, &p.name)).collect());
    let endpoints = named(doc.endpoints.iter().map(|e| (&e.tenant, &e.name)).collect());
    let mut steps = Vec::new();
    for name in state.event_types.keys().filter(|n| !types.contains(*n)) {
        let line = format!("- event type {tenant}/{name}");
        steps.push(step(line, "DELETE", format!("{base}/event-types/{name}"), None));
    }
    for (name, config) in state.plugins.iter().filter(|(n, _)| !plugins.contains(*n)) {
        let set = |k: &str| config[k].as_object().is_some_and(|m| !m.is_empty());
        if set("values") || set("secrets") {
            let line = format!("- plugin settings {tenant}/{name}");
            steps.push(step(line, "PUT", format!("{base}/plugins/{name}/config"), Some(json!({}))));
        }
    }
    for out in &state.endpoints {
        let name = out["description"].as_str().unwrap_or_default();
        if !endpoints.contains(name) {
            let id = out["id"].as_str().unwrap_or_default();
            steps.push(step(
                format!("- endpoint {tenant}/{name} ({id})"),
                "DELETE",
                format!("{base}/endpoints/{id}"),
                None,
            ));
        }
    }
    steps
}

/// The settings whose value the API writes in its own form: compared by what they mean.
const DURATIONS: [&str; 5] = ["timeout", "connect_timeout", "base", "cap", "ttl"];
/// Sections the API patches field by field: a field the document leaves out is the node's.
const SECTIONS: [&str; 4] = ["retry", "destination", "oauth2", "tls"];

/// Does the node's `have` already say what the document's `want` says for `key`?
fn same(key: &str, want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::String(a), Value::String(b)) if DURATIONS.contains(&key) => {
            let ms = |t: &str| crate::config::parse_duration_ms(t).ok();
            ms(a).is_some() && ms(a) == ms(b)
        }
        (Value::String(a), Value::String(b)) if key == "url" => match (url::Url::parse(a), url::Url::parse(b)) {
            (Ok(a), Ok(b)) => a == b,
            _ => a == b,
        },
        (Value::Object(a), Value::Object(b)) if SECTIONS.contains(&key) => {
            a.iter().all(|(k, v)| same(k, v, b.get(k).unwrap_or(&Value::Null)))
        }
        _ => equal(want, have),
    }
}

/// JSON equality with numbers compared as numbers (`10` is `10.0`).
fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| equal(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| equal(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_compared_by_what_they_mean() {
        let cases = [
            ("timeout", json!("1000ms"), json!("1s"), true),
            ("timeout", json!("2s"), json!("1s"), false),
            ("rate_per_sec", json!(10), json!(10.0), true),
            ("url", json!("https://example.com"), json!("https://example.com/"), true),
            ("retry", json!({"base": "1s"}), json!({"base": "1000ms", "factor": 2.0}), true),
            ("retry", json!({"factor": 3}), json!({"base": "1s", "factor": 2.0}), false),
            ("headers", json!({"a": "1"}), json!({"a": "1", "b": "2"}), false),
            ("event_types", json!(["a.*"]), json!(["a.*"]), true),
        ];
        for (key, want, have, expected) in cases {
            assert_eq!(same(key, &want, &have), expected, "{key}: {want} against {have}");
        }
    }
}
