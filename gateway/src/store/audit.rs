//! The audit log (`audit_log`): every write through the API leaves one entry, written in
//! the transaction of the change itself, so there is no change without an entry and no
//! entry without a change.
//!
//! How, without a new argument on every store method: the API's middleware opens a
//! [`scope`] around each write request with the entry it will be (route, resource, client
//! address; authentication notes the actor, the body's parser the names of the fields it
//! sets); the request's task carries it (a tokio task-local). The store's write paths look for it as they write:
//! - SQLite's writer runs each administrative write as a job on its thread
//!   (`Writer::audited`): the job inserts the pending entry before its `COMMIT` when the
//!   write changed something ([`Changed`]: a `false` or `None` answer is "nothing to
//!   change", a 404).
//! - Postgres' administrative writes end with [`finish`] (`insert + COMMIT`) instead of a
//!   bare `COMMIT`, under the same rule.
//! - Group commits (intake, an endpoint's enable or pause): the `Committer` appends a
//!   `WriteOp::Audit` after the request's own ops, which both writers apply in the same
//!   transaction only when the op before it changed something (an event stored, not a
//!   duplicate or a conflict).
//!
//! Once written, the entry is spent: a request that writes twice is logged once, with
//! its first change. A failed transaction writes neither. Plugin uploads, rollbacks and
//! deletions change files, not rows: the middleware records those after they succeed, in a
//! transaction of their own (`Admin::record_audit`). Nothing here sees a value the request
//! set, only field names, so no secret can reach the log.

use std::future::Future;
use std::sync::{Arc, Mutex};

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::Result;
use super::queries::{Dialect, Queries, json};
use super::sql::Sql;
use crate::model::{AuditEntry, AuditFilter, TenantId};

tokio::task_local! {
    static PENDING: Arc<Mutex<Draft>>;
}

/// The entry a request will leave, and whether a transaction wrote it already.
struct Draft {
    entry: AuditEntry,
    written: bool,
}

/// Runs `request` with `entry` pending (see the module doc). Answers with the entry when
/// no transaction wrote it.
pub async fn scope<F: Future>(entry: AuditEntry, request: F) -> (F::Output, Option<AuditEntry>) {
    let draft = Arc::new(Mutex::new(Draft { entry, written: false }));
    let out = PENDING.scope(draft.clone(), request).await;
    let draft = draft.lock().unwrap_or_else(|e| e.into_inner());
    (out, (!draft.written).then(|| draft.entry.clone()))
}

fn with_draft<T>(f: impl FnOnce(&mut Draft) -> T) -> Option<T> {
    PENDING.try_with(|d| f(&mut d.lock().unwrap_or_else(|e| e.into_inner()))).ok()
}

/// Names who is calling (set as the request authenticates).
pub fn note_actor(actor: impl Into<String>) {
    with_draft(|d| d.entry.actor = actor.into());
}

/// Names the resource a request creates, once its id is known.
pub fn note_resource(id: impl Into<String>) {
    with_draft(|d| d.entry.resource = Some(id.into()));
}

/// Names the fields a request's body sets (their names only, sorted; never a value).
pub fn note_fields<'a>(names: impl Iterator<Item = &'a String>) {
    with_draft(|d| {
        d.entry.fields = names.cloned().collect();
        d.entry.fields.sort();
    });
}

/// The entry of the request this task serves, if it is not written yet.
pub(super) fn pending() -> Option<AuditEntry> {
    with_draft(|d| (!d.written).then(|| d.entry.clone())).flatten()
}

/// The pending entry was committed.
pub(super) fn written() {
    with_draft(|d| d.written = true);
}

/// Whether a write's answer means it changed something: `false` and `None` are how the
/// store says there was nothing to change (no such row, a replay not running).
pub trait Changed {
    fn changed(&self) -> bool;
}

impl Changed for () {
    fn changed(&self) -> bool {
        true
    }
}

impl Changed for bool {
    fn changed(&self) -> bool {
        *self
    }
}

impl<T> Changed for Option<T> {
    fn changed(&self) -> bool {
        self.is_some()
    }
}

/// One entry (numbered in order of appearance, as SQLite's writer binds).
pub(super) const INSERT_AUDIT: &str = "INSERT INTO audit_log (id, at, actor, tenant_id, route, kind, resource_id, \
     fields, client) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// Deletes up to `$2` entries older than `$1` (retention, SQLite).
pub(super) const PURGE_AUDIT: &str =
    "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log WHERE at < $1 ORDER BY at LIMIT $2)";

/// [`PURGE_AUDIT`] on Postgres: nodes purging at the same time take different rows.
pub(super) const PURGE_AUDIT_PG: &str = "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log WHERE at < $1 \
     ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// The stored form of an entry's field names.
