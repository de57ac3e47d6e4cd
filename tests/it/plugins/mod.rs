//! Deliveries through the example WebAssembly plugins (built by scripts/build-plugins),
//! uploads, tenant isolation and hot reload under load; the plugin features each have a
//! module below, one line each:
//!
//! - `config`: a tenant's plugin settings
//! - `guard`: per-tenant plugin limits and upload guards through the API
//! - `js`: JavaScript plugins end to end
//! - `limits`: plugin time budgets that grow with input, the largest event through a plugin
//! - `stats`: per-plugin call statistics through the API
//! - `versions`: plugin versions: pinning, rollback, deletion

use std::path::PathBuf;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use tests::{ADMIN_TOKEN, Answer, FakeReceiver, TestGateway, with_custom_section};

mod config;
mod guard;
mod js;
mod limits;
mod stats;
mod versions;

/// A built example plugin; the suite fails (never skips) when it is missing.
pub(crate) fn plugin_bytes(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../target/wasm32-wasip2/release/{name}.wasm"));
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; build the plugins first with scripts/build-plugins", path.display()))
}

pub(crate) async fn upload(
    gw: &TestGateway,
    tenant: &str,
    name: &str,
    bytes: Vec<u8>,
    token: &str,
) -> anyhow::Result<tests::Reply> {
    gw.api.raw("PUT", &format!("/v1/tenants/{tenant}/plugins/{name}"), Some(token), bytes).await
}

#[tokio::test]
async fn the_transform_plugin_reshapes_the_body() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[("HERALD_PLUGINS_CONFIG", r#"{acme = {chat = {redact = "email"}}}"#)]).await?;
    gw.api.tenant("acme").await?;
    let r = upload(&gw, "acme", "chat", plugin_bytes("transform_chat"), ADMIN_TOKEN).await?;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["hooks"], json!(["transform"]));
    let rx = FakeReceiver::start().await?;
    let ep = gw.api.endpoint("acme", json!({"url": rx.url(), "plugins": {"transform": "chat"}})).await?;
    gw.api
        .event(
            "acme",
            json!({"id": "evt_chat", "type": "user.created", "payload": {"name": "Ada", "email": "ada@example.com"}}),
        )
        .await?;
    let got = rx.wait_for(1, Duration::from_secs(10)).await?;
    let body = got[0].json();
    let text = body["text"].as_str().unwrap_or_else(|| panic!("not a chat message: {body}"));
    assert!(text.contains("user.created") && text.contains("Ada"), "{text}");
    assert!(!text.contains("ada@example.com") && text.contains("[redacted]"), "redacted: {text}");
    // The built-in signature covers the transformed body.
    let secret = ep["secret"].as_str().unwrap();
    let key = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, secret.trim_start_matches("whsec_"))?;
    let ts = got[0].header("webhook-timestamp").unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key)?;
    mac.update(format!("evt_chat.{ts}.").as_bytes());
    mac.update(&got[0].body);
    let want = format!(
        "v1,{}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, mac.finalize().into_bytes())
    );
    assert_eq!(got[0].header("webhook-signature"), Some(want.as_str()));
    let d = gw
        .api
        .wait_for("/v1/tenants/acme/events/evt_chat/deliveries", Duration::from_secs(5), |v| {
            v["data"][0]["state"] == "delivered"
        })
        .await?;
    assert_eq!(d["data"][0]["attempts"], 1);
    Ok(())
}

