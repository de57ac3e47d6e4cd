//! Dead-letter recovery: filtered replays, their rate, restarts, cancels, listing and
//! scopes; a plugin's drops as one reason; operational events; endpoint health; retention.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, Backend, FakeReceiver, TestGateway};

use super::plugins::{plugin_bytes, upload};

tests::backends!(
    a_filtered_replay_delivers_exactly_the_selection_at_its_rate,
    replays_need_the_replay_scope_and_stay_in_their_tenant,
    a_disabled_endpoint_refuses_replay_until_re_enabled,
    a_filter_replay_leaves_out_endpoints_not_active_and_says_why,
    retention_purges_delivered_work_and_keeps_dead_letters,
    a_replay_cancelled_midway_sends_nothing_more,
    replays_are_listed_newest_first_in_pages,
    a_plugins_drops_are_one_dead_letter_reason,
);

async fn dead_letters(gw: &TestGateway, query: &str, n: usize) -> anyhow::Result<Vec<Value>> {
    let path = format!("/v1/tenants/acme/dead-letters?{query}");
    let v =
        gw.api.wait_for(&path, Duration::from_secs(10), |v| v["data"].as_array().is_some_and(|d| d.len() == n)).await?;
    Ok(v["data"].as_array().unwrap().clone())
}

async fn wait_replay(gw: &TestGateway, id: &str, timeout: Duration) -> anyhow::Result<Value> {
    gw.api
        .wait_for(&format!("/v1/tenants/acme/replays/{id}"), timeout, |v| {
            v["state"] == "done" && v["pending"] == 0 && v["sent"] == v["selected"]
        })
        .await
}

/// 422s produce dead letters of two event types; returns the endpoint id.
async fn seed_dead_letters(gw: &TestGateway, rx: &FakeReceiver, paid: usize, other: usize) -> anyhow::Result<String> {
    gw.api.tenant("acme").await?;
    rx.set_default(Answer::status(422));
    let ep = gw.api.endpoint("acme", json!({"url": rx.url(), "rate_per_sec": 1000, "burst": 100})).await?;
    for i in 0..paid {
        gw.api.event("acme", json!({"id": format!("paid_{i}"), "type": "invoice.paid", "payload": {"i": i}})).await?;
    }
    for i in 0..other {
        gw.api
            .event("acme", json!({"id": format!("other_{i}"), "type": "invoice.voided", "payload": {"i": i}}))
            .await?;
    }
    dead_letters(gw, "limit=1000", paid + other).await?;
    Ok(ep["id"].as_str().unwrap().to_string())
}

