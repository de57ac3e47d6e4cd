//! W3C trace context from the producer to the receiver: a `traceparent` posted with events
//! (or written in an outbox row) reaches every attempt with the producer's trace id and a
//! span id of the attempt's own; a malformed one never breaks intake. With an OTLP
//! endpoint, a local collector (written here: hyper decoding `ExportTraceServiceRequest`)
//! receives the spans of one event's life with their parent links. On both stores.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use tests::pg::PgSchema;
use tests::{ADMIN_TOKEN, Answer, Backend, FakeReceiver, HeraldProcess, Received, TestGateway, herald_binary};

use crate::plugins::plugin_bytes;

tests::backends!(
    producer_trace_reaches_every_attempt,
    outbox_rows_carry_their_trace,
    one_events_life_is_one_exported_trace,
    an_outbox_rows_relay_span_joins_its_trace
);

/// A collector of OTLP/HTTP protobuf spans on 127.0.0.1: keeps every span it is sent.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Collector {
    /// Starts one; answers its base URL (Herald adds `/v1/traces`).
    async fn start() -> anyhow::Result<(Collector, String)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let me = Collector::default();
        let spans = me.spans.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let spans = spans.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let spans = spans.clone();
                        async move {
                            let ok = req.uri().path() == "/v1/traces"
                                && req.headers().get("content-type").is_some_and(|v| v == "application/x-protobuf");
                            let body = req.into_body().collect().await?.to_bytes();
                            let status = match ExportTraceServiceRequest::decode(body) {
                                Ok(export) if ok => {
                                    let got = export.resource_spans.into_iter().flat_map(|r| r.scope_spans);
                                    spans.lock().unwrap().extend(got.flat_map(|s| s.spans));
                                    200
                                }
                                _ => 400,
                            };
                            let answer = hyper::Response::builder()
                                .status(status)
                                .header("content-type", "application/x-protobuf")
                                .body(Full::new(bytes::Bytes::new()))?;
                            Ok::<_, anyhow::Error>(answer)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok((me, url))
    }

    /// The spans of trace `trace_id` (hex), once `done` holds for them.
    async fn trace(&self, trace_id: &str, done: impl Fn(&[Span]) -> bool) -> anyhow::Result<Vec<Span>> {
        tests::eventually(&format!("spans of trace {trace_id}"), WAIT, || async {
            let spans: Vec<Span> =
                self.spans.lock().unwrap().iter().filter(|s| hex::encode(&s.trace_id) == trace_id).cloned().collect();
            Ok(if done(&spans) { Ok(spans) } else { Err(format!("{:?}", names(&spans))) })
        })
        .await
    }
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

/// The attribute `key` of `span`, as text.
fn attr(span: &Span, key: &str) -> Option<String> {
    let v = span.attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()?;
    Some(match v {
        AnyValue::StringValue(s) => s.clone(),
        AnyValue::IntValue(i) => i.to_string(),
        other => format!("{other:?}"),
    })
}

const WAIT: Duration = Duration::from_secs(20);
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const FAST_RETRY: &str = r#"{"base": "100ms", "factor": 2, "cap": "1s", "jitter": "none", "max_attempts": 5}"#;

/// The (trace id, span id, flags) of the `traceparent` a receiver got.
fn traceparent(r: &Received) -> Option<(String, String, String)> {
    let v = r.header("traceparent")?;
    let parts: Vec<&str> = v.split('-').collect();
    assert_eq!(parts.len(), 4, "{v}");
    assert_eq!(parts[0], "00", "{v}");
    Some((parts[1].to_string(), parts[2].to_string(), parts[3].to_string()))
}

fn by_event<'a>(got: &'a [Received], id: &str) -> Vec<&'a Received> {
    got.iter().filter(|r| r.header("webhook-id") == Some(id)).collect()
}

