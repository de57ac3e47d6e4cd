//! JavaScript plugins end to end: the example plugins of `sdk-js/examples/` (one per
//! hook) uploaded as source to a real `herald serve` on both backends and delivering to a
//! real receiver; hostile JavaScript contained like a hostile component, other tenants
//! unaffected. Needs the runtime built by scripts/build-js-runtime (the suite fails,
//! never skips, without it).

use std::path::PathBuf;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tests::pg::PgSchema;
use tests::{ADMIN_TOKEN, Answer, Api, Backend, FakeReceiver, HeraldProcess, TestGateway, herald_binary};

tests::backends!(each_example_hook_runs_in_a_real_server);

const WAIT: Duration = Duration::from_secs(20);

/// The runtime component built by scripts/build-js-runtime.
fn js_runtime() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/js-runtime/herald-js.wasm");
    assert!(path.is_file(), "{} is missing: build it with scripts/build-js-runtime", path.display());
    path.display().to_string()
}

/// An in-process node that runs JavaScript plugins, with a call budget well above what
/// the hostile test's huge output needs alone (its 5 MiB array is built and lowered within
/// a few ms), so a suite running on every core cannot turn the output-size failure into a
/// timeout; a loop still spends all of it.
async fn js_gateway() -> anyhow::Result<TestGateway> {
    let runtime = js_runtime();
    TestGateway::start_with(&[
        ("HERALD_PLUGINS_JS_RUNTIME", runtime.as_str()),
        ("HERALD_PLUGINS_CALL_TIMEOUT", "100ms"),
    ])
    .await
}

