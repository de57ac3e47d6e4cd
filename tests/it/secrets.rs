//! Tokens and secrets: tokens are listed without their secret and revoked with immediate
//! effect on every node; no secret Herald holds ever appears in what it prints.

use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tests::pg::PgSchema;
use tests::{ADMIN_TOKEN, Answer, Backend, FakeReceiver, HeraldProcess, TestGateway, herald_binary};

tests::backends!(tokens_are_listed_and_revoked_at_once);

async fn tokens_are_listed_and_revoked_at_once(backend: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(backend, &[]).await?;
    let api = &gw.api;
    api.tenant("acme").await?;
    api.tenant("globex").await?;
    let writer = api.token("acme", &["events:write", "read"]).await?;
    let manager = api.token("acme", &["manage"]).await?;
    let endpoints = "/v1/tenants/acme/endpoints";
    assert_eq!(api.get(endpoints, &writer).await?.status, 200, "the token works (and is cached)");

    let list = api.get("/v1/tenants/acme/tokens", ADMIN_TOKEN).await?;
    assert_eq!(list.status, 200, "{}", list.text);
    let data = list.json["data"].as_array().context("data")?.clone();
    assert_eq!(data.len(), 2);
    assert_eq!(data[0]["scopes"], json!(["events:write", "read"]));
    assert_eq!(data[1]["scopes"], json!(["manage"]));
    assert!(
        data.iter().all(|t| t["id"].as_str().is_some_and(|id| id.starts_with("tok_")) && t["created_at"].is_string())
    );
    let hashes = [writer.as_str(), manager.as_str()].map(gateway::api::hash_token);
    for secret in [&writer, &manager, &hashes[0], &hashes[1]] {
        assert!(!list.text.contains(secret.as_str()), "a listing shows no token or hash: {}", list.text);
    }
    let writer_id = data[0]["id"].as_str().unwrap().to_string();
    // Its use is recorded (in the background, to the minute).
    api.wait_for("/v1/tenants/acme/tokens", Duration::from_secs(5), |v| v["data"][0]["last_used_at"].is_string())
        .await?;
    assert!(api.get("/v1/tenants/acme/tokens", ADMIN_TOKEN).await?.json["data"][1]["last_used_at"].is_null());

    // Only the admin lists and revokes; another tenant's path does not reach the token.
    assert_eq!(api.get("/v1/tenants/acme/tokens", &manager).await?.status, 403);
    let path = format!("/v1/tenants/acme/tokens/{writer_id}");
    assert_eq!(api.call("DELETE", &path, &manager, None).await?.status, 403);
    let elsewhere = format!("/v1/tenants/globex/tokens/{writer_id}");
    assert_eq!(api.call("DELETE", &elsewhere, ADMIN_TOKEN, None).await?.status, 404);
    assert_eq!(api.get(endpoints, &writer).await?.status, 200);

    let r = api.call("DELETE", &path, ADMIN_TOKEN, None).await?;
    assert_eq!(r.status, 204, "{}", r.text);
    let refused = api.get(endpoints, &writer).await?;
    assert_eq!(refused.status, 401, "a revoked token is refused at once: {}", refused.text);
    assert_eq!(refused.json["error"]["code"], "unauthorized");
    assert_eq!(api.call("DELETE", &path, ADMIN_TOKEN, None).await?.status, 404, "already revoked");
    assert_eq!(api.get("/v1/tenants/acme/tokens", ADMIN_TOKEN).await?.json["data"].as_array().map(Vec::len), Some(1));
    let other = api.get(endpoints, &manager).await?;
    assert_eq!(other.status, 403, "the other token still authenticates (it lacks `read`)");
    Ok(())
}

/// Two nodes on one Postgres schema: a token revoked through node A is refused by node B
/// on its very next request, although B had just accepted it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_revoked_on_one_node_is_refused_by_the_other_at_once() -> anyhow::Result<()> {
    let schema = PgSchema::create().await?;
    let store = [("HERALD_STORE_URL", schema.url.as_str())];
    let a = TestGateway::start_with(&store).await?;
    let b = TestGateway::start_with(&store).await?;
    a.api.tenant("acme").await?;
    let token = a.api.token("acme", &["read"]).await?;
    for _ in 0..3 {
        assert_eq!(b.api.get("/v1/tenants/acme/endpoints", &token).await?.status, 200);
    }
    let id = a.api.get("/v1/tenants/acme/tokens", ADMIN_TOKEN).await?.json["data"][0]["id"]
        .as_str()
        .context("token id")?
        .to_string();
    let r = a.api.call("DELETE", &format!("/v1/tenants/acme/tokens/{id}"), ADMIN_TOKEN, None).await?;
    assert_eq!(r.status, 204, "{}", r.text);
    assert_eq!(b.api.get("/v1/tenants/acme/endpoints", &token).await?.status, 401);
    assert_eq!(a.api.get("/v1/tenants/acme/endpoints", &token).await?.status, 401);
    drop((a, b));
    Ok(())
}

