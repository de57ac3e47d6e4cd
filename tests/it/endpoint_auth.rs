//! How an endpoint's requests authenticate and leave the node (issue 32): OAuth2 client
//! credentials against a local token server, the egress proxy through a local CONNECT
//! proxy, TLS client certificates against a local rustls server that requires them. Every
//! server is real, on 127.0.0.1.

use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, Api, Backend, FakeReceiver, HeraldProcess, SEAL_KEY, TestGateway, herald_binary};
use tokio::net::TcpListener;

tests::backends!(
    a_token_is_fetched_once_per_lifetime_and_never_shown,
    an_expired_token_is_refreshed_once,
    a_401_refreshes_the_token_once_then_holds_the_endpoint,
    a_token_server_that_is_down_is_auth_token_and_pauses_the_endpoint,
    a_client_certificate_delivers_and_a_wrong_one_pauses,
);

/// A token request as the server got it: its `authorization` header and form body.
type TokenRequest = (Option<String>, String);

/// An OAuth2 token server: `tok-<n>` for the n-th request, living `expires_in` seconds,
/// unless `fail_with` holds a status.
#[derive(Clone, Default)]
struct TokenServer {
    addr: Option<std::net::SocketAddr>,
    fetches: Arc<AtomicUsize>,
    expires_in: Arc<AtomicU64>,
    fail_with: Arc<AtomicU16>,
    /// Each request: its `authorization` header and form body.
    requests: Arc<Mutex<Vec<TokenRequest>>>,
}

impl TokenServer {
    async fn start(expires_in: u64) -> anyhow::Result<TokenServer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let me = TokenServer { addr: Some(listener.local_addr()?), ..Default::default() };
        me.expires_in.store(expires_in, Ordering::SeqCst);
        let server = me.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let server = server.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let server = server.clone();
                        async move { server.handle(req).await }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(me)
    }

    fn url(&self) -> String {
        format!("http://{}/oauth/token", self.addr.unwrap())
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    async fn handle(&self, req: http::Request<Incoming>) -> Result<http::Response<Full<Bytes>>, hyper::Error> {
        let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
        let body = String::from_utf8_lossy(&req.into_body().collect().await?.to_bytes()).into_owned();
        self.requests.lock().unwrap().push((auth, body));
        let n = self.fetches.fetch_add(1, Ordering::SeqCst) + 1;
        let (status, body) = match self.fail_with.load(Ordering::SeqCst) {
            0 => {
                let expires_in = self.expires_in.load(Ordering::SeqCst);
                (200, json!({"access_token": format!("tok-{n}"), "token_type": "Bearer", "expires_in": expires_in}))
            }
            s => (s, json!({"error": "invalid_client", "error_description": "secret s3cr3t-value is wrong"})),
        };
        Ok(http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap())
    }
}

const SECRET: &str = "s3cr3t-value";