#[tokio::test]
async fn the_sign_plugin_replaces_the_signature_scheme() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    assert_eq!(upload(&gw, "acme", "hexsig", plugin_bytes("sign_hmac_hex"), ADMIN_TOKEN).await?.status, 200);
    let rx = FakeReceiver::start().await?;
    let ep = gw.api.endpoint("acme", json!({"url": rx.url(), "plugins": {"sign": "hexsig"}})).await?;
    gw.api.event("acme", json!({"id": "evt_sig", "type": "invoice.paid", "payload": {"amount": 5}})).await?;
    let got = rx.wait_for(1, Duration::from_secs(10)).await?;
    let header =
        got[0].header("x-herald-signature").unwrap_or_else(|| panic!("no signature header: {:?}", got[0].headers));
    let (t, v1) = header.split_once(',').unwrap();
    let ts = t.strip_prefix("t=").unwrap();
    let key = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        ep["secret"].as_str().unwrap().trim_start_matches("whsec_"),
    )?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key)?;
    mac.update(format!("{ts}.").as_bytes());
    mac.update(&got[0].body);
    assert_eq!(v1, format!("v1={}", hex::encode(mac.finalize().into_bytes())));
    assert!(got[0].header("webhook-signature").is_none(), "the plugin's scheme replaces the built-in one");
    assert_eq!(got[0].header("webhook-id"), Some("evt_sig"));
    Ok(())
}

#[tokio::test]
async fn the_classify_plugin_decides_what_a_409_means() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[(
        "HERALD_PLUGINS_CONFIG",
        r#"{acme = {c409 = {}}, beta = {c409 = {on_409 = "retry", retry_after = "1"}}}"#,
    )])
    .await?;
    let mut receivers = Vec::new();
    for tenant in ["acme", "beta"] {
        gw.api.tenant(tenant).await?;
        assert_eq!(upload(&gw, tenant, "c409", plugin_bytes("classify_409"), ADMIN_TOKEN).await?.status, 200);
        let rx = FakeReceiver::start().await?;
        rx.set_default(Answer::status(409));
        let retry = json!({"base": "100ms", "jitter": "none", "max_attempts": 3});
        gw.api
            .post(
                &format!("/v1/tenants/{tenant}/endpoints"),
                ADMIN_TOKEN,
                json!({"url": rx.url(), "plugins": {"classify": "c409"}, "retry": retry}),
            )
            .await?;
        gw.api
            .post(&format!("/v1/tenants/{tenant}/events"), ADMIN_TOKEN, json!({"id": "e", "type": "t", "payload": {}}))
            .await?;
        receivers.push(rx);
    }
    // acme: 409 = already processed → delivered after one attempt.
    let d = gw
        .api
        .wait_for("/v1/tenants/acme/events/e/deliveries", Duration::from_secs(10), |v| {
            v["data"][0]["state"] == "delivered"
        })
        .await?;
    assert_eq!(d["data"][0]["attempts"], 1);
    let id = d["data"][0]["id"].as_str().unwrap();
    let full = gw.api.get(&format!("/v1/tenants/acme/deliveries/{id}"), ADMIN_TOKEN).await?;
    assert_eq!(full.json["attempt_history"][0]["decided_by"], "plugin:c409");
    // beta: 409 = retry after 1 s, until the attempts run out (the built-in table would fail it at once).
    let d = gw
        .api
        .wait_for("/v1/tenants/beta/events/e/deliveries", Duration::from_secs(15), |v| v["data"][0]["state"] == "dead")
        .await?;
    assert_eq!(
        (d["data"][0]["attempts"].as_u64(), d["data"][0]["reason"].as_str()),
        (Some(3), Some("exhausted")),
        "{d}"
    );
    let got = receivers[1].received();
    let gap = got[1].at.duration_since(got[0].at);
    assert!(gap >= Duration::from_millis(950), "the plugin's retry-after was honoured: {gap:?}");
    Ok(())
}

