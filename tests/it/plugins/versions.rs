//! Plugin versions end to end on both backends: every upload numbered with its hash, a
//! pinned `name@n` binding beside one that follows the serving version, a rollback under
//! load that loses and doubles nothing, and `DELETE` refused while an endpoint binds it.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};
use tests::{ADMIN_TOKEN, Backend, FakeReceiver, Received, TestGateway};

use super::{plugin_bytes, upload};

tests::backends!(versions_pin_roll_back_under_load_and_guard_deletion);

const EVENTS: usize = 200;

/// The transform_chat example answers a chat message; the hostile guest, for an ordinary
/// event type, passes the envelope through unchanged.
fn is_chat(r: &Received) -> bool {
    r.json()["text"].is_string()
}

fn ids(got: &[Received]) -> Vec<String> {
    got.iter().map(|r| r.header("webhook-id").unwrap_or_default().to_string()).collect()
}

async fn post(gw: &TestGateway, range: std::ops::Range<usize>) -> anyhow::Result<()> {
    for i in range {
        let r = gw.api.event("acme", json!({"id": format!("evt_{i}"), "type": "user.created", "payload": {"i": i}}));
        assert_eq!(r.await?.status, 202);
    }
    Ok(())
}

async fn versions_pin_roll_back_under_load_and_guard_deletion(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    gw.api.tenant("acme").await?;
    let (chat, hostile) = (plugin_bytes("transform_chat"), plugin_bytes("hostile"));
    for (bytes, version) in [(&chat, 1), (&hostile, 2), (&hostile, 2)] {
        let r = upload(&gw, "acme", "shape", bytes.clone(), ADMIN_TOKEN).await?;
        assert_eq!((r.status, &r.json["version"]), (200, &json!(version)), "{}", r.text);
    }
    let r = gw.api.get("/v1/tenants/acme/plugins/shape/versions", ADMIN_TOKEN).await?;
    let listed: Vec<_> =
        r.json["data"].as_array().unwrap().iter().map(|v| (&v["version"], &v["sha256"], &v["current"])).collect();
    let sha = |b: &[u8]| json!(hex::encode(Sha256::digest(b)));
    assert_eq!(listed, [(&json!(1), &sha(&chat), &json!(false)), (&json!(2), &sha(&hostile), &json!(true))]);

    let (latest, pinned) = (FakeReceiver::start().await?, FakeReceiver::start().await?);
    let ep_latest = gw
        .api
        .endpoint(
            "acme",
            json!({"url": latest.url(), "plugins": {"transform": "shape"}, "rate_per_sec": 1000, "burst": 100}),
        )
        .await?;
    let ep_pinned = gw
        .api
        .endpoint(
            "acme",
            json!({"url": pinned.url(), "plugins": {"transform": "shape@1"}, "rate_per_sec": 1000, "burst": 100}),
        )
        .await?;
    let r = gw
        .api
        .post(
            "/v1/tenants/acme/endpoints",
            ADMIN_TOKEN,
            json!({"url": latest.url(), "plugins": {"transform": "shape@9"}}),
        )
        .await?;
    assert_eq!(r.status, 422, "an unknown version is refused: {}", r.text);

    // Half the events while version 2 serves, a rollback while they are delivered, then
    // the other half: each event arrives once at each endpoint.
    post(&gw, 0..EVENTS / 2).await?;
    let r = gw.api.post("/v1/tenants/acme/plugins/shape/rollback", ADMIN_TOKEN, json!({"version": 1})).await?;
    assert_eq!((r.status, &r.json["version"]), (200, &json!(1)), "{}", r.text);
    post(&gw, EVENTS / 2..EVENTS).await?;
    for rx in [&latest, &pinned] {
        let got = rx.wait_for(EVENTS, Duration::from_secs(60)).await?;
        let unique: HashSet<String> = ids(&got).into_iter().collect();
        assert_eq!((got.len(), unique.len()), (EVENTS, EVENTS), "none lost, none doubled");
    }
    assert!(pinned.received().iter().all(is_chat), "the pinned endpoint always ran version 1");
    let late: HashSet<String> = (EVENTS / 2..EVENTS).map(|i| format!("evt_{i}")).collect();
    let late_seen = latest.received().into_iter().filter(|r| late.contains(r.header("webhook-id").unwrap_or_default()));
    assert!(late_seen.clone().all(|r| is_chat(&r)), "events posted after the rollback ran version 1");
    assert_eq!(late_seen.count(), EVENTS / 2);
    let r = gw.api.get("/v1/tenants/acme/plugins/shape/versions", ADMIN_TOKEN).await?;
    assert_eq!(r.json["data"][0]["current"], true, "{}", r.text);
    let r = gw.api.post("/v1/tenants/acme/plugins/shape/rollback", ADMIN_TOKEN, json!({"version": 7})).await?;
    assert_eq!(r.status, 404, "{}", r.text);

    // DELETE waits until no endpoint binds the plugin, by name or pinned.
    let r = gw.api.call("DELETE", "/v1/tenants/acme/plugins/shape", ADMIN_TOKEN, None).await?;
    assert_eq!(r.status, 409, "{}", r.text);
    let pinned_id = ep_pinned["id"].as_str().unwrap();
    assert!(r.text.contains(ep_latest["id"].as_str().unwrap()) && r.text.contains(pinned_id), "{}", r.text);
    for ep in [&ep_latest, &ep_pinned] {
        let path = format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().unwrap());
        assert_eq!(gw.api.call("DELETE", &path, ADMIN_TOKEN, None).await?.status, 204);
    }
    let r = gw.api.call("DELETE", "/v1/tenants/acme/plugins/shape", ADMIN_TOKEN, None).await?;
    assert_eq!(r.status, 204, "{}", r.text);
    assert_eq!(gw.api.get("/v1/tenants/acme/plugins/shape", ADMIN_TOKEN).await?.status, 404);
    assert_eq!(gw.api.get("/v1/tenants/acme/plugins/shape/versions", ADMIN_TOKEN).await?.status, 404);
    let r = upload(&gw, "acme", "shape", chat.clone(), ADMIN_TOKEN).await?;
    assert_eq!(r.json["version"], 1, "its versions went with it: {}", r.text);
    Ok(())
}

