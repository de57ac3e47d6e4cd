//! Durability: what was acknowledged survives SIGKILL of the real `herald` process.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tests::{ADMIN_TOKEN, FakeReceiver, HeraldProcess, done_or, eventually, herald_binary};
use tokio::sync::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_sigkill() -> anyhow::Result<()> {
    let bin = herald_binary()?;
    let dir = tempfile::tempdir()?;
    let rx = FakeReceiver::start().await?;
    let mut node = HeraldProcess::start(&bin, dir.path(), &[]).await?;
    node.api.tenant("acme").await?;
    node.api.endpoint("acme", json!({"url": rx.url(), "rate_per_sec": 1})).await?;

    // A burst of concurrent posts; record every id that got its 202.
    let acked = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let api = node.api.clone();
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                let id = format!("evt_{worker}_{i}");
                let r = api.event("acme", json!({"id": id, "type": "invoice.paid", "payload": {"n": i}})).await;
                if matches!(r, Ok(ref r) if r.status == 202) {
                    acked.lock().await.push(id);
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    node.kill();
    let acked = acked.lock().await.clone();
    assert_eq!(acked.len(), 400, "every post was acknowledged before the kill");

    let node = HeraldProcess::start(&bin, dir.path(), &[]).await?;
    for id in &acked {
        let r = node.api.get(&format!("/v1/tenants/acme/events/{id}"), ADMIN_TOKEN).await?;
        assert_eq!(r.status, 200, "acknowledged event {id} lost");
        let r = node.api.get(&format!("/v1/tenants/acme/events/{id}/deliveries"), ADMIN_TOKEN).await?;
        assert_eq!(r.json["data"].as_array().map(Vec::len), Some(1), "delivery of {id} lost");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_delivery_loses_nothing_and_bounds_duplicates() -> anyhow::Result<()> {
    let bin = herald_binary()?;
    let dir = tempfile::tempdir()?;
    let rx = FakeReceiver::start().await?;
    rx.set_default(tests::Answer::status(200).delay(Duration::from_millis(20)));
    // A kill can make go out twice what was sent and not yet recorded: the node-wide slots
    // (held through the result's commit) bound that, here to the endpoint's own 8.
    let env = [("HERALD_DELIVERY_MAX_IN_FLIGHT_TOTAL", "8")];
    let mut node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    node.api.tenant("acme").await?;
    let max_in_flight = 8;
    node.api.endpoint("acme", json!({"url": rx.url(), "rate_per_sec": 200, "max_in_flight": max_in_flight})).await?;
    let total = 300;
    let events: Vec<_> =
        (0..total).map(|i| json!({"id": format!("evt_{i}"), "type": "t", "payload": {"i": i}})).collect();
    for chunk in events.chunks(100) {
        let r = node.api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, json!({"events": chunk})).await?;
        assert_eq!(r.status, 202, "{}", r.text);
    }
    rx.wait_for(60, Duration::from_secs(20)).await?;
    node.kill();
    let at_kill = rx.count();
    assert!(at_kill < total, "the kill came mid-delivery ({at_kill} of {total} arrived)");

    let node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    node.api
        .wait_for("/v1/tenants/acme/deliveries?state=delivered&limit=1000", Duration::from_secs(60), |v| {
            v["data"].as_array().is_some_and(|d| d.len() == total)
        })
        .await?;
    let got = rx.received();
    let mut ids: Vec<&str> = got.iter().filter_map(|r| r.header("webhook-id")).collect();
    let arrivals = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), total, "every acknowledged event arrived");
    let duplicates = arrivals - total;
    assert!(
        duplicates <= max_in_flight,
        "{duplicates} duplicates, more than the {max_in_flight} that could be in flight"
    );
    Ok(())
}

/// How a restart test stops the node.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// SIGKILL: nothing released, the store as the process left it.
    Kill,
    /// SIGTERM: the drained shutdown.
    Term,
}

