//! Persistence: the `Store` trait, its SQLite and Postgres implementations, and the
//! group committer that folds many concurrent writes into one durable transaction.
//! Architecture invariant: this is the only module that speaks SQL.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::model::*;

pub(crate) mod committer;
pub mod outbox;
mod plugin_settings;
pub mod postgres;
mod queries;
mod rows;
mod sql;
pub mod sqlite;

pub use committer::{CommitSink, Committer, Pending};

/// The query behind [`ClaimBatch::next_due`] and [`Store::next_due`] (`$1`: the endpoint).
const NEXT_DUE: &str =
    "SELECT MIN(next_attempt_at) FROM deliveries WHERE endpoint_id = $1 AND state IN ('queued', 'waiting')";

/// A storage failure. `Conflict` and `NotFound` are the caller's business; `Backend` is ours.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("already exists: {0}")]
    Conflict(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("storage unavailable: {0}")]
    Backend(BackendError),
}

impl StoreError {
    /// A backend failure Herald itself detected.
    pub fn backend(message: impl Into<String>) -> StoreError {
        StoreError::Backend(BackendError { message: message.into(), source: None })
    }

    /// A failure of the database driver (sqlx, rusqlite), kept as the source.
    fn from_driver(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
        StoreError::Backend(BackendError { message: e.to_string(), source: Some(Arc::new(e)) })
    }
}

/// Why the storage failed. Its text includes the driver's message, because logs print
/// only an error's text; the driver's error itself is the `source`, for callers that
/// inspect it. Shared (`Arc`) so that one failed group commit fails every caller in it.
#[derive(Debug, Clone)]
pub struct BackendError {
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e
            && db.is_unique_violation()
        {
            return StoreError::Conflict(db.message().to_string());
        }
        StoreError::from_driver(e)
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What intake learned about one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestOutcome {
    /// Deliveries this event has (new ones, or the existing ones of a duplicate).
    pub deliveries: u32,
    /// Endpoints that got a new delivery (empty for a duplicate).
    pub endpoints: Vec<EndpointId>,
    /// The (tenant, id) was already stored: nothing new was written.
    pub duplicate: bool,
    /// The (tenant, id) was already stored with a different type or payload. Then nothing
    /// of the whole op (request) it came in was written.
    pub conflict: bool,
    /// New deliveries leased in the intake commit itself to a partition on this node (see
    /// [`Handoff`]), with their endpoints; these endpoints are not in `endpoints`.
    pub leased: Vec<(EndpointId, Claimed)>,
    /// Where the op stands in the store's order of writes, where the store orders them
    /// (SQLite's writer numbers its ops; 0 elsewhere): a partition whose claim came later
    /// (see [`Handoff::claimed`]) has seen these deliveries, and is not woken for them.
    pub seq: u64,
}

/// Claim at intake: partitions on this node that take a new delivery already leased to
/// them, so it needs no claim of its own (one commit less per delivery). Asked by the
/// store inside the intake commit, for each new delivery (see [`Store::hand_off`]).
pub trait Handoff: Send + Sync {
    /// Who the leases are for (this node's lease owner).
    fn owner(&self) -> &str;
    /// Until when a new delivery of `endpoint` made at `now` is leased, when a partition
    /// here takes it directly; `None`: it is queued for a claim as usual. A delivery given
    /// a lease is stored `delivering`, leased to [`Handoff::owner`], with fence 1, exactly
    /// as a first claim would have left it.
    fn lease(&self, endpoint: &str, now: Millis) -> Option<Millis>;
    /// A claim under `endpoint`'s partition lease, op `seq` in the store's order of
    /// writes, took `claimed` deliveries and found nothing else due: told as the claim is
    /// applied, before any later op (of its own commit too) runs. From here on nothing of
    /// the endpoint waits in the store unseen, so its partition may take new deliveries at
    /// intake at once, instead of after it has heard back (when intake ops in between
    /// would have queued theirs for yet another claim).
    fn claimed(&self, endpoint: &str, seq: u64, claimed: usize);
}

/// The fingerprint of a stored event: its column, or for an event stored before the
/// column existed (NULL), computed from its type and payload.
pub(crate) fn stored_fingerprint(
    fingerprint: Option<String>,
    event_type: Option<String>,
    payload: Option<String>,
) -> String {
    fingerprint.unwrap_or_else(|| event_fingerprint(&event_type.unwrap_or_default(), &payload.unwrap_or_default()))
}

impl IngestOutcome {
    /// A new event fanned out to `endpoints`.
    pub fn stored(endpoints: Vec<EndpointId>) -> IngestOutcome {
        IngestOutcome::stored_leased(endpoints, Vec::new())
    }