#[tokio::test]
async fn uploads_are_validated_and_scoped_to_their_tenant() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    gw.api.tenant("other").await?;
    let other = gw.api.token("other", &["manage", "read"]).await?;
    assert_eq!(upload(&gw, "acme", "chat", plugin_bytes("transform_chat"), ADMIN_TOKEN).await?.status, 200);
    // Garbage and core modules are refused with a reason; nothing is written.
    for (bytes, what) in [(b"not wasm".to_vec(), "garbage"), (b"\0asm\x01\0\0\0".to_vec(), "core module")] {
        let r = upload(&gw, "acme", "broken", bytes, ADMIN_TOKEN).await?;
        assert_eq!(r.status, 422, "{what}: {}", r.text);
        assert!(r.json["error"]["message"].as_str().unwrap().len() > 10);
    }
    assert!(!gw.dir.path().join("plugins/acme/broken.wasm").exists());
    let r = upload(&gw, "acme", "Bad_Name", plugin_bytes("transform_chat"), ADMIN_TOKEN).await?;
    assert!(r.status == 422 || r.status == 404, "{}", r.text);
    // Another tenant can neither upload into acme nor see or bind acme's plugin.
    assert_eq!(upload(&gw, "acme", "x", plugin_bytes("transform_chat"), &other).await?.status, 404);
    assert_eq!(gw.api.get("/v1/tenants/acme/plugins", &other).await?.status, 404);
    let r = gw
        .api
        .post(
            "/v1/tenants/other/endpoints",
            &other,
            json!({"url": "http://127.0.0.1:9/x", "plugins": {"transform": "chat"}}),
        )
        .await?;
    assert_eq!(r.status, 422, "{}", r.text);
    let r = gw.api.get("/v1/tenants/other/plugins", &other).await?;
    assert_eq!(r.json["data"].as_array().unwrap().len(), 0);
    // A plugin bound to the wrong hook is refused.
    let r = gw
        .api
        .post(
            "/v1/tenants/acme/endpoints",
            ADMIN_TOKEN,
            json!({"url": "http://127.0.0.1:9/x", "plugins": {"sign": "chat"}}),
        )
        .await?;
    assert_eq!(r.status, 422, "{}", r.text);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_under_load_loses_nothing_and_a_corrupt_file_keeps_the_old_version() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    let v1 = plugin_bytes("transform_chat");
    let v2 = with_custom_section(v1.clone(), "v2");
    assert_eq!(upload(&gw, "acme", "chat", v1, ADMIN_TOKEN).await?.status, 200);
    let rx = FakeReceiver::start().await?;
    gw.api.endpoint("acme", json!({"url": rx.url(), "rate_per_sec": 1000, "plugins": {"transform": "chat"}})).await?;
    let file = gw.dir.path().join("plugins/acme/chat.wasm");
    let sha = |v: &serde_json::Value| v["data"][0]["sha256"].as_str().unwrap_or_default().to_string();
    let sha1 = sha(&gw.api.get("/v1/tenants/acme/plugins", ADMIN_TOKEN).await?.json);

    let total = 300;
    let poster = {
        let api = gw.api.clone();
        tokio::spawn(async move {
            for i in 0..total {
                api.event("acme", json!({"id": format!("e{i}"), "type": "t", "payload": {"i": i}})).await?;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            anyhow::Ok(())
        })
    };
    rx.wait_for(50, Duration::from_secs(10)).await?;
    // Replace the file behind Herald's back (atomically, as a deploy would).
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, &v2)?;
    std::fs::rename(&tmp, &file)?;
    let swapped = gw
        .api
        .wait_for("/v1/tenants/acme/plugins", Duration::from_secs(10), |v| {
            !v["data"][0]["sha256"].is_null() && sha(v) != sha1
        })
        .await?;
    let sha2 = sha(&swapped);
    // Now a corrupt file: the old version keeps serving and the error is visible.
    std::fs::write(&tmp, b"\0asm garbage")?;
    std::fs::rename(&tmp, &file)?;
    let broken = gw
        .api
        .wait_for("/v1/tenants/acme/plugins", Duration::from_secs(10), |v| v["data"][0]["error"].is_string())
        .await?;
    assert_eq!(sha(&broken), sha2, "the last good version still serves: {broken}");
    poster.await??;

    let got = rx.wait_for(total, Duration::from_secs(20)).await?;
    rx.stays_at(total, Duration::from_secs(2)).await?;
    let mut ids: Vec<&str> = got.iter().filter_map(|r| r.header("webhook-id")).collect();
    assert!(got.iter().all(|r| r.json()["text"].is_string()), "every delivery went through a version of the plugin");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!((ids.len(), rx.count()), (total, total), "none lost, none doubled");
    Ok(())
}