/// `herald check-config` and the logs of a whole run (debug level: every module, the store
/// driver, the HTTP stack) show none of the secrets the run created or was given. The log is
/// JSON lines, and the dead letter and the endpoint's state change each have a line with
/// the fields an operator filters on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_is_printed_by_check_config_or_in_the_logs() -> anyhow::Result<()> {
    let bin = herald_binary()?;
    let schema = PgSchema::create().await?;
    let password = "pg-password-7c41e9";
    let Some((scheme_user, rest)) = schema.url.split_once('@') else {
        bail!("the test Postgres URL names no user: {}", schema.url);
    };
    let store_url = format!("{scheme_user}:{password}@{rest}");
    let operator = FakeReceiver::start().await?;
    let operator_secret = "whsec_b3BlcmF0b3Itc2VjcmV0LWZvci10aGUtdGVzdA";
    let operator_url = operator.url();
    let env = [
        ("HERALD_STORE_URL", store_url.as_str()),
        ("HERALD_OPERATOR_URL", operator_url.as_str()),
        ("HERALD_OPERATOR_SECRET", operator_secret),
        ("HERALD_LOG_LEVEL", "debug"),
        ("HERALD_LOG_FORMAT", "json"),
        // The command-line client's variables: `serve` must start with them set.
        ("HERALD_TOKEN", "hrld_client-side-token"),
        ("HERALD_API", "http://127.0.0.1:9"),
    ];

    let dir = tempfile::tempdir()?;
    let checked = std::process::Command::new(&bin)
        .arg("check-config")
        .env_clear()
        .envs(tests::base_env(dir.path()))
        .envs(env)
        .output()?;
    let check_output =
        format!("{}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));
    assert!(checked.status.success(), "{check_output}");
    assert!(check_output.contains("admin_token"), "check-config prints the settings: {check_output}");

    let log_path = dir.path().join("herald.log");
    let node = HeraldProcess::start_logged(&bin, dir.path(), &env, Some(&log_path)).await?;
    let mut secrets = vec![ADMIN_TOKEN.to_string(), operator_secret.to_string(), password.to_string()];
    secrets.extend(exercise(&node, &operator).await?);
    drop(node);
    let log = std::fs::read_to_string(&log_path)?;
    assert!(log.contains("herald serving") && log.contains("DEBUG"), "the run logged: {log}");
    let lines: Vec<Value> = log.lines().map(serde_json::from_str).collect::<Result<_, _>>().context("JSON lines")?;
    // Exact for the dead letter ("dead letters: …" counts the disabled endpoint's others),
    // a prefix for the state change (its message names the new state).
    let line = |exact: bool, message: &str| {
        let matches = |m: &str| if exact { m == message } else { m.starts_with(message) };
        lines.iter().find(|l| l["fields"]["message"].as_str().is_some_and(matches)).cloned()
    };
    let dead = line(true, "dead letter").with_context(|| format!("no dead-letter line in {log}"))?;
    for field in ["tenant", "endpoint_id", "delivery_id", "event_id", "attempt", "reason"] {
        assert!(!dead["fields"][field].is_null(), "the dead-letter line has no {field}: {dead}");
    }
    assert_eq!(dead["fields"]["tenant"], "acme", "{dead}");
    let change = line(false, "endpoint state change").with_context(|| format!("no endpoint state change in {log}"))?;
    assert_eq!(
        (&change["fields"]["state"], &change["fields"]["tenant"]),
        (&json!("disabled"), &json!("acme")),
        "{change}"
    );
    assert!(change["fields"]["endpoint_id"].as_str().is_some_and(|id| id.starts_with("ep_")), "{change}");
    for secret in &secrets {
        assert!(!check_output.contains(secret.as_str()), "check-config printed {secret}:\n{check_output}");
        assert!(!log.contains(secret.as_str()), "the log shows {secret}");
    }
    Ok(())
}

