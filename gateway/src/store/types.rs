//! The store's vocabulary: what the `Engine` writes (`WriteOp`) and gets back
//! (`WriteResult`), what a claim hands a worker (`Claimed`), claim at intake (`Handoff`),
//! and what the reads filter and report. Plain data; no SQL.

use crate::model::*;

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
/// store inside the intake commit, for each new delivery (see [`Engine::hand_off`](super::Engine::hand_off)).
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
    /// On an ordered endpoint: a dead-lettered head holds its key (`ordering_on_dead: block`).
    pub dead_heads_block: bool,
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
    /// The event's trace context, which each attempt passes on with a span id of its own.
    pub trace: Option<TraceContext>,
    /// The version of its type's schema the event was posted against (`None`: no schema).
    pub schema_version: Option<i64>,
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
            trace: event.trace.clone(),
            schema_version: event.schema_version,
        }
    }

    /// The replay that re-queued it, while it has not been sent since: if that replay is
    /// cancelled, it must not be sent (see [`Admin::cancel_replay`](super::Admin::cancel_replay)).
    pub fn unsent_of_replay(&self) -> Option<&str> {
        self.replay.as_deref().filter(|_| self.attempts == self.attempt_base)
    }
}

/// The trace context of a stored event (`traceparent`, `tracestate` columns); one stored
/// before it was validated, or damaged since, is none.
pub fn stored_trace(traceparent: Option<String>, tracestate: Option<String>) -> Option<TraceContext> {
    TraceContext::parse(&traceparent?, tracestate.as_deref())
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
    /// Its endpoint orders deliveries: the next of its key goes out only once this result
    /// is committed, so it never waits for a later commit.
    pub ordered: bool,
}

impl AttemptResult {
    /// A delivery delivered by its first attempt: the attempt is kept in the delivery's own
    /// row (its `first_*` columns, migration 0025), not in a row of `attempts`, and the
    /// reads of attempts add it back as it was. A delivered row is final, so the attempt
    /// never changes; any other result's attempt gets its own row.
    pub fn kept_in_delivery(&self) -> bool {
        self.state == DeliveryState::Delivered && self.attempt.number == 1
    }
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
    /// Who changes the state (kept with it, with the time of the change).
    pub by: StateBy,
    pub now: Millis,
}

impl EndpointChange {
    /// Back to `active` through the API (an enable, or what an API write resumes), no
    /// longer failing.
    pub fn reactivate(endpoint: EndpointId, now: Millis) -> EndpointChange {
        EndpointChange {
            endpoint,
            state: Some(EndpointState::Active),
            reason: None,
            paused_until: None,
            failing_since: Failing::Recovered,
            by: StateBy::Operator,
            now,
        }
    }
}

/// A message from another node sharing the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// These endpoints got new work.
    Work(Vec<EndpointId>),
    /// These endpoints' settings or state changed.
    Changed(Vec<EndpointId>),
    /// Notices may have been lost (the listener reconnected): any endpoint may have new
    /// work or changes.
    Missed,
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
    /// The audit entry of the API request whose ops come just before it in its commit
    /// (appended by the `Committer`): stored only when that op changed something
    /// ([`WriteResult::changed`]).
    Audit(Box<AuditEntry>),
}

impl WriteOp {
    /// Is this write acknowledged to someone outside the engine (a producer's 202, an API
    /// client's answer)? Such a commit reaches the disk before anyone is answered. The
    /// engine's own bookkeeping (claims, results, releases, leases) need not wait for the
    /// disk: the next acknowledged commit or checkpoint syncs it, and a power cut that
    /// takes it back only makes a delivery go out again (at least once), never loses one.
    pub fn acknowledged(&self) -> bool {
        matches!(self, WriteOp::Ingest(_) | WriteOp::Endpoint(_) | WriteOp::Audit(_))
    }

    /// May this write wait a few milliseconds for others to commit with it? An attempt's
    /// results: nothing a producer, a receiver or an endpoint's pacing waits for hangs on
    /// them (the endpoint's slot frees once the response is judged), so a store may hold
    /// them for the next commit instead of committing them alone.
    pub fn can_wait(&self) -> bool {
        matches!(self, WriteOp::Record(results) if !results.iter().any(|r| r.ordered))
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
    /// Was the audit entry stored (the op before it changed something)?
    Audit(bool),
}

impl WriteResult {
    /// Whether the op that answered this changed anything an audit entry would describe:
    /// an intake that stored no new event (duplicates, a conflict) did not.
    pub fn changed(&self) -> bool {
        match self {
            WriteResult::Ingest(outcomes) => outcomes.iter().any(|o| !o.duplicate && !o.conflict),
            WriteResult::Audit(_) => false,
            _ => true,
        }
    }
}

/// One unsettled delivery of a `poll` endpoint as its consumer reads it: its position in
/// the endpoint's order (see `sql::poll_page`) and its event.
#[derive(Debug, Clone, PartialEq)]
pub struct Polled {
    pub position: i64,
    pub delivery: DeliveryId,
    pub event_id: EventId,
    pub event_type: String,
    /// The payload, exactly as the producer posted it.
    pub payload: String,
    pub event_created_at: Millis,
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

/// What one turn of a replay did ([`Admin::replay_turn`](super::Admin::replay_turn)).
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

/// What [`Committer::record_with`](super::Committer::record_with) did.
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
    /// Only deliveries to one of these endpoints (a portal session's endpoint limit).
    pub endpoints: Option<Vec<EndpointId>>,
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
