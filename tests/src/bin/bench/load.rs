//! Load shapes that post with many producers at once while Herald delivers: the fan-out
//! tail (N events × M endpoints) and one endpoint taking intake and delivery together.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;
use tests::pg::PgSchema;
use tests::{ADMIN_TOKEN, Api, FakeReceiver};

use super::pgcpu::PgCpu;
use super::queue::Broker;
use super::{WRITER_THREAD, cpu_seconds, percentile, thread_cpu_seconds};

/// How the producers post: `events` single events by `concurrency` producers, each fanned
/// out to `endpoints` endpoints; as fast as they can, or open loop at `rate` events/s; with
/// [`typical_filter`] on every endpoint, or none.
pub struct Shape {
    pub events: usize,
    pub endpoints: usize,
    pub concurrency: usize,
    pub rate: Option<f64>,
    pub filter: bool,
}

/// A content filter of four clauses (the type, a range of a payload number, a path that
/// must be missing) that every event the benchmarks post matches (`{"n": i, …}`).
pub fn typical_filter() -> serde_json::Value {
    json!({"type": {"$in": ["invoice.paid", "invoice.created"]},
           "data.n": {"$gte": 0, "$lt": 1_000_000_000}, "data.test": {"$exists": false}})
}

/// Posts single events as `shape` says, every endpoint of tenant `bench` subscribed, and
/// measures 202→arrival of each (event, endpoint) pair and the
/// deliveries/s from the first post to the last arrival, the node's CPU per delivery and
/// its SQLite writer thread's; on Postgres (`pg`) also the server's CPU per delivery.
pub async fn posting_while_delivering(
    api: &Api,
    rx: &FakeReceiver,
    pid: u32,
    pg: Option<&PgSchema>,
    Shape { events, endpoints, concurrency, rate, filter }: Shape,
    out: &mut HashMap<String, f64>,
) -> anyhow::Result<()> {
    for i in 0..endpoints {
        let mut spec = json!({"url": format!("{}/{i}", rx.url()), "rate_per_sec": 100_000, "burst": 1000,
            "max_in_flight": (256 / endpoints).max(4)});
        if filter {
            spec["filter"] = typical_filter();
        }
        api.endpoint("bench", spec).await?;
    }
    let acks = Arc::new(Mutex::new(HashMap::with_capacity(events)));
    let next = Arc::new(AtomicUsize::new(0));
    let pg_cpu = match pg {
        Some(schema) => Some(PgCpu::start(schema).await?),
        None => None,
    };
    let cpu_before = cpu_seconds(pid)?;
    let writer_before = thread_cpu_seconds(pid, WRITER_THREAD)?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (api, acks, next) = (api.clone(), acks.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= events {
                    return anyhow::Ok(());
                }
                if let Some(rate) = rate {
                    tokio::time::sleep_until((start + Duration::from_secs_f64(i as f64 / rate)).into()).await;
                }
                let id = format!("evt_{i}");
                let body = json!({"id": id, "type": "invoice.paid", "payload": {"n": i, "amount": 1999}});
                let r = api.post("/v1/tenants/bench/events", ADMIN_TOKEN, body).await?;
                if r.status != 202 {
                    bail!("{} {}", r.status, r.text);
                }
                acks.lock().unwrap().insert(id, Instant::now());
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let posted = start.elapsed().as_secs_f64();
    let total = events * endpoints;
    let got = rx.wait_for(total, Duration::from_secs(300)).await?;
    let last = got.iter().map(|r| r.at).max().unwrap_or_else(Instant::now);
    let cpu = cpu_seconds(pid)? - cpu_before;
    // SQLite's writer thread (zero on Postgres): the intake commits, where fan-out runs,
    // and the claims and results.
    let writer = thread_cpu_seconds(pid, WRITER_THREAD)? - writer_before;
    if let Some(pg_cpu) = pg_cpu {
        let (backends, writers) = pg_cpu.stop().await?;
        out.insert("pg_cpu_us_per_delivery".into(), (backends + writers) * 1e6 / total as f64);
        out.insert("pg_writers_us_per_delivery".into(), writers * 1e6 / total as f64);
    }
    let acks = std::mem::take(&mut *acks.lock().unwrap());
    let mut l: Vec<f64> = got
        .iter()
        .filter_map(|r| Some(r.at.saturating_duration_since(*acks.get(r.header("webhook-id")?)?)))
        .map(|d| d.as_secs_f64() * 1000.0)
        .collect();
    if l.len() != total {
        bail!("{} arrivals matched a 202 of {total}", l.len());
    }
    if let Ok(path) = std::env::var("HERALD_BENCH_DUMP") {
        dump(api, &path, &got, &acks, start).await?;
    }
    l.sort_by(f64::total_cmp);
    let secs = last.duration_since(start).as_secs_f64();
    out.insert("p50_ms".into(), percentile(&l, 0.5));
    out.insert("p99_ms".into(), percentile(&l, 0.99));
    out.insert("max_ms".into(), percentile(&l, 1.0));
    out.insert("deliveries_per_s".into(), total as f64 / secs);
    out.insert("events_per_s".into(), events as f64 / posted);
    out.insert("node_cpu_us_per_delivery".into(), cpu * 1e6 / total as f64);
    out.insert("writer_cpu_us_per_delivery".into(), writer * 1e6 / total as f64);
    Ok(())
}

/// `HERALD_BENCH_DUMP=FILE`: where a run's tail comes from. FILE gets one line per delivery
/// (ms from the first post to its 202 and to its arrival, the endpoint's path, the
/// latency), FILE.metrics the node's `/metrics` after the run (claims, commit times). Each
/// run overwrites them: with `--runs N`, the last run's.
async fn dump(
    api: &Api,
    path: &str,
    got: &[tests::Received],
    acks: &HashMap<String, Instant>,
    start: Instant,
) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    let metrics = api.raw("GET", "/metrics", None, "").await?;
    std::fs::write(format!("{path}.metrics"), &metrics.text)?;
    let mut out = String::from("# ack_ms arrival_ms path latency_ms\n");
    for r in got {
        let Some(ack) = r.header("webhook-id").and_then(|id| acks.get(id)) else { continue };
        let (a, t) = (ack.duration_since(start).as_secs_f64() * 1e3, r.at.duration_since(start).as_secs_f64() * 1e3);
        writeln!(out, "{a:.2} {t:.2} {} {:.2}", r.path, (t - a).max(0.0))?;
    }
    std::fs::write(path, out)?;
    Ok(())
}

