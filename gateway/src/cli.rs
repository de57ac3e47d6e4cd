//! Operator and developer commands that talk to a running Herald over its own API
//! (`herald replay`, `herald trigger`, `herald apply`, `herald dump`, `herald listen`,
//! `herald mcp`).
//! Not a webhook client: `deliver` alone talks to endpoints.

pub mod apply;
pub mod document;
pub mod dump;
pub mod listen;
pub mod mcp;
mod node;

use std::io::{BufRead, IsTerminal, Write};
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
    #[error("refusing to replay every dead letter of tenant {0} without --all (name a filter or --ids to replay some)")]
    NeedsAll(String),
    #[error("not confirmed: nothing replayed")]
    NotConfirmed,
    #[error("event type {0} is not in tenant {1}'s catalog: give --data to post a payload of your own")]
    UnknownType(String, String),
    #[error(
        "event type {0} has {2} example(s) in tenant {1}'s catalog, so there is no example {3}: give --data, or add one"
    )]
    NoExample(String, String, usize, usize),
    /// A document that `herald apply` cannot take, or a node `herald dump` cannot write as one.
    #[error(transparent)]
    Document(#[from] document::DocError),
    #[error("cannot read {0}: {1}")]
    Unreadable(String, String),
    /// An argument the command cannot take, named.
    #[error("{0}")]
    Usage(String),
    /// A call of `herald apply`'s plan failed: the calls before it were made.
    #[error("{0}: {1} (the changes printed before it were made)")]
    Step(String, String),
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
    /// Replaying every dead letter (no ids, no filter) is meant.
    pub all: bool,
}

/// What to do before a replay is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// Ids, a filter, or `--all`: go.
    Go,
    /// Every dead letter, on a terminal: ask first.
    Ask,
    /// Every dead letter, with no one to ask: refuse.
    Refuse,
}

impl ReplayRequest {
    /// Does it name neither ids nor any filter, selecting every dead letter of the tenant?
    pub fn selects_everything(&self) -> bool {
        self.ids.is_empty() && self.filter.as_object().is_none_or(|f| f.is_empty())
    }

    /// A replay of every dead letter needs `--all`, or a yes on a terminal.
    pub fn selection(&self, terminal: bool) -> Selection {
        match (self.selects_everything() && !self.all, terminal) {
            (false, _) => Selection::Go,
            (true, true) => Selection::Ask,
            (true, false) => Selection::Refuse,
        }
    }
}

/// Asks on the terminal before a replay of every dead letter; refuses one without `--all`
/// where there is no terminal to ask on (a script, a pipe).
pub fn confirm(req: &ReplayRequest) -> Result<(), CliError> {
    let stdin = std::io::stdin();
    match req.selection(stdin.is_terminal()) {
        Selection::Go => Ok(()),
        Selection::Refuse => Err(CliError::NeedsAll(req.tenant.clone())),
        Selection::Ask => {
            eprint!("Replay every dead letter of tenant {}? [y/N] ", req.tenant);
            let _ = std::io::stderr().flush();
            let mut answer = String::new();
            // An unreadable terminal is a no.
            let _ = stdin.lock().read_line(&mut answer);
            match answer.trim() {
                "y" | "Y" | "yes" => Ok(()),
                _ => Err(CliError::NotConfirmed),
            }
        }
    }
}

/// The commands' HTTP client (plain HTTP to a node's API).
fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// `GET uri` with the token, answered as it comes: its body may stream for as long as the
/// node holds it (`herald listen`'s connection).
async fn open(uri: &str, token: &str) -> Result<http::Response<hyper::body::Incoming>, CliError> {
    let unreachable = |e: &dyn std::fmt::Display| CliError::Unreachable(uri.to_string(), e.to_string());
    let req = http::Request::get(uri)
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(Bytes::new()))
        .map_err(|e| unreachable(&e))?;
    client().request(req).await.map_err(|e| unreachable(&e))
}

async fn call(api: &str, method: &str, path: &str, token: &str, body: Option<Value>) -> Result<Value, CliError> {
    let client = client();
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

/// What `herald trigger` posts: one event of `event_type`, with `payload` or, without one,
/// the catalog's example number `example` (0 is the first) of that type.
#[derive(Debug, Clone)]
pub struct TriggerRequest {
    pub api: String,
    pub token: String,
    pub tenant: String,
    pub event_type: String,
    pub payload: Option<Value>,
    pub example: usize,
    pub id: Option<String>,
    pub ordering_key: Option<String>,
}

/// Posts one real event of the tenant (`POST /v1/tenants/{tenant}/events`): it fans out,
/// is signed and delivered like any other. Answers what intake answered (`id`,
/// `deliveries`, `duplicate`).
pub async fn trigger(req: TriggerRequest) -> Result<Value, CliError> {
    let payload = match req.payload.clone() {
        Some(payload) => payload,
        None => catalog_example(&req).await?,
    };
    let mut body = json!({ "type": req.event_type, "payload": payload });
    if let Some(id) = &req.id {
        body["id"] = json!(id);
    }
    if let Some(key) = &req.ordering_key {
        body["ordering_key"] = json!(key);
    }
    call(&req.api, "POST", &format!("/v1/tenants/{}/events", req.tenant), &req.token, Some(body)).await
}

/// The tenant's catalog's example of the type (its own type, else the operator's).
async fn catalog_example(req: &TriggerRequest) -> Result<Value, CliError> {
    let path = format!("/v1/tenants/{}/event-types/{}", req.tenant, req.event_type);
    let found = match call(&req.api, "GET", &path, &req.token, None).await {
        Err(CliError::Refused(404, _)) => {
            return Err(CliError::UnknownType(req.event_type.clone(), req.tenant.clone()));
        }
        found => found?,
    };
    let examples = found["examples"].as_array().cloned().unwrap_or_default();
    examples
        .get(req.example)
        .cloned()
        .ok_or_else(|| CliError::NoExample(req.event_type.clone(), req.tenant.clone(), examples.len(), req.example + 1))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(ids: &[&str], filter: Value, all: bool) -> ReplayRequest {
        ReplayRequest {
            api: String::new(),
            token: String::new(),
            tenant: "acme".into(),
            ids: ids.iter().map(|s| s.to_string()).collect(),
            filter,
            rate_per_sec: 10.0,
            batch: 100,
            wait: false,
            all,
        }
    }

    #[test]
    fn replaying_every_dead_letter_needs_all_or_a_yes() {
        let cases = [
            (request(&[], json!({}), false), true, Selection::Ask),
            (request(&[], json!({}), false), false, Selection::Refuse),
            (request(&[], Value::Null, false), false, Selection::Refuse),
            (request(&[], json!({}), true), false, Selection::Go),
            (request(&[], json!({"type": "invoice.paid"}), false), false, Selection::Go),
            (request(&["dlv_1"], json!({}), false), false, Selection::Go),
        ];
        for (req, terminal, want) in cases {
            assert_eq!(req.selection(terminal), want, "{req:?} on a terminal: {terminal}");
        }
    }
}
