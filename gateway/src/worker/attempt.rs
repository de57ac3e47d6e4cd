//! One attempt's I/O, in named steps: build the request (envelope, transform and sign
//! plugins, headers: [`build`]), send it through `deliver`, judge the outcome (classify
//! plugin or the built-in table: [`judge`]), decide with [`decide`](super::decide), apply
//! the endpoint's change ([`endpoint`]), and record the result and that change in one
//! commit ([`record`]).
//!
//! It never paces and never claims, by its types: it touches only an [`AttemptCtx`], its
//! partition's [`PartitionLink`] and its claim's [`Target`], and none of them can take a
//! pacer permit, read the partition's queue or claim.

mod batch;
mod build;
mod endpoint;
mod judge;
mod non_empty;
mod record;
mod round;
mod trace;

pub(super) use non_empty::NonEmpty;
pub(super) use record::Recorder;

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::decide::{Decision, decide};
use super::signal::{PartitionLink, Target};
use super::target::{Request, Sent, Through};
use crate::catalog::Catalog;
use crate::classify::{self, Outcome, Verdict};
use crate::clock::Clock;
use crate::config::Config;
use crate::deliver::Deliverer;
use crate::metrics::Metrics;
use crate::model::{Attempt, Millis, SentRequest, new_id};
use crate::ops::Ops;
use crate::plugin::{self, PluginHost};
use crate::store::{Claimed, EndpointChange, Release};
use crate::telemetry::Telemetry;
use build::{converted, encoded, signed, transformed};
use endpoint::endpoint_change;
use judge::{Judged, judge_exchange};
use record::{Settling, record};
use trace::AttemptTrace;

/// What an attempt may touch, one for the engine: no store, no partitions, no pacer, no
/// claims (the committer only as a [`Recorder`]).
pub(super) struct AttemptCtx {
    pub(super) recorder: Recorder,
    pub(super) deliverer: Deliverer,
    pub(super) config: Arc<Config>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) ops: Ops,
    pub(super) plugins: PluginHost,
    /// The engine's time: every stored time it writes and every timer it sets.
    pub(super) clock: Clock,
    /// Attempt spans, when exported.
    pub(super) telemetry: Telemetry,
    /// The event catalog: a CloudEvent's `dataschema`.
    pub(super) catalog: Arc<Catalog>,
}

/// What an attempt produced before classification.
enum Exchange {
    /// The request went out; what came back (an answer or a transport failure), and what
    /// was sent.
    Answered(Outcome, SentRequest),
    /// A plugin decided instead: it dropped the delivery, or it failed before sending.
    Decided { verdict: Verdict, by: String, error: Option<String> },
}

/// Runs one attempt of the claimed deliveries to its recorded end: each is sent and judged,
/// decided (delivery and endpoint), and recorded with its endpoint change in one commit.
/// The pacer slot frees once the requests are judged (a pause or halt they caused is in
/// memory by then), so the endpoint's next request does not wait for this one's commit;
/// the global slot frees after the commits, bounding the results the writer may have
/// waiting.
///
/// An endpoint without batching gets one delivery at a time (each would have a request of
/// its own, in turn); a batching endpoint's deliveries share one request, judged once
/// ([`batch`]), and their results stay per delivery, each fenced and recorded on its own.
/// A batching broker endpoint's deliveries are each their own message, published in one
/// pipelined round and judged each by its own acknowledgement ([`round`]).
pub(super) async fn run(
    cx: Arc<AttemptCtx>,
    link: PartitionLink,
    target: Arc<Target>,
    claimed: NonEmpty<Claimed>,
    _slot: OwnedSemaphorePermit,
    mut rng: StdRng,
) {
    let again = if wait_for_plugins(&cx, &target, &claimed).await {
        link.request_done();
        Some(cx.clock.now() + PLUGIN_LOADING_RETRY_MS)
    } else {
        cx.metrics.in_flight.inc();
        let spec = &target.endpoint.spec;
        let settling = match spec.batch {
            Some(_) if spec.target.kind().is_broker() => {
                round::attempt_round(&cx, &link, &target, claimed, &mut rng).await
            }
            Some(_) => batch::attempt_batch(&cx, &link, &target, claimed, &mut rng).await,
            None => {
                let mut settling = Vec::new();
                for d in claimed {
                    settling.push(attempt_one(&cx, &link, &target, d, &mut rng).await);
                }
                settling
            }
        };
        cx.metrics.in_flight.dec();
        link.request_done();
        let again = settling.iter().filter_map(|s| s.again).min();
        // Together, so a batch's results join one group commit rather than one each.
        futures::future::join_all(settling.into_iter().map(|s| record(&cx, &target, s))).await;
        again
    };
    link.settled(again);
}

