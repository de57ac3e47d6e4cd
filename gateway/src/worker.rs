//! The delivery engine: the one place that composes the pure policies (`pace`, `lease`,
//! `classify`, `schedule`, `sign`, and its own `decide`) with I/O (`store`, `deliver`,
//! `plugin`). One partition task per endpoint with work claims leased batches, paces them on
//! absolute deadlines, sends them with bounded concurrency, and records each result through
//! the group committer.
//!
//! - this file: the engine's lifecycle, the scan for due work and lease recovery;
//! - [`partition`]: one endpoint's task (lease, claim, pace, dispatch);
//! - [`attempt`]: one attempt's I/O (envelope, plugins, headers, send, judge, record), with
//!   only what an attempt may touch ([`attempt::AttemptCtx`]);
//! - [`decide`]: what a verdict means for the delivery and its endpoint (pure);
//! - [`known`]: what a partition knows of its endpoint's work, and claim at intake (pure);
//! - [`members`]: which endpoints this node paces when nodes share a store;
//! - [`refresh`]: the node's check of its partitions' endpoints' versions, which tells a
//!   partition of a change nobody announced.
//!
//! A partition is a private `Partition` with named steps (hold the lease, refresh, prefetch,
//! refill or idle, send next). A change to its endpoint (API, another node's `NOTIFY`, or a
//! version moved in the store: [`refresh`]) wakes it from any wait and re-plans the pacer
//! from the new settings; a queue claimed at a faster rate (or a shorter timeout) goes back
//! to be claimed again (`signal`: what wakes it and what it shares with its attempts).

mod attempt;
mod decide;
mod known;
mod members;
mod partition;
mod refresh;
mod signal;
mod target;

pub use decide::{Decision, EndpointAction, EndpointEffect, decide, endpoint_effect};

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;

use crate::clock::Clock;
use crate::config::Config;
use crate::deliver::Deliverer;
use crate::metrics::Metrics;
use crate::model::{EndpointId, Millis};
use crate::ops::Ops;
use crate::plugin::PluginHost;
use crate::store::{Claimed, Committer, DynStore, Handoff, Notice, Release};
use crate::telemetry::Telemetry;
use attempt::{AttemptCtx, Recorder};

/// Follows the store's notices (where it has them: Postgres), so other nodes' work and
/// endpoint changes reach this node's partitions without waiting for a scan.
async fn listen(inner: &Arc<Inner>) {
    match inner.store.subscribe().await {
        Ok(Some(mut rx)) => {
            let listener = inner.clone();
            tokio::spawn(async move {
                while let Some(notice) = rx.recv().await {
                    match notice {
                        Notice::Work(ids) => ids.iter().for_each(|id| ensure_partition(&listener, id)),
                        Notice::Changed(ids) => signal_changed(&listener, &ids),
                        Notice::Missed => missed(&listener),
                    }
                }
            });
        }
        Ok(None) => {}
        Err(e) => tracing::error!(error = %e, "cannot listen for other nodes' work; scanning only"),
    }
}

/// How often the engine looks for due work it was not told about (retries coming due,
/// work added by other nodes) and for abandoned leases.
const SCAN_EVERY: Duration = Duration::from_secs(1);
const RECOVER_EVERY: Duration = Duration::from_secs(5);
/// A pause that needs a human lasts until someone re-enables the endpoint.
const HUMAN_PAUSE: Duration = Duration::from_secs(365 * 86_400);
/// How long a node holds an endpoint's partition, and when it renews it.
const PARTITION_LEASE: Duration = Duration::from_secs(15);
const PARTITION_RENEW_BEFORE: Duration = Duration::from_secs(5);
/// How long an idle partition waits for new work before it retires.
const IDLE_LINGER: Duration = Duration::from_secs(10);
/// How often a node on a shared store says it is alive and reads who else is.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// How long work may wait overdue, its partition lease held by nobody, before a node that
/// is not its endpoint's preferred one takes it over.
const TAKEOVER_AFTER: Duration = crate::store::MEMBER_TIMEOUT;
/// How long a node keeps another node's endpoint it took over before offering it back (its
/// owner takes it at its next scan if it is well; if not, it is taken over again).
const TAKEOVER_HOLD: Duration = Duration::from_secs(10);

