//! Verified endpoints: whether an HTTP endpoint that asks for it (`verify`) has confirmed,
//! by echoing a signed random challenge, that it wants deliveries at its current URL; the
//! stored state of that handshake, what counts as an echo, and the capped backoff of the
//! tries after a failure. Pure: the handshake itself is the worker's
//! (`worker/partition/verify.rs`), which alone sends it.

use serde::{Deserialize, Serialize};

use super::Millis;

/// The `type` of a verification request's body.
pub const VERIFICATION_TYPE: &str = "webhook.verification";

/// The wait after a first failed try; it doubles with each failure in a row.
pub const VERIFY_RETRY_FIRST_MS: Millis = 5_000;

/// The longest wait between two tries.
pub const VERIFY_RETRY_CAP_MS: Millis = 3_600_000;

/// Where an endpoint's verification stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum VerifyState {
    /// Not tried yet at its current URL (or asked to try again now).
    Pending,
    /// Its current URL echoed the challenge: deliveries go out.
    Verified,
    /// The last try did not get the challenge back; tried again at `next_try_at`.
    Failed,
}

/// The stored state of an endpoint's verification (the `verification` column, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verification {
    pub state: VerifyState,
    /// The URL it stands for: a URL changed since is verified again.
    pub url: String,
    /// Why the last try failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_tried_at: Option<Millis>,
    /// When it is tried next (`None` once verified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_try_at: Option<Millis>,
    /// Failed tries in a row at this URL.
    #[serde(default)]
    pub failures: u32,
}

/// What the verification gate lets through at some instant ([`gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Verified (or not asked for): deliveries go out.
    Open,
    /// A handshake is due now.
    Due,
    /// Deliveries wait; the next try is then.
    WaitUntil(Millis),
}

impl Verification {
    /// Not tried yet at `url` (a new endpoint, a changed URL); due at once.
    pub fn pending(url: &str) -> Verification {
        Verification {
            state: VerifyState::Pending,
            url: url.to_string(),
            reason: None,
            last_tried_at: None,
            next_try_at: None,
            failures: 0,
        }
    }

    /// "Verify now": pending at `url`, due at `now`, keeping the last try's reason in view.
    pub fn requested(stored: Option<&Verification>, url: &str, now: Millis) -> Verification {
        let last = stored.filter(|v| v.url == url);
        Verification {
            reason: last.and_then(|v| v.reason.clone()),
            last_tried_at: last.and_then(|v| v.last_tried_at),
            next_try_at: Some(now),
            ..Verification::pending(url)
        }
    }

    /// `url` echoed the challenge at `now`.
    pub fn verified(url: &str, now: Millis) -> Verification {
        Verification { state: VerifyState::Verified, last_tried_at: Some(now), ..Verification::pending(url) }
    }

    /// A try at `url` failed at `now` for `reason`: tried again after the backoff of one
    /// failure more than the stored ones at that URL.
    pub fn failed(stored: Option<&Verification>, url: &str, reason: String, now: Millis) -> Verification {
        let failures = stored.filter(|v| v.url == url).map_or(0, |v| v.failures).saturating_add(1);
        Verification {
            state: VerifyState::Failed,
            reason: Some(reason),
            last_tried_at: Some(now),
            next_try_at: Some(now.saturating_add(retry_after(failures))),
            failures,
            ..Verification::pending(url)
        }
    }
}

/// The wait after `failures` failed tries in a row: 5 s, doubled each time, at most an hour.
pub fn retry_after(failures: u32) -> Millis {
    let doublings = failures.saturating_sub(1).min(20);
    VERIFY_RETRY_FIRST_MS.saturating_mul(1 << doublings).min(VERIFY_RETRY_CAP_MS)
}

/// The gate of an endpoint that asks for verification, sending to `url`, with `stored`
/// state: open once verified at that URL; otherwise due, or waiting for its next try. A
/// state stored for another URL stands for nothing.
pub fn gate(stored: Option<&Verification>, url: &str, now: Millis) -> Gate {
    match stored.filter(|v| v.url == url) {
        Some(v) if v.state == VerifyState::Verified => Gate::Open,
        Some(Verification { next_try_at: Some(at), .. }) if *at > now => Gate::WaitUntil(*at),
        _ => Gate::Due,
    }
}

/// Did an answer echo `challenge`? A `2xx` whose body is a JSON object with `"challenge"`
/// equal to it; otherwise why not, as the endpoint's `verification.reason` says it.
pub fn judge_answer(status: u16, body: &str, challenge: &str) -> Result<(), String> {
    if !(200..300).contains(&status) {
        return Err(format!("answered {status}, not 2xx with the challenge"));
    }
    let echoed = serde_json::from_str::<serde_json::Value>(body.trim()).ok().and_then(|v| match v.get("challenge") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        _ => None,
    });
    match echoed {
        Some(s) if s == challenge => Ok(()),
        Some(_) => Err(format!("answered {status} with another challenge than the one sent")),
        None => Err(format!("answered {status} without {{\"challenge\": …}} in a JSON body")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_opens_only_when_verified_at_the_current_url() {
        let url = "https://a.example/h";
        assert_eq!(gate(None, url, 10), Gate::Due);
        assert_eq!(gate(Some(&Verification::verified(url, 5)), url, 10), Gate::Open);
        assert_eq!(gate(Some(&Verification::verified("https://old.example/h", 5)), url, 10), Gate::Due);
        let failed = Verification::failed(None, url, "answered 404".into(), 10);
        assert_eq!(gate(Some(&failed), url, 11), Gate::WaitUntil(10 + VERIFY_RETRY_FIRST_MS));
        assert_eq!(gate(Some(&failed), url, 10 + VERIFY_RETRY_FIRST_MS), Gate::Due);
        assert_eq!(gate(Some(&Verification::requested(Some(&failed), url, 20)), url, 20), Gate::Due);
    }

    #[test]
    fn failures_back_off_doubling_up_to_the_cap_and_reset_at_a_new_url() {
        assert_eq!([1, 2, 3, 4].map(retry_after), [5_000, 10_000, 20_000, 40_000]);
        assert_eq!(retry_after(30), VERIFY_RETRY_CAP_MS);
        let url = "https://a.example/h";
        let once = Verification::failed(None, url, "x".into(), 0);
        let twice = Verification::failed(Some(&once), url, "x".into(), 100);
        assert_eq!((twice.failures, twice.next_try_at), (2, Some(100 + 10_000)));
        let elsewhere = Verification::failed(Some(&twice), "https://b.example/h", "x".into(), 200);
        assert_eq!(elsewhere.failures, 1);
    }

    #[test]
    fn only_a_2xx_json_echo_of_the_same_challenge_verifies() {
        assert_eq!(judge_answer(200, r#"{"challenge": "abc"}"#, "abc"), Ok(()));
        assert_eq!(judge_answer(204, "{\"challenge\":\"abc\",\"x\":1}\n", "abc"), Ok(()));
        let refused = [
            (404, r#"{"challenge": "abc"}"#, "answered 404"),
            (200, "", "without"),
            (200, "abc", "without"),
            (200, r#"{"challenge": "abd"}"#, "another challenge"),
            (200, r#"{"challenge": 1}"#, "without"),
        ];
        for (status, body, why) in refused {
            let e = judge_answer(status, body, "abc").unwrap_err();
            assert!(e.contains(why), "{status} {body}: {e}");
        }
    }
}
