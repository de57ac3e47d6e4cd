//! The `scale` case: deliveries/s of a Postgres cluster of 1, 2 and 4 nodes, each node
//! held to a slice of a core and the database to a slice of its own (cgroup v1 CPU
//! quotas), on a Postgres server of the bench's own with `fsync` on. Every size runs on a
//! fresh schema: `endpoints` endpoints, `events` events posted round-robin over the nodes
//! (each fans out to every endpoint), timed from the first post to the last arrival.
//! Reports per size the deliveries/s, the scaling against one node, the imbalance of the
//! work (max/mean of the nodes' attempts) and the share of the database's CPU periods
//! that were throttled (near 1: its slice is the limit).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tests::pg::{OwnPostgres, PgSchema};
use tests::{ADMIN_TOKEN, Api, FakeReceiver, HeraldProcess, eventually, herald_binary};

pub struct Params {
    pub sizes: Vec<usize>,
    pub node_cpu: f64,
    pub db_cpu: f64,
    pub endpoints: usize,
    pub events: usize,
}

pub async fn run(p: &Params) -> anyhow::Result<HashMap<String, f64>> {
    let pg = OwnPostgres::start_durable()?;
    let db = CpuSlice::new("db", p.db_cpu)?;
    let postmaster = pg.postmaster_pid()?;
    db.add(postmaster)?;
    // Its background processes are children started before the move; backends started
    // later inherit the postmaster's group.
    for pid in children(postmaster)? {
        db.add(pid)?;
    }
    let mut out = HashMap::new();
    for &n in &p.sizes {
        let (per_s, imbalance, throttled) = cluster_run(&pg.url(), n, p, &db).await?;
        out.insert(format!("n{n}_deliveries_per_s"), per_s);
        out.insert(format!("n{n}_imbalance"), imbalance);
        out.insert(format!("n{n}_db_throttled"), throttled);
    }
    if let Some(&one) = p.sizes.first() {
        let base = out[&format!("n{one}_deliveries_per_s")];
        for &n in &p.sizes[1..] {
            out.insert(format!("n{n}_scaling"), out[&format!("n{n}_deliveries_per_s")] / base);
        }
    }
    Ok(out)
}

/// One cluster of `n` nodes: (deliveries/s, imbalance, throttled share of the database).
async fn cluster_run(base: &str, n: usize, p: &Params, db: &CpuSlice) -> anyhow::Result<(f64, f64, f64)> {
    let schema = PgSchema::create_in(base).await?;
    let bin = herald_binary()?;
    let rx = FakeReceiver::start().await?;
    let mut nodes = Vec::new();
    let mut slices = Vec::new();
    let mut dirs = Vec::new();
    for i in 0..n {
        let dir = tempfile::tempdir()?;
        let id = format!("bench-node-{i}");
        let env =
            [("HERALD_LOG_LEVEL", "error"), ("HERALD_STORE_URL", schema.url.as_str()), ("HERALD_CLUSTER_NODE_ID", &id)];
        let node = HeraldProcess::start(&bin, dir.path(), &env).await?;
        let slice = CpuSlice::new(&format!("node{i}"), p.node_cpu)?;
        slice.add(node.pid())?;
        nodes.push(node);
        slices.push(slice);
        dirs.push(dir);
    }
    let apis: Vec<Api> = nodes.iter().map(|n| n.api.clone()).collect();
    apis[0].tenant("bench").await?;
    for _ in 0..p.endpoints {
        let spec = json!({"url": rx.url(), "rate_per_sec": 100_000, "burst": 1000, "max_in_flight": 16});
        apis[0].endpoint("bench", spec).await?;
    }
    for api in &apis {
        eventually("every node sees the whole cluster", Duration::from_secs(20), || async {
            let nodes = metric(api, "herald_cluster_nodes").await?;
            // 0: a build from before cluster membership (a base to compare with).
            tests::done_or(nodes == n as f64 || nodes == 0.0, format!("{nodes} of {n}"))
        })
        .await?;
    }
    let total = p.events * p.endpoints;
    let attempts_before = attempts(&apis).await?;
    let throttled_before = db.throttled()?;
    let start = Instant::now();
    let per_post = (1000 / p.endpoints).clamp(1, 100);
    let mut posts = Vec::new();
    for (i, chunk) in (0..p.events).collect::<Vec<_>>().chunks(per_post).enumerate() {
        let events: Vec<Value> = chunk.iter().map(|e| json!({"type": "t", "payload": {"n": e}})).collect();
        let api = apis[i % n].clone();
        posts.push(tokio::spawn(async move {
            let r = api.post("/v1/tenants/bench/events/batch", ADMIN_TOKEN, json!({"events": events})).await?;
            if r.status != 202 {
                bail!("{} {}", r.status, r.text);
            }
            anyhow::Ok(())
        }));
    }
    for post in posts {
        post.await??;
    }
    rx.wait_for(total, Duration::from_secs(600)).await?;
    let secs = start.elapsed().as_secs_f64();
    let (periods, throttled) = db.throttled()?;
    let throttled = (throttled - throttled_before.1) as f64 / (periods - throttled_before.0).max(1) as f64;
    let done: Vec<f64> =
        attempts(&apis).await?.iter().zip(&attempts_before).map(|(after, before)| after - before).collect();
    let mean = done.iter().sum::<f64>() / n as f64;
    let imbalance = done.iter().copied().fold(0.0, f64::max) / mean;
    eprintln!(
        "{n} node(s): {:.0} deliveries/s, attempts per node {done:?}, database throttled {:.0} %",
        total as f64 / secs,
        throttled * 100.0
    );
    drop(nodes);
    drop(slices);
    Ok((total as f64 / secs, imbalance, throttled))
}

