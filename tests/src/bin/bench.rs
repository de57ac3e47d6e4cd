//! Benchmarks that drive the real `herald` binary over HTTP on 127.0.0.1 and print figures.
//! Build in release first: `cargo build --release -p gateway -p tests`, then e.g.
//! `target/release/herald-bench intake --events 20000 --concurrency 64 --runs 3`.
//! Every scenario is bounded in count and time.

// Test code: a failed unwrap is a failed test, and tests compare against the wall clock.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use tests::pg::PgSchema;
use tests::{ADMIN_TOKEN, Answer, FakeReceiver, HeraldProcess, herald_binary};

#[path = "bench/firstcall.rs"]
mod firstcall;
#[path = "bench/isolation.rs"]
mod isolation;
#[path = "bench/js.rs"]
mod js;
#[path = "bench/load.rs"]
mod load;
#[path = "bench/ordered.rs"]
mod ordered;
#[path = "bench/outbox.rs"]
mod outbox;
#[path = "bench/pgcpu.rs"]
mod pgcpu;
#[path = "bench/queue.rs"]
mod queue;
#[path = "bench/scale.rs"]
mod scale;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
    /// Extra Herald nodes sharing the store (needs --store-url): all of them deliver.
    #[arg(long, default_value_t = 1, global = true)]
    nodes: usize,
    /// Repetitions; the median run is reported alongside each run.
    #[arg(long, default_value_t = 3, global = true)]
    runs: usize,
    /// The node's store: SQLite in a temporary directory by default, or a Postgres database
    /// URL (every run gets a fresh schema in it).
    #[arg(long, global = true)]
    store_url: Option<String>,
}