/// What `herald plugin run` says about the hostile guest's `transform` for `event_type`.
async fn cli_transform(path: PathBuf, event_type: &str) -> String {
    let input = json!({"context": {"event_type": event_type}}).to_string();
    // A plain thread, as the `herald` binary runs it (not inside this test's runtime).
    let run =
        move || gateway::plugin::run_hook_file(&path, &gateway::plugin::PluginConfig::for_cli(), "transform", &input);
    let result = tokio::task::spawn_blocking(move || std::thread::spawn(run).join().unwrap()).await.unwrap();
    match result {
        Ok(out) => serde_json::from_str::<serde_json::Value>(&out).unwrap()["result"]["action"].to_string(),
        Err(e) => e.to_string(),
    }
}

/// `herald plugin run` hands a JSON body to the plugin with its keys in the order written
/// (they came back sorted), its strings untouched, as the server sends a payload: the
/// hostile guest passes an ordinary event's request through unchanged.
#[tokio::test]
async fn plugin_run_keeps_the_order_of_a_json_bodys_keys() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("hostile.wasm");
    std::fs::write(&path, plugin_bytes("hostile"))?;
    std::fs::write(
        dir.path().join("input.json"),
        r#"{"request": {"body": {"zeta": 1, "alpha": {"y": [1, "a  b\" c"], "b": null}, "mid": 2.50}}}"#,
    )?;
    let bin = tests::herald_binary()?;
    let args = ["plugin", "run", "hostile.wasm", "--hook", "transform", "--input", "input.json"];
    let out = tokio::process::Command::new(&bin).args(args).current_dir(dir.path()).kill_on_drop(true).output();
    let out = tokio::time::timeout(Duration::from_secs(60), out).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&stdout)?;
    assert_eq!(report["result"]["body"], r#"{"zeta":1,"alpha":{"y":[1,"a  b\" c"],"b":null},"mid":2.50}"#, "{report}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_plugin_fails_its_attempts_cleanly_and_frees_its_slots() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    for tenant in ["evil", "acme"] {
        gw.api.tenant(tenant).await?;
    }
    assert_eq!(upload(&gw, "evil", "hostile", plugin_bytes("hostile"), ADMIN_TOKEN).await?.status, 200);
    let (evil_rx, acme_rx) = (FakeReceiver::start().await?, FakeReceiver::start().await?);
    // Two slots: two stuck attempts would stop this endpoint for good.
    gw.api
        .endpoint(
            "evil",
            json!({"url": evil_rx.url(), "max_in_flight": 2, "rate_per_sec": 1000, "burst": 100,
                   "plugins": {"transform": "hostile"}, "retry": {"max_attempts": 1}}),
        )
        .await?;
    gw.api.endpoint("acme", json!({"url": acme_rx.url(), "rate_per_sec": 1000, "burst": 100})).await?;

    // The reason each misbehaviour is recorded with; `None`: delivered.
    let modes: [(&str, Option<&str>); 6] = [
        ("print", None),
        ("panic", Some("plugin:trap: wasm trap: wasm `unreachable` instruction executed")),
        ("exit", Some("plugin:trap: exit(1)")),
        ("socket", Some("plugin:error: socket: ")),
        ("spin", Some("plugin:timeout")),
        ("ok", None),
    ];
    for round in 0..3 {
        for (mode, _) in &modes {
            gw.api
                .event("evil", json!({"id": format!("{mode}{round}"), "type": format!("x.{mode}"), "payload": {}}))
                .await?;
            gw.api.event("acme", json!({"id": format!("{mode}{round}"), "type": "t", "payload": {}})).await?;
        }
    }
    acme_rx.wait_for(18, Duration::from_secs(20)).await?;
    // Every attempt ended recorded (after each failure the slot came back, or the
    // later events would never be sent).
    evil_rx.wait_for(6, Duration::from_secs(20)).await?;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/wasm32-wasip2/release/hostile.wasm");
    for (mode, want) in modes {
        for round in 0..3 {
            let list = gw
                .api
                .wait_for(&format!("/v1/tenants/evil/events/{mode}{round}/deliveries"), Duration::from_secs(20), |v| {
                    matches!(v["data"][0]["state"].as_str(), Some("delivered" | "dead"))
                })
                .await?;
            let id = list["data"][0]["id"].as_str().unwrap();
            let d = gw.api.get(&format!("/v1/tenants/evil/deliveries/{id}"), ADMIN_TOKEN).await?.json;
            let attempt = &d["attempt_history"][0];
            match want {
                None => assert_eq!(d["state"], "delivered", "{mode}: {d}"),
                Some(reason) => {
                    assert_eq!((d["state"].as_str(), d["attempts"].as_u64()), (Some("dead"), Some(1)), "{mode}: {d}");
                    let error = attempt["error"].as_str().unwrap_or_default();
                    assert!(error.starts_with(reason), "{mode}: {error}");
                    assert_eq!(attempt["decided_by"], "plugin:hostile", "{mode}: {d}");
                }
            }
        }
        // `herald plugin run` reports the same as the server recorded.
        let cli = cli_transform(path.clone(), &format!("x.{mode}")).await;
        match want {
            None => assert_eq!(cli, "\"send\"", "{mode}"),
            Some(reason) => assert!(cli.starts_with(reason), "{mode}: the CLI says {cli}"),
        }
    }
    assert_eq!(evil_rx.count(), 6, "print and ok, three rounds each");
    Ok(())
}

