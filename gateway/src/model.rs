//! The domain vocabulary: ids, tenants, endpoints, events, deliveries, attempts. Plain data
//! with validating constructors; no I/O, no clock reads.

use std::collections::BTreeMap;
use std::fmt;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// The reserved tenant that owns operational events: no API client may create or post to it.
pub const OPS_TENANT: &str = "herald-ops";

mod audit;
mod batch;
mod bindings;
mod catalog;
mod cloudevents;
mod destination;
mod egress;
mod filter;
mod plugin_settings;
mod portal;
mod replay;
mod sent;
mod status;
mod stored;
mod target;
mod trace;
mod verification;
pub use audit::{AuditEntry, AuditFilter};
pub use batch::{
    BATCH_TYPE, BatchError, Batching, MAX_BATCH_BYTES, MAX_BATCH_EVENTS, MAX_BATCH_WAIT_MS, batch_envelope, batch_id,
    refused_events,
};
pub use bindings::{PluginBindings, is_slug, split_pinned};
pub use catalog::{Adapter, CatalogOwner, EventType, SchemaValidation, SchemaVersion, TenantSettings, adapter_chain};
pub use cloudevents::{CeAttributes, CeHeaders, CeMode, CloudEvents, encode as encode_cloudevent};
pub use destination::{Destination, EndpointKind, TEMPLATE_PLACEHOLDERS, render_template};
pub use egress::{ClientAuth, EndpointTls, OAuth2, WriteOnly};
pub use filter::{
    FILTER_ROOTS, Filter, FilterError, MAX_FILTER_BYTES, MAX_FILTER_DEPTH, MAX_FILTER_VALUES, Miss, filter_subject,
    json_kind,
};
pub use plugin_settings::*;
pub use portal::{Branding, PortalSession};
pub use replay::*;
pub use sent::{MAX_SENT_BODY, SentRequest, envelope};
pub use status::{DeliveryStatus, EndpointStatus, StateBy, delivery_status};
pub use target::{
    AmqpTarget, HttpSettings, HttpTarget, ListenTarget, NatsTarget, PollTarget, RedisTarget, ShapeError, Target,
};
pub use trace::{TRACEPARENT, TRACESTATE, TraceContext, span_id};
pub use verification::{
    Gate, VERIFICATION_TYPE, VERIFY_RETRY_CAP_MS, VERIFY_RETRY_FIRST_MS, Verification, VerifyState, judge_answer,
};

/// Milliseconds since the Unix epoch: how every instant is stored.
pub type Millis = i64;

/// Why an identifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct IdError(pub String);

const CROCKFORD: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// A new time-ordered id: `prefix_` + 10 chars of milliseconds + 16 random chars.
pub fn new_id(prefix: &str, now: Millis, rng: &mut impl Rng) -> String {
    let mut s = String::with_capacity(prefix.len() + 27);
    s.push_str(prefix);
    s.push('_');
    let t = now.max(0) as u64;
    for i in (0..10).rev() {
        s.push(CROCKFORD[((t >> (i * 5)) & 31) as usize] as char);
    }
    let r: u128 = rng.random();
    for i in 0..16 {
        s.push(CROCKFORD[((r >> (i * 5)) & 31) as usize] as char);
    }
    s
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        /// Maps keyed by the id can be looked up with a stored string (hash and equality
        /// are the string's).
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id!(
    /// A tenant's slug: `[a-z0-9][a-z0-9_-]{0,63}`.
    TenantId
);
string_id!(
    /// An event id, unique per tenant: supplied by the producer or generated (`evt_…`).
    EventId
);
string_id!(
    /// An endpoint id (`ep_…`).
    EndpointId
);
string_id!(
    /// A delivery id (`dlv_…`): one (event, endpoint) pair.
    DeliveryId
);

impl TenantId {
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if ok {
            Ok(Self(s.to_string()))
        } else {
            Err(IdError(format!(
                "{s:?} is not a tenant id (1-64 chars of a-z, 0-9, '_' or '-', starting with a letter or digit)"
            )))
        }
    }
}

