//! The reads behind the console's pages (shared by both backends, like the rest of
//! [`Queries`]): tenants, a page of a tenant's endpoints with their health, and attempts
//! per time bucket. Each is bounded by an index: `endpoints_tenant`, `attempts_started`,
//! `attempts_endpoint`, `deliveries_endpoint`.

use std::collections::HashMap;

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Pool, Row, Type};

use super::super::rows::{self, EndpointRow, TenantRow};
use super::super::sql::Sql;
use super::super::{Result, SeriesPoint, SeriesScope};
use super::count;
use super::{Dialect, Queries};
use crate::model::*;

impl<DB> Queries<DB>
where
    DB: Database + Dialect,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> String: Decode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Decode<'q, DB>,
    for<'c> &'c str: ColumnIndex<DB::Row>,
    for<'r> TenantRow: FromRow<'r, DB::Row>,
    for<'r> EndpointRow: FromRow<'r, DB::Row>,
{
    pub(in super::super) async fn list_tenants(&self) -> Result<Vec<Tenant>> {
        let rows = sqlx::query_as::<_, TenantRow>("SELECT id, name, created_at FROM tenants ORDER BY id")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(Tenant::from).collect())
    }

    /// Up to `limit` of the tenant's endpoints in creation order, after the endpoint `after`;
    /// with `plugin`, only those binding it to a hook (as `name` or pinned, `name@n`).
    pub(in super::super) async fn endpoint_page(
        &self,
        tenant: &TenantId,
        after: Option<&EndpointId>,
        limit: u32,
        plugin: Option<&str>,
    ) -> Result<Vec<Endpoint>> {
        let pinned = plugin.map(|name| format!("{name}@"));
        let mut q = Sql::<DB>::new("SELECT * FROM endpoints WHERE tenant_id = ");
        q.push_bind(tenant.as_str());
        if let (Some(name), Some(pinned)) = (plugin, &pinned) {
            // `substr`, not LIKE: `_` in a plugin name is a LIKE wildcard.
            for (i, hook) in ["transform", "classify", "sign"].into_iter().enumerate() {
                let bound = DB::json_text("spec", &["plugins", hook]);
                q.push(if i == 0 { " AND (" } else { " OR " });
                q.push(format_args!("{bound} = ")).push_bind(name);
                // The length is ours, not the caller's (Postgres' substr takes an int4).
                q.push(format_args!(" OR substr({bound}, 1, {}) = ", pinned.len()));
                q.push_bind(pinned.as_str());
            }
            q.push(")");
        }
        if let Some(after) = after {
            // Row values compare in the index's order on both backends.
            q.push(" AND (created_at, id) > (SELECT created_at, id FROM endpoints WHERE id = ")
                .push_bind(after.as_str())
                .push(")");
        }
        q.push(" ORDER BY created_at, id LIMIT ").push_bind(i64::from(limit));
        let (text, args) = q.take()?;
        rows::all(sqlx::query_as_with::<_, EndpointRow, _>(&text, args).fetch_all(&self.pool).await?)
    }

    /// Attempts started at or after `since`, per `bucket_ms`, oldest bucket first; buckets
    /// without attempts are left out. Those in `attempts` and first attempts kept in their
    /// delivered rows alike.
    pub(in super::super) async fn attempt_series(
        &self,
        scope: &SeriesScope,
        since: Millis,
        bucket_ms: i64,
    ) -> Result<Vec<SeriesPoint>> {
        // SUM over BIGINT is NUMERIC on Postgres: cast so both backends give a 64-bit integer.
        let mut q = Sql::<DB>::new("SELECT a.started_at / ");
        q.push_bind(bucket_ms).push(
            " AS bucket, COUNT(*) AS n, COUNT(*) FILTER (WHERE a.status BETWEEN 200 AND 299) AS ok, \
             CAST(SUM(a.duration_ms) AS BIGINT) AS total_ms, MAX(a.duration_ms) AS max_ms FROM (\
             SELECT a.started_at, a.status, a.duration_ms FROM attempts a",
        );
        match scope {
            SeriesScope::All => {
                q.push(" WHERE a.started_at >= ").push_bind(since);
            }
            SeriesScope::Endpoint(e) => {
                q.push(" WHERE a.endpoint_id = ").push_bind(e.as_str()).push(" AND a.started_at >= ").push_bind(since);
            }
            SeriesScope::Tenant(t) => {
                q.push(" JOIN deliveries d ON d.id = a.delivery_id WHERE a.started_at >= ")
                    .push_bind(since)
                    .push(" AND d.tenant_id = ")
                    .push_bind(t.as_str());
            }
        }
        // And the first attempts kept in their deliveries' rows (migration 0025): delivered ones,
        // whose `updated_at` (the attempt's end) is at least its start: a range of `deliveries_finished`.
        q.push(
            " UNION ALL SELECT d.first_started_at, d.last_status, d.first_duration_ms FROM deliveries d \
             WHERE d.state = 'delivered' AND d.first_attempt_id IS NOT NULL AND d.updated_at >= ",
        )
        .push_bind(since)
        .push(" AND d.first_started_at >= ")
        .push_bind(since);
        match scope {
            SeriesScope::All => {}
            SeriesScope::Endpoint(e) => {
                q.push(" AND d.endpoint_id = ").push_bind(e.as_str());
            }
            SeriesScope::Tenant(t) => {
                q.push(" AND d.tenant_id = ").push_bind(t.as_str());
            }
        }
        q.push(") a GROUP BY bucket ORDER BY bucket");
        let (text, args) = q.take()?;
        let rows = sqlx::query_with(&text, args).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(SeriesPoint {
                    start: r.try_get::<i64, _>("bucket")? * bucket_ms,
                    attempts: r.try_get::<i64, _>("n")? as u64,
                    successes: r.try_get::<i64, _>("ok")? as u64,
                    total_ms: r.try_get::<Option<i64>, _>("total_ms")?.unwrap_or(0) as u64,
                    max_ms: r.try_get::<Option<i64>, _>("max_ms")?.unwrap_or(0) as u64,
                })
            })
            .collect()
    }

    /// The health of each of `endpoints` at `now`, in one statement for the whole page (a
    /// page used to cost three statements per endpoint): attempts over the last hour and
    /// day and the latest ones, from `attempts_endpoint`, beside the backlog, the dead
    /// letters and the first attempts kept in delivered rows, from `deliveries_endpoint`,
    /// each grouped by endpoint, and the latest failed
    /// attempt (its category, status and time). An endpoint with
    /// neither attempts nor deliveries has no row.
    pub(in super::super) async fn endpoint_health_page(
        &self,
        endpoints: &[EndpointId],
        now: Millis,
    ) -> Result<HashMap<EndpointId, Health>> {
        if endpoints.is_empty() {
            return Ok(HashMap::new());
        }
        // SUM over BIGINT is NUMERIC on Postgres: cast so both backends give a 64-bit integer.
        let mut q = Sql::<DB>::new(
            "SELECT endpoint_id, CAST(SUM(a1) AS BIGINT) AS a1, CAST(SUM(s1) AS BIGINT) AS s1, \
             CAST(SUM(a24) AS BIGINT) AS a24, CAST(SUM(s24) AS BIGINT) AS s24, \
             MAX(success) AS success, MAX(attempt) AS attempt, \
             CAST(SUM(backlog) AS BIGINT) AS backlog, CAST(SUM(dead) AS BIGINT) AS dead, \
             MAX(err_at) AS err_at, MAX(err_status) AS err_status, MAX(err_text) AS err_text FROM (",
        );
        q.push("SELECT endpoint_id, COUNT(*) FILTER (WHERE started_at >= ").push_bind(now - 3_600_000);
        q.push(") AS a1, COUNT(*) FILTER (WHERE started_at >= ").push_bind(now - 3_600_000);
        q.push(" AND status BETWEEN 200 AND 299) AS s1, COUNT(*) FILTER (WHERE started_at >= ")
            .push_bind(now - 86_400_000);
        q.push(") AS a24, COUNT(*) FILTER (WHERE started_at >= ").push_bind(now - 86_400_000);
        q.push(
            " AND status BETWEEN 200 AND 299) AS s24, \
             MAX(started_at) FILTER (WHERE status BETWEEN 200 AND 299) AS success, MAX(started_at) AS attempt, \
             0 AS backlog, 0 AS dead, CAST(NULL AS BIGINT) AS err_at, CAST(NULL AS BIGINT) AS err_status, \
             NULL AS err_text \
             FROM attempts WHERE endpoint_id IN (",
        );
        push_list(&mut q, endpoints);
        // Each endpoint's deliveries: the backlog, the dead letters and the first attempts
        // kept in delivered rows (migration 0025), counted as the attempts above are.
        q.push(") GROUP BY endpoint_id UNION ALL SELECT endpoint_id, COUNT(*) FILTER (WHERE first_started_at >= ")
            .push_bind(now - 3_600_000);
        q.push(") AS a1, COUNT(*) FILTER (WHERE first_started_at >= ").push_bind(now - 3_600_000);
        q.push(" AND last_status BETWEEN 200 AND 299) AS s1, COUNT(*) FILTER (WHERE first_started_at >= ")
            .push_bind(now - 86_400_000);
        q.push(") AS a24, COUNT(*) FILTER (WHERE first_started_at >= ").push_bind(now - 86_400_000);
        q.push(
            " AND last_status BETWEEN 200 AND 299) AS s24, \
             MAX(first_started_at) FILTER (WHERE last_status BETWEEN 200 AND 299), MAX(first_started_at), \
             COUNT(*) FILTER (WHERE state IN ('queued', 'waiting', 'delivering', 'paused')), \
             COUNT(*) FILTER (WHERE state = 'dead'), CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), NULL FROM deliveries WHERE endpoint_id IN (",
        );
        push_list(&mut q, endpoints);
        // Each endpoint's latest failed attempt, found backwards on `attempts_endpoint` (a
        // plugin's drop is no failure); only its row is read.
        q.push(
            ") GROUP BY endpoint_id UNION ALL \
             SELECT a.endpoint_id, 0, 0, 0, 0, NULL, NULL, 0, 0, a.started_at, a.status, a.error FROM attempts a \
             WHERE a.id IN (SELECT (SELECT b.id FROM attempts b WHERE b.endpoint_id = e.id \
             AND b.verdict <> 'delivered' AND b.verdict <> 'fail:dropped' ORDER BY b.started_at DESC LIMIT 1) \
             FROM endpoints e WHERE e.id IN (",
        );
        push_list(&mut q, endpoints);
        q.push(")) ) AS h GROUP BY endpoint_id");
        let (text, args) = q.take()?;
        let rows = sqlx::query_with(&text, args).fetch_all(&self.pool).await?;
        rows.iter().map(health_row).collect()
    }
}

