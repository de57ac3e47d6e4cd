//! The event catalog's records: event types with their JSON Schema versions, and what a
//! tenant's intake does with an event that fails them (`SchemaValidation`). Plain data.

use serde::{Deserialize, Serialize};

use super::{Millis, TenantId};

/// Whose catalog a type belongs to: the operator's (every tenant inherits it) or one
/// tenant's own (which overrides an operator type of the same name).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CatalogOwner {
    Operator,
    Tenant(TenantId),
}

impl CatalogOwner {
    /// As stored: the tenant id, or `""` for the operator (no tenant id is empty).
    pub fn stored(&self) -> &str {
        match self {
            CatalogOwner::Operator => "",
            CatalogOwner::Tenant(t) => t.as_str(),
        }
    }

    /// The owner a path names: a tenant's, or the operator's (`None`).
    pub fn of(tenant: Option<&TenantId>) -> CatalogOwner {
        tenant.map_or(CatalogOwner::Operator, |t| CatalogOwner::Tenant(t.clone()))
    }

    pub fn from_stored(s: String) -> CatalogOwner {
        match s.as_str() {
            "" => CatalogOwner::Operator,
            _ => CatalogOwner::Tenant(TenantId::from_stored(s)),
        }
    }
}

/// One event type of a catalog, with its latest schema.
#[derive(Debug, Clone, PartialEq)]
pub struct EventType {
    pub owner: CatalogOwner,
    /// The event type's name (the grammar of `validate_event_type`).
    pub name: String,
    pub description: String,
    pub deprecated: bool,
    /// Example payloads (each valid against the latest schema when written).
    pub examples: Vec<serde_json::Value>,
    /// The latest schema's version: 1, 2, …; 0 while the type has no schema.
    pub version: i64,
    /// The latest schema (draft 2020-12); `None` while `version` is 0.
    pub schema: Option<serde_json::Value>,
    /// The plugins that convert a payload from one version of the schema to an older one,
    /// for endpoints that pin it (`payload_versions`).
    pub adapters: Vec<Adapter>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// One step of payload conversion: a plugin (its `transform` hook) that turns a payload of
/// version `from` of a type's schema into one of version `to`, an older one. A tenant's
/// own type names the tenant's plugin; an operator type, the operator's (a plugin of the
/// reserved tenant `herald-ops`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Adapter {
    /// The version it reads (2 or more, at most the type's latest).
    pub from: i64,
    /// The version it writes (1 or more, below `from`).
    pub to: i64,
    /// The plugin's name; its `transform` hook gets the payload and returns it converted.
    pub plugin: String,
}

/// The shortest chain of `adapters` that takes a payload from version `from` to version
/// `to` (empty when they are equal); `None` when no chain does. Of two chains of one
/// length, the one listed first wins.
pub fn adapter_chain(adapters: &[Adapter], from: i64, to: i64) -> Option<Vec<&Adapter>> {
    // Breadth first over versions: each reached once, by the fewest steps.
    let mut reached: Vec<(i64, Option<usize>)> = vec![(from, None)];
    let mut at = 0;
    while at < reached.len() {
        let (version, _) = reached[at];
        if version == to {
            let mut chain = Vec::new();
            let mut back = reached[at].1;
            while let Some(i) = back {
                let step = &adapters[i];
                chain.push(step);
                back = reached.iter().find(|(v, _)| *v == step.from).and_then(|(_, b)| *b);
            }
            chain.reverse();
            return Some(chain);
        }
        for (i, a) in adapters.iter().enumerate() {
            if a.from == version && !reached.iter().any(|(v, _)| *v == a.to) {
                reached.push((a.to, Some(i)));
            }
        }
        at += 1;
    }
    None
}

/// One numbered version of an event type's schema; kept when a newer one replaces it.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaVersion {
    pub version: i64,
    pub schema: serde_json::Value,
    pub created_at: Millis,
}

/// What intake does with an event whose payload fails its type's schema, or whose type is
/// not in a catalog the tenant has (its own or the operator's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SchemaValidation {
    /// Nothing is checked.
    #[default]
    Off,
    /// Accepted, and counted in `herald_schema_violations_total{mode="warn"}`.
    Warn,
    /// Refused with a 422 naming the failing path; nothing is stored.
    Enforce,
}

/// A tenant's settings, stored in one row (`catalog_settings`) and held in memory by
/// `catalog`, so intake and endpoint writes read them without a store read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TenantSettings {
    pub schema_validation: SchemaValidation,
    /// Every HTTP endpoint of the tenant is verified (`verify`) unless its own `verify` was
    /// written: applied to an endpoint when it is created and when its URL changes.
    pub verify_endpoints: bool,
}

impl SchemaValidation {
    pub fn as_str(self) -> &'static str {
        match self {
            SchemaValidation::Off => "off",
            SchemaValidation::Warn => "warn",
            SchemaValidation::Enforce => "enforce",
        }
    }

    pub fn parse(s: &str) -> Option<SchemaValidation> {
        match s {
            "off" => Some(SchemaValidation::Off),
            "warn" => Some(SchemaValidation::Warn),
            "enforce" => Some(SchemaValidation::Enforce),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(from: i64, to: i64, plugin: &str) -> Adapter {
        Adapter { from, to, plugin: plugin.into() }
    }

    #[test]
    fn chains_are_the_shortest_path_of_registered_steps() {
        let adapters = [step(3, 2, "a32"), step(2, 1, "a21"), step(4, 3, "a43"), step(4, 2, "a42")];
        let names = |from, to| {
            adapter_chain(&adapters, from, to).map(|c| c.iter().map(|a| a.plugin.as_str()).collect::<Vec<_>>())
        };
        assert_eq!(names(2, 2), Some(vec![]));
        assert_eq!(names(2, 1), Some(vec!["a21"]));
        assert_eq!(names(3, 1), Some(vec!["a32", "a21"]));
        assert_eq!(names(4, 1), Some(vec!["a42", "a21"]), "two steps, not three");
        assert_eq!(names(1, 2), None, "no step up");
        assert_eq!(names(5, 1), None);
        assert_eq!(adapter_chain(&[step(2, 1, "x"), step(1, 2, "y")], 2, 3), None, "a cycle ends");
    }
}
