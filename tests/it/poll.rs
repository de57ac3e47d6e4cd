//! Pull delivery: a `poll` endpoint's consumer pages through its deliveries with a cursor,
//! verifies each item's Standard Webhooks signature as a receiver of a push would (an HMAC
//! written here, and the official library with an independent ed25519 check), and
//! acknowledges pages, which settles them as delivered. A cursor read again gives the same
//! page (across a restart too), one past retention is `410 cursor_expired`, only the `poll`
//! scope reaches the routes, bad input names its field, and the engine never pushes a
//! `poll` endpoint's deliveries.

use std::time::Duration;

use anyhow::{Context, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tests::{ADMIN_TOKEN, Api, Backend, FakeReceiver, TestGateway, done_or, eventually};

use crate::portal::{mint, open};
use crate::signatures::verify_signed;

tests::backends!(
    pages_verify_and_an_acknowledgement_settles_them,
    the_same_cursor_gives_the_same_page,
    a_cursor_past_retention_is_gone,
    only_the_poll_scope_polls,
    bad_input_is_refused_naming_the_field_and_writes_nothing,
    the_engine_never_pushes_a_poll_endpoint,
);

const WAIT: Duration = Duration::from_secs(30);
const T: &str = "/v1/tenants/acme";

/// A tenant `acme` and a `poll` endpoint for `types` signing `v1` and `v1a`: (id, whsec).
async fn poll_endpoint(api: &Api, types: Value) -> anyhow::Result<(String, String)> {
    let body = json!({"kind": "poll", "event_types": types, "signatures": ["v1", "v1a"]});
    let e = api.endpoint("acme", body).await?;
    ensure!(e["kind"] == "poll" && e["url"] == "", "{e}");
    Ok((e["id"].as_str().context("id")?.to_string(), e["secret"].as_str().context("secret")?.to_string()))
}

async fn post_events(api: &Api, prefix: &str, n: usize) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = format!("evt_{prefix}_{i}");
        api.event("acme", json!({"id": id, "type": "order.paid", "payload": {"n": i, "note": "ünïcode"}}))
            .await?
            .expect(202)?;
        ids.push(id);
    }
    Ok(ids)
}

/// One page of `endpoint`'s deliveries (`query`: `limit=…&cursor=…`), as `token`.
async fn page(api: &Api, endpoint: &str, query: &str, token: &str) -> anyhow::Result<Value> {
    Ok(api.get(&format!("{T}/endpoints/{endpoint}/poll?{query}"), token).await?.expect(200)?.json)
}

fn items(page: &Value) -> Vec<Value> {
    page["data"].as_array().cloned().unwrap_or_default()
}

fn ids_of(page: &Value) -> Vec<String> {
    items(page).iter().filter_map(|d| d["id"].as_str().map(String::from)).collect()
}

fn cursor(page: &Value) -> anyhow::Result<String> {
    Ok(page["next_cursor"].as_str().context("next_cursor")?.to_string())
}

async fn ack(api: &Api, endpoint: &str, cursor: &str, token: &str) -> anyhow::Result<u64> {
    let r = api.post(&format!("{T}/endpoints/{endpoint}/poll/ack"), token, json!({"cursor": cursor})).await?;
    r.expect(200)?.json["acknowledged"].as_u64().context("acknowledged")
}

/// Standard Webhooks `v1` as a receiver computes it, with no code of Herald's: the HMAC-SHA256
/// of `id.timestamp.body` under the secret's bytes, in base64.
fn v1_of(whsec: &str, id: &str, timestamp: &str, body: &str) -> anyhow::Result<String> {
    let key = STANDARD.decode(whsec.strip_prefix("whsec_").context("whsec_")?)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key)?;
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    Ok(format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes())))
}

