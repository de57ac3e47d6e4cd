//! The shared Postgres store: several nodes on one database (reads and LISTEN here, the
//! group-commit write path in [`writer`]). Claims take rows with
//! `FOR UPDATE SKIP LOCKED` under fenced leases, each group commit is one transaction with
//! array-bound (`UNNEST`) multi-row statements, and intake wakes the other nodes through
//! `LISTEN/NOTIFY`. Semantics match the SQLite store exactly; it must not hold locks
//! across a network round trip to anything but Postgres.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgRow};
use sqlx::{PgPool, Postgres, QueryBuilder, Row};
use tokio::sync::mpsc;

use super::rows::{
    self, ATTEMPT_ORDER, AttemptRow, DELIVERY_COLUMNS, DeliveryRow, EndpointRow, EventRow, ReplayRow, TOKEN_COLUMNS,
    TenantRow, TokenRow,
};
use super::sql;
use super::*;

/// The notification channel intake signals on; the schema is appended so that databases
/// shared by several schemas (tests, tenants of a hosting provider) do not wake each other.
const CHANNEL: &str = "herald_work";
/// Postgres refuses channel names of 64 bytes or more.
const MAX_CHANNEL: usize = 63;
/// Endpoint ids per notification: payloads must stay under 8000 bytes.
const IDS_PER_NOTIFY: usize = 200;
/// Group commits that hit a deadlock or serialization failure are replayed this often.
const MAX_REPLAYS: u32 = 3;

pub struct PostgresStore {
    pool: PgPool,
    channel: String,
}

mod writer;
use writer::{apply_all, is_transient};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

impl PostgresStore {
    /// Connects (the URL may carry `options=-c search_path=<schema>`) and migrates the
    /// schema first on the search path. `max_connections` is for queries and commits; the
    /// notification listener gets one more.
    pub async fn open(url: &str, max_connections: u32) -> Result<Self> {
        let options = PgConnectOptions::from_str(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1) + 1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        // The migrator takes an advisory lock, so nodes starting together migrate once.
        MIGRATOR.run(&pool).await.map_err(|e| StoreError::Backend(format!("migrations: {e}")))?;
        let schema: Option<String> = sqlx::query_scalar("SELECT current_schema()").fetch_one(&pool).await?;
        let channel = match schema {
            Some(s) if CHANNEL.len() + 1 + s.len() <= MAX_CHANNEL => format!("{CHANNEL}:{s}"),
            _ => CHANNEL.to_string(),
        };
        Ok(PostgresStore { pool, channel })
    }
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("serializable")
}

