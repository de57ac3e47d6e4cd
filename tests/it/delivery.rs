//! The delivery engine against fake receivers: retries, 429 pauses, isolation, the
//! classification table, dead letters, signatures.

use std::time::{Duration, Instant};

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tests::{ADMIN_TOKEN, Answer, Backend, FakeReceiver, TestGateway};

// Every engine test runs on both stores.
tests::backends!(
    retry_then_429_pauses_the_whole_endpoint_then_delivers,
    a_hanging_endpoint_does_not_hold_up_a_healthy_one,
    the_classification_table_end_to_end,
    a_paused_endpoint_keeps_its_deliveries_until_re_enabled,
    a_timed_pause_ends_in_the_endpoints_state,
    redirects_are_not_followed_and_transport_failures_are_retried,
    events_past_their_ttl_become_dead_letters,
    requests_carry_a_verifiable_standard_webhooks_signature,
    an_endpoints_own_user_agent_is_what_the_receiver_gets,
);

const FAST_RETRY: &str = r#"{"base": "100ms", "factor": 2, "cap": "1s", "jitter": "none", "max_attempts": 5}"#;

fn fast_retry() -> Value {
    serde_json::from_str(FAST_RETRY).unwrap()
}

async fn setup(gw: &TestGateway, rx: &FakeReceiver, extra: Value) -> anyhow::Result<Value> {
    if gw.api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.status == 404 {
        gw.api.tenant("acme").await?;
    }
    let mut body = json!({"url": rx.url(), "rate_per_sec": 100, "retry": fast_retry()});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    gw.api.endpoint("acme", body).await
}

async fn delivery_of(gw: &TestGateway, event: &str) -> anyhow::Result<Value> {
    let r = gw.api.get(&format!("/v1/tenants/acme/events/{event}/deliveries"), ADMIN_TOKEN).await?;
    let id = r.json["data"][0]["id"].as_str().unwrap_or_default().to_string();
    Ok(gw.api.get(&format!("/v1/tenants/acme/deliveries/{id}"), ADMIN_TOKEN).await?.json)
}

async fn wait_state(gw: &TestGateway, event: &str, state: &str, timeout: Duration) -> anyhow::Result<Value> {
    tests::eventually(&format!("{event} reaching {state}"), timeout, || async {
        let d = delivery_of(gw, event).await?;
        Ok(if d["state"] == state { Ok(d) } else { Err(d.to_string()) })
    })
    .await
}