/// A core module with one function of `code_bytes` bytes of code (`i32.const 1; drop`
/// repeated), encoded by hand: the payload of a compile bomb.
fn huge_function_module(code_bytes: usize) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    fn section(id: u8, payload: &[u8], out: &mut Vec<u8>) {
        out.push(id);
        leb(payload.len(), out);
        out.extend_from_slice(payload);
    }
    let mut body = vec![0]; // no locals
    for _ in 0..code_bytes / 3 {
        body.extend_from_slice(&[0x41, 0x01, 0x1a]);
    }
    body.push(0x0b);
    let mut code = vec![1];
    leb(body.len(), &mut code);
    code.extend_from_slice(&body);
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    section(1, &[1, 0x60, 0, 0], &mut module); // one type: () -> ()
    section(3, &[1, 0], &mut module); // one function of that type
    section(10, &code, &mut module);
    module
}

/// A real plugin carrying, at its end, a core module it never instantiates (a component
/// core-module section), whose one function is `code_bytes` long.
fn compile_bomb(code_bytes: usize) -> Vec<u8> {
    let module = huge_function_module(code_bytes);
    let mut bytes = plugin_bytes("classify_409");
    bytes.push(1);
    let mut n = module.len();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        bytes.push(if n == 0 { byte } else { byte | 0x80 });
        if n == 0 {
            break;
        }
    }
    bytes.extend_from_slice(&module);
    bytes
}

