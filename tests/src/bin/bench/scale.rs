//! The `scale` case: deliveries/s of a Postgres cluster of 1, 2 and 4 nodes, each node
//! held to a slice of a core and the database to a slice of its own (cgroup v1 CPU
//! quotas), on a Postgres server of the bench's own with `fsync` on. Every size runs on a
//! fresh schema: `endpoints` endpoints, `events` events posted round-robin over the nodes
//! (each fans out to every endpoint), timed from the first post to the last arrival.
//! Reports per size the deliveries/s, the scaling against one node, the imbalance of the
//! work (max/mean of the nodes' attempts) and the share of the database's CPU periods
//! that were throttled (near 1: its slice is the limit), the CPU each delivery cost the
//! nodes, the database and the bench itself (the load generator and the receiver), and the
//! statements the database ran per delivery with the costliest of them
//! (`pg_stat_statements`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Executor};
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
    let mut stats = PgConnectOptions::from_str(&pg.url())?.application_name("herald-bench").connect().await?;
    stats.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await?;
    let mut out = HashMap::new();
    for &n in &p.sizes {
        let run = cluster_run(&pg.url(), n, p, &db, &mut stats).await?;
        for (name, value) in run {
            out.insert(format!("n{n}_{name}"), value);
        }
    }
    if let Some(&one) = p.sizes.first() {
        let base = out[&format!("n{one}_deliveries_per_s")];
        for &n in &p.sizes[1..] {
            out.insert(format!("n{n}_scaling"), out[&format!("n{n}_deliveries_per_s")] / base);
        }
    }
    Ok(out)
}

/// One cluster of `n` nodes: its figures by name.
async fn cluster_run(
    base: &str,
    n: usize,
    p: &Params,
    db: &CpuSlice,
    stats: &mut PgConnection,
) -> anyhow::Result<Vec<(&'static str, f64)>> {
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
    let node_cpu_before = slices.iter().map(CpuSlice::cpu_ns).sum::<anyhow::Result<u64>>()?;
    let (db_cpu_before, bench_cpu_before) = (db.cpu_ns()?, own_cpu_seconds()?);
    sqlx::query("SELECT pg_stat_statements_reset()").execute(&mut *stats).await?;
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
    let per_delivery = |ns: u64| ns as f64 / 1_000.0 / total as f64;
    let node_us = per_delivery(slices.iter().map(CpuSlice::cpu_ns).sum::<anyhow::Result<u64>>()? - node_cpu_before);
    let db_us = per_delivery(db.cpu_ns()? - db_cpu_before);
    let bench_us = (own_cpu_seconds()? - bench_cpu_before) * 1e6 / total as f64;
    let statements = statements(stats, total).await?;
    let (periods, throttled) = db.throttled()?;
    let throttled = (throttled - throttled_before.1) as f64 / (periods - throttled_before.0).max(1) as f64;
    let done: Vec<f64> =
        attempts(&apis).await?.iter().zip(&attempts_before).map(|(after, before)| after - before).collect();
    let mean = done.iter().sum::<f64>() / n as f64;
    let imbalance = done.iter().copied().fold(0.0, f64::max) / mean;
    eprintln!(
        "{n} node(s): {:.0} deliveries/s, attempts per node {done:?}, database throttled {:.0} %; CPU per delivery: \
         nodes {node_us:.0} µs, database {db_us:.0} µs, bench {bench_us:.0} µs; {statements:.1} statements per delivery",
        total as f64 / secs,
        throttled * 100.0
    );
    drop(nodes);
    drop(slices);
    Ok(vec![
        ("deliveries_per_s", total as f64 / secs),
        ("imbalance", imbalance),
        ("db_throttled", throttled),
        ("node_cpu_us_per_delivery", node_us),
        ("db_cpu_us_per_delivery", db_us),
        ("bench_cpu_us_per_delivery", bench_us),
        ("statements_per_delivery", statements),
    ])
}

