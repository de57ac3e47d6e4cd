//! Queue destinations against the real local brokers: Redis Streams and NATS JetStream
//! (the machine's shared servers for the steady runs; a server of the test's own, on a free
//! port, for whatever stops one). Every event arrives once per webhook id (duplicates at
//! most what was in flight), a broker restarted mid-run loses nothing, refused credentials
//! and a missing stream pause the endpoint, a SIGKILL of Herald loses nothing, and the pace
//! holds to ±1 %.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Api, Backend, HeraldProcess, TestGateway, backends, eventually, herald_binary};

const SHARED_REDIS: &str = "redis://127.0.0.1:6379";
const SHARED_NATS: &str = "nats://127.0.0.1:4222";

/// A name no earlier run used (the shared brokers keep what tests leave).
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}{}x{}", std::process::id(), nanos % 1_000_000_000_000)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A broker process of the test's own; killed when dropped, whatever happens.
struct OwnServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    command: fn(u16, &Path) -> Command,
}

impl OwnServer {
    fn start(command: fn(u16, &Path) -> Command) -> anyhow::Result<OwnServer> {
        let mut s = OwnServer { port: free_port()?, dir: tempfile::tempdir()?, child: None, command };
        s.start_again()?;
        Ok(s)
    }

    /// A Redis with an append-only file synced on every write, so a kill loses nothing it
    /// acknowledged; `requirepass` when `password` is set.
    fn redis(password: Option<&'static str>) -> anyhow::Result<OwnServer> {
        match password {
            None => Self::start(|port, dir| redis_command(port, dir, None)),
            Some(_) => Self::start(|port, dir| redis_command(port, dir, Some("right-password"))),
        }
    }

    /// A NATS server with JetStream stored in the test's directory.
    fn nats() -> anyhow::Result<OwnServer> {
        Self::start(|port, dir| {
            let mut c = Command::new("nats-server");
            c.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"]).arg(dir);
            c
        })
    }

    fn start_again(&mut self) -> anyhow::Result<()> {
        let child = (self.command)(self.port, self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start the broker")?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL: the broker gone at once, mid-publish.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    async fn wait_up(&self) -> anyhow::Result<()> {
        let addr = format!("127.0.0.1:{}", self.port);
        eventually("the broker listens", Duration::from_secs(20), || async {
            Ok(tokio::net::TcpStream::connect(&addr).await.map(|_| ()).map_err(|e| e.to_string()))
        })
        .await
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn redis_command(port: u16, dir: &Path, password: Option<&str>) -> Command {
    let mut c = Command::new("redis-server");
    c.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""]);
    c.args(["--appendonly", "yes", "--appendfsync", "always", "--dir"]).arg(dir);
    if let Some(p) = password {
        c.args(["--requirepass", p]);
    }
    c
}

/// Posts `total` events of type `order.paid` in batches; returns their ids.
async fn post_events(api: &Api, tenant: &str, total: usize) -> anyhow::Result<Vec<String>> {
    let ids: Vec<String> = (0..total).map(|i| format!("evt_{i}")).collect();
    let events: Vec<Value> =
        ids.iter().map(|id| json!({"id": id, "type": "order.paid", "payload": {"id": id}})).collect();
    for chunk in events.chunks(100) {
        let r = api.post(&format!("/v1/tenants/{tenant}/events/batch"), ADMIN_TOKEN, json!({"events": chunk})).await?;
        anyhow::ensure!(r.status == 202, "batch: {} {}", r.status, r.text);
    }
    Ok(ids)
}

// --- Redis Streams ---

async fn redis_conn(url: &str) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    Ok(redis::Client::open(url)?.get_multiplexed_async_connection().await?)
}

/// Every entry of `stream`: its id and fields.
async fn redis_entries(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
) -> anyhow::Result<Vec<redis::streams::StreamId>> {
    let reply: redis::streams::StreamRangeReply =
        redis::cmd("XRANGE").arg(stream).arg("-").arg("+").query_async(conn).await?;
    Ok(reply.ids)
}

