//! CloudEvents 1.0 output per endpoint: what arrives in binary and structured mode over HTTP
//! is read by the official Python SDK (`cloudevents.http.from_http`, in
//! `tests/contract/parse_cloudevents.py`) with `id`, `type`, `source`, `time` and the
//! catalog's `dataschema`, and its Standard Webhooks signature verifies over the bytes sent;
//! NATS, RabbitMQ and Redis messages carry their binding's attributes; bad settings are
//! refused naming the field, nothing written.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Api, Backend, FakeReceiver, Received, TestGateway, eventually};

tests::backends!(http_modes_parse_with_the_sdk_and_verify_over_the_bytes_sent, bad_settings_are_refused_by_name);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// One message as it arrived, for the SDK: its name, headers, body and the `whsec_` that
/// signs it.
struct Arrived {
    name: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    whsec: Option<String>,
}

impl Arrived {
    fn http(name: &str, r: &Received, whsec: Option<&str>) -> Arrived {
        let headers = r
            .headers
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        Arrived { name: name.into(), headers, body: r.body.to_vec(), whsec: whsec.map(String::from) }
    }
}

/// Runs the SDK over `messages`; returns, by name, the attributes and data it read and
/// whether the signature verified.
async fn parse_in_python(dir: &Path, messages: &[Arrived]) -> anyhow::Result<Value> {
    let python = repo().join("target/pytools/venv/bin/python");
    ensure!(python.exists(), "{} is missing: run scripts/pytools (scripts/test does)", python.display());
    let messages: Vec<Value> = messages
        .iter()
        .map(|m| {
            let headers: serde_json::Map<String, Value> =
                m.headers.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
            json!({"name": m.name, "headers": headers, "body": STANDARD.encode(&m.body), "whsec": m.whsec})
        })
        .collect();
    let file = dir.join("cloudevents.json");
    std::fs::write(&file, Value::from(messages).to_string())?;
    let script = repo().join("tests/contract/parse_cloudevents.py");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(&python).arg(&script).arg(&file).kill_on_drop(true).output(),
    )
    .await
    .context("the SDK ran over a minute")??;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "the SDK refused a message:\n{text}");
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The one request of `event` at the receiver path ending in `path`.
fn at<'a>(got: &'a [Received], path: &str, event: &str) -> anyhow::Result<&'a Received> {
    got.iter()
        .find(|r| r.path.ends_with(path) && r.header("webhook-id") == Some(event))
        .with_context(|| format!("{event} at {path}"))
}

/// The schema of `invoice.paid` in acme's catalog, with the `$id` a `dataschema` names.
const SCHEMA_ID: &str = "https://schemas.acme.example/invoice.paid.json";

async fn catalog_type(api: &Api) -> anyhow::Result<()> {
    let schema = json!({"$id": SCHEMA_ID, "type": "object", "properties": {"amount": {"type": "integer"}}});
    api.post("/v1/tenants/acme/event-types", ADMIN_TOKEN, json!({"name": "invoice.paid", "schema": schema}))
        .await?
        .expect(201)?;
    Ok(())
}

