//! One delivery attempt's I/O: build the request (envelope, transform and sign plugins,
//! headers), send it through `deliver`, judge the outcome (classify plugin or the built-in
//! table), apply what [`decide`](super::decide) says to the endpoint, and record the result
//! and the endpoint's change in one commit. It never paces and never claims.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::rngs::StdRng;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::decide::{Decision, EndpointAction, EndpointEffect, decide, endpoint_effect};
use super::signal::{Shared, Target};
use super::target::{Request, Sent};
use super::{HUMAN_PAUSE, Inner};
use crate::classify::{self, Outcome, Verdict};
use crate::model::{
    Attempt, DeliveryState, Endpoint, EndpointSpec, EndpointState, Millis, SentRequest, TRACEPARENT, TRACESTATE,
    TraceContext, envelope, new_id, span_id,
};
use crate::net::headers::is_reserved;
use crate::plugin;
use crate::sign::{self, Secret};
use crate::store::{AttemptResult, Claimed, EndpointChange, Recorded, Release};
use crate::telemetry::Span;

/// What an attempt produced before classification.
enum Exchange {
    /// The request went out; what came back (an answer or a transport failure), and what
    /// was sent.
    Answered(Outcome, SentRequest),
    /// A plugin decided instead: it dropped the delivery, or it failed before sending.
    Decided { verdict: Verdict, by: String, error: Option<String> },
}

