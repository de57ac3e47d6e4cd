//! The event catalog as intake sees it: every tenant's settings (`schema_validation`, and
//! `verify_endpoints`, which endpoint writes read) and every
//! event type's latest schema, compiled once per (type, version) and kept in memory, so an
//! event is checked without a read of the store. It never writes: the API writes the
//! catalog and then [`Catalog::refresh`]es; a node sharing a Postgres store also follows
//! the others' writes (`app`: a one-row read of `catalog_revision` every second, a full
//! reload only when it moved).
//!
//! Schemas are JSON Schema draft 2020-12 (`jsonschema`, no remote or file resolving:
//! a `$ref` reaches only the schema itself), with `format` asserted.
//!
//! `catalog/export.rs` writes a tenant's catalog as an OpenAPI 3.1 `webhooks` document. The
//! types and their numbered schema versions live in `store/event_types.rs`; their API is
//! `api/event_types.rs` (and `api/test_send.rs`: an example sent to one endpoint,
//! `NewEvent::only`).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

mod export;
pub use export::openapi;

use crate::metrics::Metrics;
use crate::model::{
    Adapter, EventType, OPS_TENANT, SchemaValidation, TenantId, TenantSettings, adapter_chain, type_filter_matches,
};
use crate::store::{DynStore, StoreError};

/// The draft every schema is read as.
pub const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// A compiled schema.
pub type Validator = jsonschema::Validator;

/// Checks that `schema` is a draft 2020-12 schema Herald can use (an object, valid against
/// the meta-schema, every `$ref` local, every pattern a valid regex) and compiles it.
/// Errors start with the place in the schema at fault.
pub fn compile(schema: &serde_json::Value) -> Result<Validator, String> {
    if !schema.is_object() {
        return Err("must be a JSON Schema object".into());
    }
    if let Some(d) = schema.get("$schema")
        && d.as_str().map(|d| d.trim_end_matches('#')) != Some(DIALECT)
    {
        return Err(format!("$schema: only draft 2020-12 ({DIALECT}) is supported, not {d}"));
    }
    jsonschema::draft202012::meta::validate(schema).map_err(|e| at(&e.instance_path().to_string(), &e.to_string()))?;
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(schema)
        .map_err(|e| at(&e.schema_path().to_string(), &e.to_string()))
}

/// The first reason `payload` fails `validator`, starting with its path in the payload
/// (`payload.items[2].sku: …`); `None` when it passes.
pub fn first_failure(validator: &Validator, payload: &serde_json::Value) -> Option<String> {
    let e = validator.iter_errors(payload).next()?;
    let mut path = String::from("payload");
    for segment in e.instance_path().iter() {
        match segment {
            jsonschema::paths::LocationSegment::Index(i) => path.push_str(&format!("[{i}]")),
            jsonschema::paths::LocationSegment::Property(p) => {
                path.push('.');
                path.push_str(&p);
            }
        }
    }
    Some(format!("{path}: {e}"))
}

fn at(pointer: &str, message: &str) -> String {
    match pointer {
        "" => message.to_string(),
        p => format!("at {p}: {message}"),
    }
}

/// Every tenant's setting and every type's latest compiled schema, as of one revision of
/// the stored catalog.
pub struct Catalog {
    snapshot: RwLock<Arc<Snapshot>>,
    /// One refresh at a time (a slower one must not put an older snapshot back).
    refreshing: tokio::sync::Mutex<()>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Snapshot {
    /// `catalog_revision` when it was read; -1 before the first read.
    revision: i64,
    /// Tenants whose settings are not the defaults.
    settings: HashMap<TenantId, TenantSettings>,
    /// Types by owner (`""`: the operator's) and name.
    types: HashMap<String, HashMap<String, Arc<Compiled>>>,
    /// Each type's adapters, by (owner, name); types without any are absent.
    adapters: HashMap<(String, String), Vec<Adapter>>,
}

/// One type's latest schema, compiled.
struct Compiled {
    version: i64,
    validator: Option<Validator>,
    /// What a CloudEvent's `dataschema` names: the schema's own absolute `$id`, else
    /// `urn:herald:event-type:{name}:v{version}`; `None` while the type has no schema.
    dataschema: Option<String>,
}

/// What an event's check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// It passes, or the tenant does not validate.
    Pass,
    /// It fails (the reason), and the tenant only warns: accept it.
    Warned(String),
    /// It fails (the reason), and the tenant enforces: refuse it.
    Refused(String),
}

