//! `v1a` (ed25519) signatures: what a receiver gets verifies with an implementation that
//! shares no code with Herald (Python `cryptography`, keys from the tenant's JWKS fetched
//! without a token) and, for `v1` beside it, with the official Standard Webhooks library
//! (`tests/contract/verify_signatures.py`, from the virtualenv `scripts/pytools` builds);
//! a rotation signs with both keys; bad keys are refused naming the field, nothing written;
//! a sign plugin still replaces the built-in signatures.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Backend, FakeReceiver, Received, SEAL_KEY, TestGateway};

tests::backends!(
    v1a_deliveries_verify_independently_and_a_rotation_signs_with_both,
    bad_keys_are_refused_and_write_nothing
);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// A supplied key in the 64-byte form libsodium and Svix write (seed, then public key).
fn supplied_key() -> (String, gateway::sign::v1a::SigningKey) {
    let seed = [7u8; 32];
    let key = gateway::sign::v1a::SigningKey::parse(&format!("whsk_{}", STANDARD.encode(seed))).expect("a key");
    let public = STANDARD.decode(&key.public_key().to_string()["whpk_".len()..]).expect("base64");
    (format!("whsk_{}", STANDARD.encode([&seed[..], &public].concat())), key)
}

/// Runs the independent verifier over `deliveries` (each with its endpoint's `whsec_`, if any).
async fn verify_in_python(
    dir: &Path,
    jwks: &Value,
    deliveries: &[(&str, &Received, Option<&str>)],
) -> anyhow::Result<Value> {
    let deliveries: Vec<Value> = deliveries
        .iter()
        .map(|(endpoint, r, whsec)| {
            json!({"endpoint": endpoint, "id": r.header("webhook-id"), "timestamp": r.header("webhook-timestamp"),
                   "signature": r.header("webhook-signature"), "body": STANDARD.encode(&r.body), "whsec": whsec})
        })
        .collect();
    verify_signed(dir, jwks, deliveries).await
}

/// The independent verifier (`tests/contract/verify_signatures.py`) over signed messages,
/// each `{endpoint, id, timestamp, signature, body (base64), whsec}`: its JSON answer.
pub(crate) async fn verify_signed(dir: &Path, jwks: &Value, deliveries: Vec<Value>) -> anyhow::Result<Value> {
    let python = repo().join("target/pytools/venv/bin/python");
    ensure!(python.exists(), "{} is missing: run scripts/pytools (scripts/test does)", python.display());
    let file = dir.join("signed.json");
    std::fs::write(&file, json!({"jwks": jwks, "deliveries": deliveries}).to_string())?;
    let script = repo().join("tests/contract/verify_signatures.py");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(&python).arg(&script).arg(&file).kill_on_drop(true).output(),
    )
    .await
    .context("the verifier ran over a minute")??;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "the verifier failed:\n{text}");
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The one delivery of `event` to the receiver path ending in `path`.
fn arrived<'a>(got: &'a [Received], path: &str, event: &str) -> anyhow::Result<&'a Received> {
    let at: Vec<&Received> =
        got.iter().filter(|r| r.path.ends_with(path) && r.header("webhook-id") == Some(event)).collect();
    ensure!(at.len() == 1, "{event} at {path}: {} arrivals", at.len());
    Ok(at[0])
}

