//! The customer portal (`/console/portal`) in a real browser: headless Chromium driven by
//! Selenium (`tests/console/portal_flow.py`) against a live `herald serve`, as
//! `tests/it/console.rs` drives the console. Two local pages on their own ports (other
//! origins) frame the portal: one listed in `portal.frame_ancestors`, one not. Screenshots
//! land in `target/artifacts/portal/`; the portal pages' load times are printed.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, FakeReceiver, HeraldProcess, herald_binary};

use crate::portal::MIN_TTL;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// A page that frames the URL in its own fragment (`#<url-encoded portal link>`).
const HOST_PAGE: &str = "<!doctype html><title>host</title><iframe id=\"portal\" name=\"portal\" \
     width=\"1200\" height=\"800\"></iframe><script>document.getElementById('portal').src = \
     decodeURIComponent(location.hash.slice(1));</script>";

/// A page of its own origin (a receiver on its own port) answering every request with
/// [`HOST_PAGE`].
async fn host_page() -> anyhow::Result<(FakeReceiver, String)> {
    let host = FakeReceiver::start().await?;
    host.set_default(Answer::status(200).header("content-type", "text/html; charset=utf-8").body(HOST_PAGE));
    let url = host.url();
    Ok((host, url))
}

fn origin(url: &str) -> anyhow::Result<String> {
    let rest = url.strip_prefix("http://").context("http")?;
    Ok(format!("http://{}", rest.split('/').next().context("host")?))
}

/// Tenants acme (branded, with a catalog type to send) and globex (an endpoint acme must
/// never see).
async fn seed(api: &tests::Api, rx: &FakeReceiver) -> anyhow::Result<Value> {
    api.tenant("acme").await?;
    api.tenant("globex").await?;
    let other_url = format!("{}/globex-private", rx.url());
    api.endpoint("globex", json!({"url": other_url})).await?;
    let schema = json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
        "required": ["order_id"], "properties": {"order_id": {"type": "string"}}});
    api.post(
        "/v1/event-types",
        ADMIN_TOKEN,
        json!({"name": "order.created", "description": "An order was placed", "schema": schema,
               "examples": [{"order_id": "ord_portal_example"}]}),
    )
    .await?
    .expect(201)?;
    let brand = json!({"name": "Acme <b>Hooks</b>", "accent": "#aa3300",
        "logo": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="});
    api.call("PUT", "/v1/tenants/acme/branding", ADMIN_TOKEN, Some(brand)).await?.expect(200)?;
    Ok(json!({
        "admin_token": ADMIN_TOKEN,
        "tenant": "acme",
        "other_tenant": "globex",
        "other_url": other_url,
        "receiver_url": format!("{}/acme", rx.url()),
        "event_type": "order.created",
        "event_type_description": "An order was placed",
        "example_marker": "ord_portal_example",
        "brand_name": "Acme <b>Hooks</b>",
        "brand_accent": "#aa3300",
        "min_ttl": MIN_TTL.1.parse::<u64>()?,
    }))
}

/// Opens a minted link, checks the code leaves the URL and the history, creates an
/// endpoint, test-sends a catalog example and sees its attempt, browses the catalog and
/// deliveries, sees nothing of another tenant, is refused after revocation and expiry, and
/// is framed by the allowed origin only.
#[tokio::test]
async fn the_portal_works_in_a_real_browser_and_frames_only_where_allowed() -> anyhow::Result<()> {
    let (allowed, allowed_url) = host_page().await?;
    let (denied, denied_url) = host_page().await?;
    let ancestors = format!("[\"{}\"]", origin(&allowed_url)?);
    let dir = tempfile::tempdir()?;
    let env = [MIN_TTL, ("HERALD_PORTAL_FRAME_ANCESTORS", ancestors.as_str())];
    let node = HeraldProcess::start(&herald_binary()?, dir.path(), &env).await?;
    let rx = FakeReceiver::start().await?;
    let mut cfg = seed(&node.api, &rx).await?;
    let shots = repo().join("target/artifacts/portal");
    cfg["base"] = json!(node.api.base);
    cfg["screenshots"] = json!(shots);
    cfg["allowed_host"] = json!(allowed_url);
    cfg["denied_host"] = json!(denied_url);
    let config = dir.path().join("portal.json");
    std::fs::write(&config, cfg.to_string())?;

    let summary =
        crate::console::browse("portal_flow.py", &[config.to_str().context("path")?], Duration::from_secs(240)).await?;
    println!("portal page loads (ms): {}", summary["page_ms"]);
    println!("the unlisted origin's frame, refused: {}", summary["csp_refusal"]);
    // The test send reached the receiver: the catalog's example, once.
    let got = rx.wait_for(1, Duration::from_secs(10)).await?;
    ensure!(got[0].json()["data"]["order_id"] == "ord_portal_example", "{:?}", got[0].json());
    ensure!(allowed.count() >= 1 && denied.count() >= 1, "both host pages were loaded");
    for page in [
        "portal-endpoints",
        "portal-test-send-attempt",
        "portal-catalog",
        "portal-catalog-type",
        "portal-deliveries",
        "portal-revoked",
        "portal-link-used",
        "portal-expired",
        "portal-framed-allowed",
        "portal-framed-denied",
    ] {
        let png = std::fs::read(shots.join(format!("{page}.png"))).with_context(|| format!("screenshot {page}"))?;
        ensure!(png.starts_with(b"\x89PNG"), "{page}.png is not a PNG");
    }
    Ok(())
}

/// The portal page carries the configured `frame-ancestors`; the console keeps `'none'`.
#[tokio::test]
async fn only_the_portal_page_may_be_framed() -> anyhow::Result<()> {
    let env = [("HERALD_PORTAL_FRAME_ANCESTORS", "[\"https://app.example.com\", \"http://127.0.0.1:8081\"]")];
    let gw = tests::TestGateway::start_with(&env).await?;
    let csp = |r: &tests::Reply| {
        r.headers.get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
    };
    let portal = gw.api.raw("GET", "/console/portal", None, "").await?.expect(200)?;
    ensure!(
        csp(&portal).ends_with("frame-ancestors https://app.example.com http://127.0.0.1:8081"),
        "{}",
        csp(&portal)
    );
    ensure!(csp(&portal).contains("script-src 'self'"), "{}", csp(&portal));
    for page in ["/console", "/console/", "/console/index.html", "/console/app.js"] {
        let r = gw.api.raw("GET", page, None, "").await?.expect(200)?;
        ensure!(csp(&r).ends_with("frame-ancestors 'none'"), "{page}: {}", csp(&r));
    }
    Ok(())
}
