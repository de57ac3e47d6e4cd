//! SQL both backends share: every statement both drivers run (sqlx on Postgres, rusqlite on
//! SQLite's writer thread, sqlx on SQLite's readers), how an unfinished delivery settles
//! against its endpoint's state, and the delivery and dead-letter filters, built once for
//! either dialect ([`Sql`] writes `?` or `$n` itself). What differs on purpose (`SKIP
//! LOCKED`, `UNNEST`, `RETURNING`, group commits) stays in each writer.
//!
//! Statements use `$n`. sqlx binds `$n` by its number on SQLite as on Postgres; rusqlite
//! takes `$n` for a name and numbers names in order of first appearance, so a statement
//! SQLite's writer runs numbers its `$n` in that order (checked by a test below).

use std::fmt::{Display, Write};

use sqlx::error::BoxDynError;
use sqlx::{Arguments, Database, Encode, Type};

use super::{DeliveryFilter, Result, StoreError};
use crate::model::{DEAD_REASON_CLASSES, DeadLetterFilter, TenantId};

/// A statement with its bound values, built piece by piece in either dialect. sqlx's
/// `QueryBuilder` does the same, but code generic over the database cannot drop one it
/// has executed (the borrow checker cannot see that its arguments hold no borrow at drop);
/// this builder is taken apart into text and arguments instead.
pub(super) struct Sql<'a, DB: Database> {
    text: String,
    args: DB::Arguments<'a>,
    /// The first value that failed to encode, reported when the statement is taken.
    failed: Option<BoxDynError>,
}

impl<'a, DB: Database> Sql<'a, DB> {
    pub(super) fn new(text: impl Into<String>) -> Self {
        Sql { text: text.into(), args: Default::default(), failed: None }
    }

    pub(super) fn push(&mut self, text: impl Display) -> &mut Self {
        // Writing to a String cannot fail.
        let _ = write!(self.text, "{text}");
        self
    }

    /// Binds `value` and writes its placeholder.
    pub(super) fn push_bind<T: 'a + Encode<'a, DB> + Type<DB>>(&mut self, value: T) -> &mut Self {
        if let Err(e) = self.args.add(value) {
            self.failed.get_or_insert(e);
        }
        // Writing to a String cannot fail.
        let _ = self.args.format_placeholder(&mut self.text);
        self
    }

    #[cfg(test)]
    pub(super) fn sql(&self) -> &str {
        &self.text
    }

    /// The statement's text and its arguments, for `sqlx::query_with` and friends.
    pub(super) fn take(self) -> Result<(String, DB::Arguments<'a>)> {
        match self.failed {
            Some(e) => Err(StoreError::backend(format!("cannot bind a value: {e}"))),
            None => Ok((self.text, self.args)),
        }
    }
}

/// A new tenant (`$1` id, `$2` name, `$3` created at).
pub(super) const INSERT_TENANT: &str = "INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3)";

/// A new API token (`$4`: its scopes, space-separated).
pub(super) const INSERT_TOKEN: &str =
    "INSERT INTO tokens (id, hash, tenant_id, scopes, created_at) VALUES ($1, $2, $3, $4, $5)";

/// Deletes tenant `$1`'s token `$2`.
pub(super) const REVOKE_TOKEN: &str = "DELETE FROM tokens WHERE tenant_id = $1 AND id = $2";

/// Token `$2` authenticated a request at `$1`: its last use never moves backwards.
pub(super) const TOUCH_TOKEN: &str =
    "UPDATE tokens SET last_used_at = $1 WHERE hash = $2 AND COALESCE(last_used_at, 0) < $1";

/// A new endpoint; `$3` its spec and `$4` its event types, as JSON. Its state is as old
/// as the endpoint (`state_since` is `created_at`, `$9`).
pub(super) const INSERT_ENDPOINT: &str = "INSERT INTO endpoints (id, tenant_id, spec, event_types, state, \
     state_reason, paused_until, failing_since, created_at, updated_at, ordering, state_since) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $9)";

/// At `$1`, endpoint `$6`'s state becomes `$2` (why: `$3`, until `$4`), changed by `$5`
/// (`StateBy`). `state_since` moves only when it enters another status: a second `429`
/// while its pause runs, or a second hold, keeps the time the first one began.
pub(super) const CHANGE_ENDPOINT_STATE: &str = "UPDATE endpoints SET updated_at = $1, state = $2, \
     state_reason = $3, paused_until = $4, state_by = $5, \
     state_since = CASE WHEN state = $2 AND state_by = $5 AND (paused_until IS NULL OR paused_until > $1) \
     THEN state_since ELSE $1 END WHERE id = $6";