impl EventId {
    /// Producer-supplied ids: 1-128 printable ASCII chars without spaces or '/'.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let ok = !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
        if ok {
            Ok(Self(s.to_string()))
        } else {
            Err(IdError(format!("{s:?} is not an event id (1-128 printable ASCII chars without spaces or '/')")))
        }
    }
    pub fn generate(now: Millis, rng: &mut impl Rng) -> Self {
        Self(new_id("evt", now, rng))
    }
}

impl EndpointId {
    pub fn generate(now: Millis, rng: &mut impl Rng) -> Self {
        Self(new_id("ep", now, rng))
    }
    /// Ids come back from URLs and the store; any non-empty string is a candidate to look up.
    pub fn from_stored(s: impl Into<String>) -> Self {
        Self(s.into())
    }
}

impl DeliveryId {
    pub fn generate(now: Millis, rng: &mut impl Rng) -> Self {
        Self(new_id("dlv", now, rng))
    }
    pub fn from_stored(s: impl Into<String>) -> Self {
        Self(s.into())
    }
}

impl EventId {
    pub fn from_stored(s: impl Into<String>) -> Self {
        Self(s.into())
    }
}

impl TenantId {
    pub fn from_stored(s: impl Into<String>) -> Self {
        Self(s.into())
    }
}

/// What a tenant token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scope {
    #[serde(rename = "events:write")]
    EventsWrite,
    #[serde(rename = "read")]
    Read,
    #[serde(rename = "manage")]
    Manage,
    #[serde(rename = "replay")]
    Replay,
    /// Read and acknowledge a `poll` endpoint's deliveries (pull delivery), and nothing else.
    #[serde(rename = "poll")]
    Poll,
}

impl Scope {
    pub const ALL: [Scope; 5] = [Scope::EventsWrite, Scope::Read, Scope::Manage, Scope::Replay, Scope::Poll];
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::EventsWrite => "events:write",
            Scope::Read => "read",
            Scope::Manage => "manage",
            Scope::Replay => "replay",
            Scope::Poll => "poll",
        }
    }
    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
    pub created_at: Millis,
}

/// A stored token: only its hash is kept.
#[derive(Debug, Clone)]
pub struct TokenRecord {
    /// `tok_` and the first 16 hex digits of the hash: names the token in lists and
    /// revocations without revealing it.
    pub id: String,
    pub hash: String,
    pub tenant: TenantId,
    pub scopes: Vec<Scope>,
    pub created_at: Millis,
    /// When it last authenticated a request, to the minute (`None`: never).
    pub last_used_at: Option<Millis>,
}

impl TokenRecord {
    /// A new, never used token with the given sha256 hex `hash`.
    pub fn new(hash: String, tenant: TenantId, scopes: Vec<Scope>, created_at: Millis) -> TokenRecord {
        TokenRecord { id: Self::id_of(&hash), hash, tenant, scopes, created_at, last_used_at: None }
    }

    /// The id of the token whose hash is `hash` (the migrations derive it the same way).
    pub fn id_of(hash: &str) -> String {
        format!("tok_{}", hash.get(..16).unwrap_or(hash))
    }
}

/// One signing secret; during rotation the previous one stays valid until `expires_at`.
/// A `v1` (HMAC) secret is `whsec_…`; a `v1a` (ed25519) key has its `public_key`, and its
/// `secret` is `whsk_…`, or sealed under `[secrets] key` when the node has one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SecretEntry {
    pub secret: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Millis>,
    /// A `v1a` key's `whpk_…` (kept in clear, so it is shown without opening the secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
}

impl SecretEntry {
    /// A `v1` secret (`whsec_…`) valid until replaced.
    pub fn v1(secret: String) -> SecretEntry {
        SecretEntry { secret, expires_at: None, public_key: None }
    }

    /// Is this a `v1a` (ed25519) key rather than a `v1` secret?
    pub fn is_v1a(&self) -> bool {
        self.public_key.is_some()
    }
}

