//! A tenant's own plugin settings (`PUT|GET …/plugins/{name}/config`), end to end on both
//! backends: they apply to the next delivery without a restart, survive one, sit between
//! the operator's defaults and overrides, and never show a secret again.

use std::time::Duration;

use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Backend, FakeReceiver, TestGateway, pg::PgSchema};

use super::{plugin_bytes, upload};

tests::backends!(tenant_settings_apply_at_once_survive_a_restart_and_hide_secrets);

const CONFIG: &str = "/v1/tenants/acme/plugins/chat/config";

/// The operator's layers: defaults (`redact`, `style`) and an override (`skip_types`).
const OPERATOR: [(&str, &str); 2] = [
    ("HERALD_PLUGINS_CONFIG", r#"{acme = {chat = {redact = "email", style = "slack"}}}"#),
    ("HERALD_PLUGINS_OVERRIDE", r#"{acme = {chat = {skip_types = "audit.*"}}}"#),
];

/// Posts a `user.created` event and returns the chat message the receiver got, as
/// (the body's one key, its text).
async fn deliver_one(gw: &TestGateway, rx: &FakeReceiver, id: &str) -> anyhow::Result<(String, String)> {
    let before = rx.count();
    let payload = json!({"name": "Ada", "email": "ada@example.com"});
    let r = gw.api.event("acme", json!({"id": id, "type": "user.created", "payload": payload})).await?;
    assert_eq!(r.status, 202, "{}", r.text);
    let got = match rx.wait_for(before + 1, Duration::from_secs(10)).await {
        Ok(got) => got,
        Err(e) => {
            let d = gw.api.get(&format!("/v1/tenants/acme/events/{id}/deliveries"), ADMIN_TOKEN).await?;
            anyhow::bail!("{e}; deliveries: {}", d.text)
        }
    };
    let body = got[before].json();
    let (key, text) = body.as_object().and_then(|o| o.iter().next()).expect("a chat message");
    Ok((key.clone(), text.as_str().unwrap_or_default().to_string()))
}

async fn start(dir: tempfile::TempDir, schema: &Option<PgSchema>) -> anyhow::Result<TestGateway> {
    let mut env = OPERATOR.to_vec();
    if let Some(s) = schema {
        env.push(("HERALD_STORE_URL", s.url.as_str()));
    }
    TestGateway::start_in(dir, &env).await
}

async fn tenant_settings_apply_at_once_survive_a_restart_and_hide_secrets(backend: Backend) -> anyhow::Result<()> {
    let schema = match backend {
        Backend::Postgres => Some(PgSchema::create().await?),
        Backend::Sqlite => None,
    };
    let gw = start(tempfile::tempdir()?, &schema).await?;
    gw.api.tenant("acme").await?;
    let manage = gw.api.token("acme", &["manage"]).await?;
    assert_eq!(upload(&gw, "acme", "chat", plugin_bytes("transform_chat"), ADMIN_TOKEN).await?.status, 200);
    let rx = FakeReceiver::start().await?;
    let ep = gw.api.endpoint("acme", json!({"url": rx.url(), "plugins": {"transform": "chat"}})).await?;

    // The operator's defaults alone: slack style, the email redacted.
    let (key, text) = deliver_one(&gw, &rx, "evt_1").await?;
    assert_eq!(key, "text");
    assert!(text.contains("Ada") && !text.contains("ada@example.com"), "{text}");
    let r = gw.api.get(CONFIG, &manage).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"values": {}, "secrets": {}, "overridden": ["skip_types"], "updated_at": null}));

    // The tenant's own settings win over the defaults; a secret reaches the plugin; the
    // override still wins over the tenant. No restart.
    let set = json!({"values": {"redact": "name", "skip_types": ""}, "secrets": {"style": "discord"}});
    let r = gw.api.call("PUT", CONFIG, &manage, Some(set)).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["secrets"], json!({"style": "********"}));
    assert!(!r.text.contains("discord"), "a secret is never shown: {}", r.text);
    let (key, text) = deliver_one(&gw, &rx, "evt_2").await?;
    assert_eq!(key, "content", "the secret style applies to the next delivery");
    assert!(!text.contains("Ada") && text.contains("ada@example.com"), "{text}");
    let r = gw.api.event("acme", json!({"id": "evt_audit", "type": "audit.login", "payload": {}})).await?;
    assert_eq!(r.status, 202);
    gw.api
        .wait_for("/v1/tenants/acme/events/evt_audit/deliveries", Duration::from_secs(10), |v| {
            v["data"][0]["state"] == "dead"
        })
        .await?;
    assert_eq!(rx.count(), 2, "the operator's skip_types override still drops audit events");

    // Durable: a restarted node applies them before it delivers. (A new endpoint: the
    // stopped node's partition lease on the old one lasts until it expires.)
    let old = format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().unwrap());
    assert_eq!(gw.api.call("DELETE", &old, ADMIN_TOKEN, None).await?.status, 204);
    let dir = gw.stop().await;
    let gw = start(dir, &schema).await?;
    let rx = FakeReceiver::start().await?;
    gw.api.wait_for("/v1/tenants/acme/plugins/chat", Duration::from_secs(20), |p| p["loading"] == false).await?;
    gw.api.endpoint("acme", json!({"url": rx.url(), "plugins": {"transform": "chat"}})).await?;
    let r = gw.api.get(CONFIG, &manage).await?;
    assert_eq!(r.json["values"], json!({"redact": "name", "skip_types": ""}));
    assert_eq!(r.json["secrets"], json!({"style": "********"}));
    assert!(r.json["updated_at"].is_string());
    let (key, text) = deliver_one(&gw, &rx, "evt_3").await?;
    assert_eq!(key, "content");
    assert!(!text.contains("Ada"), "{text}");

    // Replacing the map keeps a secret only when asked to; the default `redact` is back.
    let keep = json!({"values": {}, "keep_secrets": ["style"]});
    assert_eq!(gw.api.call("PUT", CONFIG, &manage, Some(keep)).await?.status, 200);
    let (key, text) = deliver_one(&gw, &rx, "evt_4").await?;
    assert_eq!(key, "content");
    assert!(text.contains("Ada") && !text.contains("ada@example.com"), "{text}");
    assert_eq!(gw.api.call("PUT", CONFIG, &manage, Some(json!({}))).await?.status, 200);
    assert_eq!(deliver_one(&gw, &rx, "evt_5").await?.0, "text", "the secret is gone");
    drop(gw);
    Ok(())
}

