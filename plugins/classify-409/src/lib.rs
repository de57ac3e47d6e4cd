//! Classifies `409 Conflict` responses: many receivers answer 409 when they have
//! already processed an event (idempotency keys), which Herald's built-in table would
//! treat as a permanent failure.
//!
//! Configuration (`[plugins.config.<tenant>.<name>]`):
//! - `on_409` = `"delivered"` (default) or `"retry"`;
//! - `retry_after` = seconds to wait when retrying (default 60).
//!
//! Every other outcome gets `default`: Herald's built-in table decides.

use plugin_sdk::{DeliveryContext, Hooks, Outcome, Plugin, Verdict, config, log};

/// The plugin; see the crate docs.
struct Classify409;

const DEFAULT_RETRY_AFTER_SECS: u32 = 60;

impl Plugin for Classify409 {
    const HOOKS: Hooks = Hooks::CLASSIFY;
    const CLASSIFY_STATUSES: Option<&'static [u16]> = Some(&[409]);

    fn classify(ctx: &DeliveryContext, outcome: &Outcome) -> Verdict {
        if outcome.status() != Some(409) {
            return Verdict::Default;
        }
        match config("on_409").as_deref() {
            None | Some("delivered") => Verdict::Delivered,
            Some("retry") => {
                let after = config("retry_after")
                    .and_then(|s| s.trim().parse::<u32>().ok())
                    .unwrap_or(DEFAULT_RETRY_AFTER_SECS);
                Verdict::Retry(Some(after))
            }
            Some(other) => {
                log::warn(&format!(
                    "unknown on_409 value {other:?} for endpoint {}; using the built-in table",
                    ctx.endpoint_id
                ));
                Verdict::Default
            }
        }
    }
}

plugin_sdk::export!(Classify409);
