//! Recording an attempt: its result and the endpoint's change in one commit (the change
//! first), tried again while the database is out of reach; then counted, logged, and a
//! dead letter announced.

use std::time::Duration;

use super::AttemptCtx;
use crate::model::{Attempt, DeliveryState, Millis};
use crate::store::{AttemptResult, Claimed, Committer, EndpointChange, Recorded, Release};
use crate::worker::decide::Decision;
use crate::worker::signal::Target;

/// The committer as an attempt sees it: it records results and hands claims back, and
/// cannot claim.
pub(in crate::worker) struct Recorder(Committer);

impl Recorder {
    pub(in crate::worker) fn new(committer: Committer) -> Recorder {
        Recorder(committer)
    }

    /// Commits a result, trying again for as long as the database is out of reach
    /// (restarting, a connection lost): a result sent and then dropped would be sent again
    /// once its lease expired, long after the database came back. Trying again is safe: the
    /// fence admits one result per claim, so a retry after a commit whose answer was lost is
    /// refused (counted as fenced), never recorded twice, and a result that outlived its
    /// lease is refused too. The attempt keeps its node-wide slot meanwhile, so a node whose
    /// database is down soon stops sending (`delivery.max_in_flight_total`). A failure of
    /// another kind (the database refused the statement) is not tried again: it would fail
    /// every group commit it joined.
    async fn until_stored(
        &self,
        change: Option<EndpointChange>,
        result: AttemptResult,
    ) -> crate::store::Result<Recorded> {
        crate::worker::until_stored(None, || self.0.record_with(change.clone(), result.clone())).await
    }

    /// Hands claimed deliveries back unsent (see [`crate::worker::release`]).
    pub(super) async fn release(&self, releases: Vec<Release>) {
        crate::worker::release(&self.0, releases).await;
    }
}

/// A delivery's attempt judged and decided, its request over, its result not yet recorded.
pub(super) struct Settling {
    pub(super) d: Claimed,
    pub(super) decision: Decision,
    pub(super) attempt: Attempt,
    pub(super) change: Option<EndpointChange>,
    /// When the partition should look at the delivery's key again: its retry, or now on an
    /// ordered endpoint (what follows it in its key may go once it has settled).
    pub(super) again: Option<Millis>,
}

/// Commits the result with the endpoint's change (the change first, so the result settles
/// against the endpoint's new state), then counts it and announces a dead letter.
pub(super) async fn record(cx: &AttemptCtx, target: &Target, settling: Settling) {
    let Settling { d, decision, attempt, change, .. } = settling;
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
    let recorded = cx.recorder.until_stored(change, result).await;
    if let Ok(Recorded { dead_lettered: n @ 1.., .. }) = recorded {
        target.counters.dead_lettered("endpoint_disabled", n);
        tracing::warn!(
            tenant = %d.tenant, endpoint_id = %target.endpoint.id, count = n, reason = "endpoint_disabled",
            "dead letters: the disabled endpoint's other deliveries"
        );
    }
    match recorded.map(|r| r.settled) {
        Ok(None) => {
            cx.metrics.fenced_results.inc();
            tracing::warn!(
                tenant = %d.tenant, endpoint_id = %target.endpoint.id, delivery_id = %d.id, event_id = %d.event_id,
                attempt = number, "lease lost before the result was recorded"
            );
        }
        Ok(Some(settled)) => counted(cx, target, &d, &decision, number, settled),
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

/// Counts a recorded result by the state it settled in (which a change committed
/// meanwhile may have made other than the decision's).
fn counted(cx: &AttemptCtx, target: &Target, d: &Claimed, decision: &Decision, number: u32, settled: DeliveryState) {
    match settled {
        DeliveryState::Delivered => {
            target.counters.settled(settled, None);
            let waited = cx.clock.now().saturating_sub(d.event_created_at).max(0) as u64;
            cx.metrics.arrival_latency.observe(Duration::from_millis(waited));
        }
        DeliveryState::Dead if decision.state == DeliveryState::Dead => dead_lettered(cx, target, d, decision, number),
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
    }
}

/// A delivery just went to the dead-letter queue: counted, logged, announced as an
/// operational event.
fn dead_lettered(cx: &AttemptCtx, target: &Target, d: &Claimed, decision: &Decision, number: u32) {
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
    cx.ops.emit(&d.tenant, "delivery.dead", format!("delivery.dead.{}.{}", d.id, number), data);
}