/// Handle to the running engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    store: DynStore,
    committer: Committer,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    owner: String,
    partitions: Mutex<HashMap<EndpointId, Arc<signal::Signal>>>,
    /// Which endpoints are this node's to pace, when nodes share the store.
    members: members::Members,
    /// Held across each heartbeat; true once this node has left (no heartbeat after it).
    left: tokio::sync::Mutex<bool>,
    global: Arc<Semaphore>,
    scan: Notify,
    shutdown: watch::Receiver<bool>,
    /// The engine's time: every stored time it writes and every timer it sets.
    clock: Clock,
    /// Partition and attempt tasks, so shutdown can wait for them to finish.
    tasks: Arc<Tasks>,
    /// What every attempt gets: the deliverer, plugins, operational events and spans are
    /// the attempts' alone.
    attempts: Arc<AttemptCtx>,
}

impl Engine {
    /// Starts the engine as node `owner` (an id this process holds: see
    /// `store::Engine::hold_node_id`); it stops taking new work when `shutdown` turns true. Its clock
    /// reads the wall clock once, here, and follows tokio's from then on (so a paused
    /// runtime controls it).
    #[allow(clippy::too_many_arguments)] // one per part of the node it wires together
    pub async fn start(
        owner: String,
        store: DynStore,
        committer: Committer,
        config: Arc<Config>,
        metrics: Arc<Metrics>,
        ops: Ops,
        plugins: PluginHost,
        telemetry: Telemetry,
        catalog: Arc<crate::catalog::Catalog>,
        shutdown: watch::Receiver<bool>,
    ) -> Engine {
        let clock = Clock::new();
        let attempts = Arc::new(AttemptCtx {
            recorder: Recorder::new(committer.clone()),
            deliverer: Deliverer::new(config.delivery.allow_private_destinations),
            config: config.clone(),
            metrics: metrics.clone(),
            ops,
            plugins,
            clock,
            telemetry,
            catalog,
        });
        let inner = Arc::new(Inner {
            global: Arc::new(Semaphore::new(config.delivery.max_in_flight_total)),
            store,
            committer,
            config,
            metrics,
            members: members::Members::new(&owner),
            left: tokio::sync::Mutex::new(false),
            owner,
            partitions: Mutex::default(),
            scan: Notify::new(),
            shutdown,
            clock,
            tasks: Arc::default(),
            attempts,
        });
        recover(&inner).await;
        listen(&inner).await;
        inner.store.hand_off(Arc::new(Handoffs { inner: Arc::downgrade(&inner), owner: inner.owner.clone() }));
        tokio::spawn(heartbeats(inner.clone()));
        tokio::spawn(refresh::run(inner.clone()));
        tokio::spawn(dispatch(inner.clone()));
        tokio::spawn(close_relay(inner.clone()));
        Engine { inner }
    }

    /// The engine's clock, for the stored times others write (the API's).
    /// The engine's HTTP client (its OAuth2 tokens are the node's).
    pub fn deliverer(&self) -> Deliverer {
        self.inner.attempts.deliverer.clone()
    }

    pub fn clock(&self) -> Clock {
        self.inner.clock
    }

    /// Tells the engine that these endpoints have new work.
    pub fn poke(&self, endpoints: &[EndpointId]) {
        self.poke_after(endpoints, 0);
    }

    /// Tells the engine that these endpoints have new work from op `seq` in the store's
    /// order of writes (see `IngestOutcome::seq`): a running partition whose claim came
    /// after it and took all that was due is not woken.
    pub fn poke_after(&self, endpoints: &[EndpointId], seq: u64) {
        for id in endpoints {
            wake(&self.inner, id, seq);
        }
    }

    /// Gives deliveries leased at intake (see [`Handoff`]) to their partitions, starting
    /// one where none runs (it takes the endpoint's lease again, which this node holds).
    pub fn hand_over(&self, leased: impl IntoIterator<Item = (EndpointId, Claimed)>) {
        for (id, claimed) in leased {
            let mut parts = self.inner.partitions.lock().expect("partition map");
            match parts.get(&id) {
                Some(signal) => signal.hand(claimed),
                None => {
                    let signal = signal::Signal::default();
                    signal.hand(claimed);
                    start_partition(&self.inner, &mut parts, &id, signal);
                }
            }
        }
    }

