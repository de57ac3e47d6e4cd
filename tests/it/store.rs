//! The store conformance suite: one body per case, run against SQLite and Postgres through
//! the `Store` trait and the group committer. Instants are fixed numbers, never the clock.

use std::collections::HashSet;
use std::time::Duration;

use gateway::model::*;
use gateway::store::{
    self, AttemptResult, ClaimRequest, Claimed, Committer, DeliveryFilter, DynStore, EndpointChange, Notice, Release,
    ReplayTurn, SeriesPoint, SeriesScope, StoreError, WriteOp, WriteResult,
};
use sqlx::Connection;
use tests::Backend;
use tests::pg::PgSchema;

const T0: Millis = 1_700_000_000_000;
const HOUR: Millis = 3_600_000;

/// A store opened on one backend for a case, with what keeps its storage alive.
struct Opened {
    store: DynStore,
    committer: Committer,
    url: String,
    _storage: Storage,
}

#[allow(dead_code)] // held for their Drop
enum Storage {
    Dir(tempfile::TempDir),
    Schema(PgSchema),
}

impl Opened {
    /// A fresh store on `backend`: an SQLite file in a temporary directory, or a schema of
    /// its own in the test Postgres database.
    async fn on(backend: Backend) -> anyhow::Result<Opened> {
        let (url, storage) = match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir()?;
                (format!("sqlite://{}", dir.path().join("herald.db").display()), Storage::Dir(dir))
            }
            Backend::Postgres => {
                let schema = PgSchema::create().await?;
                (schema.url.clone(), Storage::Schema(schema))
            }
        };
        let store = store::open(&url, 4).await?;
        let committer = Committer::start(store.clone(), 64);
        Ok(Opened { store, committer, url, _storage: storage })
    }

    /// A second handle on the same storage: another node.
    async fn another_node(&self) -> anyhow::Result<(DynStore, Committer)> {
        let store = store::open(&self.url, 4).await?;
        let committer = Committer::start(store.clone(), 64);
        Ok((store, committer))
    }
}

// Every case against both backends: `store::sqlite::<case>`, `store::postgres::<case>`.
tests::backends!(with Opened::on =>
    tenants_tokens_and_endpoints,
    a_node_ids_leases_are_recovered_at_once,
    intake_is_idempotent_and_fans_out_by_filter,
    claim_takes_due_rows_in_order_under_a_fenced_lease,
    stale_fence_records_nothing,
    release_hands_deliveries_back,
    endpoint_changes_move_its_deliveries,
    unfinished_results_settle_against_the_endpoint,
    enabling_an_endpoint_lifts_its_timed_pause,
    abandoned_leases_are_recovered,
    partitions_have_one_owner_at_a_time,
    claims_in_a_partition_need_its_lease,
    deliveries_list_with_filters_and_pages,
    delivery_reads_back_with_its_attempts,
    a_first_time_success_is_kept_in_its_delivery_row,
    due_work_is_reported,
    one_commit_applies_mixed_ops_in_order,
    concurrent_nodes_never_claim_the_same_delivery,
    dead_letters_replay_report_and_purge,
    a_cancelled_replay_returns_what_it_has_not_sent,
    claims_of_many_endpoints_in_one_commit_stay_apart,
    health_of_a_page_of_endpoints,
    state_changes_keep_when_and_by_whom,
    a_drained_claim_is_told_in_the_order_of_writes,
    heartbeats_tell_the_live_nodes,
    an_audit_entry_commits_with_its_change_only,
    an_endpoints_verification_is_stored_apart_from_its_settings,
    an_ordered_claim_takes_each_keys_head_beside_the_unordered,
    every_change_to_an_endpoint_moves_its_version,
);

// ---- fixtures ----

fn tenant(id: &str) -> Tenant {
    Tenant { id: TenantId::parse(id).unwrap(), name: format!("{id} inc"), created_at: T0 }
}

fn endpoint(tenant: &str, id: &str, types: &[&str], created_at: Millis) -> Endpoint {
    Endpoint {
        id: EndpointId::from_stored(id),
        tenant: TenantId::parse(tenant).unwrap(),
        spec: EndpointSpec {
            event_types: types.iter().map(|t| t.to_string()).collect(),
            ..EndpointSpec::for_test(format!("http://127.0.0.1:9/{id}"))
        },
        state: EndpointState::Active,
        state_reason: None,
        paused_until: None,
        failing_since: None,
        verification: None,
        listener: None,
        state_since: Some(created_at),
        state_by: None,
        created_at,
        updated_at: created_at,
        version: 0,
    }
}

fn event(tenant: &str, id: &str, event_type: &str, at: Millis) -> NewEvent {
    NewEvent {
        tenant: TenantId::parse(tenant).unwrap(),
        id: EventId::parse(id).unwrap(),
        event_type: event_type.into(),
        payload: format!("{{\"id\": \"{id}\", \"amount\": 1.50}}"),
        fingerprint: gateway::model::event_fingerprint(event_type, &format!("{{\"id\": \"{id}\", \"amount\": 1.50}}")),
        created_at: at,
        expires_at: at + 24 * HOUR,
        ordering_key: None,
        trace: None,
        schema_version: None,
        only: None,
    }
}

/// Tenant `acme` with endpoints `ep_a` (everything) and, if asked, more.
async fn setup(b: &Opened, endpoints: &[(&str, &[&str])]) -> anyhow::Result<()> {
    b.store.create_tenant(&tenant("acme")).await?;
    for (i, (id, types)) in endpoints.iter().enumerate() {
        b.store.insert_endpoint(&endpoint("acme", id, types, T0 + i as Millis)).await?;
    }
    Ok(())
}

fn claim_req(endpoint: &str, now: Millis, limit: u32, owner: &str) -> ClaimRequest {
    ClaimRequest {
        endpoint: EndpointId::from_stored(endpoint),
        now,
        limit,
        owner: owner.into(),
        lease_until: now + 60_000,
        in_partition: false,
        dead_heads_block: false,
    }
}

fn result(
    c: &Claimed,
    fence: i64,
    state: DeliveryState,
    next: Option<Millis>,
    status: u16,
    at: Millis,
) -> AttemptResult {
    let number = c.attempts + 1;
    AttemptResult {
        delivery: c.id.clone(),
        fence,
        state,
        next_attempt_at: next,
        reason: (state == DeliveryState::Dead).then(|| format!("permanent:{status}")),
        ordered: false,
        attempt: Attempt {
            id: format!("att_{}_{number}_{fence}", c.id),
            delivery_id: c.id.clone(),
            number,
            started_at: at,
            duration_ms: 12,
            status: Some(status),
            response_body: Some("ok".into()),
            error: None,
            verdict: state.as_str().to_string(),
            decided_by: "builtin".into(),
            request: None,
        },
    }
}

async fn delivery_of(b: &Opened, event: &str, endpoint: &str) -> anyhow::Result<Delivery> {
    let f = DeliveryFilter {
        tenant: Some(TenantId::parse("acme")?),
        event: Some(EventId::parse(event)?),
        endpoint: Some(EndpointId::from_stored(endpoint)),
        limit: 10,
        ..Default::default()
    };
    let mut found = b.store.list_deliveries(&f).await?;
    anyhow::ensure!(found.len() == 1, "{event} → {endpoint}: {} deliveries", found.len());
    Ok(found.remove(0))
}

async fn ingest(b: &Opened, events: Vec<NewEvent>) -> anyhow::Result<()> {
    b.committer.ingest(events).await?;
    Ok(())
}

// ---- cases ----

async fn tenants_tokens_and_endpoints(b: Opened) -> anyhow::Result<()> {
    let s = &b.store;
    s.create_tenant(&tenant("acme")).await?;
    // A unique violation names the field, in Herald's words on either backend (issue 29 §10).
    let conflict = |r: Result<(), StoreError>| match r {
        Err(StoreError::Conflict(m)) => m,
        other => panic!("not a conflict: {other:?}"),
    };
    assert_eq!(conflict(s.create_tenant(&tenant("acme")).await), "id: a tenant with this id already exists");
    let got = s.get_tenant(&TenantId::parse("acme")?).await?.expect("tenant");
    assert_eq!((got.name.as_str(), got.created_at), ("acme inc", T0));
    assert!(s.get_tenant(&TenantId::parse("nobody")?).await?.is_none());

    let acme = TenantId::parse("acme")?;
    let token = TokenRecord::new("ab".repeat(32), acme.clone(), vec![Scope::EventsWrite, Scope::Read], T0);
    s.insert_token(&token).await?;
    let found = s.find_token(&token.hash).await?.expect("token");
    assert_eq!((found.tenant.as_str(), found.scopes), ("acme", vec![Scope::EventsWrite, Scope::Read]));
    assert_eq!((found.id.as_str(), found.last_used_at), ("tok_abababababababab", None));
    assert!(s.find_token("cd").await?.is_none());

    // Listed oldest first with their last use; revoked by id, only within their tenant.
    s.create_tenant(&tenant("other")).await?;
    let second = TokenRecord::new("cd".repeat(32), acme.clone(), vec![Scope::Manage], T0 + 1);
    s.insert_token(&second).await?;
    s.touch_token(&token.hash, T0 + 60_000).await?;
    s.touch_token(&token.hash, T0 + 5).await?;
    let listed = s.list_tokens(&acme).await?;
    let summary: Vec<_> = listed.iter().map(|t| (t.id.as_str(), t.last_used_at)).collect();
    assert_eq!(summary, [("tok_abababababababab", Some(T0 + 60_000)), ("tok_cdcdcdcdcdcdcdcd", None)]);
    assert!(!s.revoke_token(&TenantId::parse("other")?, &token.id).await?, "another tenant's token");
    assert!(s.revoke_token(&acme, &token.id).await?);
    assert!(!s.revoke_token(&acme, &token.id).await?, "already revoked");
    assert!(s.find_token(&token.hash).await?.is_none());
    assert_eq!(s.list_tokens(&acme).await?.len(), 1);

    s.insert_endpoint(&endpoint("acme", "ep_b", &["invoice.*"], T0 + 2)).await?;
    s.insert_endpoint(&endpoint("acme", "ep_a", &[], T0 + 1)).await?;
    let again = conflict(s.insert_endpoint(&endpoint("acme", "ep_a", &[], T0)).await);
    assert_eq!(again, "id: an endpoint with this id already exists");
    let listed: Vec<String> =
        s.list_endpoints(&TenantId::parse("acme")?).await?.into_iter().map(|e| e.id.to_string()).collect();
    assert_eq!(listed, ["ep_a", "ep_b"], "listed by creation");
    let mut e = s.endpoint(&EndpointId::from_stored("ep_b")).await?.expect("endpoint");
    assert_eq!(e.spec, endpoint("acme", "ep_b", &["invoice.*"], 0).spec, "the spec round-trips");
    e.spec.rate_per_sec = 2.5;
    e.spec.event_types = vec!["order.created".into()];
    e.updated_at = T0 + 10;
    assert!(s.update_endpoint(&e).await?);
    let back = s.endpoint(&e.id).await?.expect("endpoint");
    assert_eq!((back.spec.rate_per_sec, back.updated_at), (2.5, T0 + 10));
    let mut other = e.clone();
    other.tenant = TenantId::parse("umbrella")?;
    assert!(!s.update_endpoint(&other).await?, "another tenant's endpoint is not updated");
    // The filter change applies to intake at once.
    ingest(&b, vec![event("acme", "evt_1", "order.created", T0 + 20), event("acme", "evt_2", "invoice.paid", T0 + 21)])
        .await?;
    delivery_of(&b, "evt_1", "ep_b").await?;
    assert!(delivery_of(&b, "evt_2", "ep_b").await.is_err(), "ep_b no longer takes invoices");

    // Deleting an endpoint dead-letters its unfinished deliveries.
    assert!(!s.delete_endpoint(&TenantId::parse("umbrella")?, &e.id, T0 + 30).await?);
    assert!(s.delete_endpoint(&TenantId::parse("acme")?, &e.id, T0 + 30).await?);
    assert!(s.endpoint(&e.id).await?.is_none());
    let d = delivery_of(&b, "evt_1", "ep_b").await?;
    assert_eq!((d.state, d.reason.as_deref(), d.updated_at), (DeliveryState::Dead, Some("endpoint_deleted"), T0 + 30));
    Ok(())
}

async fn intake_is_idempotent_and_fans_out_by_filter(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_all", &[]), ("ep_inv", &["invoice.*"]), ("ep_paid", &["invoice.paid"]), ("ep_off", &[])]).await?;
    b.committer
        .change_endpoint(EndpointChange {
            endpoint: EndpointId::from_stored("ep_off"),
            state: Some(EndpointState::Disabled),
            reason: Some("gone".into()),
            paused_until: None,
            failing_since: Failing::Unchanged,
            by: StateBy::Operator,
            now: T0,
        })
        .await?;
    let out = b
        .committer
        .ingest(vec![
            event("acme", "evt_1", "invoice.paid", T0 + 1),
            event("acme", "evt_2", "invoice.created", T0 + 2),
            event("acme", "evt_1", "invoice.paid", T0 + 3),
            event("acme", "evt_3", "order.created", T0 + 4),
        ])
        .await?;
    let targets = |i: usize| {
        let mut v: Vec<String> = out[i].endpoints.iter().map(|e| e.to_string()).collect();
        v.sort();
        v
    };
    assert_eq!((out[0].deliveries, out[0].duplicate), (3, false));
    assert_eq!(targets(0), ["ep_all", "ep_inv", "ep_paid"]);
    assert_eq!((out[1].deliveries, targets(1)), (2, vec!["ep_all".to_string(), "ep_inv".to_string()]));
    assert!(out[2].duplicate, "the same id twice in one batch is stored once");
    assert_eq!(out[2].deliveries, 3, "and reports the deliveries of its first occurrence");
    assert!(out[2].endpoints.is_empty());
    assert_eq!((out[3].deliveries, targets(3)), (1, vec!["ep_all".to_string()]));

    let again = b.committer.ingest(vec![event("acme", "evt_1", "invoice.paid", T0 + 9)]).await?;
    assert_eq!(
        (again[0].deliveries, again[0].duplicate, again[0].endpoints.len()),
        (3, true, 0),
        "a duplicate reports its deliveries"
    );

    let stored = b.store.get_event(&TenantId::parse("acme")?, &EventId::parse("evt_1")?).await?.expect("event");
    assert_eq!(stored.payload, "{\"id\": \"evt_1\", \"amount\": 1.50}", "payload bytes are kept exactly");
    assert_eq!(
        (stored.created_at, stored.expires_at, stored.event_type.as_str()),
        (T0 + 1, T0 + 1 + 24 * HOUR, "invoice.paid")
    );
    let all = b
        .store
        .list_deliveries(&DeliveryFilter { tenant: Some(TenantId::parse("acme")?), limit: 100, ..Default::default() })
        .await?;
    assert_eq!(all.len(), 6, "no delivery was written twice");
    assert!(all.iter().all(|d| d.state == DeliveryState::Queued && d.attempts == 0));
    let d = delivery_of(&b, "evt_2", "ep_inv").await?;
    assert_eq!((d.next_attempt_at, d.created_at, d.event_type.as_str()), (Some(T0 + 2), T0 + 2, "invoice.created"));

    // Event ids are unique per tenant, not globally.
    b.store.create_tenant(&tenant("umbrella")).await?;
    let other = b.committer.ingest(vec![event("umbrella", "evt_1", "invoice.paid", T0)]).await?;
    assert_eq!((other[0].duplicate, other[0].deliveries), (false, 0));
    Ok(())
}

