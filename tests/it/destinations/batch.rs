//! Batching on queue destinations (`batch` on a `redis-stream`, `nats` or `amqp` endpoint):
//! the claimed deliveries go as one pipelined round, each event its own message (its own
//! envelope, signature, `herald-delivery-id` and broker dedupe id), each settled by its own
//! acknowledgement, so one refused message is retried alone; the settings are checked.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Api, Backend, TestGateway, backends, done_or, eventually};

use super::{
    SHARED_AMQP, SHARED_NATS, SHARED_REDIS, amqp_header, amqp_queue, broker_endpoint, nats_stream, post_events,
    redis_conn, redis_entries, unique,
};

backends!(
    redis_batch_is_one_round_of_separate_signed_messages,
    nats_batch_is_one_round_of_separate_signed_messages,
    amqp_batch_is_one_round_of_separate_signed_messages,
    redis_batch_retries_a_refused_entry_alone,
    redis_batches_keep_each_key_in_order,
    nats_batch_retries_a_duplicate_alone,
    nats_batch_of_cloudevents_sends_each_event_as_it_would_alone,
    amqp_batch_retries_a_nacked_message_alone,
    batch_settings_on_queue_destinations_are_checked,
);

const WAIT: Duration = Duration::from_secs(40);

/// A batching endpoint's settings: `n` events a round, waiting up to `wait` for company (a
/// first round goes when full), fast retries; `destination` for its kind.
fn batched(n: usize, wait: &str, destination: Value) -> Value {
    json!({"destination": destination, "batch": {"max_events": n, "max_wait": wait},
           "retry": {"base": "100ms", "factor": 1, "jitter": "none", "max_attempts": 50}})
}

/// A node with a fresh tenant and a batching endpoint of `kind`; the endpoint, paused when
/// `paused` (its deliveries wait until the test has set the broker up).
async fn setup(
    b: Backend,
    kind: &str,
    url: &str,
    extra: Value,
    paused: bool,
) -> anyhow::Result<(TestGateway, String, Value)> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let tenant = unique("qb");
    gw.api.tenant(&tenant).await?;
    let destination = extra["destination"].clone();
    let ep = broker_endpoint(&gw.api, &tenant, kind, url, destination, extra).await?;
    if paused {
        let path = format!("/v1/tenants/{tenant}/endpoints/{}/pause", ep["id"].as_str().context("id")?);
        gw.api.post(&path, ADMIN_TOKEN, json!({})).await?.expect(200)?;
    }
    Ok((gw, tenant, ep))
}

async fn enable(api: &Api, tenant: &str, ep: &Value) -> anyhow::Result<()> {
    let path = format!("/v1/tenants/{tenant}/endpoints/{}/enable", ep["id"].as_str().context("id")?);
    api.post(&path, ADMIN_TOKEN, json!({})).await?.expect(200).map(drop)
}

/// One message as its consumer read it: its headers, its body, and the broker's dedupe id
/// (JetStream's `Nats-Msg-Id`, AMQP's `message-id`; Redis has none).
struct Got {
    headers: HashMap<String, String>,
    body: Vec<u8>,
    dedupe: Option<String>,
}

/// Every one of `ids` arrived once, as a message of its own: its own envelope, a signature
/// that verifies with the endpoint's secret, its own delivery id and dedupe id.
fn each_its_own_message(ep: &Value, got: &[Got], ids: &[String], dedupes: bool) -> anyhow::Result<()> {
    let secret = gateway::sign::Secret::parse(ep["secret"].as_str().context("secret")?).map_err(anyhow::Error::msg)?;
    let mut seen = HashSet::new();
    let (mut deliveries, mut dedupe) = (HashSet::new(), HashSet::new());
    for m in got {
        let h = |name: &str| m.headers.get(name).cloned().with_context(|| format!("{name} in {:?}", m.headers));
        let id = h("webhook-id")?;
        ensure!(seen.insert(id.clone()), "{id} arrived twice");
        let body: Value = serde_json::from_slice(&m.body)?;
        ensure!(body["id"] == id.as_str() && body["type"] == "order.paid", "its own envelope: {body}");
        let ts: i64 = h("webhook-timestamp")?.parse()?;
        ensure!(gateway::sign::verify(&secret, &id, ts, &m.body, &h("webhook-signature")?), "{id}: signature");
        ensure!(h("herald-batch-size").is_err(), "no batch header on a message: {:?}", m.headers);
        deliveries.insert(h("herald-delivery-id")?);
        if dedupes {
            dedupe.insert(m.dedupe.clone().context("a dedupe id")?);
        }
    }
    let mut want: Vec<_> = ids.to_vec();
    let mut seen: Vec<_> = seen.into_iter().collect();
    want.sort();
    seen.sort();
    ensure!(seen == want, "every event once: {seen:?}");
    ensure!(deliveries.len() == ids.len(), "distinct delivery ids: {deliveries:?}");
    ensure!(!dedupes || dedupe == deliveries, "the dedupe ids are the delivery ids: {dedupe:?}");
    Ok(())
}

