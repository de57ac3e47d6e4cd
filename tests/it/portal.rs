//! The customer portal's API on both stores: minting a session (admin only, input checked),
//! its one-time link exchanged once, expiry and revocation, read-only and endpoint-limited
//! sessions, what a session may never reach (another tenant, the operator's routes), and
//! branding. The portal page itself, in Chromium, is `portal_browser`.

use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Api, Backend, FakeReceiver, TestGateway, eventually};

tests::backends!(
    minting_is_the_admins_and_checks_its_input,
    a_link_exchanges_once_for_a_customer_session,
    revoked_and_expired_sessions_are_refused,
    read_only_and_endpoint_limits_hold,
    branding_is_checked_and_read_through_the_session,
    plugins_only_when_the_operator_allows,
);

/// The shortest `ttl_secs` these tests' nodes allow, so that expiry takes seconds.
pub const MIN_TTL: (&str, &str) = ("HERALD_PORTAL_MIN_TTL_SECS", "2");

fn message(reply: &tests::Reply) -> String {
    reply.json["error"]["message"].as_str().unwrap_or_default().to_string()
}

/// Mints a session for `tenant` with `body`; returns its JSON (`id`, `url`, …).
pub async fn mint(api: &Api, tenant: &str, body: Value) -> anyhow::Result<Value> {
    let r = api.post(&format!("/v1/tenants/{tenant}/portal-sessions"), ADMIN_TOKEN, body).await?.expect(201)?;
    Ok(r.json)
}

/// The one-time code in a minted link's fragment.
fn code_of(session: &Value) -> anyhow::Result<String> {
    let url = session["url"].as_str().context("url")?;
    let (_, code) = url.split_once("#code=").with_context(|| format!("no code in {url}"))?;
    Ok(code.to_string())
}

/// Exchanges a minted link for its session token.
pub async fn open(api: &Api, session: &Value) -> anyhow::Result<String> {
    let r =
        api.raw("POST", "/v1/portal-sessions/exchange", None, json!({"code": code_of(session)?}).to_string()).await?;
    let r = r.expect(200)?;
    Ok(r.json["token"].as_str().context("token")?.to_string())
}

async fn refused(
    api: &Api,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
    status: u16,
) -> anyhow::Result<String> {
    let r = api.call(method, path, token, body).await?;
    ensure!(r.status == status, "{method} {path}: expected {status}, got {} {}", r.status, r.text);
    Ok(message(&r))
}

async fn minting_is_the_admins_and_checks_its_input(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[MIN_TTL]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    api.tenant("globex").await?;
    let theirs = api.endpoint("globex", json!({"url": "http://127.0.0.1:9/x"})).await?;
    let manage = api.token("acme", &["read", "manage"]).await?;
    let path = "/v1/tenants/acme/portal-sessions";
    refused(api, "POST", path, &manage, Some(json!({})), 403).await?;
    refused(api, "GET", path, &manage, None, 403).await?;
    for (body, field) in [
        (json!({"ttl_secs": 1}), "ttl_secs:"),
        (json!({"ttl_secs": 86_401}), "ttl_secs:"),
        (json!({"endpoints": ["ep_nope"]}), "endpoints:"),
        // Another tenant's endpoint is as unknown as one that does not exist.
        (json!({"endpoints": [theirs["id"]]}), "endpoints:"),
        (json!({"endpoints": []}), "endpoints:"),
        (json!({"scopes": ["events:write"]}), "scopes:"),
        (json!({"scopes": ["everything"]}), "scopes:"),
    ] {
        let m = refused(api, "POST", path, ADMIN_TOKEN, Some(body.clone()), 422).await?;
        ensure!(m.starts_with(field), "{body}: {m}");
    }
    ensure!(api.get(path, ADMIN_TOKEN).await?.expect(200)?.json["data"] == json!([]), "a refused mint stored nothing");
    let s = mint(api, "acme", json!({})).await?;
    ensure!(s["url"].as_str().is_some_and(|u| u.starts_with("/console/portal#code=hpc_")), "{s}");
    ensure!(s["scopes"] == json!(["read", "manage", "replay"]) && s["state"] == "pending", "{s}");
    let listed = api.get(path, ADMIN_TOKEN).await?.expect(200)?.json;
    ensure!(listed["data"][0]["id"] == s["id"] && listed["data"][0].get("url").is_none(), "{listed}");
    ensure!(!listed.to_string().contains(&code_of(&s)?), "a listing never shows the code");
    Ok(())
}

