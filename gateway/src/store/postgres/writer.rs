//! The Postgres store's write path: one group commit is one transaction of array-bound
//! (`UNNEST`) multi-row statements, claims `FOR UPDATE SKIP LOCKED`, and intake's
//! `NOTIFY`. It differs from SQLite's on purpose (round trips cost more than statements
//! here); what both share lives in `store::sql` and `store::rows`.

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, Postgres, QueryBuilder, Row};

use super::super::audit;
use super::super::rows::stored_filter;
use super::super::sql;
use super::super::*;
use super::IDS_PER_NOTIFY;
use crate::model::{DeliveryOrder, FannedOut, Subscriber, fan_out};

/// Deadlocks and serialization failures between nodes' commits: the whole batch can be
/// replayed (it was rolled back as a unit).
pub(super) fn is_transient(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40P01" | "40001")))
}

/// Applies the ops in order, except partition leases, which go first, in endpoint order,
/// and the attempt results, which go last. Runs of consecutive intakes, and all the
/// results, are folded into single statements: every statement is a round trip to the
/// server, and results between intakes would cut their runs.
///
/// Partition leases are the rows several nodes' commits write at once (every node's scan
/// finds the same due endpoints, and a node that stopped leaves all of them free at once).
/// Taken in each commit's own order, two commits locking two rows in opposite orders
/// deadlocked; Postgres found it only after `deadlock_timeout` (1 s), and each replay could
/// meet another: a rolling restart of 3 nodes stopped every delivery for 3 to 7 s. Taken in
/// one order, they only queue behind each other. Going first is safe: a claim checks its
/// lease after it in the same transaction either way, and nothing else reads them.
///
/// Results wait for nothing (see `WriteOp::can_wait`), and a result applied at the end of
/// its commit is one applied in the next commit a little sooner. Each op is numbered in the
/// order of writes (one node's commits apply one at a time), and a claim that took all that
/// was due under its partition lease is told to `handoff` as it is applied, so intake ops
/// after it (in this commit too) lease to the partition.
pub(super) async fn apply_all(
    conn: &mut PgConnection,
    ops: &[WriteOp],
    channel: &str,
    handoff: Option<&dyn Handoff>,
) -> sqlx::Result<Vec<WriteResult>> {
    let mut slots: Vec<Option<WriteResult>> = ops.iter().map(|_| None).collect();
    take_leases(conn, ops, &mut slots).await?;
    let (recorded, others): (Vec<Numbered<'_>>, Vec<Numbered<'_>>) = ops
        .iter()
        .enumerate()
        .filter(|(_, op)| !matches!(op, WriteOp::Partition(_) | WriteOp::Audit(_)))
        .partition(|(_, op)| matches!(op, WriteOp::Record(_)));
    apply_in_order(conn, &others, channel, handoff, &mut slots).await?;
    record_together(conn, &recorded, &mut slots).await?;
    audit_after(conn, ops, &mut slots).await?;
    Ok(slots.into_iter().flatten().collect())
}

/// Stores the audit entries among `ops`, last (they would cut runs of intakes), each only
/// when the op just before it changed something (see [`WriteOp::Audit`]).
async fn audit_after(conn: &mut PgConnection, ops: &[WriteOp], slots: &mut Slots) -> sqlx::Result<()> {
    for (at, op) in ops.iter().enumerate() {
        let WriteOp::Audit(entry) = op else { continue };
        let changed = at.checked_sub(1).and_then(|before| slots[before].as_ref()).is_some_and(WriteResult::changed);
        if changed {
            audit::insert_pg(conn, entry).await?;
        }
        slots[at] = Some(WriteResult::Audit(changed));
    }
    Ok(())
}

/// An op and its place in its commit.
type Numbered<'a> = (usize, &'a WriteOp);

/// A commit's answers, each in its op's place.
type Slots = [Option<WriteResult>];

