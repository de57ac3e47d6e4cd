//! `herald listen`: a tenant's events as real deliveries to a URL on the developer's
//! machine, with no inbound port. It finds (or creates) the tenant's endpoint of kind
//! `listen` named for the listener, holds one outbound connection to a node
//! (`GET …/endpoints/{id}/listen`, NDJSON), forwards each request it streams exactly (the
//! node built and signed it) to `--forward`, and posts the answer back (`POST` on the same
//! path): status, headers and the first KiB of the body, or the transport failure (a
//! refused connection is `connection_refused`). The request leaves through `deliver`, as a
//! webhook leaves a node (loopback allowed). One line per delivery on standard output.
//! A dropped connection is taken again after a second; deliveries wait meanwhile.

use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::{CliError, call, open};
use crate::classify::Outcome;
use crate::deliver::{Deliverer, Outgoing, Route, Via};

/// What `herald listen` is asked for.
#[derive(Debug, Clone)]
pub struct ListenRequest {
    pub api: String,
    pub token: String,
    pub tenant: String,
    /// The local URL the deliveries go to.
    pub forward: String,
    /// The event types to receive (`prefix.*` too); empty: every type.
    pub types: Vec<String>,
    /// An existing endpoint of kind `listen` to take; otherwise the one named `name`.
    pub endpoint: Option<String>,
    /// The listener's name: its endpoint is `listen://<name>`.
    pub name: String,
    /// A dead letter to replay through the listener before listening.
    pub replay: Option<String>,
}

/// How long the local URL has to answer (the endpoint's own `timeout` bounds the attempt).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);
/// The wait before a lost connection is taken again.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// Checks the request, sets the endpoint up and forwards its deliveries until the process
/// is stopped; returns only on an error.
pub async fn listen(req: ListenRequest) -> Result<(), CliError> {
    let forward = check_forward(&req.forward)?;
    check_types(&req).await.map_err(token_refused)?;
    let endpoint = endpoint(&req).await.map_err(token_refused)?;
    // The signing secret is not printed (terminals and CI logs keep what they show): where
    // to read it is.
    eprintln!(
        "listening for tenant {} on endpoint {endpoint} ({}), forwarding to {forward}; its signing secret: GET {}/secret",
        req.tenant,
        if req.types.is_empty() { "every type".to_string() } else { req.types.join(", ") },
        endpoint_path(&req, &endpoint),
    );
    if let Some(id) = &req.replay {
        replay(&req, id).await?;
    }
    // The developer's own machine: private and loopback addresses are the point.
    let deliverer = Deliverer::new(true);
    loop {
        match stream(&req, &endpoint, &forward, &deliverer).await {
            Ok(()) => eprintln!("the node ended the connection; connecting again"),
            // Refused (a token revoked, the endpoint gone): nothing to wait for. A node
            // stopping (503) or out of reach: the next one may take the connection.
            Err(e @ CliError::Refused(400..=499, _)) => return Err(e),
            Err(e) => eprintln!("{e}; connecting again"),
        }
        tokio::time::sleep(RECONNECT_AFTER).await;
    }
}

/// A token the node does not take, said as such.
fn token_refused(e: CliError) -> CliError {
    match e {
        CliError::Refused(status @ (401 | 403), message) => {
            CliError::Usage(format!("--token: Herald refused it ({status}: {message})"))
        }
        e => e,
    }
}

/// `--forward`: an `http://` or `https://` URL with a host.
fn check_forward(raw: &str) -> Result<String, CliError> {
    let bad = |why: String| CliError::Usage(format!("--forward {raw:?}: {why}"));
    let url = url::Url::parse(raw).map_err(|e| bad(format!("not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(format!("the scheme must be http or https, not {}", url.scheme())));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host".into()));
    }
    Ok(url.to_string())
}

