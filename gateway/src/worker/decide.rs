//! What a verdict means: for the delivery (its next state, when, why) and for its endpoint
//! (failure tracking, a timed pause, a hold for a human, disabling). Pure: `now` and the
//! RNG are arguments; the attempt shell applies the result.

use std::time::Duration;

use crate::classify::Verdict;
use crate::clock::rfc3339;
use crate::model::{DeliveryState, Failing, Millis};
use crate::schedule::{RetryDecision, RetryPolicy};

/// What happens to a delivery after a verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub state: DeliveryState,
    pub next_attempt_at: Option<Millis>,
    /// The dead-letter reason, for a dead delivery.
    pub reason: Option<String>,
    /// The verdict as recorded with the attempt.
    pub label: String,
}

/// Turns a verdict into the delivery's next state under `policy`. `attempt_number` counts
/// the attempts this policy budgets (a replay starts its own count).
pub fn decide(
    verdict: &Verdict,
    attempt_number: u32,
    now: Millis,
    deadline: Millis,
    policy: &RetryPolicy,
    rng: &mut impl rand::Rng,
) -> Decision {
    let dead = |reason: String, label: String| Decision {
        state: DeliveryState::Dead,
        next_attempt_at: None,
        reason: Some(reason),
        label,
    };
    let retry =
        |after: Option<Duration>, rng: &mut _| match policy.next_attempt(attempt_number, now, deadline, after, rng) {
            RetryDecision::RetryAt(at) => Decision {
                state: DeliveryState::Waiting,
                next_attempt_at: Some(at),
                reason: None,
                label: "retry".into(),
            },
            RetryDecision::GiveUp(r) => {
                dead(r.as_str().to_string(), format!("{}{}", crate::model::GAVE_UP, r.as_str()))
            }
        };
    match verdict {
        Verdict::Delivered => {
            Decision { state: DeliveryState::Delivered, next_attempt_at: None, reason: None, label: "delivered".into() }
        }
        Verdict::Retry { after } => retry(*after, rng),
        Verdict::PauseFor { after, .. } => retry(Some(*after), rng),
        Verdict::Fail { reason } => dead(reason.clone(), format!("fail:{reason}")),
        Verdict::HoldForHuman { reason } => Decision {
            state: DeliveryState::Paused,
            next_attempt_at: None,
            reason: None,
            label: format!("pause_endpoint:{reason}"),
        },
        Verdict::DisableEndpoint { reason } => dead("endpoint_disabled".into(), format!("disable_endpoint:{reason}")),
    }
}

/// What an attempt's verdict does to its endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointEffect {
    /// How the endpoint's `failing_since` changes.
    pub failing_since: Failing,
    pub action: EndpointAction,
}

/// The change of state an attempt asks of its endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointAction {
    /// Nothing beyond failure tracking.
    None,
    /// Send nothing until `until` (rate limiting); then resume at the paced rate.
    PauseFor { until: Millis, after: Duration, reason: String },
    /// Send nothing until a human re-enables the endpoint; keep its deliveries.
    HoldForHuman { reason: String },
    /// Disable the endpoint; its queued deliveries become dead letters.
    Disable { reason: String },
}

