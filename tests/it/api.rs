//! The admin and intake API: round trips, idempotency, fan-out, bad input, isolation.

use serde_json::json;
use tests::{ADMIN_TOKEN, FakeReceiver, TestGateway};

#[tokio::test]
async fn round_trip_tenant_token_endpoint_event() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let token = api.token("acme", &["events:write", "read", "manage"]).await?;
    let r = api
        .post(
            "/v1/tenants/acme/endpoints",
            &token,
            json!({"url": "http://127.0.0.1:9/hook", "event_types": ["invoice.*"], "rate_per_sec": 5,
                   "retry": {"base": "1s", "factor": 2, "cap": "900s", "jitter": "20%", "max_attempts": 13}}),
        )
        .await?;
    assert_eq!(r.status, 201, "{}", r.text);
    let ep = r.json["id"].as_str().unwrap().to_string();
    assert!(ep.starts_with("ep_"));
    assert!(r.json["secret"].as_str().unwrap().starts_with("whsec_"));
    assert_eq!(r.json["rate_per_sec"], 5.0);
    assert_eq!(r.json["max_in_flight"], 4);
    assert_eq!(r.json["retry"]["max_attempts"], 13);

    let r = api.get(&format!("/v1/tenants/acme/endpoints/{ep}"), &token).await?;
    assert_eq!((r.status, r.json["url"].as_str()), (200, Some("http://127.0.0.1:9/hook")));
    assert!(r.json.get("secret").is_none(), "secrets are not listed");

    let r = api
        .call("PATCH", &format!("/v1/tenants/acme/endpoints/{ep}"), &token, Some(json!({"rate_per_sec": 20})))
        .await?;
    assert_eq!((r.status, r.json["rate_per_sec"].as_f64()), (200, Some(20.0)));

    let body = r#"{"id": "evt_1", "type": "invoice.paid", "payload": {"amount": 10.50, "z": [1, 2]}}"#;
    let r = api.raw("POST", "/v1/tenants/acme/events", Some(&token), body).await?;
    assert_eq!(r.status, 202, "{}", r.text);
    assert_eq!(r.json["id"], "evt_1");
    assert_eq!(r.json["deliveries"], 1);

    let r = api.get("/v1/tenants/acme/events/evt_1", &token).await?;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["type"], "invoice.paid");
    assert!(r.text.contains(r#""payload":{"amount": 10.50, "z": [1, 2]}"#), "payload bytes kept exactly: {}", r.text);

    let r = api.get("/v1/tenants/acme/events/evt_1/deliveries", &token).await?;
    let data = r.json["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["endpoint_id"], ep.as_str());
    assert_eq!(data[0]["event_id"], "evt_1");
    let delivery = data[0]["id"].as_str().unwrap();
    let r = api.get(&format!("/v1/tenants/acme/deliveries/{delivery}"), &token).await?;
    assert_eq!(r.status, 200);
    assert!(r.json["attempt_history"].is_array());

    let r = api.post(&format!("/v1/tenants/acme/endpoints/{ep}/rotate-secret"), &token, json!({})).await?;
    assert_eq!(r.status, 200);
    let r = api.get(&format!("/v1/tenants/acme/endpoints/{ep}/secret"), &token).await?;
    assert_eq!(r.json["secrets"].as_array().unwrap().len(), 2, "old secret valid during grace: {}", r.text);

    let r = api.call("DELETE", &format!("/v1/tenants/acme/endpoints/{ep}"), &token, None).await?;
    assert_eq!(r.status, 204);
    let r = api.get(&format!("/v1/tenants/acme/endpoints/{ep}"), &token).await?;
    assert_eq!(r.status, 404);
    Ok(())
}

#[tokio::test]
async fn intake_is_idempotent_per_tenant() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    let rx = FakeReceiver::start().await?;
    for t in ["a", "b"] {
        api.tenant(t).await?;
        api.endpoint(t, json!({"url": rx.url(), "rate_per_sec": 1})).await?;
    }
    let ev = json!({"id": "evt_same", "type": "x.y", "payload": {}});
    let first = api.event("a", ev.clone()).await?;
    let again = api.event("a", ev.clone()).await?;
    assert_eq!((first.status, again.status), (202, 202));
    assert_eq!(first.json["duplicate"], false);
    assert_eq!(again.json["duplicate"], true);
    assert_eq!(again.json["deliveries"], 1);
    let r = api.get("/v1/tenants/a/events/evt_same/deliveries", ADMIN_TOKEN).await?;
    assert_eq!(r.json["data"].as_array().unwrap().len(), 1, "no new deliveries for a duplicate");
    // The same id in another tenant is another event.
    let other = api.event("b", ev).await?;
    assert_eq!(other.json["duplicate"], false);
    Ok(())
}

#[tokio::test]
async fn fan_out_follows_filters_and_state() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let url = "http://127.0.0.1:9/h";
    let all = api.endpoint("acme", json!({"url": url, "rate_per_sec": 1})).await?;
    let invoices = api.endpoint("acme", json!({"url": url, "event_types": ["invoice.*"], "rate_per_sec": 1})).await?;
    let paid = api.endpoint("acme", json!({"url": url, "event_types": ["invoice.paid"], "rate_per_sec": 1})).await?;
    api.endpoint("acme", json!({"url": url, "event_types": ["user.created"], "rate_per_sec": 1})).await?;
    let cases = [("invoice.paid", 3), ("invoice.voided", 2), ("invoice", 1), ("order.shipped", 1)];
    for (i, (ty, want)) in cases.iter().enumerate() {
        let r = api.event("acme", json!({"id": format!("e{i}"), "type": ty, "payload": {"i": i}})).await?;
        assert_eq!(r.json["deliveries"], *want, "{ty}");
    }
    let r = api.get("/v1/tenants/acme/events/e0/deliveries", ADMIN_TOKEN).await?;
    let mut got: Vec<String> =
        r.json["data"].as_array().unwrap().iter().map(|d| d["endpoint_id"].as_str().unwrap().to_string()).collect();
    got.sort();
    let mut want: Vec<String> =
        [&all, &invoices, &paid].iter().map(|e| e["id"].as_str().unwrap().to_string()).collect();
    want.sort();
    assert_eq!(got, want);

    // The batch form: all or nothing, one 202.
    let r = api
        .post(
            "/v1/tenants/acme/events/batch",
            ADMIN_TOKEN,
            json!({"events": [
            {"type": "invoice.paid", "payload": {}}, {"id": "e0", "type": "invoice.paid", "payload": {"i": 0}}]}),
        )
        .await?;
    assert_eq!(r.status, 202, "{}", r.text);
    let data = r.json["data"].as_array().unwrap();
    assert_eq!((data[0]["deliveries"].as_u64(), data[1]["duplicate"].as_bool()), (Some(3), Some(true)));
    assert!(data[0]["id"].as_str().unwrap().starts_with("evt_"));
    Ok(())
}