/// Endpoints with work queued when a restart test stops its node, and what each holds.
const RESTART_ENDPOINTS: usize = 20;
const RESTART_EVENTS_EACH: usize = 8;

/// A node that restarts delivers at once: it waits out neither the partition leases nor
/// the delivery leases of its previous process (SQLite: that process can never send again;
/// Postgres: the restarted node has the same node id and holds its lock, so the leases of
/// that id are its own), nor those of its own drained shutdown (which gives them up).
/// Work is queued for many endpoints (paced at 2/s each) when the node stops; the figure
/// is the time from the restarted node's readiness to its first delivery, and then every
/// event arrives. Before stable node ids, Postgres after SIGKILL sent nothing for 15 s.
async fn a_restarted_node_delivers_at_once(backend: tests::Backend, stop: Stop) -> anyhow::Result<()> {
    let bin = herald_binary()?;
    let dir = tempfile::tempdir()?;
    let schema = match backend {
        tests::Backend::Postgres => Some(tests::pg::PgSchema::create().await?),
        tests::Backend::Sqlite => None,
    };
    let env: Vec<(&str, &str)> = schema.iter().map(|s| ("HERALD_STORE_URL", s.url.as_str())).collect();
    let rx = FakeReceiver::start().await?;
    let mut node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    node.api.tenant("acme").await?;
    for i in 0..RESTART_ENDPOINTS {
        let url = format!("{}/{i}", rx.url());
        node.api.endpoint("acme", json!({"url": url, "rate_per_sec": 2, "burst": 1})).await?;
    }
    let total = RESTART_ENDPOINTS * RESTART_EVENTS_EACH;
    let events: Vec<_> =
        (0..RESTART_EVENTS_EACH).map(|i| json!({"id": format!("evt_{i}"), "type": "t", "payload": {}})).collect();
    let r = node.api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, json!({"events": events})).await?;
    assert_eq!(r.status, 202, "{}", r.text);
    // Every endpoint has sent once (its burst) and holds the rest under its lease.
    rx.wait_for(RESTART_ENDPOINTS, Duration::from_secs(20)).await?;
    match stop {
        Stop::Kill => node.kill(),
        Stop::Term => {
            let status = node.terminate(Duration::from_secs(20)).await?;
            assert!(status.success(), "a drained shutdown exits cleanly: {status}");
        }
    }
    let before = rx.count();
    assert!(before < total, "the node stopped with work queued ({before} of {total} arrived)");

    let node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    let ready = Instant::now();
    let got = rx.wait_for(before + 1, Duration::from_secs(30)).await?;
    let first = got[before].at.saturating_duration_since(ready);
    eprintln!("{backend:?} after {stop:?}: restart ready -> first delivery {first:?}");
    // Every event arrives (the leases of the stopped process are taken up, not lost).
    eventually(&format!("{backend:?} after {stop:?}: every event arrives"), Duration::from_secs(30), || async {
        let got = rx.received();
        let distinct: HashSet<(&str, Option<&str>)> =
            got.iter().map(|r| (r.path.as_str(), r.header("webhook-id"))).collect();
        done_or(distinct.len() == total, format!("{} of {total}", distinct.len()))
    })
    .await?;
    // The lease is 15 s; a paced delivery is due at once, so 1 s tells the two apart.
    assert!(first <= Duration::from_secs(1), "{backend:?} after {stop:?}: the first delivery took {first:?}");
    drop(node);
    drop(schema);
    Ok(())
}

mod restart {
    use super::{Stop, a_restarted_node_delivers_at_once};
    use tests::Backend;

    tests::backends!(after_sigkill, after_sigterm);

    async fn after_sigkill(backend: Backend) -> anyhow::Result<()> {
        a_restarted_node_delivers_at_once(backend, Stop::Kill).await
    }

    async fn after_sigterm(backend: Backend) -> anyhow::Result<()> {
        a_restarted_node_delivers_at_once(backend, Stop::Term).await
    }
}