/// Replaces endpoint `$5` (of tenant `$6`)'s spec, event types and ordering (`$4`) at `$3`.
pub(super) const UPDATE_ENDPOINT: &str = "UPDATE endpoints SET spec = $1, event_types = $2, updated_at = $3, \
     ordering = $4 WHERE id = $5 AND tenant_id = $6";

/// Stores endpoint `$2`'s verification (`$1`, JSON).
pub(super) const PUT_VERIFICATION: &str = "UPDATE endpoints SET verification = $1 WHERE id = $2";
/// Pins endpoint `$2`'s listener to node `$1`; a pin already there changes nothing (no new
/// version, so the other nodes re-read nothing).
pub(super) const PUT_LISTENER: &str =
    "UPDATE endpoints SET listener = $1 WHERE id = $2 AND (listener IS NULL OR listener <> $1)";

/// Deletes endpoint `$1` of tenant `$2`; then [`DEAD_ON_DELETED_ENDPOINT`], in the same transaction.
pub(super) const DELETE_ENDPOINT: &str = "DELETE FROM endpoints WHERE id = $1 AND tenant_id = $2";

/// At `$1`, the unfinished deliveries of deleted endpoint `$2` become dead letters.
pub(super) const DEAD_ON_DELETED_ENDPOINT: &str = "UPDATE deliveries SET state = 'dead', \
     reason = 'endpoint_deleted', next_attempt_at = NULL, lease_owner = NULL, lease_until = NULL, updated_at = $1 \
     WHERE endpoint_id = $2 AND state IN ('queued', 'waiting', 'paused', 'delivering')";

// The three endpoint-state cascades: at `$1`, endpoint `$2`'s deliveries not leased follow
// its new state. A delivery leased meanwhile settles when its result or release is
// recorded ([`settle`]).

/// Disabled: they become dead letters.
pub(super) const DEAD_ON_DISABLED_ENDPOINT: &str = "UPDATE deliveries SET state = 'dead', \
     reason = 'endpoint_disabled', next_attempt_at = NULL, updated_at = $1 \
     WHERE endpoint_id = $2 AND state IN ('queued', 'waiting', 'paused')";

/// Paused for a human (no `paused_until`): they wait, paused. A `poll` endpoint's (never
/// due) are its consumer's to read whatever the endpoint's state: a pause holds pushes only.
pub(super) const PAUSE_DELIVERIES: &str = "UPDATE deliveries SET state = 'paused', updated_at = $1 \
     WHERE endpoint_id = $2 AND state IN ('queued', 'waiting') AND next_attempt_at IS NOT NULL";

/// Active again: the paused ones are due now.
pub(super) const RESUME_DELIVERIES: &str = "UPDATE deliveries SET state = 'waiting', next_attempt_at = $1, \
     updated_at = $1 WHERE endpoint_id = $2 AND state = 'paused'";

/// At `$1`, every timed pause (a 429's `Retry-After`, `pause {"for": …}`) that has run out
/// ends: the endpoint is active again (since the pause's end), its reason cleared. Its
/// deliveries were never paused (they wait, due at the pause's end), so nothing cascades.
/// A pause made longer or turned into a human's meanwhile is not touched.
pub(super) const END_TIMED_PAUSES: &str = "UPDATE endpoints SET state = 'active', state_reason = NULL, \
     state_since = paused_until, state_by = NULL, paused_until = NULL, updated_at = $1 \
     WHERE state = 'paused' AND paused_until IS NOT NULL AND paused_until <= $1 RETURNING tenant_id, id";

/// Takes or renews endpoint `$1`'s partition lease for `$2` until `$3`: if it is free,
/// already `$2`'s, or expired at `$4`. One row changed: `$2` holds it.
pub(super) const TAKE_PARTITION: &str = "INSERT INTO partitions (endpoint_id, owner, lease_until) \
     VALUES ($1, $2, $3) ON CONFLICT (endpoint_id) \
     DO UPDATE SET owner = excluded.owner, lease_until = excluded.lease_until \
     WHERE partitions.owner = excluded.owner OR partitions.lease_until < $4";

/// Gives up endpoint `$1`'s partition lease, if `$2` holds it.
pub(super) const RELEASE_PARTITION: &str = "DELETE FROM partitions WHERE endpoint_id = $1 AND owner = $2";

