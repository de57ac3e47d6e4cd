//! The shared Postgres store: several nodes on one database (reads and LISTEN here, the
//! group-commit write path in [`writer`]). Claims take rows with
//! `FOR UPDATE SKIP LOCKED` under fenced leases, each group commit is one transaction with
//! array-bound (`UNNEST`) multi-row statements, and intake wakes the other nodes through
//! `LISTEN/NOTIFY`. Semantics match the SQLite store exactly; it must not hold locks
//! across a network round trip to anything but Postgres.

use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgQueryResult};
use sqlx::{PgPool, Postgres, Row};
use tokio::sync::mpsc;

use super::portal;
use super::queries::{self, Dialect, Queries, TurnStep};
use super::reads::HasReads;
use super::sql::{self, Sql};
use super::*;

/// The notification channel intake signals on; the schema is appended so that databases
/// shared by several schemas (tests, tenants of a hosting provider) do not wake each other.
const CHANNEL: &str = "herald_work";
/// Postgres refuses channel names of 64 bytes or more.
const MAX_CHANNEL: usize = 63;
/// Marks a notification about changed endpoints; intake's carry bare ids of new work.
const CHANGED: &str = "changed:";
/// Endpoint ids per notification: payloads must stay under 8000 bytes.
const IDS_PER_NOTIFY: usize = 200;
/// Group commits that hit a deadlock or serialization failure are replayed this often.
const MAX_REPLAYS: u32 = 3;

pub struct PostgresStore {
    /// Reads and administrative writes, on sqlx's pool.
    q: Queries<Postgres>,
    channel: String,
    /// Set by [`Engine::hand_off`]: this node's partitions that take new deliveries at intake.
    handoff: OnceLock<Arc<dyn Handoff>>,
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
        MIGRATOR.run(&pool).await.map_err(|e| StoreError::backend(format!("migrations: {e}")))?;
        let schema: Option<String> = sqlx::query_scalar("SELECT current_schema()").fetch_one(&pool).await?;
        let channel = match schema {
            Some(s) if CHANNEL.len() + 1 + s.len() <= MAX_CHANNEL => format!("{CHANNEL}:{s}"),
            _ => CHANNEL.to_string(),
        };
        Ok(PostgresStore { q: Queries { pool, wal: None }, channel, handoff: OnceLock::new() })
    }
}

impl PostgresStore {
    /// A transaction for an administrative write, with the request's pending audit entry,
    /// which [`audit::finish`] inserts before the commit (see `audit`).
    async fn begin(&self) -> Result<(sqlx::Transaction<'static, Postgres>, Option<AuditEntry>)> {
        Ok((self.q.pool.begin().await?, audit::pending()))
    }
}

impl HasReads for PostgresStore {
    fn reads(&self) -> &dyn Reads {
        &self.q
    }
}

#[async_trait]
impl Admin for PostgresStore {
    async fn create_tenant(&self, t: &Tenant) -> Result<()> {
        let (mut tx, entry) = self.begin().await?;
        let out = self.q.create_tenant(&mut tx, t).await?;
        audit::finish(tx, entry, out).await
    }

    async fn insert_token(&self, t: &TokenRecord) -> Result<()> {
        let (mut tx, entry) = self.begin().await?;
        let out = self.q.insert_token(&mut tx, t).await?;
        audit::finish(tx, entry, out).await
    }

    async fn revoke_token(&self, tenant: &TenantId, id: &str) -> Result<bool> {
        let (mut tx, entry) = self.begin().await?;
        let out = self.q.revoke_token(&mut tx, tenant, id).await?;
        audit::finish(tx, entry, out).await
    }

    async fn touch_token(&self, hash: &str, at: Millis) -> Result<()> {
        sqlx::query(sql::TOUCH_TOKEN).bind(at).bind(hash).execute(&self.q.pool).await?;
        Ok(())
    }

    async fn insert_endpoint(&self, e: &Endpoint) -> Result<()> {
        let (mut tx, entry) = self.begin().await?;
        let out = self.q.insert_endpoint(&mut tx, e).await?;
        audit::finish(tx, entry, out).await
    }

    async fn update_endpoint(&self, e: &Endpoint) -> Result<bool> {
        let (mut tx, entry) = self.begin().await?;
        let out = self.q.update_endpoint(&mut tx, e).await?;
        audit::finish(tx, entry, out).await
    }