fn example(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../sdk-js/examples/{name}.js"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

async fn upload(api: &Api, tenant: &str, name: &str, source: Vec<u8>) -> anyhow::Result<tests::Reply> {
    api.raw("PUT", &format!("/v1/tenants/{tenant}/plugins/{name}"), Some(ADMIN_TOKEN), source).await
}

/// The delivery of `event` (of tenant `tenant`) once it is settled, with its attempts.
async fn settled(api: &Api, tenant: &str, event: &str) -> anyhow::Result<Value> {
    let list = api
        .wait_for(&format!("/v1/tenants/{tenant}/events/{event}/deliveries"), WAIT, |v| {
            matches!(v["data"][0]["state"].as_str(), Some("delivered" | "dead"))
        })
        .await?;
    let id = list["data"][0]["id"].as_str().unwrap_or_default().to_string();
    Ok(api.get(&format!("/v1/tenants/{tenant}/deliveries/{id}"), ADMIN_TOKEN).await?.json)
}

/// Asserts that the delivery of `event` settled dead after one attempt, which failed with
/// an error starting with `reason`.
async fn dead_after_one_attempt(api: &Api, tenant: &str, event: &str, reason: &str) -> anyhow::Result<()> {
    let d = settled(api, tenant, event).await?;
    assert_eq!((d["state"].as_str(), d["attempts"].as_u64()), (Some("dead"), Some(1)), "{event}: {d}");
    let error = d["attempt_history"][0]["error"].as_str().unwrap_or_default();
    assert!(error.starts_with(reason), "{event}: {error}");
    Ok(())
}

/// `herald serve`, finding the JavaScript runtime without being told where, with the three
/// example plugins uploaded as JavaScript: the transform reshapes the body (with its
/// config), the signature verifies, and a 409 counts as delivered.
async fn each_example_hook_runs_in_a_real_server(backend: Backend) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let schema = match backend {
        Backend::Postgres => Some(PgSchema::create().await?),
        Backend::Sqlite => None,
    };
    // No `plugins.js_runtime`: `herald serve` finds the runtime in `js-runtime/` of the
    // target directory it was built in, from a working directory of its own.
    js_runtime();
    let mut env = vec![
        ("HERALD_PLUGINS_CONFIG", r#"{acme = {chat = {prefix = "> "}}}"#),
        // This test is about each hook working in a server, not about the budget (tested on
        // its own): a debug build's host side (lifting strings and lists into the guest) is
        // slow enough that the sign example's first call overran 10 ms of CPU on a busy
        // machine, failing the attempt and leaving the retry past the test's wait.
        ("HERALD_PLUGINS_CALL_TIMEOUT", "100ms"),
    ];
    if let Some(schema) = &schema {
        env.push(("HERALD_STORE_URL", schema.url.as_str()));
    }
    let node = HeraldProcess::start(&herald_binary()?, dir.path(), &env).await?;
    let api = &node.api;
    api.tenant("acme").await?;
    for (name, file, hooks) in [
        ("chat", "transform-chat", "transform"),
        ("hexsig", "sign-hmac-hex", "sign"),
        ("c409", "classify-409", "classify"),
    ] {
        let r = upload(api, "acme", name, example(file)).await?;
        assert_eq!((r.status, &r.json["hooks"]), (200, &json!([hooks])), "{name}: {}", r.text);
    }
    let (chat_rx, sign_rx, conflict_rx) =
        (FakeReceiver::start().await?, FakeReceiver::start().await?, FakeReceiver::start().await?);
    conflict_rx.set_default(Answer::status(409));
    api.endpoint("acme", json!({"url": chat_rx.url(), "event_types": ["chat.*"], "plugins": {"transform": "chat"}}))
        .await?;
    let signed = api
        .endpoint("acme", json!({"url": sign_rx.url(), "event_types": ["sign.*"], "plugins": {"sign": "hexsig"}}))
        .await?;
    api.endpoint("acme", json!({"url": conflict_rx.url(), "event_types": ["dup.*"], "plugins": {"classify": "c409"}}))
        .await?;

    for (id, kind, payload) in [
        ("evt_chat", "chat.posted", json!({"summary": "Ada joined"})),
        ("evt_test", "chat.test", json!({})),
        ("evt_sign", "sign.me", json!({"amount": 5})),
        ("evt_dup", "dup.seen", json!({})),
    ] {
        let r = api.event("acme", json!({"id": id, "type": kind, "payload": payload})).await?;
        assert_eq!(r.status, 202, "{}", r.text);
    }

    let got = chat_rx.wait_for(1, WAIT).await?;
    assert_eq!(got[0].json(), json!({"text": "> chat.posted: Ada joined"}));
    let dropped = settled(api, "acme", "evt_test").await?;
    assert_eq!(dropped["state"], "dead", "a dropped delivery is never sent: {dropped}");

    let got = sign_rx.wait_for(1, WAIT).await?;
    let header = got[0].header("x-signature").unwrap_or_else(|| panic!("no signature: {:?}", got[0].headers));
    let (t, v1) = header.split_once(',').unwrap();
    let secret = signed["secret"].as_str().unwrap().trim_start_matches("whsec_");
    let key = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, secret)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key)?;
    mac.update(format!("{}.", t.trim_start_matches("t=")).as_bytes());
    mac.update(&got[0].body);
    assert_eq!(v1, format!("v1={}", hex::encode(mac.finalize().into_bytes())));
    assert!(got[0].header("webhook-signature").is_none(), "the plugin's scheme replaces the built-in one");

    let dup = settled(api, "acme", "evt_dup").await?;
    assert_eq!((dup["state"].as_str(), dup["attempts"].as_u64()), (Some("delivered"), Some(1)), "{dup}");
    assert_eq!(dup["attempt_history"][0]["decided_by"], "plugin:c409");
    Ok(())
}

/// Hostile plugins of tenant `evil`, each bound to its own endpoint, and the reason its
/// attempt is recorded with.
const HOSTILE: [(&str, &str, &str); 4] = [
    ("spin", "function transform(ctx, req) { for (;;) {} }", "plugin:timeout: "),
    (
        "bomb",
        "function transform(ctx, req) { return { tag: 'send', val: { headers: [], body: new Uint8Array(256 << 20) } }; }",
        "plugin:memory: over its memory limit of 64 MiB (plugins.js_memory_limit_mib)",
    ),
    ("throws", "function transform(ctx, req) { throw new Error('no thanks'); }", "plugin:error: Error: no thanks"),
    (
        "huge",
        "function transform(ctx, req) { return { tag: 'send', val: { headers: [], body: new Uint8Array(5 << 20) } }; }",
        "plugin:output_too_large",
    ),
];

