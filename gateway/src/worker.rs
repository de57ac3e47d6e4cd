//! The delivery engine: the one place that composes the pure policies (`pace`, `lease`,
//! `classify`, `schedule`, `sign`) with I/O (`store`, `deliver`). One partition task per
//! endpoint with work claims leased batches, paces them on absolute deadlines, sends them
//! with bounded concurrency, and records each result through the group committer.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;

use crate::classify::{self, Outcome, Verdict};
use crate::clock::{now_ms, rfc3339};
use crate::config::Config;
use crate::deliver::{Deliverer, Outgoing, Sent};
use crate::lease;
use crate::metrics::Metrics;
use crate::model::*;
use crate::ops::Ops;
use crate::pace::{Pacer, Permit};
use crate::plugin::{self, PluginHost};
use crate::schedule::{RetryDecision, RetryPolicy};
use crate::sign::{self, Secret};
use crate::store::{AttemptResult, ClaimRequest, Claimed, Committer, DynStore, EndpointChange, Release};

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
/// How often a busy partition re-reads its endpoint (rate changes, pauses by other nodes).
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// Handle to the running engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    store: DynStore,
    committer: Committer,
    deliverer: Deliverer,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    owner: String,
    partitions: Mutex<HashMap<EndpointId, Arc<Notify>>>,
    global: Arc<Semaphore>,
    scan: Notify,
    shutdown: watch::Receiver<bool>,
    ops: Ops,
    plugins: PluginHost,
}

impl Engine {
    /// Starts the engine; it stops taking new work when `shutdown` turns true.
    pub async fn start(
        store: DynStore,
        committer: Committer,
        config: Arc<Config>,
        metrics: Arc<Metrics>,
        ops: Ops,
        plugins: PluginHost,
        shutdown: watch::Receiver<bool>,
    ) -> Engine {
        let mut rng = StdRng::from_rng(&mut rand::rng());
        let owner = new_id("node", now_ms(), &mut rng);
        let inner = Arc::new(Inner {
            deliverer: Deliverer::new(config.delivery.allow_private_destinations),
            global: Arc::new(Semaphore::new(config.delivery.max_in_flight_total)),
            store,
            committer,
            config,
            metrics,
            owner,
            partitions: Mutex::default(),
            scan: Notify::new(),
            shutdown,
            ops,
            plugins,
        });
        // A single SQLite node owns every lease in its file: whatever was in flight when
        // the previous process died can be retried at once. Shared stores wait for expiry.
        let horizon = if inner.config.store_url.starts_with("sqlite:") { Millis::MAX } else { now_ms() };
        match inner.store.recover_leases(horizon, now_ms()).await {
            Ok(n) if n > 0 => {
                inner.metrics.leases_recovered.add(n);
                tracing::info!(recovered = n, "recovered abandoned leases");
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "lease recovery failed"),
        }
        match inner.store.subscribe().await {
            Ok(Some(mut rx)) => {
                let listener = inner.clone();
                tokio::spawn(async move {
                    while let Some(ids) = rx.recv().await {
                        for id in &ids {
                            ensure_partition(&listener, id);
                        }
                    }
                });
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "cannot listen for other nodes' work; scanning only"),
        }
        tokio::spawn(dispatch(inner.clone()));
        Engine { inner }
    }

    /// Tells the engine that these endpoints have new work.
    pub fn poke(&self, endpoints: &[EndpointId]) {
        for id in endpoints {
            ensure_partition(&self.inner, id);
        }
    }

    /// Asks the engine to look for due work now.
    pub fn scan(&self) {
        self.inner.scan.notify_one();
    }
}

fn ensure_partition(inner: &Arc<Inner>, id: &EndpointId) {
    let mut parts = inner.partitions.lock().expect("partition map");
    if let Some(n) = parts.get(id) {
        n.notify_one();
        return;
    }
    let notify = Arc::new(Notify::new());
    parts.insert(id.clone(), notify.clone());
    tokio::spawn(partition(inner.clone(), id.clone(), notify));
}