/// The heads of endpoint `$endpoint`'s keys (bound parameters): column `$col` of each key's
/// first unfinished delivery in intake order (`$order`: `rowid` on SQLite, `seq` on
/// Postgres), dead ones counting while bound parameter `$block` says dead heads block. A
/// loose index scan of `deliveries_ordered` steps from key to key (`MIN(ordering_key) > the
/// last`), then takes each key's first row, so it costs about keys × log n, however deep one
/// key's backlog (a `GROUP BY` read every row: 3 ms of CPU per delivery on a 10k-deep key).
/// A claim joins the heads to `deliveries` by `$col` (`rowid`, `id`: a key lookup each) and
/// keeps those due, rather than filtering the endpoint's due deliveries by them, which read
/// the whole backlog of a deep key (issue 53). A macro, so that each statement using it is
/// one constant.
macro_rules! heads {
    ($order:literal, $col:literal, $endpoint:literal, $block:literal) => {
        concat!(
            "WITH RECURSIVE k(ordering_key) AS (SELECT MIN(o.ordering_key) FROM deliveries o \
             WHERE o.endpoint_id = ",
            $endpoint,
            " AND o.ordering_key IS NOT NULL AND o.state IN ('queued', 'waiting', 'delivering', 'dead') \
             UNION ALL SELECT (SELECT MIN(o.ordering_key) FROM deliveries o WHERE o.endpoint_id = ",
            $endpoint,
            " AND o.ordering_key IS NOT NULL AND o.ordering_key > k.ordering_key \
             AND o.state IN ('queued', 'waiting', 'delivering', 'dead')) FROM k WHERE k.ordering_key IS NOT NULL) \
             SELECT (SELECT o.",
            $col,
            " FROM deliveries o WHERE o.endpoint_id = ",
            $endpoint,
            " AND o.ordering_key = k.ordering_key AND o.ordering_key IS NOT NULL \
             AND o.state IN ('queued', 'waiting', 'delivering', 'dead') AND (o.state <> 'dead' OR ",
            $block,
            ") ORDER BY o.",
            $order,
            " LIMIT 1) FROM k WHERE k.ordering_key IS NOT NULL"
        )
    };
}
pub(super) use heads;

/// Endpoint `$endpoint`'s unordered waiting deliveries: the rows of `deliveries_due` under
/// its NULL key, selecting `$select`. The caller adds its terms and orders by
/// `d.ordering_key, d.next_attempt_at` (the key is NULL in every row here; leading with it
/// lets Postgres read the index in order rather than sort the backlog).
macro_rules! keyless {
    ($select:literal, $endpoint:literal) => {
        concat!(
            "SELECT ",
            $select,
            " FROM deliveries d WHERE d.endpoint_id = ",
            $endpoint,
            " AND d.ordering_key IS NULL AND d.state IN ('queued', 'waiting')"
        )
    };
}
pub(super) use keyless;

/// The earliest due time of endpoint `$1`'s waiting deliveries that may go out: its
/// unordered ones' and its keys' heads' (`$2`: dead heads block), on each backend.
macro_rules! next_due {
    ($order:literal, $col:literal) => {
        concat!(
            "SELECT MIN(u.at) FROM (SELECT f.at FROM (",
            keyless!("d.next_attempt_at AS at", "$1"),
            " ORDER BY d.ordering_key, d.next_attempt_at LIMIT 1) f \
             UNION ALL SELECT d.next_attempt_at FROM deliveries d WHERE d.",
            $col,
            " IN (",
            heads!($order, $col, "$1", "$2"),
            ") AND d.state IN ('queued', 'waiting')) u"
        )
    };
}
pub(super) const NEXT_DUE_SQLITE: &str = next_due!("rowid", "rowid");
pub(super) const NEXT_DUE_POSTGRES: &str = next_due!("seq", "id");

/// Pull delivery. A `poll` endpoint's deliveries are ordered by their position `seq` (SQLite's
/// rowid, Postgres' `seq`): the order their intakes committed in (one writer on SQLite; on
/// Postgres, intakes to one `poll` endpoint take its lock before they number their rows, as
/// an ordered key's do), so a read never sees a later one before an earlier one.
///
/// The unsettled deliveries of a `poll` endpoint: stored never due (the terms of the
/// index `deliveries_pull`, as it is written, so both backends use it).
macro_rules! unsettled_pull {
    ($d:literal) => {
        concat!($d, "state IN ('queued', 'waiting') AND ", $d, "next_attempt_at IS NULL")
    };
}

/// A page: up to `$3` of endpoint `$1`'s unsettled deliveries after position `$2`, in
/// order, with their events.
pub(super) fn poll_page(seq: &str) -> String {
    format!(
        "SELECT d.{seq} AS position, d.id, d.event_id, d.event_type, e.payload, e.created_at \
         FROM deliveries d JOIN events e ON e.tenant_id = d.tenant_id AND e.id = d.event_id \
         WHERE d.endpoint_id = $1 AND {} AND d.{seq} > $2 ORDER BY d.{seq} LIMIT $3",
        unsettled_pull!("d.")
    )
}

