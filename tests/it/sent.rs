//! What each attempt sent, as `GET …/deliveries/{id}` shows it, on both backends: the
//! headers and body a receiver got, byte for byte, whether a transform and sign plugin
//! shaped them or Herald's envelope went out as it is.

use std::time::Duration;

use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Api, Backend, FakeReceiver, Received, TestGateway};

use crate::plugins::plugin_bytes;

tests::backends!(each_attempt_shows_what_its_receiver_got);

const WAIT: Duration = Duration::from_secs(20);

/// The one attempt of `event`'s delivery, once it is delivered.
async fn attempt_of(api: &Api, event: &str) -> anyhow::Result<Value> {
    let list = api
        .wait_for(&format!("/v1/tenants/acme/events/{event}/deliveries"), WAIT, |v| {
            v["data"][0]["state"] == "delivered"
        })
        .await?;
    let id = list["data"][0]["id"].as_str().unwrap_or_default();
    let d = api.get(&format!("/v1/tenants/acme/deliveries/{id}"), ADMIN_TOKEN).await?.json;
    assert_eq!(d["attempt_history"].as_array().map(Vec::len), Some(1), "{d}");
    Ok(d["attempt_history"][0]["request"].clone())
}

/// The recorded headers, each as the receiver got it (the client adds only `host` and
/// `content-length`).
fn assert_headers_as_received(request: &Value, got: &Received) -> Vec<(String, String)> {
    let headers: Vec<(String, String)> =
        serde_json::from_value(request["headers"].clone()).expect("[name, value] pairs");
    for (name, value) in &headers {
        assert_eq!(got.header(name), Some(value.as_str()), "{name} as recorded: {request}");
    }
    let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
    for name in got.headers.keys() {
        assert!(
            names.contains(&name.as_str()) || ["host", "content-length"].contains(&name.as_str()),
            "{name} unrecorded"
        );
    }
    headers
}

/// A transformed and plugin-signed delivery records the transformed body and the sign
/// plugin's header; a plain one records that its body was the event's envelope, and the
/// API rebuilds that body exactly.
async fn each_attempt_shows_what_its_receiver_got(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    for (name, file) in [("chat", "transform_chat"), ("hostile", "hostile")] {
        let r =
            api.raw("PUT", &format!("/v1/tenants/acme/plugins/{name}"), Some(ADMIN_TOKEN), plugin_bytes(file)).await?;
        assert_eq!(r.status, 200, "{name}: {}", r.text);
    }
    let (shaped_rx, plain_rx) = (FakeReceiver::start().await?, FakeReceiver::start().await?);
    api.endpoint(
        "acme",
        json!({"url": shaped_rx.url(), "event_types": ["chat.*"], "headers": {"x-team": "blue"},
               "plugins": {"transform": "chat", "sign": "hostile"}}),
    )
    .await?;
    api.endpoint("acme", json!({"url": plain_rx.url(), "event_types": ["plain.*"]})).await?;
    for (id, kind, payload) in
        [("evt_chat", "chat.posted", json!({"name": "Ada"})), ("evt_plain", "plain.made", json!({"n": 1.50}))]
    {
        let r = api.event("acme", json!({"id": id, "type": kind, "payload": payload})).await?;
        assert_eq!(r.status, 202, "{}", r.text);
    }

    let got = shaped_rx.wait_for(1, WAIT).await?.remove(0);
    let request = attempt_of(api, "evt_chat").await?;
    let headers = assert_headers_as_received(&request, &got);
    assert!(headers.contains(&("x-hostile".into(), "ok".into())), "the sign plugin's header: {request}");
    assert!(headers.contains(&("x-team".into(), "blue".into())), "the endpoint's header: {request}");
    assert!(got.header("webhook-signature").is_none(), "the sign plugin replaces the built-in signature");
    assert!(got.json()["text"].as_str().is_some_and(|t| t.contains("Ada")), "transformed: {:?}", got.body);
    assert_eq!(request["body"].as_str().map(str::as_bytes), Some(&got.body[..]), "{request}");
    assert_eq!((&request["body_is_payload"], &request["truncated"]), (&json!(false), &json!(false)));
    assert_eq!(request["body_size"], got.body.len());

    let got = plain_rx.wait_for(1, WAIT).await?.remove(0);
    let request = attempt_of(api, "evt_plain").await?;
    let headers = assert_headers_as_received(&request, &got);
    let signature = headers.iter().find(|(n, _)| n == "webhook-signature").map(|(_, v)| v.as_str());
    assert!(signature.is_some_and(|s| s.starts_with("v1,")), "{request}");
    assert_eq!(request["body"].as_str().map(str::as_bytes), Some(&got.body[..]), "the envelope, rebuilt: {request}");
    assert_eq!((&request["body_is_payload"], &request["truncated"]), (&json!(true), &json!(false)));
    assert_eq!(request["body_size"], got.body.len());
    Ok(())
}
