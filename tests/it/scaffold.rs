//! `herald plugin new --lang rust NAME` creates a project whose unit test passes: built
//! natively against `plugin_sdk::testing`, with the workspace's lock file (no download)
//! and a target directory under the workspace's, so a warm run only rebuilds the project.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// What one cold build of the project may take on a shared 2-core machine.
const BUILD_LIMIT: Duration = Duration::from_secs(600);

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn a_scaffolded_rust_plugin_builds_and_its_test_passes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let herald = tests::herald_binary()?;
    let out =
        Command::new(&herald).args(["plugin", "new", "--lang", "rust", "add-tag", "--dir"]).arg(dir.path()).output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let root = dir.path().join("add-tag");
    let again =
        Command::new(&herald).args(["plugin", "new", "--lang", "rust", "add-tag", "--dir"]).arg(dir.path()).output()?;
    assert!(!again.status.success(), "an existing project is never overwritten");
    std::fs::copy(workspace().join("Cargo.lock"), root.join("Cargo.lock"))?;

    let started = Instant::now();
    let mut child = Command::new(env!("CARGO"))
        .args(["test", "--offline", "--quiet"])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", workspace().join("target/scaffold"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cargo test")?;
    while child.try_wait()?.is_none() {
        if started.elapsed() > BUILD_LIMIT {
            child.kill()?;
            anyhow::bail!("the scaffolded project did not build and test within {BUILD_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("2 passed"), "its two tests ran: {text}");
    Ok(())
}
