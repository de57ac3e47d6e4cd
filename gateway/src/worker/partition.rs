//! One endpoint's partition task: it holds the endpoint's partition lease, claims leased
//! batches of due deliveries (ahead of need), paces them with the endpoint's `Pacer`, and
//! spawns an [`attempt`](super::attempt) for each permit. It never judges an outcome.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{IDLE_LINGER, Inner, SCAN_EVERY, TAKEOVER_HOLD, attempt, ensure_partition};
use crate::lease;
use crate::metrics::TenantCounters;
use crate::model::{Endpoint, EndpointId, EndpointKind, EndpointSpec, EndpointState, Gate, Millis, Sendable};
use crate::pace::{Pacer, Permit};
use crate::schedule::RetryOverride;
use crate::store::{ClaimBatch, ClaimRequest, Claimed, PartitionLease, Release, Result as StoreResult};

mod batch;
mod handoff;
mod held;
mod verify;

use super::known::{Known, Stored};
use super::signal::{Shared, Signal, Target};
use super::target::Opened;

/// Runs one endpoint's partition until it retires (idle, lease lost, endpoint gone) or the
/// engine shuts down. Each turn of the loop is a list of named steps.
pub(super) async fn run(inner: Arc<Inner>, id: EndpointId, signal: Arc<Signal>) {
    let mut p = Partition::new(inner, id, signal);
    loop {
        p.collect_prefetch(false).await;
        p.collect_handed();
        if p.signal.known(Known::take_changed) {
            p.hand_back_cancelled().await;
        }
        // New work while sending: the queue ran dry of what the last claim knew.
        p.signal.known(Known::take_fresh);
        if *p.inner.shutdown.borrow() {
            p.hand_back(p.inner.clock.now()).await;
            return;
        }
        if !p.hold().await {
            // Another node paces this endpoint; look again when its lease may have lapsed.
            p.hand_back(p.inner.clock.now()).await;
            if p.retire() {
                return;
            }
            continue;
        }
        if p.moved_away() {
            // A node joined and this endpoint is its now: hand it over.
            p.give_up().await;
            if p.retire() {
                return;
            }
            continue;
        }
        p.publish_open();
        if !p.queue.is_empty() {
            if !p.refresh_if_stale().await {
                continue;
            }
            p.prefetch_claim(false);
        }
        if p.queue.is_empty() {
            match p.refill_or_idle().await {
                Flow::Send => {}
                Flow::Again => continue,
                Flow::Stop => return,
            }
        }
        if let Flow::Stop = p.send_next().await {
            return;
        }
    }
}

/// What the partition loop does after a step.
enum Flow {
    /// Go on to the next step.
    Send,
    /// Start the loop over.
    Again,
    /// The partition ends.
    Stop,
}

/// One partition's state, owned by its task.
struct Partition {
    inner: Arc<Inner>,
    id: EndpointId,
    /// Poked when the endpoint gets new work or changes.
    signal: Arc<Signal>,
    /// Claimed deliveries not yet sent, in claim order.
    queue: VecDeque<Claimed>,
    /// Created by the first successful refill; shared with in-flight attempts.
    shared: Option<Arc<Shared>>,
    /// The endpoint's settings as of the last refill or refresh.
    target: Option<Arc<Target>>,
    /// A claim running ahead of need, so the queue never runs dry while the pacer has slots
    /// (with the size it asked for).
    prefetch: Option<JoinHandle<(usize, LeasedClaim)>>,
    /// Until when this node's partition lease is known to hold.
    held: Option<Instant>,
    /// The endpoint's tenant's outcome counters for its kind, looked up once per partition.
    counters: Option<TenantCounters>,
    /// A renewal of the partition lease riding the next group commit while sending goes on.
    renewal: Option<JoinHandle<(Instant, StoreResult<bool>)>>,
    /// The endpoint as last read (its version is the signal's, which the node checks).
    endpoint: Option<Endpoint>,
    rng: StdRng,
    /// The cluster membership this partition last checked its endpoint against, and
    /// whether the endpoint then belonged to another node.
    members_seen: u64,
    moved: bool,
    /// Since when it paces another node's endpoint it took over (see [`TAKEOVER_HOLD`]).
    took_over: Option<Instant>,
    /// A batching endpoint's: when the oldest queued delivery fell due, once looked at.
    batch_since: Option<Millis>,
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.signal.known(Known::close);
        self.set_held(None);
    }
}

