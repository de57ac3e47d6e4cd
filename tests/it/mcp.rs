//! `herald mcp`: the Model Context Protocol server on stdio, driven as an assistant's client
//! drives it (the real binary, JSON-RPC lines on its pipes) against a real node.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Answer, FakeReceiver, TestGateway, herald_binary};

/// A running `herald mcp` and its pipes.
struct Mcp {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    next_id: u64,
}

impl Mcp {
    fn start(api: &str, token: &str) -> anyhow::Result<Mcp> {
        let mut child = Command::new(herald_binary()?)
            .args(["mcp", "--api", api, "--token", token])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(Mcp { child, stdin, lines, next_id: 1 })
    }

    fn send_line(&mut self, line: &str) -> anyhow::Result<()> {
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        Ok(())
    }

    /// The next line the server writes, as JSON (within 15 s).
    fn answer(&self) -> anyhow::Result<Value> {
        let line = self.lines.recv_timeout(Duration::from_secs(15)).context("no answer from herald mcp in 15 s")?;
        serde_json::from_str(&line).with_context(|| format!("not JSON: {line}"))
    }

    /// A request and its answer, checked to be the answer to it.
    fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send_line(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string())?;
        let answer = self.answer()?;
        ensure!(answer["jsonrpc"] == "2.0" && answer["id"] == id, "not the answer to {id}: {answer}");
        Ok(answer)
    }

    /// `tools/call`'s result: `(is_error, structured content or text)`.
    fn tool(&mut self, name: &str, arguments: Value) -> anyhow::Result<(bool, Value)> {
        let answer = self.request("tools/call", json!({"name": name, "arguments": arguments}))?;
        let result = answer.get("result").with_context(|| format!("{name}: not a result: {answer}"))?;
        let is_error = result["isError"].as_bool().context("isError")?;
        let text = result["content"][0]["text"].as_str().context("text content")?;
        Ok((is_error, result.get("structuredContent").cloned().unwrap_or_else(|| json!(text))))
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tool_names(list: &Value) -> Vec<String> {
    list["result"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(String::from))
        .collect()
}

/// An assistant with a tenant's `read` token finds the failing endpoints, inspects a dead
/// letter's attempts and cannot replay; with `replay` it replays by id, the delivery goes
/// out, and the replay is in the audit log as that token's. Bad messages get JSON-RPC
/// errors, bad arguments a tool error naming them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assistant_finds_a_failing_endpoint_inspects_its_dead_letter_and_replays_it() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let (bad, good) = (FakeReceiver::start().await?, FakeReceiver::start().await?);
    bad.set_default(Answer::status(422));
    gw.api.tenant("acme").await?;
    let failing = gw.api.endpoint("acme", json!({"url": bad.url(), "event_types": ["invoice.paid"]})).await?;
    let healthy = gw.api.endpoint("acme", json!({"url": good.url(), "event_types": ["invoice.paid"]})).await?;
    let paused = gw.api.endpoint("acme", json!({"url": good.url(), "event_types": ["user.created"]})).await?;
    let id = |ep: &Value| ep["id"].as_str().unwrap_or_default().to_string();
    let (failing, healthy, paused) = (id(&failing), id(&healthy), id(&paused));
    gw.api
        .post(&format!("/v1/tenants/acme/endpoints/{paused}/pause"), ADMIN_TOKEN, json!({"reason": "maintenance"}))
        .await?
        .expect(200)?;
    gw.api.event("acme", json!({"id": "evt_1", "type": "invoice.paid", "payload": {"n": 1}})).await?.expect(202)?;
    let dead = gw
        .api
        .wait_for("/v1/tenants/acme/dead-letters", Duration::from_secs(15), |v| {
            v["data"].as_array().is_some_and(|d| d.len() == 1)
        })
        .await?;
    let dlv = dead["data"][0]["id"].as_str().context("dead letter id")?.to_string();
    good.wait_for(1, Duration::from_secs(10)).await?;

    let reader = gw.api.token("acme", &["read"]).await?;
    let mut mcp = Mcp::start(&gw.api.base, &reader)?;
    let init = mcp.request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}),
    )?;
    ensure!(init["result"]["protocolVersion"] == "2025-06-18", "{init}");
    ensure!(init["result"]["capabilities"]["tools"].is_object() && init["result"]["serverInfo"]["name"] == "herald");
    // A notification gets no answer: the next line is the answer to the next request.
    mcp.send_line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)?;
    let listed = mcp.request("tools/list", json!({}))?;
    let names = tool_names(&listed);
    ensure!(
        names == ["list_failing_endpoints", "inspect_delivery", "list_dead_letters"],
        "a read token is offered exactly the read tools: {names:?}"
    );
    for tool in listed["result"]["tools"].as_array().context("tools")? {
        ensure!(tool["inputSchema"]["type"] == "object" && tool["description"].is_string(), "{tool}");
    }

    let (is_error, found) = mcp.tool("list_failing_endpoints", json!({}))?;
    ensure!(!is_error, "{found}");
    let found: Vec<(String, String)> = found["endpoints"]
        .as_array()
        .context("endpoints")?
        .iter()
        .map(|e| (e["id"].as_str().unwrap_or_default().into(), e["status"].as_str().unwrap_or_default().into()))
        .collect();
    ensure!(found.contains(&(paused.clone(), "paused".into())), "the paused endpoint is listed: {found:?}");
    ensure!(!found.iter().any(|(id, _)| *id == healthy), "a healthy endpoint is not failing: {found:?}");

    let (is_error, delivery) = mcp.tool("inspect_delivery", json!({"delivery_id": dlv}))?;
    ensure!(!is_error, "{delivery}");
    ensure!(delivery["endpoint_id"] == failing.as_str(), "{delivery}");
    let attempts = delivery["attempt_history"].as_array().context("attempt_history")?;
    ensure!(attempts.len() == 1 && attempts[0]["status"] == 422, "{delivery}");
    let (is_error, deliveries) = mcp.tool("inspect_delivery", json!({"event_id": "evt_1"}))?;
    ensure!(!is_error && deliveries["data"].as_array().map(Vec::len) == Some(2), "{deliveries}");
    let (is_error, letters) = mcp.tool("list_dead_letters", json!({"endpoint": failing}))?;
    ensure!(!is_error && letters["data"][0]["id"] == dlv.as_str(), "{letters}");

    // What the token may not do, and bad arguments: tool errors that say why.
    let (is_error, said) = mcp.tool("replay_dead_letters", json!({"ids": [dlv]}))?;
    ensure!(is_error && said.to_string().contains("replay scope"), "{said}");
    let (is_error, said) = mcp.tool("inspect_delivery", json!({"delivery_id": dlv, "verbose": true}))?;
    ensure!(is_error && said.to_string().contains("verbose: not an argument"), "{said}");
    let (is_error, said) = mcp.tool("inspect_delivery", json!({}))?;
    ensure!(is_error && said.to_string().contains("delivery_id or event_id"), "{said}");
    let (is_error, said) = mcp.tool("list_dead_letters", json!({"tenant": "other"}))?;
    let refused = ["answered 403", "answered 404"].iter().any(|a| said.to_string().contains(a));
    ensure!(is_error && refused, "another tenant's dead letters are refused: {said}");
    // Protocol errors: not JSON, an unknown method, an unknown tool.
    mcp.send_line("{not json")?;
    ensure!(mcp.answer()?["error"]["code"] == -32700);
    ensure!(mcp.request("resources/list", json!({}))?["error"]["code"] == -32601);
    ensure!(mcp.request("tools/call", json!({"name": "drop_tables"}))?["error"]["code"] == -32602);
    drop(mcp);

    // With `replay`: a replay by id that delivers once the receiver is fixed, and an audit
    // entry naming the token.
    let created = gw.api.post("/v1/tenants/acme/tokens", ADMIN_TOKEN, json!({"scopes": ["read", "replay"]})).await?;
    let created = created.expect(201)?;
    let (token_id, replayer) =
        (created.json["id"].as_str().context("id")?, created.json["token"].as_str().context("token")?);
    let mut mcp = Mcp::start(&gw.api.base, replayer)?;
    ensure!(tool_names(&mcp.request("tools/list", json!({}))?).contains(&"replay_dead_letters".to_string()));
    let (is_error, said) = mcp.tool("replay_dead_letters", json!({}))?;
    ensure!(is_error && said.to_string().contains("all: true"), "every dead letter needs all: true: {said}");
    bad.set_default(Answer::status(200));
    let (is_error, replay) = mcp.tool("replay_dead_letters", json!({"ids": [dlv], "rate_per_sec": 10}))?;
    ensure!(!is_error && replay["selected"] == 1, "{replay}");
    bad.wait_for(2, Duration::from_secs(15)).await?;
    let audit = gw
        .api
        .wait_for("/v1/tenants/acme/audit", Duration::from_secs(5), |v| {
            v["data"]
                .as_array()
                .is_some_and(|d| d.iter().any(|e| e["route"].as_str().is_some_and(|r| r.ends_with("/replays"))))
        })
        .await?;
    let entry = audit["data"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["route"].as_str().is_some_and(|r| r.ends_with("/replays")));
    ensure!(entry.is_some_and(|e| e["actor"] == format!("token:{token_id}").as_str()), "{audit}");
    Ok(())
}

/// A token the node refuses: `herald mcp` says so on stderr and exits non-zero before it
/// reads a message, writing nothing on stdout (which a client parses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_ends_herald_mcp_with_a_clear_error() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let api = gw.api.base.clone();
    let out = tokio::task::spawn_blocking(move || -> anyhow::Result<std::process::Output> {
        Ok(Command::new(herald_binary()?)
            .args(["mcp", "--api", &api, "--token", "hrld_not_a_token"])
            .stdin(Stdio::null())
            .output()?)
    });
    let out = tokio::time::timeout(Duration::from_secs(15), out).await???;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !out.stdout.is_empty() {
        bail!("exit {:?}, stdout {:?}", out.status, String::from_utf8_lossy(&out.stdout));
    }
    ensure!(stderr.contains("401"), "{stderr}");
    Ok(())
}