/// Waits until `stream` holds every one of `ids` (as `webhook-id`); returns the entries.
async fn redis_all_arrive(
    url: &str,
    stream: &str,
    ids: &[String],
    within: Duration,
) -> anyhow::Result<Vec<redis::streams::StreamId>> {
    let conn = redis_conn(url).await?;
    eventually(&format!("{} entries in {stream}", ids.len()), within, || {
        let mut conn = conn.clone();
        async move {
            let entries = redis_entries(&mut conn, stream).await?;
            let seen = count_ids(entries.iter().filter_map(|e| e.get::<String>("webhook-id")));
            let missing = ids.iter().filter(|id| !seen.contains_key(*id)).count();
            Ok(if missing == 0 { Ok(entries) } else { Err(format!("{missing} missing of {}", ids.len())) })
        }
    })
    .await
}

/// Waits until a delivery of `tenant` failed an attempt and waits for its retry: the
/// broker's outage was met, not only scheduled.
async fn a_retry_waits(api: &Api, tenant: &str) -> anyhow::Result<()> {
    let path = format!("/v1/tenants/{tenant}/deliveries?state=waiting&limit=1");
    api.wait_for(&path, Duration::from_secs(30), |v| v["data"].as_array().is_some_and(|d| !d.is_empty()))
        .await
        .map(drop)
}

/// Waits until the endpoint is paused; returns its view and the reason.
async fn paused(api: &Api, tenant: &str, id: &str) -> anyhow::Result<(Value, String)> {
    let path = format!("/v1/tenants/{tenant}/endpoints/{id}");
    let got = api.wait_for(&path, Duration::from_secs(30), |v| v["state"] == "paused").await?;
    let reason = got["state_reason"].as_str().unwrap_or("").to_string();
    Ok((got, reason))
}

fn count_ids(ids: impl Iterator<Item = String>) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for id in ids {
        *seen.entry(id).or_insert(0) += 1;
    }
    seen
}

/// Each id arrived; the duplicates are at most what could be in flight.
fn assert_once_each(seen: &HashMap<String, usize>, ids: &[String], in_flight: usize) {
    let dups: usize = seen.values().map(|n| n - 1).sum();
    assert!(ids.iter().all(|id| seen.contains_key(id)), "every event arrived");
    assert_eq!(seen.len(), ids.len(), "nothing else arrived");
    assert!(dups <= in_flight, "{dups} duplicates, more than the {in_flight} in flight");
}