/// One delivery's attempt up to its record: sent, judged, decided, and its effect on the
/// endpoint applied to the partition.
async fn attempt_one(cx: &AttemptCtx, link: &PartitionLink, target: &Target, d: Claimed, rng: &mut StdRng) -> Settling {
    let sending = Sending::start(cx, target, d, rng);
    let sent = Instant::now();
    let exchange = send(cx, target, &sending.d, &sending.ctx, &sending.trace).await;
    let duration_ms = sent.elapsed().as_millis() as u64;
    cx.metrics.attempt_duration.observe(sent.elapsed());
    concluded(cx, link, target, sending, exchange, duration_ms, rng).await
}

/// One delivery's attempt from what it produced (`duration_ms` on the wire): judged,
/// decided, and its effect on the endpoint applied to the partition.
async fn concluded(
    cx: &AttemptCtx,
    link: &PartitionLink,
    target: &Target,
    sending: Sending,
    exchange: Exchange,
    duration_ms: u64,
    rng: &mut StdRng,
) -> Settling {
    let judged = judge_exchange(cx, target, &sending.ctx, &sending.trace, exchange).await;
    let now = cx.clock.now();
    let decision = sending.decide(target, &judged, now, rng);
    let change = endpoint_change(cx, link, &target.endpoint, &judged.verdict, now);
    sending.settle(cx, target, (judged, decision, change), duration_ms)
}

/// One delivery's attempt under way: the delivery, what plugins know of the attempt, its
/// part in the event's trace, and when it started.
struct Sending {
    d: Claimed,
    ctx: plugin::DeliveryContext,
    trace: AttemptTrace,
    started: Millis,
}

impl Sending {
    fn start(cx: &AttemptCtx, target: &Target, d: Claimed, rng: &mut StdRng) -> Sending {
        Sending::start_at(cx, target, d, cx.clock.now(), rng)
    }

    /// An attempt started at `started` (the round's one time, for a round of several).
    fn start_at(cx: &AttemptCtx, target: &Target, d: Claimed, started: Millis, rng: &mut StdRng) -> Sending {
        let ctx = context(target, &d, started, new_id("att", started, rng));
        let trace = AttemptTrace::start(&cx.telemetry, &d, rng);
        Sending { d, ctx, trace, started }
    }

    /// The delivery's next state after `judged`, under the endpoint's retry policy.
    fn decide(&self, target: &Target, judged: &Judged, now: Millis, rng: &mut StdRng) -> Decision {
        let budgeted = self.ctx.attempt.saturating_sub(self.d.attempt_base);
        decide(&judged.verdict, budgeted, now, deadline(target, &self.d), &target.policy, rng)
    }

    /// The attempt judged and decided, with the endpoint's change: what is to be recorded.
    fn settle(
        self,
        cx: &AttemptCtx,
        target: &Target,
        (judged, decision, change): (Judged, Decision, Option<EndpointChange>),
        duration_ms: u64,
    ) -> Settling {
        let Sending { d, ctx, mut trace, started } = self;
        trace.settled(target, &d, &ctx, &judged, &decision);
        drop(trace);
        let attempt = Attempt {
            id: ctx.attempt_id,
            delivery_id: d.id.clone(),
            number: ctx.attempt,
            started_at: started,
            duration_ms,
            status: judged.status,
            response_body: judged.response_body,
            error: judged.error,
            verdict: decision.label.clone(),
            decided_by: judged.by,
            request: judged.request,
        };
        // On an ordered endpoint, what follows this delivery in its key may go once it has
        // settled: the partition claims again rather than wait for the next due time it knew.
        let ordered = target.endpoint.spec.is_ordered();
        let again = decision.next_attempt_at.or_else(|| ordered.then(|| cx.clock.now()));
        Settling { d, decision, attempt, change, again }
    }
}

/// What a plugin may know of the attempt.
fn context(target: &Target, d: &Claimed, started: Millis, attempt_id: String) -> plugin::DeliveryContext {
    plugin::DeliveryContext {
        tenant: d.tenant.to_string(),
        endpoint_id: target.endpoint.id.to_string(),
        event_id: d.event_id.to_string(),
        event_type: d.event_type.clone(),
        attempt: d.attempts + 1,
        timestamp: started.div_euclid(1000).max(0) as u64,
        attempt_id,
    }
}

