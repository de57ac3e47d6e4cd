//! `isolation-plugins` (issue 48.16): does a tenant whose plugins burn their budget, or
//! misbehave in every way the hostile guest knows, delay another tenant's deliveries?
//!
//! On one node: tenant `good` posts `rate` events/s, each delivered to two endpoints (one
//! with no plugin, one with the hostile guest's pass-through `transform`); tenant `slow`
//! posts `slow_rate` events/s to an endpoint whose `transform` does legal work of about
//! `slow_ms` of CPU (the guest's `burn` mode, calibrated in process first). Three phases
//! of `seconds` each, on the same node:
//! - `alone`: good and slow only (the baseline);
//! - `burners`: tenant `evil` also posts `burn_rate` events/s to each of `burners`
//!   endpoints whose `transform` spins until the budget stops it;
//! - `hostile`: the burners, plus `hostile_endpoints` more of evil's endpoints spread over
//!   every hostile mode (print, panic, exit, fail, socket, spin, alloc, huge), each mode
//!   posted `hostile_rate` events/s.
//!
//! Reports good's 202→arrival and post→arrival p50/p99 per phase (over both its endpoints), the ratios
//! to `alone`, `/healthz` p99, the node's CPU, and the slow plugin's `plugin:timeout`
//! count over the run (it must stay 0: its calls are within their budget).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Api, FakeReceiver};

use super::{cpu_seconds, percentile, wasm};

/// Every misbehaviour of the hostile guest (`tests/guests/hostile`).
const HOSTILE_MODES: [&str; 8] = ["print", "panic", "exit", "fail", "socket", "spin", "alloc", "huge"];

/// The `isolation-plugins` scenario's arguments.
#[derive(clap::Args, Clone)]
pub(crate) struct Params {
    #[arg(long, default_value_t = 100)]
    pub(crate) rate: u64,
    #[arg(long, default_value_t = 10)]
    pub(crate) seconds: u64,
    #[arg(long, default_value_t = 10)]
    pub(crate) slow_rate: u64,
    #[arg(long, default_value_t = 9.0)]
    pub(crate) slow_ms: f64,
    #[arg(long, default_value_t = 7)]
    pub(crate) burners: usize,
    #[arg(long, default_value_t = 4)]
    pub(crate) burn_rate: u64,
    #[arg(long, default_value_t = 44)]
    pub(crate) hostile_endpoints: usize,
    /// Events/s of each hostile mode (each fanned out to that mode's endpoints).
    #[arg(long, default_value_t = 1)]
    pub(crate) hostile_rate: u64,
    /// The burners' plugin in JavaScript, `for (;;) {}` (needs scripts/build-js-runtime).
    #[arg(long, default_value_t = false)]
    pub(crate) js: bool,
}

/// `burn_iterations` for about `ms` of CPU per call, timed in process through the real host
/// (the fastest of 20 calls: the one the machine did not preempt).
pub(crate) fn calibrate(ms: f64) -> anyhow::Result<u64> {
    use gateway::plugin::*;
    let hostile = wasm("hostile")?;
    let time = |iterations: u64| -> anyhow::Result<f64> {
        let dir = tempfile::tempdir()?;
        let mut cfg = PluginConfig::new(dir.path());
        cfg.watch = false;
        cfg.call_timeout = Duration::from_secs(5);
        let config = HashMap::from([("burn_iterations".to_string(), iterations.to_string())]);
        cfg.plugin_config.insert(("cal".into(), "burn".into()), config);
        let host = PluginHost::start(cfg)?;
        host.install_blocking("cal", "burn", &hostile)?;
        let ctx = DeliveryContext { event_type: "x.burn".into(), ..super::bench_context() };
        let request = Request { headers: Vec::new(), body: b"{}".to_vec() };
        let rt = tokio::runtime::Builder::new_current_thread().build()?;
        let mut best = f64::MAX;
        for _ in 0..20 {
            let t = Instant::now();
            rt.block_on(host.transform("cal", "burn", &ctx, &request)).map_err(|f| anyhow::anyhow!("burn: {f}"))?;
            best = best.min(t.elapsed().as_secs_f64() * 1000.0);
        }
        Ok(best)
    };
    let probe = 2_000_000;
    let iterations = (probe as f64 * ms / time(probe)?) as u64;
    Ok(iterations)
}