/// Runs one attempt of `d` to its recorded end: send, judge, decide (delivery and
/// endpoint), record both in one commit. The pacer slot frees once the request is judged
/// (a pause or halt it caused is in memory by then), so the endpoint's next request does
/// not wait for this one's commit; the global slot frees after the commit, bounding the
/// results the writer may have waiting.
pub(super) async fn run(
    inner: Arc<Inner>,
    shared: Arc<Shared>,
    target: Arc<Target>,
    d: Claimed,
    _slot: OwnedSemaphorePermit,
    mut rng: StdRng,
) {
    let again = if wait_for_plugins(&inner, &target, &d).await {
        shared.request_done();
        Some(inner.clock.now() + PLUGIN_LOADING_RETRY_MS)
    } else {
        inner.metrics.in_flight.inc();
        let started = inner.clock.now();
        let sent = Instant::now();
        let attempt_id = new_id("att", started, &mut rng);
        let ctx = context(&target, &d, started, attempt_id);
        let mut trace = AttemptTrace::start(&inner, &d, &mut rng);
        let exchange = send(&inner, &target, &d, &ctx, &trace).await;
        let duration_ms = sent.elapsed().as_millis() as u64;
        inner.metrics.attempt_duration.observe(sent.elapsed());
        let judged = judge_exchange(&inner, &target, &ctx, &trace, exchange).await;
        let now = inner.clock.now();
        let decision = decide(
            &judged.verdict,
            ctx.attempt.saturating_sub(d.attempt_base),
            now,
            deadline(&target, &d),
            &target.policy,
            &mut rng,
        );
        let change = endpoint_change(&inner, &shared, &target.endpoint, &judged.verdict, now);
        inner.metrics.in_flight.dec();
        shared.request_done();
        trace.settled(&target, &d, &ctx, &judged, &decision);
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
        let again = decision.next_attempt_at.or_else(|| ordered.then(|| inner.clock.now()));
        record(&inner, &target, &d, decision, attempt, change).await;
        again
    };
    shared.settled(again);
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

/// An attempt's part in its event's trace: the `traceparent` it sends (the event's trace
/// id, a span id of the attempt's own: a retry gets another), and its span when spans are
/// exported (then that span's id is the one sent). Nothing when the event has no trace.
struct AttemptTrace {
    header: Option<TraceContext>,
    span: Option<Span>,
}

impl AttemptTrace {
    fn start(inner: &Inner, d: &Claimed, rng: &mut StdRng) -> AttemptTrace {
        let span = inner.telemetry.attempt(d.trace.as_ref());
        let header = match &span {
            Some(s) => Some(s.context()),
            None => d.trace.as_ref().map(|t| t.child(span_id(rng))),
        };
        AttemptTrace { header, span }
    }

    /// A child span for a plugin call of the attempt.
    fn plugin(&self, hook: plugin::Hook, name: &str) -> Option<Span> {
        let mut span = self.span.as_ref()?.child(format!("plugin {} {name}", hook.as_str()));
        span.set("herald.plugin", name.to_string());
        span.set("herald.plugin.hook", hook.as_str());
        Some(span)
    }

    /// Notes on the span what the attempt was and how it was judged.
    fn settled(
        &mut self,
        target: &Target,
        d: &Claimed,
        ctx: &plugin::DeliveryContext,
        j: &Judged,
        decision: &Decision,
    ) {
        let Some(span) = self.span.as_mut() else { return };
        span.set("herald.tenant", d.tenant.to_string());
        span.set("herald.endpoint_id", target.endpoint.id.to_string());
        span.set("herald.event_id", d.event_id.to_string());
        span.set("herald.delivery_id", d.id.to_string());
        span.set("herald.attempt", i64::from(ctx.attempt));
        span.set("herald.attempt_id", ctx.attempt_id.clone());
        span.set("herald.verdict", decision.label.clone());
        span.set("herald.decided_by", j.by.clone());
        if let Some(status) = j.status {
            span.set("http.response.status_code", i64::from(status));
        }
        if decision.state != DeliveryState::Delivered {
            span.fail(j.error.clone().unwrap_or_else(|| decision.label.clone()));
        }
    }
}

/// The event's queue TTL, tightened by the endpoint's own retry TTL; a replay sets its own.
fn deadline(target: &Target, d: &Claimed) -> Millis {
    d.deadline
        .unwrap_or_else(|| d.expires_at.min(d.event_created_at.saturating_add(target.policy.ttl().as_millis() as i64)))
}

/// An exchange judged: the verdict, who gave it, and what the attempt record keeps.
struct Judged {
    verdict: Verdict,
    by: String,
    status: Option<u16>,
    response_body: Option<String>,
    error: Option<String>,
    request: Option<SentRequest>,
}

async fn judge_exchange(
    inner: &Inner,
    target: &Target,
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
    ex: Exchange,
) -> Judged {
    match ex {
        Exchange::Answered(outcome, sent) => {
            let (verdict, by) = judge(inner, target, ctx, trace, &outcome).await;
            let request = Some(sent);
            match outcome {
                Outcome::Response(r) => Judged {
                    verdict,
                    by,
                    status: Some(r.status),
                    response_body: Some(r.body_prefix),
                    error: None,
                    request,
                },
                Outcome::Transport { kind, detail } => Judged {
                    verdict,
                    by,
                    status: None,
                    response_body: None,
                    error: Some(format!("{kind}: {detail}")),
                    request,
                },
            }
        }
        Exchange::Decided { verdict, by, error } => {
            Judged { verdict, by, status: None, response_body: None, error, request: None }
        }
    }
}

/// The endpoint effect of `verdict`, applied to the partition (under its failure-tracking
/// lock, so concurrent attempts see each other's changes); the change to commit, if any.
fn endpoint_change(
    inner: &Inner,
    shared: &Shared,
    endpoint: &Endpoint,
    verdict: &Verdict,
    now: Millis,
) -> Option<EndpointChange> {
    let effect = {
        let mut failing = shared.failing_since.lock().expect("failing");
        let effect = endpoint_effect(verdict, *failing, now, inner.config.delivery.disable_after);
        if effect.failing_since.changes() {
            *failing = effect.failing_since.since();
        }
        effect
    };
    apply_effect(inner, shared, endpoint, &effect, now)
}

/// Commits the result with the endpoint's change (the change first, so the result settles
/// against the endpoint's new state), then counts it and announces a dead letter.
async fn record(
    inner: &Inner,
    target: &Target,
    d: &Claimed,
    decision: Decision,
    attempt: Attempt,
    change: Option<EndpointChange>,
) {
    let (number, duration_ms, status) = (attempt.number, attempt.duration_ms, attempt.status);
    let result = AttemptResult {
        delivery: d.id.clone(),
        fence: d.fence,
        state: decision.state,
        next_attempt_at: decision.next_attempt_at,
        reason: decision.reason.clone(),
        attempt,
        ordered: target.endpoint.spec.is_ordered(),
    };
    let recorded = record_until_stored(inner, change, result).await;
    if let Ok(Recorded { dead_lettered: n @ 1.., .. }) = recorded {
        target.counters.dead_lettered("endpoint_disabled", n);
        tracing::warn!(
            tenant = %d.tenant, endpoint_id = %target.endpoint.id, count = n, reason = "endpoint_disabled",
            "dead letters: the disabled endpoint's other deliveries"
        );
    }
    match recorded.map(|r| r.settled) {
        Ok(None) => {
            inner.metrics.fenced_results.inc();
            tracing::warn!(
                tenant = %d.tenant, endpoint_id = %target.endpoint.id, delivery_id = %d.id, event_id = %d.event_id,
                attempt = number, "lease lost before the result was recorded"
            );
        }
        Ok(Some(settled)) => match settled {
            DeliveryState::Delivered => {
                target.counters.settled(settled, None);
                let waited = inner.clock.now().saturating_sub(d.event_created_at).max(0) as u64;
                inner.metrics.arrival_latency.observe(Duration::from_millis(waited));
            }
            DeliveryState::Dead if decision.state == DeliveryState::Dead => {
                dead_lettered(inner, target, d, &decision, number)
            }
            DeliveryState::Dead => {
                // A retry whose endpoint was disabled meanwhile (by another attempt, or an
                // operator): a dead letter like the endpoint's others, counted the same.
                target.counters.settled(settled, Some("endpoint_disabled"));
                tracing::warn!(
                    tenant = %d.tenant, endpoint_id = %target.endpoint.id, delivery_id = %d.id,
                    event_id = %d.event_id, attempt = number, reason = "endpoint_disabled", "dead letter"
                );
            }
            state => target.counters.settled(state, None),
        },
        Err(e) => {
            tracing::error!(
                tenant = %d.tenant, endpoint_id = %target.endpoint.id, delivery_id = %d.id, event_id = %d.event_id,
                attempt = number, error = %e, "cannot record attempt; the lease will expire and it will be sent again"
            )
        }
    }
    tracing::debug!(
        tenant = %d.tenant, endpoint_id = %target.endpoint.id, delivery_id = %d.id, event_id = %d.event_id,
        attempt = number, status, verdict = %decision.label, duration_ms, "attempt"
    );
}

/// Commits a result, trying again for as long as the database is out of reach (restarting,
/// a connection lost): a result sent and then dropped would be sent again once its lease
/// expired, long after the database came back. Trying again is safe: the fence admits one
/// result per claim, so a retry after a commit whose answer was lost is refused (counted as
/// fenced), never recorded twice, and a result that outlived its lease is refused too. The
/// attempt keeps its node-wide slot meanwhile, so a node whose database is down soon stops
/// sending (`delivery.max_in_flight_total`). A failure of another kind (the database
/// refused the statement) is not tried again: it would fail every group commit it joined.
async fn record_until_stored(
    inner: &Inner,
    change: Option<EndpointChange>,
    result: AttemptResult,
) -> crate::store::Result<Recorded> {
    super::until_stored(None, || inner.committer.record_with(change.clone(), result.clone())).await
}

/// A delivery just went to the dead-letter queue: counted, logged, announced as an
/// operational event.
fn dead_lettered(inner: &Inner, target: &Target, d: &Claimed, decision: &Decision, number: u32) {
    target.counters.settled(decision.state, decision.reason.as_deref());
    tracing::warn!(
        tenant = %d.tenant, endpoint_id = %target.endpoint.id, delivery_id = %d.id, event_id = %d.event_id,
        event_type = %d.event_type, attempt = number, reason = decision.reason.as_deref().unwrap_or(""),
        "dead letter"
    );
    let data = serde_json::json!({
        "delivery_id": d.id, "event_id": d.event_id, "event_type": d.event_type,
        "endpoint_id": target.endpoint.id, "reason": decision.reason, "attempts": number,
    });
    inner.ops.emit(&d.tenant, "delivery.dead", format!("delivery.dead.{}.{}", d.id, number), data);
}

/// How soon a delivery waiting for a loading plugin is tried again.
const PLUGIN_LOADING_RETRY_MS: Millis = 250;
/// How long an attempt waits in place for a loading plugin before handing back.
const PLUGIN_LOADING_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits, without an attempt, while a plugin bound to `d`'s endpoint is still loading
/// (after a start or a new file): calling it now would fail `plugin:not_found`, which is
/// not the delivery's fault. The delivery goes out as soon as the load ends; after
/// [`PLUGIN_LOADING_WAIT`] it is handed back, due shortly, and the slot freed.
async fn wait_for_plugins(inner: &Arc<Inner>, target: &Target, d: &Claimed) -> bool {
    let bound = &target.endpoint.spec.plugins;
    let tenant = d.tenant.as_str();
    let deadline = tokio::time::Instant::now() + PLUGIN_LOADING_WAIT;
    for name in [&bound.transform, &bound.classify, &bound.sign].into_iter().flatten() {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !inner.plugins.until_loaded(tenant, name, left).await {
            let release = Release {
                delivery: d.id.clone(),
                fence: d.fence,
                next_attempt_at: inner.clock.now() + PLUGIN_LOADING_RETRY_MS,
            };
            super::release(inner, vec![release]).await;
            return true;
        }
    }
    false
}

/// Builds the request (transform and sign plugins included), notes what it is, and sends it
/// the way the claim opened ([`Transport`]).
async fn send(
    inner: &Inner,
    target: &Target,
    d: &Claimed,
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
) -> Exchange {
    let spec = &target.endpoint.spec;
    let (request, is_envelope) = match transformed(inner, spec, d, ctx, trace).await {
        Ok(transformed) => transformed,
        Err(decided) => return decided,
    };
    let (headers, body) = match signed(inner, target, d, ctx, trace, request).await {
        Ok(signed) => signed,
        Err(decided) => return decided,
    };
    let transport = match &target.opened {
        Ok(opened) => &opened.transport,
        Err(e) => return held(e.hold_reason()),
    };
    match transport.send(inner, d, Request { headers, body, is_envelope }).await {
        Sent::Answered(outcome, sent) => Exchange::Answered(outcome, sent),
        Sent::TokenFailed(e) => token_failed(e),
    }
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

/// The envelope with the endpoint's custom headers, as its transform plugin (if any)
/// leaves it, and whether the body is still the envelope; `Err`: the plugin dropped the
/// delivery or failed.
async fn transformed(
    inner: &Inner,
    spec: &EndpointSpec,
    d: &Claimed,
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
) -> Result<(plugin::Request, bool), Exchange> {
    let request = plugin::Request {
        headers: std::iter::once(("content-type".to_string(), "application/json".to_string()))
            .chain(spec.headers.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect(),
        body: envelope(d.event_id.as_str(), &d.event_type, d.event_created_at, &d.payload).into_bytes(),
    };
    let Some(name) = &spec.plugins.transform else { return Ok((request, true)) };
    let timer = inner.metrics.plugin_call(plugin::Hook::Transform);
    let span = trace.plugin(plugin::Hook::Transform, name);
    match timer.time(inner.plugins.transform(d.tenant.as_str(), name, ctx, &request)).await {
        Ok(plugin::TransformResult::Send(r)) => {
            let unchanged = r.body == request.body;
            Ok((r, unchanged))
        }
        // One dead-letter reason for every drop, so `reason=dropped` finds them all; the
        // plugin's own words are the attempt's error (and the delivery's last error).
        Ok(plugin::TransformResult::Drop(reason)) => Err(Exchange::Decided {
            verdict: Verdict::Fail { reason: "dropped".into() },
            by: format!("plugin:{name}"),
            error: Some(reason),
        }),
        Err(f) => Err(plugin_failed(inner, d, ctx, (name, span), plugin::Hook::Transform, f)),
    }
}

/// The headers and body to send: the request's headers without reserved ones, Herald's
/// own, and the signature (the sign plugin's headers, or Standard Webhooks' with the
/// endpoint's secrets); `Err`: the sign plugin failed.
async fn signed(
    inner: &Inner,
    target: &Target,
    d: &Claimed,
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
    mut request: plugin::Request,
) -> Result<(Vec<(String, String)>, Vec<u8>), Exchange> {
    let sign_plugin = &target.endpoint.spec.plugins.sign;
    let timestamp = ctx.timestamp as i64;
    // A sign plugin reads the request as the transform left it; otherwise it is ours to take.
    let mut headers = match sign_plugin {
        Some(_) => request.headers.clone(),
        None => std::mem::take(&mut request.headers),
    };
    headers.retain(|(k, _)| !is_reserved(k));
    headers.extend([
        ("user-agent".to_string(), concat!("herald/", env!("CARGO_PKG_VERSION")).to_string()),
        (sign::HEADER_ID.to_string(), d.event_id.to_string()),
        (sign::HEADER_TIMESTAMP.to_string(), timestamp.to_string()),
        ("herald-attempt-id".to_string(), ctx.attempt_id.clone()),
        ("herald-delivery-id".to_string(), d.id.to_string()),
    ]);
    if let Some(t) = &trace.header {
        headers.push((TRACEPARENT.to_string(), t.traceparent()));
        headers.extend(t.state.as_ref().map(|s| (TRACESTATE.to_string(), s.clone())));
    }
    match sign_plugin {
        Some(name) => {
            let keys: Vec<Vec<u8>> = target.secrets().iter().map(|s| s.as_bytes().to_vec()).collect();
            let timer = inner.metrics.plugin_call(plugin::Hook::Sign);
            let span = trace.plugin(plugin::Hook::Sign, name);
            match timer.time(inner.plugins.sign(d.tenant.as_str(), name, ctx, &keys, &request)).await {
                Ok(extra) => headers.extend(extra.into_iter().filter(|(k, _)| !is_reserved(k))),
                Err(f) => return Err(plugin_failed(inner, d, ctx, (name, span), plugin::Hook::Sign, f)),
            }
        }
        None => {
            let secrets: Vec<&Secret> = target.secrets().iter().collect();
            let sig = sign::signature_header(&secrets, d.event_id.as_str(), timestamp, &request.body);
            headers.push((sign::HEADER_SIGNATURE.to_string(), sig));
        }
    }
    Ok((headers, request.body))
}

/// A transform or sign plugin call that failed: counted, logged, and retried per policy.
fn plugin_failed(
    inner: &Inner,
    d: &Claimed,
    ctx: &plugin::DeliveryContext,
    (name, span): (&str, Option<Span>),
    hook: plugin::Hook,
    f: plugin::PluginFailure,
) -> Exchange {
    if let Some(mut span) = span {
        span.fail(f.reason());
    }
    inner.metrics.plugin_failed(d.tenant.as_str(), name, hook, &f);
    tracing::warn!(
        tenant = %d.tenant, endpoint_id = %ctx.endpoint_id, delivery_id = %d.id, event_id = %d.event_id,
        attempt = ctx.attempt, plugin = name, hook = hook.as_str(), error = %f, "plugin call failed"
    );
    Exchange::Decided { verdict: Verdict::Retry { after: None }, by: format!("plugin:{name}"), error: Some(f.reason()) }
}

/// The verdict: the endpoint's classify plugin if it has an opinion, else the built-in table.
async fn judge(
    inner: &Inner,
    target: &Target,
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
    outcome: &Outcome,
) -> (Verdict, String) {
    let builtin = || (classify::classify(outcome), "builtin".to_string());
    let Some(name) = &target.endpoint.spec.plugins.classify else { return builtin() };
    let timer = inner.metrics.plugin_call(plugin::Hook::Classify);
    let mut span = trace.plugin(plugin::Hook::Classify, name);
    match timer.time(inner.plugins.classify(ctx.tenant.as_str(), name, ctx, &outcome.into())).await {
        Ok(v) => plugin::verdict(v, name).map(|v| (v, format!("plugin:{name}"))).unwrap_or_else(builtin),
        Err(f) => {
            if let Some(span) = span.as_mut() {
                span.fail(f.reason());
            }
            inner.metrics.plugin_failed(&ctx.tenant, name, plugin::Hook::Classify, &f);
            tracing::warn!(
                tenant = %ctx.tenant, endpoint_id = %ctx.endpoint_id, event_id = %ctx.event_id, attempt = ctx.attempt,
                plugin = %name, error = %f, "classify failed; using the built-in table"
            );
            (classify::classify(outcome), format!("builtin (plugin:{name} failed: {f})"))
        }
    }
}

/// Applies an endpoint effect to the partition (pacer, halt), metrics, logs and
/// operational events; returns the change to commit with the attempt's result.
fn apply_effect(
    inner: &Inner,
    shared: &Shared,
    endpoint: &Endpoint,
    effect: &EndpointEffect,
    now: Millis,
) -> Option<EndpointChange> {
    let change = |state, reason, paused_until| EndpointChange {
        endpoint: endpoint.id.clone(),
        state,
        reason,
        paused_until,
        failing_since: effect.failing_since,
        now,
    };
    let halt = |kind: &str, reason: &str| {
        shared.halted.store(true, Ordering::Release);
        shared.pacer.lock().expect("pacer").pause_until(Instant::now() + HUMAN_PAUSE);
        let data =
            serde_json::json!({ "endpoint_id": endpoint.id, "url": endpoint.spec.target.url(), "reason": reason });
        inner.ops.emit(&endpoint.tenant, kind, format!("{kind}.{}.{now}", endpoint.id), data);
    };
    match &effect.action {
        EndpointAction::None => effect.failing_since.changes().then(|| change(None, None, None)),
        EndpointAction::PauseFor { until, after, reason } => {
            shared.pacer.lock().expect("pacer").pause_until(Instant::now() + *after);
            inner.metrics.endpoint_pauses.inc();
            tracing::info!(
                tenant = %endpoint.tenant, endpoint_id = %endpoint.id, state = "paused",
                pause_ms = after.as_millis() as u64, reason, "endpoint state change: paused for a while"
            );
            Some(change(Some(EndpointState::Paused), Some(reason.clone()), Some(*until)))
        }
        EndpointAction::HoldForHuman { reason } => {
            halt("endpoint.paused", reason);
            inner.metrics.endpoint_pauses.inc();
            tracing::warn!(
                tenant = %endpoint.tenant, endpoint_id = %endpoint.id, state = "paused", reason,
                "endpoint state change: paused until re-enabled"
            );
            Some(change(Some(EndpointState::Paused), Some(reason.clone()), None))
        }
        EndpointAction::Disable { reason } => {
            halt("endpoint.disabled", reason);
            inner.metrics.endpoint_disables.inc();
            tracing::warn!(
                tenant = %endpoint.tenant, endpoint_id = %endpoint.id, state = "disabled", reason,
                "endpoint state change: disabled"
            );
            Some(change(Some(EndpointState::Disabled), Some(reason.clone()), None))
        }
    }
}