/// An infinite loop, a memory bomb, a thrown error and a huge output each fail their
/// attempt with their reason, while another tenant's JavaScript transform delivers every
/// event; a syntax error and bytes that are neither wasm nor text are refused at upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_javascript_is_contained_and_other_tenants_deliver() -> anyhow::Result<()> {
    let gw = js_gateway().await?;
    let api = &gw.api;
    for tenant in ["evil", "acme"] {
        api.tenant(tenant).await?;
    }
    let refused = upload(api, "evil", "broken", b"function transform(ctx, req) { return {".to_vec()).await?;
    assert_eq!(refused.status, 422, "{}", refused.text);
    assert!(refused.text.contains("SyntaxError"), "the author sees why: {}", refused.text);
    let binary = upload(api, "evil", "binary", vec![0xff, 0xfe, 0x00, 0x01]).await?;
    assert!(binary.status == 400 || binary.status == 422, "{}", binary.text);
    assert!(binary.text.contains("not UTF-8 text either"), "{}", binary.text);

    let evil_rx = FakeReceiver::start().await?;
    for (name, source, _) in HOSTILE {
        let r = upload(api, "evil", name, source.as_bytes().to_vec()).await?;
        assert_eq!(r.status, 200, "{name}: {}", r.text);
        api.endpoint(
            "evil",
            json!({"url": evil_rx.url(), "event_types": [name], "plugins": {"transform": name}, "retry": {"max_attempts": 1}}),
        )
        .await?;
    }
    assert_eq!(upload(api, "acme", "chat", example("transform-chat")).await?.status, 200);
    let acme_rx = FakeReceiver::start().await?;
    api.endpoint(
        "acme",
        json!({"url": acme_rx.url(), "rate_per_sec": 1000, "burst": 100, "plugins": {"transform": "chat"}}),
    )
    .await?;

    for round in 0..3 {
        for (name, _, _) in HOSTILE {
            api.event("evil", json!({"id": format!("{name}{round}"), "type": name, "payload": {}})).await?;
            api.event(
                "acme",
                json!({"id": format!("{name}{round}"), "type": "chat.posted", "payload": {"summary": name}}),
            )
            .await?;
        }
    }
    let got = acme_rx.wait_for(12, WAIT).await?;
    assert!(got.iter().all(|r| r.json()["text"].as_str().is_some_and(|t| t.starts_with("chat.posted: "))));
    for (name, _, reason) in HOSTILE {
        for round in 0..3 {
            dead_after_one_attempt(api, "evil", &format!("{name}{round}"), reason).await?;
        }
    }
    assert_eq!(evil_rx.count(), 0, "nothing hostile was sent");
    Ok(())
}

/// Runs `program args` in `dir` (with `env`, and no `HERALD_PLUGINS_JS_RUNTIME` but one
/// `env` sets) for at most a minute; returns its output, whether it succeeded or not.
async fn output(
    dir: &std::path::Path,
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<std::process::Output> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).current_dir(dir).kill_on_drop(true).env_remove("HERALD_PLUGINS_JS_RUNTIME");
    cmd.envs(env.iter().copied());
    Ok(tokio::time::timeout(Duration::from_secs(60), cmd.output()).await??)
}

/// Like [`output`], for a command that must succeed: its stdout and stderr.
async fn run(dir: &std::path::Path, program: &str, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<String> {
    let out = output(dir, program, args, env).await?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    anyhow::ensure!(out.status.success(), "{program} {args:?} failed ({}): {text}", out.status);
    Ok(text)
}

/// The examples' unit tests pass under node with the test helper, which evaluates plugins
/// by the runtime's own rules (`sdk-js/plugin-host.js`).
#[tokio::test]
async fn the_examples_unit_tests_pass_under_node_without_herald() -> anyhow::Result<()> {
    let sdk = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sdk-js");
    let out = run(&sdk, "node", &["--test", "examples/"], &[]).await?;
    assert!(out.contains("# pass 10") && out.contains("# fail 0"), "{out}");
    Ok(())
}

/// The cases of `sdk-js/tests/outputs.json`: what a hook may return (a body as a string
/// or bytes, …) and the `plugin:invalid_output` naming the field when it may not.
fn output_cases() -> anyhow::Result<Vec<Value>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sdk-js/tests/outputs.json");
    let table: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    Ok(table["cases"].as_array().cloned().unwrap_or_default())
}