async fn a_filtered_replay_delivers_exactly_the_selection_at_its_rate(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    let ep = seed_dead_letters(&gw, &rx, 10, 3).await?;
    let r = gw.api.get("/v1/tenants/acme/dead-letters?type=invoice.paid", ADMIN_TOKEN).await?;
    assert_eq!(r.json["data"].as_array().unwrap().len(), 10);
    assert_eq!(r.json["counts_by_reason"]["permanent:422"], 10, "the counts follow the filter: {}", r.text);
    let first_round = rx.received();
    rx.set_default(Answer::status(200));

    let rate = 5.0;
    let r = gw
        .api
        .post("/v1/tenants/acme/replays", ADMIN_TOKEN, json!({"filter": {"endpoint": ep, "type": "invoice.paid", "reason": "permanent:422"}, "rate_per_sec": rate, "batch": 4}))
        .await?;
    assert_eq!(r.status, 202, "{}", r.text);
    assert_eq!(r.json["selected"], 10);
    let id = r.json["id"].as_str().unwrap().to_string();
    let done = wait_replay(&gw, &id, Duration::from_secs(20)).await?;
    assert_eq!((done["delivered"].as_u64(), done["failed"].as_u64()), (Some(10), Some(0)), "{done}");

    let replayed: Vec<_> = rx.received().into_iter().skip(first_round.len()).collect();
    let mut ids: Vec<&str> = replayed.iter().map(|r| r.header("webhook-id").unwrap()).collect();
    ids.sort();
    let mut want: Vec<String> = (0..10).map(|i| format!("paid_{i}")).collect();
    want.sort();
    assert_eq!(ids, want, "exactly the selected dead letters, with their original webhook-id");
    for r in &replayed {
        let original = first_round.iter().find(|o| o.header("webhook-id") == r.header("webhook-id")).unwrap();
        let (t0, t1): (i64, i64) =
            (original.header("webhook-timestamp").unwrap().parse()?, r.header("webhook-timestamp").unwrap().parse()?);
        assert!(t1 >= t0, "fresh timestamp");
        assert_ne!(original.header("herald-attempt-id"), r.header("herald-attempt-id"));
    }
    let span = replayed.last().unwrap().at.duration_since(replayed[0].at).as_secs_f64();
    let achieved = (replayed.len() - 1) as f64 / span;
    assert!(achieved <= rate * 1.05, "replayed at {achieved:.2}/s, over the {rate}/s asked");
    // The others stay dead letters.
    dead_letters(&gw, "type=invoice.voided", 3).await?;
    dead_letters(&gw, "type=invoice.paid", 0).await?;

    // Endpoint health sits beside its pacing settings.
    let e = gw.api.get(&format!("/v1/tenants/acme/endpoints/{ep}"), ADMIN_TOKEN).await?;
    let h = &e.json["health"];
    assert_eq!(h["attempts_1h"], 23, "{h}");
    assert!((h["success_rate_1h"].as_f64().unwrap() - 10.0 / 23.0).abs() < 1e-9, "{h}");
    assert!(h["last_success_at"].is_string());
    assert_eq!(h["rate_per_sec"], 1000.0);
    Ok(())
}

#[tokio::test]
async fn a_replay_resumes_after_a_restart() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let rx = FakeReceiver::start().await?;
    seed_dead_letters(&gw, &rx, 12, 0).await?;
    rx.set_default(Answer::status(200));
    let before = rx.count();
    let r = gw
        .api
        .post("/v1/tenants/acme/replays", ADMIN_TOKEN, json!({"filter": {}, "rate_per_sec": 4, "batch": 2}))
        .await?;
    assert_eq!(r.status, 202, "{}", r.text);
    let id = r.json["id"].as_str().unwrap().to_string();
    rx.wait_for(before + 3, Duration::from_secs(10)).await?;
    let dir = gw.stop().await;
    let mid = rx.count() - before;
    assert!(mid < 12, "stopped half-way ({mid} of 12 replayed)");
    let gw = TestGateway::start_in(dir, &[]).await?;
    let done = wait_replay(&gw, &id, Duration::from_secs(20)).await?;
    assert_eq!(done["delivered"], 12, "{done}");
    let mut ids: Vec<String> =
        rx.received().iter().skip(before).filter_map(|r| r.header("webhook-id").map(String::from)).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 12);
    Ok(())
}

async fn replays_need_the_replay_scope_and_stay_in_their_tenant(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    seed_dead_letters(&gw, &rx, 2, 0).await?;
    let reader = gw.api.token("acme", &["read"]).await?;
    let replayer = gw.api.token("acme", &["replay"]).await?;
    let body = json!({"filter": {}});
    let r = gw.api.post("/v1/tenants/acme/replays", &reader, body.clone()).await?;
    assert_eq!(r.status, 403, "{}", r.text);
    let r = gw.api.get("/v1/tenants/acme/dead-letters", &reader).await?;
    assert_eq!(r.status, 200, "reading dead letters needs only read");

    gw.api.tenant("other").await?;
    let other = gw.api.token("other", &["read", "replay"]).await?;
    let r = gw.api.get("/v1/tenants/acme/dead-letters", &other).await?;
    assert_eq!(r.status, 404);
    let r = gw.api.post("/v1/tenants/acme/replays", &other, body.clone()).await?;
    assert_eq!(r.status, 404);
    // Naming acme's delivery ids from tenant other selects nothing.
    let ids: Vec<String> =
        dead_letters(&gw, "", 2).await?.iter().map(|d| d["id"].as_str().unwrap().to_string()).collect();
    let r = gw.api.post("/v1/tenants/other/replays", &other, json!({"ids": ids})).await?;
    assert_eq!((r.status, r.json["selected"].as_u64()), (202, Some(0)), "{}", r.text);
    let r = gw.api.post("/v1/tenants/acme/replays", &replayer, json!({"ids": ids, "rate_per_sec": 100})).await?;
    assert_eq!((r.status, r.json["selected"].as_u64()), (202, Some(2)), "{}", r.text);
    let r = gw.api.get(&format!("/v1/tenants/other/replays/{}", r.json["id"].as_str().unwrap()), &other).await?;
    assert_eq!(r.status, 404);
    for bad in [
        json!({}),
        json!({"ids": []}),
        json!({"filter": {}, "rate_per_sec": 0}),
        json!({"filter": {"since": "yesterday"}}),
    ] {
        let r = gw.api.post("/v1/tenants/acme/replays", &replayer, bad.clone()).await?;
        assert!(r.status == 422 || r.status == 400, "{bad}: {}", r.text);
    }
    Ok(())
}