/// The configurable part of an endpoint: the delivery settings every kind shares, and
/// where deliveries go ([`Target`]). Stored as one flat document (`stored::SpecDoc`, the
/// form the API shows too), so documents written before the target was a type still read.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(try_from = "stored::SpecDoc", into = "stored::SpecDoc")]
pub struct EndpointSpec {
    pub description: String,
    pub event_types: Vec<String>,
    /// What an event's content must match, beside `event_types` (`None`: anything).
    pub filter: Option<Filter>,
    pub rate_per_sec: f64,
    pub burst: u32,
    pub max_in_flight: u32,
    pub timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub retry: RetryOverrideDoc,
    pub plugins: PluginBindings,
    /// Sent with every delivery (HTTP headers, or a broker message's).
    pub headers: BTreeMap<String, String>,
    pub secrets: Vec<SecretEntry>,
    /// Deliveries go out one at a time, in intake order, per endpoint or per event key.
    pub ordering: DeliveryOrder,
    /// With `ordering`: whether a dead-lettered head holds its key.
    pub ordering_on_dead: DeadHead,
    /// CloudEvents 1.0 output instead of the Standard Webhooks envelope (`None`: the envelope).
    pub cloudevents: Option<CloudEvents>,
    /// Several events per request (`None`: one event per request).
    pub batch: Option<Batching>,
    /// Pinned payload versions: event type → the version of its schema this endpoint
    /// takes; an event posted against a newer one is converted down by the type's
    /// adapters before anything else shapes it (empty: every payload as posted).
    pub payload_versions: BTreeMap<String, i64>,
    /// Where deliveries go, with the settings of that kind alone.
    pub target: Target,
}

/// The pacing and deadlines of a new endpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub rate_per_sec: f64,
    pub burst: u32,
    pub max_in_flight: u32,
    pub timeout_ms: u64,
    pub connect_timeout_ms: u64,
}

impl EndpointSpec {
    /// A spec that sends to `target`, signed with `secret`, at `limits`: every type, no
    /// description, plugins, headers, ordering or retry override.
    pub fn new(target: Target, secret: String, limits: Limits) -> EndpointSpec {
        let Limits { rate_per_sec, burst, max_in_flight, timeout_ms, connect_timeout_ms } = limits;
        EndpointSpec {
            description: String::new(),
            event_types: Vec::new(),
            filter: None,
            rate_per_sec,
            burst,
            max_in_flight,
            timeout_ms,
            connect_timeout_ms,
            retry: RetryOverrideDoc::default(),
            plugins: PluginBindings::default(),
            headers: BTreeMap::new(),
            secrets: vec![SecretEntry::v1(secret)],
            ordering: DeliveryOrder::None,
            ordering_on_dead: DeadHead::Skip,
            cloudevents: None,
            payload_versions: BTreeMap::new(),
            batch: None,
            target,
        }
    }

    /// The operator's endpoint (`ops`): operational events to `url`, signed with `secret`.
    pub fn operator(url: String, secret: String) -> EndpointSpec {
        let limits =
            Limits { rate_per_sec: 50.0, burst: 50, max_in_flight: 4, timeout_ms: 10_000, connect_timeout_ms: 3_000 };
        EndpointSpec { description: "operator".into(), ..EndpointSpec::new(Target::http(url), secret, limits) }
    }

    /// A test's HTTP endpoint at `url`: 10 per second, 4 in flight, a fixed secret.
    pub fn for_test(url: impl Into<String>) -> EndpointSpec {
        let limits =
            Limits { rate_per_sec: 10.0, burst: 10, max_in_flight: 4, timeout_ms: 10_000, connect_timeout_ms: 3_000 };
        EndpointSpec::new(Target::http(url), "whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0".into(), limits)
    }
}

/// The stored form of a per-endpoint retry override (durations in milliseconds).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RetryOverrideDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

impl RetryOverrideDoc {
    pub fn is_empty(&self) -> bool {
        *self == RetryOverrideDoc::default()
    }
}

/// Whether an endpoint receives deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EndpointState {
    Active,
    Paused,
    Disabled,
}

