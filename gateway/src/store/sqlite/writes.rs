//! The SQLite store's writes outside the hot path (tenants, tokens, endpoint CRUD, lease
//! recovery, replays, retention). Each runs on the writer thread ([`super::writer`]) in a
//! transaction of its own between group commits: the sqlx pool is opened read-only, so no
//! write can queue for the file's lock behind the committer (busy waits of seconds).

use rusqlite::{Transaction, params};

use super::super::*;
use super::super::{audit, portal, sql};
use crate::store::queries::json;

pub(super) fn create_tenant(tx: &Transaction<'_>, t: &Tenant) -> Result<()> {
    tx.prepare_cached(sql::INSERT_TENANT)?.execute(params![t.id.as_str(), t.name, t.created_at])?;
    Ok(())
}

pub(super) fn insert_token(tx: &Transaction<'_>, t: &TokenRecord) -> Result<()> {
    let scopes: Vec<&str> = t.scopes.iter().map(|s| s.as_str()).collect();
    tx.prepare_cached(sql::INSERT_TOKEN)?.execute(params![
        t.id,
        t.hash,
        t.tenant.as_str(),
        scopes.join(" "),
        t.created_at
    ])?;
    Ok(())
}

pub(super) fn revoke_token(tx: &Transaction<'_>, tenant: &TenantId, id: &str) -> Result<bool> {
    let n = tx.prepare_cached(sql::REVOKE_TOKEN)?.execute(params![tenant.as_str(), id])?;
    Ok(n > 0)
}

pub(super) fn touch_token(tx: &Transaction<'_>, hash: &str, at: Millis) -> Result<()> {
    tx.prepare_cached(sql::TOUCH_TOKEN)?.execute(params![at, hash])?;
    Ok(())
}

pub(super) fn insert_endpoint(tx: &Transaction<'_>, e: &Endpoint) -> Result<()> {
    tx.prepare_cached(sql::INSERT_ENDPOINT)?.execute(params![
        e.id.as_str(),
        e.tenant.as_str(),
        json(&e.spec),
        json(&e.spec.event_types),
        e.state.as_str(),
        e.state_reason,
        e.paused_until,
        e.failing_since,
        e.created_at,
        e.updated_at,
        e.spec.ordering.stored()
    ])?;
    Ok(())
}

pub(super) fn update_endpoint(tx: &Transaction<'_>, e: &Endpoint) -> Result<bool> {
    let n = tx.prepare_cached(sql::UPDATE_ENDPOINT)?.execute(params![
        json(&e.spec),
        json(&e.spec.event_types),
        e.updated_at,
        e.spec.ordering.stored(),
        e.id.as_str(),
        e.tenant.as_str()
    ])?;
    Ok(n == 1)
}

pub(super) fn put_verification(tx: &Transaction<'_>, id: &EndpointId, v: &Verification) -> Result<bool> {
    let n = tx.prepare_cached(sql::PUT_VERIFICATION)?.execute(params![json(v), id.as_str()])?;
    Ok(n == 1)
}

pub(super) fn put_listener(tx: &Transaction<'_>, id: &EndpointId, node: &str) -> Result<bool> {
    let n = tx.prepare_cached(sql::PUT_LISTENER)?.execute(params![node, id.as_str()])?;
    Ok(n == 1)
}

pub(super) fn delete_endpoint(tx: &Transaction<'_>, tenant: &TenantId, id: &EndpointId, now: Millis) -> Result<bool> {
    let n = tx.prepare_cached(sql::DELETE_ENDPOINT)?.execute(params![id.as_str(), tenant.as_str()])?;
    tx.prepare_cached(sql::DEAD_ON_DELETED_ENDPOINT)?.execute(params![now, id.as_str()])?;
    Ok(n == 1)
}

pub(super) fn put_plugin_settings(tx: &Transaction<'_>, s: &StoredPluginSettings) -> Result<()> {
    tx.prepare_cached(sql::UPSERT_PLUGIN_SETTINGS)?.execute(params![
        s.tenant.as_str(),
        s.plugin,
        json(&s.settings),
        s.updated_at
    ])?;
    Ok(())
}

pub(super) fn insert_event_type(tx: &Transaction<'_>, t: &EventType) -> Result<()> {
    tx.prepare_cached(sql::INSERT_EVENT_TYPE)?.execute(params![
        t.owner.stored(),
        t.name,
        t.description,
        t.deprecated,
        json(&t.examples),
        t.version,
        t.created_at,
        json(&t.adapters)
    ])?;
    if let Some(schema) = &t.schema {
        insert_schema_version(tx, t, schema)?;
    }
    tx.prepare_cached(sql::BUMP_CATALOG_REVISION)?.execute([])?;
    Ok(())
}

