//! The API contract, `GET /openapi.json`: it matches the router route for route and scope
//! for scope; schemathesis runs it against a live `herald serve` on both backends (no 5xx,
//! every response as documented); and a Python client generated from the live document
//! drives a whole delivery. The Python tools come from `scripts/pytools` (run by
//! `scripts/test`); a missing tool fails these tests, it never skips them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, Backend, FakeReceiver, HeraldProcess, TestGateway, herald_binary, pg};

tests::backends!(schemathesis_finds_nothing);

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

/// The routes DESIGN.md names: each must be in the document.
const DESIGN_ROUTES: &[(&str, &str)] = &[
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("post", "/v1/tenants"),
    ("post", "/v1/tenants/{tenant}/tokens"),
    ("post", "/v1/tenants/{tenant}/endpoints"),
    ("get", "/v1/tenants/{tenant}/endpoints"),
    ("get", "/v1/tenants/{tenant}/endpoints/{id}"),
    ("patch", "/v1/tenants/{tenant}/endpoints/{id}"),
    ("delete", "/v1/tenants/{tenant}/endpoints/{id}"),
    ("post", "/v1/tenants/{tenant}/endpoints/{id}/enable"),
    ("post", "/v1/tenants/{tenant}/endpoints/{id}/rotate-secret"),
    ("post", "/v1/tenants/{tenant}/events"),
    ("get", "/v1/tenants/{tenant}/events/{id}"),
    ("get", "/v1/tenants/{tenant}/events/{id}/deliveries"),
    ("get", "/v1/tenants/{tenant}/deliveries/{id}"),
    ("get", "/v1/tenants/{tenant}/dead-letters"),
    ("post", "/v1/tenants/{tenant}/replays"),
    ("get", "/v1/tenants/{tenant}/replays/{id}"),
    ("put", "/v1/tenants/{tenant}/plugins/{name}"),
    ("get", "/v1/tenants/{tenant}/plugins"),
];

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// A tool of the contract tests' virtualenv.
pub(crate) fn pytool(name: &str) -> anyhow::Result<PathBuf> {
    let path = repo().join("target/pytools/venv/bin").join(name);
    ensure!(path.exists(), "{} is missing: run scripts/pytools (scripts/test does)", path.display());
    Ok(path)
}

/// Runs `cmd` to completion within `limit`, killing it if it overruns.
pub(crate) async fn run(mut cmd: tokio::process::Command, limit: Duration) -> anyhow::Result<Output> {
    cmd.kill_on_drop(true).stdin(std::process::Stdio::null());
    tokio::time::timeout(limit, cmd.output())
        .await
        .with_context(|| format!("{cmd:?} ran over {limit:?}"))?
        .context("spawn")
}

pub(crate) fn text(out: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// (method, path) of every operation in `doc`.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| item.as_object().expect("path item").keys().map(move |m| (m.clone(), path.clone())))
        .filter(|(m, _)| METHODS.iter().any(|x| x.eq_ignore_ascii_case(m)))
        .collect()
}

async fn document(api: &tests::Api) -> anyhow::Result<Value> {
    let r = api.raw("GET", "/openapi.json", None, "").await?;
    ensure!(r.status == 200, "GET /openapi.json without a token: {} {}", r.status, r.text);
    ensure!(r.json["openapi"] == "3.1.0", "not OpenAPI 3.1: {}", r.json["openapi"]);
    Ok(r.json)
}

#[tokio::test]
async fn every_route_is_documented_and_every_operation_is_routed() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let doc = document(&gw.api).await?;
    let ops = operations(&doc);
    for (m, p) in DESIGN_ROUTES {
        assert!(ops.contains(&(m.to_string(), p.to_string())), "{m} {p} is not in the document");
    }
    let paths: BTreeSet<&String> = ops.iter().map(|(_, p)| p).collect();
    for path in paths {
        let concrete = path.replace("{tenant}", "acme").replace("{id}", "x").replace("{name}", "x");
        for method in METHODS {
            let r = gw.api.raw(method, &concrete, Some(ADMIN_TOKEN), "").await?;
            let documented = ops.contains(&(method.to_lowercase(), path.clone()));
            if documented {
                // Routed: whatever the handler says, it is not the router's own refusal.
                assert_ne!(r.status, 405, "{method} {path} is documented but not routed");
                assert_ne!(r.json["error"]["message"], "no such route", "{method} {path} is documented but not routed");
            } else {
                assert_eq!(r.status, 405, "{method} {path} is routed but not documented: {}", r.text);
            }
        }
    }
    Ok(())
}