async fn a_link_exchanges_once_for_a_customer_session(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[MIN_TTL]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    api.tenant("globex").await?;
    api.endpoint("globex", json!({"url": "http://127.0.0.1:9/globex"})).await?;
    let rx = FakeReceiver::start().await?;
    let s = mint(api, "acme", json!({})).await?;
    let token = open(api, &s).await?;
    let again =
        api.raw("POST", "/v1/portal-sessions/exchange", None, json!({"code": code_of(&s)?}).to_string()).await?;
    ensure!(again.status == 401 && message(&again).contains("ask for a new one"), "{} {}", again.status, again.text);
    let me = api.get("/v1/whoami", &token).await?.expect(200)?.json;
    ensure!(me["tenant"] == "acme" && me["admin"] == false && me["portal"]["id"] == s["id"], "{me}");
    ensure!(me["portal"]["read_only"] == false && me["portal"]["plugins"] == false, "{me}");
    // The customer's own: endpoints, deliveries, the catalog to read.
    let e = api.post("/v1/tenants/acme/endpoints", &token, json!({"url": rx.url()})).await?.expect(201)?.json;
    let ep = e["id"].as_str().context("id")?;
    api.call("PATCH", &format!("/v1/tenants/acme/endpoints/{ep}"), &token, Some(json!({"description": "mine"})))
        .await?
        .expect(200)?;
    api.post(&format!("/v1/tenants/acme/endpoints/{ep}/rotate-secret"), &token, json!({})).await?.expect(200)?;
    api.get("/v1/tenants/acme/deliveries", &token).await?.expect(200)?;
    api.get("/v1/tenants/acme/event-types", &token).await?.expect(200)?;
    // Nothing of another tenant, nothing of the operator's.
    refused(api, "GET", "/v1/tenants/globex/endpoints", &token, None, 404).await?;
    refused(api, "GET", "/v1/tenants", &token, None, 403).await?;
    refused(api, "GET", "/v1/overview", &token, None, 403).await?;
    for (method, path, body) in [
        ("POST", "/v1/tenants/acme/tokens", Some(json!({"scopes": ["read"]}))),
        ("GET", "/v1/tenants/acme/tokens", None),
        ("POST", "/v1/tenants/acme/event-types", Some(json!({"name": "x.y"}))),
        ("PUT", "/v1/tenants/acme/catalog", Some(json!({"schema_validation": "off"}))),
        ("GET", "/v1/tenants/acme/plugins", None),
        ("POST", "/v1/tenants/acme/events", Some(json!({"type": "x.y", "payload": {}}))),
        ("POST", "/v1/tenants/acme/portal-sessions", Some(json!({}))),
        ("PUT", "/v1/tenants/acme/branding", Some(json!({"name": "mine"}))),
    ] {
        refused(api, method, path, &token, body, 403).await?;
    }
    let listed = api.get("/v1/tenants/acme/portal-sessions", ADMIN_TOKEN).await?.expect(200)?.json;
    ensure!(listed["data"][0]["state"] == "active", "{listed}");
    Ok(())
}

