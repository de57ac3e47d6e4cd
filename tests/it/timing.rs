//! The engine's timing rules in paused time: a node runs in this test's runtime with
//! `tokio::time::pause()`, so its clock (`gateway::clock::Clock`) and timers move only when
//! the test advances them, and hours of backoff, pauses and lingering take milliseconds.
//!
//! A paused runtime advances by itself whenever it is idle, including while the node waits
//! for real I/O (the SQLite writer thread, sockets); [`hold_time`] keeps it busy so time
//! moves only by `advance`. Waits are bounded by real time ([`real`]), because a paused
//! timer never fires by itself.

use std::future::Future;
use std::time::{Duration, SystemTime};

use anyhow::bail;
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, Api, FakeReceiver, TestGateway};

/// Real time any one step may take before the test fails.
const STEP: Duration = Duration::from_secs(10);

/// Keeps the runtime from idling, so its paused clock moves only when the test advances it.
fn hold_time() -> tokio::task::JoinHandle<()> {
    tokio::spawn(async {
        loop {
            tokio::task::yield_now().await;
        }
    })
}

/// Runs `fut` for at most [`STEP`] of real time.
async fn real<T>(what: &str, fut: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        std::thread::sleep(STEP);
        let _ = tx.send(());
    });
    tokio::select! {
        v = fut => v,
        _ = rx => bail!("{what}: not within {STEP:?} of real time"),
    }
}

/// Polls `GET path` until `done` holds (bounded by real time). A failed request is tried
/// again: the node closes idle keep-alive connections when time jumps past their deadline.
async fn until(api: &Api, path: &str, done: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
    real(path, async {
        loop {
            if let Ok(r) = api.get(path, ADMIN_TOKEN).await
                && r.status == 200
                && done(&r.json)
            {
                return Ok(r.json);
            }
            tokio::task::yield_now().await;
        }
    })
    .await
}

async fn read(api: &Api, path: &str) -> anyhow::Result<Value> {
    until(api, path, |_| true).await
}

async fn arrivals(rx: &FakeReceiver, n: usize) -> anyhow::Result<()> {
    real(&format!("arrival {n}"), async { rx.wait_for(n, Duration::from_secs(86_400)).await.map(drop) })
        .await
        .map_err(|e| e.context(format!("{} arrived", rx.count())))
}

fn ms(v: &Value) -> i64 {
    let t = humantime::parse_rfc3339(v.as_str().expect("a timestamp")).expect("RFC 3339");
    t.duration_since(SystemTime::UNIX_EPOCH).expect("after the epoch").as_millis() as i64
}

/// A node with tenant `acme`, one endpoint (`spec` added to its URL) and one event posted;
/// returns the node, the endpoint id and the first delivery's path.
async fn setup(rx: &FakeReceiver, env: &[(&str, &str)], spec: Value) -> anyhow::Result<(TestGateway, String, String)> {
    let gw = TestGateway::start_with(env).await?;
    gw.api.tenant("acme").await?;
    let mut body = json!({"url": rx.url()});
    body.as_object_mut().expect("object").extend(spec.as_object().expect("object").clone());
    let ep = gw.api.endpoint("acme", body).await?;
    let r = gw.api.event("acme", json!({"id": "evt_1", "type": "a.b", "payload": {}})).await?;
    anyhow::ensure!(r.status == 202, "{}", r.text);
    let list = gw.api.get("/v1/tenants/acme/events/evt_1/deliveries", ADMIN_TOKEN).await?;
    let delivery = list.json["data"][0]["id"].as_str().expect("a delivery").to_string();
    Ok((gw, ep["id"].as_str().expect("id").to_string(), format!("/v1/tenants/acme/deliveries/{delivery}")))
}

/// Attempt `n` (1-based) is recorded: the delivery as read then.
async fn attempted(api: &Api, delivery: &str, n: usize) -> anyhow::Result<Value> {
    until(api, delivery, |d| d["attempts"].as_u64().is_some_and(|a| a >= n as u64) && d["state"] != "delivering").await
}