/// The position of endpoint `$1`'s delivery `$2`, while it is stored (settled or not).
pub(super) fn poll_position(seq: &str) -> String {
    format!("SELECT {seq} FROM deliveries WHERE endpoint_id = $1 AND id = $2")
}

/// What an acknowledgement settles, a batch at a time: up to `$3` of endpoint `$1`'s
/// unsettled deliveries at positions up to `$2`, in order.
pub(super) fn poll_acked(seq: &str) -> String {
    format!(
        "SELECT id FROM deliveries WHERE endpoint_id = $1 AND {} AND {seq} <= $2 ORDER BY {seq} LIMIT $3",
        unsettled_pull!("")
    )
}

/// Delivery `$2`, acknowledged by its consumer at `$1`: delivered, as a push that got a 2xx.
pub(super) const ACK_DELIVERED: &str = "UPDATE deliveries SET state = 'delivered', attempts = attempts + 1, \
     next_attempt_at = NULL, lease_owner = NULL, lease_until = NULL, last_status = NULL, last_error = NULL, \
     updated_at = $1 WHERE id = $2 AND state IN ('queued', 'waiting') AND next_attempt_at IS NULL";

/// The attempt an acknowledgement records (`$1`) of delivery `$3` at `$2`: its number the
/// delivery's attempts (counted by [`ACK_DELIVERED`]), decided by `poll`.
pub(super) const ACK_ATTEMPT: &str = "INSERT INTO attempts (id, started_at, delivery_id, number, duration_ms, \
     verdict, decided_by, endpoint_id) SELECT $1, $2, id, attempts, 0, 'delivered', 'poll', endpoint_id \
     FROM deliveries WHERE id = $3";

/// The endpoints intake fans out to: every one not disabled (a paused one's deliveries
/// wait). A macro, so that both subscriber queries are whole constants.
macro_rules! subscribed {
    () => {
        "state <> 'disabled'"
    };
}

/// Tenant `$1`'s endpoints intake fans out to: (id, event types, ordering, content filter
/// as JSON text or NULL, whether it is kind `poll`). SQLite's writer reads them per tenant,
/// once per commit.
pub(super) const SUBSCRIBERS_OF_TENANT: &str = concat!(
    "SELECT id, event_types, ordering, json_extract(spec, '$.filter'), COALESCE(json_extract(spec, '$.kind'), '') = 'poll' \
     FROM endpoints WHERE tenant_id = $1 AND ",
    subscribed!()
);

/// The endpoints intake fans out to of the tenants in array `$1`, oldest first: (tenant,
/// id, event types, ordering, content filter as JSON text or NULL, whether it is kind
/// `poll`). Postgres reads them per group commit, in one round trip.
pub(super) const SUBSCRIBERS_OF_TENANTS: &str = concat!(
    "SELECT tenant_id, id, event_types, ordering, spec::json ->> 'filter' AS filter, \
     COALESCE(spec::json ->> 'kind', '') = 'poll' AS pull FROM endpoints WHERE tenant_id = ANY($1) AND ",
    subscribed!(),
    " ORDER BY created_at, id"
);

/// Replaces the settings of tenant `$1`'s plugin `$2` (JSON `$3`) at `$4`.
pub(super) const UPSERT_PLUGIN_SETTINGS: &str = "INSERT INTO plugin_settings (tenant_id, plugin, settings, \
     updated_at) VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id, plugin) \
     DO UPDATE SET settings = excluded.settings, updated_at = excluded.updated_at";

/// A new event type (`$1` owner, `$2` name, `$3` description, `$4` deprecated, `$5` examples
/// JSON, `$6` latest schema version, `$7` created and updated at, `$8` adapters JSON).
pub(super) const INSERT_EVENT_TYPE: &str = "INSERT INTO event_types (owner, name, description, deprecated, \
     examples, version, created_at, updated_at, adapters) VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8)";

/// Replaces event type (`$7` owner, `$8` name)'s fields at `$5` (`$6`: its adapters JSON),
/// if its latest schema version is still `$9` (two writers cannot both number version n+1).
pub(super) const UPDATE_EVENT_TYPE: &str = "UPDATE event_types SET description = $1, deprecated = $2, \
     examples = $3, version = $4, updated_at = $5, adapters = $6 WHERE owner = $7 AND name = $8 AND version = $9";

/// Schema version `$3` (`$4` JSON) of event type (`$1` owner, `$2` name), at `$5`.
pub(super) const INSERT_SCHEMA_VERSION: &str =
    "INSERT INTO event_type_schemas (owner, name, version, schema, created_at) VALUES ($1, $2, $3, $4, $5)";