    async fn put_verification(&self, id: &EndpointId, v: &Verification) -> Result<bool> {
        let (mut tx, entry) = self.begin().await?;
        let out = self.q.put_verification(&mut tx, id, v).await?;
        audit::finish(tx, entry, out).await
    }

    async fn put_listener(&self, id: &EndpointId, node: &str) -> Result<bool> {
        let (mut tx, entry) = self.begin().await?;
        let out = self.q.put_listener(&mut tx, id, node).await?;
        audit::finish(tx, entry, out).await
    }

    async fn delete_endpoint(&self, tenant: &TenantId, id: &EndpointId, now: Millis) -> Result<bool> {
        let (mut tx, entry) = self.begin().await?;
        let out = self.q.delete_endpoint(&mut tx, tenant, id, now).await?;
        audit::finish(tx, entry, out).await
    }

    async fn put_plugin_settings(&self, s: &StoredPluginSettings) -> Result<()> {
        let (mut tx, entry) = self.begin().await?;
        let out = self.q.put_plugin_settings(&mut tx, s).await?;
        audit::finish(tx, entry, out).await
    }

    async fn insert_event_type(&self, t: &EventType) -> Result<()> {
        let (mut tx, entry) = self.begin().await?;
        let owner = t.owner.stored();
        sqlx::query(sql::INSERT_EVENT_TYPE)
            .bind(owner)
            .bind(&t.name)
            .bind(&t.description)
            .bind(t.deprecated)
            .bind(queries::json(&t.examples))
            .bind(t.version)
            .bind(t.created_at)
            .bind(queries::json(&t.adapters))
            .execute(&mut *tx)
            .await?;
        if let Some(schema) = &t.schema {
            insert_schema_version(&mut tx, t, schema).await?;
        }
        sqlx::query(sql::BUMP_CATALOG_REVISION).execute(&mut *tx).await?;
        audit::finish(tx, entry, ()).await
    }

    async fn update_event_type(&self, t: &EventType, prior_version: i64) -> Result<bool> {
        let (mut tx, entry) = self.begin().await?;
        let done = sqlx::query(sql::UPDATE_EVENT_TYPE)
            .bind(&t.description)
            .bind(t.deprecated)
            .bind(queries::json(&t.examples))
            .bind(t.version)
            .bind(t.updated_at)
            .bind(queries::json(&t.adapters))
            .bind(t.owner.stored())
            .bind(&t.name)
            .bind(prior_version)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        if let Some(schema) = t.schema.as_ref().filter(|_| t.version > prior_version) {
            insert_schema_version(&mut tx, t, schema).await?;
        }
        sqlx::query(sql::BUMP_CATALOG_REVISION).execute(&mut *tx).await?;
        audit::finish(tx, entry, true).await
    }

    async fn delete_event_type(&self, owner: &CatalogOwner, name: &str) -> Result<bool> {
        let (mut tx, entry) = self.begin().await?;
        let done = sqlx::query(sql::DELETE_EVENT_TYPE).bind(owner.stored()).bind(name).execute(&mut *tx).await?;
        sqlx::query(sql::DELETE_SCHEMA_VERSIONS).bind(owner.stored()).bind(name).execute(&mut *tx).await?;
        sqlx::query(sql::BUMP_CATALOG_REVISION).execute(&mut *tx).await?;
        audit::finish(tx, entry, done.rows_affected() == 1).await
    }

    async fn put_tenant_settings(&self, tenant: &TenantId, settings: TenantSettings, at: Millis) -> Result<()> {
        let (mut tx, entry) = self.begin().await?;
        sqlx::query(sql::UPSERT_TENANT_SETTINGS)
            .bind(tenant.as_str())
            .bind(settings.schema_validation.as_str())
            .bind(settings.verify_endpoints)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        sqlx::query(sql::BUMP_CATALOG_REVISION).execute(&mut *tx).await?;
        audit::finish(tx, entry, ()).await
    }

    async fn insert_portal_session(&self, s: &PortalSession, code_hash: &str) -> Result<()> {
        let (mut tx, entry) = self.begin().await?;
        sqlx::query(portal::INSERT_PORTAL_SESSION)
            .bind(&s.id)
            .bind(s.tenant.as_str())
            .bind(code_hash)
            .bind(portal::scopes_text(s))
            .bind(s.read_only)
            .bind(portal::endpoints_json(s))
            .bind(s.created_at)
            .bind(s.expires_at)
            .execute(&mut *tx)
            .await?;
        audit::finish(tx, entry, ()).await
    }