async fn revoked_and_expired_sessions_are_refused(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[MIN_TTL]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let s = mint(api, "acme", json!({})).await?;
    let token = open(api, &s).await?;
    api.get("/v1/tenants/acme/endpoints", &token).await?.expect(200)?;
    let path = format!("/v1/tenants/acme/portal-sessions/{}", s["id"].as_str().context("id")?);
    refused(api, "DELETE", &path, &token, None, 403).await?;
    api.call("DELETE", &path, ADMIN_TOKEN, None).await?.expect(204)?;
    let m = refused(api, "GET", "/v1/tenants/acme/endpoints", &token, None, 401).await?;
    ensure!(m == "this portal link has expired; ask for a new one", "{m}");
    refused(api, "DELETE", &path, ADMIN_TOKEN, None, 404).await?;
    // A revoked link cannot be opened either.
    let unopened = mint(api, "acme", json!({})).await?;
    let unopened_path = format!("/v1/tenants/acme/portal-sessions/{}", unopened["id"].as_str().context("id")?);
    api.call("DELETE", &unopened_path, ADMIN_TOKEN, None).await?.expect(204)?;
    let r =
        api.raw("POST", "/v1/portal-sessions/exchange", None, json!({"code": code_of(&unopened)?}).to_string()).await?;
    ensure!(r.status == 401, "{} {}", r.status, r.text);

    let short = mint(api, "acme", json!({"ttl_secs": 2})).await?;
    let token = open(api, &short).await?;
    api.get("/v1/tenants/acme/endpoints", &token).await?.expect(200)?;
    eventually("the session expires", Duration::from_secs(10), || async {
        let r = api.get("/v1/tenants/acme/endpoints", &token).await?;
        Ok(if r.status == 401 { Ok(message(&r)) } else { Err(format!("{} {}", r.status, r.text)) })
    })
    .await
    .and_then(|m| {
        ensure!(m == "this portal link has expired; ask for a new one", "{m}");
        Ok(())
    })?;
    // An expired link cannot be opened.
    let late = mint(api, "acme", json!({"ttl_secs": 2})).await?;
    eventually("the link expires", Duration::from_secs(10), || async {
        let listed = api.get("/v1/tenants/acme/portal-sessions", ADMIN_TOKEN).await?.json;
        let state = listed["data"]
            .as_array()
            .and_then(|d| d.iter().find(|s| s["id"] == late["id"]))
            .map(|s| s["state"].clone());
        tests::done_or(state == Some(json!("expired")), format!("{state:?}"))
    })
    .await?;
    let r = api.raw("POST", "/v1/portal-sessions/exchange", None, json!({"code": code_of(&late)?}).to_string()).await?;
    ensure!(r.status == 401, "{} {}", r.status, r.text);
    Ok(())
}

async fn read_only_and_endpoint_limits_hold(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[MIN_TTL]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let rx = FakeReceiver::start().await?;
    let mine = api.endpoint("acme", json!({"url": format!("{}/mine", rx.url())})).await?;
    let other = api.endpoint("acme", json!({"url": format!("{}/other", rx.url())})).await?;
    let (mine, other) = (mine["id"].as_str().context("id")?, other["id"].as_str().context("id")?);

    let ro = open(api, &mint(api, "acme", json!({"read_only": true})).await?).await?;
    api.get("/v1/tenants/acme/endpoints", &ro).await?.expect(200)?;
    let m = refused(api, "POST", "/v1/tenants/acme/endpoints", &ro, Some(json!({"url": rx.url()})), 403).await?;
    ensure!(m.contains("read-only"), "{m}");
    refused(api, "POST", &format!("/v1/tenants/acme/endpoints/{mine}/pause"), &ro, Some(json!({})), 403).await?;

    let limited = open(api, &mint(api, "acme", json!({"endpoints": [mine]})).await?).await?;
    let listed = api.get("/v1/tenants/acme/endpoints", &limited).await?.expect(200)?.json;
    let ids: Vec<&str> = listed["data"].as_array().context("data")?.iter().filter_map(|e| e["id"].as_str()).collect();
    ensure!(ids == [mine], "{ids:?}");
    api.get(&format!("/v1/tenants/acme/endpoints/{mine}"), &limited).await?.expect(200)?;
    refused(api, "GET", &format!("/v1/tenants/acme/endpoints/{other}"), &limited, None, 404).await?;
    refused(
        api,
        "PATCH",
        &format!("/v1/tenants/acme/endpoints/{other}"),
        &limited,
        Some(json!({"description": "x"})),
        404,
    )
    .await?;
    let m = refused(api, "POST", "/v1/tenants/acme/endpoints", &limited, Some(json!({"url": rx.url()})), 403).await?;
    ensure!(m.contains("limited"), "{m}");
    // Deliveries to the other endpoint are absent too.
    api.event("acme", json!({"type": "a.b", "payload": {}})).await?.expect(202)?;
    rx.wait_for(2, Duration::from_secs(20)).await?;
    let all = api.get("/v1/tenants/acme/deliveries", ADMIN_TOKEN).await?.json;
    let seen = api.get("/v1/tenants/acme/deliveries", &limited).await?.expect(200)?.json;
    ensure!(all["data"].as_array().map(Vec::len) == Some(2), "{all}");
    let seen = seen["data"].as_array().context("data")?;
    ensure!(seen.len() == 1 && seen[0]["endpoint_id"] == mine, "{seen:?}");
    let theirs = all["data"].as_array().context("data")?.iter().find(|d| d["endpoint_id"] == other).context("other")?;
    let theirs_id = theirs["id"].as_str().context("id")?;
    refused(api, "GET", &format!("/v1/tenants/acme/deliveries/{theirs_id}"), &limited, None, 404).await?;
    // What spans the tenant is not for it: the tenant's series, a replay of any endpoint's.
    refused(api, "GET", "/v1/tenants/acme/series", &limited, None, 422).await?;
    refused(api, "GET", &format!("/v1/tenants/acme/series?endpoint={other}"), &limited, None, 404).await?;
    api.get(&format!("/v1/tenants/acme/series?endpoint={mine}"), &limited).await?.expect(200)?;
    let replays = "/v1/tenants/acme/replays";
    refused(api, "POST", replays, &limited, Some(json!({"filter": {}})), 422).await?;
    refused(api, "POST", replays, &limited, Some(json!({"filter": {"endpoint": other}})), 404).await?;
    refused(api, "POST", replays, &limited, Some(json!({"ids": [theirs_id]})), 404).await?;
    Ok(())
}

