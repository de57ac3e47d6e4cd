//! Herald's Postgres restarts under running nodes (a server of the test's own, never the
//! shared one): once quickly, once down for 30 s. Every node keeps answering `/healthz`,
//! intake answers `202` or `503 storage_unavailable` and nothing else, `/readyz` says the
//! store is gone, delivery resumes within 5 s of the database's return, and every event
//! that got its `202` arrives, with no more duplicates than were in flight.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cluster::metric;
use bytes::Bytes;
use serde_json::json;
use tests::pg::OwnPostgres;
use tests::{Answer, FakeReceiver, HeraldProcess, done_or, eventually, herald_binary};

const NODES: usize = 2;
const ENDPOINTS: usize = 4;
const MAX_IN_FLIGHT: usize = 4;
/// How long the second outage lasts.
const LONG_OUTAGE: Duration = Duration::from_secs(30);

/// What the producer and the probes saw.
#[derive(Default)]
struct Seen {
    /// Events acknowledged (`202`), and when.
    acked: Vec<(String, Instant)>,
    /// `503 storage_unavailable` answers.
    refused: usize,
    /// How long each `503` took, while the database was down for long.
    refused_in_outage: Vec<Duration>,
    /// Any other answer, or a failed request: never expected.
    other: Vec<String>,
    /// `/healthz` answers that were not `200`.
    unhealthy: Vec<String>,
    /// `/readyz` answered 503 while the database was down.
    not_ready: usize,
}