/// A claim made under the partition lease: when it was submitted if it renewed the lease,
/// and what it got (`None`: another node holds the partition; an error claims nothing and
/// proves nothing).
type LeasedClaim = (Option<Instant>, StoreResult<Option<ClaimBatch>>);

enum Refill {
    Claimed(Arc<Target>),
    /// Another node holds the endpoint's partition.
    Lost,
    /// Nothing due; the earliest due time, if any work is waiting.
    Idle(Option<Millis>),
    /// The endpoint is gone, disabled, held for a human, or of kind `poll` (read, not sent).
    Gone,
}

impl Partition {
    fn new(inner: Arc<Inner>, id: EndpointId, signal: Arc<Signal>) -> Partition {
        let took_over = (!super::ours(&inner, id.as_str())).then(Instant::now);
        Partition {
            id,
            signal,
            queue: VecDeque::new(),
            shared: None,
            target: None,
            prefetch: None,
            held: None,
            counters: None,
            renewal: None,
            endpoint: None,
            rng: StdRng::from_rng(&mut rand::rng()),
            members_seen: inner.members.generation(),
            moved: false,
            took_over,
            batch_since: None,
            inner,
        }
    }

    /// Adds a finished prefetch to the queue; with `wait`, or when the queue is empty,
    /// waits for a running one.
    async fn collect_prefetch(&mut self, wait: bool) {
        let ready = self.prefetch.as_ref().is_some_and(|h| wait || h.is_finished() || self.queue.is_empty());
        if ready && let Some(h) = self.prefetch.take() {
            let answer = h.await;
            self.signal.known(Known::forget_terms);
            match answer {
                Ok((limit, leased)) => {
                    let committed = leased.1.is_ok();
                    if let Some(batch) = self.note_claim(leased) {
                        let short = committed && batch.claimed.len() < limit;
                        self.signal.known(|k| k.prefetched(short, batch.next_due));
                        self.queue.extend(batch.claimed);
                    }
                }
                Err(e) => tracing::error!(endpoint_id = %self.id, error = %e, "prefetch claim task failed"),
            }
        }
    }

    /// Hands every claimed-but-unsent delivery back (a running prefetch's and those leased
    /// to it at intake too), due at `at`.
    async fn hand_back(&mut self, at: Millis) {
        // Closed first: it is giving work back, not taking more.
        self.signal.known(Known::close);
        self.collect_prefetch(true).await;
        self.queue.extend(self.signal.known(Known::take_inbox));
        self.release_queue(at).await;
    }

    /// Whether the endpoint went to another node since this partition last looked (the
    /// membership changed: a node joined). A partition that took over another node's
    /// endpoint offers it back after [`TAKEOVER_HOLD`].
    fn moved_away(&mut self) -> bool {
        let generation = self.inner.members.generation();
        let offer_back = self.took_over.is_some_and(|at| at.elapsed() >= TAKEOVER_HOLD);
        if generation != self.members_seen || offer_back {
            self.members_seen = generation;
            self.moved = !super::ours(&self.inner, self.id.as_str());
            self.took_over = None;
        }
        self.moved
    }

    /// Hands the unsent claims back and gives the partition lease up, so the endpoint's
    /// node takes it at its next scan. Attempts in flight finish and record here: their
    /// deliveries are leased one by one, so nothing is sent twice.
    async fn give_up(&mut self) {
        self.hand_back(self.inner.clock.now()).await;
        self.collect_renewal(true).await;
        let release =
            PartitionLease { endpoint: self.id.clone(), owner: self.inner.owner.clone(), now: 0, until: None };
        match self.inner.committer.hold_partition(release).await {
            Ok(_) => tracing::info!(endpoint_id = %self.id, "handed the endpoint to the node it now belongs to"),
            Err(e) => {
                tracing::warn!(endpoint_id = %self.id, error = %e, "cannot give the partition lease up; it expires")
            }
        }
        self.set_held(None);
    }

