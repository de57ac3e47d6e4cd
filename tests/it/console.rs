//! The console (`/console`), in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by `scripts/test`) driven by Selenium
//! (`tests/console/console_flow.py`, from the virtualenv `scripts/pytools` builds) against a
//! live `herald serve`. A missing tool fails the test, it never skips it. Screenshots of each
//! page, named by what they show, land in `target/artifacts/console/`.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, FakeReceiver, HeraldProcess, herald_binary};

tests::backends!(console_reads_on, endpoints_filter_by_the_plugin_they_bind);

/// Stored where the console shows it; each would set `window.__xss` if it ran.
const XSS_DESCRIPTION: &str = "<img src=x onerror=\"window.__xss=1\"><script>window.__xss=2</script>";
const XSS_BODY: &str = "<script>window.__xss=3</script><img src=x onerror=\"window.__xss=4\">";
/// Dead letters the failing endpoint makes.
const DEAD: usize = 3;
/// The event the hostile plugin refuses (its type's last segment says how it misbehaves).
const PLUGIN_EVENT: &str = "evt_plugin_fail";
/// The hostile transform's first stored version, which its endpoint is pinned to.
const PINNED: &str = "hostile@1";
/// A classify plugin the browser binds beside the pinned transform.
const CLASSIFY: &str = "classify-409";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn python() -> anyhow::Result<PathBuf> {
    let path = repo().join("target/pytools/venv/bin/python");
    ensure!(path.exists(), "{} is missing: run scripts/pytools (scripts/test does)", path.display());
    for tool in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        ensure!(
            PathBuf::from(tool).exists(),
            "{tool} is missing: apt-get install chromium chromium-driver (scripts/test does)"
        );
    }
    Ok(path)
}

/// Runs the browser script `script` (under `tests/console/`) with `args` within `limit`;
/// its stdout is a JSON summary.
pub(crate) async fn browse(script: &str, args: &[&str], limit: Duration) -> anyhow::Result<Value> {
    let mut cmd = tokio::process::Command::new(python()?);
    cmd.arg(repo().join("tests/console").join(script)).args(args).kill_on_drop(true);
    cmd.stdin(std::process::Stdio::null());
    let out: Output = tokio::time::timeout(limit, cmd.output())
        .await
        .with_context(|| format!("the browser ran over {limit:?}"))??;
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "the browser flow {script} failed:\n{text}");
    serde_json::from_slice(&out.stdout).with_context(|| format!("the browser's summary:\n{text}"))
}

/// Polls `GET path` until `done` holds for its JSON, within `limit`.
async fn until(api: &tests::Api, path: &str, limit: Duration, done: impl Fn(&Value) -> bool) -> anyhow::Result<()> {
    api.wait_for(path, limit, done).await.map(drop)
}