/// A replay of `{"filter": {}}` while an endpoint holding a dead letter is disabled
/// replays the rest and says what it left out and why; its `since` reads back as the RFC
/// 3339 time given. A filter naming no endpoint of the tenant (unknown, or another
/// tenant's) is a 404, not a replay of nothing.
async fn a_filter_replay_leaves_out_endpoints_not_active_and_says_why(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    seed_dead_letters(&gw, &rx, 3, 0).await?;
    let gone = FakeReceiver::start().await?;
    gone.set_default(Answer::status(410));
    let body = json!({"url": gone.url(), "event_types": ["gone.x"], "rate_per_sec": 100});
    let disabled = gw.api.endpoint("acme", body).await?["id"].as_str().unwrap().to_string();
    gw.api.event("acme", json!({"id": "gone_1", "type": "gone.x", "payload": {}})).await?.expect(202)?;
    // The 422 endpoint takes every type: 4 dead letters there, 1 on the disabled one.
    dead_letters(&gw, "", 5).await?;
    rx.set_default(Answer::status(200));
    let since = "2020-01-01T00:00:00Z";
    let r = gw
        .api
        .post("/v1/tenants/acme/replays", ADMIN_TOKEN, json!({"filter": {"since": since}, "rate_per_sec": 100}))
        .await?;
    assert_eq!(r.status, 202, "{}", r.text);
    assert_eq!(r.json["selected"], 4, "{}", r.text);
    assert_eq!(r.json["filter"]["since"], since, "{}", r.text);
    let skipped = &r.json["skipped"];
    assert_eq!(skipped.as_array().map(Vec::len), Some(1), "{}", r.text);
    assert_eq!((&skipped[0]["endpoint"], &skipped[0]["state"]), (&json!(disabled), &json!("disabled")), "{}", r.text);
    assert_eq!(skipped[0]["dead_letters"], 1, "{}", r.text);
    assert!(skipped[0]["reason"].as_str().is_some_and(|r| !r.is_empty()), "why: {}", r.text);
    let done = wait_replay(&gw, r.json["id"].as_str().unwrap(), Duration::from_secs(10)).await?;
    assert_eq!(done["delivered"], 4, "{done}");
    assert_eq!((&done["skipped"], &done["filter"]["since"]), (skipped, &json!(since)), "{done}");
    let left = dead_letters(&gw, "", 1).await?;
    assert_eq!(left[0]["endpoint_id"], json!(disabled), "the one left out is still a dead letter");
    assert_eq!(gone.count(), 1, "nothing was sent to the disabled endpoint");

    let r = gw.api.post("/v1/tenants/acme/replays", ADMIN_TOKEN, json!({"filter": {"endpoint": "ep_nope"}})).await?;
    assert_eq!(r.status, 404, "an unknown endpoint: {}", r.text);
    gw.api.tenant("other").await?;
    let theirs = gw.api.endpoint("other", json!({"url": rx.url()})).await?["id"].as_str().unwrap().to_string();
    let r = gw.api.post("/v1/tenants/acme/replays", ADMIN_TOKEN, json!({"filter": {"endpoint": theirs}})).await?;
    assert_eq!(r.status, 404, "another tenant's endpoint: {}", r.text);
    Ok(())
}