/// Deletes event type (`$1` owner, `$2` name); then [`DELETE_SCHEMA_VERSIONS`].
pub(super) const DELETE_EVENT_TYPE: &str = "DELETE FROM event_types WHERE owner = $1 AND name = $2";

/// Deletes every schema version of event type (`$1` owner, `$2` name).
pub(super) const DELETE_SCHEMA_VERSIONS: &str = "DELETE FROM event_type_schemas WHERE owner = $1 AND name = $2";

/// Sets tenant `$1`'s `schema_validation` to `$2` and `verify_endpoints` to `$3` at `$4`.
pub(super) const UPSERT_TENANT_SETTINGS: &str = "INSERT INTO catalog_settings (tenant_id, schema_validation, \
     verify_endpoints, updated_at) VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id) \
     DO UPDATE SET schema_validation = excluded.schema_validation, verify_endpoints = excluded.verify_endpoints, \
     updated_at = excluded.updated_at";

/// Every catalog write's last statement: tells other nodes' caches something changed.
pub(super) const BUMP_CATALOG_REVISION: &str = "UPDATE catalog_revision SET revision = revision + 1";

/// A new replay.
pub(super) const INSERT_REPLAY: &str = "INSERT INTO replays (id, tenant_id, state, ids, filter, rate_per_sec, \
     batch, selected, requeued, cursor, created_at, updated_at, next_due_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";

/// Re-enabling endpoint `$2` at `$1` lifts its timed pause (a 429's `Retry-After`), if it
/// has one: what the pause handed back, due at its end (within a second, as the engine's
/// clock reads it), is due now. Run before the endpoint's `paused_until` is cleared.
pub(super) const DUE_AT_LIFTED_PAUSE: &str = "UPDATE deliveries SET next_attempt_at = $1, updated_at = $1 \
     WHERE endpoint_id = $2 AND state IN ('queued', 'waiting') AND next_attempt_at > $1 \
     AND next_attempt_at - (SELECT paused_until FROM endpoints WHERE id = $2) BETWEEN -1000 AND 1000";

/// Gives up every partition lease `$1` holds: a node whose attempts have all recorded their
/// results (a drained shutdown), so a node that follows (its own restart, or another node)
/// paces those endpoints at once instead of waiting out the lease.
pub(super) const RELEASE_PARTITIONS_OF: &str = "DELETE FROM partitions WHERE owner = $1";

/// Returns every delivery leased to `$2` to `waiting`, due at `$1`: the leases of a node
/// id whose previous process is gone (`Housekeeping::recover_leases_of`).
pub(super) const RECOVER_LEASES_OF: &str = "UPDATE deliveries SET state = 'waiting', next_attempt_at = $1, \
     lease_owner = NULL, lease_until = NULL, updated_at = $1 WHERE state = 'delivering' AND lease_owner = $2";

/// Gives up every partition lease: a store one node owns (SQLite) at that node's start,
/// where whoever held them was that node's previous process.
pub(super) const RELEASE_ALL_PARTITIONS: &str = "DELETE FROM partitions";

/// What a delivery row (named `row`) that is not finished becomes, given its endpoint's
/// state right now: dead on a disabled endpoint, paused on an endpoint paused for a human
/// (no `paused_until`), else `wanted` (an SQL expression).
pub(super) fn settle(row: &str, wanted: &str) -> String {
    format!(
        "CASE (SELECT CASE WHEN e.state = 'paused' AND e.paused_until IS NOT NULL THEN 'active' ELSE e.state END \
         FROM endpoints e WHERE e.id = {row}.endpoint_id) \
         WHEN 'disabled' THEN 'dead' WHEN 'paused' THEN 'paused' ELSE {wanted} END"
    )
}

/// The `SET` of a replay re-queueing a dead letter (the row named `row`): due at `due`,
/// retries counted afresh, deadline `deadline`, tied to replay `replay` (SQL expressions).
/// The reason and time it was dead with are kept, for a cancel to put it back as it was
/// ([`return_unsent`]); a disabled endpoint leaves it dead.
pub(super) fn requeue_set(row: &str, due: &str, deadline: &str, replay: &str, now: &str) -> String {
    let settled = settle(row, "'queued'");
    format!(
        "state = {settled}, next_attempt_at = {due}, attempt_base = {row}.attempts, deadline = {deadline}, \
         replay_id = {replay}, prior_reason = {row}.reason, prior_dead_at = {row}.updated_at, \
         reason = CASE WHEN {settled} = 'dead' THEN 'endpoint_disabled' END, updated_at = {now}"
    )
}