async fn setup(api: &Api, rx: &FakeReceiver, token_url: &str, extra: Value) -> anyhow::Result<String> {
    api.tenant("acme").await?;
    let mut body = json!({
        "url": rx.url(), "rate_per_sec": 1000, "burst": 100, "max_in_flight": 8,
        "retry": {"base": "100ms", "jitter": "none"},
        "oauth2": {"token_url": token_url, "client_id": "herald client", "client_secret": SECRET,
                   "scopes": ["webhooks.write", "b"], "audience": "https://rx.example"},
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let ep = api.endpoint("acme", body).await?;
    Ok(ep["id"].as_str().unwrap().to_string())
}

async fn post_events(api: &Api, from: usize, n: usize) -> anyhow::Result<()> {
    for i in from..from + n {
        api.event("acme", json!({"id": format!("evt_{i}"), "type": "t", "payload": {"i": i}})).await?.expect(202)?;
    }
    Ok(())
}

fn bearer(r: &tests::Received) -> String {
    r.header("authorization").unwrap_or("").to_string()
}

async fn delivery_of(gw: &TestGateway, event: &str) -> anyhow::Result<Value> {
    let r = gw.api.get(&format!("/v1/tenants/acme/events/{event}/deliveries"), ADMIN_TOKEN).await?;
    let id = r.json["data"][0]["id"].as_str().unwrap_or_default().to_string();
    Ok(gw.api.get(&format!("/v1/tenants/acme/deliveries/{id}"), ADMIN_TOKEN).await?.json)
}

async fn endpoint(api: &Api, id: &str) -> anyhow::Result<Value> {
    Ok(api.get(&format!("/v1/tenants/acme/endpoints/{id}"), ADMIN_TOKEN).await?.expect(200)?.json)
}

async fn a_token_is_fetched_once_per_lifetime_and_never_shown(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    let ts = TokenServer::start(3600).await?;
    let id = setup(&gw.api, &rx, &ts.url(), json!({})).await?;
    post_events(&gw.api, 0, 40).await?;
    let got = rx.wait_for(40, Duration::from_secs(20)).await?;
    assert!(got.iter().all(|r| bearer(r) == "Bearer tok-1"), "{:?}", got.iter().map(bearer).collect::<Vec<_>>());
    assert_eq!(ts.fetches(), 1, "40 deliveries, 8 at a time, one token");

    // The token request: client credentials, the scopes and audience, Basic auth with the
    // form-encoded id and secret (RFC 6749 2.3.1).
    let (auth, form) = ts.requests.lock().unwrap()[0].clone();
    let form: std::collections::HashMap<String, String> = url_form(&form);
    assert_eq!(form.get("grant_type").map(String::as_str), Some("client_credentials"));
    assert_eq!(form.get("scope").map(String::as_str), Some("webhooks.write b"));
    assert_eq!(form.get("audience").map(String::as_str), Some("https://rx.example"));
    assert!(!form.contains_key("client_secret"), "basic: the secret is not in the body");
    let basic = auth.unwrap().strip_prefix("Basic ").unwrap().to_string();
    let pair = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(basic)?)?;
    assert_eq!(pair, format!("herald+client:{SECRET}"));

    // The secret is never shown: not by the endpoint's views, nor in an attempt, whose
    // `authorization` as sent is redacted.
    let ep = endpoint(&gw.api, &id).await?;
    assert_eq!(ep["oauth2"]["client_secret_set"], true, "{ep}");
    assert_eq!(ep["token"]["state"], "valid", "{ep}");
    assert_eq!(ep["token"]["fetches"], 1, "{ep}");
    let list = gw.api.get("/v1/tenants/acme/endpoints?health=true", ADMIN_TOKEN).await?.text;
    let d = tests::eventually("evt_0 delivered", Duration::from_secs(5), || async {
        let d = delivery_of(&gw, "evt_0").await?;
        Ok(if d["state"] == "delivered" { Ok(d) } else { Err(d.to_string()) })
    })
    .await?;
    let sent = &d["attempt_history"][0]["request"]["headers"];
    let authz = sent.as_array().unwrap().iter().find(|h| h[0] == "authorization").unwrap();
    assert_eq!(authz[1], "Bearer [redacted]", "{sent}");
    for (what, text) in [("endpoint", ep.to_string()), ("list", list), ("delivery", d.to_string())] {
        assert!(!text.contains(SECRET), "{what} shows the secret: {text}");
        assert!(!text.contains("tok-1"), "{what} shows the token: {text}");
    }

    // client_secret_post: a new configuration is a new token, the secret in the form.
    gw.api
        .call(
            "PATCH",
            &format!("/v1/tenants/acme/endpoints/{id}"),
            ADMIN_TOKEN,
            Some(json!({"oauth2": {"client_auth": "client_secret_post"}})),
        )
        .await?
        .expect(200)?;
    post_events(&gw.api, 40, 1).await?;
    let got = rx.wait_for(41, Duration::from_secs(10)).await?;
    assert_eq!(bearer(&got[40]), "Bearer tok-2");
    let (auth, form) = ts.requests.lock().unwrap()[1].clone();
    assert_eq!(auth, None);
    let form = url_form(&form);
    assert_eq!(form.get("client_secret").map(String::as_str), Some(SECRET));
    assert_eq!(form.get("client_id").map(String::as_str), Some("herald client"));
    Ok(())
}

fn url_form(body: &str) -> std::collections::HashMap<String, String> {
    body.split('&').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (decode(k), decode(v))).collect()
}