    /// Removes the partition from the map; the periodic scan or the next poke starts it
    /// again when work arrives. Its partition lease is kept until it expires, so a partition
    /// that restarts here at once never races another node for it. False when deliveries
    /// were leased to it at intake meanwhile: it goes on (the map's lock orders the two).
    fn retire(&self) -> bool {
        let mut parts = self.inner.partitions.lock().expect("partition map");
        if !self.signal.known(Known::retire) {
            return false;
        }
        parts.remove(&self.id);
        true
    }

    fn counters(&mut self, endpoint: &Endpoint) -> TenantCounters {
        // Looked up again only when the endpoint's kind changed (a PATCH may change it).
        let kind = endpoint.spec.target.kind();
        match &self.counters {
            Some(c) if c.kind() == kind.as_str() => c.clone(),
            _ => self.counters.insert(self.inner.metrics.tenant(endpoint.tenant.as_str(), kind)).clone(),
        }
    }

    /// Re-reads a busy endpoint's settings and state after a change (announced, or found by
    /// the node's check of versions: [`super::refresh`]), or when it has no target to send
    /// on (dropped for a verification). False when the endpoint stopped being sendable and
    /// the queue was handed back; a queue that could outlive its leases on the new settings
    /// is handed back too, to be claimed again.
    async fn refresh_if_stale(&mut self) -> bool {
        if !self.signal.known(|k| k.stale()) && self.target.is_some() {
            return true;
        }
        let read = self.inner.store.endpoint(&self.id).await;
        self.note_read(&read);
        match read {
            Ok(Some(e)) if e.sendable_at(self.inner.clock.now()) == Sendable::Yes && e.verify_gate(0) == Gate::Open => {
                if self.target.as_ref().is_some_and(|t| outlives_leases(&t.endpoint.spec, &e.spec)) {
                    // Claimed on the old settings, leased for the old rate and timeout: at a
                    // slower rate (or with a longer timeout) the queue would outlive those
                    // leases, and lease recovery would hand them out again while it still sends
                    // them. Handed back, they are claimed again on the new settings.
                    self.release_queue(self.inner.clock.now()).await;
                }
                if let Some(sh) = self.shared.clone() {
                    self.repace(&sh, &e);
                }
                let counters = self.counters(&e);
                self.target = Some(Arc::new(make_target(&self.inner, e, counters, self.inner.clock.now())));
                true
            }
            Ok(read) => {
                // Disabled, paused, gone or to be verified (again): hand the queue back; the
                // refill decides. One to be verified sends nothing more on the settings of
                // before (a new URL), nor takes deliveries at intake, until its refill.
                if read.is_some_and(|e| e.verify_gate(0) != Gate::Open) {
                    self.target = None;
                }
                self.release_queue(self.inner.clock.now()).await;
                false
            }
            Err(e) => {
                tracing::warn!(endpoint_id = %self.id, error = %e, "cannot refresh endpoint");
                true
            }
        }
    }

    /// Starts the next claim while half the current one is still queued, or at once with
    /// `now` (a batch waiting for company); unless the last claim found less than it asked
    /// for: new work will say so.
    fn prefetch_claim(&mut self, now: bool) {
        let (None, Some(tg)) = (&self.prefetch, &self.target) else { return };
        if self.signal.known(|k| k.stored()) != Stored::Unknown {
            return;
        }
        let req =
            claim_request(&self.inner, &self.id, &tg.endpoint.spec, self.queue.len() as u32, self.inner.clock.now());
        if !now && self.queue.len() > req.limit as usize / 2 {
            return;
        }
        let (committer, metrics) = (self.inner.committer.clone(), self.inner.metrics.clone());
        let renew = self.renew_with_claim(req.now);
        let renewed = renew.map(|_| Instant::now());
        self.expect_drained(&tg.endpoint.spec, renewed);
        let limit = req.limit as usize;
        self.prefetch = Some(tokio::spawn(async move {
            let claim = metrics.claim_duration.time(committer.claim_in_partition(req, renew)).await;
            (limit, (renewed, claim))
        }));
    }

