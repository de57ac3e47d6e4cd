//! How Herald ships, each artifact used as a platform team would: the OCI image run with
//! podman (runc), the Helm chart validated and its cluster Deployment run under
//! `podman kube play`, the compose stack of two nodes on Postgres, the Debian package
//! installed and purged in a container. The image and the package carry the debug
//! `herald` this suite builds (its debug info stripped), so the suite builds no second,
//! release binary; a release runs the same scripts on a `dist` build (docs/deploying.md).
//! The tools come from `scripts/packaging-tools` (scripts/test runs it): a missing one
//! fails the test. Containers, volumes and networks a test makes are removed after it.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tests::pg::PgSchema;
use tests::{ADMIN_TOKEN, Api, FakeReceiver, done_or, eventually, free_port, herald_binary};

/// The image the tests run, built from the suite's `herald` by `scripts/image`.
const IMAGE: &str = "localhost/herald:it";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A packaging tool, run from the repository's root with the tools' directory first on
/// `PATH` and podman's state under target/containers (as scripts/lib/containers.sh sets).
fn tool(program: &str) -> Command {
    let root = repo();
    let mut cmd = Command::new(program);
    let path =
        format!("{}:{}", root.join("target/packaging-tools/bin").display(), std::env::var("PATH").unwrap_or_default());
    cmd.current_dir(&root)
        .env("PATH", path)
        .env("CONTAINERS_STORAGE_CONF", root.join("target/containers/storage.conf"))
        .env("CONTAINERS_CONF", root.join("target/containers/containers.conf"));
    cmd
}

/// Runs `cmd` to its end; its stdout, or an error with everything it printed.
fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("{cmd:?} (scripts/packaging-tools installs the tools)"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!("{cmd:?}: {}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(stdout)
}

/// Commands that undo what a test made, run when it ends, passed or failed.
struct Cleanup(Vec<Vec<String>>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for args in &self.0 {
            let _ = tool(&args[0]).args(&args[1..]).output();
        }
    }
}

fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Builds [`IMAGE`] from the suite's `herald` (one test at a time; unchanged inputs
/// keep the image as built).
fn image() -> anyhow::Result<&'static str> {
    let binary = herald_binary()?;
    std::fs::create_dir_all(repo().join("target/containers"))?;
    run(tool("flock")
        .args(["target/containers/image.lock", "scripts/image", "--tag", IMAGE, "--binary"])
        .arg(&binary))?;
    Ok(IMAGE)
}

fn git_head() -> anyhow::Result<String> {
    Ok(run(Command::new("git").current_dir(repo()).args(["rev-parse", "HEAD"]))?.trim().to_string())
}

/// `herald --version` of the suite's binary: its version and the commit it was built
/// from (whatever `HEAD` is now, if it was built before the last commit).
fn built_version() -> anyhow::Result<String> {
    let version = run(Command::new(herald_binary()?).arg("--version"))?;
    let revision = version.trim().rsplit_once(" (").map(|(_, r)| r.trim_end_matches(')').to_string());
    let revision = revision.unwrap_or_default();
    assert!(revision.len() == 12 && revision.chars().all(|c| c.is_ascii_hexdigit()), "no revision: {version}");
    Ok(version)
}

/// Waits until `/readyz` on 127.0.0.1:`port` answers 200.
async fn ready(port: u16, within: Duration) -> anyhow::Result<()> {
    let admin = Api::new(format!("http://127.0.0.1:{port}"));
    eventually("/readyz", within, || async {
        let status = admin.raw("GET", "/readyz", None, "").await.map(|r| r.status).unwrap_or(0);
        done_or(status == 200, status)
    })
    .await
}

/// The Standard Webhooks signature `secret` (`whsec_…`) gives `id`, `ts` and `body`.
fn signature(secret: &str, id: &str, ts: &str, body: &[u8]) -> anyhow::Result<String> {
    let key = base64::engine::general_purpose::STANDARD.decode(secret.strip_prefix("whsec_").context("whsec_")?)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key)?;
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(body);
    Ok(format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())))
}

