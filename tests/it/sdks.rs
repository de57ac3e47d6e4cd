//! The SDKs under `sdks/` (TypeScript, Python, Go): clients generated from `/openapi.json` by
//! `sdks/generate`, each with webhook verification, an example and tests of its own. Here: the
//! committed document and clients are what a node serves and the generator writes; the
//! conformance vectors of `sdks/vectors/` hold for Herald's own signer and API; and each
//! SDK's tests and example run against a live node, as child processes (`node`, `python`,
//! `go`) given its URL. The tools come from `scripts/sdk-tools` and `scripts/pytools` (run by
//! `scripts/test`); a missing one fails these tests, it never skips them.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use anyhow::{Context, ensure};
use gateway::sign::{self, Secret, v1a};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Backend, TestGateway};
use tokio::process::Command;

use crate::contract::{pytool, repo, run, text};

tests::backends!(
    the_api_error_vectors_hold,
    the_typescript_sdk_passes_its_tests_and_example_against_a_live_node,
    the_python_sdk_passes_its_tests_and_example_against_a_live_node,
    the_go_sdk_passes_its_tests_and_example_against_a_live_node,
);

/// A token no node issued (the `bogus` of the error vectors).
const BOGUS_TOKEN: &str = "hrld_not_a_token_herald_issued";

fn sdks() -> PathBuf {
    repo().join("sdks")
}

fn vectors(name: &str) -> anyhow::Result<Value> {
    let path = sdks().join("vectors").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path)?).with_context(|| path.display().to_string())
}

fn str_of<'a>(v: &'a Value, key: &str) -> anyhow::Result<&'a str> {
    v[key].as_str().with_context(|| format!("{key} in {v}"))
}

/// Every `sign` vector gives exactly its signature with `gateway::sign` (`v1`) and
/// `sign::v1a` (`v1a`); every `verify` vector's signature verifies with Herald's check or
/// not, as it says. Herald's check has no clock: a vector refused for its timestamp alone
/// carries a good signature, refused by the SDKs' tolerance.
#[test]
fn the_signature_vectors_hold_for_heralds_signer() -> anyhow::Result<()> {
    let all = vectors("signatures.json")?;
    let tolerance = all["tolerance_seconds"].as_i64().context("tolerance_seconds")?;
    let sign_vectors = all["sign"].as_array().context("sign")?;
    ensure!(sign_vectors.iter().any(|v| v["key"].as_str().is_some_and(|k| k.starts_with("whsk_"))), "no v1a vector");
    for v in sign_vectors {
        let (key, id, body) = (str_of(v, "key")?, str_of(v, "id")?, str_of(v, "body")?.as_bytes());
        let ts = v["timestamp"].as_i64().context("timestamp")?;
        let got = match key.strip_prefix("whsk_") {
            None => sign::signature(&Secret::parse(key)?, id, ts, body),
            Some(_) => v1a::signatures(&[&v1a::SigningKey::parse(key)?], id, ts, body).join(" "),
        };
        ensure!(got == str_of(v, "signature")?, "{}: Herald signs {got}", str_of(v, "name")?);
    }
    for v in all["verify"].as_array().context("verify")? {
        let (key, id, body, header) =
            (str_of(v, "key")?, str_of(v, "id")?, str_of(v, "body")?.as_bytes(), str_of(v, "signature")?);
        let name = str_of(v, "name")?;
        let ts = str_of(v, "timestamp")?.parse::<i64>().ok();
        let signed = ts.is_some_and(|ts| match key.strip_prefix("whpk_") {
            None => Secret::parse(key).is_ok_and(|s| sign::verify(&s, id, ts, body, header)),
            Some(_) => v1a::PublicKey::parse(key).is_ok_and(|k| v1a::verify(&k, id, ts, body, header)),
        });
        let now = v["now"].as_i64().context("now")?;
        let in_time = ts.is_some_and(|ts| (now - ts).abs() <= tolerance);
        ensure!(
            (signed && in_time) == v["valid"].as_bool().context("valid")?,
            "{name}: signed {signed}, in time {in_time}"
        );
        match str_of(v, "why") {
            Ok("signature") => ensure!(!signed, "{name}: Herald verifies it"),
            Ok("timestamp") => ensure!(!in_time && (signed || ts.is_none()), "{name}: its signature is good"),
            _ => ensure!(v["valid"] == true, "{name}: a failing vector says why"),
        }
    }
    Ok(())
}