/// Each of `ids`' delivery, once every one is `delivered`: its attempts.
async fn attempts_when_delivered(api: &Api, tenant: &str, ids: &[String]) -> anyhow::Result<Vec<Vec<Value>>> {
    let mut all = Vec::new();
    for id in ids {
        let list = api
            .wait_for(&format!("/v1/tenants/{tenant}/events/{id}/deliveries"), WAIT, |v| {
                v["data"][0]["state"] == "delivered"
            })
            .await?;
        let delivery = list["data"][0]["id"].as_str().context("delivery id")?;
        let d = api.get(&format!("/v1/tenants/{tenant}/deliveries/{delivery}"), ADMIN_TOKEN).await?.expect(200)?;
        all.push(d.json["attempt_history"].as_array().context("attempts")?.clone());
    }
    Ok(all)
}

/// The node's `herald_attempts_total`: requests made, one per round.
async fn requests_made(api: &Api) -> anyhow::Result<u64> {
    let text = api.raw("GET", "/metrics", None, "").await?.text;
    let line = text.lines().find(|l| l.starts_with("herald_attempts_total ")).context("herald_attempts_total")?;
    Ok(line.rsplit(' ').next().context("a value")?.parse()?)
}

/// One round carried every delivery: each has one attempt, all with the round's start and
/// duration, and the node made one request.
async fn one_round(api: &Api, tenant: &str, ids: &[String]) -> anyhow::Result<()> {
    let attempts = attempts_when_delivered(api, tenant, ids).await?;
    ensure!(attempts.iter().all(|a| a.len() == 1 && a[0]["status"] == 200), "one attempt each: {attempts:?}");
    let shared = |f: &str| attempts.iter().map(|a| a[0][f].to_string()).collect::<HashSet<_>>().len() == 1;
    ensure!(shared("started_at") && shared("duration_ms"), "one round's start and duration: {attempts:?}");
    ensure!(requests_made(api).await? == 1, "one request for the round");
    Ok(())
}

/// Of the deliveries of `ids` (all delivered), all but one went in the first round alone;
/// the one that failed there was retried alone (its later attempts start after the round,
/// each a request of its own) until delivered. Returns its event id.
async fn one_retried_alone(api: &Api, tenant: &str, ids: &[String]) -> anyhow::Result<String> {
    let attempts = attempts_when_delivered(api, tenant, ids).await?;
    let round = attempts[0][0]["started_at"].clone();
    ensure!(attempts.iter().all(|a| a[0]["started_at"] == round), "one first round: {attempts:?}");
    let retried: Vec<_> = ids.iter().zip(&attempts).filter(|(_, a)| a.len() > 1).collect();
    ensure!(retried.len() == 1, "exactly one retried: {attempts:?}");
    let (id, tries) = retried[0];
    ensure!(tries[0]["verdict"] != "delivered" && tries.last().context("last")?["verdict"] == "delivered", "{tries:?}");
    let later: HashSet<_> = tries[1..].iter().map(|a| a["started_at"].to_string()).collect();
    ensure!(later.len() == tries.len() - 1 && !later.contains(&round.to_string()), "each retry its own: {tries:?}");
    let requests = requests_made(api).await?;
    ensure!(requests == tries.len() as u64, "the round and one request per retry: {requests}, {tries:?}");
    Ok(id.clone())
}

// --- Redis Streams ---

