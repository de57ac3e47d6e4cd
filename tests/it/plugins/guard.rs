//! What guards tenants' plugins through the API: an operator's per-tenant limits
//! (`[plugins.tenant.<tenant>]`) hold for that tenant's uploads only; an upload never
//! prunes a pinned version; a `DELETE` racing an endpoint that binds the plugin never
//! leaves the endpoint bound to nothing; and a setting PUT on one node of a shared
//! Postgres store reaches the deliveries of another without a restart.

use std::time::{Duration, Instant};

use serde_json::json;
use tests::pg::PgSchema;
use tests::{ADMIN_TOKEN, Api, FakeReceiver, HeraldProcess, TestGateway, herald_binary, with_custom_section};

use super::{plugin_bytes, upload};

fn version_numbers(r: &tests::Reply) -> Vec<u64> {
    r.json["data"].as_array().unwrap().iter().map(|v| v["version"].as_u64().unwrap()).collect()
}

#[tokio::test]
async fn tenant_limits_hold_for_that_tenant_and_uploads_keep_pinned_versions() -> anyhow::Result<()> {
    let base = plugin_bytes("hostile");
    // `acme` has room for three versions of about this size; `slim` for no real plugin.
    let n = base.len() + 100;
    let tenants = format!(
        "{{acme = {{max_plugin_bytes = {n}, max_tenant_bytes = {}}}, slim = {{max_plugin_bytes = 1000}}}}",
        3 * n
    );
    let gw = TestGateway::start_with(&[("HERALD_PLUGINS_TENANT", &tenants)]).await?;
    for t in ["acme", "slim", "wide"] {
        gw.api.tenant(t).await?;
    }
    let r = upload(&gw, "slim", "p", base.clone(), ADMIN_TOKEN).await?;
    // Too large is `payload_too_large`, as for any body over its limit (it was
    // `invalid_plugin`), whether the size was declared up front or counted.
    assert_eq!((r.status, r.json["error"]["code"].as_str()), (413, Some("payload_too_large")), "{}", r.text);
    assert!(r.text.contains("plugins.tenant.slim.max_plugin_bytes"), "the error names the key: {}", r.text);
    assert!(!gw.dir.path().join("plugins/slim/p.wasm").exists());
    // A tenant without its own table has the global limit; the same upload passes.
    assert_eq!(upload(&gw, "wide", "p", base.clone(), ADMIN_TOKEN).await?.status, 200);

    // Three versions fill acme; version 1 is pinned by an endpoint.
    for v in 1..=3 {
        let r = upload(&gw, "acme", "shape", with_custom_section(base.clone(), &format!("v{v}")), ADMIN_TOKEN).await?;
        assert_eq!((r.status, &r.json["version"]), (200, &json!(v)), "{}", r.text);
    }
    let rx = FakeReceiver::start().await?;
    gw.api.endpoint("acme", json!({"url": rx.url(), "plugins": {"transform": "shape@1"}})).await?;
    // A fourth makes room by dropping the oldest version nobody pins.
    let r = upload(&gw, "acme", "shape", with_custom_section(base.clone(), "v4"), ADMIN_TOKEN).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = gw.api.get("/v1/tenants/acme/plugins/shape/versions", ADMIN_TOKEN).await?;
    assert_eq!(version_numbers(&r), [1, 3, 4], "{}", r.text);
    // An upload that does not fit even then is refused, saying what counts.
    let r = upload(&gw, "acme", "other", with_custom_section(base.clone(), "x"), ADMIN_TOKEN).await?;
    assert_eq!(r.status, 422, "{}", r.text);
    assert!(r.text.contains("kept versions") && r.text.contains("plugins.tenant.acme.max_tenant_bytes"), "{}", r.text);
    Ok(())
}