    /// Tells the engine that these endpoints' settings or state changed (committed): a
    /// partition pacing one re-reads it and re-plans its next send at once, instead of
    /// waiting out an interval planned at the old rate. Other nodes learn through the store.
    pub fn changed(&self, endpoints: &[EndpointId]) {
        signal_changed(&self.inner, endpoints);
        let (store, endpoints) = (self.inner.store.clone(), endpoints.to_vec());
        tokio::spawn(async move {
            if let Err(e) = store.announce_changed(&endpoints).await {
                tracing::warn!(error = %e, "cannot tell other nodes about an endpoint change");
            }
        });
    }

    /// Asks the engine to look for due work now.
    pub fn scan(&self) {
        self.inner.scan.notify_one();
    }

    /// After `shutdown` turned true: wakes every partition so it hands its unsent claims
    /// back, and waits up to `grace` for them and for in-flight attempts to record their
    /// results. False when something was still running at the deadline (its leases then
    /// expire, or a restarted SQLite node recovers them at once).
    ///
    /// Once drained, nothing of this node is in flight: it gives its partition leases up
    /// (`release`: unless its id is now another process's), so whoever paces those
    /// endpoints next (its own restart, another node) starts at once rather than after the
    /// lease runs out.
    pub async fn drain(&self, grace: Duration, release: bool) -> bool {
        // Out of the cluster first, so the other nodes take this node's endpoints up as
        // their partitions here hand them back.
        heartbeat(&self.inner, true).await;
        for signal in self.inner.partitions.lock().expect("partition map").values() {
            signal.stop();
        }
        let drained = tokio::time::timeout(grace, self.inner.tasks.idle()).await.is_ok();
        if !drained {
            tracing::warn!(running = self.inner.tasks.live(), "shutdown grace ran out with attempts in flight");
            return false;
        }
        if !release {
            return true;
        }
        if let Err(e) = self.inner.store.release_partitions(Some(&self.inner.owner)).await {
            tracing::warn!(error = %e, "cannot give the partition leases up; they expire instead");
        }
        true
    }
}

/// Counts running engine tasks (mini-redis's shutdown latch, with a count for the log).
#[derive(Default)]
struct Tasks {
    live: AtomicUsize,
    finished: Notify,
}

/// Decrements the count when its task ends, however it ends.
struct TaskDone(Arc<Tasks>);

impl Tasks {
    fn spawn(self: &Arc<Self>, task: impl Future<Output = ()> + Send + 'static) {
        self.live.fetch_add(1, Ordering::AcqRel);
        let done = TaskDone(self.clone());
        // Boxed: an attempt's future is about 3 KiB, which tokio would otherwise copy into
        // the task cell on spawn and out of it again when the task finishes.
        let task = Box::pin(task);
        tokio::spawn(async move {
            let _done = done;
            task.await;
        });
    }

    fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Resolves once no task is running.
    async fn idle(&self) {
        loop {
            let finished = self.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            if self.live() == 0 {
                return;
            }
            finished.await;
        }
    }
}

impl Drop for TaskDone {
    fn drop(&mut self) {
        if self.0.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.finished.notify_waiters();
        }
    }
}

/// Takes up what the previous process of this node left: it never sends again. A single
/// SQLite node owns every lease in its file: whatever was in flight when that process died
/// is retried at once, and the partitions it held are free at once. On a shared store
/// this process holds its node id (no live process shares it), so the leases stored under
/// that id are taken up at once too; other nodes' wait until they expire.
async fn recover(inner: &Inner) {
    let alone = !inner.config.store_kind.is_shared();
    let now = inner.clock.now();
    let mut recovered = inner.store.recover_leases(if alone { Millis::MAX } else { now }, now).await;
    if !alone && let Ok(n) = recovered {
        recovered = inner.store.recover_leases_of(&inner.owner, now).await.map(|m| n + m);
    }
    match recovered {
        Ok(n) if n > 0 => {
            inner.metrics.leases_recovered.inc_by(n);
            tracing::info!(recovered = n, "recovered abandoned leases");
        }
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "lease recovery failed"),
    }
    let owner = if alone { None } else { Some(inner.owner.as_str()) };
    match inner.store.release_partitions(owner).await {
        Ok(n) if n > 0 => tracing::info!(released = n, "took up the partitions of the previous process"),
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "cannot free the previous process's partitions; they expire instead"),
    }
}