/// The input every case runs on in `outputs.test.mjs`, as `herald plugin run` reads it.
const CASE_INPUT: &str = r#"{"request": {"headers": [["content-type", "application/json"]], "body": {"n": 1}},
    "outcome": {"status": 500}, "secrets": ["k"]}"#;

/// Each case of what a hook returns gives the same result under node (the test kit) and
/// in Herald (`herald plugin run`, on the runtime component the server runs): a string
/// body is its UTF-8 bytes, not an empty body; what neither can send is refused with the
/// same `plugin:invalid_output` naming the field, and `plugin run` prints it with the
/// plugin's log lines.
#[tokio::test]
async fn what_a_hook_returns_is_checked_alike_under_node_and_in_herald() -> anyhow::Result<()> {
    let cases = output_cases()?;
    let sdk = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sdk-js");
    let out = run(&sdk, "node", &["--test", "tests/"], &[]).await?;
    assert!(out.contains(&format!("# pass {}", cases.len() + 4)) && out.contains("# fail 0"), "{out}");

    let (dir, bin) = (tempfile::tempdir()?, herald_binary()?.display().to_string());
    std::fs::write(dir.path().join("input.json"), CASE_INPUT)?;
    // The budget a debug build on a busy machine evaluates a source in.
    let env = [("HERALD_PLUGINS_CALL_TIMEOUT", "200ms")];
    for case in &cases {
        let name = case["name"].as_str().unwrap_or_default();
        std::fs::write(dir.path().join("plugin.js"), case["source"].as_str().unwrap_or_default())?;
        let hook = case["hook"].as_str().unwrap_or_default();
        let args = ["plugin", "run", "plugin.js", "--hook", hook, "--input", "input.json"];
        let out = output(dir.path(), &bin, &args, &env).await?;
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let report: Value =
            serde_json::from_str(&stdout).map_err(|e| anyhow::anyhow!("{name}: {e}: {stdout}{stderr}"))?;
        if let Some(logs) = case.get("logs") {
            let got: Vec<Value> =
                report["logs"].as_array().into_iter().flatten().map(|l| json!([l["level"], l["message"]])).collect();
            assert_eq!(&Value::from(got), logs, "{name}: {report}");
        }
        if let Some(reason) = case["reason"].as_str() {
            let at = case["at"].as_str().map(|at| format!(" ({at})")).unwrap_or_default();
            let expected = format!("{reason}{at}");
            assert!(!out.status.success(), "{name}: {stdout}");
            assert_eq!(report["error"], expected, "{name}");
            assert_eq!(stderr.trim(), format!("error: {expected}"), "{name}");
            continue;
        }
        assert!(out.status.success(), "{name}: {stdout}{stderr}");
        let result = &report["result"];
        if let Some(body) = case.get("body") {
            assert_eq!((&result["action"], &result["body"]), (&json!("send"), body), "{name}: {report}");
        }
        if let Some(reason) = case.get("drop") {
            assert_eq!((&result["action"], &result["reason"]), (&json!("drop"), reason), "{name}: {report}");
        }
        if let Some(verdict) = case.get("verdict") {
            assert_eq!(&result["verdict"], verdict, "{name}: {report}");
        }
        if let Some(headers) = case.get("headers") {
            assert_eq!(&result["headers"], headers, "{name}: {report}");
        }
    }
    Ok(())
}

