//! The built-in response classification table (DESIGN.md "Default classification") and
//! `Retry-After` parsing. Pure policy: it maps an attempt's outcome to a verdict and must
//! not schedule, pace, sleep, read the clock or perform I/O.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

/// How long a `429` without `Retry-After` pauses its endpoint.
pub const DEFAULT_429_PAUSE: Duration = Duration::from_secs(60);

/// Why an attempt got no HTTP response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportErrorKind {
    /// The total request deadline passed.
    Timeout,
    /// The connect deadline passed.
    ConnectTimeout,
    /// The receiver refused the connection.
    ConnectionRefused,
    /// The connection was reset or closed mid-request.
    ConnectionReset,
    /// The host name did not resolve.
    Dns,
    /// The TLS handshake failed (certificate or protocol).
    Tls,
    /// The SSRF guard refused the destination address.
    Blocked,
    /// A broker refused the endpoint's credentials (or their permissions).
    BrokerAuth,
    /// A broker has no such destination: the exchange, the stream (or no JetStream stream
    /// takes the subject), or a key of another type.
    BrokerMissing,
    /// Any other transport failure.
    Other,
}

/// What one delivery attempt produced: the one outcome vocabulary, from `deliver` (which
/// produces it) through the classifier and plugins to the recorded attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The receiver answered.
    Response(Response),
    /// No response was received.
    Transport {
        /// What went wrong, as the classification table speaks of it.
        kind: TransportErrorKind,
        /// The error chain, for the attempt record.
        detail: String,
    },
}

/// A receiver's answer, as much of it as Herald keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The parsed `Retry-After` header, if present and valid.
    pub retry_after: Option<Duration>,
    /// Response headers; captured only when a classify plugin will read them.
    pub headers: Vec<(String, String)>,
    /// The first [`BODY_PREFIX`](crate::deliver::BODY_PREFIX) bytes of the body (lossy UTF-8).
    pub body_prefix: String,
}

impl Outcome {
    /// An answer with only a status and `Retry-After` (what the built-in table reads).
    pub fn status(status: u16, retry_after: Option<Duration>) -> Outcome {
        Outcome::Response(Response { status, retry_after, headers: Vec::new(), body_prefix: String::new() })
    }

    /// The HTTP status, if the receiver answered.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            Outcome::Response(r) => Some(r.status),
            Outcome::Transport { .. } => None,
        }
    }
}

/// What to do about an outcome. One word per meaning: a timed pause (`PauseFor`) is
/// rate limiting and resumes by itself; a hold (`HoldForHuman`) waits for someone to fix
/// the endpoint and re-enable it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The receiver has the event.
    Delivered,
    /// Try this delivery again later.
    Retry {
        /// A delay requested by the receiver; `None` means "use the backoff schedule".
        after: Option<Duration>,
    },
    /// Pause the whole endpoint for `after` (e.g. a `429`), and retry this delivery then.
    PauseFor {
        /// How long the endpoint sends nothing.
        after: Duration,
        /// Why, for the operator (kept with the endpoint's state).
        reason: String,
    },
    /// Give up on this delivery: dead-letter it with `reason`.
    Fail {
        /// Dead-letter reason, e.g. `permanent:404`.
        reason: String,
    },
    /// Hold the endpoint until a human re-enables it (credentials, TLS); keep its deliveries.
    HoldForHuman {
        /// Why, for the operator.
        reason: String,
    },
    /// Disable the endpoint; its queued deliveries become dead letters.
    DisableEndpoint {
        /// Why, for the operator.
        reason: String,
    },
}

/// A transport error name that is not one of the known kinds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown transport error kind {0:?}")]
pub struct UnknownTransportErrorKind(pub String);

/// Applies the built-in classification table to an outcome.
pub fn classify(outcome: &Outcome) -> Verdict {
    match outcome {
        Outcome::Response(r) => classify_status(r.status, r.retry_after),
        Outcome::Transport { kind, detail } => classify_transport(*kind, detail),
    }
}

/// Parses a `Retry-After` value: delay-seconds or an HTTP date, relative to `now`.
/// A date in the past yields zero; anything else unparsable (including negatives) yields
/// `None`. Nothing is capped here: the schedule decides whether the delay fits.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse().ok().map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

impl TransportErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [TransportErrorKind; 10] = [
        Self::Timeout,
        Self::ConnectTimeout,
        Self::ConnectionRefused,
        Self::ConnectionReset,
        Self::Dns,
        Self::Tls,
        Self::Blocked,
        Self::BrokerAuth,
        Self::BrokerMissing,
        Self::Other,
    ];

    /// The snake_case name stored with an attempt.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::ConnectTimeout => "connect_timeout",
            Self::ConnectionRefused => "connection_refused",
            Self::ConnectionReset => "connection_reset",
            Self::Dns => "dns",
            Self::Tls => "tls",
            Self::Blocked => "blocked",
            Self::BrokerAuth => "broker_auth",
            Self::BrokerMissing => "broker_missing",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for TransportErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TransportErrorKind {
    type Err = UnknownTransportErrorKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| UnknownTransportErrorKind(s.to_owned()))
    }
}