impl Catalog {
    /// An empty catalog (every tenant `off`) until the first [`Catalog::refresh`].
    pub fn new(metrics: Arc<Metrics>) -> Catalog {
        let snapshot = Snapshot { revision: -1, ..Snapshot::default() };
        Catalog { snapshot: RwLock::new(Arc::new(snapshot)), refreshing: Default::default(), metrics }
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads the stored catalog again if it changed since the last read. Schemas of a
    /// (type, version) already compiled are kept, not compiled again.
    pub async fn refresh(&self, store: &DynStore) -> Result<(), StoreError> {
        let _one = self.refreshing.lock().await;
        let old = self.snapshot();
        let revision = store.catalog_revision().await?;
        if revision == old.revision {
            return Ok(());
        }
        let (types, settings) = (store.event_types(None).await?, store.tenant_settings().await?);
        let snapshot = Snapshot::build(revision, &old, types, settings);
        *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(snapshot);
        Ok(())
    }

    /// The tenant's settings.
    pub fn settings(&self, tenant: &TenantId) -> TenantSettings {
        self.snapshot().settings.get(tenant).copied().unwrap_or_default()
    }

    /// Checks one event against the tenant's catalog, as its setting says, and counts a
    /// failure in `herald_schema_violations_total`.
    pub fn check(&self, tenant: &TenantId, event_type: &str, payload: &str) -> Check {
        let snapshot = self.snapshot();
        let mode = snapshot.mode(tenant);
        if mode == SchemaValidation::Off {
            return Check::Pass;
        }
        let Some(reason) = snapshot.failure(tenant, event_type, payload) else {
            return Check::Pass;
        };
        self.metrics.schema_violation(tenant.as_str(), mode.as_str());
        match mode {
            SchemaValidation::Enforce => Check::Refused(reason),
            _ => Check::Warned(reason),
        }
    }

    /// Whether the tenant has a catalog: types of its own, or the operator's.
    pub fn has_catalog(&self, tenant: &TenantId) -> bool {
        let snapshot = self.snapshot();
        snapshot.owned(tenant.as_str()).is_some() || snapshot.owned("").is_some()
    }

    /// Why an endpoint's `event_types` are refused, if they are: under [`OUTSIDE_RULE`],
    /// the first filter that names no type of the tenant's catalog (a `prefix.*` filter
    /// must match at least one). `None` when all do, or the tenant does not enforce its
    /// catalog, or has none.
    pub fn refused_filter(&self, tenant: &TenantId, filters: &[String]) -> Option<String> {
        let snapshot = self.snapshot();
        if snapshot.mode(tenant) != SchemaValidation::Enforce {
            return None;
        }
        let unknown = snapshot.unknown_filter(tenant, filters)?;
        Some(format!("event_types: {unknown:?} names no type of the event catalog ({OUTSIDE_RULE})"))
    }

    /// The `dataschema` of the tenant's events of `event_type` (its own type, else the
    /// operator's), when the catalog holds a schema for it.
    pub fn dataschema(&self, tenant: &TenantId, event_type: &str) -> Option<String> {
        self.snapshot().seen(tenant, event_type)?.dataschema.clone()
    }

    /// The latest schema version of `event_type` as the tenant sees it (its own type, else
    /// the operator's): what a posted event of that type is stamped with. `None` while the
    /// type has no schema or is not in the catalog.
    pub fn version(&self, tenant: &TenantId, event_type: &str) -> Option<i64> {
        self.snapshot().seen(tenant, event_type).map(|c| c.version).filter(|v| *v > 0)
    }
}

/// A step of a payload's conversion: whose plugin (the type owner's: a tenant, or the
/// operator's `herald-ops`) and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub tenant: String,
    pub plugin: String,
    pub from: i64,
    pub to: i64,
}