async fn retry_then_429_pauses_the_whole_endpoint_then_delivers(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    rx.script([Answer::status(500), Answer::status(429).header("Retry-After", "5")]);
    setup(&gw, &rx, json!({"max_in_flight": 1})).await?;
    gw.api.event("acme", json!({"id": "evt_first", "type": "t", "payload": {}})).await?.expect(202)?;
    let got = rx.wait_for(2, Duration::from_secs(10)).await?;
    let paused_at = got[1].at;
    assert_eq!(got[1].status, 429);
    // More work queued for the paused endpoint must wait too.
    for i in 0..3 {
        let r = gw.api.event("acme", json!({"id": format!("evt_more_{i}"), "type": "t", "payload": {}})).await?;
        assert_eq!(r.status, 202);
    }
    let got = rx.wait_for(6, Duration::from_secs(20)).await?;
    for r in &got[2..] {
        let gap = r.at.duration_since(paused_at);
        assert!(gap >= Duration::from_secs(5), "a request came {gap:?} after the 429 with Retry-After: 5");
    }
    let first: Vec<_> = got.iter().filter(|r| r.header("webhook-id") == Some("evt_first")).collect();
    assert_eq!(first.len(), 3, "500, 429, then 200");
    let d = wait_state(&gw, "evt_first", "delivered", Duration::from_secs(5)).await?;
    assert_eq!(d["attempts"], 3);
    let statuses: Vec<_> =
        d["attempt_history"].as_array().unwrap().iter().map(|a| a["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [500, 429, 200]);
    let attempt_ids: std::collections::HashSet<_> =
        first.iter().map(|r| r.header("herald-attempt-id").unwrap().to_string()).collect();
    assert_eq!(attempt_ids.len(), 3, "a fresh attempt id every attempt");
    Ok(())
}

async fn a_hanging_endpoint_does_not_hold_up_a_healthy_one(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let hanging = FakeReceiver::start().await?;
    hanging.set_default(Answer::hang());
    let healthy = FakeReceiver::start().await?;
    setup(&gw, &hanging, json!({"event_types": ["slow.*"], "timeout": "3s", "connect_timeout": "1s"})).await?;
    setup(&gw, &healthy, json!({"event_types": ["fast.*"]})).await?;
    for i in 0..20 {
        gw.api.event("acme", json!({"type": "slow.x", "payload": {"i": i}})).await?;
    }
    hanging.wait_for(4, Duration::from_secs(5)).await?;
    let start = Instant::now();
    for i in 0..20 {
        gw.api.event("acme", json!({"type": "fast.x", "payload": {"i": i}})).await?;
    }
    healthy.wait_for(20, Duration::from_secs(2)).await?;
    assert!(start.elapsed() < Duration::from_secs(2), "healthy deliveries waited {:?}", start.elapsed());
    assert_eq!(hanging.count(), 4, "the hanging endpoint holds only its own max_in_flight");
    Ok(())
}

async fn the_classification_table_end_to_end(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    // status → (final delivery state, dead reason, endpoint state, attempts)
    let cases: &[(u16, &str, Option<&str>, &str, u64)] = &[
        (400, "dead", Some("permanent:400"), "active", 1),
        (422, "dead", Some("permanent:422"), "active", 1),
        (404, "dead", Some("permanent:404"), "active", 1),
        (401, "paused", None, "paused", 1),
        (403, "paused", None, "paused", 1),
        (410, "dead", Some("endpoint_disabled"), "disabled", 1),
        (500, "dead", Some("exhausted"), "active", 3),
        (408, "dead", Some("exhausted"), "active", 3),
    ];
    let mut receivers = Vec::new();
    for (i, (status, ..)) in cases.iter().enumerate() {
        let rx = FakeReceiver::start().await?;
        rx.set_default(Answer::status(*status));
        let retry = json!({"base": "50ms", "jitter": "none", "max_attempts": 3});
        let ep = setup(&gw, &rx, json!({"event_types": [format!("case{i}")], "retry": retry})).await?;
        gw.api.event("acme", json!({"id": format!("evt_{status}"), "type": format!("case{i}"), "payload": {}})).await?;
        receivers.push((rx, ep));
    }
    for ((status, state, reason, ep_state, attempts), (rx, ep)) in cases.iter().zip(&receivers) {
        let d = wait_state(&gw, &format!("evt_{status}"), state, Duration::from_secs(10)).await?;
        assert_eq!(d["reason"].as_str(), *reason, "{status}: {d}");
        assert_eq!(d["attempts"].as_u64(), Some(*attempts), "{status}: {d}");
        assert_eq!(rx.count() as u64, *attempts, "{status}: requests sent");
        let e = gw.api.get(&format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().unwrap()), ADMIN_TOKEN).await?;
        assert_eq!(e.json["state"], *ep_state, "{status}: {}", e.text);
        let history = d["attempt_history"].as_array().unwrap();
        assert_eq!(history.len() as u64, *attempts);
        assert_eq!(history[0]["status"].as_u64(), Some(u64::from(*status)));
    }
    // Dead letters are listed with their reasons.
    let r = gw.api.get("/v1/tenants/acme/dead-letters?reason=permanent:422", ADMIN_TOKEN).await?;
    assert_eq!(r.json["data"].as_array().unwrap().len(), 1);
    assert_eq!(r.json["counts_by_reason"], json!({"permanent:422": 1}), "the counts follow the filter: {}", r.text);
    // One vocabulary: `reason=permanent` is what the metrics count as `permanent`.
    let r = gw.api.get("/v1/tenants/acme/dead-letters?reason=permanent", ADMIN_TOKEN).await?;
    assert_eq!(r.json["data"].as_array().unwrap().len(), 3, "{}", r.text);
    let counts = json!({"permanent:400": 1, "permanent:404": 1, "permanent:422": 1});
    assert_eq!(r.json["counts_by_reason"], counts, "{}", r.text);
    let metrics = gw.api.raw("GET", "/metrics", None, "").await?.text;
    let line = "herald_dead_letters_total{tenant=\"acme\",kind=\"http\",reason=\"permanent\"} 3";
    assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
    let ep = receivers[6].1["id"].as_str().unwrap();
    let r = gw.api.get(&format!("/v1/tenants/acme/dead-letters?endpoint={ep}"), ADMIN_TOKEN).await?;
    assert_eq!(r.json["counts_by_reason"], json!({"exhausted": 1}), "{}", r.text);
    Ok(())
}

/// A timed pause ends in the endpoint's state, not only in delivery: once a 429's
/// `Retry-After` or `pause {"for": "2s"}` runs out, the endpoint is `active` in the API, in
/// its health and in `herald_endpoints`, and a replay of its dead letter is accepted.
async fn a_timed_pause_ends_in_the_endpoints_state(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    rx.script([Answer::status(400), Answer::status(429).header("Retry-After", "2")]);
    let ep = setup(&gw, &rx, json!({"max_in_flight": 1})).await?;
    let path = format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().unwrap());
    gw.api.event("acme", json!({"id": "evt_dead", "type": "t", "payload": {}})).await?.expect(202)?;
    let dead = wait_state(&gw, "evt_dead", "dead", Duration::from_secs(10)).await?;
    let replay = json!({"ids": [dead["id"]]});
    let is = |state: &'static str| move |e: &Value| e["state"] == state;
    // A 429 with `Retry-After: 2`.
    gw.api.event("acme", json!({"id": "evt_429", "type": "t", "payload": {}})).await?.expect(202)?;
    gw.api.wait_for(&path, Duration::from_secs(10), is("paused")).await?;
    let e = gw.api.wait_for(&path, Duration::from_secs(10), is("active")).await?;
    assert_eq!(
        (&e["health"]["state"], &e["paused_until"], &e["state_reason"]),
        (&json!("active"), &Value::Null, &Value::Null),
        "{e}"
    );
    // `pause {"for": "2s"}`.
    let r = gw.api.post(&format!("{path}/pause"), ADMIN_TOKEN, json!({"for": "2s"})).await?.expect(200)?;
    assert_eq!(r.json["state"], "paused");
    let r = gw.api.post("/v1/tenants/acme/replays", ADMIN_TOKEN, replay.clone()).await?;
    assert_eq!(r.status, 409, "a replay to a paused endpoint: {}", r.text);
    let e = gw.api.wait_for(&path, Duration::from_secs(10), is("active")).await?;
    assert_eq!(e["health"]["state"], "active", "{e}");
    let metrics = gw.api.raw("GET", "/metrics", None, "").await?.text;
    let states: Vec<&str> = metrics.lines().filter(|l| l.starts_with("herald_endpoints{")).collect();
    assert_eq!(states, ["herald_endpoints{state=\"active\"} 1.0"], "{states:?}");
    gw.api.post("/v1/tenants/acme/replays", ADMIN_TOKEN, replay).await?.expect(202)?;
    wait_state(&gw, "evt_dead", "delivered", Duration::from_secs(10)).await?;
    Ok(())
}

