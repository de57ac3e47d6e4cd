//! The API listener: accepts connections under a cap (making room at the cap from idle and
//! slow connections) and serves each with HTTP/1.1, closing a connection that is too slow
//! to send a request head or idle too long. It knows nothing of routes (those are the rest
//! of `api`) and never talks to webhook endpoints.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tower_service::Service;

use crate::config::ServerLimits;

/// How long a connection may take to send its request head while the listener is at its
/// cap and another connection waits for a slot (`server.header_read_timeout` when shorter).
/// A real client sends its head within milliseconds of connecting; one that has sent none
/// for this long while others wait is the one to drop.
pub const PRESSURE_HEADER_TIMEOUT: Duration = Duration::from_millis(250);

/// Serves `app` on `listener` until `shutdown` resolves, then lets every open connection
/// finish its request in flight (idle ones close at once) and returns.
///
/// At most `limits.max_connections` connections are served at once. At the cap, the next
/// one is accepted and waits while room is made for it: the connection idle longest
/// between keep-alive requests is closed, or else the oldest one that has not sent its
/// request head within [`PRESSURE_HEADER_TIMEOUT`]; a connection with a request in flight
/// is never closed for room. So idle and slow connections cannot starve real ones (641
/// idle connections once kept `/healthz` from answering), and more connections than the
/// cap, beyond the one waiting, stay in the kernel's backlog, costing no file descriptor.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let open = Arc::new(Open::default());
    let (closing, closed) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: the condition passes, the
                    // listener stays. Back off a little rather than spin.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let permit = match slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => tokio::select! {
                permit = make_room(&slots, &open, limits) => permit,
                _ = &mut shutdown => break,
            },
        };
        let entry = open.add();
        tokio::spawn(connection((stream, peer), app.clone(), limits, (permit, entry), closed.clone()));
    }
    drop(listener);
    let _ = closing.send(true);
    // Every connection holds a slot until it ends: all slots back means all ended.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
    Ok(())
}

/// Closes connections for room (see [`serve`]) until a slot is free, and takes it.
async fn make_room(slots: &Arc<Semaphore>, open: &Open, limits: ServerLimits) -> OwnedSemaphorePermit {
    let head_timeout = limits.header_read_timeout.min(PRESSURE_HEADER_TIMEOUT);
    loop {
        let now = Instant::now();
        // After an eviction the slot frees at once, unless the connection started a request
        // just then (then it keeps its slot): look again soon.
        let look_again = match open.evict_one(now, head_timeout) {
            Eviction::Done => now + Duration::from_millis(50),
            Eviction::NotBefore(t) => t,
        };
        tokio::select! {
            permit = slots.clone().acquire_owned() => return permit.expect("the semaphore is never closed"),
            _ = tokio::time::sleep_until(look_again) => {}
        }
    }
}

/// The connections being served, for [`make_room`].
#[derive(Default)]
struct Open {
    next: std::sync::atomic::AtomicU64,
    entries: Mutex<std::collections::HashMap<u64, Arc<Entry>>>,
}

/// One open connection: its phase, and how to ask it to close.
struct Entry {
    id: u64,
    activity: Arc<Activity>,
    evict: tokio::sync::Notify,
    /// Asked to close already: not picked again.
    evicted: std::sync::atomic::AtomicBool,
}

/// What [`Open::evict_one`] did.
#[derive(Debug, PartialEq, Eq)]
enum Eviction {
    /// Asked one connection to close.
    Done,
    /// None may be closed before this instant.
    NotBefore(Instant),
}

impl Open {
    fn add(self: &Arc<Self>) -> Registered {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let entry = Arc::new(Entry {
            id,
            activity: Arc::new(Activity::new(Instant::now())),
            evict: tokio::sync::Notify::new(),
            evicted: Default::default(),
        });
        self.lock().insert(id, entry.clone());
        Registered { open: self.clone(), entry }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the connection idle longest to close, or else the oldest one still without its
    /// request head after `head_timeout`.
    fn evict_one(&self, now: Instant, head_timeout: Duration) -> Eviction {
        let entries = self.lock();
        let candidates = entries.values().filter(|e| !e.evicted.load(std::sync::atomic::Ordering::Relaxed));
        // The oldest of each kind: (since, entry).
        let (mut idle, mut head) = (None::<(Instant, &Arc<Entry>)>, None::<(Instant, &Arc<Entry>)>);
        for e in candidates {
            let (slot, since) = match *e.activity.phase() {
                Phase::Idle(since) => (&mut idle, since),
                Phase::Head(since) => (&mut head, since),
                Phase::Busy(_) => continue,
            };
            if slot.is_none_or(|(oldest, _)| since < oldest) {
                *slot = Some((since, e));
            }
        }
        let victim = match (idle, head) {
            (Some((_, e)), _) => e,
            (None, Some((since, e))) if now >= since + head_timeout => e,
            (None, Some((since, _))) => return Eviction::NotBefore(since + head_timeout),
            (None, None) => return Eviction::NotBefore(now + head_timeout),
        };
        victim.evicted.store(true, std::sync::atomic::Ordering::Relaxed);
        victim.evict.notify_one();
        Eviction::Done
    }
}

/// A connection's place in [`Open`] and its slot, given up when it ends.
struct Registered {
    open: Arc<Open>,
    entry: Arc<Entry>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.lock().remove(&self.entry.id);
    }
}