    async fn exchange_portal_code(&self, code_hash: &str, token_hash: &str, now: Millis) -> Result<bool> {
        let (mut tx, entry) = self.begin().await?;
        let done = sqlx::query(portal::EXCHANGE_PORTAL_CODE)
            .bind(token_hash)
            .bind(now)
            .bind(code_hash)
            .execute(&mut *tx)
            .await?;
        audit::finish(tx, entry, done.rows_affected() == 1).await
    }

    async fn revoke_portal_session(&self, tenant: &TenantId, id: &str, now: Millis) -> Result<bool> {
        let (mut tx, entry) = self.begin().await?;
        let done = sqlx::query(portal::REVOKE_PORTAL_SESSION)
            .bind(now)
            .bind(tenant.as_str())
            .bind(id)
            .execute(&mut *tx)
            .await?;
        audit::finish(tx, entry, done.rows_affected() == 1).await
    }

    async fn put_branding(&self, tenant: &TenantId, b: &Branding, at: Millis) -> Result<()> {
        let (mut tx, entry) = self.begin().await?;
        sqlx::query(portal::UPSERT_BRANDING)
            .bind(tenant.as_str())
            .bind(&b.name)
            .bind(&b.logo)
            .bind(&b.accent)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        audit::finish(tx, entry, ()).await
    }

    async fn create_replay(&self, r: &Replay) -> Result<()> {
        let (mut tx, entry) = self.begin().await?;
        let out = self.q.create_replay(&mut tx, r).await?;
        audit::finish(tx, entry, out).await
    }

