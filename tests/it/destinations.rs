//! Queue destinations against the real local brokers: Redis Streams, NATS JetStream and
//! RabbitMQ (the machine's shared servers for the steady runs; a server of the test's own,
//! on a free port, for whatever stops one). Every event arrives once per webhook id
//! (duplicates at most what was in flight) and is counted by kind in `/metrics`, a broker
//! restarted mid-run loses nothing, refused credentials and a missing stream pause the
//! endpoint, a SIGKILL of Herald loses nothing, the pace holds to ±1 %, credentials are
//! sealed at rest and never printed, the SSRF guard covers broker hosts, and every message
//! carries the producer's trace.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use tests::{
    ADMIN_TOKEN, Api, Backend, HeraldProcess, SEAL_KEY, TestGateway, backends, done_or, eventually, herald_binary,
};

mod batch;

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

/// A broker process of the test's own, leading a process group of its own; the group is
/// killed when dropped, whatever happens.
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

    /// A RabbitMQ node of the test's own, never the machine's shared one on 5672: its AMQP
    /// port, node name, distribution port, data, logs, config, plugins and Erlang cookie (a
    /// `HOME` of its own) all its own. The server script is run as it is installed for the
    /// service user: `rabbitmq-server` on the `PATH` switches to that user, who cannot write
    /// the test's directory.
    fn rabbitmq() -> anyhow::Result<OwnServer> {
        Self::start(|port, dir| {
            for sub in ["mnesia", "log"] {
                std::fs::create_dir_all(dir.join(sub)).expect("the node's directories");
            }
            let conf = dir.join("rabbitmq.conf");
            std::fs::write(&conf, format!("listeners.tcp.local = 127.0.0.1:{port}\n")).expect("rabbitmq.conf");
            std::fs::write(dir.join("enabled_plugins"), "[].\n").expect("enabled_plugins");
            std::fs::write(dir.join("rabbitmq-env.conf"), "").expect("rabbitmq-env.conf");
            let dist = free_port().expect("a distribution port");
            let mut c = Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server");
            c.current_dir(dir)
                .env("HOME", dir)
                .env("RABBITMQ_CONF_ENV_FILE", dir.join("rabbitmq-env.conf"))
                .env("RABBITMQ_CONFIG_FILE", &conf)
                .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
                .env("RABBITMQ_NODENAME", format!("herald-test-{port}@localhost"))
                .env("RABBITMQ_NODE_PORT", port.to_string())
                .env("RABBITMQ_DIST_PORT", dist.to_string())
                .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
                .env("RABBITMQ_LOG_BASE", dir.join("log"))
                .env("RABBITMQ_PID_FILE", dir.join("rabbitmq.pid"))
                .env("ERL_EPMD_ADDRESS", "127.0.0.1");
            c
        })
    }

    fn start_again(&mut self) -> anyhow::Result<()> {
        let child = (self.command)(self.port, self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("start the broker")?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL to the whole group: the broker gone at once, mid-publish, with whatever it
    /// started (RabbitMQ's script runs the Erlang VM as its child).
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let group = format!("-{}", c.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Until the broker accepts connections (a RabbitMQ node boots in several seconds).
    async fn wait_up(&self) -> anyhow::Result<()> {
        let addr = format!("127.0.0.1:{}", self.port);
        eventually("the broker listens", Duration::from_secs(60), || async {
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

/// Every entry of `stream`: its id and fields, read a page at a time (a reply of 10,000
/// entries at once outlasts the client's response deadline).
async fn redis_entries(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
) -> anyhow::Result<Vec<redis::streams::StreamId>> {
    const PAGE: usize = 1_000;
    let mut all = Vec::new();
    let mut from = "-".to_string();
    loop {
        let reply: redis::streams::StreamRangeReply =
            redis::cmd("XRANGE").arg(stream).arg(&from).arg("+").arg("COUNT").arg(PAGE).query_async(conn).await?;
        let n = reply.ids.len();
        if let Some(last) = reply.ids.last() {
            from = format!("({}", last.id);
        }
        all.extend(reply.ids);
        if n < PAGE {
            return Ok(all);
        }
    }
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
            let n: usize = redis::cmd("XLEN").arg(stream).query_async(&mut conn).await?;
            if n < ids.len() {
                return Ok(Err(format!("{n} of {} in", ids.len())));
            }
            let entries = redis_entries(&mut conn, stream).await?;
            let seen = count_ids(entries.iter().filter_map(|e| e.get::<String>("webhook-id")));
            let missing = ids.iter().filter(|id| !seen.contains_key(*id)).count();
            Ok(if missing == 0 { Ok(entries) } else { Err(format!("{missing} missing of {}", ids.len())) })
        }
    })
    .await
}

/// Retries soon and for long: a broker's outage is waited out, not dead-lettered.
const FAST_RETRIES: [(&str, &str); 3] =
    [("HERALD_RETRY_BASE", "100ms"), ("HERALD_RETRY_CAP", "1s"), ("HERALD_RETRY_MAX_ATTEMPTS", "100")];

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

/// `/metrics` counts `n` deliveries of `tenant` to destinations of `kind`.
async fn counted_by_kind(api: &Api, tenant: &str, kind: &str, n: usize) -> anyhow::Result<()> {
    let line =
        format!("herald_delivery_outcomes_total{{tenant=\"{tenant}\",kind=\"{kind}\",outcome=\"delivered\"}} {n}");
    eventually(&line, Duration::from_secs(10), || async {
        let text = api.raw("GET", "/metrics", None, "").await?.text;
        let ours: Vec<&str> = text.lines().filter(|l| l.contains(&format!("tenant=\"{tenant}\""))).collect();
        done_or(text.lines().any(|l| l == line), format!("{ours:?}"))
    })
    .await
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
    let total = 10_000;
    let ids = post_events(&gw.api, &tenant, total).await?;
    let stream = format!("{prefix}:{tenant}:order.paid");
    let entries = redis_all_arrive(SHARED_REDIS, &stream, &ids, Duration::from_secs(120)).await?;
    let seen = count_ids(entries.iter().filter_map(|e| e.get::<String>("webhook-id")));
    assert_once_each(&seen, &ids, 16);
    counted_by_kind(&gw.api, &tenant, "redis-stream", total).await?;
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
    let gw = TestGateway::start_with(&FAST_RETRIES).await?;
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
    let gw = TestGateway::start_with(&[("HERALD_SECRETS_KEY", SEAL_KEY)]).await?;
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

/// Waits until the stream holds `total` messages; returns each `webhook-id`'s count.
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
        ids.extend(m.headers.get("webhook-id").map(|v| v.to_string()));
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
    let total = 10_000;
    let ids = post_events(&gw.api, &tenant, total).await?;
    let seen = nats_all_arrive(&mut stream, total, Duration::from_secs(120)).await?;
    // JetStream dedupes a delivery's retries on its id: exactly once.
    assert_once_each(&seen, &ids, 0);
    counted_by_kind(&gw.api, &tenant, "nats", total).await?;
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
    let gw = TestGateway::start_with(&FAST_RETRIES).await?;
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
    let gw = TestGateway::start_with(&[("HERALD_SECRETS_KEY", SEAL_KEY)]).await?;
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

/// Posts event `evt_1` (`order.paid`) to `tenant`.
async fn post_evt_1(api: &Api, tenant: &str) -> anyhow::Result<()> {
    api.event(tenant, json!({"id": "evt_1", "type": "order.paid", "payload": {}})).await?.expect(202).map(drop)
}

/// Waits until each of `tenant`'s deliveries of `event` is delivered; returns the response
/// each one's attempts recorded.
async fn delivered(api: &Api, tenant: &str, event: &str, deliveries: usize) -> anyhow::Result<Vec<String>> {
    let path = format!("/v1/tenants/{tenant}/events/{event}/deliveries");
    let list = api
        .wait_for(&path, Duration::from_secs(30), |v| {
            v["data"].as_array().is_some_and(|d| d.len() == deliveries && d.iter().all(|d| d["state"] == "delivered"))
        })
        .await?;
    let mut answers = Vec::new();
    for d in list["data"].as_array().context("data")? {
        let id = d["id"].as_str().context("id")?;
        let detail = api.get(&format!("/v1/tenants/{tenant}/deliveries/{id}"), ADMIN_TOKEN).await?;
        for a in detail.json["attempt_history"].as_array().context("attempts")? {
            answers.push(a["response_body"].as_str().unwrap_or_default().to_string());
        }
    }
    Ok(answers)
}

/// The stream's messages: each one's `webhook-id` and `Nats-Msg-Id`.
async fn nats_messages(stream: &mut async_nats::jetstream::stream::Stream) -> anyhow::Result<Vec<(String, String)>> {
    let last = stream.info().await?.state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let m = stream.get_raw_message(seq).await?;
        let header = |name: &str| m.headers.get(name).map(|v| v.to_string()).unwrap_or_default();
        out.push((header("webhook-id"), header("Nats-Msg-Id")));
    }
    Ok(out)
}

/// One event sent to two NATS endpoints whose subjects land on one stream is two messages,
/// each with the event's `webhook-id`; neither delivery is a JetStream duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_two_endpoints_on_one_stream_get_a_message_each() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let tenant = unique("m");
    gw.api.tenant(&tenant).await?;
    let name = unique("HERALD_TWO_");
    let mut stream = nats_stream(SHARED_NATS, &name, &format!("{name}.>")).await?;
    nats_endpoint(&gw.api, &tenant, SHARED_NATS, &format!("{name}.a.{{type}}"), json!({})).await?;
    nats_endpoint(&gw.api, &tenant, SHARED_NATS, &format!("{name}.b.{{type}}"), json!({})).await?;
    post_evt_1(&gw.api, &tenant).await?;
    let answers = delivered(&gw.api, &tenant, "evt_1", 2).await?;
    assert!(answers.iter().all(|a| !a.contains("duplicate")), "{answers:?}");
    let messages = nats_messages(&mut stream).await?;
    assert_eq!(messages.len(), 2, "two deliveries, two messages: {messages:?}");
    assert!(messages.iter().all(|(w, _)| w == "evt_1"), "{messages:?}");
    assert_ne!(messages[0].1, messages[1].1, "each delivery has its own Nats-Msg-Id");
    let js = async_nats::jetstream::new(async_nats::connect(SHARED_NATS).await?);
    js.delete_stream(&name).await?;
    Ok(())
}

/// Two tenants that each post `evt_1` to a subject of one stream: two messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_two_tenants_with_one_event_id_get_a_message_each() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let name = unique("HERALD_TENANTS_");
    let mut stream = nats_stream(SHARED_NATS, &name, &format!("{name}.>")).await?;
    for tenant in ["t1", "t2"] {
        gw.api.tenant(tenant).await?;
        nats_endpoint(&gw.api, tenant, SHARED_NATS, &format!("{name}.{{tenant}}.{{type}}"), json!({})).await?;
        post_evt_1(&gw.api, tenant).await?;
    }
    for tenant in ["t1", "t2"] {
        let answers = delivered(&gw.api, tenant, "evt_1", 1).await?;
        assert!(answers.iter().all(|a| !a.contains("duplicate")), "{tenant}: {answers:?}");
    }
    let messages = nats_messages(&mut stream).await?;
    assert_eq!(messages.len(), 2, "two tenants' evt_1, two messages: {messages:?}");
    let js = async_nats::jetstream::new(async_nats::connect(SHARED_NATS).await?);
    js.delete_stream(&name).await?;
    Ok(())
}

/// A first attempt that JetStream answers `duplicate` (a message already holds the
/// delivery's id) is not counted as delivered: it is retried, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_duplicate_on_a_first_attempt_is_not_delivered() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let tenant = unique("d");
    gw.api.tenant(&tenant).await?;
    let name = unique("HERALD_DUP_");
    nats_stream(SHARED_NATS, &name, &format!("{name}.>")).await?;
    let ep = nats_endpoint(&gw.api, &tenant, SHARED_NATS, &format!("{name}.{{type}}"), json!({})).await?;
    let ep = ep["id"].as_str().context("id")?;
    let r = gw.api.post(&format!("/v1/tenants/{tenant}/endpoints/{ep}/pause"), ADMIN_TOKEN, json!({})).await?;
    anyhow::ensure!(r.status == 200, "pause: {} {}", r.status, r.text);
    post_evt_1(&gw.api, &tenant).await?;
    let list = gw
        .api
        .wait_for(&format!("/v1/tenants/{tenant}/events/evt_1/deliveries"), Duration::from_secs(10), |v| {
            v["data"].as_array().is_some_and(|d| d.len() == 1)
        })
        .await?;
    let delivery = list["data"][0]["id"].as_str().context("delivery id")?.to_string();
    // Someone else's message under the delivery's id, before its first attempt.
    let js = async_nats::jetstream::new(async_nats::connect(SHARED_NATS).await?);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", delivery.as_str());
    js.publish_with_headers(format!("{name}.other"), headers, "not herald's".into()).await?.await?;
    let r = gw.api.post(&format!("/v1/tenants/{tenant}/endpoints/{ep}/enable"), ADMIN_TOKEN, json!({})).await?;
    anyhow::ensure!(r.status == 200, "enable: {} {}", r.status, r.text);
    let path = format!("/v1/tenants/{tenant}/deliveries/{delivery}");
    let got = gw
        .api
        .wait_for(&path, Duration::from_secs(30), |v| v["attempt_history"].as_array().is_some_and(|a| !a.is_empty()))
        .await?;
    let first = &got["attempt_history"][0];
    assert_ne!(first["verdict"], "delivered", "{first}");
    let error = first["error"].as_str().unwrap_or_default();
    assert!(error.contains("already holds a message"), "{first}");
    js.delete_stream(&name).await?;
    Ok(())
}

