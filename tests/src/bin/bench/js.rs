//! JavaScript plugin figures (issue 15): per-call cost of a transform of a 1 KiB event and
//! the time to load a tenant's source, in process through the real host; and, on a real
//! node, the memory each of `tenants` tenants' JavaScript plugins costs and the restart
//! with all of them installed. Needs `scripts/build-js-runtime --warm`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use tests::{ADMIN_TOKEN, FakeReceiver, HeraldProcess, herald_binary};

use super::percentile;

/// A reasonable transform: parse the envelope, redact the customer's email, add a field,
/// and send the whole event back as JSON.
const REDACT: &str = r#"
function transform(ctx, req) {
  const event = JSON.parse(herald.text(req.body));
  if (event.data.customer) event.data.customer.email = '[redacted]';
  event.data.delivered_by = 'herald';
  return { tag: 'send', val: { headers: req.headers, body: herald.bytes(JSON.stringify(event)) } };
}
"#;

pub(crate) fn runtime() -> anyhow::Result<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/js-runtime/herald-js.wasm");
    if !path.is_file() {
        bail!("{} is missing: run scripts/build-js-runtime --warm", path.display());
    }
    Ok(path)
}

/// A 1 KiB envelope (1,023 bytes) like the ones Herald sends (`{"id", "type", "timestamp", "data"}`).
fn event_1kib() -> Vec<u8> {
    let lines: Vec<serde_json::Value> =
        (0..21).map(|i| json!({"sku": format!("sku_{i:04}"), "qty": i + 1, "price": 1999 + i})).collect();
    let body = json!({"id": "evt_1", "type": "invoice.paid", "timestamp": "2023-11-14T22:13:20Z",
        "data": {"invoice": "in_123", "amount": 4200, "customer": {"email": "a@example.com", "name": "Ada"}, "lines": lines}});
    serde_json::to_vec(&body).expect("json")
}

/// `js-calls`: p50/p99 µs of the transform (through the call pool, as in the server) and
/// p50/max ms of loading `loads` distinct sources (the upload's validation: the runtime
/// instantiated and the source evaluated by `describe`).
pub(crate) fn calls(calls: usize, loads: usize) -> anyhow::Result<HashMap<String, f64>> {
    use gateway::plugin::*;
    let dir = tempfile::tempdir()?;
    let mut cfg = PluginConfig::new(dir.path().join("plugins"));
    cfg.watch = false;
    cfg.cache_dir = Some(dir.path().join("cache"));
    cfg.js_runtime = Some(runtime()?);
    cfg.max_plugins_per_tenant = loads + 1;
    let host = PluginHost::start(cfg)?;
    let first = Instant::now();
    host.install_blocking("bench", "redact", REDACT.as_bytes())?;
    let mut out = HashMap::from([("first_load_ms".to_string(), first.elapsed().as_secs_f64() * 1000.0)]);
    let mut load_ms: Vec<f64> = (0..loads)
        .map(|i| {
            let source = format!("{REDACT}\n// copy {i}\n");
            let t = Instant::now();
            host.install_blocking("bench", &format!("copy{i}"), source.as_bytes()).expect("install");
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    load_ms.sort_by(f64::total_cmp);
    out.insert("load_p50_ms".into(), percentile(&load_ms, 0.5));
    out.insert("load_max_ms".into(), percentile(&load_ms, 1.0));
    let ctx = super::bench_context();
    let request = Request { headers: vec![("content-type".into(), "application/json".into())], body: event_1kib() };
    out.insert("event_bytes".into(), request.body.len() as f64);
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let mut call = || drop(rt.block_on(host.transform("bench", "redact", &ctx, &request)).expect("transform"));
    super::time_calls("transform", calls, 200, &mut call, &mut out);
    Ok(out)
}

/// Resident memory of a process, in MiB, from `/proc/<pid>/status`.
fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("VmRSS")?;
    let kib: f64 = line.split_whitespace().nth(1).context("VmRSS value")?.parse()?;
    Ok(kib / 1024.0)
}

/// `js-tenants`: `tenants` tenants each upload the transform as JavaScript and get one
/// delivery through it (so each holds a warm instance); reports the node's RSS growth per
/// tenant, then kills the node and times its restart (ready, every plugin serving, first
/// delivery through the last tenant's plugin, to an endpoint created after the restart).
pub(crate) async fn tenants(tenants: usize) -> anyhow::Result<HashMap<String, f64>> {
    let bin = herald_binary()?;
    let dir = tempfile::tempdir()?;
    let runtime = runtime()?.display().to_string();
    let env = [("HERALD_LOG_LEVEL", "error"), ("HERALD_PLUGINS_JS_RUNTIME", runtime.as_str())];
    let mut node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    let api = node.api.clone();
    let rx = FakeReceiver::start().await?;
    let before = rss_mib(node.pid())?;
    for t in 0..tenants {
        let tenant = format!("t{t:03}");
        api.tenant(&tenant).await?;
        let source = format!("{REDACT}\n// tenant {tenant}\n");
        let r = api
            .raw("PUT", &format!("/v1/tenants/{tenant}/plugins/redact"), Some(ADMIN_TOKEN), source.into_bytes())
            .await?;
        if r.status != 200 {
            bail!("upload for {tenant}: {} {}", r.status, r.text);
        }
        api.endpoint(&tenant, json!({"url": rx.url(), "plugins": {"transform": "redact"}})).await?;
        let payload = json!({"customer": {"email": "a@example.com"}});
        api.event(&tenant, json!({"type": "invoice.paid", "payload": payload})).await?;
    }
    rx.wait_for(tenants, Duration::from_secs(120)).await?;
    let after = rss_mib(node.pid())?;
    node.kill();

    let started = Instant::now();
    let node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    let ready = started.elapsed();
    // The loader takes tenants in order, so the last one's plugin serves last. A new
    // endpoint: the killed node's partition leases on the old ones must expire first.
    let last = format!("t{:03}", tenants - 1);
    let plugins = format!("/v1/tenants/{last}/plugins");
    node.api.wait_for(&plugins, Duration::from_secs(60), |v| v["data"][0]["loading"] == false).await?;
    let all_loaded = started.elapsed();
    let fresh = FakeReceiver::start().await?;
    let ep = json!({"url": fresh.url(), "event_types": ["after.restart"], "plugins": {"transform": "redact"}});
    node.api.endpoint(&last, ep).await?;
    node.api.event(&last, json!({"type": "after.restart", "payload": {"customer": {}}})).await?;
    let first_delivery = fresh.wait_for(1, Duration::from_secs(60)).await?[0].at.duration_since(started);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Ok(HashMap::from([
        ("rss_before_mib".to_string(), before),
        ("rss_after_mib".to_string(), after),
        ("rss_per_tenant_mib".to_string(), (after - before) / tenants as f64),
        ("restart_ready_ms".to_string(), ms(ready)),
        ("restart_all_plugins_ms".to_string(), ms(all_loaded)),
        ("restart_first_delivery_ms".to_string(), ms(first_delivery)),
    ]))
}
