//! Several real `herald` processes on one Postgres schema, one receiver: a delivery is never
//! in flight on two nodes at once, an endpoint's pace holds for the whole cluster, and a
//! node killed with SIGKILL loses nothing (the others finish its work once its leases end).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gateway::model::{EndpointId, Millis};
use serde_json::{Value, json};
use tests::pg::PgSchema;
use tests::{ADMIN_TOKEN, Answer, Api, FakeReceiver, HeraldProcess, Received, done_or, eventually, herald_binary};

/// How long the receiver takes to answer: each request is in flight at least this long.
const RECEIVER_DELAY: Duration = Duration::from_millis(30);
const RATE: f64 = 20.0;
const BURST: usize = 4;

struct Cluster {
    // Declared first: nodes are killed before their schema is dropped.
    nodes: Vec<HeraldProcess>,
    dirs: Vec<tempfile::TempDir>,
    schema: PgSchema,
}

impl Cluster {
    async fn start(n: usize, env: &[(&str, &str)]) -> anyhow::Result<Cluster> {
        let bin = herald_binary()?;
        let schema = PgSchema::create().await?;
        let mut env: Vec<(&str, &str)> = env.to_vec();
        env.push(("HERALD_STORE_URL", &schema.url));
        let mut nodes = Vec::new();
        let mut dirs = Vec::new();
        for _ in 0..n {
            let dir = tempfile::tempdir()?;
            nodes.push(HeraldProcess::start(&bin, dir.path(), &env).await?);
            dirs.push(dir);
        }
        Ok(Cluster { nodes, dirs, schema })
    }

    /// Creates tenant `acme` and one paced endpoint; returns its id.
    async fn endpoint(&self, rx: &FakeReceiver, extra: Value) -> anyhow::Result<String> {
        let api = &self.nodes[0].api;
        api.tenant("acme").await?;
        let mut body = json!({"url": rx.url(), "rate_per_sec": RATE, "burst": BURST, "max_in_flight": 4});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let ep = api.endpoint("acme", body).await?;
        Ok(ep["id"].as_str().expect("id").to_string())
    }

    /// Posts `total` events in batches spread over every node; returns their ids.
    async fn post(&self, total: usize) -> anyhow::Result<Vec<String>> {
        let ids: Vec<String> = (0..total).map(|i| format!("evt_{i:05}")).collect();
        for (n, chunk) in ids.chunks(50).enumerate() {
            let events: Vec<Value> =
                chunk.iter().map(|id| json!({"id": id, "type": "invoice.paid", "payload": {"id": id}})).collect();
            let api = &self.nodes[n % self.nodes.len()].api;
            let r = api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, json!({"events": events})).await?;
            anyhow::ensure!(r.status == 202, "batch refused: {} {}", r.status, r.text);
        }
        Ok(ids)
    }
}

/// Polls `api` until all `total` deliveries of `acme` are delivered.
async fn wait_delivered(api: &Api, total: usize, timeout: Duration) -> anyhow::Result<()> {
    api.wait_for(&format!("/v1/tenants/acme/deliveries?state=delivered&limit={}", total + 1), timeout, |v| {
        v["data"].as_array().is_some_and(|d| d.len() == total)
    })
    .await?;
    Ok(())
}

/// Requests per webhook id, in arrival order.
fn by_event(got: &[Received]) -> HashMap<String, Vec<Instant>> {
    let mut map: HashMap<String, Vec<Instant>> = HashMap::new();
    for r in got {
        map.entry(r.header("webhook-id").unwrap_or_default().to_string()).or_default().push(r.at);
    }
    map
}

/// No webhook id was ever in flight twice at once: each request of an id arrives after the
/// previous one was answered.
fn assert_single_flight(got: &[Received]) {
    for (id, mut times) in by_event(got) {
        times.sort();
        for w in times.windows(2) {
            let gap = w[1].duration_since(w[0]);
            assert!(gap >= RECEIVER_DELAY, "{id} was in flight twice at once ({gap:?} apart)");
        }
    }
}

/// Waits until `total` distinct (endpoint path, webhook id) pairs have arrived.
async fn every_event_arrives(rx: &FakeReceiver, total: usize) -> anyhow::Result<()> {
    eventually("every event arrives", Duration::from_secs(60), || async {
        let got = rx.received();
        let distinct: std::collections::HashSet<(&str, Option<&str>)> =
            got.iter().map(|r| (r.path.as_str(), r.header("webhook-id"))).collect();
        done_or(distinct.len() == total, format!("{} of {total}", distinct.len()))
    })
    .await
}

