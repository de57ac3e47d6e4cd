//! The administrative writes: tenants, tokens, endpoints, a tenant's plugin settings and
//! replays. Callers: the API (and `ops`, which sets up Herald's own tenant and endpoints),
//! the replay runner (`replay_turn`, `cancel_replay`), and a `poll` endpoint's consumer
//! (`ack_polled`). Each runs in a transaction of its own, outside the group commits.

use async_trait::async_trait;

use super::{ReplayTurn, Result};
use crate::model::*;

#[async_trait]
pub trait Admin: Send + Sync + 'static {
    async fn create_tenant(&self, tenant: &Tenant) -> Result<()>;
    async fn insert_token(&self, token: &TokenRecord) -> Result<()>;
    /// Deletes the tenant's token `id`; false when it has no such token.
    async fn revoke_token(&self, tenant: &TenantId, id: &str) -> Result<bool>;
    /// Records that the token authenticated a request at `at` (never moves backwards).
    async fn touch_token(&self, hash: &str, at: Millis) -> Result<()>;
    async fn insert_endpoint(&self, endpoint: &Endpoint) -> Result<()>;
    /// Replaces spec and state; false when it does not exist.
    async fn update_endpoint(&self, endpoint: &Endpoint) -> Result<bool>;
    /// Stores where an endpoint's verification stands (not its settings, nor `updated_at`).
    /// False when there is no such endpoint.
    async fn put_verification(&self, endpoint: &EndpointId, verification: &Verification) -> Result<bool>;
    /// Pins a `listen` endpoint to `node`, which holds its listener's connection (runtime
    /// state, not its settings). True when the pin moved.
    async fn put_listener(&self, endpoint: &EndpointId, node: &str) -> Result<bool>;
    /// Deletes it; its unfinished deliveries become dead letters (`endpoint_deleted`).
    async fn delete_endpoint(&self, tenant: &TenantId, id: &EndpointId, now: Millis) -> Result<bool>;
    /// Replaces the settings of one tenant's plugin (a tenant's own configuration).
    async fn put_plugin_settings(&self, s: &StoredPluginSettings) -> Result<()>;
    /// Adds an event type, and its schema as version 1 when it has one (`version` 1).
    async fn insert_event_type(&self, t: &EventType) -> Result<()>;
    /// Replaces an event type's fields if its latest version is still `prior_version`; a
    /// `t.version` above it stores `t.schema` as that new version (older ones stay). False
    /// when the type is gone or another write numbered a version first.
    async fn update_event_type(&self, t: &EventType, prior_version: i64) -> Result<bool>;
    /// Deletes an event type with every version of its schema.
    async fn delete_event_type(&self, owner: &CatalogOwner, name: &str) -> Result<bool>;
    /// Sets the tenant's settings: what its intake does with events that fail its catalog,
    /// and whether its endpoints are verified.
    async fn put_tenant_settings(&self, tenant: &TenantId, settings: TenantSettings, at: Millis) -> Result<()>;
    /// Adds a portal session whose link's one-time code hashes to `code_hash`.
    async fn insert_portal_session(&self, session: &PortalSession, code_hash: &str) -> Result<()>;
    /// Exchanges a live session's one-time code for its token, once: false when no live
    /// session has that code (unknown, used, expired or revoked).
    async fn exchange_portal_code(&self, code_hash: &str, token_hash: &str, now: Millis) -> Result<bool>;
    /// Revokes the tenant's session `id`; false when it has no such unrevoked session.
    async fn revoke_portal_session(&self, tenant: &TenantId, id: &str, now: Millis) -> Result<bool>;
    /// Sets the tenant's portal branding.
    async fn put_branding(&self, tenant: &TenantId, branding: &Branding, at: Millis) -> Result<()>;
    async fn create_replay(&self, replay: &Replay) -> Result<()>;
    /// Stores an audit entry in a transaction of its own: for a write that changed no row
    /// (plugin files); every other write's entry rides its own transaction (`audit`).
    async fn record_audit(&self, entry: &AuditEntry) -> Result<()>;
    /// One turn of a running replay, if its schedule (`next_due_at`) has come by `now`:
    /// re-queues what [`Replay::plan`] allows of the dead letters after its cursor (those
    /// it selected when it started, on endpoints not disabled), spaced at its rate from
    /// `now` ([`Replay::schedule`]), retries counted afresh, deadline `now + ttl_ms`, each
    /// keeping the reason and time it was dead with; advances the cursor and the schedule.
    /// With nothing left to re-queue, it marks the replay done once everything it
    /// re-queued has settled. Every node may run a replay: they take turns on its
    /// schedule, so together they keep its rate, and one that dies leaves it to the others.
    async fn replay_turn(&self, replay_id: &str, now: Millis, ttl_ms: i64) -> Result<ReplayTurn>;
    /// Cancels a running replay: what it re-queued and has not sent goes back among the
    /// dead letters as it was (reason, time, attempts), in the same transaction. Those a
    /// partition has claimed but not sent go back when it hands them back (a release, or
    /// lease recovery), never to be claimed again. `None` when it was not running;
    /// otherwise the endpoints with such claimed deliveries, whose partitions must be told.
    async fn cancel_replay(&self, tenant: &TenantId, id: &str, now: Millis) -> Result<Option<Vec<EndpointId>>>;
    /// A `poll` endpoint's consumer acknowledged everything up to position `upto`: up to
    /// `limit` of its unsettled deliveries there, in order, become delivered at `now`, each
    /// with an attempt decided by `poll`. Answers how many (fewer than `limit`: none left).
    /// Data, like intake: no audit entry.
    async fn ack_polled(&self, endpoint: &EndpointId, upto: i64, now: Millis, limit: u32) -> Result<u64>;
}
