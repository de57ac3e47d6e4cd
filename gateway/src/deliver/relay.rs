//! `herald listen`'s relay: the listener connections this node holds, one per `listen`
//! endpoint, and the requests sent down them that wait for their answers. The engine sends
//! ([`Relay::send`], which answers an [`Outcome`] as an HTTP send does), the API serves each
//! connection ([`Relay::connect`]: the requests to write down it) and takes the answers the
//! listener posts back ([`Relay::answer`]).
//!
//! It never builds, signs or judges a request: the engine built it exactly as for a webhook,
//! and classifies the answer as one. A request whose connection ends before its answer came
//! is a transport failure (`connection_reset`), one sent where no listener is connected a
//! refused connection; the engine does not send while none is (`worker/partition.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::BODY_PREFIX;
use crate::classify::{self, Outcome, Response, TransportErrorKind};
use crate::model::Millis;

/// How many requests may wait to be written down one connection (the endpoint's
/// `max_in_flight` bounds them first).
const LINE_DEPTH: usize = 64;

/// The listener connections of this node, by endpoint id.
#[derive(Default)]
pub struct Relay {
    lines: Mutex<HashMap<String, Line>>,
    serial: AtomicU64,
    /// The node is shutting down: every connection ended, none taken.
    closed: AtomicBool,
}

/// One endpoint's connection: where its requests go, and the ones waiting for an answer.
struct Line {
    serial: u64,
    tx: mpsc::Sender<RelayRequest>,
    pending: HashMap<String, oneshot::Sender<Answer>>,
}

/// One request down a listener's connection: what to send to the local URL, exactly (the
/// body in base64, as bytes), and what it is for (the line the listener prints).
#[derive(Debug, Clone, Serialize)]
pub struct RelayRequest {
    /// What the answer is posted back for (`POST …/listen/{request}`).
    pub id: String,
    pub delivery_id: String,
    pub event_id: String,
    pub event_type: String,
    /// The attempt's number (1 is the first).
    pub attempt: u32,
    /// The request's headers, in order, as the node built them (signature included).
    pub headers: Vec<(String, String)>,
    /// The request's body, base64 (standard alphabet, padded).
    pub body: String,
}

/// What the listener posts back for one request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Answer {
    /// The local URL answered.
    Response {
        status: u16,
        /// The answer's headers.
        #[serde(default)]
        headers: Vec<(String, String)>,
        /// The first KiB of its body (more is cut).
        #[serde(default)]
        body: String,
    },
    /// The local URL gave no answer: `connection_refused`, `timeout`, … (the transport
    /// failures of an attempt), and what the listener saw.
    Failed {
        error: TransportErrorKind,
        #[serde(default)]
        detail: String,
    },
}

/// The listener's side of a connection: the requests to write down it. Dropping it (the
/// connection ended) fails the requests still waiting for an answer.
pub struct Listening {
    rx: mpsc::Receiver<RelayRequest>,
    relay: Arc<Relay>,
    endpoint: String,
    serial: u64,
}

impl Listening {
    /// The next request to write down the connection; `None`: another listener of the
    /// same endpoint took over, or the node is stopping.
    pub async fn next(&mut self) -> Option<RelayRequest> {
        self.rx.recv().await
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let mut lines = self.relay.lines.lock().unwrap_or_else(|e| e.into_inner());
        if lines.get(&self.endpoint).is_some_and(|l| l.serial == self.serial) {
            lines.remove(&self.endpoint);
        }
    }
}

impl Relay {
    /// Takes a listener's connection for `endpoint`; one already there ends (the newest
    /// listener wins), failing its requests waiting for answers. `None` once the node stops.
    pub fn connect(self: &Arc<Self>, endpoint: &str) -> Option<Listening> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(LINE_DEPTH);
        let line = Line { serial, tx, pending: HashMap::new() };
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).insert(endpoint.to_string(), line);
        Some(Listening { rx, relay: self.clone(), endpoint: endpoint.to_string(), serial })
    }

    /// Whether a listener is connected here for `endpoint`.
    pub fn connected(&self, endpoint: &str) -> bool {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).contains_key(endpoint)
    }

    /// Ends every connection and takes no more (the node is stopping: a connection
    /// streaming forever would hold the server's graceful shutdown).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Takes the answer to request `id` of `endpoint`'s connection; false when none waits
    /// for it (answered already, timed out, or its connection ended).
    pub fn answer(&self, endpoint: &str, id: &str, answer: Answer) -> bool {
        let waiting = {
            let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
            lines.get_mut(endpoint).and_then(|l| l.pending.remove(id))
        };
        waiting.is_some_and(|w| w.send(answer).is_ok())
    }

    /// Sends one request down `endpoint`'s connection and waits up to `timeout` for the
    /// answer the listener posts back. `keep_headers`: a classify plugin reads them; `now`
    /// reads an HTTP date in `Retry-After`.
    pub async fn send(
        &self,
        endpoint: &str,
        mut request: RelayRequest,
        keep_headers: bool,
        now: Millis,
        timeout: Duration,
    ) -> Outcome {
        let (answered, answer) = oneshot::channel();
        let tx = {
            let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
            let Some(line) = lines.get_mut(endpoint) else {
                return failed(TransportErrorKind::ConnectionRefused, "no listener is connected for the endpoint");
            };
            request.id = format!("{}-{}", line.serial, self.serial.fetch_add(1, Ordering::Relaxed));
            line.pending.insert(request.id.clone(), answered);
            line.tx.clone()
        };
        let id = request.id.clone();
        let exchange = async {
            if tx.send(request).await.is_err() {
                return failed(TransportErrorKind::ConnectionReset, "the listener disconnected");
            }
            drop(tx);
            match answer.await {
                Ok(answer) => answer.outcome(keep_headers, now),
                Err(_) => failed(TransportErrorKind::ConnectionReset, "the listener disconnected before it answered"),
            }
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(outcome) => outcome,
            Err(_) => {
                if let Some(line) = self.lines.lock().unwrap_or_else(|e| e.into_inner()).get_mut(endpoint) {
                    line.pending.remove(&id);
                }
                failed(TransportErrorKind::Timeout, &format!("the listener posted no answer within {timeout:?}"))
            }
        }
    }
}

