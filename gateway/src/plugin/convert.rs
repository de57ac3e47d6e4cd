//! Conversions between the WIT types and Herald's own vocabulary (`classify`), beside the
//! one `bindgen!` as Spin keeps its `conversions` beside its bindings: the worker speaks
//! only `classify::Outcome` and `classify::Verdict`.

use std::time::Duration;

use super::bindings::herald::plugin::types as wit;
use crate::classify;

impl From<&classify::Outcome> for wit::Outcome {
    fn from(outcome: &classify::Outcome) -> wit::Outcome {
        match outcome {
            classify::Outcome::Response(r) => wit::Outcome::Response(wit::Response {
                status: r.status,
                headers: r.headers.clone(),
                body: r.body_prefix.as_bytes().to_vec(),
            }),
            classify::Outcome::Transport { kind, detail } => {
                wit::Outcome::TransportError(wit::TransportError { kind: (*kind).into(), message: detail.clone() })
            }
        }
    }
}

impl From<classify::TransportErrorKind> for wit::TransportErrorKind {
    fn from(kind: classify::TransportErrorKind) -> wit::TransportErrorKind {
        use classify::TransportErrorKind as K;
        match kind {
            K::Timeout | K::ConnectTimeout => wit::TransportErrorKind::Timeout,
            K::ConnectionRefused => wit::TransportErrorKind::ConnectionRefused,
            K::ConnectionReset => wit::TransportErrorKind::ConnectionReset,
            K::Dns => wit::TransportErrorKind::Dns,
            K::Tls => wit::TransportErrorKind::Tls,
            K::Blocked | K::BrokerAuth | K::BrokerMissing | K::Other => wit::TransportErrorKind::Other,
        }
    }
}

/// A classify plugin's verdict in Herald's terms; `None` is `default` (use the built-in
/// table). `plugin` names the plugin in the reasons it leaves.
pub fn verdict(v: wit::Verdict, plugin: &str) -> Option<classify::Verdict> {
    Some(match v {
        wit::Verdict::Default => return None,
        wit::Verdict::Delivered => classify::Verdict::Delivered,
        wit::Verdict::Retry(after) => classify::Verdict::Retry { after: after.map(|s| Duration::from_secs(s.into())) },
        wit::Verdict::Fail(reason) => classify::Verdict::Fail { reason: format!("plugin:{reason}") },
        wit::Verdict::PauseEndpoint(p) => classify::Verdict::PauseFor {
            after: Duration::from_secs(p.secs.into()),
            reason: format!("paused by plugin {plugin}: {}", p.reason),
        },
        wit::Verdict::DisableEndpoint(reason) => classify::Verdict::DisableEndpoint { reason },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_keep_their_meaning_and_reasons() {
        let pause = wit::Pause { secs: 30, reason: "maintenance window".into() };
        let cases = [
            (wit::Verdict::Default, None),
            (wit::Verdict::Delivered, Some(classify::Verdict::Delivered)),
            (wit::Verdict::Retry(None), Some(classify::Verdict::Retry { after: None })),
            (wit::Verdict::Retry(Some(5)), Some(classify::Verdict::Retry { after: Some(Duration::from_secs(5)) })),
            (wit::Verdict::Fail("dup".into()), Some(classify::Verdict::Fail { reason: "plugin:dup".into() })),
            (
                wit::Verdict::PauseEndpoint(pause),
                Some(classify::Verdict::PauseFor {
                    after: Duration::from_secs(30),
                    reason: "paused by plugin c409: maintenance window".into(),
                }),
            ),
            (
                wit::Verdict::DisableEndpoint("gone".into()),
                Some(classify::Verdict::DisableEndpoint { reason: "gone".into() }),
            ),
        ];
        for (wit, want) in cases {
            assert_eq!(verdict(wit.clone(), "c409"), want, "{wit:?}");
        }
    }

    #[test]
    fn outcomes_reach_plugins_whole() {
        let r = classify::Outcome::Response(classify::Response {
            status: 409,
            retry_after: None,
            headers: vec![("x-dup".into(), "1".into())],
            body_prefix: "already".into(),
        });
        let want = wit::Outcome::Response(wit::Response {
            status: 409,
            headers: vec![("x-dup".into(), "1".into())],
            body: b"already".to_vec(),
        });
        assert_eq!(wit::Outcome::from(&r), want);
        let t =
            classify::Outcome::Transport { kind: classify::TransportErrorKind::ConnectTimeout, detail: "slow".into() };
        let want = wit::Outcome::TransportError(wit::TransportError {
            kind: wit::TransportErrorKind::Timeout,
            message: "slow".into(),
        });
        assert_eq!(wit::Outcome::from(&t), want);
    }
}