async fn a_disabled_endpoint_refuses_replay_until_re_enabled(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    gw.api.tenant("acme").await?;
    rx.set_default(Answer::status(410));
    let ep = gw.api.endpoint("acme", json!({"url": rx.url(), "rate_per_sec": 100, "max_in_flight": 1})).await?;
    let ep = ep["id"].as_str().unwrap().to_string();
    // All three in one commit, before the 410 disables the endpoint (intake skips disabled
    // endpoints).
    let events: Vec<Value> = (0..3).map(|i| json!({"id": format!("e{i}"), "type": "t", "payload": {}})).collect();
    let r = gw.api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, json!({"events": events})).await?;
    assert_eq!(r.status, 202, "{}", r.text);
    let dead = dead_letters(&gw, "", 3).await?;
    assert!(dead.iter().all(|d| d["reason"] == "endpoint_disabled"), "{dead:?}");
    let r = gw.api.post("/v1/tenants/acme/replays", ADMIN_TOKEN, json!({"filter": {"endpoint": ep}})).await?;
    assert_eq!(r.status, 409, "{}", r.text);
    rx.set_default(Answer::status(200));
    let r = gw.api.post(&format!("/v1/tenants/acme/endpoints/{ep}/enable"), ADMIN_TOKEN, json!({})).await?;
    assert_eq!(r.status, 200);
    let r = gw
        .api
        .post("/v1/tenants/acme/replays", ADMIN_TOKEN, json!({"filter": {"endpoint": ep}, "rate_per_sec": 100}))
        .await?;
    assert_eq!(r.status, 202, "{}", r.text);
    let done = wait_replay(&gw, r.json["id"].as_str().unwrap(), Duration::from_secs(10)).await?;
    assert_eq!(done["delivered"], 3, "{done}");
    Ok(())
}

#[tokio::test]
async fn operational_events_reach_the_operator() -> anyhow::Result<()> {
    let operator = FakeReceiver::start().await?;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let gw = TestGateway::start_with(&[
        ("HERALD_OPERATOR_URL", &operator.url()),
        ("HERALD_OPERATOR_SECRET", secret),
        ("HERALD_OPERATOR_STALE_AFTER", "500ms"),
        ("HERALD_OPERATOR_CHECK_EVERY", "200ms"),
    ])
    .await?;
    gw.api.tenant("acme").await?;
    let make = |status: u16, ty: &'static str| {
        let gw = &gw;
        async move {
            let rx = FakeReceiver::start().await?;
            rx.set_default(Answer::status(status));
            gw.api.endpoint("acme", json!({"url": rx.url(), "event_types": [ty], "max_in_flight": 1})).await?;
            gw.api.event("acme", json!({"type": ty, "payload": {}})).await?;
            anyhow::Ok(rx)
        }
    };
    let _a = make(401, "a").await?;
    let _b = make(410, "b").await?;
    let _c = make(422, "c").await?;
    let wanted = ["endpoint.paused", "endpoint.disabled", "delivery.dead", "dead_letters.stale"];
    tests::eventually(&format!("the operator getting {wanted:?}"), Duration::from_secs(15), || async {
        let types: Vec<String> =
            operator.received().iter().filter_map(|r| r.json()["type"].as_str().map(String::from)).collect();
        tests::done_or(wanted.iter().all(|w| types.iter().any(|t| t == w)), format!("{types:?}"))
    })
    .await?;
    let got = operator.received();
    let paused = got.iter().find(|r| r.json()["type"] == "endpoint.paused").unwrap();
    assert_eq!(paused.json()["data"]["tenant"], "acme");
    assert!(paused.header("webhook-signature").unwrap().starts_with("v1,"));
    // Issue 48 §23: the event's fields are the webhook's `data`, not nested in a `data` of their own.
    for r in &got {
        let (body, data) = (r.json(), &r.json()["data"]);
        assert!(data.get("data").is_none(), "data.data: {body}");
        assert!(data["tenant"] == "acme" && data["at"].is_string(), "{body}");
    }
    let data = &paused.json()["data"];
    assert!(data["endpoint_id"].is_string() && data["reason"].is_string() && data["url"].is_string(), "{data}");
    let dead = got.iter().find(|r| r.json()["type"] == "delivery.dead").unwrap().json();
    assert!(dead["data"]["delivery_id"].is_string() && dead["data"]["attempts"].is_u64(), "{dead}");
    Ok(())
}