async fn claim_takes_due_rows_in_order_under_a_fenced_lease(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[]), ("ep_b", &["other"])]).await?;
    // Posted out of order: claims follow next_attempt_at.
    let times = [4, 0, 3, 1, 2, 10];
    ingest(&b, times.iter().map(|t| event("acme", &format!("evt_{t}"), "t", T0 + t)).collect()).await?;

    let got = b.committer.claim(claim_req("ep_a", T0 + 3, 3, "node-1")).await?;
    let ids: Vec<&str> = got.iter().map(|c| c.event_id.as_str()).collect();
    assert_eq!(ids, ["evt_0", "evt_1", "evt_2"], "due rows, earliest first, at most the limit");
    let c = &got[0];
    assert_eq!((c.fence, c.attempts, c.tenant.as_str(), c.event_type.as_str()), (1, 0, "acme", "t"));
    assert_eq!(c.payload, "{\"id\": \"evt_0\", \"amount\": 1.50}");
    assert_eq!((c.event_created_at, c.expires_at), (T0, T0 + 24 * HOUR));
    let d = delivery_of(&b, "evt_0", "ep_a").await?;
    assert_eq!((d.state, d.updated_at), (DeliveryState::Delivering, T0 + 3));

    let got = b.committer.claim(claim_req("ep_a", T0 + 3, 10, "node-2")).await?;
    let ids: Vec<&str> = got.iter().map(|c| c.event_id.as_str()).collect();
    assert_eq!(ids, ["evt_3"], "leased rows are skipped; future ones are not due");
    assert!(
        b.committer.claim(claim_req("ep_b", T0 + 100, 10, "node-1")).await?.is_empty(),
        "other endpoints' rows are not taken"
    );
    assert!(b.committer.claim(claim_req("ep_a", T0 + 3, 10, "node-1")).await?.is_empty());

    // A released delivery comes back with a fresh fence on the next claim.
    let rel = Release { delivery: got[0].id.clone(), fence: got[0].fence, next_attempt_at: T0 + 5 };
    b.committer.release(vec![rel]).await?;
    let again = b.committer.claim(claim_req("ep_a", T0 + 5, 10, "node-1")).await?;
    let ids: Vec<(&str, i64)> = again.iter().map(|c| (c.event_id.as_str(), c.fence)).collect();
    assert_eq!(ids, [("evt_4", 1), ("evt_3", 2)]);
    Ok(())
}

/// An endpoint that turned ordered with unordered deliveries still waiting: a claim takes
/// those and each key's head, in due order, never a key's second; a key's next is due once
/// its head is done, and the next due time counts only what may go out.
async fn an_ordered_claim_takes_each_keys_head_beside_the_unordered(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    ingest(&b, vec![event("acme", "evt_u1", "t", T0 + 1), event("acme", "evt_u2", "t", T0 + 5)]).await?;
    let mut ep = b.store.endpoint(&EndpointId::from_stored("ep_a")).await?.expect("endpoint");
    ep.spec.ordering = DeliveryOrder::Key;
    assert!(b.store.update_endpoint(&ep).await?);
    let keyed =
        |id: &str, key: &str, t: Millis| NewEvent { ordering_key: Some(key.into()), ..event("acme", id, "t", t) };
    ingest(&b, vec![keyed("evt_a1", "a", T0 + 2), keyed("evt_b1", "b", T0 + 3), keyed("evt_a2", "a", T0 + 4)]).await?;
    ingest(&b, (0..50).map(|i| keyed(&format!("evt_b{}", i + 2), "b", T0 + 6)).collect()).await?;

    let first = b.committer.claim(claim_req("ep_a", T0 + 10, 3, "node-1")).await?;
    let ids: Vec<&str> = first.iter().map(|c| c.event_id.as_str()).collect();
    assert_eq!(ids, ["evt_u1", "evt_a1", "evt_b1"], "the earliest due of the unordered and the heads");
    let got = b.committer.claim(claim_req("ep_a", T0 + 10, 10, "node-1")).await?;
    let ids: Vec<&str> = got.iter().map(|c| c.event_id.as_str()).collect();
    assert_eq!(ids, ["evt_u2"], "a key in flight sends nothing more");
    assert_eq!(b.store.next_due(&EndpointId::from_stored("ep_a"), false).await?, None, "nothing else may go out");

    let a1 = &first[1];
    assert_eq!(
        b.committer.record(vec![result(a1, a1.fence, DeliveryState::Delivered, None, 200, T0 + 11)]).await?,
        [true]
    );
    assert_eq!(b.store.next_due(&EndpointId::from_stored("ep_a"), false).await?, Some(T0 + 4), "a2 is the head now");
    let got = b.committer.claim(claim_req("ep_a", T0 + 12, 10, "node-1")).await?;
    let ids: Vec<&str> = got.iter().map(|c| c.event_id.as_str()).collect();
    assert_eq!(ids, ["evt_a2"], "key a goes on; key b waits on its head");
    Ok(())
}

/// An endpoint's stored version: read back with it and by id in one statement (unknown ids
/// left out), raised by every change to its row, the engine's own (a pause) too.
async fn every_change_to_an_endpoint_moves_its_version(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[]), ("ep_b", &[])]).await?;
    let ids = [EndpointId::from_stored("ep_a"), EndpointId::from_stored("ep_b"), EndpointId::from_stored("ep_none")];
    let first = versions(&b, &ids).await?;
    assert_eq!(first.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["ep_a", "ep_b"]);
    let read = b.store.endpoint(&ids[0]).await?.expect("endpoint");
    assert_eq!(read.version, first[0].1, "the endpoint reads back with its version");

    let mut ep = read;
    ep.spec.rate_per_sec = 7.0;
    assert!(b.store.update_endpoint(&ep).await?);
    let after = versions(&b, &ids).await?;
    assert_ne!(after[0].1, first[0].1, "a change moves it");
    assert_eq!(after[1].1, first[1].1, "and only its own");

    b.committer.change_endpoint(change("ep_a", EndpointState::Paused, Some(T0 + HOUR), T0 + 1)).await?;
    assert_ne!(versions(&b, &ids).await?[0].1, after[0].1, "the engine's own change moves it too");
    assert!(versions(&b, &[]).await?.is_empty());
    Ok(())
}

/// The stored versions of `ids`, by id.
async fn versions(b: &Opened, ids: &[EndpointId]) -> anyhow::Result<Vec<(String, i64)>> {
    let mut v: Vec<(String, i64)> =
        b.store.endpoint_versions(ids).await?.into_iter().map(|(id, v)| (id.to_string(), v)).collect();
    v.sort();
    Ok(v)
}

async fn stale_fence_records_nothing(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    ingest(&b, vec![event("acme", "evt_1", "t", T0)]).await?;
    let c = b.committer.claim(claim_req("ep_a", T0, 1, "node-1")).await?.remove(0);
    let stale = result(&c, c.fence - 1, DeliveryState::Delivered, None, 200, T0 + 1);
    assert_eq!(b.committer.record(vec![stale]).await?, [false], "a stale fence is refused");
    let (d, attempts) = b.store.get_delivery(&c.tenant, &c.id).await?.expect("delivery");
    assert_eq!((d.state, d.attempts, attempts.len()), (DeliveryState::Delivering, 0, 0), "and writes no attempt");

    let ok = result(&c, c.fence, DeliveryState::Delivered, None, 200, T0 + 1);
    assert_eq!(b.committer.record(vec![ok.clone()]).await?, [true]);
    let mut twice = ok;
    twice.attempt.id.push_str("_again");
    assert_eq!(b.committer.record(vec![twice]).await?, [false], "a finished delivery takes no second result");
    let (d, attempts) = b.store.get_delivery(&c.tenant, &c.id).await?.expect("delivery");
    assert_eq!((d.state, d.attempts, d.last_status, attempts.len()), (DeliveryState::Delivered, 1, Some(200), 1));
    assert_eq!(d.updated_at, T0 + 1 + 12, "updated when the attempt ended");
    Ok(())
}

async fn release_hands_deliveries_back(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    ingest(&b, vec![event("acme", "evt_1", "t", T0), event("acme", "evt_2", "t", T0)]).await?;
    let got = b.committer.claim(claim_req("ep_a", T0, 2, "node-1")).await?;
    let rel = |c: &Claimed, fence| Release { delivery: c.id.clone(), fence, next_attempt_at: T0 + 500 };
    b.committer.release(vec![rel(&got[0], got[0].fence), rel(&got[1], got[1].fence + 1)]).await?;
    let released = b.store.get_delivery(&got[0].tenant, &got[0].id).await?.expect("delivery").0;
    assert_eq!(
        (released.state, released.next_attempt_at, released.attempts),
        (DeliveryState::Waiting, Some(T0 + 500), 0)
    );
    let kept = b.store.get_delivery(&got[1].tenant, &got[1].id).await?.expect("delivery").0;
    assert_eq!(kept.state, DeliveryState::Delivering, "a release with a stale fence changes nothing");
    let early = match b.committer.submit(WriteOp::Claim(claim_req("ep_a", T0 + 499, 5, "node-1"))).await? {
        WriteResult::Claim(batch) => batch,
        other => panic!("{other:?}"),
    };
    assert!(early.claimed.is_empty(), "not due before its time");
    assert_eq!(early.next_due, Some(T0 + 500), "an empty claim says when the next one is due");
    assert_eq!(b.committer.claim(claim_req("ep_a", T0 + 500, 5, "node-1")).await?.len(), 1);
    Ok(())
}

fn change(endpoint: &str, state: EndpointState, paused_until: Option<Millis>, now: Millis) -> EndpointChange {
    EndpointChange {
        endpoint: EndpointId::from_stored(endpoint),
        state: Some(state),
        reason: Some(format!("{} for a test", state.as_str())),
        paused_until,
        failing_since: Failing::Unchanged,
        by: StateBy::Operator,
        now,
    }
}

async fn endpoint_changes_move_its_deliveries(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[]), ("ep_b", &[])]).await?;
    ingest(&b, (0..3).map(|i| event("acme", &format!("evt_{i}"), "t", T0 + i)).collect()).await?;
    let leased = b.committer.claim(claim_req("ep_a", T0, 1, "node-1")).await?;
    assert_eq!(leased.len(), 1);
    let state = |e: &'static str, ep: &'static str| {
        let b = &b;
        async move { delivery_of(b, e, ep).await.map(|d| d.state) }
    };

    // A pause with an end time (429) leaves deliveries where they are.
    assert_eq!(
        b.committer.change_endpoint(change("ep_a", EndpointState::Paused, Some(T0 + 60_000), T0 + 10)).await?,
        0
    );
    let e = b.store.endpoint(&EndpointId::from_stored("ep_a")).await?.expect("endpoint");
    assert_eq!(
        (e.state, e.paused_until, e.state_reason.as_deref()),
        (EndpointState::Paused, Some(T0 + 60_000), Some("paused for a test"))
    );
    assert_eq!(state("evt_1", "ep_a").await?, DeliveryState::Queued);

    // A pause for a human holds its waiting deliveries; enabling puts them back, due now.
    assert_eq!(b.committer.change_endpoint(change("ep_a", EndpointState::Paused, None, T0 + 20)).await?, 2);
    assert_eq!(state("evt_1", "ep_a").await?, DeliveryState::Paused);
    assert_eq!(state("evt_0", "ep_a").await?, DeliveryState::Delivering, "in flight stays in flight");
    assert_eq!(state("evt_1", "ep_b").await?, DeliveryState::Queued, "other endpoints are untouched");
    assert_eq!(b.committer.change_endpoint(change("ep_a", EndpointState::Active, None, T0 + 30)).await?, 2);
    let d = delivery_of(&b, "evt_2", "ep_a").await?;
    assert_eq!((d.state, d.next_attempt_at, d.updated_at), (DeliveryState::Waiting, Some(T0 + 30), T0 + 30));

    // Disabling dead-letters what waits (paused ones too), not what is in flight.
    b.committer.change_endpoint(change("ep_a", EndpointState::Paused, None, T0 + 40)).await?;
    assert_eq!(b.committer.change_endpoint(change("ep_a", EndpointState::Disabled, None, T0 + 50)).await?, 2);
    let d = delivery_of(&b, "evt_2", "ep_a").await?;
    assert_eq!(
        (d.state, d.reason.as_deref(), d.next_attempt_at),
        (DeliveryState::Dead, Some("endpoint_disabled"), None)
    );
    assert_eq!(state("evt_0", "ep_a").await?, DeliveryState::Delivering);
    let e = b.store.endpoint(&EndpointId::from_stored("ep_a")).await?.expect("endpoint");
    assert_eq!((e.state, e.updated_at), (EndpointState::Disabled, T0 + 50));
    // Intake skips a disabled endpoint.
    let out = b.committer.ingest(vec![event("acme", "evt_9", "t", T0 + 60)]).await?;
    assert_eq!(out[0].endpoints, [EndpointId::from_stored("ep_b")]);

    // `failing_since` alone changes nothing else.
    let only_failing = EndpointChange {
        endpoint: EndpointId::from_stored("ep_b"),
        state: None,
        reason: None,
        paused_until: None,
        failing_since: Failing::Since(T0 + 70),
        by: StateBy::Receiver,
        now: T0 + 70,
    };
    assert_eq!(b.committer.change_endpoint(only_failing).await?, 0);
    let e = b.store.endpoint(&EndpointId::from_stored("ep_b")).await?.expect("endpoint");
    assert_eq!((e.state, e.failing_since), (EndpointState::Active, Some(T0 + 70)));
    Ok(())
}

