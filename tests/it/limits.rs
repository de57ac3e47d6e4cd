//! The API's edges (issue 11): every refusal is the JSON error shape with a stable code,
//! stored fields have size limits, durations cannot wrap, deep payloads, token bodies, id
//! reuse with another payload, and text no store can hold. Storage-facing classes run on
//! both backends.

use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Api, Backend, Reply, TestGateway};

tests::backends!(
    reusing_an_event_id_with_another_payload_is_a_conflict,
    text_no_store_can_hold_is_refused_before_the_store,
    stored_fields_have_size_limits,
    a_duplicate_tenant_is_a_conflict_in_herald_words,
);

/// Asserts the documented error shape and returns the code.
fn error_code(r: &Reply, status: u16, what: &str) -> String {
    assert_eq!(r.status, status, "{what}: {}", r.text);
    let code =
        r.json["error"]["code"].as_str().unwrap_or_else(|| panic!("{what}: not the JSON error shape: {}", r.text));
    assert!(r.json["error"]["message"].is_string(), "{what}: {}", r.text);
    code.to_string()
}

async fn deliveries(api: &Api, tenant: &str) -> anyhow::Result<usize> {
    let r = api.get(&format!("/v1/tenants/{tenant}/deliveries?limit=1000"), ADMIN_TOKEN).await?;
    Ok(r.json["data"].as_array().map_or(0, Vec::len))
}

async fn reusing_an_event_id_with_another_payload_is_a_conflict(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    api.endpoint("acme", json!({"url": "http://127.0.0.1:9/h", "rate_per_sec": 1})).await?;
    let first = api.event("acme", json!({"id": "evt_1", "type": "a.b", "payload": {"n": 1}})).await?;
    assert_eq!((first.status, &first.json["duplicate"]), (202, &json!(false)), "{}", first.text);
    let repeat = api.event("acme", json!({"id": "evt_1", "type": "a.b", "payload": {"n": 1}})).await?;
    assert_eq!((repeat.status, &repeat.json["duplicate"]), (202, &json!(true)), "a true repeat: {}", repeat.text);
    for (what, body) in [
        ("other payload", json!({"id": "evt_1", "type": "a.b", "payload": {"n": 2}})),
        ("other type", json!({"id": "evt_1", "type": "a.c", "payload": {"n": 1}})),
    ] {
        let r = api.event("acme", body).await?;
        assert_eq!(error_code(&r, 409, what), "conflict");
        assert!(r.text.contains("evt_1"), "names the id: {}", r.text);
    }
    let stored = api.get("/v1/tenants/acme/events/evt_1", ADMIN_TOKEN).await?;
    assert_eq!(stored.json["payload"], json!({"n": 1}), "the first event stands");

    // A batch with one conflicting event is refused whole: its new event is not stored.
    let before = deliveries(api, "acme").await?;
    let batch = json!({"events": [
        {"id": "evt_new", "type": "a.b", "payload": {}},
        {"id": "evt_1", "type": "a.b", "payload": {"n": 3}},
    ]});
    let r = api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, batch).await?;
    assert_eq!(error_code(&r, 409, "batch"), "conflict");
    assert_eq!(api.get("/v1/tenants/acme/events/evt_new", ADMIN_TOKEN).await?.status, 404);
    assert_eq!(deliveries(api, "acme").await?, before);
    // The same id twice in one batch with different payloads conflicts with itself.
    let twice = json!({"events": [
        {"id": "evt_2", "type": "a.b", "payload": 1}, {"id": "evt_2", "type": "a.b", "payload": 2}]});
    let r = api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, twice).await?;
    assert_eq!(error_code(&r, 409, "within a batch"), "conflict");
    assert_eq!(api.get("/v1/tenants/acme/events/evt_2", ADMIN_TOKEN).await?.status, 404);

    // Concurrent requests share commits: a conflicting one never fails its neighbours.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let api = api.clone();
        let body = if i % 5 == 0 {
            json!({"id": "evt_1", "type": "a.b", "payload": {"n": i}})
        } else {
            json!({"id": format!("evt_c{i}"), "type": "a.b", "payload": {"n": i}})
        };
        tasks.push(tokio::spawn(async move { (i, api.event("acme", body).await) }));
    }
    for t in tasks {
        let (i, r) = t.await?;
        let r = r?;
        assert_eq!(r.status, if i % 5 == 0 { 409 } else { 202 }, "request {i}: {}", r.text);
    }
    Ok(())
}