async fn retention_purges_delivered_work_and_keeps_dead_letters(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[("HERALD_RETENTION_DELIVERED", "300ms"), ("HERALD_RETENTION_EVERY", "100ms")])
        .await?;
    let ok = FakeReceiver::start().await?;
    let bad = FakeReceiver::start().await?;
    bad.set_default(Answer::status(422));
    gw.api.tenant("acme").await?;
    gw.api.endpoint("acme", json!({"url": ok.url(), "event_types": ["ok"]})).await?;
    gw.api.endpoint("acme", json!({"url": bad.url(), "event_types": ["bad"]})).await?;
    gw.api.event("acme", json!({"id": "delivered", "type": "ok", "payload": {}})).await?;
    gw.api.event("acme", json!({"id": "dead", "type": "bad", "payload": {}})).await?;
    ok.wait_for(1, Duration::from_secs(5)).await?;
    tests::eventually("the delivered event purged", Duration::from_secs(10), || async {
        let status = gw.api.get("/v1/tenants/acme/events/delivered", ADMIN_TOKEN).await?.status;
        tests::done_or(status == 404, status)
    })
    .await?;
    let r = gw.api.get("/v1/tenants/acme/events/dead", ADMIN_TOKEN).await?;
    assert_eq!(r.status, 200, "dead letters are kept longer");
    dead_letters(&gw, "", 1).await?;
    Ok(())
}

/// A replay at a low rate, cancelled midway: nothing it had not sent goes out after the
/// cancel (the receiver is watched for a window), what it had not sent is back among the
/// dead letters as it was, and its figures add up.
async fn a_replay_cancelled_midway_sends_nothing_more(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    seed_dead_letters(&gw, &rx, 12, 0).await?;
    let id_of = |d: &Value| d["id"].as_str().unwrap_or_default().to_string();
    let before: HashMap<String, Value> =
        dead_letters(&gw, "limit=1000", 12).await?.into_iter().map(|d| (id_of(&d), d)).collect();
    rx.set_default(Answer::status(200));
    let first_round = rx.count();

    let r = gw.api.post("/v1/tenants/acme/replays", ADMIN_TOKEN, json!({"filter": {}, "rate_per_sec": 4})).await?;
    assert_eq!(r.status, 202, "{}", r.text);
    let id = r.json["id"].as_str().unwrap().to_string();
    rx.wait_for(first_round + 3, Duration::from_secs(10)).await?;
    let cancel = gw.api.post(&format!("/v1/tenants/acme/replays/{id}/cancel"), ADMIN_TOKEN, json!({})).await?;
    let at_cancel = rx.count() - first_round;
    // An absence needs a window: two seconds is eight of the replay's intervals.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let replayed = rx.count() - first_round;
    assert!(replayed <= at_cancel + 1, "{} sent after the cancel (one may have been in flight)", replayed - at_cancel);
    assert_eq!((cancel.status, cancel.json["state"].as_str()), (200, Some("cancelled")), "{}", cancel.text);

    let done = gw
        .api
        .wait_for(&format!("/v1/tenants/acme/replays/{id}"), Duration::from_secs(10), |v| v["pending"] == 0)
        .await?;
    let figure = |k: &str| done[k].as_u64().unwrap_or(u64::MAX);
    assert_eq!((figure("sent"), figure("delivered")), (replayed as u64, replayed as u64), "{done}");
    assert_eq!((figure("selected"), figure("failed"), done["state"].as_str()), (12, 0, Some("cancelled")), "{done}");
    assert_eq!(figure("requeued"), figure("delivered") + figure("returned"), "the figures add up: {done}");
    assert!(figure("requeued") < 12, "{done}");

    // Back among the dead letters as they were: reason, time of death, attempt history.
    let after = dead_letters(&gw, "limit=1000", 12 - replayed).await?;
    for d in &after {
        let was = &before[&id_of(d)];
        let kept =
            |d: &Value| (d["reason"].clone(), d["updated_at"].clone(), d["attempts"].clone(), d["state"].clone());
        assert_eq!(kept(d), kept(was), "{d}");
    }
    let one = gw.api.get(&format!("/v1/tenants/acme/deliveries/{}", id_of(&after[0])), ADMIN_TOKEN).await?;
    assert_eq!(one.json["attempt_history"].as_array().map(Vec::len), Some(1), "{}", one.text);
    assert_eq!(rx.count() - first_round, replayed, "nothing went out since the window");
    Ok(())
}