async fn a_paused_endpoint_keeps_its_deliveries_until_re_enabled(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(401));
    let ep = setup(&gw, &rx, json!({"max_in_flight": 1})).await?;
    let ep = ep["id"].as_str().unwrap().to_string();
    gw.api.event("acme", json!({"id": "e1", "type": "t", "payload": {}})).await?;
    wait_state(&gw, "e1", "paused", Duration::from_secs(5)).await?;
    gw.api.event("acme", json!({"id": "e2", "type": "t", "payload": {}})).await?;
    let e = gw.api.get(&format!("/v1/tenants/acme/endpoints/{ep}"), ADMIN_TOKEN).await?;
    assert_eq!(e.json["state"], "paused");
    assert!(e.json["state_reason"].as_str().unwrap().contains("401"), "{}", e.text);
    rx.stays_at(1, Duration::from_millis(300)).await.map_err(|e| e.context("no blind retries against a 401"))?;
    rx.set_default(Answer::status(200));
    let r = gw.api.post(&format!("/v1/tenants/acme/endpoints/{ep}/enable"), ADMIN_TOKEN, json!({})).await?;
    assert_eq!((r.status, r.json["state"].as_str()), (200, Some("active")));
    wait_state(&gw, "e1", "delivered", Duration::from_secs(5)).await?;
    wait_state(&gw, "e2", "delivered", Duration::from_secs(5)).await?;
    Ok(())
}