async fn http_modes_parse_with_the_sdk_and_verify_over_the_bytes_sent(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    catalog_type(api).await?;
    let rx = FakeReceiver::start().await?;
    let binary =
        api.endpoint("acme", json!({"url": format!("{}/binary", rx.url()), "cloudevents": {"mode": "binary"}})).await?;
    ensure!(binary["cloudevents"] == json!({"mode": "binary"}), "the view shows the setting: {binary}");
    let structured = json!({"mode": "structured", "source": "https://acme.example/{tenant}/hooks"});
    let s = api.endpoint("acme", json!({"url": format!("{}/structured", rx.url()), "cloudevents": structured})).await?;
    api.endpoint("acme", json!({"url": format!("{}/plain", rx.url())})).await?;
    for (id, ty) in [("evt_known", "invoice.paid"), ("evt_other", "note.added")] {
        api.event("acme", json!({"id": id, "type": ty, "payload": {"amount": 7, "note": "a \"quoted\" é"}}))
            .await?
            .expect(202)?;
    }
    let got = rx.wait_for(6, Duration::from_secs(20)).await?;
    // The plain endpoint still gets Standard Webhooks' envelope.
    ensure!(at(&got, "/plain", "evt_known")?.json()["data"]["amount"] == 7, "the envelope is unchanged");
    ensure!(at(&got, "/plain", "evt_known")?.header("ce-id").is_none(), "no CloudEvents on a plain endpoint");
    let secret = |e: &Value| e["secret"].as_str().map(String::from);
    let mut messages = Vec::new();
    for event in ["evt_known", "evt_other"] {
        messages.push(Arrived::http(
            &format!("binary {event}"),
            at(&got, "/binary", event)?,
            secret(&binary).as_deref(),
        ));
        messages.push(Arrived::http(
            &format!("structured {event}"),
            at(&got, "/structured", event)?,
            secret(&s).as_deref(),
        ));
    }
    let known = at(&got, "/binary", "evt_known")?;
    ensure!(known.header("content-type") == Some("application/json"), "{:?}", known.headers);
    ensure!(known.json() == json!({"amount": 7, "note": "a \"quoted\" é"}), "binary: the data is the body");
    let whole = at(&got, "/structured", "evt_known")?;
    ensure!(whole.header("content-type") == Some("application/cloudevents+json"), "{:?}", whole.headers);
    let parsed = parse_in_python(gw.dir.path(), &messages).await?;
    for (name, source) in [("binary", "/herald/tenants/acme"), ("structured", "https://acme.example/acme/hooks")] {
        for (event, ty, schema) in [("evt_known", "invoice.paid", Some(SCHEMA_ID)), ("evt_other", "note.added", None)] {
            let p = &parsed[format!("{name} {event}")];
            let a = &p["attributes"];
            ensure!(a["specversion"] == "1.0" && a["id"] == event && a["type"] == ty, "{name} {event}: {p}");
            ensure!(a["source"] == source && a["datacontenttype"] == "application/json", "{name} {event}: {p}");
            ensure!(a["time"].as_str().is_some_and(|t| t.starts_with("20")), "{name} {event}: {p}");
            ensure!(a.get("dataschema").and_then(Value::as_str) == schema, "{name} {event}: dataschema: {p}");
            ensure!(p["data"] == json!({"amount": 7, "note": "a \"quoted\" é"}), "{name} {event}: {p}");
            ensure!(p["verified"] == true, "{name} {event}: the signature covers the bytes sent: {p}");
        }
    }
    Ok(())
}

async fn bad_settings_are_refused_by_name(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let url = "http://127.0.0.1:9/hook";
    let cases = [
        (json!({"mode": "batch"}), "cloudevents.mode"),
        (json!({"source": "/s"}), "cloudevents"),
        (json!({"mode": "binary", "source": "a b"}), "cloudevents.source"),
        (json!({"mode": "binary", "source": "/t/{type}"}), "cloudevents.source"),
        (json!({"mode": "binary", "extra": 1}), "cloudevents"),
        (json!("binary"), "cloudevents"),
    ];
    for (setting, field) in &cases {
        let r =
            api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, json!({"url": url, "cloudevents": setting})).await?;
        // A body of the wrong shape is the API's 400 (`invalid_request`), a value that fails
        // its check a 422; either names the field.
        ensure!(matches!(r.status, 400 | 422), "{setting}: {} {}", r.status, r.text);
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        ensure!(message.starts_with(field), "{setting}: names {field}: {message}");
    }
    let listed = api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.expect(200)?;
    ensure!(listed.json["data"].as_array().is_some_and(Vec::is_empty), "nothing written: {}", listed.text);
    // A patch refused leaves the stored setting; `null` removes it.
    let e = api.endpoint("acme", json!({"url": url, "cloudevents": {"mode": "structured"}})).await?;
    let path = format!("/v1/tenants/acme/endpoints/{}", e["id"].as_str().context("id")?);
    let r =
        api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"cloudevents": {"mode": "binary", "source": ""}}))).await?;
    ensure!(r.status == 422 && r.text.contains("cloudevents.source"), "{} {}", r.status, r.text);
    let shown = api.get(&path, ADMIN_TOKEN).await?.expect(200)?;
    ensure!(shown.json["cloudevents"] == json!({"mode": "structured"}), "{}", shown.text);
    api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"cloudevents": null}))).await?.expect(200)?;
    let shown = api.get(&path, ADMIN_TOKEN).await?.expect(200)?;
    ensure!(shown.json["cloudevents"].is_null(), "{}", shown.text);
    Ok(())
}

const SHARED_REDIS: &str = "redis://127.0.0.1:6379";
const SHARED_NATS: &str = "nats://127.0.0.1:4222";
const SHARED_AMQP: &str = "amqp://127.0.0.1:5672/%2f";

/// A name no earlier run used (the shared brokers keep what tests leave).
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}{}x{}", std::process::id(), nanos % 1_000_000_000_000)
}

/// A broker endpoint of `kind` at `url` with CloudEvents in `mode`.
async fn broker(api: &Api, kind: &str, url: &str, destination: Value, mode: &str) -> anyhow::Result<Value> {
    let body = json!({"kind": kind, "url": url, "destination": destination, "cloudevents": {"mode": mode}});
    api.endpoint("acme", body).await
}

