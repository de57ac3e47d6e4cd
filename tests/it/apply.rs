//! `herald apply -f FILE` and `herald dump` (issue 52, item 4), run as the real binary
//! against real nodes: a dump applied to a fresh node recreates its state, a second apply
//! changes nothing and writes nothing, `--dry-run` writes nothing, `--prune` removes,
//! secrets are references that resolve from the environment and from files, and a bad
//! document is one error naming its path, before any write.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Backend, FakeReceiver, TestGateway, herald_binary};

use crate::plugins::{plugin_bytes, upload};

tests::backends!(a_dump_applied_to_a_fresh_node_recreates_it_and_a_second_apply_changes_nothing);

/// What `herald` printed and whether it succeeded.
struct Run {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `herald ARGS --api … --token ADMIN` with `env` added, in `dir`.
async fn herald(gw: &TestGateway, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Run> {
    let (bin, api, dir) = (herald_binary()?, gw.api.base.clone(), dir.to_path_buf());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let run = tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin)
            .args(&args)
            .args(["--api", &api, "--token", ADMIN_TOKEN])
            .env_remove("HERALD_API")
            .env_remove("HERALD_TOKEN")
            .envs(env)
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .output()
    });
    let out = tokio::time::timeout(Duration::from_secs(60), run).await???;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ok(Run { ok: out.status.success(), code: out.status.code(), stdout: text(&out.stdout), stderr: text(&out.stderr) })
}

async fn get(gw: &TestGateway, path: &str) -> anyhow::Result<Value> {
    Ok(gw.api.get(path, ADMIN_TOKEN).await?.expect(200)?.json)
}

/// Every `updated_at` of the tenant's endpoints, own event types and plugin settings:
/// equal before and after a call that wrote nothing.
async fn write_marks(gw: &TestGateway, tenant: &str) -> anyhow::Result<Vec<String>> {
    let base = format!("/v1/tenants/{tenant}");
    let mut marks = Vec::new();
    for list in ["endpoints", "event-types"] {
        for row in get(gw, &format!("{base}/{list}")).await?["data"].as_array().into_iter().flatten() {
            marks.push(format!(
                "{list} {} {}",
                row["name"].as_str().or(row["id"].as_str()).unwrap_or(""),
                row["updated_at"]
            ));
        }
    }
    for row in get(gw, &format!("{base}/plugins")).await?["data"].as_array().into_iter().flatten() {
        let name = row["name"].as_str().unwrap_or_default();
        let config = get(gw, &format!("{base}/plugins/{name}/config")).await?;
        marks.push(format!("plugin {name} {}", config["updated_at"]));
    }
    Ok(marks)
}

async fn start(backend: Backend) -> anyhow::Result<TestGateway> {
    TestGateway::start_on(backend, &[("HERALD_SECRETS_KEY", tests::SEAL_KEY)]).await
}

/// A node set up through the API as an operator would: a tenant with a name, an event type
/// with a schema and examples, a plugin with settings (a secret among them) bound to an
/// endpoint, and endpoints with filters, retry overrides, headers and both signatures.
async fn populate(gw: &TestGateway, rx: &FakeReceiver) -> anyhow::Result<()> {
    let r = gw.api.post("/v1/tenants", ADMIN_TOKEN, json!({"id": "acme", "name": "Acme Corp"})).await?;
    r.expect(201)?;
    let ty = json!({"name": "invoice.paid", "description": "An invoice was paid",
        "schema": {"type": "object", "required": ["amount"]}, "examples": [{"amount": 5}]});
    gw.api.post("/v1/tenants/acme/event-types", ADMIN_TOKEN, ty).await?.expect(201)?;
    gw.api.post("/v1/tenants/acme/event-types", ADMIN_TOKEN, json!({"name": "user.created"})).await?.expect(201)?;
    upload(gw, "acme", "chat", plugin_bytes("transform_chat"), ADMIN_TOKEN).await?.expect(200)?;
    let config = json!({"values": {"style": "slack"}, "secrets": {"api_key": "k-31415"}});
    gw.api.call("PUT", "/v1/tenants/acme/plugins/chat/config", ADMIN_TOKEN, Some(config)).await?.expect(200)?;
    gw.api
        .endpoint(
            "acme",
            json!({"url": rx.url(), "description": "billing", "event_types": ["invoice.*"],
                "filter": {"data.amount": {"$gte": 100}}, "rate_per_sec": 25, "burst": 5, "timeout": "5s",
                "retry": {"base": "2s", "max_attempts": 4}, "headers": {"x-team": "payments"},
                "plugins": {"transform": "chat"}}),
        )
        .await?;
    gw.api
        .endpoint(
            "acme",
            json!({"url": rx.url(), "description": "audit log", "signatures": ["v1", "v1a"],
        "cloudevents": {"mode": "binary", "source": "/acme/{tenant}"}, "verify": true}),
        )
        .await?;
    Ok(())
}