    /// A new event fanned out to `queued` endpoints for a claim and to `leased` ones'
    /// partitions directly.
    pub fn stored_leased(queued: Vec<EndpointId>, leased: Vec<(EndpointId, Claimed)>) -> IngestOutcome {
        let deliveries = (queued.len() + leased.len()) as u32;
        IngestOutcome { deliveries, endpoints: queued, duplicate: false, conflict: false, leased, seq: 0 }
    }

    /// A repeat of a stored event that got `deliveries` deliveries the first time.
    pub fn duplicate(deliveries: u32) -> IngestOutcome {
        IngestOutcome {
            deliveries,
            endpoints: Vec::new(),
            duplicate: true,
            conflict: false,
            leased: Vec::new(),
            seq: 0,
        }
    }

    /// The outcomes of an op of `n` events refused because event `at` conflicts.
    pub fn refused(n: usize, at: usize) -> Vec<IngestOutcome> {
        (0..n)
            .map(|i| IngestOutcome {
                deliveries: 0,
                endpoints: Vec::new(),
                duplicate: false,
                conflict: i == at,
                leased: Vec::new(),
                seq: 0,
            })
            .collect()
    }
}

/// Claim due deliveries of one endpoint under a lease.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub endpoint: EndpointId,
    pub now: Millis,
    pub limit: u32,
    pub owner: String,
    pub lease_until: Millis,
    /// Claim only while `owner` holds the endpoint's partition lease (checked in the same
    /// transaction, so a claim that follows a [`WriteOp::Partition`] in one commit is
    /// proof of the lease).
    pub in_partition: bool,
}

/// Takes, renews or gives up an endpoint's partition lease.
#[derive(Debug, Clone)]
pub struct PartitionLease {
    pub endpoint: EndpointId,
    pub owner: String,
    pub now: Millis,
    /// Hold it until then; `None` gives it up (a no-op unless `owner` holds it).
    pub until: Option<Millis>,
}

/// A delivery handed to a worker, with what it needs to send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub id: DeliveryId,
    pub tenant: TenantId,
    pub event_id: EventId,
    pub event_type: String,
    pub payload: String,
    pub event_created_at: Millis,
    pub expires_at: Millis,
    pub attempts: u32,
    /// Attempts made before the last replay: retries are counted from here.
    pub attempt_base: u32,
    /// A deadline set by a replay, replacing the event's own.
    pub deadline: Option<Millis>,
    /// The replay that last re-queued it.
    pub replay: Option<String>,
    pub fence: i64,
}

impl Claimed {
    /// New delivery `id` of `event`, leased at intake (see [`Handoff`]): fence 1, no
    /// attempts yet, as a first claim would have left it.
    pub fn new_leased(id: DeliveryId, event: &NewEvent) -> Claimed {
        Claimed {
            id,
            tenant: event.tenant.clone(),
            event_id: event.id.clone(),
            event_type: event.event_type.clone(),
            payload: event.payload.clone(),
            event_created_at: event.created_at,
            expires_at: event.expires_at,
            attempts: 0,
            attempt_base: 0,
            deadline: None,
            replay: None,
            fence: 1,
        }
    }

