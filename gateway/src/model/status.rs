//! An endpoint's delivery status (issue 51.7, after the MCP Events draft's `deliveryStatus`
//! and Svix's rate-limit status): one word for where its deliveries stand, since when,
//! until when, why, and its latest failed attempt. A read-side view, computed in one
//! place ([`delivery_status`]) from the stored state and the health read.

use serde::Serialize;

use super::{Endpoint, EndpointState, Gate, LastError, Millis};

/// Who made an endpoint's last change of state (stored as `endpoints.state_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateBy {
    /// An attempt's verdict on the receiver's answer: a `429`'s timed pause, a hold for a
    /// human, disabling.
    Receiver,
    /// Someone through the API (pause, enable).
    Operator,
}

impl StateBy {
    pub fn as_str(self) -> &'static str {
        match self {
            StateBy::Receiver => "receiver",
            StateBy::Operator => "operator",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [StateBy::Receiver, StateBy::Operator].into_iter().find(|x| x.as_str() == s)
    }
}

/// Where an endpoint's deliveries stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EndpointStatus {
    /// Sending, and its latest attempts succeed (or it has none).
    Active,
    /// Sending, but failing since `since`.
    Failing,
    /// Sending nothing until `until`: the receiver asked for a pause (a `429`).
    Throttled,
    /// Sending nothing: held for a human, or paused by an operator (until `until`, if set).
    Paused,
    /// Sending nothing: its deliveries become dead letters.
    Disabled,
    /// Sending nothing until its URL echoes the verification challenge (`verify`); its
    /// deliveries wait. `since`: the last try (none before the first), `until`: the next,
    /// `reason`: why the last one failed.
    Unverified,
}

/// An endpoint's delivery status at some instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryStatus {
    pub status: EndpointStatus,
    /// When it entered this status (`None`: not known, a change stored before Herald kept it).
    pub since: Option<Millis>,
    /// When a timed pause ends (throttled, or paused for a while).
    pub until: Option<Millis>,
    /// Why (the stored `state_reason`).
    pub reason: Option<String>,
    pub last_error: Option<LastError>,
}

