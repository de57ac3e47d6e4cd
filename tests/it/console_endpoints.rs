//! Endpoints added, edited and deleted from the console and from the customer portal, in
//! headless Chromium (`tests/console/endpoints_flow.py`, as `console.rs` drives the
//! console): the new signing secret shown once and copyable, then the deliveries at the
//! edited URL with the edited headers (and through the edited content filter), signed with
//! that secret. In the same browser: the
//! pages at 420 px, queue endpoints' destinations, the test send's example, what the portal
//! leaves out, replays with their filters in a narrow frame, dates typed as UTC, `/` and the
//! favicon. Screenshots land in `target/artifacts/console/` and `target/artifacts/portal/`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, FakeReceiver, HeraldProcess, herald_binary};

/// The example payload the catalog offers for a test send (its marker is what the page must show).
const EXAMPLE_MARKER: &str = "ord_example_7731";
const OPERATOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// Dead letters the failing endpoint makes.
const DEAD: usize = 3;

/// A page of its own origin that frames the portal link in its fragment in a frame 720 px
/// wide: a platform's page with a sidebar.
const NARROW_HOST_PAGE: &str = "<!doctype html><title>host</title><body style=\"margin:0\">\
     <iframe id=\"portal\" name=\"portal\" width=\"720\" height=\"900\" style=\"border:0\"></iframe>\
     <script>document.getElementById('portal').src = decodeURIComponent(location.hash.slice(1));</script>";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn origin(url: &str) -> anyhow::Result<String> {
    let rest = url.strip_prefix("http://").context("http")?;
    Ok(format!("http://{}", rest.split('/').next().context("host")?))
}

/// Tenant acme with a catalog (a type with an example to test-send), an endpoint with a
/// long URL, a NATS and a Redis Streams endpoint, and dead letters replayed twice (by ids,
/// then by a filter); tenant globex beside it.
async fn seed(api: &tests::Api, ok: &FakeReceiver, bad: &FakeReceiver) -> anyhow::Result<Value> {
    api.tenant("acme").await?;
    api.tenant("globex").await?;
    for (name, examples) in [
        ("order.created", json!([{"order_id": EXAMPLE_MARKER, "total": 1999}])),
        ("order.shipped", json!([])),
        ("order.failed", json!([])),
        ("stock.changed", json!([])),
    ] {
        let t = json!({"name": name, "description": format!("{name} happened"), "examples": examples});
        api.post("/v1/event-types", ADMIN_TOKEN, t).await?.expect(201)?;
    }
    let long_url = format!("{}/hooks/acme-production/orders-and-shipments/receiver?source=herald", ok.url());
    api.endpoint("acme", json!({"url": long_url, "description": "the long one", "event_types": ["stock.changed"]}))
        .await?;
    let nats = json!({"kind": "nats", "url": "nats://127.0.0.1:4222", "destination": {"subject": "orders.{type}"},
        "event_types": ["stock.changed"]});
    api.endpoint("acme", nats).await?;
    let redis = json!({"kind": "redis-stream", "url": "redis://127.0.0.1:6379",
        "destination": {"stream": "herald:{tenant}"}, "event_types": ["stock.changed"]});
    api.endpoint("acme", redis).await?;
    bad.set_default(Answer::status(422));
    let failing = api.endpoint("acme", json!({"url": bad.url(), "event_types": ["order.failed"]})).await?;
    let failing = failing["id"].as_str().context("id")?.to_string();
    for n in 0..DEAD {
        let e = json!({"id": format!("evt_failed_{n}"), "type": "order.failed", "payload": {"n": n}});
        api.event("acme", e).await?.expect(202)?;
    }
    let dead = api
        .wait_for("/v1/tenants/acme/dead-letters", Duration::from_secs(30), |j| {
            j["data"].as_array().is_some_and(|d| d.len() == DEAD)
        })
        .await?;
    let ids: Vec<&str> = dead["data"].as_array().context("data")?.iter().filter_map(|d| d["id"].as_str()).collect();
    replay(api, json!({"ids": ids[..2], "rate_per_sec": 100})).await?;
    let filter = json!({"endpoint": failing, "reason": "permanent:422", "since": "2000-01-01T00:00:00Z"});
    replay(api, json!({"filter": filter, "rate_per_sec": 100})).await?;
    Ok(json!({
        "admin_token": ADMIN_TOKEN,
        "tenant": "acme",
        "long_url": long_url,
        "event_type": "order.created",
        "edited_types": "order.created, order.shipped",
        "example_marker": EXAMPLE_MARKER,
        "nats_target": "subject orders.{type}",
        "redis_target": "stream herald:{tenant}",
        "failing_endpoint": failing,
        "replayed_ids": 2,
        "dead": DEAD,
    }))
}

