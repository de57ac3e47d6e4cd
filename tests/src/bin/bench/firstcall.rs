//! `first-call` (issue 48.18): how long the first call of a freshly uploaded plugin takes,
//! next to its second call and its load.
//!
//! The issue's two probes, `sign` plugins that end in `output_too_large`: `aliased`
//! returns 100k headers whose values all alias one 1 KiB buffer, `keys` calls `get-config`
//! with an 8 MiB key in a loop. Each round uploads a fresh copy of each (distinct bytes, so
//! it is compiled, not found in the cache) bound to an endpoint of its own, then posts two
//! events to it: the first event's attempt is the plugin's first call, the second's its
//! second. Reports, per probe, the median (over `rounds`) and the largest first-call
//! attempt duration, the median second one, and the median `load_ms` of the upload.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::bail;
use serde_json::{Value, json};
use tests::{ADMIN_TOKEN, Api};

use super::percentile;

/// The hand-written plugin component of the tests, with holes for each part.
const WAT_PLUGIN: &str = include_str!("../../../guests/wat-plugin.wat");

/// Makes the probe plugin of a round.
type Probe = fn(usize) -> anyhow::Result<Vec<u8>>;

/// How long one attempt may take to settle.
const SETTLE: Duration = Duration::from_secs(30);

/// A `sign` plugin with `body` as its core function, `pages` of memory and `data`; `round`
/// makes its bytes distinct.
fn sign_plugin(body: &str, pages: u32, data: &str, round: usize) -> anyhow::Result<Vec<u8>> {
    let holes = [
        ("{hooks}", "04".to_string()),
        ("{pages}", pages.to_string()),
        ("{data}", format!(r#"{data} (data (i32.const 2000) "{round:08}")"#)),
        ("{extra}", String::new()),
        ("{describe}", "(i32.const 0)".into()),
        ("{transform}", "unreachable".into()),
        ("{classify}", "unreachable".into()),
        ("{sign}", body.to_string()),
    ];
    let text = holes.iter().fold(WAT_PLUGIN.to_string(), |text, (hole, value)| text.replace(hole, value));
    Ok(wat::parse_str(&text)?)
}

/// 100k headers `x-sig-aa: <1 KiB at 65536>`, the list built at 131072 by a loop.
fn aliased(round: usize) -> anyhow::Result<Vec<u8>> {
    let count = 100_000u32;
    let body = format!(
        "(local.set 0 (i32.const 131072))
         (loop $l
           (i32.store (local.get 0) (i32.const 500)) (i32.store offset=4 (local.get 0) (i32.const 8))
           (i32.store offset=8 (local.get 0) (i32.const 65536)) (i32.store offset=12 (local.get 0) (i32.const 1024))
           (local.set 0 (i32.add (local.get 0) (i32.const 16)))
           (br_if $l (i32.lt_u (local.get 0) (i32.const {end}))))
         (i32.store8 (i32.const 160) (i32.const 0)) (i32.store (i32.const 164) (i32.const 131072))
         (i32.store (i32.const 168) (i32.const {count})) (i32.const 160)",
        end = 131_072 + count * 16,
    );
    sign_plugin(&body, 3 + (count * 16).div_ceil(1 << 16), r#"(data (i32.const 500) "x-sig-aa")"#, round)
}

/// `get-config` with an 8 MiB key at 65536, 1000 times.
fn keys(round: usize) -> anyhow::Result<Vec<u8>> {
    let len = 8u32 << 20;
    let body = format!(
        "(local.set 0 (i32.const 0))
         (loop $l
           (call $get_config (i32.const 65536) (i32.const {len}) (i32.const 256))
           (local.set 0 (i32.add (local.get 0) (i32.const 1)))
           (br_if $l (i32.lt_u (local.get 0) (i32.const 1000))))
         (i32.store8 (i32.const 160) (i32.const 0)) (i32.store (i32.const 168) (i32.const 0)) (i32.const 160)"
    );
    sign_plugin(&body, 2 + len.div_ceil(1 << 16), "", round)
}

pub(crate) async fn run(api: &Api, rounds: usize, out: &mut HashMap<String, f64>) -> anyhow::Result<()> {
    api.tenant("probe").await?;
    let rx = tests::FakeReceiver::start().await?;
    let probes: [(&str, Probe); 2] = [("aliased", aliased), ("keys", keys)];
    for (probe, make) in probes {
        let (mut first, mut second, mut load) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let name = format!("{probe}{round}");
            let r =
                api.raw("PUT", &format!("/v1/tenants/probe/plugins/{name}"), Some(ADMIN_TOKEN), make(round)?).await?;
            if r.status != 200 {
                bail!("upload {name}: {} {}", r.status, r.text);
            }
            load.push(r.json["load_ms"].as_f64().unwrap_or(f64::NAN));
            let spec = json!({"url": rx.url(), "event_types": [format!("{name}.x")], "plugins": {"sign": name},
                "retry": {"max_attempts": 1}});
            api.endpoint("probe", spec).await?;
            for (n, durations) in [(1, &mut first), (2, &mut second)] {
                let id = format!("{name}_{n}");
                let r = api.event("probe", json!({"id": id, "type": format!("{name}.x"), "payload": {}})).await?;
                if r.status != 202 {
                    bail!("event {id}: {} {}", r.status, r.text);
                }
                let attempt = first_attempt(api, &id).await?;
                let error = attempt["error"].as_str().unwrap_or_default();
                if !error.starts_with("plugin:output_too_large") {
                    bail!("{id}: the probe ended with {error:?}, not output_too_large");
                }
                durations.push(attempt["duration_ms"].as_f64().unwrap_or(f64::NAN));
            }
        }
        for v in [&mut first, &mut second, &mut load] {
            v.sort_by(f64::total_cmp);
        }
        out.insert(format!("{probe}_first_ms"), percentile(&first, 0.5));
        out.insert(format!("{probe}_first_max_ms"), first.last().copied().unwrap_or(f64::NAN));
        out.insert(format!("{probe}_second_ms"), percentile(&second, 0.5));
        out.insert(format!("{probe}_load_ms"), percentile(&load, 0.5));
    }
    Ok(())
}

/// The first attempt of event `id`'s delivery, once it has settled.
async fn first_attempt(api: &Api, id: &str) -> anyhow::Result<Value> {
    let list = api
        .wait_for(&format!("/v1/tenants/probe/events/{id}/deliveries"), SETTLE, |v| {
            matches!(v["data"][0]["state"].as_str(), Some("delivered" | "dead"))
        })
        .await?;
    let delivery = list["data"][0]["id"].as_str().unwrap_or_default().to_string();
    let d = api.get(&format!("/v1/tenants/probe/deliveries/{delivery}"), ADMIN_TOKEN).await?;
    Ok(d.json["attempt_history"][0].clone())
}
