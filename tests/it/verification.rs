//! Verified endpoints: an endpoint with `verify` gets nothing until its URL has echoed a
//! signed challenge (`{"type": "webhook.verification", "challenge": …}` answered with
//! `{"challenge": …}`); until then its deliveries wait, not attempted and not dead; a
//! failure shows on the endpoint with its reason, and "verify now" tries again at once.
//! A tenant's `verify_endpoints` (`PUT …/catalog`) verifies its endpoints as they are
//! created or moved to a new URL, unless an endpoint's own `verify` says otherwise.

use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tests::{ADMIN_TOKEN, Answer, Backend, FakeReceiver, TestGateway};

tests::backends!(
    an_echoing_receiver_gets_deliveries_only_after_a_signed_handshake,
    deliveries_wait_for_a_receiver_that_does_not_echo_until_verify_now,
    a_url_change_is_verified_again_before_anything_goes_there,
    endpoints_without_verify_are_unaffected,
    turning_verify_off_lets_the_waiting_deliveries_go,
    bad_verify_input_is_refused_naming_the_field_and_writes_nothing,
    a_tenant_that_verifies_its_endpoints_verifies_new_and_moved_ones_unless_they_say_otherwise,
    bad_tenant_settings_are_refused_naming_the_field_and_write_nothing,
);

const WAIT: Duration = Duration::from_secs(10);

/// Is this request a verification request? Its challenge, if so.
fn challenge_of(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    (v["type"] == "webhook.verification").then(|| v["challenge"].as_str().map(String::from))?
}

/// The receiver answers verification requests with their challenge (other requests as
/// scripted: 200).
fn echo(rx: &FakeReceiver) {
    rx.answer_when(|body| {
        let challenge = challenge_of(body)?;
        Some(
            Answer::status(200)
                .header("content-type", "application/json")
                .body(&json!({"challenge": challenge}).to_string()),
        )
    });
}

async fn endpoint(gw: &TestGateway, url: &str, extra: Value) -> anyhow::Result<Value> {
    if gw.api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.status == 404 {
        gw.api.tenant("acme").await?;
    }
    let mut body = json!({"url": url, "rate_per_sec": 100});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    gw.api.endpoint("acme", body).await
}

async fn post_event(gw: &TestGateway, id: &str) -> anyhow::Result<()> {
    gw.api.event("acme", json!({"id": id, "type": "order.created", "payload": {"n": 1}})).await?.expect(202)?;
    Ok(())
}

async fn delivery_of(gw: &TestGateway, event: &str) -> anyhow::Result<Value> {
    let r = gw.api.get(&format!("/v1/tenants/acme/events/{event}/deliveries"), ADMIN_TOKEN).await?;
    let id = r.json["data"][0]["id"].as_str().unwrap_or_default().to_string();
    Ok(gw.api.get(&format!("/v1/tenants/acme/deliveries/{id}"), ADMIN_TOKEN).await?.json)
}

/// A gateway with an endpoint that asks for verification at a receiver that answers 200
/// without the challenge, and `event` posted to it: once its verification has `failed`,
/// the gateway, the receiver, the endpoint's id and the endpoint.
async fn waiting_for_a_receiver_that_does_not_echo(
    b: Backend,
    event: &str,
) -> anyhow::Result<(TestGateway, FakeReceiver, String, Value)> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    let ep = endpoint(&gw, &rx.url(), json!({"verify": true})).await?;
    let id = ep["id"].as_str().unwrap().to_string();
    post_event(&gw, event).await?;
    let e = verification(&gw, &id, "failed").await?;
    Ok((gw, rx, id, e))
}

/// Waits until `event`'s delivery is delivered.
async fn delivered(gw: &TestGateway, event: &str, wait: Duration) -> anyhow::Result<()> {
    tests::eventually(&format!("{event} delivered"), wait, || async {
        let d = delivery_of(gw, event).await?;
        Ok(if d["state"] == "delivered" { Ok(()) } else { Err(d.to_string()) })
    })
    .await
}

