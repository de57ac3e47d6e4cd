//! The event catalog, end to end on both stores: event types with JSON Schemas (the
//! operator's, inherited, and a tenant's own), what intake does with a payload that fails
//! them under `schema_validation` (`enforce`, `warn`), schema versions, endpoints' event
//! types checked against the catalog, test sends, and the OpenAPI export (checked by
//! `openapi-spec-validator`, from the virtualenv `scripts/pytools` builds).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Api, Backend, FakeReceiver, TestGateway};

tests::backends!(
    catalog_crud_and_bad_input,
    enforce_refuses_a_bad_payload_naming_its_path_and_stores_nothing,
    warn_accepts_and_counts,
    a_schema_version_bump_leaves_old_events_alone,
    test_send_delivers_an_example_to_one_endpoint,
    the_export_passes_an_openapi_validator,
);

/// A typical schema: an object of typed properties, two required, a format or two.
fn order_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["order_id", "customer"],
        "properties": {
            "order_id": {"type": "string", "pattern": "^ord_[0-9a-z]+$"},
            "total": {"type": "integer", "minimum": 0},
            "placed_at": {"type": "string", "format": "date-time"},
            "customer": {"$ref": "#/$defs/customer"},
        },
        "$defs": {
            "customer": {
                "type": "object",
                "required": ["email"],
                "properties": {"email": {"type": "string", "format": "email"}},
            },
        },
    })
}

fn good_order() -> Value {
    json!({"order_id": "ord_1", "total": 1999, "placed_at": "2026-01-01T00:00:00Z", "customer": {"email": "a@example.com"}})
}

/// Tenant `acme` with the operator's `order.created` type (schema and one example) and
/// `schema_validation` set to `mode`.
async fn catalog_tenant(api: &Api, mode: &str) -> anyhow::Result<()> {
    api.tenant("acme").await?;
    api.post(
        "/v1/event-types",
        ADMIN_TOKEN,
        json!({"name": "order.created", "description": "An order was placed", "schema": order_schema(),
               "examples": [good_order()]}),
    )
    .await?
    .expect(201)?;
    api.call("PUT", "/v1/tenants/acme/catalog", ADMIN_TOKEN, Some(json!({"schema_validation": mode})))
        .await?
        .expect(200)?;
    Ok(())
}

/// The value of a metric series (its labels as in the exposition), 0 if absent.
async fn metric(api: &Api, series: &str) -> anyhow::Result<f64> {
    let text = api.get("/metrics", ADMIN_TOKEN).await?.text;
    let line = text.lines().find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '));
    Ok(line.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0))
}

fn message(reply: &tests::Reply) -> String {
    reply.json["error"]["message"].as_str().unwrap_or_default().to_string()
}