/// `deliver --batch N`: the same events delivered to one endpoint without batching and with
/// batches of `batch` (waiting at most `wait`), one after the other on the same node, in the
/// order `batch_first` says (runs alternate it): deliveries/s (first post to last arrival),
/// 202→arrival p50/p99 of every event (`http` only: a broker's messages are counted, not
/// timed), node CPU per delivery and the requests made (the receiver's count, or the node's
/// `herald_attempts_total` for a broker `kind`, one per pipelined round), each as `none_…`
/// and `batch_…`, and `ratio` (batch over none deliveries/s).
pub async fn batch_against_none(
    api: &Api,
    pid: u32,
    (events, batch, wait, kind): (usize, usize, &str, &str),
    batch_first: bool,
    out: &mut HashMap<String, f64>,
) -> anyhow::Result<()> {
    let variants = if batch_first { ["batch", "none"] } else { ["none", "batch"] };
    for variant in variants {
        let rx = FakeReceiver::start().await?;
        let broker = Broker::open(kind).await?;
        let mut spec = json!({"url": rx.url(), "event_types": [format!("{variant}.paid")], "rate_per_sec": 100_000,
            "burst": 1000, "max_in_flight": 256});
        if let Some(b) = &broker {
            b.target(&mut spec);
        }
        if variant == "batch" {
            spec["batch"] = json!({"max_events": batch, "max_wait": wait});
        }
        api.endpoint("bench", spec).await?;
        let (cpu_before, requests_before) = (cpu_seconds(pid)?, requests_made(api).await?);
        let start = Instant::now();
        let acked = post_timed(api, &format!("{variant}.paid"), events).await?;
        let (secs, requests) = match broker {
            Some(b) => {
                b.wait_for(events, Duration::from_secs(300)).await?;
                let secs = start.elapsed().as_secs_f64();
                b.clean().await?;
                (secs, requests_made(api).await? - requests_before)
            }
            None => {
                let arrived = arrivals(&rx, events, Duration::from_secs(300)).await?;
                let secs = arrived.iter().flatten().max().map_or(0.0, |at| at.duration_since(start).as_secs_f64());
                let mut l: Vec<f64> = arrived
                    .iter()
                    .zip(&acked)
                    .filter_map(|(at, ack)| Some(at.as_ref()?.saturating_duration_since(*ack).as_secs_f64() * 1000.0))
                    .collect();
                l.sort_by(f64::total_cmp);
                out.insert(format!("{variant}_p50_ms"), percentile(&l, 0.5));
                out.insert(format!("{variant}_p99_ms"), percentile(&l, 0.99));
                (secs, rx.count() as f64)
            }
        };
        out.insert(format!("{variant}_deliveries_per_s"), events as f64 / secs);
        out.insert(format!("{variant}_requests"), requests);
        out.insert(
            format!("{variant}_node_cpu_us_per_delivery"),
            (cpu_seconds(pid)? - cpu_before) * 1e6 / events as f64,
        );
    }
    out.insert("ratio".into(), out["batch_deliveries_per_s"] / out["none_deliveries_per_s"]);
    Ok(())
}