#[derive(Subcommand, Clone)]
enum Scenario {
    /// Events/s durably accepted and time to 202, each event fanned out to one endpoint.
    Intake {
        #[arg(long, default_value_t = 20_000)]
        events: usize,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Post with a tenant token instead of the admin token: on Postgres every request
        /// then reads its token from the store (no cache, so revocations hold at once).
        #[arg(long, default_value_t = false)]
        tenant_token: bool,
        /// With the event catalog: a typical schema for the type (an object of 10 typed
        /// properties, 4 required, two formats, a pattern) and ~1 KiB payloads that fit it,
        /// under this `schema_validation` (`off` for the baseline with the same payloads,
        /// `warn`, `enforce`). Without it: small payloads and no catalog.
        #[arg(long)]
        schema_validation: Option<String>,
    },
    /// End-to-end deliveries/s: events posted in batches, delivered to a fast receiver.
    Deliver {
        #[arg(long, default_value_t = 20_000)]
        events: usize,
        #[arg(long, default_value_t = 1)]
        endpoints: usize,
        /// Bind the three example plugins (transform, classify, sign) to every endpoint.
        #[arg(long, default_value_t = false)]
        plugins: bool,
        /// With `--plugins`: bind only these hooks (comma-separated), to cost each one.
        #[arg(long, value_delimiter = ',', default_value = "transform,classify,sign")]
        hooks: Vec<String>,
        /// Ordered delivery: endpoints ordered by `key`, event `i` carrying key `i % keys`
        /// (0: unordered).
        #[arg(long, default_value_t = 0)]
        keys: usize,
        /// Export spans over OTLP at this sampling ratio (0 to 1), to a local sink that
        /// accepts and discards them; unset: export off (the default node).
        #[arg(long)]
        otlp_ratio: Option<f64>,
        /// The destination: `http` (the fast receiver), or `redis-stream`, `nats`, `amqp` on
        /// the machine's brokers (127.0.0.1, usual ports), counted there.
        #[arg(long, default_value = "http")]
        kind: String,
        /// The signatures every endpoint sends (comma-separated): `v1` (HMAC, the default),
        /// `v1a` (ed25519) or `v1,v1a`.
        #[arg(long, value_delimiter = ',', default_value = "v1")]
        signatures: Vec<String>,
        /// A typical content filter on every endpoint, which every event matches.
        #[arg(long, default_value_t = false)]
        filter: bool,
        /// CloudEvents output on every endpoint, in this mode (`binary` or `structured`);
        /// unset: the Standard Webhooks envelope.
        #[arg(long)]
        cloudevents: Option<String>,
        /// Batches of this many events, against none, alternated within each run (one
        /// endpoint of `--kind`; a broker's batch is a pipelined round): deliveries/s,
        /// 202→arrival p50/p99 (`http`), node CPU and requests of each and their ratio.
        /// 0: no comparison (the usual run).
        #[arg(long, default_value_t = 0)]
        batch: usize,
        /// With `--batch`: the batch's `max_wait`.
        #[arg(long, default_value = "100ms")]
        batch_wait: String,
    },
    /// `fanout-tail`: `events` single events posted by `concurrency` producers at once,
    /// each fanned out to `endpoints` endpoints: 202→arrival p50/p99/max of every delivery,
    /// deliveries/s (first post to last arrival) and node CPU per delivery.
    FanoutTail {
        #[arg(long, default_value_t = 2_000)]
        events: usize,
        #[arg(long, default_value_t = 10)]
        endpoints: usize,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Post at this many events/s in total (open loop: event i is due at i/rate s)
        /// instead of as fast as the producers can: the tail at a load the node sustains.
        #[arg(long)]
        rate: Option<f64>,
        /// A typical content filter on every endpoint (four clauses over the payload and the
        /// type, which every event matches, so the deliveries are the same as without).
        #[arg(long, default_value_t = false)]
        filter: bool,
    },
    /// `concurrent`: one endpoint taking intake and delivery at the same time (`events`
    /// posted by `concurrency` producers while the receiver takes them): deliveries/s.
    Concurrent {
        #[arg(long, default_value_t = 20_000)]
        events: usize,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
    },
    /// Time from 202 to arrival at the receiver, posting at a fixed rate, and the node's
    /// CPU per delivery (`fixed-rate --rate 500 --seconds 20`: the moderate-load cost), with
    /// the SQLite writer thread's share and the post→202 time.
    #[command(alias = "fixed-rate")]
    Latency {
        #[arg(long, default_value_t = 200)]
        rate: u64,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Add one more endpoint that gets an extra event for every tenth one: `fast`
        /// answers at once (the baseline), `hang` never answers (the isolation case). Both
        /// put the same load on Herald; only the extra endpoint's behaviour differs.
        #[arg(long, value_enum)]
        extra: Option<Extra>,
        #[arg(long, default_value_t = 1)]
        endpoints: usize,
        /// Deliver this many events first, to an endpoint of their own, so the run starts
        /// on a store the size of a node that has been running a while, not an empty one.
        #[arg(long, default_value_t = 0)]
        history: usize,
    },
    /// Per-call cost of each example plugin's hook, in process (p50/p99 µs).
    PluginCalls {
        #[arg(long, default_value_t = 20_000)]
        calls: usize,
    },
    /// JavaScript plugins, in process: transform of a 1 KiB event (p50/p99 µs through the
    /// call pool) and loading a tenant's source (ms, `loads` distinct sources).
    JsCalls {
        #[arg(long, default_value_t = 5_000)]
        calls: usize,
        #[arg(long, default_value_t = 20)]
        loads: usize,
    },
    /// JavaScript plugins on a real node: RSS per tenant with `tenants` tenants' plugins
    /// warm, then the restart with all of them installed.
    JsTenants {
        #[arg(long, default_value_t = 100)]
        tenants: usize,
    },
    /// Plugin isolation (issue 48.16), in one run on one node: tenant `good` posts `rate`
    /// events/s to two endpoints (one through a pass-through transform) and tenant `slow`
    /// `slow_rate`/s through a legal transform of about `slow_ms` of CPU; first alone, then
    /// beside tenant `evil` posting `burn_rate` events/s to each of `burners` endpoints whose
    /// transform spins until its budget stops it, then beside those and `hostile_endpoints`
    /// more with every hostile plugin. Reports good's 202→arrival p50/p99 per phase and its
    /// ratios to the baseline, `/healthz` p99, the node's CPU and the slow plugin's timeouts
    /// (see `bench/isolation.rs`). Needs `scripts/build-plugins`.
    IsolationPlugins(isolation::Params),
    /// The first call of a freshly uploaded plugin (issue 48.18): the issue's two probes
    /// (100k headers aliasing one 1 KiB buffer; `get-config` with 8 MiB keys), each uploaded
    /// `rounds` times: the first and second attempt's duration and the load time, medians
    /// (see `bench/firstcall.rs`).
    FirstCall {
        #[arg(long, default_value_t = 5)]
        rounds: usize,
    },
    /// Restart of a node with `plugins` installed plugins (distinct, all compiled and
    /// cached): ms from spawn to `/readyz`, to every plugin serving, and to the first
    /// delivery through the plugin loaded last.
    Restart {
        #[arg(long, default_value_t = 100)]
        plugins: usize,
    },
    /// How soon a rate change applies: one endpoint at 0.01/s with `events` queued is
    /// PATCHed to 100,000/s (through the last node with `--nodes`, which never paced it).
    /// Reports ms from the PATCH to the first arrival after it, and the drain time.
    RateChange {
        #[arg(long, default_value_t = 20_000)]
        events: usize,
    },
    /// The transactional outbox relay (a producer schema in the test Postgres): rows/s
    /// from inserting `rows` rows to their durable intake, then insert→relayed lag
    /// p50/p99/max at a steady `rate` rows/s (one per transaction) for `seconds`.
    Outbox {
        #[arg(long, default_value_t = 20_000)]
        rows: usize,
        #[arg(long, default_value_t = 1000)]
        rate: u64,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// The source's `batch`.
        #[arg(long, default_value_t = 500)]
        batch: u32,
    },
    /// One ordered endpoint's keys while one key's head fails: `rate` events/s for `seconds`
    /// over `keys` keys, first with every key answered at once, then with key `k0` answered
    /// `500` every time. Reports the other keys' 202→arrival p50/p99 in each phase.
    OrderedTail {
        #[arg(long, default_value_t = 200)]
        rate: u64,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long, default_value_t = 10)]
        keys: usize,
    },
    /// Scaling over nodes: deliveries/s of a Postgres cluster of each size in `sizes`, each
    /// node held to `node_cpu` cores and the database (a server of the bench's own, `fsync`
    /// on) to `db_cpu` (cgroup v1 CPU quotas: run as root), with `endpoints` endpoints and
    /// `events` events fanned out to all of them; the imbalance of the nodes' work and how
    /// often the database's slice ran out.
    Scale {
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        sizes: Vec<usize>,
        #[arg(long, default_value_t = 0.25)]
        node_cpu: f64,
        #[arg(long, default_value_t = 1.0)]
        db_cpu: f64,
        #[arg(long, default_value_t = 1000)]
        endpoints: usize,
        #[arg(long, default_value_t = 20)]
        events: usize,
    },
    /// Achieved rate of one endpoint paced at `rate`/s over `seconds`.
    Pacing {
        #[arg(long, default_value_t = 100.0)]
        rate: f64,
        #[arg(long, default_value_t = 30)]
        seconds: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
enum Extra {
    Fast,
    Hang,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The receiver and the producers hold hundreds of connections: the table grows here,
    // once, not in the middle of a measured run (see `reserve_fd_table`).
    gateway::app::reserve_fd_table(4096);
    let mut results = Vec::new();
    for run in 1..=cli.runs {
        let r = run_once(&cli.scenario, cli.store_url.as_deref(), cli.nodes).await?;
        println!("run {run}: {}", fmt(&r));
        results.push(r);
    }
    let mut keys: Vec<&String> = results[0].keys().collect();
    keys.sort();
    let medians: HashMap<String, f64> = keys
        .iter()
        .map(|k| {
            let mut v: Vec<f64> = results.iter().map(|r| r[*k]).collect();
            v.sort_by(f64::total_cmp);
            ((*k).clone(), v[v.len() / 2])
        })
        .collect();
    println!("median of {} runs: {}", cli.runs, fmt(&medians));
    Ok(())
}

fn fmt(r: &HashMap<String, f64>) -> String {
    let mut keys: Vec<_> = r.keys().collect();
    keys.sort();
    keys.iter().map(|k| format!("{k}={:.2}", r[*k])).collect::<Vec<_>>().join(" ")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn node(
    store_url: Option<&str>,
    extra: &[(&str, &str)],
) -> anyhow::Result<(Option<PgSchema>, tempfile::TempDir, HeraldProcess)> {
    let bin = herald_binary()?;
    if !bin.to_string_lossy().contains("release") {
        eprintln!("warning: {} is not a release build", bin.display());
    }
    let dir = tempfile::tempdir()?;
    let schema = match store_url {
        Some(url) => Some(PgSchema::create_in(url).await?),
        None => None,
    };
    // HERALD_BENCH_LOG (e.g. "gateway::store=trace") lets a profile read the node's logs.
    let level = std::env::var("HERALD_BENCH_LOG").unwrap_or_else(|_| "error".into());
    let mut env = vec![("HERALD_LOG_LEVEL", level.as_str())];
    env.extend_from_slice(extra);
    if let Some(s) = &schema {
        env.push(("HERALD_STORE_URL", &s.url));
    }
    // JavaScript plugins (`--js`), when the runtime is built.
    let runtime = js::runtime().ok().map(|p| p.display().to_string());
    if let Some(runtime) = &runtime {
        env.push(("HERALD_PLUGINS_JS_RUNTIME", runtime));
    }
    // HERALD_BENCH_NODE_LOG=FILE keeps the (first) node's logs there.
    let log = std::env::var_os("HERALD_BENCH_NODE_LOG").map(std::path::PathBuf::from);
    let p = HeraldProcess::start_logged(&bin, dir.path(), &env, log.as_deref()).await?;
    // In this order, so that the node stops before its schema is dropped.
    Ok((schema, dir, p))
}

/// An OTLP/HTTP endpoint on 127.0.0.1 that reads each export and answers 200, keeping
/// nothing (what a collector costs the node is its answer, not its work). Its base URL.
async fn otlp_sink() -> anyhow::Result<String> {
    use http_body_util::{BodyExt, Full};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    req.into_body().collect().await?;
                    Ok::<_, hyper::Error>(hyper::Response::new(Full::new(bytes::Bytes::new())))
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    Ok(url)
}

/// Records arrival instants by webhook-id.
fn arrivals(rx: &FakeReceiver) -> HashMap<String, Instant> {
    rx.received().into_iter().filter_map(|r| Some((r.header("webhook-id")?.to_string(), r.at))).collect()
}

/// The SQLite writer thread's name as `/proc` shows it (cut to 15 bytes).
const WRITER_THREAD: &str = "herald-sqlite-w";

/// User plus system CPU time of a process so far, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    stat_cpu_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat"))?, clock_ticks()?)
}

/// CPU seconds of the process's threads whose name starts with `name` (a thread's name is
/// cut to 15 bytes), e.g. the SQLite writer's, to split the node's CPU by thread.
fn thread_cpu_seconds(pid: u32, name: &str) -> anyhow::Result<f64> {
    let ticks = clock_ticks()?;
    let mut total = 0.0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let dir = task?.path();
        // A thread may end between listing and reading: it counts for nothing then.
        let (Ok(comm), Ok(stat)) =
            (std::fs::read_to_string(dir.join("comm")), std::fs::read_to_string(dir.join("stat")))
        else {
            continue;
        };
        if comm.trim_end().starts_with(name) {
            total += stat_cpu_seconds(&stat, ticks)?;
        }
    }
    Ok(total)
}

