//! What the delivery engine writes and hears: group commits ([`WriteOp`]), partition
//! leases, claim at intake ([`Handoff`]) and other nodes' notices. Callers: `worker` and
//! the [`Committer`](super::Committer). Beside it, [`Housekeeping`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};

use super::{CommitSink, Handoff, Notice, PartitionLease, Result, StoreError, WriteOp, WriteResult};
use crate::model::*;

/// The engine's side of the store: what both backends must do alike.
///
/// - A partition's lease (`WriteOp::Partition`) rides the group commit of its claim, and a
///   claim made under it checks the lease in the same transaction. A claim that gets less
///   than it asked for also says when the next delivery is due, so a partition at low rates
///   does not claim again until new work, a change, a retry or that time wakes it (new work
///   that arrives while it is still sending ends that state at once, so prefetch goes on).
/// - Claim at intake: while a partition knows nothing of its endpoint waits in the store and
///   holds its lease, it is open (`worker/known.rs`; `worker/partition/handoff.rs` gives it
///   the partition's facts: room for a claim's size, leases as long as a claim's), and the
///   intake commit stores that endpoint's new deliveries already leased to it (`Handoff`,
///   asked by the writer per delivery); they reach its queue through its signal's inbox with
///   no claim of their own. It opens in the writer's order of writes, not when it hears
///   back: the writer numbers its ops, and a partition claim that took all that was due is
///   told to the engine as it is applied (`Handoff::claimed`), inside its transaction, so no
///   intake op falls between the claim and the opening; a wake for an intake op numbered
///   before that claim is not news (`IngestOutcome::seq`). Without this, producers posting
///   at once kept every partition claiming. Postgres hands off too (its commit loop applies
///   one node's commits one at a time, numbered the same way), and its intake statement
///   checks the stored partition lease of each delivery it leases (owner and expiry, as a
///   claim does); one it cannot lease is queued and announced.
/// - On Postgres a commit holding only the engine's bookkeeping runs with
///   `synchronous_commit = off`: the next acknowledged commit flushes it.
/// - Ordered delivery: an ordered endpoint's deliveries carry an `ordering_key` (fan-out sets
///   it from the endpoint's `ordering` and the event's key). A claim takes only the heads of
///   their keys: `sql::heads` (each key's first unfinished delivery in intake order,
///   `rowid` on SQLite and `seq` on Postgres, read once per claim from the partial index
///   `deliveries_ordered`), looked up by key, beside the endpoint's unordered deliveries
///   (`sql::keyless`: `deliveries_due` under its NULL key), so a claim costs the same
///   however deep one key's backlog, and a key never has two deliveries claimed, whichever node
///   claims. Intake never hands an ordered delivery to a partition, and its result is
///   committed at once (`AttemptResult::ordered`); the attempt then tells its partition to
///   claim again (`Shared::settled` with a due time of now). On Postgres, intake takes a
///   transaction lock per (endpoint, key) before numbering its deliveries, so `seq` follows
///   commit order within a key.
#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// Applies every op in one durable transaction: all commit, or all fail.
    async fn apply(&self, ops: Vec<WriteOp>) -> Result<Vec<WriteResult>>;
    /// The store's own group-commit queue, batching up to `max_batch` ops per commit;
    /// `None` (the default): the [`Committer`](super::Committer) runs a loop over [`Engine::apply`].
    fn commit_sink(&self, _max_batch: usize) -> Option<Arc<dyn CommitSink>> {
        None
    }
    /// Lets intake commits lease new deliveries to this node's partitions (`handoff`)
    /// where the store can tell they hold their endpoint's lease. SQLite can: one node owns
    /// every partition in its file. Postgres checks the stored partition lease in the
    /// intake statement itself, as a claim does. The default never does: every delivery is
    /// queued and claimed under the partition lease checked in the claim's transaction.
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
    /// Takes the node id `id` for this process's life, so no other live process uses it:
    /// whoever holds it may take up every lease stored under it at once (see
    /// [`Housekeeping::recover_leases_of`]). `None`: another live process holds it. The
    /// default (a store one node owns, SQLite) always grants it: one process at a time
    /// opens the file's writer.
    async fn hold_node_id(&self, _id: &str) -> Result<Option<NodeIdLock>> {
        Ok(Some(NodeIdLock::unshared()))
    }
    /// Says node `id` is alive (or, `leaving`, that it no longer takes work) and returns
    /// the cluster's live nodes, `id` among them unless it is leaving: those seen within
    /// [`MEMBER_TIMEOUT`], by the store's own clock. The engine spreads the endpoints over
    /// them (`lease::preferred_node`). `None` (the default): a store one node owns, which
    /// paces every endpoint.
    async fn heartbeat(&self, _id: &str, _leaving: bool) -> Result<Option<Vec<String>>> {
        Ok(None)
    }
}