#[tokio::test]
async fn compile_bombs_and_tenants_over_their_limits_are_refused_while_others_deliver() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[("HERALD_PLUGINS_MAX_PLUGINS_PER_TENANT", "2")]).await?;
    gw.api.tenant("acme").await?;
    gw.api.tenant("globex").await?;

    // 4 MB in one function: before compiling, refused for well under the CPU seconds
    // (and gigabytes) a compile would take. CPU time, not the wall clock: on a loaded
    // machine the wall clock also counts everybody else's turns.
    let bomb = compile_bomb(4 << 20);
    let cpu = tests::cpu_time(libc::RUSAGE_SELF);
    let r = upload(&gw, "acme", "bomb", bomb.clone(), ADMIN_TOKEN).await?;
    let spent = tests::cpu_time(libc::RUSAGE_SELF) - cpu;
    assert_eq!((r.status, r.json["error"]["code"].as_str()), (422, Some("invalid_plugin")), "{}", r.text);
    let message = r.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("refused before compiling") && message.contains("a function of"), "{message}");
    assert!(spent < Duration::from_secs(2), "the refusal cost {spent:?} of CPU");
    assert!(!gw.dir.path().join("plugins/acme/bomb.wasm").exists());
    // The same plugin with a small extra module is fine: the limit is what refused it.
    assert_eq!(upload(&gw, "acme", "fine", compile_bomb(3000), ADMIN_TOKEN).await?.status, 200);

    // `herald plugin check` refuses it the same way, at once, in one line: the refusal is
    // the author's to read, so no stack backtrace even where RUST_BACKTRACE asks for one
    // (resolving one cost more than the check).
    let file = gw.dir.path().join("bomb.wasm");
    std::fs::write(&file, &bomb)?;
    let mut check = std::process::Command::new(tests::herald_binary()?);
    check.env("RUST_BACKTRACE", "1").args(["plugin", "check"]).arg(&file);
    let (out, spent) = tests::output_and_cpu_time(&mut check)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("error: component refused before compiling: a function of"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(spent < Duration::from_secs(2), "the refusal cost {spent:?} of CPU");

    // acme's second plugin fits; its third is over plugins.max_plugins_per_tenant.
    assert_eq!(upload(&gw, "acme", "c409", plugin_bytes("classify_409"), ADMIN_TOKEN).await?.status, 200);
    let r = upload(&gw, "acme", "chat", plugin_bytes("transform_chat"), ADMIN_TOKEN).await?;
    assert_eq!((r.status, r.json["error"]["code"].as_str()), (422, Some("plugin_limit")), "{}", r.text);
    assert!(r.text.contains("max_plugins_per_tenant"), "{}", r.text);

    // Another tenant uploads and delivers through its plugin as usual.
    assert_eq!(upload(&gw, "globex", "chat", plugin_bytes("transform_chat"), ADMIN_TOKEN).await?.status, 200);
    let rx = FakeReceiver::start().await?;
    gw.api.endpoint("globex", json!({"url": rx.url(), "plugins": {"transform": "chat"}})).await?;
    gw.api.event("globex", json!({"id": "evt_g", "type": "user.created", "payload": {"name": "Ada"}})).await?;
    let got = rx.wait_for(1, Duration::from_secs(10)).await?;
    assert!(got[0].json()["text"].is_string(), "{:?}", got[0].json());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_every_tenant_loads_and_a_delivery_waits_for_its_plugin() -> anyhow::Result<()> {
    let bin = tests::herald_binary()?;
    let dir = tempfile::tempdir()?;
    // A compile cache of its own, emptied below. Fewer instance slots than one tenant has
    // plugins.
    let cache = dir.path().join("plugin-cache").display().to_string();
    let env = [
        ("HERALD_PLUGINS_CACHE_DIR", cache.as_str()),
        ("HERALD_PLUGINS_MAX_INSTANCES", "6"),
        ("HERALD_PLUGINS_MAX_PLUGINS_PER_TENANT", "20"),
    ];
    let mut node = tests::HeraldProcess::start(&bin, dir.path(), &env).await?;
    let api = node.api.clone();
    api.tenant("aaa").await?;
    api.tenant("zzz").await?;
    let chat = plugin_bytes("transform_chat");
    // Distinct bytes, so each is compiled on its own.
    for (tenant, n) in [("aaa", 8), ("zzz", 4)] {
        for i in 0..n {
            let path = format!("/v1/tenants/{tenant}/plugins/p{i}");
            let r = api
                .raw("PUT", &path, Some(ADMIN_TOKEN), with_custom_section(chat.clone(), &format!("{tenant}{i}")))
                .await?;
            assert_eq!(r.status, 200, "{path}: {}", r.text);
        }
    }
    let rx = FakeReceiver::start().await?;
    let retry = json!({"base": "1s", "jitter": "none", "max_attempts": 2});
    api.endpoint("zzz", json!({"url": rx.url(), "plugins": {"transform": "p3"}, "retry": retry})).await?;
    node.kill();

    // Without the compile cache every plugin compiles again, in the background, tenants
    // taking turns: zzz's p3 is among the last, and the node serves before it is ready.
    std::fs::remove_dir_all(dir.path().join("plugin-cache"))?;
    let node = tests::HeraldProcess::start(&bin, dir.path(), &env).await?;
    let api = node.api.clone();
    api.event("zzz", json!({"id": "evt_wait", "type": "user.created", "payload": {"name": "Ada"}})).await?;
    let listed = api.get("/v1/tenants/zzz/plugins/p3", ADMIN_TOKEN).await?;
    assert_eq!(listed.json["loading"], true, "the delivery is to wait for a loading plugin: {}", listed.text);

    let got = rx.wait_for(1, Duration::from_secs(60)).await?;
    assert!(got[0].json()["text"].is_string(), "went through the plugin: {:?}", got[0].json());
    let d = api
        .wait_for("/v1/tenants/zzz/events/evt_wait/deliveries", Duration::from_secs(10), |v| {
            v["data"][0]["state"] == "delivered"
        })
        .await?;
    assert_eq!(d["data"][0]["attempts"], 1, "waiting cost no attempt: {d}");
    let plugins = api
        .wait_for("/v1/tenants/aaa/plugins", Duration::from_secs(60), |v| {
            v["data"].as_array().is_some_and(|a| a.iter().all(|p| p["loading"] == false))
        })
        .await?;
    let all = plugins["data"].as_array().unwrap();
    assert_eq!(all.len(), 8);
    assert!(all.iter().all(|p| p["error"].is_null() && p["hooks"] == json!(["transform"])), "{plugins}");
    assert!(std::fs::read_dir(dir.path().join("plugin-cache"))?.count() >= 12, "compiled artifacts cached again");
    Ok(())
}

#[tokio::test]
async fn a_compile_over_its_memory_or_time_limit_is_refused_and_the_node_serves_on() -> anyhow::Result<()> {
    let bin = tests::herald_binary()?;
    for (key, value, expected) in [
        ("HERALD_PLUGINS_COMPILE_MEMORY_MIB", "4", "compiling needed more than 4 MiB"),
        ("HERALD_PLUGINS_COMPILE_TIMEOUT", "1ms", "compiling took longer than"),
    ] {
        let dir = tempfile::tempdir()?;
        // A compile cache of its own: the shared one may hold this plugin compiled.
        let cache = dir.path().join("plugin-cache").display().to_string();
        let env = [(key, value), ("HERALD_PLUGINS_CACHE_DIR", cache.as_str())];
        let node = tests::HeraldProcess::start(&bin, dir.path(), &env).await?;
        node.api.tenant("acme").await?;
        let path = "/v1/tenants/acme/plugins/chat";
        let r = node.api.raw("PUT", path, Some(ADMIN_TOKEN), plugin_bytes("transform_chat")).await?;
        assert_eq!(r.status, 422, "{key}: {}", r.text);
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(expected), "{key}: {message}");
        assert!(!dir.path().join("plugins/acme/chat.wasm").exists());
        let health = node.api.raw("GET", "/healthz", None, "").await?;
        assert_eq!(health.status, 200);
    }
    Ok(())
}

