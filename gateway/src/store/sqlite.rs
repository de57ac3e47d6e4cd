//! The embedded SQLite store: WAL, one dedicated writer connection on its own thread (it
//! runs the group commits itself, see [`writer`]) and a pool of read-only readers. A commit
//! someone is answered for syncs to disk (`synchronous=FULL`); the engine's bookkeeping
//! rides the next such sync (see [`WriteOp::acknowledged`]).

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteQueryResult};

use super::queries::{self, Dialect, Queries, TurnStep};
use super::reads::HasReads;
use super::sql::{self, Sql};
use super::*;

pub struct SqliteStore {
    /// Reads, on sqlx's pool.
    q: Queries<Sqlite>,
    writer: writer::Writer,
}

mod checkpoint;
mod writer;
mod writes;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Settings of every connection to the file (the sqlx pool, the writer and its
/// checkpointer): durable commits, enforced references, a 64 MiB page cache.
///
/// The writer's cache has a cost that grows with it. When a B-tree split leaves its new
/// pages out of order, SQLite renumbers one for a moment to the page after the lock byte
/// (262,145 at 4 KiB pages). The end of that transaction then walks every cached page
/// (`pcache1TruncateUnsafe`): about 13% of the writer thread under load. A smaller writer
/// cache (8 MiB, 2 MiB) makes the walk shorter but costs as much again in page reads;
/// measured A/B with `herald-bench`, it was no faster. Avoiding the walk needs a page cache
/// of our own (`SQLITE_CONFIG_PCACHE2`, which is `unsafe`) or a patched SQLite.
const PRAGMAS: [(&str, &str); 4] =
    [("synchronous", "FULL"), ("foreign_keys", "ON"), ("temp_store", "MEMORY"), ("cache_size", "-65536")];
/// How long a connection waits for another one's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

impl SqliteStore {
    pub async fn open(url: &str, max_connections: u32) -> Result<Self> {
        if StoreKind::parse(url)? != StoreKind::Sqlite {
            return Err(StoreError::backend("not an SQLite URL"));
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
        MIGRATOR.run(&setup).await.map_err(|e| StoreError::backend(format!("migrations: {e}")))?;
        setup.close().await;
        let mut wal = options.get_filename().as_os_str().to_owned();
        wal.push("-wal");
        let wal = std::path::PathBuf::from(wal);
        checkpoint::preallocate_wal(&wal)?;
        let writer = writer::Writer::open(options.get_filename())?;
        // Every write runs on the writer thread. A write through the pool would wait for
        // the file's lock behind group commits (seconds under load); read-only, it fails.
        let readers = options.clone().create_if_missing(false).read_only(true);
        // Every reader is opened here, not by the first burst of reads: opening one takes
        // milliseconds, and a node's first fan-out (every partition reading its endpoint
        // at once) waited up to 30 ms for them before its first claim.
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .min_connections(max_connections)
            .connect_with(readers)
            .await?;
        Ok(SqliteStore { q: Queries { pool, wal: Some(wal) }, writer })
    }
}

/// Creates the database file, if missing, readable by its owner only (0600). It holds
/// token hashes, signing secrets and payloads; SQLite gives the `-wal` and `-shm` files it
/// creates the database file's permissions, so they are private too.
fn create_private(path: &std::path::Path) -> Result<()> {
    let mut open = private_file();
    open.create(true).truncate(false);
    open.open(path).map(drop).map_err(|e| StoreError::backend(format!("cannot create {}: {e}", path.display())))
}

/// Options that open a file for writing and create it readable by its owner only (0600),
/// as every file of the store is.
fn private_file() -> std::fs::OpenOptions {
    let mut open = std::fs::OpenOptions::new();
    open.write(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    open
}

impl HasReads for SqliteStore {
    fn reads(&self) -> &dyn Reads {
        &self.q
    }
}

#[async_trait]
impl Admin for SqliteStore {
    async fn create_tenant(&self, t: &Tenant) -> Result<()> {
        let t = t.clone();
        self.writer.audited(move |tx| writes::create_tenant(tx, &t)).await
    }

    async fn insert_token(&self, t: &TokenRecord) -> Result<()> {
        let t = t.clone();
        self.writer.audited(move |tx| writes::insert_token(tx, &t)).await
    }

    async fn revoke_token(&self, tenant: &TenantId, id: &str) -> Result<bool> {
        let (tenant, id) = (tenant.clone(), id.to_string());
        self.writer.audited(move |tx| writes::revoke_token(tx, &tenant, &id)).await
    }

    async fn touch_token(&self, hash: &str, at: Millis) -> Result<()> {
        let hash = hash.to_string();
        self.writer.run(move |tx| writes::touch_token(tx, &hash, at)).await
    }

    async fn insert_endpoint(&self, e: &Endpoint) -> Result<()> {
        let e = e.clone();
        self.writer.audited(move |tx| writes::insert_endpoint(tx, &e)).await
    }

    async fn update_endpoint(&self, e: &Endpoint) -> Result<bool> {
        let e = e.clone();
        self.writer.audited(move |tx| writes::update_endpoint(tx, &e)).await
    }

    async fn put_verification(&self, id: &EndpointId, v: &Verification) -> Result<bool> {
        let (id, v) = (id.clone(), v.clone());
        self.writer.audited(move |tx| writes::put_verification(tx, &id, &v)).await
    }

    async fn put_listener(&self, id: &EndpointId, node: &str) -> Result<bool> {
        let (id, node) = (id.clone(), node.to_string());
        self.writer.audited(move |tx| writes::put_listener(tx, &id, &node)).await
    }

    async fn delete_endpoint(&self, tenant: &TenantId, id: &EndpointId, now: Millis) -> Result<bool> {
        let (tenant, id) = (tenant.clone(), id.clone());
        self.writer.audited(move |tx| writes::delete_endpoint(tx, &tenant, &id, now)).await
    }

    async fn put_plugin_settings(&self, s: &StoredPluginSettings) -> Result<()> {
        let s = s.clone();
        self.writer.audited(move |tx| writes::put_plugin_settings(tx, &s)).await
    }

    async fn insert_event_type(&self, t: &EventType) -> Result<()> {
        let t = t.clone();
        self.writer.audited(move |tx| writes::insert_event_type(tx, &t)).await
    }

    async fn update_event_type(&self, t: &EventType, prior_version: i64) -> Result<bool> {
        let t = t.clone();
        self.writer.audited(move |tx| writes::update_event_type(tx, &t, prior_version)).await
    }

    async fn delete_event_type(&self, owner: &CatalogOwner, name: &str) -> Result<bool> {
        let (owner, name) = (owner.clone(), name.to_string());
        self.writer.audited(move |tx| writes::delete_event_type(tx, &owner, &name)).await
    }

    async fn put_tenant_settings(&self, tenant: &TenantId, settings: TenantSettings, at: Millis) -> Result<()> {
        let tenant = tenant.clone();
        self.writer.audited(move |tx| writes::put_tenant_settings(tx, &tenant, settings, at)).await
    }

    async fn insert_portal_session(&self, session: &PortalSession, code_hash: &str) -> Result<()> {
        let (session, code_hash) = (session.clone(), code_hash.to_string());
        self.writer.audited(move |tx| writes::insert_portal_session(tx, &session, &code_hash)).await
    }

    async fn exchange_portal_code(&self, code_hash: &str, token_hash: &str, now: Millis) -> Result<bool> {
        let (code_hash, token_hash) = (code_hash.to_string(), token_hash.to_string());
        self.writer.audited(move |tx| writes::exchange_portal_code(tx, &code_hash, &token_hash, now)).await
    }

    async fn revoke_portal_session(&self, tenant: &TenantId, id: &str, now: Millis) -> Result<bool> {
        let (tenant, id) = (tenant.clone(), id.to_string());
        self.writer.audited(move |tx| writes::revoke_portal_session(tx, &tenant, &id, now)).await
    }

    async fn put_branding(&self, tenant: &TenantId, branding: &Branding, at: Millis) -> Result<()> {
        let (tenant, branding) = (tenant.clone(), branding.clone());
        self.writer.audited(move |tx| writes::put_branding(tx, &tenant, &branding, at)).await
    }

    async fn create_replay(&self, r: &Replay) -> Result<()> {
        let r = r.clone();
        self.writer.audited(move |tx| writes::create_replay(tx, &r)).await
    }

    async fn record_audit(&self, entry: &AuditEntry) -> Result<()> {
        let entry = entry.clone();
        self.writer.run(move |tx| audit::insert_sqlite(tx, &entry)).await
    }

    async fn replay_turn(&self, replay_id: &str, now: Millis, ttl_ms: i64) -> Result<ReplayTurn> {
        // Planned by reads; the writes apply only if nothing moved since (see each).
        let mut conn = self.q.pool.acquire().await?;
        let step = Queries::<Sqlite>::plan_turn(&mut conn, replay_id, "", now).await?;
        drop(conn);
        let (replay, picked) = match step {
            TurnStep::Ended => return Ok(ReplayTurn::Ended),
            TurnStep::NotYet(at) => return Ok(ReplayTurn::NotYet(at)),
            TurnStep::Done => {
                let id = replay_id.to_string();
                return match self.writer.run(move |tx| writes::replay_done(tx, &id, now)).await? {
                    true => Ok(ReplayTurn::Ended),
                    // Cancelled, or something it re-queued came back meanwhile.
                    false => Ok(ReplayTurn::NotYet(now + SETTLE_CHECK_MS)),
                };
            }
            TurnStep::Requeue(replay, picked) => (*replay, picked),
        };
        let (due, next_due) = replay.schedule(now, picked.requeue.len());
        let cursor = picked.cursor.unwrap_or_else(|| replay.cursor.clone());
        let picked = picked.requeue;
        let step = writes::ReplayStep { replay, picked, cursor, due, next_due, now, deadline: now + ttl_ms };
        let (applied, step) = self.writer.run(move |tx| Ok((writes::replay_step(tx, &step)?, step))).await?;
        if !applied {
            // Cancelled, or another turn moved the cursor first: read it again.
            return Ok(ReplayTurn::NotYet(now));
        }
        let n = step.picked.len() as u32;
        Ok(queries::requeued(step.picked.into_iter().map(|(_, e)| e).collect(), n, next_due))
    }

    async fn cancel_replay(&self, tenant: &TenantId, id: &str, now: Millis) -> Result<Option<Vec<EndpointId>>> {
        let (tenant, id) = (tenant.clone(), id.to_string());
        self.writer.audited(move |tx| writes::cancel_replay(tx, &tenant, &id, now)).await
    }

    async fn ack_polled(&self, endpoint: &EndpointId, upto: i64, now: Millis, limit: u32) -> Result<u64> {
        let endpoint = endpoint.clone();
        self.writer.run(move |tx| writes::ack_polled(tx, &endpoint, upto, now, limit)).await
    }
}

#[async_trait]
impl Engine for SqliteStore {
    async fn release_partitions(&self, owner: Option<&str>) -> Result<u64> {
        let owner = owner.map(str::to_owned);
        self.writer.run(move |tx| writes::release_partitions(tx, owner.as_deref())).await
    }

    async fn subscribe(&self) -> Result<Option<tokio::sync::mpsc::Receiver<Notice>>> {
        Ok(None)
    }

    async fn announce_changed(&self, _endpoints: &[EndpointId]) -> Result<()> {
        Ok(())
    }

    async fn apply(&self, ops: Vec<WriteOp>) -> Result<Vec<WriteResult>> {
        self.writer.apply(ops).await
    }

    fn commit_sink(&self, max_batch: usize) -> Option<Arc<dyn CommitSink>> {
        Some(self.writer.sink(max_batch))
    }

    fn hand_off(&self, handoff: Arc<dyn Handoff>) {
        self.writer.hand_off(handoff);
    }
}

#[async_trait]
impl Housekeeping for SqliteStore {
    async fn recover_leases(&self, expired_before: Millis, now: Millis) -> Result<u64> {
        self.writer.run(move |tx| writes::recover_leases(tx, expired_before, now)).await
    }

    async fn recover_leases_of(&self, owner: &str, now: Millis) -> Result<u64> {
        let owner = owner.to_owned();
        self.writer.run(move |tx| writes::recover_leases_of(tx, &owner, now)).await
    }

    async fn end_timed_pauses(&self, now: Millis) -> Result<Vec<(TenantId, EndpointId)>> {
        self.writer.run(move |tx| writes::end_timed_pauses(tx, now)).await
    }

    async fn purge(&self, delivered_before: Millis, dead_before: Millis, limit: u32) -> Result<u64> {
        self.writer.run(move |tx| writes::purge(tx, delivered_before, dead_before, limit)).await
    }
}

impl Dialect for Sqlite {
    /// One bound parameter per id.
    fn push_ids<'a>(q: &mut Sql<'a, Sqlite>, ids: &'a [String]) {
        q.push(" AND deliveries.id IN (");
        for (i, id) in ids.iter().enumerate() {
            q.push(if i == 0 { "" } else { ", " }).push_bind(id.as_str());
        }
        q.push(")");
    }

    fn push_one_of<'a>(q: &mut Sql<'a, Sqlite>, column: &str, ids: &'a [String]) {
        q.push(format_args!("{column} IN (SELECT value FROM json_each(")).push_bind(queries::json(&ids)).push("))");
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    const NEXT_DUE: &'static str = sql::NEXT_DUE_SQLITE;
    const SEQ: &'static str = "rowid";

    fn json_text(column: &str, path: &[&str]) -> String {
        format!("json_extract({column}, '$.{}')", path.join("."))
    }
}