async fn enabling_an_endpoint_lifts_its_timed_pause(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    ingest(&b, (0..2).map(|i| event("acme", &format!("evt_{i}"), "t", T0)).collect()).await?;
    let got = b.committer.claim(claim_req("ep_a", T0, 2, "node-1")).await?;
    let until = T0 + HOUR;
    b.committer.change_endpoint(change("ep_a", EndpointState::Paused, Some(until), T0 + 1)).await?;
    // One handed back to the pause's end (as the engine's clock reads it), one retry due
    // an hour after it.
    let back = Release { delivery: got[0].id.clone(), fence: got[0].fence, next_attempt_at: until + 3 };
    b.committer.release(vec![back]).await?;
    let later = result(&got[1], got[1].fence, DeliveryState::Waiting, Some(until + HOUR), 500, T0 + 2);
    assert_eq!(b.committer.record(vec![later]).await?, [true]);

    b.committer.change_endpoint(change("ep_a", EndpointState::Active, None, T0 + 10)).await?;
    let f = DeliveryFilter { endpoint: Some(EndpointId::from_stored("ep_a")), limit: 10, ..Default::default() };
    let mut due: Vec<Option<Millis>> =
        b.store.list_deliveries(&f).await?.into_iter().map(|d| d.next_attempt_at).collect();
    due.sort();
    assert_eq!(
        due,
        [Some(T0 + 10), Some(until + HOUR)],
        "what the pause held is due now; a later retry keeps its time"
    );
    Ok(())
}

async fn unfinished_results_settle_against_the_endpoint(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_off", &[]), ("ep_human", &[]), ("ep_429", &[])]).await?;
    ingest(&b, (0..2).map(|i| event("acme", &format!("evt_{i}"), "t", T0)).collect()).await?;
    let off = b.committer.claim(claim_req("ep_off", T0, 2, "node-1")).await?;
    let human = b.committer.claim(claim_req("ep_human", T0, 2, "node-1")).await?;
    let limited = b.committer.claim(claim_req("ep_429", T0, 2, "node-1")).await?;
    b.committer.change_endpoint(change("ep_off", EndpointState::Disabled, None, T0 + 1)).await?;
    b.committer.change_endpoint(change("ep_human", EndpointState::Paused, None, T0 + 1)).await?;
    b.committer.change_endpoint(change("ep_429", EndpointState::Paused, Some(T0 + 60_000), T0 + 1)).await?;

    let retry = |c: &Claimed| result(c, c.fence, DeliveryState::Waiting, Some(T0 + 1_000), 500, T0 + 2);
    let results = b.store.apply(vec![WriteOp::Record(vec![retry(&off[0]), retry(&human[0]), retry(&limited[0])])]);
    let settled = match results.await?.as_slice() {
        [WriteResult::Record(settled)] => settled.clone(),
        other => panic!("{other:?}"),
    };
    use DeliveryState::{Dead, Paused, Waiting};
    assert_eq!(settled, [Some(Dead), Some(Paused), Some(Waiting)], "each result says what it settled as");
    let get = |c: &Claimed| {
        let (s, c) = (&b.store, c.clone());
        async move { s.get_delivery(&c.tenant, &c.id).await.map(|d| d.expect("delivery").0) }
    };
    let d = get(&off[0]).await?;
    assert_eq!(
        (d.state, d.reason.as_deref(), d.attempts),
        (DeliveryState::Dead, Some("endpoint_disabled"), 1),
        "a retry on a disabled endpoint is dead"
    );
    assert_eq!(
        get(&human[0]).await?.state,
        DeliveryState::Paused,
        "a retry on an endpoint paused for a human waits for them"
    );
    let d = get(&limited[0]).await?;
    assert_eq!(
        (d.state, d.next_attempt_at),
        (DeliveryState::Waiting, Some(T0 + 1_000)),
        "a timed pause does not hold retries"
    );

    // Finished results are recorded as they are.
    let done = result(&off[1], off[1].fence, DeliveryState::Delivered, None, 200, T0 + 3);
    assert_eq!(b.committer.record(vec![done]).await?, [true]);
    assert_eq!(get(&off[1]).await?.state, DeliveryState::Delivered);

    // Releases settle the same way.
    let rel = |c: &Claimed| Release { delivery: c.id.clone(), fence: c.fence, next_attempt_at: T0 + 5 };
    b.committer.release(vec![rel(&human[1]), rel(&limited[1])]).await?;
    assert_eq!(get(&human[1]).await?.state, DeliveryState::Paused);
    assert_eq!(get(&limited[1]).await?.state, DeliveryState::Waiting);
    Ok(())
}

async fn abandoned_leases_are_recovered(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    ingest(&b, vec![event("acme", "evt_1", "t", T0), event("acme", "evt_2", "t", T0)]).await?;
    let mut req = claim_req("ep_a", T0, 1, "node-dead");
    req.lease_until = T0 + 10_000;
    let lost = b.committer.claim(req).await?.remove(0);
    let mut req = claim_req("ep_a", T0 + 1, 1, "node-alive");
    req.lease_until = T0 + 30_000;
    let alive = b.committer.claim(req).await?.remove(0);

    assert_eq!(b.store.recover_leases(T0 + 10_000, T0 + 10_000).await?, 0, "a lease is abandoned only after it ends");
    assert_eq!(b.store.recover_leases(T0 + 10_001, T0 + 20_000).await?, 1);
    let d = b.store.get_delivery(&lost.tenant, &lost.id).await?.expect("delivery").0;
    assert_eq!((d.state, d.next_attempt_at, d.updated_at), (DeliveryState::Waiting, Some(T0 + 20_000), T0 + 20_000));
    let d = b.store.get_delivery(&alive.tenant, &alive.id).await?.expect("delivery").0;
    assert_eq!(d.state, DeliveryState::Delivering, "a live lease is kept");

    // The slow node comes back: its result is refused, before and after the new claim.
    let late = result(&lost, lost.fence, DeliveryState::Delivered, None, 200, T0 + 20_001);
    assert_eq!(b.committer.record(vec![late.clone()]).await?, [false]);
    let again = b.committer.claim(claim_req("ep_a", T0 + 20_000, 5, "node-alive")).await?.remove(0);
    assert_eq!((again.id.as_str(), again.fence), (lost.id.as_str(), lost.fence + 1));
    assert_eq!(b.committer.record(vec![late]).await?, [false]);
    let fresh = result(&again, again.fence, DeliveryState::Delivered, None, 200, T0 + 20_002);
    assert_eq!(b.committer.record(vec![fresh]).await?, [true]);
    let (d, attempts) = b.store.get_delivery(&lost.tenant, &lost.id).await?.expect("delivery");
    assert_eq!((d.state, attempts.len()), (DeliveryState::Delivered, 1));
    Ok(())
}

/// A node that holds its id takes up every delivery leased under it at once, however long
/// those leases would still run; other owners' leases are kept.
async fn a_node_ids_leases_are_recovered_at_once(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    ingest(&b, vec![event("acme", "evt_1", "t", T0), event("acme", "evt_2", "t", T0)]).await?;
    let mut req = claim_req("ep_a", T0, 1, "node-a");
    req.lease_until = T0 + 60_000;
    let mine = b.committer.claim(req).await?.remove(0);
    let mut req = claim_req("ep_a", T0 + 1, 1, "node-b");
    req.lease_until = T0 + 60_000;
    let other = b.committer.claim(req).await?.remove(0);

    assert_eq!(b.store.recover_leases_of("node-a", T0 + 5).await?, 1);
    let d = b.store.get_delivery(&mine.tenant, &mine.id).await?.expect("delivery").0;
    assert_eq!((d.state, d.next_attempt_at), (DeliveryState::Waiting, Some(T0 + 5)));
    let d = b.store.get_delivery(&other.tenant, &other.id).await?.expect("delivery").0;
    assert_eq!(d.state, DeliveryState::Delivering, "another node's lease is kept");
    // The previous process's result is refused once the delivery is claimed again.
    let again = b.committer.claim(claim_req("ep_a", T0 + 6, 5, "node-a")).await?.remove(0);
    assert_eq!((again.id.as_str(), again.fence), (mine.id.as_str(), mine.fence + 1));
    let late = result(&mine, mine.fence, DeliveryState::Delivered, None, 200, T0 + 7);
    assert_eq!(b.committer.record(vec![late]).await?, [false]);
    Ok(())
}

async fn partitions_have_one_owner_at_a_time(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    let s = &b.store;
    let ep = EndpointId::from_stored("ep_a");
    assert!(s.acquire_partition(&ep, "node-a", T0, T0 + 15_000).await?);
    assert!(!s.acquire_partition(&ep, "node-b", T0 + 1, T0 + 15_001).await?, "held by node-a");
    assert!(s.acquire_partition(&ep, "node-a", T0 + 10_000, T0 + 25_000).await?, "renewed by its owner");
    assert!(!s.acquire_partition(&ep, "node-b", T0 + 20_000, T0 + 35_000).await?, "the renewal counts");
    assert!(s.acquire_partition(&ep, "node-b", T0 + 25_001, T0 + 40_000).await?, "taken over after expiry");
    assert!(!s.acquire_partition(&ep, "node-a", T0 + 25_002, T0 + 40_000).await?);
    s.release_partition(&ep, "node-a").await?;
    assert!(!s.acquire_partition(&ep, "node-a", T0 + 25_003, T0 + 40_000).await?, "only the owner releases");
    s.release_partition(&ep, "node-b").await?;
    assert!(s.acquire_partition(&ep, "node-a", T0 + 25_004, T0 + 40_000).await?, "free after release");
    assert!(
        s.acquire_partition(&EndpointId::from_stored("ep_other"), "node-b", T0, T0 + 1).await?,
        "partitions are per endpoint"
    );

    // Racing nodes: exactly one wins a free partition.
    let (other, _) = b.another_node().await?;
    for round in 0..5 {
        let ep = EndpointId::from_stored(format!("ep_race_{round}"));
        let (x, y) = tokio::join!(
            s.acquire_partition(&ep, "node-x", T0, T0 + 100),
            other.acquire_partition(&ep, "node-y", T0, T0 + 100)
        );
        assert!(x? ^ y?, "round {round}: exactly one owner");
    }
    Ok(())
}

/// A partition's claim takes (or renews) the lease in its own commit, or checks it: it
/// never claims while another node holds the partition.
async fn claims_in_a_partition_need_its_lease(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    ingest(&b, (0..3).map(|i| event("acme", &format!("evt_{i}"), "t", T0 + i)).collect()).await?;
    let ep = EndpointId::from_stored("ep_a");
    assert!(b.store.acquire_partition(&ep, "node-b", T0, T0 + 15_000).await?);
    let c = &b.committer;
    assert!(c.claim_in_partition(claim_req("ep_a", T0 + 3, 10, "node-a"), Some(T0 + 15_003)).await?.is_none());
    let checked = c.claim_in_partition(claim_req("ep_a", T0 + 3, 10, "node-a"), None).await?;
    assert_eq!(checked.map(|v| v.claimed.len()), Some(0), "a lease it does not hold proves nothing");
    let held = c.claim_in_partition(claim_req("ep_a", T0 + 3, 2, "node-b"), None).await?.expect("node-b holds it");
    assert_eq!(held.claimed.len(), 2, "the holder claims after a check alone");

    let late = T0 + 15_001;
    let taken = c.claim_in_partition(claim_req("ep_a", late, 10, "node-a"), Some(late + 15_000)).await?;
    assert_eq!(taken.map(|v| v.claimed.len()), Some(1), "the lease lapsed: taken over and claimed in one commit");
    assert!(!b.store.acquire_partition(&ep, "node-b", late + 1, late + 15_000).await?, "node-a holds it now");
    Ok(())
}