/// The node's `herald_attempts_total`: the requests (and pipelined rounds) it made.
async fn requests_made(api: &Api) -> anyhow::Result<f64> {
    let text = api.raw("GET", "/metrics", None, "").await?.text;
    let line = text.lines().find(|l| l.starts_with("herald_attempts_total ")).unwrap_or("herald_attempts_total 0");
    Ok(line.rsplit(' ').next().unwrap_or("0").parse()?)
}

/// Posts `count` events of `event_type` (payload `{"n": i}`) in batches of 1,000; when
/// each was acknowledged (its batch's 202).
async fn post_timed(api: &Api, event_type: &str, count: usize) -> anyhow::Result<Vec<Instant>> {
    let mut acked = Vec::with_capacity(count);
    for start in (0..count).step_by(1000) {
        let end = count.min(start + 1000);
        let chunk: Vec<_> = (start..end).map(|i| json!({"type": event_type, "payload": {"n": i}})).collect();
        let r = api.post("/v1/tenants/bench/events/batch", ADMIN_TOKEN, json!({"events": chunk})).await?;
        if r.status != 202 {
            bail!("{} {}", r.status, r.text);
        }
        acked.resize(end, Instant::now());
    }
    Ok(acked)
}

/// Waits until every event `0..count` arrived at `rx` (alone or in batches); when each
/// first arrived.
async fn arrivals(rx: &FakeReceiver, count: usize, timeout: Duration) -> anyhow::Result<Vec<Option<Instant>>> {
    let deadline = Instant::now() + timeout;
    let (mut at, mut seen, mut read) = (vec![None; count], 0, 0);
    loop {
        let got = rx.received();
        for r in &got[read..] {
            let body = r.json();
            let one = [body.clone()];
            let events = match body["data"].as_array() {
                Some(list) if body["type"] == "batch" => list.as_slice(),
                _ => &one[..],
            };
            for e in events {
                let n = e["data"]["n"].as_u64().unwrap_or(u64::MAX) as usize;
                if let Some(slot @ None) = at.get_mut(n) {
                    *slot = Some(r.at);
                    seen += 1;
                }
            }
        }
        read = got.len();
        if seen == count {
            return Ok(at);
        }
        if Instant::now() > deadline {
            bail!("{seen} of {count} events arrived within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
