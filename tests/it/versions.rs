//! Pinned payload versions (issue 51.5), end to end on both stores: events carry the
//! schema version they were posted against; an endpoint pinning an older one gets the
//! payload converted by real adapter plugins (`tests/guests/adapter-rename`, chained), signed
//! over the bytes sent, at a real receiver on loopback; a missing adapter holds the endpoint
//! with the reason shown until the adapter is registered; bad input names its field and
//! writes nothing; the catalog export shows an endpoint's pinned shape.

use std::time::Duration;

use anyhow::{Context, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tests::{ADMIN_TOKEN, Api, Backend, FakeReceiver, TestGateway};

use crate::plugins::plugin_bytes;

tests::backends!(
    a_pinned_endpoint_gets_the_payload_converted_and_signed,
    a_missing_adapter_holds_the_endpoint_until_it_is_registered,
    bad_input_names_the_field_and_writes_nothing,
    the_export_shows_an_endpoints_pinned_shape,
);

const WAIT: Duration = Duration::from_secs(20);

/// Each adapter (an instance of `adapter-rename`) undoes one rename and stamps the version
/// it writes: v3 `total_cents` → v2 `amount_cents` → v1 `amount`.
const ADAPTERS: &str = r#"{acme = {"inv-3to2" = {rename = "total_cents:amount_cents", version = "2"}, "inv-2to1" = {rename = "amount_cents:amount", version = "1"}}}"#;

/// A schema requiring the one property `key`, an integer.
fn schema(key: &str) -> Value {
    json!({"type": "object", "required": [key], "properties": {key: {"type": "integer"}}})
}

/// Tenant `acme` with the adapter plugins uploaded and its own type `invoice.paid` in
/// versions 1 (`amount`) and 2 (`amount_cents`), without adapters.
async fn two_versions(gw: &TestGateway) -> anyhow::Result<()> {
    let api = &gw.api;
    api.tenant("acme").await?;
    for name in ["inv-3to2", "inv-2to1"] {
        let path = format!("/v1/tenants/acme/plugins/{name}");
        api.raw("PUT", &path, Some(ADMIN_TOKEN), plugin_bytes("adapter_rename")).await?.expect(200)?;
    }
    api.post("/v1/tenants/acme/event-types", ADMIN_TOKEN, json!({"name": "invoice.paid", "schema": schema("amount")}))
        .await?
        .expect(201)?;
    bump(api, "amount_cents", 2).await
}

/// [`two_versions`] on a node on `backend`, and an endpoint pinning `invoice.paid` to
/// version 1 at a receiver.
async fn pinned_to_v1(backend: Backend) -> anyhow::Result<(TestGateway, FakeReceiver, Value)> {
    let gw = TestGateway::start_on(backend, &[("HERALD_PLUGINS_CONFIG", ADAPTERS)]).await?;
    two_versions(&gw).await?;
    let rx = FakeReceiver::start().await?;
    let ep = gw.api.endpoint("acme", json!({"url": rx.url(), "payload_versions": {"invoice.paid": 1}})).await?;
    Ok((gw, rx, ep))
}

/// A new schema version requiring `key`, which must be number `version`.
async fn bump(api: &Api, key: &str, version: i64) -> anyhow::Result<()> {
    let r = api.call(
        "PATCH",
        "/v1/tenants/acme/event-types/invoice.paid",
        ADMIN_TOKEN,
        Some(json!({"schema": schema(key)})),
    );
    ensure!(r.await?.expect(200)?.json["version"] == version, "not version {version}");
    Ok(())
}

async fn adapters(api: &Api, list: Value) -> anyhow::Result<tests::Reply> {
    api.call("PATCH", "/v1/tenants/acme/event-types/invoice.paid", ADMIN_TOKEN, Some(json!({"adapters": list}))).await
}

fn message(r: &tests::Reply) -> String {
    r.json["error"]["message"].as_str().unwrap_or_default().to_string()
}

/// Checks the Standard Webhooks signature of what `rx` got against the endpoint's secret.
fn signed_over_the_body(got: &tests::Received, whsec: &str) -> anyhow::Result<()> {
    let key = STANDARD.decode(whsec.trim_start_matches("whsec_"))?;
    let (id, ts) = (got.header("webhook-id").context("id")?, got.header("webhook-timestamp").context("ts")?);
    let mut mac = Hmac::<Sha256>::new_from_slice(&key)?;
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&got.body);
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    let header = got.header("webhook-signature").context("signature")?;
    ensure!(header.split(' ').any(|s| s == expected), "signature {header} is not over the body sent");
    Ok(())
}