fn decode(s: &str) -> String {
    let s = s.replace('+', " ");
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() + 1 {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// The `client_id:client_secret` of the n-th token request's Basic authorization.
fn basic_pair(ts: &TokenServer, n: usize) -> anyhow::Result<String> {
    let (auth, _) = ts.requests.lock().unwrap()[n].clone();
    let basic = auth.context("no authorization")?.strip_prefix("Basic ").context("not Basic")?.to_string();
    Ok(String::from_utf8(base64::engine::general_purpose::STANDARD.decode(basic)?)?)
}

/// On a node with `[secrets] key` the client secret is sealed at rest: the token request
/// carries it, while the store (every file of the SQLite database) and the API never hold
/// it in clear. Under another operator key it does not open: the endpoint is held saying
/// why, and nothing is sent until the secret is written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_secret_is_sealed_at_rest() -> anyhow::Result<()> {
    let bin = herald_binary()?;
    let dir = tempfile::tempdir()?;
    let rx = FakeReceiver::start().await?;
    let ts = TokenServer::start(3600).await?;
    let node = HeraldProcess::start(&bin, dir.path(), &[("HERALD_SECRETS_KEY", SEAL_KEY)]).await?;
    let id = setup(&node.api, &rx, &ts.url(), json!({})).await?;
    post_events(&node.api, 0, 3).await?;
    rx.wait_for(3, Duration::from_secs(20)).await?;
    assert_eq!(basic_pair(&ts, 0)?, "herald+client:s3cr3t-value");
    let shown = endpoint(&node.api, &id).await?;
    assert_eq!(shown["oauth2"]["client_secret_set"], true, "{shown}");
    assert!(!shown.to_string().contains(SECRET), "{shown}");
    drop(node);
    let stored = tests::stored_bytes(dir.path())?;
    assert!(stored.windows(3).any(|w| w == b"v1:"), "no sealed value stored");
    assert!(!stored.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "the secret is stored in clear");

    // Another operator key: held with the reason, no token fetched, nothing sent.
    let other_key = [("HERALD_SECRETS_KEY", "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=")];
    let node = HeraldProcess::start(&bin, dir.path(), &other_key).await?;
    post_events(&node.api, 3, 1).await?;
    let path = format!("/v1/tenants/acme/endpoints/{id}");
    let held = node.api.wait_for(&path, Duration::from_secs(20), |v| v["state"] == "paused").await?;
    let reason = held["state_reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("oauth2: the client secret sealed under key") && reason.ends_with("write it again"),
        "{reason}"
    );
    assert_eq!((rx.count(), ts.fetches()), (3, 1), "nothing sent under a key that does not open the secret");
    let shown = endpoint(&node.api, &id).await?;
    assert_eq!(shown["token"]["state"], "failing", "{shown}");

    // Written again under this key, and enabled: the held delivery goes.
    let patch = json!({"oauth2": {"client_secret": SECRET}});
    node.api.call("PATCH", &path, ADMIN_TOKEN, Some(patch)).await?.expect(200)?;
    node.api.post(&format!("{path}/enable"), ADMIN_TOKEN, json!({})).await?.expect(200)?;
    rx.wait_for(4, Duration::from_secs(20)).await?;
    assert_eq!(basic_pair(&ts, 1)?, "herald+client:s3cr3t-value");
    Ok(())
}

/// A client secret stored in clear (before secrets were sealed, or by a node without
/// `[secrets] key`) is sealed at the endpoint's next write on a node with a key: the row then
/// holds no clear secret, and the token request still carries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_secret_stored_in_clear_is_sealed_at_the_next_write() -> anyhow::Result<()> {
    let gw = TestGateway::start_on(Backend::Postgres, &[("HERALD_SECRETS_KEY", SEAL_KEY)]).await?;
    let rx = FakeReceiver::start().await?;
    let ts = TokenServer::start(3600).await?;
    let id = setup(&gw.api, &rx, &ts.url(), json!({})).await?;
    let url = gw.schema().context("a Postgres node")?.url.clone();
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&url).await?;
    let row = || sqlx::query_scalar::<_, String>("SELECT spec FROM endpoints WHERE id = $1").bind(&id).fetch_one(&pool);
    let sealed: Value = serde_json::from_str(&row().await?)?;
    assert_eq!(sealed["oauth2"]["client_secret_sealed"], true, "{sealed}");
    assert!(sealed["oauth2"]["client_secret"].as_str().unwrap_or_default().starts_with("v1:"), "{sealed}");

    // The row as a node without a key writes it.
    let mut legacy = sealed.clone();
    legacy["oauth2"]["client_secret"] = json!(SECRET);
    legacy["oauth2"].as_object_mut().context("oauth2")?.remove("client_secret_sealed");
    sqlx::query("UPDATE endpoints SET spec = $1 WHERE id = $2")
        .bind(legacy.to_string())
        .bind(&id)
        .execute(&pool)
        .await?;

    let path = format!("/v1/tenants/acme/endpoints/{id}");
    gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"rate_per_sec": 900}))).await?.expect(200)?;
    let resealed = row().await?;
    assert!(!resealed.contains(SECRET), "{resealed}");
    let resealed: Value = serde_json::from_str(&resealed)?;
    assert_eq!(resealed["oauth2"]["client_secret_sealed"], true, "{resealed}");
    assert_eq!(resealed["rate_per_sec"].as_f64(), Some(900.0), "{resealed}");
    post_events(&gw.api, 0, 2).await?;
    rx.wait_for(2, Duration::from_secs(20)).await?;
    assert_eq!(basic_pair(&ts, 0)?, "herald+client:s3cr3t-value");
    Ok(())
}

async fn an_expired_token_is_refreshed_once(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    // One second: refreshed 100 ms early.
    let ts = TokenServer::start(1).await?;
    let id = setup(&gw.api, &rx, &ts.url(), json!({})).await?;
    post_events(&gw.api, 0, 8).await?;
    rx.wait_for(8, Duration::from_secs(10)).await?;
    assert_eq!(ts.fetches(), 1);
    ts.expires_in.store(3600, Ordering::SeqCst);
    tests::eventually("the token going stale", Duration::from_secs(5), || async {
        let ep = endpoint(&gw.api, &id).await?;
        Ok(if ep["token"]["state"] == "none" { Ok(()) } else { Err(ep["token"].to_string()) })
    })
    .await?;
    // Eight deliveries at once after the expiry: one of them fetches, the rest wait for it.
    post_events(&gw.api, 8, 8).await?;
    let got = rx.wait_for(16, Duration::from_secs(10)).await?;
    assert!(got[8..].iter().all(|r| bearer(r) == "Bearer tok-2"), "{:?}", got.iter().map(bearer).collect::<Vec<_>>());
    assert_eq!(ts.fetches(), 2, "one refresh after the expiry");
    Ok(())
}