/// In a real server: a transform whose body is a string delivers that body (it used to
/// send 0 bytes and count as delivered); a number body, or no result at all, fails the
/// attempt as `plugin:invalid_output` naming the field, and nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_body_is_delivered_and_unusable_output_fails_the_attempt() -> anyhow::Result<()> {
    let gw = js_gateway().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let plugins = [
        (
            "text",
            "function transform(ctx, req) { return { tag: 'send', val: { headers: req.headers, body: `h\u{e9}llo ${ctx.eventId}` } }; }",
            None,
        ),
        (
            "number",
            "function transform(ctx, req) { return { tag: 'send', val: { headers: req.headers, body: 42 } }; }",
            Some(
                "plugin:invalid_output: transform: request.body must be a string or bytes (a Uint8Array, another typed array, a DataView or an ArrayBuffer), got number",
            ),
        ),
        (
            "nothing",
            "function transform(ctx, req) { herald.log('info', 'forgot to return'); }",
            Some("plugin:invalid_output: transform: the result must be"),
        ),
    ];
    let (rx, refused_rx) = (FakeReceiver::start().await?, FakeReceiver::start().await?);
    for (name, source, refusal) in plugins {
        let r = upload(api, "acme", name, source.as_bytes().to_vec()).await?;
        assert_eq!(r.status, 200, "{name}: {}", r.text);
        let url = if refusal.is_some() { refused_rx.url() } else { rx.url() };
        let endpoint =
            json!({"url": url, "event_types": [name], "plugins": {"transform": name}, "retry": {"max_attempts": 1}});
        api.endpoint("acme", endpoint).await?;
        let r = api.event("acme", json!({"id": format!("evt_{name}"), "type": name, "payload": {}})).await?;
        assert_eq!(r.status, 202, "{}", r.text);
    }
    let got = rx.wait_for(1, WAIT).await?;
    assert_eq!(got[0].body.as_ref(), "h\u{e9}llo evt_text".as_bytes());
    let sent = settled(api, "acme", "evt_text").await?;
    assert_eq!(sent["state"], "delivered", "{sent}");
    for (name, _, refusal) in plugins {
        let Some(refusal) = refusal else { continue };
        dead_after_one_attempt(api, "acme", &format!("evt_{name}"), refusal).await?;
    }
    assert_eq!(refused_rx.count(), 0, "nothing refused was sent");
    Ok(())
}

/// A syntax error names its line and column, with no word of WebAssembly: at upload, in
/// the load error the plugin list shows for a file dropped into the plugins directory, and
/// at `herald plugin check`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_syntax_error_says_where_it_is() -> anyhow::Result<()> {
    const BROKEN: &str = "// a transform\nfunction transform(ctx, req) {\n  return {;\n}\n";
    const WHERE: &str = "(line 3, column 11)";
    let gw = js_gateway().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let refused = upload(api, "acme", "broken", BROKEN.as_bytes().to_vec()).await?;
    assert_eq!(
        (refused.status, refused.json["error"]["code"].as_str()),
        (422, Some("invalid_plugin")),
        "{}",
        refused.text
    );
    let message = refused.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("JavaScript source refused: SyntaxError: ") && message.ends_with(WHERE), "{message}");
    assert!(!message.contains("WebAssembly") && !message.contains("trap"), "{message}");

    let tenant_dir = gw.dir.path().join("plugins/acme");
    std::fs::create_dir_all(&tenant_dir)?;
    std::fs::write(tenant_dir.join("dropped.wasm"), BROKEN)?;
    let listed = api
        .wait_for("/v1/tenants/acme/plugins", WAIT, |v| {
            v["data"].as_array().into_iter().flatten().any(|p| p["name"] == "dropped" && p["error"].is_string())
        })
        .await?;
    let dropped = listed["data"].as_array().into_iter().flatten().find(|p| p["name"] == "dropped").cloned();
    let error = dropped.as_ref().and_then(|p| p["error"].as_str()).unwrap_or_default();
    assert!(error.starts_with("JavaScript source refused: SyntaxError: ") && error.ends_with(WHERE), "{error}");

    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("broken.js"), BROKEN)?;
    let bin = herald_binary()?.display().to_string();
    let checked = output(dir.path(), &bin, &["plugin", "check", "broken.js"], &[]).await?;
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert!(!checked.status.success() && stderr.trim().ends_with(WHERE), "{stderr}");
    assert!(!stderr.contains("WebAssembly"), "{stderr}");
    Ok(())
}

/// Without a JavaScript runtime, a tenant's JavaScript upload is refused with a message
/// that names no path of the server; `herald plugin check`, whose user runs the server,
/// says where it looked.
#[tokio::test]
async fn a_missing_runtime_shows_a_tenant_no_server_path() -> anyhow::Result<()> {
    let place = "/srv/herald-secret-place/herald-js.wasm";
    let gw = TestGateway::start_with(&[("HERALD_PLUGINS_JS_RUNTIME", place)]).await?;
    gw.api.tenant("acme").await?;
    let r = upload(&gw.api, "acme", "chat", example("transform-chat")).await?;
    assert_eq!(r.status, 422, "{}", r.text);
    let message = r.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("runs no JavaScript plugins") && !message.contains('/'), "{message}");

    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("plugin.js"), example("transform-chat"))?;
    let bin = herald_binary()?.display().to_string();
    let env = [("HERALD_PLUGINS_JS_RUNTIME", place)];
    let checked = output(dir.path(), &bin, &["plugin", "check", "plugin.js"], &env).await?;
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert!(!checked.status.success() && stderr.contains(place), "{stderr}");
    Ok(())
}