async fn deliveries_list_with_filters_and_pages(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[]), ("ep_b", &["invoice.*"])]).await?;
    b.store.create_tenant(&tenant("umbrella")).await?;
    b.store.insert_endpoint(&endpoint("umbrella", "ep_u", &[], T0)).await?;
    let mut events: Vec<NewEvent> =
        (0..5).map(|i| event("acme", &format!("evt_{i}"), "invoice.paid", T0 + i * 1000)).collect();
    events.push(event("acme", "evt_order", "order.created", T0 + 6000));
    events.push(event("umbrella", "evt_0", "invoice.paid", T0));
    ingest(&b, events).await?;
    let dead = b.committer.claim(claim_req("ep_b", T0 + 1000, 2, "node-1")).await?;
    let fail = |c: &Claimed| result(c, c.fence, DeliveryState::Dead, None, 422, T0 + 50_000);
    b.committer.record(vec![fail(&dead[0]), fail(&dead[1])]).await?;

    let acme = TenantId::parse("acme")?;
    let list = |f: DeliveryFilter| {
        let s = b.store.clone();
        async move { s.list_deliveries(&DeliveryFilter { tenant: Some(TenantId::parse("acme").unwrap()), ..f }).await }
    };
    let all = list(DeliveryFilter { limit: 100, ..Default::default() }).await?;
    assert_eq!(all.len(), 11, "6 to ep_a, 5 to ep_b, none of umbrella's");
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "ordered by id");
    assert!(all.iter().all(|d| d.tenant == acme));

    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = list(DeliveryFilter { after: after.clone(), limit: 4, ..Default::default() }).await?;
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 4);
        after = page.last().map(|d| d.id.clone());
        paged.extend(page.into_iter().map(|d| d.id));
    }
    assert_eq!(paged, all.iter().map(|d| d.id.clone()).collect::<Vec<_>>(), "pages cover the list exactly once");

    let n = |f: DeliveryFilter| {
        let list = &list;
        async move { list(DeliveryFilter { limit: 100, ..f }).await.map(|v| v.len()) }
    };
    assert_eq!(n(DeliveryFilter { endpoint: Some(EndpointId::from_stored("ep_b")), ..Default::default() }).await?, 5);
    assert_eq!(n(DeliveryFilter { event: Some(EventId::parse("evt_3")?), ..Default::default() }).await?, 2);
    assert_eq!(n(DeliveryFilter { event_type: Some("order.created".into()), ..Default::default() }).await?, 1);
    assert_eq!(n(DeliveryFilter { state: Some(DeliveryState::Dead), ..Default::default() }).await?, 2);
    assert_eq!(n(DeliveryFilter { state: Some(DeliveryState::Queued), ..Default::default() }).await?, 9);
    assert_eq!(n(DeliveryFilter { reason: Some("permanent:422".into()), ..Default::default() }).await?, 2);
    assert_eq!(n(DeliveryFilter { reason: Some("exhausted".into()), ..Default::default() }).await?, 0);
    // since/until bound updated_at: [since, until).
    assert_eq!(n(DeliveryFilter { since: Some(T0 + 50_012), ..Default::default() }).await?, 2);
    assert_eq!(n(DeliveryFilter { since: Some(T0 + 50_013), ..Default::default() }).await?, 0);
    assert_eq!(n(DeliveryFilter { until: Some(T0 + 1000), ..Default::default() }).await?, 1);
    assert_eq!(n(DeliveryFilter { since: Some(T0 + 1000), until: Some(T0 + 3000), ..Default::default() }).await?, 3);
    let both = DeliveryFilter {
        endpoint: Some(EndpointId::from_stored("ep_b")),
        state: Some(DeliveryState::Queued),
        event_type: Some("invoice.paid".into()),
        ..Default::default()
    };
    assert_eq!(n(both).await?, 3, "filters combine");
    Ok(())
}

async fn delivery_reads_back_with_its_attempts(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    ingest(&b, vec![event("acme", "evt_1", "t", T0)]).await?;
    let c = b.committer.claim(claim_req("ep_a", T0, 1, "node-1")).await?.remove(0);
    let mut first = result(&c, c.fence, DeliveryState::Waiting, Some(T0 + 1_000), 503, T0 + 10);
    first.attempt.error = Some("timeout: no answer".into());
    first.attempt.status = None;
    first.attempt.response_body = None;
    first.attempt.verdict = "retry".into();
    let sent_headers = [("webhook-id".to_string(), "evt_1".to_string()), ("x-plugin".into(), "é \"q\"".into())];
    first.attempt.request = Some(SentRequest::new(&sent_headers, "{\"text\":\"é\"}".as_bytes(), false));
    b.committer.record(vec![first]).await?;
    let d = b.store.get_delivery(&c.tenant, &c.id).await?.expect("delivery").0;
    assert_eq!(
        (d.state, d.attempts, d.last_status, d.last_error.as_deref()),
        (DeliveryState::Waiting, 1, None, Some("timeout: no answer"))
    );
    let c = b.committer.claim(claim_req("ep_a", T0 + 1_000, 1, "node-1")).await?.remove(0);
    assert_eq!((c.attempts, c.fence), (1, 2));
    let mut second = result(&c, c.fence, DeliveryState::Delivered, None, 204, T0 + 1_010);
    second.attempt.request = Some(SentRequest::new(&sent_headers[..1], &[b'x'; 300], true));
    b.committer.record(vec![second]).await?;

    let (d, attempts) = b.store.get_delivery(&c.tenant, &c.id).await?.expect("delivery");
    assert_eq!((d.state, d.attempts, d.last_status, d.last_error), (DeliveryState::Delivered, 2, Some(204), None));
    assert_eq!((d.event_id.as_str(), d.endpoint_id.as_str(), d.next_attempt_at), ("evt_1", "ep_a", None));
    let numbers: Vec<u32> = attempts.iter().map(|a| a.number).collect();
    assert_eq!(numbers, [1, 2]);
    let a = &attempts[0];
    assert_eq!((a.started_at, a.duration_ms, a.status, a.response_body.as_deref()), (T0 + 10, 12, None, None));
    assert_eq!(
        (a.error.as_deref(), a.verdict.as_str(), a.decided_by.as_str()),
        (Some("timeout: no answer"), "retry", "builtin")
    );
    assert_eq!((attempts[1].status, attempts[1].response_body.as_deref()), (Some(204), Some("ok")));
    // What was sent: a transformed body kept as text, an envelope body only by its size.
    let sent = attempts[0].request.as_ref().expect("the first attempt's request");
    assert_eq!(
        (sent.headers()?, sent.body.as_deref(), sent.body_size),
        (sent_headers.to_vec(), Some("{\"text\":\"é\"}"), 13)
    );
    let sent = attempts[1].request.as_ref().expect("the second attempt's request");
    assert_eq!((sent.headers()?, sent.body.as_deref(), sent.body_size), (sent_headers[..1].to_vec(), None, 300));
    assert!(attempts.iter().all(|a| a.delivery_id == c.id));

    assert!(b.store.get_delivery(&TenantId::parse("umbrella")?, &c.id).await?.is_none(), "another tenant sees nothing");
    assert!(b.store.get_delivery(&c.tenant, &DeliveryId::from_stored("dlv_missing")).await?.is_none());
    Ok(())
}

/// A delivery delivered by its first attempt keeps that attempt in its own row (issue
/// 53.0): no `attempts` row is written for it, and every read of attempts shows it as it
/// was recorded (the delivery's history, the console's series in each scope, endpoint
/// health). A delivery that needed a retry keeps a row per attempt.
async fn a_first_time_success_is_kept_in_its_delivery_row(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    ingest(&b, vec![event("acme", "evt_1", "t", T0), event("acme", "evt_2", "t", T0)]).await?;
    let c = b.committer.claim(claim_req("ep_a", T0, 2, "node-1")).await?;
    let mut first = result(&c[0], c[0].fence, DeliveryState::Delivered, None, 200, T0 + 10);
    first.attempt.decided_by = "plugin:accept-409".into();
    first.attempt.response_body = Some("é \"ok\"".into());
    let sent_headers = [("webhook-id".to_string(), "evt_1".to_string()), ("x-plugin".into(), "é".into())];
    first.attempt.request = Some(SentRequest::new(&sent_headers, "{\"text\":\"é\"}".as_bytes(), true));
    let retry = result(&c[1], c[1].fence, DeliveryState::Waiting, Some(T0 + 1_000), 503, T0 + 20);
    b.committer.record(vec![first.clone(), retry]).await?;
    let again = b.committer.claim(claim_req("ep_a", T0 + 1_000, 1, "node-1")).await?.remove(0);
    b.committer.record(vec![result(&again, again.fence, DeliveryState::Delivered, None, 204, T0 + 1_010)]).await?;

    let (d, attempts) = b.store.get_delivery(&c[0].tenant, &c[0].id).await?.expect("delivery");
    assert_eq!((d.state, d.attempts, d.last_status, d.last_error), (DeliveryState::Delivered, 1, Some(200), None));
    assert_eq!(format!("{attempts:?}"), format!("{:?}", [&first.attempt]), "the first attempt as recorded");
    let retried = b.store.get_delivery(&c[1].tenant, &c[1].id).await?.expect("delivery").1;
    let numbers: Vec<(u32, Option<u16>)> = retried.iter().map(|a| (a.number, a.status)).collect();
    assert_eq!(numbers, [(1, Some(503)), (2, Some(204))]);
    assert_eq!(attempt_rows(&b).await?, 2, "only the retried delivery's attempts have rows");

    let point = SeriesPoint { start: T0 / HOUR * HOUR, attempts: 3, successes: 2, total_ms: 36, max_ms: 12 };
    let acme = SeriesScope::Tenant(TenantId::parse("acme")?);
    for scope in [SeriesScope::All, acme, SeriesScope::Endpoint(EndpointId::from_stored("ep_a"))] {
        assert_eq!(b.store.attempt_series(&scope, T0, HOUR).await?, std::slice::from_ref(&point), "{scope:?}");
    }
    let later = b.store.attempt_series(&SeriesScope::All, T0 + 15, HOUR).await?;
    assert_eq!(later.iter().map(|p| p.attempts).collect::<Vec<_>>(), [2], "the window leaves the first out");
    let other = SeriesScope::Tenant(TenantId::parse("umbrella")?);
    assert!(b.store.attempt_series(&other, T0, HOUR).await?.is_empty());

    let health = b.store.endpoint_health(&EndpointId::from_stored("ep_a"), T0 + HOUR / 2).await?;
    assert_eq!((health.attempts_1h, health.successes_1h, health.attempts_24h, health.successes_24h), (3, 2, 3, 2));
    assert_eq!((health.last_success_at, health.last_attempt_at), (Some(T0 + 1_010), Some(T0 + 1_010)));
    assert_eq!(health.last_error.map(|e| (e.status, e.at)), Some((Some(503), T0 + 20)));
    Ok(())
}

/// The rows of `attempts`, read as a script outside Herald would.
async fn attempt_rows(b: &Opened) -> anyhow::Result<i64> {
    let count = "SELECT COUNT(*) FROM attempts";
    Ok(match b.url.starts_with("sqlite:") {
        true => sqlx::query_scalar(count).fetch_one(&mut sqlx::SqliteConnection::connect(&b.url).await?).await?,
        false => sqlx::query_scalar(count).fetch_one(&mut sqlx::PgConnection::connect(&b.url).await?).await?,
    })
}

async fn due_work_is_reported(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[]), ("ep_b", &["b"])]).await?;
    assert!(b.store.pending_endpoints().await?.is_empty());
    assert_eq!(b.store.next_due(&EndpointId::from_stored("ep_a"), false).await?, None);
    ingest(
        &b,
        vec![
            event("acme", "evt_1", "a", T0 + 5),
            event("acme", "evt_2", "b", T0 + 7),
            event("acme", "evt_3", "b", T0 + 3),
        ],
    )
    .await?;
    let mut pending = b.store.pending_endpoints().await?;
    pending.sort();
    assert_eq!(pending, [(EndpointId::from_stored("ep_a"), T0 + 3), (EndpointId::from_stored("ep_b"), T0 + 3)]);
    let acme = TenantId::from_stored("acme");
    let stats = b.store.queue_stats(T0 + 5, 1).await?;
    assert_eq!((stats.due, stats.oldest_due), (3, Some(T0 + 3)), "due by T0+5: ep_a's two, ep_b's one");
    assert_eq!(stats.top_due, [(acme.clone(), EndpointId::from_stored("ep_a"), 2)]);
    assert_eq!(stats.endpoints_by_state, [("active".to_string(), 2)]);
    assert!(stats.dead.is_empty());
    assert_eq!(stats.wal_bytes.is_some(), b.url.starts_with("sqlite:"), "only SQLite has a WAL");
    let c = b.committer.claim(claim_req("ep_b", T0 + 3, 1, "node-1")).await?;
    assert_eq!(
        b.store.next_due(&EndpointId::from_stored("ep_b"), false).await?,
        Some(T0 + 7),
        "leased rows are not pending"
    );
    b.committer.record(vec![result(&c[0], c[0].fence, DeliveryState::Waiting, Some(T0 + 6), 500, T0 + 4)]).await?;
    assert_eq!(b.store.next_due(&EndpointId::from_stored("ep_b"), false).await?, Some(T0 + 6), "retries are pending");
    b.committer.change_endpoint(change("ep_a", EndpointState::Paused, None, T0 + 8)).await?;
    let pending = b.store.pending_endpoints().await?;
    assert_eq!(pending, [(EndpointId::from_stored("ep_b"), T0 + 6)], "paused deliveries are not pending");
    let mut stats = b.store.queue_stats(T0 + 10, 5).await?;
    assert_eq!((stats.due, stats.oldest_due), (2, Some(T0 + 6)), "paused deliveries are not due");
    assert_eq!(stats.top_due, [(acme, EndpointId::from_stored("ep_b"), 2)]);
    stats.endpoints_by_state.sort();
    assert_eq!(stats.endpoints_by_state, [("active".to_string(), 1), ("paused".to_string(), 1)]);
    Ok(())
}

/// A shared store lists the nodes that said they are alive (each node's own answer holds
/// itself), drops one that leaves, and lists which partitions are held; a store one node
/// owns has no membership.
async fn heartbeats_tell_the_live_nodes(b: Opened) -> anyhow::Result<()> {
    let shared = b.url.starts_with("postgres");
    let a = b.store.heartbeat("node-a", false).await?;
    if !shared {
        assert_eq!(a, None, "SQLite: one node paces everything");
    } else {
        assert_eq!(a, Some(vec!["node-a".to_string()]));
        let both = b.store.heartbeat("node-b", false).await?;
        assert_eq!(both, Some(vec!["node-a".to_string(), "node-b".to_string()]));
        let left = b.store.heartbeat("node-a", true).await?;
        assert_eq!(left, Some(vec!["node-b".to_string()]), "a leaving node is not a member, even to itself");
        assert_eq!(b.store.heartbeat("node-b", false).await?, Some(vec!["node-b".to_string()]));
    }
    setup(&b, &[("ep_a", &[]), ("ep_b", &[])]).await?;
    assert!(b.store.acquire_partition(&EndpointId::from_stored("ep_a"), "node-b", T0, T0 + 1_000).await?);
    assert_eq!(b.store.held_partitions(T0 + 500).await?, [EndpointId::from_stored("ep_a")]);
    assert!(b.store.held_partitions(T0 + 1_001).await?.is_empty(), "an expired lease is held by nobody");
    Ok(())
}