/// Two tenants; acme has a healthy endpoint (a hostile description), one whose receiver
/// answers 422 with a hostile body, so its events become dead letters, and one whose
/// transform plugin (the hostile guest) refuses its event after logging why.
async fn seed(api: &tests::Api, ok: &FakeReceiver, bad: &FakeReceiver) -> anyhow::Result<Value> {
    api.tenant("acme").await?;
    api.tenant("globex").await?;
    bad.set_default(Answer::status(422).body(XSS_BODY));
    let healthy = json!({"url": ok.url(), "description": XSS_DESCRIPTION, "rate_per_sec": 7, "burst": 3,
        "event_types": ["invoice.paid"]});
    api.endpoint("acme", healthy).await?;
    api.endpoint("acme", json!({"url": bad.url(), "event_types": ["invoice.failed"]})).await?;
    let other_url = format!("{}/globex-private", ok.url());
    api.endpoint("globex", json!({"url": other_url, "event_types": ["nothing.matches"]})).await?;
    for n in 0..DEAD {
        for (kind, id) in [("paid", format!("evt_paid_{n}")), ("failed", format!("evt_failed_{n}"))] {
            let r =
                api.event("acme", json!({"id": id, "type": format!("invoice.{kind}"), "payload": {"n": n}})).await?;
            ensure!(r.status == 202, "event: {} {}", r.status, r.text);
        }
    }
    ok.wait_for(DEAD, Duration::from_secs(30)).await?;
    until(api, "/v1/tenants/acme/dead-letters", Duration::from_secs(30), |j| {
        j["counts_by_reason"]["permanent:422"] == DEAD
    })
    .await?;
    // Fixed: a replay now delivers.
    bad.set_default(Answer::status(200));
    let plugin_endpoint = failing_plugin(api, bad).await?;
    pin_and_offer_a_classifier(api, &plugin_endpoint).await?;
    let oauth2_endpoint = oauth2_failing(api, bad).await?;
    Ok(json!({
        "oauth2_endpoint": oauth2_endpoint,
        "oauth2_client": OAUTH2_CLIENT,
        "oauth2_secret": OAUTH2_SECRET,
        "admin_token": ADMIN_TOKEN,
        "read_token": api.token("acme", &["read"]).await?,
        "tenant": "acme",
        "other_tenant": "globex",
        "other_url": other_url,
        "healthy_url": ok.url(),
        "xss_description": XSS_DESCRIPTION,
        "xss_body": XSS_BODY,
        "failed_event": "evt_failed_0",
        "dead": DEAD,
        "plugin_event": PLUGIN_EVENT,
        "plugin_endpoint": plugin_endpoint,
        "pinned": PINNED,
        "classify_plugin": CLASSIFY,
    }))
}

const OAUTH2_CLIENT: &str = "console-client";
const OAUTH2_SECRET: &str = "console-s3cret";

/// An OAuth2 endpoint whose token server is down: held, with its last token error.
async fn oauth2_failing(api: &tests::Api, rx: &FakeReceiver) -> anyhow::Result<String> {
    let down = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let token_url = format!("http://{}/token", down.local_addr()?);
    drop(down);
    let oauth2 = json!({"token_url": token_url, "client_id": OAUTH2_CLIENT, "client_secret": OAUTH2_SECRET});
    let ep = api.endpoint("acme", json!({"url": rx.url(), "event_types": ["auth.checked"], "oauth2": oauth2})).await?;
    let id = ep["id"].as_str().context("id")?.to_string();
    let r = api.event("acme", json!({"id": "evt_auth", "type": "auth.checked", "payload": {}})).await?;
    ensure!(r.status == 202, "event: {} {}", r.status, r.text);
    until(api, &format!("/v1/tenants/acme/endpoints/{id}"), Duration::from_secs(10), |j| j["state"] == "paused")
        .await?;
    Ok(id)
}

/// Pins the hostile transform's endpoint to its first version (`hostile@1`, which no
/// plugin listing names), and uploads a classify plugin for the browser to bind beside it.
async fn pin_and_offer_a_classifier(api: &tests::Api, endpoint: &str) -> anyhow::Result<()> {
    let path = format!("/v1/tenants/acme/endpoints/{endpoint}");
    let r = api.call("PATCH", &path, ADMIN_TOKEN, Some(json!({"plugins": {"transform": PINNED}}))).await?;
    ensure!(r.status == 200 && r.json["plugins"]["transform"] == PINNED, "pin: {} {}", r.status, r.text);
    let plugin = format!("/v1/tenants/acme/plugins/{CLASSIFY}");
    let r = api.raw("PUT", &plugin, Some(ADMIN_TOKEN), crate::plugins::plugin_bytes("classify_409")).await?;
    ensure!(r.status == 200, "upload: {} {}", r.status, r.text);
    until(api, &plugin, Duration::from_secs(30), |j| {
        j["hooks"].as_array().is_some_and(|h| h.contains(&json!("classify")))
    })
    .await
}