async fn v1a_deliveries_verify_independently_and_a_rotation_signs_with_both(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[("HERALD_SECRETS_KEY", SEAL_KEY)]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    api.tenant("globex").await?;
    let rx = FakeReceiver::start().await?;
    // `a` signs v1a only, with a generated key; `b` signs both, v1a with a supplied key.
    let a = api.endpoint("acme", json!({"url": format!("{}/a", rx.url()), "signatures": ["v1a"]})).await?;
    ensure!(a["signatures"] == json!(["v1a"]) && a.get("secret").is_none(), "{a}");
    let a_key = a["public_keys"][0]["public_key"].as_str().context("a's public key")?.to_string();
    let a_kid = a["public_keys"][0]["kid"].as_str().context("a's kid")?.to_string();
    let (supplied, b_signing) = supplied_key();
    let b = api.endpoint("acme", json!({"url": format!("{}/b", rx.url()), "signing_key": supplied})).await?;
    ensure!(b["signatures"] == json!(["v1", "v1a"]), "{b}");
    let b_whsec = b["secret"].as_str().context("b's v1 secret")?.to_string();
    let b_public = b_signing.public_key();
    ensure!(b["public_keys"][0]["public_key"] == b_public.to_string(), "b shows its key's public key: {b}");
    ensure!(b["public_keys"][0]["kid"] == b_public.kid(), "{b}");
    // Another tenant's key is never in acme's set.
    api.endpoint("globex", json!({"url": format!("{}/g", rx.url()), "signatures": ["v1a"]})).await?;
    let (a_id, b_id) = (a["id"].as_str().context("id")?, b["id"].as_str().context("id")?);

    // The secret key is never shown; the public ones are, to a reader too.
    let reader = api.token("acme", &["read"]).await?;
    for path in [format!("/v1/tenants/acme/endpoints/{b_id}"), format!("/v1/tenants/acme/endpoints/{b_id}/secret")] {
        let r = api.get(&path, ADMIN_TOKEN).await?.expect(200)?;
        ensure!(!r.text.contains("whsk_") && !r.text.contains(&supplied["whsk_".len()..]), "{path}: {}", r.text);
        ensure!(r.json["public_keys"][0]["public_key"] == b_public.to_string(), "{path}: {}", r.text);
    }
    let shown = api.get(&format!("/v1/tenants/acme/endpoints/{a_id}"), &reader).await?.expect(200)?;
    ensure!(shown.json["public_keys"][0]["public_key"] == a_key.as_str(), "{}", shown.text);
    let secrets = api.get(&format!("/v1/tenants/acme/endpoints/{b_id}/secret"), ADMIN_TOKEN).await?.json;
    ensure!(
        secrets["secret"] == b_whsec.as_str() && secrets["secrets"].as_array().map(Vec::len) == Some(1),
        "{secrets}"
    );

    // The JWKS: without a token, both keys; one endpoint's with `endpoint`.
    let jwks = api.raw("GET", "/v1/tenants/acme/jwks.json", None, "").await?.expect(200)?;
    let kids: Vec<&str> =
        jwks.json["keys"].as_array().context("keys")?.iter().filter_map(|k| k["kid"].as_str()).collect();
    ensure!(
        kids == [a_kid.as_str(), b_public.kid().as_str()] || kids == [b_public.kid().as_str(), a_kid.as_str()],
        "{}",
        jwks.text
    );
    let b_jwk = jwks.json["keys"].as_array().unwrap().iter().find(|k| k["kid"] == b_public.kid()).context("b's jwk")?;
    ensure!(
        b_jwk
            == &json!({"kty": "OKP", "crv": "Ed25519", "x": b_public.jwk_x(), "kid": b_public.kid(), "alg": "EdDSA", "use": "sig"}),
        "{b_jwk}"
    );
    ensure!(
        jwks.headers.get("cache-control").is_some_and(|v| v.to_str().unwrap_or("").starts_with("public")),
        "{:?}",
        jwks.headers
    );
    let only_a = api.raw("GET", &format!("/v1/tenants/acme/jwks.json?endpoint={a_id}"), None, "").await?.expect(200)?;
    ensure!(
        only_a.json["keys"].as_array().map(Vec::len) == Some(1) && only_a.json["keys"][0]["kid"] == a_kid.as_str(),
        "{}",
        only_a.text
    );
    for path in ["/v1/tenants/nobody/jwks.json".to_string(), format!("/v1/tenants/globex/jwks.json?endpoint={a_id}")] {
        let none = api.raw("GET", &path, None, "").await?.expect(200)?;
        ensure!(none.json == json!({"keys": []}), "{path}: {}", none.text);
    }

    api.event("acme", json!({"id": "evt_1", "type": "invoice.paid", "payload": {"amount": 1}})).await?.expect(202)?;
    rx.wait_for(2, Duration::from_secs(10)).await?;
    // A rotation of `a`: the new key signs, the previous one too until the grace ends.
    let rotated = api
        .post(&format!("/v1/tenants/acme/endpoints/{a_id}/rotate-secret"), ADMIN_TOKEN, json!({}))
        .await?
        .expect(200)?;
    ensure!(rotated.json.get("secret").is_none() && !rotated.text.contains("whsk_"), "{}", rotated.text);
    let new_kid = rotated.json["public_key"]["kid"].as_str().context("new kid")?.to_string();
    ensure!(new_kid != a_kid, "{}", rotated.text);
    let detail = api.get(&format!("/v1/tenants/acme/endpoints/{a_id}"), &reader).await?.json;
    let keys = detail["public_keys"].as_array().context("public_keys")?;
    ensure!(keys.len() == 2 && keys[0]["kid"] == new_kid.as_str() && keys[0]["expires_at"].is_null(), "{detail}");
    ensure!(
        keys[1]["kid"] == a_kid.as_str() && keys[1]["expires_at"] == rotated.json["previous_valid_until"],
        "{detail}"
    );
    let jwks = api.raw("GET", "/v1/tenants/acme/jwks.json", None, "").await?.expect(200)?.json;
    ensure!(jwks["keys"].as_array().map(Vec::len) == Some(3), "the rotation's keys are all in the set: {jwks}");
    api.event("acme", json!({"id": "evt_2", "type": "invoice.paid", "payload": {"amount": 2}})).await?.expect(202)?;
    let got = rx.wait_for(4, Duration::from_secs(10)).await?;

    let cases = [
        ("a", arrived(&got, "/a", "evt_1")?, None),
        ("a", arrived(&got, "/a", "evt_2")?, None),
        ("b", arrived(&got, "/b", "evt_1")?, Some(b_whsec.as_str())),
        ("b", arrived(&got, "/b", "evt_2")?, Some(b_whsec.as_str())),
    ];
    for (_, r, whsec) in &cases {
        let sig = r.header("webhook-signature").context("signature")?;
        ensure!(sig.starts_with("v1,") == whsec.is_some(), "v1 first when it signs v1: {sig}");
    }
    let verified = verify_in_python(gw.dir.path(), &jwks, &cases).await?;
    let results = verified["results"].as_array().context("results")?;
    let b_kid = b_public.kid();
    let expect = [
        (vec![a_kid.as_str()], 1, Value::Null),
        (
            if new_kid < a_kid {
                vec![new_kid.as_str(), a_kid.as_str()]
            } else {
                vec![a_kid.as_str(), new_kid.as_str()]
            },
            2,
            Value::Null,
        ),
        (vec![b_kid.as_str()], 1, json!(true)),
        (vec![b_kid.as_str()], 1, json!(true)),
    ];
    for (got, (kids, entries, v1)) in results.iter().zip(expect) {
        ensure!(
            got["kids"] == json!(kids) && got["v1a_entries"] == entries && got["standardwebhooks_v1"] == v1,
            "{got}"
        );
    }
    // Herald's own check agrees with the public key the endpoint shows.
    let r = cases[3].1;
    let ts: i64 = r.header("webhook-timestamp").context("ts")?.parse()?;
    ensure!(gateway::sign::v1a::verify(&b_public, "evt_2", ts, &r.body, r.header("webhook-signature").unwrap_or("")));

    // Stored sealed: the supplied key is nowhere in clear in the node's files.
    if backend == Backend::Sqlite {
        let seed_b64 = STANDARD.encode([7u8; 32]);
        for entry in std::fs::read_dir(gw.dir.path())? {
            let path = entry?.path();
            if path.is_file() && !path.ends_with("signed.json") {
                let bytes = std::fs::read(&path)?;
                let found = |needle: &str| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
                ensure!(!found(&seed_b64) && !found(&supplied), "{} holds the key in clear", path.display());
            }
        }
    }
    Ok(())
}

