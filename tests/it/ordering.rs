//! Ordered delivery: an endpoint with `ordering` sends each key's deliveries one at a time,
//! in intake order, through random failures, retries, dead letters and a SIGKILL.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, Api, Backend, FakeReceiver, HeraldProcess, Received, TestGateway, herald_binary};

tests::backends!(
    every_key_arrives_in_order_through_random_failures,
    a_dead_head_lets_its_key_go_on_by_default,
    a_dead_head_blocks_its_key_until_replayed,
    ordering_endpoint_sends_one_at_a_time_in_intake_order,
    a_retrying_head_holds_only_its_own_key,
);

const KEYS: usize = 10;
const PER_KEY: usize = 200;

/// A fast retry: an ordered key waits on its head, so the tests keep the waits short.
fn ordered(rx: &FakeReceiver, ordering: &str, extra: Value) -> Value {
    let mut body = json!({
        "url": rx.url(), "rate_per_sec": 10_000, "burst": 1_000, "max_in_flight": 64, "ordering": ordering,
        "retry": {"base": "10ms", "factor": 1, "jitter": "none", "max_attempts": 1000},
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

/// Posts `events` in batches of 100.
async fn post(api: &Api, events: &[Value]) -> anyhow::Result<()> {
    for chunk in events.chunks(100) {
        api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, json!({"events": chunk})).await?.expect(202)?;
    }
    Ok(())
}

/// `KEYS` × `per_key` events, the keys interleaved: event `i` is number `i / KEYS` of key
/// `k{i % KEYS}`.
fn interleaved(per_key: usize) -> Vec<Value> {
    (0..KEYS * per_key)
        .map(|i| {
            let (key, n) = (i % KEYS, i / KEYS);
            json!({"id": format!("evt_{i}"), "type": "t", "ordering_key": format!("k{key}"), "payload": {"key": key, "n": n}})
        })
        .collect()
}

/// Checks that every key's requests came in order: each request is for the key's next
/// number (or, with `duplicates`, one already delivered: what a kill had in flight), and
/// the next number goes out only after the previous one got its 2xx. Returns how many of
/// each key were delivered.
fn assert_in_order(got: &[Received], duplicates: bool) -> HashMap<u64, u64> {
    let mut delivered: HashMap<u64, u64> = HashMap::new();
    for r in got {
        let body = r.json();
        let (key, n) = (body["data"]["key"].as_u64().unwrap(), body["data"]["n"].as_u64().unwrap());
        let done = delivered.entry(key).or_insert(0);
        if duplicates && n < *done {
            continue;
        }
        assert_eq!(n, *done, "key {key}: number {n} went out while {done} was the next in order");
        if (200..300).contains(&r.status) {
            *done += 1;
        }
    }
    delivered
}

async fn every_key_arrives_in_order_through_random_failures(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    rx.fail_at_random(0.2, Answer::status(503));
    gw.api.tenant("acme").await?;
    gw.api.endpoint("acme", ordered(&rx, "key", json!({}))).await?;
    post(&gw.api, &interleaved(PER_KEY)).await?;
    tests::eventually("every event delivered", Duration::from_secs(180), || async {
        let ok = rx.received().iter().filter(|r| r.status == 200).count();
        Ok(if ok >= KEYS * PER_KEY { Ok(()) } else { Err(format!("{ok} of {} delivered", KEYS * PER_KEY)) })
    })
    .await?;
    let got = rx.received();
    let failed = got.iter().filter(|r| r.status != 200).count();
    assert!(failed > 100, "the receiver failed at random ({failed} of {})", got.len());
    let delivered = assert_in_order(&got, false);
    assert!(delivered.values().all(|&n| n == PER_KEY as u64), "{delivered:?}");
    Ok(())
}

async fn ordering_endpoint_sends_one_at_a_time_in_intake_order(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(200).delay(Duration::from_millis(2)));
    rx.fail_at_random(0.2, Answer::status(500));
    gw.api.tenant("acme").await?;
    gw.api.endpoint("acme", ordered(&rx, "endpoint", json!({}))).await?;
    // Keys on the events do not split an endpoint-ordered endpoint.
    let events = interleaved(20);
    post(&gw.api, &events).await?;
    tests::eventually("every event delivered", Duration::from_secs(60), || async {
        let ok = rx.received().iter().filter(|r| r.status == 200).count();
        Ok(if ok >= events.len() { Ok(()) } else { Err(format!("{ok} of {} delivered", events.len())) })
    })
    .await?;
    let mut next = 0;
    for r in rx.received() {
        let i = r.header("webhook-id").unwrap().strip_prefix("evt_").unwrap().parse::<usize>()?;
        assert_eq!(i, next, "evt_{i} went out while evt_{next} was next");
        if r.status == 200 {
            next += 1;
        }
    }
    Ok(())
}

/// Three events of one key, the first refused for good (a 422 is a dead letter at once).
async fn dead_head(b: Backend, extra: Value) -> anyhow::Result<(TestGateway, FakeReceiver)> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    rx.script([Answer::status(422)]);
    gw.api.tenant("acme").await?;
    gw.api.endpoint("acme", ordered(&rx, "key", extra)).await?;
    let events: Vec<Value> = (0..3)
        .map(|n| json!({"id": format!("evt_{n}"), "type": "t", "ordering_key": "cus_1", "payload": {"key": 1, "n": n}}))
        .collect();
    post(&gw.api, &events).await?;
    Ok((gw, rx))
}

