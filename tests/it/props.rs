//! Property tests of the intake and endpoint validators through the real API: for any
//! body, Herald answers a 2xx or the JSON 4xx error shape, never a 5xx or a dropped
//! connection, and a 4xx writes nothing. Case counts are bounded so this runs in seconds.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Api, Reply, TestGateway};

const CASES: u32 = 150;

/// Strings that probe the validators: ordinary and hostile text, durations that would
/// wrap, reserved header names, URLs.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9._:*-]{0,12}",
        any::<String>(),
        Just("a\u{0}b".to_string()),
        Just("18446744073709552s".to_string()),
        Just("10000000000000000s".to_string()),
        "[0-9]{1,22}(ms|s|m|h|d)",
        Just("x".repeat(3000)),
        Just("herald-x".to_string()),
        Just("http://127.0.0.1:9/h".to_string()),
        Just("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_string()),
        Just("20%".to_string()),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        text().prop_map(Value::from),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::btree_map(text(), inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An object whose keys come mostly from `fields` (plus stray ones), with plausible or
/// arbitrary values.
fn object_of(
    fields: &'static [&'static str],
    plausible: BTreeMap<&'static str, BoxedStrategy<Value>>,
) -> impl Strategy<Value = Value> {
    let key = prop_oneof![9 => prop::sample::select(fields).prop_map(str::to_string), 1 => text()];
    let entry = key.prop_flat_map(move |k| {
        let v = match plausible.get(k.as_str()) {
            Some(s) => prop_oneof![3 => s.clone(), 1 => value().boxed()].boxed(),
            None => value().boxed(),
        };
        (Just(k), v)
    });
    prop::collection::vec(entry, 0..7).prop_map(|kv| Value::Object(kv.into_iter().collect()))
}

fn event() -> impl Strategy<Value = Value> {
    let plausible = BTreeMap::from([
        ("type", prop_oneof![Just(json!("a.b")), text().prop_map(Value::from)].boxed()),
        ("id", "[a-z0-9_]{1,10}".prop_map(Value::from).boxed()),
    ]);
    object_of(&["id", "type", "payload"], plausible)
}

fn endpoint() -> impl Strategy<Value = Value> {
    let dur = || "[0-9]{1,3}(ms|s|m)".prop_map(Value::from).boxed();
    let plausible = BTreeMap::from([
        ("url", Just(json!("http://127.0.0.1:9/h")).boxed()),
        ("timeout", dur()),
        ("connect_timeout", dur()),
        ("rate_per_sec", (0.0f64..2000.0).prop_map(|f| json!(f)).boxed()),
        ("burst", (0u32..5000).prop_map(Value::from).boxed()),
        ("max_in_flight", (0u32..5000).prop_map(Value::from).boxed()),
        ("event_types", prop::collection::vec(text(), 0..4).prop_map(Value::from).boxed()),
        ("headers", prop::collection::btree_map(text(), text(), 0..3).prop_map(|m| json!(m)).boxed()),
        (
            "retry",
            object_of(
                &["base", "factor", "cap", "jitter", "max_attempts", "ttl"],
                BTreeMap::from([("base", dur()), ("cap", dur()), ("ttl", dur())]),
            )
            .boxed(),
        ),
    ]);
    object_of(
        &[
            "url",
            "description",
            "event_types",
            "rate_per_sec",
            "burst",
            "max_in_flight",
            "secret",
            "timeout",
            "connect_timeout",
            "retry",
            "plugins",
            "headers",
        ],
        plausible,
    )
}

/// 2xx, or a 4xx with `{"error": {"code", "message"}}`.
fn judge(what: &str, body: &str, r: &Reply) -> Result<bool, TestCaseError> {
    match r.status {
        200..=299 => Ok(true),
        400..=499 if r.json["error"]["code"].is_string() && r.json["error"]["message"].is_string() => Ok(false),
        s => Err(TestCaseError::fail(format!("{what} {body:.300}: {s} {:.300}", r.text))),
    }
}

async fn count(api: &Api, path: &str) -> anyhow::Result<usize> {
    let r = api.get(path, ADMIN_TOKEN).await?;
    Ok(r.json["data"].as_array().map_or(0, Vec::len))
}

fn runner() -> TestRunner {
    TestRunner::new(Config { cases: CASES, failure_persistence: None, ..Config::default() })
}

/// A node with tenant `acme` and one endpoint made from `endpoint`; returns its id.
fn node(rt: &tokio::runtime::Runtime, endpoint: Value) -> (TestGateway, String) {
    let started = rt.block_on(async {
        let gw = TestGateway::start().await?;
        gw.api.tenant("acme").await?;
        let ep = gw.api.endpoint("acme", endpoint).await?;
        anyhow::Ok((gw, ep["id"].as_str().unwrap_or_default().to_string()))
    });
    started.expect("test gateway")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

#[test]
fn any_event_body_is_accepted_or_refused_cleanly() {
    let rt = runtime();
    let (gw, _) = node(&rt, json!({"url": "http://127.0.0.1:9/h", "rate_per_sec": 0.01, "burst": 1}));
    let api = &gw.api;
    let single = event().prop_map(|e| ("/v1/tenants/acme/events", e));
    let batch =
        prop::collection::vec(event(), 0..3).prop_map(|es| ("/v1/tenants/acme/events/batch", json!({"events": es})));
    let strategy = prop_oneof![3 => single, 1 => batch];
    runner()
        .run(&strategy, |(path, body)| {
            rt.block_on(async {
                let before = count(api, "/v1/tenants/acme/deliveries?limit=1000").await.map_err(fail)?;
                let text = body.to_string();
                let r = api.raw("POST", path, Some(ADMIN_TOKEN), text.clone()).await.map_err(fail)?;
                if !judge(path, &text, &r)? {
                    let after = count(api, "/v1/tenants/acme/deliveries?limit=1000").await.map_err(fail)?;
                    prop_assert_eq!(before, after, "a refused event wrote deliveries: {}", text);
                }
                Ok(())
            })
        })
        .unwrap();
}

#[test]
fn any_endpoint_body_is_accepted_or_refused_cleanly() {
    let rt = runtime();
    let (gw, ep) = node(&rt, json!({"url": "http://127.0.0.1:9/h"}));
    let api = &gw.api;
    let one = format!("/v1/tenants/acme/endpoints/{ep}");
    let strategy = (any::<bool>(), endpoint());
    runner()
        .run(&strategy, |(patch, body)| {
            rt.block_on(async {
                let listed = count(api, "/v1/tenants/acme/endpoints").await.map_err(fail)?;
                let stored = api.get(&one, ADMIN_TOKEN).await.map_err(fail)?.json;
                let text = body.to_string();
                let r = if patch {
                    api.raw("PATCH", &one, Some(ADMIN_TOKEN), text.clone()).await
                } else {
                    api.raw("POST", "/v1/tenants/acme/endpoints", Some(ADMIN_TOKEN), text.clone()).await
                }
                .map_err(fail)?;
                if !judge("endpoint", &text, &r)? {
                    prop_assert_eq!(listed, count(api, "/v1/tenants/acme/endpoints").await.map_err(fail)?);
                    let now = api.get(&one, ADMIN_TOKEN).await.map_err(fail)?.json;
                    prop_assert_eq!(stored["updated_at"].clone(), now["updated_at"].clone(), "a refused patch wrote");
                }
                Ok(())
            })
        })
        .unwrap();
}

#[test]
fn any_bytes_are_refused_cleanly() {
    let rt = runtime();
    let (gw, _) = node(&rt, json!({"url": "http://127.0.0.1:9/h"}));
    let api = &gw.api;
    let paths = prop::sample::select(vec![
        "/v1/tenants/acme/events",
        "/v1/tenants/acme/events/batch",
        "/v1/tenants/acme/endpoints",
        "/v1/tenants/acme/tokens",
        "/v1/tenants",
        "/v1/tenants/acme/replays",
    ]);
    runner()
        .run(&(paths, prop::collection::vec(any::<u8>(), 0..64)), |(path, bytes)| {
            rt.block_on(async {
                let r = api.raw("POST", path, Some(ADMIN_TOKEN), bytes.clone()).await.map_err(fail)?;
                judge(path, &String::from_utf8_lossy(&bytes), &r).map(|_| ())
            })
        })
        .unwrap();
}

fn fail(e: anyhow::Error) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}