async fn one_commit_applies_mixed_ops_in_order(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[]), ("ep_b", &[])]).await?;
    ingest(&b, vec![event("acme", "evt_0", "t", T0)]).await?;
    let c = b.committer.claim(claim_req("ep_a", T0, 1, "node-1")).await?.remove(0);
    let ok = result(&c, c.fence, DeliveryState::Delivered, None, 200, T0 + 1);
    let mut dup = ok.clone();
    dup.attempt.id.push_str("_dup");
    let ops = vec![
        WriteOp::Ingest(vec![event("acme", "evt_1", "t", T0 + 1)]),
        WriteOp::Ingest(vec![event("acme", "evt_2", "t", T0 + 2), event("acme", "evt_1", "t", T0 + 3)]),
        WriteOp::Record(vec![ok]),
        WriteOp::Record(vec![dup]),
        WriteOp::Claim(claim_req("ep_b", T0 + 2, 10, "node-1")),
        WriteOp::Endpoint(change("ep_a", EndpointState::Disabled, None, T0 + 4)),
        WriteOp::Release(Vec::new()),
        WriteOp::Ingest(vec![event("acme", "evt_3", "t", T0 + 5)]),
    ];
    let results = b.store.apply(ops).await?;
    assert_eq!(results.len(), 8);
    let WriteResult::Ingest(first) = &results[0] else { panic!("{:?}", results[0]) };
    assert_eq!((first[0].deliveries, first[0].duplicate), (2, false));
    let WriteResult::Ingest(second) = &results[1] else { panic!("{:?}", results[1]) };
    assert_eq!(
        second.iter().map(|o| o.duplicate).collect::<Vec<_>>(),
        [false, true],
        "earlier ops of the commit are visible"
    );
    let WriteResult::Record(r) = &results[2] else { panic!("{:?}", results[2]) };
    assert_eq!(r, &[Some(DeliveryState::Delivered)]);
    let WriteResult::Record(r) = &results[3] else { panic!("{:?}", results[3]) };
    assert_eq!(r, &[None], "the second result for one lease is refused");
    let WriteResult::Claim(batch) = &results[4] else { panic!("{:?}", results[4]) };
    let ids: Vec<&str> = batch.claimed.iter().map(|c| c.event_id.as_str()).collect();
    assert_eq!(ids, ["evt_0", "evt_1", "evt_2"], "the claim sees deliveries ingested before it");
    let WriteResult::Endpoint(dead) = &results[5] else { panic!("{:?}", results[5]) };
    assert_eq!(*dead, 2, "ep_a's evt_1 and evt_2 deliveries");
    assert!(matches!(results[6], WriteResult::Release));
    let WriteResult::Ingest(last) = &results[7] else { panic!("{:?}", results[7]) };
    assert_eq!(last[0].endpoints, [EndpointId::from_stored("ep_b")], "intake after the disable skips it");
    let (d, attempts) = b.store.get_delivery(&c.tenant, &c.id).await?.expect("delivery");
    assert_eq!((d.state, attempts.len()), (DeliveryState::Delivered, 1));

    // A failing op fails the whole commit: nothing of it is stored.
    let bad = vec![
        WriteOp::Ingest(vec![event("acme", "evt_4", "t", T0 + 6)]),
        WriteOp::Ingest(vec![event("nobody", "evt_5", "t", T0 + 6)]),
    ];
    assert!(b.store.apply(bad).await.is_err(), "an event of an unknown tenant is refused");
    assert!(b.store.get_event(&TenantId::parse("acme")?, &EventId::parse("evt_4")?).await?.is_none(), "all or nothing");
    Ok(())
}

async fn concurrent_nodes_never_claim_the_same_delivery(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    let total = 400;
    ingest(&b, (0..total).map(|i| event("acme", &format!("evt_{i}"), "t", T0 + i)).collect()).await?;
    let (_other_store, other) = b.another_node().await?;
    let mut tasks = Vec::new();
    for (n, committer) in
        [b.committer.clone(), other, b.committer.clone(), b.another_node().await?.1].into_iter().enumerate()
    {
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = committer.claim(claim_req("ep_a", T0 + total, 7, &format!("node-{n}"))).await?;
                if got.is_empty() {
                    return anyhow::Ok(mine);
                }
                mine.extend(got.into_iter().map(|c| c.id));
            }
        }));
    }
    let mut seen = HashSet::new();
    for t in tasks {
        for id in tokio::time::timeout(Duration::from_secs(30), t).await???.into_iter() {
            assert!(seen.insert(id.clone()), "{id} claimed twice");
        }
    }
    assert_eq!(seen.len(), total as usize, "every delivery claimed once");
    Ok(())
}

async fn dead_letters_replay_report_and_purge(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[]), ("ep_b", &[])]).await?;
    let acme = TenantId::parse("acme")?;
    ingest(&b, (0..5).map(|i| event("acme", &format!("evt_{i}"), "t", T0 + i)).collect()).await?;
    let failed = b.committer.claim(claim_req("ep_a", T0 + 10, 5, "node-1")).await?;
    b.committer
        .record(failed.iter().map(|c| result(c, c.fence, DeliveryState::Dead, None, 422, T0 + 100)).collect())
        .await?;
    b.committer.change_endpoint(change("ep_b", EndpointState::Disabled, None, T0 + 50)).await?;

    let only_a = DeadLetterFilter { endpoint: Some("ep_a".into()), ..Default::default() };
    assert_eq!(b.store.dead_selection(&acme, None, Some(&only_a)).await?, (5, vec![]));
    let ids = [failed[0].id.to_string(), failed[1].id.to_string()];
    assert_eq!(b.store.dead_selection(&acme, Some(&ids), None).await?.0, 2);
    let (n, blocked) = b.store.dead_selection(&acme, None, None).await?;
    let ep_b = SkippedEndpoint {
        endpoint: "ep_b".into(),
        state: "disabled".into(),
        reason: Some("disabled for a test".into()),
        dead_letters: 5,
    };
    assert_eq!((n, blocked), (10, vec![ep_b.clone()]), "a disabled endpoint blocks a replay");
    // A filter's skipped endpoints are left out of what it selects.
    let skipping = DeadLetterFilter { skipped: vec![ep_b], ..Default::default() };
    assert_eq!(b.store.dead_selection(&acme, None, Some(&skipping)).await?, (5, vec![]));
    let dead_of = |endpoint: Option<&str>, reason: Option<&str>| DeliveryFilter {
        tenant: Some(acme.clone()),
        endpoint: endpoint.map(EndpointId::from_stored),
        reason: reason.map(str::to_string),
        limit: 1,
        ..Default::default()
    };
    let mut counts = b.store.dead_letter_counts(&dead_of(None, None)).await?;
    counts.sort();
    assert_eq!(counts, [("endpoint_disabled".to_string(), 5), ("permanent:422".to_string(), 5)]);
    // The counts follow the list's filters (not its page), and a reason's class (the
    // metrics' `permanent`) selects each of its reasons.
    let permanent = [("permanent:422".to_string(), 5)];
    assert_eq!(b.store.dead_letter_counts(&dead_of(Some("ep_a"), None)).await?, permanent);
    assert_eq!(b.store.dead_letter_counts(&dead_of(None, Some("permanent"))).await?, permanent);
    assert_eq!(b.store.dead_letter_counts(&dead_of(None, Some("permanent:422"))).await?, permanent);
    assert_eq!(b.store.dead_letter_counts(&dead_of(None, Some("permanent:404"))).await?, []);
    assert_eq!(b.store.dead_letter_counts(&dead_of(None, Some("other"))).await?, []);
    let listed = b.store.list_deliveries(&DeliveryFilter { limit: 100, ..dead_of(None, Some("permanent")) }).await?;
    assert_eq!(listed.len(), 5, "reason=permanent lists what the metrics call permanent");
    let by_class = DeadLetterFilter { reason: Some("permanent".into()), ..Default::default() };
    assert_eq!(b.store.dead_selection(&acme, None, Some(&by_class)).await?, (5, vec![]));
    assert_eq!(b.store.stale_dead_letters(T0 + 200).await?, [(acme.clone(), T0 + 50, 10)]);
    assert!(b.store.stale_dead_letters(T0 + 50).await?.is_empty());

    let replay = replay("rpl_1", Some(only_a), 3, 5, T0 + 200);
    b.store.create_replay(&replay).await?;
    assert_eq!(b.store.running_replays().await?.len(), 1);
    let ep_a = || vec![EndpointId::from_stored("ep_a")];
    let queued = |b: &Opened| {
        let s = b.store.clone();
        async move {
            let f = DeliveryFilter {
                state: Some(DeliveryState::Queued),
                endpoint: Some(EndpointId::from_stored("ep_a")),
                limit: 10,
                ..Default::default()
            };
            let mut due: Vec<Option<Millis>> =
                s.list_deliveries(&f).await?.into_iter().map(|d| d.next_attempt_at).collect();
            due.sort();
            anyhow::Ok(due)
        }
    };
    // At 100/s a turn re-queues a tenth of a second's worth, up to the batch of 3.
    let turn = b.store.replay_turn("rpl_1", T0 + 300, HOUR).await?;
    assert_eq!(turn, ReplayTurn::Requeued { endpoints: ep_a(), requeued: 3, next_due: T0 + 330 });
    assert_eq!(queued(&b).await?, [Some(T0 + 300), Some(T0 + 310), Some(T0 + 320)], "spaced at the replay's rate");
    // Another node's turn before the schedule has come re-queues nothing: together they
    // keep the replay's rate.
    assert_eq!(b.store.replay_turn("rpl_1", T0 + 320, HOUR).await?, ReplayTurn::NotYet(T0 + 330));
    // A batch re-queued and not sent: nothing more until some of it is.
    assert_eq!(b.store.replay_turn("rpl_1", T0 + 340, HOUR).await?, ReplayTurn::NotYet(T0 + 440));
    assert_eq!(queued(&b).await?.len(), 3);

    let sent = b.committer.claim(claim_req("ep_a", T0 + 340, 2, "node-1")).await?;
    let replayed = sent.iter().map(|c| (c.attempts, c.attempt_base, c.deadline, c.replay.as_deref()));
    assert!(replayed.clone().all(|r| r == (1, 1, Some(T0 + 300 + HOUR), Some("rpl_1"))), "{sent:?}");
    b.committer
        .record(vec![
            result(&sent[0], sent[0].fence, DeliveryState::Delivered, None, 200, T0 + 345),
            result(&sent[1], sent[1].fence, DeliveryState::Dead, None, 422, T0 + 345),
        ])
        .await?;
    let turn = b.store.replay_turn("rpl_1", T0 + 450, HOUR).await?;
    let last = ReplayTurn::Requeued { endpoints: ep_a(), requeued: 2, next_due: T0 + 470 };
    assert_eq!(turn, last, "continues after its cursor, from its turn's time, as sends make room");
    let p = b.store.get_replay(&acme, "rpl_1").await?.expect("replay");
    assert_eq!((p.replay.state, p.replay.requeued), (ReplayState::Running, 5));
    let f = ReplayFigures { sent: 2, delivered: 1, failed: 1, returned: 0, pending: 3 };
    assert_eq!(p.figures, f, "each re-queued delivery counted once, by what became of it");

    let rest = b.committer.claim(claim_req("ep_a", T0 + 600, 10, "node-1")).await?;
    assert_eq!(rest.len(), 3);
    b.committer
        .record(rest.iter().map(|c| result(c, c.fence, DeliveryState::Delivered, None, 200, T0 + 610)).collect())
        .await?;
    // Everything re-queued and settled: done.
    assert_eq!(b.store.replay_turn("rpl_1", T0 + 700, HOUR).await?, ReplayTurn::Ended);
    let p = b.store.get_replay(&acme, "rpl_1").await?.expect("replay");
    assert_eq!(p.replay.state, ReplayState::Done);
    assert_eq!(p.figures, ReplayFigures { sent: 5, delivered: 4, failed: 1, returned: 0, pending: 0 });
    assert!(b.store.running_replays().await?.is_empty());
    assert_eq!(b.store.cancel_replay(&acme, "rpl_1", T0 + 700).await?, None, "only a running replay is cancelled");

    let h = b.store.endpoint_health(&EndpointId::from_stored("ep_a"), T0 + 1_000).await?;
    assert_eq!((h.attempts_1h, h.successes_1h, h.attempts_24h, h.successes_24h), (10, 4, 10, 4));
    assert_eq!(
        (h.last_success_at, h.last_attempt_at, h.backlog, h.dead_letters),
        (Some(T0 + 610), Some(T0 + 610), 0, 1)
    );

    // Retention: delivered work and old dead letters go; an event goes with its last delivery.
    assert_eq!(b.store.purge(T0 + 10_000, T0 + 200, 100).await?, 9);
    let gone = &sent[0];
    assert!(b.store.get_delivery(&acme, &gone.id).await?.is_none());
    assert!(b.store.get_event(&acme, &gone.event_id).await?.is_none(), "no delivery left: the event is purged");
    assert!(b.store.get_event(&acme, &sent[1].event_id).await?.is_some(), "an event with a delivery left stays");
    assert_eq!(b.store.purge(T0 + 10_000, T0 + 200, 100).await?, 0);
    Ok(())
}

/// A running replay of `acme` created at `at`, due then, at 100/s.
fn replay(id: &str, filter: Option<DeadLetterFilter>, batch: u32, selected: u64, at: Millis) -> Replay {
    Replay {
        id: id.into(),
        tenant: TenantId::parse("acme").unwrap(),
        state: ReplayState::Running,
        ids: None,
        filter,
        rate_per_sec: 100.0,
        batch,
        selected,
        requeued: 0,
        cursor: String::new(),
        next_due_at: at,
        created_at: at,
        updated_at: at,
    }
}

