//! NATS JetStream destinations (`async-nats`; linked only here): a publish with the webhook
//! headers as message headers and `Nats-Msg-Id` set to the delivery's own id (see
//! `Message::dedupe_id`: JetStream drops a repeat of one delivery within its duplicate
//! window, never another delivery of the same event), counted once the stream
//! acknowledges it. A first attempt that JetStream calls a duplicate is not counted: the
//! message it holds is not this delivery's. One client per destination, which reconnects
//! by itself; while it is disconnected attempts fail at once (retried) rather than queue
//! in its buffer. A batching endpoint's round writes every message's publish, then awaits
//! their acknowledgements. No stream for the subject is `broker_missing`; refused credentials are
//! `broker_auth`.

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::{ConnectErrorKind, ConnectOptions, connection::State};

use super::broker::{Guard, Key, Message, Pool, acknowledged, failed, message_headers};
use crate::classify::{Outcome, TransportErrorKind};

/// The NATS clients of a node, one per destination.
#[derive(Default)]
pub(super) struct Nats {
    pool: Pool<async_nats::jetstream::Context>,
}

impl Nats {
    pub(super) async fn publish(&self, m: &Message, guard: Guard) -> Outcome {
        let one = self.publish_round(std::slice::from_ref(m), guard).await;
        one.into_iter().next().unwrap_or_else(|| failed(TransportErrorKind::Other, "no acknowledgement"))
    }

    /// Publishes `ms` (one destination's) in one round: every `PUB` written, then each
    /// message's JetStream acknowledgement awaited (all within the first's `timeout`); one
    /// outcome per message, judged on its own.
    pub(super) async fn publish_round(&self, ms: &[Message], guard: Guard) -> Vec<Outcome> {
        let Some(m) = ms.first() else { return Vec::new() };
        let key = Key::of(m);
        let js = match self.pool.get(&key, || connect(m, guard)).await {
            Ok(c) => c,
            Err(outcome) => return vec![outcome; ms.len()],
        };
        if js.client().connection_state() != State::Connected {
            let lost = failed(TransportErrorKind::ConnectionReset, "disconnected from the NATS server; reconnecting");
            return vec![lost; ms.len()];
        }
        let deadline = tokio::time::Instant::now() + m.timeout;
        let late = || failed(TransportErrorKind::Timeout, format!("no JetStream ack within {:?}", m.timeout));
        let mut pending = Vec::with_capacity(ms.len());
        for m in ms {
            let sent = tokio::time::timeout_at(deadline, js.send_publish(m.target.clone(), message(m))).await;
            pending.push(sent);
        }
        let mut outcomes = Vec::with_capacity(ms.len());
        for (m, sent) in ms.iter().zip(pending) {
            outcomes.push(match sent {
                Ok(Ok(ack)) => match tokio::time::timeout_at(deadline, ack).await {
                    Ok(Ok(ack)) => judged(m, &ack.stream, ack.sequence, ack.duplicate),
                    Ok(Err(e)) => publish_failed(&e),
                    Err(_) => late(),
                },
                Ok(Err(e)) => publish_failed(&e),
                Err(_) => late(),
            });
        }
        outcomes
    }
}

/// One message as JetStream takes it: the body, the webhook headers, the delivery's id.
fn message(m: &Message) -> PublishMessage {
    let mut msg = PublishMessage::build().payload(m.body.clone()).message_id(&m.dedupe_id);
    for (k, v) in message_headers(m) {
        msg = msg.header(k, v);
    }
    msg
}

async fn connect(m: &Message, guard: Guard) -> Result<async_nats::jetstream::Context, Outcome> {
    let d = &m.destination;
    let url = guard.pinned(m).await?;
    // Only the server checked: not the others a cluster's server tells of, which the guard
    // never saw.
    let mut options =
        ConnectOptions::new().connection_timeout(m.connect_timeout).name("herald").ignore_discovered_servers();
    if let (Some(user), Some(pass)) = (&d.username, &d.password) {
        options = options.user_and_password(user.clone(), pass.expose().to_string());
    }
    if let Some(token) = &d.token {
        options = options.token(token.expose().to_string());
    }
    let client = options.connect(url.as_str()).await.map_err(|e| {
        let kind = match e.kind() {
            ConnectErrorKind::Authentication | ConnectErrorKind::AuthorizationViolation => {
                TransportErrorKind::BrokerAuth
            }
            ConnectErrorKind::TimedOut => TransportErrorKind::ConnectTimeout,
            ConnectErrorKind::Dns => TransportErrorKind::Dns,
            ConnectErrorKind::Tls => TransportErrorKind::Tls,
            ConnectErrorKind::Io | ConnectErrorKind::MaxReconnects => TransportErrorKind::ConnectionRefused,
            ConnectErrorKind::ServerParse => TransportErrorKind::Other,
        };
        failed(kind, e.to_string())
    })?;
    let mut js = async_nats::jetstream::new(client);
    js.set_timeout(m.timeout);
    Ok(js)
}

/// What a stream's acknowledgement means for the attempt. A duplicate on a later attempt
/// is an earlier attempt's message (its acknowledgement was lost): delivered. On a first
/// attempt no attempt of this delivery vouches for it (a message of someone else's under
/// this id): not delivered, retried. The one first-attempt duplicate that is this
/// delivery's own, an attempt a node sent and died before recording, costs one retry: the
/// next attempt counts it.
fn judged(m: &Message, stream: &str, sequence: u64, duplicate: bool) -> Outcome {
    match (duplicate, m.first_attempt) {
        (false, _) => acknowledged(format!("{stream} seq {sequence}")),
        (true, false) => acknowledged(format!("{stream} seq {sequence} (duplicate of an earlier attempt)")),
        (true, true) => failed(
            TransportErrorKind::Other,
            format!(
                "JetStream stream {stream} already holds a message with Nats-Msg-Id {:?} (seq {sequence}) \
                 on this delivery's first attempt: not counted as delivered",
                m.dedupe_id
            ),
        ),
    }
}

fn publish_failed(e: &PublishError) -> Outcome {
    let kind = match e.kind() {
        PublishErrorKind::StreamNotFound => TransportErrorKind::BrokerMissing,
        PublishErrorKind::TimedOut => TransportErrorKind::Timeout,
        PublishErrorKind::BrokenPipe => TransportErrorKind::ConnectionReset,
        _ => TransportErrorKind::Other,
    };
    failed(kind, e.to_string())
}