async fn a_pinned_endpoint_gets_the_payload_converted_and_signed(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[("HERALD_PLUGINS_CONFIG", ADAPTERS)]).await?;
    let api = &gw.api;
    two_versions(&gw).await?;
    adapters(api, json!([{"from": 2, "to": 1, "plugin": "inv-2to1"}])).await?.expect(200)?;
    let (pinned_rx, plain_rx) = (FakeReceiver::start().await?, FakeReceiver::start().await?);
    let pinned = api.endpoint("acme", json!({"url": pinned_rx.url(), "payload_versions": {"invoice.paid": 1}})).await?;
    assert_eq!(pinned["payload_versions"], json!({"invoice.paid": 1}));
    let whsec = pinned["secret"].as_str().context("secret")?;
    api.endpoint("acme", json!({"url": plain_rx.url()})).await?;

    // A v2 event: v1's shape to the pinned endpoint, as posted to the other.
    api.event("acme", json!({"id": "evt_v2", "type": "invoice.paid", "payload": {"amount_cents": 500}}))
        .await?
        .expect(202)?;
    let event = api.get("/v1/tenants/acme/events/evt_v2", ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(event.json["schema_version"], 2);
    let got = pinned_rx.wait_for(1, WAIT).await?;
    assert_eq!(got[0].json()["data"], json!({"amount": 500, "v": 1}));
    assert_eq!(got[0].json()["type"], "invoice.paid");
    signed_over_the_body(&got[0], whsec)?;
    assert_eq!(plain_rx.wait_for(1, WAIT).await?[0].json()["data"], json!({"amount_cents": 500}));
    // What the attempt sent is the converted body, not the stored event's envelope.
    let list = api.get("/v1/tenants/acme/events/evt_v2/deliveries", ADMIN_TOKEN).await?.expect(200)?;
    ensure!(list.json["data"].as_array().is_some_and(|d| d.len() == 2), "{}", list.text);

    // Version 3, and a chain v3 → v2 → v1 of two adapters.
    bump(api, "total_cents", 3).await?;
    let chain = json!([{"from": 3, "to": 2, "plugin": "inv-3to2"}, {"from": 2, "to": 1, "plugin": "inv-2to1"}]);
    assert_eq!(adapters(api, chain.clone()).await?.expect(200)?.json["adapters"], chain);
    api.event("acme", json!({"id": "evt_v3", "type": "invoice.paid", "payload": {"total_cents": 7}}))
        .await?
        .expect(202)?;
    let got = pinned_rx.wait_for(2, WAIT).await?;
    assert_eq!(got[1].json()["data"], json!({"amount": 7, "v": 1}), "both steps ran, the last one last");
    signed_over_the_body(&got[1], whsec)?;
    assert_eq!(plain_rx.wait_for(2, WAIT).await?[1].json()["data"], json!({"total_cents": 7}));
    // An event of a type without a schema carries no version and goes as posted.
    api.event("acme", json!({"id": "evt_free", "type": "note.added", "payload": {"x": 1}})).await?.expect(202)?;
    let free = api.get("/v1/tenants/acme/events/evt_free", ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(free.json["schema_version"], Value::Null);
    assert_eq!(pinned_rx.wait_for(3, WAIT).await?[2].json()["data"], json!({"x": 1}));
    Ok(())
}

async fn a_missing_adapter_holds_the_endpoint_until_it_is_registered(backend: Backend) -> anyhow::Result<()> {
    let (gw, rx, ep) = pinned_to_v1(backend).await?;
    let api = &gw.api;
    let path = format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().context("id")?);
    api.event("acme", json!({"id": "evt_held", "type": "invoice.paid", "payload": {"amount_cents": 9}}))
        .await?
        .expect(202)?;

    let held = api.wait_for(&path, WAIT, |e| e["delivery_status"]["status"] == "paused").await?;
    let reason = held["delivery_status"]["reason"].as_str().unwrap_or_default();
    ensure!(reason == "payload_versions: no adapter for invoice.paid v2 \u{2192} v1", "{held}");
    rx.stays_at(0, Duration::from_millis(500)).await?;
    let deliveries = api.get("/v1/tenants/acme/events/evt_held/deliveries", ADMIN_TOKEN).await?.expect(200)?;
    ensure!(deliveries.json["data"][0]["state"] != "dead", "held, not dead: {}", deliveries.text);

    // Registered: the endpoint resumes by itself and the delivery goes out in v1's shape.
    adapters(api, json!([{"from": 2, "to": 1, "plugin": "inv-2to1"}])).await?.expect(200)?;
    let got = rx.wait_for(1, WAIT).await?;
    assert_eq!(got[0].json()["data"], json!({"amount": 9, "v": 1}));
    api.wait_for(&path, WAIT, |e| e["delivery_status"]["status"] == "active").await?;
    Ok(())
}