async fn text_no_store_can_hold_is_refused_before_the_store(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let ep = api.endpoint("acme", json!({"url": "http://127.0.0.1:9/h", "rate_per_sec": 1})).await?;
    let ep = ep["id"].as_str().unwrap();
    let nul = "a\u{0}b";
    let bodies: Vec<(&str, String, Value)> = vec![
        ("tenant name", "/v1/tenants".into(), json!({"id": "nul", "name": nul})),
        (
            "description",
            "/v1/tenants/acme/endpoints".into(),
            json!({"url": "http://127.0.0.1:9/x", "description": nul}),
        ),
        (
            "header",
            "/v1/tenants/acme/endpoints".into(),
            json!({"url": "http://127.0.0.1:9/x", "headers": {"x-a": nul}}),
        ),
        ("replay filter", "/v1/tenants/acme/replays".into(), json!({"filter": {"reason": nul}})),
        ("event id", "/v1/tenants/acme/events".into(), json!({"id": nul, "type": "a.b", "payload": {}})),
    ];
    for (what, path, body) in bodies {
        let r = api.post(&path, ADMIN_TOKEN, body).await?;
        assert!(matches!(r.status, 400 | 422), "{what}: {} {}", r.status, r.text);
        error_code(&r, r.status, what);
    }
    let r = api
        .call("PATCH", &format!("/v1/tenants/acme/endpoints/{ep}"), ADMIN_TOKEN, Some(json!({"description": nul})))
        .await?;
    error_code(&r, 422, "patch");
    for path in [
        "/v1/tenants/acme/events/evt%00x".to_string(),
        "/v1/tenants/acme/deliveries?reason=a%00b".to_string(),
        "/v1/tenants/acme/dead-letters?type=%00".to_string(),
        format!("/v1/tenants/acme/endpoints/{ep}%00"),
    ] {
        let r = api.get(&path, ADMIN_TOKEN).await?;
        error_code(&r, 400, &path);
    }
    // A NUL inside a payload is JSON text (`\u0000`) and stored as sent.
    let r =
        api.post("/v1/tenants/acme/events", ADMIN_TOKEN, json!({"id": "e1", "type": "a.b", "payload": nul})).await?;
    assert_eq!(r.status, 202, "{}", r.text);
    let r = api.get("/v1/tenants/acme/events/e1", ADMIN_TOKEN).await?;
    assert_eq!(r.json["payload"], nul);
    let r = api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?;
    assert_eq!(r.json["data"].as_array().unwrap().len(), 1, "no endpoint was written");
    Ok(())
}

async fn stored_fields_have_size_limits(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let url = "http://127.0.0.1:9/h";
    let many_types: Vec<String> = (0..101).map(|i| format!("t{i}")).collect();
    let many_headers: serde_json::Map<String, Value> = (0..21).map(|i| (format!("x-h{i}"), json!("v"))).collect();
    let cases: Vec<(&str, Value)> = vec![
        ("description", json!({"url": url, "description": "d".repeat(1025)})),
        ("url", json!({"url": format!("{url}/{}", "p".repeat(2048))})),
        ("event_types", json!({"url": url, "event_types": many_types})),
        ("event_types", json!({"url": url, "event_types": ["x".repeat(129)]})),
        ("headers", json!({"url": url, "headers": many_headers})),
        ("headers", json!({"url": url, "headers": {"x".repeat(129): "v"}})),
        ("headers.x-big", json!({"url": url, "headers": {"x-big": "v".repeat(2049)}})),
        ("headers.herald-tenant", json!({"url": url, "headers": {"herald-tenant": "v"}})),
        ("headers.Host", json!({"url": url, "headers": {"Host": "evil.example"}})),
        ("timeout", json!({"url": url, "timeout": "18446744073709552s"})),
        ("retry.ttl", json!({"url": url, "retry": {"ttl": "10000000000000000s"}})),
        ("connect_timeout", json!({"url": url, "timeout": "2s", "connect_timeout": "3s"})),
    ];
    for (field, body) in cases {
        let r = api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, body).await?;
        error_code(&r, 422, field);
        assert!(r.json["error"]["message"].as_str().unwrap().starts_with(field), "names {field}: {}", r.text);
    }
    let r = api.post("/v1/tenants", ADMIN_TOKEN, json!({"id": "big", "name": "n".repeat(257)})).await?;
    assert!(error_code(&r, 422, "tenant name") == "invalid_request" && r.text.contains("name"), "{}", r.text);
    let r = api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?;
    assert_eq!(r.json["data"].as_array().unwrap().len(), 0, "nothing was written");

    // At the limits, and a short timeout with the default connect deadline, are fine.
    let fine = json!({"url": url, "description": "d".repeat(1024), "timeout": "2s",
                      "headers": {"x-big": "v".repeat(2048)}, "retry": {"ttl": "30d"}});
    let r = api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, fine).await?;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!((r.json["timeout"].as_str(), r.json["connect_timeout"].as_str()), (Some("2s"), Some("2s")));
    Ok(())
}