fn now_ms() -> Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as Millis
}

/// A counter from a node's `/metrics`.
pub(crate) async fn metric(api: &Api, name: &str) -> anyhow::Result<u64> {
    let r = api.raw("GET", "/metrics", None, Bytes::new()).await?;
    let line = r.text.lines().find(|l| l.split(' ').next() == Some(name));
    Ok(line.and_then(|l| l.split(' ').nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_keep_single_flight_and_the_endpoint_pace() -> anyhow::Result<()> {
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(200).delay(RECEIVER_DELAY));
    let cluster = Cluster::start(3, &[]).await?;
    let endpoint = EndpointId::from_stored(cluster.endpoint(&rx, json!({})).await?);
    // The test holds the endpoint's partition while it posts, like a fourth node: no node
    // may send meanwhile, and pacing is measured apart from intake.
    let store = gateway::store::open(&cluster.schema.url, 2).await?;
    let now = now_ms();
    assert!(store.acquire_partition(&endpoint, "test-holder", now, now + 60_000).await?);
    let total = 200; // 10 s at 20/s
    let ids = cluster.post(total).await?;
    rx.stays_at(0, Duration::from_millis(500))
        .await
        .map_err(|e| e.context("nobody sends for a partition another node holds"))?;
    store.release_partition(&endpoint, "test-holder").await?;

    let got = rx.wait_for(total, Duration::from_secs(40)).await?;
    wait_delivered(&cluster.nodes[2].api, total, Duration::from_secs(10)).await?;
    let got_all = rx.received();
    assert_single_flight(&got_all);
    let arrived = by_event(&got_all);
    assert_eq!(arrived.len(), total, "every event arrived");
    assert!(ids.iter().all(|id| arrived.contains_key(id)));
    assert_eq!(got_all.len(), total, "nothing was sent twice");

    let mut times: Vec<Instant> = got.iter().map(|r| r.at).collect();
    times.sort();
    let span = times[total - 1].duration_since(times[0]).as_secs_f64();
    // The first BURST requests may leave at once; from then on every request waits for its
    // slot, so the pace is measured from the BURST-th arrival on. (The burst also lets a
    // node that was briefly starved of CPU catch up, as it would in production.)
    let start = times[BURST - 1];
    let paced = (total - BURST) as f64 / times[total - 1].duration_since(start).as_secs_f64();
    let overall = (total - 1) as f64 / span;
    let mut per_node = Vec::new();
    for node in &cluster.nodes {
        per_node.push(metric(&node.api, "herald_attempts_total").await?);
    }
    eprintln!(
        "cluster pace {paced:.3}/s after the burst ({overall:.3}/s overall, {span:.2}s); attempts per node {per_node:?}"
    );
    assert!((paced - RATE).abs() <= RATE * 0.02, "the cluster sent {paced:.3}/s, not {RATE}/s ± 2 %");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_run_loses_nothing() -> anyhow::Result<()> {
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(200).delay(RECEIVER_DELAY));
    // Short delivery leases, so the others recover the dead node's work within seconds.
    // What the kill can make go out twice (sent, result not yet committed) is bounded by
    // the node-wide slots, held through the commit: here the endpoint's own 4.
    let env = [("HERALD_DELIVERY_LEASE_MARGIN", "2s"), ("HERALD_DELIVERY_MAX_IN_FLIGHT_TOTAL", "4")];
    let mut cluster = Cluster::start(3, &env).await?;
    let max_in_flight = 4;
    cluster.endpoint(&rx, json!({"timeout": "2s", "connect_timeout": "1s", "max_in_flight": max_in_flight})).await?;
    let total = 200;
    let ids = cluster.post(total).await?;

    // Kill the node that is delivering, mid-run.
    rx.wait_for(40, Duration::from_secs(20)).await?;
    let mut busy = None;
    for (i, node) in cluster.nodes.iter().enumerate() {
        if metric(&node.api, "herald_attempts_total").await? > 0 {
            busy = Some(i);
        }
    }
    let busy = busy.expect("some node is delivering");
    cluster.nodes[busy].kill();
    let killed_at = Instant::now();
    let at_kill = rx.count();
    assert!(at_kill < total, "the kill came mid-run ({at_kill} of {total} arrived)");
    let survivors: Vec<&HeraldProcess> =
        cluster.nodes.iter().enumerate().filter(|(i, _)| *i != busy).map(|(_, n)| n).collect();

    // Its partition lease (15 s) and delivery leases must lapse first; then the rest
    // arrives at the paced rate.
    wait_delivered(&survivors[0].api, total, Duration::from_secs(50)).await?;
    let got = rx.received();
    assert_single_flight(&got);
    let arrived = by_event(&got);
    let lost: Vec<&String> = ids.iter().filter(|id| !arrived.contains_key(*id)).collect();
    assert!(lost.is_empty(), "events never delivered: {lost:?}");
    let duplicates = got.len() - total;
    assert!(
        duplicates <= max_in_flight,
        "{duplicates} duplicates, more than the {max_in_flight} that could be in flight"
    );
    let mut recovered = 0;
    for node in &survivors {
        recovered += metric(&node.api, "herald_leases_recovered_total").await?;
    }
    assert!(recovered > 0, "the survivors took over the dead node's leases");
    let resumed = got.iter().map(|r| r.at).filter(|t| *t > killed_at).min().expect("arrivals after the kill");
    eprintln!(
        "killed node {busy} after {at_kill} arrivals; resumed after {:?}; {recovered} leases recovered; {duplicates} duplicates",
        resumed.duration_since(killed_at)
    );
    Ok(())
}

/// Every node runs every running replay, taking turns on the schedule stored with it: two
/// nodes on one replay keep its rate between them, and when the node it was started on
/// dies, the other finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_keeps_its_rate_across_nodes_and_outlives_the_node_it_started_on() -> anyhow::Result<()> {
    let rx = FakeReceiver::start().await?;
    rx.set_default(Answer::status(422));
    let mut cluster = Cluster::start(2, &[]).await?;
    cluster.endpoint(&rx, json!({"rate_per_sec": 1000, "burst": 100})).await?;
    let total = 16;
    cluster.post(total).await?;
    let dead = format!("/v1/tenants/acme/dead-letters?limit={}", total + 1);
    let api = cluster.nodes[1].api.clone();
    api.wait_for(&dead, Duration::from_secs(20), |v| v["data"].as_array().is_some_and(|d| d.len() == total)).await?;
    rx.set_default(Answer::status(200));
    let first_round = rx.count();

    let rate = 4.0;
    let body = json!({"filter": {}, "rate_per_sec": rate, "batch": 2});
    let asked = Instant::now();
    let r = cluster.nodes[0].api.post("/v1/tenants/acme/replays", ADMIN_TOKEN, body).await?;
    assert_eq!(r.status, 202, "{}", r.text);
    let id = r.json["id"].as_str().expect("id").to_string();
    // By 12 of 16 (2.75 s at 4/s) the other node has found the replay (it looks every 2 s)
    // and takes its turns too.
    rx.wait_for(first_round + 12, Duration::from_secs(20)).await?;
    cluster.nodes[0].kill();
    let before_kill: Vec<Instant> = rx.received().iter().skip(first_round).map(|r| r.at).collect();

    let progress = format!("/v1/tenants/acme/replays/{id}");
    // Done once everything it re-queued has settled: what the dead node had claimed waits
    // for its leases to expire (the endpoint's partition lease, 15 s, and the deliveries'),
    // and for the survivor's recovery scan.
    let done = api
        .wait_for(&progress, Duration::from_secs(60), |v| v["state"] == "done" && v["sent"] == v["selected"])
        .await?;
    assert_eq!(done["selected"], total, "{done}");
    // The first is due when the replay is created, the n-th n / rate later: measured from
    // the request, a late arrival can only lower the figure.
    let span = before_kill.last().expect("arrivals").duration_since(asked).as_secs_f64();
    let achieved = (before_kill.len() - 1) as f64 / span;
    eprintln!("{} replayed {span:.2} s after the request, before the kill: {achieved:.2}/s", before_kill.len());
    assert!(achieved <= rate * 1.02, "two nodes replayed at {achieved:.2}/s, over the {rate}/s asked");
    Ok(())
}

/// Two live processes never share a node id: a second one asking for a held
/// `cluster.node_id` is refused at start, naming it (sharing it would let each take up the
/// other's leases as its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_node_with_the_same_id_is_refused() -> anyhow::Result<()> {
    let env = [("HERALD_CLUSTER_NODE_ID", "node-a")];
    let cluster = Cluster::start(1, &env).await?;
    let dir = tempfile::tempdir()?;
    let mut cmd = tokio::process::Command::new(herald_binary()?);
    cmd.arg("serve").current_dir(dir.path()).env_clear().kill_on_drop(true);
    cmd.envs(tests::base_env(dir.path())).env("HERALD_STORE_URL", &cluster.schema.url).envs(env);
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second node started: {stderr}");
    assert!(stderr.contains("\"node-a\" is held by another live process"), "{stderr}");
    // The first is untouched.
    cluster.nodes[0].api.raw("GET", "/readyz", None, Bytes::new()).await?.expect(200)?;
    Ok(())
}