/// Redis and RabbitMQ: one event to two endpoints on one stream or queue is two messages,
/// each with the event's `webhook-id`; RabbitMQ's `message-id` is each delivery's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_and_amqp_two_endpoints_get_a_message_each() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let tenant = unique("b");
    gw.api.tenant(&tenant).await?;
    let stream = unique("herald:two:");
    for _ in 0..2 {
        redis_endpoint(&gw.api, &tenant, SHARED_REDIS, &stream, json!({})).await?;
    }
    let exchange = unique("herald.two.");
    let ch = amqp_queue(SHARED_AMQP, &exchange, false).await?;
    for key in ["a", "b"] {
        let dest = json!({"exchange": exchange, "routing_key": key});
        broker_endpoint(&gw.api, &tenant, "amqp", SHARED_AMQP, dest, json!({})).await?;
    }
    post_evt_1(&gw.api, &tenant).await?;
    delivered(&gw.api, &tenant, "evt_1", 4).await?;
    let mut conn = redis_conn(SHARED_REDIS).await?;
    let entries = redis_entries(&mut conn, &stream).await?;
    let ids: Vec<Option<String>> = entries.iter().map(|e| e.get::<String>("webhook-id")).collect();
    assert_eq!(ids, [Some("evt_1".to_string()), Some("evt_1".to_string())]);
    let _: () = redis::cmd("DEL").arg(&stream).query_async(&mut conn).await?;
    let mut messages = Vec::new();
    while let Some(m) = ch.basic_get(exchange.as_str().into(), lapin::options::BasicGetOptions { no_ack: true }).await?
    {
        let message_id = m.delivery.properties.message_id().as_ref().map(|id| id.to_string());
        messages.push((amqp_header(&m.delivery, "webhook-id"), message_id));
    }
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(messages.iter().all(|(w, _)| w.as_deref() == Some("evt_1")), "{messages:?}");
    assert_ne!(messages[0].1, messages[1].1, "each delivery has its own message-id: {messages:?}");
    Ok(())
}