async fn a_401_refreshes_the_token_once_then_holds_the_endpoint(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    let ts = TokenServer::start(3600).await?;
    let id = setup(&gw.api, &rx, &ts.url(), json!({"max_in_flight": 1})).await?;
    // The receiver refuses the first token once: one refresh, and the same attempt delivers.
    rx.script([Answer::status(401)]);
    post_events(&gw.api, 0, 1).await?;
    let got = rx.wait_for(2, Duration::from_secs(10)).await?;
    assert_eq!([bearer(&got[0]), bearer(&got[1])], ["Bearer tok-1", "Bearer tok-2"]);
    let d = tests::eventually("evt_0 delivered", Duration::from_secs(5), || async {
        let d = delivery_of(&gw, "evt_0").await?;
        Ok(if d["state"] == "delivered" { Ok(d) } else { Err(d.to_string()) })
    })
    .await?;
    assert_eq!(d["attempts"], 1, "{d}");
    assert_eq!(ts.fetches(), 2);

    // A receiver that refuses every token: one refresh, then the 401 rule (held for a human).
    rx.set_default(Answer::status(401));
    post_events(&gw.api, 1, 1).await?;
    tests::eventually("the endpoint held", Duration::from_secs(10), || async {
        let ep = endpoint(&gw.api, &id).await?;
        Ok(if ep["state"] == "paused" { Ok(()) } else { Err(ep.to_string()) })
    })
    .await?;
    let ep = endpoint(&gw.api, &id).await?;
    assert_eq!(ep["state_reason"], "credentials: HTTP 401", "{ep}");
    assert_eq!(ep["paused_until"], Value::Null, "held until re-enabled: {ep}");
    let got = rx.received();
    assert_eq!(got.len(), 4, "401 with tok-2, 401 with tok-3");
    assert_eq!([bearer(&got[2]), bearer(&got[3])], ["Bearer tok-2", "Bearer tok-3"]);
    assert_eq!(ts.fetches(), 3, "one refresh per refusal");
    Ok(())
}

async fn a_token_server_that_is_down_is_auth_token_and_pauses_the_endpoint(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    // A port nothing listens on.
    let down = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/token", down.local_addr()?);
    drop(down);
    let id = setup(&gw.api, &rx, &url, json!({})).await?;
    post_events(&gw.api, 0, 3).await?;
    let d = tests::eventually("evt_0 held", Duration::from_secs(10), || async {
        let d = delivery_of(&gw, "evt_0").await?;
        Ok(if d["state"] == "paused" { Ok(d) } else { Err(d.to_string()) })
    })
    .await?;
    let error = d["attempt_history"][0]["error"].as_str().unwrap_or_default().to_string();
    assert!(error.starts_with("auth:token: connection_refused"), "{d}");
    let ep = endpoint(&gw.api, &id).await?;
    assert_eq!(ep["state"], "paused", "{ep}");
    assert!(ep["state_reason"].as_str().unwrap().starts_with("auth:token: "), "{ep}");
    assert_eq!(ep["token"]["state"], "failing", "{ep}");
    assert!(ep["token"]["last_error"].as_str().unwrap().starts_with("connection_refused"), "{ep}");
    rx.stays_at(0, Duration::from_millis(300)).await?;

    // A token server that refuses the client: its error code, never its description
    // (which here quotes the secret).
    let ts = TokenServer::start(3600).await?;
    ts.fail_with.store(401, Ordering::SeqCst);
    let path = format!("/v1/tenants/acme/endpoints/{id}");
    gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"oauth2": {"token_url": ts.url()}}))).await?.expect(200)?;
    gw.api.post(&format!("{path}/enable"), ADMIN_TOKEN, json!({})).await?.expect(200)?;
    let ep = tests::eventually("held again", Duration::from_secs(10), || async {
        let ep = endpoint(&gw.api, &id).await?;
        Ok(if ep["state"] == "paused" { Ok(ep) } else { Err(ep.to_string()) })
    })
    .await?;
    assert_eq!(ep["state_reason"], "auth:token: HTTP 401 from the token endpoint (invalid_client)", "{ep}");
    assert!(!ep.to_string().contains(SECRET));
    assert_eq!(rx.count(), 0);
    Ok(())
}