/// The hostile guest as acme's `hostile` transform, refusing one event: its failure (and
/// the log line it wrote) is in the plugin's stats before the browser starts. Returns the
/// id of the endpoint that binds it.
async fn failing_plugin(api: &tests::Api, bad: &FakeReceiver) -> anyhow::Result<String> {
    let path = "/v1/tenants/acme/plugins/hostile";
    let r = api.raw("PUT", path, Some(ADMIN_TOKEN), crate::plugins::plugin_bytes("hostile")).await?;
    ensure!(r.status == 200, "upload: {} {}", r.status, r.text);
    let never = format!("{}/never-sent", bad.url());
    let endpoint = api
        .endpoint(
            "acme",
            json!({"url": never, "event_types": ["plugin.fail"], "plugins": {"transform": "hostile"},
                   "retry": {"max_attempts": 1}}),
        )
        .await?;
    let r = api.event("acme", json!({"id": PLUGIN_EVENT, "type": "plugin.fail", "payload": {}})).await?;
    ensure!(r.status == 202, "event: {} {}", r.status, r.text);
    until(api, path, Duration::from_secs(30), |j| j["stats"]["failures"] == 1).await?;
    Ok(endpoint["id"].as_str().context("endpoint id")?.to_string())
}

/// Every item of issue 16's "How it is checked", in one browser session: admin sign-in,
/// the success rate beside the rate, a delivery and its attempts, a replay by filter to
/// its end, a plugin's failures with its log lines, a refused plugin upload, a read-only
/// tenant token, another tenant invisible, hostile stored text rendered as text. And issue
/// 29's console items: one header after an admin sign-in, an unknown event or endpoint
/// shown inline (the search form kept), reason counts without list bullets, a pinned
/// plugin binding shown and kept when the bindings are saved, a read-only token offered
/// no action its scopes do not allow.
#[tokio::test]
async fn the_console_works_in_a_real_browser() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let node = HeraldProcess::start(&herald_binary()?, dir.path(), &[]).await?;
    let (ok, bad) = (FakeReceiver::start().await?, FakeReceiver::start().await?);
    let mut cfg = seed(&node.api, &ok, &bad).await?;
    let broken = dir.path().join("broken.wasm");
    std::fs::write(&broken, b"\0asm\x0d\0\x01\0 this is not a component")?;
    let shots = repo().join("target/artifacts/console");
    cfg["base"] = json!(node.api.base);
    cfg["broken_plugin"] = json!(broken);
    cfg["screenshots"] = json!(shots);
    let config = dir.path().join("console.json");
    std::fs::write(&config, cfg.to_string())?;

    let summary = browse("console_flow.py", &[config.to_str().context("path")?], Duration::from_secs(240)).await?;
    println!("console page loads (ms, small store): {}", summary["page_ms"]);
    assert!(summary["other_tenant"].as_str().is_some_and(|m| m.contains("not_found")), "{summary}");
    // The replay reached the receiver: each dead letter delivered once more.
    bad.wait_for(DEAD * 2, Duration::from_secs(10)).await?;
    // Saving the bindings kept the pinned transform the page showed, beside the classifier.
    let bound = node
        .api
        .get(&format!("/v1/tenants/acme/endpoints/{}", cfg["plugin_endpoint"].as_str().context("id")?), ADMIN_TOKEN)
        .await?;
    assert_eq!(bound.json["plugins"], json!({"transform": PINNED, "classify": CLASSIFY}), "{}", bound.text);
    screenshots_taken(
        &shots,
        &[
            "overview",
            "header-after-admin-sign-in",
            "endpoints",
            "endpoint",
            "delivery",
            "unknown-event-error-inline",
            "unknown-endpoint-error-inline",
            "dead-letter-reason-counts",
            "dead-letters",
            "plugins",
            "plugin",
            "pinned-binding-shown",
            "pinned-binding-kept-after-save",
            "endpoint-oauth2",
            "read-only-endpoint-without-actions",
            "read-only-dead-letters-without-replay",
            "read-only-plugins-without-upload",
        ],
    )
}

/// Each of `pages` has its screenshot, a PNG, under `dir`.
pub(crate) fn screenshots_taken(dir: &std::path::Path, pages: &[&str]) -> anyhow::Result<()> {
    for page in pages {
        let png = std::fs::read(dir.join(format!("{page}.png"))).with_context(|| format!("screenshot {page}"))?;
        ensure!(png.starts_with(b"\x89PNG"), "{page}.png is not a PNG");
    }
    Ok(())
}

