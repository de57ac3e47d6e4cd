//! Turns Herald's JSON envelope (`{"id", "type", "timestamp", "data"}`) into a chat
//! message that Slack or Discord incoming webhooks accept, optionally redacting
//! fields of `data` first and dropping event types nobody wants in a channel.
//!
//! Configuration:
//! - `style` = `"slack"` (default: `{"text": …}`) or `"discord"` (`{"content": …}`);
//! - `redact` = comma-separated keys replaced by `"[redacted]"` anywhere in `data`
//!   (e.g. `"email,card_number"`);
//! - `skip_types` = comma-separated event types (or `prefix.*`) to drop.

use std::collections::HashMap;
use std::io::Write as _;

use plugin_sdk::{DeliveryContext, Hooks, Plugin, Request, TransformResult, config};
use serde_json::Value;
use serde_json::value::RawValue;

/// The plugin; see the crate docs.
struct TransformChat;

impl Plugin for TransformChat {
    const HOOKS: Hooks = Hooks::TRANSFORM;

    fn transform(ctx: &DeliveryContext, mut req: Request) -> Result<TransformResult, String> {
        if let Some(skip) = config("skip_types")
            && list(&skip).any(|pattern| type_matches(pattern, &ctx.event_type))
        {
            let reason = format!("event type {} is skipped", ctx.event_type);
            return Ok(TransformResult::Drop(reason));
        }
        let key = match config("style").as_deref() {
            Some("discord") => "content",
            None | Some("slack") => "text",
            Some(other) => return Err(format!("unknown style {other:?}")),
        };
        // Only `data` is parsed; the envelope's other fields are in the context.
        let envelope: HashMap<&str, &RawValue> =
            serde_json::from_slice(&req.body).map_err(|e| format!("body is not JSON: {e}"))?;
        let mut data: Value = match envelope.get("data") {
            Some(raw) => serde_json::from_str(raw.get()).map_err(|e| e.to_string())?,
            None => Value::Null,
        };
        if let Some(keys) = config("redact") {
            let keys: Vec<&str> = list(&keys).collect();
            redact(&mut data, &keys);
        }
        let text = message_text(ctx, &data)?;
        let mut body = Vec::with_capacity(text.len() + 16);
        write!(body, "{{\"{key}\":").map_err(|e| e.to_string())?;
        serde_json::to_writer(&mut body, &text).map_err(|e| e.to_string())?;
        body.push(b'}');
        req.body = body;
        req.set_header("content-type", "application/json");
        Ok(TransformResult::Send(req))
    }
}

/// ``*type* `id` `` and the (redacted) data, pretty-printed in a code block.
fn message_text(ctx: &DeliveryContext, data: &Value) -> Result<String, String> {
    let mut text = Vec::with_capacity(256);
    write!(text, "*{}* `{}`\n```", ctx.event_type, ctx.event_id).map_err(|e| e.to_string())?;
    serde_json::to_writer_pretty(&mut text, data).map_err(|e| e.to_string())?;
    text.extend_from_slice(b"```");
    String::from_utf8(text).map_err(|e| e.to_string())
}

fn list(csv: &str) -> impl Iterator<Item = &str> {
    csv.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn type_matches(pattern: &str, event_type: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => event_type.starts_with(prefix),
        None => pattern == event_type,
    }
}

/// Replaces the value of every object key in `keys`, at any depth.
fn redact(value: &mut Value, keys: &[&str]) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if keys.contains(&k.as_str()) {
                    *v = Value::String("[redacted]".to_string());
                } else {
                    redact(v, keys);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| redact(v, keys)),
        _ => {}
    }
}

plugin_sdk::export!(TransformChat);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn redacts_at_any_depth() {
        let mut v = json!({"email": "a@b", "card": {"number": "4242", "brand": "visa"}, "list": [{"email": "c"}]});
        redact(&mut v, &["email", "number"]);
        assert_eq!(
            v,
            json!({"email": "[redacted]", "card": {"number": "[redacted]", "brand": "visa"}, "list": [{"email": "[redacted]"}]})
        );
    }

    #[test]
    fn matches_prefix_patterns() {
        assert!(type_matches("invoice.*", "invoice.paid"));
        assert!(!type_matches("invoice.paid", "invoice.created"));
    }
}
