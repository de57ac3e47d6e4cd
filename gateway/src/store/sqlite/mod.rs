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
mod writes;

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
        let setup = SqlitePoolOptions::new().max_connections(1).connect_with(options.clone()).await?;
        MIGRATOR.run(&setup).await.map_err(|e| StoreError::Backend(format!("migrations: {e}")))?;
        setup.close().await;
        let writer = writer::Writer::open(options.get_filename())?;
        // Every write runs on the writer thread. A write through the pool would wait for
        // the file's lock behind group commits (seconds under load); read-only, it fails.
        let readers = options.create_if_missing(false).read_only(true);
        let pool = SqlitePoolOptions::new().max_connections(max_connections).connect_with(readers).await?;
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
        let t = t.clone();
        self.writer.run(move |tx| writes::create_tenant(tx, &t)).await
    }

    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
        let row = sqlx::query_as::<_, TenantRow>("SELECT id, name, created_at FROM tenants WHERE id = ?")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Tenant::from))
    }

    async fn insert_token(&self, t: &TokenRecord) -> Result<()> {
        let t = t.clone();
        self.writer.run(move |tx| writes::insert_token(tx, &t)).await
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
        let (tenant, id) = (tenant.clone(), id.to_string());
        self.writer.run(move |tx| writes::revoke_token(tx, &tenant, &id)).await
    }

    async fn touch_token(&self, hash: &str, at: Millis) -> Result<()> {
        let hash = hash.to_string();
        self.writer.run(move |tx| writes::touch_token(tx, &hash, at)).await
    }

    async fn insert_endpoint(&self, e: &Endpoint) -> Result<()> {
        let e = e.clone();
        self.writer.run(move |tx| writes::insert_endpoint(tx, &e)).await
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
        let e = e.clone();
        self.writer.run(move |tx| writes::update_endpoint(tx, &e)).await
    }

    async fn delete_endpoint(&self, tenant: &TenantId, id: &EndpointId, now: Millis) -> Result<bool> {
        let (tenant, id) = (tenant.clone(), id.clone());
        self.writer.run(move |tx| writes::delete_endpoint(tx, &tenant, &id, now)).await
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
        self.writer.run(move |tx| writes::recover_leases(tx, expired_before, now)).await
    }

    async fn subscribe(&self) -> Result<Option<tokio::sync::mpsc::Receiver<Vec<EndpointId>>>> {
        Ok(None)
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
        let r = r.clone();
        self.writer.run(move |tx| writes::create_replay(tx, &r)).await
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
        let row = sqlx::query_as::<_, ReplayRow>("SELECT * FROM replays WHERE id = ?")
            .bind(replay_id)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Err(StoreError::NotFound(format!("replay {replay_id}"))) };
        let replay = Replay::try_from(row)?;
        if replay.state != ReplayState::Running {
            return Ok((Vec::new(), 0));
        }
        // Picked by a read; the write re-queues them only if the cursor has not moved since.
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
        let picked: Vec<(String, String)> = q.build_query_as().fetch_all(&self.pool).await?;
        let step = writes::ReplayStep {
            replay_id: replay_id.to_string(),
            from_cursor: replay.cursor.clone(),
            done: picked.len() < replay.batch as usize,
            picked,
            now,
            spacing_ms,
            deadline,
        };
        let (n, step) = self.writer.run(move |tx| Ok((writes::replay_step(tx, &step)?, step))).await?;
        let mut endpoints: Vec<EndpointId> =
            step.picked.into_iter().take(n as usize).map(|(_, e)| EndpointId::from_stored(e)).collect();
        endpoints.sort_unstable();
        endpoints.dedup();
        Ok((endpoints, n))
    }

    async fn finish_replay(&self, tenant: &TenantId, id: &str, state: ReplayState, now: Millis) -> Result<bool> {
        let (tenant, id) = (tenant.clone(), id.to_string());
        self.writer.run(move |tx| writes::finish_replay(tx, &tenant, &id, state, now)).await
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
        self.writer.run(move |tx| writes::purge(tx, delivered_before, dead_before, limit)).await
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