#[tokio::test]
async fn bad_input_gets_a_clear_4xx_and_writes_nothing() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[("HERALD_SERVER_MAX_PAYLOAD_BYTES", "1000")]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    api.endpoint("acme", json!({"url": "http://127.0.0.1:9/h", "rate_per_sec": 1})).await?;
    let reader = api.token("acme", &["read"]).await?;
    let big = "x".repeat(2000);
    let cases: Vec<(&str, &str, Option<&str>, String, u16)> = vec![
        ("POST", "/v1/tenants/acme/events", Some(ADMIN_TOKEN), "{not json".into(), 400),
        ("POST", "/v1/tenants/acme/events", Some(ADMIN_TOKEN), r#"{"payload": {}}"#.into(), 400),
        ("POST", "/v1/tenants/acme/events", Some(ADMIN_TOKEN), r#"{"type": 5, "payload": {}}"#.into(), 400),
        ("POST", "/v1/tenants/acme/events", Some(ADMIN_TOKEN), r#"{"type": "a.b"}"#.into(), 400),
        ("POST", "/v1/tenants/acme/events", Some(ADMIN_TOKEN), r#"{"type": "a b", "payload": {}}"#.into(), 400),
        (
            "POST",
            "/v1/tenants/acme/events",
            Some(ADMIN_TOKEN),
            r#"{"id": "has space", "type": "a", "payload": {}}"#.into(),
            400,
        ),
        (
            "POST",
            "/v1/tenants/acme/events",
            Some(ADMIN_TOKEN),
            r#"{"type": "a", "payload": {}, "extra": 1}"#.into(),
            400,
        ),
        ("POST", "/v1/tenants/acme/events", Some(ADMIN_TOKEN), format!(r#"{{"type": "a", "payload": "{big}"}}"#), 413),
        ("POST", "/v1/tenants/nobody/events", Some(ADMIN_TOKEN), r#"{"type": "a", "payload": {}}"#.into(), 404),
        ("POST", "/v1/tenants/acme/events", None, r#"{"type": "a", "payload": {}}"#.into(), 401),
        ("POST", "/v1/tenants/acme/events", Some("wrong"), r#"{"type": "a", "payload": {}}"#.into(), 401),
        ("POST", "/v1/tenants/acme/events", Some(&reader), r#"{"type": "a", "payload": {}}"#.into(), 403),
        ("POST", "/v1/tenants/acme/endpoints", Some(ADMIN_TOKEN), r#"{"url": "ftp://example.com/x"}"#.into(), 422),
        ("POST", "/v1/tenants/acme/endpoints", Some(ADMIN_TOKEN), r#"{"url": "not a url"}"#.into(), 422),
        ("POST", "/v1/tenants/acme/endpoints", Some(ADMIN_TOKEN), r#"{}"#.into(), 422),
        (
            "POST",
            "/v1/tenants/acme/endpoints",
            Some(ADMIN_TOKEN),
            r#"{"url": "http://a.example", "rate_per_sec": 0}"#.into(),
            422,
        ),
        (
            "POST",
            "/v1/tenants/acme/endpoints",
            Some(ADMIN_TOKEN),
            r#"{"url": "http://a.example", "timeout": "90s"}"#.into(),
            422,
        ),
        (
            "POST",
            "/v1/tenants/acme/endpoints",
            Some(ADMIN_TOKEN),
            r#"{"url": "http://a.example", "secret": "nope"}"#.into(),
            422,
        ),
        (
            "POST",
            "/v1/tenants/acme/endpoints",
            Some(ADMIN_TOKEN),
            r#"{"url": "http://a.example", "retry": {"factor": 0.5}}"#.into(),
            422,
        ),
        (
            "POST",
            "/v1/tenants/acme/endpoints",
            Some(ADMIN_TOKEN),
            r#"{"url": "http://a.example", "event_types": ["a b"]}"#.into(),
            422,
        ),
        (
            "POST",
            "/v1/tenants/acme/endpoints",
            Some(ADMIN_TOKEN),
            r#"{"url": "http://a.example", "headers": {"webhook-id": "x"}}"#.into(),
            422,
        ),
        ("POST", "/v1/tenants/acme/endpoints", Some(&reader), r#"{"url": "http://a.example"}"#.into(), 403),
        ("POST", "/v1/tenants", Some(&reader), r#"{"id": "x"}"#.into(), 403),
        ("POST", "/v1/tenants", Some(ADMIN_TOKEN), r#"{"id": "Bad Id"}"#.into(), 422),
        ("POST", "/v1/tenants", Some(ADMIN_TOKEN), r#"{"id": "acme"}"#.into(), 409),
        ("GET", "/v1/tenants/acme/deliveries?state=bogus", Some(ADMIN_TOKEN), String::new(), 400),
    ];
    for (method, path, token, body, want) in &cases {
        let r = api.raw(method, path, *token, body.clone()).await?;
        assert_eq!(r.status, *want, "{method} {path} {body:.80}: {}", r.text);
        assert!(
            r.json["error"]["code"].is_string() && r.json["error"]["message"].is_string(),
            "JSON error for {path}: {}",
            r.text
        );
    }
    // Nothing was written: no events at all, one endpoint.
    let r = api.get("/v1/tenants/acme/deliveries", ADMIN_TOKEN).await?;
    assert_eq!(r.json["data"].as_array().unwrap().len(), 0);
    let r = api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?;
    assert_eq!(r.json["data"].as_array().unwrap().len(), 1);
    Ok(())
}

#[tokio::test]
async fn private_destinations_are_refused_by_default() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[("HERALD_DELIVERY_ALLOW_PRIVATE_DESTINATIONS", "false")]).await?;
    gw.api.tenant("acme").await?;
    for url in [
        "http://127.0.0.1:8080/x",
        "http://169.254.169.254/latest",
        "http://[::1]/x",
        "http://10.0.0.1/x",
        "http://localhost/x",
    ] {
        let r = gw.api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, json!({"url": url})).await?;
        assert_eq!(r.status, 422, "{url}: {}", r.text);
    }
    Ok(())
}

#[tokio::test]
async fn tenants_cannot_see_each_other() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("a").await?;
    api.tenant("b").await?;
    let ta = api.token("a", &["events:write", "read", "manage"]).await?;
    let ep_b = api.endpoint("b", json!({"url": "http://127.0.0.1:9/h", "rate_per_sec": 1})).await?;
    let ep_b = ep_b["id"].as_str().unwrap();
    api.event("b", json!({"id": "evt_b", "type": "t", "payload": {}})).await?;
    let r = api.get("/v1/tenants/b/events/evt_b/deliveries", ADMIN_TOKEN).await?;
    let dlv_b = r.json["data"][0]["id"].as_str().unwrap().to_string();
    // Through b's URLs with a's token, and through a's URLs with b's ids: 404 either way.
    for path in [
        "/v1/tenants/b/endpoints".to_string(),
        format!("/v1/tenants/b/endpoints/{ep_b}"),
        format!("/v1/tenants/a/endpoints/{ep_b}"),
        "/v1/tenants/b/events/evt_b".into(),
        "/v1/tenants/a/events/evt_b".into(),
        format!("/v1/tenants/a/deliveries/{dlv_b}"),
        format!("/v1/tenants/b/deliveries/{dlv_b}"),
    ] {
        let r = api.get(&path, &ta).await?;
        assert_eq!(r.status, 404, "{path}: {}", r.text);
    }
    let r = api.post("/v1/tenants/b/events", &ta, json!({"type": "t", "payload": {}})).await?;
    assert_eq!(r.status, 404);
    let r =
        api.call("PATCH", &format!("/v1/tenants/a/endpoints/{ep_b}"), &ta, Some(json!({"rate_per_sec": 1}))).await?;
    assert_eq!(r.status, 404);
    let r = api.call("DELETE", &format!("/v1/tenants/a/endpoints/{ep_b}"), &ta, None).await?;
    assert_eq!(r.status, 404);
    let r = api.get(&format!("/v1/tenants/b/endpoints/{ep_b}"), ADMIN_TOKEN).await?;
    assert_eq!(r.status, 200, "b's endpoint is untouched");
    Ok(())
}

#[tokio::test]
async fn health_and_metrics() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let r = gw.api.raw("GET", "/healthz", None, "").await?;
    assert_eq!(r.status, 200);
    gw.api.tenant("acme").await?;
    gw.api.endpoint("acme", json!({"url": "http://127.0.0.1:9/h", "rate_per_sec": 1})).await?;
    gw.api.event("acme", json!({"type": "t", "payload": {}})).await?;
    let r = gw.api.raw("GET", "/metrics", None, "").await?;
    assert!(r.text.contains("herald_events_accepted_total 1"), "{}", r.text);
    assert!(r.text.contains("herald_deliveries_created_total 1"), "{}", r.text);
    Ok(())
}

/// Issue 29 §11: every refusal of a body or query starts with the field (or parameter) at
/// fault, as a path; every bad query value is `400 invalid_query`.
#[tokio::test]
async fn every_refusal_starts_with_the_field() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let ep = api.endpoint("acme", json!({"url": "http://127.0.0.1:9/h"})).await?;
    let ep_path = format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().unwrap());
    let url = r#""url": "http://127.0.0.1:9/x""#;
    // (method, path, body, status, code, what the message starts with)
    let cases: Vec<(&str, String, String, u16, &str, &str)> = vec![
        (
            "POST",
            "/v1/tenants/acme/endpoints".into(),
            format!(r#"{{{url}, "rate_per_sec": "fast"}}"#),
            400,
            "invalid_request",
            "rate_per_sec: expected a number",
        ),
        (
            "POST",
            "/v1/tenants/acme/endpoints".into(),
            format!(r#"{{{url}, "burst": -1}}"#),
            400,
            "invalid_request",
            "burst: expected a whole number",
        ),
        (
            "POST",
            "/v1/tenants/acme/endpoints".into(),
            format!(r#"{{{url}, "retry": {{"factor": "x"}}}}"#),
            400,
            "invalid_request",
            "retry.factor: expected a number",
        ),
        (
            "POST",
            "/v1/tenants/acme/endpoints".into(),
            format!(r#"{{{url}, "retry": {{"bse": "1s"}}}}"#),
            400,
            "invalid_request",
            "retry.bse: unknown field",
        ),
        (
            "POST",
            "/v1/tenants/acme/endpoints".into(),
            format!(r#"{{{url}, "event_types": "a.b"}}"#),
            400,
            "invalid_request",
            "event_types: expected an array",
        ),
        (
            "POST",
            "/v1/tenants/acme/endpoints".into(),
            format!(r#"{{{url}, "headers": {{"x-a": 1}}}}"#),
            400,
            "invalid_request",
            "headers.x-a: expected a string",
        ),
        (
            "POST",
            "/v1/tenants/acme/endpoints".into(),
            format!(r#"{{{url}, "colour": 1}}"#),
            400,
            "invalid_request",
            "colour: unknown field",
        ),
        (
            "PATCH",
            ep_path.clone(),
            r#"{"max_in_flight": 1.5}"#.into(),
            400,
            "invalid_request",
            "max_in_flight: expected a whole number",
        ),
        ("POST", "/v1/tenants".into(), r#"{"id": 7}"#.into(), 400, "invalid_request", "id: expected a string"),
        ("POST", "/v1/tenants".into(), r#"{"name": "x"}"#.into(), 400, "invalid_request", "id: required"),
        (
            "POST",
            "/v1/tenants".into(),
            "[1]".into(),
            400,
            "invalid_request",
            "body: expected a JSON object, got an array",
        ),
        ("POST", "/v1/tenants".into(), "{not json".into(), 400, "invalid_request", "body: key must be a string"),
        (
            "POST",
            "/v1/tenants/acme/tokens".into(),
            r#"{"scopes": "read"}"#.into(),
            400,
            "invalid_request",
            "scopes: expected an array",
        ),
        (
            "POST",
            "/v1/tenants/acme/replays".into(),
            r#"{"filter": {}, "rate_per_sec": true}"#.into(),
            400,
            "invalid_request",
            "rate_per_sec: expected a number",
        ),
        (
            "POST",
            "/v1/tenants/acme/replays".into(),
            r#"{"filter": {"since": 5}}"#.into(),
            400,
            "invalid_request",
            "filter.since: expected a string",
        ),
        (
            "POST",
            "/v1/tenants/acme/events".into(),
            r#"{"type": 5, "payload": {}}"#.into(),
            400,
            "invalid_request",
            "type: expected a string",
        ),
        (
            "POST",
            "/v1/tenants/acme/events".into(),
            r#"{"type": "a.b"}"#.into(),
            400,
            "invalid_request",
            "payload: required",
        ),
        ("POST", "/v1/tenants/acme/events".into(), "{not json".into(), 400, "invalid_request", "body: "),
        (
            "POST",
            "/v1/tenants/acme/events/batch".into(),
            r#"{"events": [{"type": "a", "payload": 1}, {"payload": 1}]}"#.into(),
            400,
            "invalid_request",
            "events[1].type: required",
        ),
        (
            "GET",
            "/v1/tenants/acme/deliveries?limit=ten".into(),
            String::new(),
            400,
            "invalid_query",
            "limit: expected a whole number",
        ),
        (
            "GET",
            "/v1/tenants/acme/deliveries?limit=0".into(),
            String::new(),
            400,
            "invalid_query",
            "limit: 0 is not 1 to 1000",
        ),
        (
            "GET",
            "/v1/tenants/acme/deliveries?state=bogus".into(),
            String::new(),
            400,
            "invalid_query",
            "state: unknown state",
        ),
        (
            "GET",
            "/v1/tenants/acme/dead-letters?since=yesterday".into(),
            String::new(),
            400,
            "invalid_query",
            "since: \"yesterday\" is not an RFC 3339",
        ),
        ("GET", "/v1/tenants/acme/deliveries?until=1".into(), String::new(), 400, "invalid_query", "until: "),
        (
            "GET",
            "/v1/tenants/acme/deliveries?colour=red".into(),
            String::new(),
            400,
            "invalid_query",
            "colour: unknown field",
        ),
        (
            "GET",
            "/v1/tenants/acme/deliveries?limit=1&limit=2".into(),
            String::new(),
            400,
            "invalid_query",
            "limit: the key is given more than once",
        ),
        (
            "GET",
            "/v1/tenants/acme/endpoints?health=maybe".into(),
            String::new(),
            400,
            "invalid_query",
            "health: expected true or false",
        ),
        ("GET", "/v1/tenants/acme/endpoints?plugin=Bad%20Name".into(), String::new(), 400, "invalid_query", "plugin: "),
        ("GET", "/v1/tenants/acme/replays?limit=-1".into(), String::new(), 400, "invalid_query", "limit: "),
        ("GET", "/v1/tenants/acme/series?window=2h".into(), String::new(), 400, "invalid_query", "window: "),
        ("GET", "/v1/overview?window=2h".into(), String::new(), 400, "invalid_query", "window: "),
    ];
    for (method, path, body, status, code, starts) in &cases {
        let r = api.raw(method, path, Some(ADMIN_TOKEN), body.clone()).await?;
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(
            (r.status, r.json["error"]["code"].as_str()),
            (*status, Some(*code)),
            "{method} {path} {body}: {}",
            r.text
        );
        assert!(message.starts_with(starts), "{method} {path} {body}: {message:?} should start with {starts:?}");
    }
    Ok(())
}

/// Issue 29 §13: a key given twice in one object is refused, naming it, at any depth and on
/// every route that reads JSON; nothing is written.
#[tokio::test]
async fn a_key_given_twice_is_refused_with_its_path() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let cases = [
        ("/v1/tenants", r#"{"id": "a", "id": "b"}"#, "id"),
        ("/v1/tenants/acme/endpoints", r#"{"url": "http://127.0.0.1:9/a", "url": "http://127.0.0.1:9/b"}"#, "url"),
        (
            "/v1/tenants/acme/endpoints",
            r#"{"url": "http://127.0.0.1:9/a", "headers": {"x-a": "1", "x-a": "2"}}"#,
            "headers.x-a",
        ),
        (
            "/v1/tenants/acme/endpoints",
            r#"{"url": "http://127.0.0.1:9/a", "retry": {"base": "1s", "base": "2s"}}"#,
            "retry.base",
        ),
        ("/v1/tenants/acme/events", r#"{"id": "evt_a", "id": "evt_b", "type": "a.b", "payload": {}}"#, "id"),
        ("/v1/tenants/acme/events", r#"{"type": "a.b", "payload": {"n": [{"k": 1, "k": 2}]}}"#, "payload.n[0].k"),
        (
            "/v1/tenants/acme/events/batch",
            r#"{"events": [{"type": "a.b", "payload": {"x": 1, "x": 1}}]}"#,
            "events[0].payload.x",
        ),
    ];
    for (path, body, key) in cases {
        let r = api.raw("POST", path, Some(ADMIN_TOKEN), body).await?;
        assert_eq!((r.status, r.json["error"]["code"].as_str()), (400, Some("invalid_request")), "{body}: {}", r.text);
        let message = r.json["error"]["message"].as_str().unwrap();
        assert_eq!(message, format!("{key}: the key is given more than once"), "{body}");
    }
    let r = api.get("/v1/tenants", ADMIN_TOKEN).await?;
    assert_eq!(r.json["data"].as_array().unwrap().len(), 1, "no tenant was written: {}", r.text);
    let r = api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?;
    assert_eq!(r.json["data"].as_array().unwrap().len(), 0, "no endpoint was written: {}", r.text);
    let r = api.get("/v1/tenants/acme/deliveries", ADMIN_TOKEN).await?;
    let r2 = api.get("/v1/tenants/acme/events/evt_a", ADMIN_TOKEN).await?;
    assert_eq!((r.json["data"].as_array().unwrap().len(), r2.status), (0, 404), "no event was written");
    Ok(())
}

/// Issue 29 §13: a patch that changes nothing (`{}`, or the values already set) answers the
/// endpoint as it is and writes nothing: `updated_at` stays.
#[tokio::test]
async fn an_empty_patch_changes_nothing() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let created = api.endpoint("acme", json!({"url": "http://127.0.0.1:9/h", "rate_per_sec": 5})).await?;
    let path = format!("/v1/tenants/acme/endpoints/{}", created["id"].as_str().unwrap());
    let before = api.get(&path, ADMIN_TOKEN).await?.json;
    // So that a write would stamp a later `updated_at` (milliseconds on the node's monotonic
    // clock), let the clock pass the one stored: a bounded spin, not a wait for work.
    let read = std::time::Instant::now();
    while read.elapsed() < std::time::Duration::from_millis(2) {
        tokio::task::yield_now().await;
    }
    for body in [json!({}), json!({"rate_per_sec": 5}), json!({"url": "http://127.0.0.1:9/h"})] {
        let r = api.call("PATCH", &path, ADMIN_TOKEN, Some(body.clone())).await?;
        assert_eq!(r.status, 200, "{body}: {}", r.text);
        assert_eq!(r.json["updated_at"], before["updated_at"], "{body}: answered as it was");
        let after = api.get(&path, ADMIN_TOKEN).await?.json;
        assert_eq!(after["updated_at"], before["updated_at"], "{body}: nothing was written");
    }
    // A real change is still written.
    let r = api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"rate_per_sec": 6}))).await?;
    assert_eq!((r.status, r.json["rate_per_sec"].as_f64()), (200, Some(6.0)), "{}", r.text);
    assert_ne!(r.json["updated_at"], before["updated_at"]);
    Ok(())
}

/// Issue 48 §11: each message starts with the field at fault, whole, once: not with a
/// serde position (`[0]: …` for a top-level array), a noun (`event type "a b" …`), a group
/// (`pacing: rate_per_sec …`) or the path twice (`retry: retry.jitter: …`); a bad PEM is
/// said in words, not as lists of byte values. Nothing of a refused request is written.
#[tokio::test]
async fn each_message_starts_with_its_field_once() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let ep = r#""url": "http://127.0.0.1:9/x""#;
    let events = "/v1/tenants/acme/events";
    let batch = "/v1/tenants/acme/events/batch";
    let endpoints = "/v1/tenants/acme/endpoints";
    let unterminated = r#""-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ\n""#;
    let not_base64 = r#""-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n""#;
    // (path, body, status, the whole message or, ending in `…`, how it starts)
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (events, r#"[1, "a.b", {}]"#.into(), 400, "body: expected a JSON object, got an array"),
        (events, r#""a.b""#.into(), 400, "body: expected a JSON object, got string \"a.b\""),
        (batch, r#"[{"type": "a.b", "payload": {}}]"#.into(), 400, "body: expected a JSON object, got an array"),
        (batch, r#"{"events": [["evt_1", "a.b", {}]]}"#.into(), 400, "events[0]: expected a JSON object, got an array"),
        (batch, r#"{"events": {"type": "a.b"}}"#.into(), 400, "events: expected an array, got an object"),
        (events, r#"{"type": "a b", "payload": {}}"#.into(), 400, "type: \"a b\" is not an event type (…"),
        (
            batch,
            r#"{"events": [{"type": "a", "payload": 1}, {"type": "a b", "payload": 1}]}"#.into(),
            400,
            "events[1].type: \"a b\" is not an event type (…",
        ),
        (events, r#"{"id": "a b", "type": "a", "payload": {}}"#.into(), 400, "id: \"a b\" is not an event id (…"),
        (
            events,
            r#"{"type": "a", "payload": {}, "ordering_key": ""}"#.into(),
            400,
            "ordering_key: must be 1-256 visible ASCII characters",
        ),
        (batch, r#"{"events": []}"#.into(), 400, "events: must not be empty"),
        (endpoints, format!(r#"{{{ep}, "rate_per_sec": 0}}"#), 422, "rate_per_sec: must be a finite number in (0, …"),
        (endpoints, format!(r#"{{{ep}, "burst": 0}}"#), 422, "burst: must be at least 1"),
        (endpoints, format!(r#"{{{ep}, "max_in_flight": 0}}"#), 422, "max_in_flight: must be at least 1"),
        (
            endpoints,
            format!(r#"{{{ep}, "retry": {{"jitter": "0%"}}}}"#),
            422,
            r#"retry.jitter: must be "none", "full" or a percentage in (0%, 100%], got "0%""#,
        ),
        (
            endpoints,
            format!(r#"{{{ep}, "retry": {{"jitter": "half"}}}}"#),
            422,
            r#"retry.jitter: must be "none", "full" or a percentage like "20%", got "half""#,
        ),
        (
            endpoints,
            format!(r#"{{{ep}, "retry": {{"base": "10s", "cap": "1s"}}}}"#),
            422,
            "retry.cap: 1s is less than the base delay (10s)",
        ),
        (
            endpoints,
            format!(r#"{{{ep}, "retry": {{"factor": 0.5}}}}"#),
            422,
            "retry.factor: must be a finite number >= 1, got 0.5",
        ),
        (
            endpoints,
            format!(r#"{{{ep}, "retry": {{"max_attempts": 0}}}}"#),
            422,
            "retry.max_attempts: must be at least 1",
        ),
        (
            endpoints,
            format!(r#"{{{ep}, "tls": {{"ca_bundle": {unterminated}}}}}"#),
            422,
            r#"tls.ca_bundle: is not PEM: a section has no "-----END CERTIFICATE-----" line"#,
        ),
        (
            endpoints,
            format!(r#"{{{ep}, "tls": {{"ca_bundle": {not_base64}}}}}"#),
            422,
            "tls.ca_bundle: is not PEM: a section's body is not valid base64",
        ),
    ];
    for (path, body, status, want) in &cases {
        let r = api.raw("POST", path, Some(ADMIN_TOKEN), body.clone()).await?;
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(r.status, *status, "{path} {body}: {}", r.text);
        match want.strip_suffix('…') {
            Some(start) => assert!(message.starts_with(start), "{path} {body}: {message:?} should start {start:?}"),
            None => assert_eq!(message, *want, "{path} {body}"),
        }
    }
    let listed = api.get(endpoints, ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(listed.json["data"], json!([]), "no endpoint was written");
    let deliveries = api.get("/v1/tenants/acme/deliveries", ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(deliveries.json["data"], json!([]), "no event was written");
    Ok(())
}

/// Issue 48 §11: a body over the API's limit is a `413` that names the limit and what sets
/// it, on a route that parses its own body and on one that reads a JSON object.
#[tokio::test]
async fn a_body_over_the_limit_names_the_limit() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[("HERALD_SERVER_MAX_PAYLOAD_BYTES", "1024")]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    // 16 × 1 KiB is under the floor of 1 MiB: the limit is 1 MiB + 64 KiB.
    let limit = (1 << 20) + (64 << 10);
    let body = format!(r#"{{"type": "a", "payload": "{}"}}"#, "x".repeat(limit));
    for path in ["/v1/tenants/acme/events", "/v1/tenants/acme/endpoints"] {
        let r = api.raw("POST", path, Some(ADMIN_TOKEN), body.clone()).await?;
        assert_eq!(
            (r.status, r.json["error"]["code"].as_str()),
            (413, Some("payload_too_large")),
            "{path}: {}",
            r.text
        );
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        let want = format!("body: over the limit of {limit} bytes (");
        assert!(message.starts_with(&want), "{path}: {message:?} should start {want:?}");
        assert!(message.contains("server.max_payload_bytes"), "{path}: {message:?} names what sets it");
    }
    // A payload over its own limit (under the body's) names that one.
    let r = api.event("acme", json!({"type": "a", "payload": "x".repeat(2000)})).await?;
    assert_eq!(r.status, 413, "{}", r.text);
    let message = r.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("payload: 2002 bytes, over the limit of 1024 (server.max_payload_bytes)"), "{message}");
    Ok(())
}

/// Issue 48 §15: a URL with no host right after `//` (`http:///x`, which the URL standard
/// reads as `http://x/`) is refused, not stored as another URL.
#[tokio::test]
async fn a_url_without_its_host_is_refused_not_rewritten() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[("HERALD_DELIVERY_ALLOW_PRIVATE_DESTINATIONS", "true")]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    for url in ["http:///x", "http:/x", "https:example.com/h", "http:\\\\x/h"] {
        let r = api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, json!({ "url": url })).await?;
        assert_eq!(r.status, 422, "{url}: {}", r.text);
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with("url: ") && message.contains("scheme://host"), "{url}: {message}");
    }
    let listed = api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(listed.json["data"], json!([]), "nothing was stored");
    // Written in full, a URL is stored as written.
    let ep = api.endpoint("acme", json!({"url": "http://x/"})).await?;
    assert_eq!(ep["url"], "http://x/");
    let path = format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().unwrap_or_default());
    let r = api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"url": "http:///y"}))).await?;
    assert_eq!(r.status, 422, "{}", r.text);
    assert_eq!(api.get(&path, ADMIN_TOKEN).await?.json["url"], "http://x/", "the stored URL is kept");
    Ok(())
}

/// Issue 48 §15: a `PATCH` with no body at all is refused with a clear `400` (it is not
/// read as `{}`); `{}` still changes nothing, and a bodiless `POST` action still works.
#[tokio::test]
async fn a_patch_without_a_body_is_refused() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let ep = api.endpoint("acme", json!({"url": "http://127.0.0.1:9/h"})).await?;
    let path = format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().unwrap_or_default());
    let r = api.raw("PATCH", &path, Some(ADMIN_TOKEN), "").await?;
    assert_eq!((r.status, r.json["error"]["code"].as_str()), (400, Some("invalid_request")), "{}", r.text);
    let message = r.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("body: required"), "{message}");
    api.raw("PATCH", &path, Some(ADMIN_TOKEN), "{}").await?.expect(200)?;
    api.raw("PATCH", "/v1/event-types/none", Some(ADMIN_TOKEN), "").await?.expect(400)?;
    api.raw("POST", &format!("{path}/pause"), Some(ADMIN_TOKEN), "").await?.expect(200)?;
    Ok(())
}