async fn redis_got(stream: &str, n: usize) -> anyhow::Result<Vec<Got>> {
    let mut conn = redis_conn(SHARED_REDIS).await?;
    let entries = eventually(&format!("{n} entries"), WAIT, || {
        let mut conn = conn.clone();
        async move {
            let entries = redis_entries(&mut conn, stream).await?;
            Ok(if entries.len() >= n { Ok(entries) } else { Err(format!("{}", entries.len())) })
        }
    })
    .await?;
    let _: () = redis::cmd("DEL").arg(stream).query_async(&mut conn).await?;
    let got = entries.iter().map(|e| {
        let fields = e.map.keys().filter(|k| *k != "body");
        let headers = fields.filter_map(|k| e.get::<String>(k).map(|v| (k.clone(), v))).collect();
        Got { headers, body: e.get::<Vec<u8>>("body").unwrap_or_default(), dedupe: None }
    });
    Ok(got.collect())
}

async fn redis_batch_is_one_round_of_separate_signed_messages(b: Backend) -> anyhow::Result<()> {
    let stream = unique("herald:qbatch:");
    let (gw, tenant, ep) =
        setup(b, "redis-stream", SHARED_REDIS, batched(10, "30s", json!({"stream": stream})), false).await?;
    let ids = post_events(&gw.api, &tenant, 10).await?;
    one_round(&gw.api, &tenant, &ids).await?;
    each_its_own_message(&ep, &redis_got(&stream, 10).await?, &ids, false)
}

/// A stream key that holds a string refuses its `XADD` (`WRONGTYPE`, the endpoint paused as
/// for a missing stream) while the others of the pipeline go in; once the key is a stream's
/// again and the endpoint enabled, that one delivery goes alone.
async fn redis_batch_retries_a_refused_entry_alone(b: Backend) -> anyhow::Result<()> {
    let prefix = unique("herald:qbatch:");
    let extra = batched(3, "1s", json!({"stream": format!("{prefix}:{{type}}")}));
    let (gw, tenant, ep) = setup(b, "redis-stream", SHARED_REDIS, extra, true).await?;
    let mut conn = redis_conn(SHARED_REDIS).await?;
    let (good, bad) = (format!("{prefix}:order.paid"), format!("{prefix}:order.refused"));
    let _: () = redis::cmd("SET").arg(&bad).arg("not a stream").query_async(&mut conn).await?;
    let events = json!({"events": [
        {"id": "evt_0", "type": "order.paid", "payload": {}},
        {"id": "evt_1", "type": "order.refused", "payload": {}},
        {"id": "evt_2", "type": "order.paid", "payload": {}},
    ]});
    gw.api.post(&format!("/v1/tenants/{tenant}/events/batch"), ADMIN_TOKEN, events).await?.expect(202)?;
    enable(&gw.api, &tenant, &ep).await?;
    let path = format!("/v1/tenants/{tenant}/endpoints/{}", ep["id"].as_str().context("id")?);
    let paused = gw.api.wait_for(&path, WAIT, |v| v["state"] == "paused").await?;
    ensure!(paused["state_reason"].as_str().is_some_and(|r| r.contains("WRONGTYPE")), "{paused}");
    let _: () = redis::cmd("DEL").arg(&bad).query_async(&mut conn).await?;
    enable(&gw.api, &tenant, &ep).await?;
    let ids: Vec<String> = (0..3).map(|i| format!("evt_{i}")).collect();
    let retried = one_retried_alone(&gw.api, &tenant, &ids).await?;
    ensure!(retried == "evt_1", "the refused one: {retried}");
    let n: usize = redis::cmd("XLEN").arg(&good).query_async(&mut conn).await?;
    let m: usize = redis::cmd("XLEN").arg(&bad).query_async(&mut conn).await?;
    ensure!((n, m) == (2, 1), "each once: {n} and {m}");
    let _: () = redis::cmd("DEL").arg(&good).arg(&bad).query_async(&mut conn).await?;
    Ok(())
}

