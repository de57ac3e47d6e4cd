//! What the API, the console, the metrics and the engine read: one trait, implemented once
//! for both backends by the shared statements on a backend's sqlx pool
//! ([`Queries`](super::queries)). A backend hands its `Queries` out ([`HasReads`]); it
//! writes no read of its own.

use std::collections::HashMap;

use async_trait::async_trait;

use super::{DeliveryFilter, Polled, QueueStats, Result, SeriesPoint, SeriesScope};
use crate::model::*;

/// Every read of the store. Callers: the API and console (tenants, tokens, endpoints,
/// events, deliveries, replays, health, series), the metrics (`queue_stats`), the engine
/// (`endpoint`, `endpoint_versions`, `pending_endpoints`, `next_due`, `cancelled_replays`), replays
/// (`running_replays`), operational events (`stale_dead_letters`) and a `poll` endpoint's
/// consumer (`poll_page`, `poll_position`).
#[async_trait]
pub trait Reads: Send + Sync + 'static {
    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>>;
    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>>;
    /// A tenant's tokens, oldest first.
    async fn list_tokens(&self, tenant: &TenantId) -> Result<Vec<TokenRecord>>;
    async fn list_tenants(&self) -> Result<Vec<Tenant>>;
    /// Any tenant's endpoint by id (the engine's view).
    async fn endpoint(&self, id: &EndpointId) -> Result<Option<Endpoint>>;
    /// The stored [`Endpoint::version`] of each of `ids` that exists, in one statement (the
    /// engine's check of which endpoints changed).
    async fn endpoint_versions(&self, ids: &[EndpointId]) -> Result<Vec<(EndpointId, i64)>>;
    async fn list_endpoints(&self, tenant: &TenantId) -> Result<Vec<Endpoint>>;
    /// Up to `limit` of a tenant's endpoints in creation order, after the endpoint `after`;
    /// with `plugin`, only those that bind that plugin to any hook (`name` or `name@n`).
    async fn endpoint_page(
        &self,
        tenant: &TenantId,
        after: Option<&EndpointId>,
        limit: u32,
        plugin: Option<&str>,
    ) -> Result<Vec<Endpoint>>;
    /// Attempts started since `since` per `bucket_ms`, oldest first (empty buckets left out).
    async fn attempt_series(&self, scope: &SeriesScope, since: Millis, bucket_ms: i64) -> Result<Vec<SeriesPoint>>;
    async fn plugin_settings(&self, tenant: &TenantId, plugin: &str) -> Result<Option<StoredPluginSettings>>;
    /// Every tenant's plugin settings: a node applies them at start and, on a shared
    /// store, follows other nodes' changes.
    async fn all_plugin_settings(&self) -> Result<Vec<StoredPluginSettings>>;
    /// One catalog's event types (the operator's or a tenant's own; every catalog's with
    /// `None`), each with its latest schema, by name.
    async fn event_types(&self, owner: Option<&CatalogOwner>) -> Result<Vec<EventType>>;
    async fn event_type(&self, owner: &CatalogOwner, name: &str) -> Result<Option<EventType>>;
    /// Every schema version of an event type, oldest first.
    async fn schema_versions(&self, owner: &CatalogOwner, name: &str) -> Result<Vec<SchemaVersion>>;
    /// Every tenant's settings that were ever set (unset: the defaults).
    async fn tenant_settings(&self) -> Result<Vec<(TenantId, TenantSettings)>>;
    /// A number every catalog write raises (types and settings).
    async fn catalog_revision(&self) -> Result<i64>;
    /// The portal session whose token hashes to `token_hash` (expired and revoked ones too).
    async fn find_portal_session(&self, token_hash: &str) -> Result<Option<PortalSession>>;
    /// A tenant's portal sessions, newest first.
    async fn list_portal_sessions(&self, tenant: &TenantId) -> Result<Vec<PortalSession>>;
    /// A tenant's portal branding, if it was ever set.
    async fn branding(&self, tenant: &TenantId) -> Result<Option<Branding>>;
    /// Up to `limit` audit log entries matching `filter`, newest first.
    async fn audit_page(&self, filter: &AuditFilter, limit: u32) -> Result<Vec<AuditEntry>>;
    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<Event>>;
    async fn list_deliveries(&self, filter: &DeliveryFilter) -> Result<Vec<Delivery>>;
    async fn get_delivery(&self, tenant: &TenantId, id: &DeliveryId) -> Result<Option<(Delivery, Vec<Attempt>)>>;
    /// Endpoints with deliveries waiting (queued or waiting), with the earliest due time.
    async fn pending_endpoints(&self) -> Result<Vec<(EndpointId, Millis)>>;
    /// Endpoints whose partition lease some node holds at `now`.
    async fn held_partitions(&self, now: Millis) -> Result<Vec<EndpointId>>;
    /// The earliest due time of one endpoint's waiting deliveries that may go out: on an
    /// ordered endpoint, only its keys' heads count (dead ones too, with
    /// `dead_heads_block`).
    async fn next_due(&self, endpoint: &EndpointId, dead_heads_block: bool) -> Result<Option<Millis>>;
    /// Dead letters of `tenant` matching a replay selection: how many (those of the
    /// filter's `skipped` endpoints aside), and the endpoints among them that are not active,
    /// with their state, its reason and how many of the dead letters are theirs.
    async fn dead_selection(
        &self,
        tenant: &TenantId,
        ids: Option<&[String]>,
        filter: Option<&DeadLetterFilter>,
    ) -> Result<(u64, Vec<SkippedEndpoint>)>;
    /// The distinct endpoints of `tenant`'s deliveries among `ids` (ids of no delivery of
    /// the tenant add none).
    async fn delivery_endpoints(&self, tenant: &TenantId, ids: &[String]) -> Result<Vec<EndpointId>>;
    async fn get_replay(&self, tenant: &TenantId, id: &str) -> Result<Option<ReplayProgress>>;
    /// Up to `limit` of a tenant's replays, newest first, older than the replay `after`.
    async fn list_replays(&self, tenant: &TenantId, after: Option<&str>, limit: u32) -> Result<Vec<ReplayProgress>>;
    /// Replays still running (to resume after a restart).
    async fn running_replays(&self) -> Result<Vec<Replay>>;
    /// Which of these replays are cancelled.
    async fn cancelled_replays(&self, ids: &[String]) -> Result<Vec<String>>;
    /// The dead letters `f` selects (its page aside: every one, not only a page's),
    /// counted by reason.
    async fn dead_letter_counts(&self, f: &DeliveryFilter) -> Result<Vec<(String, u64)>>;
    /// Per tenant: the oldest unresolved dead letter, if older than `older_than`, and the count.
    async fn stale_dead_letters(&self, older_than: Millis) -> Result<Vec<(TenantId, Millis, u64)>>;
    /// The health of each of `endpoints` (a page of them) at `now`, in one statement: an
    /// endpoint without attempts or deliveries is left out (its health is the default).
    async fn endpoint_health_page(&self, endpoints: &[EndpointId], now: Millis) -> Result<HashMap<EndpointId, Health>>;
    /// One endpoint's health at `now` (see [`Reads::endpoint_health_page`]).
    async fn endpoint_health(&self, endpoint: &EndpointId, now: Millis) -> Result<Health> {
        let mut page = self.endpoint_health_page(std::slice::from_ref(endpoint), now).await?;
        Ok(page.remove(endpoint).unwrap_or_default())
    }
    /// Queue depth, dead letters and endpoint states for the metrics, with the `top`
    /// endpoints that have the most due deliveries.
    async fn queue_stats(&self, now: Millis, top: u32) -> Result<QueueStats>;
    /// Up to `limit` of a `poll` endpoint's unsettled deliveries after position `after`, in
    /// the order their intakes committed (a consumer's page).
    async fn poll_page(&self, endpoint: &EndpointId, after: i64, limit: u32) -> Result<Vec<Polled>>;
    /// The position of the endpoint's delivery `delivery` while it is stored; `None` once
    /// retention purged it (or it was never the endpoint's).
    async fn poll_position(&self, endpoint: &EndpointId, delivery: &DeliveryId) -> Result<Option<i64>>;
}

