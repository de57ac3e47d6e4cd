//! The transactional outbox relay, end to end: a producer's Postgres schema with the shipped
//! DDL, the real `herald` binary relaying it (on SQLite or a Postgres store of its own),
//! and a receiver that records what arrives.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};
use tests::pg::PgSchema;
use tests::{ADMIN_TOKEN, Api, Backend, FakeReceiver, HeraldProcess, herald_binary};

tests::backends!(
    committed_rows_arrive_and_rolled_back_ones_never,
    rows_failing_an_enforced_catalog_are_parked_with_the_path
);

/// A producer: its own schema with the outbox table (and a business table), and a pool.
struct Producer {
    pool: PgPool,
    // Dropped after the pool's last use; nodes are killed before it (declare them after).
    schema: PgSchema,
}

impl Producer {
    async fn create() -> anyhow::Result<Producer> {
        let schema = PgSchema::create().await?;
        let pool = PgPoolOptions::new().max_connections(4).connect(&schema.url).await?;
        sqlx::raw_sql(gateway::store::outbox::SCHEMA).execute(&pool).await?;
        sqlx::raw_sql("CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, total INT NOT NULL)").execute(&pool).await?;
        Ok(Producer { pool, schema })
    }

    /// An `[[outbox]]` source for this producer.
    fn source(&self, batch: u32) -> String {
        format!(
            "[[outbox]]\nname = \"orders\"\nurl = \"{}\"\nbatch = {batch}\npoll_interval = \"200ms\"\n",
            self.schema.url
        )
    }

    /// Inserts an order and its outbox rows in one committed transaction.
    async fn commit(&self, rows: &[(&str, &str, &str)]) -> anyhow::Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO orders (total) VALUES (1999)").execute(&mut *tx).await?;
        insert(&mut tx, rows).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        Ok(sqlx::query(sql).fetch_one(&self.pool).await?.try_get(0)?)
    }

    /// Parked rows: event id → the reason Herald stored.
    async fn parked(&self) -> anyhow::Result<HashMap<String, String>> {
        let rows = sqlx::query("SELECT event_id, error FROM herald_outbox WHERE failed_at IS NOT NULL")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok((r.try_get("event_id")?, r.try_get("error")?))).collect()
    }
}