/// Waits until the endpoint's `verification.state` is `state`; returns the endpoint.
async fn verification(gw: &TestGateway, id: &str, state: &str) -> anyhow::Result<Value> {
    tests::eventually(&format!("verification {state}"), WAIT, || async {
        let e = gw.api.get(&format!("/v1/tenants/acme/endpoints/{id}"), ADMIN_TOKEN).await?.json;
        Ok(if e["verification"]["state"] == state { Ok(e) } else { Err(e["verification"].to_string()) })
    })
    .await
}

/// Whether `header` is a `v1` signature of (`msg_id`, `ts`, `body`) by `secret` (`whsec_…`).
fn signed_by(secret: &str, msg_id: &str, ts: &str, body: &[u8], header: &str) -> anyhow::Result<bool> {
    let key = base64::engine::general_purpose::STANDARD.decode(secret.strip_prefix("whsec_").unwrap())?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key)?;
    mac.update(format!("{msg_id}.{ts}.").as_bytes());
    mac.update(body);
    let expected = format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()));
    Ok(header.split(' ').any(|s| s == expected))
}

/// The handshake comes first, signed with the endpoint's secret, carrying a random
/// challenge; the event follows once it was echoed, and the endpoint shows `verified`.
async fn an_echoing_receiver_gets_deliveries_only_after_a_signed_handshake(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    echo(&rx);
    let ep = endpoint(&gw, &rx.url(), json!({"verify": true})).await?;
    assert_eq!(ep["verify"], true, "{ep}");
    let id = ep["id"].as_str().unwrap();
    post_event(&gw, "evt_after_handshake").await?;
    let got = rx.wait_for(2, WAIT).await?;

    let hs = &got[0];
    let challenge = challenge_of(&hs.body).expect("the first request is the verification request");
    assert!(challenge.len() >= 32, "a random challenge: {challenge}");
    let body = hs.json();
    assert_eq!(body["endpoint_id"], id, "{body}");
    let msg_id = hs.header("webhook-id").unwrap();
    assert!(msg_id.starts_with("vrf_"), "{msg_id}");
    let (ts, sig) = (hs.header("webhook-timestamp").unwrap(), hs.header("webhook-signature").unwrap());
    assert!(signed_by(ep["secret"].as_str().unwrap(), msg_id, ts, &hs.body, sig)?, "signed with the secret: {sig}");
    assert_eq!(hs.header("content-type"), Some("application/json"));

    assert_eq!(got[1].header("webhook-id"), Some("evt_after_handshake"), "the event after the handshake");
    let e = verification(&gw, id, "verified").await?;
    assert!(e["verification"]["last_tried_at"].is_string(), "{e}");
    assert!(e["verification"]["next_try_at"].is_null(), "{e}");
    // Verified once: the next event goes straight out.
    post_event(&gw, "evt_second").await?;
    let got = rx.wait_for(3, WAIT).await?;
    assert_eq!(got[2].header("webhook-id"), Some("evt_second"));
    assert_eq!(got.iter().filter(|r| challenge_of(&r.body).is_some()).count(), 1, "one handshake");
    Ok(())
}