/// An ordered endpoint's rounds hold only the heads of their keys: four events on each of
/// three keys take at least four rounds, and each key's entries are in intake order.
async fn redis_batches_keep_each_key_in_order(b: Backend) -> anyhow::Result<()> {
    let stream = unique("herald:qborder:");
    let mut extra = batched(10, "100ms", json!({"stream": stream}));
    extra["ordering"] = json!("key");
    let (gw, tenant, ep) = setup(b, "redis-stream", SHARED_REDIS, extra, true).await?;
    let events: Vec<Value> = (0..4)
        .flat_map(|n| (0..3).map(move |k| json!({"id": format!("evt_k{k}_{n}"), "type": "order.paid", "ordering_key": format!("k{k}"), "payload": {}})))
        .collect();
    gw.api
        .post(&format!("/v1/tenants/{tenant}/events/batch"), ADMIN_TOKEN, json!({"events": events}))
        .await?
        .expect(202)?;
    enable(&gw.api, &tenant, &ep).await?;
    let got = redis_got(&stream, 12).await?;
    let order: Vec<String> = got.iter().filter_map(|m| m.headers.get("webhook-id").cloned()).collect();
    ensure!(order.len() == 12, "each once: {order:?}");
    for k in 0..3 {
        let of_key: Vec<_> = order.iter().filter(|i| i.starts_with(&format!("evt_k{k}_"))).cloned().collect();
        let want: Vec<_> = (0..4).map(|n| format!("evt_k{k}_{n}")).collect();
        ensure!(of_key == want, "key k{k} in intake order: {of_key:?}");
    }
    let requests = requests_made(&gw.api).await?;
    ensure!((4..12).contains(&requests), "rounds of at most one event per key, several keys each: {requests}");
    Ok(())
}

// --- NATS JetStream ---

async fn nats_got(stream: &mut async_nats::jetstream::stream::Stream, n: usize) -> anyhow::Result<Vec<Got>> {
    eventually(&format!("{n} messages"), WAIT, || {
        let mut s = stream.clone();
        async move {
            let got = s.info().await?.state.messages as usize;
            done_or(got >= n, got)
        }
    })
    .await?;
    let mut got = Vec::new();
    for seq in 1..=stream.info().await?.state.last_sequence {
        let m = stream.get_raw_message(seq).await?;
        let headers: HashMap<String, String> = m
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.first().map(|v| v.to_string()).unwrap_or_default()))
            .collect();
        let dedupe = headers.get("Nats-Msg-Id").cloned();
        got.push(Got { headers, body: m.payload.to_vec(), dedupe });
    }
    Ok(got)
}

async fn nats_batch_is_one_round_of_separate_signed_messages(b: Backend) -> anyhow::Result<()> {
    let name = unique("HERALD_QB_");
    let mut stream = nats_stream(SHARED_NATS, &name, &format!("{name}.>")).await?;
    let extra = batched(10, "30s", json!({"subject": format!("{name}.{{type}}")}));
    let (gw, tenant, ep) = setup(b, "nats", SHARED_NATS, extra, false).await?;
    let ids = post_events(&gw.api, &tenant, 10).await?;
    one_round(&gw.api, &tenant, &ids).await?;
    let got = nats_got(&mut stream, 10).await?;
    each_its_own_message(&ep, &got, &ids, true)?;
    async_nats::jetstream::new(async_nats::connect(SHARED_NATS).await?).delete_stream(&name).await?;
    Ok(())
}

/// A message of someone else's already holds one delivery's `Nats-Msg-Id`: JetStream calls
/// that one a duplicate on its first attempt (not counted, retried), the rest of the round
/// is delivered; the retry goes alone.
async fn nats_batch_retries_a_duplicate_alone(b: Backend) -> anyhow::Result<()> {
    let name = unique("HERALD_QBD_");
    nats_stream(SHARED_NATS, &name, &format!("{name}.>")).await?;
    let extra = batched(3, "1s", json!({"subject": format!("{name}.{{type}}")}));
    let (gw, tenant, ep) = setup(b, "nats", SHARED_NATS, extra, true).await?;
    let ids = post_events(&gw.api, &tenant, 3).await?;
    let list = gw
        .api
        .wait_for(&format!("/v1/tenants/{tenant}/events/evt_1/deliveries"), WAIT, |v| v["data"][0]["id"].is_string())
        .await?;
    let delivery = list["data"][0]["id"].as_str().context("delivery id")?;
    let js = async_nats::jetstream::new(async_nats::connect(SHARED_NATS).await?);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", delivery);
    js.publish_with_headers(format!("{name}.other"), headers, "not herald's".into()).await?.await?;
    enable(&gw.api, &tenant, &ep).await?;
    let retried = one_retried_alone(&gw.api, &tenant, &ids).await?;
    ensure!(retried == "evt_1", "the duplicate: {retried}");
    js.delete_stream(&name).await?;
    Ok(())
}

