//! Network edges of the API listener: slow and idle clients are cut off after their
//! timeouts, the connection cap holds, and normal requests keep succeeding meanwhile; a
//! node makes room for its connections before it serves.

use std::time::{Duration, Instant};

use anyhow::Context;
use tests::TestGateway;
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