async fn bad_input_names_the_field_and_writes_nothing(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[("HERALD_PLUGINS_CONFIG", ADAPTERS)]).await?;
    let api = &gw.api;
    two_versions(&gw).await?;
    let rx = FakeReceiver::start().await?;
    // A value of the wrong JSON type is a 400, as everywhere; a value the catalog lacks, a 422.
    let pins = [
        (json!({"order.unknown": 1}), 422, "payload_versions.order.unknown: names no type"),
        (json!({"invoice.paid": 3}), 422, "payload_versions.invoice.paid: version 3 does not exist"),
        (json!({"invoice.paid": 0}), 422, "payload_versions.invoice.paid: "),
        (json!({"bad type!": 1}), 422, "payload_versions.bad type!: "),
        (json!({"invoice.paid": "one"}), 400, "payload_versions.invoice.paid: "),
    ];
    for (pin, status, expected) in pins {
        let r = api
            .post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, json!({"url": rx.url(), "payload_versions": pin}))
            .await?;
        ensure!(r.status == status && message(&r).starts_with(expected), "{pin}: {} {}", r.status, r.text);
    }
    let batch = json!({"url": rx.url(), "payload_versions": {"invoice.paid": 1}, "batch": {"max_events": 10}});
    let r = api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, batch).await?;
    ensure!(r.status == 422 && message(&r).starts_with("payload_versions: "), "{}", r.text);
    let listed = api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.expect(200)?;
    ensure!(listed.json["data"].as_array().is_some_and(Vec::is_empty), "written: {}", listed.text);

    let steps = [
        (json!([{"from": 2, "to": 1, "plugin": "missing"}]), "adapters[0].plugin: "),
        (json!([{"from": 5, "to": 1, "plugin": "inv-2to1"}]), "adapters[0].from: "),
        (json!([{"from": 2, "to": 2, "plugin": "inv-2to1"}]), "adapters[0].to: "),
        (
            json!([{"from": 2, "to": 1, "plugin": "inv-2to1"}, {"from": 2, "to": 1, "plugin": "inv-3to2"}]),
            "adapters[1].to: ",
        ),
        (json!([{"from": 2, "to": 1}]), "adapters"),
    ];
    for (list, expected) in steps {
        let r = adapters(api, list.clone()).await?;
        ensure!((400..500).contains(&r.status) && message(&r).starts_with(expected), "{list}: {} {}", r.status, r.text);
    }
    let t = api.get("/v1/tenants/acme/event-types/invoice.paid", ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(t.json["adapters"], json!([]), "nothing written");
    Ok(())
}

async fn the_export_shows_an_endpoints_pinned_shape(backend: Backend) -> anyhow::Result<()> {
    let (gw, _rx, ep) = pinned_to_v1(backend).await?;
    let api = &gw.api;
    let id = ep["id"].as_str().context("id")?;
    let data = |doc: &Value| doc["components"]["schemas"].as_object().and_then(|s| s.values().next().cloned());
    let version = |doc: &Value| doc["webhooks"]["invoice.paid"]["post"]["x-herald-schema-version"].clone();

    let latest = api.get("/v1/tenants/acme/event-types/openapi.json", ADMIN_TOKEN).await?.expect(200)?.json;
    assert_eq!((version(&latest), data(&latest)), (json!(2), Some(schema("amount_cents"))));
    let reader = api.token("acme", &["read"]).await?;
    let path = format!("/v1/tenants/acme/event-types/openapi.json?endpoint={id}");
    let pinned = api.get(&path, &reader).await?.expect(200)?.json;
    assert_eq!((version(&pinned), data(&pinned)), (json!(1), Some(schema("amount"))));
    let r = api.get("/v1/tenants/acme/event-types/openapi.json?endpoint=ep_nope", ADMIN_TOKEN).await?;
    ensure!(r.status == 404, "{}", r.text);
    Ok(())
}