/// Sends the head of a `PUT` upload declaring `length` body bytes, then only 1 KiB of
/// them, and returns the status line Herald answers with while the rest never comes.
async fn upload_head(gw: &TestGateway, token: Option<&str>, length: usize) -> anyhow::Result<String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(gw.addr).await?;
    let auth = token.map(|t| format!("authorization: Bearer {t}\r\n")).unwrap_or_default();
    let head = format!("PUT /v1/tenants/acme/plugins/p HTTP/1.1\r\nhost: x\r\n{auth}content-length: {length}\r\n\r\n");
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(&[0u8; 1024]).await?;
    let mut status = String::new();
    let mut reader = tokio::io::BufReader::new(conn);
    tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut status)).await??;
    Ok(status.trim_end().to_string())
}

#[tokio::test]
async fn uploads_are_authenticated_before_their_body_is_read() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    gw.api.tenant("acme").await?;
    // Herald answers without waiting for the 4 MiB it was promised (within the 8 MiB
    // plugin limit): it did not read the body of a request it was going to refuse.
    assert_eq!(upload_head(&gw, None, 4 << 20).await?, "HTTP/1.1 401 Unauthorized");
    assert_eq!(upload_head(&gw, Some("wrong"), 4 << 20).await?, "HTTP/1.1 401 Unauthorized");
    // Over the limit, the declared length alone is refused.
    assert_eq!(upload_head(&gw, Some(ADMIN_TOKEN), 15 << 20).await?, "HTTP/1.1 413 Payload Too Large");
    Ok(())
}