    /// Claims more work; when there is none, waits for it (or lingers and retires).
    async fn refill_or_idle(&mut self) -> Flow {
        if let Stored::Drained { next_due } = self.known_due() {
            return self.idle(next_due).await;
        }
        match self.refill().await {
            Refill::Claimed(t) => {
                self.target = Some(t);
                Flow::Send
            }
            Refill::Idle(wake_at) => self.idle(wake_at).await,
            Refill::Lost | Refill::Gone => {
                // Lost: another node paces this endpoint; look again when its lease may have
                // lapsed. Gone: whatever was leased to it at intake settles as it is handed back.
                self.hand_back(self.inner.clock.now()).await;
                if self.retire() { Flow::Stop } else { Flow::Again }
            }
        }
    }

    /// Nothing to send: sleep until `wake_at`, a poke or a freed slot; with nothing waiting
    /// and nothing in flight, linger, then retire.
    async fn idle(&mut self, wake_at: Option<Millis>) -> Flow {
        self.publish_open();
        let busy = self.shared.as_ref().is_some_and(|s| s.busy());
        if wake_at.is_none() && !busy {
            // Linger before retiring: a partition that came and went with every event would
            // re-take its lease (a write) and respawn each time. A change (or the cluster's
            // membership) ends the linger too: the endpoint may have moved to another node,
            // which waits for this lease until it is given up.
            tokio::select! {
                _ = self.signal.work.notified() => {
                    // Deliveries handed over at intake leave what is known of the store standing.
                    self.signal.known(Known::take_fresh);
                    return Flow::Again;
                }
                _ = self.signal.change.notified() => return Flow::Again,
                _ = tokio::time::sleep(IDLE_LINGER) => {}
            }
            if !super::ours(&self.inner, self.id.as_str()) {
                // Another node's endpoint (taken over, or paced here while the membership
                // was out of date): its lease is given up rather than left to run out, so
                // that node takes the endpoint at its next scan.
                self.give_up().await;
            }
            if !self.retire() {
                return Flow::Again;
            }
            // Work that arrived between the timeout and the retirement.
            let block = self.endpoint.as_ref().is_some_and(|e| e.spec.dead_heads_block());
            if matches!(self.inner.store.next_due(&self.id, block).await, Ok(Some(_))) {
                ensure_partition(&self.inner, &self.id);
            }
            return Flow::Stop;
        }
        let clock = self.inner.clock;
        let wake = wake_at.map_or(Instant::now() + SCAN_EVERY, |at| clock.instant_at(at.min(clock.now() + 60_000)));
        let freed = async {
            match &self.shared {
                Some(s) => s.freed.notified().await,
                None => std::future::pending().await,
            }
        };
        // A finished attempt leaves what is known of the next due time standing.
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => self.signal.known(Known::forget_due),
            // A wake whose work the loop already saw (and claimed) leaves what is known standing.
            _ = self.signal.work.notified() => {
                self.signal.known(Known::take_fresh);
            }
            _ = self.signal.change.notified() => self.signal.known(Known::forget_due),
            _ = freed => {}
        }
        Flow::Again
    }

    /// Reads the endpoint, (re)configures the pacer and claims a batch of due deliveries.
    async fn refill(&mut self) -> Refill {
        let (inner, id) = (&self.inner, &self.id);
        let (read, fresh) = match self.cached_endpoint() {
            Some(e) => (Ok(Some(e)), false),
            None => {
                let read = inner.store.endpoint(id).await;
                self.note_read(&read);
                (read, true)
            }
        };
        let id = &self.id;
        let mut endpoint = match read {
            Ok(Some(e)) => e,
            Ok(None) => return Refill::Gone,
            Err(e) => {
                tracing::warn!(endpoint_id = %id, error = %e, "cannot read endpoint");
                return Refill::Idle(Some(self.inner.clock.now() + 1_000));
            }
        };
        if endpoint.spec.target.kind().is_pull() {
            // A consumer reads a `poll` endpoint's deliveries: this node sends none of them
            // (they are stored never due; a replayed one waits here for the consumer too).
            return Refill::Gone;
        }
        let now = self.inner.clock.now();
        match endpoint.sendable_at(now) {
            Sendable::Yes => {}
            Sendable::PausedUntil(until) => return Refill::Idle(Some(until)),
            Sendable::No => return Refill::Gone,
        }
        if let Some(next_try) = self.unverified(&mut endpoint, now).await {
            return Refill::Idle(Some(next_try));
        }
        if self.unplugged(&endpoint) {
            self.hand_back(now).await;
            return Refill::Idle(Some(now + UNPLUGGED_LOOK_AGAIN));
        }
        let Some(sh) = self.configure(&endpoint) else { return Refill::Gone };
        if let Some(until) = sh.pacer.lock().expect("pacer").paused_until()
            && until > Instant::now()
        {
            return Refill::Idle(Some(self.inner.clock.millis_at(until)));
        }
        let counters = self.counters(&endpoint);
        let target = Arc::new(make_target(&self.inner, endpoint, counters, now));
        if fresh {
            // The read cleared the news of a change: whatever is sent from now on, even
            // deliveries leased at intake after this refill finds nothing, is sent on it
            // (a rotated secret signs the next delivery).
            self.target = Some(target.clone());
        }
        let handed = self.signal.known(Known::take_inbox);
        if !handed.is_empty() {
            // Leased at intake: nothing to claim for them.
            self.queue.extend(handed);
            return Refill::Claimed(target);
        }
        let (inner, id) = (&self.inner, &self.id);
        let spec = &target.endpoint.spec;
        let req = claim_request(inner, id, spec, 0, now);
        let limit = req.limit as usize;
        let renew = self.renew_with_claim(now);
        let renewed = renew.map(|_| Instant::now());
        self.expect_drained(spec, renewed);
        let claim = inner.metrics.claim_duration.time(inner.committer.claim_in_partition(req, renew)).await;
        self.signal.known(Known::forget_terms);
        let failed = claim.is_err();
        let Some(batch) = self.note_claim((renewed, claim)) else { return Refill::Lost };
        if failed {
            return Refill::Idle(Some(self.inner.clock.now() + 500));
        }
        self.signal.known(|k| k.refilled(batch.claimed.len() < limit, batch.next_due));
        if batch.claimed.is_empty() {
            return Refill::Idle(batch.next_due);
        }
        self.queue.extend(batch.claimed);
        Refill::Claimed(target)
    }

    /// The endpoint as last read, while it may stand for the stored one: no change
    /// announced or found by the node's check of versions since, and not halted by an
    /// attempt (which changed its state itself). A refill at every event would otherwise
    /// read it again.
    fn cached_endpoint(&self) -> Option<Endpoint> {
        let halted = self.shared.as_ref().is_none_or(|sh| sh.halted.load(Ordering::Acquire));
        if halted || self.signal.known(|k| k.stale()) {
            return None;
        }
        self.endpoint.clone()
    }

    /// Keeps what was read, and tells the node's check of versions which version it was.
    fn note_read(&mut self, read: &StoreResult<Option<Endpoint>>) {
        self.endpoint = read.as_ref().ok().cloned().flatten();
        self.signal.read_at(self.endpoint.as_ref().map(|e| e.version));
        if let Some(e) = &self.endpoint {
            let listen = e.spec.target.kind() == EndpointKind::Listen;
            self.inner.members.pin(self.id.as_str(), e.listener.as_deref().filter(|_| listen));
        }
    }

    /// A `listen` endpoint whose listener is not connected to this node: nothing is
    /// claimed, taken at intake or sent, and its deliveries wait in the store as a paused
    /// endpoint's do (no attempt, so no retry counts), until a listener connects here or
    /// the endpoint moves to the node it connected to (`Members::pin`).
    fn unplugged(&self, endpoint: &Endpoint) -> bool {
        endpoint.spec.target.kind() == EndpointKind::Listen
            && !self.inner.attempts.deliverer.relay().connected(self.id.as_str())
    }

    /// The partition's shared state, created on first use and re-paced to `endpoint`'s
    /// settings afterwards. `None` when the stored pacing is invalid.
    fn configure(&mut self, endpoint: &Endpoint) -> Option<Arc<Shared>> {
        let spec = &endpoint.spec;
        if let Some(sh) = self.shared.clone() {
            self.repace(&sh, endpoint);
            sh.halted.store(false, Ordering::Release);
            return Some(sh);
        }
        let pacer = match Pacer::try_new(spec.rate_per_sec, spec.burst, spec.max_in_flight) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(endpoint_id = %self.id, field = e.field(), error = %e, "invalid pacing");
                return None;
            }
        };
        let sh = Arc::new(Shared::new(pacer, endpoint.failing_since));
        self.shared = Some(sh.clone());
        Some(sh)
    }

    /// Applies the endpoint's pacing as read. The pacer re-plans its next deadline from the
    /// new rate (GCRA trims debt planned at a slower one). After a change, an endpoint
    /// that is active again (re-enabled) also drops a pause this partition set itself.
    fn repace(&mut self, sh: &Shared, endpoint: &Endpoint) {
        let spec = &endpoint.spec;
        let mut pacer = sh.pacer.lock().expect("pacer");
        if let Err(e) = pacer.reconfigure(spec.rate_per_sec, spec.burst, spec.max_in_flight) {
            tracing::warn!(endpoint_id = %self.id, field = e.field(), error = %e, "keeping previous pacing");
        }
        if self.signal.known(Known::read) && endpoint.state == EndpointState::Active {
            pacer.resume();
        }
    }

    /// Asks the pacer, and sends the next delivery when it allows; otherwise waits as it says.
    async fn send_next(&mut self) -> Flow {
        let (Some(sh), Some(tg)) = (self.shared.clone(), self.target.clone()) else { return Flow::Again };
        if self.signal.known(|k| k.has_changed()) {
            // A change that came during a claim is seen before anything more is sent (it
            // may have cancelled a replay whose deliveries that claim took).
            return Flow::Again;
        }
        if sh.halted.load(Ordering::Acquire) || self.unplugged(&tg.endpoint) {
            self.release_queue(self.inner.clock.now()).await;
            return Flow::Again;
        }
        let batch = tg.endpoint.spec.batch;
        if let Some(b) = &batch
            && let Some(until) = self.batch_wait(b)
        {
            return self.wait_for_company(until).await;
        }
        let permit = sh.pacer.lock().expect("pacer").poll(Instant::now());
        match permit {
            Permit::Go => {
                let Some(claimed) = self.take(batch.as_ref()) else { return Flow::Again };
                let Ok(slot) = self.inner.global.clone().acquire_owned().await else { return Flow::Stop };
                let seed = StdRng::from_rng(&mut self.rng);
                let link = sh.attempt_started();
                self.inner.tasks.spawn(attempt::run(self.inner.attempts.clone(), link, tg, claimed, slot, seed));
            }
            Permit::WaitUntil(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = self.signal.change.notified() => {}
                }
            }
            Permit::Full => {
                tokio::select! {
                    _ = tokio::time::sleep(SCAN_EVERY) => {}
                    _ = sh.freed.notified() => {}
                    _ = self.signal.change.notified() => {}
                }
            }
            Permit::Paused(until) => {
                let resume_at = self.inner.clock.millis_at(until);
                self.release_queue(resume_at).await;
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => {}
                    _ = self.signal.work.notified() => {}
                    _ = self.signal.change.notified() => {}
                }
            }
        }
        Flow::Again
    }
}