/// NATS (binary: `ce-*` headers, the NATS binding's) and Redis (binary: `ce-*` fields) are
/// read by the SDK as they are; RabbitMQ's binary message carries the AMQP binding's
/// `cloudEvents:*` properties and the data's content type, its structured one the event as
/// `application/cloudevents+json`. The signature verifies over each body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_carry_their_bindings_attributes() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let subject = unique("herald.ce.");
    let js = async_nats::jetstream::new(async_nats::connect(SHARED_NATS).await?);
    let config = async_nats::jetstream::stream::Config {
        name: subject.replace('.', "_"),
        subjects: vec![subject.clone()],
        ..Default::default()
    };
    let stream = js.get_or_create_stream(config).await?;
    let nats = broker(api, "nats", SHARED_NATS, json!({"subject": subject}), "binary").await?;
    let key = unique("herald:ce:");
    let redis = broker(api, "redis-stream", SHARED_REDIS, json!({"stream": key}), "binary").await?;
    let exchange = unique("herald.ce.");
    let ch = amqp_queue(&exchange).await?;
    for (mode, rk) in [("binary", "b"), ("structured", "s")] {
        broker(api, "amqp", SHARED_AMQP, json!({"exchange": exchange, "routing_key": rk}), mode).await?;
    }
    api.event("acme", json!({"id": "evt_b", "type": "order.paid", "payload": {"n": 1}})).await?.expect(202)?;
    let mut messages = Vec::new();
    // NATS: the message's headers.
    let m = eventually("the NATS message", Duration::from_secs(20), || {
        let mut s = stream.clone();
        async move {
            let n = s.info().await?.state.messages;
            if n == 0 {
                return Ok(Err("none yet".to_string()));
            }
            Ok(Ok(s.get_raw_message(1).await?))
        }
    })
    .await?;
    let headers = m.headers.iter().flat_map(|(k, vs)| vs.iter().map(move |v| (k.to_string(), v.to_string())));
    let whsec = |e: &Value| e["secret"].as_str().map(String::from);
    messages.push(Arrived {
        name: "nats".into(),
        headers: headers.collect(),
        body: m.payload.to_vec(),
        whsec: whsec(&nats),
    });
    stream.purge().await?;
    // Redis: the entry's fields, its body in `body`.
    let mut conn = redis::Client::open(SHARED_REDIS)?.get_multiplexed_async_connection().await?;
    let entry = eventually("the Redis entry", Duration::from_secs(20), || {
        let mut conn = conn.clone();
        let key = key.clone();
        async move {
            let reply: redis::streams::StreamRangeReply =
                redis::cmd("XRANGE").arg(&key).arg("-").arg("+").query_async(&mut conn).await?;
            Ok(reply.ids.into_iter().next().ok_or_else(|| "none yet".to_string()))
        }
    })
    .await?;
    let body: Vec<u8> = entry.get("body").context("the entry's body")?;
    let mut fields = Vec::new();
    for k in entry.map.keys().filter(|k| k.as_str() != "body") {
        fields.push((k.clone(), entry.get::<String>(k).context("a text field")?));
    }
    let _: () = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
    messages.push(Arrived { name: "redis".into(), headers: fields, body, whsec: whsec(&redis) });
    let parsed = parse_in_python(gw.dir.path(), &messages).await?;
    for name in ["nats", "redis"] {
        let p = &parsed[name];
        let a = &p["attributes"];
        ensure!(a["id"] == "evt_b" && a["type"] == "order.paid" && a["specversion"] == "1.0", "{name}: {p}");
        ensure!(a["source"] == "/herald/tenants/acme" && p["data"] == json!({"n": 1}), "{name}: {p}");
        ensure!(p["verified"] == true, "{name}: {p}");
    }
    amqp_messages_carry_the_binding(&ch, &exchange).await
}