#[async_trait]
impl Store for PostgresStore {
    async fn create_tenant(&self, t: &Tenant) -> Result<()> {
        sqlx::query("INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3)")
            .bind(t.id.as_str())
            .bind(&t.name)
            .bind(t.created_at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
        let row = sqlx::query_as::<_, TenantRow>("SELECT id, name, created_at FROM tenants WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Tenant::from))
    }

    async fn insert_token(&self, t: &TokenRecord) -> Result<()> {
        let scopes: Vec<&str> = t.scopes.iter().map(|s| s.as_str()).collect();
        sqlx::query("INSERT INTO tokens (id, hash, tenant_id, scopes, created_at) VALUES ($1, $2, $3, $4, $5)")
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

    async fn revoke_token(&self, tenant: &TenantId, id: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM tokens WHERE tenant_id = $1 AND id = $2")
            .bind(tenant.as_str())
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn touch_token(&self, hash: &str, at: Millis) -> Result<()> {
        sqlx::query("UPDATE tokens SET last_used_at = GREATEST(COALESCE(last_used_at, 0), $2) WHERE hash = $1")
            .bind(hash)
            .bind(at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn insert_endpoint(&self, e: &Endpoint) -> Result<()> {
        sqlx::query(
            "INSERT INTO endpoints (id, tenant_id, spec, event_types, state, state_reason, paused_until, \
             failing_since, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
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
        let row = sqlx::query_as::<_, EndpointRow>("SELECT * FROM endpoints WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.map(Endpoint::try_from).transpose()
    }

    async fn list_endpoints(&self, tenant: &TenantId) -> Result<Vec<Endpoint>> {
        let rows =
            sqlx::query_as::<_, EndpointRow>("SELECT * FROM endpoints WHERE tenant_id = $1 ORDER BY created_at, id")
                .bind(tenant.as_str())
                .fetch_all(&self.pool)
                .await?;
        rows::all(rows)
    }

    async fn update_endpoint(&self, e: &Endpoint) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE endpoints SET spec = $1, event_types = $2, updated_at = $3 WHERE id = $4 AND tenant_id = $5",
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
        let done = sqlx::query("DELETE FROM endpoints WHERE id = $1 AND tenant_id = $2")
            .bind(id.as_str())
            .bind(tenant.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE deliveries SET state = 'dead', reason = 'endpoint_deleted', next_attempt_at = NULL, \
             lease_owner = NULL, lease_until = NULL, updated_at = $1 \
             WHERE endpoint_id = $2 AND state IN ('queued', 'waiting', 'paused', 'delivering')",
        )
        .bind(now)
        .bind(id.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
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
        let mut q: QueryBuilder<'_, Postgres> =
            QueryBuilder::new(format!("SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE 1 = 1"));
        sql::push_delivery_filter(&mut q, f);
        rows::all(q.build_query_as::<DeliveryRow>().fetch_all(&self.pool).await?)
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
        let attempts =
            sqlx::query_as::<_, AttemptRow>(&format!("SELECT * FROM attempts WHERE delivery_id = $1 {ATTEMPT_ORDER}"))
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
            "SELECT MIN(next_attempt_at) FROM deliveries WHERE endpoint_id = $1 AND state IN ('queued', 'waiting')",
        )
        .bind(endpoint.as_str())
        .fetch_one(&self.pool)
        .await?;
        Ok(due)
    }

    async fn recover_leases(&self, expired_before: Millis, now: Millis) -> Result<u64> {
        // SKIP LOCKED: a row some node is recording right now is not abandoned.
        let done = sqlx::query(
            "UPDATE deliveries SET state = 'waiting', next_attempt_at = $1, lease_owner = NULL, \
             lease_until = NULL, updated_at = $1 WHERE id IN (SELECT id FROM deliveries \
             WHERE state = 'delivering' AND lease_until < $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind(now)
        .bind(expired_before)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn subscribe(&self) -> Result<Option<mpsc::Receiver<Vec<EndpointId>>>> {
        let listener = listen(&self.pool, &self.channel).await?;
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(forward_notifications(listener, self.pool.clone(), self.channel.clone(), tx));
        Ok(Some(rx))
    }

    async fn dead_selection(
        &self,
        tenant: &TenantId,
        ids: Option<&[String]>,
        filter: Option<&DeadLetterFilter>,
    ) -> Result<(u64, Vec<EndpointId>)> {
        let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new("SELECT COUNT(*) FROM deliveries WHERE 1 = 1");
        sql::push_dead_selection(&mut q, tenant, ids, filter, "", push_id_list);
        let n: i64 = q.build_query_scalar().fetch_one(&self.pool).await?;
        let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new(
            "SELECT DISTINCT e.id FROM deliveries JOIN endpoints e ON e.id = deliveries.endpoint_id \
             WHERE e.state <> 'active'",
        );
        sql::push_dead_selection(&mut q, tenant, ids, filter, "", push_id_list);
        let blocked: Vec<String> = q.build_query_scalar().fetch_all(&self.pool).await?;
        Ok((n as u64, blocked.into_iter().map(EndpointId::from_stored).collect()))
    }

    async fn create_replay(&self, r: &Replay) -> Result<()> {
        sqlx::query(
            "INSERT INTO replays (id, tenant_id, state, ids, filter, rate_per_sec, batch, selected, sent, cursor, \
             created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
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
        let row = sqlx::query_as::<_, ReplayRow>("SELECT * FROM replays WHERE id = $1 AND tenant_id = $2")
            .bind(id)
            .bind(tenant.as_str())
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let replay = Replay::try_from(row)?;
        let counts = sqlx::query("SELECT state, COUNT(*) AS n FROM deliveries WHERE replay_id = $1 GROUP BY state")
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
        // Every node resumes running replays: the row lock makes their batches take turns,
        // each continuing from the cursor the previous one committed.
        let row = sqlx::query_as::<_, ReplayRow>("SELECT * FROM replays WHERE id = $1 FOR UPDATE")
            .bind(replay_id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else { return Err(StoreError::NotFound(format!("replay {replay_id}"))) };
        let replay = Replay::try_from(row)?;
        if replay.state != ReplayState::Running {
            return Ok((Vec::new(), 0));
        }
        let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new("SELECT id, endpoint_id FROM deliveries WHERE 1 = 1");
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
        let ids: Vec<String> = picked.iter().map(|r| r.try_get("id")).collect::<sqlx::Result<_>>()?;
        let due: Vec<i64> = (0..ids.len()).map(|i| now + (i as f64 * spacing_ms) as i64).collect();
        if !ids.is_empty() {
            sqlx::query(&format!(
                "UPDATE deliveries d SET state = {}, next_attempt_at = v.due, attempt_base = d.attempts, \
                 deadline = $3, replay_id = $4, reason = NULL, updated_at = $5 \
                 FROM UNNEST($1::text[], $2::int8[]) AS v(id, due) WHERE d.id = v.id AND d.state = 'dead'",
                sql::settle("d", "'queued'")
            ))
            .bind(&ids)
            .bind(&due)
            .bind(deadline)
            .bind(replay_id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        let cursor = ids.last().cloned().unwrap_or_else(|| replay.cursor.clone());
        let n = ids.len() as u32;
        let done = n < replay.batch;
        sqlx::query(
            "UPDATE replays SET sent = sent + $1, cursor = $2, updated_at = $3, \
             state = CASE WHEN $4 THEN 'done' ELSE state END WHERE id = $5",
        )
        .bind(i64::from(n))
        .bind(&cursor)
        .bind(now)
        .bind(done)
        .bind(replay_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        let mut endpoints: Vec<EndpointId> = picked
            .iter()
            .map(|r| Ok(EndpointId::from_stored(r.try_get::<String, _>("endpoint_id")?)))
            .collect::<Result<_>>()?;
        endpoints.sort_unstable();
        endpoints.dedup();
        Ok((endpoints, n))
    }

    async fn finish_replay(&self, tenant: &TenantId, id: &str, state: ReplayState, now: Millis) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE replays SET state = $1, updated_at = $2 WHERE id = $3 AND tenant_id = $4 AND state = 'running'",
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
             WHERE tenant_id = $1 AND state = 'dead' GROUP BY reason ORDER BY n DESC",
        )
        .bind(tenant.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("reason")?, r.try_get::<i64, _>("n")? as u64))).collect()
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
            "SELECT COUNT(*) FILTER (WHERE started_at >= $1) AS a1, \
             COUNT(*) FILTER (WHERE started_at >= $1 AND status BETWEEN 200 AND 299) AS s1, \
             COUNT(*) AS a24, COUNT(*) FILTER (WHERE status BETWEEN 200 AND 299) AS s24 \
             FROM attempts WHERE endpoint_id = $2 AND started_at >= $3",
        )
        .bind(now - 3_600_000)
        .bind(endpoint.as_str())
        .bind(now - 86_400_000)
        .fetch_one(&self.pool)
        .await?;
        let last = sqlx::query(
            "SELECT MAX(started_at) FILTER (WHERE status BETWEEN 200 AND 299) AS success, MAX(started_at) AS attempt \
             FROM attempts WHERE endpoint_id = $1",
        )
        .bind(endpoint.as_str())
        .fetch_one(&self.pool)
        .await?;
        let b = sqlx::query(
            "SELECT COUNT(*) FILTER (WHERE state IN ('queued', 'waiting', 'delivering', 'paused')) AS backlog, \
             COUNT(*) FILTER (WHERE state = 'dead') AS dead FROM deliveries WHERE endpoint_id = $1",
        )
        .bind(endpoint.as_str())
        .fetch_one(&self.pool)
        .await?;
        let n = |row: &PgRow, c: &str| -> Result<u64> { Ok(row.try_get::<i64, _>(c)? as u64) };
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
        // SKIP LOCKED: nodes purging at the same time take different rows.
        let rows = sqlx::query(
            "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries \
             WHERE (state = 'delivered' AND updated_at < $1) OR (state = 'dead' AND updated_at < $2) \
             LIMIT $3 FOR UPDATE SKIP LOCKED) RETURNING id, tenant_id, event_id",
        )
        .bind(delivered_before)
        .bind(dead_before)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
        let column = |c: &str| rows.iter().map(|r| r.try_get::<String, _>(c)).collect::<sqlx::Result<Vec<_>>>();
        let (ids, tenants, events) = (column("id")?, column("tenant_id")?, column("event_id")?);
        if !ids.is_empty() {
            sqlx::query("DELETE FROM attempts WHERE delivery_id = ANY($1)").bind(&ids).execute(&mut *tx).await?;
            sqlx::query(
                "DELETE FROM events e USING UNNEST($1::text[], $2::text[]) AS v(tenant_id, id) \
                 WHERE e.tenant_id = v.tenant_id AND e.id = v.id \
                 AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.tenant_id = e.tenant_id AND d.event_id = e.id)",
            )
            .bind(&tenants)
            .bind(&events)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(ids.len() as u64)
    }

    async fn apply(&self, ops: Vec<WriteOp>) -> Result<Vec<WriteResult>> {
        let mut replays = 0;
        loop {
            let mut tx = self.pool.begin().await?;
            let outcome = match apply_all(&mut tx, &ops, &self.channel).await {
                Ok(results) => tx.commit().await.map(|()| results),
                // Dropping the transaction rolls it back.
                Err(e) => Err(e),
            };
            match outcome {
                Ok(results) => return Ok(results),
                Err(e) if is_transient(&e) && replays < MAX_REPLAYS => {
                    replays += 1;
                    tracing::debug!(error = %e, replays, "group commit replayed");
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

async fn listen(pool: &PgPool, channel: &str) -> sqlx::Result<PgListener> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

/// Feeds notifications to the engine until it stops listening. Missed notifications
/// (while reconnecting) only delay work until the engine's periodic scan.
async fn forward_notifications(
    mut listener: PgListener,
    pool: PgPool,
    channel: String,
    tx: mpsc::Sender<Vec<EndpointId>>,
) {
    loop {
        let got = tokio::select! {
            _ = tx.closed() => return,
            got = listener.recv() => got,
        };
        match got {
            Ok(n) => {
                let ids: Vec<EndpointId> =
                    n.payload().split(',').filter(|s| !s.is_empty()).map(EndpointId::from_stored).collect();
                if !ids.is_empty() && tx.send(ids).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "lost the notification listener; reconnecting");
                loop {
                    tokio::select! {
                        _ = tx.closed() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                    match listen(&pool, &channel).await {
                        Ok(l) => {
                            listener = l;
                            break;
                        }
                        Err(e) => tracing::warn!(error = %e, "cannot listen for notifications"),
                    }
                }
            }
        }
    }
}

/// Postgres's "id is one of these": one array parameter.
fn push_id_list<'a>(q: &mut QueryBuilder<'a, Postgres>, ids: &'a [String]) {
    q.push(" AND deliveries.id = ANY(").push_bind(ids).push(")");
}