/// `herald openapi` prints what `/openapi.json` serves, for clients generated offline.
#[tokio::test]
async fn the_cli_prints_the_served_document() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let served = document(&gw.api).await?;
    let mut cli = tokio::process::Command::new(herald_binary()?);
    cli.arg("openapi");
    let out = run(cli, Duration::from_secs(30)).await?;
    ensure!(out.status.success(), "herald openapi: {}", text(&out));
    let printed: Value = serde_json::from_slice(&out.stdout).context("herald openapi prints JSON")?;
    assert_eq!(printed, served);
    Ok(())
}

/// Each tenant operation names the scope its handler demands: a token with exactly that
/// scope gets past authorisation, a token with every other scope gets `403`.
#[tokio::test]
async fn the_documented_scopes_are_the_enforced_ones() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    let doc = document(&gw.api).await?;
    let all = ["events:write", "read", "manage", "replay", "poll"];
    for (method, path) in operations(&doc).into_iter().filter(|(_, p)| p.starts_with("/v1/tenants/{tenant}")) {
        let security = &doc["paths"][&path][&method]["security"];
        if security.is_null() {
            // A public route (the tenant's JWKS): answered without any token.
            let concrete = path.replace("{tenant}", "acme");
            let r = gw.api.raw(&method.to_uppercase(), &concrete, None, "").await?;
            assert_eq!(
                r.status, 200,
                "{method} {path} documents no security but refuses a caller without a token: {}",
                r.text
            );
            continue;
        }
        let scopes: Vec<&str> = security
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["tenant_token"].as_array())
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let concrete = path.replace("{tenant}", "acme").replace("{id}", "x").replace("{name}", "x");
        let others: Vec<&str> = all.iter().copied().filter(|s| !scopes.contains(s)).collect();
        let outsider = gw.api.token("acme", &others).await?;
        let r = gw.api.raw(&method.to_uppercase(), &concrete, Some(&outsider), "").await?;
        assert_eq!(r.status, 403, "{method} {path} with scopes {others:?} (documented: {scopes:?}): {}", r.text);
        if let [scope] = scopes[..] {
            let insider = gw.api.token("acme", &[scope]).await?;
            let r = gw.api.raw(&method.to_uppercase(), &concrete, Some(&insider), "").await?;
            assert_ne!(r.status, 403, "{method} {path} refuses its documented scope {scope}: {}", r.text);
        } else {
            // Only the admin's routes name no tenant scope.
            let admins = ["/tokens", "/portal-sessions", "/branding"];
            assert!(scopes.is_empty() && admins.iter().any(|a| path.contains(a)), "{method} {path}: scopes {scopes:?}");
        }
    }
    Ok(())
}

/// A tenant with an endpoint, an event and its delivery, for schemathesis's path
/// parameters (`tests/contract/schemathesis.toml`).
async fn seed(api: &tests::Api, receiver: &FakeReceiver) -> anyhow::Result<Vec<(&'static str, String)>> {
    api.tenant("acme").await?;
    let endpoint = api.endpoint("acme", json!({ "url": receiver.url() })).await?;
    let event = api.event("acme", json!({ "type": "invoice.paid", "payload": {"n": 1} })).await?;
    ensure!(event.status == 202, "event: {} {}", event.status, event.text);
    let event = event.json["id"].as_str().context("event id")?.to_string();
    let page = api.get(&format!("/v1/tenants/acme/events/{event}/deliveries"), ADMIN_TOKEN).await?;
    let delivery = page.json["data"][0]["id"].as_str().context("delivery id")?.to_string();
    Ok(vec![
        ("HERALD_CONTRACT_ENDPOINT", endpoint["id"].as_str().context("endpoint id")?.to_string()),
        ("HERALD_CONTRACT_EVENT", event),
        ("HERALD_CONTRACT_DELIVERY", delivery),
    ])
}

