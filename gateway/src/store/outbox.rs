//! The producer's side of the transactional outbox: the SQL the relay (`crate::outbox`)
//! runs against a producer's Postgres database. Reads committed rows in `seq` order under
//! `FOR UPDATE SKIP LOCKED` (so several nodes share one outbox and none takes a row another
//! holds), then deletes what Herald ingested and parks what it refused, in the same
//! producer transaction. It never writes Herald's own store.

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{Executor, Postgres, Row, Transaction};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Result;

/// The DDL the producer runs (`config/outbox.sql`), for the table `herald_outbox`.
pub const SCHEMA: &str = include_str!("../../../config/outbox.sql");

/// The default table name, as written in [`SCHEMA`].
pub const DEFAULT_TABLE: &str = "herald_outbox";

/// [`SCHEMA`] for the table `table` (an identifier the config has checked); the index,
/// trigger, function and NOTIFY channel are named after it.
pub fn schema_for(table: &str) -> String {
    SCHEMA.replace(DEFAULT_TABLE, table)
}

/// A producer transaction left open longer than this is ended by Postgres, so a relay that
/// lost its way (a hung node) never holds rows locked for long.
const IDLE_IN_TRANSACTION: &str = "60s";

/// One row as read: `seq` orders it; the rest is what intake validates.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub seq: i64,
    pub tenant: Option<String>,
    pub event_id: String,
    pub event_type: String,
    /// The payload's JSON text (byte-exact for a `json` column).
    pub payload: String,
    /// The optional `traceparent` and `tracestate` columns (NULL, or a table without them: none).
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// A connection pool to one producer database and its outbox table.
#[derive(Clone)]
pub struct ProducerOutbox {
    pool: PgPool,
    table: Arc<str>,
    /// Which of the optional trace columns the table has, and when that was read.
    trace_columns: Arc<Mutex<Option<(TraceColumns, Instant)>>>,
}

/// The optional trace-context columns a producer's table has (`config/outbox.sql` adds
/// them; a table created before it has neither, and keeps working).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TraceColumns {
    traceparent: bool,
    tracestate: bool,
}

/// How long a table found without both trace columns is believed: a producer that adds
/// them (`ALTER TABLE … ADD COLUMN`) is read with them within this, no restart needed.
const TRACE_COLUMNS_RECHECK: Duration = Duration::from_secs(30);

/// Rows taken under lock in an open producer transaction. Dropping it without
/// [`OutboxBatch::finish`] rolls back: the rows stay for the next read.
pub struct OutboxBatch {
    tx: Transaction<'static, Postgres>,
    table: Arc<str>,
    pub rows: Vec<OutboxRow>,
}

/// The outbox's backlog: how old its oldest unrelayed row is, and how many rows are parked.
#[derive(Debug, Clone, Copy, Default)]
pub struct Backlog {
    pub oldest_secs: Option<f64>,
    pub pending: i64,
    pub parked: i64,
}