/// `--types`: each a type of the tenant's catalog, or a `prefix.*` matching one, once the
/// tenant has a catalog; without one, any type (as an endpoint's `event_types`).
async fn check_types(req: &ListenRequest) -> Result<(), CliError> {
    if req.types.is_empty() {
        return Ok(());
    }
    let listed = call(&req.api, "GET", &format!("/v1/tenants/{}/event-types", req.tenant), &req.token, None).await?;
    let known: Vec<&str> = listed["data"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect();
    if known.is_empty() {
        return Ok(());
    }
    let unknown: Vec<&str> = req
        .types
        .iter()
        .map(String::as_str)
        .filter(|t| match t.strip_suffix('*') {
            Some(prefix) => !known.iter().any(|k| k.starts_with(prefix)),
            None => !known.contains(t),
        })
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(CliError::Usage(format!(
        "--types: {} not in tenant {}'s event catalog (it has: {})",
        unknown.join(", "),
        req.tenant,
        known.join(", ")
    )))
}

fn endpoint_path(req: &ListenRequest, id: &str) -> String {
    format!("/v1/tenants/{}/endpoints/{id}", req.tenant)
}

/// The endpoint to listen on: `--endpoint`'s (of kind `listen`), or the one named for the
/// listener, created when there is none; its event types set to `--types` when given.
async fn endpoint(req: &ListenRequest) -> Result<String, CliError> {
    let url = format!("listen://{}", req.name);
    let found = match &req.endpoint {
        Some(id) => Some(call(&req.api, "GET", &endpoint_path(req, id), &req.token, None).await?),
        None => named(req, &url).await?,
    };
    let Some(found) = found else {
        let body = json!({"url": url, "kind": "listen", "event_types": req.types, "description": format!("herald listen {}", req.name)});
        let created =
            call(&req.api, "POST", &format!("/v1/tenants/{}/endpoints", req.tenant), &req.token, Some(body)).await?;
        return Ok(created["id"].as_str().unwrap_or_default().to_string());
    };
    let id = found["id"].as_str().unwrap_or_default().to_string();
    if found["kind"] != "listen" {
        return Err(CliError::Usage(format!("--endpoint {id}: kind {}, not listen", found["kind"])));
    }
    if !req.types.is_empty() && found["event_types"] != json!(req.types) {
        let body = json!({"event_types": req.types});
        call(&req.api, "PATCH", &endpoint_path(req, &id), &req.token, Some(body)).await?;
    }
    Ok(id)
}

/// The tenant's `listen` endpoint at `url`, if there is one.
async fn named(req: &ListenRequest, url: &str) -> Result<Option<Value>, CliError> {
    let mut after = String::new();
    loop {
        let path = format!("/v1/tenants/{}/endpoints?limit=1000{after}", req.tenant);
        let page = call(&req.api, "GET", &path, &req.token, None).await?;
        let rows = page["data"].as_array().cloned().unwrap_or_default();
        if let Some(found) = rows.into_iter().find(|e| e["kind"] == "listen" && e["url"] == url) {
            return Ok(Some(found));
        }
        match page["next_after"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => return Ok(None),
        }
    }
}

/// `--replay`: a dead letter of the endpoint sent again, through the listener.
async fn replay(req: &ListenRequest, id: &str) -> Result<(), CliError> {
    let body = json!({"ids": [id], "rate_per_sec": 10.0, "batch": 1});
    let created =
        call(&req.api, "POST", &format!("/v1/tenants/{}/replays", req.tenant), &req.token, Some(body)).await?;
    match created["selected"].as_u64() {
        Some(0) | None => Err(CliError::Usage(format!(
            "--replay {id}: not a dead letter of tenant {} (a delivery still retrying goes out at its next attempt)",
            req.tenant
        ))),
        Some(_) => {
            eprintln!("replaying {id} ({})", created["id"].as_str().unwrap_or_default());
            Ok(())
        }
    }
}

/// Holds one connection: forwards each request it streams, each on a task of its own,
/// until the node ends it (`Ok`) or it fails.
async fn stream(req: &ListenRequest, endpoint: &str, forward: &str, deliverer: &Deliverer) -> Result<(), CliError> {
    let uri = format!("{}{}/listen", req.api.trim_end_matches('/'), endpoint_path(req, endpoint));
    let unreachable = |e: &dyn std::fmt::Display| CliError::Unreachable(uri.clone(), e.to_string());
    let resp = open(&uri, &req.token).await?;
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    if status != 200 {
        let text = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let value: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
        let message = value["error"]["message"].as_str().map(String::from);
        return Err(CliError::Refused(status, message.unwrap_or_else(|| String::from_utf8_lossy(&text).into_owned())));
    }
    let mut pending = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| unreachable(&e))?;
        let Some(data) = frame.data_ref() else { continue };
        pending.extend_from_slice(data);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let Ok(line) = serde_json::from_slice::<Value>(&line) else { continue };
            if line["type"] == "hello" {
                eprintln!("connected to node {}", line["node"].as_str().unwrap_or("?"));
            }
            if line["type"] == "request" {
                let (req, deliverer, forward) = (req.clone(), deliverer.clone(), forward.to_string());
                let endpoint = endpoint.to_string();
                tokio::spawn(async move { relay_one(&req, &endpoint, &forward, &deliverer, line).await });
            }
        }
    }
    Ok(())
}

