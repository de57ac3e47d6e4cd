//! OpenTelemetry spans of an event's life, exported over OTLP/HTTP (protobuf) when
//! `[tracing] otlp_endpoint` is set: the intake request (a child of the producer's span),
//! its commit, each attempt (with its status and verdict) and the plugin calls inside it.
//! One event's spans are one trace: the intake span's context is stored with the event, and
//! every attempt is its child. Spans are batched and posted off the hot path (the SDK's
//! batch thread, through `deliver::otlp`). With no endpoint, [`Telemetry::off`] builds
//! nothing: every method answers `None` at once. It never decides what Herald does.
//!
//! The W3C trace context's format is `model/trace.rs`. Every attempt sends the event's
//! `traceparent` with a span id of its own, exported or not (`worker/attempt.rs::AttemptTrace`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer, TracerProvider,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider};

use crate::config::TracingConfig;
use crate::deliver::otlp::OtlpClient;
use crate::model::TraceContext;

/// How long one export may take before it is given up (the spans are dropped, not retried).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often batched spans are sent.
const EXPORT_EVERY: Duration = Duration::from_secs(1);
/// Spans waiting for export beyond this are dropped rather than held (a collector that is
/// down costs memory up to here, never delivery).
const MAX_QUEUED: usize = 16_384;

/// The node's span exporter, or nothing. Cheap to clone.
#[derive(Clone, Default)]
pub struct Telemetry {
    on: Option<Arc<Exporting>>,
}

struct Exporting {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

/// Why export could not start.
#[derive(Debug, thiserror::Error)]
#[error("tracing.otlp_endpoint: {0}")]
pub struct TelemetryError(String);

impl Telemetry {
    /// No export: nothing is built, ever.
    pub fn off() -> Telemetry {
        Telemetry { on: None }
    }

    /// Export as `config` says, through a client whose requests run on `runtime`.
    pub fn start(config: &TracingConfig, runtime: tokio::runtime::Handle) -> Result<Telemetry, TelemetryError> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(OtlpClient::new(runtime, EXPORT_TIMEOUT))
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(config.otlp_endpoint.as_str())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| TelemetryError(e.to_string()))?;
        let batch =
            BatchConfigBuilder::default().with_scheduled_delay(EXPORT_EVERY).with_max_queue_size(MAX_QUEUED).build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).with_batch_config(batch).build())
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio))))
            .with_resource(Resource::builder().with_service_name(config.service_name.clone()).build())
            .build();
        let tracer = provider.tracer("herald");
        Ok(Telemetry { on: Some(Arc::new(Exporting { provider, tracer })) })
    }

    /// Whether spans are exported.
    pub fn is_on(&self) -> bool {
        self.on.is_some()
    }

    /// The span of a request that posts events, a child of the producer's context (or the
    /// root of a new trace).
    pub fn intake(&self, name: &'static str, parent: Option<&TraceContext>) -> Option<Span> {
        let on = self.on.as_ref()?;
        Some(Span::start(on, name, SpanKind::Server, parent))
    }

    /// The span of one attempt, a child of the event's stored context. `None` when export
    /// is off or the event has no context.
    pub fn attempt(&self, parent: Option<&TraceContext>) -> Option<Span> {
        let (on, parent) = (self.on.as_ref()?, parent?);
        Some(Span::start(on, "deliver", SpanKind::Client, Some(parent)))
    }

    /// Sends what is batched and stops export (at shutdown). Blocks until done or timed out.
    pub fn shutdown(&self) {
        if let Some(on) = &self.on
            && let Err(e) = on.provider.shutdown_with_timeout(EXPORT_TIMEOUT)
        {
            tracing::warn!(error = %e, "span export did not finish at shutdown");
        }
    }
}

/// One span being recorded (or, not sampled, only carrying its ids). Ends when dropped.
pub struct Span {
    span: opentelemetry_sdk::trace::Span,
    tracer: SdkTracer,
    /// The vendors' state the trace came with, passed on unchanged.
    state: Option<String>,
}

impl Span {
    fn start(on: &Exporting, name: &'static str, kind: SpanKind, parent: Option<&TraceContext>) -> Span {
        let cx = match parent {
            Some(p) => Context::new().with_remote_span_context(SpanContext::new(
                TraceId::from_bytes(p.trace_id),
                SpanId::from_bytes(p.span_id),
                TraceFlags::new(p.flags),
                true,
                TraceState::NONE,
            )),
            None => Context::new(),
        };
        let span = on.tracer.span_builder(name).with_kind(kind).start_with_context(&on.tracer, &cx);
        Span { span, tracer: on.tracer.clone(), state: parent.and_then(|p| p.state.clone()) }
    }

    /// This span as the parent of what follows it (what is stored with an event, what an
    /// attempt sends as `traceparent`).
    pub fn context(&self) -> TraceContext {
        use opentelemetry::trace::Span as _;
        let sc = self.span.span_context();
        TraceContext {
            trace_id: sc.trace_id().to_bytes(),
            span_id: sc.span_id().to_bytes(),
            flags: sc.trace_flags().to_u8(),
            state: self.state.clone(),
        }
    }

    /// A child span (the commit of a request, a plugin call of an attempt).
    pub fn child(&self, name: impl Into<Cow<'static, str>>) -> Span {
        use opentelemetry::trace::Span as _;
        let cx = Context::new().with_remote_span_context(self.span.span_context().clone());
        let span = self.tracer.span_builder(name).with_kind(SpanKind::Internal).start_with_context(&self.tracer, &cx);
        Span { span, tracer: self.tracer.clone(), state: self.state.clone() }
    }

    /// Sets an attribute (only if recording: nothing is built for a span not sampled).
    pub fn set(&mut self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        use opentelemetry::trace::Span as _;
        if self.span.is_recording() {
            self.span.set_attribute(KeyValue::new(key, value));
        }
    }

    /// Marks the span failed, with why.
    pub fn fail(&mut self, why: impl Into<Cow<'static, str>>) {
        use opentelemetry::trace::Span as _;
        if self.span.is_recording() {
            self.span.set_status(Status::error(why));
        }
    }
}