/// With `cloudevents` (binary), a round's messages are each one CloudEvent, as alone: the
/// event's `ce-id`, its payload as the body, its own signature and `Nats-Msg-Id`.
async fn nats_batch_of_cloudevents_sends_each_event_as_it_would_alone(b: Backend) -> anyhow::Result<()> {
    let name = unique("HERALD_QBCE_");
    let mut stream = nats_stream(SHARED_NATS, &name, &format!("{name}.>")).await?;
    let mut extra = batched(3, "30s", json!({"subject": format!("{name}.{{type}}")}));
    extra["cloudevents"] = json!({"mode": "binary"});
    let (gw, tenant, ep) = setup(b, "nats", SHARED_NATS, extra, false).await?;
    let ids = post_events(&gw.api, &tenant, 3).await?;
    one_round(&gw.api, &tenant, &ids).await?;
    let got = nats_got(&mut stream, 3).await?;
    let secret = gateway::sign::Secret::parse(ep["secret"].as_str().context("secret")?).map_err(anyhow::Error::msg)?;
    let mut dedupe = HashSet::new();
    for m in &got {
        let id = m.headers.get("webhook-id").context("webhook-id")?;
        ensure!(m.headers.get("ce-id") == Some(id), "its own CloudEvent: {:?}", m.headers);
        ensure!(serde_json::from_slice::<Value>(&m.body)? == json!({"id": id}), "its payload as the body");
        let ts: i64 = m.headers.get("webhook-timestamp").context("timestamp")?.parse()?;
        let sig = m.headers.get("webhook-signature").context("signature")?;
        ensure!(gateway::sign::verify(&secret, id, ts, &m.body, sig), "{id}: signature over the bytes sent");
        dedupe.insert(m.dedupe.clone().context("Nats-Msg-Id")?);
    }
    ensure!(got.len() == 3 && dedupe.len() == 3, "three messages, three ids: {dedupe:?}");
    async_nats::jetstream::new(async_nats::connect(SHARED_NATS).await?).delete_stream(&name).await?;
    Ok(())
}

// --- AMQP ---

/// Takes every message of `queue` now in it.
async fn amqp_got(ch: &lapin::Channel, queue: &str, n: usize) -> anyhow::Result<Vec<Got>> {
    use lapin::options::BasicGetOptions;
    let got = std::sync::Mutex::new(Vec::new());
    eventually(&format!("{n} messages in {queue}"), WAIT, || async {
        while let Some(m) = ch.basic_get(queue.into(), BasicGetOptions { no_ack: true }).await? {
            let d = &m.delivery;
            let names = d.properties.headers().as_ref().map(|h| h.inner().keys().cloned().collect::<Vec<_>>());
            let headers = names
                .unwrap_or_default()
                .into_iter()
                .filter_map(|k| amqp_header(d, k.as_str()).map(|v| (k.to_string(), v)))
                .collect();
            let dedupe = d.properties.message_id().as_ref().map(|s| s.to_string());
            got.lock().unwrap().push(Got { headers, body: d.data.clone(), dedupe });
        }
        let n_got = got.lock().unwrap().len();
        done_or(n_got >= n, n_got)
    })
    .await?;
    Ok(got.into_inner().unwrap())
}

async fn amqp_batch_is_one_round_of_separate_signed_messages(b: Backend) -> anyhow::Result<()> {
    let exchange = unique("herald.qbatch.");
    let ch = amqp_queue(SHARED_AMQP, &exchange, false).await?;
    let extra = batched(10, "30s", json!({"exchange": exchange, "routing_key": "{type}"}));
    let (gw, tenant, ep) = setup(b, "amqp", SHARED_AMQP, extra, false).await?;
    let ids = post_events(&gw.api, &tenant, 10).await?;
    one_round(&gw.api, &tenant, &ids).await?;
    each_its_own_message(&ep, &amqp_got(&ch, &exchange, 10).await?, &ids, true)
}

