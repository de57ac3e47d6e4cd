//! The SQLite writer: one connection, on its own thread, runs each group commit as one
//! synchronous `BEGIN IMMEDIATE … COMMIT` with cached prepared statements.
//!
//! Why not sqlx here: its SQLite driver hops to a worker thread for every statement and
//! every returned row, and binds arguments as boxed values. A commit of a few hundred ops
//! spent most of its time in those hops (measured: 68 µs per recorded attempt, of which
//! SQLite's own work was a fraction). Here a whole commit is one hop, and each row is one
//! step of a prepared statement, so the writes are plain single-row statements.
//! Reads stay on sqlx's pool; WAL lets them run beside the writer.
//!
//! The thread (`writer/thread.rs`: rusqlite, cached single-row statements, one thread hop
//! each way per commit) also runs every other SQLite write (tenants, tokens, endpoint CRUD,
//! lease recovery, replays, retention: `sqlite/writes.rs`), each in a transaction of its own
//! between group commits; nothing writes through sqlx's pool, which SQLite opens read-only,
//! every connection at start (a fresh node's first reads do not wait for connections to
//! open). Attempt results alone (`WriteOp::can_wait`) wait for the next intake commit when
//! one is due soon (two of the usual gaps, at most 10 ms), so at moderate rates it carries
//! them and a crash repeats only about two commits' worth. A checkpointer thread
//! (`checkpoint.rs`) copies the WAL back off the writer's path; a missing WAL is laid out in
//! zeros at open (2,000 frames), so the commits that fill it overwrite the file instead of
//! growing it (no inode write per sync). The bundled SQLite is built with the flags in
//! `.cargo/config.toml` (`fdatasync`, no memory statistics).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, mpsc};

use rand::SeedableRng;
use rand::rngs::StdRng;
use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior, params};
use tokio::sync::oneshot;

use super::super::audit::{self, Changed};
use super::super::rows::stored_filter;
use super::super::sql;
use super::super::*;
use super::checkpoint::{WAL_RESTART_FRAMES, connect, spawn_checkpointer};
use crate::model::{DeliveryOrder, FannedOut, Subscriber, fan_out};
use thread::{Sink, Thread, Work};

mod thread;

/// One transaction for the writer thread to run; it answers its caller itself.
type Job = Box<dyn FnOnce(&mut Connection, &mut StdRng) + Send>;

/// Handle to the writer thread; the thread ends when every handle (and sink) is dropped.
pub(super) struct Writer {
    work: mpsc::Sender<Work>,
    /// Ops per group commit, at most (set by [`Writer::sink`]).
    max_batch: Arc<AtomicUsize>,
    /// Set by [`Writer::hand_off`]; read by the thread for each intake commit.
    handoff: Arc<OnceLock<Arc<dyn Handoff>>>,
}

impl Writer {
    /// Opens the writer connection on `path` (already migrated) and starts its thread.
    pub(super) fn open(path: &Path) -> Result<Writer> {
        let conn = connect(path)?;
        // The checkpointer thread copies the WAL back as it grows; the writer checkpoints
        // inline only past this size, when little is left to copy, so that its next
        // transaction can start the WAL over (only a writer can, and only once all of it
        // is copied), keeping the file bounded under sustained load.
        conn.pragma_update_and_check(None, "wal_autocheckpoint", WAL_RESTART_FRAMES, |r| r.get::<_, i64>(0))?;
        conn.set_prepared_statement_cache_capacity(32);
        let dirty = spawn_checkpointer(path)?;
        let (work, rx) = mpsc::channel::<Work>();
        let max_batch = Arc::new(AtomicUsize::new(1024));
        let handoff = Arc::new(OnceLock::new());
        let rng = StdRng::from_rng(&mut rand::rng());
        let acknowledged = Default::default();
        let thread = Thread { conn, rng, durable: None, dirty, rx, handoff: handoff.clone(), acknowledged };
        let limit = max_batch.clone();
        std::thread::Builder::new()
            .name("herald-sqlite-writer".into())
            .spawn(move || thread.run(&limit))
            .map_err(|e| StoreError::backend(format!("cannot start the SQLite writer thread: {e}")))?;
        Ok(Writer { work, max_batch, handoff })
    }

