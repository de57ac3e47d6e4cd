//! Network edges of the API listener: slow and idle clients are cut off after their
//! timeouts, the connection cap holds, and normal requests keep succeeding meanwhile; a
//! node makes room for its connections before it serves.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use tests::{ADMIN_TOKEN, TestGateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const REQUEST: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: herald\r\n\r\n";

/// Reads until the server closes the connection (EOF or reset); returns how long it took.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .context("the server kept the connection open")?;
    Ok(start.elapsed())
}

/// Sends one request on `stream` and reads its complete `ok` answer.
async fn healthz_on(stream: &mut TcpStream) -> anyhow::Result<()> {
    stream.write_all(REQUEST).await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(Duration::from_secs(5), async {
        while !got.ends_with(b"\r\n\r\nok") {
            let n = stream.read(&mut buf).await?;
            anyhow::ensure!(n > 0, "closed before the answer");
            got.extend_from_slice(&buf[..n]);
        }
        anyhow::Ok(())
    })
    .await
    .context("no answer")??;
    assert!(got.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_are_closed_after_their_timeouts() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[
        ("HERALD_SERVER_IDLE_TIMEOUT", "600ms"),
        ("HERALD_SERVER_HEADER_READ_TIMEOUT", "1s"),
    ])
    .await?;

    // Keep-alive: answered, then closed once idle for the idle timeout, not before.
    let mut idle = TcpStream::connect(gw.addr).await?;
    healthz_on(&mut idle).await?;
    let took = closed_within(&mut idle, Duration::from_secs(5)).await?;
    assert!(took >= Duration::from_millis(450), "closed after {took:?}, before the idle timeout");

    // Requests closer together than the idle timeout keep a connection open.
    let mut busy = TcpStream::connect(gw.addr).await?;
    for _ in 0..6 {
        healthz_on(&mut busy).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A connection that never sends a request head is closed after the header timeout.
    let mut silent = TcpStream::connect(gw.addr).await?;
    let took = closed_within(&mut silent, Duration::from_secs(5)).await?;
    assert!(took >= Duration::from_millis(800), "closed after {took:?}");

    // Slowloris: a header line every 100 ms never completes the head; sending does not
    // extend the deadline.
    let slow = TcpStream::connect(gw.addr).await?;
    let (mut read, mut write) = slow.into_split();
    let start = Instant::now();
    let trickle = tokio::spawn(async move {
        let _ = write.write_all(b"GET /healthz HTTP/1.1\r\n").await;
        for i in 0..50 {
            if write.write_all(format!("x-slow-{i}: 1\r\n").as_bytes()).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), read.read(&mut buf)).await.context("slowloris kept open")?;
    assert!(matches!(n, Ok(0) | Err(_)), "no answer to an unfinished head: {n:?}");
    assert!(start.elapsed() < Duration::from_secs(3), "closed only after {:?}", start.elapsed());
    trickle.abort();
    Ok(())
}

/// Reads what the server sends until it closes the connection, within `limit`.
async fn read_to_close(stream: &mut TcpStream, limit: Duration) -> anyhow::Result<String> {
    let mut got = Vec::new();
    tokio::time::timeout(limit, stream.read_to_end(&mut got))
        .await
        .context("the server kept the connection open")??;
    Ok(String::from_utf8_lossy(&got).into_owned())
}

/// A request body that pauses longer than `server.body_read_timeout` is refused with a JSON
/// `408`, stores nothing, and its connection is closed; a slow body that keeps coming (every
/// pause shorter than the timeout, the whole far longer) is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_refused_with_408_and_a_slow_steady_one_is_served() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[("HERALD_SERVER_BODY_READ_TIMEOUT", "500ms")]).await?;
    gw.api.tenant("acme").await?;
    let request = |id: &str| {
        let body = json!({"id": id, "type": "t", "payload": {"pad": "x".repeat(200)}}).to_string();
        let head = format!(
            "POST /v1/tenants/acme/events HTTP/1.1\r\nhost: herald\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        (head, body)
    };

    // Half a body, then nothing.
    let (head, body) = request("evt_stalled");
    let mut stalled = TcpStream::connect(gw.addr).await?;
    stalled.write_all(head.as_bytes()).await?;
    stalled.write_all(&body.as_bytes()[..body.len() / 2]).await?;
    let started = Instant::now();
    let answer = read_to_close(&mut stalled, Duration::from_secs(5)).await?;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"request_timeout\"") && answer.contains("server.body_read_timeout"), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(450), "refused after {:?}", started.elapsed());
    let r = gw.api.get("/v1/tenants/acme/events/evt_stalled", ADMIN_TOKEN).await?;
    assert_eq!(r.status, 404, "nothing of a refused request is stored: {}", r.text);
    // A plugin upload reads its body its own way, under the same rule.
    let mut upload = TcpStream::connect(gw.addr).await?;
    let head = format!(
        "PUT /v1/tenants/acme/plugins/p HTTP/1.1\r\nhost: herald\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\
         content-length: 4096\r\n\r\n\0asm"
    );
    upload.write_all(head.as_bytes()).await?;
    let answer = read_to_close(&mut upload, Duration::from_secs(5)).await?;
    assert!(answer.starts_with("HTTP/1.1 408") && answer.contains("\"request_timeout\""), "{answer}");

    // 20 bytes every 100 ms: under the timeout each time, over a second in all.
    let (head, body) = request("evt_steady");
    let mut steady = TcpStream::connect(gw.addr).await?;
    steady.write_all(head.as_bytes()).await?;
    for chunk in body.as_bytes().chunks(20) {
        steady.write_all(chunk).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut got = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), steady.read(&mut got)).await.context("no answer")??;
    let answer = String::from_utf8_lossy(&got[..n]);
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    Ok(())
}

