//! How a plugin behaves, through the plugin API: calls and failures per hook, failures by
//! reason, p50/p99 call time, and the latest failures with messages and log lines.

use std::time::Duration;

use serde_json::json;
use tests::{ADMIN_TOKEN, FakeReceiver, TestGateway};

use super::{plugin_bytes, upload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_api_shows_calls_failures_by_reason_timings_and_recent_failures() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    assert_eq!(upload(&gw, "acme", "h", plugin_bytes("hostile"), ADMIN_TOKEN).await?.status, 200);
    let rx = FakeReceiver::start().await?;
    let ep =
        json!({"url": rx.url(), "plugins": {"transform": "h"}, "retry": {"max_attempts": 1}, "rate_per_sec": 1000});
    gw.api.endpoint("acme", ep).await?;
    // Five pass through; two fail after logging why; one spins into its time budget.
    let events = [("ok", 5), ("x.fail", 2), ("x.spin", 1)];
    for (kind, n) in events {
        for i in 0..n {
            let id = format!("evt_{}_{i}", kind.replace('.', "_"));
            assert_eq!(gw.api.event("acme", json!({"id": id, "type": kind, "payload": {}})).await?.status, 202);
        }
    }
    rx.wait_for(5, Duration::from_secs(10)).await?;
    let p = gw
        .api
        .wait_for("/v1/tenants/acme/plugins/h", Duration::from_secs(10), |p| {
            // Counted when it starts; the spinning call fails 10 ms later.
            p["stats"]["calls"] == 8 && p["stats"]["failures"] == 3
        })
        .await?;
    let s = &p["stats"];
    assert_eq!(s["failures"], 3, "{s}");
    assert_eq!(s["hooks"], json!([{"hook": "transform", "calls": 8, "failures": 3}]));
    assert_eq!(s["failures_by_reason"], json!({"error": 2, "timeout": 1}));
    let (p50, p99) = (s["p50_ms"].as_f64().unwrap(), s["p99_ms"].as_f64().unwrap());
    assert!(p50 > 0.0 && p99 >= p50 && p99 >= 10.0, "the spinning call ran its 10 ms budget: {s}");
    let recent = s["recent_failures"].as_array().unwrap();
    assert_eq!(recent.len(), 3);
    let refused = recent.iter().find(|f| f["event_id"] == "evt_x_fail_1").expect("the failure of evt_x_fail_1");
    assert_eq!(refused["reason"], "error");
    assert!(refused["message"].as_str().unwrap().contains("refused evt_x_fail_1"), "{refused}");
    assert_eq!(refused["logs"], json!([{"level": "warn", "message": "refusing evt_x_fail_1"}]));
    assert!(refused["attempt_id"].as_str().unwrap().starts_with("att_") && refused["at"].is_string());
    let spun = recent.iter().find(|f| f["reason"] == "timeout").expect("the timeout");
    assert_eq!(spun["event_id"], "evt_x_spin_0");
    // The same figures in /metrics.
    let text = gw.api.get("/metrics", ADMIN_TOKEN).await?.text;
    let p99_line = text
        .lines()
        .find(|l| l.starts_with(r#"herald_plugin_call_p99_seconds{tenant="acme",plugin="h"}"#))
        .unwrap_or_else(|| panic!("no p99 series in {text}"));
    let exported: f64 = p99_line.rsplit(' ').next().unwrap().parse()?;
    assert!((exported * 1000.0 - p99).abs() < 0.01, "{p99_line} vs {p99} ms");
    assert!(text.contains(r#"herald_plugin_call_p50_seconds{tenant="acme",plugin="h"}"#));
    Ok(())
}