/// The `v1` secret of each endpoint, as the variable `dump` names for it.
async fn secret_env(gw: &TestGateway) -> anyhow::Result<Vec<(String, String)>> {
    let mut env = vec![("HERALD_SECRET_ACME_PLUGIN_CHAT_API_KEY".to_string(), "k-31415".to_string())];
    for ep in get(gw, "/v1/tenants/acme/endpoints").await?["data"].as_array().into_iter().flatten() {
        let secret = get(gw, &format!("/v1/tenants/acme/endpoints/{}/secret", ep["id"].as_str().unwrap())).await?;
        let var = gateway::cli::document::env_name(&["acme", ep["description"].as_str().unwrap()]);
        env.push((var, secret["secret"].as_str().unwrap().to_string()));
    }
    Ok(env)
}

async fn a_dump_applied_to_a_fresh_node_recreates_it_and_a_second_apply_changes_nothing(
    backend: Backend,
) -> anyhow::Result<()> {
    let (old, rx, dir) = (start(backend).await?, FakeReceiver::start().await?, tempfile::tempdir()?);
    populate(&old, &rx).await?;
    let dumped = herald(&old, dir.path(), &["dump"], &[]).await?;
    assert!(dumped.ok, "{}", dumped.stderr);
    let text = &dumped.stdout;
    for says in [
        "name: Acme Corp",
        "name: billing",
        "transform: chat",
        "mode: binary",
        "verify: true",
        "$gte",
        "HERALD_SECRET_ACME_BILLING",
    ] {
        assert!(text.contains(says), "no {says:?} in the dump:\n{text}");
    }
    assert!(!text.contains("whsec_") && !text.contains("k-31415"), "no secret in a dump:\n{text}");
    std::fs::write(dir.path().join("herald.yaml"), text)?;
    let env = secret_env(&old).await?;
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();

    // A fresh node with the plugin installed (its code is not in the document).
    let new = start(backend).await?;
    new.api.post("/v1/tenants", ADMIN_TOKEN, json!({"id": "acme", "name": "Acme Corp"})).await?.expect(201)?;
    upload(&new, "acme", "chat", plugin_bytes("transform_chat"), ADMIN_TOKEN).await?.expect(200)?;
    let applied = herald(&new, dir.path(), &["apply", "-f", "herald.yaml"], &env).await?;
    assert!(applied.ok, "{}{}", applied.stdout, applied.stderr);
    assert!(applied.stdout.contains("+ endpoint acme/billing"), "{}", applied.stdout);
    let again = herald(&new, dir.path(), &["dump"], &[]).await?;
    assert_eq!(again.stdout, dumped.stdout, "the fresh node's dump");
    // The secrets came from their references.
    assert_eq!(secret_env(&new).await?[1..], secret_env(&old).await?[1..]);

    // A second apply: nothing to do, and nothing written (no `updated_at` moves).
    let marks = write_marks(&new, "acme").await?;
    let second = herald(&new, dir.path(), &["apply", "-f", "herald.yaml"], &env).await?;
    assert!(second.ok && second.stdout.trim() == "no changes", "{}{}", second.stdout, second.stderr);
    assert_eq!(write_marks(&new, "acme").await?, marks);

    // The same state as TOML: it applies as "no changes" too.
    let toml = herald(&new, dir.path(), &["dump", "--format", "toml"], &[]).await?;
    assert!(toml.ok && toml.stdout.contains("[[endpoints]]"), "{}{}", toml.stdout, toml.stderr);
    std::fs::write(dir.path().join("herald.toml"), &toml.stdout)?;
    let third = herald(&new, dir.path(), &["apply", "-f", "herald.toml"], &env).await?;
    assert!(third.ok && third.stdout.trim() == "no changes", "{}{}", third.stdout, third.stderr);
    assert_eq!(write_marks(&new, "acme").await?, marks);
    Ok(())
}