/// Drives a node through tokens, endpoints, secret rotation, deliveries, a dead letter (an
/// operator event signed with the operator secret), bad tokens and a revocation; returns
/// every secret it created.
async fn exercise(node: &HeraldProcess, operator: &FakeReceiver) -> anyhow::Result<Vec<String>> {
    let api = &node.api;
    api.tenant("acme").await?;
    let token = api.token("acme", &["events:write", "read", "manage"]).await?;
    let revoked = api.token("acme", &["read"]).await?;
    let receiver = FakeReceiver::start().await?;
    receiver.script([Answer::status(500), Answer::status(200)]);
    let ep = api
        .endpoint(
            "acme",
            json!({"url": receiver.url(), "retry": {"base": "10ms", "jitter": "none", "max_attempts": 1}}),
        )
        .await?;
    let ep_id = ep["id"].as_str().context("id")?;
    let gone = FakeReceiver::start().await?;
    gone.set_default(Answer::status(410));
    api.endpoint("acme", json!({"url": gone.url()})).await?;
    let rotated = api.post(&format!("/v1/tenants/acme/endpoints/{ep_id}/rotate-secret"), &token, json!({})).await?;
    let secrets = api.get(&format!("/v1/tenants/acme/endpoints/{ep_id}/secret"), &token).await?;
    for i in 0..2 {
        let r = api.post("/v1/tenants/acme/events", &token, json!({"type": "t", "payload": {"i": i}})).await?;
        assert_eq!(r.status, 202, "{}", r.text);
    }
    receiver.wait_for(2, Duration::from_secs(10)).await?;
    gone.wait_for(1, Duration::from_secs(10)).await?;
    // Two dead letters and the disabled endpoint, each announced after its log line.
    operator.wait_for(3, Duration::from_secs(10)).await.context("the operator events")?;
    assert_eq!(api.get("/v1/tenants/acme/endpoints", "hrld_not-a-token").await?.status, 401);
    let id = api.get("/v1/tenants/acme/tokens", ADMIN_TOKEN).await?.json["data"][1]["id"].clone();
    let r = api
        .call("DELETE", &format!("/v1/tenants/acme/tokens/{}", id.as_str().unwrap_or("")), ADMIN_TOKEN, None)
        .await?;
    assert_eq!(r.status, 204, "{}", r.text);
    assert_eq!(api.get("/v1/tenants/acme/endpoints", &revoked).await?.status, 401);

    let mut created = vec![token, revoked];
    let whsec = |v: &Value| v.as_str().map(String::from);
    created.extend(whsec(&ep["secret"]));
    created.extend(whsec(&rotated.json["secret"]));
    created.extend(secrets.json["secrets"].as_array().into_iter().flatten().filter_map(|s| whsec(&s["secret"])));
    assert!(created.iter().filter(|s| s.starts_with("whsec_")).count() >= 3, "{created:?}");
    Ok(created)
}

/// `herald serve` refuses an admin token shorter than 32 characters, naming the key.
#[tokio::test]
async fn serve_refuses_a_short_admin_token() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cmd = tokio::process::Command::new(herald_binary()?);
    cmd.arg("serve").current_dir(dir.path()).env_clear().envs(tests::base_env(dir.path()));
    cmd.env("HERALD_SERVER_ADMIN_TOKEN", "change-me-please-0123456789abcd");
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output()).await.context("herald kept running")??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("server.admin_token") && stderr.contains("at least 32 characters"), "{stderr}");
    assert!(!stderr.contains("change-me-please"), "the refused token is not echoed: {stderr}");
    Ok(())
}

/// `herald check-config` names the keys of the operator's plugin settings but not their
/// values: a plugin's configuration may hold its own secrets (an API key, a signing key).
#[tokio::test]
async fn check_config_shows_plugin_settings_keys_but_not_their_values() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("herald.toml");
    let (default, forced) = ("sk_live_plugin-default-7f3a", "tok_plugin-override-91c2");
    std::fs::write(
        &file,
        format!(
            "[plugins.config.acme.signer]\nsigning_key = \"{default}\"\n\
             [plugins.override.acme.signer]\napi_token = \"{forced}\"\n"
        ),
    )?;
    let out = std::process::Command::new(herald_binary()?)
        .arg("check-config")
        .arg("--config")
        .arg(&file)
        .env_clear()
        .envs(tests::base_env(dir.path()))
        .output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("plugins.config.acme.signer.signing_key = \"<redacted>\"\n"), "{text}");
    assert!(text.contains("plugins.override.acme.signer.api_token = \"<redacted>\"\n"), "{text}");
    assert!(!text.contains(default) && !text.contains(forced), "a plugin setting's value was printed: {text}");
    Ok(())
}
