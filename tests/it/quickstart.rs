//! README's five-minute path, run as a reader runs it: from nothing to a delivered event
//! whose signature the reader's own check verifies.

use std::path::Path;
use std::time::Duration;

/// The first `sh` block of README's "Five minutes to a delivered, verified event".
fn five_minute_block(readme: &str) -> Option<&str> {
    let section = readme.split("\n## Five minutes to a delivered, verified event\n").nth(1)?;
    section.split("```sh\n").nth(1)?.split("\n```").next()
}

/// README's five-minute block, run by bash in a network namespace of its own (so its fixed
/// ports, 8080 and 9999, meet nothing else on the machine), with the built `herald` for
/// `cargo run --release …` and the receiver's path from the repository's root: it prints
/// the delivery's state, `delivered`, and `verified` with the event as the receiver got it.
#[tokio::test]
async fn the_readme_five_minute_path_delivers_an_event_and_verifies_its_signature() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize()?;
    let readme = std::fs::read_to_string(root.join("README.md"))?;
    let block = five_minute_block(&readme).expect("README: a sh block under \"Five minutes …\"");
    let (cargo_run, receiver) = ("cargo run --release -p gateway --bin herald -- serve", "deploy/compose/receiver.py");
    assert!(block.contains(cargo_run) && block.contains(receiver), "the block changed:\n{block}");
    let herald = tests::herald_binary()?;
    let script = block
        .replace(cargo_run, &format!("{} serve", herald.display()))
        .replace(receiver, &root.join(receiver).display().to_string());
    // Stops what the block left running in the background (herald, the receiver).
    let script = format!("ip link set lo up\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n{script}\n");
    let dir = tempfile::tempdir()?;
    let mut command = tokio::process::Command::new("unshare");
    command.args(["--net", "bash", "-c", &script]).current_dir(dir.path()).kill_on_drop(true);
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("HERALD_")) {
        command.env_remove(name);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), command.output()).await??;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    let shown = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(out.status.success(), "{shown}");
    assert!(lines.contains(&"delivered"), "{shown}");
    let verified = lines.iter().find_map(|l| l.strip_prefix("verified "));
    let event: serde_json::Value = serde_json::from_str(verified.unwrap_or_else(|| panic!("{shown}")))?;
    assert_eq!(
        (&event["id"], &event["type"], &event["data"]["amount"]),
        (&"evt_1".into(), &"invoice.paid".into(), &1999.into()),
        "{shown}"
    );
    Ok(())
}