/// Takes the partition leases among `ops` in endpoint order (see [`apply_all`]).
async fn take_leases(conn: &mut PgConnection, ops: &[WriteOp], slots: &mut Slots) -> sqlx::Result<()> {
    let mut leases: Vec<(usize, &PartitionLease)> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            WriteOp::Partition(lease) => Some((i, lease)),
            _ => None,
        })
        .collect();
    // Stable: two ops on one partition keep their order.
    leases.sort_by(|a, b| a.1.endpoint.as_str().cmp(b.1.endpoint.as_str()));
    for (at, lease) in leases {
        next_op_seq();
        slots[at] = Some(WriteResult::Partition(partition(conn, lease).await?));
    }
    Ok(())
}

/// Applies the ops that are neither leases nor results in their order, each run of
/// consecutive intakes as one [`ingest_run`].
async fn apply_in_order(
    conn: &mut PgConnection,
    ops: &[Numbered<'_>],
    channel: &str,
    handoff: Option<&dyn Handoff>,
    slots: &mut Slots,
) -> sqlx::Result<()> {
    let mut i = 0;
    while i < ops.len() {
        let (at, op) = ops[i];
        let result = match op {
            WriteOp::Ingest(_) => {
                let run = intake_run(&ops[i..]);
                i += run.len();
                let outcomes = ingest_run(conn, &run.iter().map(|r| r.1).collect::<Vec<_>>(), channel, handoff).await?;
                for ((at, _), outcome) in run.iter().zip(outcomes) {
                    slots[*at] = Some(outcome);
                }
                continue;
            }
            WriteOp::Claim(req) => {
                let seq = next_op_seq();
                let (batch, seen_all) = claim(conn, req).await?;
                if let (Some(handoff), true) = (handoff, seen_all) {
                    handoff.claimed(req.endpoint.as_str(), seq, batch.claimed.len());
                }
                WriteResult::Claim(batch)
            }
            WriteOp::Release(releases) => {
                next_op_seq();
                release(conn, releases).await?;
                WriteResult::Release
            }
            WriteOp::Endpoint(change) => {
                next_op_seq();
                WriteResult::Endpoint(change_endpoint(conn, change).await?)
            }
            WriteOp::Partition(_) => unreachable!("partition leases are taken first"),
            WriteOp::Record(_) => unreachable!("results are applied last"),
            WriteOp::Audit(_) => unreachable!("audit entries are stored last"),
        };
        slots[at] = Some(result);
        i += 1;
    }
    Ok(())
}

/// The intake ops at the start of `ops`, up to the first op of another kind.
fn intake_run<'a>(ops: &[Numbered<'a>]) -> Vec<(usize, &'a [NewEvent])> {
    ops.iter()
        .map_while(|(at, op)| match op {
            WriteOp::Ingest(events) => Some((*at, events.as_slice())),
            _ => None,
        })
        .collect()
}