async fn catalog_crud_and_bad_input(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let reader = api.token("acme", &["read"]).await?;
    let manager = api.token("acme", &["manage"]).await?;

    // The operator's type, inherited.
    let created = api
        .post("/v1/event-types", ADMIN_TOKEN, json!({"name": "order.created", "schema": order_schema()}))
        .await?
        .expect(201)?;
    assert_eq!((created.json["version"].as_i64(), created.json["source"].as_str()), (Some(1), Some("operator")));
    let list = api.get("/v1/tenants/acme/event-types", &reader).await?.expect(200)?;
    assert_eq!(list.json["data"][0]["name"], "order.created");
    assert_eq!(list.json["data"][0]["source"], "operator");
    // A tenant token cannot touch the operator's catalog, nor write with `read`.
    api.post("/v1/event-types", &manager, json!({"name": "x.y"})).await?.expect(403)?;
    let refused = api.post("/v1/tenants/acme/event-types", &reader, json!({"name": "x.y"})).await?;
    ensure!(refused.status == 403, "a read token wrote: {}", refused.text);

    // The tenant's own type of the same name overrides it; deleting it shows the operator's again.
    api.post("/v1/tenants/acme/event-types", &manager, json!({"name": "order.created", "description": "ours"}))
        .await?
        .expect(201)?;
    let own = api.get("/v1/tenants/acme/event-types/order.created", &reader).await?.expect(200)?;
    assert_eq!((own.json["source"].as_str(), own.json["version"].as_i64()), (Some("tenant"), Some(0)));
    let again = api.post("/v1/tenants/acme/event-types", &manager, json!({"name": "order.created"})).await?;
    ensure!(again.status == 409 && message(&again).starts_with("name:"), "{}", again.text);
    api.call("DELETE", "/v1/tenants/acme/event-types/order.created", &manager, None).await?.expect(204)?;
    let back = api.get("/v1/tenants/acme/event-types/order.created", &reader).await?.expect(200)?;
    assert_eq!(back.json["source"], "operator");

    // Bad input names its field.
    let cases = [
        (json!({"name": "bad name"}), "name:"),
        (json!({"description": "no name"}), "name: required"),
        (json!({"name": "openapi.json"}), "name:"),
        (json!({"name": "a.b", "schema": {"type": "objekt"}}), "schema:"),
        (json!({"name": "a.b", "schema": {"$schema": "http://json-schema.org/draft-07/schema#"}}), "schema: $schema"),
        (json!({"name": "a.b", "schema": {"$ref": "https://example.com/remote.json"}}), "schema:"),
        (json!({"name": "a.b", "schema": 3}), "schema:"),
        (json!({"name": "a.b", "schema": order_schema(), "examples": [good_order(), {"order_id": 1}]}), "examples[1]:"),
        (json!({"name": "a.b", "examples": "x"}), "examples"),
    ];
    for (body, field) in cases {
        let r = api.post("/v1/tenants/acme/event-types", &manager, body.clone()).await?;
        ensure!(r.status == 422 || r.status == 400, "{body}: {} {}", r.status, r.text);
        ensure!(message(&r).contains(field), "{body}: expected {field:?} in {}", r.text);
    }
    let renamed =
        api.call("PATCH", "/v1/event-types/order.created", ADMIN_TOKEN, Some(json!({"name": "other"}))).await?;
    ensure!(renamed.status == 422 && message(&renamed).starts_with("name:"), "{}", renamed.text);
    api.get("/v1/tenants/acme/event-types/nope", &reader).await?.expect(404)?;

    // An endpoint's event types are checked against the catalog the tenant enforces.
    api.call("PUT", "/v1/tenants/acme/catalog", &manager, Some(json!({"schema_validation": "enforce"})))
        .await?
        .expect(200)?;
    let unknown = api
        .post(
            "/v1/tenants/acme/endpoints",
            &manager,
            json!({"url": "https://example.com/h", "event_types": ["order.craeted"]}),
        )
        .await?;
    ensure!(unknown.status == 422 && message(&unknown).starts_with("event_types:"), "{}", unknown.text);
    assert!(message(&unknown).contains("order.craeted"), "{}", unknown.text);
    let pattern = api
        .post(
            "/v1/tenants/acme/endpoints",
            &manager,
            json!({"url": "https://example.com/h", "event_types": ["invoice.*"]}),
        )
        .await?;
    ensure!(pattern.status == 422, "a pattern matching no type was taken: {}", pattern.text);
    for types in [json!(["order.created"]), json!(["order.*"]), json!(["*"])] {
        api.post("/v1/tenants/acme/endpoints", &manager, json!({"url": "https://example.com/h", "event_types": types}))
            .await?
            .expect(201)?;
    }
    // Settings: read back; a bad mode names the field.
    let bad = api.call("PUT", "/v1/tenants/acme/catalog", &manager, Some(json!({"schema_validation": "loud"}))).await?;
    ensure!(bad.status == 422 || bad.status == 400, "{}", bad.text);
    ensure!(message(&bad).contains("schema_validation"), "{}", bad.text);
    api.call("PUT", "/v1/tenants/acme/catalog", &manager, Some(json!({"schema_validation": "warn"})))
        .await?
        .expect(200)?;
    let settings = api.get("/v1/tenants/acme/catalog", &reader).await?.expect(200)?;
    assert_eq!(settings.json["schema_validation"], "warn");
    Ok(())
}

