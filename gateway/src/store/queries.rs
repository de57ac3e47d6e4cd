//! The statements run on a backend's sqlx pool: every read, as the one implementation of
//! [`Reads`] for both backends, and the administrative writes (tenants, tokens, endpoints,
//! replays) that Postgres runs there (SQLite's pool is read-only: it runs the same
//! statements, `store/sql.rs`, on its writer thread, `sqlite/writes.rs`, so they never
//! queue for the file's lock). Written once, generic over sqlx's `Database`: the SQL uses
//! `$n` placeholders, which sqlx binds by number on SQLite as on Postgres, and decodes into
//! the shared [`rows`](super::rows). What differs on purpose (the group-commit writers,
//! claims, lease recovery, re-queueing a replay's batch, purging, notifications) stays in
//! each backend.

use std::collections::HashMap;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Pool, Row, Type};

use super::rows::{
    self, ATTEMPT_COLUMNS, ATTEMPT_ORDER, AttemptRow, DELIVERY_COLUMNS, DeliveryRow, EndpointRow, EventRow,
    FIRST_ATTEMPT_COLUMNS, ReplayRow, TOKEN_COLUMNS, TenantRow, TokenRow,
};
use super::sql::{self, Sql};
use super::{DeliveryFilter, Polled, QueueStats, Reads, Result, SeriesPoint, SeriesScope, StoreError};
use crate::model::*;

mod insight;

/// What a backend's SQL dialect writes differently in the shared statements.
pub(super) trait Dialect: Database {
    /// "`deliveries.id` is one of `ids`", after a `WHERE`.
    fn push_ids<'a>(q: &mut Sql<'a, Self>, ids: &'a [String]);
    /// "`column` is one of `ids`", after a `WHERE`: one bound value, so the statement's
    /// text is the same however many ids there are.
    fn push_one_of<'a>(q: &mut Sql<'a, Self>, column: &str, ids: &'a [String]);
    /// Rows a statement changed (sqlx has no trait for it).
    fn rows_affected(done: &Self::QueryResult) -> u64;
    /// The text at `path` in the JSON text column `column` (NULL when absent).
    fn json_text(column: &str, path: &[&str]) -> String;
    /// [`sql::NEXT_DUE_SQLITE`] or [`sql::NEXT_DUE_POSTGRES`].
    const NEXT_DUE: &'static str;
    /// The column of a delivery's position in commit order (`rowid`, `seq`).
    const SEQ: &'static str;
}

/// The shared statements on one backend's pool.
pub(super) struct Queries<DB: Database> {
    pub(super) pool: Pool<DB>,
    /// SQLite's write-ahead log, whose size the metrics show (`None` on Postgres).
    pub(super) wal: Option<std::path::PathBuf>,
}

pub(super) fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("serializable")
}

/// A count column (`COUNT(*)`, 64-bit on both backends).
fn count<R: Row>(row: &R, column: &str) -> Result<u64>
where
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    Ok(row.try_get::<i64, _>(column)? as u64)
}