/// Log lines of `log` (JSON lines) about `tenant`'s plugin `name`, as (level, message).
fn plugin_log_lines(log: &str, tenant: &str, name: &str) -> Vec<(String, String)> {
    let lines = log.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
    lines
        .filter(|l| l["fields"]["tenant"] == tenant && l["fields"]["plugin"] == name)
        .map(|l| (l["level"].as_str().unwrap_or_default().to_string(), l["fields"]["message"].to_string()))
        .collect()
}

#[tokio::test]
async fn a_plugin_file_that_fails_to_load_is_tried_and_logged_once_per_change() -> anyhow::Result<()> {
    let bin = tests::herald_binary()?;
    let dir = tempfile::tempdir()?;
    let log_path = dir.path().join("herald.log");
    let env = [("HERALD_LOG_LEVEL", "debug"), ("HERALD_LOG_FORMAT", "json")];
    let node = tests::HeraldProcess::start_logged(&bin, dir.path(), &env, Some(&log_path)).await?;
    node.api.tenant("acme").await?;
    let file = dir.path().join("plugins/acme/bad.wasm");
    std::fs::create_dir_all(file.parent().unwrap())?;
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, b"\0asm garbage")?;
    std::fs::rename(&tmp, &file)?;
    let listed = node
        .api
        .wait_for("/v1/tenants/acme/plugins", Duration::from_secs(10), |v| v["data"][0]["error"].is_string())
        .await?;
    assert_eq!(listed["data"][0]["name"], "bad", "{listed}");
    let one = node.api.get("/v1/tenants/acme/plugins/bad", ADMIN_TOKEN).await?;
    assert!(one.json["error"].as_str().is_some_and(|e| e.contains("WebAssembly")), "{}", one.text);

    // A window in which the old watcher retried the file about ten times (reading the
    // file raised an inotify open event, which scheduled the next reload).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let about = plugin_log_lines(&std::fs::read_to_string(&log_path)?, "acme", "bad");
    assert_eq!(about.len(), 1, "one line per change of the file: {about:?}");
    assert_eq!(about[0].0, "WARN", "{about:?}");

    // A tenant's rejected upload is the tenant's error: INFO, never WARN or ERROR.
    let r = node.api.raw("PUT", "/v1/tenants/acme/plugins/refused", Some(ADMIN_TOKEN), b"\0asm nope".to_vec()).await?;
    assert_eq!(r.status, 422, "{}", r.text);
    let refused = plugin_log_lines(&std::fs::read_to_string(&log_path)?, "acme", "refused");
    assert_eq!(refused.iter().map(|(level, _)| level.as_str()).collect::<Vec<_>>(), ["INFO"], "{refused:?}");

    // Fixing the file loads it, and clears the error.
    std::fs::write(&tmp, plugin_bytes("transform_chat"))?;
    std::fs::rename(&tmp, &file)?;
    let fixed = node
        .api
        .wait_for("/v1/tenants/acme/plugins/bad", Duration::from_secs(10), |v| {
            v["sha256"].as_str().is_some_and(|s| !s.is_empty())
        })
        .await?;
    assert!(fixed["error"].is_null(), "{fixed}");
    Ok(())
}