/// Serves one connection until it ends, times out, is asked to make room, or the node
/// shuts down.
async fn connection(
    (stream, peer): (TcpStream, std::net::SocketAddr),
    app: Router,
    limits: ServerLimits,
    (_slot, registered): (OwnedSemaphorePermit, Registered),
    mut closing: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let entry = registered.entry.clone();
    let activity = entry.activity.clone();
    let io = TokioIo::new(Watched { inner: stream, activity: activity.clone() });
    let requests = activity.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let busy = Busy::start(requests.clone());
        let mut app = app.clone();
        let mut req = req.map(|body| TimedBody::new(body, limits.body_read_timeout));
        // The client's address, for the audit log (`api/audit.rs`).
        req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
        async move {
            // Busy until the body is sent, not only its head: a streamed answer (`herald
            // listen`'s connection) is a request in flight, never an idle connection.
            let response = app.call(req).await;
            response.map(|r| r.map(|body| axum::body::Body::new(Streaming { inner: body, _busy: busy })))
        }
    });
    // Our own timers below judge the head and idle phases; hyper's would conflate them.
    let conn = http1::Builder::new().header_read_timeout(None).serve_connection(io, service);
    tokio::pin!(conn);
    let mut shutting_down = false;
    loop {
        let deadline = activity.deadline(limits, Instant::now());
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "API connection ended with an error");
                }
                return;
            }
            _ = closing.changed(), if !shutting_down => {
                shutting_down = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = entry.evict.notified() => {
                if !matches!(*activity.phase(), Phase::Busy(_)) {
                    tracing::debug!("closing an idle or slow API connection to make room");
                    return;
                }
                // A request began just as it was picked: it keeps its slot.
                entry.evicted.store(false, std::sync::atomic::Ordering::Relaxed);
            }
            _ = tokio::time::sleep_until(deadline) => {
                if activity.expired(limits, Instant::now()) {
                    // Nothing is in flight: dropping the connection just closes the socket.
                    tracing::debug!("closing a slow or idle API connection");
                    return;
                }
            }
        }
    }
}

/// Where a connection is between requests: what its deadline is measured from.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request head, since the connection opened or the head's first byte.
    Head(Instant),
    /// Keep-alive: no request in flight and no byte of the next one, since the instant.
    Idle(Instant),
    /// Requests being handled: no deadline here.
    Busy(usize),
}

/// A connection's phase, updated by its reads and its requests.
struct Activity(Mutex<Phase>);