const BASE: &str = "tenants: [{id: acme}]
event_types:
  - {tenant: acme, name: order.created}
  - {tenant: acme, name: order.shipped}
endpoints:
  - {tenant: acme, name: orders, url: 'URL', rate_per_sec: 10}
  - {tenant: acme, name: shipping, url: 'URL'}
";

/// `--dry-run` prints the diff and writes nothing; without `--prune` what the document no
/// longer names stays; with it, it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_writes_nothing_and_prune_removes_what_the_document_no_longer_names() -> anyhow::Result<()> {
    let (gw, rx, dir) = (TestGateway::start().await?, FakeReceiver::start().await?, tempfile::tempdir()?);
    let file = dir.path().join("herald.yaml");
    std::fs::write(&file, BASE.replace("URL", &rx.url()))?;
    let dry = herald(&gw, dir.path(), &["apply", "-f", "herald.yaml", "--dry-run"], &[]).await?;
    assert!(dry.ok && dry.stdout.contains("+ tenant acme") && dry.stdout.contains("dry run"), "{}", dry.stdout);
    assert_eq!(get(&gw, "/v1/tenants").await?["data"], json!([]), "a dry run created nothing");
    assert!(herald(&gw, dir.path(), &["apply", "-f", "herald.yaml"], &[]).await?.ok);

    // The next version: a faster `orders`, no `shipping`, no `order.shipped`.
    let next = BASE
        .replace("rate_per_sec: 10", "rate_per_sec: 50")
        .replace("  - {tenant: acme, name: shipping, url: 'URL'}\n", "");
    std::fs::write(&file, next.replace("  - {tenant: acme, name: order.shipped}\n", "").replace("URL", &rx.url()))?;
    let marks = write_marks(&gw, "acme").await?;
    for args in [&["--dry-run"][..], &["--dry-run", "--prune"]] {
        let run = herald(&gw, dir.path(), &[&["apply", "-f", "herald.yaml"][..], args].concat(), &[]).await?;
        assert!(run.ok && run.stdout.contains("~ endpoint acme/orders\n    rate_per_sec: 10.0 → 50"), "{}", run.stdout);
        let pruned = ["- endpoint acme/shipping", "- event type acme/order.shipped"];
        let prune = args.contains(&"--prune");
        assert!(pruned.iter().all(|line| run.stdout.contains(line) == prune), "{args:?}: {}", run.stdout);
    }
    assert_eq!(write_marks(&gw, "acme").await?, marks, "dry runs wrote nothing");

    let applied = herald(&gw, dir.path(), &["apply", "-f", "herald.yaml"], &[]).await?;
    assert!(applied.ok && !applied.stdout.contains("- endpoint"), "{}", applied.stdout);
    let endpoints = get(&gw, "/v1/tenants/acme/endpoints").await?;
    assert_eq!(endpoints["data"].as_array().map(Vec::len), Some(2), "without --prune, shipping stays");
    assert_eq!(endpoints["data"][0]["rate_per_sec"], 50.0);
    let pruned = herald(&gw, dir.path(), &["apply", "-f", "herald.yaml", "--prune"], &[]).await?;
    assert!(pruned.ok && pruned.stdout.contains("- endpoint acme/shipping"), "{}{}", pruned.stdout, pruned.stderr);
    let names = |v: Value, key: &str| -> Vec<String> {
        v["data"].as_array().into_iter().flatten().filter_map(|e| e[key].as_str().map(String::from)).collect()
    };
    assert_eq!(names(get(&gw, "/v1/tenants/acme/endpoints").await?, "description"), ["orders"]);
    assert_eq!(names(get(&gw, "/v1/tenants/acme/event-types").await?, "name"), ["order.created"]);
    let last = herald(&gw, dir.path(), &["apply", "-f", "herald.yaml", "--prune"], &[]).await?;
    assert_eq!(last.stdout.trim(), "no changes", "{}", last.stderr);
    Ok(())
}