/// How often a `listen` partition whose listener is not connected here looks again (a
/// listener connecting here wakes it at once).
const UNPLUGGED_LOOK_AGAIN: Millis = 1_000;

/// The next claim of a partition that still holds `queued` unsent deliveries: about a
/// second of its rate, leased long enough to send all of them at that rate (a batching
/// endpoint's requests carry up to `max_events` each, after a wait of up to `max_wait`).
fn claim_request(inner: &Inner, id: &EndpointId, spec: &EndpointSpec, queued: u32, now: Millis) -> ClaimRequest {
    let limit = claim_limit(spec);
    let timeout = Duration::from_millis(spec.timeout_ms);
    let margin = inner.config.delivery.lease_margin;
    let (per_request, wait) = spec.batch.map_or((1, 0), |b| (b.max_events, b.max_wait_ms as i64));
    let events_per_sec = spec.rate_per_sec * f64::from(per_request);
    ClaimRequest {
        endpoint: id.clone(),
        now,
        limit,
        owner: inner.owner.clone(),
        lease_until: lease::lease_until(now, queued + limit, events_per_sec, timeout, margin).saturating_add(wait),
        in_partition: true,
        dead_heads_block: spec.dead_heads_block(),
    }
}

/// How many deliveries a claim asks for: about a second of the endpoint's rate, in events
/// (a batching endpoint's requests carry up to `max_events` each).
fn claim_limit(spec: &EndpointSpec) -> u32 {
    let n = spec.batch.map_or(1, |b| b.max_events);
    lease::claim_size(
        spec.rate_per_sec * f64::from(n),
        spec.burst.saturating_mul(n),
        spec.max_in_flight.saturating_mul(n),
    )
}