/// Bad OAuth2 settings are refused naming the field; nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_oauth2_settings_are_refused_naming_the_field() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[("HERALD_DELIVERY_ALLOW_PRIVATE_DESTINATIONS", "false")]).await?;
    gw.api.tenant("acme").await?;
    let good = json!({"token_url": "https://auth.example/token", "client_id": "c", "client_secret": "s"});
    let with = |k: &str, v: Value| {
        let mut o = good.clone();
        o[k] = v;
        o
    };
    let without = |k: &str| {
        let mut o = good.clone();
        o.as_object_mut().unwrap().remove(k);
        o
    };
    let cases = [
        (without("token_url"), "oauth2.token_url"),
        (without("client_id"), "oauth2.client_id"),
        (without("client_secret"), "oauth2.client_secret"),
        (with("token_url", json!("ftp://auth.example/t")), "oauth2.token_url"),
        (with("token_url", json!("http://10.0.0.1/token")), "oauth2.token_url"),
        (with("token_url", json!("https://u:p@auth.example/t")), "oauth2.token_url"),
        (with("client_secret", json!("")), "oauth2.client_secret"),
        (with("client_id", json!("a\u{7}b")), "oauth2.client_id"),
        (with("scopes", json!(["two words"])), "oauth2.scopes"),
        (with("scopes", json!([""])), "oauth2.scopes"),
        (with("scopes", json!(vec!["s"; 33])), "oauth2.scopes"),
        (with("audience", json!("x".repeat(1025))), "oauth2.audience"),
    ];
    // What does not decode is the API's 400, naming the field too.
    let undecodable =
        [(with("client_auth", json!("private_key_jwt")), "oauth2.client_auth"), (with("extra", json!(1)), "extra")];
    for (oauth2, field) in cases.into_iter().chain(undecodable) {
        let body = json!({"url": "https://rx.example/h", "oauth2": oauth2});
        let r = gw.api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, body).await?;
        let status = if field.contains("client_auth") || field == "extra" { 400 } else { 422 };
        assert_eq!(r.status, status, "{oauth2}: {}", r.text);
        assert!(
            r.json["error"]["message"].as_str().unwrap().contains(field),
            "{oauth2} should name {field}: {}",
            r.text
        );
        assert!(!r.text.contains("\"s\""), "{}", r.text);
    }
    let body = json!({"url": "https://rx.example/h", "oauth2": good, "headers": {"Authorization": "Bearer x"}});
    let r = gw.api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, body).await?;
    assert_eq!(r.status, 422, "{}", r.text);
    assert!(r.text.contains("headers.authorization"), "{}", r.text);
    let listed = gw.api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?;
    assert_eq!(listed.json["data"].as_array().unwrap().len(), 0, "{}", listed.text);

    // Removed with null.
    let ep = gw.api.endpoint("acme", json!({"url": "https://rx.example/h", "oauth2": good})).await?;
    let path = format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().unwrap());
    let r = gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"oauth2": null}))).await?.expect(200)?;
    assert_eq!(r.json["oauth2"], Value::Null, "{}", r.text);
    Ok(())
}

/// A local HTTP CONNECT proxy: checks `Proxy-Authorization` when it has credentials,
/// records each tunnel's target, and counts the requests it carries (`POST /hook`).
#[derive(Clone)]
struct ConnectProxy {
    addr: std::net::SocketAddr,
    credentials: Option<String>,
    tunnels: Arc<Mutex<Vec<String>>>,
    refused: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl ConnectProxy {
    async fn start(credentials: Option<&str>) -> anyhow::Result<ConnectProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let me = ConnectProxy {
            addr: listener.local_addr()?,
            credentials: credentials.map(|c| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(c))),
            tunnels: Arc::default(),
            refused: Arc::default(),
            requests: Arc::default(),
        };
        let proxy = me.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let proxy = proxy.clone();
                tokio::spawn(async move {
                    let _ = proxy.serve(stream).await;
                });
            }
        });
        Ok(me)
    }

    fn url(&self, userinfo: &str) -> String {
        format!("http://{userinfo}{}", self.addr)
    }

    async fn serve(&self, mut client: tokio::net::TcpStream) -> anyhow::Result<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            anyhow::ensure!(client.read(&mut byte).await? == 1, "closed");
            head.push(byte[0]);
        }
        let head = String::from_utf8(head)?;
        let target = head.split(' ').nth(1).unwrap_or_default().to_string();
        let auth = head
            .lines()
            .find_map(|l| l.strip_prefix("Proxy-Authorization: ").or_else(|| l.strip_prefix("proxy-authorization: ")));
        if !head.starts_with("CONNECT ") || self.credentials.as_deref().is_some_and(|c| Some(c) != auth) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            client.write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n").await?;
            return Ok(());
        }
        self.tunnels.lock().unwrap().push(target.clone());
        let mut upstream = tokio::net::TcpStream::connect(&target).await?;
        client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
        let (mut cr, mut cw) = client.into_split();
        let (mut ur, mut uw) = upstream.split();
        let requests = self.requests.clone();
        let up = async {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = cr.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>(());
                }
                let seen = buf[..n].windows(10).filter(|w| w == b"POST /hook").count();
                requests.fetch_add(seen, Ordering::SeqCst);
                uw.write_all(&buf[..n]).await?;
            }
        };
        let down = tokio::io::copy(&mut ur, &mut cw);
        let _ = tokio::join!(up, down);
        Ok(())
    }
}

async fn proxied_events(gw: &TestGateway, rx: &FakeReceiver, from: usize, n: usize) -> anyhow::Result<()> {
    post_events(&gw.api, from, n).await?;
    rx.wait_for(from + n, Duration::from_secs(10)).await?;
    Ok(())
}