/// A cancel puts what the replay re-queued and did not send back among the dead letters as
/// it was, at once for what waits in the store, and for what a partition holds when it is
/// handed back or its lease is recovered; what it sent stays sent. Replays list newest
/// first.
async fn a_cancelled_replay_returns_what_it_has_not_sent(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    let acme = TenantId::parse("acme")?;
    ingest(&b, (0..6).map(|i| event("acme", &format!("evt_{i}"), "t", T0 + i)).collect()).await?;
    let first = b.committer.claim(claim_req("ep_a", T0 + 10, 6, "node-1")).await?;
    b.committer
        .record(first.iter().map(|c| result(c, c.fence, DeliveryState::Dead, None, 422, T0 + 100)).collect())
        .await?;
    let dead = |b: &Opened| {
        let s = b.store.clone();
        async move {
            let f = DeliveryFilter { state: Some(DeliveryState::Dead), limit: 100, ..Default::default() };
            anyhow::Ok(s.list_deliveries(&f).await?)
        }
    };
    let as_it_was = |d: &Delivery| {
        (d.reason.as_deref(), d.attempts, d.updated_at, d.next_attempt_at) == (Some("permanent:422"), 1, T0 + 112, None)
    };
    assert!(dead(&b).await?.iter().all(as_it_was));

    b.store.create_replay(&replay("rpl_c", Some(DeadLetterFilter::default()), 4, 6, T0 + 200)).await?;
    let turn = b.store.replay_turn("rpl_c", T0 + 300, HOUR).await?;
    assert!(matches!(turn, ReplayTurn::Requeued { requeued: 4, .. }), "{turn:?}");
    // Two come due and a partition claims them; it sends one.
    let leased = b.committer.claim(claim_req("ep_a", T0 + 315, 10, "node-1")).await?;
    assert_eq!(leased.len(), 2);
    b.committer
        .record(vec![result(&leased[0], leased[0].fence, DeliveryState::Delivered, None, 200, T0 + 320)])
        .await?;

    let told = b.store.cancel_replay(&acme, "rpl_c", T0 + 400).await?;
    assert_eq!(told, Some(vec![EndpointId::from_stored("ep_a")]), "the partition holding one unsent is named");
    assert_eq!(b.store.cancelled_replays(&["rpl_c".into(), "rpl_x".into()]).await?, ["rpl_c"]);
    // The two still queued are dead letters again, as they were; the held one waits for
    // its partition.
    assert_eq!(dead(&b).await?.iter().filter(|d| as_it_was(d)).count(), 4);
    let held = delivery_of(&b, leased[1].event_id.as_str(), "ep_a").await?;
    assert_eq!(held.state, DeliveryState::Delivering);
    let back = Release { delivery: leased[1].id.clone(), fence: leased[1].fence, next_attempt_at: T0 + 410 };
    b.committer.release(vec![back]).await?;
    assert_eq!(dead(&b).await?.iter().filter(|d| as_it_was(d)).count(), 5, "handed back: dead as it was");
    assert!(b.committer.claim(claim_req("ep_a", T0 + 10_000, 10, "node-1")).await?.is_empty(), "none comes back");
    assert_eq!(b.store.replay_turn("rpl_c", T0 + 500, HOUR).await?, ReplayTurn::Ended);
    let p = b.store.get_replay(&acme, "rpl_c").await?.expect("replay");
    assert_eq!((p.replay.state, p.replay.selected, p.replay.requeued), (ReplayState::Cancelled, 6, 4));
    assert_eq!(p.figures, ReplayFigures { sent: 1, delivered: 1, failed: 0, returned: 3, pending: 0 });
    assert_eq!(b.store.cancel_replay(&acme, "rpl_c", T0 + 500).await?, None);
    let all = DeliveryFilter { tenant: Some(acme.clone()), limit: 1, ..Default::default() };
    assert_eq!(b.store.dead_letter_counts(&all).await?, [("permanent:422".to_string(), 5)]);

    // A node that dies holding a cancelled replay's deliveries: lease recovery returns them.
    b.store.create_replay(&replay("rpl_d", Some(DeadLetterFilter::default()), 4, 5, T0 + 600)).await?;
    assert!(matches!(b.store.replay_turn("rpl_d", T0 + 700, HOUR).await?, ReplayTurn::Requeued { requeued: 4, .. }));
    assert_eq!(b.committer.claim(claim_req("ep_a", T0 + 800, 10, "node-2")).await?.len(), 4);
    assert!(b.store.cancel_replay(&acme, "rpl_d", T0 + 900).await?.is_some());
    assert_eq!(b.store.recover_leases(Millis::MAX, T0 + 1_000).await?, 4);
    assert_eq!(dead(&b).await?.iter().filter(|d| as_it_was(d)).count(), 5, "recovered: dead as they were");
    let p = b.store.get_replay(&acme, "rpl_d").await?.expect("replay");
    assert_eq!(p.figures, ReplayFigures { sent: 0, delivered: 0, failed: 0, returned: 4, pending: 0 });

    // Newest first, in pages; a tenant sees only its own.
    let ids = |page: Vec<ReplayProgress>| page.into_iter().map(|p| p.replay.id).collect::<Vec<_>>();
    assert_eq!(ids(b.store.list_replays(&acme, None, 1).await?), ["rpl_d"]);
    assert_eq!(ids(b.store.list_replays(&acme, Some("rpl_d"), 10).await?), ["rpl_c"]);
    assert!(b.store.list_replays(&acme, Some("rpl_c"), 10).await?.is_empty());
    b.store.create_tenant(&tenant("other")).await?;
    assert!(b.store.list_replays(&TenantId::parse("other")?, None, 10).await?.is_empty());
    Ok(())
}

/// A page's health in one read: attempts in the last hour and day and the latest ones,
/// backlog and dead letters, the latest failed attempt, each endpoint apart; one with neither attempts nor deliveries,
/// and one not asked for, are left out.
async fn health_of_a_page_of_endpoints(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[]), ("ep_b", &[]), ("ep_c", &["never.sent"])]).await?;
    ingest(&b, (0..4).map(|i| event("acme", &format!("evt_{i}"), "t", T0 + i)).collect()).await?;
    let now = T0 + 30 * HOUR;
    let a = b.committer.claim(claim_req("ep_a", T0 + 10, 3, "node-1")).await?;
    b.committer
        .record(vec![
            // A day and more ago: only the latest success counts it.
            result(&a[0], a[0].fence, DeliveryState::Delivered, None, 200, T0 + 100),
            result(&a[1], a[1].fence, DeliveryState::Waiting, Some(now + HOUR), 500, now - 2 * HOUR),
            result(&a[2], a[2].fence, DeliveryState::Dead, None, 422, now - 600_000),
        ])
        .await?;
    let bb = b.committer.claim(claim_req("ep_b", T0 + 10, 1, "node-1")).await?;
    b.committer.record(vec![result(&bb[0], bb[0].fence, DeliveryState::Delivered, None, 200, now - 300_000)]).await?;

    let ids = ["ep_a", "ep_b", "ep_c"].map(EndpointId::from_stored);
    let page = b.store.endpoint_health_page(&ids, now).await?;
    let ep_a = Health {
        attempts_1h: 1,
        successes_1h: 0,
        attempts_24h: 2,
        successes_24h: 0,
        last_success_at: Some(T0 + 100),
        last_attempt_at: Some(now - 600_000),
        backlog: 2,
        dead_letters: 1,
        // The latest of its failed attempts (the 422, not the older 500).
        last_error: Some(LastError { category: "permanent", status: Some(422), at: now - 600_000 }),
    };
    let ep_b = Health {
        attempts_1h: 1,
        successes_1h: 1,
        attempts_24h: 1,
        successes_24h: 1,
        last_success_at: Some(now - 300_000),
        last_attempt_at: Some(now - 300_000),
        backlog: 3,
        dead_letters: 0,
        last_error: None,
    };
    assert_eq!(page.len(), 2, "{page:?}");
    assert_eq!((page.get("ep_a"), page.get("ep_b")), (Some(&ep_a), Some(&ep_b)));
    assert_eq!(b.store.endpoint_health(&ids[0], now).await?, ep_a, "one endpoint reads as it does in a page");
    assert_eq!(b.store.endpoint_health(&ids[2], now).await?, Health::default());
    let only_b = b.store.endpoint_health_page(&ids[1..2], now).await?;
    assert_eq!(only_b.keys().collect::<Vec<_>>(), [&ids[1]]);
    assert!(b.store.endpoint_health_page(&[], now).await?.is_empty());
    Ok(())
}

/// Each change of state keeps its time and who made it (`state_since`, `state_by`): a new
/// endpoint's is its creation; a second pause of the same kind while the first runs keeps
/// the first's time; another kind, or a pause after the last ran out, starts anew; the end
/// of a timed pause dates from the pause's end.
async fn state_changes_keep_when_and_by_whom(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[])]).await?;
    let id = EndpointId::from_stored("ep_a");
    let read = || async { anyhow::Ok(b.store.endpoint(&id).await?.expect("endpoint")) };
    let was = |e: Endpoint| (e.state, e.state_since, e.state_by);
    let receiver = |until: Option<Millis>, now: Millis| EndpointChange {
        by: StateBy::Receiver,
        ..change("ep_a", EndpointState::Paused, until, now)
    };
    use EndpointState::*;
    assert_eq!(was(read().await?), (Active, Some(T0), None), "new: as old as the endpoint");
    b.committer.change_endpoint(receiver(Some(T0 + 1_000), T0 + 10)).await?;
    assert_eq!(was(read().await?), (Paused, Some(T0 + 10), Some(StateBy::Receiver)));
    b.committer.change_endpoint(receiver(Some(T0 + 2_000), T0 + 20)).await?;
    let e = read().await?;
    assert_eq!((e.paused_until, was(e)), (Some(T0 + 2_000), (Paused, Some(T0 + 10), Some(StateBy::Receiver))));
    b.committer.change_endpoint(change("ep_a", Paused, None, T0 + 30)).await?;
    assert_eq!(was(read().await?), (Paused, Some(T0 + 30), Some(StateBy::Operator)), "an operator's pause");
    b.committer.change_endpoint(change("ep_a", Active, None, T0 + 40)).await?;
    assert_eq!(was(read().await?), (Active, Some(T0 + 40), Some(StateBy::Operator)));
    b.committer.change_endpoint(receiver(Some(T0 + 100), T0 + 50)).await?;
    assert_eq!(b.store.end_timed_pauses(T0 + 200).await?.len(), 1);
    assert_eq!(was(read().await?), (Active, Some(T0 + 100), None), "active since the pause's end");
    // A pause that ran out, not yet ended in the store: the next one starts anew.
    b.committer.change_endpoint(receiver(Some(T0 + 400), T0 + 300)).await?;
    b.committer.change_endpoint(receiver(Some(T0 + 600), T0 + 500)).await?;
    assert_eq!(was(read().await?), (Paused, Some(T0 + 500), Some(StateBy::Receiver)));
    Ok(())
}

async fn claims_of_many_endpoints_in_one_commit_stay_apart(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[]), ("ep_b", &[]), ("ep_c", &[])]).await?;
    ingest(&b, (0..6).map(|i| event("acme", &format!("evt_{i}"), "t", T0 + i)).collect()).await?;
    let ops = vec![
        WriteOp::Claim(claim_req("ep_a", T0 + 10, 2, "node-1")),
        WriteOp::Claim(claim_req("ep_b", T0 + 10, 10, "node-1")),
        WriteOp::Claim(claim_req("ep_c", T0 + 2, 10, "node-2")),
    ];
    let results = b.store.apply(ops).await?;
    let claimed: Vec<Vec<Claimed>> = results
        .into_iter()
        .map(|r| match r {
            WriteResult::Claim(batch) => batch.claimed,
            other => panic!("{other:?}"),
        })
        .collect();
    let ids = |c: &[Claimed]| c.iter().map(|c| c.event_id.to_string()).collect::<Vec<_>>();
    assert_eq!(ids(&claimed[0]), ["evt_0", "evt_1"], "ep_a: its limit, in due order");
    assert_eq!(ids(&claimed[1]).len(), 6, "ep_b: all of its own, none of ep_a's");
    assert_eq!(ids(&claimed[2]), ["evt_0", "evt_1", "evt_2"], "ep_c: only what is due at its now");
    for (endpoint, c) in ["ep_a", "ep_b", "ep_c"].iter().zip(&claimed) {
        let filter = DeliveryFilter {
            endpoint: Some(EndpointId::from_stored(*endpoint)),
            state: Some(DeliveryState::Delivering),
            limit: 100,
            ..Default::default()
        };
        assert_eq!(b.store.list_deliveries(&filter).await?.len(), c.len(), "{endpoint}: leased in the same commit");
        // The fence handed out is the one a result must present.
        let r = result(&c[0], c[0].fence, DeliveryState::Delivered, None, 200, T0 + 20);
        assert_eq!(b.committer.record(vec![r]).await?, [true]);
    }
    // The rest of ep_a is still there for the next claim.
    let more = b.committer.claim(claim_req("ep_a", T0 + 10, 10, "node-1")).await?;
    assert_eq!(ids(&more), ["evt_2", "evt_3", "evt_4", "evt_5"]);
    Ok(())
}

/// What the store tells the engine about claims; like the engine, it opens an endpoint to
/// intake once told its claim found nothing else due.
#[derive(Default)]
struct Told(std::sync::Mutex<Vec<(String, u64, usize)>>);

impl store::Handoff for Told {
    fn owner(&self) -> &str {
        "node-a"
    }
    fn lease(&self, endpoint: &str, now: Millis) -> Option<Millis> {
        let told = self.0.lock().unwrap();
        told.iter().any(|(e, ..)| e == endpoint).then_some(now + 60_000)
    }
    fn claimed(&self, endpoint: &str, seq: u64, claimed: usize) {
        self.0.lock().unwrap().push((endpoint.to_string(), seq, claimed));
    }
}