// What the statements need of a backend, said once: sqlx provides all of it for SQLite and
// Postgres, but Rust does not carry bounds like these from a trait to its users.
#[async_trait]
impl<DB> Reads for Queries<DB>
where
    DB: Dialect,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Option<String>: Encode<'q, DB>,
    for<'q> Option<i64>: Encode<'q, DB>,
    for<'q> f64: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'c> &'c str: ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
    for<'r> TenantRow: FromRow<'r, DB::Row>,
    for<'r> TokenRow: FromRow<'r, DB::Row>,
    for<'r> EndpointRow: FromRow<'r, DB::Row>,
    for<'r> EventRow: FromRow<'r, DB::Row>,
    for<'r> DeliveryRow: FromRow<'r, DB::Row>,
    for<'r> AttemptRow: FromRow<'r, DB::Row>,
    for<'r> ReplayRow: FromRow<'r, DB::Row>,
{
    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
        let row = sqlx::query_as::<_, TenantRow>("SELECT id, name, created_at FROM tenants WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Tenant::from))
    }
    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let row = sqlx::query_as::<_, TokenRow>(&format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = $1"))
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(TokenRecord::from))
    }
    async fn list_tokens(&self, tenant: &TenantId) -> Result<Vec<TokenRecord>> {
        let rows = sqlx::query_as::<_, TokenRow>(&format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens WHERE tenant_id = $1 ORDER BY created_at, id"
        ))
        .bind(tenant.as_str())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(TokenRecord::from).collect())
    }
    async fn endpoint(&self, id: &EndpointId) -> Result<Option<Endpoint>> {
        let row = sqlx::query_as::<_, EndpointRow>("SELECT * FROM endpoints WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.map(Endpoint::try_from).transpose()
    }
    async fn endpoint_versions(&self, ids: &[EndpointId]) -> Result<Vec<(EndpointId, i64)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = ids.iter().map(|id| id.as_str().to_owned()).collect();
        let mut q = Sql::<DB>::new("SELECT id, version FROM endpoints WHERE ");
        DB::push_one_of(&mut q, "id", &ids);
        let (text, args) = q.take()?;
        let rows = sqlx::query_with(&text, args).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| Ok((EndpointId::from_stored(r.try_get::<String, _>("id")?), r.try_get("version")?)))
            .collect()
    }
    async fn list_endpoints(&self, tenant: &TenantId) -> Result<Vec<Endpoint>> {
        let rows =
            sqlx::query_as::<_, EndpointRow>("SELECT * FROM endpoints WHERE tenant_id = $1 ORDER BY created_at, id")
                .bind(tenant.as_str())
                .fetch_all(&self.pool)
                .await?;
        rows::all(rows)
    }
    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<Event>> {
        let row = sqlx::query_as::<_, EventRow>("SELECT * FROM events WHERE tenant_id = $1 AND id = $2")
            .bind(tenant.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Event::from))
    }
    async fn list_deliveries(&self, f: &DeliveryFilter) -> Result<Vec<Delivery>> {
        let mut q = Sql::<DB>::new(format!("SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE 1 = 1"));
        sql::push_delivery_filter(&mut q, f);
        let (text, args) = q.take()?;
        rows::all(sqlx::query_as_with::<_, DeliveryRow, _>(&text, args).fetch_all(&self.pool).await?)
    }
    async fn get_delivery(&self, tenant: &TenantId, id: &DeliveryId) -> Result<Option<(Delivery, Vec<Attempt>)>> {
        let row = sqlx::query_as::<_, DeliveryRow>(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE id = $1 AND tenant_id = $2"
        ))
        .bind(id.as_str())
        .bind(tenant.as_str())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        // Its attempts with rows of their own, and the first one if its row keeps it.
        let attempts = sqlx::query_as::<_, AttemptRow>(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE delivery_id = $1 UNION ALL \
             SELECT {FIRST_ATTEMPT_COLUMNS} FROM deliveries WHERE id = $1 AND first_attempt_id IS NOT NULL \
             {ATTEMPT_ORDER}"
        ))
        .bind(id.as_str())
        .fetch_all(&self.pool)
        .await?;
        Ok(Some((row.try_into()?, attempts.into_iter().map(Attempt::from).collect())))
    }
    async fn pending_endpoints(&self) -> Result<Vec<(EndpointId, Millis)>> {
        // A `poll` endpoint's deliveries are never due (a consumer reads them): not pending.
        let rows = sqlx::query(
            "SELECT endpoint_id, MIN(next_attempt_at) AS due FROM deliveries \
             WHERE state IN ('queued', 'waiting') AND next_attempt_at IS NOT NULL GROUP BY endpoint_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((EndpointId::from_stored(r.try_get::<String, _>("endpoint_id")?), r.try_get("due")?)))
            .collect()
    }
    async fn held_partitions(&self, now: Millis) -> Result<Vec<EndpointId>> {
        let ids: Vec<String> = sqlx::query_scalar("SELECT endpoint_id FROM partitions WHERE lease_until >= $1")
            .bind(now)
            .fetch_all(&self.pool)
            .await?;
        Ok(ids.into_iter().map(EndpointId::from_stored).collect())
    }
    async fn next_due(&self, endpoint: &EndpointId, dead_heads_block: bool) -> Result<Option<Millis>> {
        let due: Option<i64> = sqlx::query_scalar(DB::NEXT_DUE)
            .bind(endpoint.as_str())
            .bind(dead_heads_block)
            .fetch_one(&self.pool)
            .await?;
        Ok(due)
    }
    async fn dead_selection(
        &self,
        tenant: &TenantId,
        ids: Option<&[String]>,
        filter: Option<&DeadLetterFilter>,
    ) -> Result<(u64, Vec<SkippedEndpoint>)> {
        let mut q = Sql::<DB>::new("SELECT COUNT(*) FROM deliveries WHERE 1 = 1");
        sql::push_dead_selection(&mut q, tenant, ids, filter, "", DB::push_ids);
        let (text, args) = q.take()?;
        let n: i64 = sqlx::query_scalar_with(&text, args).fetch_one(&self.pool).await?;
        let mut q = Sql::<DB>::new(
            "SELECT e.id, e.state, e.state_reason, COUNT(*) AS n FROM deliveries \
             JOIN endpoints e ON e.id = deliveries.endpoint_id WHERE e.state <> 'active'",
        );
        sql::push_dead_selection(&mut q, tenant, ids, filter, "", DB::push_ids);
        q.push(" GROUP BY e.id, e.state, e.state_reason ORDER BY e.id");
        let (text, args) = q.take()?;
        let rows = sqlx::query_with(&text, args).fetch_all(&self.pool).await?;
        let blocked = rows
            .iter()
            .map(|r| {
                Ok(SkippedEndpoint {
                    endpoint: r.try_get("id")?,
                    state: r.try_get("state")?,
                    reason: r.try_get("state_reason")?,
                    dead_letters: count(r, "n")?,
                })
            })
            .collect::<Result<_>>()?;
        Ok((n as u64, blocked))
    }
    async fn delivery_endpoints(&self, tenant: &TenantId, ids: &[String]) -> Result<Vec<EndpointId>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = Sql::<DB>::new("SELECT DISTINCT endpoint_id FROM deliveries WHERE tenant_id = ");
        q.push_bind(tenant.as_str());
        DB::push_ids(&mut q, ids);
        let (text, args) = q.take()?;
        let found: Vec<String> = sqlx::query_scalar_with(&text, args).fetch_all(&self.pool).await?;
        Ok(found.into_iter().map(EndpointId::from_stored).collect())
    }
    async fn get_replay(&self, tenant: &TenantId, id: &str) -> Result<Option<ReplayProgress>> {
        let row = sqlx::query_as::<_, ReplayRow>("SELECT * FROM replays WHERE id = $1 AND tenant_id = $2")
            .bind(id)
            .bind(tenant.as_str())
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(self.with_figures(vec![Replay::try_from(row)?]).await?.pop())
    }
    async fn list_replays(&self, tenant: &TenantId, after: Option<&str>, limit: u32) -> Result<Vec<ReplayProgress>> {
        let mut q = Sql::<DB>::new("SELECT * FROM replays WHERE tenant_id = ");
        q.push_bind(tenant.as_str());
        if let Some(after) = after {
            q.push(" AND id < ").push_bind(after);
        }
        q.push(" ORDER BY id DESC LIMIT ").push_bind(i64::from(limit.max(1)));
        let (text, args) = q.take()?;
        let rows = sqlx::query_as_with::<_, ReplayRow, _>(&text, args).fetch_all(&self.pool).await?;
        self.with_figures(rows::all(rows)?).await
    }
    async fn running_replays(&self) -> Result<Vec<Replay>> {
        let rows = sqlx::query_as::<_, ReplayRow>("SELECT * FROM replays WHERE state = 'running' ORDER BY created_at")
            .fetch_all(&self.pool)
            .await?;
        rows::all(rows)
    }
    async fn cancelled_replays(&self, ids: &[String]) -> Result<Vec<String>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = Sql::<DB>::new("SELECT id FROM replays WHERE state = 'cancelled' AND id IN (");
        for (i, id) in ids.iter().enumerate() {
            q.push(if i == 0 { "" } else { ", " }).push_bind(id.as_str());
        }
        q.push(")");
        let (text, args) = q.take()?;
        Ok(sqlx::query_scalar_with(&text, args).fetch_all(&self.pool).await?)
    }
    async fn dead_letter_counts(&self, f: &DeliveryFilter) -> Result<Vec<(String, u64)>> {
        let mut q =
            Sql::<DB>::new("SELECT COALESCE(reason, '') AS reason, COUNT(*) AS n FROM deliveries WHERE state = 'dead'");
        sql::push_delivery_conditions(&mut q, f);
        q.push(" GROUP BY reason ORDER BY n DESC");
        let (text, args) = q.take()?;
        let rows = sqlx::query_with(&text, args).fetch_all(&self.pool).await?;
        rows.iter().map(|r| Ok((r.try_get("reason")?, count(r, "n")?))).collect()
    }
    async fn stale_dead_letters(&self, older_than: Millis) -> Result<Vec<(TenantId, Millis, u64)>> {
        let rows = sqlx::query(
            "SELECT tenant_id, MIN(updated_at) AS oldest, COUNT(*) AS n FROM deliveries WHERE state = 'dead' \
             GROUP BY tenant_id HAVING MIN(updated_at) < $1",
        )
        .bind(older_than)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let tenant = TenantId::from_stored(r.try_get::<String, _>("tenant_id")?);
                Ok((tenant, r.try_get("oldest")?, count(r, "n")?))
            })
            .collect()
    }
    /// Queue depth and its oldest due delivery, the `top` endpoints by due deliveries,
    /// endpoints by state, dead letters per tenant, and the size of SQLite's WAL.
    async fn queue_stats(&self, now: Millis, top: u32) -> Result<QueueStats> {
        let due = sqlx::query(
            "SELECT COUNT(*) AS n, MIN(next_attempt_at) AS oldest FROM deliveries \
             WHERE state IN ('queued', 'waiting') AND next_attempt_at <= $1",
        )
        .bind(now)
        .fetch_one(&self.pool)
        .await?;
        let top_due = sqlx::query(
            "SELECT tenant_id, endpoint_id, COUNT(*) AS n FROM deliveries \
             WHERE state IN ('queued', 'waiting') AND next_attempt_at <= $1 \
             GROUP BY tenant_id, endpoint_id ORDER BY n DESC, endpoint_id LIMIT $2",
        )
        .bind(now)
        .bind(i64::from(top))
        .fetch_all(&self.pool)
        .await?;
        let states =
            sqlx::query("SELECT state, COUNT(*) AS n FROM endpoints GROUP BY state").fetch_all(&self.pool).await?;
        Ok(QueueStats {
            due: count(&due, "n")?,
            oldest_due: due.try_get("oldest")?,
            top_due: top_due
                .iter()
                .map(|r| {
                    let tenant = TenantId::from_stored(r.try_get::<String, _>("tenant_id")?);
                    Ok((tenant, EndpointId::from_stored(r.try_get::<String, _>("endpoint_id")?), count(r, "n")?))
                })
                .collect::<Result<_>>()?,
            endpoints_by_state: states
                .iter()
                .map(|r| Ok((r.try_get::<String, _>("state")?, count(r, "n")?)))
                .collect::<Result<_>>()?,
            dead: self.stale_dead_letters(Millis::MAX).await?,
            wal_bytes: self.wal.as_ref().map(|wal| std::fs::metadata(wal).map_or(0, |m| m.len())),
        })
    }

    async fn poll_page(&self, endpoint: &EndpointId, after: i64, limit: u32) -> Result<Vec<Polled>> {
        let rows = sqlx::query(&sql::poll_page(DB::SEQ))
            .bind(endpoint.as_str())
            .bind(after)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(Polled {
                    position: r.try_get("position")?,
                    delivery: DeliveryId::from_stored(r.try_get::<String, _>("id")?),
                    event_id: EventId::from_stored(r.try_get::<String, _>("event_id")?),
                    event_type: r.try_get("event_type")?,
                    payload: r.try_get("payload")?,
                    event_created_at: r.try_get("created_at")?,
                })
            })
            .collect()
    }
    async fn poll_position(&self, endpoint: &EndpointId, delivery: &DeliveryId) -> Result<Option<i64>> {
        let position = sqlx::query_scalar(&sql::poll_position(DB::SEQ))
            .bind(endpoint.as_str())
            .bind(delivery.as_str())
            .fetch_optional(&self.pool)
            .await?;
        Ok(position)
    }

    // The console's reads (`insight.rs`) and plugin settings (`plugin_settings.rs`) are
    // written beside their other statements; the inherent methods are these.
    async fn list_tenants(&self) -> Result<Vec<Tenant>> {
        Queries::list_tenants(self).await
    }
    async fn endpoint_page(
        &self,
        tenant: &TenantId,
        after: Option<&EndpointId>,
        limit: u32,
        plugin: Option<&str>,
    ) -> Result<Vec<Endpoint>> {
        Queries::endpoint_page(self, tenant, after, limit, plugin).await
    }
    async fn attempt_series(&self, scope: &SeriesScope, since: Millis, bucket_ms: i64) -> Result<Vec<SeriesPoint>> {
        Queries::attempt_series(self, scope, since, bucket_ms).await
    }
    async fn endpoint_health_page(&self, endpoints: &[EndpointId], now: Millis) -> Result<HashMap<EndpointId, Health>> {
        Queries::endpoint_health_page(self, endpoints, now).await
    }
    async fn plugin_settings(&self, tenant: &TenantId, plugin: &str) -> Result<Option<StoredPluginSettings>> {
        Queries::plugin_settings(self, tenant, plugin).await
    }
    async fn all_plugin_settings(&self) -> Result<Vec<StoredPluginSettings>> {
        Queries::all_plugin_settings(self).await
    }
    // The event catalog's reads (`event_types.rs`).
    async fn event_types(&self, owner: Option<&CatalogOwner>) -> Result<Vec<EventType>> {
        Queries::event_types(self, owner).await
    }
    async fn event_type(&self, owner: &CatalogOwner, name: &str) -> Result<Option<EventType>> {
        Queries::event_type(self, owner, name).await
    }
    async fn schema_versions(&self, owner: &CatalogOwner, name: &str) -> Result<Vec<SchemaVersion>> {
        Queries::schema_versions(self, owner, name).await
    }
    async fn tenant_settings(&self) -> Result<Vec<(TenantId, TenantSettings)>> {
        Queries::tenant_settings(self).await
    }
    async fn catalog_revision(&self) -> Result<i64> {
        Queries::catalog_revision(self).await
    }
    // The portal's reads (`portal.rs`).
    async fn find_portal_session(&self, token_hash: &str) -> Result<Option<PortalSession>> {
        Queries::portal_session(self, token_hash).await
    }
    async fn list_portal_sessions(&self, tenant: &TenantId) -> Result<Vec<PortalSession>> {
        Queries::portal_sessions(self, tenant).await
    }
    async fn branding(&self, tenant: &TenantId) -> Result<Option<Branding>> {
        Queries::branding(self, tenant).await
    }
    // The audit log (`audit.rs`).
    async fn audit_page(&self, filter: &AuditFilter, limit: u32) -> Result<Vec<AuditEntry>> {
        Queries::audit_page(self, filter, limit).await
    }
}

