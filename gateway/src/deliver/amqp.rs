//! AMQP 0-9-1 destinations (`lapin`; linked only here): a persistent publish to the
//! exchange with the routing key, `mandatory` set, the webhook headers as message headers
//! and the delivery's own id as `message-id` (see `Message::dedupe_id`), counted only once
//! the broker confirms it (publisher confirms on). A nack is retried; a message the broker
//! returns unroutable, a missing exchange (`NOT_FOUND`) are `broker_missing`; refused
//! credentials (`ACCESS_REFUSED`) are `broker_auth`. One connection and confirming channel
//! per destination, opened anew after any error that closes either. A batching endpoint's
//! round writes every message's publish, then awaits their confirms. A CloudEvent's `ce-*`
//! attributes go as the AMQP binding's `cloudEvents:*` properties, its content type as the
//! message's.

use std::sync::Arc;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind, PublisherConfirm};

use super::broker::{Guard, Key, Message, Pool, acknowledged, failed, message_headers};
use crate::classify::{Outcome, TransportErrorKind};

/// A destination's connection and its channel in confirm mode.
struct Link {
    // Held so the connection lives as long as its channel is in use.
    _connection: Connection,
    channel: Channel,
}

/// The AMQP connections of a node, one per destination.
#[derive(Default)]
pub(super) struct Amqp {
    pool: Pool<Arc<Link>>,
}

impl Amqp {
    pub(super) async fn publish(&self, m: &Message, guard: Guard) -> Outcome {
        let one = self.publish_round(std::slice::from_ref(m), guard).await;
        one.into_iter().next().unwrap_or_else(|| failed(TransportErrorKind::Other, "no confirm"))
    }

    /// Publishes `ms` (one destination's) in one round on the confirming channel: every
    /// `basic.publish` written, then each message's confirm awaited (all within the first's
    /// `timeout`); one outcome per message, a nack failing only its own.
    pub(super) async fn publish_round(&self, ms: &[Message], guard: Guard) -> Vec<Outcome> {
        let Some(m) = ms.first() else { return Vec::new() };
        let key = Key::of(m);
        let link = match self.pool.get(&key, || connect(m, guard)).await {
            Ok(l) => l,
            Err(outcome) => return vec![outcome; ms.len()],
        };
        if !link.channel.status().connected() {
            self.pool.forget(&key).await;
            let lost = failed(TransportErrorKind::ConnectionReset, "the AMQP channel closed; reconnecting");
            return vec![lost; ms.len()];
        }
        let deadline = tokio::time::Instant::now() + m.timeout;
        let mut pending = Vec::with_capacity(ms.len());
        for m in ms {
            pending.push(tokio::time::timeout_at(deadline, publish_one(&link.channel, m)).await);
        }
        let (mut outcomes, mut trusted) = (Vec::with_capacity(ms.len()), true);
        for (m, sent) in ms.iter().zip(pending) {
            let confirmed = match sent {
                Ok(Ok(confirm)) => tokio::time::timeout_at(deadline, confirm).await,
                Ok(Err(e)) => Ok(Err(e)),
                Err(elapsed) => Err(elapsed),
            };
            let (outcome, keeps) = confirmation(m, confirmed);
            trusted &= keeps;
            outcomes.push(outcome);
        }
        if !trusted {
            // An error closes the channel (a missing exchange does) or the connection; a
            // lost confirm leaves the channel's count unsure: open both anew.
            self.pool.forget(&key).await;
        }
        outcomes
    }
}

/// Writes one message's persistent, `mandatory` publish; its confirm comes later.
async fn publish_one(channel: &Channel, m: &Message) -> Result<PublisherConfirm, lapin::Error> {
    let mut headers = FieldTable::default();
    let mut content_type = "application/json";
    for (k, v) in message_headers(m) {
        if k.eq_ignore_ascii_case("content-type") {
            content_type = v;
        }
        headers.insert(property_name(k), AMQPValue::LongString(LongString::from(v)));
    }
    let properties = BasicProperties::default()
        .with_content_type(ShortString::from(content_type))
        .with_message_id(ShortString::from(m.dedupe_id.as_str()))
        .with_delivery_mode(2)
        .with_headers(headers);
    let exchange = ShortString::from(m.destination.exchange.as_deref().unwrap_or(""));
    let options = BasicPublishOptions { mandatory: true, ..Default::default() };
    channel.basic_publish(exchange, ShortString::from(m.target.as_str()), options, &m.body, properties).await
}

