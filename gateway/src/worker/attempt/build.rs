//! Building an attempt's request: the payload converted to the version the endpoint pins
//! (the type's adapter plugins), the envelope (or, for CloudEvents, the event's data)
//! with the endpoint's custom headers, its transform plugin, the CloudEvents encoding,
//! Herald's own headers, and the signature (its sign plugin, or Standard Webhooks' with the
//! endpoint's secrets) over the bytes encoded.

use super::trace::AttemptTrace;
use super::{AttemptCtx, Exchange};
use crate::classify::Verdict;
use crate::model::{
    CeAttributes, CeHeaders, EndpointSpec, TRACEPARENT, TRACESTATE, encode_cloudevent, envelope, rfc3339,
};
use crate::net::headers::is_reserved;
use crate::plugin;
use crate::sign::{self, Secret};
use crate::store::Claimed;
use crate::telemetry::Span;
use crate::worker::signal::Target;

/// The event's payload in the version of its type's schema the endpoint pins: `None` when
/// it takes it as posted (no pin for the type, the event has no version, or it is the
/// pinned one or older), else converted by the type's adapters, one call per step of the
/// shortest chain. `Err`: no chain (the endpoint is held, the reason naming the type and
/// both versions: registering the adapter resumes it), or an adapter dropped, failed or
/// answered with something that is not JSON.
pub(super) async fn converted(
    cx: &AttemptCtx,
    spec: &EndpointSpec,
    d: &Claimed,
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
) -> Result<Option<String>, Exchange> {
    let (Some(pin), Some(version)) = (spec.payload_versions.get(&d.event_type), d.schema_version) else {
        return Ok(None);
    };
    if version <= *pin {
        return Ok(None);
    }
    let steps = cx.catalog.conversion(&d.tenant, &d.event_type, version, *pin).map_err(super::held)?;
    let mut payload = d.payload.clone().into_bytes();
    for step in steps {
        let request = plugin::Request {
            headers: vec![("content-type".to_string(), "application/json".to_string())],
            body: payload,
        };
        payload = transform_call(cx, d, ctx, trace, (&step.tenant, &step.plugin), &request).await?.body;
        if serde_json::from_slice::<serde::de::IgnoredAny>(&payload).is_err() {
            let error = format!("adapter v{} \u{2192} v{}: its output is not JSON", step.from, step.to);
            let verdict = Verdict::Retry { after: None };
            return Err(Exchange::Decided { verdict, by: format!("plugin:{}", step.plugin), error: Some(error) });
        }
    }
    // JSON is UTF-8.
    Ok(Some(String::from_utf8(payload).unwrap_or_default()))
}

