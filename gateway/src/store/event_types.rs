//! The event catalog (`event_types`, `event_type_schemas`, `catalog_settings`,
//! `catalog_revision`): the reads both backends share, written once over sqlx's
//! `Database`. The writes are `Admin`'s (SQLite runs them on its writer thread,
//! `sqlite/writes.rs`; Postgres in a transaction on its pool), with the statements in
//! `sql.rs`. Every write bumps `catalog_revision` in its transaction, so a node learns
//! whether anything changed from one row (`catalog::Catalog::refresh`).

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::queries::{Dialect, Queries};
use super::{Result, StoreError};
use crate::model::{CatalogOwner, EventType, SchemaValidation, SchemaVersion, TenantId, TenantSettings};

/// An event type with its latest schema (NULL while it has none).
const SELECT_TYPES: &str = "SELECT t.owner, t.name, t.description, t.deprecated, t.examples, t.version, s.schema, t.adapters, \
     t.created_at, t.updated_at FROM event_types t LEFT JOIN event_type_schemas s \
     ON s.owner = t.owner AND s.name = t.name AND s.version = t.version";

pub(super) fn json_value(what: &str, text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| StoreError::backend(format!("stored {what}: {e}")))
}

impl<DB> Queries<DB>
where
    DB: Dialect,
    for<'c> &'c sqlx::Pool<DB>: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> bool: Decode<'q, DB> + Type<DB>,
    for<'c> &'c str: ColumnIndex<DB::Row>,
{
    /// One owner's types (every owner's with `None`), by owner and name.
    pub(super) async fn event_types(&self, owner: Option<&CatalogOwner>) -> Result<Vec<EventType>> {
        let rows = match owner {
            Some(o) => {
                let sql = format!("{SELECT_TYPES} WHERE t.owner = $1 ORDER BY t.name");
                sqlx::query(&sql).bind(o.stored()).fetch_all(&self.pool).await?
            }
            None => {
                let sql = format!("{SELECT_TYPES} ORDER BY t.owner, t.name");
                sqlx::query(&sql).fetch_all(&self.pool).await?
            }
        };
        rows.iter().map(event_type).collect()
    }

    pub(super) async fn event_type(&self, owner: &CatalogOwner, name: &str) -> Result<Option<EventType>> {
        let sql = format!("{SELECT_TYPES} WHERE t.owner = $1 AND t.name = $2");
        let row = sqlx::query(&sql).bind(owner.stored()).bind(name).fetch_optional(&self.pool).await?;
        row.as_ref().map(event_type).transpose()
    }

    /// Every schema version of a type, oldest first.
    pub(super) async fn schema_versions(&self, owner: &CatalogOwner, name: &str) -> Result<Vec<SchemaVersion>> {
        let rows = sqlx::query(
            "SELECT version, schema, created_at FROM event_type_schemas WHERE owner = $1 AND name = $2 \
             ORDER BY version",
        )
        .bind(owner.stored())
        .bind(name)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(SchemaVersion {
                    version: r.try_get("version")?,
                    schema: json_value("schema", &r.try_get::<String, _>("schema")?)?,
                    created_at: r.try_get("created_at")?,
                })
            })
            .collect()
    }

    /// Every tenant's settings that were ever set.
    pub(super) async fn tenant_settings(&self) -> Result<Vec<(TenantId, TenantSettings)>> {
        let rows = sqlx::query("SELECT tenant_id, schema_validation, verify_endpoints FROM catalog_settings")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let mode = r.try_get::<String, _>("schema_validation")?;
                let schema_validation = SchemaValidation::parse(&mode)
                    .ok_or_else(|| StoreError::backend(format!("stored schema_validation {mode:?}")))?;
                let verify_endpoints = r.try_get::<bool, _>("verify_endpoints")?;
                let settings = TenantSettings { schema_validation, verify_endpoints };
                Ok((TenantId::from_stored(r.try_get::<String, _>("tenant_id")?), settings))
            })
            .collect()
    }

    pub(super) async fn catalog_revision(&self) -> Result<i64> {
        let row = sqlx::query("SELECT revision FROM catalog_revision").fetch_one(&self.pool).await?;
        Ok(row.try_get("revision")?)
    }
}

fn event_type<R: Row>(r: &R) -> Result<EventType>
where
    for<'q> String: Decode<'q, R::Database> + Type<R::Database>,
    for<'q> i64: Decode<'q, R::Database> + Type<R::Database>,
    for<'q> bool: Decode<'q, R::Database> + Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    let examples = json_value("examples", &r.try_get::<String, _>("examples")?)?;
    Ok(EventType {
        owner: CatalogOwner::from_stored(r.try_get("owner")?),
        name: r.try_get("name")?,
        description: r.try_get("description")?,
        deprecated: r.try_get("deprecated")?,
        examples: serde_json::from_value(examples).map_err(|e| StoreError::backend(format!("stored examples: {e}")))?,
        version: r.try_get("version")?,
        schema: r.try_get::<Option<String>, _>("schema")?.map(|s| json_value("schema", &s)).transpose()?,
        adapters: serde_json::from_value(json_value("adapters", &r.try_get::<String, _>("adapters")?)?)
            .map_err(|e| StoreError::backend(format!("stored adapters: {e}")))?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}