/// A receiver that answers 200 without the challenge: the delivery is neither attempted
/// nor dead, the endpoint shows `failed` with the reason; fixed and verified now, the
/// waiting delivery goes out.
async fn deliveries_wait_for_a_receiver_that_does_not_echo_until_verify_now(b: Backend) -> anyhow::Result<()> {
    let (gw, rx, id, e) = waiting_for_a_receiver_that_does_not_echo(b, "evt_waits").await?;
    let id = id.as_str();
    let v = &e["verification"];
    assert!(v["reason"].as_str().unwrap().contains("without {\"challenge\""), "{v}");
    assert!(v["next_try_at"].is_string() && v["last_tried_at"].is_string(), "{v}");
    assert_eq!(e["state"], "active", "the endpoint itself is not paused: {e}");
    let status = &e["delivery_status"];
    assert_eq!(status["status"], "unverified", "its delivery status says why nothing goes: {e}");
    assert_eq!(status["reason"], v["reason"], "{e}");
    assert_eq!((&status["since"], &status["until"]), (&v["last_tried_at"], &v["next_try_at"]), "{e}");

    let d = delivery_of(&gw, "evt_waits").await?;
    assert!(d["state"] == "queued" || d["state"] == "waiting", "waiting: {d}");
    assert_eq!(d["attempts"], 0, "not attempted: {d}");
    let dead = gw.api.get("/v1/tenants/acme/dead-letters", ADMIN_TOKEN).await?.json;
    assert_eq!(dead["data"].as_array().map(Vec::len), Some(0), "{dead}");
    let got = rx.received();
    assert!(!got.is_empty() && got.iter().all(|r| challenge_of(&r.body).is_some()), "only handshakes so far");

    echo(&rx);
    let r = gw.api.post(&format!("/v1/tenants/acme/endpoints/{id}/verify"), ADMIN_TOKEN, json!({})).await?;
    assert_eq!(r.status, 202, "{}", r.text);
    assert_eq!(r.json["verification"]["state"], "pending", "{}", r.text);
    // A try already under way when "verify now" came may fail once more (5 s, then 10 s).
    delivered(&gw, "evt_waits", 2 * WAIT).await?;
    let e = verification(&gw, id, "verified").await?;
    assert_eq!(e["delivery_status"]["status"], "active", "{e}");
    let got = rx.received();
    let first_event = got.iter().position(|r| r.header("webhook-id") == Some("evt_waits")).unwrap();
    let echoed = got[..first_event].iter().rposition(|r| challenge_of(&r.body).is_some());
    assert!(echoed.is_some(), "a handshake before the event");
    Ok(())
}

/// A verified endpoint whose URL changes is verified at the new URL before an event goes
/// there.
async fn a_url_change_is_verified_again_before_anything_goes_there(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let (old, new) = (FakeReceiver::start().await?, FakeReceiver::start().await?);
    echo(&old);
    echo(&new);
    let ep = endpoint(&gw, &old.url(), json!({"verify": true})).await?;
    let id = ep["id"].as_str().unwrap();
    verification(&gw, id, "verified").await?;
    let path = format!("/v1/tenants/acme/endpoints/{id}");
    let r = gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"url": new.url()}))).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_ne!(r.json["verification"]["state"], "verified", "a new URL is not verified: {}", r.text);
    post_event(&gw, "evt_moved").await?;
    let got = new.wait_for(2, WAIT).await?;
    assert!(challenge_of(&got[0].body).is_some(), "the new URL's handshake first");
    assert_eq!(got[1].header("webhook-id"), Some("evt_moved"));
    verification(&gw, id, "verified").await?;
    assert!(old.received().iter().all(|r| challenge_of(&r.body).is_some()), "nothing else went to the old URL");
    Ok(())
}

/// Without `verify` nothing changes: no handshake, no `verification`, and "verify now" is
/// a conflict.
async fn endpoints_without_verify_are_unaffected(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    echo(&rx);
    let ep = endpoint(&gw, &rx.url(), json!({})).await?;
    assert_eq!(ep["verify"], false, "{ep}");
    assert!(ep.get("verification").is_none(), "{ep}");
    post_event(&gw, "evt_plain").await?;
    let got = rx.wait_for(1, WAIT).await?;
    assert_eq!(got[0].header("webhook-id"), Some("evt_plain"), "the event, no handshake");
    let id = ep["id"].as_str().unwrap();
    let r = gw.api.post(&format!("/v1/tenants/acme/endpoints/{id}/verify"), ADMIN_TOKEN, json!({})).await?;
    assert_eq!(r.status, 409, "{}", r.text);
    assert!(r.text.contains("verify"), "{}", r.text);
    Ok(())
}