#[tokio::test]
async fn a_delete_racing_a_binding_never_leaves_an_endpoint_bound_to_nothing() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    let rx = FakeReceiver::start().await?;
    let bytes = plugin_bytes("hostile");
    let (mut bound, mut deleted) = (0, 0);
    for round in 0..25 {
        assert_eq!(upload(&gw, "acme", "p", bytes.clone(), ADMIN_TOKEN).await?.status, 200);
        let create = gw.api.post(
            "/v1/tenants/acme/endpoints",
            ADMIN_TOKEN,
            json!({"url": rx.url(), "plugins": {"transform": "p"}}),
        );
        let delete = gw.api.call("DELETE", "/v1/tenants/acme/plugins/p", ADMIN_TOKEN, None);
        let (created, removed) = tokio::join!(create, delete);
        let (created, removed) = (created?, removed?);
        match (created.status, removed.status) {
            // The binding came first: the delete is refused; unbind for the next round.
            (201, 409) => {
                bound += 1;
                let id = created.json["id"].as_str().unwrap();
                let r = gw.api.call("DELETE", &format!("/v1/tenants/acme/endpoints/{id}"), ADMIN_TOKEN, None).await?;
                assert_eq!(r.status, 204);
            }
            // The delete came first: the binding finds no plugin.
            (422, 204) => deleted += 1,
            other => panic!("round {round}: endpoint {} / delete {}: {other:?}", created.text, removed.text),
        }
        // Whatever the order, no endpoint binds a plugin that is gone.
        let endpoints = gw.api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?;
        let plugins = gw.api.get("/v1/tenants/acme/plugins", ADMIN_TOKEN).await?;
        let has_plugin = plugins.json["data"].as_array().unwrap().iter().any(|p| p["name"] == "p");
        let binds = endpoints.json["data"].as_array().unwrap().iter().any(|e| e["plugins"]["transform"] == "p");
        assert!(!binds || has_plugin, "round {round}: an endpoint binds a deleted plugin");
    }
    assert_eq!(bound + deleted, 25);
    Ok(())
}

/// Posts `user.created` events through `api` until `rx` gets one whose chat message is
/// under `key`, for at most `within`; returns how many it took.
async fn until_delivered_as(api: &Api, rx: &FakeReceiver, key: &str, within: Duration) -> anyhow::Result<usize> {
    let deadline = Instant::now() + within;
    for i in 0.. {
        let before = rx.count();
        let payload = json!({"name": "Ada", "email": "ada@example.com"});
        let id = format!("evt_{key}_{i}");
        let r = api.event("acme", json!({"id": id, "type": "user.created", "payload": payload})).await?;
        assert_eq!(r.status, 202, "{}", r.text);
        let got = rx.wait_for(before + 1, deadline.saturating_duration_since(Instant::now())).await?;
        if got[before].json().get(key).is_some() {
            return Ok(i + 1);
        }
        anyhow::ensure!(Instant::now() < deadline, "no delivery as {key:?} within {within:?}");
    }
    unreachable!()
}

#[tokio::test]
async fn a_setting_put_on_one_node_reaches_another_nodes_deliveries() -> anyhow::Result<()> {
    let bin = herald_binary()?;
    let schema = PgSchema::create().await?;
    let env = [("HERALD_STORE_URL", schema.url.as_str())];
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let mut a = HeraldProcess::start(&bin, dir_a.path(), &env).await?;
    let b = HeraldProcess::start(&bin, dir_b.path(), &env).await?;
    a.api.tenant("acme").await?;
    // Each node serves the plugins of its own directory.
    for node in [&a, &b] {
        let r = node
            .api
            .raw("PUT", "/v1/tenants/acme/plugins/chat", Some(ADMIN_TOKEN), plugin_bytes("transform_chat"))
            .await?;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    // On A, while B runs: B started without it and can only learn it from the store.
    let discord = json!({"values": {"style": "discord"}});
    let r = a.api.call("PUT", "/v1/tenants/acme/plugins/chat/config", ADMIN_TOKEN, Some(discord)).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    a.kill();
    // Only B is left to deliver (the endpoint is new, so no lease of A's holds it): the
    // discord style (`content`, not slack's `text`) must reach its deliveries within its
    // follow interval (1 s), bounded here by 10 s.
    let rx = FakeReceiver::start().await?;
    b.api.endpoint("acme", json!({"url": rx.url(), "plugins": {"transform": "chat"}})).await?;
    until_delivered_as(&b.api, &rx, "content", Duration::from_secs(10)).await?;
    // A change made on B applies to its own next delivery.
    let r = b.api.call("PUT", "/v1/tenants/acme/plugins/chat/config", ADMIN_TOKEN, Some(json!({"values": {}}))).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(until_delivered_as(&b.api, &rx, "text", Duration::from_secs(10)).await?, 1);
    drop(b);
    Ok(())
}