/// The endpoint effect of `verdict` for an endpoint failing since `failing_since`: the
/// first failure starts the clock, a success stops it, and an endpoint still failing
/// `disable_after` later is disabled (seed 000: "disable after continuous failure").
pub fn endpoint_effect(
    verdict: &Verdict,
    failing_since: Option<Millis>,
    now: Millis,
    disable_after: Duration,
) -> EndpointEffect {
    let delivered = matches!(verdict, Verdict::Delivered);
    let (failing, since) = match (delivered, failing_since) {
        (true, Some(_)) => (Failing::Recovered, None),
        (true, None) => (Failing::Unchanged, None),
        (false, None) => (Failing::Since(now), Some(now)),
        (false, Some(t)) => (Failing::Unchanged, Some(t)),
    };
    let overdue = since.filter(|t| now.saturating_sub(*t) >= disable_after.as_millis() as i64);
    let action = match verdict {
        Verdict::PauseFor { after, reason } => EndpointAction::PauseFor {
            until: now.saturating_add(after.as_millis().min(i64::MAX as u128) as i64),
            after: *after,
            reason: reason.clone(),
        },
        Verdict::HoldForHuman { reason } => EndpointAction::HoldForHuman { reason: reason.clone() },
        Verdict::DisableEndpoint { reason } => EndpointAction::Disable { reason: reason.clone() },
        _ => match overdue {
            Some(t) => EndpointAction::Disable { reason: format!("failing since {}", rfc3339(t)) },
            None => EndpointAction::None,
        },
    };
    EndpointEffect { failing_since: failing, action }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    const NOW: Millis = 1_000_000_000;
    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn decisions() {
        let policy = RetryPolicy::try_new(
            Duration::from_secs(1),
            2.0,
            Duration::from_secs(60),
            crate::schedule::Jitter::None,
            3,
            Duration::from_secs(3600),
        )
        .unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let now = 1_000_000;
        let deadline = now + 3_600_000;
        let retry = |after| Verdict::Retry { after };
        let d = decide(&Verdict::Delivered, 1, now, deadline, &policy, &mut rng);
        assert_eq!(d.state, DeliveryState::Delivered);
        let d = decide(&retry(None), 1, now, deadline, &policy, &mut rng);
        assert_eq!((d.state, d.next_attempt_at), (DeliveryState::Waiting, Some(now + 1_000)));
        let d = decide(&retry(None), 2, now, deadline, &policy, &mut rng);
        assert_eq!(d.next_attempt_at, Some(now + 2_000));
        let d = decide(&retry(None), 3, now, deadline, &policy, &mut rng);
        assert_eq!((d.state, d.reason.as_deref()), (DeliveryState::Dead, Some("exhausted")));
        // Labels are read by machines: plain ASCII; one recorded before reads the same.
        assert_eq!(d.label, "retry->exhausted");
        assert_eq!(crate::model::ascii_label("retry\u{2192}exhausted".into()), d.label);
        let d = decide(&retry(Some(Duration::from_secs(5))), 1, now, deadline, &policy, &mut rng);
        assert_eq!(d.next_attempt_at, Some(now + 5_000));
        let pause = Verdict::PauseFor { after: Duration::from_secs(5), reason: "rate limited (429)".into() };
        let d = decide(&pause, 1, now, deadline, &policy, &mut rng);
        assert_eq!((d.state, d.next_attempt_at), (DeliveryState::Waiting, Some(now + 5_000)));
        let d = decide(&retry(Some(Duration::from_secs(7200))), 1, now, deadline, &policy, &mut rng);
        assert_eq!(d.reason.as_deref(), Some("retry_after_beyond_deadline"));
        let d = decide(&retry(None), 1, deadline + 1, deadline, &policy, &mut rng);
        assert_eq!(d.reason.as_deref(), Some("expired"));
        let d = decide(&Verdict::Fail { reason: "permanent:422".into() }, 1, now, deadline, &policy, &mut rng);
        assert_eq!((d.state, d.reason.as_deref()), (DeliveryState::Dead, Some("permanent:422")));
        let d = decide(&Verdict::HoldForHuman { reason: "credentials".into() }, 1, now, deadline, &policy, &mut rng);
        assert_eq!(d.state, DeliveryState::Paused);
        let d = decide(&Verdict::DisableEndpoint { reason: "gone".into() }, 1, now, deadline, &policy, &mut rng);
        assert_eq!(d.reason.as_deref(), Some("endpoint_disabled"));
    }

    #[rustfmt::skip]
    #[test]
    fn endpoint_effects_table() {
        use EndpointAction as A;
        let secs = Duration::from_secs;
        let hour = 3_600_000;
        let s = |r: &str| r.to_string();
        let retry = Verdict::Retry { after: None };
        let pause = Verdict::PauseFor { after: secs(30), reason: s("rate limited (429)") };
        let hold = Verdict::HoldForHuman { reason: s("credentials: HTTP 401") };
        let disable = Verdict::DisableEndpoint { reason: s("gone: HTTP 410") };
        let fail = Verdict::Fail { reason: s("permanent:404") };
        let overdue = NOW - 86_400_000;
        let since_overdue = format!("failing since {}", rfc3339(overdue));
        //  verdict               failing since      → failing_since change  action
        type Case<'a> = (&'a Verdict, Option<Millis>, Failing, A);
        let cases: Vec<Case<'_>> = vec![
            (&Verdict::Delivered, None,              Failing::Unchanged,      A::None),
            (&Verdict::Delivered, Some(NOW - hour),  Failing::Recovered,      A::None),
            (&Verdict::Delivered, Some(overdue),     Failing::Recovered,      A::None),
            (&retry,              None,              Failing::Since(NOW),     A::None),
            (&retry,              Some(NOW - hour),  Failing::Unchanged,      A::None),
            (&retry,              Some(overdue),     Failing::Unchanged,      A::Disable { reason: since_overdue.clone() }),
            (&fail,               Some(overdue),     Failing::Unchanged,      A::Disable { reason: since_overdue.clone() }),
            (&fail,               None,              Failing::Since(NOW),     A::None),
            (&pause,              None,              Failing::Since(NOW),     A::PauseFor { until: NOW + 30_000, after: secs(30), reason: s("rate limited (429)") }),
            (&pause,              Some(overdue),     Failing::Unchanged,      A::PauseFor { until: NOW + 30_000, after: secs(30), reason: s("rate limited (429)") }),
            (&hold,               None,              Failing::Since(NOW),     A::HoldForHuman { reason: s("credentials: HTTP 401") }),
            (&disable,            Some(NOW - hour),  Failing::Unchanged,      A::Disable { reason: s("gone: HTTP 410") }),
        ];
        for (verdict, failing_since, change, action) in cases {
            let got = endpoint_effect(verdict, failing_since, NOW, DAY);
            assert_eq!(got, EndpointEffect { failing_since: change, action }, "{verdict:?} failing since {failing_since:?}");
        }
    }

    #[test]
    fn huge_pauses_do_not_overflow() {
        let v = Verdict::PauseFor { after: Duration::from_secs(u64::MAX), reason: "x".into() };
        let e = endpoint_effect(&v, None, NOW, DAY);
        assert!(matches!(e.action, EndpointAction::PauseFor { until: Millis::MAX, .. }), "{e:?}");
    }
}