/// Starts a replay and waits until it is done.
async fn replay(api: &tests::Api, body: Value) -> anyhow::Result<()> {
    let r = api.post("/v1/tenants/acme/replays", ADMIN_TOKEN, body).await?.expect(202)?;
    let path = format!("/v1/tenants/acme/replays/{}", r.json["id"].as_str().context("replay id")?);
    api.wait_for(&path, Duration::from_secs(30), |j| j["state"] == "done").await.map(drop)
}

/// Item 9 of issue 48, in both modes: an endpoint added in the browser shows its signing
/// secret once (and it is the one that signs); its URL, description, event types, content
/// filter and headers are edited there, and deliveries follow the edit; it is deleted there. Issue
/// 48's item 24 and the console half of item 23 are checked in the same browser.
#[tokio::test]
async fn endpoints_are_added_edited_and_deleted_in_the_console_and_the_portal() -> anyhow::Result<()> {
    let (ok, bad, rx, operator) = (
        FakeReceiver::start().await?,
        FakeReceiver::start().await?,
        FakeReceiver::start().await?,
        FakeReceiver::start().await?,
    );
    let host = FakeReceiver::start().await?;
    host.set_default(Answer::status(200).header("content-type", "text/html; charset=utf-8").body(NARROW_HOST_PAGE));
    let ancestors = format!("[\"{}\"]", origin(&host.url())?);
    let operator_url = operator.url();
    let env = [
        ("HERALD_PORTAL_FRAME_ANCESTORS", ancestors.as_str()),
        ("HERALD_OPERATOR_URL", operator_url.as_str()),
        ("HERALD_OPERATOR_SECRET", OPERATOR_SECRET),
    ];
    let dir = tempfile::tempdir()?;
    let node = HeraldProcess::start(&herald_binary()?, dir.path(), &env).await?;
    let mut cfg = seed(&node.api, &ok, &bad).await?;
    cfg["base"] = json!(node.api.base);
    cfg["host"] = json!(host.url());
    cfg["screenshots"] = json!({"console": repo().join("target/artifacts/console"),
        "portal": repo().join("target/artifacts/portal")});
    for mode in ["console", "portal"] {
        cfg[mode] = json!({"url": format!("{}/{mode}-first", rx.url()), "edited_url": format!("{}/{mode}-edited", rx.url()),
            "description": format!("added in the {mode}"), "edited_description": format!("edited in the {mode}"),
            "header": format!("X-Customer: {mode}-42"), "event": format!("evt_{mode}_edited")});
    }
    let config = dir.path().join("endpoints.json");
    std::fs::write(&config, cfg.to_string())?;

    let summary =
        crate::console::browse("endpoints_flow.py", &[config.to_str().context("path")?], Duration::from_secs(300))
            .await?;
    for mode in ["console", "portal"] {
        let got = &summary[mode];
        let (id, secret) = (got["id"].as_str().context("id")?, got["secret"].as_str().context("secret")?);
        // Deleted from the page: gone from the API.
        let gone = node.api.get(&format!("/v1/tenants/acme/endpoints/{id}"), ADMIN_TOKEN).await?;
        ensure!(gone.status == 404, "{mode}: {id} still answers {}", gone.status);
        // The event sent after the edit went to the edited URL, with the edited header,
        // signed with the secret the page showed.
        let event = cfg[mode]["event"].as_str().context("event")?;
        let at = rx.received().into_iter().filter(|r| r.json()["id"] == event).collect::<Vec<_>>();
        ensure!(at.len() == 1, "{mode}: {event} arrived {} times", at.len());
        let r = &at[0];
        ensure!(r.path.ends_with(&format!("/{mode}-edited")), "{mode}: sent to {}", r.path);
        ensure!(r.header("x-customer") == Some(format!("{mode}-42").as_str()), "{mode}: headers {:?}", r.headers);
        let (ts, sig) =
            (r.header("webhook-timestamp").context("timestamp")?, r.header("webhook-signature").context("sig")?);
        let key = gateway::sign::Secret::parse(secret).map_err(|e| anyhow::anyhow!("{e}"))?;
        ensure!(
            gateway::sign::verify(&key, event, ts.parse()?, &r.body, sig),
            "{mode}: the shown secret does not verify {sig}"
        );
        ensure!(
            !rx.received().iter().any(|r| r.path.ends_with(&format!("/{mode}-first"))),
            "{mode}: sent to the old URL"
        );
    }
    let shots = repo().join("target/artifacts");
    crate::console::screenshots_taken(
        &shots,
        &[
            "console/console-endpoint-added-secret",
            "console/console-endpoint-edited",
            "console/console-edited-delivery-headers",
            "console/console-endpoint-delete-confirm",
            "console/console-endpoint-deleted",
            "console/console-narrow-endpoints",
            "console/console-replays-with-filters",
            "portal/portal-endpoint-added-secret",
            "portal/portal-endpoint-edited",
            "portal/portal-edited-delivery-headers",
            "portal/portal-endpoint-delete-confirm",
            "portal/portal-endpoint-deleted",
            "portal/portal-narrow-endpoints",
            "portal/portal-replays-in-a-narrow-frame",
        ],
    )
}