impl EndpointState {
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointState::Active => "active",
            EndpointState::Paused => "paused",
            EndpointState::Disabled => "disabled",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "active" => Some(Self::Active),
            "paused" => Some(Self::Paused),
            "disabled" => Some(Self::Disabled),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Endpoint {
    pub id: EndpointId,
    pub tenant: TenantId,
    pub spec: EndpointSpec,
    pub state: EndpointState,
    pub state_reason: Option<String>,
    /// While paused: when delivery may resume on its own (`None`: needs a human).
    pub paused_until: Option<Millis>,
    pub failing_since: Option<Millis>,
    /// Where its verification stands (`None`: never tried), when it asks for one.
    pub verification: Option<Verification>,
    /// Kind `listen`: the node that last took its listener's connection, which paces it
    /// from then on (`None`: never connected).
    pub listener: Option<String>,
    /// When `state` last changed (`None`: before Herald kept it).
    pub state_since: Option<Millis>,
    /// Who made that change (`None`: not known).
    pub state_by: Option<StateBy>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Raised by every change to the stored row (a trigger: changes made directly in the
    /// database too); the engine compares it to find which endpoints changed.
    pub version: i64,
}

impl Endpoint {
    /// Does this endpoint subscribe to `event_type`? Exact names and `prefix.*`; an empty
    /// filter subscribes to everything.
    pub fn matches(&self, event_type: &str) -> bool {
        type_filter_matches(&self.spec.event_types, event_type)
    }

    /// Secrets valid at `now` (the current one plus any still in their grace period).
    pub fn valid_secrets(&self, now: Millis) -> impl Iterator<Item = &SecretEntry> {
        self.spec.secrets.iter().filter(move |s| s.expires_at.is_none_or(|t| t > now))
    }

    /// The pause rule: may this endpoint be sent to at `now`, and if not, until when? A
    /// pause with an end is over at that instant; one without waits for a human.
    pub fn sendable_at(&self, now: Millis) -> Sendable {
        match (self.state, self.paused_until) {
            (EndpointState::Active, _) => Sendable::Yes,
            (EndpointState::Paused, Some(until)) if until <= now => Sendable::Yes,
            (EndpointState::Paused, Some(until)) => Sendable::PausedUntil(until),
            (EndpointState::Paused, None) | (EndpointState::Disabled, _) => Sendable::No,
        }
    }
}

/// An endpoint's latest failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastError {
    /// Its category (`classify::failure_categories`).
    pub category: &'static str,
    /// The receiver's HTTP status, if it answered.
    pub status: Option<u16>,
    pub at: Millis,
}

/// Whether an endpoint may be sent to at some instant ([`Endpoint::sendable_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sendable {
    Yes,
    /// Paused until then: it resumes on its own.
    PausedUntil(Millis),
    /// Disabled, or paused until a human resumes it.
    No,
}

/// The start of an attempt's label when its retries were given up (`retry->exhausted`):
/// plain ASCII, for whoever reads it. Attempts recorded before were labelled `retry→…`;
/// [`ascii_label`] reads them in today's words.
pub const GAVE_UP: &str = "retry->";

/// An attempt's recorded label in today's words: an older `retry→exhausted` reads as
/// `retry->exhausted`.
pub fn ascii_label(label: String) -> String {
    match label.strip_prefix("retry\u{2192}") {
        Some(rest) => format!("{GAVE_UP}{rest}"),
        None => label,
    }
}

/// The classes of dead-letter reasons, the one vocabulary of the API's `reason` filter,
/// the metrics' `reason` label and the console: a reason is its class (`exhausted`) or its
/// class and a detail (`permanent:404`); a reason of no other class is `other`.
pub const DEAD_REASON_CLASSES: [&str; 8] = [
    "exhausted",
    "expired",
    "permanent",
    "endpoint_disabled",
    "retry_after_beyond_deadline",
    "plugin",
    "dropped",
    "other",
];

/// The index in [`DEAD_REASON_CLASSES`] of a dead-letter reason's class: the part before
/// its first `:` (`permanent:404` → `permanent`), `other` for anything else.
pub fn dead_reason_class(reason: &str) -> usize {
    let class = reason.split(':').next().unwrap_or("");
    DEAD_REASON_CLASSES.iter().position(|r| *r == class).unwrap_or(DEAD_REASON_CLASSES.len() - 1)
}