    /// The group committer's queue: writes go straight to the writer thread, which folds
    /// whatever is waiting (up to `max_batch` ops) into one commit and answers each caller.
    pub(super) fn sink(&self, max_batch: usize) -> Arc<dyn CommitSink> {
        self.max_batch.store(max_batch.max(1), Ordering::Relaxed);
        Arc::new(Sink(self.work.clone()))
    }

    /// Applies `ops` in one transaction, in order; all of them commit or none does.
    pub(super) async fn apply(&self, ops: Vec<WriteOp>) -> Result<Vec<WriteResult>> {
        let handoff = self.handoff.clone();
        self.job(move |conn, rng| transaction(conn, ops, rng, handoff.get().map(|h| &**h))).await
    }

    /// From now on, intake commits lease new deliveries to the partitions `handoff` names
    /// (see [`Engine::hand_off`](crate::store::Engine::hand_off)); set once, by the engine.
    pub(super) fn hand_off(&self, handoff: Arc<dyn Handoff>) {
        if self.handoff.set(handoff).is_err() {
            tracing::warn!("the SQLite writer already hands deliveries off to an engine");
        }
    }

    /// Runs `write` in a transaction of its own on the writer thread, between group
    /// commits: no other connection writes to the file, so nothing waits for its lock.
    /// Like every job, it is on disk before it answers.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        write: impl FnOnce(&Transaction<'_>) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.job(move |conn, _| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = write(&tx)?;
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    /// [`Writer::run`] for a write through the API: the request's pending audit entry
    /// (see [`audit`](super::super::audit)) is inserted before the `COMMIT` when the write
    /// changed something, and marked written once committed.
    pub(super) async fn audited<T: Changed + Send + 'static>(
        &self,
        write: impl FnOnce(&Transaction<'_>) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let entry = audit::pending();
        let (out, logged) = self
            .run(move |tx| {
                let out = write(tx)?;
                let entry = entry.filter(|_| out.changed());
                if let Some(e) = &entry {
                    audit::insert_sqlite(tx, e)?;
                }
                Ok((out, entry.is_some()))
            })
            .await?;
        if logged {
            audit::written();
        }
        Ok(out)
    }

    async fn job<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection, &mut StdRng) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let stopped = || StoreError::backend("the SQLite writer thread stopped");
        let (reply, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn, rng| {
            let _ = reply.send(work(conn, rng));
        });
        self.work.send(Work::Job(job)).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        match &e {
            rusqlite::Error::SqliteFailure(f, Some(msg))
                if f.code == ErrorCode::ConstraintViolation
                    && matches!(
                        f.extended_code,
                        rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                    ) =>
            {
                // "UNIQUE constraint failed: tenants.id" (or "events.tenant_id, events.id").
                let table = msg.split_once(": ").and_then(|(_, cols)| cols.split('.').next());
                StoreError::unique_violation(table, msg)
            }
            _ => StoreError::from_driver(e),
        }
    }
}

/// A failed op rolls the whole transaction back (the `Transaction` drop does it). A claim
/// under a partition lease that found nothing else due is told to the engine (see
/// `Handoff::claimed`) as it is applied, so the intake ops after it in the same commit
/// already hand their deliveries over (if that commit fails, the claim answers with the
/// error, and the partition closes and claims again).
fn transaction(
    conn: &mut Connection,
    ops: Vec<WriteOp>,
    rng: &mut StdRng,
    handoff: Option<&dyn Handoff>,
) -> Result<Vec<WriteResult>> {
    let started = std::time::Instant::now();
    let n = ops.len();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut subscribers = Subscribers::default();
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        let seq = next_op_seq();
        results.push(match op {
            WriteOp::Ingest(events) => {
                let mut outcomes = ingest(&tx, events, &mut subscribers, rng, handoff)?;
                outcomes.iter_mut().for_each(|o| o.seq = seq);
                WriteResult::Ingest(outcomes)
            }
            WriteOp::Claim(req) => {
                let (batch, seen_all) = claim(&tx, &req)?;
                if let (Some(handoff), true) = (handoff, seen_all) {
                    handoff.claimed(req.endpoint.as_str(), seq, batch.claimed.len());
                }
                WriteResult::Claim(batch)
            }
            WriteOp::Record(rs) => WriteResult::Record(record(&tx, rs)?),
            WriteOp::Release(rs) => {
                release(&tx, rs)?;
                WriteResult::Release
            }
            WriteOp::Endpoint(change) => {
                // Fan-out reads endpoint states: forget what this commit read so far.
                subscribers = Subscribers::default();
                WriteResult::Endpoint(change_endpoint(&tx, change)?)
            }
            WriteOp::Partition(lease) => WriteResult::Partition(partition(&tx, lease)?),
            WriteOp::Audit(entry) => {
                // The request's own op comes just before its entry (see `WriteOp::Audit`).
                let changed = results.last().is_some_and(WriteResult::changed);
                if changed {
                    audit::insert_sqlite(&tx, &entry)?;
                }
                WriteResult::Audit(changed)
            }
        });
    }
    let applied = started.elapsed();
    tx.commit()?;
    tracing::trace!(
        ops = n,
        apply_micros = applied.as_micros() as u64,
        commit_micros = (started.elapsed() - applied).as_micros() as u64,
        "sqlite transaction"
    );
    Ok(results)
}