/// How long claims the database could not take back are tried again: past this their
/// leases have long expired and the scan has taken them up anyway.
const RELEASE_RETRY_FOR: Duration = Duration::from_secs(300);
/// The first wait before a write the database could not take is tried again, and the
/// longest.
const STORE_RETRY_FIRST: Duration = Duration::from_millis(100);
const STORE_RETRY_MAX: Duration = Duration::from_secs(1);

/// Hands claimed-but-unsent deliveries back. When the database is out of reach (a
/// restart, an outage) the release is tried again in the background until it is stored:
/// dropped, it would hold its deliveries back for the rest of their leases (the endpoint's
/// timeout plus the lease margin after the claim, most of a minute after the database's
/// return). Trying again is safe: a release is fenced, so one that outlived its claim is
/// refused, never applied to a later one.
async fn release(committer: &Committer, releases: Vec<Release>) {
    let count = releases.len();
    match committer.release(releases.clone()).await {
        Ok(()) => {}
        Err(e) if e.is_unavailable() => {
            tracing::warn!(count, error = %e, "cannot hand claims back yet; trying again until the database takes them");
            let committer = committer.clone();
            tokio::spawn(async move {
                let tried = Instant::now();
                let stored =
                    until_stored(Some(tried + RELEASE_RETRY_FOR), || committer.release(releases.clone())).await;
                match stored {
                    Ok(()) => tracing::info!(count, "handed claims back once the database returned"),
                    Err(e) => tracing::warn!(count, error = %e, "release failed; leases will expire instead"),
                }
            });
        }
        Err(e) => tracing::warn!(count, error = %e, "release failed; leases will expire instead"),
    }
}