/// A posted trace context goes out on each attempt: the producer's trace id and flags, a
/// new span id per attempt (the retry's differs from the first's), `tracestate` as posted.
/// A batch's context is each of its events'. A malformed `traceparent` is ignored: the
/// event is accepted and delivered without one. Custom headers cannot set it.
async fn producer_trace_reaches_every_attempt(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let rx = FakeReceiver::start().await?;
    let retry: serde_json::Value = serde_json::from_str(FAST_RETRY)?;
    api.endpoint("acme", json!({"url": rx.url(), "retry": retry})).await?;
    let forged = api
        .post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, json!({"url": rx.url(), "headers": {"traceparent": PARENT}}))
        .await?;
    assert_eq!(forged.status, 422, "a custom traceparent is Herald's own header: {}", forged.text);

    rx.script([Answer::status(500)]);
    let post = |path: &str, headers: Vec<(&'static str, &'static str)>, body: serde_json::Value| {
        let path = format!("/v1/tenants/acme/{path}");
        async move { api.raw_with("POST", &path, Some(ADMIN_TOKEN), &headers, body.to_string()).await }
    };
    let one = json!({"id": "evt_traced", "type": "a.b", "payload": {}});
    post("events", vec![("traceparent", PARENT), ("tracestate", "congo=t61rcWkgMzE")], one).await?.expect(202)?;
    let got = rx.wait_for(2, WAIT).await?;
    let attempts = by_event(&got, "evt_traced");
    assert_eq!(attempts.len(), 2, "one failed attempt and its retry");
    let spans: Vec<(String, String, String)> = attempts.iter().map(|r| traceparent(r).expect("traceparent")).collect();
    for (trace, span, flags) in &spans {
        assert_eq!((trace.as_str(), flags.as_str()), (TRACE_ID, "01"), "the producer's trace and flags");
        assert_ne!(span, "00f067aa0ba902b7", "a span of the attempt's own, not the producer's");
    }
    assert_ne!(spans[0].1, spans[1].1, "each attempt has its own span id");
    assert!(attempts.iter().all(|r| r.header("tracestate") == Some("congo=t61rcWkgMzE")));

    let batch = json!({"events": [{"id": "evt_b1", "type": "a.b", "payload": {}}, {"id": "evt_b2", "type": "a.b", "payload": {}}]});
    post("events/batch", vec![("traceparent", PARENT)], batch).await?.expect(202)?;
    for bad in [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "ff-nonsense",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
    ] {
        let id = format!("evt_bad_{}", bad.len());
        let r = post(
            "events",
            vec![("traceparent", bad), ("tracestate", "a=b")],
            json!({"id": id, "type": "a.b", "payload": {}}),
        )
        .await?;
        assert_eq!(r.status, 202, "a malformed traceparent ({bad}) does not refuse the event: {}", r.text);
    }
    let got = rx.wait_for(7, WAIT).await?;
    for id in ["evt_b1", "evt_b2"] {
        let r = by_event(&got, id);
        assert_eq!(r.len(), 1, "{id}");
        assert_eq!(traceparent(r[0]).map(|t| t.0).as_deref(), Some(TRACE_ID), "{id} joins the request's trace");
        assert_eq!(r[0].header("tracestate"), None);
    }
    for r in got.iter().filter(|r| r.header("webhook-id").is_some_and(|id| id.starts_with("evt_bad_"))) {
        assert_eq!(r.header("traceparent"), None, "no context: none sent (export is off)");
        assert_eq!(r.header("tracestate"), None, "no tracestate without a valid traceparent");
    }
    Ok(())
}

/// A node (on `b`, with `env`) relaying a producer's outbox (the shipped DDL, in a schema
/// of its own), with tenant `acme` and one endpoint to `rx`.
struct Relaying {
    node: HeraldProcess,
    rx: FakeReceiver,
    pool: sqlx::PgPool,
    _dir: tempfile::TempDir,
    // Dropped after the node is killed.
    _schemas: (PgSchema, Option<PgSchema>),
}

impl Relaying {
    async fn start(b: Backend, env: &[(&str, &str)]) -> anyhow::Result<Relaying> {
        let producer = PgSchema::create().await?;
        let pool = PgPoolOptions::new().max_connections(2).connect(&producer.url).await?;
        sqlx::raw_sql(gateway::store::outbox::SCHEMA).execute(&pool).await?;
        let store = match b {
            Backend::Postgres => Some(PgSchema::create().await?),
            Backend::Sqlite => None,
        };
        let dir = tempfile::tempdir()?;
        let mut all: Vec<(&str, &str)> = store.iter().map(|s| ("HERALD_STORE_URL", s.url.as_str())).collect();
        all.extend_from_slice(env);
        let source = format!("[[outbox]]\nname = \"orders\"\nurl = \"{}\"\npoll_interval = \"100ms\"\n", producer.url);
        let node = HeraldProcess::start_with_config(&herald_binary()?, dir.path(), &all, &source).await?;
        let rx = FakeReceiver::start().await?;
        node.api.tenant("acme").await?;
        node.api.endpoint("acme", json!({"url": rx.url()})).await?;
        Ok(Relaying { node, rx, pool, _dir: dir, _schemas: (producer, store) })
    }