/// Per tenant, the endpoints intake fans out to (id and type filter), read once per commit.
#[derive(Default)]
struct Subscribers(HashMap<String, Vec<Subscriber>>);

impl Subscribers {
    fn of(&mut self, tx: &Transaction<'_>, tenant: &TenantId) -> Result<&[Subscriber]> {
        if !self.0.contains_key(tenant.as_str()) {
            let mut q = tx.prepare_cached(sql::SUBSCRIBERS_OF_TENANT)?;
            let rows = q.query_map([tenant.as_str()], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, Option<String>>(3)?,
                    r.get::<_, bool>(4)?,
                ))
            })?;
            let mut eps = Vec::new();
            for row in rows {
                let (id, types, ordering, filter, pull) = row?;
                let types = serde_json::from_str(&types)
                    .map_err(|e| StoreError::backend(format!("endpoint {id}: event_types: {e}")))?;
                eps.push(Subscriber {
                    filter: stored_filter(&id, filter.as_deref())?,
                    endpoint: id,
                    event_types: types,
                    ordering: DeliveryOrder::from_stored(ordering.as_deref()),
                    pull,
                });
            }
            self.0.insert(tenant.to_string(), eps);
        }
        Ok(&self.0[tenant.as_str()])
    }
}

/// Stores new events and fans each out to the tenant's subscribed endpoints. A (tenant,
/// id) already stored, even earlier in this same commit, is a duplicate: nothing is written
/// and it answers with the deliveries the first one got. If its type or payload differ, the
/// op is refused whole: a savepoint takes back what it wrote.
fn ingest(
    tx: &Transaction<'_>,
    events: Vec<NewEvent>,
    subscribers: &mut Subscribers,
    rng: &mut StdRng,
    handoff: Option<&dyn Handoff>,
) -> Result<Vec<IngestOutcome>> {
    // A lone event's conflict is found before it writes anything: only a batch needs the
    // savepoint (two statements per request on the writer's hot path otherwise).
    let guarded = events.len() > 1;
    if guarded {
        tx.prepare_cached("SAVEPOINT ingest")?.execute([])?;
    }
    let out = match ingest_op(tx, &events, subscribers, rng, handoff)? {
        Ok(out) => out,
        Err(at) => {
            if guarded {
                tx.prepare_cached("ROLLBACK TO ingest")?.execute([])?;
            }
            IngestOutcome::refused(events.len(), at)
        }
    };
    if guarded {
        tx.prepare_cached("RELEASE ingest")?.execute([])?;
    }
    Ok(out)
}

/// [`ingest`] inside its savepoint: `Err(i)` when event `i` conflicts with a stored one.
/// A new delivery whose endpoint's partition takes it here (`handoff`) is stored leased to
/// it, as a claim would leave it, and comes back with the outcome.
fn ingest_op(
    tx: &Transaction<'_>,
    events: &[NewEvent],
    subscribers: &mut Subscribers,
    rng: &mut StdRng,
    handoff: Option<&dyn Handoff>,
) -> Result<std::result::Result<Vec<IngestOutcome>, usize>> {
    let mut write = IngestStatements::prepare(tx)?;
    let mut out = Vec::with_capacity(events.len());
    for (i, ev) in events.iter().enumerate() {
        if !write.event(ev)? {
            match write.repeat(ev)? {
                Some(duplicate) => out.push(duplicate),
                None => return Ok(Err(i)),
            }
            continue;
        }
        let (mut queued, mut leased) = (Vec::new(), Vec::new());
        for FannedOut { id, endpoint, ordering_key, pull } in fan_out(ev, subscribers.of(tx, &ev.tenant)?, rng) {
            // An ordered delivery waits for its turn in the store: only a claim knows
            // whether it heads its key. A pulled one is never leased (its partition never
            // opens), and stored never due.
            let handoff = handoff.filter(|_| ordering_key.is_none() && !pull);
            match handoff.and_then(|h| Some((h.owner(), h.lease(endpoint, ev.created_at)?))) {
                Some((owner, until)) => {
                    write.leased(ev, &id, endpoint, owner, until)?;
                    leased.push((EndpointId::from_stored(endpoint), Claimed::new_leased(id, ev)));
                }
                None => {
                    write.queued(ev, &id, endpoint, ordering_key, pull)?;
                    queued.push(EndpointId::from_stored(endpoint));
                }
            }
        }
        out.push(IngestOutcome::stored_leased(queued, leased));
    }
    Ok(Ok(out))
}