impl Catalog {
    /// Why an endpoint of `tenant` cannot pin version `version` of `event_type`, if it
    /// cannot: the type is not in the catalog the tenant sees, or has no such version.
    pub fn refused_pin(&self, tenant: &TenantId, event_type: &str, version: i64) -> Option<String> {
        let snapshot = self.snapshot();
        let Some(compiled) = snapshot.seen(tenant, event_type) else {
            return Some("names no type of the tenant's event catalog".into());
        };
        match compiled.version {
            0 => Some("the type has no schema, so no versions".into()),
            latest if !(1..=latest).contains(&version) => {
                Some(format!("version {version} does not exist (1 to {latest})"))
            }
            _ => None,
        }
    }

    /// The adapters that take a payload of `event_type` from version `from` to `to`, as
    /// the tenant sees the type (its own type's, else the operator's), shortest chain
    /// first; `Err`: the reason no chain does, naming the type and both versions.
    pub fn conversion(&self, tenant: &TenantId, event_type: &str, from: i64, to: i64) -> Result<Vec<Step>, String> {
        let snapshot = self.snapshot();
        let missing = || format!("{ADAPTER_MISSING} {event_type} v{from} \u{2192} v{to}");
        let (owner, _) = snapshot.seen_with_owner(tenant, event_type).ok_or_else(missing)?;
        let registered = snapshot.adapters.get(&(owner.to_string(), event_type.to_string()));
        let chain = adapter_chain(registered.map_or(&[][..], Vec::as_slice), from, to).ok_or_else(missing)?;
        let plugin_tenant = if owner.is_empty() { OPS_TENANT } else { owner };
        Ok(chain
            .into_iter()
            .map(|a| Step { tenant: plugin_tenant.to_string(), plugin: a.plugin.clone(), from: a.from, to: a.to })
            .collect())
    }
}

/// How a hold for a missing adapter starts (the endpoint's `state_reason`), followed by
/// `{type} v{from} → v{to}`; registering adapters resumes the endpoints held so.
pub const ADAPTER_MISSING: &str = "payload_versions: no adapter for";

/// The one rule for event types outside a tenant's catalog, for posting and subscribing
/// alike; every refusal under it says it.
pub const OUTSIDE_RULE: &str = "with schema_validation \"enforce\", events and endpoints take only the catalog's \
     types; with \"warn\" or \"off\", any type";

impl Snapshot {
    /// The first of `filters` that names no type of the tenant's catalog; `None` when all
    /// do, or when the tenant has no catalog.
    fn unknown_filter<'f>(&self, tenant: &TenantId, filters: &'f [String]) -> Option<&'f str> {
        let own = self.owned(tenant.as_str());
        let operator = self.owned("");
        if own.is_none() && operator.is_none() {
            return None;
        }
        let names: Vec<&String> = own.into_iter().chain(operator).flat_map(|types| types.keys()).collect();
        let known = |f: &String| names.iter().any(|n| type_filter_matches(std::slice::from_ref(f), n));
        filters.iter().find(|f| f.as_str() != "*" && !known(f)).map(String::as_str)
    }

    fn mode(&self, tenant: &TenantId) -> SchemaValidation {
        self.settings.get(tenant).map(|s| s.schema_validation).unwrap_or_default()
    }

    fn build(
        revision: i64,
        old: &Snapshot,
        types: Vec<EventType>,
        settings: Vec<(TenantId, TenantSettings)>,
    ) -> Snapshot {
        let mut by_owner: HashMap<String, HashMap<String, Arc<Compiled>>> = HashMap::new();
        let mut adapters = HashMap::new();
        for mut t in types {
            let owner = t.owner.stored().to_string();
            if !t.adapters.is_empty() {
                adapters.insert((owner.clone(), t.name.clone()), std::mem::take(&mut t.adapters));
            }
            let kept = old.owned(&owner).and_then(|m| m.get(&t.name)).filter(|c| c.version == t.version).cloned();
            let compiled = kept.unwrap_or_else(|| Arc::new(Compiled::of(&t)));
            by_owner.entry(owner).or_default().insert(t.name, compiled);
        }
        let settings = settings.into_iter().filter(|(_, s)| *s != TenantSettings::default()).collect();
        Snapshot { revision, settings, types: by_owner, adapters }
    }

    /// The tenant's own type of this name, else the operator's, with its owner.
    fn seen_with_owner<'a>(&'a self, tenant: &'a TenantId, event_type: &str) -> Option<(&'a str, &'a Arc<Compiled>)> {
        match self.owned(tenant.as_str()).and_then(|m| m.get(event_type)) {
            Some(c) => Some((tenant.as_str(), c)),
            None => Some(("", self.owned("")?.get(event_type)?)),
        }
    }

    /// The tenant's own type of this name, else the operator's.
    fn seen<'a>(&'a self, tenant: &'a TenantId, event_type: &str) -> Option<&'a Arc<Compiled>> {
        self.seen_with_owner(tenant, event_type).map(|(_, compiled)| compiled)
    }

    fn owned(&self, owner: &str) -> Option<&HashMap<String, Arc<Compiled>>> {
        self.types.get(owner).filter(|m| !m.is_empty())
    }

    /// Why the event fails the tenant's catalog, if it does. A tenant with no catalog at
    /// all (neither its own types nor the operator's) accepts every type.
    fn failure(&self, tenant: &TenantId, event_type: &str, payload: &str) -> Option<String> {
        let own = self.owned(tenant.as_str());
        let operator = self.owned("");
        if own.is_none() && operator.is_none() {
            return None;
        }
        let found = own.and_then(|m| m.get(event_type)).or_else(|| operator.and_then(|m| m.get(event_type)));
        let Some(compiled) = found else {
            return Some(format!("type: {event_type:?} is not in the event catalog ({OUTSIDE_RULE})"));
        };
        let validator = compiled.validator.as_ref()?;
        let value: serde_json::Value = match serde_json::from_str(payload) {
            Ok(v) => v,
            Err(e) => return Some(format!("payload: invalid JSON: {e}")),
        };
        first_failure(validator, &value)
            .map(|reason| format!("{reason} (schema v{} of {event_type})", compiled.version))
    }
}