async fn redirects_are_not_followed_and_transport_failures_are_retried(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let target = FakeReceiver::start().await?;
    let redirecting = FakeReceiver::start().await?;
    redirecting.set_default(Answer::status(302).header("Location", &target.url()));
    let hanging = FakeReceiver::start().await?;
    hanging.set_default(Answer::hang());
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let retry = json!({"base": "50ms", "jitter": "none", "max_attempts": 2});
    setup(&gw, &redirecting, json!({"event_types": ["redirect"], "retry": retry})).await?;
    setup(
        &gw,
        &hanging,
        json!({"event_types": ["hang"], "retry": retry, "timeout": "300ms", "connect_timeout": "300ms"}),
    )
    .await?;
    gw.api
        .endpoint("acme", json!({"url": format!("http://{closed}/x"), "event_types": ["refused"], "retry": retry}))
        .await?;
    for t in ["redirect", "hang", "refused"] {
        gw.api.event("acme", json!({"id": t, "type": t, "payload": {}})).await?;
    }
    for t in ["redirect", "hang", "refused"] {
        let d = wait_state(&gw, t, "dead", Duration::from_secs(10)).await?;
        assert_eq!(
            (d["reason"].as_str(), d["attempts"].as_u64()),
            (Some("exhausted"), Some(2)),
            "{t}: retried, then exhausted: {d}"
        );
    }
    assert_eq!(target.count(), 0, "the redirect was never followed");
    let d = delivery_of(&gw, "hang").await?;
    assert!(d["attempt_history"][0]["error"].as_str().unwrap().starts_with("timeout"), "{d}");
    let d = delivery_of(&gw, "refused").await?;
    assert!(d["attempt_history"][0]["error"].as_str().unwrap().starts_with("connection_refused"), "{d}");
    Ok(())
}

async fn events_past_their_ttl_become_dead_letters(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(503));
    setup(&gw, &rx, json!({"retry": {"base": "400ms", "jitter": "none", "max_attempts": 50, "ttl": "1s"}})).await?;
    gw.api.event("acme", json!({"id": "e", "type": "t", "payload": {}})).await?;
    // The real-time smoke test of the rule; `timing.rs` holds its timing in paused time.
    let d = wait_state(&gw, "e", "dead", Duration::from_secs(10)).await?;
    assert_eq!(d["reason"], "expired", "{d}");
    assert!(d["attempts"].as_u64().unwrap() >= 1);
    Ok(())
}