/// The statements of [`ingest_op`], prepared once per op (and cached across ops).
struct IngestStatements<'tx> {
    event: rusqlite::CachedStatement<'tx>,
    queued: rusqlite::CachedStatement<'tx>,
    leased: rusqlite::CachedStatement<'tx>,
    count: rusqlite::CachedStatement<'tx>,
    stored: rusqlite::CachedStatement<'tx>,
}

impl<'tx> IngestStatements<'tx> {
    fn prepare(tx: &'tx Transaction<'_>) -> Result<Self> {
        Ok(Self {
            event: tx.prepare_cached(
                "INSERT INTO events (tenant_id, id, type, payload, created_at, expires_at, fingerprint, traceparent, \
                 tracestate, schema_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT DO NOTHING",
            )?,
            queued: tx.prepare_cached(
                "INSERT INTO deliveries (id, tenant_id, event_id, endpoint_id, event_type, state, attempts, \
                 next_attempt_at, created_at, updated_at, ordering_key) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'queued', 0, CASE WHEN ?8 THEN NULL ELSE ?6 END, ?6, ?6, ?7)",
            )?,
            leased: tx.prepare_cached(
                "INSERT INTO deliveries (id, tenant_id, event_id, endpoint_id, event_type, state, attempts, \
                 next_attempt_at, lease_owner, lease_until, fence, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'delivering', 0, ?6, ?7, ?8, 1, ?6, ?6)",
            )?,
            count: tx.prepare_cached("SELECT COUNT(*) FROM deliveries WHERE tenant_id = ?1 AND event_id = ?2")?,
            stored: tx.prepare_cached(
                "SELECT fingerprint, CASE WHEN fingerprint IS NULL THEN type END, \
                 CASE WHEN fingerprint IS NULL THEN payload END FROM events WHERE tenant_id = ?1 AND id = ?2",
            )?,
        })
    }

    /// Inserts the event; false when its (tenant, id) is stored already.
    fn event(&mut self, ev: &NewEvent) -> Result<bool> {
        let inserted = self.event.execute(params![
            ev.tenant.as_str(),
            ev.id.as_str(),
            ev.event_type,
            ev.payload,
            ev.created_at,
            ev.expires_at,
            ev.fingerprint,
            ev.trace.as_ref().map(TraceContext::traceparent),
            ev.trace.as_ref().and_then(|t| t.state.as_deref()),
            ev.schema_version
        ])?;
        Ok(inserted != 0)
    }

    /// An event whose (tenant, id) is stored: a duplicate, with the deliveries the stored
    /// one got, or `None` when its type or payload differ.
    fn repeat(&mut self, ev: &NewEvent) -> Result<Option<IngestOutcome>> {
        let key = params![ev.tenant.as_str(), ev.id.as_str()];
        let (fingerprint, event_type, payload) = self.stored.query_row(key, |r| {
            Ok((r.get::<_, Option<String>>(0)?, r.get::<_, Option<String>>(1)?, r.get::<_, Option<String>>(2)?))
        })?;
        if crate::store::stored_fingerprint(fingerprint, event_type, payload) != ev.fingerprint {
            return Ok(None);
        }
        let n: i64 = self.count.query_row(key, |r| r.get(0))?;
        Ok(Some(IngestOutcome::duplicate(n as u32)))
    }

