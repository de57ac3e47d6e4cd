//! `outbox`: the transactional outbox relay. A producer schema (in the test Postgres) with
//! the shipped DDL; one node relaying it into tenant `bench` (one endpoint paced at 1/s,
//! as in `intake`, so deliveries do not compete with the relay).
//!
//! - throughput: `rows` rows committed in transactions of 1,000, timed from the first
//!   insert until no row waits (a row is deleted only after its durable intake): rows/s;
//! - lag: rows committed one per transaction at a steady `rate` for `seconds`; an
//!   `AFTER DELETE` trigger (added for this phase only) records each row's age when the
//!   relay deletes it, on the producer's clock: p50/p99/max ms from insert to relayed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};
use tests::pg::PgSchema;
use tests::{FakeReceiver, HeraldProcess, herald_binary};

/// The lag phase's producers: each commits on its own connection at `rate / PRODUCERS`.
const PRODUCERS: u64 = 4;

/// What one run measures.
pub struct Params {
    pub rows: usize,
    pub rate: u64,
    pub seconds: u64,
    pub batch: u32,
}

pub async fn run(p: &Params, store_url: Option<&str>) -> anyhow::Result<HashMap<String, f64>> {
    let base = store_url.map(str::to_string).unwrap_or_else(tests::pg::base_url);
    let producer = PgSchema::create_in(&base).await?;
    let pool = PgPoolOptions::new().max_connections(PRODUCERS as u32 + 2).connect(&producer.url).await?;
    sqlx::raw_sql(gateway::store::outbox::SCHEMA).execute(&pool).await?;
    let store = match store_url {
        Some(url) => Some(PgSchema::create_in(url).await?),
        None => None,
    };
    let dir = tempfile::tempdir()?;
    let mut env = vec![("HERALD_LOG_LEVEL", "error")];
    if let Some(s) = &store {
        env.push(("HERALD_STORE_URL", &s.url));
    }
    let config = format!("[[outbox]]\nname = \"bench\"\nurl = \"{}\"\nbatch = {}\n", producer.url, p.batch);
    let node = HeraldProcess::start_with_config(&herald_binary()?, dir.path(), &env, &config).await?;
    let rx = FakeReceiver::start().await?;
    node.api.tenant("bench").await?;
    node.api.endpoint("bench", json!({"url": rx.url(), "rate_per_sec": 1, "max_in_flight": 1})).await?;

    let mut out = HashMap::new();
    out.insert("rows_per_s".into(), throughput(&pool, p.rows).await?);
    let lagged = lag(&pool, p, &mut out).await?;
    // Every row became an event in Herald (the relay deleted none it did not ingest).
    let metrics = node.api.get("/metrics", tests::ADMIN_TOKEN).await?.text;
    let accepted = metrics.lines().find_map(|l| l.strip_prefix("herald_events_accepted_total "));
    if accepted.and_then(|v| v.trim().parse::<f64>().ok()) != Some((p.rows + lagged) as f64) {
        bail!("Herald accepted {accepted:?} events of {} rows", p.rows + lagged);
    }
    drop(node);
    pool.close().await;
    Ok(out)
}

/// Commits `rows` rows in transactions of 1,000 and waits until the relay took them all.
async fn throughput(pool: &PgPool, rows: usize) -> anyhow::Result<f64> {
    let start = Instant::now();
    for first in (0..rows).step_by(1000) {
        let last = (first + 1000).min(rows) - 1;
        sqlx::query(
            "INSERT INTO herald_outbox (tenant, event_id, event_type, payload) \
             SELECT 'bench', 'evt_t_' || g, 'invoice.paid', json_build_object('n', g, 'amount', 1999) \
             FROM generate_series($1::int, $2::int) AS g",
        )
        .bind(first as i32)
        .bind(last as i32)
        .execute(pool)
        .await?;
    }
    drained(pool, Duration::from_secs(300)).await?;
    Ok(rows as f64 / start.elapsed().as_secs_f64())
}

/// Waits until no row is waiting (and none was parked).
async fn drained(pool: &PgPool, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let r = sqlx::query("SELECT COUNT(*) FILTER (WHERE failed_at IS NULL), COUNT(*) FROM herald_outbox")
            .fetch_one(pool)
            .await?;
        let (pending, all): (i64, i64) = (r.try_get(0)?, r.try_get(1)?);
        if all > pending {
            bail!("{} rows were parked", all - pending);
        }
        if pending == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{pending} rows still waiting after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Commits one row per transaction at a steady rate; records each row's insert→relayed age.
/// Returns how many rows it committed.
async fn lag(pool: &PgPool, p: &Params, out: &mut HashMap<String, f64>) -> anyhow::Result<usize> {
    sqlx::raw_sql(
        "CREATE TABLE bench_lag (ms FLOAT8 NOT NULL);
         CREATE FUNCTION bench_lag() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
             INSERT INTO bench_lag VALUES (EXTRACT(EPOCH FROM clock_timestamp() - OLD.created_at) * 1000);
             RETURN NULL; END $$;
         CREATE TRIGGER bench_lag AFTER DELETE ON herald_outbox FOR EACH ROW EXECUTE FUNCTION bench_lag();",
    )
    .execute(pool)
    .await?;
    let per_producer = p.rate * p.seconds / PRODUCERS;
    let period = Duration::from_secs_f64(PRODUCERS as f64 / p.rate as f64);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..PRODUCERS {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            for i in 0..per_producer {
                tick.tick().await;
                sqlx::query(
                    "INSERT INTO herald_outbox (tenant, event_id, event_type, payload) \
                     VALUES ('bench', $1, 'invoice.paid', '{\"amount\": 1999}')",
                )
                .bind(format!("evt_l_{worker}_{i}"))
                .execute(&pool)
                .await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let produced = start.elapsed().as_secs_f64();
    drained(pool, Duration::from_secs(60)).await?;
    let r = sqlx::query(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), \
         MAX(ms), COUNT(*) FROM bench_lag",
    )
    .fetch_one(pool)
    .await?;
    let n: i64 = r.try_get(3)?;
    if n as u64 != per_producer * PRODUCERS {
        bail!("{n} rows relayed of {}", per_producer * PRODUCERS);
    }
    out.insert("lag_p50_ms".into(), r.try_get(0)?);
    out.insert("lag_p99_ms".into(), r.try_get(1)?);
    out.insert("lag_max_ms".into(), r.try_get(2)?);
    out.insert("lag_rate_achieved".into(), n as f64 / produced);
    Ok(n as usize)
}
