//! `herald mcp`: a Model Context Protocol server on standard input and output, for an
//! operator's or a tenant's assistant (MCP's stdio transport: one JSON-RPC 2.0 message per
//! line each way; nothing else is written to standard output, diagnostics go to stderr).
//!
//! It holds one token and calls the node's API with it, so it can do what that token's
//! scopes allow and nothing more: the tools it lists are those the token may use
//! (`GET /v1/whoami`, asked once at start), and the API refuses the rest anyway. Every
//! write it makes goes through the API, so it is in the audit log as that token's
//! (`token:<id>`, or `admin`). Tools:
//! - `list_failing_endpoints` (`read`): endpoints whose delivery status is not `active`;
//! - `inspect_delivery` (`read`): one delivery with its attempt history, or an event's
//!   deliveries;
//! - `list_dead_letters` (`read`): a tenant's dead letters, filtered, with counts by reason;
//! - `replay_dead_letters` (`replay`): a replay of dead letters by ids or by filter (never
//!   of every dead letter without `all: true`).

use std::io::{BufRead, Write};

use serde_json::{Map, Value, json};

use super::node::Node;
use super::{CliError, call};

/// The protocol versions this server speaks, newest first; a client asking for another is
/// answered with the newest (MCP's version negotiation).
const PROTOCOL_VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];

/// The most endpoints `list_failing_endpoints` reads per tenant (pages of 1,000).
const MAX_ENDPOINTS_READ: usize = 100_000;

/// What the token may do, as `GET /v1/whoami` says.
#[derive(Debug, Clone)]
struct Caller {
    admin: bool,
    /// A tenant token's tenant; none for the admin token.
    tenant: Option<String>,
    scopes: Vec<String>,
}

impl Caller {
    fn may(&self, scope: &str) -> bool {
        self.admin || self.scopes.iter().any(|s| s == scope)
    }
}

/// One tool: its name, what it needs, what it says of itself.
struct Tool {
    name: &'static str,
    scope: &'static str,
    title: &'static str,
    description: &'static str,
    schema: fn() -> Value,
}

const TOOLS: [Tool; 4] = [
    Tool {
        name: "list_failing_endpoints",
        scope: "read",
        title: "List failing endpoints",
        description: "Endpoints whose delivery status is not active (failing, throttled, paused or disabled), \
                      with the status, since when, why, and the last error's category and HTTP status.",
        schema: || {
            json!({
                "type": "object",
                "properties": {
                    "tenant": {"type": "string", "description": "The tenant; the admin token lists every tenant's when it is left out."}
                },
                "additionalProperties": false
            })
        },
    },
    Tool {
        name: "inspect_delivery",
        scope: "read",
        title: "Inspect a delivery",
        description: "One delivery (dlv_…) with its state and every attempt (status, latency, error, response), \
                      or, given an event id, that event's deliveries.",
        schema: || {
            json!({
                "type": "object",
                "properties": {
                    "tenant": {"type": "string"},
                    "delivery_id": {"type": "string", "description": "A delivery id, dlv_…"},
                    "event_id": {"type": "string", "description": "An event id: its deliveries, instead of one delivery."}
                },
                "additionalProperties": false
            })
        },
    },
    Tool {
        name: "list_dead_letters",
        scope: "read",
        title: "List dead letters",
        description: "A tenant's dead letters, newest first, with the counts by reason of those the filters select.",
        schema: || {
            json!({
                "type": "object",
                "properties": {
                    "tenant": {"type": "string"},
                    "endpoint": {"type": "string", "description": "Only this endpoint's (ep_…)."},
                    "reason": {"type": "string", "description": "e.g. exhausted, expired, permanent, permanent:404."},
                    "type": {"type": "string", "description": "Only this event type."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 1000}
                },
                "additionalProperties": false
            })
        },
    },
    Tool {
        name: "replay_dead_letters",
        scope: "replay",
        title: "Replay dead letters",
        description: "Sends dead letters again, rate limited, as a durable replay: by ids, or by a filter \
                      (endpoint, reason, type, since, until). Replaying every dead letter of the tenant needs all: true.",
        schema: || {
            json!({
                "type": "object",
                "properties": {
                    "tenant": {"type": "string"},
                    "ids": {"type": "array", "items": {"type": "string"}, "description": "Delivery ids (dlv_…)."},
                    "filter": {
                        "type": "object",
                        "properties": {
                            "endpoint": {"type": "string"}, "reason": {"type": "string"}, "type": {"type": "string"},
                            "since": {"type": "string", "format": "date-time"}, "until": {"type": "string", "format": "date-time"}
                        }
                    },
                    "all": {"type": "boolean", "description": "Replay every dead letter of the tenant (no ids, no filter)."},
                    "rate_per_sec": {"type": "number", "exclusiveMinimum": 0}
                },
                "additionalProperties": false
            })
        },
    },
];