/// Forwards one streamed request to the local URL, prints its line and posts the answer.
async fn relay_one(req: &ListenRequest, endpoint: &str, forward: &str, deliverer: &Deliverer, line: Value) {
    let started = Instant::now();
    let mut answer = forward_one(deliverer, forward, &line).await;
    let ms = started.elapsed().as_millis();
    let shown = match (&answer["status"], &answer["error"]) {
        (Value::Number(status), _) => status.to_string(),
        (_, error) => format!("ERR {}", error.as_str().unwrap_or("other")),
    };
    let field = |k: &str| line[k].as_str().unwrap_or_default().to_string();
    println!(
        "{shown}  {ms} ms  {}  {}  {}  attempt {}",
        field("delivery_id"),
        field("event_type"),
        field("event_id"),
        line["attempt"]
    );
    answer["request"] = line["id"].clone();
    let path = format!("{}/listen", endpoint_path(req, endpoint));
    if let Err(e) = call(&req.api, "POST", &path, &req.token, Some(answer)).await {
        eprintln!("cannot post the answer for {}: {e}", field("delivery_id"));
    }
}

/// Sends the request exactly as streamed (headers in order, the body's bytes) through
/// `deliver`, as the node would send a webhook, and answers what came back as the answer
/// route takes it: status, headers and the first KiB of the body, or the transport failure.
async fn forward_one(deliverer: &Deliverer, forward: &str, line: &Value) -> Value {
    let body = match base64::engine::general_purpose::STANDARD.decode(line["body"].as_str().unwrap_or_default()) {
        Ok(body) => body,
        Err(e) => return json!({"error": "other", "detail": format!("the streamed body is not base64: {e}")}),
    };
    let headers = line["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|pair| Some((pair[0].as_str()?.to_string(), pair[1].as_str()?.to_string())))
        .collect();
    let route = Route { connect_timeout: FORWARD_TIMEOUT, timeout: FORWARD_TIMEOUT, via: Via::Direct, tls: None };
    let out = Outgoing {
        url: forward.to_string(),
        headers,
        body: Bytes::from(body),
        route,
        keep_headers: true,
        keep_body: crate::deliver::BODY_PREFIX,
        now: 0,
    };
    match deliverer.send(out).await {
        Outcome::Response(r) => json!({"status": r.status, "headers": r.headers, "body": r.body_prefix}),
        Outcome::Transport { kind, detail } => json!({"error": kind, "detail": detail}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_urls_are_checked_by_name() {
        assert_eq!(check_forward("http://localhost:3000/hook").unwrap(), "http://localhost:3000/hook");
        for (bad, why) in [
            ("localhost:3000", "scheme must be http"),
            ("not a url", "not a URL"),
            ("ftp://x/y", "scheme must be http"),
        ] {
            let e = check_forward(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--forward {bad:?}")) && e.contains(why), "{bad}: {e}");
        }
    }
}