/// The operation `id` of the document: its method and path template.
fn operation<'a>(doc: &'a Value, id: &str) -> anyhow::Result<(String, &'a str)> {
    let paths = doc["paths"].as_object().context("paths")?;
    paths
        .iter()
        .flat_map(|(path, item)| item.as_object().into_iter().flatten().map(move |(m, op)| (m, path, op)))
        .find(|(_, _, op)| op["operationId"] == id)
        .map(|(m, path, _)| (m.to_uppercase(), path.as_str()))
        .with_context(|| format!("no operation {id} in /openapi.json"))
}

/// `$tenant` in every string of `v` replaced by `tenant`.
fn substitute(v: &Value, tenant: &str) -> Value {
    match v {
        Value::String(s) => Value::String(s.replace("$tenant", tenant)),
        Value::Array(items) => Value::Array(items.iter().map(|i| substitute(i, tenant)).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, i)| (k.clone(), substitute(i, tenant))).collect()),
        other => other.clone(),
    }
}

/// The error vectors, sent as raw HTTP (what each names in `/openapi.json`) to a node on
/// `backend`: each gets its status, code and message, and nothing is written.
async fn the_api_error_vectors_hold(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    let doc = api.raw("GET", "/openapi.json", None, "").await?.expect(200)?.json;
    api.tenant("acme").await?;
    let read = api.token("acme", &["read"]).await?;
    let all = vectors("errors.json")?;
    let errors = all["errors"].as_array().context("errors")?;
    ensure!(errors.len() >= 10, "{} error vectors", errors.len());
    for v in errors {
        let name = str_of(v, "name")?;
        let (method, template) = operation(&doc, str_of(v, "operation")?)?;
        let mut path = template.to_string();
        for (param, value) in v["params"].as_object().into_iter().flatten() {
            path = path.replace(&format!("{{{param}}}"), substitute(value, "acme").as_str().context("a param")?);
        }
        let query: Vec<String> =
            v["query"].as_object().into_iter().flatten().map(|(k, q)| format!("{k}={q}")).collect();
        if !query.is_empty() {
            path = format!("{path}?{}", query.join("&"));
        }
        let token = match str_of(v, "token")? {
            "admin" => Some(ADMIN_TOKEN),
            "read" => Some(read.as_str()),
            "bogus" => Some(BOGUS_TOKEN),
            _ => None,
        };
        let body = if v["body"].is_null() { String::new() } else { substitute(&v["body"], "acme").to_string() };
        let r = api.raw(&method, &path, token, body).await?;
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        ensure!(
            r.status == v["status"] && r.json["error"]["code"] == v["code"],
            "{name}: {method} {path}: {} {}",
            r.status,
            r.text
        );
        let prefix = v["message_starts_with"].as_str().unwrap_or_default();
        ensure!(message.starts_with(prefix), "{name}: {message:?} does not start with {prefix:?}");
    }
    let endpoints = api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.json;
    ensure!(endpoints["data"] == json!([]), "an endpoint was written: {endpoints}");
    let tenants = api.get("/v1/tenants", ADMIN_TOKEN).await?.json;
    ensure!(tenants["data"].as_array().is_some_and(|t| t.len() == 1), "a tenant was written: {tenants}");
    Ok(())
}

/// The paths and schemas the two documents do not share alike, for the failure's message.
fn differences(served: &Value, committed: &Value) -> String {
    let mut changed = Vec::new();
    for at in ["/paths", "/components/schemas"] {
        let (a, b) = (served.pointer(at), committed.pointer(at));
        let keys: BTreeSet<&String> =
            [a, b].into_iter().flatten().filter_map(Value::as_object).flat_map(|m| m.keys()).collect();
        changed.extend(keys.into_iter().filter(|k| a.map(|a| &a[k.as_str()]) != b.map(|b| &b[k.as_str()])));
    }
    format!("differing: {changed:?}")
}

