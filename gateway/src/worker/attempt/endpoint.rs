//! What a verdict does to the endpoint: the effect [`decide`](crate::worker::decide) gives,
//! applied to the partition (pause, halt), metrics, logs and operational events, and the
//! change to commit with the attempt's result.

use super::AttemptCtx;
use crate::classify::Verdict;
use crate::model::{Endpoint, EndpointState, Millis, StateBy};
use crate::store::EndpointChange;
use crate::worker::decide::{EndpointAction, EndpointEffect, endpoint_effect};
use crate::worker::signal::PartitionLink;

/// The endpoint effect of `verdict`, applied to the partition (its failing streak under the
/// partition's lock, so concurrent attempts see each other's changes); the change to
/// commit, if any.
pub(super) fn endpoint_change(
    cx: &AttemptCtx,
    link: &PartitionLink,
    endpoint: &Endpoint,
    verdict: &Verdict,
    now: Millis,
) -> Option<EndpointChange> {
    let effect = link.failing_since(|failing| {
        let effect = endpoint_effect(verdict, *failing, now, cx.config.delivery.disable_after);
        if effect.failing_since.changes() {
            *failing = effect.failing_since.since();
        }
        effect
    });
    apply_effect(cx, link, endpoint, &effect, now)
}

/// Applies an endpoint effect to the partition (pause, halt), metrics, logs and
/// operational events; returns the change to commit with the attempt's result.
fn apply_effect(
    cx: &AttemptCtx,
    link: &PartitionLink,
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
        by: StateBy::Receiver,
        now,
    };
    let halt = |kind: &str, reason: &str| {
        link.halt();
        let data =
            serde_json::json!({ "endpoint_id": endpoint.id, "url": endpoint.spec.target.url(), "reason": reason });
        cx.ops.emit(&endpoint.tenant, kind, format!("{kind}.{}.{now}", endpoint.id), data);
    };
    match &effect.action {
        EndpointAction::None => effect.failing_since.changes().then(|| change(None, None, None)),
        EndpointAction::PauseFor { until, after, reason } => {
            link.pause_for(*after);
            cx.metrics.endpoint_pauses.inc();
            tracing::info!(
                tenant = %endpoint.tenant, endpoint_id = %endpoint.id, state = "paused",
                pause_ms = after.as_millis() as u64, reason, "endpoint state change: paused for a while"
            );
            Some(change(Some(EndpointState::Paused), Some(reason.clone()), Some(*until)))
        }
        EndpointAction::HoldForHuman { reason } => {
            halt("endpoint.paused", reason);
            cx.metrics.endpoint_pauses.inc();
            tracing::warn!(
                tenant = %endpoint.tenant, endpoint_id = %endpoint.id, state = "paused", reason,
                "endpoint state change: paused until re-enabled"
            );
            Some(change(Some(EndpointState::Paused), Some(reason.clone()), None))
        }
        EndpointAction::Disable { reason } => {
            halt("endpoint.disabled", reason);
            cx.metrics.endpoint_disables.inc();
            tracing::warn!(
                tenant = %endpoint.tenant, endpoint_id = %endpoint.id, state = "disabled", reason,
                "endpoint state change: disabled"
            );
            Some(change(Some(EndpointState::Disabled), Some(reason.clone()), None))
        }
    }
}