pub(crate) async fn run(api: &Api, pid: u32, p: &Params, out: &mut HashMap<String, f64>) -> anyhow::Result<()> {
    let iterations = {
        let ms = p.slow_ms;
        tokio::task::spawn_blocking(move || calibrate(ms)).await??
    };
    let hostile = wasm("hostile")?;
    // good: two endpoints, one through a pass-through transform.
    api.tenant("good").await?;
    upload(api, "good", "pass", hostile.clone()).await?;
    let (good_plain, good_plugged) = (FakeReceiver::start().await?, FakeReceiver::start().await?);
    let fast = json!({"rate_per_sec": 10_000, "burst": 100, "max_in_flight": 16});
    api.endpoint("good", with(&fast, json!({"url": good_plain.url()}))).await?;
    api.endpoint("good", with(&fast, json!({"url": good_plugged.url(), "plugins": {"transform": "pass"}}))).await?;
    // slow: legal work of about `slow_ms`, one attempt (a timeout is not retried away).
    api.tenant("slow").await?;
    upload(api, "slow", "burn", hostile.clone()).await?;
    let r = api
        .call(
            "PUT",
            "/v1/tenants/slow/plugins/burn/config",
            ADMIN_TOKEN,
            Some(json!({"values": {"burn_iterations": iterations.to_string()}})),
        )
        .await?;
    if r.status != 200 {
        bail!("slow's config: {} {}", r.status, r.text);
    }
    let slow_rx = FakeReceiver::start().await?;
    let once = json!({"retry": {"max_attempts": 1}});
    api.endpoint("slow", with(&fast, with(&once, json!({"url": slow_rx.url(), "plugins": {"transform": "burn"}}))))
        .await?;
    // evil: burners, and endpoints for every hostile mode.
    api.tenant("evil").await?;
    let spin = match p.js {
        true => b"function transform(ctx, req) { for (;;) {} }".to_vec(),
        false => hostile.clone(),
    };
    upload(api, "evil", "spin", spin).await?;
    upload(api, "evil", "hostile", hostile).await?;
    let evil_rx = FakeReceiver::start().await?;
    let evil = with(&fast, with(&once, json!({"url": evil_rx.url()})));
    for _ in 0..p.burners {
        let spec = json!({"event_types": ["burn.spin"], "plugins": {"transform": "spin"}});
        api.endpoint("evil", with(&evil, spec)).await?;
    }
    for i in 0..p.hostile_endpoints {
        let mode = HOSTILE_MODES[i % HOSTILE_MODES.len()];
        let spec = json!({"event_types": [format!("hostile.{mode}")], "plugins": {"transform": "hostile"}});
        api.endpoint("evil", with(&evil, spec)).await?;
    }
    out.insert("slow_burn_iterations".into(), iterations as f64);

    let slow_stop = Arc::new(AtomicBool::new(false));
    let slow = tokio::spawn(post_at(api.clone(), "slow", vec!["slow.burn".into()], p.slow_rate, slow_stop.clone()));
    for phase in ["alone", "burners", "hostile"] {
        let stop = Arc::new(AtomicBool::new(false));
        let mut attacks = Vec::new();
        if phase != "alone" {
            attacks.push(tokio::spawn(post_at(
                api.clone(),
                "evil",
                vec!["burn.spin".into()],
                p.burn_rate,
                stop.clone(),
            )));
        }
        if phase == "hostile" {
            for mode in HOSTILE_MODES {
                let types = vec![format!("hostile.{mode}")];
                attacks.push(tokio::spawn(post_at(api.clone(), "evil", types, p.hostile_rate, stop.clone())));
            }
        }
        let health = tokio::spawn(healthz(api.clone(), stop.clone()));
        // Let the attack reach its steady state before measuring (the baseline too, for
        // the same shape).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let cpu_before = cpu_seconds(pid)?;
        let (mut ms, mut sent_ms) = good_steady(api, [&good_plain, &good_plugged], phase, p.rate, p.seconds).await?;
        out.insert(format!("{phase}_node_cpu_pct"), (cpu_seconds(pid)? - cpu_before) / p.seconds as f64 * 100.0);
        stop.store(true, Ordering::Relaxed);
        let mut health = health.await??;
        let mut evil_events = 0;
        for attack in attacks {
            evil_events += attack.await??;
        }
        ms.sort_by(f64::total_cmp);
        sent_ms.sort_by(f64::total_cmp);
        health.sort_by(f64::total_cmp);
        out.insert(format!("{phase}_p50_ms"), percentile(&ms, 0.5));
        out.insert(format!("{phase}_p99_ms"), percentile(&ms, 0.99));
        out.insert(format!("{phase}_sent_p50_ms"), percentile(&sent_ms, 0.5));
        out.insert(format!("{phase}_sent_p99_ms"), percentile(&sent_ms, 0.99));
        out.insert(format!("{phase}_healthz_p99_ms"), percentile(&health, 0.99));
        if phase != "alone" {
            out.insert(format!("{phase}_evil_events"), evil_events as f64);
            let ratio = out[&format!("{phase}_p99_ms")] / out["alone_p99_ms"];
            out.insert(format!("{phase}_p99_ratio"), ratio);
            let sent_ratio = out[&format!("{phase}_sent_p99_ms")] / out["alone_sent_p99_ms"];
            out.insert(format!("{phase}_sent_p99_ratio"), sent_ratio);
        }
    }
    slow_stop.store(true, Ordering::Relaxed);
    let slow_posted = slow.await??;
    // The slow plugin's failures as the node counts them, once every call of the run has
    // ended (a busy machine leaves a backlog behind the last post; bounded by a minute).
    let settled_by = Instant::now() + Duration::from_secs(60);
    let detail = loop {
        let detail = api.get("/v1/tenants/slow/plugins/burn", ADMIN_TOKEN).await?;
        let calls = detail.json["stats"]["calls"].as_u64().unwrap_or(0);
        if calls >= slow_posted as u64 || Instant::now() > settled_by {
            break detail;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let by_reason = &detail.json["stats"]["failures_by_reason"];
    out.insert("slow_calls".into(), detail.json["stats"]["calls"].as_f64().unwrap_or(f64::NAN));
    out.insert("slow_timeouts".into(), by_reason["timeout"].as_f64().unwrap_or(0.0));
    out.insert("slow_failures".into(), detail.json["stats"]["failures"].as_f64().unwrap_or(f64::NAN));
    out.insert("slow_p99_call_ms".into(), detail.json["stats"]["p99_ms"].as_f64().unwrap_or(f64::NAN));
    out.insert("slow_posted".into(), slow_posted as f64);
    // Which limit stopped each of them: its dead letter's error names it (issue 48.17).
    for (key, n) in slow_timeouts_by_limit(api).await? {
        out.insert(format!("slow_timeouts_{key}"), n as f64);
    }
    let evil = api.get("/v1/tenants/evil/plugins/spin", ADMIN_TOKEN).await?;
    out.insert("spin_timeouts".into(), evil.json["stats"]["failures_by_reason"]["timeout"].as_f64().unwrap_or(0.0));
    Ok(())
}

/// The slow tenant's timeouts by the limit that stopped them, from its dead letters' errors:
/// `fits` (2x the budget, a plugin whose calls fit it), `tolerance` (1.25x), `wall` (the
/// wall-time cap).
async fn slow_timeouts_by_limit(api: &Api) -> anyhow::Result<BTreeMap<&'static str, u64>> {
    let mut counts = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let mut path = "/v1/tenants/slow/dead-letters?limit=1000".to_string();
        if let Some(a) = &after {
            path.push_str(&format!("&after={a}"));
        }
        let page = api.get(&path, ADMIN_TOKEN).await?;
        for d in page.json["data"].as_array().into_iter().flatten() {
            let error = d["last_error"].as_str().unwrap_or("");
            if !error.contains("timeout") {
                continue;
            }
            let key = if error.contains("of wall time") {
                "wall"
            } else if error.contains("whose calls fit") {
                "fits"
            } else {
                "tolerance"
            };
            *counts.entry(key).or_default() += 1;
        }
        match page.json["next_after"].as_str() {
            Some(a) => after = Some(a.to_string()),
            None => return Ok(counts),
        }
    }
}