async fn requests_carry_a_verifiable_standard_webhooks_signature(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    let ep = setup(&gw, &rx, json!({"headers": {"x-custom": "yes"}})).await?;
    let secret = ep["secret"].as_str().unwrap().to_string();
    let body = r#"{"id": "evt_sig", "type": "invoice.paid", "payload": {"amount": 10.50}}"#;
    assert_eq!(gw.api.raw("POST", "/v1/tenants/acme/events", Some(ADMIN_TOKEN), body).await?.status, 202);
    let got = rx.wait_for(1, Duration::from_secs(5)).await?;
    let r = &got[0];
    assert_eq!(r.header("webhook-id"), Some("evt_sig"));
    assert_eq!(r.header("x-custom"), Some("yes"));
    assert!(r.header("user-agent").unwrap().starts_with("herald/"));
    let ts: i64 = r.header("webhook-timestamp").unwrap().parse()?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
    assert!((now - ts).abs() < 60);
    let key = base64::engine::general_purpose::STANDARD.decode(secret.strip_prefix("whsec_").unwrap())?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key)?;
    mac.update(format!("evt_sig.{ts}.").as_bytes());
    mac.update(&r.body);
    let expected = format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()));
    assert_eq!(r.header("webhook-signature"), Some(expected.as_str()));
    let body = String::from_utf8(r.body.to_vec())?;
    assert!(body.contains(r#""data":{"amount": 10.50}"#), "payload bytes kept: {body}");
    let v = r.json();
    assert_eq!((v["id"].as_str(), v["type"].as_str()), (Some("evt_sig"), Some("invoice.paid")));

    // During rotation both secrets sign.
    let r = gw
        .api
        .post(
            &format!("/v1/tenants/acme/endpoints/{}/rotate-secret", ep["id"].as_str().unwrap()),
            ADMIN_TOKEN,
            json!({}),
        )
        .await?;
    assert_eq!(r.status, 200);
    gw.api.event("acme", json!({"id": "evt_sig2", "type": "invoice.paid", "payload": {}})).await?;
    let got = rx.wait_for(2, Duration::from_secs(5)).await?;
    let sigs: Vec<&str> = got[1].header("webhook-signature").unwrap().split(' ').collect();
    assert_eq!(sigs.len(), 2, "{sigs:?}");
    assert!(sigs.iter().all(|s| s.starts_with("v1,")));
    Ok(())
}

/// A stopping node lets the attempt in flight finish and record its result: nothing is left
/// `delivering` for a lease to time out, and nothing is sent twice after a restart.
#[tokio::test]
async fn shutdown_waits_for_attempts_in_flight_to_record() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(200).delay(Duration::from_secs(2)));
    setup(&gw, &rx, json!({})).await?;
    assert_eq!(gw.api.event("acme", json!({"id": "evt_inflight", "type": "t", "payload": {}})).await?.status, 202);
    rx.wait_for(1, Duration::from_secs(10)).await?;
    let id = delivery_of(&gw, "evt_inflight").await?["id"].as_str().unwrap_or_default().to_string();
    let url = format!("sqlite://{}", gw.dir.path().join("herald.db").display());
    let _dir = gw.stop().await;

    let store = gateway::store::open(&url, 1).await?;
    let tenant = gateway::model::TenantId::from_stored("acme");
    let (delivery, attempts) =
        store.get_delivery(&tenant, &gateway::model::DeliveryId::from_stored(id)).await?.expect("delivery");
    assert_eq!(delivery.state, gateway::model::DeliveryState::Delivered, "{delivery:?}");
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(rx.count(), 1);
    Ok(())
}