/// A secret is read from the variable or the file its reference names (a relative path is
/// the document's folder's); changing the file's secret changes the endpoint's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_references_resolve_from_the_environment_and_from_files() -> anyhow::Result<()> {
    let (gw, dir) = (TestGateway::start().await?, tempfile::tempdir()?);
    let (from_env, from_file) =
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_dGVzdHNlY3JldHRlc3RzZWNyZXR0ZXN0c2Vj");
    std::fs::create_dir(dir.path().join("conf"))?;
    std::fs::write(dir.path().join("conf/hooks.secret"), format!("{from_file}\n"))?;
    let doc = "tenants: [{id: acme}]
endpoints:
  - {tenant: acme, name: a, url: 'https://a.example.com/', secret: {env: HOOK_A_SECRET}}
  - {tenant: acme, name: b, url: 'https://b.example.com/', secret: {file: hooks.secret}}
";
    std::fs::write(dir.path().join("conf/herald.yaml"), doc)?;
    let env = [("HOOK_A_SECRET", from_env)];
    let run = herald(&gw, dir.path(), &["apply", "-f", "conf/herald.yaml"], &env).await?;
    assert!(run.ok, "{}{}", run.stdout, run.stderr);
    let secrets = || async {
        let mut found = Vec::new();
        for ep in get(&gw, "/v1/tenants/acme/endpoints").await?["data"].as_array().into_iter().flatten() {
            let s = get(&gw, &format!("/v1/tenants/acme/endpoints/{}/secret", ep["id"].as_str().unwrap())).await?;
            found.push(s["secret"].as_str().unwrap_or_default().to_string());
        }
        anyhow::Ok(found)
    };
    assert_eq!(secrets().await?, [from_env, from_file]);
    assert!(!run.stdout.contains("whsec_"), "no secret printed: {}", run.stdout);

    let rotated = "whsec_bmV3c2VjcmV0bmV3c2VjcmV0bmV3c2VjcmV0";
    std::fs::write(dir.path().join("conf/hooks.secret"), rotated)?;
    let run = herald(&gw, dir.path(), &["apply", "-f", "conf/herald.yaml"], &env).await?;
    assert!(run.ok && run.stdout.contains("~ endpoint acme/b\n    secret: changed"), "{}{}", run.stdout, run.stderr);
    assert_eq!(secrets().await?, [from_env, rotated]);
    Ok(())
}

/// Each bad document is refused with one line naming its path, exit 1, and nothing is
/// written, not even the tenant its first lines would create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_document_is_one_error_naming_its_path_and_writes_nothing() -> anyhow::Result<()> {
    let (gw, dir) = (TestGateway::start().await?, tempfile::tempdir()?);
    let ok = "tenants: [{id: acme}]\nendpoints:\n  - {tenant: acme, name: a, url: 'https://a.example.com/'";
    let cases = [
        ("bad.yaml", format!("{ok}, colour: red}}"), "error: endpoints[0].colour: unknown field `colour`"),
        ("bad.yaml", format!("{ok}, burst: many}}"), "error: endpoints[0].burst: invalid type"),
        (
            "bad.yaml",
            format!("{ok}}}\n  - {{tenant: acne, name: b, url: 'https://b.example.com/'}}"),
            "error: endpoints[1].tenant: no tenant \"acne\"",
        ),
        (
            "bad.yaml",
            format!("{ok}, secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}}"),
            "error: endpoints[0].secret: a secret is a reference",
        ),
        (
            "bad.yaml",
            format!("{ok}, secret: {{env: HOOK_UNSET_9}}}}"),
            "error: endpoints[0].secret: environment variable HOOK_UNSET_9 is not set",
        ),
        ("bad.yaml", format!("{ok}, secret: {{file: missing.secret}}}}"), "error: endpoints[0].secret: cannot read"),
        (
            "bad.yaml",
            format!("{ok}, plugins: {{transform: chat}}}}"),
            "error: endpoints[0].plugins.transform: no plugin \"chat\"",
        ),
        ("bad.toml", "[[tenants]]\nid = \"acme\"\nname = 7\n".into(), "error: tenants[0].name: invalid type"),
        (
            "bad.toml",
            "[[tenants]]\nid = \"acme\"\n[[plugins]]\ntenant = \"acme\"\nname = \"chat\"\n".into(),
            "error: plugins[0].name: no plugin \"chat\"",
        ),
    ];
    for (file, text, says) in cases {
        std::fs::write(dir.path().join(file), &text)?;
        let run = herald(&gw, dir.path(), &["apply", "-f", file], &[]).await?;
        assert_eq!(run.code, Some(1), "{text}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.starts_with(says), "{text}:\nwanted {says}\ngot {}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "one line: {}", run.stderr);
        assert!(!run.stderr.contains("whsec_"), "the secret is not repeated: {}", run.stderr);
        assert_eq!(get(&gw, "/v1/tenants").await?["data"], json!([]), "{text}: nothing written");
    }
    Ok(())
}

