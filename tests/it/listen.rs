//! `herald listen` end to end, with real processes: the `herald` binary as the node (or two
//! nodes on one Postgres) and as the listener, and a receiver on 127.0.0.1 standing for the
//! developer's local server. Deliveries arrive once each and signed as any push, wait while
//! no listener is connected, are retried and classified as HTTP answers, and reach a
//! listener connected to a node that did not own the endpoint.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tests::pg::PgSchema;
use tests::{ADMIN_TOKEN, Answer, Api, Backend, FakeReceiver, HeraldProcess, Received, eventually, herald_binary};

tests::backends!(
    a_thousand_events_arrive_once_each_and_every_signature_verifies,
    a_killed_listener_gets_what_waited_once_it_is_back,
    a_listeners_answers_are_classified_as_http_answers,
    bad_input_is_refused_naming_what_is_wrong,
);

const WAIT: Duration = Duration::from_secs(60);
const TYPE: &str = "invoice.paid";
/// Fast retries, so a 500 is tried again at once, and new endpoints (the listener's) paced
/// for a thousand events in seconds.
const NODE_ENV: [(&str, &str); 6] = [
    ("HERALD_RETRY_BASE", "100ms"),
    ("HERALD_RETRY_CAP", "1s"),
    ("HERALD_RETRY_JITTER", "none"),
    ("HERALD_ENDPOINT_DEFAULTS_RATE_PER_SEC", "500"),
    ("HERALD_ENDPOINT_DEFAULTS_BURST", "50"),
    ("HERALD_ENDPOINT_DEFAULTS_MAX_IN_FLIGHT", "16"),
];

/// One `herald serve` process on `backend`, with tenant `acme`, its type and a token.
struct Node {
    // Declared first: the node stops before its directory and schema go.
    process: HeraldProcess,
    _dir: tempfile::TempDir,
    _schema: Option<PgSchema>,
    token: String,
}

impl Node {
    async fn start(backend: Backend) -> anyhow::Result<Node> {
        let (dir, bin) = (tempfile::tempdir()?, herald_binary()?);
        let schema = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(PgSchema::create().await?),
        };
        let mut env = NODE_ENV.to_vec();
        if let Some(s) = &schema {
            env.push(("HERALD_STORE_URL", &s.url));
        }
        let process = HeraldProcess::start(&bin, dir.path(), &env).await?;
        let token = setup_tenant(&process.api).await?;
        Ok(Node { process, _dir: dir, _schema: schema, token })
    }

    fn api(&self) -> &Api {
        &self.process.api
    }
}

/// Tenant `acme`, its event types and a token of every scope `herald listen` uses.
async fn setup_tenant(api: &Api) -> anyhow::Result<String> {
    api.tenant("acme").await?;
    api.post("/v1/tenants/acme/event-types", ADMIN_TOKEN, json!({"name": TYPE})).await?.expect(201)?;
    api.post("/v1/tenants/acme/event-types", ADMIN_TOKEN, json!({"name": "user.created"})).await?.expect(201)?;
    api.token("acme", &["manage", "read", "events:write", "replay"]).await
}

/// A running `herald listen`, its standard output and error in files; killed when dropped.
struct Listener {
    child: Child,
    out: PathBuf,
    err: PathBuf,
    _dir: tempfile::TempDir,
}

impl Listener {
    fn start(api: &Api, token: &str, args: &[&str]) -> anyhow::Result<Listener> {
        let dir = tempfile::tempdir()?;
        let (out, err) = (dir.path().join("out"), dir.path().join("err"));
        let child = listen_command(api, token, args)
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(&err)?)
            .spawn()?;
        Ok(Listener { child, out, err, _dir: dir })
    }

    /// The lines it printed, one per delivery.
    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.out).unwrap_or_default().lines().map(String::from).collect()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// SIGKILL: the connection drops with no goodbye.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.kill();
    }
}

fn listen_command(api: &Api, token: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(herald_binary().expect("herald"));
    cmd.arg("listen")
        .args(["--api", &api.base, "--token", token, "--tenant", "acme", "--name", "dev"])
        .args(args)
        .env_clear()
        .stdin(Stdio::null());
    cmd
}