fn clock_ticks() -> anyhow::Result<f64> {
    let out = std::process::Command::new("getconf").arg("CLK_TCK").output()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().context("getconf CLK_TCK")
}

/// utime + stime of a `/proc/…/stat` line, in seconds.
fn stat_cpu_seconds(stat: &str, ticks: f64) -> anyhow::Result<f64> {
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(") ").context("/proc/<pid>/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11).context("utime")?.parse()?;
    let stime: f64 = fields.get(12).context("stime")?.parse()?;
    Ok((utime + stime) / ticks)
}

fn wasm_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/wasm32-wasip2/release")
}

/// The delivery context of the plugin benchmarks.
fn bench_context() -> gateway::plugin::DeliveryContext {
    gateway::plugin::DeliveryContext {
        tenant: "bench".into(),
        endpoint_id: "ep_1".into(),
        event_id: "evt_1".into(),
        event_type: "invoice.paid".into(),
        attempt: 1,
        timestamp: 1_700_000_000,
        attempt_id: "att_1".into(),
    }
}

/// Runs `f` `warmup` times, then times `calls` runs of it: `<label>_p50_us`, `_p99_us`.
fn time_calls(label: &str, calls: usize, warmup: usize, f: &mut dyn FnMut(), out: &mut HashMap<String, f64>) {
    for _ in 0..warmup {
        f();
    }
    let mut us: Vec<f64> = (0..calls)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    us.sort_by(f64::total_cmp);
    out.insert(format!("{label}_p50_us"), percentile(&us, 0.5));
    out.insert(format!("{label}_p99_us"), percentile(&us, 0.99));
}

