//! W3C trace context from the producer to the receiver: a `traceparent` posted with events
//! (or written in an outbox row) reaches every attempt with the producer's trace id and a
//! span id of the attempt's own; a malformed one never breaks intake. On both stores.

use std::time::Duration;

use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use tests::pg::PgSchema;
use tests::{ADMIN_TOKEN, Answer, Backend, FakeReceiver, HeraldProcess, Received, TestGateway, herald_binary};

tests::backends!(producer_trace_reaches_every_attempt, outbox_rows_carry_their_trace);

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

/// An outbox row's `traceparent`/`tracestate` columns reach its deliveries; a producer's
/// table from before those columns keeps relaying.
async fn outbox_rows_carry_their_trace(b: Backend) -> anyhow::Result<()> {
    let producer = PgSchema::create().await?;
    let pool = PgPoolOptions::new().max_connections(2).connect(&producer.url).await?;
    sqlx::raw_sql(gateway::store::outbox::SCHEMA).execute(&pool).await?;
    let store = match b {
        Backend::Postgres => Some(PgSchema::create().await?),
        Backend::Sqlite => None,
    };
    let dir = tempfile::tempdir()?;
    let env: Vec<(&str, &str)> = store.iter().map(|s| ("HERALD_STORE_URL", s.url.as_str())).collect();
    let source = format!("[[outbox]]\nname = \"orders\"\nurl = \"{}\"\npoll_interval = \"100ms\"\n", producer.url);
    let node = HeraldProcess::start_with_config(&herald_binary()?, dir.path(), &env, &source).await?;
    let rx = FakeReceiver::start().await?;
    node.api.tenant("acme").await?;
    node.api.endpoint("acme", json!({"url": rx.url()})).await?;

    sqlx::query(
        "INSERT INTO herald_outbox (tenant, event_id, event_type, payload, traceparent, tracestate) VALUES \
         ('acme', 'evt_row', 'a.b', '{}', $1, 'k=v'), ('acme', 'evt_row_bad', 'a.b', '{}', 'garbage', 'k=v')",
    )
    .bind(PARENT)
    .execute(&pool)
    .await?;
    let got = rx.wait_for(2, WAIT).await?;
    let row = by_event(&got, "evt_row");
    assert_eq!(traceparent(row[0]).map(|t| t.0).as_deref(), Some(TRACE_ID), "the row's trace");
    assert_eq!(row[0].header("tracestate"), Some("k=v"));
    assert_eq!(by_event(&got, "evt_row_bad")[0].header("traceparent"), None, "a malformed one is ignored");

    // A table created before the trace columns.
    sqlx::raw_sql("ALTER TABLE herald_outbox DROP COLUMN traceparent, DROP COLUMN tracestate").execute(&pool).await?;
    sqlx::query(
        "INSERT INTO herald_outbox (tenant, event_id, event_type, payload) VALUES ('acme', 'evt_old', 'a.b', '{}')",
    )
    .execute(&pool)
    .await?;
    let got = rx.wait_for(3, WAIT).await?;
    assert_eq!(by_event(&got, "evt_old")[0].header("traceparent"), None);
    drop(node);
    pool.close().await;
    Ok(())
}