async fn dispatch(inner: Arc<Inner>) {
    let mut shutdown = inner.shutdown.clone();
    let mut last_recover = Instant::now();
    loop {
        if *shutdown.borrow() {
            return;
        }
        match inner.store.pending_endpoints().await {
            Ok(pending) => {
                let now = now_ms();
                for (id, due) in pending {
                    if due <= now + SCAN_EVERY.as_millis() as i64 {
                        ensure_partition(&inner, &id);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "scan for due work failed"),
        }
        if last_recover.elapsed() >= RECOVER_EVERY {
            last_recover = Instant::now();
            match inner.store.recover_leases(now_ms(), now_ms()).await {
                Ok(n) if n > 0 => {
                    inner.metrics.leases_recovered.add(n);
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

/// What a partition shares with its in-flight attempts.
struct Shared {
    pacer: Mutex<Pacer>,
    freed: Notify,
    /// The endpoint was paused for a human or disabled: stop sending.
    halted: AtomicBool,
    failing_since: Mutex<Option<Millis>>,
}

/// What an attempt needs to know about its endpoint, fixed for one claim.
struct Target {
    endpoint: Endpoint,
    policy: RetryPolicy,
    secrets: Vec<Secret>,
}

async fn partition(inner: Arc<Inner>, id: EndpointId, notify: Arc<Notify>) {
    let mut shared: Option<Arc<Shared>> = None;
    let mut queue: VecDeque<Claimed> = VecDeque::new();
    let mut target: Option<Arc<Target>> = None;
    let mut rng = StdRng::from_rng(&mut rand::rng());
    let mut held: Option<Instant> = None;
    // A claim running ahead of need, so the queue never runs dry while the pacer has slots.
    let mut prefetch: Option<tokio::task::JoinHandle<Vec<Claimed>>> = None;
    let mut refreshed = Instant::now();
    loop {
        if prefetch.as_ref().is_some_and(|h| h.is_finished() || queue.is_empty())
            && let Some(h) = prefetch.take()
        {
            queue.extend(h.await.unwrap_or_default());
        }
        if *inner.shutdown.borrow() {
            if let Some(h) = prefetch.take() {
                queue.extend(h.await.unwrap_or_default());
            }
            release_all(&inner, &mut queue, now_ms()).await;
            break;
        }
        if !hold_partition(&inner, &id, &mut held).await {
            // Another node paces this endpoint; look again when its lease may have lapsed.
            if let Some(h) = prefetch.take() {
                queue.extend(h.await.unwrap_or_default());
            }
            release_all(&inner, &mut queue, now_ms()).await;
            retire(&inner, &id);
            return;
        }
        if !queue.is_empty() {
            if refreshed.elapsed() >= REFRESH_EVERY {
                // Keep a busy endpoint's settings and state fresh.
                refreshed = Instant::now();
                match inner.store.endpoint(&id).await {
                    Ok(Some(e)) if sendable(&e, now_ms()) => {
                        if let Some(sh) = &shared {
                            let spec = &e.spec;
                            let _ = sh.pacer.lock().expect("pacer").reconfigure(
                                spec.rate_per_sec,
                                spec.burst,
                                spec.max_in_flight,
                            );
                        }
                        target = Some(Arc::new(make_target(&inner, e, now_ms())));
                    }
                    Ok(_) => {
                        // Disabled, paused or gone: hand the queue back; the refill decides.
                        release_all(&inner, &mut queue, now_ms()).await;
                        continue;
                    }
                    Err(e) => tracing::warn!(endpoint = %id, error = %e, "cannot refresh endpoint"),
                }
            }
            if let (None, Some(tg)) = (&prefetch, &target) {
                let req = claim_request(&inner, &id, &tg.endpoint.spec, queue.len() as u32, now_ms());
                if queue.len() <= req.limit as usize / 2 {
                    let committer = inner.committer.clone();
                    prefetch = Some(tokio::spawn(async move { committer.claim(req).await.unwrap_or_default() }));
                }
            }
        }
        if queue.is_empty() {
            match refill(&inner, &id, &mut shared, &mut queue).await {
                Refill::Claimed(t) => {
                    target = Some(t);
                    refreshed = Instant::now();
                }
                Refill::Idle(wake_at) => {
                    let busy = shared.as_ref().is_some_and(|s| s.pacer.lock().expect("pacer").in_flight() > 0);
                    if wake_at.is_none() && !busy {
                        // Linger before retiring: a partition that came and went with every
                        // event would re-take its lease (a write) and respawn each time.
                        if tokio::time::timeout(IDLE_LINGER, notify.notified()).await.is_ok() {
                            continue;
                        }
                        retire(&inner, &id);
                        // Work that arrived between the timeout and the retirement.
                        if matches!(inner.store.next_due(&id).await, Ok(Some(_))) {
                            ensure_partition(&inner, &id);
                        }
                        return;
                    }
                    let sleep = wake_at.map(|at| Duration::from_millis((at - now_ms()).clamp(0, 60_000) as u64));
                    let sleep = sleep.unwrap_or(SCAN_EVERY);
                    let freed = async {
                        match &shared {
                            Some(s) => s.freed.notified().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = tokio::time::sleep(sleep) => {}
                        _ = notify.notified() => {}
                        _ = freed => {}
                    }
                    continue;
                }
                Refill::Gone => {
                    retire(&inner, &id);
                    return;
                }
            }
        }
        let (Some(sh), Some(tg)) = (shared.clone(), target.clone()) else { continue };
        if sh.halted.load(Ordering::Acquire) {
            release_all(&inner, &mut queue, now_ms()).await;
            continue;
        }
        let permit = sh.pacer.lock().expect("pacer").poll(Instant::now());
        match permit {
            Permit::Go => {
                let Some(delivery) = queue.pop_front() else { continue };
                let Ok(slot) = inner.global.clone().acquire_owned().await else { return };
                let seed = StdRng::from_rng(&mut rng);
                tokio::spawn(attempt(inner.clone(), sh, tg, delivery, slot, seed));
            }
            Permit::WaitUntil(at) => tokio::time::sleep_until(at).await,
            Permit::Full => {
                let _ = tokio::time::timeout(SCAN_EVERY, sh.freed.notified()).await;
            }
            Permit::Paused(until) => {
                let resume_at = now_ms() + until.saturating_duration_since(Instant::now()).as_millis() as i64;
                release_all(&inner, &mut queue, resume_at).await;
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => {}
                    _ = notify.notified() => {}
                }
            }
        }
    }
}

/// Removes the partition from the map; the periodic scan or the next poke starts it again
/// when work arrives. Its partition lease is kept until it expires, so a partition that
/// restarts here at once never races another node for it.
fn retire(inner: &Inner, id: &EndpointId) {
    inner.partitions.lock().expect("partition map").remove(id);
}

/// Keeps this node's lease on the endpoint's partition, renewing it ahead of expiry.
async fn hold_partition(inner: &Inner, id: &EndpointId, held: &mut Option<Instant>) -> bool {
    if held.is_some_and(|until| until > Instant::now() + PARTITION_RENEW_BEFORE) {
        return true;
    }
    let now = now_ms();
    let until = now + PARTITION_LEASE.as_millis() as i64;
    match inner.store.acquire_partition(id, &inner.owner, now, until).await {
        Ok(true) => {
            // Count from before the call so the local view never outlives the stored lease.
            *held = Some(Instant::now() + PARTITION_LEASE - Duration::from_millis(500));
            true
        }
        Ok(false) => {
            *held = None;
            false
        }
        Err(e) => {
            tracing::warn!(endpoint = %id, error = %e, "cannot renew partition lease");
            held.is_some_and(|until| until > Instant::now())
        }
    }
}

enum Refill {
    Claimed(Arc<Target>),
    /// Nothing due; the earliest due time, if any work is waiting.
    Idle(Option<Millis>),
    /// The endpoint is gone, disabled or paused for a human.
    Gone,
}

async fn refill(
    inner: &Arc<Inner>,
    id: &EndpointId,
    shared: &mut Option<Arc<Shared>>,
    queue: &mut VecDeque<Claimed>,
) -> Refill {
    let endpoint = match inner.store.endpoint(id).await {
        Ok(Some(e)) => e,
        Ok(None) => return Refill::Gone,
        Err(e) => {
            tracing::warn!(endpoint = %id, error = %e, "cannot read endpoint");
            return Refill::Idle(Some(now_ms() + 1_000));
        }
    };
    let now = now_ms();
    match (endpoint.state, endpoint.paused_until) {
        (EndpointState::Disabled, _) | (EndpointState::Paused, None) => return Refill::Gone,
        (EndpointState::Paused, Some(until)) if until > now => return Refill::Idle(Some(until)),
        _ => {}
    }
    let spec = &endpoint.spec;
    let sh = match shared {
        Some(sh) => {
            let mut p = sh.pacer.lock().expect("pacer");
            if let Err(e) = p.reconfigure(spec.rate_per_sec, spec.burst, spec.max_in_flight) {
                tracing::warn!(endpoint = %id, error = %e, "keeping previous pacing");
            }
            sh.halted.store(false, Ordering::Release);
            drop(p);
            sh.clone()
        }
        None => {
            let pacer = match Pacer::try_new(spec.rate_per_sec, spec.burst, spec.max_in_flight) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(endpoint = %id, error = %e, "invalid pacing");
                    return Refill::Gone;
                }
            };
            let sh = Arc::new(Shared {
                pacer: Mutex::new(pacer),
                freed: Notify::new(),
                halted: AtomicBool::new(false),
                failing_since: Mutex::new(endpoint.failing_since),
            });
            *shared = Some(sh.clone());
            sh
        }
    };
    if let Some(until) = sh.pacer.lock().expect("pacer").paused_until()
        && until > Instant::now()
    {
        return Refill::Idle(Some(now + until.saturating_duration_since(Instant::now()).as_millis() as i64));
    }
    let claimed = match inner.committer.claim(claim_request(inner, id, spec, 0, now)).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(endpoint = %id, error = %e, "claim failed");
            return Refill::Idle(Some(now_ms() + 500));
        }
    };
    if claimed.is_empty() {
        return match inner.store.next_due(id).await {
            Ok(due) => Refill::Idle(due),
            Err(_) => Refill::Idle(Some(now_ms() + 1_000)),
        };
    }
    queue.extend(claimed);
    Refill::Claimed(Arc::new(make_target(inner, endpoint, now)))
}

/// The next claim of a partition that still holds `queued` unsent deliveries: about a
/// second of its rate, leased long enough to send all of them at that rate.
fn claim_request(inner: &Inner, id: &EndpointId, spec: &EndpointSpec, queued: u32, now: Millis) -> ClaimRequest {
    let limit = lease::claim_size(spec.rate_per_sec, spec.burst, spec.max_in_flight);
    let timeout = Duration::from_millis(spec.timeout_ms);
    let margin = inner.config.delivery.lease_margin;
    ClaimRequest {
        endpoint: id.clone(),
        now,
        limit,
        owner: inner.owner.clone(),
        lease_until: lease::lease_until(now, queued + limit, spec.rate_per_sec, timeout, margin),
    }
}

/// May this endpoint be sent to at `now`?
fn sendable(e: &Endpoint, now: Millis) -> bool {
    match e.state {
        EndpointState::Active => true,
        EndpointState::Paused => e.paused_until.is_some_and(|until| until <= now),
        EndpointState::Disabled => false,
    }
}

/// The endpoint's effective retry policy and signing secrets at `now`.
fn make_target(inner: &Inner, endpoint: Endpoint, now: Millis) -> Target {
    let policy = endpoint
        .spec
        .retry
        .to_override()
        .ok()
        .and_then(|o| inner.config.retry.with_override(&o).ok())
        .unwrap_or_else(|| inner.config.retry.clone());
    let secrets = endpoint.valid_secrets(now).filter_map(|s| Secret::parse(&s.secret).ok()).collect();
    Target { endpoint, policy, secrets }
}

/// Hands claimed-but-unsent deliveries back, due at `at`.
async fn release_all(inner: &Inner, queue: &mut VecDeque<Claimed>, at: Millis) {
    if queue.is_empty() {
        return;
    }
    let releases = queue.drain(..).map(|c| Release { delivery: c.id, fence: c.fence, next_attempt_at: at }).collect();
    if let Err(e) = inner.committer.release(releases).await {
        tracing::warn!(error = %e, "release failed; leases will expire instead");
    }
}

/// The JSON envelope a receiver gets by default; the payload bytes are kept exactly.
pub fn envelope(event_id: &str, event_type: &str, created_at: Millis, payload: &str) -> String {
    let s = |v: &str| serde_json::to_string(v).expect("string serializes");
    format!(
        "{{\"id\":{},\"type\":{},\"timestamp\":{},\"data\":{}}}",
        s(event_id),
        s(event_type),
        s(&rfc3339(created_at)),
        payload
    )
}

/// What happens to a delivery after a verdict. Pure.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub state: DeliveryState,
    pub next_attempt_at: Option<Millis>,
    pub reason: Option<String>,
    pub label: String,
}

/// Turns a verdict into the delivery's next state under `policy`.
pub fn decide(
    verdict: &Verdict,
    attempt_number: u32,
    now: Millis,
    deadline: Millis,
    policy: &RetryPolicy,
    rng: &mut impl rand::Rng,
) -> Decision {
    let dead = |reason: String, label: String| Decision {
        state: DeliveryState::Dead,
        next_attempt_at: None,
        reason: Some(reason),
        label,
    };
    match verdict {
        Verdict::Delivered => {
            Decision { state: DeliveryState::Delivered, next_attempt_at: None, reason: None, label: "delivered".into() }
        }
        Verdict::Retry { after, .. } => match policy.next_attempt(attempt_number, now, deadline, *after, rng) {
            RetryDecision::RetryAt(at) => Decision {
                state: DeliveryState::Waiting,
                next_attempt_at: Some(at),
                reason: None,
                label: "retry".into(),
            },
            RetryDecision::GiveUp(r) => dead(r.as_str().to_string(), format!("retry→{}", r.as_str())),
        },
        Verdict::Fail { reason } => dead(reason.clone(), format!("fail:{reason}")),
        Verdict::PauseEndpoint { reason } => Decision {
            state: DeliveryState::Paused,
            next_attempt_at: None,
            reason: None,
            label: format!("pause_endpoint:{reason}"),
        },
        Verdict::DisableEndpoint { reason } => dead("endpoint_disabled".into(), format!("disable_endpoint:{reason}")),
    }
}

/// What an attempt produced before classification.
struct Exchange {
    outcome: Outcome,
    status: Option<u16>,
    body_prefix: Option<String>,
    error: Option<String>,
    /// The verdict, when it is already decided (a plugin failed or dropped the delivery).
    verdict: Option<(Verdict, String)>,
    /// The response, for a classify plugin.
    answer: Option<crate::deliver::Answer>,
}

async fn attempt(
    inner: Arc<Inner>,
    shared: Arc<Shared>,
    target: Arc<Target>,
    d: Claimed,
    _slot: tokio::sync::OwnedSemaphorePermit,
    mut rng: StdRng,
) {
    if wait_for_plugins(&inner, &target, &d).await {
        shared.pacer.lock().expect("pacer").release();
        shared.freed.notify_one();
        return;
    }
    inner.metrics.in_flight.inc();
    let started = now_ms();
    let clock = Instant::now();
    let number = d.attempts + 1;
    let attempt_id = new_id("att", started, &mut rng);
    let ctx = plugin::DeliveryContext {
        tenant: d.tenant.to_string(),
        endpoint_id: target.endpoint.id.to_string(),
        event_id: d.event_id.to_string(),
        event_type: d.event_type.clone(),
        attempt: number,
        timestamp: started.div_euclid(1000).max(0) as u64,
        attempt_id: attempt_id.clone(),
    };
    let exchange = exchange(&inner, &target, &d, &ctx).await;
    let duration_ms = clock.elapsed().as_millis() as u64;
    let (verdict, decided_by) = match exchange.verdict.clone() {
        Some(v) => v,
        None => judge(&inner, &target, &ctx, &exchange),
    };
    let now = now_ms();
    // The event's queue TTL, tightened by the endpoint's own retry TTL; a replay sets its own.
    let deadline = d
        .deadline
        .unwrap_or_else(|| d.expires_at.min(d.event_created_at.saturating_add(target.policy.ttl().as_millis() as i64)));
    let budgeted = number.saturating_sub(d.attempt_base);
    let decision = decide(&verdict, budgeted, now, deadline, &target.policy, &mut rng);
    endpoint_effects(&inner, &shared, &target.endpoint, &verdict, &exchange.outcome, now).await;
    let result = AttemptResult {
        delivery: d.id.clone(),
        fence: d.fence,
        state: decision.state,
        next_attempt_at: decision.next_attempt_at,
        reason: decision.reason.clone(),
        attempt: Attempt {
            id: attempt_id,
            delivery_id: d.id.clone(),
            number,
            started_at: started,
            duration_ms,
            status: exchange.status,
            response_body: exchange.body_prefix,
            error: exchange.error,
            verdict: decision.label.clone(),
            decided_by,
        },
    };
    match inner.committer.record(vec![result]).await {
        Ok(accepted) if accepted.first() == Some(&false) => {
            inner.metrics.fenced_results.inc();
            tracing::warn!(delivery = %d.id, "lease lost before the result was recorded");
        }
        Ok(_) => match decision.state {
            DeliveryState::Delivered => inner.metrics.delivered.inc(),
            DeliveryState::Dead => {
                inner.metrics.dead_lettered.inc();
                let data = serde_json::json!({
                    "delivery_id": d.id, "event_id": d.event_id, "event_type": d.event_type,
                    "endpoint_id": target.endpoint.id, "reason": decision.reason, "attempts": number,
                });
                inner.ops.emit(&d.tenant, "delivery.dead", format!("delivery.dead.{}.{}", d.id, number), data);
            }
            DeliveryState::Waiting => inner.metrics.retries_scheduled.inc(),
            _ => {}
        },
        Err(e) => {
            tracing::error!(delivery = %d.id, error = %e, "cannot record attempt; the lease will expire and it will be retried")
        }
    }
    tracing::debug!(delivery = %d.id, attempt = number, status = exchange.status, verdict = %decision.label, duration_ms, "attempt");
    shared.pacer.lock().expect("pacer").release();
    shared.freed.notify_one();
    inner.metrics.in_flight_done.inc();
}

/// How soon a delivery waiting for a loading plugin is tried again.
const PLUGIN_LOADING_RETRY_MS: Millis = 250;

/// Hands `d` back, due shortly and without an attempt, when a plugin bound to its
/// endpoint is still loading (after a start or a new file): calling it now would fail
/// `plugin:not_found`, which is not the delivery's fault.
async fn wait_for_plugins(inner: &Inner, target: &Target, d: &Claimed) -> bool {
    let bound = &target.endpoint.spec.plugins;
    let mut names = [&bound.transform, &bound.classify, &bound.sign].into_iter().flatten();
    if !names.any(|name| inner.plugins.loading(d.tenant.as_str(), name)) {
        return false;
    }
    let release =
        Release { delivery: d.id.clone(), fence: d.fence, next_attempt_at: now_ms() + PLUGIN_LOADING_RETRY_MS };
    if let Err(e) = inner.committer.release(vec![release]).await {
        tracing::warn!(delivery = %d.id, error = %e, "release failed; the lease will expire instead");
    }
    true
}

/// Builds the request (transform and sign plugins included) and sends it.
async fn exchange(inner: &Inner, target: &Target, d: &Claimed, ctx: &plugin::DeliveryContext) -> Exchange {
    let spec = &target.endpoint.spec;
    let tenant = d.tenant.as_str();
    let failed = |inner: &Inner, name: &str, f: plugin::PluginFailure| {
        inner.metrics.plugin_failures.inc();
        tracing::warn!(plugin = name, tenant, error = %f, "plugin call failed");
        Exchange {
            outcome: Outcome::Transport(classify::TransportErrorKind::Other),
            status: None,
            body_prefix: None,
            error: Some(f.reason()),
            verdict: Some((Verdict::Retry { after: None, pause_endpoint: false }, format!("plugin:{name}"))),
            answer: None,
        }
    };
    let mut request = plugin::Request {
        headers: std::iter::once(("content-type".to_string(), "application/json".to_string()))
            .chain(spec.headers.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect(),
        body: envelope(d.event_id.as_str(), &d.event_type, d.event_created_at, &d.payload).into_bytes(),
    };
    if let Some(name) = &spec.plugins.transform {
        match inner.plugins.transform(tenant, name, ctx, &request) {
            Ok(plugin::TransformResult::Send(r)) => request = r,
            Ok(plugin::TransformResult::Drop(reason)) => {
                return Exchange {
                    outcome: Outcome::Transport(classify::TransportErrorKind::Other),
                    status: None,
                    body_prefix: None,
                    error: None,
                    verdict: Some((Verdict::Fail { reason: format!("dropped:{reason}") }, format!("plugin:{name}"))),
                    answer: None,
                };
            }
            Err(f) => return failed(inner, name, f),
        }
    }
    let timestamp = ctx.timestamp as i64;
    let mut headers = request.headers.clone();
    headers.retain(|(k, _)| !is_herald_header(k));
    headers.extend([
        ("user-agent".to_string(), concat!("herald/", env!("CARGO_PKG_VERSION")).to_string()),
        (sign::HEADER_ID.to_string(), d.event_id.to_string()),
        (sign::HEADER_TIMESTAMP.to_string(), timestamp.to_string()),
        ("herald-attempt-id".to_string(), ctx.attempt_id.clone()),
        ("herald-delivery-id".to_string(), d.id.to_string()),
    ]);
    match &spec.plugins.sign {
        Some(name) => {
            let keys: Vec<Vec<u8>> = target.secrets.iter().map(|s| s.as_bytes().to_vec()).collect();
            match inner.plugins.sign(tenant, name, ctx, &keys, &request) {
                Ok(extra) => headers.extend(extra.into_iter().filter(|(k, _)| !is_herald_header(k))),
                Err(f) => return failed(inner, name, f),
            }
        }
        None => {
            let secrets: Vec<&Secret> = target.secrets.iter().collect();
            let sig = sign::signature_header(&secrets, d.event_id.as_str(), timestamp, &request.body);
            headers.push((sign::HEADER_SIGNATURE.to_string(), sig));
        }
    }
    let sent = inner
        .deliverer
        .send(Outgoing {
            url: spec.url.clone(),
            headers,
            body: Bytes::from(request.body),
            connect_timeout: Duration::from_millis(spec.connect_timeout_ms),
            timeout: Duration::from_millis(spec.timeout_ms),
        })
        .await;
    inner.metrics.attempts.inc();
    match sent {
        Sent::Answer(a) => Exchange {
            outcome: Outcome::Response {
                status: a.status,
                retry_after: a.retry_after.as_deref().and_then(|v| classify::parse_retry_after(v, SystemTime::now())),
            },
            status: Some(a.status),
            body_prefix: Some(a.body_prefix.clone()),
            error: None,
            verdict: None,
            answer: Some(a),
        },
        Sent::Failed(kind, detail) => Exchange {
            outcome: Outcome::Transport(kind),
            status: None,
            body_prefix: None,
            error: Some(format!("{}: {detail}", kind.as_str())),
            verdict: None,
            answer: None,
        },
    }
}

/// Headers only Herald sets: a plugin's copies are dropped.
fn is_herald_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n == "user-agent" || n.starts_with("webhook-") || n.starts_with("herald-")
}

/// The verdict: the endpoint's classify plugin if it has an opinion, else the built-in table.
fn judge(inner: &Inner, target: &Target, ctx: &plugin::DeliveryContext, ex: &Exchange) -> (Verdict, String) {
    let builtin = || (classify::classify(&ex.outcome), "builtin".to_string());
    let Some(name) = &target.endpoint.spec.plugins.classify else { return builtin() };
    let outcome = match (&ex.answer, &ex.outcome) {
        (Some(a), _) => plugin::Outcome::Response(plugin::Response {
            status: a.status,
            headers: a.headers.clone(),
            body: a.body_prefix.as_bytes().to_vec(),
        }),
        (None, Outcome::Transport(kind)) => plugin::Outcome::TransportError(plugin::TransportError {
            kind: match kind {
                classify::TransportErrorKind::Timeout | classify::TransportErrorKind::ConnectTimeout => {
                    plugin::TransportErrorKind::Timeout
                }
                classify::TransportErrorKind::ConnectionRefused => plugin::TransportErrorKind::ConnectionRefused,
                classify::TransportErrorKind::ConnectionReset => plugin::TransportErrorKind::ConnectionReset,
                classify::TransportErrorKind::Dns => plugin::TransportErrorKind::Dns,
                classify::TransportErrorKind::Tls => plugin::TransportErrorKind::Tls,
                _ => plugin::TransportErrorKind::Other,
            },
            message: ex.error.clone().unwrap_or_default(),
        }),
        (None, Outcome::Response { .. }) => return builtin(),
    };
    let by = format!("plugin:{name}");
    match inner.plugins.classify(ctx.tenant.as_str(), name, ctx, &outcome) {
        Ok(plugin::Verdict::Default) => builtin(),
        Ok(plugin::Verdict::Delivered) => (Verdict::Delivered, by),
        Ok(plugin::Verdict::Retry(after)) => {
            (Verdict::Retry { after: after.map(|s| Duration::from_secs(u64::from(s))), pause_endpoint: false }, by)
        }
        Ok(plugin::Verdict::Fail(reason)) => (Verdict::Fail { reason: format!("plugin:{reason}") }, by),
        Ok(plugin::Verdict::PauseEndpoint(p)) => {
            (Verdict::Retry { after: Some(Duration::from_secs(u64::from(p.secs))), pause_endpoint: true }, by)
        }
        Ok(plugin::Verdict::DisableEndpoint(reason)) => (Verdict::DisableEndpoint { reason }, by),
        Err(f) => {
            inner.metrics.plugin_failures.inc();
            tracing::warn!(plugin = %name, tenant = %ctx.tenant, error = %f, "classify failed; using the built-in table");
            let (v, _) = builtin();
            (v, format!("builtin (plugin:{name} failed: {f})"))
        }
    }
}

/// Applies what a verdict means for the whole endpoint: pauses, disables, failure tracking.
async fn endpoint_effects(
    inner: &Inner,
    shared: &Shared,
    endpoint: &Endpoint,
    verdict: &Verdict,
    outcome: &Outcome,
    now: Millis,
) {
    let change = |state: Option<EndpointState>,
                  reason: Option<String>,
                  until: Option<Millis>,
                  failing: Option<Option<Millis>>| {
        EndpointChange {
            endpoint: endpoint.id.clone(),
            state,
            reason,
            paused_until: until,
            failing_since: failing,
            now,
        }
    };
    let failing = {
        let mut f = shared.failing_since.lock().expect("failing");
        match (verdict, *f) {
            (Verdict::Delivered, Some(_)) => {
                *f = None;
                Some(None)
            }
            (Verdict::Delivered, None) => None,
            (_, None) => {
                *f = Some(now);
                Some(Some(now))
            }
            (_, Some(_)) => None,
        }
    };
    let since = *shared.failing_since.lock().expect("failing");
    let overdue = since.is_some_and(|t| now - t >= inner.config.delivery.disable_after.as_millis() as i64);
    let change = match verdict {
        Verdict::Retry { after: Some(after), pause_endpoint: true } => {
            shared.pacer.lock().expect("pacer").pause_until(Instant::now() + *after);
            inner.metrics.endpoint_pauses.inc();
            tracing::info!(endpoint = %endpoint.id, pause_ms = after.as_millis() as u64, "endpoint rate limited; pausing");
            let reason = match outcome {
                Outcome::Response { status: 429, .. } => "rate limited (429)".to_string(),
                Outcome::Response { status, .. } => format!("paused by classify plugin (HTTP {status})"),
                Outcome::Transport(k) => format!("paused by classify plugin ({})", k.as_str()),
            };
            Some(change(Some(EndpointState::Paused), Some(reason), Some(now + after.as_millis() as i64), failing))
        }
        Verdict::PauseEndpoint { reason } => {
            shared.halted.store(true, Ordering::Release);
            shared.pacer.lock().expect("pacer").pause_until(Instant::now() + HUMAN_PAUSE);
            inner.metrics.endpoint_pauses.inc();
            tracing::warn!(endpoint = %endpoint.id, reason, "endpoint paused until re-enabled");
            let data = serde_json::json!({ "endpoint_id": endpoint.id, "url": endpoint.spec.url, "reason": reason });
            inner.ops.emit(&endpoint.tenant, "endpoint.paused", format!("endpoint.paused.{}.{now}", endpoint.id), data);
            Some(change(Some(EndpointState::Paused), Some(reason.clone()), None, failing))
        }
        Verdict::DisableEndpoint { reason } => Some(disable(inner, shared, endpoint, reason.clone(), failing, now)),
        _ if overdue => {
            let reason = format!("failing since {}", rfc3339(since.unwrap_or(now)));
            Some(disable(inner, shared, endpoint, reason, failing, now))
        }
        _ => failing.map(|f| change(None, None, None, Some(f))),
    };
    if let Some(c) = change
        && let Err(e) = inner.committer.change_endpoint(c).await
    {
        tracing::error!(endpoint = %endpoint.id, error = %e, "cannot record endpoint state");
    }
}

fn disable(
    inner: &Inner,
    shared: &Shared,
    endpoint: &Endpoint,
    reason: String,
    failing: Option<Option<Millis>>,
    now: Millis,
) -> EndpointChange {
    shared.halted.store(true, Ordering::Release);
    shared.pacer.lock().expect("pacer").pause_until(Instant::now() + HUMAN_PAUSE);
    inner.metrics.endpoint_disables.inc();
    tracing::warn!(endpoint = %endpoint.id, reason, "endpoint disabled");
    let data = serde_json::json!({ "endpoint_id": endpoint.id, "url": endpoint.spec.url, "reason": reason });
    inner.ops.emit(&endpoint.tenant, "endpoint.disabled", format!("endpoint.disabled.{}.{now}", endpoint.id), data);
    EndpointChange {
        endpoint: endpoint.id.clone(),
        state: Some(EndpointState::Disabled),
        reason: Some(reason),
        paused_until: None,
        failing_since: failing,
        now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_keeps_payload_bytes() {
        let e = envelope("evt_1", "a.b", 0, "{\"x\": 1.50}");
        assert_eq!(
            e,
            "{\"id\":\"evt_1\",\"type\":\"a.b\",\"timestamp\":\"1970-01-01T00:00:00Z\",\"data\":{\"x\": 1.50}}"
        );
        serde_json::from_str::<serde_json::Value>(&e).unwrap();
    }

    #[test]
    fn decisions() {
        let policy = RetryPolicy::try_new(
            Duration::from_secs(1),
            2.0,
            Duration::from_secs(60),
            crate::schedule::Jitter::None,
            3,
            Duration::from_secs(3600),
        )
        .unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let now = 1_000_000;
        let deadline = now + 3_600_000;
        let retry = |after| Verdict::Retry { after, pause_endpoint: false };
        let d = decide(&Verdict::Delivered, 1, now, deadline, &policy, &mut rng);
        assert_eq!(d.state, DeliveryState::Delivered);
        let d = decide(&retry(None), 1, now, deadline, &policy, &mut rng);
        assert_eq!((d.state, d.next_attempt_at), (DeliveryState::Waiting, Some(now + 1_000)));
        let d = decide(&retry(None), 2, now, deadline, &policy, &mut rng);
        assert_eq!(d.next_attempt_at, Some(now + 2_000));
        let d = decide(&retry(None), 3, now, deadline, &policy, &mut rng);
        assert_eq!((d.state, d.reason.as_deref()), (DeliveryState::Dead, Some("exhausted")));
        let d = decide(&retry(Some(Duration::from_secs(5))), 1, now, deadline, &policy, &mut rng);
        assert_eq!(d.next_attempt_at, Some(now + 5_000));
        let d = decide(&retry(Some(Duration::from_secs(7200))), 1, now, deadline, &policy, &mut rng);
        assert_eq!(d.reason.as_deref(), Some("retry_after_beyond_deadline"));
        let d = decide(&retry(None), 1, deadline + 1, deadline, &policy, &mut rng);
        assert_eq!(d.reason.as_deref(), Some("expired"));
        let d = decide(&Verdict::Fail { reason: "permanent:422".into() }, 1, now, deadline, &policy, &mut rng);
        assert_eq!((d.state, d.reason.as_deref()), (DeliveryState::Dead, Some("permanent:422")));
        let d = decide(&Verdict::PauseEndpoint { reason: "credentials".into() }, 1, now, deadline, &policy, &mut rng);
        assert_eq!(d.state, DeliveryState::Paused);
        let d = decide(&Verdict::DisableEndpoint { reason: "gone".into() }, 1, now, deadline, &policy, &mut rng);
        assert_eq!(d.reason.as_deref(), Some("endpoint_disabled"));
    }
}