impl Compiled {
    fn of(t: &EventType) -> Compiled {
        let validator = t.schema.as_ref().and_then(|s| match compile(s) {
            Ok(v) => Some(v),
            Err(e) => {
                // Checked when written; a schema that no longer compiles validates nothing.
                tracing::warn!(owner = t.owner.stored(), event_type = %t.name, version = t.version, error = %e,
                    "stored event type schema does not compile");
                None
            }
        });
        let dataschema = t.schema.as_ref().map(|s| match s.get("$id").and_then(|id| id.as_str()) {
            Some(id) if url::Url::parse(id).is_ok() => id.to_string(),
            _ => format!("urn:herald:event-type:{}:v{}", t.name, t.version),
        });
        Compiled { version: t.version, validator, dataschema }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schemas_that_are_not_draft_2020_12_are_refused_with_their_place() {
        assert!(compile(&json!({"type": "object"})).is_ok());
        assert!(compile(&json!({})).is_ok());
        let bad = compile(&json!({"type": "objekt"})).unwrap_err();
        assert!(bad.contains("/type"), "{bad}");
        assert!(compile(&json!(3)).unwrap_err().contains("object"));
        let draft7 = compile(&json!({"$schema": "http://json-schema.org/draft-07/schema#"})).unwrap_err();
        assert!(draft7.starts_with("$schema:"), "{draft7}");
        assert!(compile(&json!({"$ref": "https://example.com/s.json"})).is_err());
        assert!(compile(&json!({"pattern": "(["})).is_err());
    }

    #[test]
    fn a_failure_names_the_path_in_the_payload() {
        let v = compile(&json!({
            "type": "object",
            "properties": {"items": {"type": "array", "items": {"properties": {"sku": {"type": "string"}}}},
                           "email": {"type": "string", "format": "email"}},
        }))
        .unwrap();
        assert_eq!(first_failure(&v, &json!({"items": [{"sku": "a"}]})), None);
        let e = first_failure(&v, &json!({"items": [{"sku": "a"}, {"sku": 3}]})).unwrap();
        assert!(e.starts_with("payload.items[1].sku: "), "{e}");
        let e = first_failure(&v, &json!({"email": "nope"})).unwrap();
        assert!(e.starts_with("payload.email: "), "{e}");
    }
}