/// A node that loses the session holding its id (the database ended it) and finds another
/// process holding the id when it comes to take it again stops, with an error naming the
/// id: the leases under that id are the other's now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_id_was_taken_meanwhile_stops() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(1, &[("HERALD_CLUSTER_NODE_ID", "node-a")]).await?;
    // One connection: the lock the test takes is its session's.
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&cluster.schema.url).await?;
    let key = "hashtext(current_schema()), hashtext('herald-node:node-a')";
    let ended: i64 = sqlx::query_scalar(&format!(
        "SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l, (SELECT {key}) AS k(s, n) \
         WHERE l.locktype = 'advisory' AND l.granted AND l.classid::int = k.s AND l.objid::int = k.n"
    ))
    .fetch_one(&pool)
    .await?;
    assert_eq!(ended, 1, "one session held the node's id");
    // Taken before the node comes back for it (it looks once a second).
    let take = format!("SELECT pg_try_advisory_lock({key})");
    eventually("the test takes the id", Duration::from_secs(5), || async {
        let taken: bool = sqlx::query_scalar(&take).fetch_one(&pool).await?;
        done_or(taken, "held")
    })
    .await?;
    let status = cluster.nodes[0].exited(Duration::from_secs(20)).await?;
    assert!(!status.success(), "the node stopped with an error: {status}");
    Ok(())
}