/// 300 hostile connections (half silent, half trickling a head) while normal clients
/// keep getting answers; bounded to a few seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn normal_requests_succeed_while_hundreds_of_idle_and_slow_connections_are_open() -> anyhow::Result<()> {
    let gw = TestGateway::start().await?;
    let mut hostile = Vec::new();
    for i in 0..300 {
        let mut s = TcpStream::connect(gw.addr).await?;
        if i % 2 == 0 {
            s.write_all(b"POST /v1/tenants HTTP/1.1\r\n").await?;
        }
        hostile.push(s);
    }
    let trickle = async {
        for round in 0..10 {
            for s in hostile.iter_mut().step_by(2) {
                s.write_all(format!("x-slow-{round}: 1\r\n").as_bytes()).await?;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        anyhow::Ok(())
    };
    let normal = async {
        let mut slowest = Duration::ZERO;
        for _ in 0..40 {
            let start = Instant::now();
            let r = gw.api.raw("GET", "/readyz", None, bytes::Bytes::new()).await?;
            assert_eq!(r.status, 200, "{}", r.text);
            let mut fresh = TcpStream::connect(gw.addr).await?;
            healthz_on(&mut fresh).await?;
            slowest = slowest.max(start.elapsed());
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        anyhow::Ok(slowest)
    };
    let (trickled, slowest) = tokio::join!(trickle, normal);
    trickled?;
    let slowest = slowest?;
    assert!(slowest < Duration::from_secs(2), "a normal request took {slowest:?}");
    Ok(())
}

/// Past `server.max_connections`, a new connection waits while room is made for it: the
/// keep-alive connection idle longest is closed at once (here the harness's pooled one),
/// else the oldest connection that has not sent a request head within 250 ms, however
/// long `server.header_read_timeout` is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_while_room_is_made() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[("HERALD_SERVER_MAX_CONNECTIONS", "4")]).await?;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(gw.addr).await?);
    }
    let start = Instant::now();
    let mut next = TcpStream::connect(gw.addr).await?;
    healthz_on(&mut next).await?;
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(150), "answered after {waited:?}: the cap did not hold");
    assert!(waited < Duration::from_secs(1), "answered after {waited:?}, not when room was made");
    // The oldest silent connection made the room.
    closed_within(&mut silent[0], Duration::from_secs(1)).await?;
    Ok(())
}