impl RelayRequest {
    /// A request of `headers` and `body` (its `id` is given when it is sent).
    pub fn new(
        delivery_id: String,
        event_id: String,
        event_type: String,
        attempt: u32,
        headers: Vec<(String, String)>,
        body: &[u8],
    ) -> RelayRequest {
        let body = base64::engine::general_purpose::STANDARD.encode(body);
        RelayRequest { id: String::new(), delivery_id, event_id, event_type, attempt, headers, body }
    }
}

impl Answer {
    /// The answer as an HTTP send's outcome: the first [`BODY_PREFIX`] bytes of the body,
    /// `Retry-After` parsed, the headers kept only for a classify plugin.
    pub fn outcome(self, keep_headers: bool, now: Millis) -> Outcome {
        match self {
            Answer::Response { status, headers, mut body } => {
                let retry_after =
                    headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("retry-after")).and_then(|(_, v)| {
                        classify::parse_retry_after(v, UNIX_EPOCH + Duration::from_millis(now.max(0) as u64))
                    });
                if body.len() > BODY_PREFIX {
                    let cut = (0..=BODY_PREFIX).rev().find(|&i| body.is_char_boundary(i)).unwrap_or(0);
                    body.truncate(cut);
                }
                let headers = if keep_headers { headers } else { Vec::new() };
                Outcome::Response(Response { status, retry_after, headers, body_prefix: body })
            }
            Answer::Failed { error, detail } => {
                Outcome::Transport { kind: error, detail: format!("listener: {detail}") }
            }
        }
    }
}

fn failed(kind: TransportErrorKind, detail: &str) -> Outcome {
    Outcome::Transport { kind, detail: detail.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> RelayRequest {
        RelayRequest::new("dlv_1".into(), "evt_1".into(), "a.b".into(), 1, vec![("x".into(), "y".into())], b"{}")
    }

    #[tokio::test]
    async fn an_answer_posted_back_is_the_outcome_and_a_dropped_connection_fails_what_waits() {
        let relay = Arc::new(Relay::default());
        let none = relay.send("ep_1", request(), false, 0, Duration::from_secs(1)).await;
        assert!(matches!(none, Outcome::Transport { kind: TransportErrorKind::ConnectionRefused, .. }));
        let mut line = relay.connect("ep_1").unwrap();
        let sender = relay.clone();
        let sent = tokio::spawn(async move { sender.send("ep_1", request(), false, 0, Duration::from_secs(5)).await });
        let got = line.next().await.unwrap();
        assert_eq!((got.body.as_str(), got.headers.len()), ("e30=", 1));
        let answer = Answer::Response {
            status: 429,
            headers: vec![("Retry-After".into(), "7".into())],
            body: "é".repeat(BODY_PREFIX),
        };
        assert!(relay.answer("ep_1", &got.id, answer.clone()));
        assert!(!relay.answer("ep_1", &got.id, answer), "answered once");
        let Outcome::Response(r) = sent.await.unwrap() else { panic!("not a response") };
        assert_eq!((r.status, r.retry_after, r.headers.len()), (429, Some(Duration::from_secs(7)), 0));
        assert!(r.body_prefix.len() <= BODY_PREFIX && r.body_prefix.len() >= BODY_PREFIX - 1);

        let sender = relay.clone();
        let sent = tokio::spawn(async move { sender.send("ep_1", request(), false, 0, Duration::from_secs(5)).await });
        line.next().await.unwrap();
        drop(line);
        let outcome = sent.await.unwrap();
        assert!(matches!(outcome, Outcome::Transport { kind: TransportErrorKind::ConnectionReset, .. }), "{outcome:?}");
        assert!(!relay.connected("ep_1"));
    }

    #[test]
    fn a_failure_posted_back_reads_as_a_transport_failure() {
        let answer: Answer =
            serde_json::from_str(r#"{"error":"connection_refused","detail":"connect: refused"}"#).unwrap();
        let Outcome::Transport { kind, detail } = answer.outcome(false, 0) else { panic!("not a failure") };
        assert_eq!((kind, detail.as_str()), (TransportErrorKind::ConnectionRefused, "listener: connect: refused"));
        let answer: Answer = serde_json::from_str(r#"{"status":200}"#).unwrap();
        assert_eq!(answer.outcome(true, 0), Outcome::status(200, None));
    }
}
