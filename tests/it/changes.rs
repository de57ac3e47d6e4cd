//! A change to an endpoint takes effect on its partition within a second (issue 13): a
//! partition waiting out an interval planned at the old rate is woken and re-paced, an
//! enabled endpoint resumes, and across Postgres nodes the one pacing the endpoint hears of
//! a change made through another.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{Value, json};
use sqlx::Connection as _;
use tests::pg::PgSchema;
use tests::{ADMIN_TOKEN, Answer, Api, Backend, FakeReceiver, TestGateway};

/// What the issue promises: the first arrival after a change, within this.
const APPLIES_WITHIN: Duration = Duration::from_secs(1);
/// So slow that, unchanged, the second delivery would come 100 s after the first.
const SLOW: f64 = 0.01;
const BACKLOG: usize = 20;

tests::backends!(
    a_faster_rate_applies_within_a_second,
    enabling_a_paused_endpoint_applies_within_a_second,
    a_faster_rate_set_in_the_database_applies_within_a_second,
    changes_while_delivering_send_each_delivery_once
);

/// Creates tenant `acme` and an endpoint at `rate`; returns its id.
async fn endpoint(api: &Api, rx: &FakeReceiver, rate: f64) -> anyhow::Result<String> {
    api.tenant("acme").await?;
    let ep = api.endpoint("acme", json!({"url": rx.url(), "rate_per_sec": rate, "burst": 1})).await?;
    Ok(ep["id"].as_str().expect("id").to_string())
}

async fn post_backlog(api: &Api) -> anyhow::Result<()> {
    let events: Vec<Value> = (0..BACKLOG).map(|i| json!({"type": "invoice.paid", "payload": {"n": i}})).collect();
    let r = api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, json!({"events": events})).await?;
    anyhow::ensure!(r.status == 202, "batch refused: {} {}", r.status, r.text);
    Ok(())
}

/// Sends `body` to the endpoint (`path` after its id) and returns when it was sent.
async fn change(api: &Api, id: &str, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Instant> {
    let at = Instant::now();
    let r = api.call(method, &format!("/v1/tenants/acme/endpoints/{id}{path}"), ADMIN_TOKEN, body).await?;
    anyhow::ensure!(r.status == 200, "{method} {path} refused: {} {}", r.status, r.text);
    Ok(at)
}

/// PATCHes the slow endpoint fast through `api`: its second delivery must arrive within
/// [`APPLIES_WITHIN`] of the PATCH, and the backlog then drains.
async fn speed_up(api: &Api, rx: &FakeReceiver, id: &str) -> anyhow::Result<()> {
    // Unchanged, the next delivery is 100 s away.
    rx.stays_at(1, Duration::from_millis(300)).await.map_err(|e| e.context("the slow rate holds until the change"))?;
    let patched = change(api, id, "PATCH", "", Some(json!({"rate_per_sec": 1000}))).await?;
    let got = rx.wait_for(2, APPLIES_WITHIN).await?;
    let after = got[1].at.duration_since(patched);
    assert!(after <= APPLIES_WITHIN, "first arrival {after:?} after the PATCH");
    rx.wait_for(BACKLOG, Duration::from_secs(10)).await?;
    Ok(())
}

/// The backlog's first delivery went at once (burst 1); the next one is 100 s away at the
/// old rate. A PATCH to a fast rate gets it out within a second, and the rest follow.
async fn a_faster_rate_applies_within_a_second(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    let id = endpoint(&gw.api, &rx, SLOW).await?;
    post_backlog(&gw.api).await?;
    rx.wait_for(1, Duration::from_secs(10)).await?;

    speed_up(&gw.api, &rx, &id).await
}

/// An endpoint held for a human (401) sends nothing; re-enabling it sends its held
/// deliveries within a second.
async fn enabling_a_paused_endpoint_applies_within_a_second(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    rx.script([Answer::status(401)]);
    let id = endpoint(&gw.api, &rx, 10.0).await?;
    post_backlog(&gw.api).await?;
    rx.wait_for(1, Duration::from_secs(10)).await?;
    gw.api
        .wait_for(&format!("/v1/tenants/acme/endpoints/{id}"), Duration::from_secs(10), |v| v["state"] == "paused")
        .await?;
    // At 10/s a paused endpoint that still sent would show within 100 ms.
    rx.stays_at(1, Duration::from_millis(300)).await.map_err(|e| e.context("a paused endpoint sends nothing"))?;

    let enabled = change(&gw.api, &id, "POST", "/enable", None).await?;
    let got = rx.wait_for(2, APPLIES_WITHIN).await?;
    let after = got[1].at.duration_since(enabled);
    assert!(after <= APPLIES_WITHIN, "first arrival {after:?} after enabling");
    Ok(())
}

/// The same change made in the database (an operator's script, a restore): no API call,
/// so no node announces it. The node's check of versions finds it within a second.
async fn a_faster_rate_set_in_the_database_applies_within_a_second(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[]).await?;
    let rx = FakeReceiver::start().await?;
    let id = endpoint(&gw.api, &rx, SLOW).await?;
    post_backlog(&gw.api).await?;
    rx.wait_for(1, Duration::from_secs(10)).await?;
    rx.stays_at(1, Duration::from_millis(300)).await.map_err(|e| e.context("the slow rate holds until the change"))?;

    let changed = Instant::now();
    set_rate_in_database(&gw, b, &id, 1000).await?;
    let got = rx.wait_for(2, APPLIES_WITHIN).await?;
    let after = got[1].at.duration_since(changed);
    assert!(after <= APPLIES_WITHIN, "first arrival {after:?} after the change in the database");
    rx.wait_for(BACKLOG, Duration::from_secs(10)).await?;
    Ok(())
}