/// Every request goes through the node's proxy, to the address Herald resolved and
/// checked; `no_proxy` and an endpoint's `"none"` bypass it; an endpoint's own proxy is
/// used instead; wrong credentials are refused by the proxy and nothing arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_go_through_the_egress_proxy() -> anyhow::Result<()> {
    let proxy = ConnectProxy::start(Some("herald:p@ss w0rd")).await?;
    let url = proxy.url("herald:p%40ss%20w0rd@");
    let gw = TestGateway::start_with(&[("HERALD_DELIVERY_PROXY", url.as_str())]).await?;
    let rx = FakeReceiver::start().await?;
    gw.api.tenant("acme").await?;
    // `localhost`: the proxy is asked for the address Herald resolved, not the name.
    let hook = format!("http://localhost:{}/hook", rx.addr.port());
    let ep = gw.api.endpoint("acme", json!({"url": hook, "rate_per_sec": 1000, "max_in_flight": 4})).await?;
    let path = format!("/v1/tenants/acme/endpoints/{}", ep["id"].as_str().unwrap());
    proxied_events(&gw, &rx, 0, 20).await?;
    assert_eq!(proxy.requests.load(Ordering::SeqCst), 20, "every request went through the proxy");
    let tunnels = proxy.tunnels.lock().unwrap().clone();
    assert!(!tunnels.is_empty() && tunnels.len() <= 4, "{tunnels:?}");
    let target = format!("127.0.0.1:{}", rx.addr.port());
    assert!(tunnels.iter().all(|t| *t == target || *t == format!("[::1]:{}", rx.addr.port())), "{tunnels:?}");

    // The endpoint's own "none": direct.
    gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"proxy": "none"}))).await?.expect(200)?;
    proxied_events(&gw, &rx, 20, 5).await?;
    assert_eq!(proxy.requests.load(Ordering::SeqCst), 20, "none bypasses the proxy");

    // Its own proxy (the password never shown), then wrong credentials: refused, nothing sent.
    let own = ConnectProxy::start(None).await?;
    let r =
        gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"proxy": own.url("u:secretpw@")}))).await?.expect(200)?;
    assert_eq!(r.json["proxy"], format!("http://u:***@{}", own.addr), "{}", r.text);
    assert!(!gw.api.get(&path, ADMIN_TOKEN).await?.text.contains("secretpw"));
    proxied_events(&gw, &rx, 25, 3).await?;
    assert_eq!(own.requests.load(Ordering::SeqCst), 3);
    let wrong = proxy.url("herald:wrong@");
    gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"proxy": wrong}))).await?.expect(200)?;
    post_events(&gw.api, 28, 1).await?;
    let d = tests::eventually("a refused tunnel recorded", Duration::from_secs(10), || async {
        let d = delivery_of(&gw, "evt_28").await?;
        Ok(if d["attempts"].as_u64() >= Some(1) { Ok(d) } else { Err(d.to_string()) })
    })
    .await?;
    let error = d["attempt_history"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("answered 407"), "{d}");
    assert!(!d.to_string().contains("wrong"), "no proxy password in the attempt: {d}");
    assert!(proxy.refused.load(Ordering::SeqCst) >= 1);
    assert_eq!(rx.count(), 28);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_proxy_bypasses_the_node_proxy() -> anyhow::Result<()> {
    let proxy = ConnectProxy::start(None).await?;
    let url = proxy.url("");
    for no_proxy in ["127.0.0.0/8", "localhost", "*"] {
        let gw =
            TestGateway::start_with(&[("HERALD_DELIVERY_PROXY", &url), ("HERALD_DELIVERY_NO_PROXY", no_proxy)]).await?;
        let rx = FakeReceiver::start().await?;
        gw.api.tenant("acme").await?;
        let hook = format!("http://localhost:{}/hook", rx.addr.port());
        gw.api.endpoint("acme", json!({"url": hook, "rate_per_sec": 1000})).await?;
        proxied_events(&gw, &rx, 0, 5).await?;
        assert_eq!(proxy.requests.load(Ordering::SeqCst), 0, "{no_proxy}");
    }
    Ok(())
}

/// Bad proxy settings: the endpoint's is a 422 naming `proxy`; the node's refuses to start
/// naming the key; neither prints the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_proxy_settings_are_refused_naming_the_field() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    for bad in ["https://proxy:3128", "socks5://proxy:1080", "http://proxy:3128/path", "proxy:3128", "http://"] {
        let body = json!({"url": "https://rx.example/h", "proxy": bad});
        let r = gw.api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, body).await?;
        assert_eq!(r.status, 422, "{bad}: {}", r.text);
        assert!(r.json["error"]["message"].as_str().unwrap().starts_with("proxy: "), "{bad}: {}", r.text);
    }
    for (key, value) in [
        ("HERALD_DELIVERY_PROXY", "https://u:topsecret@proxy:3128"),
        ("HERALD_DELIVERY_NO_PROXY", "10.0.0.0/99"),
        ("HERALD_DELIVERY_NO_PROXY", "a b"),
    ] {
        let dir = tempfile::tempdir()?;
        let mut env = tests::base_env(dir.path());
        env.push((key.to_string(), value.to_string()));
        let err = gateway::config::Config::load(None, env).unwrap_err().to_string();
        let name = key.trim_start_matches("HERALD_DELIVERY_").to_ascii_lowercase();
        assert!(err.contains(&format!("delivery.{name}")), "{err}");
        assert!(!err.contains("topsecret"), "{err}");
    }
    let dir = tempfile::tempdir()?;
    let mut env = tests::base_env(dir.path());
    env.push(("HERALD_DELIVERY_PROXY".into(), "http://u:topsecret@proxy:3128".into()));
    let config = gateway::config::Config::load(None, env)?;
    assert!(!format!("{config:?}").contains("topsecret"));
    Ok(())
}