/// The attempt results of every `Record` op in one [`record`], answered per op, each
/// numbered in the order of writes.
async fn record_together(conn: &mut PgConnection, recorded: &[Numbered<'_>], slots: &mut Slots) -> sqlx::Result<()> {
    let runs: Vec<(usize, &[AttemptResult])> = recorded
        .iter()
        .filter_map(|(at, op)| match op {
            WriteOp::Record(rs) => Some((*at, rs.as_slice())),
            _ => None,
        })
        .collect();
    let all: Vec<&AttemptResult> = runs.iter().flat_map(|(_, rs)| rs.iter()).collect();
    let mut accepted = record(conn, &all).await?.into_iter();
    for (at, rs) in runs {
        next_op_seq();
        slots[at] = Some(WriteResult::Record(accepted.by_ref().take(rs.len()).collect()));
    }
    Ok(())
}

/// A run of intake requests as one `ingest`, answered per request, each numbered in the
/// order of writes.
async fn ingest_run(
    conn: &mut PgConnection,
    run: &[&[NewEvent]],
    channel: &str,
    handoff: Option<&dyn Handoff>,
) -> sqlx::Result<Vec<WriteResult>> {
    let mut results = Vec::with_capacity(run.len());
    let seqs: Vec<u64> = run.iter().map(|_| next_op_seq()).collect();
    let numbered = |seq: u64, mut outcomes: Vec<IngestOutcome>| {
        outcomes.iter_mut().for_each(|o| o.seq = seq);
        WriteResult::Ingest(outcomes)
    };
    let events: Vec<&NewEvent> = run.iter().flat_map(|evs| evs.iter()).collect();
    match ingest(conn, &events, channel, handoff).await? {
        Ok(outcomes) => {
            let mut outcomes = outcomes.into_iter();
            for (evs, seq) in run.iter().zip(seqs) {
                results.push(numbered(seq, outcomes.by_ref().take(evs.len()).collect()));
            }
        }
        // Rare: some request reuses an id with another payload. Its folded run wrote
        // nothing; take the requests one by one so only that one is refused.
        Err(_) => {
            for (evs, seq) in run.iter().zip(seqs) {
                let events: Vec<&NewEvent> = evs.iter().collect();
                let outcomes = ingest(conn, &events, channel, handoff).await?;
                results.push(numbered(seq, outcomes.unwrap_or_else(|at| IngestOutcome::refused(evs.len(), at))));
            }
        }
    }
    Ok(results)
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

/// Stores new events and fans each out to its tenant's subscribed endpoints, in one
/// statement; a delivery whose endpoint's partition here takes it (`handoff`) is stored
/// leased to it, as a claim would leave it, when the stored partition lease says this node
/// holds it. Then tells the other nodes which endpoints got work for a claim (delivered
/// when the transaction commits). When an event reuses a stored id with another type or
/// payload, it writes nothing and answers `Err(index)` of that event.
async fn ingest(
    conn: &mut PgConnection,
    events: &[&NewEvent],
    channel: &str,
    handoff: Option<&dyn Handoff>,
) -> sqlx::Result<Result<Vec<IngestOutcome>, usize>> {
    let subscribers = subscribers(conn, events).await?;
    // A pair repeated within the batch is inserted once, at its first occurrence; the
    // repeats are duplicates of it (or conflicts).
    let mut pairs = HashSet::with_capacity(events.len());
    let first: Vec<bool> = events.iter().map(|e| pairs.insert((e.tenant.as_str(), e.id.as_str()))).collect();
    let (rows, fanned) = fan_out_firsts(events, &first, &subscribers, handoff);
    let owner = handoff.map(|h| h.owner());
    lock_ordering_keys(conn, &rows).await?;
    let (inserted, leased) = insert(conn, events, &first, &rows, owner).await?;
    let fresh: Vec<bool> = events.iter().zip(&first).map(|(e, f)| *f && inserted.contains(&key(e))).collect();
    if let Some(at) = first_conflict(conn, events, &fresh).await? {
        delete_fresh(conn, events, &fresh).await?;
        return Ok(Err(at));
    }
    let Answered { mut out, duplicates, mut woken } = answer(events, &first, &fresh, &rows, fanned, &leased);
    // Counted after this batch's own deliveries are in, so a duplicate within the batch
    // reports the deliveries of its first occurrence.
    count_duplicates(conn, events, &duplicates, &mut out).await?;
    woken.sort_unstable();
    woken.dedup();
    notify_woken(conn, channel, &woken).await?;
    Ok(Ok(out))
}

/// The deliveries of each event's first occurrence in the batch (`first`), to its tenant's
/// subscribers, and each such event's range in them. A delivery whose endpoint's partition
/// here takes it (`handoff`) gets a lease until; an ordered one never does: it waits for
/// its turn in the store, and only a claim knows whether it heads its key.
fn fan_out_firsts<'a>(
    events: &[&'a NewEvent],
    first: &[bool],
    subscribers: &'a HashMap<String, Vec<Subscriber>>,
    handoff: Option<&dyn Handoff>,
) -> (Vec<NewDelivery<'a>>, Vec<std::ops::Range<usize>>) {
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_rng(&mut rand::rng());
    let mut rows: Vec<NewDelivery<'_>> = Vec::new();
    let mut fanned: Vec<std::ops::Range<usize>> = Vec::with_capacity(events.len());
    for (ev, _) in events.iter().copied().zip(first).filter(|(_, f)| **f) {
        let start = rows.len();
        let of_tenant = subscribers.get(ev.tenant.as_str()).map(Vec::as_slice).unwrap_or_default();
        for FannedOut { id, endpoint, ordering_key, pull } in fan_out(ev, of_tenant, &mut rng) {
            let until =
                handoff.filter(|_| ordering_key.is_none() && !pull).and_then(|h| h.lease(endpoint, ev.created_at));
            rows.push(NewDelivery { id, event: ev, endpoint, ordering_key, until, pull });
        }
        fanned.push(start..rows.len());
    }
    (rows, fanned)
}

/// What an ingest answers before the duplicates are counted.
struct Answered<'a> {
    /// Per event: its deliveries queued and leased, or a duplicate (of 0 deliveries yet).
    out: Vec<IngestOutcome>,
    /// The events not inserted (`fresh` false), as indexes.
    duplicates: Vec<usize>,
    /// The endpoints that got a queued delivery, for a claim.
    woken: Vec<&'a str>,
}

/// Each event's outcome: of a fresh one, its deliveries (its range of `rows`, from
/// `fanned`) queued or `leased` to this node's partition.
fn answer<'a>(
    events: &[&NewEvent],
    first: &[bool],
    fresh: &[bool],
    rows: &[NewDelivery<'a>],
    fanned: Vec<std::ops::Range<usize>>,
    leased: &HashSet<String>,
) -> Answered<'a> {
    let mut answered = Answered { out: Vec::with_capacity(events.len()), duplicates: Vec::new(), woken: Vec::new() };
    let mut fanned = fanned.into_iter();
    for (i, ev) in events.iter().enumerate() {
        let range = if first[i] { fanned.next().unwrap_or_default() } else { 0..0 };
        if !fresh[i] {
            answered.duplicates.push(i);
            answered.out.push(IngestOutcome::duplicate(0));
            continue;
        }
        let (mut queued, mut handed) = (Vec::new(), Vec::new());
        for row in &rows[range] {
            let endpoint = EndpointId::from_stored(row.endpoint);
            match leased.contains(row.id.as_str()) {
                true => handed.push((endpoint, Claimed::new_leased(row.id.clone(), ev))),
                false => {
                    answered.woken.push(row.endpoint);
                    queued.push(endpoint);
                }
            }
        }
        answered.out.push(IngestOutcome::stored_leased(queued, handed));
    }
    answered
}