/// One endpoint's row of [`Queries::endpoint_health_page`].
fn health_row<R: Row>(r: &R) -> Result<(EndpointId, Health)>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'q> String: Decode<'q, R::Database> + Type<R::Database>,
    for<'q> i64: Decode<'q, R::Database> + Type<R::Database>,
    for<'q> Option<i64>: Decode<'q, R::Database>,
{
    let health = Health {
        attempts_1h: count(r, "a1")?,
        successes_1h: count(r, "s1")?,
        attempts_24h: count(r, "a24")?,
        successes_24h: count(r, "s24")?,
        last_success_at: r.try_get("success")?,
        last_attempt_at: r.try_get("attempt")?,
        backlog: count(r, "backlog")?,
        dead_letters: count(r, "dead")?,
        last_error: last_error(r)?,
    };
    Ok((EndpointId::from_stored(r.try_get::<String, _>("endpoint_id")?), health))
}

/// The latest failed attempt of a health row, in the one vocabulary of failures.
fn last_error<R: Row>(r: &R) -> Result<Option<LastError>>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'q> String: Decode<'q, R::Database> + Type<R::Database>,
    for<'q> Option<i64>: Decode<'q, R::Database>,
    for<'q> i64: Type<R::Database>,
{
    let Some(at) = r.try_get::<Option<i64>, _>("err_at")? else { return Ok(None) };
    let status = r.try_get::<Option<i64>, _>("err_status")?.and_then(|s| u16::try_from(s).ok());
    let error: Option<String> = r.try_get("err_text")?;
    let category = crate::classify::failure_category(status, error.as_deref());
    Ok(Some(LastError { category, status, at }))
}

/// `ids` as a comma-separated list of bound values, for an `IN (…)`.
fn push_list<'a, DB>(q: &mut Sql<'a, DB>, ids: &'a [EndpointId])
where
    DB: sqlx::Database,
    &'a str: Encode<'a, DB> + Type<DB>,
{
    for (i, id) in ids.iter().enumerate() {
        q.push(if i == 0 { "" } else { ", " }).push_bind(id.as_str());
    }
}
