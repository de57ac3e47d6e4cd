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