/// docs/plugins/javascript.md, followed literally from a fresh directory
/// with only the `herald` binary (which finds the runtime itself): `herald plugin new
/// --lang js` scaffolds a plugin whose own test passes under node, which `plugin check`
/// loads and `plugin run` runs on the `input.json` it wrote; a second scaffold over it is
/// refused.
#[tokio::test]
async fn a_scaffolded_javascript_plugin_passes_its_test_loads_and_runs_on_its_input() -> anyhow::Result<()> {
    js_runtime();
    let (dir, bin) = (tempfile::tempdir()?, herald_binary()?);
    let bin = bin.display().to_string();
    run(dir.path(), &bin, &["plugin", "new", "--lang", "js", "shiny"], &[]).await?;
    let project = dir.path().join("shiny");
    let out = run(&project, "node", &["--test"], &[]).await?;
    assert!(out.contains("# pass 2") && out.contains("# fail 0"), "{out}");
    // A budget for evaluating the source that a debug build on a busy machine meets too.
    let env = [("HERALD_PLUGINS_CALL_TIMEOUT", "200ms")];
    let report = run(&project, &bin, &["plugin", "check", "plugin.js"], &env).await?;
    assert!(report.contains("shiny 0.1.0") && report.contains("hooks:   transform"), "{report}");
    let args = ["plugin", "run", "plugin.js", "--hook", "transform", "--input", "input.json"];
    let ran: Value = serde_json::from_str(&run(&project, &bin, &args, &env).await?)?;
    let result = &ran["result"];
    assert_eq!(result["action"], "send", "{ran}");
    assert_eq!(result["headers"].as_array().and_then(|h| h.last()), Some(&json!(["x-shiny", "blue"])), "{ran}");
    let body: Value = serde_json::from_str(result["body"].as_str().unwrap_or_default())?;
    assert_eq!((&body["event_type"], &body["data"]["amount"]), (&json!("invoice.paid"), &json!(1999)), "{ran}");
    let env = [("HERALD_PLUGINS_CALL_TIMEOUT", "soon")];
    let bad = run(&project, &bin, &["plugin", "check", "plugin.js"], &env).await;
    assert!(bad.is_err_and(|e| e.to_string().contains("HERALD_PLUGINS_CALL_TIMEOUT: invalid duration")));
    let again = run(dir.path(), &bin, &["plugin", "new", "--lang", "js", "shiny"], &[]).await;
    assert!(again.is_err_and(|e| e.to_string().contains("exists")));
    Ok(())
}