pub(super) fn update_event_type(tx: &Transaction<'_>, t: &EventType, prior_version: i64) -> Result<bool> {
    let n = tx.prepare_cached(sql::UPDATE_EVENT_TYPE)?.execute(params![
        t.description,
        t.deprecated,
        json(&t.examples),
        t.version,
        t.updated_at,
        json(&t.adapters),
        t.owner.stored(),
        t.name,
        prior_version
    ])?;
    if n == 0 {
        return Ok(false);
    }
    if let Some(schema) = t.schema.as_ref().filter(|_| t.version > prior_version) {
        insert_schema_version(tx, t, schema)?;
    }
    tx.prepare_cached(sql::BUMP_CATALOG_REVISION)?.execute([])?;
    Ok(true)
}

/// Stores `t.schema` as its version `t.version`.
fn insert_schema_version(tx: &Transaction<'_>, t: &EventType, schema: &serde_json::Value) -> Result<()> {
    let values = params![t.owner.stored(), t.name, t.version, json(schema), t.updated_at];
    tx.prepare_cached(sql::INSERT_SCHEMA_VERSION)?.execute(values)?;
    Ok(())
}

pub(super) fn delete_event_type(tx: &Transaction<'_>, owner: &CatalogOwner, name: &str) -> Result<bool> {
    let n = tx.prepare_cached(sql::DELETE_EVENT_TYPE)?.execute(params![owner.stored(), name])?;
    tx.prepare_cached(sql::DELETE_SCHEMA_VERSIONS)?.execute(params![owner.stored(), name])?;
    tx.prepare_cached(sql::BUMP_CATALOG_REVISION)?.execute([])?;
    Ok(n == 1)
}

pub(super) fn put_tenant_settings(
    tx: &Transaction<'_>,
    tenant: &TenantId,
    settings: TenantSettings,
    at: Millis,
) -> Result<()> {
    let (mode, verify) = (settings.schema_validation.as_str(), settings.verify_endpoints);
    tx.prepare_cached(sql::UPSERT_TENANT_SETTINGS)?.execute(params![tenant.as_str(), mode, verify, at])?;
    tx.prepare_cached(sql::BUMP_CATALOG_REVISION)?.execute([])?;
    Ok(())
}

pub(super) fn insert_portal_session(tx: &Transaction<'_>, s: &PortalSession, code_hash: &str) -> Result<()> {
    tx.prepare_cached(portal::INSERT_PORTAL_SESSION)?.execute(params![
        s.id,
        s.tenant.as_str(),
        code_hash,
        portal::scopes_text(s),
        s.read_only,
        portal::endpoints_json(s),
        s.created_at,
        s.expires_at
    ])?;
    Ok(())
}

pub(super) fn exchange_portal_code(
    tx: &Transaction<'_>,
    code_hash: &str,
    token_hash: &str,
    now: Millis,
) -> Result<bool> {
    Ok(tx.prepare_cached(portal::EXCHANGE_PORTAL_CODE)?.execute(params![token_hash, now, code_hash])? == 1)
}

pub(super) fn revoke_portal_session(tx: &Transaction<'_>, tenant: &TenantId, id: &str, now: Millis) -> Result<bool> {
    Ok(tx.prepare_cached(portal::REVOKE_PORTAL_SESSION)?.execute(params![now, tenant.as_str(), id])? == 1)
}

pub(super) fn put_branding(tx: &Transaction<'_>, tenant: &TenantId, b: &Branding, at: Millis) -> Result<()> {
    tx.prepare_cached(portal::UPSERT_BRANDING)?.execute(params![tenant.as_str(), b.name, b.logo, b.accent, at])?;
    Ok(())
}

pub(super) fn recover_leases(tx: &Transaction<'_>, expired_before: Millis, now: Millis) -> Result<u64> {
    let n = tx
        .prepare_cached(
            "UPDATE deliveries SET state = 'waiting', next_attempt_at = ?1, lease_owner = NULL, \
             lease_until = NULL, updated_at = ?1 WHERE state = 'delivering' AND lease_until < ?2",
        )?
        .execute(params![now, expired_before])?;
    if n > 0 {
        // Unsent deliveries of replays cancelled while they were leased: dead letters again.
        tx.prepare_cached(&sql::return_unsent(sql::OF_CANCELLED_REPLAYS))?.execute(params![now])?;
    }
    Ok(n as u64)
}