/// What the built-in table makes of an HTTP status: the one table behind both an
/// answer's verdict ([`classify_status`]) and a failed attempt's category
/// ([`failure_category`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusClass {
    Success,
    RateLimited,
    ServerError,
    Credentials,
    Gone,
    Permanent,
    /// 3xx (the redirect is never followed), 1xx as a final status, codes outside
    /// 100..=599: protocol oddities.
    Unexpected,
}

impl StatusClass {
    fn of(status: u16) -> StatusClass {
        match status {
            200..=299 => StatusClass::Success,
            429 => StatusClass::RateLimited,
            408 | 500..=599 => StatusClass::ServerError,
            401 | 403 => StatusClass::Credentials,
            410 => StatusClass::Gone,
            400..=499 => StatusClass::Permanent,
            _ => StatusClass::Unexpected,
        }
    }

    /// The category of a failed attempt with this answer (a success a plugin failed is
    /// unexpected too).
    fn category(self) -> &'static str {
        match self {
            StatusClass::RateLimited => "rate_limited",
            StatusClass::ServerError => "server_error",
            StatusClass::Credentials => "credentials",
            StatusClass::Gone => "gone",
            StatusClass::Permanent => "permanent",
            StatusClass::Success | StatusClass::Unexpected => "unexpected_status",
        }
    }
}

fn classify_status(status: u16, retry_after: Option<Duration>) -> Verdict {
    match StatusClass::of(status) {
        StatusClass::Success => Verdict::Delivered,
        StatusClass::RateLimited => Verdict::PauseFor {
            after: retry_after.unwrap_or(DEFAULT_429_PAUSE),
            reason: "rate limited (429)".to_owned(),
        },
        StatusClass::ServerError => retry(retry_after),
        StatusClass::Credentials => Verdict::HoldForHuman { reason: format!("credentials: HTTP {status}") },
        StatusClass::Gone => Verdict::DisableEndpoint { reason: format!("gone: HTTP {status}") },
        StatusClass::Permanent => Verdict::Fail { reason: format!("permanent:{status}") },
        // The failure is recorded (a redirect never followed): retry, do not drop.
        StatusClass::Unexpected => retry(None),
    }
}

/// A broker's refusal names what to fix; the reason carries its words (cut).
fn classify_transport(kind: TransportErrorKind, detail: &str) -> Verdict {
    use TransportErrorKind::*;
    let cut = || detail.chars().take(300).collect::<String>();
    match kind {
        Timeout | ConnectTimeout | ConnectionRefused | ConnectionReset | Dns | Other => retry(None),
        Tls => Verdict::HoldForHuman { reason: "tls".to_owned() },
        Blocked => Verdict::Fail { reason: "blocked_destination".to_owned() },
        BrokerAuth => Verdict::HoldForHuman { reason: format!("broker:auth: {}", cut()) },
        BrokerMissing => Verdict::HoldForHuman { reason: format!("broker:missing: {}", cut()) },
    }
}

/// The error class of a token endpoint that gave no token (OAuth2 endpoints).
pub const AUTH_TOKEN: &str = "auth:token";

/// The verdict when an endpoint's OAuth2 token endpoint gives no token: nothing can be
/// sent until someone fixes the credentials or the token endpoint, so the endpoint is held
/// as for a TLS failure; the reason carries the token error (shown with its state).
pub fn token_failed(error: &str) -> Verdict {
    let cut: String = error.chars().take(300).collect();
    Verdict::HoldForHuman { reason: format!("{AUTH_TOKEN}: {cut}") }
}

/// The categories of a failed attempt that got an answer: the class the built-in table
/// gives its status (`permanent` as in the dead-letter reason `permanent:404`).
pub const ANSWER_CATEGORIES: [&str; 6] =
    ["rate_limited", "server_error", "credentials", "gone", "permanent", "unexpected_status"];

/// Every category of a failed attempt, the one vocabulary of an endpoint's
/// `delivery_status.last_error` in the API and the console: [`ANSWER_CATEGORIES`], the
/// transport kinds ([`TransportErrorKind::as_str`]) for an attempt without an answer, and
/// `plugin`, the dead-letter class of a failed plugin call.
pub fn failure_categories() -> impl Iterator<Item = &'static str> {
    ANSWER_CATEGORIES.into_iter().chain(TransportErrorKind::ALL.map(|k| k.as_str())).chain(["plugin"])
}