/// `sdks/openapi.json` is what `/openapi.json` serves, and `sdks/generate` run on it writes
/// exactly the committed clients: a route or schema changed without regenerating fails here.
#[tokio::test]
async fn the_committed_sdks_are_generated_from_the_served_document() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let served = gw.api.raw("GET", "/openapi.json", None, "").await?.expect(200)?.json;
    let committed: Value = serde_json::from_str(&std::fs::read_to_string(sdks().join("openapi.json"))?)?;
    ensure!(
        served == committed,
        "sdks/openapi.json is not what /openapi.json serves ({}): run sdks/generate \
         (`target/debug/herald openapi | sdks/generate --spec -`)",
        differences(&served, &committed)
    );
    let out = tempfile::tempdir()?;
    let mut generate = Command::new(sdks().join("generate"));
    generate.arg("--out").arg(out.path());
    let generated = expect_success(run(generate, Duration::from_secs(60)).await?, "sdks/generate")?;
    let written: Vec<&str> = std::str::from_utf8(&generated.stdout)?.lines().collect();
    ensure!(written.len() == 3, "sdks/generate wrote {written:?}");
    for rel in written {
        let fresh = std::fs::read_to_string(out.path().join(rel))?;
        let committed = std::fs::read_to_string(sdks().join(rel)).unwrap_or_default();
        ensure!(
            fresh == committed,
            "sdks/{rel} is not what sdks/generate writes from sdks/openapi.json: run sdks/generate"
        );
    }
    Ok(())
}

fn expect_success(out: Output, what: &str) -> anyhow::Result<Output> {
    ensure!(out.status.success(), "{what} failed:\n{}", text(&out));
    Ok(out)
}

/// The folder `scripts/sdk-tools` installs into: `sdk-tools` in this build's target directory.
fn sdk_tools() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.ancestors().find(|d| d.join("sdk-tools").is_dir()).map(|d| d.join("sdk-tools"));
    dir.with_context(|| format!("no sdk-tools above {}: run scripts/sdk-tools (scripts/test does)", exe.display()))
}