/// The statements the database ran since the last reset, per delivery; prints the
/// costliest (by execution time), so a rise in coordination shows by name.
async fn statements(stats: &mut PgConnection, deliveries: usize) -> anyhow::Result<f64> {
    let top: Vec<(i64, f64, String)> = sqlx::query_as(
        "SELECT calls, total_exec_time, query FROM pg_stat_statements \
         WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC LIMIT 8",
    )
    .fetch_all(&mut *stats)
    .await?;
    let calls: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'",
    )
    .fetch_one(&mut *stats)
    .await?;
    for (calls, ms, query) in top {
        let query: String = query.split_whitespace().collect::<Vec<_>>().join(" ");
        let short: String = query.chars().take(110).collect();
        eprintln!("  {calls:>7} calls {ms:>8.0} ms  {short}");
    }
    Ok(calls as f64 / deliveries as f64)
}

/// This process's CPU seconds so far (the load generator and the receiver).
fn own_cpu_seconds() -> anyhow::Result<f64> {
    super::stat_cpu_seconds(&std::fs::read_to_string("/proc/self/stat")?, super::clock_ticks()?)
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

/// A cgroup v1 CPU group with a quota of `cores` (of a 10 ms period), and a `cpuacct` group
/// of the same members that counts their CPU time; both removed on drop (what still runs
/// in them goes back to the root groups first).
struct CpuSlice {
    path: PathBuf,
    acct: PathBuf,
}

const CPU_ROOT: &str = "/sys/fs/cgroup/cpu";
/// cgroup v1's CPU accounting: a hierarchy of its own on this kind of machine.
const ACCT_ROOT: &str = "/sys/fs/cgroup/cpuacct";
/// The quota's period, in µs.
const PERIOD_US: u64 = 10_000;

impl CpuSlice {
    fn new(name: &str, cores: f64) -> anyhow::Result<CpuSlice> {
        let group = format!("herald-bench-{}-{name}", std::process::id());
        let (path, acct) = (PathBuf::from(CPU_ROOT).join(&group), PathBuf::from(ACCT_ROOT).join(&group));
        std::fs::create_dir(&path)
            .with_context(|| format!("{}: the scale case needs cgroup v1's cpu controller, as root", path.display()))?;
        if let Err(e) = std::fs::create_dir(&acct) {
            let _ = std::fs::remove_dir(&path);
            return Err(e).with_context(|| format!("{}: the scale case needs cgroup v1's cpuacct", acct.display()));
        }
        let slice = CpuSlice { path, acct };
        // A short period: with the default 100 ms, a node at an eighth of a core runs
        // 12.5 ms and then waits 87.5 ms with its requests and commits stalled, and the
        // figures swing with how the work falls on the periods.
        std::fs::write(slice.path.join("cpu.cfs_period_us"), PERIOD_US.to_string())?;
        std::fs::write(slice.path.join("cpu.cfs_quota_us"), ((cores * PERIOD_US as f64) as u64).to_string())?;
        Ok(slice)
    }

    fn add(&self, pid: u32) -> anyhow::Result<()> {
        for group in [&self.path, &self.acct] {
            std::fs::write(group.join("cgroup.procs"), pid.to_string()).with_context(|| format!("move {pid}"))?;
        }
        Ok(())
    }

    /// The CPU time its members spent so far, in ns.
    fn cpu_ns(&self) -> anyhow::Result<u64> {
        Ok(std::fs::read_to_string(self.acct.join("cpuacct.usage"))?.trim().parse()?)
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
        for (group, root) in [(&self.path, CPU_ROOT), (&self.acct, ACCT_ROOT)] {
            if let Ok(procs) = std::fs::read_to_string(group.join("cgroup.procs")) {
                for pid in procs.lines() {
                    let _ = std::fs::write(PathBuf::from(root).join("cgroup.procs"), pid);
                }
            }
            // A process killed just now may take a moment to leave the group.
            let removed = (0..50).any(|_| {
                let gone = std::fs::remove_dir(group).is_ok();
                if !gone {
                    std::thread::sleep(Duration::from_millis(20));
                }
                gone
            });
            if !removed {
                eprintln!("could not remove {}", group.display());
            }
        }
    }
}