// --- AMQP ---

const SHARED_AMQP: &str = "amqp://127.0.0.1:5672/%2f";

/// A topic exchange and a queue of the same name bound to all of it, at `url`: durable on a
/// broker the test restarts, deleted with their last user on the shared one.
async fn amqp_queue(url: &str, exchange: &str, durable: bool) -> anyhow::Result<lapin::Channel> {
    use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    let x = ExchangeDeclareOptions { auto_delete: !durable, durable, ..Default::default() };
    ch.exchange_declare(exchange.into(), lapin::ExchangeKind::Topic, x, FieldTable::default()).await?;
    let queue = QueueDeclareOptions { auto_delete: !durable, durable, ..Default::default() };
    ch.queue_declare(exchange.into(), queue, FieldTable::default()).await?;
    ch.queue_bind(exchange.into(), exchange.into(), "#".into(), QueueBindOptions::default(), FieldTable::default())
        .await?;
    Ok(ch)
}

/// How many messages `queue` holds.
async fn amqp_count(ch: &lapin::Channel, queue: &str) -> anyhow::Result<usize> {
    use lapin::options::QueueDeclareOptions;
    let passive = QueueDeclareOptions { passive: true, ..Default::default() };
    let q = ch.queue_declare(queue.into(), passive, lapin::types::FieldTable::default()).await?;
    Ok(q.message_count() as usize)
}