/// Whether deliveries claimed on settings `old` may outlive their leases once sent on
/// `new`: a lease covers the claim's sending time at `old`'s rate (in events) and `old`'s
/// timeout, and its batches' wait.
fn outlives_leases(old: &EndpointSpec, new: &EndpointSpec) -> bool {
    let batch = |s: &EndpointSpec| s.batch.map_or((1, 0), |b| (b.max_events, b.max_wait_ms));
    let ((old_n, old_wait), (new_n, new_wait)) = (batch(old), batch(new));
    new.rate_per_sec * f64::from(new_n) < old.rate_per_sec * f64::from(old_n)
        || new.timeout_ms > old.timeout_ms
        || new_wait > old_wait
}

/// The endpoint's effective retry policy, and its material opened at `now` (once per claim
/// rather than per attempt).
fn make_target(inner: &Inner, endpoint: Endpoint, counters: TenantCounters, now: Millis) -> Target {
    let policy = RetryOverride::from_doc(&endpoint.spec.retry)
        .ok()
        .and_then(|o| inner.config.retry.with_override(&o).ok())
        .unwrap_or_else(|| inner.config.retry.clone());
    let opened = Opened::open(&endpoint, &inner.config.delivery, inner.config.secrets.as_deref(), now);
    Target { endpoint, policy, opened, counters }
}