/// `verify` that is not a boolean, or on a broker kind, is refused naming it, and nothing
/// is written.
async fn bad_verify_input_is_refused_naming_the_field_and_writes_nothing(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    let ep = endpoint(&gw, &rx.url(), json!({})).await?;
    let path = format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().unwrap());
    for bad in [json!("yes"), json!(1), json!("true")] {
        let r = gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"verify": bad}))).await?;
        assert!((400..500).contains(&r.status), "{bad}: {} {}", r.status, r.text);
        assert!(r.text.contains("verify"), "{bad}: {}", r.text);
    }
    let broker = json!({
        "kind": "redis-stream", "url": "redis://127.0.0.1:6379", "destination": {"stream": "s"}, "verify": true,
    });
    let r = gw.api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, broker).await?;
    assert_eq!(r.status, 422, "{}", r.text);
    assert!(r.text.contains("verify: is for kind http only"), "{}", r.text);
    let list = gw.api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.json;
    assert_eq!(list["data"].as_array().map(Vec::len), Some(1), "nothing written: {list}");
    assert_eq!(gw.api.get(&path, ADMIN_TOKEN).await?.json["verify"], false, "a refused patch changes nothing");
    let r = gw.api.post("/v1/tenants/acme/endpoints/ep_missing/verify", ADMIN_TOKEN, json!({})).await?;
    assert_eq!(r.status, 404, "{}", r.text);
    Ok(())
}

/// A receiver that never echoes keeps its deliveries waiting until `verify` is turned off:
/// then they go, with no handshake more, and the endpoint shows no `verification`.
async fn turning_verify_off_lets_the_waiting_deliveries_go(b: Backend) -> anyhow::Result<()> {
    let (gw, rx, id, _) = waiting_for_a_receiver_that_does_not_echo(b, "evt_off").await?;
    assert_eq!(delivery_of(&gw, "evt_off").await?["attempts"], 0, "waiting, not attempted");

    let path = format!("/v1/tenants/acme/endpoints/{id}");
    let r = gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"verify": false}))).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["verify"], false, "{}", r.text);
    assert!(r.json.get("verification").is_none(), "{}", r.text);
    delivered(&gw, "evt_off", WAIT).await?;
    let got = rx.received();
    let event = got.iter().position(|r| r.header("webhook-id") == Some("evt_off")).expect("the event");
    assert!(got[event..].iter().all(|r| challenge_of(&r.body).is_none()), "no handshake after it");
    Ok(())
}

/// Sets the tenant's settings; the answer's body.
async fn put_settings(gw: &TestGateway, body: Value) -> anyhow::Result<Value> {
    let r = gw.api.call("PUT", "/v1/tenants/acme/catalog", ADMIN_TOKEN, Some(body)).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    Ok(r.json)
}

async fn patch_url(gw: &TestGateway, id: &str, url: &str) -> anyhow::Result<Value> {
    let path = format!("/v1/tenants/acme/endpoints/{id}");
    let r = gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"url": url}))).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    Ok(r.json)
}