/// A node applies its writes one commit at a time (SQLite's writer thread, the Postgres
/// store's commit loop), so a partition's claim that takes all that is due is told to the
/// engine as it is applied, with its place in that order: intake before it holds nothing
/// new for the partition, and intake after it, even in the same commit, already finds the
/// partition open. A full claim, or one whose lease another node holds, says nothing.
async fn a_drained_claim_is_told_in_the_order_of_writes(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_a", &[]), ("ep_b", &[])]).await?;
    let told = std::sync::Arc::new(Told::default());
    b.store.hand_off(told.clone());
    let before = b.committer.ingest(vec![event("acme", "evt_0", "t", T0)]).await?[0].seq;
    let in_partition = |limit| ClaimRequest { in_partition: true, ..claim_req("ep_a", T0 + 1, limit, "node-a") };
    let full = b.committer.claim_in_partition(in_partition(1), Some(T0 + 15_000)).await?.expect("lease taken");
    assert_eq!(full.claimed.len(), 1);
    assert!(told.0.lock().unwrap().is_empty(), "a full claim may have left work behind");
    let ops = vec![WriteOp::Claim(in_partition(10)), WriteOp::Ingest(vec![event("acme", "evt_1", "t", T0 + 2)])];
    let [WriteResult::Claim(drained), WriteResult::Ingest(after)] = &b.store.apply(ops).await?[..] else {
        panic!("a claim and an intake")
    };
    assert!(drained.claimed.is_empty());
    let heard = told.0.lock().unwrap().clone();
    assert_eq!(heard.len(), 1, "{heard:?}");
    let (endpoint, at, claimed) = heard[0].clone();
    assert_eq!((endpoint.as_str(), claimed), ("ep_a", 0));
    assert!(before > 0 && before < at && at < after[0].seq, "{before} < {at} < {}", after[0].seq);
    let leased: Vec<&str> = after[0].leased.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!((leased, after[0].endpoints.len()), (vec!["ep_a"], 1), "ep_a open in the same commit, ep_b not");
    let elsewhere = ClaimRequest { in_partition: true, ..claim_req("ep_b", T0 + 3, 10, "node-a") };
    assert!(b.store.acquire_partition(&EndpointId::from_stored("ep_b"), "node-b", T0, T0 + 15_000).await?);
    let refused = b.committer.claim_in_partition(elsewhere, None).await?;
    assert_eq!(refused.map(|c| c.claimed.len()), Some(0));
    assert_eq!(told.0.lock().unwrap().len(), 1, "a claim without the lease sees nothing for the partition");
    Ok(())
}

/// Behaviour that differs between the backends.
mod backend_specific {
    use super::*;

    /// On a shared store, a lease given at intake needs the stored partition lease: the
    /// engine's word that its partition is open is not enough. Where another node holds
    /// the partition, or none does, the delivery is queued, and the other nodes are told.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_leases_at_intake_only_under_the_stored_partition_lease() -> anyhow::Result<()> {
        let b = Opened::on(Backend::Postgres).await?;
        setup(&b, &[("ep_a", &[]), ("ep_b", &[]), ("ep_c", &[])]).await?;
        let (other, _) = b.another_node().await?;
        let mut rx = other.subscribe().await?.expect("Postgres nodes listen for each other's work");
        let offers = std::sync::Arc::new(Offers);
        b.store.hand_off(offers);
        assert!(b.store.acquire_partition(&EndpointId::from_stored("ep_a"), "node-a", T0, T0 + 15_000).await?);
        assert!(b.store.acquire_partition(&EndpointId::from_stored("ep_b"), "node-b", T0, T0 + 15_000).await?);
        let out = b.committer.ingest(vec![event("acme", "evt_1", "t", T0 + 1)]).await?;
        let leased: Vec<&str> = out[0].leased.iter().map(|(e, _)| e.as_str()).collect();
        let mut queued: Vec<&str> = out[0].endpoints.iter().map(EndpointId::as_str).collect();
        queued.sort();
        assert_eq!((leased, queued, out[0].deliveries), (vec!["ep_a"], vec!["ep_b", "ep_c"], 3));
        let woken = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await?.expect("notification");
        let Notice::Work(mut woken) = woken else { panic!("new work, not {woken:?}") };
        woken.sort();
        assert_eq!(woken, [EndpointId::from_stored("ep_b"), EndpointId::from_stored("ep_c")], "not ep_a");
        // Stored as a first claim would leave it: its fence records the result.
        let (_, handed) = &out[0].leased[0];
        assert_eq!(handed.fence, 1);
        let r = result(handed, 1, DeliveryState::Delivered, None, 200, T0 + 20);
        assert_eq!(b.committer.record(vec![r]).await?, [true]);
        // Past the stored lease, nothing more is leased at intake.
        let late = b.committer.ingest(vec![event("acme", "evt_2", "t", T0 + 15_001)]).await?;
        assert!(late[0].leased.is_empty(), "{late:?}");
        Ok(())
    }

    /// A node whose partitions would take anything at intake.
    struct Offers;

    impl store::Handoff for Offers {
        fn owner(&self) -> &str {
            "node-a"
        }
        fn lease(&self, _endpoint: &str, now: Millis) -> Option<Millis> {
            Some(now + 60_000)
        }
        fn claimed(&self, _endpoint: &str, _seq: u64, _claimed: usize) {}
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_id_has_one_live_holder() -> anyhow::Result<()> {
        let b = Opened::on(Backend::Postgres).await?;
        let (other, _) = b.another_node().await?;
        let held = b.store.hold_node_id("node-a").await?.expect("a free id is granted");
        assert!(other.hold_node_id("node-a").await?.is_none(), "held by the first");
        assert!(other.hold_node_id("node-b").await?.is_some(), "another id is free");
        assert!(!*held.lost.borrow());
        drop(held);
        // Dropping the lock ends its session, which frees the id (as a killed process's does).
        tests::eventually("the id comes free", Duration::from_secs(10), || async {
            Ok(other.hold_node_id("node-a").await?.map(drop).ok_or_else(|| "still held".to_string()))
        })
        .await?;
        // A schema is a store of its own: the same id there is another node's.
        let elsewhere = Opened::on(Backend::Postgres).await?;
        assert!(elsewhere.store.hold_node_id("node-b").await?.is_some());
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn intake_wakes_the_other_nodes() -> anyhow::Result<()> {
        let b = Opened::on(Backend::Postgres).await?;
        setup(&b, &[("ep_a", &[]), ("ep_b", &["b"])]).await?;
        let (other, _) = b.another_node().await?;
        let mut rx = other.subscribe().await?.expect("Postgres nodes listen for each other's work");
        ingest(&b, vec![event("acme", "evt_1", "a", T0)]).await?;
        let woken = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await?.expect("notification");
        assert_eq!(woken, Notice::Work(vec![EndpointId::from_stored("ep_a")]));
        ingest(&b, vec![event("acme", "evt_2", "b", T0), event("acme", "evt_3", "b", T0)]).await?;
        let Some(Notice::Work(mut woken)) = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await? else {
            panic!("a notification of new work")
        };
        woken.sort();
        assert_eq!(woken, [EndpointId::from_stored("ep_a"), EndpointId::from_stored("ep_b")]);

        // Another schema on the same server is not woken.
        let c = Opened::on(Backend::Postgres).await?;
        let mut rx_c = c.store.subscribe().await?.expect("listener");
        ingest(&b, vec![event("acme", "evt_4", "a", T0)]).await?;
        tokio::time::timeout(Duration::from_secs(5), rx.recv()).await?.expect("notification");
        assert!(tokio::time::timeout(Duration::from_millis(300), rx_c.recv()).await.is_err(), "schemas are separate");
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_endpoint_change_is_announced_to_the_other_nodes() -> anyhow::Result<()> {
        let b = Opened::on(Backend::Postgres).await?;
        setup(&b, &[("ep_a", &[]), ("ep_b", &[])]).await?;
        let (other, _) = b.another_node().await?;
        let mut rx = other.subscribe().await?.expect("Postgres nodes listen for each other's changes");
        let changed = [EndpointId::from_stored("ep_a"), EndpointId::from_stored("ep_b")];
        b.store.announce_changed(&changed).await?;
        let heard = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await?.expect("notification");
        assert_eq!(heard, Notice::Changed(changed.to_vec()));
        Ok(())
    }

    /// The database, its WAL and its shared-memory index hold secrets: owner-only files.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_files_are_private() -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let b = Opened::on(Backend::Sqlite).await?;
        setup(&b, &[("ep_a", &[])]).await?;
        ingest(&b, vec![event("acme", "evt_1", "a", T0)]).await?;
        let Storage::Dir(dir) = &b._storage else { unreachable!() };
        for name in ["herald.db", "herald.db-wal", "herald.db-shm"] {
            let mode = std::fs::metadata(dir.path().join(name))?.permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{name} has mode {mode:o}");
        }
        Ok(())
    }

    /// The writer never copies the WAL back inline until it is large, and the checkpointer
    /// thread can never finish while the writer keeps appending: only the writer's own
    /// inline checkpoint lets the WAL start over. Under commits that never pause, with
    /// readers alongside, the file must stay bounded (it grew past 100 MB without that).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_wal_stays_bounded_under_sustained_writes() -> anyhow::Result<()> {
        let b = Opened::on(Backend::Sqlite).await?;
        setup(&b, &[("ep_b", &[]), ("ep_c", &[])]).await?;
        let wal = std::path::PathBuf::from(format!("{}-wal", b.url.trim_start_matches("sqlite://")));
        let pad = "x".repeat(2000);
        let mut writers = tokio::task::JoinSet::new();
        for w in 0..8 {
            let (committer, pad) = (b.committer.clone(), pad.clone());
            writers.spawn(async move {
                for c in 0..40 {
                    let events = (0..50)
                        .map(|i| {
                            let mut e = event("acme", &format!("evt_{w}_{c}_{i}"), "t", T0);
                            e.payload = format!("{{\"pad\": \"{pad}\"}}");
                            e
                        })
                        .collect();
                    committer.ingest(events).await?;
                }
                anyhow::Ok(())
            });
        }
        let reader = {
            let store = b.store.clone();
            tokio::spawn(async move {
                let filter = DeliveryFilter { limit: 10, ..Default::default() };
                loop {
                    store.list_deliveries(&filter).await?;
                }
                #[allow(unreachable_code)]
                anyhow::Ok(())
            })
        };
        let mut largest = 0;
        while let Some(w) = tokio::time::timeout(Duration::from_secs(60), writers.join_next()).await? {
            w??;
            largest = largest.max(std::fs::metadata(&wal)?.len());
        }
        reader.abort();
        let filter =
            DeliveryFilter { endpoint: Some(EndpointId::from_stored("ep_c")), limit: 20_000, ..Default::default() };
        assert_eq!(b.store.list_deliveries(&filter).await?.len(), 8 * 40 * 50, "every event fanned out");
        assert!(largest < 40 << 20, "the WAL grew to {} MB", largest >> 20);
        Ok(())
    }

    #[tokio::test]
    async fn sqlite_is_a_single_node_store() -> anyhow::Result<()> {
        let b = Opened::on(Backend::Sqlite).await?;
        assert!(b.store.subscribe().await?.is_none());
        Ok(())
    }
}

/// The two schemas held together: after every migration, SQLite and Postgres have the same
/// tables, columns (through [`schemas::TYPES`]), nullability, primary keys and indexes (name,
/// table, columns, uniqueness, partial predicate), save the listed
/// [`schemas::EXCEPTIONS`]. An exception that no longer applies fails too, so the list stays
/// true.
mod schemas {
    use std::collections::BTreeSet;
    use std::str::FromStr;

    use sqlx::{Connection, Row};

    use super::Opened;
    use tests::Backend;

    /// Column types, each engine's to the one both are compared as: `(engine, its type, as)`.
    /// A type missing here fails the test, so a new one is mapped on purpose.
    const TYPES: [(Backend, &str, &str); 9] = [
        (Backend::Sqlite, "TEXT", "text"),
        (Backend::Sqlite, "INTEGER", "integer"),
        (Backend::Sqlite, "REAL", "real"),
        (Backend::Postgres, "text", "text"),
        // Instants, counts and numbers are BIGINT; `catalog_revision.id` is a plain INTEGER.
        (Backend::Postgres, "bigint", "integer"),
        (Backend::Postgres, "integer", "integer"),
        // SQLite has no boolean: a flag is an INTEGER 0 or 1.
        (Backend::Postgres, "boolean", "integer"),
        (Backend::Postgres, "double precision", "real"),
        (Backend::Postgres, "timestamp with time zone", "timestamp"),
    ];

    /// A fact of one side that the other side lacks, on purpose.
    struct Exception {
        side: Backend,
        /// As [`facts`] writes it; `table <name>` covers every fact of that table.
        fact: &'static str,
        reason: &'static str,
    }

    const ORDERED: &str = "SQLite orders a key's (and a poll endpoint's) deliveries by rowid, the implicit last \
                           column of every index; Postgres has no rowid and numbers them from the deliveries_seq \
                           sequence";

    const EXCEPTIONS: &[Exception] = &[
        Exception {
            side: Backend::Postgres,
            fact: "table cluster_nodes",
            reason: "cluster membership: SQLite is a single-node store",
        },
        Exception { side: Backend::Postgres, fact: "column deliveries.seq integer null", reason: ORDERED },
        Exception {
            side: Backend::Postgres,
            fact: "index deliveries_ordered on deliveries (endpoint_id, ordering_key, seq) where ordering_key is not null and state in 'queued', 'waiting', 'delivering', 'dead'",
            reason: ORDERED,
        },
        Exception {
            side: Backend::Sqlite,
            fact: "index deliveries_ordered on deliveries (endpoint_id, ordering_key) where ordering_key is not null and state in 'queued', 'waiting', 'delivering', 'dead'",
            reason: ORDERED,
        },
        Exception {
            side: Backend::Postgres,
            fact: "index deliveries_pull on deliveries (endpoint_id, seq) where state in 'queued', 'waiting' and next_attempt_at is null",
            reason: ORDERED,
        },
        Exception {
            side: Backend::Sqlite,
            fact: "index deliveries_pull on deliveries (endpoint_id) where state in 'queued', 'waiting' and next_attempt_at is null",
            reason: ORDERED,
        },
        Exception {
            side: Backend::Postgres,
            fact: "column tokens.id text not null",
            reason: "known difference: SQLite's ALTER TABLE cannot make the added column NOT NULL (0005_token_ids); \
                     every insert sets it",
        },
        Exception {
            side: Backend::Sqlite,
            fact: "column tokens.id text null",
            reason: "known difference: SQLite's ALTER TABLE cannot make the added column NOT NULL (0005_token_ids); \
                     every insert sets it",
        },
    ];