/// The endpoint kinds of issue 51 survive a round trip: a `poll` endpoint (no URL), a
/// `listen` endpoint and a batching HTTP endpoint, dumped and applied to a fresh node, are
/// the same endpoints there, and a second apply changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_listen_and_batching_endpoints_survive_a_round_trip() -> anyhow::Result<()> {
    let (old, rx, dir) = (start(Backend::Sqlite).await?, FakeReceiver::start().await?, tempfile::tempdir()?);
    old.api.post("/v1/tenants", ADMIN_TOKEN, json!({"id": "acme", "name": "Acme"})).await?.expect(201)?;
    let endpoints = [
        json!({"kind": "poll", "description": "pulled", "event_types": ["order.*"], "signatures": ["v1", "v1a"]}),
        json!({"kind": "listen", "url": "listen://dev", "description": "laptop", "rate_per_sec": 50}),
        json!({"url": rx.url(), "description": "batched",
            "batch": {"max_events": 20, "max_bytes": 65536, "max_wait": "2s"}}),
    ];
    for body in endpoints {
        old.api.endpoint("acme", body).await?;
    }
    let dumped = herald(&old, dir.path(), &["dump"], &[]).await?;
    assert!(dumped.ok, "{}", dumped.stderr);
    for says in ["kind: poll", "kind: listen", "listen://dev", "max_events: 20", "max_wait: 2s"] {
        assert!(dumped.stdout.contains(says), "no {says:?} in the dump:\n{}", dumped.stdout);
    }
    std::fs::write(dir.path().join("herald.yaml"), &dumped.stdout)?;
    let env = secret_env(&old).await?;
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();

    let new = start(Backend::Sqlite).await?;
    let applied = herald(&new, dir.path(), &["apply", "-f", "herald.yaml"], &env).await?;
    assert!(applied.ok, "{}{}", applied.stdout, applied.stderr);
    let again = herald(&new, dir.path(), &["dump"], &[]).await?;
    assert_eq!(again.stdout, dumped.stdout, "the fresh node's dump");
    let shape = |gw: &TestGateway| {
        let gw = gw.api.clone();
        async move {
            let list = gw.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.expect(200)?.json;
            let mut found: Vec<Value> = list["data"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    let mut e = e.clone();
                    for volatile in ["id", "created_at", "updated_at", "delivery_status", "health"] {
                        e.as_object_mut().unwrap().remove(volatile);
                    }
                    e
                })
                .collect();
            found.sort_by_key(|e| e["description"].as_str().unwrap_or_default().to_string());
            anyhow::Ok(found)
        }
    };
    assert_eq!(shape(&new).await?, shape(&old).await?, "the same endpoints");
    assert_eq!(secret_env(&new).await?[1..], secret_env(&old).await?[1..], "the same v1 secrets");
    let marks = write_marks(&new, "acme").await?;
    let second = herald(&new, dir.path(), &["apply", "-f", "herald.yaml"], &env).await?;
    assert!(second.ok && second.stdout.trim() == "no changes", "{}{}", second.stdout, second.stderr);
    assert_eq!(write_marks(&new, "acme").await?, marks);
    Ok(())
}