/// A test PKI: a CA and certificates it signs (rcgen).
struct Pki {
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> anyhow::Result<Pki> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "herald test CA");
        Ok(Pki { ca: params.self_signed(&ca_key)?, ca_key })
    }

    /// A certificate for `name` and its key, as PEM.
    fn issue(&self, name: &str, expired: bool) -> anyhow::Result<(String, String)> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()])?;
        if expired {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        }
        let cert = params.signed_by(&key, &self.ca, &self.ca_key)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// A receiver on TLS that requires a client certificate from `clients`' CA; counts the
/// requests that got through.
async fn mtls_receiver(server: &Pki, clients: &Pki) -> anyhow::Result<(u16, Arc<AtomicUsize>)> {
    use rustls_pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let (cert, key) = server.issue("localhost", false)?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(clients.ca.der().clone())?;
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build()?;
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![rustls_pki_types::CertificateDer::from_pem_slice(cert.as_bytes())?],
            rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())?,
        )?;
    serve_tls(config).await
}

/// A receiver on TLS presenting `cert` (PEM, with its `key`), asking for no client
/// certificate; counts the requests that got through.
async fn tls_receiver(cert: &str, key: &str) -> anyhow::Result<(u16, Arc<AtomicUsize>)> {
    use rustls_pki_types::pem::PemObject;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![rustls_pki_types::CertificateDer::from_pem_slice(cert.as_bytes())?],
            rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())?,
        )?;
    serve_tls(config).await
}

/// Serves HTTP on TLS with `config` on a free port; counts the requests that got through.
async fn serve_tls(config: rustls::ServerConfig) -> anyhow::Result<(u16, Arc<AtomicUsize>)> {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, counted) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else { return };
                let svc = hyper::service::service_fn(move |_req: http::Request<Incoming>| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async { Ok::<_, hyper::Error>(http::Response::new(Full::new(Bytes::new()))) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Ok((port, count))
}

/// A valid client certificate delivers through a receiver that requires one (its private
/// CA trusted through `ca_bundle`); the key is stored sealed and never shown; a
/// certificate the receiver does not accept holds the endpoint under the TLS rule.
async fn a_client_certificate_delivers_and_a_wrong_one_pauses(b: Backend) -> anyhow::Result<()> {
    let (server_ca, client_ca, other_ca) = (Pki::new()?, Pki::new()?, Pki::new()?);
    let (port, served) = mtls_receiver(&server_ca, &client_ca).await?;
    let gw = TestGateway::start_on(b, &[("HERALD_SECRETS_KEY", SEAL_KEY)]).await?;
    gw.api.tenant("acme").await?;
    let (cert, key) = client_ca.issue("herald-client", false)?;
    let ep = gw
        .api
        .endpoint(
            "acme",
            json!({"url": format!("https://localhost:{port}/hook"), "rate_per_sec": 100,
                   "tls": {"client_cert": cert, "client_key": key, "ca_bundle": server_ca.ca.pem()}}),
        )
        .await?;
    let id = ep["id"].as_str().unwrap().to_string();
    assert_eq!(ep["tls"]["client_key_set"], true, "{ep}");
    post_events(&gw.api, 0, 3).await?;
    tests::eventually("3 delivered over mTLS", Duration::from_secs(10), || async {
        let n = served.load(Ordering::SeqCst);
        Ok(if n == 3 { Ok(()) } else { Err(n.to_string()) })
    })
    .await?;
    let shown = endpoint(&gw.api, &id).await?.to_string();
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    if b == Backend::Sqlite {
        for entry in std::fs::read_dir(gw.dir.path())? {
            let path = entry?.path();
            if path.is_file() {
                let bytes = std::fs::read(&path)?;
                assert!(!bytes.windows(11).any(|w| w == b"PRIVATE KEY"), "{} holds the key in clear", path.display());
            }
        }
    }

    // A certificate from a CA the receiver does not trust: the TLS rule.
    let (cert, key) = other_ca.issue("herald-client", false)?;
    let path = format!("/v1/tenants/acme/endpoints/{id}");
    let body = json!({"tls": {"client_cert": cert, "client_key": key}});
    gw.api.call("PATCH", &path, ADMIN_TOKEN, Some(body)).await?.expect(200)?;
    post_events(&gw.api, 3, 1).await?;
    let ep = tests::eventually("held for TLS", Duration::from_secs(10), || async {
        let ep = endpoint(&gw.api, &id).await?;
        Ok(if ep["state"] == "paused" { Ok(ep) } else { Err(ep.to_string()) })
    })
    .await?;
    assert_eq!(ep["state_reason"], "tls", "{ep}");
    assert_eq!(served.load(Ordering::SeqCst), 3);
    Ok(())
}

/// Every server certificate failure follows the TLS rule (the endpoint paused until
/// re-enabled, reason `tls`, its delivery waiting), not `other:` retries: a certificate
/// of an unknown issuer, a self-signed one, an expired one, one for another name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_server_certificate_failure_pauses_the_endpoint() -> anyhow::Result<()> {
    let (trusted, unknown) = (Pki::new()?, Pki::new()?);
    let key = rcgen::KeyPair::generate()?;
    let self_signed = rcgen::CertificateParams::new(vec!["localhost".to_string()])?.self_signed(&key)?;
    let cases = [
        ("unknown_issuer", unknown.issue("localhost", false)?),
        ("self_signed", (self_signed.pem(), key.serialize_pem())),
        ("expired", trusted.issue("localhost", true)?),
        ("wrong_name", trusted.issue("other.example", false)?),
    ];
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    let mut endpoints = Vec::new();
    for (what, (cert, key)) in &cases {
        let (port, served) = tls_receiver(cert, key).await?;
        let ep = gw
            .api
            .endpoint(
                "acme",
                json!({"url": format!("https://localhost:{port}/hook"), "event_types": [format!("tls.{what}")],
                       "rate_per_sec": 100, "tls": {"ca_bundle": trusted.ca.pem()}}),
            )
            .await?;
        let r = gw.api.event("acme", json!({"id": what, "type": format!("tls.{what}"), "payload": {}})).await?;
        anyhow::ensure!(r.status == 202, "{what}: {} {}", r.status, r.text);
        endpoints.push((what, ep["id"].as_str().context("id")?.to_string(), served));
    }
    for (what, id, served) in endpoints {
        let ep = tests::eventually(&format!("{what}: held for TLS"), Duration::from_secs(10), || async {
            let ep = endpoint(&gw.api, &id).await?;
            Ok(if ep["state"] == "paused" { Ok(ep) } else { Err(ep.to_string()) })
        })
        .await?;
        assert_eq!(ep["state_reason"], "tls", "{what}: {ep}");
        let d = delivery_of(&gw, what).await?;
        assert_eq!(d["state"], "paused", "{what}: its delivery waits: {d}");
        let attempts = d["attempt_history"].as_array().context("attempts")?;
        assert_eq!(attempts.len(), 1, "{what}: no retries: {d}");
        let error = attempts[0]["error"].as_str().unwrap_or_default();
        assert!(error.starts_with("tls:") && error.contains("certificate"), "{what}: {error}");
        assert_eq!(served.load(Ordering::SeqCst), 0, "{what}");
    }
    Ok(())
}

