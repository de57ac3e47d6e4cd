//! Tenants' own plugin settings (`plugin_settings`): the reads both backends share, and the
//! upsert Postgres runs on its pool (SQLite runs the same statement on its writer thread,
//! `sqlite/writes.rs`). The settings are one JSON document per (tenant, plugin).

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::queries::{Dialect, Queries};
use super::{Result, StoreError};
use crate::model::{PluginSettings, StoredPluginSettings, TenantId};

const COLUMNS: &str = "tenant_id, plugin, settings, updated_at";

pub(super) fn decode(settings: &str) -> Result<PluginSettings> {
    serde_json::from_str(settings).map_err(|e| StoreError::backend(format!("stored plugin settings: {e}")))
}

impl<DB> Queries<DB>
where
    DB: Dialect,
    for<'c> &'c sqlx::Pool<DB>: Executor<'c, Database = DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'c> &'c str: ColumnIndex<DB::Row>,
{
    pub(super) async fn put_plugin_settings(&self, conn: &mut DB::Connection, s: &StoredPluginSettings) -> Result<()> {
        sqlx::query(super::sql::UPSERT_PLUGIN_SETTINGS)
            .bind(s.tenant.as_str())
            .bind(s.plugin.as_str())
            .bind(super::queries::json(&s.settings))
            .bind(s.updated_at)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    pub(super) async fn plugin_settings(
        &self,
        tenant: &TenantId,
        plugin: &str,
    ) -> Result<Option<StoredPluginSettings>> {
        let sql = format!("SELECT {COLUMNS} FROM plugin_settings WHERE tenant_id = $1 AND plugin = $2");
        let row = sqlx::query(&sql).bind(tenant.as_str()).bind(plugin).fetch_optional(&self.pool).await?;
        row.map(|r| stored(&r)).transpose()
    }

    pub(super) async fn all_plugin_settings(&self) -> Result<Vec<StoredPluginSettings>> {
        let sql = format!("SELECT {COLUMNS} FROM plugin_settings ORDER BY tenant_id, plugin");
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        rows.iter().map(stored).collect()
    }
}

fn stored<R: Row>(row: &R) -> Result<StoredPluginSettings>
where
    for<'q> String: Decode<'q, R::Database> + Type<R::Database>,
    for<'q> i64: Decode<'q, R::Database> + Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    Ok(StoredPluginSettings {
        tenant: TenantId::from_stored(row.try_get::<String, _>("tenant_id")?),
        plugin: row.try_get("plugin")?,
        settings: decode(&row.try_get::<String, _>("settings")?)?,
        updated_at: row.try_get("updated_at")?,
    })
}