/// The event's queue TTL, tightened by the endpoint's own retry TTL; a replay sets its own.
fn deadline(target: &Target, d: &Claimed) -> Millis {
    d.deadline
        .unwrap_or_else(|| d.expires_at.min(d.event_created_at.saturating_add(target.policy.ttl().as_millis() as i64)))
}

/// How soon a delivery waiting for a loading plugin is tried again.
const PLUGIN_LOADING_RETRY_MS: Millis = 250;
/// How long an attempt waits in place for a loading plugin before handing back.
const PLUGIN_LOADING_WAIT: Duration = Duration::from_secs(5);

/// Waits, without an attempt, while a plugin bound to the deliveries' endpoint is still
/// loading (after a start or a new file): calling it now would fail `plugin:not_found`,
/// which is not the deliveries' fault. They go out as soon as the load ends; after
/// [`PLUGIN_LOADING_WAIT`] they are handed back, due shortly, and the slot freed.
async fn wait_for_plugins(cx: &AttemptCtx, target: &Target, claimed: &NonEmpty<Claimed>) -> bool {
    let bound = &target.endpoint.spec.plugins;
    let tenant = claimed.first().tenant.as_str();
    let deadline = Instant::now() + PLUGIN_LOADING_WAIT;
    for name in [&bound.transform, &bound.classify, &bound.sign].into_iter().flatten() {
        let left = deadline.saturating_duration_since(Instant::now());
        if !cx.plugins.until_loaded(tenant, name, left).await {
            let next_attempt_at = cx.clock.now() + PLUGIN_LOADING_RETRY_MS;
            let releases = claimed.iter().map(|d| Release { delivery: d.id.clone(), fence: d.fence, next_attempt_at });
            cx.recorder.release(releases.collect()).await;
            return true;
        }
    }
    false
}

/// Builds the request (adapters to the pinned version, transform plugin, CloudEvents encoding, sign plugin), notes what it is, and sends it
/// the way the claim opened ([`Transport`]).
async fn send(
    inner: &AttemptCtx,
    target: &Target,
    d: &Claimed,
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
) -> Exchange {
    let request = match built(inner, target, d, ctx, trace).await {
        Ok(request) => request,
        Err(decided) => return decided,
    };
    let transport = match &target.opened {
        Ok(opened) => &opened.transport,
        Err(e) => return held(e.hold_reason()),
    };
    let via = Through { deliverer: &inner.deliverer, metrics: &inner.metrics, clock: &inner.clock };
    match transport.send(via, d, request).await {
        Sent::Answered(outcome, sent) => Exchange::Answered(outcome, sent),
        Sent::TokenFailed(e) => token_failed(e),
    }
}

/// One delivery's request, ready to leave: transformed, encoded, signed; `Err`: a plugin
/// decided instead.
async fn built(
    inner: &AttemptCtx,
    target: &Target,
    d: &Claimed,
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
) -> Result<Request, Exchange> {
    let spec = &target.endpoint.spec;
    let converted = converted(inner, spec, d, ctx, trace).await?;
    let payload = converted.as_deref().unwrap_or(&d.payload);
    let (request, is_envelope) = transformed(inner, spec, (d, payload), ctx, trace).await?;
    // A converted payload's envelope is not the stored event's: the attempt keeps its body.
    let is_envelope = is_envelope && converted.is_none();
    let request = encoded(inner, spec, d, request);
    let (headers, body) = signed(inner, target, d, ctx, trace, request, None).await?;
    Ok(Request { headers, body, is_envelope })
}

/// The endpoint's own material cannot be used (a TLS key or a broker credential that does
/// not open): held until a human fixes it.
fn held(reason: String) -> Exchange {
    let verdict = Verdict::HoldForHuman { reason: reason.clone() };
    Exchange::Decided { verdict, by: "builtin".to_string(), error: Some(reason) }
}

/// The token endpoint gave no token: nothing was sent; the endpoint is held like a TLS
/// failure (`classify::token_failed`), and the attempt says why (`auth:token: …`).
fn token_failed(error: String) -> Exchange {
    Exchange::Decided {
        verdict: classify::token_failed(&error),
        by: "builtin".to_string(),
        error: Some(format!("{}: {error}", classify::AUTH_TOKEN)),
    }
}