/// `/` sends a browser to the console and `/favicon.ico` to its icon, an SVG served like the
/// console's other files.
#[tokio::test]
async fn the_root_and_the_favicon_lead_to_the_console() -> anyhow::Result<()> {
    let gw = tests::TestGateway::start().await?;
    for (path, to) in [("/", "/console/"), ("/favicon.ico", "/console/favicon.svg")] {
        let r = gw.api.raw("GET", path, None, "").await?;
        let location = r.headers.get("location").and_then(|v| v.to_str().ok());
        ensure!((r.status, location) == (307, Some(to)), "GET {path}: {} {location:?} {}", r.status, r.text);
        ensure!(gw.api.raw("POST", path, Some(ADMIN_TOKEN), "").await?.status == 405, "POST {path}");
    }
    let icon = gw.api.raw("GET", "/console/favicon.svg", None, "").await?.expect(200)?;
    let kind = icon.headers.get("content-type").and_then(|v| v.to_str().ok());
    ensure!(kind == Some("image/svg+xml") && icon.text.starts_with("<svg"), "{kind:?} {}", icon.text);
    let page = gw.api.raw("GET", "/console/", None, "").await?.expect(200)?;
    ensure!(page.text.contains("<link rel=\"icon\" href=\"/console/favicon.svg\""), "no icon in the page");
    Ok(())
}

/// Herald's own tenant `herald-ops` (the operational events) is not one of the platform's:
/// `/v1/tenants` and the overview's count leave it out, while the admin still reads its
/// deliveries at `/v1/tenants/herald-ops/…`.
#[tokio::test]
async fn the_operational_tenant_is_not_listed_but_stays_reachable() -> anyhow::Result<()> {
    let operator = FakeReceiver::start().await?;
    let url = operator.url();
    let env = [("HERALD_OPERATOR_URL", url.as_str()), ("HERALD_OPERATOR_SECRET", OPERATOR_SECRET)];
    let gw = tests::TestGateway::start_with(&env).await?;
    gw.api.tenant("acme").await?;
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(410));
    gw.api.endpoint("acme", json!({"url": rx.url()})).await?;
    gw.api.event("acme", json!({"id": "evt_gone", "type": "a.b", "payload": {}})).await?.expect(202)?;
    // The 410 disables the endpoint: Herald tells the operator, through herald-ops.
    operator.wait_for(1, Duration::from_secs(15)).await?;
    let listed = gw.api.get("/v1/tenants", ADMIN_TOKEN).await?.expect(200)?;
    let ids: Vec<&str> =
        listed.json["data"].as_array().context("data")?.iter().filter_map(|t| t["id"].as_str()).collect();
    ensure!(ids == ["acme"], "{ids:?}");
    let overview = gw.api.get("/v1/overview", ADMIN_TOKEN).await?.expect(200)?;
    ensure!(overview.json["tenants"] == 1, "{}", overview.text);
    let ops = gw.api.get("/v1/tenants/herald-ops/deliveries", ADMIN_TOKEN).await?.expect(200)?;
    ensure!(ops.json["data"].as_array().is_some_and(|d| !d.is_empty()), "{}", ops.text);
    Ok(())
}
