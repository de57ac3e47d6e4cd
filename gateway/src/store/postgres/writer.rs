//! The Postgres store's write path: one group commit is one transaction of array-bound
//! (`UNNEST`) multi-row statements, claims `FOR UPDATE SKIP LOCKED`, and intake's
//! `NOTIFY`. It differs from SQLite's on purpose (round trips cost more than statements
//! here); what both share lives in `store::sql` and `store::rows`.

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, Postgres, QueryBuilder, Row};

use super::super::sql;
use super::super::*;
use super::IDS_PER_NOTIFY;
use crate::model::{DeliveryOrder, FannedOut, Subscriber, fan_out};

/// Deadlocks and serialization failures between nodes' commits: the whole batch can be
/// replayed (it was rolled back as a unit).
pub(super) fn is_transient(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40P01" | "40001")))
}

/// Applies the ops in order. Runs of consecutive intakes and of consecutive results are
/// folded into single statements: every statement is a round trip to the server.
pub(super) async fn apply_all(
    conn: &mut PgConnection,
    ops: &[WriteOp],
    channel: &str,
) -> sqlx::Result<Vec<WriteResult>> {
    let mut results = Vec::with_capacity(ops.len());
    let mut i = 0;
    while i < ops.len() {
        match &ops[i] {
            WriteOp::Ingest(_) => {
                let run = run_of(&ops[i..], |op| match op {
                    WriteOp::Ingest(events) => Some(events.as_slice()),
                    _ => None,
                });
                i += run.len();
                ingest_run(conn, &run, channel, &mut results).await?;
            }
            WriteOp::Record(_) => {
                let run = run_of(&ops[i..], |op| match op {
                    WriteOp::Record(results) => Some(results.as_slice()),
                    _ => None,
                });
                i += run.len();
                let all: Vec<&AttemptResult> = run.iter().flat_map(|rs| rs.iter()).collect();
                let mut accepted = record(conn, &all).await?.into_iter();
                for rs in run {
                    results.push(WriteResult::Record(accepted.by_ref().take(rs.len()).collect()));
                }
            }
            WriteOp::Claim(req) => {
                i += 1;
                results.push(WriteResult::Claim(claim(conn, req).await?));
            }
            WriteOp::Release(releases) => {
                i += 1;
                release(conn, releases).await?;
                results.push(WriteResult::Release);
            }
            WriteOp::Endpoint(change) => {
                i += 1;
                results.push(WriteResult::Endpoint(change_endpoint(conn, change).await?));
            }
            WriteOp::Partition(lease) => {
                i += 1;
                results.push(WriteResult::Partition(partition(conn, lease).await?));
            }
        }
    }
    Ok(results)
}

/// The leading ops of one kind, as `pick` sees them.
fn run_of<'a, T: ?Sized>(ops: &'a [WriteOp], pick: impl Fn(&'a WriteOp) -> Option<&'a T>) -> Vec<&'a T> {
    ops.iter().map_while(pick).collect()
}

/// A run of intake requests as one `ingest`, answered per request.
async fn ingest_run(
    conn: &mut PgConnection,
    run: &[&[NewEvent]],
    channel: &str,
    results: &mut Vec<WriteResult>,
) -> sqlx::Result<()> {
    let events: Vec<&NewEvent> = run.iter().flat_map(|evs| evs.iter()).collect();
    match ingest(conn, &events, channel).await? {
        Ok(outcomes) => {
            let mut outcomes = outcomes.into_iter();
            for evs in run {
                results.push(WriteResult::Ingest(outcomes.by_ref().take(evs.len()).collect()));
            }
        }
        // Rare: some request reuses an id with another payload. Its folded run wrote
        // nothing; take the requests one by one so only that one is refused.
        Err(_) => {
            for evs in run {
                let events: Vec<&NewEvent> = evs.iter().collect();
                let outcomes = ingest(conn, &events, channel).await?;
                results.push(WriteResult::Ingest(outcomes.unwrap_or_else(|at| IngestOutcome::refused(evs.len(), at))));
            }
        }
    }
    Ok(())
}