/// Each retry comes exactly when the backoff schedule says (base 30 s × 2, no jitter), and
/// not before.
#[tokio::test(start_paused = true)]
async fn retries_follow_the_backoff_schedule() -> anyhow::Result<()> {
    let _time = hold_time();
    let rx = FakeReceiver::start().await?;
    rx.script([Answer::status(500), Answer::status(500)]);
    let retry = json!({"retry": {"base": "30s", "factor": 2, "jitter": "none", "max_attempts": 5}});
    let (gw, _, delivery) = setup(&rx, &[], retry).await?;
    for (n, delay) in [(1, 30_000), (2, 60_000)] {
        arrivals(&rx, n).await?;
        let d = attempted(&gw.api, &delivery, n).await?;
        let started = ms(&d["attempt_history"][n - 1]["started_at"]);
        assert_eq!(ms(&d["next_attempt_at"]) - started, delay, "retry {n} is due after {delay} ms: {d}");
        tokio::time::advance(Duration::from_millis(delay as u64)).await;
        let d = attempted(&gw.api, &delivery, n + 1).await?;
        let next = ms(&d["attempt_history"][n]["started_at"]);
        assert_eq!(next - started, delay, "attempt {} came when due: {d}", n + 1);
    }
    until(&gw.api, &delivery, |d| d["state"] == "delivered").await?;
    Ok(())
}

/// A delivery whose next retry would fall past its event's `ttl` (25 min here, retries every
/// 10 min) becomes a dead letter (`expired`) when the attempt that cannot be followed fails,
/// at 20 min: not earlier, and without waiting for a retry it would never send.
#[tokio::test(start_paused = true)]
async fn a_retry_past_the_ttl_is_not_scheduled_and_the_delivery_expires() -> anyhow::Result<()> {
    let _time = hold_time();
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(503));
    let retry = json!({"retry": {"base": "10m", "factor": 1, "jitter": "none", "max_attempts": 50, "ttl": "25m"}});
    let (gw, _, delivery) = setup(&rx, &[], retry).await?;
    for n in 1..=2 {
        let d = attempted(&gw.api, &delivery, n).await?;
        assert_ne!(d["state"], "dead", "attempt {n} at {} min leaves a retry within the ttl: {d}", (n - 1) * 10);
        let started = ms(&d["attempt_history"][n - 1]["started_at"]);
        assert_eq!(ms(&d["next_attempt_at"]) - started, 600_000, "{d}");
        tokio::time::advance(Duration::from_secs(600)).await;
    }
    let d = attempted(&gw.api, &delivery, 3).await?;
    assert_eq!((&d["state"], &d["reason"]), (&json!("dead"), &json!("expired")), "{d}");
    let first = ms(&d["attempt_history"][0]["started_at"]);
    assert_eq!(ms(&d["attempt_history"][2]["started_at"]) - first, 1_200_000, "{d}");
    assert_eq!(rx.count(), 3, "no attempt past the ttl");
    Ok(())
}

/// An endpoint whose first delivery got a 429 with `Retry-After: retry_after` seconds, and
/// two more events posted behind it: the node, the endpoint's id, and when the 429 came.
async fn limited_by_a_429(rx: &FakeReceiver, retry_after: u64) -> anyhow::Result<(TestGateway, String, i64)> {
    rx.script([Answer::status(429).header("retry-after", &retry_after.to_string())]);
    let (gw, id, delivery) = setup(rx, &[], json!({"rate_per_sec": 100, "max_in_flight": 1})).await?;
    let d = attempted(&gw.api, &delivery, 1).await?;
    let limited = ms(&d["attempt_history"][0]["started_at"]);
    let ep = until(&gw.api, &format!("/v1/tenants/acme/endpoints/{id}"), |e| e["state"] == "paused").await?;
    assert_eq!(ms(&ep["paused_until"]) - limited, retry_after as i64 * 1000, "{ep}");
    for i in 2..=3 {
        let r = gw.api.event("acme", json!({"id": format!("evt_{i}"), "type": "a.b", "payload": {}})).await?;
        anyhow::ensure!(r.status == 202, "{}", r.text);
    }
    Ok((gw, id, limited))
}

/// When each of acme's deliveries made its last attempt, once all are delivered.
async fn last_attempts(api: &Api) -> anyhow::Result<Vec<(Value, i64)>> {
    let all = read(api, "/v1/tenants/acme/deliveries?limit=10").await?;
    let mut out = Vec::new();
    for d in all["data"].as_array().expect("deliveries") {
        let path = format!("/v1/tenants/acme/deliveries/{}", d["id"].as_str().expect("id"));
        let d = until(api, &path, |d| d["state"] == "delivered").await?;
        let last = ms(&d["attempt_history"].as_array().and_then(|a| a.last()).expect("an attempt")["started_at"]);
        out.push((d, last));
    }
    Ok(out)
}