/// Serves MCP on `input` and `output` until `input` ends. Fails at start, before reading
/// anything, if the token is refused. `input` is read on a thread of its own (standard
/// input blocks).
pub async fn serve(
    api: &str,
    token: &str,
    input: impl BufRead + Send + 'static,
    mut output: impl Write,
) -> Result<(), CliError> {
    let node = Node { api: api.to_string(), token: token.to_string() };
    let who = call(api, "GET", "/v1/whoami", token, None).await?;
    let caller = Caller {
        admin: who["admin"].as_bool().unwrap_or(false),
        tenant: who["tenant"].as_str().map(String::from),
        scopes: who["scopes"].as_array().into_iter().flatten().filter_map(|s| s.as_str().map(String::from)).collect(),
    };
    let server = Server { node, caller };
    let (tx, mut lines) = tokio::sync::mpsc::channel::<std::io::Result<String>>(16);
    std::thread::spawn(move || {
        for line in input.lines() {
            if tx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    let broken = |e: std::io::Error| CliError::Unreadable("standard output".into(), e.to_string());
    while let Some(line) = lines.recv().await {
        let line = line.map_err(|e| CliError::Unreadable("standard input".into(), e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        if let Some(answer) = server.handle(&line).await {
            writeln!(output, "{answer}").map_err(broken)?;
            output.flush().map_err(broken)?;
        }
    }
    Ok(())
}

struct Server {
    node: Node,
    caller: Caller,
}

/// JSON-RPC's error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

fn error(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

impl Server {
    /// The answer to one message; none for a notification.
    async fn handle(&self, line: &str) -> Option<Value> {
        let msg: Value = match serde_json::from_str(line) {
            Ok(msg) => msg,
            Err(e) => return Some(error(Value::Null, PARSE_ERROR, format!("not JSON: {e}"))),
        };
        let id = msg.get("id").cloned();
        let Some(method) = msg["method"].as_str() else {
            // A response to us (we send no requests) or garbage.
            return id.map(|id| error(id, INVALID_REQUEST, "a request needs a \"method\""));
        };
        // Notifications (`notifications/initialized`, `notifications/cancelled`) get no answer.
        let id = id?;
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let result = match method {
            "initialize" => Ok(self.initialize(&params)),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(self.list_tools()),
            "tools/call" => self.call_tool(&params).await,
            other => Err((METHOD_NOT_FOUND, format!("unknown method {other:?}"))),
        };
        Some(match result {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err((code, message)) => error(id, code, message),
        })
    }

    fn initialize(&self, params: &Value) -> Value {
        let asked = params["protocolVersion"].as_str().unwrap_or_default();
        let version = PROTOCOL_VERSIONS.iter().find(|v| **v == asked).unwrap_or(&PROTOCOL_VERSIONS[0]);
        let who = match (&self.caller.tenant, self.caller.admin) {
            (_, true) => "the admin token (every tenant)".to_string(),
            (Some(t), false) => format!("a token of tenant {t} with scopes {}", self.caller.scopes.join(", ")),
            (None, false) => "a token of no tenant".to_string(),
        };
        json!({
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": false}},
            "serverInfo": {"name": "herald", "title": "Herald webhook gateway", "version": env!("CARGO_PKG_VERSION")},
            "instructions": format!(
                "Herald delivers webhooks. This server acts as {who}: it can read endpoints' delivery status, \
                 deliveries with their attempts and dead letters, and replay dead letters if the token has the \
                 replay scope. Every write is in Herald's audit log."
            )
        })
    }

    fn list_tools(&self) -> Value {
        let tools: Vec<Value> = TOOLS
            .iter()
            .filter(|t| self.caller.may(t.scope))
            .map(|t| json!({"name": t.name, "title": t.title, "description": t.description, "inputSchema": (t.schema)()}))
            .collect();
        json!({ "tools": tools })
    }

    /// A tool's result, or a protocol error for a call that names no tool this server has.
    /// What the API refuses, and bad arguments, are results with `isError` (the assistant
    /// reads them and can correct itself).
    async fn call_tool(&self, params: &Value) -> Result<Value, (i64, String)> {
        let name = params["name"].as_str().ok_or((INVALID_PARAMS, "tools/call needs a \"name\"".to_string()))?;
        let tool = TOOLS.iter().find(|t| t.name == name).ok_or((INVALID_PARAMS, format!("unknown tool {name:?}")))?;
        let args = match &params["arguments"] {
            Value::Null => Map::new(),
            Value::Object(map) => map.clone(),
            _ => return Ok(tool_error("arguments: expected an object")),
        };
        if !self.caller.may(tool.scope) {
            return Ok(tool_error(format!(
                "{name} needs a token with the {} scope; this one has {:?}",
                tool.scope, self.caller.scopes
            )));
        }
        let schema = (tool.schema)();
        if let Some(unknown) = args.keys().find(|k| schema["properties"].get(k.as_str()).is_none()) {
            return Ok(tool_error(format!("{unknown}: not an argument of {name}")));
        }
        let outcome = match tool.name {
            "list_failing_endpoints" => self.failing_endpoints(&args).await,
            "inspect_delivery" => self.inspect_delivery(&args).await,
            "list_dead_letters" => self.dead_letters(&args).await,
            _ => self.replay(&args).await,
        };
        Ok(match outcome {
            Ok(value) => json!({
                "content": [{"type": "text", "text": serde_json::to_string_pretty(&value).unwrap_or_default()}],
                "structuredContent": value,
                "isError": false
            }),
            Err(message) => tool_error(message),
        })
    }

    /// The tenant a call is about: the argument, else the token's own.
    fn tenant(&self, args: &Map<String, Value>) -> Result<String, String> {
        match (args.get("tenant"), &self.caller.tenant) {
            (Some(Value::String(t)), _) if !t.is_empty() => Ok(t.clone()),
            (Some(_), _) => Err("tenant: expected a tenant id".into()),
            (None, Some(own)) => Ok(own.clone()),
            (None, None) => Err("tenant: required with the admin token".into()),
        }
    }

    async fn failing_endpoints(&self, args: &Map<String, Value>) -> Result<Value, String> {
        let tenants = match (args.contains_key("tenant"), self.caller.admin, &self.caller.tenant) {
            (false, true, _) => super::node::tenants(&self.node).await.map_err(api_error)?.into_keys().collect(),
            _ => vec![self.tenant(args)?],
        };
        let mut failing = Vec::new();
        for tenant in tenants {
            let mut after = String::new();
            let mut read = 0;
            while read < MAX_ENDPOINTS_READ {
                let page = self
                    .node
                    .get(&format!("/v1/tenants/{tenant}/endpoints?limit=1000{after}"))
                    .await
                    .map_err(api_error)?;
                let rows = page["data"].as_array().cloned().unwrap_or_default();
                read += rows.len();
                for ep in rows {
                    let status = &ep["delivery_status"];
                    if status["status"].as_str().is_some_and(|s| s != "active") {
                        failing.push(json!({
                            "tenant": tenant,
                            "id": ep["id"],
                            "url": ep["url"],
                            "kind": ep["kind"],
                            "description": ep["description"],
                            "status": status["status"],
                            "since": status["since"],
                            "until": status["until"],
                            "reason": status["reason"],
                            "last_error": status["last_error"],
                        }));
                    }
                }
                match page["next_after"].as_str() {
                    Some(next) => after = format!("&after={next}"),
                    None => break,
                }
            }
        }
        Ok(json!({ "count": failing.len(), "endpoints": failing }))
    }

    async fn inspect_delivery(&self, args: &Map<String, Value>) -> Result<Value, String> {
        let tenant = self.tenant(args)?;
        match (text_arg(args, "delivery_id")?, text_arg(args, "event_id")?) {
            (Some(dlv), None) => self.node.get(&format!("/v1/tenants/{tenant}/deliveries/{}", segment(&dlv))).await,
            (None, Some(evt)) => {
                self.node.get(&format!("/v1/tenants/{tenant}/events/{}/deliveries", segment(&evt))).await
            }
            _ => return Err("give one of delivery_id or event_id".into()),
        }
        .map_err(api_error)
    }

    async fn dead_letters(&self, args: &Map<String, Value>) -> Result<Value, String> {
        let tenant = self.tenant(args)?;
        let mut query = Vec::new();
        for key in ["endpoint", "reason", "type"] {
            if let Some(v) = text_arg(args, key)? {
                query.push(format!("{key}={}", segment(&v)));
            }
        }
        match args.get("limit") {
            None => {}
            Some(Value::Number(n)) if n.as_u64().is_some_and(|n| (1..=1000).contains(&n)) => {
                query.push(format!("limit={n}"))
            }
            Some(_) => return Err("limit: expected an integer from 1 to 1000".into()),
        }
        let path = format!("/v1/tenants/{tenant}/dead-letters?{}", query.join("&"));
        self.node.get(&path).await.map_err(api_error)
    }

    async fn replay(&self, args: &Map<String, Value>) -> Result<Value, String> {
        let tenant = self.tenant(args)?;
        let ids = match args.get("ids") {
            None => Vec::new(),
            Some(Value::Array(ids)) if ids.iter().all(Value::is_string) => ids.clone(),
            Some(_) => return Err("ids: expected an array of delivery ids".into()),
        };
        let filter = match args.get("filter") {
            None => Map::new(),
            Some(Value::Object(f)) => f.clone(),
            Some(_) => return Err("filter: expected an object".into()),
        };
        let all = match args.get("all") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err("all: expected true or false".into()),
        };
        if ids.is_empty() && filter.is_empty() && !all {
            return Err("name ids or a filter, or set all: true to replay every dead letter of the tenant".into());
        }
        let mut body = json!({});
        match ids.is_empty() {
            true => body["filter"] = Value::Object(filter),
            false => body["ids"] = Value::Array(ids),
        }
        if let Some(rate) = args.get("rate_per_sec") {
            body["rate_per_sec"] = rate.clone();
        }
        self.node.send("POST", &format!("/v1/tenants/{tenant}/replays"), Some(body)).await.map_err(api_error)
    }
}

fn tool_error(message: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": message.into()}], "isError": true})
}

fn api_error(e: CliError) -> String {
    e.to_string()
}

/// A string argument, if given.
fn text_arg(args: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match args.get(key) {
        None => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(format!("{key}: expected a non-empty string")),
    }
}

/// A value as one path segment or query value: anything but unreserved characters escaped.
fn segment(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b':' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
