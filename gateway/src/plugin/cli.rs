//! `herald plugin check|run`: load one `.wasm` file outside any registry and report on
//! it, or run one hook on JSON input. Same sandbox and limits as the server.

use std::collections::HashMap;
use std::path::Path;

use base64::Engine as _;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::js::{Source, detect};
use super::runtime::{LoadedPlugin, Runtime};
use super::sandbox::LogCapture;
use super::types::{Hook, PluginConfig, PluginError};
use super::{
    DeliveryContext, Outcome, Pause, Request, Response, TransformResult, TransportError, TransportErrorKind, Verdict,
};

/// Loads `path` like the server would (compile, world check, `describe`) and returns a
/// human-readable report: name, version, size, SHA-256, hooks and imports.
pub fn check_file(path: &Path, config: &PluginConfig) -> Result<String, PluginError> {
    let bytes = std::fs::read(path).map_err(|e| PluginError::io(path, e))?;
    if bytes.len() > config.max_plugin_bytes {
        let key = "plugins.max_plugin_bytes".to_string();
        return Err(PluginError::TooLarge { size: bytes.len(), limit: config.max_plugin_bytes, key });
    }
    let runtime = Runtime::new(config)?;
    let plugin = load(&runtime, "cli", &bytes, HashMap::new())?;
    let imports = runtime.imports(&plugin);
    let hooks: Vec<String> = plugin
        .hooks
        .iter()
        .map(|hook| match (hook, &plugin.classify_statuses) {
            (Hook::Classify, Some(statuses)) => {
                let list: Vec<String> = statuses.iter().map(u16::to_string).collect();
                format!("classify (statuses {} and transport errors)", list.join(" "))
            }
            _ => hook.as_str().to_string(),
        })
        .collect();
    Ok(format!(
        "ok: {path}\n  plugin:  {name} {version}\n  world:   {world}\n  hooks:   {hooks}\n  size:    {size} bytes\n  sha256:  {sha}\n  imports: {imports}\n",
        path = path.display(),
        name = plugin.plugin_name,
        world =
            if plugin.is_js() { "JavaScript on herald:plugin/js-runtime@0.1.0" } else { "herald:plugin/plugin@0.1.0" },
        version = plugin.plugin_version,
        hooks = hooks.join(", "),
        size = plugin.size,
        sha = plugin.sha256,
        imports = imports.join(", "),
    ))
}

/// Runs `hook` (`transform`, `classify` or `sign`) of the plugin at `path` once on
/// `input_json` and returns the result as JSON (pretty-printed).
///
/// Input (every field optional unless noted):
///
/// ```json
/// {
///   "context": {"tenant": "acme", "endpoint_id": "ep_1", "event_id": "evt_1",
///               "event_type": "invoice.paid", "attempt": 1,
///               "timestamp": 1700000000, "attempt_id": "att_1"},
///   "config":  {"key": "value"},
///   "request": {"headers": {"content-type": "application/json"},
///               "body": {"any": "JSON"}},
///   "outcome": {"status": 409, "headers": {}, "body": "text"},
///   "secrets": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "raw text secret"]
/// }
/// ```
///
/// - `transform` reads `request`; `classify` reads `outcome` (required); `sign` reads
///   `secrets` (required) and `request`.
/// - `context.timestamp` defaults to now; the other context fields to test values.
/// - `headers` is an object or a list of `[name, value]` pairs. A `body` that is a JSON
///   string is sent as its text; any other JSON value is serialised; `body_base64`
///   gives raw bytes instead.
/// - `outcome` is a response as above, or `{"transport_error": {"kind": "timeout" |
///   "connection_refused" | "connection_reset" | "dns" | "tls" | "other", "message": "…"}}`.
/// - A secret `whsec_<base64>` stands for its decoded bytes; any other string for its
///   UTF-8 bytes.
///
/// Output: `{"hook": …, "result": …, "logs": [{"level", "message"}]}` where `result` is
/// - transform: `{"action": "send", "headers": [[n, v]…], "body": <text or null>,
///   "body_base64": …}` or `{"action": "drop", "reason": …}`;
/// - classify: `{"verdict": "delivered" | "retry" | "fail" | "pause_endpoint" |
///   "disable_endpoint" | "default", "after_secs"?, "secs"?, "reason"?}`;
/// - sign: `{"headers": [[n, v]…]}`.
///
/// A failed call is an `Err(PluginError::Call { failure, report })`, where `report` is
/// `{"hook": …, "error": "plugin:…", "logs": […]}`: what the plugin logged before it
/// failed is often why.
pub fn run_hook_file(path: &Path, config: &PluginConfig, hook: &str, input_json: &str) -> Result<String, PluginError> {
    let hook = Hook::parse(hook)
        .ok_or_else(|| PluginError::Input(format!("unknown hook {hook:?} (transform, classify, sign)")))?;
    let input: Value =
        serde_json::from_str(input_json).map_err(|e| PluginError::Input(format!("input is not JSON: {e}")))?;
    let ctx = context(input.get("context"))?;
    let plugin_config = string_map(input.get("config"), "config")?;
    let bytes = std::fs::read(path).map_err(|e| PluginError::io(path, e))?;
    let runtime = Runtime::new(config)?;
    let plugin = load(&runtime, &ctx.tenant, &bytes, plugin_config)?;
    let mut logs = LogCapture::new();
    let result = match hook {
        Hook::Transform => {
            let req = request(input.get("request"), raw_body(input_json, "request"))?;
            plugin.transform(&ctx, &req, Some(&mut logs)).map(transform_json)
        }
        Hook::Classify => {
            let outcome = outcome(input.get("outcome"), raw_body(input_json, "outcome"))?;
            plugin.classify(&ctx, &outcome, Some(&mut logs)).map(verdict_json)
        }
        Hook::Sign => {
            let secrets = secrets(input.get("secrets"))?;
            let req = request(input.get("request"), raw_body(input_json, "request"))?;
            plugin.sign(&ctx, &secrets, &req, Some(&mut logs)).map(|headers| json!({ "headers": headers }))
        }
    };
    let logs: Vec<Value> =
        logs.into_iter().map(|(level, message)| json!({"level": level, "message": message})).collect();
    let pretty = |out: Value| serde_json::to_string_pretty(&out).unwrap_or_default();
    match result {
        Ok(result) => Ok(pretty(json!({ "hook": hook.as_str(), "result": result, "logs": logs }))),
        Err(failure) => {
            let report = pretty(json!({ "hook": hook.as_str(), "error": failure.reason(), "logs": logs }));
            Err(PluginError::Call { failure, report })
        }
    }
}

