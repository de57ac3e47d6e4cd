//! Portal sessions (`portal_sessions`) and tenants' portal branding (`tenant_branding`):
//! the reads both backends share, written once over sqlx's `Database`, and the statements
//! of the writes, which are `Admin`'s (SQLite runs them on its writer thread,
//! `sqlite/writes.rs`; Postgres on its pool). A session is read on every request it
//! authenticates: no node caches one, so a revocation holds everywhere at once.

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::Result;
use super::queries::{Dialect, Queries};
use crate::model::{Branding, EndpointId, PortalSession, Scope, TenantId};

/// A new session (`$3` the code's hash; `$4` scopes, space-separated; `$6` endpoint ids
/// as a JSON array, or NULL for all).
pub(super) const INSERT_PORTAL_SESSION: &str = "INSERT INTO portal_sessions (id, tenant_id, code_hash, scopes, \
     read_only, endpoints, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

/// Exchanges code `$3` for token `$1` at `$2`: once (the code is cleared), and only while
/// the session is live. (Numbered in order of appearance, as SQLite's writer binds.)
pub(super) const EXCHANGE_PORTAL_CODE: &str = "UPDATE portal_sessions SET code_hash = NULL, token_hash = $1, \
     exchanged_at = $2 WHERE code_hash = $3 AND revoked_at IS NULL AND expires_at > $2";

/// Revokes tenant `$2`'s session `$3` at `$1` (kept, so its token is refused as revoked).
pub(super) const REVOKE_PORTAL_SESSION: &str = "UPDATE portal_sessions SET revoked_at = $1, code_hash = NULL \
     WHERE tenant_id = $2 AND id = $3 AND revoked_at IS NULL";

/// Sets tenant `$1`'s branding (`$2` name, `$3` logo, `$4` accent) at `$5`.
pub(super) const UPSERT_BRANDING: &str = "INSERT INTO tenant_branding (tenant_id, name, logo, accent, updated_at) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id) DO UPDATE SET name = excluded.name, \
     logo = excluded.logo, accent = excluded.accent, updated_at = excluded.updated_at";

const SESSION_COLUMNS: &str =
    "id, tenant_id, scopes, read_only, endpoints, created_at, expires_at, exchanged_at, revoked_at";

/// The stored form of a session's endpoint limit.
pub(super) fn endpoints_json(s: &PortalSession) -> Option<String> {
    s.endpoints.as_ref().map(|ids| super::queries::json(&ids.iter().map(|e| e.as_str()).collect::<Vec<_>>()))
}

/// The stored form of a session's scopes.
pub(super) fn scopes_text(s: &PortalSession) -> String {
    s.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" ")
}

impl<DB> Queries<DB>
where
    DB: Dialect,
    for<'c> &'c sqlx::Pool<DB>: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> bool: Decode<'q, DB> + Type<DB>,
    for<'c> &'c str: ColumnIndex<DB::Row>,
{
    /// The session whose token hashes to `token_hash`, live or not.
    pub(super) async fn portal_session(&self, token_hash: &str) -> Result<Option<PortalSession>> {
        let sql = format!("SELECT {SESSION_COLUMNS} FROM portal_sessions WHERE token_hash = $1");
        let row = sqlx::query(&sql).bind(token_hash).fetch_optional(&self.pool).await?;
        row.as_ref().map(session).transpose()
    }

    /// A tenant's sessions, newest first.
    pub(super) async fn portal_sessions(&self, tenant: &TenantId) -> Result<Vec<PortalSession>> {
        let sql =
            format!("SELECT {SESSION_COLUMNS} FROM portal_sessions WHERE tenant_id = $1 ORDER BY created_at DESC, id");
        let rows = sqlx::query(&sql).bind(tenant.as_str()).fetch_all(&self.pool).await?;
        rows.iter().map(session).collect()
    }

    pub(super) async fn branding(&self, tenant: &TenantId) -> Result<Option<Branding>> {
        let row = sqlx::query("SELECT name, logo, accent FROM tenant_branding WHERE tenant_id = $1")
            .bind(tenant.as_str())
            .fetch_optional(&self.pool)
            .await?;
        let Some(r) = row else { return Ok(None) };
        Ok(Some(Branding { name: r.try_get("name")?, logo: r.try_get("logo")?, accent: r.try_get("accent")? }))
    }
}

fn session<R: Row>(r: &R) -> Result<PortalSession>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'q> String: Decode<'q, R::Database> + Type<R::Database>,
    for<'q> i64: Decode<'q, R::Database> + Type<R::Database>,
    for<'q> bool: Decode<'q, R::Database> + Type<R::Database>,
{
    let endpoints: Option<String> = r.try_get("endpoints")?;
    let endpoints = match endpoints {
        Some(text) => {
            let ids: Vec<String> = serde_json::from_str(&text)
                .map_err(|e| super::StoreError::backend(format!("stored endpoints: {e}")))?;
            Some(ids.into_iter().map(EndpointId::from_stored).collect())
        }
        None => None,
    };
    Ok(PortalSession {
        id: r.try_get("id")?,
        tenant: TenantId::from_stored(r.try_get::<String, _>("tenant_id")?),
        scopes: r.try_get::<String, _>("scopes")?.split(' ').filter_map(Scope::parse).collect(),
        read_only: r.try_get("read_only")?,
        endpoints,
        created_at: r.try_get("created_at")?,
        expires_at: r.try_get("expires_at")?,
        exchanged_at: r.try_get("exchanged_at")?,
        revoked_at: r.try_get("revoked_at")?,
    })
}
