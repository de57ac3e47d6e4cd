//! Judging an exchange: the endpoint's classify plugin if it has an opinion, else the
//! built-in table; and what the attempt record keeps of it.

use super::trace::AttemptTrace;
use super::{AttemptCtx, Exchange};
use crate::classify::{self, Outcome, Verdict};
use crate::model::SentRequest;
use crate::plugin;
use crate::worker::signal::Target;

/// An exchange judged: the verdict, who gave it, and what the attempt record keeps.
pub(super) struct Judged {
    pub(super) verdict: Verdict,
    pub(super) by: String,
    pub(super) status: Option<u16>,
    pub(super) response_body: Option<String>,
    pub(super) error: Option<String>,
    pub(super) request: Option<SentRequest>,
}

/// Judges what came back (a plugin's own decision stands as it is).
pub(super) async fn judge_exchange(
    cx: &AttemptCtx,
    target: &Target,
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
    ex: Exchange,
) -> Judged {
    match ex {
        Exchange::Answered(outcome, sent) => {
            let (verdict, by) = judge(cx, target, ctx, trace, &outcome).await;
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

/// The verdict: the endpoint's classify plugin if it has an opinion, else the built-in table.
async fn judge(
    cx: &AttemptCtx,
    target: &Target,
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
    outcome: &Outcome,
) -> (Verdict, String) {
    let builtin = || (classify::classify(outcome), "builtin".to_string());
    let Some(name) = &target.endpoint.spec.plugins.classify else { return builtin() };
    let timer = cx.metrics.plugin_call(plugin::Hook::Classify);
    let mut span = trace.plugin(plugin::Hook::Classify, name);
    match timer.time(cx.plugins.classify(ctx.tenant.as_str(), name, ctx, &outcome.into())).await {
        Ok(v) => plugin::verdict(v, name).map(|v| (v, format!("plugin:{name}"))).unwrap_or_else(builtin),
        Err(f) => {
            if let Some(span) = span.as_mut() {
                span.fail(f.reason());
            }
            cx.metrics.plugin_failed(&ctx.tenant, name, plugin::Hook::Classify, &f);
            tracing::warn!(
                tenant = %ctx.tenant, endpoint_id = %ctx.endpoint_id, event_id = %ctx.event_id, attempt = ctx.attempt,
                plugin = %name, error = %f, "classify failed; using the built-in table"
            );
            (classify::classify(outcome), format!("builtin (plugin:{name} failed: {f})"))
        }
    }
}