/// A rolling restart (SIGTERM, start again, one node at a time) of three nodes keeps the
/// cluster delivering: arrivals never stop for more than 2 s, and no endpoint waits longer
/// than one partition lease (15 s) between two of its deliveries. Nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_keeps_deliveries_flowing() -> anyhow::Result<()> {
    const ENDPOINTS: usize = 20;
    const EVENTS: usize = 50;
    let rx = FakeReceiver::start().await?;
    let mut cluster = Cluster::start(3, &[]).await?;
    let api = cluster.nodes[0].api.clone();
    api.tenant("acme").await?;
    for i in 0..ENDPOINTS {
        let url = format!("{}/{i}", rx.url());
        api.endpoint("acme", json!({"url": url, "rate_per_sec": 2, "burst": 1})).await?;
    }
    // 50 events to each of 20 endpoints at 2/s each: 25 s of deliveries.
    let total = ENDPOINTS * EVENTS;
    cluster.post(EVENTS).await?;
    rx.wait_for(ENDPOINTS, Duration::from_secs(20)).await?;

    let bin = herald_binary()?;
    let env = [("HERALD_STORE_URL", cluster.schema.url.clone())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut restarts = Vec::new();
    for i in 0..cluster.nodes.len() {
        let status = cluster.nodes[i].terminate(Duration::from_secs(20)).await?;
        assert!(status.success(), "node {i} stopped cleanly: {status}");
        let stopped = Instant::now();
        cluster.nodes[i] = HeraldProcess::start(&bin, cluster.dirs[i].path(), &env).await?;
        restarts.push((stopped, Instant::now()));
        // The next node stops only once deliveries went on after this one came back.
        let n = rx.count();
        rx.wait_for(n + ENDPOINTS, Duration::from_secs(20)).await?;
    }
    every_event_arrives(&rx, total).await?;

    let got = rx.received();
    let mut times: Vec<Instant> = got.iter().map(|r| r.at).collect();
    times.sort();
    let max_gap = times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
    let t0 = restarts[0].0;
    for w in times.windows(2).filter(|w| w[1] - w[0] > Duration::from_millis(900)) {
        eprintln!("gap {:?} from {:?} after the first stop", w[1] - w[0], w[0].saturating_duration_since(t0));
    }
    for (s, r) in &restarts {
        eprintln!("restart stop at {:?}, ready at {:?}", s.duration_since(t0), r.duration_since(t0));
    }
    let mut per_endpoint: HashMap<&str, Vec<Instant>> = HashMap::new();
    for r in &got {
        per_endpoint.entry(r.path.as_str()).or_default().push(r.at);
    }
    let (worst, worst_gap) = per_endpoint
        .iter_mut()
        .map(|(path, t)| {
            t.sort();
            (*path, t.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default())
        })
        .max_by_key(|(_, gap)| *gap)
        .expect("endpoints");
    let spans: Vec<String> = restarts.iter().map(|(s, r)| format!("{:?}", r.duration_since(*s))).collect();
    eprintln!(
        "rolling restart (stop -> ready {spans:?}): cluster max gap {max_gap:?}, worst endpoint {worst} {worst_gap:?}, {} duplicates",
        got.len() - total
    );
    assert!(max_gap <= Duration::from_secs(2), "the cluster sent nothing for {max_gap:?}");
    assert!(worst_gap <= Duration::from_secs(15), "{worst} waited {worst_gap:?}, longer than a partition lease");
    Ok(())
}