async fn attempts(apis: &[Api]) -> anyhow::Result<Vec<f64>> {
    let mut v = Vec::new();
    for api in apis {
        v.push(metric(api, "herald_attempts_total").await?);
    }
    Ok(v)
}

/// A sample's value from a node's `/metrics` (0 when absent).
async fn metric(api: &Api, name: &str) -> anyhow::Result<f64> {
    let text = api.raw("GET", "/metrics", None, "").await?.text;
    let line = text.lines().find(|l| l.split(' ').next() == Some(name));
    Ok(line.and_then(|l| l.split(' ').nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0.0))
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> anyhow::Result<Vec<u32>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let name = entry?.file_name();
        let Some(child) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { continue };
        let ppid =
            stat.rsplit_once(") ").and_then(|(_, rest)| rest.split_whitespace().nth(1)).and_then(|p| p.parse().ok());
        if ppid == Some(pid) {
            found.push(child);
        }
    }
    Ok(found)
}

/// A cgroup v1 CPU group with a quota of `cores` (of a 10 ms period), removed on drop
/// (what still runs in it goes back to the root group first).
struct CpuSlice {
    path: PathBuf,
}

const CPU_ROOT: &str = "/sys/fs/cgroup/cpu";
/// The quota's period, in µs.
const PERIOD_US: u64 = 10_000;

impl CpuSlice {
    fn new(name: &str, cores: f64) -> anyhow::Result<CpuSlice> {
        let path = PathBuf::from(CPU_ROOT).join(format!("herald-bench-{}-{name}", std::process::id()));
        std::fs::create_dir(&path)
            .with_context(|| format!("{}: the scale case needs cgroup v1's cpu controller, as root", path.display()))?;
        let slice = CpuSlice { path };
        // A short period: with the default 100 ms, a node at an eighth of a core runs
        // 12.5 ms and then waits 87.5 ms with its requests and commits stalled, and the
        // figures swing with how the work falls on the periods.
        std::fs::write(slice.path.join("cpu.cfs_period_us"), PERIOD_US.to_string())?;
        std::fs::write(slice.path.join("cpu.cfs_quota_us"), ((cores * PERIOD_US as f64) as u64).to_string())?;
        Ok(slice)
    }

    fn add(&self, pid: u32) -> anyhow::Result<()> {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string()).with_context(|| format!("move {pid}"))
    }

    /// (periods, throttled periods) so far.
    fn throttled(&self) -> anyhow::Result<(u64, u64)> {
        let stat = std::fs::read_to_string(self.path.join("cpu.stat"))?;
        let field =
            |name: &str| -> u64 { stat.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0) };
        Ok((field("nr_periods "), field("nr_throttled ")))
    }
}

impl Drop for CpuSlice {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.path.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(PathBuf::from(CPU_ROOT).join("cgroup.procs"), pid);
            }
        }
        // A process killed just now may take a moment to leave the group.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("could not remove {}", self.path.display());
    }
}