/// Sets the endpoint's stored rate with SQL of the node's own store, as a script would.
async fn set_rate_in_database(gw: &TestGateway, b: Backend, id: &str, rate: u32) -> anyhow::Result<()> {
    db_of(gw, b).set_rate(id, rate).await
}

/// A node's database, as a script outside Herald reaches it: its URL.
enum Db {
    Sqlite(String),
    Postgres(String),
}

impl Db {
    /// Sets the endpoint's stored rate in one `UPDATE`, as a script would.
    async fn set_rate(&self, id: &str, rate: u32) -> anyhow::Result<()> {
        let done = match self {
            Db::Sqlite(url) => {
                let mut conn = sqlx::SqliteConnection::connect(url).await?;
                sqlx::query("UPDATE endpoints SET spec = json_set(spec, '$.rate_per_sec', $1) WHERE id = $2")
                    .bind(i64::from(rate))
                    .bind(id)
                    .execute(&mut conn)
                    .await?
                    .rows_affected()
            }
            Db::Postgres(url) => {
                let mut conn = sqlx::PgConnection::connect(url).await?;
                sqlx::query(
                    "UPDATE endpoints SET spec = jsonb_set(spec::jsonb, '{rate_per_sec}', to_jsonb($1))::text \
                     WHERE id = $2",
                )
                .bind(i64::from(rate))
                .bind(id)
                .execute(&mut conn)
                .await?
                .rows_affected()
            }
        };
        anyhow::ensure!(done == 1, "no endpoint {id} in the database");
        Ok(())
    }
}

/// Endpoints and events of the run below: every event goes to every endpoint.
const MANY_ENDPOINTS: usize = 20;
const EVENTS: usize = 25;
/// Their rates: claimed at `CLAIMED_AT`, slowed to `SLOWED_TO` at once, then drained at
/// `DRAINED_AT`.
const CLAIMED_AT: u32 = 20;
const SLOWED_TO: u32 = 1;
const DRAINED_AT: u32 = 200;

