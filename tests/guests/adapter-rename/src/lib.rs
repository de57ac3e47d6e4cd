//! A payload version adapter for the pinned-versions tests (`tests/it/versions.rs`): its
//! `transform` gets an event's payload (not the envelope) and renames top-level keys, as
//! a schema version that renamed a field would need undone.
//!
//! Configuration: `rename` = comma-separated `new:old` pairs (`total_cents:amount`), each
//! key `new` of the payload renamed to `old`; `version` = a number written as the
//! payload's `"v"`, when set, so a test sees every step of a chain ran.

use plugin_sdk::{DeliveryContext, Hooks, Plugin, Request, TransformResult, config};
use serde_json::Value;

/// The plugin; see the crate docs.
struct AdapterRename;

impl Plugin for AdapterRename {
    const HOOKS: Hooks = Hooks::TRANSFORM;

    fn transform(_ctx: &DeliveryContext, mut req: Request) -> Result<TransformResult, String> {
        let mut payload: Value = serde_json::from_slice(&req.body).map_err(|e| format!("payload is not JSON: {e}"))?;
        let object = payload.as_object_mut().ok_or("payload is not an object")?;
        for pair in config("rename").unwrap_or_default().split(',').filter(|p| !p.is_empty()) {
            let (new, old) = pair.split_once(':').ok_or_else(|| format!("rename: {pair:?} is not new:old"))?;
            if let Some(v) = object.remove(new.trim()) {
                object.insert(old.trim().to_string(), v);
            }
        }
        if let Some(v) = config("version") {
            let n: i64 = v.parse().map_err(|_| format!("version: {v:?} is not a number"))?;
            object.insert("v".into(), n.into());
        }
        req.body = serde_json::to_vec(&payload).map_err(|e| e.to_string())?;
        Ok(TransformResult::Send(req))
    }
}

plugin_sdk::export!(AdapterRename);