/// `base` with `more`'s fields set over it.
fn with(base: &Value, more: Value) -> Value {
    let mut v = base.clone();
    if let (Some(v), Value::Object(more)) = (v.as_object_mut(), more) {
        v.extend(more);
    }
    v
}

async fn upload(api: &Api, tenant: &str, name: &str, bytes: Vec<u8>) -> anyhow::Result<()> {
    super::upload_plugin(api, tenant, name, bytes).await
}

/// Posts to `tenant` at `rate` events/s in total, cycling over `types` (open loop: event
/// `i` is due at `i / rate` s) until `stop`; the number posted.
async fn post_at(
    api: Api,
    tenant: &'static str,
    types: Vec<String>,
    rate: u64,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<u64> {
    let start = Instant::now();
    let mut i = 0u64;
    let path = format!("/v1/tenants/{tenant}/events");
    let mut posts = tokio::task::JoinSet::new();
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep_until((start + Duration::from_secs_f64(i as f64 / rate.max(1) as f64)).into()).await;
        let event = json!({"type": types[i as usize % types.len()], "payload": {"n": i}});
        let (api, path) = (api.clone(), path.clone());
        posts.spawn(async move {
            let r = api.post(&path, ADMIN_TOKEN, event).await?;
            if r.status != 202 {
                bail!("{} {}", r.status, r.text);
            }
            anyhow::Ok(())
        });
        i += 1;
        while let Some(done) = posts.try_join_next() {
            done??;
        }
    }
    while let Some(done) = posts.join_next().await {
        done??;
    }
    Ok(i)
}