/// Starts the image's `herald serve` on the host's network (its receiver is on 127.0.0.1)
/// with `volume` as its data directory; the ports of its API and admin listener.
fn run_image(name: &str, volume: &str) -> anyhow::Result<(u16, u16)> {
    let (api, admin) = (free_port()?, free_port()?);
    run(tool("podman").args(["run", "-d", "--name", name, "--network", "host", "-v"]).args([
        format!("{volume}:/var/lib/herald"),
        format!("--env=HERALD_SERVER_ADMIN_TOKEN={ADMIN_TOKEN}"),
        format!("--env=HERALD_SERVER_LISTEN=127.0.0.1:{api}"),
        format!("--env=HERALD_SERVER_ADMIN_LISTEN=127.0.0.1:{admin}"),
        "--env=HERALD_DELIVERY_ALLOW_PRIVATE_DESTINATIONS=true".into(),
        IMAGE.into(),
    ]))?;
    Ok((api, admin))
}

#[tokio::test]
async fn the_image_delivers_an_event_keeps_its_data_and_drains_on_sigterm() -> anyhow::Result<()> {
    image()?;
    let config: Value =
        serde_json::from_str(&run(tool("podman").args(["image", "inspect", "--format", "{{json .Config}}", IMAGE]))?)?;
    assert_eq!(config["User"], "65532:65532", "runs as the non-root user");
    assert_eq!(config["Cmd"], json!(["serve", "--config", "/etc/herald/herald.toml"]));
    assert!(config["Volumes"]["/var/lib/herald"].is_object(), "the data directory is a volume: {config}");
    let labels = &config["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(labels["org.opencontainers.image.revision"], git_head()?.as_str());
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert!(labels["org.opencontainers.image.source"].is_string(), "{labels}");

    let name = format!("herald-it-image-{}", std::process::id());
    let volume = format!("{name}-data");
    let _cleanup =
        Cleanup(vec![argv(&["podman", "rm", "-f", "-v", &name]), argv(&["podman", "volume", "rm", "-f", &volume])]);
    let spawned = Instant::now();
    let (api_port, admin_port) = run_image(&name, &volume)?;
    ready(admin_port, Duration::from_secs(120)).await?;
    eprintln!("image: spawn to /readyz in {:?}", spawned.elapsed());

    let api = Api::new(format!("http://127.0.0.1:{api_port}"));
    let rx = FakeReceiver::start().await?;
    api.tenant("acme").await?;
    let ep = api.endpoint("acme", json!({"url": rx.url(), "event_types": ["*"]})).await?;
    let reply = api.event("acme", json!({"id": "evt_image", "type": "invoice.paid", "payload": {"n": 1}})).await?;
    assert_eq!(reply.status, 202, "{}", reply.text);
    let got = rx.wait_for(1, Duration::from_secs(30)).await?;
    let ts = got[0].header("webhook-timestamp").context("timestamp")?;
    let expected = signature(ep["secret"].as_str().context("secret")?, "evt_image", ts, &got[0].body)?;
    assert_eq!(got[0].header("webhook-signature"), Some(expected.as_str()));

    // What a node needs at run time is in the image: the JavaScript runtime (found beside
    // the binary, precompiled), the example plugins, the build's revision.
    for plugin in ["transform-chat.js", "transform-chat.wasm", "classify-409.wasm", "sign-hmac-hex.wasm"] {
        let out = run(tool("podman")
            .args(["exec", &name, "herald", "plugin", "check"])
            .arg(format!("/usr/share/herald/plugins/{plugin}")))?;
        assert!(out.starts_with("ok: "), "{plugin}: {out}");
    }
    let version = run(tool("podman").args(["exec", &name, "herald", "--version"]))?;
    assert_eq!(version, built_version()?, "the image's herald is the build's, with its revision");

    // SIGTERM: the node drains and exits by itself, well within the 15 s it allows attempts.
    let stopping = Instant::now();
    run(tool("podman").args(["stop", "--time", "60", &name]))?;
    let stopped = stopping.elapsed();
    let code = run(tool("podman").args(["inspect", "--format", "{{.State.ExitCode}}", &name]))?;
    assert_eq!(code.trim(), "0", "exit status after SIGTERM");
    assert!(stopped < Duration::from_secs(15), "stopped in {stopped:?}");
    let logs = tool("podman").args(["logs", &name]).output()?;
    assert!(String::from_utf8_lossy(&logs.stderr).contains("shutting down"));

    // The data directory outlives the container: a new one on the volume knows the tenant.
    run(tool("podman").args(["rm", &name]))?;
    let (api_port, admin_port) = run_image(&name, &volume)?;
    ready(admin_port, Duration::from_secs(120)).await?;
    let again = Api::new(format!("http://127.0.0.1:{api_port}"));
    let id = ep["id"].as_str().context("endpoint id")?;
    let kept = again.get(&format!("/v1/tenants/acme/endpoints/{id}"), ADMIN_TOKEN).await?;
    assert_eq!(kept.status, 200, "the endpoint made before the restart: {}", kept.text);
    Ok(())
}

#[tokio::test]
async fn the_chart_validates_and_its_cluster_deployment_runs_under_podman_kube_play() -> anyhow::Result<()> {
    // Lint, strict schemas of every supported Kubernetes version, required values.
    run(&mut tool("scripts/chart-check"))?;

    image()?;
    let schema = PgSchema::create().await?;
    let rendered = run(tool("helm").args([
        "template",
        "it",
        "deploy/helm/herald",
        "--set",
        "mode=postgres",
        "--set",
        "replicas=1",
        "--set",
        &format!("adminToken={ADMIN_TOKEN}"),
        "--set",
        "databaseUrl=postgres://unused@localhost/unused",
        "--set",
        "image.repository=localhost/herald",
        "--set",
        "image.tag=it",
        "--set",
        "image.pullPolicy=Never",
    ]))?;
    let (api_port, admin_port) = (free_port()?, free_port()?);
    let mut adapt = tool("target/packaging-tools/venv/bin/python3");
    adapt.args(["scripts/lib/kube-play.py", ADMIN_TOKEN, &schema.url, &api_port.to_string(), &admin_port.to_string()]);
    adapt.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
    let mut child = adapt.spawn()?;
    std::io::Write::write_all(child.stdin.as_mut().context("stdin")?, rendered.as_bytes())?;
    let adapted = child.wait_with_output()?;
    assert!(adapted.status.success());
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("herald.yaml");
    std::fs::write(&file, &adapted.stdout)?;
    let file = file.to_string_lossy().to_string();

    // `kube down` leaves the volume podman made of the ConfigMap (named after it).
    let _cleanup =
        Cleanup(vec![argv(&["podman", "kube", "down", &file]), argv(&["podman", "volume", "rm", "-f", "it-herald"])]);
    run(tool("podman").args(["kube", "play", "--network", "host", &file]))?;
    ready(admin_port, Duration::from_secs(120)).await?;
    // The node's id is its pod's name, from the downward API.
    let api = Api::new(format!("http://127.0.0.1:{api_port}"));
    let metrics = api.raw("GET", "/metrics", None, "").await?.text;
    assert!(metrics.contains("herald_cluster_nodes 1"), "{metrics}");
    let logs = tool("podman").args(["logs", "it-herald-pod-0-herald"]).output()?;
    let logs = String::from_utf8_lossy(&logs.stderr);
    assert!(logs.contains(r#""node_id":"it-herald-pod-0""#), "{logs}");
    Ok(())
}

#[tokio::test]
async fn the_compose_stack_delivers_an_event_through_two_nodes_on_postgres() -> anyhow::Result<()> {
    image()?;
    run(&mut tool("scripts/compose-images"))?;
    let project = format!("herald-it-{}", std::process::id());
    let ports: Vec<u16> = (0..5).map(|_| free_port()).collect::<anyhow::Result<_>>()?;
    let env = [
        ("HERALD_ADMIN_TOKEN", ADMIN_TOKEN.to_string()),
        ("HERALD_IMAGE", IMAGE.to_string()),
        ("HERALD_1_PORT", ports[0].to_string()),
        ("HERALD_1_ADMIN_PORT", ports[1].to_string()),
        ("HERALD_2_PORT", ports[2].to_string()),
        ("HERALD_2_ADMIN_PORT", ports[3].to_string()),
        ("RECEIVER_PORT", ports[4].to_string()),
    ];
    let compose = |args: &[&str]| {
        let mut cmd = tool("podman-compose");
        cmd.current_dir(repo().join("deploy/compose"));
        cmd.args(["-p", &project, "-f", "compose.yaml", "-f", "compose.local.yaml"]).args(args);
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        cmd
    };
    // podman-compose 1.0.3 leaves the containers' anonymous volumes, the project's volume
    // and its network behind after `down`: remove them by name.
    let label = format!("label=io.podman.compose.project={project}");
    let _cleanup = Cleanup(vec![
        argv(&["sh", "-c", &format!("podman ps -a -q --filter {label} | xargs -r podman rm -f -v")]),
        argv(&["podman", "volume", "rm", "-f", &format!("{project}_pgdata")]),
        argv(&["podman", "network", "rm", "-f", &format!("{project}_default")]),
    ]);
    run(&mut compose(&["up", "-d"]))?;

    let nodes =
        [Api::new(format!("http://127.0.0.1:{}", ports[0])), Api::new(format!("http://127.0.0.1:{}", ports[2]))];
    for (node, admin) in [(0, ports[1]), (1, ports[3])] {
        // Postgres makes its cluster on first start; a node waits for it.
        ready(admin, Duration::from_secs(180)).await.with_context(|| format!("node {}", node + 1))?;
    }
    for node in &nodes {
        eventually("both nodes in the cluster", Duration::from_secs(30), || async {
            let metrics = node.raw("GET", "/metrics", None, "").await?.text;
            done_or(metrics.contains("herald_cluster_nodes 2"), "not yet 2")
        })
        .await?;
    }

    nodes[0].tenant("acme").await?;
    let ep = nodes[0].endpoint("acme", json!({"url": "http://receiver:9999/hook", "event_types": ["*"]})).await?;
    let reply =
        nodes[1].event("acme", json!({"id": "evt_compose", "type": "invoice.paid", "payload": {"n": 1}})).await?;
    assert_eq!(reply.status, 202, "{}", reply.text);
    let receiver = Api::new(format!("http://127.0.0.1:{}", ports[4]));
    let got = eventually("the receiver got evt_compose", Duration::from_secs(60), || async {
        let list = receiver.raw("GET", "/", None, "").await?.json;
        let hit = list.as_array().and_then(|l| l.iter().find(|r| r["headers"]["webhook-id"] == "evt_compose").cloned());
        Ok(hit.ok_or_else(|| list.to_string()))
    })
    .await?;
    let body = got["body"].as_str().context("body")?;
    let ts = got["headers"]["webhook-timestamp"].as_str().context("timestamp")?;
    let expected = signature(ep["secret"].as_str().context("secret")?, "evt_compose", ts, body.as_bytes())?;
    assert_eq!(got["headers"]["webhook-signature"], expected.as_str());

    run(&mut compose(&["down", "-v"]))?;
    Ok(())
}

#[test]
fn the_debian_package_installs_runs_and_purges_cleanly() -> anyhow::Result<()> {
    let binary = herald_binary()?;
    let out = run(tool("scripts/deb").args(["--fast", "--check", "--binary"]).arg(&binary))?;
    assert!(out.contains("deb: installed, ran and purged cleanly"), "{out}");
    let version = out.lines().find(|l| l.starts_with("herald ")).context("herald --version in the container")?;
    assert_eq!(format!("{version}\n"), built_version()?, "the package's herald is the build's");
    Ok(())
}