/// Schemathesis against a live `herald serve` on `backend`: every operation, generated and
/// hostile input, stateful sequences; it fails on any 5xx and on any response (status,
/// content type, headers, body) that the document does not describe.
async fn schemathesis_finds_nothing(backend: Backend) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let schema = match backend {
        Backend::Postgres => Some(pg::PgSchema::create().await?),
        Backend::Sqlite => None,
    };
    let env: Vec<(&str, &str)> = schema.iter().map(|s| ("HERALD_STORE_URL", s.url.as_str())).collect();
    let node = HeraldProcess::start(&herald_binary()?, dir.path(), &env).await?;
    let receiver = FakeReceiver::start().await?;
    let ids = seed(&node.api, &receiver).await?;
    let ops = operations(&document(&node.api).await?).len();
    // Bounded so the suite stays quick: about 20 s per backend.
    let examples = std::env::var("HERALD_CONTRACT_EXAMPLES").unwrap_or_else(|_| "40".into());
    let mut st = tokio::process::Command::new(pytool("st")?);
    st.current_dir(dir.path())
        .env("HERALD_CONTRACT_TENANT", "acme")
        .envs(ids)
        .arg("--config-file")
        .arg(repo().join("tests/contract/schemathesis.toml"))
        .args(["--no-color", "run", &format!("{}/openapi.json", node.api.base)])
        .args(["--header", &format!("Authorization: Bearer {ADMIN_TOKEN}")])
        .args(["--checks", "not_a_server_error,status_code_conformance,content_type_conformance"])
        .args(["--checks", "response_headers_conformance,response_schema_conformance"])
        .args(["--checks", "negative_data_rejection,unsupported_method"])
        // Coverage: boundary and hostile values for every parameter and field.
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        .args(["--max-examples", &examples, "--workers", "1", "--request-timeout", "20"])
        .args(["--generation-database", "none"]);
    let out = run(st, Duration::from_secs(600)).await?;
    let report = text(&out);
    ensure!(out.status.success(), "schemathesis on {backend:?} found problems:\n{report}");
    // Every operation but `/openapi.json` itself, which schemathesis leaves out.
    ensure!(report.contains(&format!("Tested: {}", ops - 1)), "schemathesis did not test every operation:\n{report}");
    // The figures, for whoever reads the test's output.
    for line in report.lines().filter(|l| l.contains("generated,") || l.contains("Tested:")) {
        println!("schemathesis {backend:?}: {}", line.trim());
    }
    Ok(())
}

/// Generates a Python client from the live document, then runs `client_flow.py` with it:
/// tenant, token, endpoint, event, delivery, dead letter (the receiver answers 422), replay,
/// delivered (it answers 200).
#[tokio::test]
async fn a_client_generated_from_the_live_document_drives_a_whole_delivery() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let node = HeraldProcess::start(&herald_binary()?, dir.path(), &[]).await?;
    let receiver = FakeReceiver::start().await?;
    receiver.script([Answer::status(422)]);

    let work = tempfile::tempdir()?;
    std::fs::write(work.path().join("openapi.json"), document(&node.api).await?.to_string())?;
    // No formatter run after generating: nothing reads the code but Python. `herald listen`'s
    // stream is NDJSON, one JSON object a line: to the generated client, text.
    let config = "post_hooks: []\ncontent_type_overrides:\n  application/x-ndjson: text/plain\n";
    std::fs::write(work.path().join("generator.yml"), config)?;
    let mut generate = tokio::process::Command::new(pytool("openapi-python-client")?);
    generate.current_dir(work.path()).args([
        "generate",
        "--path=openapi.json",
        "--meta=none",
        "--output-path=herald_client",
        "--config=generator.yml",
        "--fail-on-warning",
    ]);
    let out = run(generate, Duration::from_secs(120)).await?;
    ensure!(out.status.success(), "openapi-python-client refused the document:\n{}", text(&out));

    let mut flow = tokio::process::Command::new(pytool("python")?);
    flow.env("PYTHONPATH", work.path()).arg(repo().join("tests/contract/client_flow.py")).args([
        node.api.base.as_str(),
        ADMIN_TOKEN,
        &receiver.url(),
    ]);
    let out = run(flow, Duration::from_secs(120)).await?;
    ensure!(out.status.success(), "the generated client's flow failed:\n{}", text(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).context("client_flow.py's summary")?;
    assert_eq!(summary["statuses"], json!([422, 200]));

    // The receiver saw the same event twice: the failed attempt and the replayed one.
    let got = receiver.wait_for(2, Duration::from_secs(10)).await?;
    assert_eq!(got.len(), 2, "{got:?}");
    for r in &got {
        assert_eq!(r.header("webhook-id"), summary["event"].as_str());
        assert_eq!(r.json()["data"], json!({"amount": 42, "currency": "EUR"}));
    }
    Ok(())
}
