//! A batching endpoint's attempt: each event through the endpoint's transform plugin, then
//! one request for all (`{"type":"batch","data":[…]}`, `model::batch_envelope`), signed
//! once as the batch (`webhook-id`: `model::batch_id`), sent and judged once. Every delivery
//! gets an attempt of its own from that judgement (the shared request's headers, its own
//! part of the body when a transform changed it), decided with the same draw, so a batch
//! retried whole stays together. A 2xx answer naming events in `failed` delivers the rest
//! and retries those. What a transform drops or fails settles on its own, outside the
//! batch.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::build::{signed, transformed};
use super::endpoint::endpoint_change;
use super::judge::{Judged, judge_exchange};
use super::record::Settling;
use super::{AttemptCtx, Exchange, NonEmpty, Sending};
use crate::classify::Verdict;
use crate::deliver::BODY_PREFIX;
use crate::model::{BATCH_TYPE, SentRequest, batch_envelope, batch_id, refused_events};
use crate::plugin;
use crate::store::Claimed;
use crate::worker::signal::{PartitionLink, Target};
use crate::worker::target::{Request, Sent, Through};

/// The error of an event the receiver named in its answer's `failed`.
const REFUSED: &str = "batch: refused by the receiver";

/// One event of the batch, transformed: its attempt under way, its body, and whether that
/// body is still the event's envelope.
struct Member {
    sending: Sending,
    body: Vec<u8>,
    is_envelope: bool,
}

/// Sends `claimed` as one batch and settles each delivery by its answer.
pub(super) async fn attempt_batch(
    cx: &AttemptCtx,
    link: &PartitionLink,
    target: &Target,
    claimed: NonEmpty<Claimed>,
    rng: &mut StdRng,
) -> Vec<Settling> {
    let spec = &target.endpoint.spec;
    let id = batch_id(claimed.iter().map(|d| d.id.as_str()));
    let (mut members, mut settled) = (Vec::new(), Vec::new());
    for d in claimed {
        let sending = Sending::start(cx, target, d, rng);
        match transformed(cx, spec, (&sending.d, &sending.d.payload), &sending.ctx, &sending.trace).await {
            Ok((request, is_envelope)) => members.push(Member { sending, body: request.body, is_envelope }),
            Err(decided) => settled.push(alone(cx, link, target, sending, decided, rng).await),
        }
    }
    if members.is_empty() {
        return settled;
    }
    let sent = Instant::now();
    let first = &members[0].sending;
    let ctx = plugin::DeliveryContext { event_id: id, event_type: BATCH_TYPE.to_string(), ..first.ctx.clone() };
    let exchange = send_batch(cx, target, &members, &ctx).await;
    let duration_ms = sent.elapsed().as_millis() as u64;
    cx.metrics.attempt_duration.observe(sent.elapsed());
    let judged = judge_exchange(cx, target, &ctx, &first.trace, exchange).await;
    let now = cx.clock.now();
    let refused = match judged.verdict {
        Verdict::Delivered => judged.response_body.as_deref().and_then(refused_events).unwrap_or_default(),
        _ => Vec::new(),
    };
    // One endpoint change for the one request, committed with the first result.
    let mut change = endpoint_change(cx, link, &target.endpoint, &judged.verdict, now);
    let draw: u64 = rng.random();
    for m in members {
        let judged = part_of(&judged, &m, &refused);
        let decision = m.sending.decide(target, &judged, now, &mut StdRng::seed_from_u64(draw));
        settled.push(m.sending.settle(cx, target, (judged, decision, change.take()), duration_ms));
    }
    settled
}

/// A delivery the transform dropped or failed: judged and decided on its own.
async fn alone(
    cx: &AttemptCtx,
    link: &PartitionLink,
    target: &Target,
    sending: Sending,
    decided: Exchange,
    rng: &mut StdRng,
) -> Settling {
    super::concluded(cx, link, target, sending, decided, 0, rng).await
}

/// Builds the batch's one request (the endpoint's headers, the envelope of every member),
/// signs it once and sends it the way the claim opened.
async fn send_batch(cx: &AttemptCtx, target: &Target, members: &[Member], ctx: &plugin::DeliveryContext) -> Exchange {
    let spec = &target.endpoint.spec;
    let request = plugin::Request {
        headers: std::iter::once(("content-type".to_string(), "application/json".to_string()))
            .chain(spec.headers.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect(),
        body: batch_envelope(members.iter().map(|m| m.body.as_slice())),
    };
    let first = &members[0].sending;
    let (headers, body) = match signed(cx, target, &first.d, ctx, &first.trace, request, Some(members.len())).await {
        Ok(signed) => signed,
        Err(decided) => return decided,
    };
    let transport = match &target.opened {
        Ok(opened) => &opened.transport,
        Err(e) => return super::held(e.hold_reason()),
    };
    let via = Through { deliverer: &cx.deliverer, metrics: &cx.metrics, clock: &cx.clock };
    // The batch's body is not kept whole: each attempt keeps its own part (below).
    match transport.send(via, &first.d, Request { headers, body, is_envelope: true }).await {
        Sent::Answered(outcome, sent) => Exchange::Answered(outcome, sent),
        Sent::TokenFailed(e) => super::token_failed(e),
    }
}

/// What one member's attempt keeps of the batch's judgement: the shared request's headers
/// and size, its own part of the body when a transform changed it, the answer cut to what
/// an attempt keeps; a retry when the receiver named its event in `failed`.
fn part_of(batch: &Judged, m: &Member, refused: &[String]) -> Judged {
    let request = batch
        .request
        .as_ref()
        .map(|r| SentRequest { body: SentRequest::new(&[], &m.body, m.is_envelope).body, ..r.clone() });
    let response_body = batch.response_body.as_deref().map(|b| cut(b, BODY_PREFIX).to_string());
    let mine = |verdict, error| Judged {
        verdict,
        by: batch.by.clone(),
        status: batch.status,
        response_body: response_body.clone(),
        error,
        request: request.clone(),
    };
    if refused.iter().any(|e| e.as_str() == m.sending.d.event_id.as_str()) {
        return mine(Verdict::Retry { after: None }, Some(REFUSED.to_string()));
    }
    mine(batch.verdict.clone(), batch.error.clone())
}

/// The first `max` bytes of `text`, cut before a character split by the limit.
fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