/// A change to an endpoint's `failing_since`: when its deliveries started failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failing {
    /// It stays as it is.
    Unchanged,
    /// It has been failing since then.
    Since(Millis),
    /// It delivers again: no longer failing.
    Recovered,
}

impl Failing {
    /// Does it change the stored value?
    pub fn changes(self) -> bool {
        self != Failing::Unchanged
    }

    /// The stored `failing_since` once changed (`None`: not failing).
    pub fn since(self) -> Option<Millis> {
        match self {
            Failing::Since(t) => Some(t),
            Failing::Unchanged | Failing::Recovered => None,
        }
    }
}

impl Endpoint {
    /// A new, active endpoint with a spec the caller has validated.
    pub fn new(id: EndpointId, tenant: TenantId, spec: EndpointSpec, now: Millis) -> Endpoint {
        Endpoint {
            id,
            tenant,
            spec,
            state: EndpointState::Active,
            state_reason: None,
            paused_until: None,
            failing_since: None,
            verification: None,
            listener: None,
            state_since: Some(now),
            state_by: None,
            created_at: now,
            updated_at: now,
            version: 0,
        }
    }

    /// The verification gate at `now`: open unless it is an HTTP endpoint that asks for
    /// verification (`verify`) and is not verified at its current URL.
    pub fn verify_gate(&self, now: Millis) -> Gate {
        match self.spec.target.as_http() {
            Some(t) if t.verify => verification::gate(self.verification.as_ref(), &t.url, now),
            _ => Gate::Open,
        }
    }

    /// Its verification as shown: the stored one at its current URL, or pending (a new
    /// endpoint, a changed URL); `None` when it does not ask for verification.
    pub fn verification_now(&self) -> Option<Verification> {
        let t = self.spec.target.as_http().filter(|t| t.verify)?;
        Some(match &self.verification {
            Some(v) if v.url == t.url => v.clone(),
            _ => Verification::pending(&t.url),
        })
    }
}

/// Formats milliseconds since the epoch as RFC 3339 (UTC).
pub fn rfc3339(ms: Millis) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

/// Matches an event type against a filter of exact names, `prefix.*` patterns, or `*`.
pub fn type_filter_matches(filter: &[String], event_type: &str) -> bool {
    filter.is_empty()
        || filter.iter().any(|f| {
            f == "*"
                || f == event_type
                || f.strip_suffix(".*").is_some_and(|p| {
                    event_type.len() > p.len() + 1
                        && event_type.starts_with(p)
                        && event_type.as_bytes()[p.len()] == b'.'
                })
        })
}

/// The deliveries a new event fans out to: one per subscriber of its tenant (in the order
/// given) whose event-type filter and content filter match (or the one subscriber it is
/// `only` for), each with a fresh time-ordered id. The payload is parsed once, for the
/// first content filter it meets. Pure; both
/// stores call it inside the transaction that stores the event, so a subscription change
/// and the fan-out never interleave.
pub fn fan_out<'s>(event: &'s NewEvent, subscribers: &'s [Subscriber], rng: &mut impl rand::Rng) -> Vec<FannedOut<'s>> {
    let mut subject = None;
    subscribers
        .iter()
        .filter(|s| match &event.only {
            Some(only) => only.as_str() == s.endpoint,
            None => {
                type_filter_matches(&s.event_types, &event.event_type)
                    && s.filter
                        .as_ref()
                        .is_none_or(|f| f.matches(subject.get_or_insert_with(|| event.filter_subject())))
            }
        })
        .map(|s| FannedOut {
            id: DeliveryId::generate(event.created_at, rng),
            endpoint: s.endpoint.as_str(),
            ordering_key: s.ordering.key_of(event.ordering_key.as_deref()),
            pull: s.pull,
        })
        .collect()
}

impl EndpointSpec {
    /// Its deliveries go out in intake order, one at a time per key.
    pub fn is_ordered(&self) -> bool {
        !self.ordering.is_none()
    }