    /// The replay that re-queued it, while it has not been sent since: if that replay is
    /// cancelled, it must not be sent (see [`Store::cancel_replay`]).
    pub fn unsent_of_replay(&self) -> Option<&str> {
        self.replay.as_deref().filter(|_| self.attempts == self.attempt_base)
    }
}

/// What a claim got.
#[derive(Debug, Clone, Default)]
pub struct ClaimBatch {
    pub claimed: Vec<Claimed>,
    /// When fewer than the limit were claimed: the earliest due time of the endpoint's
    /// deliveries still waiting (`None`: none wait), read in the same transaction. Not
    /// read (`None`) after a full batch.
    pub next_due: Option<Millis>,
}

/// The recorded result of one attempt; applied only if `fence` still matches (the lease
/// holder's token), so a worker that lost its lease cannot record anything.
#[derive(Debug, Clone)]
pub struct AttemptResult {
    pub delivery: DeliveryId,
    pub fence: i64,
    pub state: DeliveryState,
    pub next_attempt_at: Option<Millis>,
    pub reason: Option<String>,
    pub attempt: Attempt,
}

/// Hand back claimed deliveries that were never sent (e.g. the endpoint paused).
#[derive(Debug, Clone)]
pub struct Release {
    pub delivery: DeliveryId,
    pub fence: i64,
    pub next_attempt_at: Millis,
}

/// A change to an endpoint's state decided by the delivery engine.
#[derive(Debug, Clone)]
pub struct EndpointChange {
    pub endpoint: EndpointId,
    /// `None`: only `failing_since` changes.
    pub state: Option<EndpointState>,
    pub reason: Option<String>,
    pub paused_until: Option<Millis>,
    /// How `failing_since` changes (a success clears it).
    pub failing_since: Failing,
    pub now: Millis,
}

/// A message from another node sharing the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// These endpoints got new work.
    Work(Vec<EndpointId>),
    /// These endpoints' settings or state changed.
    Changed(Vec<EndpointId>),
}

/// One write the group committer folds into a shared transaction.
#[derive(Debug)]
pub enum WriteOp {
    Ingest(Vec<NewEvent>),
    Claim(ClaimRequest),
    Record(Vec<AttemptResult>),
    Release(Vec<Release>),
    Endpoint(EndpointChange),
    Partition(PartitionLease),
}

impl WriteOp {
    /// Is this write acknowledged to someone outside the engine (a producer's 202, an API
    /// client's answer)? Such a commit reaches the disk before anyone is answered. The
    /// engine's own bookkeeping (claims, results, releases, leases) need not wait for the
    /// disk: the next acknowledged commit or checkpoint syncs it, and a power cut that
    /// takes it back only makes a delivery go out again (at least once), never loses one.
    pub fn acknowledged(&self) -> bool {
        matches!(self, WriteOp::Ingest(_) | WriteOp::Endpoint(_))
    }

    /// May this write wait a few milliseconds for others to commit with it? An attempt's
    /// results: nothing a producer, a receiver or an endpoint's pacing waits for hangs on
    /// them (the endpoint's slot frees once the response is judged), so a store may hold
    /// them for the next commit instead of committing them alone.
    pub fn can_wait(&self) -> bool {
        matches!(self, WriteOp::Record(_))
    }
}

/// The result of a `WriteOp`, in the same order.
#[derive(Debug)]
pub enum WriteResult {
    Ingest(Vec<IngestOutcome>),
    Claim(ClaimBatch),
    /// Per result: the state the delivery settled in, or `None` when the fence no longer
    /// matched. An unfinished result settles against its endpoint's state at commit
    /// time: a retry on an endpoint disabled meanwhile is `Dead`.
    Record(Vec<Option<DeliveryState>>),
    Release,
    /// Deliveries dead-lettered by the change (disable).
    Endpoint(u64),
    /// Does the owner hold the partition now (always false after giving it up)?
    Partition(bool),
}

