//! The embedded SQLite store: WAL with `synchronous=FULL`, one dedicated writer connection
//! on its own thread (driven by the group committer, see [`writer`]) and a pool of readers.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow};
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool};

use super::rows::{
    self, ATTEMPT_ORDER, AttemptRow, DELIVERY_COLUMNS, DeliveryRow, EndpointRow, EventRow, ReplayRow, TOKEN_COLUMNS,
    TenantRow, TokenRow,
};
use super::sql;
use super::*;

pub struct SqliteStore {
    pool: SqlitePool,
    writer: writer::Writer,
}

mod writer;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Settings of every connection to the file (the sqlx pool, the writer and its
/// checkpointer): durable commits, enforced references, a 64 MiB page cache.
const PRAGMAS: [(&str, &str); 4] =
    [("synchronous", "FULL"), ("foreign_keys", "ON"), ("temp_store", "MEMORY"), ("cache_size", "-65536")];
/// How long a connection waits for another one's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Does `url` name an in-memory SQLite database? Such a store is not durable, and the
/// writer's own connection would open a different database than the pool's.
pub(crate) fn is_in_memory(url: &str) -> bool {
    url.starts_with("sqlite:") && (url.contains(":memory:") || url.contains("mode=memory"))
}

impl SqliteStore {
    pub async fn open(url: &str, max_connections: u32) -> Result<Self> {
        if is_in_memory(url) {
            return Err(StoreError::Backend("an in-memory SQLite database is not durable; name a file".into()));
        }
        let mut options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(BUSY_TIMEOUT)
            // The writer's checkpointer thread copies the WAL back; no pool commit does it inline.
            .pragma("wal_autocheckpoint", "0");
        for (key, value) in PRAGMAS {
            options = options.pragma(key, value);
        }
        create_private(options.get_filename())?;
        let pool = SqlitePoolOptions::new().max_connections(max_connections).connect_with(options.clone()).await?;
        MIGRATOR.run(&pool).await.map_err(|e| StoreError::Backend(format!("migrations: {e}")))?;
        let writer = writer::Writer::open(options.get_filename())?;
        Ok(SqliteStore { pool, writer })
    }
}

/// Creates the database file, if missing, readable by its owner only (0600). It holds
/// token hashes, signing secrets and payloads; SQLite gives the `-wal` and `-shm` files it
/// creates the database file's permissions, so they are private too.
fn create_private(path: &std::path::Path) -> Result<()> {
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    open.open(path).map(drop).map_err(|e| StoreError::Backend(format!("cannot create {}: {e}", path.display())))
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("serializable")
}

#[async_trait]
impl Store for SqliteStore {
    async fn create_tenant(&self, t: &Tenant) -> Result<()> {
        sqlx::query("INSERT INTO tenants (id, name, created_at) VALUES (?, ?, ?)")
            .bind(t.id.as_str())
            .bind(&t.name)
            .bind(t.created_at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
        let row = sqlx::query_as::<_, TenantRow>("SELECT id, name, created_at FROM tenants WHERE id = ?")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Tenant::from))
    }

    async fn insert_token(&self, t: &TokenRecord) -> Result<()> {
        let scopes: Vec<&str> = t.scopes.iter().map(|s| s.as_str()).collect();
        sqlx::query("INSERT INTO tokens (id, hash, tenant_id, scopes, created_at) VALUES (?, ?, ?, ?, ?)")
            .bind(&t.id)
            .bind(&t.hash)
            .bind(t.tenant.as_str())
            .bind(scopes.join(" "))
            .bind(t.created_at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let row = sqlx::query_as::<_, TokenRow>(&format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = ?1"))
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(TokenRecord::from))
    }

    async fn list_tokens(&self, tenant: &TenantId) -> Result<Vec<TokenRecord>> {
        let rows = sqlx::query_as::<_, TokenRow>(&format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens WHERE tenant_id = ?1 ORDER BY created_at, id"
        ))
        .bind(tenant.as_str())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(TokenRecord::from).collect())
    }

    async fn revoke_token(&self, tenant: &TenantId, id: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM tokens WHERE tenant_id = ?1 AND id = ?2")
            .bind(tenant.as_str())
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn touch_token(&self, hash: &str, at: Millis) -> Result<()> {
        sqlx::query("UPDATE tokens SET last_used_at = max(coalesce(last_used_at, 0), ?2) WHERE hash = ?1")
            .bind(hash)
            .bind(at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn insert_endpoint(&self, e: &Endpoint) -> Result<()> {
        sqlx::query(
            "INSERT INTO endpoints (id, tenant_id, spec, event_types, state, state_reason, paused_until, \
             failing_since, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
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
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn endpoint(&self, id: &EndpointId) -> Result<Option<Endpoint>> {
        let row = sqlx::query_as::<_, EndpointRow>("SELECT * FROM endpoints WHERE id = ?")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.map(Endpoint::try_from).transpose()
    }

    async fn list_endpoints(&self, tenant: &TenantId) -> Result<Vec<Endpoint>> {
        let rows =
            sqlx::query_as::<_, EndpointRow>("SELECT * FROM endpoints WHERE tenant_id = ? ORDER BY created_at, id")
                .bind(tenant.as_str())
                .fetch_all(&self.pool)
                .await?;
        rows::all(rows)
    }

    async fn update_endpoint(&self, e: &Endpoint) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE endpoints SET spec = ?, event_types = ?, updated_at = ? WHERE id = ? AND tenant_id = ?",
        )
        .bind(json(&e.spec))
        .bind(json(&e.spec.event_types))
        .bind(e.updated_at)
        .bind(e.id.as_str())
        .bind(e.tenant.as_str())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_endpoint(&self, tenant: &TenantId, id: &EndpointId, now: Millis) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("DELETE FROM endpoints WHERE id = ? AND tenant_id = ?")
            .bind(id.as_str())
            .bind(tenant.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE deliveries SET state = 'dead', reason = 'endpoint_deleted', next_attempt_at = NULL, \
             lease_owner = NULL, lease_until = NULL, updated_at = ? \
             WHERE endpoint_id = ? AND state IN ('queued', 'waiting', 'paused', 'delivering')",
        )
        .bind(now)
        .bind(id.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<Event>> {
        let row = sqlx::query_as::<_, EventRow>("SELECT * FROM events WHERE tenant_id = ? AND id = ?")
            .bind(tenant.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Event::from))
    }

    async fn list_deliveries(&self, f: &DeliveryFilter) -> Result<Vec<Delivery>> {
        let mut q: QueryBuilder<'_, Sqlite> =
            QueryBuilder::new(format!("SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE 1 = 1"));
        sql::push_delivery_filter(&mut q, f);
        rows::all(q.build_query_as::<DeliveryRow>().fetch_all(&self.pool).await?)
    }

    async fn get_delivery(&self, tenant: &TenantId, id: &DeliveryId) -> Result<Option<(Delivery, Vec<Attempt>)>> {
        let row = sqlx::query_as::<_, DeliveryRow>(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE id = ? AND tenant_id = ?"
        ))
        .bind(id.as_str())
        .bind(tenant.as_str())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let attempts =
            sqlx::query_as::<_, AttemptRow>(&format!("SELECT * FROM attempts WHERE delivery_id = ? {ATTEMPT_ORDER}"))
                .bind(id.as_str())
                .fetch_all(&self.pool)
                .await?;
        Ok(Some((row.try_into()?, attempts.into_iter().map(Attempt::from).collect())))
    }

    async fn pending_endpoints(&self) -> Result<Vec<(EndpointId, Millis)>> {
        let rows = sqlx::query(
            "SELECT endpoint_id, MIN(next_attempt_at) AS due FROM deliveries \
             WHERE state IN ('queued', 'waiting') GROUP BY endpoint_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((EndpointId::from_stored(r.try_get::<String, _>("endpoint_id")?), r.try_get("due")?)))
            .collect()
    }

    async fn next_due(&self, endpoint: &EndpointId) -> Result<Option<Millis>> {
        let due: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(next_attempt_at) FROM deliveries WHERE endpoint_id = ? AND state IN ('queued', 'waiting')",
        )
        .bind(endpoint.as_str())
        .fetch_one(&self.pool)
        .await?;
        Ok(due)
    }

    async fn recover_leases(&self, expired_before: Millis, now: Millis) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE deliveries SET state = 'waiting', next_attempt_at = ?, lease_owner = NULL, \
             lease_until = NULL, updated_at = ? WHERE state = 'delivering' AND lease_until < ?",
        )
        .bind(now)
        .bind(now)
        .bind(expired_before)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn acquire_partition(&self, endpoint: &EndpointId, owner: &str, now: Millis, until: Millis) -> Result<bool> {
        let done = sqlx::query(
            "INSERT INTO partitions (endpoint_id, owner, lease_until) VALUES (?1, ?2, ?3) \
             ON CONFLICT (endpoint_id) DO UPDATE SET owner = ?2, lease_until = ?3 \
             WHERE partitions.owner = ?2 OR partitions.lease_until < ?4",
        )
        .bind(endpoint.as_str())
        .bind(owner)
        .bind(until)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_partition(&self, endpoint: &EndpointId, owner: &str) -> Result<()> {
        sqlx::query("DELETE FROM partitions WHERE endpoint_id = ? AND owner = ?")
            .bind(endpoint.as_str())
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn subscribe(&self) -> Result<Option<tokio::sync::mpsc::Receiver<Notice>>> {
        Ok(None)
    }

    async fn announce_changed(&self, _endpoints: &[EndpointId]) -> Result<()> {
        Ok(())
    }

    async fn dead_selection(
        &self,
        tenant: &TenantId,
        ids: Option<&[String]>,
        filter: Option<&DeadLetterFilter>,
    ) -> Result<(u64, Vec<EndpointId>)> {
        let mut q: QueryBuilder<'_, Sqlite> = QueryBuilder::new("SELECT COUNT(*) FROM deliveries WHERE 1 = 1");
        sql::push_dead_selection(&mut q, tenant, ids, filter, "", push_id_list);
        let n: i64 = q.build_query_scalar().fetch_one(&self.pool).await?;
        let mut q: QueryBuilder<'_, Sqlite> = QueryBuilder::new(
            "SELECT DISTINCT e.id FROM deliveries JOIN endpoints e ON e.id = deliveries.endpoint_id \
             WHERE e.state != 'active'",
        );
        sql::push_dead_selection(&mut q, tenant, ids, filter, "", push_id_list);
        let blocked: Vec<String> = q.build_query_scalar().fetch_all(&self.pool).await?;
        Ok((n as u64, blocked.into_iter().map(EndpointId::from_stored).collect()))
    }

    async fn create_replay(&self, r: &Replay) -> Result<()> {
        sqlx::query(
            "INSERT INTO replays (id, tenant_id, state, ids, filter, rate_per_sec, batch, selected, sent, cursor, \
             created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&r.id)
        .bind(r.tenant.as_str())
        .bind(r.state.as_str())
        .bind(r.ids.as_ref().map(json))
        .bind(r.filter.as_ref().map(json))
        .bind(r.rate_per_sec)
        .bind(i64::from(r.batch))
        .bind(r.selected as i64)
        .bind(r.sent as i64)
        .bind(&r.cursor)
        .bind(r.created_at)
        .bind(r.updated_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn get_replay(&self, tenant: &TenantId, id: &str) -> Result<Option<ReplayProgress>> {
        let row = sqlx::query_as::<_, ReplayRow>("SELECT * FROM replays WHERE id = ? AND tenant_id = ?")
            .bind(id)
            .bind(tenant.as_str())
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let replay = Replay::try_from(row)?;
        let counts = sqlx::query("SELECT state, COUNT(*) AS n FROM deliveries WHERE replay_id = ? GROUP BY state")
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        let (mut delivered, mut failed) = (0, 0);
        for r in counts {
            let state: String = r.try_get("state")?;
            let n: i64 = r.try_get("n")?;
            match state.as_str() {
                "delivered" => delivered = n as u64,
                "dead" => failed = n as u64,
                _ => {}
            }
        }
        Ok(Some(ReplayProgress { replay, delivered, failed }))
    }

    async fn running_replays(&self) -> Result<Vec<Replay>> {
        let rows = sqlx::query_as::<_, ReplayRow>("SELECT * FROM replays WHERE state = 'running' ORDER BY created_at")
            .fetch_all(&self.pool)
            .await?;
        rows::all(rows)
    }

    async fn replay_batch(
        &self,
        replay_id: &str,
        now: Millis,
        spacing_ms: f64,
        deadline: Millis,
    ) -> Result<(Vec<EndpointId>, u32)> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query_as::<_, ReplayRow>("SELECT * FROM replays WHERE id = ?")
            .bind(replay_id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else { return Err(StoreError::NotFound(format!("replay {replay_id}"))) };
        let replay = Replay::try_from(row)?;
        if replay.state != ReplayState::Running {
            return Ok((Vec::new(), 0));
        }
        let mut q: QueryBuilder<'_, Sqlite> = QueryBuilder::new("SELECT id, endpoint_id FROM deliveries WHERE 1 = 1");
        sql::push_dead_selection(
            &mut q,
            &replay.tenant,
            replay.ids.as_deref(),
            replay.filter.as_ref(),
            &replay.cursor,
            push_id_list,
        );
        q.push(" ORDER BY id LIMIT ").push_bind(i64::from(replay.batch));
        let picked = q.build().fetch_all(&mut *tx).await?;
        let mut endpoints = Vec::new();
        let mut cursor = replay.cursor.clone();
        for (i, r) in picked.iter().enumerate() {
            let id: String = r.try_get("id")?;
            let due = now + (i as f64 * spacing_ms) as i64;
            sqlx::query(&format!(
                "UPDATE deliveries SET state = {}, next_attempt_at = ?, attempt_base = attempts, deadline = ?, \
                 replay_id = ?, reason = NULL, updated_at = ? WHERE id = ? AND state = 'dead'",
                sql::settle("deliveries", "'queued'")
            ))
            .bind(due)
            .bind(deadline)
            .bind(replay_id)
            .bind(now)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
            endpoints.push(EndpointId::from_stored(r.try_get::<String, _>("endpoint_id")?));
            cursor = id;
        }
        let n = picked.len() as u32;
        let done = n < replay.batch;
        sqlx::query(
            "UPDATE replays SET sent = sent + ?, cursor = ?, updated_at = ?, \
             state = CASE WHEN ? THEN 'done' ELSE state END WHERE id = ?",
        )
        .bind(i64::from(n))
        .bind(&cursor)
        .bind(now)
        .bind(done)
        .bind(replay_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        endpoints.sort_unstable();
        endpoints.dedup();
        Ok((endpoints, n))
    }

    async fn finish_replay(&self, tenant: &TenantId, id: &str, state: ReplayState, now: Millis) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE replays SET state = ?, updated_at = ? WHERE id = ? AND tenant_id = ? AND state = 'running'",
        )
        .bind(state.as_str())
        .bind(now)
        .bind(id)
        .bind(tenant.as_str())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn dead_letter_counts(&self, tenant: &TenantId) -> Result<Vec<(String, u64)>> {
        let rows = sqlx::query(
            "SELECT COALESCE(reason, '') AS reason, COUNT(*) AS n FROM deliveries \
             WHERE tenant_id = ? AND state = 'dead' GROUP BY reason ORDER BY n DESC",
        )
        .bind(tenant.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("reason")?, r.try_get::<i64, _>("n")? as u64))).collect()
    }

    async fn stale_dead_letters(&self, older_than: Millis) -> Result<Vec<(TenantId, Millis, u64)>> {
        let rows = sqlx::query(
            "SELECT tenant_id, MIN(updated_at) AS oldest, COUNT(*) AS n FROM deliveries WHERE state = 'dead' \
             GROUP BY tenant_id HAVING MIN(updated_at) < ?",
        )
        .bind(older_than)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    TenantId::from_stored(r.try_get::<String, _>("tenant_id")?),
                    r.try_get("oldest")?,
                    r.try_get::<i64, _>("n")? as u64,
                ))
            })
            .collect()
    }

    async fn endpoint_health(&self, endpoint: &EndpointId, now: Millis) -> Result<Health> {
        let r = sqlx::query(
            "SELECT COUNT(*) FILTER (WHERE started_at >= ?1) AS a1, \
             COUNT(*) FILTER (WHERE started_at >= ?1 AND status BETWEEN 200 AND 299) AS s1, \
             COUNT(*) AS a24, COUNT(*) FILTER (WHERE status BETWEEN 200 AND 299) AS s24 \
             FROM attempts WHERE endpoint_id = ?2 AND started_at >= ?3",
        )
        .bind(now - 3_600_000)
        .bind(endpoint.as_str())
        .bind(now - 86_400_000)
        .fetch_one(&self.pool)
        .await?;
        let last = sqlx::query(
            "SELECT MAX(started_at) FILTER (WHERE status BETWEEN 200 AND 299) AS success, MAX(started_at) AS attempt \
             FROM attempts WHERE endpoint_id = ?",
        )
        .bind(endpoint.as_str())
        .fetch_one(&self.pool)
        .await?;
        let b = sqlx::query(
            "SELECT COUNT(*) FILTER (WHERE state IN ('queued', 'waiting', 'delivering', 'paused')) AS backlog, \
             COUNT(*) FILTER (WHERE state = 'dead') AS dead FROM deliveries WHERE endpoint_id = ?",
        )
        .bind(endpoint.as_str())
        .fetch_one(&self.pool)
        .await?;
        let n = |row: &SqliteRow, c: &str| -> Result<u64> { Ok(row.try_get::<i64, _>(c)? as u64) };
        Ok(Health {
            attempts_1h: n(&r, "a1")?,
            successes_1h: n(&r, "s1")?,
            attempts_24h: n(&r, "a24")?,
            successes_24h: n(&r, "s24")?,
            last_success_at: last.try_get("success")?,
            last_attempt_at: last.try_get("attempt")?,
            backlog: n(&b, "backlog")?,
            dead_letters: n(&b, "dead")?,
        })
    }

    async fn purge(&self, delivered_before: Millis, dead_before: Millis, limit: u32) -> Result<u64> {
        let mut tx = self.pool.begin().await?;
        let ids: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT id, tenant_id, event_id FROM deliveries WHERE (state = 'delivered' AND updated_at < ?) \
             OR (state = 'dead' AND updated_at < ?) LIMIT ?",
        )
        .bind(delivered_before)
        .bind(dead_before)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
        for (id, _, _) in &ids {
            sqlx::query("DELETE FROM attempts WHERE delivery_id = ?").bind(id).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM deliveries WHERE id = ?").bind(id).execute(&mut *tx).await?;
        }
        for (_, tenant, event) in &ids {
            sqlx::query(
                "DELETE FROM events WHERE tenant_id = ?1 AND id = ?2 \
                 AND NOT EXISTS (SELECT 1 FROM deliveries WHERE tenant_id = ?1 AND event_id = ?2)",
            )
            .bind(tenant)
            .bind(event)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(ids.len() as u64)
    }

    async fn apply(&self, ops: Vec<WriteOp>) -> Result<Vec<WriteResult>> {
        self.writer.apply(ops).await
    }
}

/// SQLite's "id is one of these": one bound parameter per id.
fn push_id_list<'a>(q: &mut QueryBuilder<'a, Sqlite>, ids: &'a [String]) {
    q.push(" AND deliveries.id IN (");
    let mut sep = q.separated(", ");
    for id in ids {
        sep.push_bind(id.as_str());
    }
    sep.push_unseparated(")");
}