    /// Kills the node, then closes the producer's pool (before its schema is dropped).
    async fn stop(self) {
        let Relaying { node, pool, _schemas, .. } = self;
        drop(node);
        pool.close().await;
    }
}

/// An outbox row's `traceparent`/`tracestate` columns reach its deliveries; a producer's
/// table from before those columns keeps relaying.
async fn outbox_rows_carry_their_trace(b: Backend) -> anyhow::Result<()> {
    let relaying = Relaying::start(b, &[]).await?;
    let (pool, rx) = (&relaying.pool, &relaying.rx);

    sqlx::query(
        "INSERT INTO herald_outbox (tenant, event_id, event_type, payload, traceparent, tracestate) VALUES \
         ('acme', 'evt_row', 'a.b', '{}', $1, 'k=v'), ('acme', 'evt_row_bad', 'a.b', '{}', 'garbage', 'k=v')",
    )
    .bind(PARENT)
    .execute(pool)
    .await?;
    let got = rx.wait_for(2, WAIT).await?;
    let row = by_event(&got, "evt_row");
    assert_eq!(traceparent(row[0]).map(|t| t.0).as_deref(), Some(TRACE_ID), "the row's trace");
    assert_eq!(row[0].header("tracestate"), Some("k=v"));
    assert_eq!(by_event(&got, "evt_row_bad")[0].header("traceparent"), None, "a malformed one is ignored");

    // A table created before the trace columns.
    sqlx::raw_sql("ALTER TABLE herald_outbox DROP COLUMN traceparent, DROP COLUMN tracestate").execute(pool).await?;
    sqlx::query(
        "INSERT INTO herald_outbox (tenant, event_id, event_type, payload) VALUES ('acme', 'evt_old', 'a.b', '{}')",
    )
    .execute(pool)
    .await?;
    let got = rx.wait_for(3, WAIT).await?;
    assert_eq!(by_event(&got, "evt_old")[0].header("traceparent"), None);
    relaying.stop().await;
    Ok(())
}