/// The versions listed for `name`: (number, current), oldest first.
async fn listed(gw: &TestGateway, name: &str) -> anyhow::Result<Vec<(u64, bool)>> {
    let r = gw.api.get(&format!("/v1/tenants/acme/plugins/{name}/versions"), ADMIN_TOKEN).await?;
    let data = r.json["data"].as_array().cloned().unwrap_or_default();
    Ok(data.iter().map(|v| (v["version"].as_u64().unwrap_or(0), v["current"] == true)).collect())
}

/// A file replaced on disk is hot-reloaded as the next version (it was served with
/// `version: null`, and `/versions` showed the upload's v1 as not current); a file dropped
/// in for a new plugin is its v1; bytes already stored (put back on disk) are that version
/// again, recording nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_reload_from_disk_records_a_version() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    let v1 = plugin_bytes("transform_chat");
    let v2 = tests::with_custom_section(v1.clone(), "v2");
    let r = upload(&gw, "acme", "chat", v1.clone(), ADMIN_TOKEN).await?;
    assert_eq!((r.status, &r.json["version"]), (200, &json!(1)), "{}", r.text);
    let dir = gw.dir.path().join("plugins/acme");
    let replace = |file: &str, bytes: &[u8]| -> anyhow::Result<()> {
        let tmp = dir.join(format!("{file}.tmp"));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, dir.join(file))?;
        Ok(())
    };
    let serving = |name: &'static str, sha: String| {
        move |v: &serde_json::Value| {
            let data = v["data"].as_array().cloned().unwrap_or_default();
            data.iter().any(|p| p["name"] == name && p["sha256"] == sha.as_str())
        }
    };
    let sha = |b: &[u8]| hex::encode(Sha256::digest(b));
    const WAIT: Duration = Duration::from_secs(20);

    replace("chat.wasm", &v2)?;
    let list = gw.api.wait_for("/v1/tenants/acme/plugins", WAIT, serving("chat", sha(&v2))).await?;
    let chat = list["data"].as_array().into_iter().flatten().find(|p| p["name"] == "chat").cloned();
    assert_eq!(chat.as_ref().map(|p| &p["version"]), Some(&json!(2)), "{list}");
    assert_eq!(listed(&gw, "chat").await?, [(1, false), (2, true)]);

    // The upload's bytes put back: version 1 serves again, no version 3.
    replace("chat.wasm", &v1)?;
    gw.api.wait_for("/v1/tenants/acme/plugins", WAIT, serving("chat", sha(&v1))).await?;
    assert_eq!(listed(&gw, "chat").await?, [(1, true), (2, false)]);

    // A plugin that only ever existed on disk.
    replace("dropped.wasm", &v2)?;
    let list = gw.api.wait_for("/v1/tenants/acme/plugins", WAIT, serving("dropped", sha(&v2))).await?;
    let dropped = list["data"].as_array().into_iter().flatten().find(|p| p["name"] == "dropped").cloned();
    assert_eq!(dropped.as_ref().map(|p| &p["version"]), Some(&json!(1)), "{list}");
    assert_eq!(listed(&gw, "dropped").await?, [(1, true)]);
    Ok(())
}