/// What each SDK's tests and example are given: the node, its admin token, the vectors.
fn live(cmd: &mut Command, gw: &TestGateway, tenant: &str) {
    cmd.env("HERALD_URL", &gw.api.base)
        .env("HERALD_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("HERALD_SDK_VECTORS", sdks().join("vectors"))
        .env("HERALD_TENANT", tenant);
}

/// The example's two lines: the event it posted was accepted, and its receiver verified it.
fn example_verified(out: Output, what: &str) -> anyhow::Result<()> {
    let out = expect_success(out, what)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let id = stdout.lines().find_map(|l| l.strip_prefix("accepted ")).with_context(|| format!("{what}:\n{stdout}"))?;
    let verified = format!("verified {id}: ");
    let line = stdout.lines().find(|l| l.starts_with(&verified)).with_context(|| format!("{what}:\n{stdout}"))?;
    let envelope: Value = serde_json::from_str(&line[verified.len()..])?;
    ensure!(envelope["data"] == json!({"amount": 1999, "currency": "EUR"}), "{what}: {line}");
    Ok(())
}

/// Every test name ran and passed in a runner's report.
fn passed(report: &str, names: &[&str], what: &str) -> anyhow::Result<()> {
    for name in names {
        ensure!(
            report.lines().any(|l| l.contains(name) && !l.contains("skip")),
            "{what}: {name} did not pass:\n{report}"
        );
    }
    Ok(())
}

/// `tsc` (pinned by `sdks/typescript/package-lock.json`) builds the SDK, its tests and its
/// example; `node --test` runs the tests (the vectors, then the live node); the example
/// delivers and verifies one event.
async fn the_typescript_sdk_passes_its_tests_and_example_against_a_live_node(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let modules = sdk_tools()?.join("typescript/node_modules");
    let dist = tempfile::tempdir()?;
    let mut tsc = Command::new("node");
    tsc.arg(modules.join("typescript/bin/tsc"))
        .arg("-p")
        .arg(sdks().join("typescript"))
        .arg("--outDir")
        .arg(dist.path())
        .arg("--typeRoots")
        .arg(modules.join("@types"));
    expect_success(run(tsc, Duration::from_secs(120)).await?, "tsc")?;
    let mut node = Command::new("node");
    node.arg("--test");
    for file in std::fs::read_dir(dist.path().join("test"))? {
        let path = file?.path();
        if path.to_string_lossy().ends_with(".test.js") {
            node.arg(path);
        }
    }
    live(&mut node, &gw, "unused");
    let out = expect_success(run(node, Duration::from_secs(120)).await?, "node --test")?;
    let report = text(&out);
    ensure!(report.contains("# fail 0") && report.contains("# skipped 0"), "node --test:\n{report}");
    let names = ["every sign vector", "an event goes out signed", "every API error vector"];
    passed(&report, &names, "node --test")?;
    let mut example = Command::new("node");
    example.arg(dist.path().join("examples/quickstart.js"));
    live(&mut example, &gw, "example");
    example_verified(run(example, Duration::from_secs(60)).await?, "the TypeScript example")
}

/// The Python SDK (standard library; `v1a` with `cryptography`, from `scripts/pytools`'
/// virtualenv) passes its tests, live ones included, and its example verifies one event.
async fn the_python_sdk_passes_its_tests_and_example_against_a_live_node(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let python = pytool("python")?;
    let mut unittest = Command::new(&python);
    unittest.args(["-m", "unittest", "discover", "-v", "-s"]).arg(sdks().join("python/tests"));
    let mut example = Command::new(&python);
    example.arg(sdks().join("python/examples/quickstart.py"));
    for cmd in [&mut unittest, &mut example] {
        cmd.env("PYTHONPATH", sdks().join("python"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("HERALD_SDK_REQUIRE_V1A", "1");
    }
    live(&mut unittest, &gw, "unused");
    let out = expect_success(run(unittest, Duration::from_secs(120)).await?, "python -m unittest")?;
    let report = text(&out);
    ensure!(report.contains("\nOK") && !report.contains("skipped"), "python -m unittest:\n{report}");
    let names = ["test_every_sign_vector", "test_an_event_goes_out_signed", "test_every_api_error_vector"];
    passed(&report, &names, "python -m unittest")?;
    live(&mut example, &gw, "example");
    example_verified(run(example, Duration::from_secs(60)).await?, "the Python example")
}

/// A `go` command in `sdks/go`, offline, with its build cache in the target directory.
fn go(args: &[&str]) -> anyhow::Result<Command> {
    let cache = sdk_tools()?.join("go");
    let mut cmd = Command::new("go");
    cmd.args(args)
        .current_dir(sdks().join("go"))
        .env("GOCACHE", cache.join("cache"))
        .env("GOPATH", cache.join("path"))
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "");
    Ok(cmd)
}

/// The Go SDK builds with the standard library alone (no `go.sum`, the module proxy off),
/// is `gofmt`-clean, passes `go test` (vectors and the live node) and its example verifies
/// one event.
async fn the_go_sdk_passes_its_tests_and_example_against_a_live_node(backend: Backend) -> anyhow::Result<()> {
    ensure!(!sdks().join("go/go.sum").exists(), "sdks/go has dependencies (go.sum)");
    let gw = TestGateway::start_on(backend, &[]).await?;
    let gofmt = Command::new("gofmt").arg("-l").arg(sdks().join("go")).output().await;
    let gofmt = gofmt.context("gofmt is missing: run scripts/sdk-tools (scripts/test does)")?;
    ensure!(gofmt.status.success() && gofmt.stdout.is_empty(), "gofmt -l: {}", text(&gofmt));
    let mut test = go(&["test", "-count=1", "-v", "./..."])?;
    live(&mut test, &gw, "unused");
    let out = expect_success(run(test, Duration::from_secs(300)).await?, "go test")?;
    let report = text(&out);
    ensure!(!report.contains("--- SKIP"), "go test skipped:\n{report}");
    let names = [
        "--- PASS: TestEverySignVectorGivesItsSignature",
        "--- PASS: TestLiveAnEventGoesOutSignedAndTheSDKVerifiesWhatArrived",
        "--- PASS: TestLiveEveryAPIErrorVectorFailsWithItsStatusAndCode",
    ];
    passed(&report, &names, "go test")?;
    let mut example = go(&["run", "./examples/quickstart"])?;
    live(&mut example, &gw, "example");
    example_verified(run(example, Duration::from_secs(300)).await?, "the Go example")
}