/// With `[tracing] otlp_endpoint` set, one event's life is one trace under the producer's
/// trace id: the intake request (child of the producer's span), its commit, and each
/// attempt (children of the intake span) with its status and verdict, the transform plugin
/// call a child of its attempt. The receiver's `traceparent` names its attempt's span.
async fn one_events_life_is_one_exported_trace(b: Backend) -> anyhow::Result<()> {
    let (collector, url) = Collector::start().await?;
    let gw = TestGateway::start_on(b, &[("HERALD_TRACING_OTLP_ENDPOINT", url.as_str())]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let r = api.raw("PUT", "/v1/tenants/acme/plugins/chat", Some(ADMIN_TOKEN), plugin_bytes("transform_chat")).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    let rx = FakeReceiver::start().await?;
    let retry: serde_json::Value = serde_json::from_str(FAST_RETRY)?;
    api.endpoint("acme", json!({"url": rx.url(), "retry": retry, "plugins": {"transform": "chat"}})).await?;
    rx.script([Answer::status(500)]);
    let event = json!({"id": "evt_life", "type": "chat.posted", "payload": {"name": "Ada"}});
    let headers = [("traceparent", PARENT), ("tracestate", "congo=t61rcWkgMzE")];
    api.raw_with("POST", "/v1/tenants/acme/events", Some(ADMIN_TOKEN), &headers, event.to_string())
        .await?
        .expect(202)?;
    let got = rx.wait_for(2, WAIT).await?;

    let spans =
        collector.trace(TRACE_ID, |s| s.iter().filter(|s| s.name == "deliver").count() == 2 && s.len() >= 6).await?;
    let one = |name: &str| {
        let found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "{name} in {:?}", names(&spans));
        found[0]
    };
    let intake = one("POST /v1/tenants/{tenant}/events");
    assert_eq!(hex::encode(&intake.parent_span_id), "00f067aa0ba902b7", "intake is a child of the producer's span");
    assert_eq!(attr(intake, "http.response.status_code").as_deref(), Some("202"));
    assert_eq!(one("herald.commit").parent_span_id, intake.span_id, "the commit is the request's");
    let mut attempts: Vec<&Span> = spans.iter().filter(|s| s.name == "deliver").collect();
    attempts.sort_by_key(|s| s.start_time_unix_nano);
    for a in &attempts {
        assert_eq!(a.parent_span_id, intake.span_id, "each attempt is a child of the intake span");
        assert_eq!(attr(a, "herald.event_id").as_deref(), Some("evt_life"));
        assert!(attr(a, "herald.verdict").is_some(), "{:?}", a.attributes);
        let plugin: Vec<&Span> = spans.iter().filter(|s| s.parent_span_id == a.span_id).collect();
        assert_eq!(names(&plugin.iter().map(|s| (*s).clone()).collect::<Vec<_>>()), ["plugin transform chat"]);
    }
    let statuses: Vec<Option<String>> = attempts.iter().map(|a| attr(a, "http.response.status_code")).collect();
    assert_eq!(statuses, [Some("500".to_string()), Some("200".to_string())]);
    // What each receiver request carried names the span of its attempt.
    let sent: Vec<String> = got.iter().map(|r| traceparent(r).expect("traceparent").1).collect();
    let exported: Vec<String> = attempts.iter().map(|a| hex::encode(&a.span_id)).collect();
    assert_eq!(sent, exported);
    assert!(got.iter().all(|r| r.header("tracestate") == Some("congo=t61rcWkgMzE")));

    // No producer context: the request starts a trace of its own, which the receiver gets.
    api.event("acme", json!({"id": "evt_fresh", "type": "chat.posted", "payload": {}})).await?.expect(202)?;
    let got = rx.wait_for(3, WAIT).await?;
    let (trace, span, flags) = traceparent(by_event(&got, "evt_fresh")[0]).expect("a new trace is sent");
    assert_eq!(flags, "01", "sample_ratio 1 records every new trace");
    let spans = collector.trace(&trace, |s| s.iter().any(|s| s.name == "deliver")).await?;
    assert!(spans.iter().any(|s| s.name == "deliver" && hex::encode(&s.span_id) == span));
    let intake = spans.iter().find(|s| s.name.starts_with("POST")).expect("intake span");
    assert!(intake.parent_span_id.is_empty(), "a root span");
    Ok(())
}

/// With export on, an outbox row's event is relayed in a span that is a child of the row's
/// `traceparent`, and its attempt a child of that span; the receiver gets the row's trace.
async fn an_outbox_rows_relay_span_joins_its_trace(b: Backend) -> anyhow::Result<()> {
    let (collector, url) = Collector::start().await?;
    let relaying = Relaying::start(b, &[("HERALD_TRACING_OTLP_ENDPOINT", url.as_str())]).await?;
    let (pool, rx) = (&relaying.pool, &relaying.rx);
    sqlx::query(
        "INSERT INTO herald_outbox (tenant, event_id, event_type, payload, traceparent) \
         VALUES ('acme', 'evt_row', 'a.b', '{}', $1)",
    )
    .bind(PARENT)
    .execute(pool)
    .await?;
    let got = rx.wait_for(1, WAIT).await?;
    let (trace, span, _) = traceparent(&got[0]).expect("traceparent");
    assert_eq!(trace, TRACE_ID);
    let spans = collector.trace(TRACE_ID, |s| s.iter().any(|s| s.name == "deliver")).await?;
    let relay = spans.iter().find(|s| s.name == "herald.outbox.relay").expect("relay span");
    assert_eq!(hex::encode(&relay.parent_span_id), "00f067aa0ba902b7", "a child of the row's span");
    assert_eq!(attr(relay, "herald.event_id").as_deref(), Some("evt_row"));
    let attempt = spans.iter().find(|s| s.name == "deliver").expect("attempt span");
    assert_eq!(attempt.parent_span_id, relay.span_id, "the attempt is the relay's child");
    assert_eq!(hex::encode(&attempt.span_id), span, "the receiver's traceparent names the attempt");
    relaying.stop().await;
    Ok(())
}