/// `max_in_flight` counts requests, not commits: once an endpoint has answered, its next
/// request goes out while the first one's result is still committing. On Postgres the
/// test holds the first delivery's row locked, so its result cannot commit; the second
/// delivery must still arrive, and both settle once the lock goes.
#[tokio::test]
async fn the_next_request_does_not_wait_for_a_result_to_commit() -> anyhow::Result<()> {
    use sqlx::Connection;
    let gw = TestGateway::start_on(Backend::Postgres, &[]).await?;
    let rx = FakeReceiver::start().await?;
    // Time to lock the first delivery's row before its answer comes back.
    rx.script([Answer::status(200).delay(Duration::from_secs(2))]);
    setup(&gw, &rx, json!({"max_in_flight": 1})).await?;
    let events = json!({"events": [
        {"id": "evt_a", "type": "t", "payload": {}},
        {"id": "evt_b", "type": "t", "payload": {}},
    ]});
    assert_eq!(gw.api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, events).await?.status, 202);
    let first = rx.wait_for(1, Duration::from_secs(10)).await?[0].header("webhook-id").unwrap_or_default().to_string();
    let second = if first == "evt_a" { "evt_b" } else { "evt_a" };

    let schema = gw.schema().expect("a Postgres node");
    let mut lock = sqlx::PgConnection::connect(&schema.url).await?;
    let mut tx = lock.begin().await?;
    let state: String = sqlx::query_scalar("SELECT state FROM deliveries WHERE event_id = $1 FOR UPDATE")
        .bind(&first)
        .fetch_one(&mut *tx)
        .await?;
    anyhow::ensure!(state == "delivering", "{first} settled ({state}) before its row was locked");
    let got = rx.wait_for(2, Duration::from_secs(10)).await?;
    assert_eq!(got[1].header("webhook-id"), Some(second));
    let state: String =
        sqlx::query_scalar("SELECT state FROM deliveries WHERE event_id = $1").bind(&first).fetch_one(&mut *tx).await?;
    assert_eq!(state, "delivering", "the first result committed through the lock");
    tx.rollback().await?;

    for event in [first.as_str(), second] {
        wait_state(&gw, event, "delivered", Duration::from_secs(10)).await?;
    }
    assert_eq!(rx.count(), 2, "each delivery was sent once");
    Ok(())
}

/// Claim at intake (SQLite): while an endpoint's partition knows nothing of it waits in the
/// store, each new event's delivery is leased to it in the intake commit itself. A trickle
/// of events then needs no claim per event (a commit less each), and each one still arrives
/// exactly once and settles as delivered.
#[tokio::test]
async fn a_trickle_of_events_needs_no_claim_per_event() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let rx = FakeReceiver::start().await?;
    setup(&gw, &rx, json!({})).await?;
    let claims = || async {
        let text = gw.api.raw("GET", "/metrics", None, "").await?.text;
        let line = text.lines().find(|l| l.starts_with("herald_claim_duration_seconds_count "));
        line.and_then(|l| l.split(' ').nth(1)?.parse::<f64>().ok()).ok_or_else(|| anyhow::anyhow!("no claim count"))
    };
    assert_eq!(gw.api.event("acme", json!({"id": "evt_0", "type": "t", "payload": {}})).await?.status, 202);
    rx.wait_for(1, Duration::from_secs(10)).await?;
    let before = claims().await?;
    const TRICKLE: usize = 20;
    for i in 1..=TRICKLE {
        let r = gw.api.event("acme", json!({"id": format!("evt_{i}"), "type": "t", "payload": {"i": i}})).await?;
        assert_eq!(r.status, 202, "{}", r.text);
        rx.wait_for(i + 1, Duration::from_secs(10)).await?;
    }
    let claimed = claims().await? - before;
    assert!(claimed <= 2.0, "{claimed} claims for {TRICKLE} events to an idle endpoint");
    let got = rx.received();
    let ids: std::collections::HashSet<&str> = got.iter().filter_map(|r| r.header("webhook-id")).collect();
    assert_eq!((got.len(), ids.len()), (TRICKLE + 1, TRICKLE + 1), "each event arrives exactly once");
    gw.api
        .wait_for("/v1/tenants/acme/deliveries?state=delivered&limit=100", Duration::from_secs(10), |v| {
            v["data"].as_array().is_some_and(|d| d.len() == TRICKLE + 1)
        })
        .await?;
    Ok(())
}