/// Runs `herald listen` to its end (it ends only on an error), within 30 s.
async fn listen_fails(api: &Api, token: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = tokio::process::Command::from(listen_command(api, token, args));
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output()).await??;
    anyhow::ensure!(!out.status.success(), "herald listen {args:?} succeeded");
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Posts `ids` as events of [`TYPE`], in batches.
async fn post(api: &Api, ids: &[String]) -> anyhow::Result<()> {
    for chunk in ids.chunks(100) {
        let events: Vec<Value> =
            chunk.iter().map(|id| json!({"id": id, "type": TYPE, "payload": {"id": id}})).collect();
        api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, json!({"events": events})).await?.expect(202)?;
    }
    Ok(())
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("evt_{prefix}{i:05}")).collect()
}

/// The listen endpoint named `dev`, once the listener created it.
async fn listen_endpoint(api: &Api) -> anyhow::Result<Value> {
    eventually("the listen endpoint", WAIT, || async {
        let list = api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.expect(200)?;
        let found = list.json["data"].as_array().into_iter().flatten().find(|e| e["url"] == "listen://dev").cloned();
        Ok(found.ok_or(list.text))
    })
    .await
}

/// The endpoint's `v1` secret.
async fn secret(api: &Api, endpoint: &str) -> anyhow::Result<String> {
    let r = api.get(&format!("/v1/tenants/acme/endpoints/{endpoint}/secret"), ADMIN_TOKEN).await?.expect(200)?;
    Ok(r.json["secret"].as_str().unwrap_or_default().to_string())
}

/// Checks a request's Standard Webhooks signature with an HMAC of the test's own.
fn verify(secret: &str, r: &Received) -> anyhow::Result<()> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64.decode(secret.strip_prefix("whsec_").unwrap_or(secret))?;
    let (id, ts) = (r.header("webhook-id").unwrap_or_default(), r.header("webhook-timestamp").unwrap_or_default());
    let mut mac = Hmac::<Sha256>::new_from_slice(&key)?;
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&r.body);
    let expected = format!("v1,{}", b64.encode(mac.finalize().into_bytes()));
    let got = r.header("webhook-signature").unwrap_or_default();
    anyhow::ensure!(got.split(' ').any(|s| s == expected), "{id}: signature {got:?}, want {expected}");
    Ok(())
}