/// `/healthz` round trips (ms), every 20 ms until `stop`.
async fn healthz(api: Api, stop: Arc<AtomicBool>) -> anyhow::Result<Vec<f64>> {
    let mut ms = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let r = api.raw("GET", "/healthz", None, Vec::new()).await?;
        if r.status != 200 {
            bail!("healthz {}", r.status);
        }
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(ms)
}

/// Posts `rate` events/s for `seconds` to tenant `good` and returns the time from each
/// event's 202 to its arrival at each of `rxs` (both of good's endpoints), and from the
/// start of its POST (a delivery often arrives before the client has read the 202, so
/// that one is 0 more often than not), in ms.
async fn good_steady(
    api: &Api,
    rxs: [&FakeReceiver; 2],
    phase: &str,
    rate: u64,
    seconds: u64,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let total = (rate * seconds) as usize;
    let acks = Arc::new(Mutex::new(HashMap::with_capacity(total)));
    let start = Instant::now();
    let before: Vec<usize> = rxs.iter().map(|rx| rx.count()).collect();
    let mut tasks = Vec::new();
    for i in 0..total {
        tokio::time::sleep_until((start + Duration::from_secs_f64(i as f64 / rate as f64)).into()).await;
        let (api, acks) = (api.clone(), acks.clone());
        let id = format!("{phase}_{i}");
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let r = api
                .post("/v1/tenants/good/events", ADMIN_TOKEN, json!({"id": id, "type": "good.t", "payload": {"n": i}}))
                .await?;
            if r.status != 202 {
                bail!("{} {}", r.status, r.text);
            }
            acks.lock().unwrap().insert(id, (sent, Instant::now()));
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let acks = acks.lock().unwrap().clone();
    let (mut ms, mut sent_ms) = (Vec::with_capacity(total * 2), Vec::with_capacity(total * 2));
    let since = |at: Option<&Instant>, from: Instant| {
        at.map_or(f64::NAN, |at| at.saturating_duration_since(from).as_secs_f64() * 1000.0)
    };
    for (rx, before) in rxs.into_iter().zip(before) {
        rx.wait_for(before + total, Duration::from_secs(60)).await.context("good's deliveries")?;
        let got = super::arrivals(rx);
        for (id, (sent, ack)) in &acks {
            ms.push(since(got.get(id), *ack));
            sent_ms.push(since(got.get(id), *sent));
        }
    }
    Ok((ms, sent_ms))
}