// The writes Postgres runs on its pool (SQLite runs them on its writer thread), and the
// reads and writes of a replay's turn.
impl<DB> Queries<DB>
where
    DB: Dialect,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Option<String>: Encode<'q, DB>,
    for<'q> Option<i64>: Encode<'q, DB>,
    for<'q> f64: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Type<DB>,
    for<'c> &'c str: ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
    for<'r> TenantRow: FromRow<'r, DB::Row>,
    for<'r> TokenRow: FromRow<'r, DB::Row>,
    for<'r> EndpointRow: FromRow<'r, DB::Row>,
    for<'r> EventRow: FromRow<'r, DB::Row>,
    for<'r> DeliveryRow: FromRow<'r, DB::Row>,
    for<'r> AttemptRow: FromRow<'r, DB::Row>,
    for<'r> ReplayRow: FromRow<'r, DB::Row>,
{
    pub(super) async fn create_tenant(&self, conn: &mut DB::Connection, t: &Tenant) -> Result<()> {
        sqlx::query(sql::INSERT_TENANT)
            .bind(t.id.as_str())
            .bind(&t.name)
            .bind(t.created_at)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
    pub(super) async fn insert_token(&self, conn: &mut DB::Connection, t: &TokenRecord) -> Result<()> {
        let scopes: Vec<&str> = t.scopes.iter().map(|s| s.as_str()).collect();
        sqlx::query(sql::INSERT_TOKEN)
            .bind(&t.id)
            .bind(&t.hash)
            .bind(t.tenant.as_str())
            .bind(scopes.join(" "))
            .bind(t.created_at)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
    pub(super) async fn revoke_token(&self, conn: &mut DB::Connection, tenant: &TenantId, id: &str) -> Result<bool> {
        let done = sqlx::query(sql::REVOKE_TOKEN).bind(tenant.as_str()).bind(id).execute(&mut *conn).await?;
        Ok(DB::rows_affected(&done) > 0)
    }
    pub(super) async fn insert_endpoint(&self, conn: &mut DB::Connection, e: &Endpoint) -> Result<()> {
        sqlx::query(sql::INSERT_ENDPOINT)
            .bind(e.id.as_str())
            .bind(e.tenant.as_str())
            .bind(json(&e.spec))
            .bind(json(&e.spec.event_types))
            .bind(e.state.as_str())
            .bind(&e.state_reason)
            .bind(e.paused_until)
            .bind(e.failing_since)
            .bind(e.created_at)
            .bind(e.updated_at)
            .bind(e.spec.ordering.stored().map(str::to_string))
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
    pub(super) async fn update_endpoint(&self, conn: &mut DB::Connection, e: &Endpoint) -> Result<bool> {
        let done = sqlx::query(sql::UPDATE_ENDPOINT)
            .bind(json(&e.spec))
            .bind(json(&e.spec.event_types))
            .bind(e.updated_at)
            .bind(e.spec.ordering.stored().map(str::to_string))
            .bind(e.id.as_str())
            .bind(e.tenant.as_str())
            .execute(&mut *conn)
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }
    pub(super) async fn put_verification(
        &self,
        conn: &mut DB::Connection,
        id: &EndpointId,
        v: &Verification,
    ) -> Result<bool> {
        let done = sqlx::query(sql::PUT_VERIFICATION).bind(json(v)).bind(id.as_str()).execute(&mut *conn).await?;
        Ok(DB::rows_affected(&done) == 1)
    }
    pub(super) async fn put_listener(&self, conn: &mut DB::Connection, id: &EndpointId, node: &str) -> Result<bool> {
        let done = sqlx::query(sql::PUT_LISTENER).bind(node).bind(id.as_str()).execute(&mut *conn).await?;
        Ok(DB::rows_affected(&done) == 1)
    }
    pub(super) async fn delete_endpoint(
        &self,
        conn: &mut DB::Connection,
        tenant: &TenantId,
        id: &EndpointId,
        now: Millis,
    ) -> Result<bool> {
        let done =
            sqlx::query(sql::DELETE_ENDPOINT).bind(id.as_str()).bind(tenant.as_str()).execute(&mut *conn).await?;
        sqlx::query(sql::DEAD_ON_DELETED_ENDPOINT).bind(now).bind(id.as_str()).execute(&mut *conn).await?;
        Ok(DB::rows_affected(&done) == 1)
    }
    pub(super) async fn create_replay(&self, conn: &mut DB::Connection, r: &Replay) -> Result<()> {
        sqlx::query(sql::INSERT_REPLAY)
            .bind(&r.id)
            .bind(r.tenant.as_str())
            .bind(r.state.as_str())
            .bind(r.ids.as_ref().map(json))
            .bind(r.filter.as_ref().map(json))
            .bind(r.rate_per_sec)
            .bind(i64::from(r.batch))
            .bind(r.selected as i64)
            .bind(r.requeued as i64)
            .bind(&r.cursor)
            .bind(r.created_at)
            .bind(r.updated_at)
            .bind(r.next_due_at)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
    /// The replays with what became of the deliveries each re-queued, in one grouped query.
    async fn with_figures(&self, replays: Vec<Replay>) -> Result<Vec<ReplayProgress>> {
        if replays.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = Sql::<DB>::new(
            "SELECT replay_id, COUNT(*) FILTER (WHERE attempts > attempt_base) AS sent, \
             COUNT(*) FILTER (WHERE state = 'delivered') AS delivered, \
             COUNT(*) FILTER (WHERE state = 'dead' AND attempts > attempt_base) AS failed, \
             COUNT(*) FILTER (WHERE state = 'dead' AND attempts = attempt_base) AS returned, \
             COUNT(*) FILTER (WHERE state NOT IN ('delivered', 'dead')) AS pending \
             FROM deliveries WHERE replay_id IN (",
        );
        for (i, r) in replays.iter().enumerate() {
            q.push(if i == 0 { "" } else { ", " }).push_bind(r.id.as_str());
        }
        q.push(") GROUP BY replay_id");
        let (text, args) = q.take()?;
        let mut figures = std::collections::HashMap::new();
        for r in sqlx::query_with(&text, args).fetch_all(&self.pool).await? {
            let f = ReplayFigures {
                sent: count(&r, "sent")?,
                delivered: count(&r, "delivered")?,
                failed: count(&r, "failed")?,
                returned: count(&r, "returned")?,
                pending: count(&r, "pending")?,
            };
            figures.insert(r.try_get::<String, _>("replay_id")?, f);
        }
        Ok(replays
            .into_iter()
            .map(|replay| ReplayProgress { figures: figures.get(&replay.id).copied().unwrap_or_default(), replay })
            .collect())
    }
    // The reads of a replay's turn both backends share; each applies the turn its own way.

    /// What a turn of replay `replay_id` at `now` is to do, read on `conn` (inside the
    /// turn's transaction where the backend has one; `lock`: the dialect's row lock clause
    /// for the replay, if it needs one).
    pub(super) async fn plan_turn(
        conn: &mut DB::Connection,
        replay_id: &str,
        lock: &str,
        now: Millis,
    ) -> Result<TurnStep> {
        let row = sqlx::query_as::<_, ReplayRow>(&format!("SELECT * FROM replays WHERE id = $1{lock}"))
            .bind(replay_id)
            .fetch_optional(&mut *conn)
            .await?;
        let Some(row) = row else { return Err(StoreError::NotFound(format!("replay {replay_id}"))) };
        let replay = Replay::try_from(row)?;
        if replay.state != ReplayState::Running {
            return Ok(TurnStep::Ended);
        }
        if replay.next_due_at > now {
            return Ok(TurnStep::NotYet(replay.next_due_at));
        }
        let outstanding = sqlx::query(sql::REPLAY_OUTSTANDING).bind(replay_id).fetch_one(&mut *conn).await?;
        let (unsent, unsettled) = (count(&outstanding, "unsent")?, count(&outstanding, "unsettled")?);
        let limit = match replay.plan(now, unsent) {
            TurnPlan::WaitUntil(at) => return Ok(TurnStep::NotYet(at)),
            TurnPlan::Requeue(n) => n,
        };
        let picks = Self::replay_picks(conn, &replay, limit).await?;
        Ok(match (picks.cursor.is_none(), unsettled) {
            (false, _) => TurnStep::Requeue(Box::new(replay), picks),
            (true, 0) => TurnStep::Done,
            (true, _) => TurnStep::NotYet(now + SETTLE_CHECK_MS),
        })
    }
    /// Up to `limit` of the replay's dead letters after its cursor, in id order: those it
    /// selected when it started (dead by then: not the ones its own sends failed since),
    /// on endpoints not disabled. Of those, it re-queues the ones whose event matches its
    /// endpoint's content filter as it is now; the cursor moves past them all.
    async fn replay_picks(conn: &mut DB::Connection, replay: &Replay, limit: u32) -> Result<Picks> {
        let filter = DB::json_text("ep.spec", &["filter"]);
        let mut q = Sql::<DB>::new(format!(
            "SELECT deliveries.id, deliveries.endpoint_id, {filter} AS filter, deliveries.event_id, \
             deliveries.event_type, ev.created_at AS event_created_at, \
             CASE WHEN {filter} IS NULL THEN NULL ELSE ev.payload END AS payload \
             FROM deliveries LEFT JOIN endpoints ep ON ep.id = deliveries.endpoint_id \
             LEFT JOIN events ev ON ev.tenant_id = deliveries.tenant_id AND ev.id = deliveries.event_id WHERE 1 = 1"
        ));
        let (ids, selection) = (replay.ids.as_deref(), replay.filter.as_ref());
        sql::push_dead_selection(&mut q, &replay.tenant, ids, selection, &replay.cursor, DB::push_ids);
        q.push(" AND deliveries.updated_at <= ").push_bind(replay.created_at);
        q.push(
            " AND NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.id = deliveries.endpoint_id \
             AND e.state = 'disabled') ORDER BY deliveries.id LIMIT ",
        )
        .push_bind(i64::from(limit));
        let (text, args) = q.take()?;
        let read = sqlx::query_with(&text, args).fetch_all(&mut *conn).await?;
        let mut picks = Picks { requeue: Vec::with_capacity(read.len()), cursor: None };
        for r in &read {
            let (id, endpoint): (String, String) = (r.try_get("id")?, r.try_get("endpoint_id")?);
            picks.cursor = Some(id.clone());
            if let Some(f) = rows::stored_filter(&endpoint, r.try_get::<Option<String>, _>("filter")?.as_deref())? {
                let payload: Option<String> = r.try_get("payload")?;
                let data = payload.and_then(|p| serde_json::from_str(&p).ok()).unwrap_or(serde_json::Value::Null);
                let (event, event_type): (String, String) = (r.try_get("event_id")?, r.try_get("event_type")?);
                let created_at = r.try_get::<Option<i64>, _>("event_created_at")?.unwrap_or_default();
                if !f.matches(&filter_subject(&event, &event_type, created_at, data)) {
                    continue;
                }
            }
            picks.requeue.push((id, EndpointId::from_stored(endpoint)));
        }
        Ok(picks)
    }
    /// Moves the replay's cursor past `picks` (of which it re-queued `picks.requeue` at
    /// `now`) and its schedule to `next_due`, if it is still running at the cursor they
    /// were picked from; false if not.
    pub(super) async fn advance_replay(
        conn: &mut DB::Connection,
        replay: &Replay,
        picks: &Picks,
        now: Millis,
        next_due: Millis,
    ) -> Result<bool> {
        let cursor = picks.cursor.as_deref().unwrap_or(replay.cursor.as_str());
        let moved = sqlx::query(sql::ADVANCE_REPLAY)
            .bind(picks.requeue.len() as i64)
            .bind(cursor)
            .bind(now)
            .bind(next_due)
            .bind(replay.id.as_str())
            .bind(replay.cursor.as_str())
            .execute(&mut *conn)
            .await?;
        Ok(DB::rows_affected(&moved) == 1)
    }
}

/// What a replay's turn is to do, as its reads found.
pub(super) enum TurnStep {
    /// No longer running.
    Ended,
    /// Nothing before this time.
    NotYet(Millis),
    /// Nothing left to re-queue and everything re-queued has settled: mark it done
    /// ([`sql::REPLAY_DONE`], which checks the last part again as it writes).
    Done,
    /// Re-queue these, spaced at the replay's rate.
    Requeue(Box<Replay>, Picks),
}

/// What a replay's turn read past its cursor: the dead letters to re-queue (delivery id,
/// endpoint), in id order, and the last one read (`None`: nothing was left), which the
/// cursor moves to even when a content filter left it out.
pub(super) struct Picks {
    pub(super) requeue: Vec<(String, EndpointId)>,
    pub(super) cursor: Option<String>,
}

/// The turn that re-queued `requeued` dead letters on `endpoints` (listed each once here).
pub(super) fn requeued(mut endpoints: Vec<EndpointId>, requeued: u32, next_due: Millis) -> super::ReplayTurn {
    endpoints.sort_unstable();
    endpoints.dedup();
    super::ReplayTurn::Requeued { endpoints, requeued, next_due }
}