/// Times each hook of the example plugins through the real host, reusing warm instances.
fn plugin_calls(calls: usize) -> anyhow::Result<HashMap<String, f64>> {
    use gateway::plugin::*;
    let dir = tempfile::tempdir()?;
    let mut cfg = PluginConfig::new(dir.path());
    cfg.watch = false;
    cfg.plugin_config.insert(("bench".into(), "c409".into()), HashMap::from([("on_409".into(), "retry".into())]));
    cfg.plugin_config.insert(("bench".into(), "chat".into()), HashMap::from([("redact".into(), "email".into())]));
    let host = PluginHost::start(cfg)?;
    for (name, file) in [("c409", "classify_409"), ("hexsig", "sign_hmac_hex"), ("chat", "transform_chat")] {
        let bytes = std::fs::read(wasm_dir().join(format!("{file}.wasm")))
            .context("build the plugins first: scripts/build-plugins")?;
        host.install_blocking("bench", name, &bytes)?;
    }
    let ctx = bench_context();
    let request = Request {
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"id":"evt_1","type":"invoice.paid","timestamp":"2023-11-14T22:13:20Z","data":{"invoice":"in_123","amount":4200,"customer":{"email":"a@example.com","name":"Ada"}}}"#.to_vec(),
    };
    let outcome = Outcome::Response(Response { status: 409, headers: Vec::new(), body: b"duplicate".to_vec() });
    let secrets = vec![b"0123456789abcdef0123456789abcdef".to_vec()];
    let mut out = HashMap::new();
    let mut time = |label: &str, f: &mut dyn FnMut()| time_calls(label, calls, 1000, f, &mut out);
    // Each call goes through the host's call pool, as in the server: the thread hop is
    // part of its cost.
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    time("classify", &mut || drop(rt.block_on(host.classify("bench", "c409", &ctx, &outcome)).expect("classify")));
    time("sign", &mut || drop(rt.block_on(host.sign("bench", "hexsig", &ctx, &secrets, &request)).expect("sign")));
    time("transform", &mut || drop(rt.block_on(host.transform("bench", "chat", &ctx, &request)).expect("transform")));
    Ok(out)
}

/// How many runs of `deliver --batch` started: each other run measures batches first.
static ROUND: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