/// A backend whose reads are one [`Reads`] it holds (its `Queries`).
pub(super) trait HasReads: Send + Sync + 'static {
    fn reads(&self) -> &dyn Reads;
}

/// The one forwarding from a backend to its reads.
#[async_trait]
impl<T: HasReads> Reads for T {
    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
        self.reads().get_tenant(id).await
    }
    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>> {
        self.reads().find_token(hash).await
    }
    async fn list_tokens(&self, tenant: &TenantId) -> Result<Vec<TokenRecord>> {
        self.reads().list_tokens(tenant).await
    }
    async fn list_tenants(&self) -> Result<Vec<Tenant>> {
        self.reads().list_tenants().await
    }
    async fn endpoint(&self, id: &EndpointId) -> Result<Option<Endpoint>> {
        self.reads().endpoint(id).await
    }
    async fn endpoint_versions(&self, ids: &[EndpointId]) -> Result<Vec<(EndpointId, i64)>> {
        self.reads().endpoint_versions(ids).await
    }
    async fn list_endpoints(&self, tenant: &TenantId) -> Result<Vec<Endpoint>> {
        self.reads().list_endpoints(tenant).await
    }
    async fn endpoint_page(
        &self,
        tenant: &TenantId,
        after: Option<&EndpointId>,
        limit: u32,
        plugin: Option<&str>,
    ) -> Result<Vec<Endpoint>> {
        self.reads().endpoint_page(tenant, after, limit, plugin).await
    }
    async fn attempt_series(&self, scope: &SeriesScope, since: Millis, bucket_ms: i64) -> Result<Vec<SeriesPoint>> {
        self.reads().attempt_series(scope, since, bucket_ms).await
    }
    async fn plugin_settings(&self, tenant: &TenantId, plugin: &str) -> Result<Option<StoredPluginSettings>> {
        self.reads().plugin_settings(tenant, plugin).await
    }
    async fn all_plugin_settings(&self) -> Result<Vec<StoredPluginSettings>> {
        self.reads().all_plugin_settings().await
    }
    async fn event_types(&self, owner: Option<&CatalogOwner>) -> Result<Vec<EventType>> {
        self.reads().event_types(owner).await
    }
    async fn event_type(&self, owner: &CatalogOwner, name: &str) -> Result<Option<EventType>> {
        self.reads().event_type(owner, name).await
    }
    async fn schema_versions(&self, owner: &CatalogOwner, name: &str) -> Result<Vec<SchemaVersion>> {
        self.reads().schema_versions(owner, name).await
    }
    async fn tenant_settings(&self) -> Result<Vec<(TenantId, TenantSettings)>> {
        self.reads().tenant_settings().await
    }
    async fn catalog_revision(&self) -> Result<i64> {
        self.reads().catalog_revision().await
    }
    async fn find_portal_session(&self, token_hash: &str) -> Result<Option<PortalSession>> {
        self.reads().find_portal_session(token_hash).await
    }
    async fn list_portal_sessions(&self, tenant: &TenantId) -> Result<Vec<PortalSession>> {
        self.reads().list_portal_sessions(tenant).await
    }
    async fn branding(&self, tenant: &TenantId) -> Result<Option<Branding>> {
        self.reads().branding(tenant).await
    }
    async fn audit_page(&self, filter: &AuditFilter, limit: u32) -> Result<Vec<AuditEntry>> {
        self.reads().audit_page(filter, limit).await
    }
    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<Event>> {
        self.reads().get_event(tenant, id).await
    }
    async fn list_deliveries(&self, filter: &DeliveryFilter) -> Result<Vec<Delivery>> {
        self.reads().list_deliveries(filter).await
    }
    async fn get_delivery(&self, tenant: &TenantId, id: &DeliveryId) -> Result<Option<(Delivery, Vec<Attempt>)>> {
        self.reads().get_delivery(tenant, id).await
    }
    async fn pending_endpoints(&self) -> Result<Vec<(EndpointId, Millis)>> {
        self.reads().pending_endpoints().await
    }
    async fn held_partitions(&self, now: Millis) -> Result<Vec<EndpointId>> {
        self.reads().held_partitions(now).await
    }
    async fn next_due(&self, endpoint: &EndpointId, dead_heads_block: bool) -> Result<Option<Millis>> {
        self.reads().next_due(endpoint, dead_heads_block).await
    }
    async fn dead_selection(
        &self,
        tenant: &TenantId,
        ids: Option<&[String]>,
        filter: Option<&DeadLetterFilter>,
    ) -> Result<(u64, Vec<SkippedEndpoint>)> {
        self.reads().dead_selection(tenant, ids, filter).await
    }
    async fn delivery_endpoints(&self, tenant: &TenantId, ids: &[String]) -> Result<Vec<EndpointId>> {
        self.reads().delivery_endpoints(tenant, ids).await
    }
    async fn get_replay(&self, tenant: &TenantId, id: &str) -> Result<Option<ReplayProgress>> {
        self.reads().get_replay(tenant, id).await
    }
    async fn list_replays(&self, tenant: &TenantId, after: Option<&str>, limit: u32) -> Result<Vec<ReplayProgress>> {
        self.reads().list_replays(tenant, after, limit).await
    }
    async fn running_replays(&self) -> Result<Vec<Replay>> {
        self.reads().running_replays().await
    }
    async fn cancelled_replays(&self, ids: &[String]) -> Result<Vec<String>> {
        self.reads().cancelled_replays(ids).await
    }
    async fn dead_letter_counts(&self, f: &DeliveryFilter) -> Result<Vec<(String, u64)>> {
        self.reads().dead_letter_counts(f).await
    }
    async fn stale_dead_letters(&self, older_than: Millis) -> Result<Vec<(TenantId, Millis, u64)>> {
        self.reads().stale_dead_letters(older_than).await
    }
    async fn endpoint_health_page(&self, endpoints: &[EndpointId], now: Millis) -> Result<HashMap<EndpointId, Health>> {
        self.reads().endpoint_health_page(endpoints, now).await
    }
    async fn queue_stats(&self, now: Millis, top: u32) -> Result<QueueStats> {
        self.reads().queue_stats(now, top).await
    }
    async fn poll_page(&self, endpoint: &EndpointId, after: i64, limit: u32) -> Result<Vec<Polled>> {
        self.reads().poll_page(endpoint, after, limit).await
    }
    async fn poll_position(&self, endpoint: &EndpointId, delivery: &DeliveryId) -> Result<Option<i64>> {
        self.reads().poll_position(endpoint, delivery).await
    }
}