/// The envelope with the endpoint's custom headers, as its transform plugin (if any)
/// leaves it, and whether the body is still the envelope; `Err`: the plugin dropped the
/// delivery or failed. With CloudEvents output the body is the event's data instead (never
/// the envelope): the transform shapes the data, the encoding comes after it.
pub(super) async fn transformed(
    cx: &AttemptCtx,
    spec: &EndpointSpec,
    (d, payload): (&Claimed, &str),
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
) -> Result<(plugin::Request, bool), Exchange> {
    let request = plugin::Request {
        headers: std::iter::once(("content-type".to_string(), "application/json".to_string()))
            .chain(spec.headers.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect(),
        body: match spec.cloudevents {
            Some(_) => payload.as_bytes().to_vec(),
            None => envelope(d.event_id.as_str(), &d.event_type, d.event_created_at, payload).into_bytes(),
        },
    };
    let is_envelope = spec.cloudevents.is_none();
    let Some(name) = &spec.plugins.transform else { return Ok((request, is_envelope)) };
    let sent = transform_call(cx, d, ctx, trace, (d.tenant.as_str(), name), &request).await?;
    let unchanged = sent.body == request.body;
    Ok((sent, is_envelope && unchanged))
}

/// One call of the `transform` hook of `tenant`'s plugin `name` (the endpoint's own, or an
/// adapter of the event's type); `Err`: it dropped the delivery or failed.
async fn transform_call(
    cx: &AttemptCtx,
    d: &Claimed,
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
    (tenant, name): (&str, &str),
    request: &plugin::Request,
) -> Result<plugin::Request, Exchange> {
    let timer = cx.metrics.plugin_call(plugin::Hook::Transform);
    let span = trace.plugin(plugin::Hook::Transform, name);
    match timer.time(cx.plugins.transform(tenant, name, ctx, request)).await {
        Ok(plugin::TransformResult::Send(r)) => Ok(r),
        // One dead-letter reason for every drop, so `reason=dropped` finds them all; the
        // plugin's own words are the attempt's error (and the delivery's last error).
        Ok(plugin::TransformResult::Drop(reason)) => Err(Exchange::Decided {
            verdict: Verdict::Fail { reason: "dropped".into() },
            by: format!("plugin:{name}"),
            error: Some(reason),
        }),
        Err(f) => Err(plugin_failed(cx, d, ctx, (name, span), plugin::Hook::Transform, f)),
    }
}

/// The request as a CloudEvent when the endpoint asks for one: after its transform, before
/// its signature (which covers the bytes encoded here). `dataschema` comes from the catalog.
pub(super) fn encoded(cx: &AttemptCtx, spec: &EndpointSpec, d: &Claimed, request: plugin::Request) -> plugin::Request {
    let Some(ce) = &spec.cloudevents else { return request };
    let plugin::Request { mut headers, body } = request;
    let attributes = CeAttributes {
        id: d.event_id.to_string(),
        source: ce.source_for(d.tenant.as_str()),
        event_type: d.event_type.clone(),
        time: rfc3339(d.event_created_at),
        dataschema: cx.catalog.dataschema(&d.tenant, &d.event_type),
    };
    let via = if spec.target.kind().speaks_http() { CeHeaders::Http } else { CeHeaders::Broker };
    let body = encode_cloudevent(ce.mode, &attributes, via, &mut headers, body);
    plugin::Request { headers, body }
}

/// The headers and body to send: the request's headers without reserved ones, Herald's
/// own, and the signature (the sign plugin's headers, or Standard Webhooks' with the
/// endpoint's secrets); `Err`: the sign plugin failed. A batch of `Some(n)` events (led by
/// `d`) is signed as `ctx.event_id`, the batch's id, and says its size instead of a
/// delivery's id.
pub(super) async fn signed(
    cx: &AttemptCtx,
    target: &Target,
    d: &Claimed,
    ctx: &plugin::DeliveryContext,
    trace: &AttemptTrace,
    mut request: plugin::Request,
    batch: Option<usize>,
) -> Result<(Vec<(String, String)>, Vec<u8>), Exchange> {
    let sign_plugin = &target.endpoint.spec.plugins.sign;
    let timestamp = ctx.timestamp as i64;
    // A sign plugin reads the request as the transform left it; otherwise it is ours to take.
    let mut headers = match sign_plugin {
        Some(_) => request.headers.clone(),
        None => std::mem::take(&mut request.headers),
    };
    headers.retain(|(k, _)| !is_reserved(k));
    let own = match batch {
        None => ("herald-delivery-id", d.id.to_string()),
        Some(n) => ("herald-batch-size", n.to_string()),
    };
    headers.extend([
        ("user-agent".to_string(), concat!("herald/", env!("CARGO_PKG_VERSION")).to_string()),
        (sign::HEADER_ID.to_string(), ctx.event_id.clone()),
        (sign::HEADER_TIMESTAMP.to_string(), timestamp.to_string()),
        ("herald-attempt-id".to_string(), ctx.attempt_id.clone()),
        (own.0.to_string(), own.1),
    ]);
    if let Some(t) = &trace.header {
        headers.push((TRACEPARENT.to_string(), t.traceparent()));
        headers.extend(t.state.as_ref().map(|s| (TRACESTATE.to_string(), s.clone())));
    }
    match sign_plugin {
        Some(name) => {
            let keys: Vec<Vec<u8>> = target.secrets().iter().map(|s| s.as_bytes().to_vec()).collect();
            let timer = cx.metrics.plugin_call(plugin::Hook::Sign);
            let span = trace.plugin(plugin::Hook::Sign, name);
            match timer.time(cx.plugins.sign(d.tenant.as_str(), name, ctx, &keys, &request)).await {
                Ok(extra) => headers.extend(extra.into_iter().filter(|(k, _)| !is_reserved(k))),
                Err(f) => return Err(plugin_failed(cx, d, ctx, (name, span), plugin::Hook::Sign, f)),
            }
        }
        None => {
            let keys: Vec<_> = target.signing_keys().iter().collect();
            let secrets: Vec<&Secret> = target.secrets().iter().collect();
            let sig = sign::signature_header(&secrets, &keys, &ctx.event_id, timestamp, &request.body);
            headers.push((sign::HEADER_SIGNATURE.to_string(), sig));
        }
    }
    Ok((headers, request.body))
}

/// A transform or sign plugin call that failed: counted, logged, and retried per policy.
fn plugin_failed(
    cx: &AttemptCtx,
    d: &Claimed,
    ctx: &plugin::DeliveryContext,
    (name, span): (&str, Option<Span>),
    hook: plugin::Hook,
    f: plugin::PluginFailure,
) -> Exchange {
    if let Some(mut span) = span {
        span.fail(f.reason());
    }
    cx.metrics.plugin_failed(d.tenant.as_str(), name, hook, &f);
    tracing::warn!(
        tenant = %d.tenant, endpoint_id = %ctx.endpoint_id, delivery_id = %d.id, event_id = %d.event_id,
        attempt = ctx.attempt, plugin = name, hook = hook.as_str(), error = %f, "plugin call failed"
    );
    Exchange::Decided { verdict: Verdict::Retry { after: None }, by: format!("plugin:{name}"), error: Some(f.reason()) }
}