/// How long a node that stopped saying it is alive (killed, cut off) still counts as a
/// member: five heartbeats.
pub const MEMBER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A held node id (see [`Engine::hold_node_id`]); dropping it gives the id up.
pub struct NodeIdLock {
    /// Turns true if the id was lost for good: the store's session that held it ended and
    /// another process took the id before this one could take it back. This process must
    /// then stop using the id: its leases are the other's now.
    pub lost: watch::Receiver<bool>,
    /// Ends the task that keeps the id (and closes its session) when the lock is dropped.
    _keeper: Option<tokio::task::JoinHandle<()>>,
}

impl NodeIdLock {
    /// A lock nobody else can contend for.
    pub fn unshared() -> NodeIdLock {
        NodeIdLock { lost: watch::channel(false).1, _keeper: None }
    }

    /// A lock kept by `keeper`, which reports a loss on `lost`.
    pub(super) fn kept(lost: watch::Receiver<bool>, keeper: tokio::task::JoinHandle<()>) -> NodeIdLock {
        NodeIdLock { lost, _keeper: Some(keeper) }
    }
}

impl Drop for NodeIdLock {
    fn drop(&mut self) {
        if let Some(k) = &self._keeper {
            k.abort();
        }
    }
}

/// Numbers the ops a store's writer applies, in the order it applies them (see
/// `IngestOutcome::seq`). One counter for every store in the process: each writer's own
/// ops still rise.
static OP_SEQ: AtomicU64 = AtomicU64::new(1);

/// The next op's place in the order of writes.
pub(super) fn next_op_seq() -> u64 {
    OP_SEQ.fetch_add(1, Ordering::Relaxed)
}

pub(super) fn partition_result(r: Option<WriteResult>) -> Result<bool> {
    match r {
        Some(WriteResult::Partition(held)) => Ok(held),
        other => Err(StoreError::backend(format!("the store answered with the wrong kind: {other:?}"))),
    }
}

/// Crash recovery and retention: rewrites of rows nobody works on any more. Callers: the
/// engine's lease recovery (at start, and on its timer) and `ops`' purge.
#[async_trait]
pub trait Housekeeping: Send + Sync + 'static {
    /// Returns deliveries whose lease ended before `expired_before` to `waiting`, due at
    /// `now` (crash recovery).
    async fn recover_leases(&self, expired_before: Millis, now: Millis) -> Result<u64>;
    /// Returns every delivery leased to `owner` to `waiting`, due at `now`: at the start of
    /// a node that holds `owner`'s id (see [`Engine::hold_node_id`]), whatever its previous
    /// process held is abandoned, whenever its leases would end.
    async fn recover_leases_of(&self, owner: &str, now: Millis) -> Result<u64>;
    /// Ends every timed pause that has run out by `now` (see [`EndpointState`]): those
    /// endpoints are `active` again. Returns them (tenant, endpoint).
    ///
    /// [`EndpointState`]: crate::model::EndpointState
    async fn end_timed_pauses(&self, now: Millis) -> Result<Vec<(TenantId, EndpointId)>>;
    /// Deletes up to `limit` finished deliveries (delivered before `delivered_before`, dead
    /// before `dead_before`) with their attempts, then events left without deliveries, and
    /// up to `limit` audit log entries older than `delivered_before`. Returns the larger of
    /// the two counts: `limit` means there may be more of either.
    async fn purge(&self, delivered_before: Millis, dead_before: Millis, limit: u32) -> Result<u64>;
}
