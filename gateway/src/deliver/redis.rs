//! Redis Streams destinations (the `redis` crate; linked only here): `XADD` of the body and
//! the webhook headers as fields, with `MAXLEN ~` when set, on one multiplexed connection
//! per destination; a batching endpoint's round is one pipeline of them. What Redis says maps onto the transport kinds: refused credentials
//! (`NOAUTH`, `WRONGPASS`, `NOPERM`) are `broker_auth`; a key of another type is
//! `broker_missing`; a lost or refused connection is retried.

use redis::aio::MultiplexedConnection;

use super::broker::{Guard, Key, Message, Pool, acknowledged, failed, message_headers};
use crate::classify::{Outcome, TransportErrorKind};

/// The Redis connections of a node, one per destination.
#[derive(Default)]
pub(super) struct Redis {
    pool: Pool<MultiplexedConnection>,
}

impl Redis {
    pub(super) async fn publish(&self, m: &Message, guard: Guard) -> Outcome {
        let one = self.publish_round(std::slice::from_ref(m), guard).await;
        one.into_iter().next().unwrap_or_else(|| failed(TransportErrorKind::Other, "no reply"))
    }

    /// Publishes `ms` (one destination's) in one pipeline of `XADD`s, written at once and
    /// answered in order: one outcome per message, a refused entry failing only itself.
    pub(super) async fn publish_round(&self, ms: &[Message], guard: Guard) -> Vec<Outcome> {
        let Some(m) = ms.first() else { return Vec::new() };
        let key = Key::of(m);
        let mut conn = match self.pool.get(&key, || connect(m, guard)).await {
            Ok(c) => c,
            Err(outcome) => return vec![outcome; ms.len()],
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for m in ms {
            pipe.add_command(xadd(m));
        }
        let replies = pipe.query_async::<Vec<redis::RedisResult<String>>>(&mut conn);
        match tokio::time::timeout(m.timeout, replies).await {
            Ok(Ok(replies)) => ms
                .iter()
                .zip(replies.iter().map(Some).chain(std::iter::repeat(None)))
                .map(|(m, reply)| match reply {
                    Some(Ok(id)) => acknowledged(format!("XADD {} {id}", m.target)),
                    Some(Err(e)) => outcome_of(e),
                    None => failed(TransportErrorKind::Other, "no reply to this XADD in the pipeline"),
                })
                .collect(),
            Ok(Err(e)) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
                    self.pool.forget(&key).await;
                }
                vec![outcome_of(&e); ms.len()]
            }
            Err(_) => {
                // The replies may still come; the connection is not trusted with another.
                self.pool.forget(&key).await;
                vec![failed(TransportErrorKind::Timeout, format!("no XADD reply within {:?}", m.timeout)); ms.len()]
            }
        }
    }
}

/// The `XADD` of one message: its body and headers as the entry's fields.
fn xadd(m: &Message) -> redis::Cmd {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(&m.target);
    if let Some(n) = m.destination.maxlen {
        cmd.arg("MAXLEN").arg("~").arg(n);
    }
    cmd.arg("*").arg("body").arg(m.body.as_ref());
    for (k, v) in message_headers(m) {
        cmd.arg(k).arg(v);
    }
    cmd
}

async fn connect(m: &Message, guard: Guard) -> Result<MultiplexedConnection, Outcome> {
    use redis::IntoConnectionInfo;
    let url = guard.pinned(m).await?;
    let info = url.as_str().into_connection_info().map_err(|e| outcome_of(&e))?;
    let mut settings = info.redis_settings().clone();
    if let Some(u) = &m.destination.username {
        settings = settings.set_username(u);
    }
    if let Some(p) = &m.destination.password {
        settings = settings.set_password(p.expose());
    }
    let client = redis::Client::open(info.set_redis_settings(settings)).map_err(|e| outcome_of(&e))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(m.connect_timeout))
        .set_response_timeout(Some(m.timeout));
    client.get_multiplexed_async_connection_with_config(&config).await.map_err(|e| outcome_of(&e))
}

fn outcome_of(e: &redis::RedisError) -> Outcome {
    let detail = e.to_string();
    let kind = match e.code() {
        Some("NOAUTH" | "WRONGPASS" | "NOPERM") => TransportErrorKind::BrokerAuth,
        Some("WRONGTYPE") => TransportErrorKind::BrokerMissing,
        _ if e.kind() == redis::ErrorKind::AuthenticationFailed => TransportErrorKind::BrokerAuth,
        _ if e.is_connection_refusal() => TransportErrorKind::ConnectionRefused,
        _ if e.is_timeout() => TransportErrorKind::Timeout,
        _ if e.is_io_error() || e.is_connection_dropped() => TransportErrorKind::ConnectionReset,
        _ => TransportErrorKind::Other,
    };
    failed(kind, detail)
}