/// Inserts outbox rows (tenant `acme`) as (event id, type, payload JSON text).
async fn insert(tx: &mut sqlx::PgConnection, rows: &[(&str, &str, &str)]) -> anyhow::Result<()> {
    for (id, event_type, payload) in rows {
        sqlx::query(
            "INSERT INTO herald_outbox (tenant, event_id, event_type, payload) VALUES ('acme', $1, $2, $3::json)",
        )
        .bind(id)
        .bind(event_type)
        .bind(payload)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// A node relaying `producer` (after it: killed before the producer's schema is dropped),
/// with tenant `acme` and one endpoint to `rx`.
async fn relaying_node(
    producer: &Producer,
    store: Option<&PgSchema>,
    dir: &std::path::Path,
    batch: u32,
) -> anyhow::Result<HeraldProcess> {
    relaying_node_with(producer, store, dir, batch, &[]).await
}

/// [`relaying_node`] with more `HERALD_*` settings.
async fn relaying_node_with(
    producer: &Producer,
    store: Option<&PgSchema>,
    dir: &std::path::Path,
    batch: u32,
    extra: &[(&str, &str)],
) -> anyhow::Result<HeraldProcess> {
    let mut env: Vec<(&str, &str)> = store.map(|s| ("HERALD_STORE_URL", s.url.as_str())).into_iter().collect();
    env.extend_from_slice(extra);
    HeraldProcess::start_with_config(&herald_binary()?, dir, &env, &producer.source(batch)).await
}

/// Herald's own store on `backend`: a Postgres schema of its own, or (`None`) SQLite.
async fn herald_store(backend: Backend) -> anyhow::Result<Option<PgSchema>> {
    Ok(match backend {
        Backend::Postgres => Some(PgSchema::create().await?),
        Backend::Sqlite => None,
    })
}

async fn tenant_with_endpoint(api: &Api, rx: &FakeReceiver) -> anyhow::Result<()> {
    api.tenant("acme").await?;
    api.endpoint("acme", json!({"url": rx.url(), "rate_per_sec": 1000, "burst": 100, "max_in_flight": 4})).await?;
    Ok(())
}

/// Webhook ids in arrival order.
fn arrived(rx: &FakeReceiver) -> Vec<String> {
    rx.received().iter().filter_map(|r| r.header("webhook-id").map(str::to_string)).collect()
}

/// Waits until every id in `ids` has arrived at `rx`.
async fn wait_arrived(rx: &FakeReceiver, ids: &[&str], timeout: Duration) -> anyhow::Result<()> {
    tests::eventually(&format!("{ids:?} arriving"), timeout, || async {
        let got: HashSet<String> = arrived(rx).into_iter().collect();
        tests::done_or(ids.iter().all(|id| got.contains(*id)), format!("arrived: {got:?}"))
    })
    .await
}

/// The value of a metric series (its labels written as in the exposition), 0 if absent.
async fn metric(api: &Api, series: &str) -> anyhow::Result<f64> {
    let text = api.get("/metrics", ADMIN_TOKEN).await?.text;
    let line = text.lines().find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '));
    Ok(line.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0))
}

async fn committed_rows_arrive_and_rolled_back_ones_never(backend: Backend) -> anyhow::Result<()> {
    let producer = Producer::create().await?;
    let store = herald_store(backend).await?;
    let (dir, rx) = (tempfile::tempdir()?, FakeReceiver::start().await?);
    let node = relaying_node(&producer, store.as_ref(), dir.path(), 100).await?;
    tenant_with_endpoint(&node.api, &rx).await?;

    // A transaction still open: its row is not committed, so it must wait.
    let mut open = producer.pool.begin().await?;
    insert(&mut open, &[("evt_open", "order.created", r#"{"n": 1}"#)]).await?;
    // A transaction that rolls back: its row never existed.
    let mut rolled_back = producer.pool.begin().await?;
    insert(&mut rolled_back, &[("evt_rolled_back", "order.created", r#"{"n": 2}"#)]).await?;
    rolled_back.rollback().await?;
    // The payload's bytes (spacing, key order) reach the receiver as written.
    let payload = r#"{"total": 1999,  "items": [ {"sku": "a"} ], "a": null}"#;
    producer.commit(&[("evt_committed", "order.created", payload)]).await?;

    wait_arrived(&rx, &["evt_committed"], Duration::from_secs(20)).await?;
    assert_eq!(arrived(&rx), ["evt_committed"], "only the committed row is relayed");
    let body = String::from_utf8(rx.received()[0].body.to_vec())?;
    assert!(body.contains(payload), "payload bytes changed: {body}");

    open.commit().await?;
    producer.commit(&[("evt_after", "order.created", r#"{"n": 3}"#)]).await?;
    wait_arrived(&rx, &["evt_open", "evt_after"], Duration::from_secs(20)).await?;
    let got = arrived(&rx);
    assert!(!got.iter().any(|id| id == "evt_rolled_back"), "a rolled-back row was relayed: {got:?}");
    tests::eventually("the outbox to empty", Duration::from_secs(10), || async {
        let left = producer.scalar("SELECT COUNT(*) FROM herald_outbox").await?;
        tests::done_or(left == 0, format!("{left} rows left"))
    })
    .await?;
    // /readyz reports the source, relaying, with nothing waiting.
    node.api
        .wait_for("/readyz", Duration::from_secs(10), |v| {
            v["outbox"][0]["source"] == "orders"
                && v["outbox"][0]["state"] == "relaying"
                && v["outbox"][0]["pending"] == 0
        })
        .await?;
    Ok(())
}

/// A tenant that enforces its event catalog: the relay applies it as the events API does.
async fn rows_failing_an_enforced_catalog_are_parked_with_the_path(backend: Backend) -> anyhow::Result<()> {
    let producer = Producer::create().await?;
    let store = herald_store(backend).await?;
    let (dir, rx) = (tempfile::tempdir()?, FakeReceiver::start().await?);
    let node = relaying_node(&producer, store.as_ref(), dir.path(), 100).await?;
    tenant_with_endpoint(&node.api, &rx).await?;
    let schema = json!({"type": "object", "required": ["total"], "properties": {"total": {"type": "integer"}}});
    node.api
        .post("/v1/tenants/acme/event-types", ADMIN_TOKEN, json!({"name": "order.created", "schema": schema}))
        .await?
        .expect(201)?;
    node.api
        .call("PUT", "/v1/tenants/acme/catalog", ADMIN_TOKEN, Some(json!({"schema_validation": "enforce"})))
        .await?
        .expect(200)?;

    producer
        .commit(&[
            ("evt_fits", "order.created", r#"{"total": 1999}"#),
            ("evt_string_total", "order.created", r#"{"total": "1999"}"#),
            ("evt_unknown_type", "order.shipped", r#"{"total": 1}"#),
        ])
        .await?;
    wait_arrived(&rx, &["evt_fits"], Duration::from_secs(20)).await?;
    tests::eventually("two rows parked", Duration::from_secs(20), || async {
        let parked = producer.parked().await?.len();
        tests::done_or(parked == 2, format!("{parked} parked"))
    })
    .await?;
    let parked = producer.parked().await?;
    let reason = parked.get("evt_string_total").context("not parked")?;
    assert!(reason.starts_with("schema: payload.total: "), "{reason}");
    let reason = parked.get("evt_unknown_type").context("not parked")?;
    assert!(reason.starts_with("schema: type: "), "{reason}");
    node.api.get("/v1/tenants/acme/events/evt_string_total", ADMIN_TOKEN).await?.expect(404)?;
    assert_eq!(arrived(&rx), ["evt_fits"]);
    Ok(())
}

/// Commits `total` rows (`evt_00000`…) in transactions of `per_tx`, `pause` apart.
async fn produce(producer: &Producer, total: usize, per_tx: usize, pause: Duration) -> anyhow::Result<()> {
    let ids: Vec<String> = (0..total).map(|i| format!("evt_{i:05}")).collect();
    for chunk in ids.chunks(per_tx) {
        let payloads: Vec<String> = chunk.iter().map(|id| json!({"order": id}).to_string()).collect();
        let rows: Vec<(&str, &str, &str)> =
            chunk.iter().zip(&payloads).map(|(id, p)| (id.as_str(), "order.created", p.as_str())).collect();
        producer.commit(&rows).await?;
        tokio::time::sleep(pause).await;
    }
    Ok(())
}

/// Every delivery of tenant `acme` (paged), as event ids.
async fn delivered_events(api: &Api) -> anyhow::Result<Vec<String>> {
    let (mut out, mut after) = (Vec::new(), String::new());
    loop {
        let r = api.get(&format!("/v1/tenants/acme/deliveries?limit=1000{after}"), ADMIN_TOKEN).await?;
        let page = r.json["data"].as_array().context("deliveries")?;
        out.extend(page.iter().filter_map(|d| d["event_id"].as_str().map(str::to_string)));
        match r.json["next_after"].as_str() {
            Some(next) if !page.is_empty() => after = format!("&after={next}"),
            _ => return Ok(out),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_relay_loses_and_doubles_nothing() -> anyhow::Result<()> {
    const TOTAL: usize = 2000;
    // Small batches: the relay takes many producer transactions, so the kill lands mid-way.
    const BATCH: u32 = 10;
    // What a kill can make go out twice: the deliveries sent whose results had not
    // committed, which the node-wide slots (held through the commit) bound.
    const SLOTS: &str = "8";
    let env = [("HERALD_DELIVERY_MAX_IN_FLIGHT_TOTAL", SLOTS)];
    let producer = Producer::create().await?;
    let (dir, rx) = (tempfile::tempdir()?, FakeReceiver::start().await?);
    let mut node = relaying_node_with(&producer, None, dir.path(), BATCH, &env).await?;
    tenant_with_endpoint(&node.api, &rx).await?;

    // The producer commits while the node relays, is killed and restarts.
    let producing = produce(&producer, TOTAL, 25, Duration::ZERO);
    let kill_and_restart = async {
        tests::eventually("200 rows relayed with more waiting", Duration::from_secs(30), || async {
            let left = producer.scalar("SELECT COUNT(*) FROM herald_outbox").await?;
            let made = producer.scalar("SELECT COUNT(*) * 25 FROM orders").await?;
            tests::done_or(made - left >= 200 && left > 0, format!("{left} of {made} left"))
        })
        .await?;
        node.kill();
        let left = producer.scalar("SELECT COUNT(*) FROM herald_outbox").await?;
        anyhow::ensure!(left > 0, "the kill came mid-relay: rows were waiting");
        relaying_node_with(&producer, None, dir.path(), BATCH, &env).await
    };
    let (produced, restarted) = tokio::join!(producing, kill_and_restart);
    produced?;
    let node = restarted?;

    tests::eventually("the outbox to empty", Duration::from_secs(60), || async {
        let left = producer.scalar("SELECT COUNT(*) FROM herald_outbox").await?;
        tests::done_or(left == 0, format!("{left} rows left"))
    })
    .await?;
    rx.wait_for(TOTAL, Duration::from_secs(60)).await?;
    tests::eventually("every event to arrive", Duration::from_secs(60), || async {
        let got = arrived(&rx).into_iter().collect::<HashSet<_>>().len();
        tests::done_or(got == TOTAL, format!("{got} of {TOTAL}"))
    })
    .await?;
    // Herald stored each row's event once, with one delivery: a re-read batch was a no-op.
    let events = delivered_events(&node.api).await?;
    let distinct: HashSet<&String> = events.iter().collect();
    assert_eq!((events.len(), distinct.len()), (TOTAL, TOTAL), "one delivery per outbox row");
    // The receiver may see a delivery twice (at least once), never more than the slots.
    let duplicates = arrived(&rx).len() - TOTAL;
    let slots: usize = SLOTS.parse()?;
    assert!(duplicates <= slots, "{duplicates} duplicate arrivals, more than delivery.max_in_flight_total ({slots})");
    assert_eq!(producer.parked().await?.len(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_relay_one_outbox_ingesting_each_row_once() -> anyhow::Result<()> {
    const TOTAL: usize = 1000;
    let producer = Producer::create().await?;
    let store = PgSchema::create().await?;
    let rx = FakeReceiver::start().await?;
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let a = relaying_node(&producer, Some(&store), dir_a.path(), 20).await?;
    let b = relaying_node(&producer, Some(&store), dir_b.path(), 20).await?;
    tenant_with_endpoint(&a.api, &rx).await?;

    produce(&producer, TOTAL, 20, Duration::from_millis(10)).await?;
    tests::eventually("the outbox to empty", Duration::from_secs(60), || async {
        let left = producer.scalar("SELECT COUNT(*) FROM herald_outbox").await?;
        tests::done_or(left == 0, format!("{left} rows left"))
    })
    .await?;
    tests::eventually("every event to arrive", Duration::from_secs(60), || async {
        let got = arrived(&rx).into_iter().collect::<HashSet<_>>().len();
        tests::done_or(got == TOTAL, format!("{got} of {TOTAL}"))
    })
    .await?;
    let relayed = r#"herald_outbox_relayed_total{source="orders"}"#;
    let duplicates = r#"herald_outbox_duplicates_total{source="orders"}"#;
    let (ra, rb) = (metric(&a.api, relayed).await?, metric(&b.api, relayed).await?);
    assert_eq!(ra + rb, TOTAL as f64, "each row relayed by exactly one node ({ra} + {rb})");
    assert!(ra > 0.0 && rb > 0.0, "both nodes relayed ({ra}, {rb})");
    let dup = metric(&a.api, duplicates).await? + metric(&b.api, duplicates).await?;
    assert_eq!(dup, 0.0, "no row was ingested twice");
    let events = delivered_events(&a.api).await?;
    assert_eq!(events.len(), TOTAL, "one delivery per row");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_rows_are_parked_with_their_reason_and_the_rest_flow() -> anyhow::Result<()> {
    let producer = Producer::create().await?;
    let (dir, rx) = (tempfile::tempdir()?, FakeReceiver::start().await?);
    let node = relaying_node(&producer, None, dir.path(), 100).await?;
    tenant_with_endpoint(&node.api, &rx).await?;

    let deep = format!("{}{}", "[".repeat(101), "]".repeat(101));
    let mut tx = producer.pool.begin().await?;
    insert(&mut tx, &[("evt_good_1", "order.created", "{}"), ("evt_bad_type", "not a type!", "{}")]).await?;
    insert(&mut tx, &[("evt_deep", "order.created", &deep), ("evt_same", "order.created", r#"{"v": 1}"#)]).await?;
    // The same id with another payload: a conflict, parked; the first one stands.
    insert(&mut tx, &[("evt_same", "order.created", r#"{"v": 2}"#)]).await?;
    for (tenant, id) in [("ghost", "evt_ghost"), ("Not-A-Slug", "evt_slug")] {
        sqlx::query("INSERT INTO herald_outbox (tenant, event_id, event_type, payload) VALUES ($1, $2, 't', '{}')")
            .bind(tenant)
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query("INSERT INTO herald_outbox (event_id, event_type, payload) VALUES ('evt_no_tenant', 't', '{}')")
        .execute(&mut *tx)
        .await?;
    // Issue 48 §15: a key given twice, which the events API refuses (`json` keeps both).
    insert(&mut tx, &[("evt_dup_key", "order.created", r#"{"a": {"b": 1, "b": 2}}"#)]).await?;
    insert(&mut tx, &[("evt_good_2", "order.created", "{}")]).await?;
    tx.commit().await?;

    wait_arrived(&rx, &["evt_good_1", "evt_same", "evt_good_2"], Duration::from_secs(20)).await?;
    tests::eventually("seven rows parked", Duration::from_secs(20), || async {
        let parked = producer.parked().await?.len();
        tests::done_or(parked == 7, format!("{parked} parked"))
    })
    .await?;
    let parked = producer.parked().await?;
    for (id, code) in [
        ("evt_bad_type", "invalid: "),
        ("evt_deep", "too_deep: "),
        ("evt_same", "conflict: "),
        ("evt_ghost", "unknown_tenant: "),
        ("evt_slug", "unknown_tenant: "),
        ("evt_no_tenant", "unknown_tenant: "),
        ("evt_dup_key", "invalid: payload.a.b: the key is given more than once"),
    ] {
        let reason = parked.get(id).with_context(|| format!("{id} not parked: {parked:?}"))?;
        assert!(reason.starts_with(code), "{id}: {reason}");
    }
    assert_eq!(producer.scalar("SELECT COUNT(*) FROM herald_outbox WHERE failed_at IS NULL").await?, 0);
    let same = node.api.get("/v1/tenants/acme/events/evt_same", ADMIN_TOKEN).await?;
    assert_eq!(same.json["payload"], json!({"v": 1}), "the first row's event stands");
    assert_eq!(metric(&node.api, r#"herald_outbox_parked_total{source="orders"}"#).await?, 7.0);
    node.api.wait_for("/readyz", Duration::from_secs(10), |v: &Value| v["outbox"][0]["parked"] == 7).await?;
    assert_eq!(arrived(&rx).len(), 3, "only the valid rows were delivered: {:?}", arrived(&rx));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_wait_in_the_outbox_while_heralds_store_fails() -> anyhow::Result<()> {
    let producer = Producer::create().await?;
    let store = PgSchema::create().await?;
    let (dir, rx) = (tempfile::tempdir()?, FakeReceiver::start().await?);
    let node = relaying_node(&producer, Some(&store), dir.path(), 100).await?;
    tenant_with_endpoint(&node.api, &rx).await?;
    let herald_db = PgPoolOptions::new().max_connections(1).connect(&store.url).await?;

    // Herald's store refuses every new event (a real database error on commit).
    sqlx::raw_sql("ALTER TABLE events ADD CONSTRAINT outage CHECK (false) NOT VALID").execute(&herald_db).await?;
    let ids: Vec<String> = (0..10).map(|i| format!("evt_bp_{i}")).collect();
    let rows: Vec<(&str, &str, &str)> = ids.iter().map(|id| (id.as_str(), "order.created", "{}")).collect();
    producer.commit(&rows).await?;
    node.api.wait_for("/readyz", Duration::from_secs(20), |v| v["outbox"][0]["state"] == "store_unavailable").await?;
    assert_eq!(producer.scalar("SELECT COUNT(*) FROM herald_outbox WHERE failed_at IS NULL").await?, 10);
    assert!(arrived(&rx).is_empty(), "nothing was ingested");

    sqlx::raw_sql("ALTER TABLE events DROP CONSTRAINT outage").execute(&herald_db).await?;
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    wait_arrived(&rx, &ids, Duration::from_secs(30)).await?;
    tests::eventually("the outbox to empty", Duration::from_secs(10), || async {
        let left = producer.scalar("SELECT COUNT(*) FROM herald_outbox").await?;
        tests::done_or(left == 0, format!("{left} rows left"))
    })
    .await?;
    node.api.wait_for("/readyz", Duration::from_secs(10), |v| v["outbox"][0]["state"] == "relaying").await?;
    Ok(())
}
