//! The shared Postgres store: several nodes on one database. Claims take rows with
//! `FOR UPDATE SKIP LOCKED` under fenced leases, each group commit is one transaction with
//! array-bound (`UNNEST`) multi-row statements, and intake wakes the other nodes through
//! `LISTEN/NOTIFY`. Semantics match the SQLite store exactly; it must not hold locks
//! across a network round trip to anything but Postgres.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgRow};
use sqlx::{PgConnection, PgPool, Postgres, QueryBuilder, Row};
use tokio::sync::mpsc;

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

const DELIVERY_COLUMNS: &str = "id, tenant_id, event_id, endpoint_id, event_type, state, attempts, \
     next_attempt_at, reason, last_status, last_error, created_at, updated_at";

fn delivery_from_row(r: &PgRow) -> Result<Delivery> {
    let state: String = r.try_get("state")?;
    Ok(Delivery {
        id: DeliveryId::from_stored(r.try_get::<String, _>("id")?),
        tenant: TenantId::from_stored(r.try_get::<String, _>("tenant_id")?),
        event_id: EventId::from_stored(r.try_get::<String, _>("event_id")?),
        endpoint_id: EndpointId::from_stored(r.try_get::<String, _>("endpoint_id")?),
        event_type: r.try_get("event_type")?,
        state: DeliveryState::parse(&state).ok_or_else(|| StoreError::Backend(format!("bad state {state}")))?,
        attempts: r.try_get::<i64, _>("attempts")? as u32,
        next_attempt_at: r.try_get("next_attempt_at")?,
        reason: r.try_get("reason")?,
        last_status: r.try_get::<Option<i64>, _>("last_status")?.map(|s| s as u16),
        last_error: r.try_get("last_error")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

fn endpoint_from_row(r: &PgRow) -> Result<Endpoint> {
    let spec: String = r.try_get("spec")?;
    let state: String = r.try_get("state")?;
    Ok(Endpoint {
        id: EndpointId::from_stored(r.try_get::<String, _>("id")?),
        tenant: TenantId::from_stored(r.try_get::<String, _>("tenant_id")?),
        spec: serde_json::from_str(&spec).map_err(|e| StoreError::Backend(format!("endpoint spec: {e}")))?,
        state: EndpointState::parse(&state).ok_or_else(|| StoreError::Backend(format!("bad state {state}")))?,
        state_reason: r.try_get("state_reason")?,
        paused_until: r.try_get("paused_until")?,
        failing_since: r.try_get("failing_since")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

fn attempt_from_row(r: &PgRow) -> Result<Attempt> {
    Ok(Attempt {
        id: r.try_get("id")?,
        delivery_id: DeliveryId::from_stored(r.try_get::<String, _>("delivery_id")?),
        number: r.try_get::<i64, _>("number")? as u32,
        started_at: r.try_get("started_at")?,
        duration_ms: r.try_get::<i64, _>("duration_ms")? as u64,
        status: r.try_get::<Option<i64>, _>("status")?.map(|s| s as u16),
        response_body: r.try_get("response_body")?,
        error: r.try_get("error")?,
        verdict: r.try_get("verdict")?,
        decided_by: r.try_get("decided_by")?,
    })
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
        let row = sqlx::query("SELECT id, name, created_at FROM tenants WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            Ok(Tenant {
                id: TenantId::from_stored(r.try_get::<String, _>("id")?),
                name: r.try_get("name")?,
                created_at: r.try_get("created_at")?,
            })
        })
        .transpose()
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
        Ok(row.map(TokenRow::into_record))
    }

    async fn list_tokens(&self, tenant: &TenantId) -> Result<Vec<TokenRecord>> {
        let rows = sqlx::query_as::<_, TokenRow>(&format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens WHERE tenant_id = $1 ORDER BY created_at, id"
        ))
        .bind(tenant.as_str())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(TokenRow::into_record).collect())
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
        let row =
            sqlx::query("SELECT * FROM endpoints WHERE id = $1").bind(id.as_str()).fetch_optional(&self.pool).await?;
        row.as_ref().map(endpoint_from_row).transpose()
    }

    async fn list_endpoints(&self, tenant: &TenantId) -> Result<Vec<Endpoint>> {
        let rows = sqlx::query("SELECT * FROM endpoints WHERE tenant_id = $1 ORDER BY created_at, id")
            .bind(tenant.as_str())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(endpoint_from_row).collect()
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
        let row = sqlx::query("SELECT * FROM events WHERE tenant_id = $1 AND id = $2")
            .bind(tenant.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            Ok(Event {
                id: EventId::from_stored(r.try_get::<String, _>("id")?),
                tenant: TenantId::from_stored(r.try_get::<String, _>("tenant_id")?),
                event_type: r.try_get("type")?,
                payload: r.try_get("payload")?,
                created_at: r.try_get("created_at")?,
                expires_at: r.try_get("expires_at")?,
            })
        })
        .transpose()
    }

    async fn list_deliveries(&self, f: &DeliveryFilter) -> Result<Vec<Delivery>> {
        let mut q: QueryBuilder<'_, Postgres> =
            QueryBuilder::new(format!("SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE 1 = 1"));
        if let Some(t) = &f.tenant {
            q.push(" AND tenant_id = ").push_bind(t.as_str());
        }
        if let Some(e) = &f.event {
            q.push(" AND event_id = ").push_bind(e.as_str());
        }
        if let Some(e) = &f.endpoint {
            q.push(" AND endpoint_id = ").push_bind(e.as_str());
        }
        if let Some(s) = f.state {
            q.push(" AND state = ").push_bind(s.as_str());
        }
        if let Some(t) = &f.event_type {
            q.push(" AND event_type = ").push_bind(t.as_str());
        }
        if let Some(r) = &f.reason {
            q.push(" AND reason = ").push_bind(r.as_str());
        }
        if let Some(s) = f.since {
            q.push(" AND updated_at >= ").push_bind(s);
        }
        if let Some(u) = f.until {
            q.push(" AND updated_at < ").push_bind(u);
        }
        if let Some(a) = &f.after {
            q.push(" AND id > ").push_bind(a.as_str());
        }
        q.push(" ORDER BY id LIMIT ").push_bind(i64::from(f.limit.max(1)));
        let rows = q.build().fetch_all(&self.pool).await?;
        rows.iter().map(delivery_from_row).collect()
    }

    async fn get_delivery(&self, tenant: &TenantId, id: &DeliveryId) -> Result<Option<(Delivery, Vec<Attempt>)>> {
        let row = sqlx::query(&format!("SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE id = $1 AND tenant_id = $2"))
            .bind(id.as_str())
            .bind(tenant.as_str())
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let delivery = delivery_from_row(&row)?;
        let rows = sqlx::query("SELECT * FROM attempts WHERE delivery_id = $1 ORDER BY number")
            .bind(id.as_str())
            .fetch_all(&self.pool)
            .await?;
        let attempts = rows.iter().map(attempt_from_row).collect::<Result<Vec<_>>>()?;
        Ok(Some((delivery, attempts)))
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

    async fn acquire_partition(&self, endpoint: &EndpointId, owner: &str, now: Millis, until: Millis) -> Result<bool> {
        let done = sqlx::query(
            "INSERT INTO partitions (endpoint_id, owner, lease_until) VALUES ($1, $2, $3) \
             ON CONFLICT (endpoint_id) DO UPDATE SET owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until \
             WHERE partitions.owner = EXCLUDED.owner OR partitions.lease_until < $4",
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
        sqlx::query("DELETE FROM partitions WHERE endpoint_id = $1 AND owner = $2")
            .bind(endpoint.as_str())
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(())
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
        push_dead_selection(&mut q, tenant, ids, filter, "");
        let n: i64 = q.build_query_scalar().fetch_one(&self.pool).await?;
        let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new(
            "SELECT DISTINCT e.id FROM deliveries JOIN endpoints e ON e.id = deliveries.endpoint_id \
             WHERE e.state <> 'active'",
        );
        push_dead_selection(&mut q, tenant, ids, filter, "");
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
        let row = sqlx::query("SELECT * FROM replays WHERE id = $1 AND tenant_id = $2")
            .bind(id)
            .bind(tenant.as_str())
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let replay = replay_from_row(&row)?;
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
        let rows = sqlx::query("SELECT * FROM replays WHERE state = 'running' ORDER BY created_at")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(replay_from_row).collect()
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
        let row = sqlx::query("SELECT * FROM replays WHERE id = $1 FOR UPDATE")
            .bind(replay_id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else { return Err(StoreError::NotFound(format!("replay {replay_id}"))) };
        let replay = replay_from_row(&row)?;
        if replay.state != ReplayState::Running {
            return Ok((Vec::new(), 0));
        }
        let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new("SELECT id, endpoint_id FROM deliveries WHERE 1 = 1");
        push_dead_selection(&mut q, &replay.tenant, replay.ids.as_deref(), replay.filter.as_ref(), &replay.cursor);
        q.push(" ORDER BY id LIMIT ").push_bind(i64::from(replay.batch));
        let picked = q.build().fetch_all(&mut *tx).await?;
        let ids: Vec<String> = picked.iter().map(|r| r.try_get("id")).collect::<sqlx::Result<_>>()?;
        let due: Vec<i64> = (0..ids.len()).map(|i| now + (i as f64 * spacing_ms) as i64).collect();
        if !ids.is_empty() {
            sqlx::query(&format!(
                "UPDATE deliveries d SET state = {}, next_attempt_at = v.due, attempt_base = d.attempts, \
                 deadline = $3, replay_id = $4, reason = NULL, updated_at = $5 \
                 FROM UNNEST($1::text[], $2::int8[]) AS v(id, due) WHERE d.id = v.id AND d.state = 'dead'",
                settle("'queued'")
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

/// Deadlocks and serialization failures between nodes' commits: the whole batch can be
/// replayed (it was rolled back as a unit).
fn is_transient(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40P01" | "40001")))
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

/// Applies the ops in order. Runs of consecutive intakes and of consecutive results are
/// folded into single statements: every statement is a round trip to the server.
async fn apply_all(conn: &mut PgConnection, ops: &[WriteOp], channel: &str) -> sqlx::Result<Vec<WriteResult>> {
    let mut results = Vec::with_capacity(ops.len());
    let mut i = 0;
    while i < ops.len() {
        match &ops[i] {
            WriteOp::Ingest(_) => {
                let run: Vec<&[NewEvent]> = ops[i..]
                    .iter()
                    .map_while(|op| match op {
                        WriteOp::Ingest(events) => Some(events.as_slice()),
                        _ => None,
                    })
                    .collect();
                i += run.len();
                let events: Vec<&NewEvent> = run.iter().flat_map(|evs| evs.iter()).collect();
                match ingest(conn, &events, channel).await? {
                    Ok(outcomes) => {
                        let mut outcomes = outcomes.into_iter();
                        for evs in run {
                            results.push(WriteResult::Ingest(outcomes.by_ref().take(evs.len()).collect()));
                        }
                    }
                    // Rare: some request reuses an id with another payload. Its folded run
                    // wrote nothing; take the requests one by one so only that one is refused.
                    Err(_) => {
                        for evs in run {
                            let events: Vec<&NewEvent> = evs.iter().collect();
                            let outcomes = ingest(conn, &events, channel).await?;
                            results.push(WriteResult::Ingest(
                                outcomes.unwrap_or_else(|at| IngestOutcome::refused(evs.len(), at)),
                            ));
                        }
                    }
                }
            }
            WriteOp::Record(_) => {
                let run: Vec<&[AttemptResult]> = ops[i..]
                    .iter()
                    .map_while(|op| match op {
                        WriteOp::Record(results) => Some(results.as_slice()),
                        _ => None,
                    })
                    .collect();
                i += run.len();
                let all: Vec<&AttemptResult> = run.iter().flat_map(|rs| rs.iter()).collect();
                let mut accepted = record(conn, &all).await?.into_iter();
                for rs in run {
                    results.push(WriteResult::Record(accepted.by_ref().take(rs.len()).collect()));
                }
            }
            WriteOp::Claim(req) => {
                i += 1;
                results.push(WriteResult::Claim(claim(conn, req).await?));
            }
            WriteOp::Release(releases) => {
                i += 1;
                release(conn, releases).await?;
                results.push(WriteResult::Release);
            }
            WriteOp::Endpoint(change) => {
                i += 1;
                results.push(WriteResult::Endpoint(change_endpoint(conn, change).await?));
            }
        }
    }
    Ok(results)
}

fn decode_error(e: impl std::error::Error + Send + Sync + 'static) -> sqlx::Error {
    sqlx::Error::Decode(Box::new(e))
}

/// Stores new events and fans each out to its tenant's subscribed endpoints, then tells the
/// other nodes which endpoints got work (delivered when the transaction commits). When an
/// event reuses a stored id with another type or payload, it writes nothing and answers
/// `Err(index)` of that event.
async fn ingest(
    conn: &mut PgConnection,
    events: &[&NewEvent],
    channel: &str,
) -> sqlx::Result<Result<Vec<IngestOutcome>, usize>> {
    let tenants: Vec<&str> = events.iter().map(|e| e.tenant.as_str()).collect::<HashSet<_>>().into_iter().collect();
    let rows = sqlx::query(
        "SELECT tenant_id, id, event_types FROM endpoints WHERE tenant_id = ANY($1) AND state <> 'disabled' \
         ORDER BY created_at, id",
    )
    .bind(&tenants)
    .fetch_all(&mut *conn)
    .await?;
    let mut subscribers: HashMap<String, Vec<(String, Vec<String>)>> = HashMap::new();
    for r in &rows {
        let types: String = r.try_get("event_types")?;
        let types: Vec<String> = serde_json::from_str(&types).map_err(decode_error)?;
        subscribers.entry(r.try_get("tenant_id")?).or_default().push((r.try_get("id")?, types));
    }

    // Which (tenant, id) pairs are new? ON CONFLICT DO NOTHING returns only inserted rows;
    // UNNEST keeps the batch's order, so the first occurrence of a pair is the one inserted.
    let column = |f: fn(&NewEvent) -> &str| events.iter().map(|e| f(e)).collect::<Vec<&str>>();
    let inserted = sqlx::query(
        "INSERT INTO events (tenant_id, id, type, payload, created_at, expires_at, fingerprint) \
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[], $7::text[]) \
         ON CONFLICT DO NOTHING RETURNING tenant_id, id",
    )
    .bind(column(|e| e.tenant.as_str()))
    .bind(column(|e| e.id.as_str()))
    .bind(column(|e| e.event_type.as_str()))
    .bind(column(|e| e.payload.as_str()))
    .bind(events.iter().map(|e| e.created_at).collect::<Vec<_>>())
    .bind(events.iter().map(|e| e.expires_at).collect::<Vec<_>>())
    .bind(column(|e| e.fingerprint.as_str()))
    .fetch_all(&mut *conn)
    .await?;
    let mut inserted: HashSet<(String, String)> =
        inserted.iter().map(|r| Ok((r.try_get("tenant_id")?, r.try_get("id")?))).collect::<sqlx::Result<_>>()?;
    let fresh: Vec<bool> =
        events.iter().map(|ev| inserted.remove(&(ev.tenant.to_string(), ev.id.to_string()))).collect();
    if let Some(at) = first_conflict(conn, events, &fresh).await? {
        let gone: Vec<&&NewEvent> = events.iter().zip(&fresh).filter(|(_, f)| **f).map(|(e, _)| e).collect();
        sqlx::query("DELETE FROM events e USING UNNEST($1::text[], $2::text[]) AS v(t, i) WHERE e.tenant_id = v.t AND e.id = v.i")
            .bind(gone.iter().map(|e| e.tenant.as_str()).collect::<Vec<_>>())
            .bind(gone.iter().map(|e| e.id.as_str()).collect::<Vec<_>>())
            .execute(&mut *conn)
            .await?;
        return Ok(Err(at));
    }

    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_rng(&mut rand::rng());
    let mut out = Vec::with_capacity(events.len());
    let mut rows: Vec<(String, &NewEvent, &str)> = Vec::new();
    let mut duplicates: Vec<usize> = Vec::new();
    for (i, ev) in events.iter().enumerate() {
        if !fresh[i] {
            duplicates.push(i);
            out.push(IngestOutcome { deliveries: 0, endpoints: Vec::new(), duplicate: true, conflict: false });
            continue;
        }
        let mut targets = Vec::new();
        for (endpoint, types) in subscribers.get(ev.tenant.as_str()).map(Vec::as_slice).unwrap_or_default() {
            if type_filter_matches(types, &ev.event_type) {
                rows.push((DeliveryId::generate(ev.created_at, &mut rng).to_string(), ev, endpoint.as_str()));
                targets.push(EndpointId::from_stored(endpoint.as_str()));
            }
        }
        out.push(IngestOutcome {
            deliveries: targets.len() as u32,
            endpoints: targets,
            duplicate: false,
            conflict: false,
        });
    }
    if !rows.is_empty() {
        sqlx::query(
            "INSERT INTO deliveries (id, tenant_id, event_id, endpoint_id, event_type, state, attempts, \
             next_attempt_at, created_at, updated_at) \
             SELECT id, tenant_id, event_id, endpoint_id, event_type, 'queued', 0, at, at, at \
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[]) \
             AS v(id, tenant_id, event_id, endpoint_id, event_type, at)",
        )
        .bind(rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.1.tenant.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.1.id.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.2).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.1.event_type.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.1.created_at).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
    }
    if !duplicates.is_empty() {
        // Counted after this batch's own deliveries are in, so a duplicate within the batch
        // reports the deliveries of its first occurrence.
        let counts = sqlx::query(
            "SELECT v.tenant_id, v.event_id, COUNT(d.id) AS n \
             FROM (SELECT DISTINCT * FROM UNNEST($1::text[], $2::text[]) AS u(tenant_id, event_id)) v \
             LEFT JOIN deliveries d ON d.tenant_id = v.tenant_id AND d.event_id = v.event_id \
             GROUP BY v.tenant_id, v.event_id",
        )
        .bind(duplicates.iter().map(|&i| events[i].tenant.as_str()).collect::<Vec<_>>())
        .bind(duplicates.iter().map(|&i| events[i].id.as_str()).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
        let mut n: HashMap<(String, String), i64> = HashMap::new();
        for r in &counts {
            n.insert((r.try_get("tenant_id")?, r.try_get("event_id")?), r.try_get("n")?);
        }
        for i in duplicates {
            let key = (events[i].tenant.to_string(), events[i].id.to_string());
            out[i].deliveries = n.get(&key).copied().unwrap_or(0) as u32;
        }
    }

    let mut woken: Vec<&str> = rows.iter().map(|r| r.2).collect::<HashSet<_>>().into_iter().collect();
    woken.sort_unstable();
    for chunk in woken.chunks(IDS_PER_NOTIFY) {
        sqlx::query("SELECT pg_notify($1, $2)").bind(channel).bind(chunk.join(",")).execute(&mut *conn).await?;
    }
    Ok(Ok(out))
}

/// The first event that was not inserted (`fresh`) and whose stored type or payload
/// differ. Reads after the insert, so an event a concurrent transaction committed counts.
async fn first_conflict(conn: &mut PgConnection, events: &[&NewEvent], fresh: &[bool]) -> sqlx::Result<Option<usize>> {
    let repeats: Vec<usize> = (0..events.len()).filter(|&i| !fresh[i]).collect();
    if repeats.is_empty() {
        return Ok(None);
    }
    let rows = sqlx::query(
        "SELECT e.tenant_id, e.id, e.fingerprint, CASE WHEN e.fingerprint IS NULL THEN e.type END AS type, \
         CASE WHEN e.fingerprint IS NULL THEN e.payload END AS payload FROM events e \
         JOIN UNNEST($1::text[], $2::text[]) AS v(t, i) ON e.tenant_id = v.t AND e.id = v.i",
    )
    .bind(repeats.iter().map(|&i| events[i].tenant.as_str()).collect::<Vec<_>>())
    .bind(repeats.iter().map(|&i| events[i].id.as_str()).collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    let mut stored: HashMap<(String, String), String> = HashMap::new();
    for r in &rows {
        let fingerprint =
            crate::store::stored_fingerprint(r.try_get("fingerprint")?, r.try_get("type")?, r.try_get("payload")?);
        stored.insert((r.try_get("tenant_id")?, r.try_get("id")?), fingerprint);
    }
    Ok(repeats.into_iter().find(|&i| {
        let key = (events[i].tenant.to_string(), events[i].id.to_string());
        stored.get(&key).is_some_and(|f| *f != events[i].fingerprint)
    }))
}

/// Leases the due deliveries of one endpoint. Rows another node is claiming or recording
/// right now are skipped, never waited for.
async fn claim(conn: &mut PgConnection, req: &ClaimRequest) -> sqlx::Result<Vec<Claimed>> {
    let rows = sqlx::query(
        "WITH picked AS (SELECT id FROM deliveries WHERE endpoint_id = $1 AND state IN ('queued', 'waiting') \
         AND next_attempt_at <= $2 ORDER BY next_attempt_at, id LIMIT $3 FOR UPDATE SKIP LOCKED) \
         UPDATE deliveries d SET state = 'delivering', lease_owner = $4, lease_until = $5, fence = d.fence + 1, \
         updated_at = $2 FROM picked, events e \
         WHERE d.id = picked.id AND e.tenant_id = d.tenant_id AND e.id = d.event_id \
         RETURNING d.id, d.tenant_id, d.event_id, d.event_type, d.attempts, d.attempt_base, d.deadline, d.fence, \
         d.next_attempt_at, \
         e.payload, e.created_at AS event_created_at, e.expires_at",
    )
    .bind(req.endpoint.as_str())
    .bind(req.now)
    .bind(i64::from(req.limit))
    .bind(&req.owner)
    .bind(req.lease_until)
    .fetch_all(&mut *conn)
    .await?;
    let mut claimed = rows
        .iter()
        .map(|r| {
            Ok((
                r.try_get::<i64, _>("next_attempt_at")?,
                Claimed {
                    id: DeliveryId::from_stored(r.try_get::<String, _>("id")?),
                    tenant: TenantId::from_stored(r.try_get::<String, _>("tenant_id")?),
                    event_id: EventId::from_stored(r.try_get::<String, _>("event_id")?),
                    event_type: r.try_get("event_type")?,
                    payload: r.try_get("payload")?,
                    event_created_at: r.try_get("event_created_at")?,
                    expires_at: r.try_get("expires_at")?,
                    attempts: r.try_get::<i64, _>("attempts")? as u32,
                    attempt_base: r.try_get::<i64, _>("attempt_base")? as u32,
                    deadline: r.try_get("deadline")?,
                    fence: r.try_get("fence")?,
                },
            ))
        })
        .collect::<sqlx::Result<Vec<_>>>()?;
    // RETURNING gives no order guarantee: keep the schedule's.
    claimed.sort_by(|a, b| (a.0, a.1.id.as_str()).cmp(&(b.0, b.1.id.as_str())));
    Ok(claimed.into_iter().map(|(_, c)| c).collect())
}

/// Records results whose fence still matches, and their attempts. A delivery appearing
/// twice starts a new statement, so results apply in order as if one by one.
async fn record(conn: &mut PgConnection, results: &[&AttemptResult]) -> sqlx::Result<Vec<bool>> {
    let mut accepted = Vec::with_capacity(results.len());
    let mut start = 0;
    while start < results.len() {
        let mut seen = HashSet::new();
        let end = results[start..]
            .iter()
            .position(|r| !seen.insert(r.delivery.as_str()))
            .map_or(results.len(), |n| start + n);
        accepted.extend(record_distinct(conn, &results[start..end]).await?);
        start = end;
    }
    Ok(accepted)
}

async fn record_distinct(conn: &mut PgConnection, results: &[&AttemptResult]) -> sqlx::Result<Vec<bool>> {
    // An unfinished delivery settles against its endpoint's state at commit time (a
    // concurrent disable or human pause wins over a retry).
    let sql = format!(
        "UPDATE deliveries d SET \
         state = CASE WHEN v.state IN ('waiting', 'queued') THEN {settled} ELSE v.state END, \
         attempts = v.attempts, next_attempt_at = v.next_attempt_at, \
         reason = CASE WHEN v.state IN ('waiting', 'queued') AND {settled} = 'dead' THEN 'endpoint_disabled' \
         ELSE v.reason END, \
         last_status = v.last_status, last_error = v.last_error, lease_owner = NULL, lease_until = NULL, \
         updated_at = v.updated_at \
         FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::int8[], $5::int8[], $6::text[], $7::int8[], \
         $8::text[], $9::int8[]) \
         AS v(id, fence, state, attempts, next_attempt_at, reason, last_status, last_error, updated_at) \
         WHERE d.id = v.id AND d.fence = v.fence AND d.state = 'delivering' RETURNING d.id",
        settled = settle("v.state"),
    );
    let rows = sqlx::query(&sql)
        .bind(results.iter().map(|r| r.delivery.as_str()).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.fence).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.state.as_str()).collect::<Vec<_>>())
        .bind(results.iter().map(|r| i64::from(r.attempt.number)).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.next_attempt_at).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.reason.as_deref()).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.attempt.status.map(i64::from)).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.attempt.error.as_deref()).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.attempt.started_at + r.attempt.duration_ms as i64).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
    let updated: HashSet<String> = rows.iter().map(|r| r.try_get("id")).collect::<sqlx::Result<_>>()?;
    let accepted: Vec<bool> = results.iter().map(|r| updated.contains(r.delivery.as_str())).collect();
    let attempts: Vec<&Attempt> =
        results.iter().zip(&accepted).filter(|(_, ok)| **ok).map(|(r, _)| &r.attempt).collect();
    if !attempts.is_empty() {
        sqlx::query(
            "INSERT INTO attempts (id, delivery_id, number, started_at, duration_ms, status, response_body, \
             error, verdict, decided_by, endpoint_id) \
             SELECT v.*, (SELECT endpoint_id FROM deliveries d WHERE d.id = v.delivery_id) \
             FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[], $6::int8[], \
             $7::text[], $8::text[], $9::text[], $10::text[]) \
             AS v(id, delivery_id, number, started_at, duration_ms, status, response_body, error, verdict, decided_by)",
        )
        .bind(attempts.iter().map(|a| a.id.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.delivery_id.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| i64::from(a.number)).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.started_at).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.duration_ms as i64).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.status.map(i64::from)).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.response_body.as_deref()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.error.as_deref()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.verdict.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.decided_by.as_str()).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
    }
    Ok(accepted)
}

