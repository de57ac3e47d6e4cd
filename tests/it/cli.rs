//! The `herald` command line as an operator meets it (issue 29 §12): what `serve` says at
//! start, what `check-config` prints, and `openapi` into a closed pipe. Each runs the real
//! binary.

use tests::{HeraldProcess, herald_binary};

/// `serve` without an admin token says so in a WARN line, and a log that is not a terminal
/// gets no colour codes.
#[tokio::test]
async fn serve_without_an_admin_token_warns_in_plain_text() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let log_path = dir.path().join("herald.log");
    let env = [("HERALD_SERVER_ADMIN_TOKEN", ""), ("HERALD_LOG_LEVEL", "info")];
    let node = HeraldProcess::start_logged(&herald_binary()?, dir.path(), &env, Some(&log_path)).await?;
    drop(node);
    let log = std::fs::read_to_string(&log_path)?;
    let warning = log.lines().find(|l| l.contains("no admin token is set"));
    let warning = warning.unwrap_or_else(|| panic!("no warning about the admin token in:\n{log}"));
    assert!(warning.contains(" WARN ") && warning.contains("HERALD_SERVER_ADMIN_TOKEN"), "{warning}");
    assert!(log.contains("herald serving"), "INFO lines too: {log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a log file:\n{log:?}");

    // With a token: no such warning.
    let log_path = dir.path().join("with-token.log");
    let node = HeraldProcess::start_logged(&herald_binary()?, dir.path(), &env[1..], Some(&log_path)).await?;
    drop(node);
    let log = std::fs::read_to_string(&log_path)?;
    assert!(log.contains("herald serving") && !log.contains("no admin token"), "{log}");
    Ok(())
}

/// `check-config` prints every key as `section.key = value`, secrets redacted, never a
/// Rust debug dump.
#[test]
fn check_config_prints_the_effective_keys() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("herald.toml");
    std::fs::write(
        &file,
        "[server]\nmax_connections = 64\n[[outbox]]\nname = \"orders\"\nurl = \"postgres://app:pw-9e1c@127.0.0.1/shop\"\ntenant = \"acme\"\n",
    )?;
    let out = std::process::Command::new(herald_binary()?)
        .args(["check-config", "--config"])
        .arg(&file)
        .env_clear()
        .envs(tests::base_env(dir.path()))
        .env("HERALD_SERVER_LISTEN", "127.0.0.1:9099")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    for line in [
        "server.listen = \"127.0.0.1:9099\"",
        "server.max_connections = 64",
        "server.admin_token = \"<redacted>\"",
        "retry.max_attempts = 10",
        "outbox[0].name = \"orders\"",
        "outbox[0].url = \"postgres://app:***@127.0.0.1/shop\"",
    ] {
        assert!(lines.contains(&line), "no line {line:?} in:\n{text}");
    }
    assert!(!text.contains("Config {") && !text.contains("pw-9e1c") && !text.contains(tests::ADMIN_TOKEN), "{text}");
    assert!(lines.iter().all(|l| l.contains(" = ")), "every line is a key and its value:\n{text}");
    Ok(())
}

/// `herald openapi | head`: a reader that went away ends the output quietly, without a panic.
#[test]
fn openapi_into_a_closed_pipe_exits_quietly() -> anyhow::Result<()> {
    let (reader, writer) = std::io::pipe()?;
    // Closed before the process starts, so its first write meets a broken pipe, whatever
    // the pipe's buffer could have held.
    drop(reader);
    let out = std::process::Command::new(herald_binary()?).arg("openapi").stdout(writer).output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.is_empty(), "{stderr}");
    Ok(())
}

/// Runs `herald check-config` with `env` (over the suite's base environment) and, if
/// given, a config file holding `toml`; returns whether it passed, and its output.
fn check_config(toml: Option<&str>, env: &[(&str, &str)]) -> anyhow::Result<(bool, String)> {
    let dir = tempfile::tempdir()?;
    let mut cmd = std::process::Command::new(herald_binary()?);
    cmd.arg("check-config").env_clear().envs(tests::base_env(dir.path())).envs(env.iter().copied());
    if let Some(toml) = toml {
        let file = dir.path().join("herald.toml");
        std::fs::write(&file, toml)?;
        cmd.arg("--config").arg(&file);
    }
    let out = cmd.output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), text))
}

/// Issue 48 §14: `check-config` checks the file's values too, also those a `HERALD_*`
/// variable overrides (the file is wrong, and would be used once the variable is unset);
/// and a wrong value that a variable set is named by that variable.
#[test]
fn check_config_checks_what_variables_hide_and_names_a_bad_variable() -> anyhow::Result<()> {
    // A wrong value in the file, hidden by a variable.
    let listen = [("HERALD_SERVER_LISTEN", "127.0.0.1:9099")];
    let (ok, text) = check_config(Some("[server]\nlisten = \"nowhere\"\n"), &listen)?;
    assert!(!ok, "a wrong value in the file passed:\n{text}");
    assert!(text.contains("server.listen") && text.contains("\"nowhere\""), "names the key and value:\n{text}");
    assert!(text.contains("hidden by HERALD_SERVER_LISTEN") && text.contains("herald.toml"), "{text}");
    let jitter = [("HERALD_RETRY_JITTER", "full")];
    let (ok, text) = check_config(Some("[retry]\njitter = \"0%\"\n"), &jitter)?;
    assert!(!ok && text.contains("retry.jitter") && text.contains("hidden by HERALD_RETRY_JITTER"), "{text}");
    // A right value in the file, overridden: fine, and the variable's value is shown.
    let (ok, text) = check_config(Some("[server]\nlisten = \"127.0.0.1:8080\"\n"), &listen)?;
    assert!(ok && text.contains("server.listen = \"127.0.0.1:9099\""), "{text}");

    // A wrong value from a variable is named by the variable, whatever the fault.
    for (var, value) in [
        ("HERALD_RETRY_BASE", "soon"),
        ("HERALD_SERVER_LISTEN", "nowhere"),
        ("HERALD_SERVER_MAX_PAYLOAD_BYTES", "-1"),
        ("HERALD_ENDPOINT_DEFAULTS_BURST", "0"),
        ("HERALD_RETRY_MAX_ATTEMPTS", "many"),
    ] {
        for file in [None, Some("[server]\nmax_connections = 64\n")] {
            let (ok, text) = check_config(file, &[(var, value)])?;
            assert!(!ok, "{var}={value} passed:\n{text}");
            assert!(text.contains(var), "{var}={value}: the error does not name the variable:\n{text}");
        }
    }
    Ok(())
}