/// A 429 with `Retry-After: 120` pauses the whole endpoint: the other deliveries wait for
/// the pause to end, then go at the paced rate.
#[tokio::test(start_paused = true)]
async fn a_429_pauses_the_whole_endpoint_for_its_retry_after() -> anyhow::Result<()> {
    let _time = hold_time();
    let rx = FakeReceiver::start().await?;
    let (gw, _, limited) = limited_by_a_429(&rx, 120).await?;
    tokio::time::advance(Duration::from_secs(120)).await;
    arrivals(&rx, 4).await?;
    for (d, last) in last_attempts(&gw.api).await? {
        assert!(last >= limited + 120_000, "sent during the pause: {d}");
    }
    Ok(())
}

/// Re-enabling an endpoint a 429 paused for an hour lifts the pause: the 429'd delivery and
/// those that waited behind it go out at once, without the hour passing.
#[tokio::test(start_paused = true)]
async fn re_enabling_an_endpoint_a_429_paused_sends_what_waited_at_once() -> anyhow::Result<()> {
    let _time = hold_time();
    let rx = FakeReceiver::start().await?;
    let (gw, id, limited) = limited_by_a_429(&rx, 3600).await?;
    let r = gw.api.post(&format!("/v1/tenants/acme/endpoints/{id}/enable"), ADMIN_TOKEN, json!({})).await?;
    anyhow::ensure!(r.status == 200 && r.json["state"] == "active", "{}", r.text);
    arrivals(&rx, 4).await?;
    for (d, last) in last_attempts(&gw.api).await? {
        assert!(last < limited + 3_600_000, "waited out the lifted pause: {d}");
    }
    Ok(())
}

/// An endpoint failing for `disable_after` (1 h here) is disabled by the first failure at
/// or past the hour, not before; its delivery becomes a dead letter.
#[tokio::test(start_paused = true)]
async fn an_endpoint_failing_for_disable_after_is_disabled() -> anyhow::Result<()> {
    let _time = hold_time();
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(500));
    let retry = json!({"retry": {"base": "10m", "factor": 1, "jitter": "none", "max_attempts": 20}});
    let (gw, id, delivery) = setup(&rx, &[("HERALD_DELIVERY_DISABLE_AFTER", "1h")], retry).await?;
    let endpoint = format!("/v1/tenants/acme/endpoints/{id}");
    for n in 1..=6 {
        attempted(&gw.api, &delivery, n).await?;
        let ep = read(&gw.api, &endpoint).await?;
        assert_eq!(ep["state"], "active", "failing for {} min: {ep}", (n - 1) * 10);
        tokio::time::advance(Duration::from_secs(600)).await;
    }
    let d = attempted(&gw.api, &delivery, 7).await?;
    assert_eq!((&d["state"], &d["reason"]), (&json!("dead"), &json!("endpoint_disabled")), "{d}");
    let ep = read(&gw.api, &endpoint).await?;
    assert_eq!(ep["state"], "disabled", "failing for 60 min: {ep}");
    Ok(())
}

/// An HTTP-date `Retry-After` is read against the engine's clock, not the wall's: an hour
/// into the node's (paused) time, a date two minutes past that hour pauses for two minutes.
#[tokio::test(start_paused = true)]
async fn an_http_date_retry_after_is_read_on_the_engines_clock() -> anyhow::Result<()> {
    let _time = hold_time();
    let rx = FakeReceiver::start().await?;
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    let ep = gw.api.endpoint("acme", json!({"url": rx.url(), "max_in_flight": 1})).await?;
    tokio::time::advance(Duration::from_secs(3600)).await;
    let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600 + 120));
    rx.script([Answer::status(429).header("retry-after", &date)]);
    // The hour closed the client's idle connection; the post is idempotent by its id.
    let event = json!({"id": "evt_1", "type": "a.b", "payload": {}});
    let posted = match gw.api.event("acme", event.clone()).await {
        Ok(r) => r,
        Err(_) => gw.api.event("acme", event).await?,
    };
    posted.expect(202)?;
    let list = read(&gw.api, "/v1/tenants/acme/events/evt_1/deliveries").await?;
    let delivery = format!("/v1/tenants/acme/deliveries/{}", list["data"][0]["id"].as_str().expect("id"));
    let d = attempted(&gw.api, &delivery, 1).await?;
    let limited = ms(&d["attempt_history"][0]["started_at"]);
    let path = format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().expect("id"));
    let ep = until(&gw.api, &path, |e| e["state"] == "paused").await?;
    // The date has whole seconds, and some real milliseconds passed since it was written.
    let paused = ms(&ep["paused_until"]) - limited;
    assert!((118_000..=121_000).contains(&paused), "paused for {paused} ms, not about 120 s: {ep}");
    Ok(())
}