/// Waits until `queue` holds at least `n` messages.
async fn amqp_at_least(ch: &lapin::Channel, queue: &str, n: usize) -> anyhow::Result<()> {
    eventually(&format!("{n} messages in {queue}"), Duration::from_secs(30), || async {
        let got = amqp_count(ch, queue).await?;
        done_or(got >= n, got)
    })
    .await
}

/// Takes the messages of `queue` as they come until every one of `ids` (as `webhook-id`)
/// has; returns each id's count.
async fn amqp_all_arrive(
    ch: &lapin::Channel,
    queue: &str,
    ids: &[String],
    within: Duration,
) -> anyhow::Result<HashMap<String, usize>> {
    use lapin::options::BasicGetOptions;
    let seen = Mutex::new(HashMap::new());
    eventually(&format!("{} messages in {queue}", ids.len()), within, || async {
        let mut got = Vec::new();
        while let Some(m) = ch.basic_get(queue.into(), BasicGetOptions { no_ack: true }).await? {
            got.extend(amqp_header(&m.delivery, "webhook-id"));
        }
        let mut seen = seen.lock().unwrap();
        for id in got {
            *seen.entry(id).or_insert(0) += 1;
        }
        let missing = ids.iter().filter(|id| !seen.contains_key(*id)).count();
        done_or(missing == 0, format!("{missing} missing of {}", ids.len()))
    })
    .await?;
    Ok(seen.into_inner().unwrap())
}

