//! Batching (`batch` on an endpoint): several events in one signed request, a partial batch
//! after the wait, all-or-nothing retries, a receiver accepting part of a batch, dead
//! letters and replays per event, ordering keys kept across batches, bad settings refused.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, Backend, FakeReceiver, Received, TestGateway};

tests::backends!(
    batches_of_n_arrive_with_n_events_signed_once,
    the_wait_sends_a_partial_batch,
    a_retryable_answer_retries_the_whole_batch,
    a_receiver_accepts_part_of_a_batch,
    dead_letters_stay_per_event_and_a_replay_sends_one,
    an_ordered_endpoint_keeps_each_key_in_order_across_batches,
    bad_batch_settings_are_refused_naming_the_field,
);

const WAIT: Duration = Duration::from_secs(20);
const T: &str = "/v1/tenants/acme";
const RETRY: &str = r#"{"base": "100ms", "factor": 1, "jitter": "none", "max_attempts": 3}"#;

/// A node with tenant `acme` and a batching endpoint to `rx` (`extra` on top).
async fn setup(b: Backend, rx: &FakeReceiver, batch: Value, extra: Value) -> anyhow::Result<(TestGateway, Value)> {
    let gw = TestGateway::start_on(b, &[]).await?;
    gw.api.tenant("acme").await?;
    let mut body = json!({"url": rx.url(), "rate_per_sec": 100, "batch": batch,
                          "retry": serde_json::from_str::<Value>(RETRY)?});
    for (k, v) in extra.as_object().context("extra")? {
        body[k] = v.clone();
    }
    let ep = gw.api.endpoint("acme", body).await?;
    Ok((gw, ep))
}

async fn post(gw: &TestGateway, ids: &[&str]) -> anyhow::Result<()> {
    for (n, id) in ids.iter().enumerate() {
        gw.api.event("acme", json!({"id": id, "type": "order.paid", "payload": {"n": n}})).await?.expect(202)?;
    }
    Ok(())
}

/// The event ids a batch request carries, in order.
fn ids_in(r: &Received) -> Vec<String> {
    let body = r.json();
    let data = body["data"].as_array().cloned().unwrap_or_default();
    data.iter().map(|e| e["id"].as_str().unwrap_or_default().to_string()).collect()
}

/// The delivery of `event` with its attempts.
async fn delivery(gw: &TestGateway, event: &str) -> anyhow::Result<Value> {
    let r = gw.api.get(&format!("{T}/events/{event}/deliveries"), ADMIN_TOKEN).await?.expect(200)?;
    let id = r.json["data"][0]["id"].as_str().context("a delivery")?.to_string();
    Ok(gw.api.get(&format!("{T}/deliveries/{id}"), ADMIN_TOKEN).await?.expect(200)?.json)
}

async fn wait_state(gw: &TestGateway, event: &str, state: &str) -> anyhow::Result<Value> {
    tests::eventually(&format!("{event} {state}"), WAIT, || async {
        let d = delivery(gw, event).await?;
        Ok(if d["state"] == state { Ok(d) } else { Err(d.to_string()) })
    })
    .await
}

/// A header of an attempt's request as recorded.
fn sent_header(attempt: &Value, name: &str) -> Option<String> {
    let headers = attempt["request"]["headers"].as_array()?;
    headers.iter().find(|h| h[0] == name).and_then(|h| h[1].as_str()).map(str::to_string)
}