/// Each of `want` arrived exactly once (by `webhook-id`), and nothing else did.
fn once_each(got: &[Received], want: &[String]) -> anyhow::Result<()> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for r in got {
        *seen.entry(r.header("webhook-id").unwrap_or_default()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    anyhow::ensure!(twice.is_empty(), "arrived more than once: {twice:?}");
    let missing: Vec<_> = want.iter().filter(|id| !seen.contains_key(id.as_str())).collect();
    anyhow::ensure!(missing.is_empty() && seen.len() == want.len(), "missing {missing:?}, {} arrived", seen.len());
    Ok(())
}

/// Waits until `n` deliveries of the tenant are `delivered` (their answers recorded).
async fn wait_delivered(api: &Api, n: usize) -> anyhow::Result<()> {
    let limit = (n + 1).min(1000);
    api.wait_for(&format!("/v1/tenants/acme/deliveries?state=delivered&limit={limit}"), WAIT, |v| {
        v["data"].as_array().is_some_and(|d| d.len() == n)
    })
    .await?;
    Ok(())
}

async fn a_thousand_events_arrive_once_each_and_every_signature_verifies(backend: Backend) -> anyhow::Result<()> {
    let node = Node::start(backend).await?;
    let rx = FakeReceiver::start().await?;
    let listener = Listener::start(node.api(), &node.token, &["--forward", &rx.url(), "--types", TYPE])?;
    let endpoint = listen_endpoint(node.api()).await?;
    assert_eq!(endpoint["kind"], "listen");
    // Of another type: not the listener's.
    node.api().event("acme", json!({"id": "evt_other", "type": "user.created", "payload": {}})).await?.expect(202)?;
    let want = ids("k", 1000);
    post(node.api(), &want).await?;
    let got = rx.wait_for(want.len(), WAIT).await?;
    once_each(&got, &want)?;
    let secret = secret(node.api(), endpoint["id"].as_str().unwrap_or_default()).await?;
    for r in &got {
        verify(&secret, r)?;
    }
    wait_delivered(node.api(), want.len()).await?;
    rx.stays_at(want.len(), Duration::from_millis(500)).await?;
    let lines = eventually("a line per delivery", WAIT, || async {
        let lines = listener.lines();
        Ok(if lines.len() >= want.len() { Ok(lines) } else { Err(lines.len().to_string()) })
    })
    .await?;
    assert!(lines[0].starts_with("200  ") && lines[0].contains(" ms  dlv_") && lines[0].contains(TYPE), "{lines:?}");
    // It says where the signing secret is, never the secret.
    let said = listener.stderr();
    assert!(said.contains("/secret") && !said.contains("whsec_") && !said.contains(&secret), "{said}");
    Ok(())
}

async fn a_killed_listener_gets_what_waited_once_it_is_back(backend: Backend) -> anyhow::Result<()> {
    let node = Node::start(backend).await?;
    let rx = FakeReceiver::start().await?;
    let args = ["--forward", &rx.url(), "--types", TYPE];
    let mut listener = Listener::start(node.api(), &node.token, &args)?;
    listen_endpoint(node.api()).await?;
    let first = ids("a", 50);
    post(node.api(), &first).await?;
    rx.wait_for(first.len(), WAIT).await?;
    wait_delivered(node.api(), first.len()).await?;
    listener.kill();
    let second = ids("b", 200);
    post(node.api(), &second).await?;
    // Nothing goes anywhere while no listener is connected, and nothing gives up.
    rx.stays_at(first.len(), Duration::from_secs(3)).await?;
    let r = node.api().get("/v1/tenants/acme/dead-letters", ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(r.json["data"].as_array().map(Vec::len), Some(0), "{}", r.text);
    let _back = Listener::start(node.api(), &node.token, &args)?;
    let all: Vec<String> = first.iter().chain(&second).cloned().collect();
    let got = rx.wait_for(all.len(), WAIT).await?;
    wait_delivered(node.api(), all.len()).await?;
    once_each(&rx.received(), &all)?;
    assert_eq!(got.len(), all.len());
    let endpoints = node.api().get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(endpoints.json["data"].as_array().map(Vec::len), Some(1), "the listener came back to its endpoint");
    Ok(())
}

async fn a_listeners_answers_are_classified_as_http_answers(backend: Backend) -> anyhow::Result<()> {
    let node = Node::start(backend).await?;
    let rx = FakeReceiver::start().await?;
    rx.script([Answer::status(500).body("boom")]);
    let listener = Listener::start(node.api(), &node.token, &["--forward", &rx.url()])?;
    listen_endpoint(node.api()).await?;
    node.api().event("acme", json!({"id": "evt_500", "type": TYPE, "payload": {}})).await?.expect(202)?;
    let d = wait_state(node.api(), "evt_500", |d| d["state"] == "delivered").await?;
    let history = d["attempt_history"].as_array().cloned().unwrap_or_default();
    let statuses: Vec<_> = history.iter().map(|a| a["status"].as_u64()).collect();
    assert_eq!(statuses, [Some(500), Some(200)], "{d}");
    assert_eq!(history[0]["response_body"], "boom", "{d}");
    assert!(history[0]["verdict"].as_str().is_some_and(|v| v.starts_with("retry")), "{d}");
    assert_eq!(rx.count(), 2);
    assert!(listener.lines().iter().any(|l| l.starts_with("500  ")), "{:?}", listener.lines());

    // A 429 with Retry-After pauses the endpoint as an HTTP one would be.
    rx.script([Answer::status(429).header("Retry-After", "30")]);
    node.api().event("acme", json!({"id": "evt_429", "type": TYPE, "payload": {}})).await?.expect(202)?;
    let endpoint = listen_endpoint(node.api()).await?;
    let path = format!("/v1/tenants/acme/endpoints/{}", endpoint["id"].as_str().unwrap_or_default());
    node.api().wait_for(&path, WAIT, |e| e["state"] == "paused").await?;
    node.api().post(&format!("{path}/enable"), ADMIN_TOKEN, json!({})).await?.expect(200)?;
    wait_state(node.api(), "evt_429", |d| d["state"] == "delivered").await?;

    // A local URL refusing connections is a transport failure, retried.
    drop(listener);
    let closed = format!("http://127.0.0.1:{}/hook", tests::free_port()?);
    let refused = Listener::start(node.api(), &node.token, &["--forward", &closed])?;
    node.api().event("acme", json!({"id": "evt_refused", "type": TYPE, "payload": {}})).await?.expect(202)?;
    let d = wait_state(node.api(), "evt_refused", |d| d["attempts"].as_u64() >= Some(2)).await?;
    let error = d["attempt_history"][0]["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("connection_refused"), "{d}");
    assert_ne!(d["state"], "dead", "{d}");

    // Out of attempts, it is a dead letter; `--replay` sends it again through the listener.
    let dead = wait_state(node.api(), "evt_refused", |d| d["state"] == "dead").await?;
    drop(refused);
    let before = rx.count();
    let id = dead["id"].as_str().unwrap_or_default();
    let _back = Listener::start(node.api(), &node.token, &["--forward", &rx.url(), "--replay", id])?;
    let got = rx.wait_for(before + 1, WAIT).await?;
    assert_eq!(got.last().and_then(|r| r.header("webhook-id")), Some("evt_refused"));
    wait_state(node.api(), "evt_refused", |d| d["state"] == "delivered").await?;
    Ok(())
}

/// The delivery of `event`, once `done` holds for it.
async fn wait_state(api: &Api, event: &str, done: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
    eventually(event, WAIT, || async {
        let r = api.get(&format!("/v1/tenants/acme/events/{event}/deliveries"), ADMIN_TOKEN).await?;
        let Some(id) = r.json["data"][0]["id"].as_str() else { return Ok(Err(r.text)) };
        let d = api.get(&format!("/v1/tenants/acme/deliveries/{id}"), ADMIN_TOKEN).await?.json;
        Ok(if done(&d) { Ok(d) } else { Err(d.to_string()) })
    })
    .await
}

async fn bad_input_is_refused_naming_what_is_wrong(backend: Backend) -> anyhow::Result<()> {
    let node = Node::start(backend).await?;
    let (api, token) = (node.api(), node.token.as_str());
    let err = listen_fails(api, token, &["--forward", "localhost:3000/hook"]).await?;
    assert!(err.contains("--forward \"localhost:3000/hook\": the scheme must be http or https"), "{err}");
    let err = listen_fails(api, token, &["--forward", "not a url"]).await?;
    assert!(err.contains("--forward \"not a url\": not a URL"), "{err}");
    let err = listen_fails(api, "hrt_not_a_token", &["--forward", "http://127.0.0.1:9/h", "--types", TYPE]).await?;
    assert!(err.contains("--token: Herald refused it (401"), "{err}");
    let err = listen_fails(api, "hrt_not_a_token", &["--forward", "http://127.0.0.1:9/h"]).await?;
    assert!(err.contains("--token: Herald refused it (401"), "{err}");
    let err =
        listen_fails(api, token, &["--forward", "http://127.0.0.1:9/h", "--types", "nope.never,invoice.*"]).await?;
    assert!(err.contains("--types: nope.never not in tenant acme's event catalog"), "{err}");
    let list = api.get("/v1/tenants/acme/endpoints", ADMIN_TOKEN).await?.expect(200)?;
    assert_eq!(list.json["data"].as_array().map(Vec::len), Some(0), "nothing was written: {}", list.text);

    // The routes: only a `listen` endpoint takes a listener; an answer names its field.
    let http = api.endpoint("acme", json!({"url": "http://127.0.0.1:9/h"})).await?;
    let path = format!("/v1/tenants/acme/endpoints/{}/listen", http["id"].as_str().unwrap_or_default());
    let r = api.get(&path, ADMIN_TOKEN).await?;
    assert_eq!((r.status, r.json["error"]["code"].as_str()), (409, Some("conflict")), "{}", r.text);
    let r = api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, json!({"url": "listen://", "kind": "listen"})).await?;
    assert!(r.status == 422 || r.status == 400, "{}", r.text);
    assert!(r.json["error"]["message"].as_str().is_some_and(|m| m.starts_with("url")), "{}", r.text);
    let body = json!({"url": "listen://dev", "kind": "listen", "verify": true});
    let r = api.post("/v1/tenants/acme/endpoints", ADMIN_TOKEN, body).await?;
    assert!(r.json["error"]["message"].as_str().is_some_and(|m| m.starts_with("verify")), "{}", r.text);
    let ep = api.endpoint("acme", json!({"url": "listen://dev", "kind": "listen"})).await?;
    let path = format!("/v1/tenants/acme/endpoints/{}/listen", ep["id"].as_str().unwrap_or_default());
    for (body, field) in [
        (json!({"request": "r1"}), "status"),
        (json!({"request": "r1", "status": 99}), "status"),
        (json!({"request": "r1", "status": 200, "error": "timeout"}), "error"),
        (json!({"request": "r1", "error": "on_fire"}), "error"),
        (json!({"status": 200}), "request"),
    ] {
        let r = api.post(&path, ADMIN_TOKEN, body.clone()).await?;
        let message = r.json["error"]["message"].as_str().unwrap_or_default().to_string();
        assert!((400..500).contains(&r.status) && message.contains(field), "{body}: {} {}", r.status, r.text);
    }
    let r = api.post(&path, ADMIN_TOKEN, json!({"request": "r1", "status": 200})).await?.expect(200)?;
    assert_eq!(r.json["taken"], false, "nothing waits for it");
    Ok(())
}

/// Two nodes on one Postgres: the listener connects to the node that does not own the
/// endpoint (by the cluster's hash), where its deliveries waited; they move to the node
/// holding the connection and arrive there once each, signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_on_the_node_that_does_not_own_the_endpoint_gets_its_deliveries() -> anyhow::Result<()> {
    let (bin, schema) = (herald_binary()?, PgSchema::create().await?);
    let names = ["node-a", "node-b"];
    let mut nodes = Vec::new();
    let mut dirs = Vec::new();
    for name in names {
        let dir = tempfile::tempdir()?;
        let mut env = NODE_ENV.to_vec();
        env.extend([("HERALD_STORE_URL", schema.url.as_str()), ("HERALD_CLUSTER_NODE_ID", name)]);
        nodes.push(HeraldProcess::start(&bin, dir.path(), &env).await?);
        dirs.push(dir);
    }
    for node in &nodes {
        eventually("both nodes in the cluster", WAIT, || async {
            let m = node.api.raw("GET", "/metrics", Some(ADMIN_TOKEN), "").await?;
            Ok(if m.text.contains("herald_cluster_nodes 2") { Ok(()) } else { Err("not yet".to_string()) })
        })
        .await?;
    }
    let token = setup_tenant(&nodes[0].api).await?;
    let ep = nodes[0].api.endpoint("acme", json!({"url": "listen://dev", "kind": "listen"})).await?;
    let id = ep["id"].as_str().unwrap_or_default().to_string();
    let members: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let owner = gateway::lease::preferred_node(&id, &members).unwrap_or_default();
    let (owns, other) = if owner == names[0] { (&nodes[0], &nodes[1]) } else { (&nodes[1], &nodes[0]) };
    let want = ids("c", 100);
    post(&owns.api, &want).await?;
    let rx = FakeReceiver::start().await?;
    // Waiting on the owner, with no listener anywhere.
    rx.stays_at(0, Duration::from_secs(2)).await?;
    let listener = Listener::start(&other.api, &token, &["--forward", &rx.url(), "--endpoint", &id])?;
    let got = rx.wait_for(want.len(), WAIT).await.map_err(|e| anyhow::anyhow!("{e}; {}", listener.stderr()))?;
    once_each(&got, &want)?;
    let secret = secret(&owns.api, &id).await?;
    for r in &got {
        verify(&secret, r)?;
    }
    wait_delivered(&owns.api, want.len()).await?;
    // Events posted to either node now go to the listener's.
    let more = ids("d", 20);
    post(&owns.api, &more).await?;
    let all: Vec<String> = want.iter().chain(&more).cloned().collect();
    rx.wait_for(all.len(), WAIT).await?;
    wait_delivered(&other.api, all.len()).await?;
    once_each(&rx.received(), &all)?;
    drop(listener);
    drop(nodes);
    Ok(())
}