    /// One side's schema as facts `(table, fact)`, each a line of text.
    type Facts = BTreeSet<(String, String)>;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_schemas_match() -> anyhow::Result<()> {
        let (lite, pg) = (Opened::on(Backend::Sqlite).await?, Opened::on(Backend::Postgres).await?);
        let lite = sqlite_facts(&lite.url).await?;
        let pg = postgres_facts(&pg.url).await?;
        let mut wrong = Vec::new();
        for (side, ours, theirs) in [(Backend::Sqlite, &lite, &pg), (Backend::Postgres, &pg, &lite)] {
            let excepted = |(table, fact): &(String, String)| {
                EXCEPTIONS.iter().any(|e| e.side == side && (e.fact == fact || e.fact == format!("table {table}")))
            };
            for f in ours.difference(theirs).filter(|f| !excepted(f)) {
                wrong.push(format!("only in {side:?}: {}", f.1));
            }
        }
        for e in EXCEPTIONS {
            let (ours, theirs) = if e.side == Backend::Sqlite { (&lite, &pg) } else { (&pg, &lite) };
            let holds = ours.iter().any(|(t, f)| f == e.fact || e.fact == format!("table {t}"))
                && !theirs.iter().any(|(t, f)| f == e.fact || e.fact == format!("table {t}"));
            if !holds {
                wrong.push(format!("exception no longer applies ({:?}: {}; {})", e.side, e.fact, e.reason));
            }
        }
        assert!(wrong.is_empty(), "the SQLite and Postgres schemas differ:\n{}", wrong.join("\n"));
        Ok(())
    }

    /// The type both sides are compared as, or an error naming the unmapped type.
    fn mapped(side: Backend, table: &str, column: &str, ty: &str) -> anyhow::Result<&'static str> {
        TYPES.iter().find(|(s, t, _)| *s == side && t.eq_ignore_ascii_case(ty)).map(|(_, _, c)| *c).ok_or_else(|| {
            anyhow::anyhow!("{side:?} type {ty:?} of {table}.{column} is not in TYPES: map it to the other store's")
        })
    }

    fn column(table: &str, name: &str, ty: &str, not_null: bool) -> (String, String) {
        let null = if not_null { "not null" } else { "null" };
        (table.into(), format!("column {table}.{name} {ty} {null}"))
    }

    /// A named index, or (`name` None) the index of a UNIQUE constraint, whose name each
    /// engine makes up.
    fn index(
        name: Option<&str>,
        table: &str,
        columns: &[String],
        unique: bool,
        predicate: Option<&str>,
    ) -> (String, String) {
        let mut fact = match name {
            Some(name) => format!("index {name} on {table} ({})", columns.join(", ")),
            None => format!("unique constraint on {table} ({})", columns.join(", ")),
        };
        if unique && name.is_some() {
            fact.push_str(" unique");
        }
        if let Some(p) = predicate {
            fact.push_str(&format!(" where {}", normal_predicate(p)));
        }
        (table.into(), fact)
    }

    /// A partial index's predicate in one spelling: Postgres's `(state = ANY (ARRAY['a'::text,
    /// 'b'::text]))` and SQLite's `state IN ('a','b')` both read `state in 'a', 'b'`.
    fn normal_predicate(p: &str) -> String {
        let p = p.replace("::text", "").replace("= ANY (ARRAY[", "IN (").replace("])", ")").replace(',', ", ");
        let p: String = p.chars().filter(|c| !matches!(c, '(' | ')')).collect();
        p.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
    }

    /// Herald's tables, less the migrator's own.
    fn ours(table: &str) -> bool {
        table != "_sqlx_migrations"
    }

    async fn sqlite_facts(url: &str) -> anyhow::Result<Facts> {
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)?.read_only(true);
        let mut conn = sqlx::SqliteConnection::connect_with(&options).await?;
        let tables: Vec<String> =
            sqlx::query_scalar("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
                .fetch_all(&mut conn)
                .await?;
        let mut facts = Facts::new();
        for table in tables.iter().filter(|t| ours(t)) {
            facts.insert((table.clone(), format!("table {table}")));
            let columns = sqlx::query(r#"SELECT name, type, "notnull", pk FROM pragma_table_info(?1)"#)
                .bind(table)
                .fetch_all(&mut conn)
                .await?;
            let mut key = Vec::new();
            for c in &columns {
                let (name, ty, not_null, pk): (String, String, bool, i64) =
                    (c.try_get(0)?, c.try_get(1)?, c.try_get(2)?, c.try_get(3)?);
                // A key column is NOT NULL on both sides (SQLite lets a rowid table's
                // non-integer key hold NULL, which Herald never writes).
                facts.insert(column(table, &name, mapped(Backend::Sqlite, table, &name, &ty)?, not_null || pk > 0));
                if pk > 0 {
                    key.push((pk, name));
                }
            }
            key.sort();
            let key: Vec<String> = key.into_iter().map(|(_, n)| n).collect();
            if !key.is_empty() {
                facts.insert((table.clone(), format!("primary key {table} ({})", key.join(", "))));
            }
            let indexes = sqlx::query(r#"SELECT name, "unique", origin FROM pragma_index_list(?1)"#)
                .bind(table)
                .fetch_all(&mut conn)
                .await?;
            for i in &indexes {
                let (name, unique, origin): (String, bool, String) = (i.try_get(0)?, i.try_get(1)?, i.try_get(2)?);
                if origin == "pk" {
                    continue;
                }
                let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_index_info(?1) ORDER BY seqno")
                    .bind(&name)
                    .fetch_all(&mut conn)
                    .await?;
                let sql: Option<String> = sqlx::query_scalar("SELECT sql FROM sqlite_schema WHERE name = ?1")
                    .bind(&name)
                    .fetch_one(&mut conn)
                    .await?;
                let sql = sql.unwrap_or_default().split_whitespace().collect::<Vec<_>>().join(" ");
                let predicate = sql.to_uppercase().find(" WHERE ").map(|at| &sql[at + 7..]);
                let name = (origin == "c").then_some(name.as_str());
                facts.insert(index(name, table, &columns, unique, predicate));
            }
        }
        Ok(facts)
    }

    async fn postgres_facts(url: &str) -> anyhow::Result<Facts> {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT table_name::text FROM information_schema.tables
             WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'",
        )
        .fetch_all(&mut conn)
        .await?;
        let mut facts = Facts::new();
        for table in tables.iter().filter(|t| ours(t)) {
            facts.insert((table.clone(), format!("table {table}")));
        }
        let columns = sqlx::query(
            "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text
             FROM information_schema.columns WHERE table_schema = current_schema()",
        )
        .fetch_all(&mut conn)
        .await?;
        for c in &columns {
            let (table, name, ty, nullable): (String, String, String, String) =
                (c.try_get(0)?, c.try_get(1)?, c.try_get(2)?, c.try_get(3)?);
            if ours(&table) {
                facts.insert(column(&table, &name, mapped(Backend::Postgres, &table, &name, &ty)?, nullable == "NO"));
            }
        }
        let indexes = sqlx::query(
            "SELECT i.relname::text, t.relname::text, x.indisunique, x.indisprimary,
                    EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid AND c.contype = 'u'),
                    pg_get_expr(x.indpred, x.indrelid),
                    ARRAY(SELECT a.attname::text FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
                          JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum ORDER BY k.n)
             FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
             WHERE t.relnamespace = current_schema()::regnamespace",
        )
        .fetch_all(&mut conn)
        .await?;
        for i in &indexes {
            let (name, table, unique, primary, constraint): (String, String, bool, bool, bool) =
                (i.try_get(0)?, i.try_get(1)?, i.try_get(2)?, i.try_get(3)?, i.try_get(4)?);
            let (predicate, columns): (Option<String>, Vec<String>) = (i.try_get(5)?, i.try_get(6)?);
            if !ours(&table) {
                continue;
            }
            if primary {
                facts.insert((table.clone(), format!("primary key {table} ({})", columns.join(", "))));
            } else {
                let name = (!constraint).then_some(name.as_str());
                facts.insert(index(name, &table, &columns, unique, predicate.as_deref()));
            }
        }
        Ok(facts)
    }
}

fn audit_entry(id: &str) -> AuditEntry {
    AuditEntry {
        id: id.into(),
        at: T0,
        actor: "token:tok_1".into(),
        tenant: Some(TenantId::parse("acme").unwrap()),
        route: "PATCH /v1/tenants/{tenant}/endpoints/{id}".into(),
        kind: "endpoint".into(),
        resource: Some("ep_a".into()),
        fields: vec!["url".into()],
        client: Some("127.0.0.1".into()),
    }
}

/// The ids of every stored audit entry, newest first.
async fn audit_ids(b: &Opened) -> anyhow::Result<Vec<String>> {
    Ok(b.store.audit_page(&AuditFilter::default(), 100).await?.into_iter().map(|e| e.id).collect())
}

async fn an_audit_entry_commits_with_its_change_only(b: Opened) -> anyhow::Result<()> {
    use store::audit::scope;
    setup(&b, &[("ep_a", &[])]).await?;
    assert!(audit_ids(&b).await?.is_empty(), "writes outside a request's scope leave no entry");
    let mut ep = endpoint("acme", "ep_a", &["x"], T0);
    // An administrative write that changes a row: its entry, in its transaction.
    let (changed, left) = scope(audit_entry("au_1"), b.store.update_endpoint(&ep)).await;
    assert!(changed? && left.is_none());
    let stored = b.store.audit_page(&AuditFilter::default(), 10).await?;
    assert_eq!(stored, vec![audit_entry("au_1")], "read back as written");
    // One that finds nothing to change, and one that fails: no entry, handed back.
    let ghost = endpoint("acme", "ep_ghost", &[], T0);
    let (changed, left) = scope(audit_entry("au_2"), b.store.update_endpoint(&ghost)).await;
    assert!(!changed? && left.is_some());
    let (failed, left) = scope(audit_entry("au_3"), b.store.create_tenant(&tenant("acme"))).await;
    assert!(failed.is_err() && left.is_some(), "a tenant twice is refused");
    // A group commit carries the entry beside the endpoint change.
    let paused = change("ep_a", EndpointState::Paused, None, T0 + 1);
    let (done, left) = scope(audit_entry("au_4"), b.committer.change_endpoint(paused)).await;
    done?;
    assert!(left.is_none());
    // A request that writes twice is logged once.
    ep.updated_at = T0 + 2;
    let twice = async {
        b.store.update_endpoint(&ep).await?;
        b.store.update_endpoint(&ep).await
    };
    let (done, left) = scope(audit_entry("au_5"), twice).await;
    assert!(done? && left.is_none());
    assert_eq!(audit_ids(&b).await?, ["au_5", "au_4", "au_1"]);
    // Filters and the cursor.
    let store = &b.store;
    let only = |f: AuditFilter| async move { store.audit_page(&f, 10).await.map(|p| p.len()) };
    let resources = Some(vec!["ep_a".to_string(), "ep_b".to_string()]);
    assert_eq!(only(AuditFilter { resources, ..AuditFilter::default() }).await?, 3);
    assert_eq!(only(AuditFilter { resources: Some(vec![]), ..AuditFilter::default() }).await?, 0);
    assert_eq!(only(AuditFilter { before: Some("au_4".into()), ..AuditFilter::default() }).await?, 1);
    assert_eq!(only(AuditFilter { actor: Some("admin".into()), ..AuditFilter::default() }).await?, 0);
    // Retention: entries older than delivered work's horizon go, a batch at a time.
    assert_eq!(b.store.purge(T0, T0, 100).await?, 0, "none older than T0");
    assert_eq!(b.store.purge(T0 + 1, T0, 2).await?, 2, "a full batch");
    assert_eq!(b.store.purge(T0 + 1, T0, 2).await?, 1);
    assert!(audit_ids(&b).await?.is_empty());
    Ok(())
}

/// A verified endpoint's state (migration 0017) reads back as written, survives a change of
/// the endpoint's settings (which never writes it), and is stored for an existing endpoint only.
async fn an_endpoints_verification_is_stored_apart_from_its_settings(b: Opened) -> anyhow::Result<()> {
    setup(&b, &[("ep_v", &[])]).await?;
    let id = EndpointId::from_stored("ep_v");
    assert_eq!(b.store.endpoint(&id).await?.expect("endpoint").verification, None, "never tried");
    let url = "http://127.0.0.1:9/ep_v";
    let failed = Verification::failed(None, url, "answered 404, not 2xx with the challenge".into(), T0);
    assert!(b.store.put_verification(&id, &failed).await?);
    let mut e = b.store.endpoint(&id).await?.expect("endpoint");
    assert_eq!(e.verification.as_ref(), Some(&failed));
    e.spec.description = "changed".into();
    e.updated_at = T0 + 1;
    assert!(b.store.update_endpoint(&e).await?);
    assert_eq!(b.store.endpoint(&id).await?.expect("endpoint").verification, Some(failed), "kept");
    let verified = Verification::verified(url, T0 + 2);
    assert!(b.store.put_verification(&id, &verified).await?);
    let listed = b.store.list_endpoints(&TenantId::parse("acme")?).await?;
    assert_eq!(listed[0].verification.as_ref(), Some(&verified));
    assert!(!b.store.put_verification(&EndpointId::from_stored("ep_none"), &verified).await?);
    Ok(())
}