/// Each item's body is the envelope a push sends, and its `webhook-signature` verifies.
fn check_item(item: &Value, whsec: &str, n: usize) -> anyhow::Result<()> {
    let h = &item["headers"];
    let (id, ts, body) = (
        item["id"].as_str().context("id")?,
        h["webhook-timestamp"].as_str().context("webhook-timestamp")?,
        item["body"].as_str().context("body")?,
    );
    ensure!(h["webhook-id"] == id && item["type"] == "order.paid" && h["content-type"] == "application/json", "{item}");
    let envelope: Value = serde_json::from_str(body)?;
    ensure!(envelope["data"] == json!({"n": n, "note": "ünïcode"}) && envelope["id"] == id, "{item}");
    ensure!(envelope["type"] == "order.paid" && envelope["timestamp"] == item["timestamp"], "{item}");
    let signature = h["webhook-signature"].as_str().context("webhook-signature")?;
    let v1 = v1_of(whsec, id, ts, body)?;
    ensure!(signature.split(' ').any(|s| s == v1), "{v1} not in {signature}");
    ensure!(signature.split(' ').filter(|s| s.starts_with("v1a,")).count() == 1, "{signature}");
    Ok(())
}

async fn pages_verify_and_an_acknowledgement_settles_them(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let (ep, whsec) = poll_endpoint(api, json!(["order.*"])).await?;
    let posted = post_events(api, "a", 5).await?;

    // Three pages of 2, 2 and 1, in the order the events were taken.
    let first = page(api, &ep, "limit=2", ADMIN_TOKEN).await?;
    ensure!(ids_of(&first) == posted[..2] && first["more"] == true, "{first}");
    let second = page(api, &ep, &format!("limit=2&cursor={}", cursor(&first)?), ADMIN_TOKEN).await?;
    ensure!(ids_of(&second) == posted[2..4] && second["more"] == true, "{second}");
    let third = page(api, &ep, &format!("limit=2&cursor={}", cursor(&second)?), ADMIN_TOKEN).await?;
    ensure!(ids_of(&third) == posted[4..] && third["more"] == false, "{third}");
    let all: Vec<Value> = [&first, &second, &third].into_iter().flat_map(items).collect();
    for (n, item) in all.iter().enumerate() {
        check_item(item, &whsec, n)?;
    }
    // The official library verifies `v1`, and `v1a` verifies with the tenant's JWKS key.
    let jwks = api.raw("GET", &format!("{T}/jwks.json?endpoint={ep}"), None, "").await?.expect(200)?.json;
    let signed: Vec<Value> = all
        .iter()
        .map(|i| {
            let h = &i["headers"];
            json!({"endpoint": ep, "id": i["id"], "timestamp": h["webhook-timestamp"], "signature": h["webhook-signature"],
                   "body": STANDARD.encode(i["body"].as_str().unwrap_or_default()), "whsec": whsec})
        })
        .collect();
    let verified = verify_signed(gw.dir.path(), &jwks, signed).await?;
    let results = verified["results"].as_array().context("results")?;
    ensure!(results.len() == 5, "{verified}");
    for r in results {
        ensure!(r["standardwebhooks_v1"] == true && r["kids"].as_array().map(Vec::len) == Some(1), "{verified}");
    }

    // Acknowledging the second page's cursor settles both pages; only the last item is left.
    ensure!(ack(api, &ep, &cursor(&second)?, ADMIN_TOKEN).await? == 4);
    let rest = page(api, &ep, "", ADMIN_TOKEN).await?;
    ensure!(ids_of(&rest) == posted[4..] && rest["more"] == false, "{rest}");
    ensure!(ack(api, &ep, &cursor(&third)?, ADMIN_TOKEN).await? == 1);
    let none = page(api, &ep, "", ADMIN_TOKEN).await?;
    ensure!(items(&none).is_empty() && none["more"] == false, "{none}");
    let from_last = page(api, &ep, &format!("cursor={}", cursor(&third)?), ADMIN_TOKEN).await?;
    ensure!(items(&from_last).is_empty() && from_last["next_cursor"] == third["next_cursor"], "{from_last}");
    // Idempotent: again, nothing more.
    ensure!(ack(api, &ep, &cursor(&third)?, ADMIN_TOKEN).await? == 0);

    // Delivered, as a push answered 2xx is: one attempt each, decided by `poll`; counted.
    let list = api.get(&format!("{T}/deliveries?endpoint={ep}&limit=100"), ADMIN_TOKEN).await?.expect(200)?.json;
    let list = list["data"].as_array().context("data")?;
    ensure!(list.len() == 5 && list.iter().all(|d| d["state"] == "delivered" && d["attempts"] == 1), "{list:?}");
    let one = api.get(&format!("{T}/deliveries/{}", list[0]["id"].as_str().unwrap_or("")), ADMIN_TOKEN).await?;
    let history = &one.expect(200)?.json["attempt_history"];
    ensure!(history[0]["verdict"] == "delivered" && history[0]["decided_by"] == "poll", "{history}");
    let metrics = api.raw("GET", "/metrics", None, "").await?.expect(200)?.text;
    let counted = metrics.lines().any(|l| {
        l.starts_with("herald_delivery_outcomes_total{")
            && l.contains("tenant=\"acme\"")
            && l.contains("kind=\"poll\"")
            && l.contains("outcome=\"delivered\"")
            && l.ends_with(" 5")
    });
    ensure!(counted, "{metrics}");
    let e = api.get(&format!("{T}/endpoints/{ep}"), ADMIN_TOKEN).await?.expect(200)?.json;
    ensure!(e["health"]["backlog"] == 0, "{e}");
    Ok(())
}