/// The console is static files, not API operations: GET only, each with a Content Security
/// Policy that allows no inline script, none of them in `/openapi.json`.
#[tokio::test]
async fn console_files_are_static_and_outside_the_api_document() -> anyhow::Result<()> {
    let gw = tests::TestGateway::start().await?;
    let doc = gw.api.raw("GET", "/openapi.json", None, "").await?.json;
    let paths: Vec<&String> = doc["paths"].as_object().context("paths")?.keys().collect();
    assert!(paths.iter().all(|p| !p.starts_with("/console")), "{paths:?}");
    let names: Vec<&str> = gateway::api::console_assets().collect();
    assert!(names.contains(&"index.html") && names.contains(&"app.js"), "{names:?}");
    for path in
        ["/console".to_string(), "/console/".into()].into_iter().chain(names.iter().map(|n| format!("/console/{n}")))
    {
        let r = gw.api.raw("GET", &path, None, "").await?;
        assert_eq!(r.status, 200, "GET {path}");
        let csp = r.headers.get("content-security-policy").and_then(|v| v.to_str().ok());
        assert_eq!(csp, Some(gateway::api::CONTENT_SECURITY_POLICY), "{path}");
        assert!(!gateway::api::CONTENT_SECURITY_POLICY.contains("unsafe-inline"));
        let post = gw.api.raw("POST", &path, Some(ADMIN_TOKEN), "").await?;
        assert_eq!(post.status, 405, "POST {path}");
    }
    let page = gw.api.raw("GET", "/console", None, "").await?;
    assert!(!page.text.contains("<script>") && page.text.contains("type=\"module\""), "inline script in the page");
    assert_eq!(gw.api.raw("GET", "/console/nope.js", None, "").await?.status, 404);
    Ok(())
}