/// A delivery fanned out from an event, the key it is ordered within (`None`: unordered),
/// and until when it is leased to this node's partition of its endpoint if the stored
/// partition lease allows (`None`: queued; always for an ordered delivery, which only a
/// claim may take, as the head of its key).
struct NewDelivery<'a> {
    id: DeliveryId,
    event: &'a NewEvent,
    endpoint: &'a str,
    ordering_key: Option<&'a str>,
    until: Option<Millis>,
    /// Kind `poll`: stored never due.
    pull: bool,
}

fn key(e: &NewEvent) -> (String, String) {
    (e.tenant.to_string(), e.id.to_string())
}

/// Takes a transaction lock on each (endpoint, ordering key) that `rows` add to, and on
/// each `poll` endpoint, in one order (so two intakes never wait on each other in a
/// cycle): an intake of a key (or to a `poll` endpoint) on another node waits for this
/// one's commit before it numbers its deliveries, so `seq` follows commit order within a
/// key, and a claim (or a consumer's page) never sees a later delivery before an earlier one.
async fn lock_ordering_keys(conn: &mut PgConnection, rows: &[NewDelivery<'_>]) -> sqlx::Result<()> {
    let mut keys: Vec<String> = rows
        .iter()
        .filter_map(|r| match (r.pull, r.ordering_key) {
            (true, _) => Some(format!("{}\n\u{1}poll", r.endpoint)),
            (false, key) => key.map(|key| format!("{}\n{key}", r.endpoint)),
        })
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
        let id: String = r.try_get("id")?;
        let filter = stored_filter(&id, r.try_get::<Option<&str>, _>("filter")?).map_err(decode_error)?;
        let pull: bool = r.try_get("pull")?;
        let subscriber = Subscriber { endpoint: id, event_types, filter, ordering, pull };
        subscribers.entry(r.try_get("tenant_id")?).or_default().push(subscriber);
    }
    Ok(subscribers)
}