#[tokio::test]
async fn bad_settings_are_refused_and_store_nothing() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    gw.api.tenant("other").await?;
    let read = gw.api.token("acme", &["read"]).await?;
    let other = gw.api.token("other", &["manage"]).await?;
    assert_eq!(upload(&gw, "acme", "chat", plugin_bytes("transform_chat"), ADMIN_TOKEN).await?.status, 200);
    let good = json!({"values": {"redact": "email"}});
    let cases: [(&str, &str, Value, u16, &str); 8] = [
        (CONFIG, ADMIN_TOKEN, json!({"values": {"a b": "x"}}), 422, "values: key"),
        (CONFIG, ADMIN_TOKEN, json!({"values": {"k": "x".repeat(5000)}}), 422, "values.k:"),
        (CONFIG, ADMIN_TOKEN, json!({"values": {"k": "1"}, "secrets": {"k": "2"}}), 422, "secrets.k:"),
        (CONFIG, ADMIN_TOKEN, json!({"keep_secrets": ["nope"]}), 422, "keep_secrets:"),
        (CONFIG, ADMIN_TOKEN, json!({"valeus": {}}), 400, "valeus"),
        ("/v1/tenants/acme/plugins/nope/config", ADMIN_TOKEN, good.clone(), 404, "plugin"),
        (CONFIG, &read, good.clone(), 403, ""),
        ("/v1/tenants/acme/plugins/chat/config", &other, good.clone(), 404, ""),
    ];
    for (path, token, body, status, message) in cases {
        let r = gw.api.call("PUT", path, token, Some(body.clone())).await?;
        assert_eq!(r.status, status, "{body}: {}", r.text);
        let got = r.json["error"]["message"].as_str().unwrap_or_default();
        assert!(got.contains(message), "{body}: {got}");
    }
    let r = gw.api.get(CONFIG, ADMIN_TOKEN).await?;
    assert_eq!(r.json["updated_at"], Value::Null, "nothing was stored: {}", r.text);
    assert_eq!(gw.api.get(CONFIG, &read).await?.status, 403, "reading settings needs `manage`");
    Ok(())
}