/// The reads behind the console's pages, on both backends: endpoints paged with their
/// health, attempts per bucket, the overview, deliveries newest first, pause and enable;
/// a tenant token reads its own tenant's figures and not the node's.
async fn console_reads_on(backend: tests::Backend) -> anyhow::Result<()> {
    let gw = tests::TestGateway::start_on(backend, &[]).await?;
    let (api, ok) = (&gw.api, FakeReceiver::start().await?);
    api.tenant("acme").await?;
    let mut ids = Vec::new();
    for n in 0..3 {
        let e = api.endpoint("acme", json!({"url": ok.url(), "rate_per_sec": 5 + n})).await?;
        ids.push(e["id"].as_str().context("id")?.to_string());
    }
    for n in 0..2 {
        let r = api.event("acme", json!({"id": format!("evt_{n}"), "type": "a.b", "payload": {}})).await?;
        ensure!(r.status == 202, "{}", r.text);
    }
    ok.wait_for(6, Duration::from_secs(30)).await?;
    let first = api.get("/v1/tenants/acme/endpoints?limit=2&health=true", ADMIN_TOKEN).await?;
    assert_eq!(first.json["data"].as_array().map(Vec::len), Some(2), "{}", first.text);
    assert_eq!(first.json["data"][0]["rate_per_sec"], 5.0);
    let after = first.json["next_after"].as_str().context("a second page")?;
    let second = api.get(&format!("/v1/tenants/acme/endpoints?limit=2&after={after}"), ADMIN_TOKEN).await?;
    assert_eq!(second.json["data"][0]["id"], ids[2].as_str(), "{}", second.text);
    assert_eq!(second.json["data"][0]["health"], Value::Null);
    assert!(second.json["next_after"].is_null());
    // Each endpoint's health counts its own two attempts: both delivered.
    until(api, "/v1/tenants/acme/endpoints?health=true", Duration::from_secs(10), |j| {
        j["data"]
            .as_array()
            .is_some_and(|d| d.iter().all(|e| e["health"]["attempts_1h"] == 2 && e["health"]["success_rate_1h"] == 1.0))
    })
    .await?;
    let series = api.get("/v1/tenants/acme/series", ADMIN_TOKEN).await?;
    assert_eq!(series.json["bucket_seconds"], 60);
    let points = series.json["points"].as_array().context("points")?;
    assert_eq!(points.len(), 60);
    let sum = |k: &str| points.iter().map(|p| p[k].as_u64().unwrap_or(0)).sum::<u64>();
    assert_eq!((sum("attempts"), sum("successes")), (6, 6), "{}", series.text);
    let one = api.get(&format!("/v1/tenants/acme/series?window=24h&endpoint={}", ids[0]), ADMIN_TOKEN).await?;
    let points = one.json["points"].as_array().context("points")?;
    assert_eq!((points.len(), points.iter().map(|p| p["attempts"].as_u64().unwrap_or(0)).sum::<u64>()), (96, 2));
    let overview = api.get("/v1/overview", ADMIN_TOKEN).await?;
    assert_eq!(overview.json["tenants"], 1, "{}", overview.text);
    assert_eq!(overview.json["endpoints_by_state"]["active"], 3);
    let newest = api.get("/v1/tenants/acme/deliveries?order=desc&limit=1", ADMIN_TOKEN).await?;
    assert_eq!(newest.json["data"][0]["event_id"], "evt_1", "{}", newest.text);
    let paused =
        api.post(&format!("/v1/tenants/acme/endpoints/{}/pause", ids[0]), ADMIN_TOKEN, json!({"for": "1h"})).await?;
    assert_eq!((paused.status, paused.json["state"].as_str()), (200, Some("paused")), "{}", paused.text);
    assert!(paused.json["paused_until"].is_string());
    let reader = api.token("acme", &["read"]).await?;
    assert_eq!(api.get("/v1/overview", &reader).await?.status, 403);
    assert_eq!(api.get("/v1/tenants", &reader).await?.status, 403);
    assert_eq!(api.get("/v1/tenants/acme/series?window=2h", &reader).await?.status, 400);
    let refused = api.post(&format!("/v1/tenants/acme/endpoints/{}/pause", ids[1]), &reader, json!({})).await?;
    assert_eq!(refused.status, 403);
    Ok(())
}

/// `GET /v1/whoami` tells a token what it may do, so the console offers only that: the
/// admin every scope of every tenant, a tenant token its tenant and its own scopes; no
/// token, an unknown or a revoked one get `401`. It is in the API document.
#[tokio::test]
async fn a_token_learns_its_own_tenant_and_scopes() -> anyhow::Result<()> {
    let gw = tests::TestGateway::start().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let me = |token: String| async move { api.get("/v1/whoami", &token).await };
    let admin = me(ADMIN_TOKEN.into()).await?;
    assert_eq!(admin.status, 200, "{}", admin.text);
    assert_eq!(
        admin.json,
        json!({"admin": true, "tenant": null, "scopes": ["events:write", "read", "manage", "replay", "poll"]})
    );
    let reader = me(api.token("acme", &["read"]).await?).await?;
    assert_eq!(reader.json, json!({"admin": false, "tenant": "acme", "scopes": ["read"]}), "{}", reader.text);
    let operator = me(api.token("acme", &["replay", "manage"]).await?).await?;
    assert_eq!(operator.json, json!({"admin": false, "tenant": "acme", "scopes": ["replay", "manage"]}));
    let created = api.post("/v1/tenants/acme/tokens", ADMIN_TOKEN, json!({"scopes": ["read"]})).await?;
    let (revoked, id) = (created.json["token"].as_str().context("token")?, created.json["id"].as_str().context("id")?);
    let gone = api.call("DELETE", &format!("/v1/tenants/acme/tokens/{id}"), ADMIN_TOKEN, None).await?;
    assert_eq!(gone.status, 204, "{}", gone.text);
    for token in [revoked, "hrld_unknown"] {
        let r = me(token.into()).await?;
        assert_eq!((r.status, r.json["error"]["code"].as_str()), (401, Some("unauthorized")), "{}", r.text);
    }
    assert_eq!(api.raw("GET", "/v1/whoami", None, "").await?.status, 401);
    let doc = api.raw("GET", "/openapi.json", None, "").await?.json;
    let op = &doc["paths"]["/v1/whoami"]["get"];
    assert_eq!(op["operationId"], "whoami", "{op}");
    assert!(op["responses"]["200"].is_object() && op["responses"]["401"].is_object(), "{op}");
    Ok(())
}

