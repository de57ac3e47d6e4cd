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

/// Past `server.max_connections`, a new connection waits (in the backlog) until a slot
/// frees: here, until the silent connections holding every slot time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_for_a_free_slot() -> anyhow::Result<()> {
    let gw = TestGateway::start_with(&[
        ("HERALD_SERVER_MAX_CONNECTIONS", "4"),
        ("HERALD_SERVER_HEADER_READ_TIMEOUT", "700ms"),
    ])
    .await?;
    // With the harness's pooled keep-alive connection, the silent ones fill every slot.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(gw.addr).await?);
    }
    let start = Instant::now();
    let mut next = TcpStream::connect(gw.addr).await?;
    healthz_on(&mut next).await?;
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(400), "answered after {waited:?}: the cap did not hold");
    for mut s in silent {
        closed_within(&mut s, Duration::from_secs(5)).await?;
    }
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
