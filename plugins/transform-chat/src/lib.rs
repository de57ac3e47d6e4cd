//! Turns Herald's JSON envelope (`{"id", "type", "timestamp", "data"}`) into a chat
//! message that Slack or Discord incoming webhooks accept, optionally redacting
//! fields of `data` first and dropping event types nobody wants in a channel.
//!
//! Configuration:
//! - `style` = `"slack"` (default: `{"text": …}`) or `"discord"` (`{"content": …}`);
//! - `redact` = comma-separated keys replaced by `"[redacted]"` anywhere in `data`
//!   (e.g. `"email,card_number"`);
//! - `skip_types` = comma-separated event types (or `prefix.*`) to drop.

use plugin_sdk::{DeliveryContext, Hooks, Plugin, Request, TransformResult, config};
use serde_json::{Value, json};

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
        let mut envelope: Value = serde_json::from_slice(&req.body).map_err(|e| format!("body is not JSON: {e}"))?;
        let mut data = envelope.get_mut("data").map(Value::take).unwrap_or(Value::Null);
        if let Some(keys) = config("redact") {
            let keys: Vec<&str> = list(&keys).collect();
            redact(&mut data, &keys);
        }
        let text = message_text(ctx, &data);
        let message = match config("style").as_deref() {
            Some("discord") => json!({ "content": text }),
            None | Some("slack") => json!({ "text": text }),
            Some(other) => return Err(format!("unknown style {other:?}")),
        };
        req.body = serde_json::to_vec(&message).map_err(|e| e.to_string())?;
        req.set_header("content-type", "application/json");
        Ok(TransformResult::Send(req))
    }
}

fn message_text(ctx: &DeliveryContext, data: &Value) -> String {
    let pretty = serde_json::to_string_pretty(data).unwrap_or_default();
    format!("*{}* `{}`\n```{}```", ctx.event_type, ctx.event_id, pretty)
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