async fn a_dead_head_lets_its_key_go_on_by_default(b: Backend) -> anyhow::Result<()> {
    let (gw, rx) = dead_head(b, json!({})).await?;
    let got = rx.wait_for(3, Duration::from_secs(20)).await?;
    let ids: Vec<&str> = got.iter().map(|r| r.header("webhook-id").unwrap()).collect();
    assert_eq!(ids, ["evt_0", "evt_1", "evt_2"]);
    let dead = gw.api.get("/v1/tenants/acme/dead-letters", ADMIN_TOKEN).await?;
    assert_eq!(dead.json["data"].as_array().unwrap().len(), 1, "{}", dead.text);
    let ep = gw.api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?;
    assert_eq!(ep.json["data"][0]["ordering_on_dead"], "skip", "{}", ep.text);
    Ok(())
}

async fn a_dead_head_blocks_its_key_until_replayed(b: Backend) -> anyhow::Result<()> {
    let (gw, rx) = dead_head(b, json!({"ordering_on_dead": "block"})).await?;
    rx.wait_for(1, Duration::from_secs(20)).await?;
    // Another key of the same endpoint is not held.
    post(&gw.api, &[json!({"id": "other", "type": "t", "ordering_key": "cus_2", "payload": {"key": 2, "n": 0}})])
        .await?;
    rx.wait_for(2, Duration::from_secs(20)).await?;
    rx.stays_at(2, Duration::from_secs(2)).await?;
    let r = gw.api.post("/v1/tenants/acme/replays", ADMIN_TOKEN, json!({"filter": {}, "rate_per_sec": 10})).await?;
    r.expect(202)?;
    let got = rx.wait_for(5, Duration::from_secs(20)).await?;
    let ids: Vec<&str> = got.iter().map(|r| r.header("webhook-id").unwrap()).collect();
    assert_eq!(ids, ["evt_0", "other", "evt_0", "evt_1", "evt_2"], "the replayed head first, then its key in order");
    Ok(())
}

/// A SIGKILL mid-run loses nothing and sends nothing out of order: what the node had in
/// flight may arrive twice, never after a later number of its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_mid_run_keeps_every_key_in_order() -> anyhow::Result<()> {
    let bin = herald_binary()?;
    let dir = tempfile::tempdir()?;
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(200).delay(Duration::from_millis(5)));
    rx.fail_at_random(0.1, Answer::status(503));
    let mut node = HeraldProcess::start(&bin, dir.path(), &[]).await?;
    node.api.tenant("acme").await?;
    node.api.endpoint("acme", ordered(&rx, "key", json!({}))).await?;
    let per_key = 100;
    post(&node.api, &interleaved(per_key)).await?;
    rx.wait_for(200, Duration::from_secs(30)).await?;
    node.kill();
    let node = HeraldProcess::start(&bin, dir.path(), &[]).await?;
    let total = KEYS * per_key;
    node.api
        .wait_for("/v1/tenants/acme/deliveries?state=delivered&limit=1000", Duration::from_secs(120), |v| {
            v["data"].as_array().is_some_and(|d| d.len() == total)
        })
        .await?;
    let delivered = assert_in_order(&rx.received(), true);
    assert!(delivered.values().all(|&n| n == per_key as u64), "{delivered:?}");
    Ok(())
}