    /// Ordered, and a dead-lettered head holds its key.
    pub fn dead_heads_block(&self) -> bool {
        self.is_ordered() && self.ordering_on_dead == DeadHead::Block
    }
}

/// An endpoint intake fans out to: what it subscribes to and how its deliveries are ordered.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscriber {
    pub endpoint: String,
    pub event_types: Vec<String>,
    pub filter: Option<std::sync::Arc<Filter>>,
    pub ordering: DeliveryOrder,
    /// Kind `poll`: its deliveries are stored never due (no claim takes them); a consumer
    /// reads them.
    pub pull: bool,
}

/// One delivery [`fan_out`] makes: its id, its endpoint and, on an ordered endpoint, the
/// key it is ordered within.
#[derive(Debug, Clone, PartialEq)]
pub struct FannedOut<'s> {
    pub id: DeliveryId,
    pub endpoint: &'s str,
    pub ordering_key: Option<&'s str>,
    /// Stored never due: a `poll` endpoint's, read by a consumer, never claimed.
    pub pull: bool,
}

/// Whether an endpoint's deliveries go out one at a time in intake order, and within what:
/// the whole endpoint, or each event's `ordering_key` (events without one share the
/// endpoint's default key, `""`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryOrder {
    #[default]
    None,
    Endpoint,
    Key,
}

impl DeliveryOrder {
    /// The key a delivery of an event with `event_key` is ordered within (`None`: unordered).
    pub fn key_of(self, event_key: Option<&str>) -> Option<&str> {
        match self {
            DeliveryOrder::None => None,
            DeliveryOrder::Endpoint => Some(""),
            DeliveryOrder::Key => Some(event_key.unwrap_or("")),
        }
    }

    /// As stored in the endpoint's `ordering` column: `None` for unordered.
    pub fn stored(self) -> Option<&'static str> {
        match self {
            DeliveryOrder::None => None,
            DeliveryOrder::Endpoint => Some("endpoint"),
            DeliveryOrder::Key => Some("key"),
        }
    }

    /// From the endpoint's `ordering` column.
    pub fn from_stored(s: Option<&str>) -> DeliveryOrder {
        match s {
            Some("endpoint") => DeliveryOrder::Endpoint,
            Some("key") => DeliveryOrder::Key,
            _ => DeliveryOrder::None,
        }
    }

    pub fn is_none(&self) -> bool {
        *self == DeliveryOrder::None
    }
}

/// What a dead-lettered head of an ordering key does to the deliveries behind it: they go
/// on (`skip`, the default), or they wait until it is replayed and delivered, or purged
/// (`block`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeadHead {
    #[default]
    Skip,
    Block,
}

impl DeadHead {
    pub fn is_skip(&self) -> bool {
        *self == DeadHead::Skip
    }
}

/// The longest `ordering_key` an event may carry, in bytes.
pub const MAX_ORDERING_KEY: usize = 256;

/// An event's `ordering_key`: 1-256 bytes of visible ASCII (so it shows and logs as written).
/// The error is the reason; the caller puts the field before it.
pub fn validate_ordering_key(k: &str) -> Result<(), String> {
    if !k.is_empty() && k.len() <= MAX_ORDERING_KEY && k.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(format!("must be 1-{MAX_ORDERING_KEY} visible ASCII characters"))
    }
}

/// A validated event type filter entry: `name`, `prefix.*` or `*`.
pub fn validate_type_filter(f: &str) -> Result<(), String> {
    let name = f.strip_suffix(".*").unwrap_or(f);
    if f == "*" || validate_event_type(name).is_ok() {
        Ok(())
    } else {
        Err(format!("{f:?} is not an event type, \"prefix.*\" or \"*\""))
    }
}

/// Event types: 1-128 chars of letters, digits, '.', '_', '-', ':'. The error is the
/// reason; the caller puts the field (`type`, `name`) before it.
pub fn validate_event_type(t: &str) -> Result<(), String> {
    let ok = !t.is_empty()
        && t.len() <= 128
        && t.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'));
    if ok {
        Ok(())
    } else {
        Err(format!("{t:?} is not an event type (1-128 chars of letters, digits, '.', '_', '-' or ':')"))
    }
}