async fn run_once(s: &Scenario, store_url: Option<&str>, nodes: usize) -> anyhow::Result<HashMap<String, f64>> {
    if let Scenario::PluginCalls { calls } = s {
        let calls = *calls;
        return tokio::task::spawn_blocking(move || plugin_calls(calls)).await?;
    }
    if let Scenario::Restart { plugins } = s {
        return restart(*plugins).await;
    }
    if let Scenario::Outbox { rows, rate, seconds, batch } = s {
        let params = outbox::Params { rows: *rows, rate: *rate, seconds: *seconds, batch: *batch };
        return outbox::run(&params, store_url).await;
    }
    if let Scenario::JsCalls { calls, loads } = s {
        let (calls, loads) = (*calls, *loads);
        return tokio::task::spawn_blocking(move || js::calls(calls, loads)).await?;
    }
    if let Scenario::JsTenants { tenants } = s {
        return js::tenants(*tenants).await;
    }
    if let Scenario::Scale { sizes, node_cpu, db_cpu, endpoints, events } = s {
        let params = scale::Params {
            sizes: sizes.clone(),
            node_cpu: *node_cpu,
            db_cpu: *db_cpu,
            endpoints: *endpoints,
            events: *events,
        };
        return scale::run(&params).await;
    }
    // `deliver --otlp-ratio`: spans exported to a sink that discards them.
    let otlp = match s {
        Scenario::Deliver { otlp_ratio: Some(ratio), .. } => Some((otlp_sink().await?, ratio.to_string())),
        _ => None,
    };
    let extra: Vec<(&str, &str)> = match &otlp {
        Some((url, ratio)) => vec![("HERALD_TRACING_OTLP_ENDPOINT", url), ("HERALD_TRACING_SAMPLE_RATIO", ratio)],
        None => Vec::new(),
    };
    let (schema, _dir, node) = node(store_url, &extra).await?;
    let mut _others = Vec::new();
    if nodes > 1 {
        let schema = schema.as_ref().context("--nodes needs --store-url")?;
        for _ in 1..nodes {
            let dir = tempfile::tempdir()?;
            let env = [("HERALD_LOG_LEVEL", "error"), ("HERALD_STORE_URL", schema.url.as_str())];
            _others.push((HeraldProcess::start(&herald_binary()?, dir.path(), &env).await?, dir));
        }
    }
    let api = node.api.clone();
    api.tenant("bench").await?;
    let rx = FakeReceiver::start().await?;
    let mut out = HashMap::new();
    match s.clone() {
        Scenario::Intake { events, concurrency, tenant_token, schema_validation } => {
            api.endpoint("bench", json!({"url": rx.url(), "rate_per_sec": 1, "max_in_flight": 1})).await?;
            if let Some(mode) = &schema_validation {
                let r = api
                    .post("/v1/event-types", ADMIN_TOKEN, json!({"name": "invoice.paid", "schema": bench_schema()}))
                    .await?;
                anyhow::ensure!(r.status == 201, "event type: {}", r.text);
                let r = api
                    .call("PUT", "/v1/tenants/bench/catalog", ADMIN_TOKEN, Some(json!({"schema_validation": mode})))
                    .await?;
                anyhow::ensure!(r.status == 200, "schema_validation: {}", r.text);
            }
            let catalog = schema_validation.is_some();
            let token: Arc<str> =
                if tenant_token { api.token("bench", &["events:write"]).await?.into() } else { ADMIN_TOKEN.into() };
            let latencies = Arc::new(Mutex::new(Vec::with_capacity(events)));
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let start = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..concurrency {
                let (api, latencies, next, token) = (api.clone(), latencies.clone(), next.clone(), token.clone());
                tasks.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= events {
                            return anyhow::Ok(());
                        }
                        let body = match catalog {
                            true => format!(r#"{{"id":"evt_{i}","type":"invoice.paid","payload":{}}}"#, bench_payload(i)),
                            false => format!(r#"{{"id":"evt_{i}","type":"invoice.paid","payload":{{"n":{i},"customer":"cus_123","amount":1999}}}}"#),
                        };
                        let t = Instant::now();
                        let r = api.raw("POST", "/v1/tenants/bench/events", Some(&token), body).await?;
                        if r.status != 202 {
                            bail!("{} {}", r.status, r.text);
                        }
                        latencies.lock().unwrap().push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                }));
            }
            for t in tasks {
                t.await??;
            }
            let secs = start.elapsed().as_secs_f64();
            let mut l = latencies.lock().unwrap().clone();
            l.sort_by(f64::total_cmp);
            out.insert("events_per_s".into(), events as f64 / secs);
            out.insert("p50_ms".into(), percentile(&l, 0.5));
            out.insert("p99_ms".into(), percentile(&l, 0.99));
        }
        Scenario::Deliver { events, batch: batch @ 1.., batch_wait, kind, .. } => {
            let batch_first = ROUND.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2 == 1;
            let shape = (events, batch, batch_wait.as_str(), kind.as_str());
            load::batch_against_none(&api, node.pid(), shape, batch_first, &mut out).await?;
        }
        Scenario::Deliver {
            events, endpoints, plugins, hooks, keys, kind, signatures, filter, cloudevents, ..
        } => {
            let per_endpoint_rate = 100_000;
            let mut bindings = json!({});
            if plugins {
                for (name, file) in [("chat", "transform_chat"), ("c409", "classify_409"), ("hexsig", "sign_hmac_hex")]
                {
                    let bytes = std::fs::read(wasm_dir().join(format!("{file}.wasm")))
                        .context("build the plugins first: scripts/build-plugins")?;
                    let r =
                        api.raw("PUT", &format!("/v1/tenants/bench/plugins/{name}"), Some(ADMIN_TOKEN), bytes).await?;
                    if r.status != 200 {
                        bail!("upload {name}: {} {}", r.status, r.text);
                    }
                }
                let all = json!({"transform": "chat", "classify": "c409", "sign": "hexsig"});
                bindings = json!({});
                for hook in &hooks {
                    bindings[hook] = all.get(hook).with_context(|| format!("unknown hook {hook}"))?.clone();
                }
            }
            let ordering = if keys > 0 { "key" } else { "none" };
            let broker = queue::Broker::open(&kind).await?;
            for _ in 0..endpoints {
                let mut spec = json!({"url": rx.url(), "rate_per_sec": per_endpoint_rate, "burst": 1000, "max_in_flight": (256 / endpoints).max(4), "plugins": bindings, "ordering": ordering, "signatures": signatures});
                if let Some(b) = &broker {
                    b.target(&mut spec);
                }
                if filter {
                    spec["filter"] = load::typical_filter();
                }
                if let Some(mode) = &cloudevents {
                    spec["cloudevents"] = json!({"mode": mode});
                }
                api.endpoint("bench", spec).await?;
            }
            let cpu_before = cpu_seconds(node.pid())?;
            let start = Instant::now();
            post_keyed(&api, "invoice.paid", events, keys).await?;
            let total = events * endpoints;
            match &broker {
                Some(b) => b.wait_for(total, Duration::from_secs(300)).await?,
                None => rx.wait_for(total, Duration::from_secs(300)).await.map(drop)?,
            }
            if let Some(b) = broker {
                b.clean().await?;
            }
            let secs = start.elapsed().as_secs_f64();
            out.insert("deliveries_per_s".into(), total as f64 / secs);
            out.insert("seconds".into(), secs);
            // CPU the (first) node spent per delivery: steadier than throughput on a shared
            // 2-core machine, where the load generator and receiver compete for the cores.
            let cpu = cpu_seconds(node.pid())? - cpu_before;
            out.insert("node_cpu_us_per_delivery".into(), cpu * 1e6 / total as f64);
        }
        Scenario::Latency { rate, seconds, extra, endpoints, history } => {
            if history > 0 {
                deliver_history(&api, history).await?;
            }
            for i in 0..endpoints {
                api.endpoint("bench", json!({"url": rx.url(), "event_types": [format!("fast.{i}")], "rate_per_sec": 10_000, "burst": 100, "max_in_flight": 16})).await?;
            }
            let extra_rx = FakeReceiver::start().await?;
            if extra == Some(Extra::Hang) {
                extra_rx.set_default(Answer::hang());
            }
            if extra.is_some() {
                api.endpoint("bench", json!({"url": extra_rx.url(), "event_types": ["slow"], "rate_per_sec": 10_000, "burst": 100, "max_in_flight": 16, "timeout": "30s"})).await?;
            }
            let total = (rate * seconds) as usize;
            let acks = Arc::new(Mutex::new(HashMap::with_capacity(total)));
            let cpu_before = cpu_seconds(node.pid())?;
            let writer_before = thread_cpu_seconds(node.pid(), WRITER_THREAD)?;
            let start = Instant::now();
            let mut tasks = Vec::new();
            for i in 0..total {
                let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
                tokio::time::sleep_until(due.into()).await;
                let (client, acks) = (api.clone(), acks.clone());
                let ty = format!("fast.{}", i % endpoints);
                tasks.push(tokio::spawn(async move {
                    let id = format!("evt_{i}");
                    let sent = Instant::now();
                    let r = client
                        .post(
                            "/v1/tenants/bench/events",
                            ADMIN_TOKEN,
                            json!({"id": id, "type": ty, "payload": {"n": i}}),
                        )
                        .await?;
                    if r.status != 202 {
                        bail!("{} {}", r.status, r.text);
                    }
                    acks.lock().unwrap().insert(id, (sent, Instant::now()));
                    anyhow::Ok(())
                }));
                if extra.is_some() && i % 10 == 0 {
                    let api = api.clone();
                    tasks.push(tokio::spawn(async move {
                        api.post("/v1/tenants/bench/events", ADMIN_TOKEN, json!({"type": "slow", "payload": {}}))
                            .await?;
                        anyhow::Ok(())
                    }));
                }
            }
            for t in tasks {
                t.await??;
            }
            rx.wait_for(total, Duration::from_secs(60)).await?;
            let got = arrivals(&rx);
            let acks = acks.lock().unwrap();
            let mut l: Vec<f64> = acks
                .iter()
                .map(|(id, (_, ack))| {
                    got.get(id).map_or(f64::NAN, |at| at.saturating_duration_since(*ack).as_secs_f64() * 1000.0)
                })
                .collect();
            l.sort_by(f64::total_cmp);
            out.insert("p50_ms".into(), percentile(&l, 0.5));
            out.insert("p99_ms".into(), percentile(&l, 0.99));
            // Post to 202: what a producer waits for, the durable intake commit included.
            let mut a: Vec<f64> =
                acks.values().map(|(sent, ack)| ack.duration_since(*sent).as_secs_f64() * 1000.0).collect();
            a.sort_by(f64::total_cmp);
            out.insert("ack_p50_ms".into(), percentile(&a, 0.5));
            out.insert("ack_p99_ms".into(), percentile(&a, 0.99));
            out.insert("extra_requests".into(), extra_rx.count() as f64);
            let delivered = (total + extra_rx.count()) as f64;
            let cpu = cpu_seconds(node.pid())? - cpu_before;
            out.insert("node_cpu_ms_per_delivery".into(), cpu * 1e3 / delivered);
            // Of which the SQLite writer thread (zero on Postgres): commits, pages, syncs.
            let writer = thread_cpu_seconds(node.pid(), WRITER_THREAD)? - writer_before;
            out.insert("writer_cpu_ms_per_delivery".into(), writer * 1e3 / delivered);
        }
        Scenario::FanoutTail { events, endpoints, concurrency, rate, filter } => {
            let shape = load::Shape { events, endpoints, concurrency, rate, filter };
            load::posting_while_delivering(&api, &rx, node.pid(), schema.as_ref(), shape, &mut out).await?;
        }
        Scenario::Concurrent { events, concurrency } => {
            let shape = load::Shape { events, endpoints: 1, concurrency, rate: None, filter: false };
            load::posting_while_delivering(&api, &rx, node.pid(), schema.as_ref(), shape, &mut out).await?;
        }
        Scenario::Pacing { rate, seconds } => {
            api.endpoint("bench", json!({"url": rx.url(), "rate_per_sec": rate, "burst": 1, "max_in_flight": 64}))
                .await?;
            let total = (rate * seconds as f64) as usize + 1;
            post_numbered(&api, "t", total).await?;
            let got = rx.wait_for(total, Duration::from_secs(seconds * 2 + 30)).await?;
            let mut at: Vec<Instant> = got.iter().map(|r| r.at).collect();
            at.sort();
            let span = at.last().context("arrivals")?.duration_since(at[0]).as_secs_f64();
            let achieved = (at.len() - 1) as f64 / span;
            out.insert("set_rate".into(), rate);
            out.insert("achieved_rate".into(), achieved);
            out.insert("error_pct".into(), (achieved - rate) / rate * 100.0);
        }
        Scenario::OrderedTail { rate, seconds, keys } => {
            ordered::ordered_tail(&api, &rx, rate, seconds, keys, &mut out).await?;
        }
        Scenario::RateChange { events } => {
            let patch_via = _others.last().map_or(&api, |(other, _)| &other.api);
            rate_change(&api, patch_via, &rx, events, &mut out).await?;
        }
        Scenario::IsolationPlugins(params) => {
            isolation::run(&api, node.pid(), &params, &mut out).await?;
        }
        Scenario::FirstCall { rounds } => firstcall::run(&api, rounds, &mut out).await?,
        Scenario::PluginCalls { .. }
        | Scenario::Restart { .. }
        | Scenario::Outbox { .. }
        | Scenario::JsCalls { .. }
        | Scenario::JsTenants { .. }
        | Scenario::Scale { .. } => unreachable!("handled above"),
    }
    Ok(out)
}