/// Two nodes on one Postgres schema, events of every key posted to both at once: each key
/// still arrives in order, one delivery at a time, whichever node paces the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_postgres_nodes_keep_every_key_in_order() -> anyhow::Result<()> {
    let bin = herald_binary()?;
    let schema = tests::pg::PgSchema::create().await?;
    let env = [("HERALD_STORE_URL", schema.url.as_str())];
    let (a_dir, b_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let a = HeraldProcess::start(&bin, a_dir.path(), &env).await?;
    let b = HeraldProcess::start(&bin, b_dir.path(), &env).await?;
    let rx = FakeReceiver::start().await?;
    rx.fail_at_random(0.2, Answer::status(503));
    a.api.tenant("acme").await?;
    a.api.endpoint("acme", ordered(&rx, "key", json!({}))).await?;
    let per_key = 50;
    let events = interleaved(per_key);
    // Intake order is the order of the 202s: each batch is acknowledged before the next
    // one is posted, alternating between the nodes.
    for (n, chunk) in events.chunks(20).enumerate() {
        let api = if n % 2 == 0 { &a.api } else { &b.api };
        api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, json!({"events": chunk})).await?.expect(202)?;
    }
    tests::eventually("every event delivered", Duration::from_secs(120), || async {
        let ok = rx.received().iter().filter(|r| r.status == 200).count();
        Ok(if ok >= events.len() { Ok(()) } else { Err(format!("{ok} of {} delivered", events.len())) })
    })
    .await?;
    let delivered = assert_in_order(&rx.received(), false);
    assert!(delivered.values().all(|&n| n == per_key as u64), "{delivered:?}");
    drop((a, b));
    Ok(())
}

/// A bad `ordering`, `ordering_on_dead` or `ordering_key` is a 400 naming the field, and
/// nothing is stored.
#[tokio::test]
async fn bad_ordering_input_is_refused_naming_the_field() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let rx = FakeReceiver::start().await?;
    gw.api.tenant("acme").await?;
    for (field, value) in
        [("ordering", json!("sideways")), ("ordering_on_dead", json!("retry")), ("ordering", json!(1))]
    {
        let r = gw.api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, json!({"url": rx.url(), field: value})).await?;
        // A value of the wrong shape is a bad request, as for every field of the body.
        assert_eq!(r.status, 400, "{field}: {}", r.text);
        assert!(r.text.contains(field), "{field}: {}", r.text);
    }
    let listed = gw.api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?;
    assert_eq!(listed.json["data"].as_array().unwrap().len(), 0, "{}", listed.text);
    gw.api.endpoint("acme", ordered(&rx, "key", json!({}))).await?;
    for key in [json!(""), json!("with space"), json!("k".repeat(257)), json!(7)] {
        let r = gw
            .api
            .post("/v1/tenants/acme/events", ADMIN_TOKEN, json!({"type": "t", "payload": {}, "ordering_key": key}))
            .await?;
        // As for an event's `type`: intake refuses it as a bad request.
        assert_eq!(r.status, 400, "{key}: {}", r.text);
        assert!(r.text.contains("ordering_key"), "{key}: {}", r.text);
    }
    rx.stays_at(0, Duration::from_millis(300)).await?;
    Ok(())
}

/// One key's head failing for good (503, retried) holds that key alone: every other key is
/// delivered whole, in order, while the failing head is still being retried and nothing
/// behind it has gone out.
async fn a_retrying_head_holds_only_its_own_key(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    rx.answer_when(|body| {
        let v: Value = serde_json::from_slice(body).ok()?;
        (v["data"]["key"] == 0).then(|| Answer::status(503))
    });
    gw.api.tenant("acme").await?;
    gw.api
        .endpoint(
            "acme",
            ordered(
                &rx,
                "key",
                json!({"retry": {"base": "50ms", "factor": 1, "jitter": "none", "max_attempts": 1000}}),
            ),
        )
        .await?;
    let per_key = 30;
    post(&gw.api, &interleaved(per_key)).await?;
    let others = (KEYS - 1) * per_key;
    tests::eventually("the other keys delivered", Duration::from_secs(60), || async {
        let ok = rx.received().iter().filter(|r| r.status == 200).count();
        Ok(if ok >= others { Ok(()) } else { Err(format!("{ok} of {others} delivered")) })
    })
    .await?;
    let got = rx.received();
    let stuck: Vec<u64> = got
        .iter()
        .map(|r| r.json())
        .filter(|v| v["data"]["key"] == 0)
        .map(|v| v["data"]["n"].as_u64().unwrap())
        .collect();
    assert!(stuck.len() >= 2 && stuck.iter().all(|&n| n == 0), "only key 0's head, retried: {stuck:?}");
    let delivered = assert_in_order(&got, false);
    assert!((1..KEYS as u64).all(|k| delivered.get(&k) == Some(&(per_key as u64))), "{delivered:?}");
    Ok(())
}