/// A message's header as text.
fn amqp_header(m: &lapin::message::Delivery, name: &str) -> Option<String> {
    match m.properties.headers().as_ref()?.inner().get(name)? {
        lapin::types::AMQPValue::LongString(v) => Some(String::from_utf8_lossy(v.as_bytes()).into_owned()),
        _ => None,
    }
}

async fn amqp_delivers_each_event_once(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let tenant = unique("a");
    gw.api.tenant(&tenant).await?;
    let exchange = unique("herald.test.");
    let ch = amqp_queue(SHARED_AMQP, &exchange, false).await?;
    let dest = json!({"exchange": exchange, "routing_key": "{tenant}.{type}"});
    broker_endpoint(&gw.api, &tenant, "amqp", SHARED_AMQP, dest, json!({})).await?;
    let total = 10_000;
    let ids = post_events(&gw.api, &tenant, total).await?;
    let seen = amqp_all_arrive(&ch, &exchange, &ids, Duration::from_secs(120)).await?;
    assert_once_each(&seen, &ids, 16);
    counted_by_kind(&gw.api, &tenant, "amqp", total).await?;
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
    let gw = TestGateway::start_with(&[("HERALD_SECRETS_KEY", SEAL_KEY)]).await?;
    gw.api.tenant("acme").await?;
    let dest = json!({"exchange": "amq.topic", "routing_key": "k", "username": "guest", "password": "wrong"});
    let ep = broker_endpoint(&gw.api, "acme", "amqp", SHARED_AMQP, dest, json!({})).await?;
    post_events(&gw.api, "acme", 1).await?;
    let (_, reason) = paused(&gw.api, "acme", ep["id"].as_str().context("id")?).await?;
    assert!(reason.starts_with("broker:auth:"), "{reason}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_restarted_mid_run_loses_nothing() -> anyhow::Result<()> {
    let mut rabbit = OwnServer::rabbitmq()?;
    rabbit.wait_up().await?;
    let url = format!("amqp://127.0.0.1:{}/%2f", rabbit.port);
    // Durable, so the exchange, the queue and the confirmed messages outlive the kill.
    let ch = amqp_queue(&url, "orders", true).await?;
    let gw = TestGateway::start_with(&FAST_RETRIES).await?;
    gw.api.tenant("acme").await?;
    let dest = json!({"exchange": "orders", "routing_key": "{type}"});
    broker_endpoint(&gw.api, "acme", "amqp", &url, dest, json!({"rate_per_sec": 200})).await?;
    let ids = post_events(&gw.api, "acme", 1_000).await?;
    amqp_at_least(&ch, "orders", 100).await?;
    rabbit.kill();
    a_retry_waits(&gw.api, "acme").await?;
    rabbit.start_again()?;
    rabbit.wait_up().await?;
    let ch = amqp_queue(&url, "orders", true).await?;
    let at_restart = amqp_count(&ch, "orders").await?;
    assert!(at_restart < ids.len(), "the broker stopped mid-run ({at_restart} of {} in)", ids.len());
    let seen = amqp_all_arrive(&ch, "orders", &ids, Duration::from_secs(90)).await?;
    assert_once_each(&seen, &ids, 16);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_sigkill_of_herald_mid_run_loses_nothing() -> anyhow::Result<()> {
    let bin = herald_binary()?;
    let dir = tempfile::tempdir()?;
    let env = [("HERALD_DELIVERY_MAX_IN_FLIGHT_TOTAL", "8")];
    let mut node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    let tenant = unique("ak");
    node.api.tenant(&tenant).await?;
    let exchange = unique("herald.kill.");
    let ch = amqp_queue(SHARED_AMQP, &exchange, false).await?;
    let dest = json!({"exchange": exchange, "routing_key": "{type}"});
    broker_endpoint(&node.api, &tenant, "amqp", SHARED_AMQP, dest, json!({"rate_per_sec": 300, "max_in_flight": 8}))
        .await?;
    let ids = post_events(&node.api, &tenant, 1_500).await?;
    amqp_at_least(&ch, &exchange, 500).await?;
    node.kill();
    let at_kill = amqp_count(&ch, &exchange).await?;
    assert!(at_kill < ids.len(), "the kill came mid-run ({at_kill} in)");
    let _node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    let seen = amqp_all_arrive(&ch, &exchange, &ids, Duration::from_secs(90)).await?;
    assert_once_each(&seen, &ids, 8);
    Ok(())
}

/// The pace as a consumer of the queue sees it: RabbitMQ pushes each message on as it is
/// routed, so the arrival times (the test's clock) are the publishes'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_keeps_the_pace() -> anyhow::Result<()> {
    use futures::StreamExt;
    use lapin::options::BasicConsumeOptions;
    let gw = TestGateway::start().await?;
    let tenant = unique("ap");
    gw.api.tenant(&tenant).await?;
    let exchange = unique("herald.pace.");
    let ch = amqp_queue(SHARED_AMQP, &exchange, false).await?;
    let options = BasicConsumeOptions { no_ack: true, ..Default::default() };
    let mut consumer =
        ch.basic_consume(exchange.as_str().into(), "pace".into(), options, lapin::types::FieldTable::default()).await?;
    let (rate, burst, total) = (50.0, 5usize, 400usize);
    let dest = json!({"exchange": exchange, "routing_key": "{type}"});
    broker_endpoint(&gw.api, &tenant, "amqp", SHARED_AMQP, dest, json!({"rate_per_sec": rate, "burst": burst})).await?;
    // One message first, so that the connection's opening (an AMQP handshake, a channel,
    // confirm mode) does not delay the first burst and shorten the measured span.
    gw.api.event(&tenant, json!({"id": "evt_warm", "type": "order.paid", "payload": {}})).await?.expect(202)?;
    tokio::time::timeout(Duration::from_secs(20), consumer.next()).await?.context("the consumer ended")??;
    let start = tokio::time::Instant::now();
    post_events(&gw.api, &tenant, total).await?;
    let mut at = Vec::with_capacity(total);
    let arrivals = async {
        while at.len() < total {
            consumer.next().await.context("the consumer ended")??;
            at.push(start.elapsed().as_secs_f64());
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(60), arrivals).await.context("400 messages within 60 s")??;
    assert_pace("amqp", at, rate, burst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_sigkill_of_herald_mid_run_loses_nothing() -> anyhow::Result<()> {
    let bin = herald_binary()?;
    let dir = tempfile::tempdir()?;
    let env = [("HERALD_DELIVERY_MAX_IN_FLIGHT_TOTAL", "8")];
    let mut node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    let tenant = unique("nk");
    node.api.tenant(&tenant).await?;
    let name = unique("HERALD_KILL_");
    let mut stream = nats_stream(SHARED_NATS, &name, &format!("{name}.>")).await?;
    let extra = json!({"rate_per_sec": 300, "max_in_flight": 8});
    nats_endpoint(&node.api, &tenant, SHARED_NATS, &format!("{name}.{{type}}"), extra).await?;
    let ids = post_events(&node.api, &tenant, 1_500).await?;
    eventually("a third in", Duration::from_secs(30), || {
        let mut s = stream.clone();
        async move {
            let n = s.info().await?.state.messages;
            done_or(n >= 500, n)
        }
    })
    .await?;
    node.kill();
    let at_kill = stream.info().await?.state.messages as usize;
    assert!(at_kill < ids.len(), "the kill came mid-run ({at_kill} in)");
    let _node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    let seen = nats_all_arrive(&mut stream, ids.len(), Duration::from_secs(90)).await?;
    // What was in flight at the kill is published again; JetStream drops the repeats.
    assert_once_each(&seen, &ids, 0);
    let js = async_nats::jetstream::new(async_nats::connect(SHARED_NATS).await?);
    js.delete_stream(&name).await?;
    Ok(())
}

// --- Credentials, the SSRF guard, trace context ---

/// A password or token is sealed under `[secrets] key` (a node without one refuses it) and
/// shows nowhere: not in the API's replies (the endpoint, its deliveries and attempts with
/// the brokers' refusals), not in Herald's log at debug level, not in the database files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_credentials_are_sealed_and_never_printed() -> anyhow::Result<()> {
    let keyless = TestGateway::start().await?;
    keyless.api.tenant("acme").await?;
    let dest = json!({"stream": "s", "password": "p"});
    let body = json!({"kind": "redis-stream", "url": SHARED_REDIS, "destination": dest});
    let r = keyless.api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, body).await?;
    assert_eq!(r.status, 422, "{}", r.text);
    assert!(r.text.contains("destination.password: this node has no [secrets] key"), "{}", r.text);
    drop(keyless);

    let redis = OwnServer::redis(Some("right-password"))?;
    redis.wait_up().await?;
    let nats = OwnServer::start(|port, dir| {
        let mut c = Command::new("nats-server");
        c.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "--auth", "right-token", "-sd"]).arg(dir);
        c
    })?;
    nats.wait_up().await?;
    let bin = herald_binary()?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("herald.log");
    let env = [("HERALD_SECRETS_KEY", SEAL_KEY), ("HERALD_LOG_LEVEL", "debug")];
    let node = HeraldProcess::start_logged(&bin, dir.path(), &env, Some(&log)).await?;
    let api = &node.api;
    api.tenant("acme").await?;
    let secrets = ["redis-Secret-7d1f0c", "nats-Secret-52aa9e", "amqp-Secret-e0b3c4"];
    let endpoints = [
        ("redis-stream", format!("redis://127.0.0.1:{}", redis.port), json!({"stream": "s", "password": secrets[0]})),
        ("nats", format!("nats://127.0.0.1:{}", nats.port), json!({"subject": "orders", "token": secrets[1]})),
        (
            "amqp",
            SHARED_AMQP.to_string(),
            json!({"exchange": "amq.topic", "routing_key": "k", "username": "guest", "password": secrets[2]}),
        ),
    ];
    let mut replies = Vec::new();
    let mut ids = Vec::new();
    for (kind, url, dest) in endpoints {
        let ep = broker_endpoint(api, "acme", kind, &url, dest, json!({})).await?;
        ids.push(ep["id"].as_str().context("id")?.to_string());
        replies.push(ep.to_string());
    }
    post_events(api, "acme", 1).await?;
    for id in &ids {
        let (got, reason) = paused(api, "acme", id).await?;
        assert!(reason.starts_with("broker:auth:"), "{reason}");
        replies.push(got.to_string());
    }
    let deliveries = api.get("/v1/tenants/acme/deliveries?limit=100", ADMIN_TOKEN).await?;
    replies.push(deliveries.text.clone());
    for d in deliveries.json["data"].as_array().context("deliveries")? {
        let id = d["id"].as_str().context("delivery id")?;
        // The delivery with its attempts, each with the broker's refusal.
        replies.push(api.get(&format!("/v1/tenants/acme/deliveries/{id}"), ADMIN_TOKEN).await?.expect(200)?.text);
    }
    replies.push(api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.text);
    drop(node);
    let stored = tests::stored_bytes(dir.path())?;
    let stored = String::from_utf8_lossy(&stored);
    let logged = std::fs::read_to_string(&log)?;
    assert!(!logged.is_empty(), "the node logged nothing at debug level");
    for secret in secrets {
        assert!(!logged.contains(secret), "{secret} in the log");
        assert!(!stored.contains(secret), "{secret} stored in clear");
        for reply in &replies {
            assert!(!reply.contains(secret), "{secret} in a reply: {reply}");
        }
    }

    // Under another operator key the sealed password does not open: the endpoint is held
    // with the reason, and nothing is sent.
    let other_key = [("HERALD_SECRETS_KEY", "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=")];
    let node = HeraldProcess::start(&bin, dir.path(), &other_key).await?;
    let path = format!("/v1/tenants/acme/endpoints/{}", ids[0]);
    node.api.post(&format!("{path}/enable"), ADMIN_TOKEN, json!({})).await?.expect(200)?;
    let (_, reason) = paused(&node.api, "acme", &ids[0]).await?;
    assert!(reason.starts_with("broker:auth: the password") && reason.ends_with("write it again"), "{reason}");
    Ok(())
}