/// Hands claimed deliveries back (fenced), settling them against their endpoint's state.
async fn release(conn: &mut PgConnection, releases: &[Release]) -> sqlx::Result<()> {
    if releases.is_empty() {
        return Ok(());
    }
    let settled = settle("'waiting'");
    sqlx::query(&format!(
        "UPDATE deliveries d SET state = {settled}, next_attempt_at = v.at, lease_owner = NULL, \
         lease_until = NULL, reason = CASE WHEN {settled} = 'dead' THEN 'endpoint_disabled' END \
         FROM UNNEST($1::text[], $2::int8[], $3::int8[]) AS v(id, fence, at) \
         WHERE d.id = v.id AND d.fence = v.fence AND d.state = 'delivering'"
    ))
    .bind(releases.iter().map(|r| r.delivery.as_str()).collect::<Vec<_>>())
    .bind(releases.iter().map(|r| r.fence).collect::<Vec<_>>())
    .bind(releases.iter().map(|r| r.next_attempt_at).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// What a delivery `d` that is not finished becomes, given its endpoint's state right now:
/// dead on a disabled endpoint, paused on an endpoint paused for a human, else `$wanted`.
const SETTLE_STATE: &str = "CASE (SELECT CASE WHEN e.state = 'paused' AND e.paused_until IS NOT NULL \
     THEN 'active' ELSE e.state END FROM endpoints e WHERE e.id = d.endpoint_id) \
     WHEN 'disabled' THEN 'dead' WHEN 'paused' THEN 'paused' ELSE $wanted END";

fn settle(wanted: &str) -> String {
    SETTLE_STATE.replace("$wanted", wanted)
}

async fn change_endpoint(conn: &mut PgConnection, c: &EndpointChange) -> sqlx::Result<u64> {
    let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new("UPDATE endpoints SET updated_at = ");
    q.push_bind(c.now);
    if let Some(state) = c.state {
        q.push(", state = ")
            .push_bind(state.as_str())
            .push(", state_reason = ")
            .push_bind(c.reason.clone())
            .push(", paused_until = ")
            .push_bind(c.paused_until);
    }
    if let Some(f) = c.failing_since {
        q.push(", failing_since = ").push_bind(f);
    }
    q.push(" WHERE id = ").push_bind(c.endpoint.as_str());
    q.build().execute(&mut *conn).await?;
    let affected = match (c.state, c.paused_until) {
        (None, _) | (Some(EndpointState::Paused), Some(_)) => return Ok(0),
        (Some(EndpointState::Disabled), _) => sqlx::query(
            "UPDATE deliveries SET state = 'dead', reason = 'endpoint_disabled', next_attempt_at = NULL, \
             updated_at = $1 WHERE endpoint_id = $2 AND state IN ('queued', 'waiting', 'paused')",
        ),
        (Some(EndpointState::Paused), None) => sqlx::query(
            "UPDATE deliveries SET state = 'paused', updated_at = $1 \
             WHERE endpoint_id = $2 AND state IN ('queued', 'waiting')",
        ),
        (Some(EndpointState::Active), _) => sqlx::query(
            "UPDATE deliveries SET state = 'waiting', next_attempt_at = $1, updated_at = $1 \
             WHERE endpoint_id = $2 AND state = 'paused'",
        ),
    }
    .bind(c.now)
    .bind(c.endpoint.as_str())
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(affected)
}

fn replay_from_row(r: &PgRow) -> Result<Replay> {
    let state: String = r.try_get("state")?;
    fn parse<T: serde::de::DeserializeOwned>(v: Option<String>) -> Result<Option<T>> {
        v.map(|t| serde_json::from_str(&t).map_err(|e| StoreError::Backend(format!("replay: {e}")))).transpose()
    }
    Ok(Replay {
        id: r.try_get("id")?,
        tenant: TenantId::from_stored(r.try_get::<String, _>("tenant_id")?),
        state: ReplayState::parse(&state).ok_or_else(|| StoreError::Backend(format!("bad replay state {state}")))?,
        ids: parse(r.try_get("ids")?)?,
        filter: parse(r.try_get("filter")?)?,
        rate_per_sec: r.try_get("rate_per_sec")?,
        batch: r.try_get::<i64, _>("batch")? as u32,
        selected: r.try_get::<i64, _>("selected")? as u64,
        sent: r.try_get::<i64, _>("sent")? as u64,
        cursor: r.try_get("cursor")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

/// Restricts a query on `deliveries` to a tenant's dead letters selected by explicit ids or
/// a filter, after `cursor` (a delivery id; empty for none).
fn push_dead_selection<'a>(
    q: &mut QueryBuilder<'a, Postgres>,
    tenant: &'a TenantId,
    ids: Option<&'a [String]>,
    filter: Option<&'a DeadLetterFilter>,
    cursor: &'a str,
) {
    q.push(" AND deliveries.state = 'dead' AND deliveries.tenant_id = ").push_bind(tenant.as_str());
    if !cursor.is_empty() {
        q.push(" AND deliveries.id > ").push_bind(cursor);
    }
    if let Some(ids) = ids {
        q.push(" AND deliveries.id = ANY(").push_bind(ids).push(")");
    }
    if let Some(f) = filter {
        if let Some(e) = &f.endpoint {
            q.push(" AND deliveries.endpoint_id = ").push_bind(e.as_str());
        }
        if let Some(t) = &f.event_type {
            q.push(" AND deliveries.event_type = ").push_bind(t.as_str());
        }
        if let Some(r) = &f.reason {
            q.push(" AND deliveries.reason = ").push_bind(r.as_str());
        }
        if let Some(s) = f.since {
            q.push(" AND deliveries.updated_at >= ").push_bind(s);
        }
        if let Some(u) = f.until {
            q.push(" AND deliveries.updated_at < ").push_bind(u);
        }
    }
}