/// Nodes sharing Postgres: a session minted and opened on one node works on the other, and
/// a revocation on either is refused by both from the next request (no node caches one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_holds_on_every_node() -> anyhow::Result<()> {
    let a = TestGateway::start_on(Backend::Postgres, &[MIN_TTL]).await?;
    let url = a.schema().context("a Postgres node")?.url.clone();
    let b = TestGateway::start_with(&[("HERALD_STORE_URL", url.as_str()), MIN_TTL]).await?;
    a.api.tenant("acme").await?;
    let s = mint(&a.api, "acme", json!({})).await?;
    let token = open(&b.api, &s).await?;
    for node in [&a.api, &b.api] {
        node.get("/v1/tenants/acme/endpoints", &token).await?.expect(200)?;
    }
    let path = format!("/v1/tenants/acme/portal-sessions/{}", s["id"].as_str().context("id")?);
    b.api.call("DELETE", &path, ADMIN_TOKEN, None).await?.expect(204)?;
    for node in [&a.api, &b.api] {
        let m = refused(node, "GET", "/v1/tenants/acme/endpoints", &token, None, 401).await?;
        ensure!(m.contains("expired"), "{m}");
    }
    Ok(())
}

async fn branding_is_checked_and_read_through_the_session(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[MIN_TTL]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let path = "/v1/tenants/acme/branding";
    let logo = "data:image/png;base64,iVBORw0KGgo=";
    for (body, field) in [
        (json!({"accent": "red"}), "accent:"),
        (json!({"logo": "https://cdn.example/logo.png"}), "logo:"),
        (json!({"logo": "data:text/html;base64,PGI+aGk8L2I+"}), "logo:"),
        (json!({"logo": format!("data:image/png;base64,{}", "A".repeat(70_000))}), "logo:"),
        (json!({"name": "x".repeat(101)}), "name:"),
    ] {
        let m = refused(api, "PUT", path, ADMIN_TOKEN, Some(body.clone()), 422).await?;
        ensure!(m.starts_with(field), "{body}: {m}");
    }
    // Unset: the tenant's name, no logo, no colour.
    let token = open(api, &mint(api, "acme", json!({"read_only": true})).await?).await?;
    let b = api.get(path, &token).await?.expect(200)?.json;
    ensure!(b == json!({"name": "acme", "logo": "", "accent": ""}), "{b}");
    let set = json!({"name": "Acme <b>Webhooks</b>", "logo": logo, "accent": "#aa3300"});
    api.call("PUT", path, ADMIN_TOKEN, Some(set.clone())).await?.expect(200)?;
    ensure!(api.get(path, &token).await?.expect(200)?.json == set, "branding reads back as set");
    Ok(())
}

async fn plugins_only_when_the_operator_allows(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[MIN_TTL, ("HERALD_PORTAL_PLUGINS", "true")]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let token = open(api, &mint(api, "acme", json!({})).await?).await?;
    let me = api.get("/v1/whoami", &token).await?.expect(200)?.json;
    ensure!(me["portal"]["plugins"] == true, "{me}");
    api.get("/v1/tenants/acme/plugins", &token).await?.expect(200)?;
    // The operator's routes stay closed.
    refused(api, "GET", "/v1/tenants/acme/tokens", &token, None, 403).await?;
    Ok(())
}