/// A queue that holds two messages and refuses more (`x-overflow: reject-publish`): the
/// third message of the round is nacked and retried alone, the two before it confirmed;
/// once the queue is read, the retry is confirmed.
async fn amqp_batch_retries_a_nacked_message_alone(b: Backend) -> anyhow::Result<()> {
    use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::{AMQPValue, FieldTable, ShortString};
    let exchange = unique("herald.qbnack.");
    let conn = lapin::Connection::connect(SHARED_AMQP, lapin::ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    let auto = ExchangeDeclareOptions { auto_delete: true, ..Default::default() };
    ch.exchange_declare(exchange.as_str().into(), lapin::ExchangeKind::Topic, auto, FieldTable::default()).await?;
    let mut args = FieldTable::default();
    args.insert(ShortString::from("x-max-length"), AMQPValue::LongInt(2));
    args.insert(ShortString::from("x-overflow"), AMQPValue::LongString("reject-publish".into()));
    let q = QueueDeclareOptions { auto_delete: true, ..Default::default() };
    ch.queue_declare(exchange.as_str().into(), q, args).await?;
    let bind = QueueBindOptions::default();
    ch.queue_bind(exchange.as_str().into(), exchange.as_str().into(), "#".into(), bind, FieldTable::default()).await?;
    let extra = batched(3, "1s", json!({"exchange": exchange, "routing_key": "{type}"}));
    let (gw, tenant, ep) = setup(b, "amqp", SHARED_AMQP, extra, true).await?;
    let ids = post_events(&gw.api, &tenant, 3).await?;
    enable(&gw.api, &tenant, &ep).await?;
    // The round met the full queue: one delivery waits for its retry.
    let waiting = format!("/v1/tenants/{tenant}/deliveries?state=waiting");
    gw.api.wait_for(&waiting, WAIT, |v| v["data"].as_array().is_some_and(|d| !d.is_empty())).await?;
    let first_two = amqp_got(&ch, &exchange, 2).await?;
    let retried = one_retried_alone(&gw.api, &tenant, &ids).await?;
    let got = amqp_got(&ch, &exchange, 1).await?;
    let arrived: Vec<_> = first_two.iter().chain(&got).filter_map(|m| m.headers.get("webhook-id").cloned()).collect();
    ensure!(arrived.len() == 3 && arrived[2] == retried, "the nacked one came last, alone: {arrived:?}");
    Ok(())
}

// --- Settings ---

/// `batch` goes with the broker kinds (with `cloudevents` too: each message is encoded as
/// it would be alone), not with `poll` or `listen`; bad bounds on a broker endpoint name
/// their field, and a refusal writes nothing.
async fn batch_settings_on_queue_destinations_are_checked(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    gw.api.tenant("acme").await?;
    let endpoints = "/v1/tenants/acme/endpoints";
    let ce = json!({"kind": "nats", "url": SHARED_NATS, "destination": {"subject": "s"},
                    "batch": {"max_events": 50}, "cloudevents": {"mode": "binary"}});
    let ep = gw.api.post(endpoints, ADMIN_TOKEN, ce).await?.expect(201)?.json;
    ensure!(ep["batch"]["max_events"] == 50 && ep["cloudevents"]["mode"] == "binary", "{ep}");
    let path = format!("{endpoints}/{}", ep["id"].as_str().context("id")?);
    for (patch, field) in [
        (json!({"batch": {"max_events": 0}}), "batch.max_events"),
        (json!({"batch": {"max_bytes": 0}}), "batch.max_bytes"),
        (json!({"batch": {"max_wait": "301s"}}), "batch.max_wait"),
        (json!({"batch": {"size": 3}}), "size"),
    ] {
        let r = gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(patch.clone())).await?;
        ensure!((r.status == 422 || r.status == 400) && r.text.contains(field), "{patch}: {} {}", r.status, r.text);
    }
    for (body, kind) in [
        (json!({"kind": "poll", "batch": {}}), "poll"),
        (json!({"kind": "listen", "url": "listen://dev", "batch": {}}), "listen"),
    ] {
        let r = gw.api.post(endpoints, ADMIN_TOKEN, body.clone()).await?;
        ensure!(r.status == 422, "{body}: {} {}", r.status, r.text);
        ensure!(
            r.json["error"]["message"].as_str().is_some_and(|m| m.contains("batch") && m.contains(kind)),
            "{}",
            r.text
        );
    }
    let now = gw.api.get(&path, ADMIN_TOKEN).await?.expect(200)?.json;
    ensure!(now["batch"]["max_events"] == 50, "nothing written: {now}");
    let list = gw.api.get(endpoints, ADMIN_TOKEN).await?.expect(200)?.json;
    ensure!(list["data"].as_array().map(Vec::len) == Some(1), "no endpoint created: {list}");
    Ok(())
}