    /// Stores a delivery of `ev` queued for a claim; `pull`: never due, for a consumer to
    /// read (kind `poll`).
    fn queued(
        &mut self,
        ev: &NewEvent,
        id: &DeliveryId,
        endpoint: &str,
        ordering_key: Option<&str>,
        pull: bool,
    ) -> Result<()> {
        self.queued.execute(params![
            id.as_str(),
            ev.tenant.as_str(),
            ev.id.as_str(),
            endpoint,
            ev.event_type,
            ev.created_at,
            ordering_key,
            pull
        ])?;
        Ok(())
    }

    /// Stores a delivery of `ev` leased to `owner`'s partition of its endpoint until `until`.
    fn leased(&mut self, ev: &NewEvent, id: &DeliveryId, endpoint: &str, owner: &str, until: Millis) -> Result<()> {
        self.leased.execute(params![
            id.as_str(),
            ev.tenant.as_str(),
            ev.id.as_str(),
            endpoint,
            ev.event_type,
            ev.created_at,
            owner,
            until
        ])?;
        Ok(())
    }
}

/// Leases up to `limit` due deliveries of one endpoint, oldest due first, bumping each
/// one's fence: of its unordered deliveries and its keys' heads, each read apart
/// (`sql::keyless`, `sql::heads`: a deep key costs what a shallow one does). The writer holds the write lock, so nothing changes between read and write.
/// Also says whether a claim under the partition lease took all that was due, the lease
/// held.
fn claim(tx: &Transaction<'_>, req: &ClaimRequest) -> Result<(ClaimBatch, bool)> {
    let mut select = tx.prepare_cached(concat!(
        "SELECT d.rowid, d.id, d.tenant_id, d.event_id, d.event_type, d.attempts, d.attempt_base, d.deadline, \
         d.fence, e.payload, e.created_at, e.expires_at, d.replay_id, e.traceparent, e.tracestate, \
         e.schema_version FROM deliveries d \
         JOIN events e ON e.tenant_id = d.tenant_id AND e.id = d.event_id \
         WHERE d.rowid IN (SELECT u.r FROM (SELECT f.r, f.at, f.id FROM (",
        sql::keyless!("d.rowid AS r, d.next_attempt_at AS at, d.id", "?1"),
        " AND d.next_attempt_at <= ?2 ORDER BY d.ordering_key, d.next_attempt_at, d.id LIMIT ?3) f \
         UNION ALL SELECT d.rowid, d.next_attempt_at, d.id FROM deliveries d WHERE d.rowid IN (",
        sql::heads!("rowid", "rowid", "?1", "?6"),
        ") AND d.state IN ('queued', 'waiting') AND d.next_attempt_at <= ?2) u ORDER BY u.at, u.id LIMIT ?3) \
         AND (NOT ?4 OR EXISTS (SELECT 1 FROM partitions p WHERE p.endpoint_id = ?1 AND p.owner = ?5 \
         AND p.lease_until >= ?2)) ORDER BY d.next_attempt_at, d.id"
    ))?;
    let args = params![
        req.endpoint.as_str(),
        req.now,
        i64::from(req.limit),
        req.in_partition,
        req.owner,
        req.dead_heads_block
    ];
    let rows = select.query_map(args, claimed_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
    let mut lease = tx.prepare_cached(
        "UPDATE deliveries SET state = 'delivering', lease_owner = ?1, lease_until = ?2, fence = ?3, \
         updated_at = ?4 WHERE rowid = ?5",
    )?;
    let mut claimed = Vec::with_capacity(rows.len());
    for (rowid, c) in rows {
        lease.execute(params![req.owner, req.lease_until, c.fence, req.now, rowid])?;
        claimed.push(c);
    }
    let short = claimed.len() < req.limit as usize;
    let next_due = match short {
        true => tx
            .prepare_cached(sql::NEXT_DUE_SQLITE)?
            .query_row(params![req.endpoint.as_str(), req.dead_heads_block], |r| r.get(0))?,
        false => None,
    };
    let seen_all = short && req.in_partition && holds_partition(tx, req)?;
    Ok((ClaimBatch { claimed, next_due }, seen_all))
}

/// A due delivery as [`claim`] leases it (its fence bumped), with its rowid.
fn claimed_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(i64, Claimed)> {
    let claimed = Claimed {
        id: DeliveryId::from_stored(r.get::<_, String>(1)?),
        tenant: TenantId::from_stored(r.get::<_, String>(2)?),
        event_id: EventId::from_stored(r.get::<_, String>(3)?),
        event_type: r.get(4)?,
        attempts: r.get::<_, i64>(5)? as u32,
        attempt_base: r.get::<_, i64>(6)? as u32,
        deadline: r.get(7)?,
        fence: r.get::<_, i64>(8)? + 1,
        payload: r.get(9)?,
        event_created_at: r.get(10)?,
        expires_at: r.get(11)?,
        replay: r.get(12)?,
        trace: stored_trace(r.get(13)?, r.get(14)?),
        schema_version: r.get(15)?,
    };
    Ok((r.get::<_, i64>(0)?, claimed))
}

/// Whether the claim's owner holds the partition lease of its endpoint now.
fn holds_partition(tx: &Transaction<'_>, req: &ClaimRequest) -> Result<bool> {
    let mut held = tx.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM partitions WHERE endpoint_id = ?1 AND owner = ?2 AND lease_until >= ?3)",
    )?;
    Ok(held.query_row(params![req.endpoint.as_str(), req.owner, req.now], |r| r.get::<_, bool>(0))?)
}

