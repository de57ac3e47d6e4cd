//! The `ordered-tail` case: does one key's failing head slow the other keys of an ordered
//! endpoint? Two phases on one node, each on an endpoint of its own (`ordering: "key"`):
//! `base`, every key answered at once; `failing`, key `k0`'s deliveries answered `500` every
//! time, so its head is retried for the whole phase. Reports each phase's 202→arrival
//! p50/p99 of the other keys' events and the ratio of the p99s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use tests::{ADMIN_TOKEN, Answer, Api, FakeReceiver};

use super::{arrivals, percentile};

/// What marks a delivery the receiver refuses: key `k0`'s events of the failing phase.
const FAIL_MARK: &[u8] = b"\"fail\":true";

pub async fn ordered_tail(
    api: &Api,
    rx: &FakeReceiver,
    rate: u64,
    seconds: u64,
    keys: usize,
    out: &mut HashMap<String, f64>,
) -> anyhow::Result<()> {
    if keys < 2 {
        bail!("--keys must be at least 2: key k0 fails, the others are measured");
    }
    rx.answer_when(|body| body.windows(FAIL_MARK.len()).any(|w| w == FAIL_MARK).then(|| Answer::status(500)));
    for phase in ["base", "failing"] {
        let spec = json!({"url": rx.url(), "event_types": [phase], "ordering": "key", "rate_per_sec": 100_000,
            "burst": 1000, "max_in_flight": 64});
        api.endpoint("bench", spec).await?;
    }
    for phase in ["base", "failing"] {
        let mut ms = keyed_steady(api, rx, phase, rate, seconds, keys).await?;
        ms.sort_by(f64::total_cmp);
        out.insert(format!("{phase}_p50_ms"), percentile(&ms, 0.5));
        out.insert(format!("{phase}_p99_ms"), percentile(&ms, 0.99));
    }
    out.insert("p99_ratio".into(), out["failing_p99_ms"] / out["base_p99_ms"]);
    Ok(())
}

/// Posts `rate` events/s of type `phase` for `seconds`, event `i` with key `k{i % keys}`
/// (key `k0`'s marked to fail in the failing phase), and returns the 202→arrival time in ms
/// of every event of the other keys.
async fn keyed_steady(
    api: &Api,
    rx: &FakeReceiver,
    phase: &str,
    rate: u64,
    seconds: u64,
    keys: usize,
) -> anyhow::Result<Vec<f64>> {
    let total = (rate * seconds) as usize;
    let acks = Arc::new(Mutex::new(HashMap::with_capacity(total)));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..total {
        tokio::time::sleep_until((start + Duration::from_secs_f64(i as f64 / rate as f64)).into()).await;
        let (api, acks) = (api.clone(), acks.clone());
        let (id, key) = (format!("{phase}_{i}"), i % keys);
        let (fail, phase) = (phase == "failing" && key == 0, phase.to_string());
        tasks.push(tokio::spawn(async move {
            let event = json!({"id": id, "type": phase, "ordering_key": format!("k{key}"),
                "payload": {"n": i, "fail": fail}});
            let r = api.post("/v1/tenants/bench/events", ADMIN_TOKEN, event).await?;
            if r.status != 202 {
                bail!("{} {}", r.status, r.text);
            }
            if key != 0 {
                acks.lock().unwrap().insert(id, Instant::now());
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let acks = std::mem::take(&mut *acks.lock().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let got = loop {
        let got = arrivals(rx);
        if acks.keys().all(|id| got.contains_key(id)) {
            break got;
        }
        let left =
            deadline.checked_duration_since(Instant::now()).context("the other keys' events never all arrived")?;
        // Wakes on the next arrival (or gives up at the deadline, checked above).
        let _ = rx.wait_for(rx.count() + 1, left).await;
    };
    Ok(acks.iter().map(|(id, ack)| got[id].saturating_duration_since(*ack).as_secs_f64() * 1000.0).collect())
}