/// Issue 29 §6: more idle connections than the cap (keep-alive ones between requests, and
/// silent ones that never send a head) do not lock out the API: `/healthz` and a real
/// request on fresh connections each answer within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_past_the_cap_do_not_lock_out_the_api() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[("HERALD_SERVER_MAX_CONNECTIONS", "32")]).await?;
    let mut idle = Vec::new();
    for _ in 0..24 {
        let mut s = TcpStream::connect(gw.addr).await?;
        healthz_on(&mut s).await?;
        idle.push(s);
    }
    for _ in 0..24 {
        idle.push(TcpStream::connect(gw.addr).await?);
    }
    for round in 0..3 {
        let start = Instant::now();
        let mut fresh = TcpStream::connect(gw.addr).await?;
        healthz_on(&mut fresh).await?;
        let health = start.elapsed();
        let start = Instant::now();
        let api = tests::Api::new(format!("http://{}", gw.addr));
        let r = tokio::time::timeout(Duration::from_secs(5), api.get("/v1/tenants", ADMIN_TOKEN)).await??;
        let real = start.elapsed();
        assert_eq!(r.status, 200, "{}", r.text);
        assert!(
            health < Duration::from_secs(1) && real < Duration::from_secs(1),
            "round {round}: /healthz took {health:?}, GET /v1/tenants {real:?}"
        );
        // Hold both, so the next round finds the cap as full.
        idle.push(fresh);
        idle.push(TcpStream::connect(gw.addr).await?);
    }
    Ok(())
}

/// Issue 29 §6: `server.admin_listen` serves `/healthz`, `/readyz` and `/metrics` (and no
/// API route) on a listener of its own, which answers while the API's is flooded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_on_admin_listen_while_the_api_is_flooded() -> anyhow::Result<()> {
    let admin = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let admin_listen = admin.to_string();
    let gw = TestGateway::start_with(&[
        ("HERALD_SERVER_MAX_CONNECTIONS", "4"),
        ("HERALD_SERVER_ADMIN_LISTEN", admin_listen.as_str()),
    ])
    .await?;
    // Every API slot silent, and more waiting in the backlog.
    let mut flood = Vec::new();
    for _ in 0..64 {
        flood.push(TcpStream::connect(gw.addr).await?);
    }
    let probe = tests::Api::new(format!("http://{admin}"));
    for path in ["/healthz", "/readyz", "/metrics"] {
        let start = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(5), probe.get(path, "")).await??;
        assert_eq!(r.status, 200, "{path}: {}", r.text);
        assert!(start.elapsed() < Duration::from_secs(1), "{path} took {:?}", start.elapsed());
    }
    let r = probe.get("/v1/tenants", ADMIN_TOKEN).await?;
    assert_eq!(r.status, 404, "the admin listener serves no API route: {}", r.text);
    Ok(())
}

/// `/proc/<pid>/status`'s or `/proc/<pid>/limits`' value for `key` (the first number).
#[cfg(target_os = "linux")]
fn proc_number(pid: u32, file: &str, key: &str) -> anyhow::Result<usize> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}"))?;
    let line = text.lines().find_map(|l| l.strip_prefix(key)).with_context(|| format!("no {key} in {file}"))?;
    Ok(line.split_whitespace().next().context("empty")?.parse()?)
}

/// A node sizes its descriptor table for every connection its settings allow before it
/// serves: grown on demand under load instead, each doubling stalls all its threads for an
/// RCU grace period (18 ms at a time on the benchmark machine).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_node_makes_room_for_its_connections_before_it_serves() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let env = [("HERALD_SERVER_MAX_CONNECTIONS", "3000"), ("HERALD_DELIVERY_MAX_IN_FLIGHT_TOTAL", "1000")];
    let node = tests::HeraldProcess::start(&tests::herald_binary()?, dir.path(), &env).await?;
    let table = proc_number(node.pid(), "status", "FDSize:")?;
    let soft_limit = proc_number(node.pid(), "limits", "Max open files")?;
    // Intake, deliveries in flight and as many idle, the store's readers, and a margin.
    let wanted = (3000 + 2 * 1000 + 8 + 256).min(soft_limit);
    anyhow::ensure!(table >= wanted, "descriptor table of {table} slots, wanted {wanted} (soft limit {soft_limit})");
    Ok(())
}
