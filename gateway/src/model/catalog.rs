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
    pub created_at: Millis,
    pub updated_at: Millis,
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