/// Every shape a body can take reaches the receiver as its bytes in a real server, as
/// under node and `herald plugin run` (`outputs.json`): the request passed through (its
/// body a Uint8Array of the runtime's other realm, once refused as "must be a string or a
/// Uint8Array, got Uint8Array" on every attempt), its body alone, a subarray, a DataView,
/// another typed array, an ArrayBuffer; a string of 8 MiB is `output_too_large` (it was a
/// `timeout`, spent encoding it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shape_of_body_is_sent_as_its_bytes_by_a_server() -> anyhow::Result<()> {
    let gw = js_gateway().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let shapes = [
        ("whole", "function transform(ctx, req) { return req; }", None),
        (
            "body",
            "function transform(ctx, req) { return { tag: 'send', val: { headers: req.headers, body: req.body } }; }",
            None,
        ),
        ("sub", "function transform(ctx, req) { return { headers: [], body: req.body.subarray(1, 3) }; }", Some("\"i")),
        (
            "view",
            "function transform(ctx, req) { const b = req.body; return { headers: [], body: new DataView(b.buffer, b.byteOffset + 1, 2) }; }",
            Some("\"i"),
        ),
        (
            "wide",
            "function transform(ctx, req) { return { headers: [], body: new Uint16Array([0x6968]) }; }",
            Some("hi"),
        ),
        (
            "buffer",
            "function transform(ctx, req) { return { headers: [], body: new Uint8Array([104, 105]).buffer }; }",
            Some("hi"),
        ),
    ];
    let rx = FakeReceiver::start().await?;
    for (name, source, _) in shapes {
        let r = upload(api, "acme", name, source.as_bytes().to_vec()).await?;
        assert_eq!(r.status, 200, "{name}: {}", r.text);
        let endpoint = json!({"url": format!("{}{name}", rx.url()), "event_types": [name], "plugins": {"transform": name},
            "retry": {"max_attempts": 1}, "rate_per_sec": 1000});
        api.endpoint("acme", endpoint).await?;
        let r = api.event("acme", json!({"id": format!("evt_{name}"), "type": name, "payload": {"n": 1}})).await?;
        assert_eq!(r.status, 202, "{}", r.text);
    }
    let huge = "function transform(ctx, req) { return { headers: [], body: 'x'.repeat(8 << 20) }; }";
    assert_eq!(upload(api, "acme", "huge", huge.as_bytes().to_vec()).await?.status, 200);
    let endpoint = json!({"url": rx.url(), "event_types": ["huge"], "plugins": {"transform": "huge"}, "retry": {"max_attempts": 1}});
    api.endpoint("acme", endpoint).await?;
    api.event("acme", json!({"id": "evt_huge", "type": "huge", "payload": {}})).await?;

    let got = rx.wait_for(shapes.len(), WAIT).await?;
    for (name, _, body) in shapes {
        let d = settled(api, "acme", &format!("evt_{name}")).await?;
        assert_eq!(d["state"], "delivered", "{name}: {d}");
        let sent = got.iter().find(|r| r.path.ends_with(name)).unwrap_or_else(|| panic!("{name} not received"));
        match body {
            Some(body) => assert_eq!(sent.body.as_ref(), body.as_bytes(), "{name}"),
            // The envelope, as the plugin got it.
            None => {
                let text = String::from_utf8_lossy(&sent.body);
                assert!(text.starts_with(&format!(r#"{{"id":"evt_{name}","type":"{name}","#)), "{name}: {text}");
            }
        }
    }
    dead_after_one_attempt(api, "acme", "evt_huge", "plugin:output_too_large").await?;
    Ok(())
}

/// A JavaScript plugin whose `describe` names itself with 8 MiB (twice the output cap) is
/// kept with its name cut to 128 bytes (it was refused as a whole, 422); its upload says
/// how long loading took (`load_ms`), which its first call does not pay again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_long_name_is_cut_and_the_upload_pays_for_loading() -> anyhow::Result<()> {
    let gw = js_gateway().await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    let source = "const plugin = { name: 'n'.repeat(8 << 20), version: '1.0.0' };\n\
                  function transform(ctx, req) { return req; }";
    let r = upload(api, "acme", "long", source.as_bytes().to_vec()).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["plugin_name"], "n".repeat(128), "{}", &r.text[..r.text.len().min(300)]);
    assert_eq!(r.json["plugin_version"], "1.0.0");
    let load_ms = r.json["load_ms"].as_f64().unwrap_or_default();
    assert!(load_ms > 0.0, "the upload reports its load time: {}", &r.text[..r.text.len().min(300)]);

    let rx = FakeReceiver::start().await?;
    api.endpoint("acme", json!({"url": rx.url(), "plugins": {"transform": "long"}})).await?;
    api.event("acme", json!({"id": "evt_1", "type": "t", "payload": {}})).await?;
    rx.wait_for(1, WAIT).await?;
    let p = api.get("/v1/tenants/acme/plugins/long", ADMIN_TOKEN).await?.json;
    assert_eq!(p["load_ms"], r.json["load_ms"], "{}", p["stats"]);
    // The first call ran on the instance the upload loaded (the source evaluated once):
    // within twice the call budget of this node (100 ms).
    let first = p["stats"]["p99_ms"].as_f64().unwrap_or(f64::MAX);
    assert!(first < 200.0, "the first call took {first} ms; the load {load_ms} ms");
    Ok(())
}