/// Takes, renews or gives up a partition lease; true when `owner` holds it afterwards.
/// A node that commits second waits on the first one's row lock, then sees its lease.
async fn partition(conn: &mut PgConnection, lease: &PartitionLease) -> sqlx::Result<bool> {
    let Some(until) = lease.until else {
        sqlx::query(sql::RELEASE_PARTITION)
            .bind(lease.endpoint.as_str())
            .bind(&lease.owner)
            .execute(&mut *conn)
            .await?;
        return Ok(false);
    };
    let done = sqlx::query(sql::TAKE_PARTITION)
        .bind(lease.endpoint.as_str())
        .bind(&lease.owner)
        .bind(until)
        .bind(lease.now)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

fn decode_error(e: impl std::error::Error + Send + Sync + 'static) -> sqlx::Error {
    sqlx::Error::Decode(Box::new(e))
}

/// Stores new events and fans each out to its tenant's subscribed endpoints, then tells the
/// other nodes which endpoints got work (delivered when the transaction commits). When an
/// event reuses a stored id with another type or payload, it writes nothing and answers
/// `Err(index)` of that event.
async fn ingest(
    conn: &mut PgConnection,
    events: &[&NewEvent],
    channel: &str,
) -> sqlx::Result<Result<Vec<IngestOutcome>, usize>> {
    let subscribers = subscribers(conn, events).await?;
    let fresh = insert_events(conn, events).await?;
    if let Some(at) = first_conflict(conn, events, &fresh).await? {
        delete_fresh(conn, events, &fresh).await?;
        return Ok(Err(at));
    }
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_rng(&mut rand::rng());
    let mut out = Vec::with_capacity(events.len());
    let mut rows: Vec<NewDelivery<'_>> = Vec::new();
    let mut duplicates: Vec<usize> = Vec::new();
    for (i, ev) in events.iter().enumerate() {
        if !fresh[i] {
            duplicates.push(i);
            out.push(IngestOutcome::duplicate(0));
            continue;
        }
        let mut targets = Vec::new();
        let of_tenant = subscribers.get(ev.tenant.as_str()).map(Vec::as_slice).unwrap_or_default();
        for FannedOut { id, endpoint, ordering_key } in fan_out(ev, of_tenant, &mut rng) {
            rows.push((id.to_string(), ev, endpoint, ordering_key));
            targets.push(EndpointId::from_stored(endpoint));
        }
        out.push(IngestOutcome::stored(targets));
    }
    lock_ordering_keys(conn, &rows).await?;
    insert_deliveries(conn, &rows).await?;
    // Counted after this batch's own deliveries are in, so a duplicate within the batch
    // reports the deliveries of its first occurrence.
    count_duplicates(conn, events, &duplicates, &mut out).await?;
    notify(conn, channel, &rows).await?;
    Ok(Ok(out))
}

/// A delivery fanned out from an event: (its id, the event, the endpoint id, its ordering
/// key).
type NewDelivery<'a> = (String, &'a NewEvent, &'a str, Option<&'a str>);