/// "Which endpoints use it", from the server: `?plugin=NAME` matches a binding of NAME to
/// any hook, pinned (`NAME@n`) too, and nothing else (`chat2` is not `chat`); it pages like
/// the unfiltered listing and refuses what is not a plugin name.
async fn endpoints_filter_by_the_plugin_they_bind(backend: tests::Backend) -> anyhow::Result<()> {
    let gw = tests::TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    for (name, file) in [("chat", "transform_chat"), ("chat2", "transform_chat"), ("sig", "sign_hmac_hex")] {
        let r = api
            .raw(
                "PUT",
                &format!("/v1/tenants/acme/plugins/{name}"),
                Some(ADMIN_TOKEN),
                crate::plugins::plugin_bytes(file),
            )
            .await?;
        ensure!(r.status == 200, "{name}: {}", r.text);
    }
    let mut ids = Vec::new();
    for plugins in [
        json!({"transform": "chat"}),
        json!({"transform": "chat@1"}),
        json!({"transform": "chat2"}),
        json!({"transform": "chat2", "sign": "sig"}),
        json!({"sign": "sig", "classify": null}),
        json!({}),
        json!({"transform": "chat", "sign": "sig"}),
    ] {
        let e = api.endpoint("acme", json!({"url": "https://example.com/hook", "plugins": plugins})).await?;
        ids.push(e["id"].as_str().context("id")?.to_string());
    }
    let listed = |path: String| async move {
        let r = api.get(&path, ADMIN_TOKEN).await?;
        ensure!(r.status == 200, "{path}: {}", r.text);
        let got: Vec<String> = r.json["data"]
            .as_array()
            .context("data")?
            .iter()
            .filter_map(|e| e["id"].as_str().map(String::from))
            .collect();
        Ok::<_, anyhow::Error>((got, r.json["next_after"].as_str().map(String::from)))
    };
    let base = "/v1/tenants/acme/endpoints";
    // The list's own order (oldest first, then by id: endpoints made in the same
    // millisecond need not list in the order they were made).
    let all = listed(base.to_string()).await?.0;
    assert_eq!(all.len(), 7, "unfiltered, every endpoint");
    let in_list_order = |picked: &[usize]| -> Vec<String> {
        all.iter().filter(|id| picked.iter().any(|&i| ids[i] == **id)).cloned().collect()
    };
    let chat = in_list_order(&[0, 1, 6]);
    let (first, next) = listed(format!("{base}?plugin=chat&limit=2")).await?;
    assert_eq!(first, chat[..2]);
    let next = next.context("a second page")?;
    let (second, last) = listed(format!("{base}?plugin=chat&limit=2&after={next}")).await?;
    assert_eq!((second, last), (chat[2..].to_vec(), None));
    assert_eq!(listed(format!("{base}?plugin=sig")).await?.0, in_list_order(&[3, 4, 6]));
    assert_eq!(listed(format!("{base}?plugin=chat2")).await?.0, in_list_order(&[2, 3]));
    assert!(listed(format!("{base}?plugin=nope")).await?.0.is_empty());
    for bad in ["Chat", "a%25b", "chat@1"] {
        let r = api.get(&format!("{base}?plugin={bad}"), ADMIN_TOKEN).await?;
        // A bad query value is `invalid_query`, naming the parameter (issue 29 §11).
        assert_eq!((r.status, r.json["error"]["code"].as_str()), (400, Some("invalid_query")), "{bad}: {}", r.text);
        assert!(r.json["error"]["message"].as_str().unwrap().starts_with("plugin: "), "{bad}: {}", r.text);
    }
    Ok(())
}