/// Runs `write` until the database takes it, trying again while it is out of reach (until
/// `give_up`, when given): any other failure is returned at once, as is the last one.
async fn until_stored<T, F, Fut>(give_up: Option<Instant>, mut write: F) -> crate::store::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = crate::store::Result<T>>,
{
    let mut wait = STORE_RETRY_FIRST;
    loop {
        match write().await {
            Err(e) if e.is_unavailable() && give_up.is_none_or(|at| Instant::now() + wait < at) => {
                tracing::debug!(error = %e, "cannot store yet; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(STORE_RETRY_MAX);
            }
            done => return done,
        }
    }
}

fn ensure_partition(inner: &Arc<Inner>, id: &EndpointId) {
    wake(inner, id, 0);
}

/// Wakes `id`'s partition for work from op `seq` (see [`Engine::poke_after`]), whichever
/// node's endpoint it paces, starting one where none runs if the endpoint is this node's to
/// pace. False when no partition runs here for it.
fn wake(inner: &Arc<Inner>, id: &EndpointId, seq: u64) -> bool {
    let mut parts = inner.partitions.lock().expect("partition map");
    match parts.get(id) {
        Some(signal) => signal.work_after(seq),
        None if ours(inner, id.as_str()) => start_partition(inner, &mut parts, id, signal::Signal::default()),
        None => return false,
    }
    true
}

/// Whether this node paces `endpoint`: its share of the cluster (`members`), or a `listen`
/// endpoint whose listener is connected here, whatever the share says.
fn ours(inner: &Inner, endpoint: &str) -> bool {
    inner.attempts.deliverer.relay().connected(endpoint) || inner.members.mine(endpoint)
}

/// Ends the node's listener connections when it stops (each streams until then, and the
/// server waits for its requests to finish).
async fn close_relay(inner: Arc<Inner>) {
    let mut shutdown = inner.shutdown.clone();
    let _ = shutdown.wait_for(|s| *s).await;
    inner.attempts.deliverer.relay().close();
}

/// Starts a partition for another node's endpoint whose work nobody takes.
fn take_over(inner: &Arc<Inner>, id: &EndpointId) {
    let mut parts = inner.partitions.lock().expect("partition map");
    if !parts.contains_key(id) {
        tracing::info!(endpoint_id = %id, "taking over an endpoint its preferred node does not pace");
        start_partition(inner, &mut parts, id, signal::Signal::default());
    }
}

/// Writes this node's heartbeat every [`HEARTBEAT_EVERY`] until shutdown, on a task of its
/// own so a slow scan never makes the node look gone.
async fn heartbeats(inner: Arc<Inner>) {
    let mut shutdown = inner.shutdown.clone();
    let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !*shutdown.borrow() {
        tokio::select! {
            _ = tick.tick() => heartbeat(&inner, false).await,
            _ = shutdown.changed() => {}
        }
    }
}

/// Says this node is alive (or leaving) and takes the cluster's membership in; on a
/// store this node owns, a no-op.
async fn heartbeat(inner: &Inner, leaving: bool) {
    // One at a time, and none once left: a beat still under way when the node leaves
    // would otherwise write its row back.
    let mut left = inner.left.lock().await;
    if *left {
        return;
    }
    *left = leaving;
    match inner.store.heartbeat(&inner.owner, leaving).await {
        Ok(live) => {
            if inner.members.update(live, Instant::now()) {
                let nodes = inner.members.count();
                tracing::info!(nodes, "cluster membership changed");
                inner.metrics.cluster_nodes.set(nodes as i64);
                // Partitions waiting on a timer check at once whether their endpoint moved.
                inner.partitions.lock().expect("partition map").values().for_each(|s| s.nudge());
            }
        }
        Err(e) => {
            inner.members.cut_off();
            tracing::warn!(error = %e, "cannot write this node's heartbeat; keeping the last membership");
        }
    }
}

/// Claim at intake, the engine's side: the store asks, for each new delivery, whether its
/// endpoint's partition here takes it (open, lease held, room left).
struct Handoffs {
    inner: Weak<Inner>,
    owner: String,
}

impl Handoff for Handoffs {
    fn owner(&self) -> &str {
        &self.owner
    }

    fn lease(&self, endpoint: &str, now: Millis) -> Option<Millis> {
        let inner = self.inner.upgrade()?;
        let partitions = inner.partitions.lock().expect("partition map");
        partitions.get(endpoint)?.known(|k| k.lease(now))
    }

    fn claimed(&self, endpoint: &str, seq: u64, claimed: usize) {
        let Some(inner) = self.inner.upgrade() else { return };
        let partitions = inner.partitions.lock().expect("partition map");
        if let Some(signal) = partitions.get(endpoint) {
            signal.known(|k| k.claimed(seq, claimed));
        }
    }
}

/// Starts `id`'s partition with `signal` (the caller found none in `parts`).
fn start_partition(
    inner: &Arc<Inner>,
    parts: &mut HashMap<EndpointId, Arc<signal::Signal>>,
    id: &EndpointId,
    signal: signal::Signal,
) {
    let signal = Arc::new(signal);
    parts.insert(id.clone(), signal.clone());
    inner.metrics.partitions.inc();
    let (part, id) = (inner.clone(), id.clone());
    inner.tasks.spawn(async move {
        partition::run(part.clone(), id, signal).await;
        part.metrics.partitions.dec();
    });
}

/// Wakes the partitions of changed endpoints (a change to an endpoint without one takes
/// effect when its partition starts: it reads the endpoint first).
fn signal_changed(inner: &Inner, endpoints: &[EndpointId]) {
    let parts = inner.partitions.lock().expect("partition map");
    for signal in endpoints.iter().filter_map(|id| parts.get(id)) {
        signal.changed();
    }
}

/// Notices from other nodes were lost (the store's listener reconnected): every running
/// partition reads its endpoint again, and the scan looks for work now, so none waits for
/// a wake that never came (a node still holding a partition lease while another queues its
/// endpoint's deliveries would otherwise sit on them until the lease ran out).
fn missed(inner: &Inner) {
    for signal in inner.partitions.lock().expect("partition map").values() {
        signal.changed();
    }
    inner.scan.notify_one();
}

/// The engine's background loop: every [`SCAN_EVERY`] (or when asked) it starts a
/// partition for each endpoint with work coming due, and every [`RECOVER_EVERY`] it hands
/// abandoned leases back.
async fn dispatch(inner: Arc<Inner>) {
    let mut shutdown = inner.shutdown.clone();
    let mut last_recover = Instant::now();
    inner.metrics.cluster_nodes.set(1);
    // Other nodes' endpoints with due work and no lease held, since when this node has seen
    // them so.
    let mut unheld = HashMap::new();
    loop {
        if *shutdown.borrow() {
            return;
        }
        match inner.store.pending_endpoints().await {
            Ok(pending) => scan(&inner, pending, &mut unheld).await,
            Err(e) => {
                // What was seen unheld before is no evidence across a gap: a takeover counts
                // only time watched.
                unheld.clear();
                tracing::warn!(error = %e, "scan for due work failed");
            }
        }
        end_timed_pauses(&inner).await;
        if last_recover.elapsed() >= RECOVER_EVERY {
            last_recover = Instant::now();
            match inner.store.recover_leases(inner.clock.now(), inner.clock.now()).await {
                Ok(n) if n > 0 => {
                    inner.metrics.leases_recovered.inc_by(n);
                    tracing::warn!(recovered = n, "recovered abandoned leases");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "lease recovery failed"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(SCAN_EVERY) => {}
            _ = inner.scan.notified() => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Ends the timed pauses that have run out, in the store: the endpoint's state says
/// `active` again (the API, the console, health, `herald_endpoints`, replays), not only its
/// partition's pacer. Every node does it on each scan; the first to see one ends it.
async fn end_timed_pauses(inner: &Arc<Inner>) {
    match inner.store.end_timed_pauses(inner.clock.now()).await {
        Ok(ended) if !ended.is_empty() => {
            for (tenant, endpoint) in &ended {
                tracing::info!(
                    tenant = %tenant, endpoint_id = %endpoint, state = "active",
                    "endpoint state change: its timed pause ended"
                );
            }
            let ids: Vec<EndpointId> = ended.into_iter().map(|(_, id)| id).collect();
            signal_changed(inner, &ids);
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot end timed pauses"),
    }
}

/// Wakes the partition running here of each endpoint with work coming due, whichever node
/// it belongs to (a partition still pacing another node's endpoint claims what that node
/// queued, when no notice woke it); starts one for each of this node's endpoints without
/// one, and for each of another node's whose due work this node has seen with no lease
/// held for [`TAKEOVER_AFTER`] (`unheld`: since when, kept from scan to scan).
async fn scan(inner: &Arc<Inner>, pending: Vec<(EndpointId, Millis)>, unheld: &mut HashMap<EndpointId, Instant>) {
    let now = inner.clock.now();
    let mut orphans = std::collections::HashSet::new();
    for (id, due) in pending {
        if due > now + SCAN_EVERY.as_millis() as i64 {
            continue;
        }
        if !wake(inner, &id, 0) && due <= now {
            orphans.insert(id);
        }
    }
    if orphans.is_empty() {
        unheld.clear();
        return;
    }
    let held = match inner.store.held_partitions(now).await {
        Ok(held) => held,
        Err(e) => return tracing::warn!(error = %e, "cannot read the partition leases"),
    };
    for id in &held {
        orphans.remove(id);
    }
    unheld.retain(|id, _| orphans.contains(id));
    let seen = Instant::now();
    for id in orphans {
        let since = *unheld.entry(id.clone()).or_insert(seen);
        if seen.duration_since(since) >= TAKEOVER_AFTER {
            unheld.remove(&id);
            take_over(inner, &id);
        }
    }
}

impl crate::intake::Wake for Engine {
    fn poke_after(&self, endpoints: &[EndpointId], seq: u64) {
        Engine::poke_after(self, endpoints, seq);
    }
    fn hand_over(&self, leased: &mut dyn Iterator<Item = (EndpointId, Claimed)>) {
        Engine::hand_over(self, leased);
    }
    fn changed(&self, endpoints: &[EndpointId]) {
        Engine::changed(self, endpoints);
    }
    fn clock(&self) -> Clock {
        Engine::clock(self)
    }
}