/// What a page says of its deliveries, the signing time aside.
fn stable(page: &Value) -> Value {
    let of = |i: &Value| json!([i["id"], i["delivery_id"], i["body"]]);
    json!({"data": items(page).iter().map(of).collect::<Vec<_>>(), "next": page["next_cursor"], "more": page["more"]})
}

async fn the_same_cursor_gives_the_same_page(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let (ep, _) = poll_endpoint(api, json!([])).await?;
    let posted = post_events(api, "s", 4).await?;
    let first = page(api, &ep, "limit=2", ADMIN_TOKEN).await?;
    let again = page(api, &ep, "limit=2", ADMIN_TOKEN).await?;
    ensure!(stable(&first) == stable(&again) && ids_of(&first) == posted[..2], "{first} then {again}");
    let c = cursor(&first)?;
    let second = page(api, &ep, &format!("limit=2&cursor={c}"), ADMIN_TOKEN).await?;
    ensure!(ids_of(&second) == posted[2..], "{second}");
    let second_again = page(api, &ep, &format!("limit=2&cursor={c}"), ADMIN_TOKEN).await?;
    ensure!(stable(&second) == stable(&second_again), "{second} then {second_again}");
    if b == Backend::Sqlite {
        // A restart keeps every unsettled delivery and what a cursor means. (A Postgres
        // node's schema goes with it: the restarts of a shared store are `db_restart`'s.)
        let gw = TestGateway::start_in(gw.stop().await, &[]).await?;
        let api = &gw.api;
        ensure!(stable(&page(api, &ep, "limit=2", ADMIN_TOKEN).await?) == stable(&first));
        ensure!(stable(&page(api, &ep, &format!("limit=2&cursor={c}"), ADMIN_TOKEN).await?) == stable(&second));
    }
    Ok(())
}

async fn a_cursor_past_retention_is_gone(b: Backend) -> anyhow::Result<()> {
    let env = [("HERALD_RETENTION_DELIVERED", "300ms"), ("HERALD_RETENTION_EVERY", "100ms")];
    let gw = TestGateway::start_on(b, &env).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let (ep, _) = poll_endpoint(api, json!([])).await?;
    let posted = post_events(api, "r", 3).await?;
    let first = page(api, &ep, "limit=2", ADMIN_TOKEN).await?;
    let c = cursor(&first)?;
    ensure!(ack(api, &ep, &c, ADMIN_TOKEN).await? == 2);
    let last_read = items(&first)[1]["delivery_id"].as_str().context("delivery_id")?.to_string();
    eventually("the acknowledged deliveries purged", WAIT, || async {
        let r = api.get(&format!("{T}/deliveries/{last_read}"), ADMIN_TOKEN).await?;
        done_or(r.status == 404, r.status)
    })
    .await?;
    let gone = api.get(&format!("{T}/endpoints/{ep}/poll?cursor={c}"), ADMIN_TOKEN).await?;
    ensure!(gone.status == 410 && gone.json["error"]["code"] == "cursor_expired", "{}", gone.text);
    let message = gone.json["error"]["message"].as_str().unwrap_or_default();
    ensure!(message.starts_with("cursor:") && message.contains("without a cursor"), "{message}");
    let acked = api.post(&format!("{T}/endpoints/{ep}/poll/ack"), ADMIN_TOKEN, json!({"cursor": c})).await?;
    ensure!(acked.status == 410, "{}", acked.text);
    // Unsettled work is never purged: without a cursor, the third is there.
    let rest = page(api, &ep, "", ADMIN_TOKEN).await?;
    ensure!(ids_of(&rest) == posted[2..], "{rest}");
    Ok(())
}