fn block<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_loses_nothing_and_delivery_resumes() -> anyhow::Result<()> {
    let pg = block(OwnPostgres::start)?;
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(200).delay(Duration::from_millis(20)));
    let (bin, url) = (herald_binary()?, pg.url());
    let env = [("HERALD_STORE_URL", url.as_str())];
    let mut nodes = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..NODES {
        let dir = tempfile::tempdir()?;
        nodes.push(HeraldProcess::start(&bin, dir.path(), &env).await?);
        dirs.push(dir);
    }
    let apis: Vec<tests::Api> = nodes.iter().map(|n| n.api.clone()).collect();
    apis[0].tenant("acme").await?;
    for i in 0..ENDPOINTS {
        let url = format!("{}/{i}", rx.url());
        // A long timeout makes long delivery leases: a result dropped in the outage would
        // wait that long to be sent again. The pace is four times the producer's, so the
        // backlog of the outage drains in seconds: at the producer's own pace it never
        // drained while the producer ran, and the settle time measured the backlog (2.9 s
        // to 29.7 s, as the outage fell), not leases or results left behind.
        let body =
            json!({"url": url, "rate_per_sec": 200, "burst": 20, "max_in_flight": MAX_IN_FLIGHT, "timeout": "30s"});
        apis[0].endpoint("acme", body).await?;
    }

    // A producer posting one event every 20 ms, to the nodes in turn, and probes of every
    // node's /healthz and /readyz every 100 ms, until told to stop.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let down = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn({
        let (apis, seen, stop, down) = (apis.clone(), seen.clone(), stop.clone(), down.clone());
        async move {
            // Requests overlap: a 503 may wait (the one finding out whether the database is
            // back waits out the connection pool's timeout).
            let slots = Arc::new(tokio::sync::Semaphore::new(64));
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            let mut i = 0;
            while !stop.load(Ordering::Acquire) {
                tick.tick().await;
                let slot = slots.clone().acquire_owned().await.expect("open");
                let (api, seen, down) = (apis[i % NODES].clone(), seen.clone(), down.clone());
                tokio::spawn(async move {
                    let id = format!("evt_{i:05}");
                    let sent = Instant::now();
                    let r = api.event("acme", json!({"id": id, "type": "t", "payload": {"i": i}})).await;
                    let mut s = seen.lock().unwrap();
                    match r {
                        Ok(r) if r.status == 202 => s.acked.push((id, Instant::now())),
                        Ok(r) if r.status == 503 && r.json["error"]["code"] == "storage_unavailable" => {
                            s.refused += 1;
                            if down.load(Ordering::Acquire) {
                                s.refused_in_outage.push(sent.elapsed());
                            }
                        }
                        Ok(r) => s.other.push(format!("{id}: {} {}", r.status, r.text)),
                        Err(e) => s.other.push(format!("{id}: {e:#}")),
                    }
                    drop(slot);
                });
                i += 1;
            }
            // Every request answered.
            let _ = slots.acquire_many(64).await;
        }
    });
    let probes = tokio::spawn({
        let (apis, seen, stop, down) = (apis.clone(), seen.clone(), stop.clone(), down.clone());
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while !stop.load(Ordering::Acquire) {
                tick.tick().await;
                for (n, api) in apis.iter().enumerate() {
                    let health = api.raw("GET", "/healthz", None, Bytes::new()).await;
                    let ready = api.raw("GET", "/readyz", None, Bytes::new()).await;
                    let mut s = seen.lock().unwrap();
                    match health {
                        Ok(r) if r.status == 200 => {}
                        Ok(r) => s.unhealthy.push(format!("node {n}: {} {}", r.status, r.text)),
                        Err(e) => s.unhealthy.push(format!("node {n}: {e:#}")),
                    }
                    if down.load(Ordering::Acquire) && matches!(ready, Ok(r) if r.status == 503) {
                        s.not_ready += 1;
                    }
                }
            }
        }
    });

    rx.wait_for(50, Duration::from_secs(20)).await?;
    // 1. A quick restart: every session ends, the server is back at once.
    block(|| pg.stop("fast"))?;
    block(|| pg.start_again())?;
    let back_quick = Instant::now();
    let resumed_quick = resumed_after(&rx, &seen, back_quick).await?;

    // 2. Down for 30 s.
    block(|| pg.stop("fast"))?;
    down.store(true, Ordering::Release);
    let went_down = Instant::now();
    let refused_before = seen.lock().unwrap().refused;
    eventually("intake refuses while the database is down", LONG_OUTAGE, || async {
        let s = seen.lock().unwrap();
        done_or(
            s.refused > refused_before && s.not_ready > 0,
            format!("{} refused, {} not ready", s.refused, s.not_ready),
        )
    })
    .await?;
    // The outage's length is what the test is about, not a wait for something to settle.
    tokio::time::sleep_until((went_down + LONG_OUTAGE).into()).await;
    block(|| pg.start_again())?;
    down.store(false, Ordering::Release);
    let back_long = Instant::now();
    let resumed_long = resumed_after(&rx, &seen, back_long).await?;

    stop.store(true, Ordering::Release);
    producer.await?;
    probes.await?;
    let s = std::mem::take(&mut *seen.lock().unwrap());
    let want: HashSet<String> = s.acked.iter().map(|(id, _)| id.clone()).collect();
    let wanted = want.len() * ENDPOINTS;
    eventually("every acknowledged event arrives at every endpoint", Duration::from_secs(60), || async {
        let got = rx.received();
        let arrived: HashSet<(&str, &str)> = got
            .iter()
            .filter_map(|r| Some((r.path.as_str(), r.header("webhook-id")?)))
            .filter(|(_, id)| want.contains(*id))
            .collect();
        done_or(arrived.len() == wanted, format!("{} of {wanted}", arrived.len()))
    })
    .await?;
    // Each sent attempt's result was recorded once the database was back: nothing waits
    // under a lease to be sent again (before, such results were dropped and their
    // deliveries sat 40 s in `delivering`, then went out twice).
    let pool = sqlx::PgPool::connect(&url).await?;
    eventually("every delivery is recorded as delivered", Duration::from_secs(60), || async {
        let n = count(&pool, "SELECT count(*) FROM deliveries WHERE state <> 'delivered'").await?;
        done_or(n == 0, format!("{n} not delivered"))
    })
    .await?;
    let settled = back_long.elapsed();
    // Each node holds its id again (a session-level advisory lock, lost with its session).
    eventually("each node holds its id again", Duration::from_secs(10), || async {
        let n = count(&pool, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted").await?;
        done_or(n == NODES as i64, format!("{n} ids held"))
    })
    .await?;
    let got = rx.received();
    let mut per: HashMap<(&str, &str), usize> = HashMap::new();
    for r in &got {
        *per.entry((r.path.as_str(), r.header("webhook-id").unwrap_or_default())).or_default() += 1;
    }
    let duplicates: usize = per.values().map(|n| n - 1).sum();
    let (mut reconnects, mut untried) = (0, 0);
    for api in &apis {
        reconnects += metric(api, "herald_store_recoveries_total").await?;
        untried += metric(api, "herald_store_refused_untried_total").await?;
    }
    let mut waits = s.refused_in_outage.clone();
    waits.sort_unstable();
    let median_wait = waits.get(waits.len() / 2).copied().unwrap_or_default();
    eprintln!(
        "database restarts: {} acknowledged, {} refused (503), lost 0, {duplicates} duplicates, resumed {resumed_quick:?} \
         after the quick restart and {resumed_long:?} after {LONG_OUTAGE:?} down, all settled {settled:?} after it; {reconnects} store recoveries; \
         {} refused in the long outage, median wait {median_wait:?}, {untried} refused untried",
        want.len(),
        s.refused,
        waits.len()
    );
    assert!(s.other.is_empty(), "intake answered neither 202 nor 503 storage_unavailable: {:?}", s.other);
    assert!(s.unhealthy.is_empty(), "/healthz failed: {:?}", s.unhealthy);
    // What can go out twice is what was in flight when the database went away, twice.
    let bound = 2 * ENDPOINTS * MAX_IN_FLIGHT;
    assert!(duplicates <= bound, "{duplicates} duplicates, more than the {bound} that could be in flight");
    assert!(resumed_quick <= Duration::from_secs(5), "delivery resumed {resumed_quick:?} after a quick restart");
    assert!(resumed_long <= Duration::from_secs(5), "delivery resumed {resumed_long:?} after the long outage");
    // Results sent while the database was down are recorded when it is back, so all is
    // settled in seconds, not after the leases of the dropped ones ran out (30 s and more
    // after the database's return). Nor does a delivery queued on one node wait out the
    // partition lease of the other, which took the endpoint as the database returned (its
    // membership out of date) and sat idle on it: it hands the endpoint over when the
    // membership changes, and hears what it missed (about half of the runs settled 15 s
    // late before).
    assert!(settled <= Duration::from_secs(10), "everything settled {settled:?} after the database returned");
    assert!(reconnects > 0, "the metrics show the store's recoveries");
    // While the database is down, intake answers at once: only the one request finding out
    // whether it is back waits out the connection pool's timeout (10 s), not every one.
    // Until a first write has failed to reach it (up to that timeout when none was in
    // flight as it went away), requests wait as before.
    let quick = waits.iter().filter(|w| **w < Duration::from_secs(1)).count();
    assert!(quick >= 20, "{quick} of {} refusals answered within 1 s while the database was down", waits.len());
    assert!(untried > 0, "the metrics show the refusals answered at once");
    pool.close().await;
    drop(nodes);
    drop(pg);
    Ok(())
}

/// How long after `back` the first event acknowledged after `back` arrived: intake,
/// claim and delivery all work again.
async fn resumed_after(rx: &FakeReceiver, seen: &Mutex<Seen>, back: Instant) -> anyhow::Result<Duration> {
    eventually("delivery resumes after the database returns", Duration::from_secs(30), || async {
        let fresh: HashSet<String> =
            seen.lock().unwrap().acked.iter().filter(|(_, at)| *at > back).map(|(id, _)| id.clone()).collect();
        let first = rx
            .received()
            .iter()
            .filter(|r| r.header("webhook-id").is_some_and(|id| fresh.contains(id)))
            .map(|r| r.at)
            .min();
        Ok(first.map(|at| at.duration_since(back)).ok_or_else(|| format!("{} acknowledged since", fresh.len())))
    })
    .await
}

/// A `count(*)` on the test's own server.
async fn count(pool: &sqlx::PgPool, query: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(query).fetch_one(pool).await?)
}