/// Many busy endpoints slowed mid-claim and sped up again, half through the API
/// (announced) and half in the database (found by the node's check of versions): every
/// delivery arrives exactly once at its endpoint. A claim at 20/s is leased for a second of
/// that rate (plus the 1 s timeout and the 1 s margin here); at 1/s its queue outlives
/// those leases, and lease recovery hands them out again while the old claim still holds
/// them. After a change a partition hands back what it claimed on the old settings and
/// claims it again on the new ones.
async fn changes_while_delivering_send_each_delivery_once(b: Backend) -> anyhow::Result<()> {
    let gw = TestGateway::start_on(b, &[("HERALD_DELIVERY_LEASE_MARGIN", "1s")]).await?;
    let rx = FakeReceiver::start().await?;
    gw.api.tenant("acme").await?;
    let mut ids = Vec::new();
    for i in 0..MANY_ENDPOINTS {
        let body = json!({"url": format!("{}/{i}", rx.url()), "rate_per_sec": CLAIMED_AT, "burst": 1, "timeout": "1s"});
        ids.push(gw.api.endpoint("acme", body).await?["id"].as_str().context("endpoint id")?.to_string());
    }
    let db = db_of(&gw, b);
    let total = MANY_ENDPOINTS * EVENTS;
    let events: Vec<Value> =
        (0..EVENTS).map(|n| json!({"id": format!("evt_{n}"), "type": "t", "payload": {"n": n}})).collect();
    let r = gw.api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, json!({"events": events})).await?;
    anyhow::ensure!(r.status == 202, "batch refused: {} {}", r.status, r.text);
    set_rates(&gw.api, &db, &ids, SLOWED_TO).await?;
    let slowed = rx.count();
    anyhow::ensure!(slowed < total / 2, "{slowed} of {total} arrived before the endpoints were slowed");
    // Ten seconds at the slow rate: past the claims' leases and the next lease recovery.
    let slow = MANY_ENDPOINTS * 10 * SLOWED_TO as usize;
    rx.wait_for(slowed + slow, Duration::from_secs(30)).await?;
    set_rates(&gw.api, &db, &ids, DRAINED_AT).await?;
    rx.wait_for(total, Duration::from_secs(30)).await?;
    let delivered = format!("/v1/tenants/acme/deliveries?state=delivered&limit={total}");
    gw.api
        .wait_for(&delivered, Duration::from_secs(30), |v| v["data"].as_array().is_some_and(|d| d.len() == total))
        .await?;

    let mut arrivals: HashMap<(String, String), usize> = HashMap::new();
    for r in rx.received() {
        let id = r.header("webhook-id").context("a webhook-id")?.to_string();
        *arrivals.entry((r.path.clone(), id)).or_default() += 1;
    }
    let mut twice: Vec<_> = arrivals.iter().filter(|(_, n)| **n > 1).collect();
    twice.sort();
    assert_eq!(arrivals.len(), total, "every delivery arrived");
    let some = &twice[..twice.len().min(5)];
    assert!(twice.is_empty(), "{} of {total} deliveries arrived more than once, among them {some:?}", twice.len());
    Ok(())
}

/// Where [`set_rate_in_database`] writes: the node's SQLite file or Postgres schema.
fn db_of(gw: &TestGateway, b: Backend) -> Db {
    match b {
        Backend::Sqlite => Db::Sqlite(format!("sqlite://{}", gw.dir.path().join("herald.db").display())),
        Backend::Postgres => Db::Postgres(gw.schema().map(|s| s.url.clone()).unwrap_or_default()),
    }
}

/// Sets every endpoint's rate, one through the API and the next in the database, all at
/// once.
async fn set_rates(api: &Api, db: &Db, ids: &[String], rate: u32) -> anyhow::Result<()> {
    let changes = ids.iter().enumerate().map(|(i, id)| async move {
        match i % 2 {
            0 => change(api, id, "PATCH", "", Some(json!({"rate_per_sec": rate}))).await.map(drop),
            _ => db.set_rate(id, rate).await,
        }
    });
    futures::future::try_join_all(changes).await.map(drop)
}

/// Node A paces the endpoint; the PATCH goes through node B, which started later and so
/// never held the partition. A hears of it through the store's notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_another_node_applies_within_a_second() -> anyhow::Result<()> {
    let schema = PgSchema::create().await?;
    let store = [("HERALD_STORE_URL", schema.url.as_str())];
    let a = TestGateway::start_in(tempfile::tempdir()?, &store).await?;
    let rx = FakeReceiver::start().await?;
    let id = endpoint(&a.api, &rx, SLOW).await?;
    post_backlog(&a.api).await?;
    rx.wait_for(1, Duration::from_secs(10)).await?;

    let b = TestGateway::start_in(tempfile::tempdir()?, &store).await?;
    speed_up(&b.api, &rx, &id).await
}