/// With private destinations refused, a broker URL at a loopback address is a 422 that says
/// why; one written while they were allowed is refused when it would connect (the address
/// checked is the one connected to), dead-lettered as a blocked destination with the
/// address in its error, and nothing reaches the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_hosts_pass_the_ssrf_guard() -> anyhow::Result<()> {
    let guarded = [("HERALD_DELIVERY_ALLOW_PRIVATE_DESTINATIONS", "false")];
    let gw = TestGateway::start_with(&guarded).await?;
    gw.api.tenant("acme").await?;
    for (kind, url, dest) in [
        ("redis-stream", "redis://127.0.0.1:6379", json!({"stream": "s"})),
        ("nats", "nats://localhost:4222", json!({"subject": "s"})),
        ("amqp", "amqp://[::1]:5672/%2f", json!({"exchange": "x", "routing_key": "k"})),
    ] {
        let body = json!({"kind": kind, "url": url, "destination": dest});
        let r = gw.api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, body).await?;
        assert_eq!(r.status, 422, "{url}: {}", r.text);
        assert!(r.text.contains("url: ") && r.text.contains("loopback"), "{url}: {}", r.text);
    }
    drop(gw);

    let gw = TestGateway::start().await?;
    let tenant = unique("g");
    gw.api.tenant(&tenant).await?;
    let stream = unique("herald:guard:");
    redis_endpoint(&gw.api, &tenant, SHARED_REDIS, &stream, json!({})).await?;
    let gw = TestGateway::start_in(gw.stop().await, &guarded).await?;
    post_events(&gw.api, &tenant, 1).await?;
    let dead = gw
        .api
        .wait_for(&format!("/v1/tenants/{tenant}/dead-letters"), Duration::from_secs(20), |v| {
            v["data"].as_array().is_some_and(|d| !d.is_empty())
        })
        .await?;
    let d = &dead["data"][0];
    assert!(d["reason"].as_str().is_some_and(|r| r.contains("blocked")), "{d}");
    let error = d["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("127.0.0.1 is a private or loopback address"), "{d}");
    let mut conn = redis_conn(SHARED_REDIS).await?;
    let len: usize = redis::cmd("XLEN").arg(&stream).query_async(&mut conn).await?;
    assert_eq!(len, 0, "nothing reached the broker");
    Ok(())
}