/// Puts the deliveries of cancelled replays that were re-queued and not sent since back
/// among the dead letters, as they were before the replay took them (their reason and
/// time; their attempts were never touched). `which`: an SQL condition on `deliveries`
/// naming the rows to look at; `$1`: now, the time of rows re-queued before the prior
/// time was kept. Not for leased rows: a lease holder hands them back first.
pub(super) fn return_unsent(which: &str) -> String {
    format!(
        "UPDATE deliveries SET state = 'dead', reason = COALESCE(prior_reason, 'replay_cancelled'), \
         updated_at = COALESCE(prior_dead_at, $1), next_attempt_at = NULL, lease_owner = NULL, lease_until = NULL \
         WHERE {which} AND state IN ('queued', 'waiting', 'paused') AND attempts = attempt_base \
         AND EXISTS (SELECT 1 FROM replays r WHERE r.id = deliveries.replay_id AND r.state = 'cancelled')"
    )
}

/// [`return_unsent`]'s rows after lease recovery: any of a cancelled replay.
pub(super) const OF_CANCELLED_REPLAYS: &str = "replay_id IN (SELECT id FROM replays WHERE state = 'cancelled')";

/// Cancels running replay `$2` of tenant `$3` at `$1`.
pub(super) const CANCEL_REPLAY: &str =
    "UPDATE replays SET state = 'cancelled', updated_at = $1 WHERE id = $2 AND tenant_id = $3 AND state = 'running'";

/// The endpoints of replay `$1`'s deliveries that a partition has claimed and not sent.
pub(super) const REPLAY_CLAIMED_UNSENT: &str = "SELECT DISTINCT endpoint_id FROM deliveries \
     WHERE replay_id = $1 AND state = 'delivering' AND attempts = attempt_base";

/// How many of replay `$1`'s deliveries are re-queued and not sent (`unsent`), and not
/// settled (`unsettled`, which includes those waiting for a retry and those paused).
pub(super) const REPLAY_OUTSTANDING: &str = "SELECT \
     COUNT(*) FILTER (WHERE attempts = attempt_base AND state IN ('queued', 'waiting', 'delivering')) AS unsent, \
     COUNT(*) AS unsettled FROM deliveries \
     WHERE replay_id = $1 AND state IN ('queued', 'waiting', 'delivering', 'paused')";

/// Moves running replay `$5`'s cursor from `$6` to `$2` past `$1` re-queued at `$3`, and its
/// schedule to `$4`; nothing if it is no longer running at that cursor (cancelled, or
/// another turn moved it first).
pub(super) const ADVANCE_REPLAY: &str = "UPDATE replays SET requeued = requeued + $1, cursor = $2, updated_at = $3, \
     next_due_at = $4 WHERE id = $5 AND state = 'running' AND cursor = $6";

/// Marks running replay `$2` done at `$1` if everything it re-queued has settled.
pub(super) const REPLAY_DONE: &str = "UPDATE replays SET state = 'done', updated_at = $1 \
     WHERE id = $2 AND state = 'running' AND NOT EXISTS (SELECT 1 FROM deliveries \
     WHERE replay_id = $2 AND state IN ('queued', 'waiting', 'delivering', 'paused'))";

/// Restricts a query on `deliveries` (after a `WHERE`) to `f`, ordered by id and limited.
pub(super) fn push_delivery_filter<'a, DB>(q: &mut Sql<'a, DB>, f: &'a DeliveryFilter)
where
    DB: Database,
    &'a str: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
{
    push_delivery_conditions(q, f);
    if let Some(a) = &f.after {
        q.push(if f.newest_first { " AND id < " } else { " AND id > " }).push_bind(a.as_str());
    }
    q.push(if f.newest_first { " ORDER BY id DESC LIMIT " } else { " ORDER BY id LIMIT " });
    q.push_bind(i64::from(f.limit.max(1)));
}

/// What `f` selects, without its page (`after`, order, limit): the conditions a listing
/// and its counts share.
pub(super) fn push_delivery_conditions<'a, DB>(q: &mut Sql<'a, DB>, f: &'a DeliveryFilter)
where
    DB: Database,
    &'a str: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
{
    let text = [
        (" AND tenant_id = ", f.tenant.as_ref().map(|t| t.as_str())),
        (" AND event_id = ", f.event.as_ref().map(|e| e.as_str())),
        (" AND endpoint_id = ", f.endpoint.as_ref().map(|e| e.as_str())),
        (" AND state = ", f.state.map(|s| s.as_str())),
        (" AND event_type = ", f.event_type.as_deref()),
    ];
    for (condition, value) in text {
        if let Some(v) = value {
            q.push(condition).push_bind(v);
        }
    }
    if let Some(only) = &f.endpoints {
        // No endpoint at all selects nothing (`IN ()` is not SQL).
        q.push(if only.is_empty() { " AND 1 = 0" } else { " AND endpoint_id IN (" });
        for (i, e) in only.iter().enumerate() {
            q.push(if i == 0 { "" } else { ", " }).push_bind(e.as_str());
        }
        if !only.is_empty() {
            q.push(")");
        }
    }
    if let Some(reason) = f.reason.as_deref() {
        push_reason(q, "reason", reason);
    }
    push_window(q, "", f.since, f.until);
}