#[tokio::test]
async fn every_refusal_is_the_json_error_shape() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let cases: &[(&str, &str, u16, &str)] = &[
        ("GET", "/v1/tenants/acme/deliveries?limit=-1", 400, "invalid_query"),
        ("GET", "/v1/tenants/acme/deliveries?limit=abc", 400, "invalid_query"),
        ("GET", "/v1/tenants/acme/deliveries?limit=1&limit=2", 400, "invalid_query"),
        ("GET", "/v1/tenants/acme/dead-letters?reasn=exhausted", 400, "invalid_query"),
        ("GET", "/v1/tenants/acme/endpoints?state=paused", 400, "invalid_query"),
        ("GET", "/v1/tenants/acme/events/%FF%FE", 400, "invalid_path"),
        ("GET", "/v1/tenants/acme/deliveries/%C3%28", 400, "invalid_path"),
        ("GET", "/v1/nowhere", 404, "not_found"),
        ("GET", "/v1/tenants/acme/events", 405, "method_not_allowed"),
        ("DELETE", "/v1/tenants", 405, "method_not_allowed"),
        ("PUT", "/v1/tenants/acme/endpoints", 405, "method_not_allowed"),
    ];
    for (method, path, status, code) in cases {
        let r = api.raw(method, path, Some(ADMIN_TOKEN), "").await?;
        assert_eq!(error_code(&r, *status, path), *code, "{method} {path}");
    }
    let r = api.raw("PUT", "/v1/tenants/acme/endpoints", Some(ADMIN_TOKEN), "").await?;
    let allow = r.headers.get("allow").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let mut allow: Vec<&str> = allow.split(',').map(str::trim).collect();
    allow.sort_unstable();
    assert_eq!((r.status, allow), (405, vec!["GET", "HEAD", "POST"]), "405 names the allowed methods");
    Ok(())
}

#[tokio::test]
async fn token_bodies_must_name_their_scopes() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let cases: &[(&str, u16)] = &[
        ("[]", 400),
        ("\"read\"", 400),
        ("", 422),
        ("{}", 422),
        (r#"{"scopes": []}"#, 422),
        (r#"{"scopes": ["read", "read"]}"#, 422),
        (r#"{"scopes": ["read", "admin"]}"#, 422),
        (r#"{"scopes": ["read"], "extra": 1}"#, 400),
    ];
    for (body, status) in cases {
        let r = api.raw("POST", "/v1/tenants/acme/tokens", Some(ADMIN_TOKEN), *body).await?;
        error_code(&r, *status, body);
    }
    let r = api.raw("POST", "/v1/tenants/acme/tokens", Some(ADMIN_TOKEN), r#"{"scopes": ["read"]}"#).await?;
    assert_eq!((r.status, &r.json["scopes"]), (201, &json!(["read"])), "{}", r.text);
    Ok(())
}

#[tokio::test]
async fn deep_payloads_are_refused_with_a_clear_422() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let ok = format!(r#"{{"type": "a.b", "payload": {}}}"#, nested(100));
    assert_eq!(api.raw("POST", "/v1/tenants/acme/events", Some(ADMIN_TOKEN), ok).await?.status, 202);
    for n in [101, 127, 128, 129, 5000] {
        let single = format!(r#"{{"type": "a.b", "payload": {}}}"#, nested(n));
        let batch = format!(r#"{{"events": [{{"type": "a.b", "payload": {}}}]}}"#, nested(n));
        for (path, body) in [("/v1/tenants/acme/events", single), ("/v1/tenants/acme/events/batch", batch)] {
            let r = api.raw("POST", path, Some(ADMIN_TOKEN), body).await?;
            error_code(&r, 422, path);
            assert!(r.text.contains("deeper than 100"), "{}", r.text);
        }
    }
    Ok(())
}

/// Issue 29 §10: a unique violation answers `409 conflict` naming the field, never the
/// database's own text (SQLite's "UNIQUE constraint failed", Postgres' "duplicate key").
async fn a_duplicate_tenant_is_a_conflict_in_herald_words(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let r = api.post("/v1/tenants", ADMIN_TOKEN, json!({"id": "acme", "name": "Again"})).await?;
    assert_eq!(error_code(&r, 409, "duplicate tenant"), "conflict");
    assert_eq!(r.json["error"]["message"], "id: a tenant with this id already exists", "{}", r.text);
    let r = api.get("/v1/tenants", ADMIN_TOKEN).await?;
    let names: Vec<&str> = r.json["data"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["acme"], "the first tenant stands: {}", r.text);
    Ok(())
}