/// An event as the producer posted it, validated, before it is stored.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub tenant: TenantId,
    pub id: EventId,
    pub event_type: String,
    /// The payload bytes exactly as received.
    pub payload: String,
    /// [`event_fingerprint`] of type and payload: tells a repeat from a conflicting reuse
    /// of the same id.
    pub fingerprint: String,
    pub created_at: Millis,
    pub expires_at: Millis,
    /// The key its deliveries to endpoints ordered by `key` are ordered within.
    pub ordering_key: Option<String>,
    /// The producer's trace context (or the one Herald started for it), sent on with
    /// every attempt; stored as its `traceparent` and `tracestate`.
    pub trace: Option<TraceContext>,
    /// The version of its type's schema it was posted against: the latest of the type in
    /// the tenant's catalog at intake (`None`: the type has no schema). An endpoint pinning
    /// an older one gets it converted down (`payload_versions`).
    pub schema_version: Option<i64>,
    /// Deliver to this endpoint of the tenant alone, whatever its event-type filter (a
    /// test send); `None`: to every subscriber whose filter matches.
    pub only: Option<EndpointId>,
}

impl NewEvent {
    /// The event as a content filter sees it ([`filter_subject`]). Its payload was checked
    /// at intake; one that does not parse reads as `null`.
    pub fn filter_subject(&self) -> serde_json::Value {
        let data = serde_json::from_str(&self.payload).unwrap_or(serde_json::Value::Null);
        filter_subject(self.id.as_str(), &self.event_type, self.created_at, data)
    }
}

/// The sha256 hex of an event's type and payload bytes. A type never contains a newline,
/// so the two parts cannot be confused.
pub fn event_fingerprint(event_type: &str, payload: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(event_type.as_bytes());
    h.update(b"\n");
    h.update(payload.as_bytes());
    hex::encode(h.finalize())
}

#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub id: EventId,
    #[serde(skip)]
    pub tenant: TenantId,
    #[serde(rename = "type")]
    pub event_type: String,
    #[serde(skip)]
    pub payload: String,
    pub created_at: Millis,
    pub expires_at: Millis,
    /// The version of its type's schema it was posted against (`None`: no schema).
    pub schema_version: Option<i64>,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    Queued,
    Delivering,
    Waiting,
    Delivered,
    Dead,
    Paused,
}

impl DeliveryState {
    pub const ALL: [DeliveryState; 6] = [
        DeliveryState::Queued,
        DeliveryState::Delivering,
        DeliveryState::Waiting,
        DeliveryState::Delivered,
        DeliveryState::Dead,
        DeliveryState::Paused,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Queued => "queued",
            DeliveryState::Delivering => "delivering",
            DeliveryState::Waiting => "waiting",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Dead => "dead",
            DeliveryState::Paused => "paused",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }
    /// Still to be sent (a retry, a re-queue): such a result settles against its endpoint's
    /// state when it is recorded (dead on a disabled endpoint, paused on a paused one).
    pub fn is_unfinished(self) -> bool {
        matches!(self, DeliveryState::Waiting | DeliveryState::Queued)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Delivery {
    pub id: DeliveryId,
    #[serde(skip)]
    pub tenant: TenantId,
    pub event_id: EventId,
    pub endpoint_id: EndpointId,
    pub event_type: String,
    pub state: DeliveryState,
    pub attempts: u32,
    pub next_attempt_at: Option<Millis>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// One HTTP attempt of a delivery.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    pub id: String,
    pub delivery_id: DeliveryId,
    pub number: u32,
    pub started_at: Millis,
    pub duration_ms: u64,
    pub status: Option<u16>,
    pub response_body: Option<String>,
    pub error: Option<String>,
    pub verdict: String,
    pub decided_by: String,
    /// What was sent; `None` when nothing was (a plugin dropped the delivery or failed
    /// before sending) and for attempts recorded before Herald kept it.
    #[serde(skip)]
    pub request: Option<SentRequest>,
}

#[cfg(test)]
mod tests;
