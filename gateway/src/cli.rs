//! Operator commands that talk to a running Herald over its own API (`herald replay`).
//! Not a webhook client: `deliver` alone talks to endpoints.

use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

/// A failed operator command, with what the API said.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot reach Herald at {0}: {1}")]
    Unreachable(String, String),
    #[error("Herald answered {0}: {1}")]
    Refused(u16, String),
}

/// What `herald replay` asks for.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    pub api: String,
    pub token: String,
    pub tenant: String,
    pub ids: Vec<String>,
    pub filter: Value,
    pub rate_per_sec: f64,
    pub batch: u32,
    pub wait: bool,
}

async fn call(api: &str, method: &str, path: &str, token: &str, body: Option<Value>) -> Result<Value, CliError> {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let uri = format!("{}{}", api.trim_end_matches('/'), path);
    let req = http::Request::builder()
        .method(method)
        .uri(&uri)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.map(|b| b.to_string()).unwrap_or_default())))
        .map_err(|e| CliError::Unreachable(uri.clone(), e.to_string()))?;
    let resp = client.request(req).await.map_err(|e| CliError::Unreachable(uri.clone(), e.to_string()))?;
    let status = resp.status().as_u16();
    let bytes =
        resp.into_body().collect().await.map_err(|e| CliError::Unreachable(uri.clone(), e.to_string()))?.to_bytes();
    let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if !(200..300).contains(&status) {
        let msg = value["error"]["message"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
        return Err(CliError::Refused(status, msg));
    }
    Ok(value)
}

/// Starts a replay and, if asked, follows it to the end with a progress bar on stderr.
pub async fn replay(req: ReplayRequest) -> Result<Value, CliError> {
    let mut body = json!({ "rate_per_sec": req.rate_per_sec, "batch": req.batch });
    if req.ids.is_empty() {
        body["filter"] = req.filter.clone();
    } else {
        body["ids"] = json!(req.ids);
    }
    let base = format!("/v1/tenants/{}/replays", req.tenant);
    let created = call(&req.api, "POST", &base, &req.token, Some(body)).await?;
    let id = created["id"].as_str().unwrap_or_default().to_string();
    eprintln!("replay {id}: {} dead letters selected", created["selected"]);
    if !req.wait {
        return Ok(created);
    }
    loop {
        let p = call(&req.api, "GET", &format!("{base}/{id}"), &req.token, None).await?;
        let figure = |name: &str| p[name].as_u64().unwrap_or(0);
        let (selected, sent) = (figure("selected"), figure("sent"));
        eprint!(
            "\r{} sent {sent}/{selected}: delivered {}, failed {}, pending {}   ",
            bar(sent, selected),
            figure("delivered"),
            figure("failed"),
            figure("pending")
        );
        let _ = std::io::stderr().flush();
        // Running until everything it re-queued has settled; a cancel ends it.
        if p["state"] != "running" {
            eprintln!();
            return Ok(p);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn bar(done: u64, total: u64) -> String {
    let width = 30;
    let filled = (done.min(total) * width).checked_div(total).unwrap_or(width);
    format!("[{}{}]", "#".repeat(filled as usize), "-".repeat((width - filled) as usize))
}
