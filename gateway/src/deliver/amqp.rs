//! AMQP 0-9-1 destinations (`lapin`; linked only here): a persistent publish to the
//! exchange with the routing key, `mandatory` set, the webhook headers as message headers
//! and the delivery's own id as `message-id` (see `Message::dedupe_id`), counted only once
//! the broker confirms it (publisher confirms on). A nack is retried; a message the broker
//! returns unroutable, a missing exchange (`NOT_FOUND`) are `broker_missing`; refused
//! credentials (`ACCESS_REFUSED`) are `broker_auth`. One connection and confirming channel
//! per destination, opened anew after any error that closes either. A CloudEvent's `ce-*`
//! attributes go as the AMQP binding's `cloudEvents:*` properties, its content type as the
//! message's.

use std::sync::Arc;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};

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
        let key = Key::of(m);
        let link = match self.pool.get(&key, || connect(m, guard)).await {
            Ok(l) => l,
            Err(outcome) => return outcome,
        };
        if !link.channel.status().connected() {
            self.pool.forget(&key).await;
            return failed(TransportErrorKind::ConnectionReset, "the AMQP channel closed; reconnecting");
        }
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
        let confirmed = async {
            let confirm = link
                .channel
                .basic_publish(exchange, ShortString::from(m.target.as_str()), options, &m.body, properties)
                .await?;
            confirm.await
        };
        let outcome = match tokio::time::timeout(m.timeout, confirmed).await {
            Ok(Ok(Confirmation::Ack(None))) => return acknowledged(format!("confirmed: {}", m.target)),
            Ok(Ok(Confirmation::Ack(Some(_)))) => {
                return failed(
                    TransportErrorKind::BrokerMissing,
                    format!("unroutable: no queue bound for {:?}", m.target),
                );
            }
            Ok(Ok(Confirmation::Nack(_))) => return failed(TransportErrorKind::Other, "the broker nacked the message"),
            Ok(Ok(Confirmation::NotRequested)) => {
                failed(TransportErrorKind::Other, "the channel is not in confirm mode")
            }
            Ok(Err(e)) => outcome_of(&e),
            Err(_) => failed(TransportErrorKind::Timeout, format!("no confirm within {:?}", m.timeout)),
        };
        // An error closes the channel (a missing exchange does) or the connection; a lost
        // confirm leaves the channel's count unsure: open both anew.
        self.pool.forget(&key).await;
        outcome
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