/// The category ([`failure_categories`]) of a failed attempt from what its record keeps:
/// the answer's status, or else the start of its error (`timeout: …`, `plugin:trap: …`,
/// `broker:auth: …`, `auth:token: …`).
pub fn failure_category(status: Option<u16>, error: Option<&str>) -> &'static str {
    if let Some(status) = status {
        return StatusClass::of(status).category();
    }
    let error = error.unwrap_or("");
    let mut parts = error.splitn(3, ':').map(str::trim);
    match (parts.next().unwrap_or(""), parts.next().unwrap_or("")) {
        ("plugin", _) => "plugin",
        ("broker", "missing") => "broker_missing",
        ("broker", _) => "broker_auth",
        ("auth" | "oauth2" | "signing_key", _) => "credentials",
        (kind, _) => kind.parse::<TransportErrorKind>().map(|k| k.as_str()).unwrap_or("other"),
    }
}

fn retry(after: Option<Duration>) -> Verdict {
    Verdict::Retry { after }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn resp(status: u16, retry_after: Option<Duration>) -> Outcome {
        Outcome::status(status, retry_after)
    }

    fn retry_v(after: Option<Duration>) -> Verdict {
        Verdict::Retry { after }
    }

    fn pause_for(after: Duration) -> Verdict {
        Verdict::PauseFor { after, reason: "rate limited (429)".to_owned() }
    }

    fn fail(reason: &str) -> Verdict {
        Verdict::Fail { reason: reason.to_owned() }
    }

    fn pause(reason: &str) -> Verdict {
        Verdict::HoldForHuman { reason: reason.to_owned() }
    }

    #[test]
    fn status_table() {
        let ra = Some(secs(5));
        let disable = Verdict::DisableEndpoint { reason: "gone: HTTP 410".to_owned() };
        let cases: Vec<(u16, Option<Duration>, Verdict)> = vec![
            (200, None, Verdict::Delivered),
            (201, ra, Verdict::Delivered),
            (204, None, Verdict::Delivered),
            (299, None, Verdict::Delivered),
            (429, None, pause_for(secs(60))),
            (429, ra, pause_for(secs(5))),
            (429, Some(Duration::ZERO), pause_for(Duration::ZERO)),
            (408, None, retry_v(None)),
            (408, ra, retry_v(ra)),
            (500, None, retry_v(None)),
            (502, ra, retry_v(ra)),
            (503, ra, retry_v(ra)),
            (504, None, retry_v(None)),
            (599, ra, retry_v(ra)),
            (401, None, pause("credentials: HTTP 401")),
            (403, ra, pause("credentials: HTTP 403")),
            (410, None, disable),
            (404, None, fail("permanent:404")),
            (400, None, fail("permanent:400")),
            (422, None, fail("permanent:422")),
            (405, None, fail("permanent:405")),
            (413, ra, fail("permanent:413")),
            (451, None, fail("permanent:451")),
            (499, None, fail("permanent:499")),
            (300, None, retry_v(None)),
            (301, None, retry_v(None)),
            (302, ra, retry_v(None)),
            (307, None, retry_v(None)),
            (308, None, retry_v(None)),
            (100, None, retry_v(None)),
            (101, None, retry_v(None)),
            (199, ra, retry_v(None)),
            (0, None, retry_v(None)),
            (99, None, retry_v(None)),
            (600, ra, retry_v(None)),
            (999, None, retry_v(None)),
            (u16::MAX, None, retry_v(None)),
        ];
        for (status, retry_after, want) in cases {
            assert_eq!(classify(&resp(status, retry_after)), want, "HTTP {status}");
        }
    }

    #[test]
    fn every_status_has_the_verdict_of_its_class() {
        for status in 0..=1000u16 {
            let v = classify(&resp(status, None));
            let ok = match (status, &v) {
                (200..=299, Verdict::Delivered) => true,
                (401 | 403, Verdict::HoldForHuman { .. }) => true,
                (410, Verdict::DisableEndpoint { .. }) => true,
                (408, Verdict::Retry { .. }) | (429, Verdict::PauseFor { .. }) => true,
                (400..=499, Verdict::Fail { reason }) => reason == &format!("permanent:{status}"),
                (200..=299 | 400..=499, _) => false,
                (_, Verdict::Retry { after: None }) => true,
                _ => false,
            };
            assert!(ok, "HTTP {status} → {v:?}");
        }
    }

    #[test]
    fn transport_table() {
        use TransportErrorKind::*;
        let cases = [
            (Timeout, retry_v(None)),
            (ConnectTimeout, retry_v(None)),
            (ConnectionRefused, retry_v(None)),
            (ConnectionReset, retry_v(None)),
            (Dns, retry_v(None)),
            (Other, retry_v(None)),
            (Tls, pause("tls")),
            (Blocked, fail("blocked_destination")),
            (BrokerAuth, pause("broker:auth: NOAUTH")),
            (BrokerMissing, pause("broker:missing: NOAUTH")),
        ];
        assert_eq!(cases.len(), TransportErrorKind::ALL.len());
        for (kind, want) in cases {
            // Only a broker's refusal carries the broker's words into the reason.
            assert_eq!(classify(&Outcome::Transport { kind, detail: "NOAUTH".into() }), want, "{kind}");
        }
    }

    #[test]
    fn failure_category_table() {
        let cases: [(Option<u16>, Option<&str>, &str); 20] = [
            (Some(429), None, "rate_limited"),
            (Some(500), None, "server_error"),
            (Some(503), Some("ignored"), "server_error"),
            (Some(408), None, "server_error"),
            (Some(401), None, "credentials"),
            (Some(403), None, "credentials"),
            (Some(410), None, "gone"),
            (Some(404), None, "permanent"),
            (Some(302), None, "unexpected_status"),
            (Some(200), None, "unexpected_status"),
            (None, Some("timeout: deadline of 5s"), "timeout"),
            (None, Some("connection_refused: tcp connect error"), "connection_refused"),
            (None, Some("tls: invalid peer certificate"), "tls"),
            (None, Some("plugin:trap: unreachable"), "plugin"),
            (None, Some("broker:auth: NOAUTH"), "broker_auth"),
            (None, Some("broker:missing: no stream"), "broker_missing"),
            (None, Some("auth:token: HTTP 400 invalid_client"), "credentials"),
            (None, Some("oauth2: the client secret sealed under key k2; write it again"), "credentials"),
            (None, Some("something else"), "other"),
            (None, None, "other"),
        ];
        for (status, error, want) in cases {
            let got = failure_category(status, error);
            assert_eq!(got, want, "{status:?} {error:?}");
            assert!(failure_categories().any(|c| c == got), "{got} is in the vocabulary");
        }
        for kind in TransportErrorKind::ALL {
            let error = format!("{kind}: detail");
            assert_eq!(failure_category(None, Some(&error)), kind.as_str());
            assert!(failure_categories().any(|c| c == kind.as_str()), "{kind} is in the vocabulary");
        }
    }

    #[test]
    fn transport_kind_names_round_trip() {
        let names = [
            "timeout",
            "connect_timeout",
            "connection_refused",
            "connection_reset",
            "dns",
            "tls",
            "blocked",
            "broker_auth",
            "broker_missing",
            "other",
        ];
        for (kind, name) in TransportErrorKind::ALL.into_iter().zip(names) {
            assert_eq!(kind.as_str(), name);
            assert_eq!(kind.to_string(), name);
            assert_eq!(name.parse::<TransportErrorKind>(), Ok(kind));
        }
        for bad in ["", "Timeout", "TLS", "refused", " dns"] {
            let err = bad.parse::<TransportErrorKind>().unwrap_err();
            assert_eq!(err, UnknownTransportErrorKind(bad.to_owned()));
        }
    }

    #[test]
    fn transport_kind_serde_matches_as_str() {
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, StrDeserializer};
        for kind in TransportErrorKind::ALL {
            let de: StrDeserializer<'_, Error> = kind.as_str().into_deserializer();
            let back: TransportErrorKind = serde::Deserialize::deserialize(de).unwrap();
            assert_eq!(back, kind);
        }
    }

    #[test]
    fn retry_after_table() {
        // Sun, 06 Nov 1994 08:49:37 GMT
        let now = SystemTime::UNIX_EPOCH + secs(784_111_777);
        let cases: [(&str, Option<Duration>); 19] = [
            ("0", Some(Duration::ZERO)),
            ("120", Some(secs(120))),
            ("  30 ", Some(secs(30))),
            ("\t7\r\n", Some(secs(7))),
            ("007", Some(secs(7))),
            ("31536000", Some(secs(31_536_000))),
            ("18446744073709551615", Some(secs(u64::MAX))),
            ("18446744073709551616", None),
            ("Sun, 06 Nov 1994 08:50:37 GMT", Some(secs(60))),
            ("Sun, 06 Nov 1994 08:49:37 GMT", Some(Duration::ZERO)),
            ("Sat, 05 Nov 1994 08:49:37 GMT", Some(Duration::ZERO)),
            ("Sunday, 06-Nov-94 08:49:47 GMT", Some(secs(10))),
            ("Sun Nov  6 09:49:37 1994", Some(secs(3600))),
            ("-5", None),
            ("+5", None),
            ("1.5", None),
            ("", None),
            ("soon", None),
            ("Sun, 06 Nov 1994 25:00:00 GMT", None),
        ];
        for (value, want) in cases {
            assert_eq!(parse_retry_after(value, now), want, "{value:?}");
        }
    }
}