async fn batches_of_n_arrive_with_n_events_signed_once(b: Backend) -> anyhow::Result<()> {
    let rx = FakeReceiver::start().await?;
    let (gw, ep) = setup(b, &rx, json!({"max_events": 5, "max_wait": "30s"}), json!({})).await?;
    assert_eq!(ep["batch"], json!({"max_events": 5, "max_bytes": 1048576, "max_wait": "30s"}), "{ep}");
    let secret = gateway::sign::Secret::parse(ep["secret"].as_str().context("secret")?).map_err(anyhow::Error::msg)?;
    let ids: Vec<String> = (0..10).map(|i| format!("evt_{i:02}")).collect();
    post(&gw, &ids.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    let got = rx.wait_for(2, WAIT).await?;
    let mut seen = Vec::new();
    for r in &got {
        let body = r.json();
        ensure!(body["type"] == "batch", "{body}");
        let events = body["data"].as_array().context("data")?;
        ensure!(events.len() == 5, "a full batch holds max_events: {body}");
        for e in events {
            ensure!(e["type"] == "order.paid" && e["data"]["n"].is_u64() && e["timestamp"].is_string(), "{e}");
        }
        let id = r.header("webhook-id").context("webhook-id")?;
        ensure!(id.starts_with("batch_"), "{id}");
        ensure!(r.header("herald-batch-size") == Some("5") && r.header("herald-delivery-id").is_none());
        let ts: i64 = r.header("webhook-timestamp").context("timestamp")?.parse()?;
        let sig = r.header("webhook-signature").context("signature")?;
        ensure!(gateway::sign::verify(&secret, id, ts, &r.body, sig), "one signature over the whole body");
        seen.extend(ids_in(r));
    }
    seen.sort();
    ensure!(seen == ids, "every event once: {seen:?}");
    rx.stays_at(2, Duration::from_millis(300)).await?;
    // Each delivery has an attempt of its own, pointing at the shared request.
    let d = wait_state(&gw, "evt_03", "delivered").await?;
    let attempts = d["attempt_history"].as_array().context("attempts")?;
    ensure!(attempts.len() == 1 && attempts[0]["status"] == 200, "{d}");
    ensure!(sent_header(&attempts[0], "webhook-id").as_deref() == got[0].header("webhook-id"), "{d}");
    Ok(())
}

async fn the_wait_sends_a_partial_batch(b: Backend) -> anyhow::Result<()> {
    let rx = FakeReceiver::start().await?;
    let (gw, _) = setup(b, &rx, json!({"max_events": 100, "max_wait": "1s"}), json!({})).await?;
    let posted = Instant::now();
    post(&gw, &["evt_a", "evt_b", "evt_c"]).await?;
    let got = rx.wait_for(1, WAIT).await?;
    let waited = got[0].at.duration_since(posted);
    ensure!(waited >= Duration::from_millis(900), "sent after {waited:?}, before the wait of 1s");
    ensure!(waited < Duration::from_secs(5), "sent after {waited:?}, long after the wait of 1s");
    ensure!(ids_in(&got[0]) == ["evt_a", "evt_b", "evt_c"], "{:?}", got[0].json());
    rx.stays_at(1, Duration::from_millis(500)).await?;
    Ok(())
}

async fn a_retryable_answer_retries_the_whole_batch(b: Backend) -> anyhow::Result<()> {
    let rx = FakeReceiver::start().await?;
    rx.script([Answer::status(503)]);
    let (gw, _) = setup(b, &rx, json!({"max_events": 3, "max_wait": "10s"}), json!({})).await?;
    post(&gw, &["evt_a", "evt_b", "evt_c"]).await?;
    let got = rx.wait_for(2, WAIT).await?;
    ensure!(got[0].status == 503 && got[1].status == 200);
    let sorted = |r: &Received| {
        let mut ids = ids_in(r);
        ids.sort();
        ids
    };
    ensure!(sorted(&got[0]) == sorted(&got[1]), "the same batch again: {:?} {:?}", got[0].json(), got[1].json());
    ensure!(got[0].header("webhook-id") == got[1].header("webhook-id"), "a retried batch keeps its webhook-id");
    for e in ["evt_a", "evt_b", "evt_c"] {
        let d = wait_state(&gw, e, "delivered").await?;
        let statuses: Vec<_> =
            d["attempt_history"].as_array().context("attempts")?.iter().map(|a| a["status"].clone()).collect();
        ensure!(statuses == [json!(503), json!(200)], "{e}: {d}");
    }
    rx.stays_at(2, Duration::from_millis(300)).await?;
    Ok(())
}

async fn a_receiver_accepts_part_of_a_batch(b: Backend) -> anyhow::Result<()> {
    let rx = FakeReceiver::start().await?;
    rx.script([Answer::status(200).body(r#"{"failed": ["evt_b"]}"#)]);
    let (gw, _) = setup(b, &rx, json!({"max_events": 3, "max_wait": "200ms"}), json!({})).await?;
    post(&gw, &["evt_a", "evt_b", "evt_c"]).await?;
    let got = rx.wait_for(2, WAIT).await?;
    ensure!(ids_in(&got[0]) == ["evt_a", "evt_b", "evt_c"], "{:?}", got[0].json());
    ensure!(ids_in(&got[1]) == ["evt_b"], "only the refused event again: {:?}", got[1].json());
    for e in ["evt_a", "evt_c"] {
        let d = wait_state(&gw, e, "delivered").await?;
        ensure!(d["attempts"] == 1, "{e}: {d}");
    }
    let d = wait_state(&gw, "evt_b", "delivered").await?;
    let attempts = d["attempt_history"].as_array().context("attempts")?;
    ensure!(attempts.len() == 2, "{d}");
    ensure!(attempts[0]["error"] == "batch: refused by the receiver" && attempts[0]["verdict"] != "delivered", "{d}");
    rx.stays_at(2, Duration::from_millis(300)).await?;
    Ok(())
}

async fn dead_letters_stay_per_event_and_a_replay_sends_one(b: Backend) -> anyhow::Result<()> {
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(400));
    let (gw, _) = setup(b, &rx, json!({"max_events": 3, "max_wait": "200ms"}), json!({})).await?;
    post(&gw, &["evt_a", "evt_b", "evt_c"]).await?;
    let mut dead = BTreeMap::new();
    for e in ["evt_a", "evt_b", "evt_c"] {
        let d = wait_state(&gw, e, "dead").await?;
        ensure!(d["reason"] == "permanent:400" && d["attempt_history"].as_array().map(Vec::len) == Some(1), "{d}");
        dead.insert(e, d["id"].as_str().context("id")?.to_string());
    }
    ensure!(rx.count() == 1, "one request for the three: {}", rx.count());
    let listed = gw.api.get(&format!("{T}/dead-letters"), ADMIN_TOKEN).await?.expect(200)?;
    ensure!(listed.json["data"].as_array().map(Vec::len) == Some(3), "{}", listed.text);
    rx.set_default(Answer::status(200));
    gw.api.post(&format!("{T}/replays"), ADMIN_TOKEN, json!({"ids": [dead["evt_b"]]})).await?.expect(202)?;
    let got = rx.wait_for(2, WAIT).await?;
    ensure!(ids_in(&got[1]) == ["evt_b"], "the replay sends that event alone: {:?}", got[1].json());
    wait_state(&gw, "evt_b", "delivered").await?;
    for e in ["evt_a", "evt_c"] {
        ensure!(delivery(&gw, e).await?["state"] == "dead", "{e} stays a dead letter");
    }
    Ok(())
}

async fn an_ordered_endpoint_keeps_each_key_in_order_across_batches(b: Backend) -> anyhow::Result<()> {
    let rx = FakeReceiver::start().await?;
    let batch = json!({"max_events": 10, "max_wait": "100ms"});
    let (gw, _) = setup(b, &rx, batch, json!({"ordering": "key"})).await?;
    for n in 0..4 {
        for key in 0..3 {
            let id = format!("evt_k{key}_{n}");
            let event = json!({"id": id, "type": "t", "ordering_key": format!("k{key}"), "payload": {"n": n}});
            gw.api.event("acme", event).await?.expect(202)?;
        }
    }
    let got = tests::eventually("12 events", WAIT, || async {
        let got = rx.received().iter().flat_map(ids_in).collect::<Vec<_>>();
        Ok(if got.len() >= 12 { Ok(got) } else { Err(format!("{got:?}")) })
    })
    .await?;
    for r in rx.received() {
        let ids = ids_in(&r);
        let mut keys: Vec<_> = ids.iter().map(|i| i[4..6].to_string()).collect();
        let n = keys.len();
        keys.sort();
        keys.dedup();
        ensure!(keys.len() == n, "a batch holds at most one delivery of a key: {ids:?}");
    }
    for key in 0..3 {
        let of_key: Vec<_> = got.iter().filter(|i| i.starts_with(&format!("evt_k{key}_"))).cloned().collect();
        let want: Vec<_> = (0..4).map(|n| format!("evt_k{key}_{n}")).collect();
        ensure!(of_key == want, "key k{key} in intake order: {of_key:?}");
    }
    Ok(())
}

async fn bad_batch_settings_are_refused_naming_the_field(b: Backend) -> anyhow::Result<()> {
    let rx = FakeReceiver::start().await?;
    let (gw, ep) = setup(b, &rx, json!({"max_events": 2}), json!({})).await?;
    let path = format!("{T}/endpoints/{}", ep["id"].as_str().context("id")?);
    let cases = [
        (json!({"batch": {"max_events": 0}}), "batch.max_events"),
        (json!({"batch": {"max_events": 1001}}), "batch.max_events"),
        (json!({"batch": {"max_bytes": 0}}), "batch.max_bytes"),
        (json!({"batch": {"max_wait": "301s"}}), "batch.max_wait"),
        (json!({"batch": {"max_wait": "soon"}}), "batch.max_wait"),
        (json!({"batch": {"size": 3}}), "size"),
        (json!({"batch": {}, "cloudevents": {"mode": "binary"}}), "batch"),
    ];
    for (patch, field) in cases {
        let r = gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(patch.clone())).await?;
        ensure!(r.status == 422 || r.status == 400, "{patch}: {} {}", r.status, r.text);
        ensure!(r.text.contains(field), "{patch}: the error names {field}: {}", r.text);
    }
    // Not on a `poll` endpoint (its consumer reads pages of its own size); broker kinds'
    // batches are `destinations/batch.rs`'s.
    let pulled = json!({"kind": "poll", "batch": {}});
    let r = gw.api.post(&format!("{T}/endpoints"), ADMIN_TOKEN, pulled).await?;
    ensure!(r.status == 422 && r.text.contains("batch"), "{} {}", r.status, r.text);
    let now = gw.api.get(&path, ADMIN_TOKEN).await?.expect(200)?.json;
    ensure!(now["batch"]["max_events"] == 2 && now["cloudevents"].is_null(), "nothing written: {now}");
    let list = gw.api.get(&format!("{T}/endpoints"), ADMIN_TOKEN).await?.expect(200)?.json;
    ensure!(list["data"].as_array().map(Vec::len) == Some(1), "no endpoint created: {list}");
    let r = gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"batch": null}))).await?.expect(200)?;
    ensure!(r.json["batch"].is_null(), "null removes it: {}", r.text);
    Ok(())
}