/// Runs `herald ARGS` against `gw` with the admin token; `(success, stdout, stderr)`.
async fn herald(gw: &tests::TestGateway, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
    let (bin, api) = (herald_binary()?, gw.api.base.clone());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let run = tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin)
            .args(&args)
            .args(["--api", &api, "--token", tests::ADMIN_TOKEN, "--tenant", "acme"])
            .stdin(std::process::Stdio::null())
            .output()
    });
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), run).await???;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ok((out.status.success(), text(&out.stdout), text(&out.stderr)))
}

/// `herald trigger TYPE` posts the catalog's example of the type as a real event of the
/// tenant: fanned out, signed and delivered. `--data` posts a payload of one's own; a type
/// without an example, or unknown, is a one-line error and posts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_trigger_posts_the_catalog_example_as_a_real_event() -> anyhow::Result<()> {
    use serde_json::json;
    use tests::{ADMIN_TOKEN, FakeReceiver, TestGateway};
    let gw = TestGateway::start().await?;
    let rx = FakeReceiver::start().await?;
    gw.api.tenant("acme").await?;
    let ep = gw.api.endpoint("acme", json!({"url": rx.url(), "event_types": ["invoice.paid", "user.created"]})).await?;
    let secret = gateway::sign::Secret::parse(ep["secret"].as_str().unwrap()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let examples = json!([{"invoice": "in_1", "amount": 4200}, {"invoice": "in_2", "amount": 1}]);
    let schema = json!({"type": "object", "required": ["invoice"]});
    let r = gw
        .api
        .post(
            "/v1/tenants/acme/event-types",
            ADMIN_TOKEN,
            json!({"name": "invoice.paid", "schema": schema, "examples": examples}),
        )
        .await?;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = gw.api.post("/v1/tenants/acme/event-types", ADMIN_TOKEN, json!({"name": "user.created"})).await?;
    assert_eq!(r.status, 201, "{}", r.text);

    // The second example, as a real delivery, signed with the endpoint's secret.
    let (ok, stdout, stderr) = herald(&gw, &["trigger", "invoice.paid", "--example", "2"]).await?;
    assert!(ok, "herald trigger failed: {stderr}");
    let accepted: serde_json::Value = serde_json::from_str(&stdout)?;
    assert_eq!(accepted["deliveries"], 1, "{stdout}");
    let id = accepted["id"].as_str().unwrap().to_string();
    assert!(stderr.contains(&id) && stderr.contains("accepted: 1 deliveries"), "{stderr}");
    let got = rx.wait_for(1, std::time::Duration::from_secs(10)).await?;
    let body = got[0].json();
    assert_eq!((body["id"].as_str(), &body["data"]), (Some(id.as_str()), &examples[1]), "{body}");
    let (ts, sig) = (got[0].header("webhook-timestamp").unwrap(), got[0].header("webhook-signature").unwrap());
    assert!(gateway::sign::verify(&secret, &id, ts.parse()?, &got[0].body, sig), "signed: {sig}");

    // A payload of one's own, under a chosen id: a second trigger of that id is a duplicate.
    let data = r#"{"user": "u_7"}"#;
    let (ok, _, stderr) = herald(&gw, &["trigger", "user.created", "--data", data, "--id", "evt_cli_1"]).await?;
    assert!(ok, "{stderr}");
    let got = rx.wait_for(2, std::time::Duration::from_secs(10)).await?;
    assert_eq!(got[1].json()["data"], json!({"user": "u_7"}));
    let (ok, _, stderr) = herald(&gw, &["trigger", "user.created", "--data", data, "--id", "evt_cli_1"]).await?;
    assert!(ok && stderr.contains("posted before"), "{stderr}");

    // Refused, one line each, nothing posted: a type without examples, an example that does
    // not exist, an unknown type, data that is not JSON.
    for (args, says) in [
        (&["trigger", "user.created"][..], "0 example(s)"),
        (&["trigger", "invoice.paid", "--example", "3"][..], "no example 3"),
        (&["trigger", "invoice.refunded"][..], "not in tenant acme's catalog"),
        (&["trigger", "user.created", "--data", "{user"][..], "--data: not JSON"),
    ] {
        let (ok, _, stderr) = herald(&gw, args).await?;
        assert!(!ok && stderr.starts_with("error: ") && stderr.contains(says), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
    }
    rx.stays_at(2, std::time::Duration::from_millis(300)).await?;
    Ok(())
}