/// Loads a plugin file as the server would, except that JavaScript without a runtime
/// says where the runtime was looked for: the CLI's user is the operator or the author,
/// who can act on that (a tenant never sees the server's paths).
fn load(
    runtime: &std::sync::Arc<Runtime>,
    tenant: &str,
    bytes: &[u8],
    config: HashMap<String, String>,
) -> Result<std::sync::Arc<LoadedPlugin>, PluginError> {
    if let (Ok(Source::Js(_)), Some(looked)) = (detect(bytes), runtime.js_missing()) {
        return Err(PluginError::Engine(format!(
            "{looked}: build it with scripts/build-js-runtime, or set HERALD_PLUGINS_JS_RUNTIME"
        )));
    }
    if let Some(notice) = compile_notice(runtime, bytes) {
        eprintln!("{notice}");
    }
    runtime.load(tenant, "cli", bytes, config)
}

/// What the CLI says before a load that compiles the JavaScript runtime, which takes
/// seconds of silence otherwise (tens of them on a small machine): JavaScript whose
/// runtime has no compiled copy yet. Said once, as the compiled copy is kept.
pub(super) fn compile_notice(runtime: &Runtime, bytes: &[u8]) -> Option<&'static str> {
    let js = matches!(detect(bytes), Ok(Source::Js(_)));
    (js && !runtime.is_cached(bytes)).then_some(
        "compiling Herald's JavaScript runtime (once, kept for later runs; a minute or more on a small machine)",
    )
}

fn context(v: Option<&Value>) -> Result<DeliveryContext, PluginError> {
    let empty = Map::new();
    let obj = match v {
        None => &empty,
        Some(Value::Object(o)) => o,
        Some(_) => return Err(PluginError::Input("context must be an object".into())),
    };
    let text = |key: &str, default: &str| obj.get(key).and_then(Value::as_str).unwrap_or(default).to_string();
    let now = crate::clock::now_ms().div_euclid(1000).max(0) as u64;
    Ok(DeliveryContext {
        tenant: text("tenant", "test"),
        endpoint_id: text("endpoint_id", "ep_test"),
        event_id: text("event_id", "evt_test"),
        event_type: text("event_type", "test.event"),
        attempt: obj.get("attempt").and_then(Value::as_u64).unwrap_or(1).min(u32::MAX as u64) as u32,
        timestamp: obj.get("timestamp").and_then(Value::as_u64).unwrap_or(now),
        attempt_id: text("attempt_id", "att_test"),
    })
}

fn string_map(v: Option<&Value>, what: &str) -> Result<HashMap<String, String>, PluginError> {
    match v {
        None | Some(Value::Null) => Ok(HashMap::new()),
        Some(Value::Object(o)) => o
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Ok((k.clone(), other.to_string())),
            })
            .collect(),
        Some(_) => Err(PluginError::Input(format!("{what} must be an object"))),
    }
}

fn headers(v: Option<&Value>) -> Result<Vec<(String, String)>, PluginError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(_)) => Ok(string_map(v, "headers")?.into_iter().collect()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|pair| match pair.as_array().map(Vec::as_slice) {
                Some([Value::String(n), Value::String(v)]) => Ok((n.clone(), v.clone())),
                _ => Err(PluginError::Input("headers entries must be [name, value] strings".into())),
            })
            .collect(),
        Some(_) => Err(PluginError::Input("headers must be an object or a list of pairs".into())),
    }
}