/// The delivery status of `e` at `now`, its latest failed attempt being `last_error`. A
/// timed pause that has run out reads as over ([`Endpoint::sendable_at`]), though the
/// store may not have ended it yet: active (or failing) since the pause's end.
pub fn delivery_status(e: &Endpoint, last_error: Option<LastError>, now: Millis) -> DeliveryStatus {
    let running = e.paused_until.filter(|until| *until > now);
    let (status, since, until, reason) = match e.state {
        EndpointState::Disabled => (EndpointStatus::Disabled, e.state_since, None, e.state_reason.clone()),
        EndpointState::Paused if e.paused_until.is_none() || running.is_some() => {
            let status = match (running, e.state_by) {
                (Some(_), Some(StateBy::Receiver)) => EndpointStatus::Throttled,
                _ => EndpointStatus::Paused,
            };
            (status, e.state_since, running, e.state_reason.clone())
        }
        EndpointState::Active | EndpointState::Paused => {
            // Sending: since the pause ran out, or since the last change of state.
            let sending_since = match e.state {
                EndpointState::Paused => e.paused_until,
                _ => e.state_since,
            };
            match (e.verify_gate(now), e.failing_since) {
                (Gate::Due | Gate::WaitUntil(_), _) => {
                    let v = e.verification_now().unwrap_or_else(|| super::Verification::pending(""));
                    (EndpointStatus::Unverified, v.last_tried_at, v.next_try_at, v.reason)
                }
                (Gate::Open, Some(t)) => (EndpointStatus::Failing, Some(t), None, None),
                (Gate::Open, None) => (EndpointStatus::Active, sending_since, None, None),
            }
        }
    };
    DeliveryStatus { status, since, until, reason, last_error }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EndpointId, EndpointSpec, Limits, Target, TenantId};

    const NOW: Millis = 1_000_000_000;

    fn endpoint(state: EndpointState, by: Option<StateBy>, until: Option<Millis>, failing: Option<Millis>) -> Endpoint {
        let limits =
            Limits { rate_per_sec: 1.0, burst: 1, max_in_flight: 1, timeout_ms: 1000, connect_timeout_ms: 1000 };
        let spec = EndpointSpec::new(Target::http("https://example.com/hook"), "whsec_x".into(), limits);
        let mut e = Endpoint::new(EndpointId::from_stored("ep_1"), TenantId::from_stored("acme"), spec, NOW - 100);
        e.state = state;
        e.state_by = by;
        e.state_since = Some(NOW - 10);
        e.state_reason = (state != EndpointState::Active).then(|| "why".to_string());
        e.paused_until = until;
        e.failing_since = failing;
        e
    }

    /// A stored state, who made it, its pause's end and its failing streak's start → the
    /// status, since, until and reason shown.
    type Case = (
        EndpointState,
        Option<StateBy>,
        Option<Millis>,
        Option<Millis>,
        EndpointStatus,
        Option<Millis>,
        Option<Millis>,
        Option<&'static str>,
    );

    #[test]
    fn status_table() {
        use EndpointState::*;
        use StateBy::*;
        let why = Some("why");
        #[rustfmt::skip]
        let cases: [Case; 14] = [
            //  state    by              paused until    failing since  → status            since          until          reason
            (Active,   None,           None,           None,          EndpointStatus::Active,    Some(NOW - 10), None,          None),
            (Active,   Some(Operator), None,           None,          EndpointStatus::Active,    Some(NOW - 10), None,          None),
            (Active,   Some(Receiver), None,           Some(NOW - 5), EndpointStatus::Failing,   Some(NOW - 5),  None,          None),
            (Paused,   Some(Receiver), Some(NOW + 30), None,          EndpointStatus::Throttled, Some(NOW - 10), Some(NOW + 30), why),
            (Paused,   Some(Receiver), Some(NOW + 30), Some(NOW - 5), EndpointStatus::Throttled, Some(NOW - 10), Some(NOW + 30), why),
            (Paused,   Some(Operator), Some(NOW + 30), None,          EndpointStatus::Paused,    Some(NOW - 10), Some(NOW + 30), why),
            (Paused,   None,           Some(NOW + 30), None,          EndpointStatus::Paused,    Some(NOW - 10), Some(NOW + 30), why),
            (Paused,   Some(Receiver), None,           None,          EndpointStatus::Paused,    Some(NOW - 10), None,          why),
            (Paused,   Some(Operator), None,           Some(NOW - 5), EndpointStatus::Paused,    Some(NOW - 10), None,          why),
            // A timed pause that has run out: sending since its end.
            (Paused,   Some(Receiver), Some(NOW),      None,          EndpointStatus::Active,    Some(NOW),      None,          None),
            (Paused,   Some(Operator), Some(NOW - 1),  None,          EndpointStatus::Active,    Some(NOW - 1),  None,          None),
            (Paused,   Some(Receiver), Some(NOW - 1),  Some(NOW - 5), EndpointStatus::Failing,   Some(NOW - 5),  None,          None),
            (Disabled, Some(Receiver), None,           Some(NOW - 5), EndpointStatus::Disabled,  Some(NOW - 10), None,          why),
            (Disabled, Some(Operator), Some(NOW + 30), None,          EndpointStatus::Disabled,  Some(NOW - 10), None,          why),
        ];
        for (state, by, until, failing, status, since, want_until, reason) in cases {
            let e = endpoint(state, by, until, failing);
            let got = delivery_status(&e, None, NOW);
            let want =
                DeliveryStatus { status, since, until: want_until, reason: reason.map(String::from), last_error: None };
            assert_eq!(got, want, "{state:?} by {by:?} until {until:?} failing since {failing:?}");
        }
    }

    #[test]
    fn the_last_error_is_passed_through_and_an_unknown_since_stays_unknown() {
        let mut e = endpoint(EndpointState::Active, None, None, None);
        e.state_since = None;
        let last = LastError { category: "server_error", status: Some(500), at: NOW - 1 };
        let got = delivery_status(&e, Some(last.clone()), NOW);
        assert_eq!((got.status, got.since, got.last_error), (EndpointStatus::Active, None, Some(last)));
    }

    /// An endpoint that asks for verification and is not verified sends nothing: it says so,
    /// with its last try, its next and why it failed, failing streak or not; verified, it
    /// is active again. Paused or disabled says that first.
    #[test]
    fn an_unverified_endpoint_is_unverified_until_its_url_echoes() {
        use super::super::{Verification, VerifyState};
        let mut e = endpoint(EndpointState::Active, None, None, Some(NOW - 5));
        let Target::Http(t) = &mut e.spec.target else { unreachable!() };
        t.verify = true;
        let got = delivery_status(&e, None, NOW);
        assert_eq!((got.status, got.since, got.until, got.reason), (EndpointStatus::Unverified, None, None, None));
        let failed = Verification {
            state: VerifyState::Failed,
            url: "https://example.com/hook".into(),
            reason: Some("answered 404, not 2xx with the challenge".into()),
            last_tried_at: Some(NOW - 3),
            next_try_at: Some(NOW + 5_000),
            failures: 1,
        };
        e.verification = Some(failed.clone());
        let got = delivery_status(&e, None, NOW);
        assert_eq!((got.status, got.since, got.until), (EndpointStatus::Unverified, Some(NOW - 3), Some(NOW + 5_000)));
        assert_eq!(got.reason, failed.reason);
        e.verification = Some(Verification { state: VerifyState::Verified, next_try_at: None, ..failed });
        assert_eq!(delivery_status(&e, None, NOW).status, EndpointStatus::Failing, "verified: as before");
        e.verification = None;
        e.state = EndpointState::Disabled;
        assert_eq!(delivery_status(&e, None, NOW).status, EndpointStatus::Disabled);
    }

    #[test]
    fn state_by_names_round_trip() {
        for by in [StateBy::Receiver, StateBy::Operator] {
            assert_eq!(StateBy::parse(by.as_str()), Some(by));
        }
        assert_eq!(StateBy::parse("api"), None);
    }
}