/// What the metrics read from the store at scrape time. Every query behind it is an
/// aggregate over an index or the endpoints table: cheap enough for one scrape a second.
#[derive(Debug, Clone, Default)]
pub struct QueueStats {
    /// Deliveries due (queued or waiting, `next_attempt_at` reached) and unclaimed.
    pub due: u64,
    /// When the oldest of them came due.
    pub oldest_due: Option<Millis>,
    /// The endpoints with the most due deliveries, most first: (tenant, endpoint, due).
    pub top_due: Vec<(TenantId, EndpointId, u64)>,
    /// Endpoints by stored state (`active`, `paused`, `disabled`).
    pub endpoints_by_state: Vec<(String, u64)>,
    /// Per tenant with dead letters: (tenant, the oldest one's time, how many).
    pub dead: Vec<(TenantId, Millis, u64)>,
    /// Size of the SQLite write-ahead log (`None` on Postgres).
    pub wal_bytes: Option<u64>,
}

/// What one turn of a replay did ([`Store::replay_turn`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayTurn {
    /// Re-queued `requeued` dead letters, on `endpoints` (each once). The next turn is due
    /// at `next_due`.
    Requeued { endpoints: Vec<EndpointId>, requeued: u32, next_due: Millis },
    /// Nothing to do before this time: the turn is not due (another node took the last
    /// one), a batch waits to be sent, or everything is re-queued and not all of it has
    /// settled.
    NotYet(Millis),
    /// No longer running: done (everything it re-queued has settled) or cancelled.
    Ended,
}

/// What [`Committer::record_with`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// The state the delivery settled in (see [`WriteResult::Record`]); `None`: the fence
    /// no longer matched and nothing was recorded.
    pub settled: Option<DeliveryState>,
    /// Other deliveries the endpoint change dead-lettered (disabling it).
    pub dead_lettered: u64,
}

/// Filters for listing deliveries (and dead letters).
#[derive(Debug, Clone, Default)]
pub struct DeliveryFilter {
    pub tenant: Option<TenantId>,
    pub event: Option<EventId>,
    pub endpoint: Option<EndpointId>,
    pub state: Option<DeliveryState>,
    pub event_type: Option<String>,
    pub reason: Option<String>,
    pub since: Option<Millis>,
    pub until: Option<Millis>,
    /// Page after this delivery id (ids are time-ordered).
    pub after: Option<DeliveryId>,
    pub limit: u32,
    /// Newest first (`after` then pages towards older ids).
    pub newest_first: bool,
}

/// Whose attempts a delivery-rate series counts.
#[derive(Debug, Clone)]
pub enum SeriesScope {
    /// Every tenant's (the admin overview).
    All,
    Tenant(TenantId),
    Endpoint(EndpointId),
}

/// The attempts started in one time bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeriesPoint {
    /// The bucket's first millisecond.
    pub start: Millis,
    pub attempts: u64,
    /// Attempts answered with a 2xx.
    pub successes: u64,
    /// Their summed and longest durations.
    pub total_ms: u64,
    pub max_ms: u64,
}