/// Takes a transaction lock on each (endpoint, ordering key) that `rows` add to, in one
/// order (so two intakes never wait on each other in a cycle): an intake of a key on
/// another node waits for this one's commit before it numbers its deliveries, so `seq`
/// follows commit order within a key, and a claim never sees a later delivery of a key
/// before an earlier one.
async fn lock_ordering_keys(conn: &mut PgConnection, rows: &[NewDelivery<'_>]) -> sqlx::Result<()> {
    let mut keys: Vec<String> = rows
        .iter()
        .filter_map(|r| r.3.map(|key| format!("{}\n{key}", r.2)))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if keys.is_empty() {
        return Ok(());
    }
    keys.sort_unstable();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) FROM UNNEST($1::text[]) WITH ORDINALITY AS v(k, n) ORDER BY n")
        .bind(&keys)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The endpoints (id, event types) of the events' tenants that are not disabled, per
/// tenant, oldest first.
async fn subscribers(conn: &mut PgConnection, events: &[&NewEvent]) -> sqlx::Result<HashMap<String, Vec<Subscriber>>> {
    let tenants: Vec<&str> = events.iter().map(|e| e.tenant.as_str()).collect::<HashSet<_>>().into_iter().collect();
    let rows = sqlx::query(sql::SUBSCRIBERS_OF_TENANTS).bind(&tenants).fetch_all(&mut *conn).await?;
    let mut subscribers: HashMap<String, Vec<Subscriber>> = HashMap::new();
    for r in &rows {
        let types: String = r.try_get("event_types")?;
        let event_types: Vec<String> = serde_json::from_str(&types).map_err(decode_error)?;
        let ordering = DeliveryOrder::from_stored(r.try_get::<Option<String>, _>("ordering")?.as_deref());
        let subscriber = Subscriber { endpoint: r.try_get("id")?, event_types, ordering };
        subscribers.entry(r.try_get("tenant_id")?).or_default().push(subscriber);
    }
    Ok(subscribers)
}

/// Inserts the events that are new; per event, whether it was.
async fn insert_events(conn: &mut PgConnection, events: &[&NewEvent]) -> sqlx::Result<Vec<bool>> {
    // ON CONFLICT DO NOTHING returns only inserted rows; UNNEST keeps the batch's order,
    // so the first occurrence of a pair is the one inserted.
    let column = |f: fn(&NewEvent) -> &str| events.iter().map(|e| f(e)).collect::<Vec<&str>>();
    let inserted = sqlx::query(
        "INSERT INTO events (tenant_id, id, type, payload, created_at, expires_at, fingerprint) \
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[], $7::text[]) \
         ON CONFLICT DO NOTHING RETURNING tenant_id, id",
    )
    .bind(column(|e| e.tenant.as_str()))
    .bind(column(|e| e.id.as_str()))
    .bind(column(|e| e.event_type.as_str()))
    .bind(column(|e| e.payload.as_str()))
    .bind(events.iter().map(|e| e.created_at).collect::<Vec<_>>())
    .bind(events.iter().map(|e| e.expires_at).collect::<Vec<_>>())
    .bind(column(|e| e.fingerprint.as_str()))
    .fetch_all(&mut *conn)
    .await?;
    let mut inserted: HashSet<(String, String)> =
        inserted.iter().map(|r| Ok((r.try_get("tenant_id")?, r.try_get("id")?))).collect::<sqlx::Result<_>>()?;
    Ok(events.iter().map(|ev| inserted.remove(&(ev.tenant.to_string(), ev.id.to_string()))).collect())
}

/// Takes back the events this batch inserted (`fresh`).
async fn delete_fresh(conn: &mut PgConnection, events: &[&NewEvent], fresh: &[bool]) -> sqlx::Result<()> {
    let gone: Vec<&&NewEvent> = events.iter().zip(fresh).filter(|(_, f)| **f).map(|(e, _)| e).collect();
    sqlx::query(
        "DELETE FROM events e USING UNNEST($1::text[], $2::text[]) AS v(t, i) WHERE e.tenant_id = v.t AND e.id = v.i",
    )
    .bind(gone.iter().map(|e| e.tenant.as_str()).collect::<Vec<_>>())
    .bind(gone.iter().map(|e| e.id.as_str()).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn insert_deliveries(conn: &mut PgConnection, rows: &[NewDelivery<'_>]) -> sqlx::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO deliveries (id, tenant_id, event_id, endpoint_id, event_type, state, attempts, \
         next_attempt_at, created_at, updated_at, ordering_key) \
         SELECT id, tenant_id, event_id, endpoint_id, event_type, 'queued', 0, at, at, at, ordering_key \
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[], $7::text[]) \
         WITH ORDINALITY AS v(id, tenant_id, event_id, endpoint_id, event_type, at, ordering_key, n) \
         ORDER BY n",
    )
    .bind(rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.1.tenant.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.1.id.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.2).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.1.event_type.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.1.created_at).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.3).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Sets the outcome of each repeated event (`duplicates`, indexes into `events`) to the
/// number of deliveries its stored original has.
async fn count_duplicates(
    conn: &mut PgConnection,
    events: &[&NewEvent],
    duplicates: &[usize],
    out: &mut [IngestOutcome],
) -> sqlx::Result<()> {
    if duplicates.is_empty() {
        return Ok(());
    }
    let counts = sqlx::query(
        "SELECT v.tenant_id, v.event_id, COUNT(d.id) AS n \
         FROM (SELECT DISTINCT * FROM UNNEST($1::text[], $2::text[]) AS u(tenant_id, event_id)) v \
         LEFT JOIN deliveries d ON d.tenant_id = v.tenant_id AND d.event_id = v.event_id \
         GROUP BY v.tenant_id, v.event_id",
    )
    .bind(duplicates.iter().map(|&i| events[i].tenant.as_str()).collect::<Vec<_>>())
    .bind(duplicates.iter().map(|&i| events[i].id.as_str()).collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    let mut n: HashMap<(String, String), i64> = HashMap::new();
    for r in &counts {
        n.insert((r.try_get("tenant_id")?, r.try_get("event_id")?), r.try_get("n")?);
    }
    for &i in duplicates {
        let key = (events[i].tenant.to_string(), events[i].id.to_string());
        out[i].deliveries = n.get(&key).copied().unwrap_or(0) as u32;
    }
    Ok(())
}

/// Tells the other nodes which endpoints got work (delivered when the transaction commits).
async fn notify(conn: &mut PgConnection, channel: &str, rows: &[NewDelivery<'_>]) -> sqlx::Result<()> {
    let mut woken: Vec<&str> = rows.iter().map(|r| r.2).collect::<HashSet<_>>().into_iter().collect();
    woken.sort_unstable();
    notify_woken(conn, channel, &woken).await
}

/// Tells every node (this one too) that `endpoints` got work, when the transaction commits:
/// whichever holds an endpoint's partition claims it then, not at its next refresh.
pub(super) async fn notify_woken(conn: &mut PgConnection, channel: &str, endpoints: &[&str]) -> sqlx::Result<()> {
    for chunk in endpoints.chunks(IDS_PER_NOTIFY) {
        sqlx::query("SELECT pg_notify($1, $2)").bind(channel).bind(chunk.join(",")).execute(&mut *conn).await?;
    }
    Ok(())
}

/// The first event that was not inserted (`fresh`) and whose stored type or payload
/// differ. Reads after the insert, so an event a concurrent transaction committed counts.
async fn first_conflict(conn: &mut PgConnection, events: &[&NewEvent], fresh: &[bool]) -> sqlx::Result<Option<usize>> {
    let repeats: Vec<usize> = (0..events.len()).filter(|&i| !fresh[i]).collect();
    if repeats.is_empty() {
        return Ok(None);
    }
    let rows = sqlx::query(
        "SELECT e.tenant_id, e.id, e.fingerprint, CASE WHEN e.fingerprint IS NULL THEN e.type END AS type, \
         CASE WHEN e.fingerprint IS NULL THEN e.payload END AS payload FROM events e \
         JOIN UNNEST($1::text[], $2::text[]) AS v(t, i) ON e.tenant_id = v.t AND e.id = v.i",
    )
    .bind(repeats.iter().map(|&i| events[i].tenant.as_str()).collect::<Vec<_>>())
    .bind(repeats.iter().map(|&i| events[i].id.as_str()).collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    let mut stored: HashMap<(String, String), String> = HashMap::new();
    for r in &rows {
        let fingerprint =
            crate::store::stored_fingerprint(r.try_get("fingerprint")?, r.try_get("type")?, r.try_get("payload")?);
        stored.insert((r.try_get("tenant_id")?, r.try_get("id")?), fingerprint);
    }
    Ok(repeats.into_iter().find(|&i| {
        let key = (events[i].tenant.to_string(), events[i].id.to_string());
        stored.get(&key).is_some_and(|f| *f != events[i].fingerprint)
    }))
}

/// Leases the due deliveries of one endpoint. Rows another node is claiming or recording
/// right now are skipped, never waited for.
async fn claim(conn: &mut PgConnection, req: &ClaimRequest) -> sqlx::Result<ClaimBatch> {
    let rows = sqlx::query(concat!(
        "WITH picked AS (SELECT d.id FROM deliveries d WHERE d.endpoint_id = $1 AND d.state IN ('queued', 'waiting') \
         AND d.next_attempt_at <= $2 AND (NOT $6 OR EXISTS (SELECT 1 FROM partitions p \
         WHERE p.endpoint_id = $1 AND p.owner = $4 AND p.lease_until >= $2)) AND ",
        sql::is_head!("seq", "$1", "$7"),
        " ORDER BY d.next_attempt_at, d.id LIMIT $3 FOR UPDATE SKIP LOCKED) \
         UPDATE deliveries d SET state = 'delivering', lease_owner = $4, lease_until = $5, fence = d.fence + 1, \
         updated_at = $2 FROM picked, events e \
         WHERE d.id = picked.id AND e.tenant_id = d.tenant_id AND e.id = d.event_id \
         RETURNING d.id, d.tenant_id, d.event_id, d.event_type, d.attempts, d.attempt_base, d.deadline, d.fence, \
         d.next_attempt_at, d.replay_id, \
         e.payload, e.created_at AS event_created_at, e.expires_at"
    ))
    .bind(req.endpoint.as_str())
    .bind(req.now)
    .bind(i64::from(req.limit))
    .bind(&req.owner)
    .bind(req.lease_until)
    .bind(req.in_partition)
    .bind(req.dead_heads_block)
    .fetch_all(&mut *conn)
    .await?;
    let mut claimed = rows
        .iter()
        .map(|r| {
            Ok((
                r.try_get::<i64, _>("next_attempt_at")?,
                Claimed {
                    id: DeliveryId::from_stored(r.try_get::<String, _>("id")?),
                    tenant: TenantId::from_stored(r.try_get::<String, _>("tenant_id")?),
                    event_id: EventId::from_stored(r.try_get::<String, _>("event_id")?),
                    event_type: r.try_get("event_type")?,
                    payload: r.try_get("payload")?,
                    event_created_at: r.try_get("event_created_at")?,
                    expires_at: r.try_get("expires_at")?,
                    attempts: r.try_get::<i64, _>("attempts")? as u32,
                    attempt_base: r.try_get::<i64, _>("attempt_base")? as u32,
                    deadline: r.try_get("deadline")?,
                    replay: r.try_get("replay_id")?,
                    fence: r.try_get("fence")?,
                },
            ))
        })
        .collect::<sqlx::Result<Vec<_>>>()?;
    // RETURNING gives no order guarantee: keep the schedule's.
    claimed.sort_by(|a, b| (a.0, a.1.id.as_str()).cmp(&(b.0, b.1.id.as_str())));
    let claimed: Vec<Claimed> = claimed.into_iter().map(|(_, c)| c).collect();
    let next_due = match claimed.len() < req.limit as usize {
        true => {
            let due = sqlx::query_scalar(sql::NEXT_DUE_POSTGRES).bind(req.endpoint.as_str()).bind(req.dead_heads_block);
            due.fetch_one(&mut *conn).await?
        }
        false => None,
    };
    Ok(ClaimBatch { claimed, next_due })
}

/// Records results whose fence still matches, and their attempts. A delivery appearing
/// twice starts a new statement, so results apply in order as if one by one. Per result:
/// the state it settled in, `None` when refused.
async fn record(conn: &mut PgConnection, results: &[&AttemptResult]) -> sqlx::Result<Vec<Option<DeliveryState>>> {
    let mut accepted = Vec::with_capacity(results.len());
    let mut start = 0;
    while start < results.len() {
        let mut seen = HashSet::new();
        let end = results[start..]
            .iter()
            .position(|r| !seen.insert(r.delivery.as_str()))
            .map_or(results.len(), |n| start + n);
        accepted.extend(record_distinct(conn, &results[start..end]).await?);
        start = end;
    }
    Ok(accepted)
}

async fn record_distinct(
    conn: &mut PgConnection,
    results: &[&AttemptResult],
) -> sqlx::Result<Vec<Option<DeliveryState>>> {
    // An unfinished delivery settles against its endpoint's state at commit time (a
    // concurrent disable or human pause wins over a retry).
    let sql = format!(
        "UPDATE deliveries d SET \
         state = CASE WHEN v.state IN ('waiting', 'queued') THEN {settled} ELSE v.state END, \
         attempts = v.attempts, next_attempt_at = v.next_attempt_at, \
         reason = CASE WHEN v.state IN ('waiting', 'queued') AND {settled} = 'dead' THEN 'endpoint_disabled' \
         ELSE v.reason END, \
         last_status = v.last_status, last_error = v.last_error, lease_owner = NULL, lease_until = NULL, \
         updated_at = v.updated_at \
         FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::int8[], $5::int8[], $6::text[], $7::int8[], \
         $8::text[], $9::int8[]) \
         AS v(id, fence, state, attempts, next_attempt_at, reason, last_status, last_error, updated_at) \
         WHERE d.id = v.id AND d.fence = v.fence AND d.state = 'delivering' RETURNING d.id, d.state",
        settled = sql::settle("d", "v.state"),
    );
    let rows = sqlx::query(&sql)
        .bind(results.iter().map(|r| r.delivery.as_str()).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.fence).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.state.as_str()).collect::<Vec<_>>())
        .bind(results.iter().map(|r| i64::from(r.attempt.number)).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.next_attempt_at).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.reason.as_deref()).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.attempt.status.map(i64::from)).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.attempt.error.as_deref()).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.attempt.started_at + r.attempt.duration_ms as i64).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
    let mut updated: HashMap<String, DeliveryState> = HashMap::with_capacity(rows.len());
    for row in &rows {
        let state =
            super::super::rows::delivery_state(row.try_get("state")?).map_err(|e| sqlx::Error::Decode(e.into()))?;
        updated.insert(row.try_get("id")?, state);
    }
    let accepted: Vec<Option<DeliveryState>> =
        results.iter().map(|r| updated.get(r.delivery.as_str()).copied()).collect();
    let attempts: Vec<&Attempt> =
        results.iter().zip(&accepted).filter(|(_, settled)| settled.is_some()).map(|(r, _)| &r.attempt).collect();
    if !attempts.is_empty() {
        sqlx::query(
            "INSERT INTO attempts (id, delivery_id, number, started_at, duration_ms, status, response_body, \
             error, verdict, decided_by, request_headers, request_body, request_body_size, endpoint_id) \
             SELECT v.*, (SELECT endpoint_id FROM deliveries d WHERE d.id = v.delivery_id) \
             FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[], $6::int8[], \
             $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::int8[]) \
             AS v(id, delivery_id, number, started_at, duration_ms, status, response_body, error, verdict, decided_by, \
             request_headers, request_body, request_body_size)",
        )
        .bind(attempts.iter().map(|a| a.id.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.delivery_id.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| i64::from(a.number)).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.started_at).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.duration_ms as i64).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.status.map(i64::from)).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.response_body.as_deref()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.error.as_deref()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.verdict.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.decided_by.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.request.as_ref().map(|r| r.headers_json.as_str())).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.request.as_ref().and_then(|r| r.body.as_deref())).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.request.as_ref().map(|r| r.body_size as i64)).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
    }
    Ok(accepted)
}