/// The `rate-change` case: queue `events` behind a 0.01/s endpoint (its first goes at
/// once, the next is due 100 s later), PATCH it to 100,000/s through `patch_via`, and time
/// the first arrival after the PATCH and the whole drain.
async fn rate_change(
    api: &tests::Api,
    patch_via: &tests::Api,
    rx: &FakeReceiver,
    events: usize,
    out: &mut HashMap<String, f64>,
) -> anyhow::Result<()> {
    let ep =
        api.endpoint("bench", json!({"url": rx.url(), "rate_per_sec": 0.01, "burst": 1, "max_in_flight": 64})).await?;
    let id = ep["id"].as_str().context("endpoint id")?;
    post_numbered(api, "t", events).await?;
    rx.wait_for(1, Duration::from_secs(30)).await?;
    let before = rx.count();
    let patched = Instant::now();
    let r = patch_via
        .call(
            "PATCH",
            &format!("/v1/tenants/bench/endpoints/{id}"),
            ADMIN_TOKEN,
            Some(json!({"rate_per_sec": 100_000})),
        )
        .await?;
    if r.status != 200 {
        bail!("PATCH: {} {}", r.status, r.text);
    }
    let got = rx.wait_for(before + 1, Duration::from_secs(300)).await?;
    let first = got.iter().map(|r| r.at).filter(|at| *at >= patched).min().context("an arrival after the PATCH")?;
    rx.wait_for(events, Duration::from_secs(300)).await?;
    let last = rx.received().iter().map(|r| r.at).max().context("arrivals")?;
    out.insert("patch_to_first_ms".into(), first.duration_since(patched).as_secs_f64() * 1000.0);
    out.insert("drain_s".into(), last.duration_since(patched).as_secs_f64());
    Ok(())
}