/// RabbitMQ: the binary message's `cloudEvents:*` properties and content type, the
/// structured one's event.
async fn amqp_messages_carry_the_binding(ch: &lapin::Channel, queue: &str) -> anyhow::Result<()> {
    use lapin::options::BasicGetOptions;
    let seen = std::sync::Mutex::new(Vec::new());
    eventually("two RabbitMQ messages", Duration::from_secs(20), || async {
        while let Some(m) = ch.basic_get(queue.into(), BasicGetOptions { no_ack: true }).await? {
            seen.lock().unwrap().push(m.delivery);
        }
        let n = seen.lock().unwrap().len();
        tests::done_or(n >= 2, n)
    })
    .await?;
    let got = seen.into_inner().unwrap();
    let content_type = |m: &lapin::message::Delivery| m.properties.content_type().as_ref().map(|c| c.to_string());
    let header = |m: &lapin::message::Delivery, name: &str| match m.properties.headers().as_ref()?.inner().get(name)? {
        lapin::types::AMQPValue::LongString(v) => Some(String::from_utf8_lossy(v.as_bytes()).into_owned()),
        _ => None,
    };
    let binary = got.iter().find(|m| m.routing_key.as_str() == "b").context("the binary message")?;
    ensure!(header(binary, "cloudEvents:id").as_deref() == Some("evt_b"), "{:?}", binary.properties);
    ensure!(header(binary, "cloudEvents:specversion").as_deref() == Some("1.0"), "{:?}", binary.properties);
    ensure!(header(binary, "cloudEvents:type").as_deref() == Some("order.paid"), "{:?}", binary.properties);
    ensure!(header(binary, "cloudEvents:source").as_deref() == Some("/herald/tenants/acme"), "{:?}", binary.properties);
    ensure!(header(binary, "ce-id").is_none(), "the AMQP binding's names only: {:?}", binary.properties);
    ensure!(content_type(binary).as_deref() == Some("application/json"), "{:?}", binary.properties);
    ensure!(serde_json::from_slice::<Value>(&binary.data)? == json!({"n": 1}), "binary: the data is the body");
    let structured = got.iter().find(|m| m.routing_key.as_str() == "s").context("the structured message")?;
    ensure!(content_type(structured).as_deref() == Some("application/cloudevents+json"), "{:?}", structured.properties);
    let event: Value = serde_json::from_slice(&structured.data)?;
    ensure!(event["id"] == "evt_b" && event["specversion"] == "1.0" && event["data"] == json!({"n": 1}), "{event}");
    Ok(())
}

/// A topic exchange and a queue of the same name bound to all of it, deleted with their
/// last user.
async fn amqp_queue(exchange: &str) -> anyhow::Result<lapin::Channel> {
    use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    let conn = lapin::Connection::connect(SHARED_AMQP, lapin::ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    let x = ExchangeDeclareOptions { auto_delete: true, ..Default::default() };
    ch.exchange_declare(exchange.into(), lapin::ExchangeKind::Topic, x, FieldTable::default()).await?;
    let queue = QueueDeclareOptions { auto_delete: true, ..Default::default() };
    ch.queue_declare(exchange.into(), queue, FieldTable::default()).await?;
    ch.queue_bind(exchange.into(), exchange.into(), "#".into(), QueueBindOptions::default(), FieldTable::default())
        .await?;
    Ok(ch)
}

/// The transform plugin runs before the encoding: it gets the payload (not the envelope) and
/// what it returns is the structured event's `data`; a sign plugin still replaces Herald's
/// signature, and signs the encoded bytes that arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_runs_before_the_encoding_and_a_sign_plugin_signs_what_is_sent() -> anyhow::Result<()> {
    use hmac::Mac;
    let gw = TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    for (name, file) in [("chat", "transform_chat"), ("hexsig", "sign_hmac_hex")] {
        crate::plugins::upload(&gw, "acme", name, crate::plugins::plugin_bytes(file), ADMIN_TOKEN)
            .await?
            .expect(200)?;
    }
    let rx = FakeReceiver::start().await?;
    let e = api
        .endpoint(
            "acme",
            json!({"url": rx.url(), "cloudevents": {"mode": "structured"},
                   "plugins": {"transform": "chat", "sign": "hexsig"}}),
        )
        .await?;
    api.event("acme", json!({"id": "evt_t", "type": "order.paid", "payload": {"n": 1}})).await?.expect(202)?;
    let got = rx.wait_for(1, Duration::from_secs(20)).await?.remove(0);
    ensure!(got.header("content-type") == Some("application/cloudevents+json"), "{:?}", got.headers);
    let event = got.json();
    ensure!(event["id"] == "evt_t" && event["type"] == "order.paid", "{event}");
    // transform-chat reads an envelope's `data`: given the payload, it finds none (null).
    let text = event["data"]["text"].as_str().context("the transform's body is the data")?;
    ensure!(text.contains("evt_t") && text.ends_with("null```"), "the transform got the payload: {text:?}");
    ensure!(got.header("webhook-signature").is_none(), "the sign plugin replaces Herald's signature");
    let signed = got.header("x-herald-signature").context("the sign plugin's header")?;
    let (t, hex_mac) = signed.split_once(",v1=").context("t=…,v1=…")?;
    let whsec = e["secret"].as_str().context("the endpoint's secret")?;
    let key = STANDARD.decode(whsec.trim_start_matches("whsec_"))?;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).map_err(|e| anyhow::anyhow!("the key: {e}"))?;
    mac.update(format!("{}.", t.trim_start_matches("t=")).as_bytes());
    mac.update(&got.body);
    ensure!(hex::encode(mac.finalize().into_bytes()) == hex_mac, "the sign plugin signed the bytes that arrived");
    Ok(())
}