fn message(r: &tests::Reply) -> &str {
    r.json["error"]["message"].as_str().unwrap_or("")
}

async fn bad_keys_are_refused_and_write_nothing(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let seed = STANDARD.encode([1u8; 32]);
    let bad = [
        (json!({"signing_key": "whsk_not base64!"}), "signing_key:"),
        (json!({"signing_key": format!("whsk_{}", STANDARD.encode([1u8; 31]))}), "signing_key:"),
        (json!({"signing_key": format!("whsk_{}", STANDARD.encode([1u8; 48]))}), "signing_key:"),
        (json!({"signing_key": format!("whsk_{}", STANDARD.encode([1u8; 64]))}), "signing_key:"),
        (json!({"signing_key": format!("whsec_{seed}")}), "signing_key:"),
        (json!({"signing_key": format!("whsk_{seed}"), "signatures": ["v1"]}), "signing_key:"),
        (json!({"secret": format!("whsec_{seed}"), "signatures": ["v1a"]}), "secret:"),
        (json!({"secret": format!("whsk_{seed}")}), "secret:"),
        (json!({"signatures": []}), "signatures:"),
        // Not a scheme: refused as malformed (400), as every unknown enum value is.
        (json!({"signatures": ["v2"]}), "signatures[0]"),
    ];
    let status = |field: &str| if field.ends_with(']') { 400 } else { 422 };
    let endpoints = "/v1/tenants/acme/endpoints";
    for (extra, field) in &bad {
        let mut body = json!({"url": "http://127.0.0.1:9/x"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = api.post(endpoints, ADMIN_TOKEN, body).await?;
        ensure!(r.status == status(field) && message(&r).starts_with(field), "{extra}: {} {}", r.status, r.text);
    }
    ensure!(api.get(endpoints, ADMIN_TOKEN).await?.json["data"] == json!([]), "nothing was created");

    // On an existing endpoint: a patch or rotation refused changes nothing.
    let ep = api.endpoint("acme", json!({"url": "http://127.0.0.1:9/x"})).await?;
    let path = format!("{endpoints}/{}", ep["id"].as_str().context("id")?);
    let before = api.get(&format!("{path}/secret"), ADMIN_TOKEN).await?.expect(200)?.json;
    let before_ep = api.get(&path, ADMIN_TOKEN).await?.json["updated_at"].clone();
    for (extra, field) in &bad {
        let r = api.call("PATCH", &path, ADMIN_TOKEN, Some(extra.clone())).await?;
        ensure!(r.status == status(field) && message(&r).starts_with(field), "PATCH {extra}: {} {}", r.status, r.text);
    }
    let rotations = [
        (json!({"signing_key": format!("whsk_{}", STANDARD.encode([1u8; 31]))}), "signing_key:"),
        (json!({"signature": "v1a"}), "signature:"),
        (json!({"secret": "whsec_short"}), "secret:"),
        (json!({"secret": format!("whsec_{seed}"), "signature": "v1a"}), "signature:"),
    ];
    for (body, field) in rotations {
        let r = api.post(&format!("{path}/rotate-secret"), ADMIN_TOKEN, body.clone()).await?;
        ensure!(r.status == 422 && message(&r).starts_with(field), "rotate {body}: {} {}", r.status, r.text);
    }
    ensure!(api.get(&format!("{path}/secret"), ADMIN_TOKEN).await?.json == before, "the secrets are as they were");
    let after = api.get(&path, ADMIN_TOKEN).await?.json;
    ensure!(after["updated_at"] == before_ep && after["signatures"] == json!(["v1"]), "{after}");
    Ok(())
}

/// A sign plugin replaces the built-in signatures, `v1a` as `v1`: the endpoint signs v1a,
/// yet what arrives carries the plugin's header and no `webhook-signature`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_plugin_replaces_v1a_too() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    let bytes = crate::plugins::plugin_bytes("sign_hmac_hex");
    crate::plugins::upload(&gw, "acme", "hexsig", bytes, ADMIN_TOKEN).await?.expect(200)?;
    let rx = FakeReceiver::start().await?;
    let body = json!({"url": rx.url(), "signatures": ["v1", "v1a"], "plugins": {"sign": "hexsig"}});
    gw.api.endpoint("acme", body).await?;
    gw.api.event("acme", json!({"id": "evt_p", "type": "invoice.paid", "payload": {}})).await?.expect(202)?;
    let got = rx.wait_for(1, Duration::from_secs(10)).await?;
    ensure!(got[0].header("x-herald-signature").is_some(), "{:?}", got[0].headers);
    ensure!(got[0].header("webhook-signature").is_none(), "{:?}", got[0].headers);
    Ok(())
}