/// Records attempt results; a result applies only while its fence still matches and the
/// delivery is still leased, so a second result for one lease (in this commit or a later
/// one) is refused. A first-time success's attempt goes into the delivery's row
/// ([`AttemptResult::kept_in_delivery`]), any other into `attempts`. Returns, per result, the state it settled in (`None`: refused).
fn record(tx: &Transaction<'_>, results: Vec<AttemptResult>) -> Result<Vec<Option<DeliveryState>>> {
    let unfinished = "?3 IN ('waiting', 'queued')"; // DeliveryState::is_unfinished
    let settled = sql::settle("deliveries", "?3");
    let mut update = tx.prepare_cached(&format!(
        "UPDATE deliveries SET state = CASE WHEN {unfinished} THEN {settled} ELSE ?3 END, \
         attempts = ?4, next_attempt_at = ?5, \
         reason = CASE WHEN {unfinished} AND {settled} = 'dead' THEN 'endpoint_disabled' ELSE ?6 END, \
         last_status = ?7, last_error = ?8, lease_owner = NULL, lease_until = NULL, updated_at = ?9, \
         first_attempt_id = ?10, first_started_at = ?11, first_duration_ms = ?12, first_response_body = ?13, \
         first_verdict = ?14, first_decided_by = ?15, first_request_headers = ?16, first_request_body = ?17, \
         first_request_body_size = ?18 WHERE id = ?1 AND fence = ?2 AND state = 'delivering'"
    ))?;
    let mut insert = tx.prepare_cached(INSERT_ATTEMPT)?;
    // Only an unfinished result can settle otherwise than asked: read back what it became.
    let mut settled_as = tx.prepare_cached("SELECT state FROM deliveries WHERE id = ?1")?;
    let mut accepted = Vec::with_capacity(results.len());
    for r in &results {
        let a = &r.attempt;
        // A first-time success is kept in the delivery's row: its columns, or all NULL.
        let kept = r.kept_in_delivery().then_some(a);
        let sent = kept.and_then(|a| a.request.as_ref());
        let updated = update.execute(params![
            r.delivery.as_str(),
            r.fence,
            r.state.as_str(),
            i64::from(a.number),
            r.next_attempt_at,
            r.reason,
            a.status.map(i64::from),
            a.error,
            a.started_at + a.duration_ms as i64,
            kept.map(|a| a.id.as_str()),
            kept.map(|a| a.started_at),
            kept.map(|a| a.duration_ms as i64),
            kept.and_then(|a| a.response_body.as_deref()),
            kept.map(|a| a.verdict.as_str()),
            kept.map(|a| a.decided_by.as_str()),
            sent.map(|r| r.headers_json.as_str()),
            sent.and_then(|r| r.body.as_deref()),
            sent.map(|r| r.body_size as i64)
        ])?;
        if updated == 0 {
            accepted.push(None);
            continue;
        }
        if kept.is_none() {
            insert_attempt(&mut insert, a)?;
        }
        let state = match r.state.is_unfinished() {
            true => super::super::rows::delivery_state(
                &settled_as.query_row(params![r.delivery.as_str()], |row| row.get::<_, String>(0))?,
            )?,
            false => r.state,
        };
        accepted.push(Some(state));
    }
    Ok(accepted)
}