async fn only_the_poll_scope_polls(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let (ep, _) = poll_endpoint(api, json!([])).await?;
    post_events(api, "p", 2).await?;
    let (read_path, ack_path) = (format!("{T}/endpoints/{ep}/poll"), format!("{T}/endpoints/{ep}/poll/ack"));
    let poller = api.token("acme", &["poll"]).await?;
    let first = page(api, &ep, "limit=1", &poller).await?;
    ensure!(items(&first).len() == 1, "{first}");
    let c = cursor(&first)?;
    for scope in ["read", "manage", "events:write", "replay"] {
        let token = api.token("acme", &[scope]).await?;
        let r = api.get(&read_path, &token).await?;
        ensure!(
            r.status == 403 && r.json["error"]["message"].as_str().unwrap_or("").contains("poll"),
            "{scope}: {}",
            r.text
        );
        let r = api.post(&ack_path, &token, json!({"cursor": c})).await?;
        ensure!(r.status == 403, "{scope}: {}", r.text);
    }
    // A portal session has no `poll` scope: its customer reads with a token of its own.
    let session = open(api, &mint(api, "acme", json!({})).await?).await?;
    ensure!(api.get(&read_path, &session).await?.status == 403);
    // The scope reaches nothing else, and nothing of another tenant.
    ensure!(api.get(&format!("{T}/endpoints"), &poller).await?.status == 403);
    ensure!(api.get(&format!("{T}/deliveries"), &poller).await?.status == 403);
    api.tenant("globex").await?;
    let other = api.token("globex", &["poll"]).await?;
    ensure!(api.get(&read_path, &other).await?.status == 404);
    ensure!(ack(api, &ep, &c, &poller).await? == 1);
    Ok(())
}

/// Every delivery of `ep` as the admin lists it.
async fn deliveries(api: &Api, ep: &str) -> anyhow::Result<Vec<Value>> {
    let r = api.get(&format!("{T}/deliveries?endpoint={ep}&limit=100"), ADMIN_TOKEN).await?.expect(200)?;
    Ok(r.json["data"].as_array().cloned().unwrap_or_default())
}