    async fn replay_turn(&self, replay_id: &str, now: Millis, ttl_ms: i64) -> Result<ReplayTurn> {
        let mut tx = self.q.pool.begin().await?;
        // Every node runs every running replay: the row lock makes their turns one at a
        // time, and each reads the schedule the previous turn committed.
        let (replay, picks) = match Queries::<Postgres>::plan_turn(&mut tx, replay_id, " FOR UPDATE", now).await? {
            TurnStep::Ended => return Ok(ReplayTurn::Ended),
            TurnStep::NotYet(at) => return Ok(ReplayTurn::NotYet(at)),
            TurnStep::Done => {
                let done = sqlx::query(sql::REPLAY_DONE).bind(now).bind(replay_id).execute(&mut *tx).await?;
                tx.commit().await?;
                return Ok(match done.rows_affected() {
                    1 => ReplayTurn::Ended,
                    _ => ReplayTurn::NotYet(now + SETTLE_CHECK_MS),
                });
            }
            TurnStep::Requeue(replay, picks) => (*replay, picks),
        };
        let ids: Vec<&str> = picks.requeue.iter().map(|(id, _)| id.as_str()).collect();
        let (due, next_due) = replay.schedule(now, ids.len());
        sqlx::query(&format!(
            "UPDATE deliveries d SET {} FROM UNNEST($1::text[], $2::int8[]) AS v(id, due) \
             WHERE d.id = v.id AND d.state = 'dead'",
            sql::requeue_set("d", "v.due", "$3", "$4", "$5")
        ))
        .bind(&ids)
        .bind(&due)
        .bind(now + ttl_ms)
        .bind(replay_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if !Queries::<Postgres>::advance_replay(&mut tx, &replay, &picks, now, next_due).await? {
            // Cannot happen under the row lock; said for the reader.
            return Ok(ReplayTurn::NotYet(now));
        }
        let n = picks.requeue.len() as u32;
        let turn = queries::requeued(picks.requeue.into_iter().map(|(_, e)| e).collect(), n, next_due);
        if let ReplayTurn::Requeued { endpoints, .. } = &turn {
            let ids: Vec<&str> = endpoints.iter().map(EndpointId::as_str).collect();
            writer::notify_woken(&mut tx, &self.channel, &ids).await?;
        }
        tx.commit().await?;
        Ok(turn)
    }

    async fn cancel_replay(&self, tenant: &TenantId, id: &str, now: Millis) -> Result<Option<Vec<EndpointId>>> {
        let (mut tx, entry) = self.begin().await?;
        let cancelled =
            sqlx::query(sql::CANCEL_REPLAY).bind(now).bind(id).bind(tenant.as_str()).execute(&mut *tx).await?;
        if cancelled.rows_affected() == 0 {
            return Ok(None);
        }
        sqlx::query(&sql::return_unsent("replay_id = $2")).bind(now).bind(id).execute(&mut *tx).await?;
        let claimed: Vec<String> = sqlx::query_scalar(sql::REPLAY_CLAIMED_UNSENT).bind(id).fetch_all(&mut *tx).await?;
        audit::finish(tx, entry, Some(claimed.into_iter().map(EndpointId::from_stored).collect())).await
    }

    async fn ack_polled(&self, endpoint: &EndpointId, upto: i64, now: Millis, limit: u32) -> Result<u64> {
        let mut tx = self.q.pool.begin().await?;
        // Locked: an acknowledgement running beside it waits, then finds them settled.
        let ids: Vec<String> = sqlx::query_scalar(&(sql::poll_acked("seq") + " FOR UPDATE"))
            .bind(endpoint.as_str())
            .bind(upto)
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
        let attempts: Vec<String> = {
            let mut rng = rand::rng();
            ids.iter().map(|_| new_id("att", now, &mut rng)).collect()
        };
        for (id, attempt) in ids.iter().zip(attempts) {
            sqlx::query(sql::ACK_DELIVERED).bind(now).bind(id).execute(&mut *tx).await?;
            sqlx::query(sql::ACK_ATTEMPT).bind(attempt).bind(now).bind(id).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(ids.len() as u64)
    }

    async fn record_audit(&self, entry: &AuditEntry) -> Result<()> {
        let mut conn = self.q.pool.acquire().await?;
        Ok(audit::insert_pg(&mut conn, entry).await?)
    }
}

#[async_trait]
impl Engine for PostgresStore {
    async fn release_partitions(&self, owner: Option<&str>) -> Result<u64> {
        let done = match owner {
            Some(owner) => sqlx::query(sql::RELEASE_PARTITIONS_OF).bind(owner).execute(&self.q.pool).await?,
            None => sqlx::query(sql::RELEASE_ALL_PARTITIONS).execute(&self.q.pool).await?,
        };
        Ok(done.rows_affected())
    }

    async fn subscribe(&self) -> Result<Option<mpsc::Receiver<Notice>>> {
        let listener = listen(&self.q.pool, &self.channel).await?;
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(forward_notifications(listener, self.q.pool.clone(), self.channel.clone(), tx));
        Ok(Some(rx))
    }

    async fn hold_node_id(&self, id: &str) -> Result<Option<NodeIdLock>> {
        let mut conn = self.q.pool.acquire().await?.detach();
        if !try_lock_node_id(&mut conn, id).await? {
            return Ok(None);
        }
        let (lost, watch) = tokio::sync::watch::channel(false);
        let keeper = tokio::spawn(keep_node_id(conn, self.q.pool.clone(), id.to_string(), lost));
        Ok(Some(NodeIdLock::kept(watch, keeper)))
    }

    async fn heartbeat(&self, id: &str, leaving: bool) -> Result<Option<Vec<String>>> {
        // One statement: the other nodes as of its snapshot (this node's own row is added
        // below), its own row written, and rows of nodes long gone removed.
        let mut members: Vec<String> = sqlx::query_scalar(
            "WITH seen AS (INSERT INTO cluster_nodes (node_id, seen_at) SELECT $1, clock_timestamp() WHERE NOT $2 \
             ON CONFLICT (node_id) DO UPDATE SET seen_at = EXCLUDED.seen_at RETURNING node_id), \
             gone AS (DELETE FROM cluster_nodes WHERE (node_id = $1 AND $2) \
             OR seen_at < clock_timestamp() - interval '1 hour' RETURNING node_id) \
             SELECT node_id FROM cluster_nodes WHERE node_id <> $1 \
             AND seen_at > clock_timestamp() - make_interval(secs => $3)",
        )
        .bind(id)
        .bind(leaving)
        .bind(MEMBER_TIMEOUT.as_secs_f64())
        .fetch_all(&self.q.pool)
        .await?;
        if !leaving {
            members.push(id.to_string());
        }
        members.sort_unstable();
        Ok(Some(members))
    }

    async fn announce_changed(&self, endpoints: &[EndpointId]) -> Result<()> {
        let ids: Vec<&str> = endpoints.iter().map(EndpointId::as_str).collect();
        for chunk in ids.chunks(IDS_PER_NOTIFY) {
            let payload = format!("{CHANGED}{}", chunk.join(","));
            sqlx::query("SELECT pg_notify($1, $2)").bind(&self.channel).bind(payload).execute(&self.q.pool).await?;
        }
        Ok(())
    }

    /// Claim at intake, as on SQLite: this node's commits are applied one at a time, in
    /// the order the engine numbers, and an intake commit checks each lease it gives
    /// against the stored partition lease (see `writer::insert_deliveries`).
    fn hand_off(&self, handoff: Arc<dyn Handoff>) {
        if self.handoff.set(handoff).is_err() {
            tracing::warn!("claim at intake was already set up; kept the first");
        }
    }

    async fn apply(&self, ops: Vec<WriteOp>) -> Result<Vec<WriteResult>> {
        // The engine's bookkeeping alone (claims, results, releases, leases) need not wait
        // for the WAL to reach the disk: the next acknowledged commit flushes it (the WAL
        // is written in order), or the WAL writer within a few `wal_writer_delay`s. A
        // crash of the server may take it back, which sends a delivery again; nothing
        // anyone was answered for is lost.
        let begin = match ops.iter().any(WriteOp::acknowledged) {
            true => "BEGIN",
            false => "BEGIN; SET LOCAL synchronous_commit = off",
        };
        let handoff = self.handoff.get().map(|h| &**h);
        let mut replays = 0;
        loop {
            let mut tx = self.q.pool.begin_with(begin).await?;
            let outcome = match apply_all(&mut tx, &ops, &self.channel, handoff).await {
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

#[async_trait]
impl Housekeeping for PostgresStore {
    async fn recover_leases(&self, expired_before: Millis, now: Millis) -> Result<u64> {
        let mut tx = self.q.pool.begin().await?;
        // SKIP LOCKED: a row some node is recording right now is not abandoned.
        let done = sqlx::query(
            "UPDATE deliveries SET state = 'waiting', next_attempt_at = $1, lease_owner = NULL, \
             lease_until = NULL, updated_at = $1 WHERE id IN (SELECT id FROM deliveries \
             WHERE state = 'delivering' AND lease_until < $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind(now)
        .bind(expired_before)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() > 0 {
            // Unsent deliveries of replays cancelled while they were leased: dead letters again.
            sqlx::query(&sql::return_unsent(sql::OF_CANCELLED_REPLAYS)).bind(now).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    async fn recover_leases_of(&self, owner: &str, now: Millis) -> Result<u64> {
        let mut tx = self.q.pool.begin().await?;
        let done = sqlx::query(sql::RECOVER_LEASES_OF).bind(now).bind(owner).execute(&mut *tx).await?;
        if done.rows_affected() > 0 {
            sqlx::query(&sql::return_unsent(sql::OF_CANCELLED_REPLAYS)).bind(now).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    async fn end_timed_pauses(&self, now: Millis) -> Result<Vec<(TenantId, EndpointId)>> {
        let rows = sqlx::query(sql::END_TIMED_PAUSES).bind(now).fetch_all(&self.q.pool).await?;
        rows.iter()
            .map(|r| {
                let tenant = TenantId::from_stored(r.try_get::<String, _>("tenant_id")?);
                Ok((tenant, EndpointId::from_stored(r.try_get::<String, _>("id")?)))
            })
            .collect()
    }

    async fn purge(&self, delivered_before: Millis, dead_before: Millis, limit: u32) -> Result<u64> {
        let mut tx = self.q.pool.begin().await?;
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
        // The audit log is kept as long as delivered work.
        let entries =
            sqlx::query(audit::PURGE_AUDIT_PG).bind(delivered_before).bind(i64::from(limit)).execute(&mut *tx).await?;
        tx.commit().await?;
        // A full batch of either means there may be more.
        Ok((ids.len() as u64).max(entries.rows_affected()))
    }
}

/// How often the session holding the node id is checked, and retried once it is lost.
const NODE_ID_CHECK: Duration = Duration::from_secs(1);

/// Takes the session-level advisory lock on node id `id` in this schema (`false`: another
/// session holds it). A session-level lock lives as long as the session: a killed node's
/// backend ends with its socket and frees it; nothing else ever unlocks it.
async fn try_lock_node_id(conn: &mut sqlx::PgConnection, id: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext(current_schema()), hashtext('herald-node:' || $1))")
        .bind(id)
        .fetch_one(conn)
        .await
}

/// Holds node id `id` on `conn` until the lock is dropped. When the session ends (the
/// database restarted, the network failed), takes the id again on a new one as soon as
/// the database answers; if another process took it meanwhile, reports `lost` and stops.
async fn keep_node_id(mut conn: sqlx::PgConnection, pool: PgPool, id: String, lost: tokio::sync::watch::Sender<bool>) {
    use sqlx::Connection;
    loop {
        tokio::time::sleep(NODE_ID_CHECK).await;
        if matches!(tokio::time::timeout(NODE_ID_CHECK * 5, conn.ping()).await, Ok(Ok(()))) {
            continue;
        }
        tracing::warn!(node_id = %id, "lost the session holding this node's id; taking it again");
        conn = loop {
            tokio::time::sleep(NODE_ID_CHECK).await;
            let retake = async {
                let mut conn = pool.acquire().await?.detach();
                let held = try_lock_node_id(&mut conn, &id).await?;
                Ok::<_, sqlx::Error>((conn, held))
            };
            match tokio::time::timeout(NODE_ID_CHECK * 5, retake).await {
                Ok(Ok((conn, true))) => break conn,
                Ok(Ok((_, false))) => {
                    tracing::error!(node_id = %id, "another process took this node's id while the database was out of reach");
                    let _ = lost.send(true);
                    return;
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "cannot take the node id again yet"),
                Err(_) => tracing::debug!("taking the node id again timed out"),
            }
        };
        tracing::info!(node_id = %id, "holds this node's id again");
    }
}

async fn listen(pool: &PgPool, channel: &str) -> sqlx::Result<PgListener> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

/// Feeds notifications to the engine until it stops listening. Notifications sent while
/// the listener was reconnecting are lost: once it listens again, the engine is told
/// (`Notice::Missed`) and looks for work and changes itself, rather than waiting for its
/// periodic scan, or for a partition lease to run out on a node no one woke.
async fn forward_notifications(mut listener: PgListener, pool: PgPool, channel: String, tx: mpsc::Sender<Notice>) {
    loop {
        // `try_recv`, not `recv`: `recv` reconnects without a word, and what it missed
        // meanwhile would go unnoticed.
        let got = tokio::select! {
            _ = tx.closed() => return,
            got = listener.try_recv() => got,
        };
        let notice = match got {
            Ok(Some(n)) => {
                let (changed, list) = match n.payload().strip_prefix(CHANGED) {
                    Some(rest) => (true, rest),
                    None => (false, n.payload()),
                };
                let ids: Vec<EndpointId> =
                    list.split(',').filter(|s| !s.is_empty()).map(EndpointId::from_stored).collect();
                if ids.is_empty() {
                    continue;
                }
                if changed { Notice::Changed(ids) } else { Notice::Work(ids) }
            }
            // The connection was lost, and listens again (sqlx reconnects before answering).
            Ok(None) => {
                tracing::warn!("the notification listener reconnected; looking for what it missed");
                Notice::Missed
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
                Notice::Missed
            }
        };
        if tx.send(notice).await.is_err() {
            return;
        }
    }
}

/// Stores `t.schema` as its version `t.version`.
async fn insert_schema_version(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    t: &EventType,
    schema: &serde_json::Value,
) -> Result<()> {
    sqlx::query(sql::INSERT_SCHEMA_VERSION)
        .bind(t.owner.stored())
        .bind(&t.name)
        .bind(t.version)
        .bind(queries::json(schema))
        .bind(t.updated_at)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

impl Dialect for Postgres {
    /// One array parameter.
    fn push_ids<'a>(q: &mut Sql<'a, Postgres>, ids: &'a [String]) {
        q.push(" AND deliveries.id = ANY(").push_bind(ids).push(")");
    }

    fn push_one_of<'a>(q: &mut Sql<'a, Postgres>, column: &str, ids: &'a [String]) {
        q.push(format_args!("{column} = ANY(")).push_bind(ids).push(")");
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    const NEXT_DUE: &'static str = sql::NEXT_DUE_POSTGRES;
    const SEQ: &'static str = "seq";

    fn json_text(column: &str, path: &[&str]) -> String {
        format!("({column}::jsonb #>> '{{{}}}')", path.join(","))
    }
}
