//! The one header policy: which request headers belong to the HTTP layer, which to Herald,
//! and so which an endpoint's custom headers (API) or a plugin's output (engine) may set.

/// Headers the HTTP client owns: framing and routing, never taken from a user or plugin.
pub const SENDER_OWNED: &[&str] = &["host", "content-length", "transfer-encoding", "connection", "upgrade"];

/// Headers Herald sets on every attempt (`user-agent`, `webhook-*`, `herald-*`, and the
/// W3C trace context `traceparent`/`tracestate`): a receiver relies on them, so nobody else
/// may set or override them. The trace context is the event's, with the attempt's own span
/// id; a custom header or plugin that set it would graft the delivery onto another trace.
pub fn is_herald_owned(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n == "user-agent"
        || n == "traceparent"
        || n == "tracestate"
        || n.starts_with("webhook-")
        || n.starts_with("herald-")
}

/// Either kind: what custom headers may never name and what is stripped from plugin output.
pub fn is_reserved(name: &str) -> bool {
    is_herald_owned(name) || SENDER_OWNED.iter().any(|s| s.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_names() {
        let names = ["Host", "content-length", "Transfer-Encoding", "upgrade", "User-Agent", "webhook-id", "Herald-X"];
        for name in names.into_iter().chain(["TraceParent", "tracestate"]) {
            assert!(is_reserved(name), "{name}");
        }
        for name in ["x-api-key", "authorization", "content-type", "webhooks", "heraldx"] {
            assert!(!is_reserved(name), "{name}");
        }
        assert!(!is_herald_owned("host"));
    }
}