/// ` AND` a dead-letter reason condition on `column`: a class of
/// [`DEAD_REASON_CLASSES`] (`permanent`) matches the class and each of its reasons
/// (`permanent:404`), as the metrics count them; `other`, every reason of no other class;
/// anything else, that reason exactly.
fn push_reason<'a, DB>(q: &mut Sql<'a, DB>, column: &str, reason: &'a str)
where
    DB: Database,
    &'a str: Encode<'a, DB> + Type<DB>,
{
    let (other, classes) = DEAD_REASON_CLASSES.split_last().expect("classes");
    // A class is one of the constants above (no quotes in them): written in the SQL.
    let value = format!("COALESCE({column}, '')");
    let in_class = |c: &str| format!("({value} = '{c}' OR substr({value}, 1, {}) = '{c}:')", c.len() + 1);
    if reason == *other {
        let any: Vec<String> = classes.iter().map(|c| in_class(c)).collect();
        q.push(format_args!(" AND NOT ({})", any.join(" OR ")));
    } else if let Some(c) = classes.iter().find(|c| **c == reason) {
        q.push(format_args!(" AND {}", in_class(c)));
    } else {
        q.push(format_args!(" AND {column} = ")).push_bind(reason);
    }
}

/// Restricts a query on `deliveries` (after a `WHERE`) to a tenant's dead letters selected
/// by explicit ids or a filter, after `cursor` (a delivery id; empty for none).
/// `push_ids` writes the dialect's "id is one of these" predicate.
pub(super) fn push_dead_selection<'a, DB>(
    q: &mut Sql<'a, DB>,
    tenant: &'a TenantId,
    ids: Option<&'a [String]>,
    filter: Option<&'a DeadLetterFilter>,
    cursor: &'a str,
    push_ids: impl FnOnce(&mut Sql<'a, DB>, &'a [String]),
) where
    DB: Database,
    &'a str: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
{
    q.push(" AND deliveries.state = 'dead' AND deliveries.tenant_id = ").push_bind(tenant.as_str());
    if !cursor.is_empty() {
        q.push(" AND deliveries.id > ").push_bind(cursor);
    }
    if let Some(ids) = ids {
        push_ids(q, ids);
    }
    let Some(f) = filter else { return };
    let text = [
        (" AND deliveries.endpoint_id = ", f.endpoint.as_deref()),
        (" AND deliveries.event_type = ", f.event_type.as_deref()),
    ];
    for (condition, value) in text {
        if let Some(v) = value {
            q.push(condition).push_bind(v);
        }
    }
    if let Some(reason) = f.reason.as_deref() {
        push_reason(q, "deliveries.reason", reason);
    }
    push_window(q, "deliveries.", f.since, f.until);
    for (i, s) in f.skipped.iter().enumerate() {
        q.push(if i == 0 { " AND deliveries.endpoint_id NOT IN (" } else { ", " }).push_bind(s.endpoint.as_str());
    }
    if !f.skipped.is_empty() {
        q.push(")");
    }
}