async fn bad_input_is_refused_naming_the_field_and_writes_nothing(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let rx = FakeReceiver::start().await?;
    let (ep, _) = poll_endpoint(api, json!(["order.*"])).await?;
    let (other, _) = poll_endpoint(api, json!(["none.ever"])).await?;
    let pushed = api.endpoint("acme", json!({"url": rx.url(), "event_types": ["none.ever"]})).await?;
    let pushed = pushed["id"].as_str().context("id")?.to_string();
    post_events(api, "b", 2).await?;
    let other_cursor = cursor(&page(api, &other, "", ADMIN_TOKEN).await?)?;
    let read = |q: &str| format!("{T}/endpoints/{ep}/poll?{q}");
    let cases = [
        (read("limit=0"), 400, "limit: must be 1 to 250"),
        (read("limit=251"), 400, "limit: must be 1 to 250"),
        (read("limit=many"), 400, "limit"),
        (read("cursor=nope"), 400, "cursor: is not a cursor"),
        (read(&format!("cursor={other_cursor}")), 400, "cursor: is a cursor of another endpoint"),
        (read("after=x"), 400, "after"),
        (format!("{T}/endpoints/{pushed}/poll"), 409, "kind: the endpoint is kind http, not poll"),
        (format!("{T}/endpoints/ep_nope/poll"), 404, "endpoint not found"),
    ];
    for (path, status, says) in &cases {
        let r = api.get(path, ADMIN_TOKEN).await?;
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        ensure!(r.status == *status && message.contains(says), "{path}: {} {}", r.status, r.text);
    }
    let ack_path = format!("{T}/endpoints/{ep}/poll/ack");
    let acks = [
        (json!({"cursor": other_cursor}), 422, "cursor: is a cursor of another endpoint"),
        (json!({"cursor": "nope"}), 400, "cursor: is not a cursor"),
        (json!({"cursor": 5}), 400, "cursor"),
        (json!({}), 400, "cursor"),
        (json!({"cursor": other_cursor, "all": true}), 400, "all"),
    ];
    for (body, status, says) in &acks {
        let r = api.post(&ack_path, ADMIN_TOKEN, body.clone()).await?;
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        ensure!(r.status == *status && message.contains(says), "{body}: {} {}", r.status, r.text);
    }
    let r = api.post(&format!("{T}/endpoints/{pushed}/poll/ack"), ADMIN_TOKEN, json!({"cursor": other_cursor})).await?;
    ensure!(r.status == 409, "{}", r.text);
    ensure!(deliveries(api, &ep).await?.iter().all(|d| d["state"] == "queued"), "a refused ack settles nothing");

    // A poll endpoint takes no URL, none of HTTP's settings and no plugins; none becomes one.
    let before = api.get(&format!("{T}/endpoints"), ADMIN_TOKEN).await?.expect(200)?.json["data"].clone();
    let creates = [
        (json!({"kind": "poll", "url": "https://example.com/h"}), "url: kind poll takes no URL"),
        (json!({"kind": "poll", "verify": true}), "verify: is for kind http only, not poll"),
        (json!({"kind": "poll", "proxy": "none"}), "proxy: is for kind http only, not poll"),
        (json!({"kind": "poll", "destination": {"stream": "s"}}), "destination: is not a setting of kind poll"),
        (json!({"kind": "poll", "plugins": {"classify": "nope"}}), "plugins.classify"),
        (json!({"kind": "pull"}), "kind"),
    ];
    for (body, says) in &creates {
        let r = api.post(&format!("{T}/endpoints"), ADMIN_TOKEN, body.clone()).await?;
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        ensure!((400..500).contains(&r.status) && message.contains(says), "{body}: {} {}", r.status, r.text);
    }
    for (id, kind) in [(&pushed, "poll"), (&ep, "http")] {
        let body = json!({"kind": kind, "url": rx.url()});
        let r = api.call("PATCH", &format!("{T}/endpoints/{id}"), ADMIN_TOKEN, Some(body)).await?;
        ensure!(
            r.status == 422 && r.json["error"]["message"].as_str().unwrap_or("").starts_with("kind:"),
            "{}",
            r.text
        );
    }
    let after = api.get(&format!("{T}/endpoints"), ADMIN_TOKEN).await?.expect(200)?.json["data"].clone();
    ensure!(after == before, "a refused write changes no endpoint");
    Ok(())
}

async fn the_engine_never_pushes_a_poll_endpoint(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let rx = FakeReceiver::start().await?;
    let (ep, _) = poll_endpoint(api, json!([])).await?;
    api.endpoint("acme", json!({"url": rx.url()})).await?;
    let posted = post_events(api, "w", 6).await?;
    // The pushed endpoint has had every event: the engine ran over the poll endpoint's too.
    rx.wait_for(posted.len(), WAIT).await?;
    // A change pokes its partition as well.
    let path = format!("{T}/endpoints/{ep}");
    api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"rate_per_sec": 50}))).await?.expect(200)?;
    post_events(api, "w2", 2).await?;
    rx.wait_for(posted.len() + 2, WAIT).await?;
    let all = deliveries(api, &ep).await?;
    ensure!(all.len() == 8, "{all:?}");
    for d in &all {
        ensure!(d["state"] == "queued" && d["attempts"] == 0 && d["next_attempt_at"].is_null(), "{d}");
        let one = api.get(&format!("{T}/deliveries/{}", d["id"].as_str().unwrap_or("")), ADMIN_TOKEN).await?;
        ensure!(one.expect(200)?.json["attempt_history"] == json!([]), "{d}");
    }
    let read = page(api, &ep, "limit=100", ADMIN_TOKEN).await?;
    ensure!(items(&read).len() == 8, "{read}");
    // A pause holds pushes only: its consumer reads everything, paused and enabled again,
    // and nothing becomes due.
    api.post(&format!("{path}/pause"), ADMIN_TOKEN, json!({})).await?.expect(200)?;
    ensure!(stable(&page(api, &ep, "limit=100", ADMIN_TOKEN).await?) == stable(&read));
    api.post(&format!("{path}/enable"), ADMIN_TOKEN, json!({})).await?.expect(200)?;
    ensure!(stable(&page(api, &ep, "limit=100", ADMIN_TOKEN).await?) == stable(&read));
    let all = deliveries(api, &ep).await?;
    ensure!(all.iter().all(|d| d["state"] == "queued" && d["next_attempt_at"].is_null()), "{all:?}");
    Ok(())
}