/// `GET …/replays`: newest first, paged like the other lists, with each replay's figures;
/// `read` is enough; another tenant's are not there.
async fn replays_are_listed_newest_first_in_pages(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    seed_dead_letters(&gw, &rx, 3, 0).await?;
    rx.set_default(Answer::status(200));
    let mut made = Vec::new();
    for d in dead_letters(&gw, "", 3).await? {
        let r = gw
            .api
            .post("/v1/tenants/acme/replays", ADMIN_TOKEN, json!({"ids": [d["id"]], "rate_per_sec": 100}))
            .await?;
        assert_eq!(r.status, 202, "{}", r.text);
        made.push(r.json["id"].as_str().unwrap().to_string());
    }
    let reader = gw.api.token("acme", &["read"]).await?;
    let r = gw.api.get("/v1/tenants/acme/replays?limit=2", &reader).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    let ids = |v: &Value| {
        v["data"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(ids(&r.json), [made[2].clone(), made[1].clone()], "newest first");
    assert_eq!(r.json["data"][0]["selected"], 1, "with its figures: {}", r.text);
    let next = r.json["next_after"].as_str().expect("a next page").to_string();
    let r = gw.api.get(&format!("/v1/tenants/acme/replays?limit=2&after={next}"), &reader).await?;
    assert_eq!((ids(&r.json), &r.json["next_after"]), (vec![made[0].clone()], &Value::Null), "{}", r.text);

    let r = gw.api.get("/v1/tenants/acme/replays?limit=0", &reader).await?;
    assert_eq!((r.status, r.json["error"]["code"].as_str()), (400, Some("invalid_query")), "{}", r.text);
    gw.api.tenant("other").await?;
    let other = gw.api.token("other", &["read"]).await?;
    assert_eq!(gw.api.get("/v1/tenants/acme/replays", &other).await?.status, 404);
    let r = gw.api.get("/v1/tenants/other/replays", &other).await?;
    assert_eq!(r.json["data"], json!([]), "{}", r.text);
    Ok(())
}

/// A transform plugin's drop is dead letter reason `dropped`, whatever the plugin said
/// (its words are the delivery's last error): `reason=dropped` lists them, the counts by
/// reason have one row for them, a replay's filter selects them, and so do the metrics.
async fn a_plugins_drops_are_one_dead_letter_reason(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    gw.api.tenant("acme").await?;
    assert_eq!(upload(&gw, "acme", "chat", plugin_bytes("transform_chat"), ADMIN_TOKEN).await?.status, 200);
    let set = json!({"values": {"skip_types": "audit.*"}});
    let r = gw.api.call("PUT", "/v1/tenants/acme/plugins/chat/config", ADMIN_TOKEN, Some(set)).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    let rx = FakeReceiver::start().await?;
    gw.api.endpoint("acme", json!({"url": rx.url(), "plugins": {"transform": "chat"}})).await?;
    for (id, kind) in [("evt_in", "audit.login"), ("evt_out", "audit.logout")] {
        let r = gw.api.event("acme", json!({"id": id, "type": kind, "payload": {}})).await?;
        assert_eq!(r.status, 202, "{}", r.text);
    }

    let dropped = dead_letters(&gw, "reason=dropped", 2).await?;
    let mut words: Vec<&str> = dropped.iter().map(|d| d["last_error"].as_str().unwrap_or_default()).collect();
    words.sort();
    assert_eq!(words, ["event type audit.login is skipped", "event type audit.logout is skipped"], "{dropped:?}");
    let r = gw.api.get("/v1/tenants/acme/dead-letters", ADMIN_TOKEN).await?;
    assert_eq!(r.json["counts_by_reason"], json!({"dropped": 2}), "{}", r.text);
    // The counter moves once the result's commit returns, just after the rows are readable.
    wait_for_metric(&gw, r#"herald_dead_letters_total{tenant="acme",kind="http",reason="dropped"} 2"#).await?;
    let r = gw.api.post("/v1/tenants/acme/replays", ADMIN_TOKEN, json!({"filter": {"reason": "dropped"}})).await?;
    assert_eq!((r.status, r.json["selected"].as_u64()), (202, Some(2)), "{}", r.text);
    // Replayed, the plugin drops them again: two more dead letters of the same reason.
    wait_for_metric(&gw, r#"herald_dead_letters_total{tenant="acme",kind="http",reason="dropped"} 4"#).await?;
    assert_eq!(rx.count(), 0, "a dropped delivery is never sent");
    Ok(())
}

/// Waits (10 s at most) until `/metrics` shows the line `counted`.
async fn wait_for_metric(gw: &TestGateway, counted: &str) -> anyhow::Result<()> {
    tests::eventually(counted, Duration::from_secs(10), || async {
        let metrics = gw.api.raw("GET", "/metrics", None, "").await?.text;
        let seen: Vec<&str> = metrics.lines().filter(|l| l.starts_with("herald_dead_letters_total")).collect();
        tests::done_or(metrics.lines().any(|l| l == counted), format!("{seen:?}"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_replay_follows_a_replay_to_its_end() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let rx = FakeReceiver::start().await?;
    seed_dead_letters(&gw, &rx, 4, 2).await?;
    rx.set_default(Answer::status(200));
    let bin = tests::herald_binary()?;
    let api = gw.api.base.clone();
    let run = tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin)
            .args(["replay", "--api", &api, "--token", ADMIN_TOKEN, "--tenant", "acme", "--type", "invoice.paid"])
            .args(["--rate", "50", "--batch", "2"])
            .output()
    });
    let out = tokio::time::timeout(Duration::from_secs(30), run).await???;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "herald replay failed: {stderr}");
    assert!(stderr.contains("4 dead letters selected") && stderr.contains("####"), "progress shown: {stderr}");
    let result: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!((result["delivered"].as_u64(), result["failed"].as_u64()), (Some(4), Some(0)), "{result}");
    assert_eq!((result["state"].as_str(), result["pending"].as_u64()), (Some("done"), Some(0)), "{result}");
    // A refused replay is a clear error and a failed command.
    let replay = |args: &'static [&'static str]| {
        let (bin, api) = (tests::herald_binary(), gw.api.base.clone());
        tokio::task::spawn_blocking(move || {
            let mut cmd = std::process::Command::new(bin?);
            cmd.args(["replay", "--api", &api, "--tenant", "acme"]).args(args);
            anyhow::Ok(cmd.stdin(std::process::Stdio::null()).output()?)
        })
    };
    // Every dead letter, with no terminal to ask on and no --all: refused, nothing asked of
    // the node.
    let out = tokio::time::timeout(Duration::from_secs(30), replay(&["--token", ADMIN_TOKEN])).await???;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("error: ") && stderr.contains("--all"), "{stderr}");
    let listed = gw.api.get("/v1/tenants/acme/replays", ADMIN_TOKEN).await?;
    assert_eq!(listed.json["data"].as_array().map(Vec::len), Some(1), "only the filtered replay: {}", listed.text);
    let out = tokio::time::timeout(Duration::from_secs(30), replay(&["--token", "wrong", "--all"])).await???;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"), "{}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}