/// `updated_at` in `[since, until)`.
fn push_window<'a, DB>(q: &mut Sql<'a, DB>, prefix: &str, since: Option<i64>, until: Option<i64>)
where
    DB: Database,
    i64: Encode<'a, DB> + Type<DB>,
{
    if let Some(s) = since {
        q.push(format_args!(" AND {prefix}updated_at >= ")).push_bind(s);
    }
    if let Some(u) = until {
        q.push(format_args!(" AND {prefix}updated_at < ")).push_bind(u);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeliveryState, EndpointId};

    #[test]
    fn filters_write_each_condition_once_in_either_dialect() {
        let f = DeliveryFilter {
            tenant: Some(TenantId::from_stored("acme")),
            endpoint: Some(EndpointId::from_stored("ep_1")),
            state: Some(DeliveryState::Dead),
            since: Some(5),
            limit: 10,
            ..Default::default()
        };
        let mut q: Sql<'_, sqlx::Sqlite> = Sql::new("SELECT id FROM deliveries WHERE 1 = 1");
        push_delivery_filter(&mut q, &f);
        assert_eq!(
            q.sql(),
            "SELECT id FROM deliveries WHERE 1 = 1 AND tenant_id = ? AND endpoint_id = ? AND state = ? \
             AND updated_at >= ? ORDER BY id LIMIT ?"
        );
        let mut q: Sql<'_, sqlx::Postgres> = Sql::new("SELECT id FROM deliveries WHERE 1 = 1");
        push_delivery_filter(&mut q, &f);
        assert_eq!(
            q.sql(),
            "SELECT id FROM deliveries WHERE 1 = 1 AND tenant_id = $1 AND endpoint_id = $2 AND state = $3 \
             AND updated_at >= $4 ORDER BY id LIMIT $5"
        );
    }

    /// A portal session's endpoint limit is one `IN` list; a limit of no endpoint selects
    /// nothing (rather than `IN ()`, which is not SQL).
    #[test]
    fn an_endpoint_limit_is_an_in_list() {
        let both = vec![EndpointId::from_stored("ep_1"), EndpointId::from_stored("ep_2")];
        let f = DeliveryFilter { endpoints: Some(both), limit: 5, ..Default::default() };
        let mut q: Sql<'_, sqlx::Postgres> = Sql::new("SELECT id FROM deliveries WHERE 1 = 1");
        push_delivery_filter(&mut q, &f);
        assert_eq!(q.sql(), "SELECT id FROM deliveries WHERE 1 = 1 AND endpoint_id IN ($1, $2) ORDER BY id LIMIT $3");
        let f = DeliveryFilter { endpoints: Some(Vec::new()), limit: 5, ..Default::default() };
        let mut q: Sql<'_, sqlx::Sqlite> = Sql::new("SELECT id FROM deliveries WHERE 1 = 1");
        push_delivery_filter(&mut q, &f);
        assert_eq!(q.sql(), "SELECT id FROM deliveries WHERE 1 = 1 AND 1 = 0 ORDER BY id LIMIT ?");
    }

    /// Every statement SQLite's writer runs from here, as rusqlite prepares it on the
    /// migrated schema: it parses, and its `i`th parameter is `$i`, so that the writer's
    /// positional `params![…]` bind what sqlx binds by number.
    #[test]
    fn statements_the_sqlite_writer_runs_bind_by_number() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/sqlite");
        let mut migrations: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        migrations.sort();
        for m in migrations {
            conn.execute_batch(&std::fs::read_to_string(&m).unwrap()).unwrap();
        }
        let returned = return_unsent("replay_id = $2");
        let statements = [
            INSERT_TENANT,
            INSERT_TOKEN,
            REVOKE_TOKEN,
            TOUCH_TOKEN,
            INSERT_ENDPOINT,
            UPDATE_ENDPOINT,
            DELETE_ENDPOINT,
            DEAD_ON_DELETED_ENDPOINT,
            DEAD_ON_DISABLED_ENDPOINT,
            PAUSE_DELIVERIES,
            RESUME_DELIVERIES,
            TAKE_PARTITION,
            RELEASE_PARTITION,
            RELEASE_PARTITIONS_OF,
            RECOVER_LEASES_OF,
            NEXT_DUE_SQLITE,
            SUBSCRIBERS_OF_TENANT,
            UPSERT_PLUGIN_SETTINGS,
            INSERT_REPLAY,
            DUE_AT_LIFTED_PAUSE,
            CANCEL_REPLAY,
            REPLAY_CLAIMED_UNSENT,
            ADVANCE_REPLAY,
            REPLAY_DONE,
            super::super::portal::INSERT_PORTAL_SESSION,
            super::super::portal::EXCHANGE_PORTAL_CODE,
            super::super::portal::REVOKE_PORTAL_SESSION,
            super::super::portal::UPSERT_BRANDING,
            &returned,
            &poll_page("rowid"),
            &poll_position("rowid"),
            &poll_acked("rowid"),
            ACK_DELIVERED,
            ACK_ATTEMPT,
        ];
        for text in statements {
            let statement = conn.prepare(text).unwrap_or_else(|e| panic!("{e}: {text}"));
            for i in 1..=statement.parameter_count() {
                assert_eq!(statement.parameter_name(i), Some(format!("${i}").as_str()), "{text}");
            }
        }
    }

    #[test]
    fn settle_names_its_row() {
        let s = settle("d", "'waiting'");
        assert!(s.contains("WHERE e.id = d.endpoint_id"), "{s}");
        assert!(s.ends_with("ELSE 'waiting' END"), "{s}");
    }
}