impl Activity {
    fn new(now: Instant) -> Self {
        Activity(Mutex::new(Phase::Head(now)))
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes arrived: on an idle connection, the next request's head has begun.
    fn read(&self, now: Instant) {
        let mut phase = self.phase();
        if let Phase::Idle(_) = *phase {
            *phase = Phase::Head(now);
        }
    }

    /// When the current phase runs out (re-checked then, as the phase may have moved).
    fn deadline(&self, limits: ServerLimits, now: Instant) -> Instant {
        match *self.phase() {
            Phase::Head(since) => since + limits.header_read_timeout,
            Phase::Idle(since) => since + limits.idle_timeout,
            Phase::Busy(_) => now + limits.idle_timeout,
        }
    }

    fn expired(&self, limits: ServerLimits, now: Instant) -> bool {
        now >= self.deadline(limits, now) && !matches!(*self.phase(), Phase::Busy(_))
    }
}

/// Marks a request in flight on its connection for as long as it lives.
struct Busy(Arc<Activity>);

impl Busy {
    fn start(activity: Arc<Activity>) -> Busy {
        {
            let mut phase = activity.phase();
            *phase = match *phase {
                Phase::Busy(n) => Phase::Busy(n + 1),
                _ => Phase::Busy(1),
            };
        }
        Busy(activity)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut phase = self.0.phase();
        *phase = match *phase {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Idle(Instant::now()),
        };
    }
}

/// A request body paused longer than `server.body_read_timeout`: the request is refused
/// with `408` and its connection closed.
#[derive(Debug, thiserror::Error)]
#[error("the request body paused for more than {0:?} (server.body_read_timeout)")]
pub struct BodyTimeout(pub Duration);

impl BodyTimeout {
    /// The timeout behind a failed body read, found down its chain of sources.
    pub fn behind<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e BodyTimeout> {
        std::iter::successors(Some(e), |e| e.source()).find_map(|e| e.downcast_ref())
    }
}

/// A request body that fails with [`BodyTimeout`] when none of it arrives for `timeout`
/// (measured from its last frame, like nginx's `client_body_timeout`): a slow upload goes
/// on, a trickle does not hold its connection (and its slot) for the size limit's worth of
/// pauses. A body that is all there on the first read never arms the timer.
struct TimedBody {
    inner: Incoming,
    timeout: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl TimedBody {
    fn new(inner: Incoming, timeout: Duration) -> Self {
        TimedBody { inner, timeout, timer: None }
    }
}

impl Body for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(timer) = this.timer.as_mut() {
                    timer.as_mut().reset(Instant::now() + this.timeout);
                }
                Poll::Ready(frame.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout(timeout))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its request in flight ([`Busy`]) until it is sent or dropped.
struct Streaming {
    inner: axum::body::Body,
    _busy: Busy,
}

impl Body for Streaming {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A socket that reports every read to its connection's [`Activity`].
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read(Instant::now());
        }
        result
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ServerLimits = ServerLimits {
        header_read_timeout: Duration::from_secs(10),
        body_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        max_connections: 1,
    };

    /// Room is made from the connection idle longest, else the oldest one without its head
    /// after the pressure timeout; never from one with a request in flight, nor twice.
    #[tokio::test]
    async fn room_comes_from_idle_connections_first_then_slow_heads() {
        let open = Arc::new(Open::default());
        let timeout = PRESSURE_HEADER_TIMEOUT;
        let (head, busy, idle_new, idle_old) = (open.add(), open.add(), open.add(), open.add());
        let t0 = Instant::now();
        let _request = Busy::start(busy.entry.activity.clone());
        *idle_new.entry.activity.phase() = Phase::Idle(t0);
        *idle_old.entry.activity.phase() = Phase::Idle(t0 - Duration::from_secs(1));
        let since = match *head.entry.activity.phase() {
            Phase::Head(since) => since,
            p => panic!("{p:?}"),
        };
        let asked = |r: &Registered| r.entry.evicted.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(open.evict_one(t0, timeout), Eviction::Done);
        assert!(asked(&idle_old) && !asked(&idle_new));
        assert_eq!(open.evict_one(t0, timeout), Eviction::Done);
        assert!(asked(&idle_new));
        // Only the head is left to close, once it is late.
        assert_eq!(open.evict_one(since, timeout), Eviction::NotBefore(since + timeout));
        assert_eq!(open.evict_one(since + timeout, timeout), Eviction::Done);
        assert!(asked(&head) && !asked(&busy));
        assert_eq!(open.evict_one(since + timeout, timeout), Eviction::NotBefore(since + 2 * timeout));
        drop(head);
        assert_eq!(open.lock().len(), 3, "a connection that ends leaves the registry");
    }

    #[test]
    fn each_phase_has_its_deadline() {
        let t0 = Instant::now();
        let a = Arc::new(Activity::new(t0));
        // A new connection must send its head within the header timeout.
        assert_eq!(a.deadline(LIMITS, t0), t0 + LIMITS.header_read_timeout);
        assert!(!a.expired(LIMITS, t0 + Duration::from_secs(9)));
        assert!(a.expired(LIMITS, t0 + Duration::from_secs(10)));
        // In flight: never expired, however long.
        let busy = Busy::start(a.clone());
        assert!(!a.expired(LIMITS, t0 + Duration::from_secs(3600)));
        drop(busy);
        // Idle after the response: the idle timeout, from then.
        let idle_since = match *a.phase() {
            Phase::Idle(t) => t,
            p => panic!("{p:?}"),
        };
        assert_eq!(a.deadline(LIMITS, idle_since), idle_since + LIMITS.idle_timeout);
        // A byte of the next request: the header timeout again, from that byte.
        let t1 = idle_since + Duration::from_secs(5);
        a.read(t1);
        assert_eq!(a.deadline(LIMITS, t1), t1 + LIMITS.header_read_timeout);
        // Further bytes do not extend it (a slowloris client gains nothing).
        a.read(t1 + Duration::from_secs(9));
        assert!(a.expired(LIMITS, t1 + Duration::from_secs(10)));
    }
}