/// An attempt, with the endpoint read back from the delivery's row just updated (a page
/// in cache), not with `RETURNING`, which builds and frees a temporary table on every
/// execution.
const INSERT_ATTEMPT: &str = "INSERT INTO attempts (id, delivery_id, number, started_at, duration_ms, status, \
     response_body, error, verdict, decided_by, endpoint_id, request_headers, request_body, request_body_size) \
     SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, endpoint_id, ?11, ?12, ?13 FROM deliveries WHERE id = ?2";

/// Stores the attempt of a result [`record`] accepted, with [`INSERT_ATTEMPT`].
fn insert_attempt(insert: &mut rusqlite::CachedStatement<'_>, a: &Attempt) -> Result<()> {
    insert.execute(params![
        a.id,
        a.delivery_id.as_str(),
        i64::from(a.number),
        a.started_at,
        a.duration_ms as i64,
        a.status.map(i64::from),
        a.response_body,
        a.error,
        a.verdict,
        a.decided_by,
        a.request.as_ref().map(|r| r.headers_json.as_str()),
        a.request.as_ref().and_then(|r| r.body.as_deref()),
        a.request.as_ref().map(|r| r.body_size as i64)
    ])?;
    Ok(())
}

/// Takes, renews or gives up a partition lease; true when `owner` holds it afterwards.
fn partition(tx: &Transaction<'_>, lease: PartitionLease) -> Result<bool> {
    let (id, owner) = (lease.endpoint.as_str(), lease.owner.as_str());
    let Some(until) = lease.until else {
        tx.prepare_cached(sql::RELEASE_PARTITION)?.execute(params![id, owner])?;
        return Ok(false);
    };
    let taken = tx.prepare_cached(sql::TAKE_PARTITION)?.execute(params![id, owner, until, lease.now])?;
    Ok(taken == 1)
}

/// Hands claimed-but-unsent deliveries back, due at their `next_attempt_at`; those of a
/// replay cancelled meanwhile are dead letters again, as they were.
fn release(tx: &Transaction<'_>, releases: Vec<Release>) -> Result<()> {
    let settled = sql::settle("deliveries", "'waiting'");
    let mut update = tx.prepare_cached(&format!(
        "UPDATE deliveries SET state = {settled}, next_attempt_at = ?1, lease_owner = NULL, lease_until = NULL, \
         reason = CASE WHEN {settled} = 'dead' THEN 'endpoint_disabled' END \
         WHERE id = ?2 AND fence = ?3 AND state = 'delivering'"
    ))?;
    let mut returned = tx.prepare_cached(&sql::return_unsent("id = $2 AND replay_id IS NOT NULL"))?;
    for r in releases {
        if update.execute(params![r.next_attempt_at, r.delivery.as_str(), r.fence])? == 1 {
            returned.execute(params![r.next_attempt_at, r.delivery.as_str()])?;
        }
    }
    Ok(())
}

/// Changes an endpoint's state and moves its waiting deliveries along: dead when it is
/// disabled, paused when a human must look, waiting again when it is re-enabled.
fn change_endpoint(tx: &Transaction<'_>, c: EndpointChange) -> Result<u64> {
    let now = c.now;
    let id = c.endpoint.as_str();
    if c.state == Some(EndpointState::Active) {
        tx.prepare_cached(sql::DUE_AT_LIFTED_PAUSE)?.execute(params![now, id])?;
    }
    if let Some(state) = c.state {
        tx.prepare_cached(sql::CHANGE_ENDPOINT_STATE)?.execute(params![
            now,
            state.as_str(),
            c.reason,
            c.paused_until,
            c.by.as_str(),
            id
        ])?;
    } else {
        tx.prepare_cached("UPDATE endpoints SET updated_at = ?1 WHERE id = ?2")?.execute(params![now, id])?;
    }
    if c.failing_since.changes() {
        let since = c.failing_since.since();
        tx.prepare_cached("UPDATE endpoints SET failing_since = ?1 WHERE id = ?2")?.execute(params![since, id])?;
    }
    let cascade = match (c.state, c.paused_until) {
        (None, _) | (Some(EndpointState::Paused), Some(_)) => return Ok(0),
        (Some(EndpointState::Disabled), _) => sql::DEAD_ON_DISABLED_ENDPOINT,
        (Some(EndpointState::Paused), None) => sql::PAUSE_DELIVERIES,
        (Some(EndpointState::Active), _) => sql::RESUME_DELIVERIES,
    };
    Ok(tx.prepare_cached(cascade)?.execute(params![now, id])? as u64)
}