pub(super) fn end_timed_pauses(tx: &Transaction<'_>, now: Millis) -> Result<Vec<(TenantId, EndpointId)>> {
    let mut stmt = tx.prepare_cached(sql::END_TIMED_PAUSES)?;
    let rows = stmt.query_map(params![now], |r| {
        Ok((TenantId::from_stored(r.get::<_, String>(0)?), EndpointId::from_stored(r.get::<_, String>(1)?)))
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(super) fn recover_leases_of(tx: &Transaction<'_>, owner: &str, now: Millis) -> Result<u64> {
    let n = tx.prepare_cached(sql::RECOVER_LEASES_OF)?.execute(params![now, owner])?;
    if n > 0 {
        tx.prepare_cached(&sql::return_unsent(sql::OF_CANCELLED_REPLAYS))?.execute(params![now])?;
    }
    Ok(n as u64)
}

pub(super) fn release_partitions(tx: &Transaction<'_>, owner: Option<&str>) -> Result<u64> {
    let n = match owner {
        Some(owner) => tx.prepare_cached(sql::RELEASE_PARTITIONS_OF)?.execute(params![owner])?,
        None => tx.prepare_cached(sql::RELEASE_ALL_PARTITIONS)?.execute([])?,
    };
    Ok(n as u64)
}

pub(super) fn create_replay(tx: &Transaction<'_>, r: &Replay) -> Result<()> {
    tx.prepare_cached(sql::INSERT_REPLAY)?.execute(params![
        r.id,
        r.tenant.as_str(),
        r.state.as_str(),
        r.ids.as_ref().map(json),
        r.filter.as_ref().map(json),
        r.rate_per_sec,
        i64::from(r.batch),
        r.selected as i64,
        r.requeued as i64,
        r.cursor,
        r.created_at,
        r.updated_at,
        r.next_due_at
    ])?;
    Ok(())
}

/// One replay turn's picks, read from the cursor `replay.cursor`, in id order.
pub(super) struct ReplayStep {
    pub(super) replay: Replay,
    /// (delivery id, endpoint id), in id order: those to re-queue.
    pub(super) picked: Vec<(String, EndpointId)>,
    /// Where the cursor moves: the last dead letter read (re-queued or left out).
    pub(super) cursor: String,
    /// When each picked delivery is due, and when the next turn is.
    pub(super) due: Vec<Millis>,
    pub(super) next_due: Millis,
    pub(super) now: Millis,
    pub(super) deadline: Millis,
}

/// Re-queues a turn's picks, if the replay is still running at the cursor they were
/// picked from (so a turn applies once), and advances the cursor and the schedule. False
/// if it was not.
pub(super) fn replay_step(tx: &Transaction<'_>, s: &ReplayStep) -> Result<bool> {
    let moved = tx.prepare_cached(sql::ADVANCE_REPLAY)?.execute(params![
        s.picked.len() as i64,
        s.cursor,
        s.now,
        s.next_due,
        s.replay.id,
        s.replay.cursor
    ])?;
    if moved == 0 {
        return Ok(false);
    }
    let mut requeue = tx.prepare_cached(&format!(
        "UPDATE deliveries SET {} WHERE id = ?5 AND state = 'dead'",
        sql::requeue_set("deliveries", "?1", "?2", "?3", "?4")
    ))?;
    for ((id, _), due) in s.picked.iter().zip(&s.due) {
        requeue.execute(params![due, s.deadline, s.replay.id, s.now, id])?;
    }
    Ok(true)
}

/// Marks a replay done if everything it re-queued has settled; false if not (or it was
/// not running).
pub(super) fn replay_done(tx: &Transaction<'_>, id: &str, now: Millis) -> Result<bool> {
    Ok(tx.prepare_cached(sql::REPLAY_DONE)?.execute(params![now, id])? == 1)
}

/// See [`Admin::cancel_replay`](crate::store::Admin::cancel_replay).
pub(super) fn cancel_replay(
    tx: &Transaction<'_>,
    tenant: &TenantId,
    id: &str,
    now: Millis,
) -> Result<Option<Vec<EndpointId>>> {
    if tx.prepare_cached(sql::CANCEL_REPLAY)?.execute(params![now, id, tenant.as_str()])? == 0 {
        return Ok(None);
    }
    tx.prepare_cached(&sql::return_unsent("replay_id = $2"))?.execute(params![now, id])?;
    let mut claimed = tx.prepare_cached(sql::REPLAY_CLAIMED_UNSENT)?;
    let endpoints = claimed.query_map([id], |r| r.get::<_, String>(0))?;
    Ok(Some(endpoints.map(|e| e.map(EndpointId::from_stored)).collect::<rusqlite::Result<_>>()?))
}

/// See [`Admin::ack_polled`](crate::store::Admin::ack_polled).
pub(super) fn ack_polled(
    tx: &Transaction<'_>,
    endpoint: &EndpointId,
    upto: i64,
    now: Millis,
    limit: u32,
) -> Result<u64> {
    let mut acked = tx.prepare_cached(&sql::poll_acked("rowid"))?;
    let ids = acked.query_map(params![endpoint.as_str(), upto, i64::from(limit)], |r| r.get::<_, String>(0))?;
    let ids = ids.collect::<rusqlite::Result<Vec<_>>>()?;
    let mut delivered = tx.prepare_cached(sql::ACK_DELIVERED)?;
    let mut attempt = tx.prepare_cached(sql::ACK_ATTEMPT)?;
    let mut rng = rand::rng();
    for id in &ids {
        delivered.execute(params![now, id])?;
        attempt.execute(params![new_id("att", now, &mut rng), now, id])?;
    }
    Ok(ids.len() as u64)
}

pub(super) fn purge(tx: &Transaction<'_>, delivered_before: Millis, dead_before: Millis, limit: u32) -> Result<u64> {
    let mut select = tx.prepare_cached(
        "SELECT id, tenant_id, event_id FROM deliveries WHERE (state = 'delivered' AND updated_at < ?1) \
         OR (state = 'dead' AND updated_at < ?2) LIMIT ?3",
    )?;
    let rows = select.query_map(params![delivered_before, dead_before, i64::from(limit)], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
    })?;
    let ids = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    let mut attempts = tx.prepare_cached("DELETE FROM attempts WHERE delivery_id = ?1")?;
    let mut deliveries = tx.prepare_cached("DELETE FROM deliveries WHERE id = ?1")?;
    for (id, _, _) in &ids {
        attempts.execute([id])?;
        deliveries.execute([id])?;
    }
    let mut events = tx.prepare_cached(
        "DELETE FROM events WHERE tenant_id = ?1 AND id = ?2 \
         AND NOT EXISTS (SELECT 1 FROM deliveries WHERE tenant_id = ?1 AND event_id = ?2)",
    )?;
    for (_, tenant, event) in &ids {
        events.execute([tenant, event])?;
    }
    // The audit log is kept as long as delivered work.
    let entries = tx.prepare_cached(audit::PURGE_AUDIT)?.execute(params![delivered_before, i64::from(limit)])?;
    // A full batch of either means there may be more.
    Ok(ids.len().max(entries) as u64)
}

#[cfg(test)]
mod tests {
    use super::super::SqliteStore;
    use super::*;

    /// The architecture test: a write that went to the pool instead of the writer thread
    /// would fail here, not queue for seconds behind group commits in production.
    #[tokio::test]
    async fn the_pool_cannot_write_and_the_store_writes_through_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("herald.db").display());
        let store = SqliteStore::open(&url, 2).await.unwrap();
        let refused = sqlx::query("INSERT INTO tenants (id, name, created_at) VALUES ('t1', 'x', 1)")
            .execute(&store.q.pool)
            .await
            .expect_err("the pool is read-only");
        assert!(refused.to_string().contains("readonly"), "{refused}");

        let tenant = Tenant { id: TenantId::parse("t1").unwrap(), name: "x".into(), created_at: 1 };
        store.create_tenant(&tenant).await.unwrap();
        let id = EndpointId::from_stored("ep_1");
        assert!(store.acquire_partition(&id, "node-a", 10, 20).await.unwrap());
        assert!(!store.acquire_partition(&id, "node-b", 11, 30).await.unwrap(), "held by node-a");
        assert_eq!(store.get_tenant(&tenant.id).await.unwrap().map(|t| t.name), Some("x".into()));
    }

    /// A fresh WAL is laid out in full before the first commit, so commits overwrite it
    /// instead of growing it; the store reads back what it wrote across a reopen.
    #[tokio::test]
    async fn a_fresh_wal_is_laid_out_before_the_first_commit() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("herald.db");
        let url = format!("sqlite://{}", db.display());
        let wal = dir.path().join("herald.db-wal");
        let store = SqliteStore::open(&url, 2).await.unwrap();
        let laid_out = std::fs::metadata(&wal).unwrap().len();
        assert!(laid_out >= 2000 * (4096 + 24), "a WAL of {laid_out} bytes");
        for i in 0..50 {
            let t = Tenant { id: TenantId::parse(&format!("t{i}")).unwrap(), name: "x".into(), created_at: i };
            store.create_tenant(&t).await.unwrap();
        }
        assert_eq!(std::fs::metadata(&wal).unwrap().len(), laid_out, "commits grew the WAL");
        drop(store);
        let store = SqliteStore::open(&url, 2).await.unwrap();
        let t49 = store.get_tenant(&TenantId::parse("t49").unwrap()).await.unwrap();
        assert_eq!(t49.map(|t| t.created_at), Some(49));
    }

    /// Every reader is open, idle, when the store is: a node's first fan-out (each
    /// partition reading its endpoint at once) does not wait for connections to open.
    #[tokio::test]
    async fn every_reader_is_open_before_the_first_read() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("herald.db").display());
        let store = SqliteStore::open(&url, 5).await.unwrap();
        assert_eq!((store.q.pool.size(), store.q.pool.num_idle()), (5, 5));
    }
}