/// Creates a broker endpoint of `kind` at `url` sending to `destination` (a JSON object),
/// paced fast unless `extra` (top-level fields) says otherwise.
async fn broker_endpoint(
    api: &Api,
    tenant: &str,
    kind: &str,
    url: &str,
    destination: Value,
    extra: Value,
) -> anyhow::Result<Value> {
    let mut body = json!({
        "kind": kind, "url": url, "destination": destination,
        "rate_per_sec": 1000, "burst": 100, "max_in_flight": 16,
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        body[k] = v;
    }
    api.endpoint(tenant, body).await
}

async fn redis_endpoint(api: &Api, tenant: &str, url: &str, stream: &str, extra: Value) -> anyhow::Result<Value> {
    broker_endpoint(api, tenant, "redis-stream", url, json!({"stream": stream}), extra).await
}

async fn redis_stream_delivers_each_event_once(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let tenant = unique("r");
    gw.api.tenant(&tenant).await?;
    let prefix = unique("herald:test:");
    let ep =
        redis_endpoint(&gw.api, &tenant, SHARED_REDIS, &format!("{prefix}:{{tenant}}:{{type}}"), json!({})).await?;
    assert_eq!(ep["kind"], "redis-stream");
    let total = 2_000;
    let ids = post_events(&gw.api, &tenant, total).await?;
    let stream = format!("{prefix}:{tenant}:order.paid");
    let entries = redis_all_arrive(SHARED_REDIS, &stream, &ids, Duration::from_secs(120)).await?;
    let seen = count_ids(entries.iter().filter_map(|e| e.get::<String>("webhook-id")));
    assert_once_each(&seen, &ids, 16);
    // The same envelope and webhook headers as an HTTP delivery.
    let first = &entries[0];
    let body: Value = serde_json::from_slice(&first.get::<Vec<u8>>("body").context("body")?)?;
    assert_eq!(body["type"], "order.paid");
    assert!(first.get::<String>("webhook-timestamp").is_some());
    assert!(first.get::<String>("webhook-signature").is_some_and(|s| s.starts_with("v1,")));
    let mut conn = redis_conn(SHARED_REDIS).await?;
    let _: () = redis::cmd("DEL").arg(&stream).query_async(&mut conn).await?;
    Ok(())
}

async fn redis_maxlen_trims_the_stream(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let tenant = unique("m");
    gw.api.tenant(&tenant).await?;
    let stream = unique("herald:maxlen:");
    redis_endpoint(&gw.api, &tenant, SHARED_REDIS, &stream, json!({"destination": {"stream": stream, "maxlen": 100}}))
        .await?;
    post_events(&gw.api, &tenant, 1_000).await?;
    let mut conn = redis_conn(SHARED_REDIS).await?;
    gw.api
        .wait_for(
            &format!("/v1/tenants/{tenant}/deliveries?state=delivered&limit=1000"),
            Duration::from_secs(60),
            |v| v["data"].as_array().is_some_and(|d| d.len() == 1_000),
        )
        .await?;
    let len: usize = redis::cmd("XLEN").arg(&stream).query_async(&mut conn).await?;
    // `MAXLEN ~` trims whole radix-tree nodes (100 entries each by default).
    assert!((100..=300).contains(&len), "the stream kept {len} entries of 1,000 with maxlen ~100");
    let _: () = redis::cmd("DEL").arg(&stream).query_async(&mut conn).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_mid_run_loses_nothing() -> anyhow::Result<()> {
    let mut redis = OwnServer::redis(None)?;
    redis.wait_up().await?;
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let gw = TestGateway::start_with(&[
        ("HERALD_RETRY_BASE", "100ms"),
        ("HERALD_RETRY_CAP", "1s"),
        ("HERALD_RETRY_MAX_ATTEMPTS", "100"),
    ])
    .await?;
    gw.api.tenant("acme").await?;
    redis_endpoint(&gw.api, "acme", &url, "orders", json!({"rate_per_sec": 200})).await?;
    let ids = post_events(&gw.api, "acme", 1_000).await?;
    let mut conn = redis_conn(&url).await?;
    eventually("some entries", Duration::from_secs(30), || {
        let mut conn = conn.clone();
        async move {
            let n: usize = redis::cmd("XLEN").arg("orders").query_async(&mut conn).await?;
            Ok(if n >= 100 { Ok(()) } else { Err(format!("{n}")) })
        }
    })
    .await?;
    redis.kill();
    let at_kill = {
        // Down until an attempt has failed on it and waits for its retry.
        a_retry_waits(&gw.api, "acme").await?;
        redis.start_again()?;
        redis.wait_up().await?;
        conn = redis_conn(&url).await?;
        let n: usize = redis::cmd("XLEN").arg("orders").query_async(&mut conn).await?;
        n
    };
    assert!(at_kill < ids.len(), "the broker stopped mid-run ({at_kill} of {} in)", ids.len());
    let entries = redis_all_arrive(&url, "orders", &ids, Duration::from_secs(90)).await?;
    let seen = count_ids(entries.iter().filter_map(|e| e.get::<String>("webhook-id")));
    assert_once_each(&seen, &ids, 16);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_wrong_password_pauses_the_endpoint_and_is_never_shown() -> anyhow::Result<()> {
    let redis = OwnServer::redis(Some("right-password"))?;
    redis.wait_up().await?;
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    let extra = json!({"destination": {"stream": "s", "password": "wrong-password"}});
    let ep = redis_endpoint(&gw.api, "acme", &url, "s", extra).await?;
    assert_eq!(ep["destination"]["password_set"], true);
    assert!(!ep.to_string().contains("wrong-password"), "the password is never shown: {ep}");
    let id = ep["id"].as_str().context("id")?;
    post_events(&gw.api, "acme", 3).await?;
    let (got, reason) = paused(&gw.api, "acme", id).await?;
    assert!(reason.starts_with("broker:auth:"), "{reason}");
    assert!(!got.to_string().contains("wrong-password"));
    // The right password, and a re-enable: everything arrives.
    let path = format!("/v1/tenants/acme/endpoints/{id}");
    let patch = json!({"destination": {"password": "right-password"}});
    gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(patch)).await?.expect(200)?;
    gw.api.post(&format!("{path}/enable"), ADMIN_TOKEN, json!({})).await?.expect(200)?;
    let ids: Vec<String> = (0..3).map(|i| format!("evt_{i}")).collect();
    let authed = format!("redis://:right-password@127.0.0.1:{}", redis.port);
    redis_all_arrive(&authed, "s", &ids, Duration::from_secs(30)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sigkill_of_herald_mid_run_loses_nothing() -> anyhow::Result<()> {
    let bin = herald_binary()?;
    let dir = tempfile::tempdir()?;
    let env = [("HERALD_DELIVERY_MAX_IN_FLIGHT_TOTAL", "8")];
    let mut node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    let tenant = unique("k");
    node.api.tenant(&tenant).await?;
    let stream = unique("herald:kill:");
    redis_endpoint(&node.api, &tenant, SHARED_REDIS, &stream, json!({"rate_per_sec": 300, "max_in_flight": 8})).await?;
    let ids = post_events(&node.api, &tenant, 1_500).await?;
    let mut conn = redis_conn(SHARED_REDIS).await?;
    eventually("a third in", Duration::from_secs(30), || {
        let mut conn = conn.clone();
        let stream = stream.clone();
        async move {
            let n: usize = redis::cmd("XLEN").arg(&stream).query_async(&mut conn).await?;
            Ok(if n >= 500 { Ok(()) } else { Err(format!("{n}")) })
        }
    })
    .await?;
    node.kill();
    let at_kill: usize = redis::cmd("XLEN").arg(&stream).query_async(&mut conn).await?;
    assert!(at_kill < ids.len(), "the kill came mid-run ({at_kill} in)");
    let _node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    let entries = redis_all_arrive(SHARED_REDIS, &stream, &ids, Duration::from_secs(90)).await?;
    let seen = count_ids(entries.iter().filter_map(|e| e.get::<String>("webhook-id")));
    assert_once_each(&seen, &ids, 8);
    let _: () = redis::cmd("DEL").arg(&stream).query_async(&mut conn).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stream_keeps_the_pace() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let tenant = unique("p");
    gw.api.tenant(&tenant).await?;
    let stream = unique("herald:pace:");
    let (rate, burst, total) = (50.0, 5usize, 400usize);
    redis_endpoint(&gw.api, &tenant, SHARED_REDIS, &stream, json!({"rate_per_sec": rate, "burst": burst})).await?;
    let ids = post_events(&gw.api, &tenant, total).await?;
    let entries = redis_all_arrive(SHARED_REDIS, &stream, &ids, Duration::from_secs(60)).await?;
    // The entry ids are Redis's own milliseconds of each XADD.
    let at = entries.iter().map(|e| e.id.split('-').next().unwrap().parse::<f64>().unwrap() / 1000.0);
    assert_pace("redis-stream", at.collect(), rate, burst);
    let mut conn = redis_conn(SHARED_REDIS).await?;
    let _: () = redis::cmd("DEL").arg(&stream).query_async(&mut conn).await?;
    Ok(())
}

/// The pace of arrivals at the broker (its own clock, in seconds): after the first `burst`
/// (which may leave at once) every message waits for its slot, so it is measured from the
/// `burst`-th on, and must be `rate` ± 1 %.
fn assert_pace(kind: &str, mut at: Vec<f64>, rate: f64, burst: usize) {
    at.sort_by(f64::total_cmp);
    let n = at.len();
    let paced = (n - burst) as f64 / (at[n - 1] - at[burst - 1]);
    eprintln!("{kind} pace {paced:.3}/s for {rate}/s");
    assert!((paced - rate).abs() <= rate * 0.01, "{kind}: sent {paced:.3}/s, not {rate}/s ± 1 %");
}

// --- NATS JetStream ---

/// A JetStream stream taking `subjects`, created on the server at `url`.
async fn nats_stream(url: &str, name: &str, subjects: &str) -> anyhow::Result<async_nats::jetstream::stream::Stream> {
    let js = async_nats::jetstream::new(async_nats::connect(url).await?);
    let config = async_nats::jetstream::stream::Config {
        name: name.to_string(),
        subjects: vec![subjects.to_string()],
        ..Default::default()
    };
    Ok(js.get_or_create_stream(config).await?)
}

/// Waits until the stream holds `total` messages; returns each `Nats-Msg-Id`'s count.
async fn nats_all_arrive(
    stream: &mut async_nats::jetstream::stream::Stream,
    total: usize,
    within: Duration,
) -> anyhow::Result<HashMap<String, usize>> {
    eventually(&format!("{total} messages"), within, || {
        let mut s = stream.clone();
        async move {
            let n = s.info().await?.state.messages as usize;
            Ok(if n >= total { Ok(()) } else { Err(format!("{n}")) })
        }
    })
    .await?;
    let last = stream.info().await?.state.last_sequence;
    let mut ids = Vec::new();
    for seq in 1..=last {
        let m = stream.get_raw_message(seq).await?;
        ids.extend(m.headers.get("Nats-Msg-Id").map(|v| v.to_string()));
    }
    Ok(count_ids(ids.into_iter()))
}

async fn nats_endpoint(api: &Api, tenant: &str, url: &str, subject: &str, extra: Value) -> anyhow::Result<Value> {
    broker_endpoint(api, tenant, "nats", url, json!({"subject": subject}), extra).await
}

async fn nats_jetstream_delivers_each_event_once(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let tenant = unique("n");
    gw.api.tenant(&tenant).await?;
    let name = unique("HERALD_");
    let mut stream = nats_stream(SHARED_NATS, &name, &format!("{name}.>")).await?;
    nats_endpoint(&gw.api, &tenant, SHARED_NATS, &format!("{name}.{{tenant}}.{{type}}"), json!({})).await?;
    let total = 2_000;
    let ids = post_events(&gw.api, &tenant, total).await?;
    let seen = nats_all_arrive(&mut stream, total, Duration::from_secs(120)).await?;
    // JetStream dedupes on the webhook id: exactly once.
    assert_once_each(&seen, &ids, 0);
    let m = stream.get_raw_message(1).await?;
    assert_eq!(m.subject.as_str(), format!("{name}.{tenant}.order.paid"));
    assert!(m.headers.get("webhook-signature").is_some_and(|s| s.as_str().starts_with("v1,")));
    assert!(m.headers.get("webhook-timestamp").is_some());
    let body: Value = serde_json::from_slice(&m.payload)?;
    assert_eq!(body["type"], "order.paid");
    let js = async_nats::jetstream::new(async_nats::connect(SHARED_NATS).await?);
    js.delete_stream(&name).await?;
    Ok(())
}

backends!(
    redis_stream_delivers_each_event_once,
    redis_maxlen_trims_the_stream,
    nats_jetstream_delivers_each_event_once,
    amqp_delivers_each_event_once,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_keeps_the_pace() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let tenant = unique("q");
    gw.api.tenant(&tenant).await?;
    let name = unique("HERALD_PACE_");
    let mut stream = nats_stream(SHARED_NATS, &name, &format!("{name}.>")).await?;
    let (rate, burst, total) = (50.0, 5usize, 400usize);
    let extra = json!({"rate_per_sec": rate, "burst": burst});
    nats_endpoint(&gw.api, &tenant, SHARED_NATS, &format!("{name}.{{type}}"), extra).await?;
    post_events(&gw.api, &tenant, total).await?;
    nats_all_arrive(&mut stream, total, Duration::from_secs(60)).await?;
    // The stream's own time of each message.
    let mut at = Vec::with_capacity(total);
    for seq in 1..=total as u64 {
        at.push(stream.get_raw_message(seq).await?.time.unix_timestamp_nanos() as f64 / 1e9);
    }
    assert_pace("nats", at, rate, burst);
    let js = async_nats::jetstream::new(async_nats::connect(SHARED_NATS).await?);
    js.delete_stream(&name).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restarted_mid_run_loses_nothing() -> anyhow::Result<()> {
    let mut nats = OwnServer::nats()?;
    nats.wait_up().await?;
    let url = format!("nats://127.0.0.1:{}", nats.port);
    let mut stream = nats_stream(&url, "ORDERS", "orders.>").await?;
    let gw = TestGateway::start_with(&[
        ("HERALD_RETRY_BASE", "100ms"),
        ("HERALD_RETRY_CAP", "1s"),
        ("HERALD_RETRY_MAX_ATTEMPTS", "100"),
    ])
    .await?;
    gw.api.tenant("acme").await?;
    nats_endpoint(&gw.api, "acme", &url, "orders.{type}", json!({"rate_per_sec": 200})).await?;
    let ids = post_events(&gw.api, "acme", 1_000).await?;
    eventually("some messages", Duration::from_secs(30), || {
        let mut s = stream.clone();
        async move {
            let n = s.info().await?.state.messages;
            Ok(if n >= 100 { Ok(()) } else { Err(format!("{n}")) })
        }
    })
    .await?;
    nats.kill();
    a_retry_waits(&gw.api, "acme").await?;
    nats.start_again()?;
    nats.wait_up().await?;
    let js = async_nats::jetstream::new(async_nats::connect(&url).await?);
    stream = eventually("the stream is back", Duration::from_secs(20), || {
        let js = js.clone();
        async move { Ok(js.get_stream("ORDERS").await.map_err(|e| e.to_string())) }
    })
    .await?;
    let seen = nats_all_arrive(&mut stream, ids.len(), Duration::from_secs(90)).await?;
    assert_once_each(&seen, &ids, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_missing_stream_pauses_the_endpoint_with_the_reason() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let tenant = unique("x");
    gw.api.tenant(&tenant).await?;
    let ep = nats_endpoint(&gw.api, &tenant, SHARED_NATS, &unique("nostream."), json!({})).await?;
    let id = ep["id"].as_str().context("id")?;
    post_events(&gw.api, &tenant, 2).await?;
    let (_, reason) = paused(&gw.api, &tenant, id).await?;
    assert!(reason.starts_with("broker:missing:"), "{reason}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_wrong_token_pauses_the_endpoint() -> anyhow::Result<()> {
    let nats = OwnServer::start(|port, dir| {
        let mut c = Command::new("nats-server");
        c.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "--auth", "right-token", "-sd"]).arg(dir);
        c
    })?;
    nats.wait_up().await?;
    let url = format!("nats://127.0.0.1:{}", nats.port);
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    let extra = json!({"destination": {"subject": "orders", "token": "wrong-token"}});
    let ep = nats_endpoint(&gw.api, "acme", &url, "orders", extra).await?;
    assert_eq!(ep["destination"]["token_set"], true);
    assert!(!ep.to_string().contains("wrong-token"));
    let id = ep["id"].as_str().context("id")?;
    post_events(&gw.api, "acme", 2).await?;
    let (_, reason) = paused(&gw.api, "acme", id).await?;
    assert!(reason.starts_with("broker:auth:"), "{reason}");
    Ok(())
}

// --- AMQP ---

const SHARED_AMQP: &str = "amqp://127.0.0.1:5672/%2f";

/// A topic exchange and a queue bound to all of it, on the shared RabbitMQ.
async fn amqp_queue(exchange: &str) -> anyhow::Result<lapin::Channel> {
    use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    let conn = lapin::Connection::connect(SHARED_AMQP, lapin::ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    let auto_delete = ExchangeDeclareOptions { auto_delete: true, ..Default::default() };
    ch.exchange_declare(exchange.into(), lapin::ExchangeKind::Topic, auto_delete, FieldTable::default()).await?;
    let queue = QueueDeclareOptions { auto_delete: true, ..Default::default() };
    ch.queue_declare(exchange.into(), queue, FieldTable::default()).await?;
    ch.queue_bind(exchange.into(), exchange.into(), "#".into(), QueueBindOptions::default(), FieldTable::default())
        .await?;
    Ok(ch)
}

/// Waits until the queue holds `total` messages, then takes them all: each message id's count.
async fn amqp_all_arrive(ch: &lapin::Channel, queue: &str, total: usize) -> anyhow::Result<HashMap<String, usize>> {
    use lapin::options::{BasicGetOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    eventually(&format!("{total} messages"), Duration::from_secs(120), || async {
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        let q = ch.queue_declare(queue.into(), passive, FieldTable::default()).await?;
        let n = q.message_count() as usize;
        Ok(if n >= total { Ok(()) } else { Err(format!("{n}")) })
    })
    .await?;
    let mut ids = Vec::new();
    let auto_ack = BasicGetOptions { no_ack: true };
    while let Some(m) = ch.basic_get(queue.into(), auto_ack).await? {
        ids.extend(m.delivery.properties.message_id().as_ref().map(|id| id.to_string()));
    }
    Ok(count_ids(ids.into_iter()))
}

async fn amqp_delivers_each_event_once(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let tenant = unique("a");
    gw.api.tenant(&tenant).await?;
    let exchange = unique("herald.test.");
    let ch = amqp_queue(&exchange).await?;
    let dest = json!({"exchange": exchange, "routing_key": "{tenant}.{type}"});
    broker_endpoint(&gw.api, &tenant, "amqp", SHARED_AMQP, dest, json!({})).await?;
    let total = 2_000;
    let ids = post_events(&gw.api, &tenant, total).await?;
    let seen = amqp_all_arrive(&ch, &exchange, total).await?;
    assert_once_each(&seen, &ids, 16);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_missing_exchange_and_unroutable_messages_pause_the_endpoint() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let tenant = unique("y");
    gw.api.tenant(&tenant).await?;
    let missing = json!({"exchange": unique("herald.none."), "routing_key": "k"});
    let ep = broker_endpoint(&gw.api, &tenant, "amqp", SHARED_AMQP, missing, json!({})).await?;
    post_events(&gw.api, &tenant, 2).await?;
    let (_, reason) = paused(&gw.api, &tenant, ep["id"].as_str().context("id")?).await?;
    assert!(reason.starts_with("broker:missing:") && reason.contains("NOT_FOUND"), "{reason}");
    // The default exchange routes to a queue of the key's name: none here.
    let unroutable = json!({"exchange": "", "routing_key": unique("herald.noqueue.")});
    let tenant = unique("z");
    gw.api.tenant(&tenant).await?;
    let ep = broker_endpoint(&gw.api, &tenant, "amqp", SHARED_AMQP, unroutable, json!({})).await?;
    post_events(&gw.api, &tenant, 1).await?;
    let (_, reason) = paused(&gw.api, &tenant, ep["id"].as_str().context("id")?).await?;
    assert!(reason.starts_with("broker:missing: unroutable"), "{reason}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_wrong_password_pauses_the_endpoint() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    let dest = json!({"exchange": "amq.topic", "routing_key": "k", "username": "guest", "password": "wrong"});
    let ep = broker_endpoint(&gw.api, "acme", "amqp", SHARED_AMQP, dest, json!({})).await?;
    post_events(&gw.api, "acme", 1).await?;
    let (_, reason) = paused(&gw.api, "acme", ep["id"].as_str().context("id")?).await?;
    assert!(reason.starts_with("broker:auth:"), "{reason}");
    Ok(())
}

// --- Validation ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_settings_are_checked_field_by_field() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    let cases = [
        (json!({"kind": "redis-stream", "url": SHARED_REDIS}), "destination"),
        (json!({"kind": "redis-stream", "url": SHARED_REDIS, "destination": {}}), "destination.stream"),
        (json!({"kind": "nats", "url": SHARED_REDIS, "destination": {"subject": "a"}}), "url"),
        (json!({"kind": "nats", "url": SHARED_NATS, "destination": {"subject": "a.*"}}), "destination.subject"),
        (
            json!({"kind": "nats", "url": SHARED_NATS, "destination": {"subject": "a", "stream": "s"}}),
            "destination.stream",
        ),
        (json!({"kind": "redis-stream", "url": "redis://u:p@127.0.0.1", "destination": {"stream": "s"}}), "url"),
        (
            json!({"kind": "redis-stream", "url": SHARED_REDIS, "destination": {"stream": "{event}"}}),
            "destination.stream",
        ),
        (json!({"url": "http://127.0.0.1:9/h", "destination": {"stream": "s"}}), "destination"),
        // An unknown kind does not parse: a 400 that names it.
        (json!({"kind": "kafka", "url": SHARED_REDIS}), "kind"),
    ];
    for (body, field) in cases {
        let r = gw.api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, body.clone()).await?;
        let want = if field == "kind" { 400 } else { 422 };
        assert_eq!(r.status, want, "{body}: {}", r.text);
        assert!(r.text.contains(field), "{body}: {} does not name {field}", r.text);
    }
    Ok(())
}
