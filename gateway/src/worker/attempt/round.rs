//! A batching broker endpoint's attempt: the claimed deliveries published as one pipelined
//! round. Each stays its own message, built as it would be alone (transform plugin,
//! CloudEvents encoding, its own headers, signature and dedupe id), so a consumer sees no
//! envelope change; every message is written to the destination's connection at once and
//! each is judged by its own acknowledgement, so a nack or an error retries that one only.
//! The round is one request: one pacer permit, one in-flight slot, one `herald_attempts`;
//! its attempts share its start time and duration. What a plugin drops or fails before
//! sending settles on its own, outside the round.

use rand::rngs::StdRng;
use tokio::time::Instant;

use super::record::Settling;
use super::{AttemptCtx, Exchange, NonEmpty, Sending, built, concluded, held};
use crate::store::Claimed;
use crate::worker::signal::{PartitionLink, Target};
use crate::worker::target::{Request, Through};

/// Publishes `claimed` in one round and settles each delivery by its own answer.
pub(super) async fn attempt_round(
    cx: &AttemptCtx,
    link: &PartitionLink,
    target: &Target,
    claimed: NonEmpty<Claimed>,
    rng: &mut StdRng,
) -> Vec<Settling> {
    let started = cx.clock.now();
    let (mut members, mut requests, mut settled) = (Vec::new(), Vec::new(), Vec::new());
    for d in claimed {
        let sending = Sending::start_at(cx, target, d, started, rng);
        match built(cx, target, &sending.d, &sending.ctx, &sending.trace).await {
            Ok(request) => {
                members.push(sending);
                requests.push(request);
            }
            Err(decided) => settled.push(concluded(cx, link, target, sending, decided, 0, rng).await),
        }
    }
    if members.is_empty() {
        return settled;
    }
    let sent = Instant::now();
    let exchanges = published(cx, target, &members, requests).await;
    let duration_ms = sent.elapsed().as_millis() as u64;
    cx.metrics.attempt_duration.observe(sent.elapsed());
    for (sending, exchange) in members.into_iter().zip(exchanges) {
        settled.push(concluded(cx, link, target, sending, exchange, duration_ms, rng).await);
    }
    settled
}

/// What came back for each member, in order: its acknowledgement or failure, or the hold
/// of an endpoint whose material does not open (nothing sent).
async fn published(cx: &AttemptCtx, target: &Target, members: &[Sending], requests: Vec<Request>) -> Vec<Exchange> {
    let transport = match &target.opened {
        Ok(opened) => &opened.transport,
        Err(e) => return members.iter().map(|_| held(e.hold_reason())).collect(),
    };
    let requests = members.iter().map(|s| &s.d).zip(requests).collect();
    let via = Through { deliverer: &cx.deliverer, metrics: &cx.metrics, clock: &cx.clock };
    let answers = transport.publish_round(via, requests).await;
    answers.into_iter().map(|(outcome, sent)| Exchange::Answered(outcome, sent)).collect()
}
