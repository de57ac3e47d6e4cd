//! An endpoint's `delivery_status` against real receivers on loopback: throttled by a 429's
//! `Retry-After` and active once it runs out, failing with its latest error, paused and
//! enabled through the API, on every endpoint's JSON (one, the list); what it refuses.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, Backend, FakeReceiver, TestGateway};

tests::backends!(
    a_429_reads_throttled_until_its_retry_after_then_active,
    a_failing_receiver_reads_failing_with_its_last_error,
    an_operators_pause_reads_paused_with_its_reason_then_active,
);

const WAIT: Duration = Duration::from_secs(15);

/// A new endpoint of tenant `acme` delivering to `rx`; its path in the API.
async fn endpoint(gw: &TestGateway, rx: &FakeReceiver, retry: Value) -> anyhow::Result<String> {
    gw.api.tenant("acme").await?;
    let ep = gw.api.endpoint("acme", json!({"url": rx.url(), "max_in_flight": 1, "retry": retry})).await?;
    Ok(format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().unwrap()))
}

fn time(v: &Value) -> SystemTime {
    humantime::parse_rfc3339(v.as_str().unwrap_or_else(|| panic!("a time, not {v}"))).unwrap()
}

fn status_is(status: &'static str) -> impl Fn(&Value) -> bool {
    move |e: &Value| e["delivery_status"]["status"] == status
}

/// The endpoint as the list shows it (the health not asked for).
async fn listed(gw: &TestGateway, path: &str) -> anyhow::Result<Value> {
    let list = gw.api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.expect(200)?;
    let id = path.rsplit('/').next().unwrap();
    let found = list.json["data"].as_array().unwrap().iter().find(|e| e["id"] == id).cloned();
    Ok(found.unwrap_or_else(|| panic!("{id} in {}", list.text)))
}

async fn a_429_reads_throttled_until_its_retry_after_then_active(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    rx.script([Answer::status(429).header("Retry-After", "2")]);
    let path = endpoint(&gw, &rx, json!({"base": "100ms", "jitter": "none"})).await?;
    let before = SystemTime::now() - Duration::from_secs(1);
    gw.api.event("acme", json!({"id": "evt_1", "type": "t", "payload": {}})).await?.expect(202)?;
    let e = gw.api.wait_for(&path, WAIT, status_is("throttled")).await?;
    let s = &e["delivery_status"];
    let (since, until) = (time(&s["since"]), time(&s["until"]));
    assert!(since >= before, "throttled since the 429: {s}");
    let pause = until.duration_since(since)?;
    assert!(pause >= Duration::from_millis(1900) && pause <= Duration::from_secs(3), "Retry-After: 2 → {pause:?}: {s}");
    assert_eq!(s["reason"], "rate limited (429)", "{s}");
    assert_eq!(
        (&s["last_error"]["category"], &s["last_error"]["status"]),
        (&json!("rate_limited"), &json!(429)),
        "{s}"
    );
    assert!(time(&s["last_error"]["at"]) >= before, "{s}");
    // The list says the same, health asked for or not.
    assert_eq!(listed(&gw, &path).await?["delivery_status"], *s);

    // Once the pause runs out, the retry is delivered: active since the pause's end.
    rx.wait_for(2, WAIT).await?;
    let e = gw.api.wait_for(&path, WAIT, status_is("active")).await?;
    let s = &e["delivery_status"];
    assert_eq!((time(&s["since"]), &s["until"], &s["reason"]), (until, &Value::Null, &Value::Null), "{s}");
    assert_eq!(s["last_error"]["category"], "rate_limited", "the latest failure is still the 429: {s}");
    assert_eq!(listed(&gw, &path).await?["delivery_status"], *s);
    Ok(())
}

