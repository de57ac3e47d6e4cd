//! An attempt's part in its event's trace: the `traceparent` it sends and, when spans are
//! exported, its span and its plugin calls' child spans.

use rand::rngs::StdRng;

use super::judge::Judged;
use crate::model::{DeliveryState, TraceContext, span_id};
use crate::plugin;
use crate::store::Claimed;
use crate::telemetry::{Span, Telemetry};
use crate::worker::decide::Decision;
use crate::worker::signal::Target;

/// An attempt's part in its event's trace: the `traceparent` it sends (the event's trace
/// id, a span id of the attempt's own: a retry gets another), and its span when spans are
/// exported (then that span's id is the one sent). Nothing when the event has no trace.
pub(super) struct AttemptTrace {
    pub(super) header: Option<TraceContext>,
    span: Option<Span>,
}

impl AttemptTrace {
    pub(super) fn start(telemetry: &Telemetry, d: &Claimed, rng: &mut StdRng) -> AttemptTrace {
        let span = telemetry.attempt(d.trace.as_ref());
        let header = match &span {
            Some(s) => Some(s.context()),
            None => d.trace.as_ref().map(|t| t.child(span_id(rng))),
        };
        AttemptTrace { header, span }
    }

    /// A child span for a plugin call of the attempt.
    pub(super) fn plugin(&self, hook: plugin::Hook, name: &str) -> Option<Span> {
        let mut span = self.span.as_ref()?.child(format!("plugin {} {name}", hook.as_str()));
        span.set("herald.plugin", name.to_string());
        span.set("herald.plugin.hook", hook.as_str());
        Some(span)
    }

    /// Notes on the span what the attempt was and how it was judged.
    pub(super) fn settled(
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