/// Bad TLS material is a 422 naming the field; a client key without `[secrets] key` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_settings_are_refused_naming_the_field() -> anyhow::Result<()> {
    let pki = Pki::new()?;
    let (cert, key) = pki.issue("c", false)?;
    let (other_cert, other_key) = pki.issue("d", false)?;
    let (expired, expired_key) = pki.issue("e", true)?;
    let _ = other_cert;
    let bare = TestGateway::start().await?;
    bare.api.tenant("acme").await?;
    let body = json!({"url": "https://rx.example/h", "tls": {"client_cert": cert, "client_key": key}});
    let r = bare.api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, body).await?;
    assert_eq!(r.status, 422, "{}", r.text);
    assert!(r.text.contains("tls.client_key: this node has no [secrets] key"), "{}", r.text);

    let gw = TestGateway::start_with(&[("HERALD_SECRETS_KEY", SEAL_KEY)]).await?;
    gw.api.tenant("acme").await?;
    let cases = [
        (json!({"client_cert": "not pem", "client_key": key}), "tls.client_cert"),
        (
            json!({"client_cert": cert, "client_key": "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}),
            "tls.client_key",
        ),
        (json!({"client_cert": cert, "client_key": other_key}), "tls.client_key: does not match"),
        (json!({"client_cert": expired, "client_key": expired_key}), "tls.client_cert: expired"),
        (json!({"client_cert": cert}), "tls.client_key: is required"),
        (json!({"client_key": key}), "tls.client_cert: is required"),
        (json!({"ca_bundle": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}), "tls.ca_bundle"),
        (json!({"ca_bundle": "nothing"}), "tls.ca_bundle"),
    ];
    for (tls, field) in cases {
        let body = json!({"url": "https://rx.example/h", "tls": tls});
        let r = gw.api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, body).await?;
        assert_eq!(r.status, 422, "{tls}: {}", r.text);
        assert!(
            r.json["error"]["message"].as_str().unwrap().starts_with(field),
            "{tls} should name {field}: {}",
            r.text
        );
        assert!(!r.text.contains("PRIVATE KEY"), "{}", r.text);
    }
    // The operator's key: base64 of 32 bytes, named when wrong.
    for (key, value) in [("HERALD_SECRETS_KEY", "c2hvcnQ="), ("HERALD_SECRETS_PREVIOUS_KEYS", "[\"x\"]")] {
        let dir = tempfile::tempdir()?;
        let mut env = tests::base_env(dir.path());
        env.push(("HERALD_SECRETS_KEY".into(), SEAL_KEY.into()));
        env.push((key.to_string(), value.to_string()));
        let err = gateway::config::Config::load(None, env).unwrap_err().to_string();
        assert!(err.contains("secrets.key") || err.contains("secrets.previous_keys[0]"), "{err}");
    }
    Ok(())
}