pub(super) fn fields_json(e: &AuditEntry) -> String {
    json(&e.fields)
}

/// Inserts `entry` on Postgres in `tx` when `out` changed something, then commits; marks
/// the request's entry written. The end of every audited Postgres write.
pub(super) async fn finish<T: Changed>(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    entry: Option<AuditEntry>,
    out: T,
) -> Result<T> {
    let entry = entry.filter(|_| out.changed());
    if let Some(e) = &entry {
        insert_pg(&mut tx, e).await?;
    }
    tx.commit().await?;
    if entry.is_some() {
        written();
    }
    Ok(out)
}

/// Inserts one entry on Postgres.
pub(super) async fn insert_pg(conn: &mut sqlx::PgConnection, e: &AuditEntry) -> sqlx::Result<()> {
    sqlx::query(INSERT_AUDIT)
        .bind(&e.id)
        .bind(e.at)
        .bind(&e.actor)
        .bind(e.tenant.as_ref().map(TenantId::as_str))
        .bind(&e.route)
        .bind(&e.kind)
        .bind(&e.resource)
        .bind(fields_json(e))
        .bind(&e.client)
        .execute(conn)
        .await?;
    Ok(())
}

/// Inserts one entry on SQLite's writer connection.
pub(super) fn insert_sqlite(tx: &rusqlite::Transaction<'_>, e: &AuditEntry) -> Result<()> {
    tx.prepare_cached(INSERT_AUDIT)?.execute(rusqlite::params![
        e.id,
        e.at,
        e.actor,
        e.tenant.as_ref().map(TenantId::as_str),
        e.route,
        e.kind,
        e.resource,
        fields_json(e),
        e.client
    ])?;
    Ok(())
}

const COLUMNS: &str = "id, at, actor, tenant_id, route, kind, resource_id, fields, client";

impl<DB> Queries<DB>
where
    DB: Dialect,
    for<'c> &'c sqlx::Pool<DB>: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Option<String>: Decode<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'c> &'c str: ColumnIndex<DB::Row>,
{
    /// Up to `limit` entries matching `f`, newest first.
    pub(super) async fn audit_page(&self, f: &AuditFilter, limit: u32) -> Result<Vec<AuditEntry>> {
        let mut q = Sql::<DB>::new(format!("SELECT {COLUMNS} FROM audit_log WHERE 1 = 1"));
        let text = [
            (" AND tenant_id = ", f.tenant.as_ref().map(TenantId::as_str)),
            (" AND actor = ", f.actor.as_deref()),
            (" AND kind = ", f.kind.as_deref()),
            (" AND resource_id = ", f.resource.as_deref()),
            (" AND route = ", f.route.as_deref()),
            (" AND id < ", f.before.as_deref()),
        ];
        for (condition, value) in text {
            if let Some(v) = value {
                q.push(condition).push_bind(v);
            }
        }
        match f.resources.as_deref() {
            None => {}
            Some([]) => {
                q.push(" AND 1 = 0");
            }
            Some([first, rest @ ..]) => {
                q.push(" AND resource_id IN (").push_bind(first.as_str());
                for r in rest {
                    q.push(", ").push_bind(r.as_str());
                }
                q.push(")");
            }
        }
        if let Some(since) = f.since {
            q.push(" AND at >= ").push_bind(since);
        }
        if let Some(until) = f.until {
            q.push(" AND at < ").push_bind(until);
        }
        q.push(" ORDER BY id DESC LIMIT ").push_bind(i64::from(limit));
        let (text, args) = q.take()?;
        let rows = sqlx::query_with(&text, args).fetch_all(&self.pool).await?;
        rows.iter().map(entry).collect()
    }
}

fn entry<R: Row>(r: &R) -> Result<AuditEntry>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'q> String: Decode<'q, R::Database> + Type<R::Database>,
    for<'q> Option<String>: Decode<'q, R::Database>,
    for<'q> i64: Decode<'q, R::Database> + Type<R::Database>,
{
    let fields: String = r.try_get("fields")?;
    Ok(AuditEntry {
        id: r.try_get("id")?,
        at: r.try_get("at")?,
        actor: r.try_get("actor")?,
        tenant: r.try_get::<Option<String>, _>("tenant_id")?.map(TenantId::from_stored),
        route: r.try_get("route")?,
        kind: r.try_get("kind")?,
        resource: r.try_get("resource_id")?,
        fields: serde_json::from_str(&fields)
            .map_err(|e| super::StoreError::backend(format!("stored audit fields: {e}")))?,
        client: r.try_get("client")?,
    })
}