fn wasm(file: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(wasm_dir().join(format!("{file}.wasm"))).context("build the plugins first: scripts/build-plugins")
}

async fn upload_plugin(api: &tests::Api, tenant: &str, name: &str, bytes: Vec<u8>) -> anyhow::Result<()> {
    let r = api.raw("PUT", &format!("/v1/tenants/{tenant}/plugins/{name}"), Some(ADMIN_TOKEN), bytes).await?;
    if r.status != 200 {
        bail!("upload {name}: {} {}", r.status, r.text);
    }
    Ok(())
}

/// Posts `count` events of `event_type` (payload `{"n": i}`) to tenant `bench`, in batches
/// of 1,000.
async fn post_numbered(api: &tests::Api, event_type: &str, count: usize) -> anyhow::Result<()> {
    post_keyed(api, event_type, count, 0).await
}

/// [`post_numbered`], event `i` with `ordering_key` `k{i % keys}` (none when `keys` is 0).
async fn post_keyed(api: &tests::Api, event_type: &str, count: usize, keys: usize) -> anyhow::Result<()> {
    for start in (0..count).step_by(1000) {
        let event = |i: usize| match keys {
            0 => json!({"type": event_type, "payload": {"n": i}}),
            k => json!({"type": event_type, "payload": {"n": i}, "ordering_key": format!("k{}", i % k)}),
        };
        let chunk: Vec<Value> = (start..count.min(start + 1000)).map(event).collect();
        let r = api.post("/v1/tenants/bench/events/batch", ADMIN_TOKEN, json!({"events": chunk})).await?;
        if r.status != 202 {
            bail!("{} {}", r.status, r.text);
        }
    }
    Ok(())
}

