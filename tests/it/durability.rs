//! Durability: what was acknowledged survives SIGKILL of the real `herald` process.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tests::{ADMIN_TOKEN, FakeReceiver, HeraldProcess, herald_binary};
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

/// A node that restarts delivers at once: it neither waits out the partition leases of its
/// previous process (SQLite: that process can never send again) nor of its own drained
/// shutdown (which gives them up). Before, every endpoint sent nothing for the 15 s lease.
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
    node.api.endpoint("acme", json!({"url": rx.url(), "rate_per_sec": 100})).await?;
    let r = node.api.event("acme", json!({"id": "evt_before", "type": "t", "payload": {}})).await?;
    assert_eq!(r.status, 202, "{}", r.text);
    rx.wait_for(1, Duration::from_secs(10)).await?;
    match stop {
        Stop::Kill => node.kill(),
        Stop::Term => {
            let status = node.terminate(Duration::from_secs(20)).await?;
            assert!(status.success(), "a drained shutdown exits cleanly: {status}");
        }
    }

    let node = HeraldProcess::start(&bin, dir.path(), &env).await?;
    let r = node.api.event("acme", json!({"id": "evt_after", "type": "t", "payload": {}})).await?;
    assert_eq!(r.status, 202, "{}", r.text);
    let accepted = std::time::Instant::now();
    rx.wait_for(2, Duration::from_secs(30)).await?;
    let waited = accepted.elapsed();
    // The lease is 15 s; a delivery normally takes milliseconds, so 3 s leaves a loaded
    // machine room and still tells the two apart.
    assert!(waited < Duration::from_secs(3), "{stop:?}: the restarted node's first delivery took {waited:?}");
    drop(node);
    drop(schema);
    Ok(())
}

mod restart {
    use super::{Stop, a_restarted_node_delivers_at_once};
    use tests::Backend;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_after_sigkill() -> anyhow::Result<()> {
        a_restarted_node_delivers_at_once(Backend::Sqlite, Stop::Kill).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_after_sigterm() -> anyhow::Result<()> {
        a_restarted_node_delivers_at_once(Backend::Sqlite, Stop::Term).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_after_sigterm() -> anyhow::Result<()> {
        a_restarted_node_delivers_at_once(Backend::Postgres, Stop::Term).await
    }
}