/// With `verify_endpoints` on, a new endpoint without `verify` is verified (handshake
/// before its first event), an existing one is verified at its next URL change (until
/// then its events go out as before), and an endpoint's own `verify: false` wins. Turned
/// off, an endpoint that followed the tenant stops asking at its next URL change.
async fn a_tenant_that_verifies_its_endpoints_verifies_new_and_moved_ones_unless_they_say_otherwise(
    b: Backend,
) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let (older, fresh, own, moved) = (
        FakeReceiver::start().await?,
        FakeReceiver::start().await?,
        FakeReceiver::start().await?,
        FakeReceiver::start().await?,
    );
    echo(&fresh);
    let before = endpoint(&gw, &older.url(), json!({})).await?;
    let set = put_settings(&gw, json!({"verify_endpoints": true})).await?;
    assert_eq!(set, json!({"schema_validation": "off", "verify_endpoints": true}));
    let got = gw.api.get("/v1/tenants/acme/catalog", ADMIN_TOKEN).await?.json;
    assert_eq!(got["verify_endpoints"], true, "{got}");

    let new = endpoint(&gw, &fresh.url(), json!({})).await?;
    assert_eq!(new["verify"], true, "the tenant's setting: {new}");
    let own_ep = endpoint(&gw, &own.url(), json!({"verify": false})).await?;
    assert_eq!(own_ep["verify"], false, "its own setting wins: {own_ep}");
    assert_eq!(
        gw.api.get(&format!("/v1/tenants/acme/endpoints/{}", before["id"].as_str().unwrap()), ADMIN_TOKEN).await?.json
            ["verify"],
        false,
        "an endpoint already there is left as it is"
    );

    post_event(&gw, "evt_tenant").await?;
    let got = fresh.wait_for(2, WAIT).await?;
    assert!(challenge_of(&got[0].body).is_some(), "the new endpoint's handshake first");
    assert_eq!(got[1].header("webhook-id"), Some("evt_tenant"));
    verification(&gw, new["id"].as_str().unwrap(), "verified").await?;
    let got = older.wait_for(1, WAIT).await?;
    assert_eq!(got[0].header("webhook-id"), Some("evt_tenant"), "no handshake for the older endpoint yet");
    let got = own.wait_for(1, WAIT).await?;
    assert_eq!(got[0].header("webhook-id"), Some("evt_tenant"), "no handshake for verify: false");

    // The older endpoint moves to a receiver that does not echo: verified first, so it waits.
    let older_id = before["id"].as_str().unwrap();
    let e = patch_url(&gw, older_id, &moved.url()).await?;
    assert_eq!(e["verify"], true, "verified at its new URL: {e}");
    let own_id = own_ep["id"].as_str().unwrap();
    assert_eq!(patch_url(&gw, own_id, &older.url()).await?["verify"], false, "its own false stays");
    post_event(&gw, "evt_moved_in").await?;
    verification(&gw, older_id, "failed").await?;
    let waiting = |rx: &FakeReceiver| rx.received().iter().all(|r| challenge_of(&r.body).is_some());
    let got = older.wait_for(2, WAIT).await?;
    assert_eq!(got[1].header("webhook-id"), Some("evt_moved_in"), "verify: false delivers at once");
    assert!(waiting(&moved), "only handshakes at the moved endpoint's new URL");
    let all = gw.api.get("/v1/tenants/acme/events/evt_moved_in/deliveries", ADMIN_TOKEN).await?.json;
    let d = all["data"].as_array().unwrap().iter().find(|d| d["endpoint_id"] == older_id).cloned().unwrap_or(all);
    assert_eq!(d["attempts"], 0, "its delivery waits, not attempted: {d}");

    // Off again: the endpoint that followed the tenant stops asking at its next URL change.
    assert_eq!(put_settings(&gw, json!({"verify_endpoints": false})).await?["verify_endpoints"], false);
    let e = patch_url(&gw, older_id, &fresh.url()).await?;
    assert_eq!(e["verify"], false, "follows the tenant: {e}");
    assert_eq!(endpoint(&gw, &fresh.url(), json!({})).await?["verify"], false);
    Ok(())
}

/// A `verify_endpoints` that is not a boolean, or an unknown setting, is refused naming
/// it, and the stored settings stay; a setting omitted keeps its stored value.
async fn bad_tenant_settings_are_refused_naming_the_field_and_write_nothing(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    gw.api.tenant("acme").await?;
    put_settings(&gw, json!({"schema_validation": "warn"})).await?;
    for (bad, field) in [
        (json!({"verify_endpoints": "yes"}), "verify_endpoints"),
        (json!({"verify_endpoints": 1}), "verify_endpoints"),
        (json!({"verify_endpoints": true, "schema_validation": "always"}), "schema_validation"),
        (json!({"verify_endpoint": true}), "verify_endpoint"),
    ] {
        let r = gw.api.call("PUT", "/v1/tenants/acme/catalog", ADMIN_TOKEN, Some(bad.clone())).await?;
        assert!((400..500).contains(&r.status), "{bad}: {} {}", r.status, r.text);
        assert!(r.text.contains(field), "{bad} names {field}: {}", r.text);
    }
    let got = gw.api.get("/v1/tenants/acme/catalog", ADMIN_TOKEN).await?.json;
    assert_eq!(got, json!({"schema_validation": "warn", "verify_endpoints": false}), "nothing written");
    let set = put_settings(&gw, json!({"verify_endpoints": true})).await?;
    assert_eq!(set, json!({"schema_validation": "warn", "verify_endpoints": true}), "the omitted one stays");
    Ok(())
}
