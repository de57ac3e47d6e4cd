//! `/metrics` under real deliveries: the series move as the deliveries do, on both stores,
//! and the exposition passes `promtool check metrics`. The Grafana dashboard and the alert
//! rules in `config/` pass `promtool check rules` and name only series Herald exports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use gateway::metrics::{Metrics, Snapshot};
use gateway::model::{DeliveryState, EndpointId, EndpointKind, TenantId};
use gateway::plugin::{Hook, PluginFailure, PluginMetrics};
use gateway::store::QueueStats;
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, Backend, FakeReceiver, TestGateway};

tests::backends!(metrics_follow_real_deliveries);

/// Delivered, retried, permanent, disabled, plugin-trapped and backed-up deliveries, each
/// seen in its own series.
async fn metrics_follow_real_deliveries(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    for tenant in ["acme", "evil"] {
        api.tenant(tenant).await?;
    }
    let hostile = std::fs::read(built_plugin("hostile")).context("build the plugins with scripts/build-plugins")?;
    let r = api.raw("PUT", "/v1/tenants/evil/plugins/hostile", Some(ADMIN_TOKEN), hostile).await?;
    assert_eq!(r.status, 200, "{}", r.text);

    let mut receivers = Vec::new();
    for _ in 0..6 {
        receivers.push(FakeReceiver::start().await?);
    }
    let [ok, retry, bad, gone, slow, evil]: [FakeReceiver; 6] =
        receivers.try_into().map_err(|_| anyhow::anyhow!("six receivers"))?;
    retry.script([Answer::status(500), Answer::status(200)]);
    bad.set_default(Answer::status(400));
    gone.set_default(Answer::status(410));
    slow.set_default(Answer::hang());
    let quick_retry = json!({"base": "10ms", "jitter": "none", "max_attempts": 3});
    for rx in [&ok, &retry, &bad] {
        api.endpoint("acme", json!({"url": rx.url(), "event_types": ["t"], "retry": quick_retry})).await?;
    }
    // Three deliveries wait an hour for their retry when a 410 disables the endpoint.
    gone.script([Answer::status(500), Answer::status(500), Answer::status(500)]);
    let slow_retry = json!({"base": "1h", "jitter": "none"});
    api.endpoint("acme", json!({"url": gone.url(), "event_types": ["t", "gone.*"], "retry": slow_retry})).await?;
    let slow_ep = api.endpoint(
        "acme",
        json!({"url": slow.url(), "event_types": ["slow.*"], "rate_per_sec": 1, "burst": 1, "max_in_flight": 1,
                "timeout": "30s"}),
    );
    let slow_id = slow_ep.await?["id"].as_str().context("id")?.to_string();
    api.endpoint("evil", json!({"url": evil.url(), "plugins": {"transform": "hostile"}, "retry": {"max_attempts": 1}}))
        .await?;

    // Three events fail once at the 410 endpoint, one reaches every acme endpoint, twelve
    // more back up behind the hanging one.
    for i in 0..3 {
        assert_eq!(api.event("acme", json!({"type": "gone.t", "payload": {"i": i}})).await?.status, 202);
    }
    api.wait_for("/v1/tenants/acme/deliveries?state=waiting", Duration::from_secs(10), |v| {
        v["data"].as_array().is_some_and(|d| d.len() == 3)
    })
    .await?;
    assert_eq!(api.event("acme", json!({"type": "t", "payload": {}})).await?.status, 202);
    for i in 0..12 {
        let r = api.event("acme", json!({"type": "slow.t", "payload": {"i": i}})).await?;
        assert_eq!(r.status, 202, "{}", r.text);
    }
    for mode in ["panic", "ok"] {
        assert_eq!(api.event("evil", json!({"type": format!("x.{mode}"), "payload": {}})).await?.status, 202);
    }

    let acme = |outcome: &str| {
        format!("herald_delivery_outcomes_total{{tenant=\"acme\",kind=\"http\",outcome=\"{outcome}\"}}")
    };
    let mut want = vec![
        (acme("delivered"), 2.0, 2.0),
        (acme("retried"), 4.0, 4.0),
        (acme("dead"), 2.0, 2.0),
        ("herald_dead_letters_total{tenant=\"acme\",kind=\"http\",reason=\"permanent\"}".into(), 1.0, 1.0),
        // The 410's own delivery, and with it the three waiting for their retry.
        ("herald_dead_letters_total{tenant=\"acme\",kind=\"http\",reason=\"endpoint_disabled\"}".into(), 4.0, 4.0),
        ("herald_dead_letters_total{tenant=\"acme\",kind=\"http\",reason=\"exhausted\"}".into(), 0.0, 0.0),
        ("herald_delivery_outcomes_total{tenant=\"evil\",kind=\"http\",outcome=\"delivered\"}".into(), 1.0, 1.0),
        // A failed transform retries like a failed send, so its one allowed attempt exhausts it.
        ("herald_dead_letters_total{tenant=\"evil\",kind=\"http\",reason=\"exhausted\"}".into(), 1.0, 1.0),
        // The panic traps, or on a busy machine may spend its CPU budget first: either way
        // one failure, with its reason.
        ("herald_plugin_failures_total{tenant=\"evil\",plugin=\"hostile\",hook=\"transform\",".into(), 1.0, 1.0),
        ("herald_plugin_calls_total{tenant=\"evil\",plugin=\"hostile\",hook=\"transform\"}".into(), 2.0, 2.0),
        ("herald_plugin_call_duration_seconds_count{hook=\"transform\"}".into(), 2.0, 2.0),
        ("herald_events_accepted_total".into(), 18.0, 18.0),
        ("herald_intake_commit_duration_seconds_count".into(), 18.0, 18.0),
        ("herald_arrival_latency_seconds_count".into(), 3.0, 3.0),
        ("herald_attempt_duration_seconds_count".into(), 10.0, 10.0),
        ("herald_claim_duration_seconds_count".into(), 1.0, f64::MAX),
        ("herald_requests_in_flight".into(), 1.0, 1.0),
        ("herald_partitions_held".into(), 1.0, 6.0),
        ("herald_endpoints{state=\"disabled\"}".into(), 1.0, 1.0),
        ("herald_endpoints{state=\"active\"}".into(), 5.0, 5.0),
        ("herald_dead_letters_stored{tenant=\"acme\"}".into(), 5.0, 5.0),
        ("herald_dead_letters_stored{tenant=\"evil\"}".into(), 1.0, 1.0),
        ("herald_dead_letters_oldest_age_seconds{tenant=\"acme\"}".into(), 0.0, 60.0),
        // The hanging endpoint holds one request and a claim or two; the rest wait, due.
        ("herald_due_deliveries".into(), 7.0, 12.0),
        (format!("herald_endpoint_due_deliveries{{tenant=\"acme\",endpoint=\"{slow_id}\"}}"), 7.0, 12.0),
    ];
    if backend == Backend::Sqlite {
        want.push(("herald_sqlite_wal_bytes".into(), 1.0, f64::MAX));
    }
    // Well inside the hanging request's 30 s deadline, so nothing retries it meanwhile.
    let text = wait_for_series(api, &want, Duration::from_secs(20)).await?;
    assert!(!text.contains("herald_sqlite_wal_bytes") || backend == Backend::Sqlite, "{text}");
    promtool_check_metrics(&text)?;
    drop(gw);
    Ok(())
}