/// [`insert`]'s statement: the events ($1 to $7, $17, $18, $20), then their deliveries ($8 to
/// $14, $16; $19: a `poll` endpoint's, stored never due) joined to the events it inserted,
/// leased to $15 where the partition lease allows; answers the (tenant, id) of each event inserted and the id of each delivery
/// leased.
const INSERT_EVENTS_AND_DELIVERIES: &str = "WITH ev AS (INSERT INTO events (tenant_id, id, type, payload, created_at, expires_at, fingerprint, \
     traceparent, tracestate, schema_version) SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], \
     $5::int8[], $6::int8[], $7::text[], $17::text[], $18::text[], $20::int8[]) \
     ON CONFLICT DO NOTHING RETURNING tenant_id, id), \
     dl AS (INSERT INTO deliveries (id, tenant_id, event_id, endpoint_id, event_type, state, attempts, \
     next_attempt_at, lease_owner, lease_until, fence, created_at, updated_at, ordering_key) \
     SELECT v.id, v.tenant_id, v.event_id, v.endpoint_id, v.event_type, \
     CASE WHEN p.owner IS NULL THEN 'queued' ELSE 'delivering' END, 0, \
     CASE WHEN v.pull THEN NULL ELSE v.at END, p.owner, \
     CASE WHEN p.owner IS NULL THEN NULL ELSE v.until END, CASE WHEN p.owner IS NULL THEN 0 ELSE 1 END, v.at, v.at, \
     v.ordering_key \
     FROM UNNEST($8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::int8[], $14::int8[], \
     $16::text[], $19::bool[]) WITH ORDINALITY AS v(id, tenant_id, event_id, endpoint_id, event_type, at, until, \
     ordering_key, pull, n) \
     JOIN ev ON ev.tenant_id = v.tenant_id AND ev.id = v.event_id \
     LEFT JOIN partitions p ON v.until IS NOT NULL AND p.endpoint_id = v.endpoint_id AND p.owner = $15 \
     AND p.lease_until >= v.at \
     ORDER BY v.n \
     RETURNING id, state) \
     SELECT tenant_id AS a, id AS b, NULL AS leased FROM ev \
     UNION ALL SELECT NULL, NULL, id FROM dl WHERE state = 'delivering'";

/// Inserts the events that are new (`first`: the first occurrence of each pair in the
/// batch) and, of the `rows`, the deliveries of those that were new, in one statement. A
/// row with a lease is stored `delivering`, leased to `owner` with fence 1, only while the
/// stored partition lease of its endpoint is `owner`'s at the event's time; otherwise it
/// is queued. Answers the (tenant, id) of the events inserted and the ids of the
/// deliveries leased.
async fn insert(
    conn: &mut PgConnection,
    events: &[&NewEvent],
    first: &[bool],
    rows: &[NewDelivery<'_>],
    owner: Option<&str>,
) -> sqlx::Result<(HashSet<(String, String)>, HashSet<String>)> {
    // ON CONFLICT DO NOTHING returns only inserted rows; a delivery joins the event row
    // its statement inserted, so a repeat of a stored event gets none.
    let firsts: Vec<&NewEvent> = events.iter().zip(first).filter(|(_, f)| **f).map(|(e, _)| *e).collect();
    let column = |f: fn(&NewEvent) -> &str| firsts.iter().map(|e| f(e)).collect::<Vec<&str>>();
    let stored = sqlx::query(INSERT_EVENTS_AND_DELIVERIES)
        .bind(column(|e| e.tenant.as_str()))
        .bind(column(|e| e.id.as_str()))
        .bind(column(|e| e.event_type.as_str()))
        .bind(column(|e| e.payload.as_str()))
        .bind(firsts.iter().map(|e| e.created_at).collect::<Vec<_>>())
        .bind(firsts.iter().map(|e| e.expires_at).collect::<Vec<_>>())
        .bind(column(|e| e.fingerprint.as_str()))
        .bind(rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.event.tenant.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.event.id.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.endpoint).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.event.event_type.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.event.created_at).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.until).collect::<Vec<_>>())
        .bind(owner)
        .bind(rows.iter().map(|r| r.ordering_key).collect::<Vec<_>>())
        .bind(firsts.iter().map(|e| e.trace.as_ref().map(TraceContext::traceparent)).collect::<Vec<_>>())
        .bind(firsts.iter().map(|e| e.trace.as_ref().and_then(|t| t.state.as_deref())).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.pull).collect::<Vec<_>>())
        .bind(firsts.iter().map(|e| e.schema_version).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
    let (mut inserted, mut leased) = (HashSet::new(), HashSet::new());
    for r in &stored {
        match r.try_get::<Option<String>, _>("leased")? {
            Some(id) => leased.insert(id),
            None => inserted.insert((r.try_get("a")?, r.try_get("b")?)),
        };
    }
    Ok((inserted, leased))
}