/// A replay sends at its rate on the engine's clock: at 2/s, its dead letters go out 500 ms
/// apart, and only as time passes.
#[tokio::test(start_paused = true)]
async fn a_replay_sends_at_its_rate_on_the_engines_clock() -> anyhow::Result<()> {
    const N: usize = 4;
    let _time = hold_time();
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(422));
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    gw.api.endpoint("acme", json!({"url": rx.url(), "rate_per_sec": 1000, "burst": 100})).await?;
    for i in 0..N {
        gw.api.event("acme", json!({"id": format!("evt_{i}"), "type": "a.b", "payload": {}})).await?.expect(202)?;
    }
    until(&gw.api, "/v1/tenants/acme/dead-letters", |v| v["data"].as_array().is_some_and(|d| d.len() == N)).await?;
    rx.set_default(Answer::status(200));
    let body = json!({"filter": {}, "rate_per_sec": 2, "batch": 1});
    let replay = gw.api.post("/v1/tenants/acme/replays", ADMIN_TOKEN, body).await?.expect(202)?;
    let replay = format!("/v1/tenants/acme/replays/{}", replay.json["id"].as_str().expect("id"));
    for k in 1..=N {
        arrivals(&rx, N + k).await?;
        // An attempt's result rides the next commit within 10 ms (of paused time here); the
        // replay sends its next one only once this one is recorded.
        tokio::time::advance(Duration::from_millis(10)).await;
        until(&gw.api, &replay, |r| r["delivered"].as_u64() == Some(k as u64)).await?;
        tokio::time::advance(Duration::from_millis(490)).await;
    }
    let mut sent = Vec::new();
    for i in 0..N {
        let list = read(&gw.api, &format!("/v1/tenants/acme/events/evt_{i}/deliveries")).await?;
        let path = format!("/v1/tenants/acme/deliveries/{}", list["data"][0]["id"].as_str().expect("id"));
        let d = until(&gw.api, &path, |d| d["state"] == "delivered").await?;
        sent.push(ms(&d["attempt_history"][1]["started_at"]));
    }
    sent.sort_unstable();
    let gaps: Vec<i64> = sent.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|g| (490..=600).contains(g)), "replayed {gaps:?} ms apart, not 500");
    Ok(())
}

/// An idle partition lingers for 10 s (new work within that reuses it), then retires.
#[tokio::test(start_paused = true)]
async fn an_idle_partition_retires_after_its_linger() -> anyhow::Result<()> {
    let _time = hold_time();
    let rx = FakeReceiver::start().await?;
    let (gw, _, delivery) = setup(&rx, &[], json!({})).await?;
    until(&gw.api, &delivery, |d| d["state"] == "delivered").await?;
    assert_eq!(partitions(&gw.api).await?, 1);
    tokio::time::advance(Duration::from_millis(9_900)).await;
    assert_eq!(partitions(&gw.api).await?, 1, "still lingering");
    tokio::time::advance(Duration::from_millis(100)).await;
    real("retirement", async {
        while partitions(&gw.api).await? != 0 {
            tokio::task::yield_now().await;
        }
        Ok(())
    })
    .await
}

/// The node's `herald_partitions` gauge.
async fn partitions(api: &Api) -> anyhow::Result<u64> {
    let r = real("metrics", async {
        loop {
            if let Ok(r) = api.get("/metrics", ADMIN_TOKEN).await {
                return Ok(r);
            }
        }
    })
    .await?;
    let line = r.text.lines().find(|l| l.starts_with("herald_partitions ")).expect("the gauge");
    Ok(line.rsplit(' ').next().expect("a value").parse()?)
}