/// Attempts still in flight when their endpoint is disabled (here by another attempt's
/// 410) end as dead letters when they fail, and `/metrics` counts them as such: with the
/// endpoint's other dead letters, not as retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_whose_endpoint_was_disabled_meanwhile_count_as_its_dead_letters() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let rx = FakeReceiver::start().await?;
    // The first request to arrive disables the endpoint 2 s later, when the other three are
    // in flight; they time out (a retry) 3 s after that.
    rx.script([Answer::status(410).delay(Duration::from_secs(2))]);
    rx.set_default(Answer::hang());
    let spec = json!({"url": rx.url(), "max_in_flight": 4, "rate_per_sec": 1000, "burst": 10, "timeout": "5s",
                      "connect_timeout": "1s"});
    api.endpoint("acme", spec).await?;
    let events: Vec<Value> = (0..4).map(|i| json!({"type": "t", "payload": {"i": i}})).collect();
    let r = api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, json!({"events": events})).await?;
    assert_eq!(r.status, 202, "{}", r.text);
    rx.wait_for(1, Duration::from_secs(10)).await?;
    rx.wait_for(4, Duration::from_millis(1500)).await.context("all four in flight before the 410")?;

    let dead = api
        .wait_for("/v1/tenants/acme/dead-letters", Duration::from_secs(15), |v| {
            v["data"].as_array().is_some_and(|d| d.len() == 4)
        })
        .await?;
    assert!(dead["data"].as_array().into_iter().flatten().all(|d| d["reason"] == "endpoint_disabled"), "{dead}");
    let want = [
        ("herald_dead_letters_total{tenant=\"acme\",kind=\"http\",reason=\"endpoint_disabled\"}".to_string(), 4.0, 4.0),
        ("herald_delivery_outcomes_total{tenant=\"acme\",kind=\"http\",outcome=\"retried\"}".to_string(), 0.0, 0.0),
        ("herald_dead_letters_stored{tenant=\"acme\"}".to_string(), 4.0, 4.0),
    ];
    wait_for_series(api, &want, Duration::from_secs(10)).await?;
    Ok(())
}