async fn a_failing_receiver_reads_failing_with_its_last_error(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(500));
    let path = endpoint(&gw, &rx, json!({"base": "200ms", "jitter": "none", "max_attempts": 3})).await?;
    let e = gw.api.get(&path, ADMIN_TOKEN).await?.expect(200)?.json;
    assert_eq!(e["delivery_status"]["status"], "active", "a new endpoint: {e}");
    assert_eq!(e["delivery_status"]["last_error"], Value::Null, "{e}");
    assert_eq!(time(&e["delivery_status"]["since"]), time(&e["created_at"]), "{e}");

    gw.api.event("acme", json!({"id": "evt_1", "type": "t", "payload": {}})).await?.expect(202)?;
    let e = gw.api.wait_for(&path, WAIT, status_is("failing")).await?;
    let s = &e["delivery_status"];
    assert_eq!(s["since"], e["failing_since"], "failing since its first failure: {e}");
    assert_eq!(
        (&s["last_error"]["category"], &s["last_error"]["status"]),
        (&json!("server_error"), &json!(500)),
        "{s}"
    );
    assert_eq!((&s["until"], &s["reason"]), (&Value::Null, &Value::Null), "{s}");
    let listed = listed(&gw, &path).await?;
    assert_eq!(listed["delivery_status"]["status"], "failing", "{listed}");
    assert_eq!(listed["delivery_status"]["last_error"]["status"], 500, "{listed}");

    // The receiver recovers: the next delivery ends the failing streak.
    rx.set_default(Answer::status(200));
    gw.api.event("acme", json!({"id": "evt_2", "type": "t", "payload": {}})).await?.expect(202)?;
    let e = gw.api.wait_for(&path, WAIT, status_is("active")).await?;
    assert_eq!(e["delivery_status"]["last_error"]["category"], "server_error", "{e}");
    Ok(())
}

async fn an_operators_pause_reads_paused_with_its_reason_then_active(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    let path = endpoint(&gw, &rx, json!({})).await?;
    let before = SystemTime::now() - Duration::from_secs(1);

    // Paused for a while: paused (an operator's, not the receiver's), with its end.
    let body = json!({"for": "1h", "reason": "maintenance window"});
    let r = gw.api.post(&format!("{path}/pause"), ADMIN_TOKEN, body).await?.expect(200)?;
    let s = &r.json["delivery_status"];
    assert_eq!((&s["status"], &s["reason"]), (&json!("paused"), &json!("maintenance window")), "{s}");
    let since = time(&s["since"]);
    assert!(since >= before, "{s}");
    assert_eq!(time(&s["until"]).duration_since(since)?, Duration::from_secs(3600), "{s}");
    let got = gw.api.get(&path, ADMIN_TOKEN).await?.expect(200)?.json;
    assert_eq!(got["delivery_status"], *s, "GET reads what the pause answered");

    // Paused until enabled: no end; the same status, so the same since.
    let r = gw.api.post(&format!("{path}/pause"), ADMIN_TOKEN, json!({})).await?.expect(200)?;
    let s = &r.json["delivery_status"];
    assert_eq!((&s["status"], &s["until"]), (&json!("paused"), &Value::Null), "{s}");
    assert_eq!((&s["reason"], time(&s["since"])), (&json!("paused by an operator"), since), "{s}");

    let r = gw.api.post(&format!("{path}/enable"), ADMIN_TOKEN, json!({})).await?.expect(200)?;
    let s = &r.json["delivery_status"];
    assert_eq!((&s["status"], &s["until"], &s["reason"]), (&json!("active"), &Value::Null, &Value::Null), "{s}");
    assert!(time(&s["since"]) >= since, "active since the enable: {s}");
    assert_eq!(listed(&gw, &path).await?["delivery_status"], *s);

    // Bad input is refused by name: a pause's length, and the status, which is read-only.
    let refused = |r: &tests::Reply, field: &str| {
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        assert!((400..500).contains(&r.status) && message.contains(field), "names {field}: {} {}", r.status, r.text);
    };
    let r = gw.api.post(&format!("{path}/pause"), ADMIN_TOKEN, json!({"for": "soon"})).await?;
    refused(&r, "for");
    let body = json!({"delivery_status": {"status": "active"}});
    refused(&gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(body)).await?, "delivery_status");
    Ok(())
}