/// An event posted with a `traceparent` reaches every kind's message with the producer's
/// trace id and a span id of the attempt's own, beside the webhook headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_messages_carry_the_producers_trace() -> anyhow::Result<()> {
    const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let gw = TestGateway::start().await?;
    let tenant = unique("t");
    gw.api.tenant(&tenant).await?;
    let key = unique("herald:trace:");
    redis_endpoint(&gw.api, &tenant, SHARED_REDIS, &key, json!({})).await?;
    let name = unique("HERALD_TRACE_");
    let mut stream = nats_stream(SHARED_NATS, &name, &format!("{name}.>")).await?;
    nats_endpoint(&gw.api, &tenant, SHARED_NATS, &format!("{name}.{{type}}"), json!({})).await?;
    let exchange = unique("herald.trace.");
    let ch = amqp_queue(SHARED_AMQP, &exchange, false).await?;
    let dest = json!({"exchange": exchange, "routing_key": "{type}"});
    broker_endpoint(&gw.api, &tenant, "amqp", SHARED_AMQP, dest, json!({})).await?;
    let event = json!({"id": "evt_traced", "type": "order.paid", "payload": {}});
    let path = format!("/v1/tenants/{tenant}/events");
    gw.api
        .raw_with("POST", &path, Some(ADMIN_TOKEN), &[("traceparent", PARENT)], event.to_string())
        .await?
        .expect(202)?;

    let ids = ["evt_traced".to_string()];
    let entries = redis_all_arrive(SHARED_REDIS, &key, &ids, Duration::from_secs(20)).await?;
    let from_redis = entries[0].get::<String>("traceparent");
    nats_all_arrive(&mut stream, 1, Duration::from_secs(20)).await?;
    let from_nats = stream.get_raw_message(1).await?.headers.get("traceparent").map(|v| v.to_string());
    let from_amqp = {
        use lapin::options::BasicGetOptions;
        let m = eventually("the AMQP message", Duration::from_secs(20), || async {
            let got = ch.basic_get(exchange.as_str().into(), BasicGetOptions { no_ack: true }).await?;
            Ok(got.ok_or_else(|| "none yet".to_string()))
        })
        .await?;
        let headers = m.delivery.properties.headers().clone().unwrap_or_default();
        headers.inner().get("traceparent").and_then(|v| v.as_long_string()).map(|v| v.to_string())
    };
    for (kind, got) in [("redis-stream", from_redis), ("nats", from_nats), ("amqp", from_amqp)] {
        let got = got.with_context(|| format!("{kind}: no traceparent"))?;
        let parts: Vec<&str> = got.split('-').collect();
        assert_eq!(parts.len(), 4, "{kind}: {got}");
        assert_eq!((parts[1], parts[3]), (TRACE_ID, "01"), "{kind}: the producer's trace");
        assert_ne!(parts[2], "00f067aa0ba902b7", "{kind}: a span of the attempt's own");
    }
    let mut conn = redis_conn(SHARED_REDIS).await?;
    let _: () = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
    let js = async_nats::jetstream::new(async_nats::connect(SHARED_NATS).await?);
    js.delete_stream(&name).await?;
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