/// Delivers `events` events (in batches, to a receiver of their own) before a measurement
/// starts, and waits until all have arrived: a store with history, not an empty one.
async fn deliver_history(api: &tests::Api, events: usize) -> anyhow::Result<()> {
    let rx = FakeReceiver::start().await?;
    let spec = json!({"url": rx.url(), "event_types": ["history"], "rate_per_sec": 100_000, "burst": 1000});
    api.endpoint("bench", spec).await?;
    post_numbered(api, "history", events).await?;
    rx.wait_for(events, Duration::from_secs(300)).await.map(drop)
}

/// Installs `plugins` distinct copies of the transform example (each compiled once, into
/// the node's compile cache), then kills the node and times its restart.
async fn restart(plugins: usize) -> anyhow::Result<HashMap<String, f64>> {
    let bin = herald_binary()?;
    let dir = tempfile::tempdir()?;
    let limit = plugins.to_string();
    let env = [("HERALD_LOG_LEVEL", "error"), ("HERALD_PLUGINS_MAX_PLUGINS_PER_TENANT", limit.as_str())];
    let mut node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    let api = node.api.clone();
    api.tenant("bench").await?;
    let chat = std::fs::read(wasm_dir().join("transform_chat.wasm"))
        .context("build the plugins first: scripts/build-plugins")?;
    for i in 0..plugins {
        let bytes = tests::with_custom_section(chat.clone(), &format!("v{i}"));
        let r = api.raw("PUT", &format!("/v1/tenants/bench/plugins/p{i:03}"), Some(ADMIN_TOKEN), bytes).await?;
        if r.status != 200 {
            bail!("upload p{i:03}: {} {}", r.status, r.text);
        }
    }
    let rx = FakeReceiver::start().await?;
    let last = format!("p{:03}", plugins.saturating_sub(1));
    api.endpoint("bench", json!({"url": rx.url(), "plugins": {"transform": last}})).await?;
    node.kill();

    let started = Instant::now();
    let node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    let ready = started.elapsed();
    let api = node.api.clone();
    api.event("bench", json!({"type": "user.created", "payload": {"name": "Ada"}})).await?;
    let mut all_loaded = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while all_loaded.is_none() || rx.count() == 0 {
        if Instant::now() > deadline {
            bail!("restart: not ready after 60 s");
        }
        if all_loaded.is_none() {
            let list = api.get("/v1/tenants/bench/plugins", ADMIN_TOKEN).await?;
            let items = list.json["data"].as_array().cloned().unwrap_or_default();
            if items.len() == plugins && items.iter().all(|p| p["loading"] == false && p["error"].is_null()) {
                all_loaded = Some(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let first_delivery = rx.received()[0].at.duration_since(started);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Ok(HashMap::from([
        ("ready_ms".to_string(), ms(ready)),
        ("all_plugins_ms".to_string(), ms(all_loaded.unwrap_or_default())),
        ("first_delivery_ms".to_string(), ms(first_delivery)),
    ]))
}

/// A typical event schema: an object of 10 typed properties, 4 of them required, with
/// formats (`date-time`, `email`), a pattern, an enum and a nested array of objects.
fn bench_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "required": ["invoice_id", "customer_id", "amount", "currency"],
        "properties": {
            "invoice_id": {"type": "string", "pattern": "^inv_[0-9]+$"},
            "customer_id": {"type": "string", "minLength": 1, "maxLength": 64},
            "email": {"type": "string", "format": "email"},
            "amount": {"type": "integer", "minimum": 0},
            "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]},
            "paid_at": {"type": "string", "format": "date-time"},
            "paid": {"type": "boolean"},
            "note": {"type": "string", "maxLength": 1000},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
            "lines": {"type": "array", "items": {
                "type": "object", "required": ["sku", "qty"],
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}, "price": {"type": "number"}},
            }},
        },
    })
}

/// A payload of about 1 KiB that fits [`bench_schema`].
fn bench_payload(i: usize) -> String {
    let lines: Vec<serde_json::Value> =
        (0..13).map(|l| json!({"sku": format!("sku_{l:04}_widget"), "qty": l + 1, "price": 19.99})).collect();
    json!({
        "invoice_id": format!("inv_{i}"),
        "customer_id": "cus_0123456789abcdef",
        "email": "billing@example.com",
        "amount": 1999 + i,
        "currency": "EUR",
        "paid_at": "2026-12-03T18:00:00Z",
        "paid": true,
        "note": "Thank you for your business. This invoice covers the subscription period and the add-ons listed below; questions go to billing.",
        "tags": ["subscription", "monthly", "eu", "priority"],
        "lines": lines,
    })
    .to_string()
}
