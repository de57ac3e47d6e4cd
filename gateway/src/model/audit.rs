//! The audit log's record: who changed what through the API, when and from where. Pure:
//! nothing here reads a store or a clock. An entry names the fields a write set, never
//! their values, so no secret (signing secret, OAuth2 client secret, broker password, TLS
//! key, token) can reach it.

use super::{Millis, TenantId};

/// One write through the API, as the audit log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// `au_` and a time-ordered id: newer entries sort after older ones.
    pub id: String,
    pub at: Millis,
    /// `admin`, `token:<token id>`, `portal:<session id>`, or `anonymous` (a portal link's
    /// exchange, which no token authenticates).
    pub actor: String,
    /// The tenant the write is about (`None`: an operator-wide write).
    pub tenant: Option<TenantId>,
    /// The method and the route's path template: `PATCH /v1/tenants/{tenant}/endpoints/{id}`.
    pub route: String,
    /// What kind of resource: `endpoint`, `token`, `event-type`, `tenant`, `branding`…
    pub kind: String,
    /// The resource's id (for a create, the new one's), when it has one.
    pub resource: Option<String>,
    /// The names of the fields the request set (top-level keys of its JSON body); never a
    /// value.
    pub fields: Vec<String>,
    /// The address the request came from.
    pub client: Option<String>,
}

/// What an audit listing selects: every field is an equality filter except the time range
/// (`since` inclusive, `until` exclusive); `before` is the cursor (entries older than it).
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub tenant: Option<TenantId>,
    pub actor: Option<String>,
    pub kind: Option<String>,
    pub resource: Option<String>,
    /// Only entries about one of these resources (an empty list: none); a portal session
    /// sees its endpoints' entries only.
    pub resources: Option<Vec<String>>,
    pub route: Option<String>,
    pub since: Option<Millis>,
    pub until: Option<Millis>,
    pub before: Option<String>,
}