async fn enforce_refuses_a_bad_payload_naming_its_path_and_stores_nothing(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    catalog_tenant(api, "enforce").await?;

    let mut bad = good_order();
    bad["customer"]["email"] = json!("not an email");
    let r = api.event("acme", json!({"id": "evt_bad1", "type": "order.created", "payload": bad})).await?;
    ensure!(r.status == 422, "a failing payload was taken: {} {}", r.status, r.text);
    ensure!(message(&r).starts_with("payload.customer.email:"), "the path is not named: {}", r.text);
    api.get("/v1/tenants/acme/events/evt_bad1", ADMIN_TOKEN).await?.expect(404)?;

    // A missing required field, and an unknown type in a tenant that has a catalog.
    let r = api.event("acme", json!({"type": "order.created", "payload": {"customer": {"email": "a@b.co"}}})).await?;
    ensure!(r.status == 422 && message(&r).contains("order_id"), "{}", r.text);
    let r = api.event("acme", json!({"id": "evt_unknown", "type": "order.deleted", "payload": {}})).await?;
    ensure!(r.status == 422 && message(&r).starts_with("type:"), "{}", r.text);

    // A batch names the item; none of it is stored.
    let batch = json!({"events": [
        {"id": "evt_b0", "type": "order.created", "payload": good_order()},
        {"id": "evt_b1", "type": "order.created", "payload": {"order_id": "ord_2", "customer": {}}},
    ]});
    let r = api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, batch).await?;
    ensure!(r.status == 422, "{}", r.text);
    ensure!(message(&r).starts_with("events[1].payload.customer:"), "{}", r.text);
    api.get("/v1/tenants/acme/events/evt_b0", ADMIN_TOKEN).await?.expect(404)?;
    let deliveries = api.get("/v1/tenants/acme/deliveries", ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(deliveries.json["data"].as_array().map(Vec::len), Some(0));

    // A good one is taken; refusals were counted.
    api.event("acme", json!({"id": "evt_good", "type": "order.created", "payload": good_order()}))
        .await?
        .expect(202)?;
    api.get("/v1/tenants/acme/events/evt_good", ADMIN_TOKEN).await?.expect(200)?;
    let refused = metric(api, r#"herald_schema_violations_total{tenant="acme",mode="enforce"}"#).await?;
    assert_eq!(refused, 4.0);
    Ok(())
}

async fn warn_accepts_and_counts(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    catalog_tenant(api, "warn").await?;
    api.tenant("other").await?; // no setting: off

    let series = r#"herald_schema_violations_total{tenant="acme",mode="warn"}"#;
    assert_eq!(metric(api, series).await?, 0.0);
    api.event("acme", json!({"id": "evt_w1", "type": "order.created", "payload": {"order_id": 7}}))
        .await?
        .expect(202)?;
    api.event("acme", json!({"id": "evt_w2", "type": "order.unknown", "payload": {}})).await?.expect(202)?;
    api.event("acme", json!({"id": "evt_w3", "type": "order.created", "payload": good_order()})).await?.expect(202)?;
    api.event("other", json!({"type": "order.created", "payload": {"order_id": 7}})).await?.expect(202)?;
    api.get("/v1/tenants/acme/events/evt_w1", ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(metric(api, series).await?, 2.0, "two failing events of acme counted");
    assert_eq!(metric(api, r#"herald_schema_violations_total{tenant="other",mode="warn"}"#).await?, 0.0);
    Ok(())
}

async fn a_schema_version_bump_leaves_old_events_alone(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    let rx = FakeReceiver::start().await?;
    catalog_tenant(api, "enforce").await?;
    api.endpoint("acme", json!({"url": rx.url(), "event_types": ["order.created"]})).await?;
    let v1_payload = json!({"order_id": "ord_1", "customer": {"email": "a@example.com"}});
    api.event("acme", json!({"id": "evt_v1", "type": "order.created", "payload": v1_payload})).await?.expect(202)?;
    rx.wait_for(1, Duration::from_secs(10)).await?;

    // Version 2 requires `currency`: the example kept must fit it, so it comes along.
    let mut v2 = order_schema();
    v2["required"] = json!(["order_id", "customer", "currency"]);
    v2["properties"]["currency"] = json!({"type": "string", "enum": ["EUR", "USD"]});
    let stale = api.call("PATCH", "/v1/event-types/order.created", ADMIN_TOKEN, Some(json!({"schema": v2}))).await?;
    ensure!(stale.status == 422 && message(&stale).starts_with("examples (kept)[0]:"), "{}", stale.text);
    let mut example = good_order();
    example["currency"] = json!("EUR");
    let bumped = api
        .call("PATCH", "/v1/event-types/order.created", ADMIN_TOKEN, Some(json!({"schema": v2, "examples": [example]})))
        .await?
        .expect(200)?;
    assert_eq!(bumped.json["version"], 2);
    // The same schema again makes no version.
    let same = api.call("PATCH", "/v1/event-types/order.created", ADMIN_TOKEN, Some(json!({"schema": v2}))).await?;
    assert_eq!(same.expect(200)?.json["version"], 2);

    // Version 1 stays readable; the old event and its delivery are as they were.
    let versions = api.get("/v1/tenants/acme/event-types/order.created/versions", ADMIN_TOKEN).await?.expect(200)?;
    let numbers: Vec<i64> =
        versions.json["data"].as_array().context("data")?.iter().filter_map(|v| v["version"].as_i64()).collect();
    assert_eq!(numbers, [1, 2]);
    assert_eq!(versions.json["data"][0]["schema"], order_schema());
    let old = api.get("/v1/tenants/acme/events/evt_v1", ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(old.json["payload"], v1_payload);
    let delivered = api.get("/v1/tenants/acme/events/evt_v1/deliveries", ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(delivered.json["data"][0]["state"], "delivered");

    // New events meet version 2.
    let r = api.event("acme", json!({"type": "order.created", "payload": v1_payload})).await?;
    ensure!(r.status == 422 && message(&r).contains("currency") && message(&r).contains("v2"), "{}", r.text);
    Ok(())
}

async fn test_send_delivers_an_example_to_one_endpoint(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    let (rx, other) = (FakeReceiver::start().await?, FakeReceiver::start().await?);
    catalog_tenant(api, "enforce").await?;
    // Another endpoint subscribed to every type gets nothing of a test send.
    let target = api.endpoint("acme", json!({"url": rx.url(), "event_types": ["order.*"]})).await?;
    api.endpoint("acme", json!({"url": other.url()})).await?;
    let id = target["id"].as_str().context("id")?;
    let manager = api.token("acme", &["manage"]).await?;

    let sent = api
        .post(&format!("/v1/tenants/acme/endpoints/{id}/test-send"), &manager, json!({"event_type": "order.created"}))
        .await?
        .expect(202)?;
    let got = rx.wait_for(1, Duration::from_secs(10)).await?;
    let body = got[0].json();
    assert_eq!((body["type"].as_str(), &body["data"]), (Some("order.created"), &good_order()));
    assert!(got[0].header("webhook-signature").is_some_and(|s| s.starts_with("v1,")), "unsigned");
    assert_eq!(got[0].header("webhook-id"), sent.json["event_id"].as_str());
    // The page follows the attempt through the delivery.
    let delivery = sent.json["delivery_id"].as_str().context("delivery_id")?;
    api.wait_for(&format!("/v1/tenants/acme/deliveries/{delivery}"), Duration::from_secs(10), |d| {
        d["state"] == "delivered" && d["attempt_history"].as_array().is_some_and(|a| a.len() == 1)
    })
    .await?;
    other.stays_at(0, Duration::from_millis(300)).await?;

    let no_example = api
        .post(
            &format!("/v1/tenants/acme/endpoints/{id}/test-send"),
            &manager,
            json!({"event_type": "order.created", "example": 3}),
        )
        .await?;
    ensure!(no_example.status == 422 && message(&no_example).starts_with("example:"), "{}", no_example.text);
    let no_type = api
        .post(&format!("/v1/tenants/acme/endpoints/{id}/test-send"), &manager, json!({"event_type": "nope"}))
        .await?;
    ensure!(no_type.status == 422 && message(&no_type).starts_with("event_type:"), "{}", no_type.text);
    Ok(())
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

async fn the_export_passes_an_openapi_validator(backend: Backend) -> anyhow::Result<()> {
    let python = repo().join("target/pytools/venv/bin/python");
    ensure!(python.exists(), "{} is missing: run scripts/pytools (scripts/test does)", python.display());
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    catalog_tenant(api, "off").await?;
    let manager = api.token("acme", &["manage"]).await?;
    let reader = api.token("acme", &["read"]).await?;
    api.post(
        "/v1/tenants/acme/event-types",
        &manager,
        json!({"name": "invoice:paid", "description": "Paid", "deprecated": true,
               "schema": {"type": "object", "properties": {"amount": {"type": "number"}}}, "examples": [{"amount": 1.5}]}),
    )
    .await?
    .expect(201)?;
    api.post("/v1/tenants/acme/event-types", &manager, json!({"name": "ping"})).await?.expect(201)?;

    let doc = api.get("/v1/tenants/acme/event-types/openapi.json", &reader).await?.expect(200)?.json;
    assert_eq!(doc["openapi"], "3.1.0");
    let names: Vec<&String> = doc["webhooks"].as_object().context("webhooks")?.keys().collect();
    assert_eq!(names, ["invoice:paid", "order.created", "ping"]);
    assert_eq!(doc["webhooks"]["invoice:paid"]["post"]["deprecated"], true);
    let file = gw.dir.path().join("webhooks.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&doc)?)?;
    let check = "import sys\nfrom openapi_spec_validator import validate\nfrom openapi_spec_validator.readers import read_from_filename\n\
                 spec, _ = read_from_filename(sys.argv[1])\nvalidate(spec)\nprint('valid')";
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(&python).arg("-c").arg(check).arg(&file).kill_on_drop(true).output(),
    )
    .await
    .context("the validator ran over a minute")??;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success() && text.contains("valid"), "openapi-spec-validator refused the export:\n{text}");
    Ok(())
}

/// Two nodes on one Postgres: a catalog write on one reaches the other's intake within
/// its one-second follow (`catalog_revision`), new schema versions included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_nodes_catalog_write_applies_within_seconds() -> anyhow::Result<()> {
    let a = TestGateway::start_on(Backend::Postgres, &[("HERALD_CLUSTER_NODE_ID", "node-a")]).await?;
    let url = a.schema().context("a Postgres schema")?.url.clone();
    let b =
        TestGateway::start_with(&[("HERALD_STORE_URL", url.as_str()), ("HERALD_CLUSTER_NODE_ID", "node-b")]).await?;
    catalog_tenant(&a.api, "enforce").await?;
    let refused_on_b = |payload: Value, needle: &'static str| {
        let api = b.api.clone();
        async move {
            tests::eventually("node b to refuse", Duration::from_secs(5), || {
                let (api, payload) = (api.clone(), payload.clone());
                async move {
                    let r = api.event("acme", json!({"type": "order.created", "payload": payload})).await?;
                    tests::done_or(r.status == 422 && message(&r).contains(needle), format!("{} {}", r.status, r.text))
                }
            })
            .await
        }
    };
    refused_on_b(json!({"order_id": 5}), "(schema v1 of order.created)").await?;
    let mut v2 = order_schema();
    v2["required"] = json!(["order_id", "customer", "currency"]);
    let mut example = good_order();
    example["currency"] = json!("EUR");
    a.api
        .call("PATCH", "/v1/event-types/order.created", ADMIN_TOKEN, Some(json!({"schema": v2, "examples": [example]})))
        .await?
        .expect(200)?;
    refused_on_b(good_order(), "currency").await?;
    Ok(())
}

/// Issue 48 §12: one rule for types outside the catalog, for posting and subscribing alike,
/// said in each refusal: with `enforce` neither an event nor an endpoint takes such a type;
/// with `warn` or `off` (the default) both do, although the tenant has a catalog.
#[tokio::test]
async fn one_rule_for_types_outside_the_catalog() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    catalog_tenant(api, "off").await?;
    let rx = FakeReceiver::start().await?;
    for (i, mode) in ["off", "warn", "enforce"].into_iter().enumerate() {
        api.call("PUT", "/v1/tenants/acme/catalog", ADMIN_TOKEN, Some(json!({"schema_validation": mode})))
            .await?
            .expect(200)?;
        let endpoint = json!({"url": rx.url(), "event_types": ["shipment.sent"]});
        let subscribed = api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, endpoint).await?;
        let posted =
            api.event("acme", json!({"id": format!("evt_{i}"), "type": "shipment.sent", "payload": {}})).await?;
        if mode == "enforce" {
            ensure!(subscribed.status == 422 && posted.status == 422, "{mode}: {} / {}", subscribed.text, posted.text);
            let (sub, post) = (message(&subscribed), message(&posted));
            ensure!(sub.starts_with("event_types: \"shipment.sent\""), "{sub}");
            ensure!(post.starts_with("type: \"shipment.sent\""), "{post}");
            let rule = "with schema_validation \"enforce\", events and endpoints take only the catalog's types";
            ensure!(sub.contains(rule) && post.contains(rule), "each says the rule: {sub} / {post}");
        } else {
            ensure!(subscribed.status == 201, "{mode}: the endpoint was refused: {}", subscribed.text);
            ensure!(posted.status == 202, "{mode}: the event was refused: {}", posted.text);
        }
    }
    // What was taken is delivered: the first event to the first endpoint, the second to both.
    rx.wait_for(3, Duration::from_secs(10)).await?;
    Ok(())
}