/// Hands claimed deliveries back (fenced), settling them against their endpoint's state;
/// those of a replay cancelled meanwhile are dead letters again, as they were.
async fn release(conn: &mut PgConnection, releases: &[Release]) -> sqlx::Result<()> {
    if releases.is_empty() {
        return Ok(());
    }
    let settled = sql::settle("d", "'waiting'");
    let released = sqlx::query(&format!(
        "UPDATE deliveries d SET state = {settled}, next_attempt_at = v.at, lease_owner = NULL, \
         lease_until = NULL, reason = CASE WHEN {settled} = 'dead' THEN 'endpoint_disabled' END \
         FROM UNNEST($1::text[], $2::int8[], $3::int8[]) AS v(id, fence, at) \
         WHERE d.id = v.id AND d.fence = v.fence AND d.state = 'delivering' RETURNING d.id, d.replay_id"
    ))
    .bind(releases.iter().map(|r| r.delivery.as_str()).collect::<Vec<_>>())
    .bind(releases.iter().map(|r| r.fence).collect::<Vec<_>>())
    .bind(releases.iter().map(|r| r.next_attempt_at).collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    let mut replayed = Vec::new();
    for row in &released {
        if row.try_get::<Option<String>, _>("replay_id")?.is_some() {
            replayed.push(row.try_get::<String, _>("id")?);
        }
    }
    if !replayed.is_empty() {
        let now = releases.iter().map(|r| r.next_attempt_at).max().unwrap_or_default();
        sqlx::query(&sql::return_unsent("id = ANY($2)")).bind(now).bind(&replayed).execute(&mut *conn).await?;
    }
    Ok(())
}

async fn change_endpoint(conn: &mut PgConnection, c: &EndpointChange) -> sqlx::Result<u64> {
    if c.state == Some(EndpointState::Active) {
        sqlx::query(sql::DUE_AT_LIFTED_PAUSE).bind(c.now).bind(c.endpoint.as_str()).execute(&mut *conn).await?;
    }
    let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new("UPDATE endpoints SET updated_at = ");
    q.push_bind(c.now);
    if let Some(state) = c.state {
        q.push(", state = ")
            .push_bind(state.as_str())
            .push(", state_reason = ")
            .push_bind(c.reason.clone())
            .push(", paused_until = ")
            .push_bind(c.paused_until);
    }
    if c.failing_since.changes() {
        q.push(", failing_since = ").push_bind(c.failing_since.since());
    }
    q.push(" WHERE id = ").push_bind(c.endpoint.as_str());
    q.build().execute(&mut *conn).await?;
    let cascade = match (c.state, c.paused_until) {
        (None, _) | (Some(EndpointState::Paused), Some(_)) => return Ok(0),
        (Some(EndpointState::Disabled), _) => sql::DEAD_ON_DISABLED_ENDPOINT,
        (Some(EndpointState::Paused), None) => sql::PAUSE_DELIVERIES,
        (Some(EndpointState::Active), _) => sql::RESUME_DELIVERIES,
    };
    let affected =
        sqlx::query(cascade).bind(c.now).bind(c.endpoint.as_str()).execute(&mut *conn).await?.rows_affected();
    Ok(affected)
}