/// What a message's confirm (or its absence by the deadline) means, and whether the
/// channel is still to be trusted with another publish.
fn confirmation(
    m: &Message,
    confirmed: Result<Result<Confirmation, lapin::Error>, tokio::time::error::Elapsed>,
) -> (Outcome, bool) {
    match confirmed {
        Ok(Ok(Confirmation::Ack(None))) => (acknowledged(format!("confirmed: {}", m.target)), true),
        Ok(Ok(Confirmation::Ack(Some(_)))) => {
            let why = format!("unroutable: no queue bound for {:?}", m.target);
            (failed(TransportErrorKind::BrokerMissing, why), true)
        }
        Ok(Ok(Confirmation::Nack(_))) => (failed(TransportErrorKind::Other, "the broker nacked the message"), true),
        Ok(Ok(Confirmation::NotRequested)) => {
            (failed(TransportErrorKind::Other, "the channel is not in confirm mode"), false)
        }
        Ok(Err(e)) => (outcome_of(&e), false),
        Err(_) => (failed(TransportErrorKind::Timeout, format!("no confirm within {:?}", m.timeout)), false),
    }
}

/// A header's name as a message property: a CloudEvents attribute (`ce-id`) as the AMQP
/// binding names it (`cloudEvents:id`), any other as it is.
fn property_name(header: &str) -> ShortString {
    match header.get(..3) {
        Some(p) if p.eq_ignore_ascii_case("ce-") => ShortString::from(format!("cloudEvents:{}", &header[3..])),
        _ => ShortString::from(header),
    }
}

async fn connect(m: &Message, guard: Guard) -> Result<Arc<Link>, Outcome> {
    let url = guard.pinned(m).await?;
    let mut uri: lapin::uri::AMQPUri =
        url.parse().map_err(|e| failed(TransportErrorKind::Other, format!("bad url: {e}")))?;
    if let Some(u) = &m.destination.username {
        uri.authority.userinfo.username = u.clone();
    }
    if let Some(p) = &m.destination.password {
        uri.authority.userinfo.password = p.expose().to_string();
    }
    let opened = async {
        let connection = Connection::connect_uri(uri, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok::<_, lapin::Error>(Link { _connection: connection, channel })
    };
    match tokio::time::timeout(m.connect_timeout, opened).await {
        Ok(Ok(link)) => Ok(Arc::new(link)),
        Ok(Err(e)) => Err(outcome_of(&e)),
        Err(_) => {
            Err(failed(TransportErrorKind::ConnectTimeout, format!("not connected within {:?}", m.connect_timeout)))
        }
    }
}

fn outcome_of(e: &lapin::Error) -> Outcome {
    let detail = e.to_string();
    let kind = match e.kind() {
        ErrorKind::ProtocolError(p) => match p.kind() {
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => TransportErrorKind::BrokerAuth,
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => TransportErrorKind::BrokerMissing,
            _ => TransportErrorKind::Other,
        },
        ErrorKind::AuthProviderError(_) => TransportErrorKind::BrokerAuth,
        ErrorKind::IOError(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            TransportErrorKind::ConnectionRefused
        }
        ErrorKind::IOError(_) | ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidConnectionState(_) => {
            TransportErrorKind::ConnectionReset
        }
        // RabbitMQ closes the connection on refused credentials (ACCESS_REFUSED, 403).
        _ if detail.contains("ACCESS_REFUSED") || detail.contains("ACCESS-REFUSED") => TransportErrorKind::BrokerAuth,
        _ => TransportErrorKind::Other,
    };
    failed(kind, detail)
}