impl Partition {
    /// After a change: hands back the claimed deliveries of replays cancelled since they
    /// were re-queued and not sent since (the store puts them back among the dead
    /// letters), so a cancel stops what this node has claimed and not sent. Reads the
    /// store only when the queue (with a running prefetch's claim) holds any of a replay.
    async fn hand_back_cancelled(&mut self) {
        self.collect_prefetch(true).await;
        let mut replays: Vec<String> =
            self.queue.iter().filter_map(|c| c.unsent_of_replay()).map(String::from).collect();
        if replays.is_empty() {
            return;
        }
        replays.sort_unstable();
        replays.dedup();
        let cancelled = match self.inner.store.cancelled_replays(&replays).await {
            Ok(c) if c.is_empty() => return,
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(endpoint_id = %self.id, error = %e, "cannot read which replays are cancelled");
                return;
            }
        };
        let of_cancelled = |c: &Claimed| c.unsent_of_replay().is_some_and(|r| cancelled.iter().any(|x| x == r));
        let (mut gone, keep): (VecDeque<Claimed>, VecDeque<Claimed>) = self.queue.drain(..).partition(of_cancelled);
        self.queue = keep;
        tracing::info!(endpoint_id = %self.id, handed_back = gone.len(), "unsent deliveries of cancelled replays");
        self.signal.known(Known::forget_due);
        release_all(&self.inner, &mut gone, self.inner.clock.now()).await;
    }

    /// Hands the queue back, due at `at`: the next due time is no longer known.
    async fn release_queue(&mut self, at: Millis) {
        self.signal.known(Known::forget_due);
        self.batch_since = None;
        release_all(&self.inner, &mut self.queue, at).await;
    }

    /// After a short claim nothing else was due: until a signal says otherwise, the next
    /// due time is known without claiming again (see [`Known::next_due`]).
    fn known_due(&self) -> Stored {
        let Some(sh) = self.shared.as_ref() else { return Stored::Unknown };
        let (now, halted) = (self.inner.clock.now(), sh.halted.load(Ordering::Acquire));
        self.signal.known(|k| k.next_due(now, halted, || sh.due_again.lock().expect("due again").take()))
    }
}

/// Hands claimed-but-unsent deliveries back, due at `at` (see [`super::release`]).
async fn release_all(inner: &Arc<Inner>, queue: &mut VecDeque<Claimed>, at: Millis) {
    if queue.is_empty() {
        return;
    }
    let releases = queue.drain(..).map(|c| Release { delivery: c.id, fence: c.fence, next_attempt_at: at }).collect();
    super::release(&inner.committer, releases).await;
}