/// Claim at intake under load (SQLite): producers posting at once to a cold endpoint queue
/// their first events for a claim, but once one claim finds nothing else due the partition
/// takes every later event at intake, even those committed while it waited for that claim's
/// answer. Before, each such commit woke it for another claim, and it never stopped
/// claiming (450 claims for 20k deliveries in `herald-bench fanout-tail`).
#[tokio::test]
async fn producers_posting_at_once_settle_into_claim_at_intake() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let rx = FakeReceiver::start().await?;
    setup(&gw, &rx, json!({"rate_per_sec": 100000, "burst": 1000, "max_in_flight": 16})).await?;
    const PRODUCERS: usize = 16;
    const EACH: usize = 40;
    let posts = (0..PRODUCERS).map(|p| {
        let api = gw.api.clone();
        tokio::spawn(async move {
            for i in 0..EACH {
                let r = api.event("acme", json!({"id": format!("evt_{p}_{i}"), "type": "t", "payload": {}})).await?;
                anyhow::ensure!(r.status == 202, "{}", r.text);
            }
            anyhow::Ok(())
        })
    });
    for post in posts.collect::<Vec<_>>() {
        post.await??;
    }
    rx.wait_for(PRODUCERS * EACH, Duration::from_secs(30)).await?;
    let text = gw.api.raw("GET", "/metrics", None, "").await?.text;
    let line = text.lines().find(|l| l.starts_with("herald_claim_duration_seconds_count "));
    let claims: f64 =
        line.and_then(|l| l.split(' ').nth(1)?.parse().ok()).ok_or_else(|| anyhow::anyhow!("no count"))?;
    println!("{claims} claims for {} events", PRODUCERS * EACH);
    assert!(claims <= 10.0, "{claims} claims for {} events", PRODUCERS * EACH);
    let got = rx.received();
    let ids: std::collections::HashSet<&str> = got.iter().filter_map(|r| r.header("webhook-id")).collect();
    assert_eq!(ids.len(), PRODUCERS * EACH, "each event arrives");
    Ok(())
}

/// An endpoint's `user_agent` is the `User-Agent` its receiver gets (and what the attempt
/// records as sent); a bad one is refused naming the field and changes nothing; `""` returns
/// to Herald's; a broker kind takes none.
async fn an_endpoints_own_user_agent_is_what_the_receiver_gets(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    let ua = "acme-hooks/2.0 (+https://acme.example/hooks)";
    let ep = setup(&gw, &rx, json!({"user_agent": ua})).await?;
    assert_eq!(ep["user_agent"], ua, "{ep}");
    let path = format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().unwrap());
    gw.api.event("acme", json!({"id": "evt_ua", "type": "t", "payload": {}})).await?.expect(202)?;
    let got = rx.wait_for(1, Duration::from_secs(5)).await?;
    assert_eq!(got[0].header("user-agent"), Some(ua));
    let d = wait_state(&gw, "evt_ua", "delivered", Duration::from_secs(5)).await?;
    let sent = &d["attempt_history"][0]["request"]["headers"];
    assert!(sent.as_array().unwrap().iter().any(|h| h[0] == "user-agent" && h[1] == ua), "{sent}");

    for bad in ["caf\u{e9}".to_string(), "a\tb".into(), "a\r\nx-evil: 1".into(), "u".repeat(257)] {
        let body = json!({"user_agent": bad});
        let r = gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(body.clone())).await?;
        assert_eq!(r.status, 422, "{body}: {}", r.text);
        assert!(r.text.contains("user_agent: "), "{body}: {}", r.text);
    }
    assert_eq!(gw.api.get(&path, ADMIN_TOKEN).await?.json["user_agent"], ua, "a refused patch changes nothing");

    let r = gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"user_agent": ""}))).await?;
    assert_eq!((r.status, &r.json["user_agent"]), (200, &Value::Null), "{}", r.text);
    gw.api.event("acme", json!({"id": "evt_default_ua", "type": "t", "payload": {}})).await?.expect(202)?;
    let got = rx.wait_for(2, Duration::from_secs(5)).await?;
    assert!(got[1].header("user-agent").is_some_and(|v| v.starts_with("herald/")), "{:?}", got[1].header("user-agent"));

    let broker = json!({
        "kind": "redis-stream", "url": "redis://127.0.0.1:6379", "destination": {"stream": "s"}, "user_agent": ua,
    });
    let r = gw.api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, broker).await?;
    assert_eq!(r.status, 422, "{}", r.text);
    assert!(r.text.contains("user_agent: is for kind http only"), "{}", r.text);
    Ok(())
}