/// The endpoints with work are spread over the nodes as `lease::preferred_node` says
/// (each node holds exactly its share of the partitions), a node that joins mid-run takes
/// its share within seconds, one that drains hands its endpoints to the others, and
/// nothing is sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_spread_over_the_nodes_and_a_joining_node_takes_its_share() -> anyhow::Result<()> {
    const ENDPOINTS: usize = 24;
    const EVENTS: usize = 100;
    let rx = FakeReceiver::start().await?;
    let schema = PgSchema::create().await?;
    let bin = herald_binary()?;
    let names = ["node-a", "node-b", "node-c"];
    let dirs: Vec<tempfile::TempDir> = names.iter().map(|_| tempfile::tempdir()).collect::<Result<_, _>>()?;
    let start = |i: usize| start_node(&bin, &dirs[i], &schema.url, names[i]);
    let mut nodes = vec![start(0).await?, start(1).await?];
    let api = nodes[0].api.clone();
    api.tenant("acme").await?;
    let mut ids = Vec::new();
    for i in 0..ENDPOINTS {
        let url = format!("{}/{i}", rx.url());
        let ep = api.endpoint("acme", json!({"url": url, "rate_per_sec": 4, "burst": 1})).await?;
        ids.push(ep["id"].as_str().expect("id").to_string());
    }
    let shares = |members: &[String]| shares(&ids, members);
    // 100 events to each of 24 endpoints at 4/s: 25 s of work for every endpoint.
    let total = ENDPOINTS * EVENTS;
    for chunk in (0..EVENTS).collect::<Vec<_>>().chunks(20) {
        let events: Vec<Value> = chunk.iter().map(|i| json!({"type": "t", "payload": {"n": i}})).collect();
        let r = api.post("/v1/tenants/acme/events/batch", ADMIN_TOKEN, json!({"events": events})).await?;
        anyhow::ensure!(r.status == 202, "{} {}", r.status, r.text);
    }
    let two = shares(&members(&names[..2]));
    assert!(two.iter().all(|&n| n > 0), "both nodes have endpoints: {two:?}");
    eventually("each of two nodes holds its share", Duration::from_secs(20), || async {
        let now = held(&nodes).await?;
        done_or(now == two, format!("held {now:?}, shares {two:?}"))
    })
    .await?;

    let joined = Instant::now();
    nodes.push(start(2).await?);
    let three = shares(&members(&names));
    eventually("the joining node takes its share", Duration::from_secs(20), || async {
        let now = held(&nodes).await?;
        done_or(now == three, format!("held {now:?}, shares {three:?}"))
    })
    .await?;
    let rebalanced = joined.elapsed();

    // node-b drains: it leaves the cluster first, and node-a and node-c take its endpoints.
    let left = Instant::now();
    let status = nodes[1].terminate(Duration::from_secs(20)).await?;
    assert!(status.success(), "node-b stopped cleanly: {status}");
    let after = shares(&members(&[names[0], names[2]]));
    let staying = [nodes.remove(0), nodes.remove(1)];
    eventually("the others take the leaving node's endpoints", Duration::from_secs(20), || async {
        let now = held(&staying).await?;
        done_or(now == after, format!("held {now:?}, shares {after:?}"))
    })
    .await?;
    eprintln!(
        "shares of {ENDPOINTS} endpoints: two nodes {two:?}, three {three:?} (rebalanced in {rebalanced:?}), \
         node-b gone {after:?} (in {:?})",
        left.elapsed()
    );
    assert!(rx.count() < total, "the run was still going when the shares had moved");

    every_event_arrives(&rx, total).await?;
    assert_eq!(rx.count(), total, "nothing was sent twice");
    Ok(())
}