/// Everything Herald stores. Implementations must be safe to share between tasks.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    async fn create_tenant(&self, tenant: &Tenant) -> Result<()>;
    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>>;
    async fn insert_token(&self, token: &TokenRecord) -> Result<()>;
    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>>;
    /// A tenant's tokens, oldest first.
    async fn list_tokens(&self, tenant: &TenantId) -> Result<Vec<TokenRecord>>;
    /// Deletes the tenant's token `id`; false when it has no such token.
    async fn revoke_token(&self, tenant: &TenantId, id: &str) -> Result<bool>;
    /// Records that the token authenticated a request at `at` (never moves backwards).
    async fn touch_token(&self, hash: &str, at: Millis) -> Result<()>;

    async fn insert_endpoint(&self, endpoint: &Endpoint) -> Result<()>;
    /// Any tenant's endpoint by id (the engine's view).
    async fn endpoint(&self, id: &EndpointId) -> Result<Option<Endpoint>>;
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
    async fn list_tenants(&self) -> Result<Vec<Tenant>>;
    /// Attempts started since `since` per `bucket_ms`, oldest first (empty buckets left out).
    async fn attempt_series(&self, scope: &SeriesScope, since: Millis, bucket_ms: i64) -> Result<Vec<SeriesPoint>>;
    /// Replaces spec and state; false when it does not exist.
    async fn update_endpoint(&self, endpoint: &Endpoint) -> Result<bool>;
    /// Deletes it; its unfinished deliveries become dead letters (`endpoint_deleted`).
    async fn delete_endpoint(&self, tenant: &TenantId, id: &EndpointId, now: Millis) -> Result<bool>;

    /// Replaces the settings of one tenant's plugin (a tenant's own configuration).
    async fn put_plugin_settings(&self, s: &StoredPluginSettings) -> Result<()>;
    async fn plugin_settings(&self, tenant: &TenantId, plugin: &str) -> Result<Option<StoredPluginSettings>>;
    /// Every tenant's plugin settings: a node applies them at start and, on a shared
    /// store, follows other nodes' changes.
    async fn all_plugin_settings(&self) -> Result<Vec<StoredPluginSettings>>;

    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> Result<Option<Event>>;
    async fn list_deliveries(&self, filter: &DeliveryFilter) -> Result<Vec<Delivery>>;
    async fn get_delivery(&self, tenant: &TenantId, id: &DeliveryId) -> Result<Option<(Delivery, Vec<Attempt>)>>;

    /// Endpoints with deliveries waiting (queued or waiting), with the earliest due time.
    async fn pending_endpoints(&self) -> Result<Vec<(EndpointId, Millis)>>;
    /// The earliest due time of one endpoint's waiting deliveries.
    async fn next_due(&self, endpoint: &EndpointId) -> Result<Option<Millis>>;
    /// Returns deliveries whose lease ended before `expired_before` to `waiting`, due at
    /// `now` (crash recovery).
    async fn recover_leases(&self, expired_before: Millis, now: Millis) -> Result<u64>;

    /// Applies every op in one durable transaction: all commit, or all fail.
    async fn apply(&self, ops: Vec<WriteOp>) -> Result<Vec<WriteResult>>;

    /// The store's own group-commit queue, batching up to `max_batch` ops per commit;
    /// `None` (the default): the [`Committer`] runs a loop over [`Store::apply`].
    fn commit_sink(&self, _max_batch: usize) -> Option<Arc<dyn CommitSink>> {
        None
    }

    /// Lets intake commits lease new deliveries to this node's partitions (`handoff`)
    /// where the store can tell they hold their endpoint's lease. SQLite can: one node owns
    /// every partition in its file. The default (shared stores) never does: every delivery
    /// is queued and claimed under the partition lease checked in the claim's transaction.
    fn hand_off(&self, _handoff: Arc<dyn Handoff>) {}

    /// Takes or renews the lease on an endpoint's partition: true if `owner` holds it until
    /// `until` (it was free, expired at `now`, or already `owner`'s). One node at a time
    /// paces an endpoint, so pacing holds for the cluster. A write: it is one
    /// [`WriteOp::Partition`] of its own; the engine folds it into group commits instead.
    async fn acquire_partition(&self, endpoint: &EndpointId, owner: &str, now: Millis, until: Millis) -> Result<bool> {
        let lease = PartitionLease { endpoint: endpoint.clone(), owner: owner.into(), now, until: Some(until) };
        partition_result(self.apply(vec![WriteOp::Partition(lease)]).await?.pop())
    }
    /// Gives a partition lease up (a no-op unless `owner` holds it).
    async fn release_partition(&self, endpoint: &EndpointId, owner: &str) -> Result<()> {
        let lease = PartitionLease { endpoint: endpoint.clone(), owner: owner.into(), now: 0, until: None };
        partition_result(self.apply(vec![WriteOp::Partition(lease)]).await?.pop()).map(drop)
    }
    /// Gives up every partition lease `owner` holds, or every lease at all (`None`: only for
    /// a store this node alone uses, at its start). The number given up.
    async fn release_partitions(&self, owner: Option<&str>) -> Result<u64>;
    /// What other nodes announce as they commit it: endpoints with new work, endpoints
    /// whose settings or state changed (`None`: single-node store).
    async fn subscribe(&self) -> Result<Option<mpsc::Receiver<Notice>>>;
    /// Tells the other nodes that these endpoints changed (after the change committed), so
    /// whichever node paces one re-reads it at once. A no-op on a single-node store.
    async fn announce_changed(&self, endpoints: &[EndpointId]) -> Result<()>;

    // Dead-letter recovery, health and retention.

    /// Dead letters of `tenant` matching a replay selection: how many, and the endpoints
    /// among them that are not active (a replay to those is refused).
    async fn dead_selection(
        &self,
        tenant: &TenantId,
        ids: Option<&[String]>,
        filter: Option<&DeadLetterFilter>,
    ) -> Result<(u64, Vec<EndpointId>)>;
    async fn create_replay(&self, replay: &Replay) -> Result<()>;
    async fn get_replay(&self, tenant: &TenantId, id: &str) -> Result<Option<ReplayProgress>>;
    /// Up to `limit` of a tenant's replays, newest first, older than the replay `after`.
    async fn list_replays(&self, tenant: &TenantId, after: Option<&str>, limit: u32) -> Result<Vec<ReplayProgress>>;
    /// Replays still running (to resume after a restart).
    async fn running_replays(&self) -> Result<Vec<Replay>>;
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
    /// Which of these replays are cancelled.
    async fn cancelled_replays(&self, ids: &[String]) -> Result<Vec<String>>;
    /// Dead letters of a tenant counted by reason.
    async fn dead_letter_counts(&self, tenant: &TenantId) -> Result<Vec<(String, u64)>>;
    /// Per tenant: the oldest unresolved dead letter, if older than `older_than`, and the count.
    async fn stale_dead_letters(&self, older_than: Millis) -> Result<Vec<(TenantId, Millis, u64)>>;
    /// The health of each of `endpoints` (a page of them) at `now`, in one statement: an
    /// endpoint without attempts or deliveries is left out (its health is the default).
    async fn endpoint_health_page(&self, endpoints: &[EndpointId], now: Millis) -> Result<HashMap<EndpointId, Health>>;
    /// One endpoint's health at `now` (see [`Store::endpoint_health_page`]).
    async fn endpoint_health(&self, endpoint: &EndpointId, now: Millis) -> Result<Health> {
        let mut page = self.endpoint_health_page(std::slice::from_ref(endpoint), now).await?;
        Ok(page.remove(endpoint).unwrap_or_default())
    }
    /// Queue depth, dead letters and endpoint states for the metrics, with the `top`
    /// endpoints that have the most due deliveries.
    async fn queue_stats(&self, now: Millis, top: u32) -> Result<QueueStats>;
    /// Deletes up to `limit` finished deliveries (delivered before `delivered_before`, dead
    /// before `dead_before`) with their attempts, then events left without deliveries.
    async fn purge(&self, delivered_before: Millis, dead_before: Millis, limit: u32) -> Result<u64>;
}

pub type DynStore = Arc<dyn Store>;

fn partition_result(r: Option<WriteResult>) -> Result<bool> {
    match r {
        Some(WriteResult::Partition(held)) => Ok(held),
        other => Err(StoreError::backend(format!("the store answered with the wrong kind: {other:?}"))),
    }
}

/// Opens the store named by `url` and applies its migrations.
pub async fn open(url: &str, max_connections: u32) -> Result<DynStore> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(sqlite::SqliteStore::open(url, max_connections).await?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(Arc::new(postgres::PostgresStore::open(url, max_connections).await?))
    } else {
        // The scheme only: the rest of a URL may hold a password.
        let scheme = url.split(':').next().unwrap_or_default();
        Err(StoreError::backend(format!("unsupported store url scheme {scheme:?}")))
    }
}