/// Takes back the events this batch inserted (`fresh`), with their deliveries.
async fn delete_fresh(conn: &mut PgConnection, events: &[&NewEvent], fresh: &[bool]) -> sqlx::Result<()> {
    let gone: Vec<&&NewEvent> = events.iter().zip(fresh).filter(|(_, f)| **f).map(|(e, _)| e).collect();
    sqlx::query(
        "WITH v AS (SELECT * FROM UNNEST($1::text[], $2::text[]) AS v(t, i)), \
         d AS (DELETE FROM deliveries d USING v WHERE d.tenant_id = v.t AND d.event_id = v.i) \
         DELETE FROM events e USING v WHERE e.tenant_id = v.t AND e.id = v.i",
    )
    .bind(gone.iter().map(|e| e.tenant.as_str()).collect::<Vec<_>>())
    .bind(gone.iter().map(|e| e.id.as_str()).collect::<Vec<_>>())
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

/// Whether the claim may take anything: it is not made under the partition lease (`$6`), or
/// its owner (`$4`) holds endpoint `$1`'s lease at `$2`.
macro_rules! held {
    () => {
        "(NOT $6 OR EXISTS (SELECT 1 FROM partitions p WHERE p.endpoint_id = $1 AND p.owner = $4 \
         AND p.lease_until >= $2))"
    };
}

/// Leases the due deliveries of one endpoint, in one statement that also reads when the
/// next of the rest is due and whether the claim's owner holds the partition lease. Rows
/// another node is claiming or recording right now are skipped, never waited for. Also
/// says whether a claim under the partition lease took all that was due, the lease held.
/// Its unordered deliveries and its keys' heads are read apart (`sql::keyless`,
/// `sql::heads`), each at most a claim's size, then merged in due order.
async fn claim(conn: &mut PgConnection, req: &ClaimRequest) -> sqlx::Result<(ClaimBatch, bool)> {
    // The last SELECT reads the statement's snapshot, from before the UPDATE: the rows
    // just picked are left out of the next due time by id.
    let rows = sqlx::query(concat!(
        "WITH head(id) AS (",
        sql::heads!("seq", "id", "$1", "$7"),
        "), keyless AS (",
        sql::keyless!("d.id, d.next_attempt_at", "$1"),
        " AND d.next_attempt_at <= $2 AND ",
        held!(),
        " ORDER BY d.ordering_key, d.next_attempt_at, d.id LIMIT $3 FOR UPDATE SKIP LOCKED), \
         keyed AS (SELECT d.id, d.next_attempt_at FROM deliveries d WHERE d.id IN (SELECT id FROM head) \
         AND d.state IN ('queued', 'waiting') AND d.next_attempt_at <= $2 AND ",
        held!(),
        " ORDER BY d.next_attempt_at, d.id LIMIT $3 FOR UPDATE SKIP LOCKED), \
         picked AS (SELECT u.id FROM (SELECT * FROM keyless UNION ALL SELECT * FROM keyed) u \
         ORDER BY u.next_attempt_at, u.id LIMIT $3), \
         claimed AS (UPDATE deliveries d SET state = 'delivering', lease_owner = $4, lease_until = $5, \
         fence = d.fence + 1, updated_at = $2 FROM picked, events e \
         WHERE d.id = picked.id AND e.tenant_id = d.tenant_id AND e.id = d.event_id \
         RETURNING d.id, d.tenant_id, d.event_id, d.event_type, d.attempts, d.attempt_base, d.deadline, d.fence, \
         d.next_attempt_at, d.replay_id, \
         e.payload, e.created_at AS event_created_at, e.expires_at, e.traceparent, e.tracestate, e.schema_version), \
         rest AS (SELECT (SELECT MIN(r.at) FROM ((",
        sql::keyless!("d.next_attempt_at AS at", "$1"),
        " AND d.id NOT IN (SELECT id FROM picked) ORDER BY d.ordering_key, d.next_attempt_at LIMIT 1) \
         UNION ALL (SELECT d.next_attempt_at FROM deliveries d WHERE d.id IN (SELECT id FROM head) \
         AND d.state IN ('queued', 'waiting') AND d.id NOT IN (SELECT id FROM picked))) r) AS next_due, \
         $6 AND EXISTS (SELECT 1 FROM partitions p WHERE p.endpoint_id = $1 AND p.owner = $4 \
         AND p.lease_until >= $2) AS held) \
         SELECT c.*, rest.next_due, rest.held FROM rest LEFT JOIN claimed c ON true"
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
    let (mut next_due, mut held) = (None, false);
    let mut claimed = Vec::with_capacity(rows.len());
    for r in &rows {
        (next_due, held) = (r.try_get("next_due")?, r.try_get("held")?);
        if let Some(row) = claimed_row(r)? {
            claimed.push(row);
        }
    }
    // RETURNING gives no order guarantee: keep the schedule's.
    claimed.sort_by(|a, b| (a.0, a.1.id.as_str()).cmp(&(b.0, b.1.id.as_str())));
    let claimed: Vec<Claimed> = claimed.into_iter().map(|(_, c)| c).collect();
    let short = claimed.len() < req.limit as usize;
    let next_due = if short { next_due } else { None };
    Ok((ClaimBatch { claimed, next_due }, short && held))
}

/// A delivery the claim leased, with when it was due; `None` for the one row of a claim
/// that leased nothing (it carries only the next due time and the lease check).
fn claimed_row(r: &sqlx::postgres::PgRow) -> sqlx::Result<Option<(Millis, Claimed)>> {
    let Some(id) = r.try_get::<Option<String>, _>("id")? else { return Ok(None) };
    let claimed = Claimed {
        id: DeliveryId::from_stored(id),
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
        trace: stored_trace(r.try_get("traceparent")?, r.try_get("tracestate")?),
        schema_version: r.try_get("schema_version")?,
    };
    Ok(Some((r.try_get("next_attempt_at")?, claimed)))
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
    // concurrent disable or human pause wins over a retry). The attempts of the results
    // accepted are inserted by the same statement, with the endpoint read off the row,
    // except a first-time success's, which the update keeps in the delivery's row
    // (`AttemptResult::kept_in_delivery`).
    let sql = format!(
        "WITH v AS (SELECT * FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::int8[], $5::int8[], $6::text[], \
         $7::int8[], $8::text[], $9::int8[], $10::text[], $11::int8[], $12::int8[], $13::text[], $14::text[], \
         $15::text[], $16::text[], $17::text[], $18::int8[], $19::bool[]) \
         AS v(id, fence, state, attempts, next_attempt_at, reason, last_status, last_error, updated_at, \
         attempt_id, started_at, duration_ms, response_body, verdict, decided_by, request_headers, request_body, \
         request_body_size, kept)), \
         done AS (UPDATE deliveries d SET \
         state = CASE WHEN v.state IN ('waiting', 'queued') THEN {settled} ELSE v.state END, \
         attempts = v.attempts, next_attempt_at = v.next_attempt_at, \
         reason = CASE WHEN v.state IN ('waiting', 'queued') AND {settled} = 'dead' THEN 'endpoint_disabled' \
         ELSE v.reason END, \
         last_status = v.last_status, last_error = v.last_error, lease_owner = NULL, lease_until = NULL, \
         updated_at = v.updated_at, first_attempt_id = CASE WHEN v.kept THEN v.attempt_id END, \
         first_started_at = CASE WHEN v.kept THEN v.started_at END, \
         first_duration_ms = CASE WHEN v.kept THEN v.duration_ms END, \
         first_response_body = CASE WHEN v.kept THEN v.response_body END, \
         first_verdict = CASE WHEN v.kept THEN v.verdict END, first_decided_by = CASE WHEN v.kept THEN v.decided_by END, \
         first_request_headers = CASE WHEN v.kept THEN v.request_headers END, \
         first_request_body = CASE WHEN v.kept THEN v.request_body END, \
         first_request_body_size = CASE WHEN v.kept THEN v.request_body_size END FROM v \
         WHERE d.id = v.id AND d.fence = v.fence AND d.state = 'delivering' RETURNING d.id, d.state, d.endpoint_id), \
         tried AS (INSERT INTO attempts (id, delivery_id, number, started_at, duration_ms, status, response_body, \
         error, verdict, decided_by, request_headers, request_body, request_body_size, endpoint_id) \
         SELECT v.attempt_id, v.id, v.attempts, v.started_at, v.duration_ms, v.last_status, v.response_body, \
         v.last_error, v.verdict, v.decided_by, v.request_headers, v.request_body, v.request_body_size, \
         done.endpoint_id FROM v JOIN done ON done.id = v.id WHERE NOT v.kept) \
         SELECT id, state FROM done",
        settled = sql::settle("d", "v.state"),
    );
    let attempts = || results.iter().map(|r| &r.attempt);
    let rows = sqlx::query(&sql)
        .bind(results.iter().map(|r| r.delivery.as_str()).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.fence).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.state.as_str()).collect::<Vec<_>>())
        .bind(attempts().map(|a| i64::from(a.number)).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.next_attempt_at).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.reason.as_deref()).collect::<Vec<_>>())
        .bind(attempts().map(|a| a.status.map(i64::from)).collect::<Vec<_>>())
        .bind(attempts().map(|a| a.error.as_deref()).collect::<Vec<_>>())
        .bind(attempts().map(|a| a.started_at + a.duration_ms as i64).collect::<Vec<_>>())
        .bind(attempts().map(|a| a.id.as_str()).collect::<Vec<_>>())
        .bind(attempts().map(|a| a.started_at).collect::<Vec<_>>())
        .bind(attempts().map(|a| a.duration_ms as i64).collect::<Vec<_>>())
        .bind(attempts().map(|a| a.response_body.as_deref()).collect::<Vec<_>>())
        .bind(attempts().map(|a| a.verdict.as_str()).collect::<Vec<_>>())
        .bind(attempts().map(|a| a.decided_by.as_str()).collect::<Vec<_>>())
        .bind(attempts().map(|a| a.request.as_ref().map(|r| r.headers_json.as_str())).collect::<Vec<_>>())
        .bind(attempts().map(|a| a.request.as_ref().and_then(|r| r.body.as_deref())).collect::<Vec<_>>())
        .bind(attempts().map(|a| a.request.as_ref().map(|r| r.body_size as i64)).collect::<Vec<_>>())
        .bind(results.iter().map(|r| r.kept_in_delivery()).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
    let mut updated: HashMap<String, DeliveryState> = HashMap::with_capacity(rows.len());
    for row in &rows {
        let state =
            super::super::rows::delivery_state(row.try_get("state")?).map_err(|e| sqlx::Error::Decode(e.into()))?;
        updated.insert(row.try_get("id")?, state);
    }
    Ok(results.iter().map(|r| updated.get(r.delivery.as_str()).copied()).collect())
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
            .push_bind(c.paused_until)
            .push(", state_by = ")
            .push_bind(c.by.as_str());
        // As `sql::CHANGE_ENDPOINT_STATE`: the time moves only when the status changes.
        q.push(", state_since = CASE WHEN state = ")
            .push_bind(state.as_str())
            .push(" AND state_by = ")
            .push_bind(c.by.as_str())
            .push(" AND (paused_until IS NULL OR paused_until > ")
            .push_bind(c.now)
            .push(") THEN state_since ELSE ")
            .push_bind(c.now)
            .push(" END");
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