/// A node that joins while another's partitions sit idle, still holding the endpoints'
/// leases, gets its share at once: the idle partitions of the endpoints that moved give
/// their leases up when the membership changes, rather than when their linger ends (10 s)
/// and the lease runs out (15 s more), and the new node paces its endpoints' next events
/// itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_node_takes_its_share_from_idle_partitions_at_once() -> anyhow::Result<()> {
    const ENDPOINTS: usize = 16;
    let rx = FakeReceiver::start().await?;
    let schema = PgSchema::create().await?;
    let bin = herald_binary()?;
    let names = ["node-a", "node-b"];
    let dirs: Vec<tempfile::TempDir> = names.iter().map(|_| tempfile::tempdir()).collect::<Result<_, _>>()?;
    let start = |i: usize| start_node(&bin, &dirs[i], &schema.url, names[i]);
    let mut nodes = vec![start(0).await?];
    let api = nodes[0].api.clone();
    api.tenant("acme").await?;
    let mut ids = Vec::new();
    for i in 0..ENDPOINTS {
        let url = format!("{}/{i}", rx.url());
        let ep = api.endpoint("acme", json!({"url": url, "rate_per_sec": 50})).await?;
        ids.push(ep["id"].as_str().expect("id").to_string());
    }
    let r = api.post("/v1/tenants/acme/events", ADMIN_TOKEN, json!({"type": "t", "payload": {"n": 1}})).await?;
    anyhow::ensure!(r.status == 202, "{} {}", r.status, r.text);
    rx.wait_for(ENDPOINTS, Duration::from_secs(20)).await?;
    // node-a's partitions are idle now, each still holding its endpoint's lease.
    assert_eq!(held(&nodes).await?, vec![ENDPOINTS as u64], "node-a holds every endpoint it delivered to");

    let joined = Instant::now();
    nodes.push(start(1).await?);
    let two = shares(&ids, &members(&names));
    assert!(two.iter().all(|&n| n > 0), "both nodes have endpoints: {two:?}");
    // Within 5 s: well before the idle partitions' linger (10 s) would have ended.
    eventually("node-a gives up the endpoints that moved", Duration::from_secs(5), || async {
        let now = held(&nodes[..1]).await?;
        done_or(now[0] == two[0], format!("node-a holds {}, its share is {}", now[0], two[0]))
    })
    .await?;
    let handed = joined.elapsed();
    let r = api.post("/v1/tenants/acme/events", ADMIN_TOKEN, json!({"type": "t", "payload": {"n": 2}})).await?;
    anyhow::ensure!(r.status == 202, "{} {}", r.status, r.text);
    eventually("node-b paces its share", Duration::from_secs(5), || async {
        let now = held(&nodes).await?;
        done_or(now == two, format!("held {now:?}, shares {two:?}"))
    })
    .await?;
    every_event_arrives(&rx, 2 * ENDPOINTS).await?;
    eprintln!("shares {two:?} of {ENDPOINTS} idle endpoints: node-a gave node-b its share {handed:?} after it joined");
    assert_eq!(rx.count(), 2 * ENDPOINTS, "nothing was sent twice");
    Ok(())
}

/// Starts `herald` in `dir` as cluster node `name` of the store at `url`.
async fn start_node(bin: &Path, dir: &tempfile::TempDir, url: &str, name: &str) -> anyhow::Result<HeraldProcess> {
    let env = [("HERALD_STORE_URL", url), ("HERALD_CLUSTER_NODE_ID", name)];
    HeraldProcess::start(bin, dir.path(), &env).await
}

/// Each member's share of `endpoints`, as `lease::preferred_node` splits them.
fn shares(endpoints: &[String], members: &[String]) -> Vec<u64> {
    let mut n = vec![0; members.len()];
    for id in endpoints {
        let node = gateway::lease::preferred_node(id, members).expect("members");
        n[members.iter().position(|m| m == node).expect("a member")] += 1;
    }
    n
}

fn members(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// How many partition leases each node holds (`herald_partitions_held`).
async fn held(nodes: &[HeraldProcess]) -> anyhow::Result<Vec<u64>> {
    let mut v = Vec::new();
    for node in nodes {
        v.push(metric(&node.api, "herald_partitions_held").await?);
    }
    Ok(v)
}
