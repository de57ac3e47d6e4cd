//! Plugin limits that fit the work: a call's time budget grows with its input, so the
//! largest event Herald accepts (1 MiB) goes through the example transform.

use std::time::Duration;

use serde_json::json;
use tests::{ADMIN_TOKEN, FakeReceiver, TestGateway};

use super::{plugin_bytes, upload};

/// A payload just under `server.max_payload_bytes` (1 MiB) with the posted envelope.
fn big_payload() -> serde_json::Value {
    let blob = "x".repeat(1_000_000);
    json!({"name": "Ada", "email": "ada@example.com", "blob": blob})
}

async fn deliver_big(gw: &TestGateway) -> anyhow::Result<serde_json::Value> {
    gw.api.tenant("acme").await?;
    assert_eq!(upload(gw, "acme", "chat", plugin_bytes("transform_chat"), ADMIN_TOKEN).await?.status, 200);
    let rx = FakeReceiver::start().await?;
    let retry = json!({"max_attempts": 1});
    gw.api.endpoint("acme", json!({"url": rx.url(), "plugins": {"transform": "chat"}, "retry": retry})).await?;
    let r = gw.api.event("acme", json!({"id": "evt_big", "type": "user.created", "payload": big_payload()})).await?;
    assert_eq!(r.status, 202, "{}", r.text);
    let d = gw
        .api
        .wait_for("/v1/tenants/acme/events/evt_big/deliveries", Duration::from_secs(30), |v| {
            matches!(v["data"][0]["state"].as_str(), Some("delivered" | "dead"))
        })
        .await?;
    Ok(d["data"][0].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_mib_event_goes_through_the_example_transform() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let d = deliver_big(&gw).await?;
    assert_eq!(d["state"], "delivered", "{d}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_per_mib_budget_it_times_out() -> anyhow::Result<()> {
    // The flat budget alone (10 ms measured too short here; 2 ms so that a faster machine
    // cannot fit it either) stops the same call.
    let env = [("HERALD_PLUGINS_CALL_TIMEOUT_PER_MIB", "0ms"), ("HERALD_PLUGINS_CALL_TIMEOUT", "2ms")];
    let gw = TestGateway::start_with(&env).await?;
    let d = deliver_big(&gw).await?;
    assert_eq!(d["state"], "dead", "{d}");
    // The reason names the budget that stopped it, and the key that sets it.
    let error = d["last_error"].as_str().unwrap_or_default();
    assert!(error.starts_with("plugin:timeout: ") && error.contains("CPU budget of 2ms (plugins.call_timeout)"), "{d}");
    Ok(())
}