/// The dashboard's and the alert rules' expressions are valid PromQL (`promtool check
/// rules`) and every series they name is one Herald exports.
#[test]
fn dashboard_and_alert_rules_use_only_exported_series() -> anyhow::Result<()> {
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config");
    let exported = exported_names();
    let alerts = std::fs::read_to_string(config.join("alerts.yml"))?;
    promtool(&["check", "rules", &config.join("alerts.yml").to_string_lossy()])?;
    for alert in [
        "HeraldOldestDueTooOld",
        "HeraldDeadLettersGrowing",
        "HeraldEndpointDisabled",
        "HeraldPluginFailing",
        "HeraldOutboxLagging",
        "HeraldOutboxRowsParked",
    ] {
        assert!(alerts.contains(&format!("alert: {alert}")), "alerts.yml has no {alert}");
    }

    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(config.join("grafana-dashboard.json"))?)?;
    let panels = dashboard["panels"].as_array().context("panels")?;
    let mut exprs = Vec::new();
    for panel in panels {
        let targets = panel["targets"].as_array().with_context(|| format!("panel without targets: {panel}"))?;
        assert!(!targets.is_empty(), "panel {} shows nothing", panel["title"]);
        exprs.extend(targets.iter().map(|t| t["expr"].as_str().map(String::from).context("a target without expr")));
    }
    let exprs: Vec<String> = exprs.into_iter().collect::<anyhow::Result<_>>()?;
    let titles: Vec<&str> = panels.iter().filter_map(|p| p["title"].as_str()).collect();
    for topic in ["Queue depth", "Delivery rate", "Delivery latency", "Dead letters", "Endpoints", "Plugin failures"] {
        assert!(titles.iter().any(|t| t.starts_with(topic)), "no {topic} panel in {titles:?}");
    }
    // The dashboard's queries, checked as recording rules by the same PromQL parser.
    let dir = tempfile::tempdir()?;
    let rules_path = dir.path().join("dashboard.yml");
    let rules: String = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "      - record: dashboard:query{i}\n        expr: {}\n",
                serde_json::to_string(e).unwrap_or_default()
            )
        })
        .collect();
    std::fs::write(&rules_path, format!("groups:\n  - name: dashboard\n    rules:\n{rules}"))?;
    promtool(&["check", "rules", &rules_path.to_string_lossy()])?;

    let referenced: BTreeSet<String> =
        exprs.iter().map(String::as_str).chain([alerts.as_str()]).flat_map(herald_names).collect();
    let unknown: Vec<&String> = referenced.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(unknown.is_empty(), "series that Herald does not export: {unknown:?}\nexported: {exported:?}");
    assert!(referenced.len() >= 10, "the dashboard and alerts use only {referenced:?}");
    Ok(())
}

/// Every family and sample name of an exposition where every family has a series.
fn exported_names() -> BTreeSet<String> {
    let m = Metrics::new();
    m.tenant("t", EndpointKind::Http).settled(DeliveryState::Delivered, None);
    m.plugin_failed("t", "p", Hook::Transform, &PluginFailure::Timeout(String::new()));
    m.outbox.source("s");
    let t = TenantId::from_stored("t");
    m.set_snapshot(Snapshot {
        taken_at: 1,
        queue: QueueStats {
            due: 1,
            oldest_due: Some(0),
            top_due: vec![(t.clone(), EndpointId::from_stored("ep_1"), 1)],
            endpoints_by_state: vec![("active".into(), 1)],
            dead: vec![(t, 0, 1)],
            wal_bytes: Some(1),
        },
        plugin_instances: 0,
        plugins: vec![PluginMetrics { tenant: "t".into(), name: "p".into(), hook: Hook::Sign, calls: 1, failures: 0 }],
        plugin_latency: vec![("t".into(), "p".into(), 0.001, 0.002)],
    });
    m.render().lines().flat_map(herald_names).collect()
}

/// The `herald_…` names in a text.
fn herald_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("herald_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Scrapes until every `(series, min, max)` holds; fails with the misses and the text.
async fn wait_for_series(api: &tests::Api, want: &[(String, f64, f64)], timeout: Duration) -> anyhow::Result<String> {
    tests::eventually("the series", timeout, || async {
        let r = api.raw("GET", "/metrics", None, "").await?.expect(200)?;
        let misses: Vec<String> = want
            .iter()
            .filter_map(|(series, min, max)| {
                let got = value(&r.text, series);
                (!got.is_some_and(|v| v >= *min && v <= *max))
                    .then(|| format!("{series} = {got:?}, want {min}..={max}"))
            })
            .collect();
        Ok(if misses.is_empty() { Ok(r.text) } else { Err(format!("{}\n\n{}", misses.join("\n"), r.text)) })
    })
    .await
}

/// The value of one series (name with its labels, as rendered); a `series` ending in `,`
/// names the sum of every series whose labels start so.
fn value(text: &str, series: &str) -> Option<f64> {
    if series.ends_with(',') {
        let values = text.lines().filter_map(|l| l.strip_prefix(series)?.rsplit(' ').next()?.parse::<f64>().ok());
        return values.reduce(|a, b| a + b);
    }
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn promtool_check_metrics(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("promtool (package prometheus; scripts/test installs it)")?;
    child.stdin.take().context("stdin")?.write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics: {said}\n{text}");
    Ok(())
}

fn promtool(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .context("promtool (package prometheus; scripts/test installs it)")?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?}: {said}");
    Ok(())
}

fn built_plugin(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../target/wasm32-wasip2/release/{name}.wasm"))
}