impl ProducerOutbox {
    /// A lazy pool to `url` (connections open on first use, so a producer database that is
    /// down at start delays only its relay).
    pub fn connect(url: &str, table: &str, max_connections: u32) -> Result<ProducerOutbox> {
        let options = PgConnectOptions::from_str(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute(format!("SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'").as_str())
                        .await
                        .map(drop)
                })
            })
            .connect_lazy_with(options);
        Ok(ProducerOutbox { pool, table: table.into(), trace_columns: Arc::default() })
    }

    /// Begins a producer transaction and locks up to `limit` unrelayed rows, oldest `seq`
    /// first, skipping rows another node holds.
    pub async fn take(&self, limit: u32) -> Result<OutboxBatch> {
        let mut tx = self.pool.begin().await?;
        let columns = self.trace_columns(&mut tx).await?;
        let optional = |has: bool, name: &str| if has { name.to_string() } else { format!("NULL::text AS {name}") };
        let sql = format!(
            "SELECT seq, tenant, event_id, event_type, payload::text AS payload, {}, {} FROM {} \
             WHERE failed_at IS NULL ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED",
            optional(columns.traceparent, "traceparent"),
            optional(columns.tracestate, "tracestate"),
            self.table
        );
        let rows = match sqlx::query(&sql).bind(i64::from(limit)).fetch_all(&mut *tx).await {
            Ok(rows) => rows,
            Err(e) => {
                // The table may have changed under us (a trace column dropped): read it again.
                *self.trace_columns.lock().unwrap_or_else(|e| e.into_inner()) = None;
                return Err(e.into());
            }
        };
        let rows = rows
            .iter()
            .map(|r| {
                Ok(OutboxRow {
                    seq: r.try_get("seq")?,
                    tenant: r.try_get("tenant")?,
                    event_id: r.try_get("event_id")?,
                    event_type: r.try_get("event_type")?,
                    payload: r.try_get("payload")?,
                    traceparent: r.try_get("traceparent")?,
                    tracestate: r.try_get("tracestate")?,
                })
            })
            .collect::<sqlx::Result<Vec<_>>>()?;
        Ok(OutboxBatch { tx, table: self.table.clone(), rows })
    }

    /// Which trace columns the table has: read from the catalog at first, and again after
    /// [`TRACE_COLUMNS_RECHECK`] while either is missing.
    async fn trace_columns(&self, tx: &mut Transaction<'static, Postgres>) -> Result<TraceColumns> {
        let known = *self.trace_columns.lock().unwrap_or_else(|e| e.into_inner());
        match known {
            Some((c, _)) if c.traceparent && c.tracestate => return Ok(c),
            Some((c, at)) if at.elapsed() < TRACE_COLUMNS_RECHECK => return Ok(c),
            _ => {}
        }
        let r = sqlx::query(
            "SELECT COALESCE(bool_or(attname = 'traceparent'), false) AS traceparent, \
             COALESCE(bool_or(attname = 'tracestate'), false) AS tracestate FROM pg_attribute \
             WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped",
        )
        .bind(&*self.table)
        .fetch_one(&mut **tx)
        .await?;
        let c = TraceColumns { traceparent: r.try_get("traceparent")?, tracestate: r.try_get("tracestate")? };
        *self.trace_columns.lock().unwrap_or_else(|e| e.into_inner()) = Some((c, Instant::now()));
        Ok(c)
    }

    /// The backlog, measured on the producer's clock (no skew with Herald's).
    pub async fn backlog(&self) -> Result<Backlog> {
        let t = &self.table;
        let sql = format!(
            "SELECT (SELECT EXTRACT(EPOCH FROM clock_timestamp() - created_at)::float8 FROM {t} \
                     WHERE failed_at IS NULL ORDER BY seq LIMIT 1) AS oldest, \
                    (SELECT COUNT(*) FROM {t} WHERE failed_at IS NULL) AS pending, \
                    (SELECT COUNT(*) FROM {t} WHERE failed_at IS NOT NULL) AS parked"
        );
        let r = sqlx::query(&sql).fetch_one(&self.pool).await?;
        Ok(Backlog { oldest_secs: r.try_get("oldest")?, pending: r.try_get("pending")?, parked: r.try_get("parked")? })
    }

    /// Listens for the table's NOTIFY channel and wakes `wake` on each notification (and
    /// after every reconnect, as one may have been missed), until `wake` is the only
    /// owner left. Reconnects after a failure, every `retry`.
    pub fn watch(&self, wake: Arc<Notify>, retry: Duration) {
        let (pool, channel) = (self.pool.clone(), self.table.to_string());
        tokio::spawn(async move {
            while Arc::strong_count(&wake) > 1 {
                match listen(&pool, &channel, &wake).await {
                    Ok(()) => return,
                    Err(e) => tracing::debug!(error = %e, channel, "outbox LISTEN failed; polling meanwhile"),
                }
                tokio::time::sleep(retry).await;
            }
        });
    }
}

async fn listen(pool: &PgPool, channel: &str, wake: &Arc<Notify>) -> Result<()> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    wake.notify_one();
    loop {
        // Wakes at least every few seconds to notice that the relay has stopped.
        match tokio::time::timeout(Duration::from_secs(5), listener.try_recv()).await {
            Ok(Ok(Some(_))) => wake.notify_one(),
            // The connection dropped; `try_recv` reconnects on the next call.
            Ok(Ok(None)) => wake.notify_one(),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => {}
        }
        if Arc::strong_count(wake) == 1 {
            return Ok(());
        }
    }
}

impl OutboxBatch {
    /// Deletes the relayed rows and parks the refused ones with their reason, then commits
    /// the producer transaction. Returns how many rows this call deleted.
    pub async fn finish(mut self, relayed: &[i64], parked: &[(i64, String)]) -> Result<u64> {
        let table = &self.table;
        let deleted = if relayed.is_empty() {
            0
        } else {
            let sql = format!("DELETE FROM {table} WHERE seq = ANY($1)");
            sqlx::query(&sql).bind(relayed).execute(&mut *self.tx).await?.rows_affected()
        };
        if !parked.is_empty() {
            let sql = format!(
                "UPDATE {table} SET failed_at = clock_timestamp(), error = v.error \
                 FROM UNNEST($1::bigint[], $2::text[]) AS v(seq, error) WHERE {table}.seq = v.seq"
            );
            let (seqs, errors): (Vec<i64>, Vec<String>) = parked.iter().cloned().unzip();
            sqlx::query(&sql).bind(seqs).bind(errors).execute(&mut *self.tx).await?;
        }
        self.tx.commit().await?;
        Ok(deleted)
    }
}