/// The JSON text of `<field>.body` in `input` as written: a body given as JSON reaches the
/// plugin with its keys in the order written (a `Value` sorts them), as the server sends
/// an event's payload.
fn raw_body<'a>(input: &'a str, field: &str) -> Option<&'a RawValue> {
    let top: HashMap<String, &RawValue> = serde_json::from_str(input).ok()?;
    let inner: HashMap<String, &RawValue> = serde_json::from_str(top.get(field)?.get()).ok()?;
    inner.get("body").copied()
}

/// JSON text without the whitespace between its tokens (strings kept as they are).
fn compact(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if !c.is_ascii_whitespace() {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

fn body(obj: &Map<String, Value>, raw: Option<&RawValue>) -> Result<Vec<u8>, PluginError> {
    if let Some(b64) = obj.get("body_base64").and_then(Value::as_str) {
        return base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| PluginError::Input(format!("body_base64: {e}")));
    }
    Ok(match obj.get("body") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => s.as_bytes().to_vec(),
        Some(other) => raw.map_or_else(|| other.to_string(), |raw| compact(raw.get())).into_bytes(),
    })
}

fn request(v: Option<&Value>, raw: Option<&RawValue>) -> Result<Request, PluginError> {
    let empty = Map::new();
    let obj = match v {
        None => &empty,
        Some(Value::Object(o)) => o,
        Some(_) => return Err(PluginError::Input("request must be an object".into())),
    };
    Ok(Request { headers: headers(obj.get("headers"))?, body: body(obj, raw)? })
}

fn outcome(v: Option<&Value>, raw: Option<&RawValue>) -> Result<Outcome, PluginError> {
    let Some(Value::Object(obj)) = v else {
        return Err(PluginError::Input("classify needs an \"outcome\" object".into()));
    };
    if let Some(te) = obj.get("transport_error") {
        let kind = match te.get("kind").and_then(Value::as_str).unwrap_or("other") {
            "timeout" => TransportErrorKind::Timeout,
            "connection_refused" => TransportErrorKind::ConnectionRefused,
            "connection_reset" => TransportErrorKind::ConnectionReset,
            "dns" => TransportErrorKind::Dns,
            "tls" => TransportErrorKind::Tls,
            "other" => TransportErrorKind::Other,
            k => {
                return Err(PluginError::Input(format!("unknown transport error kind {k:?}")));
            }
        };
        let message = te.get("message").and_then(Value::as_str).unwrap_or_default().to_string();
        return Ok(Outcome::TransportError(TransportError { kind, message }));
    }
    let status = obj
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| PluginError::Input("outcome needs a \"status\" or a \"transport_error\"".into()))?;
    let mut body = body(obj, raw)?;
    body.truncate(1024);
    Ok(Outcome::Response(Response { status, headers: headers(obj.get("headers"))?, body }))
}

fn secrets(v: Option<&Value>) -> Result<Vec<Vec<u8>>, PluginError> {
    let Some(Value::Array(items)) = v else {
        return Err(PluginError::Input("sign needs a \"secrets\" list".into()));
    };
    items
        .iter()
        .map(|s| {
            let s = s.as_str().ok_or_else(|| PluginError::Input("secrets must be strings".into()))?;
            match s.strip_prefix("whsec_") {
                Some(b64) => base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|e| PluginError::Input(format!("secret: {e}"))),
                None => Ok(s.as_bytes().to_vec()),
            }
        })
        .collect()
}

fn transform_json(result: TransformResult) -> Value {
    match result {
        TransformResult::Send(req) => {
            let (text, b64) = match String::from_utf8(req.body) {
                Ok(text) => (Value::String(text), Value::Null),
                Err(e) => {
                    (Value::Null, Value::String(base64::engine::general_purpose::STANDARD.encode(e.into_bytes())))
                }
            };
            json!({ "action": "send", "headers": req.headers, "body": text, "body_base64": b64 })
        }
        TransformResult::Drop(reason) => json!({ "action": "drop", "reason": reason }),
    }
}

fn verdict_json(verdict: Verdict) -> Value {
    match verdict {
        Verdict::Delivered => json!({ "verdict": "delivered" }),
        Verdict::Retry(after) => json!({ "verdict": "retry", "after_secs": after }),
        Verdict::Fail(reason) => json!({ "verdict": "fail", "reason": reason }),
        Verdict::PauseEndpoint(Pause { secs, reason }) => {
            json!({ "verdict": "pause_endpoint", "secs": secs, "reason": reason })
        }
        Verdict::DisableEndpoint(reason) => {
            json!({ "verdict": "disable_endpoint", "reason": reason })
        }
        Verdict::Default => json!({ "verdict": "default" }),
    }
}
